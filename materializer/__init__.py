"""kafka-materializer: a local Kafka-format log, Kafka-exact compaction and a RocksDB state store."""
