"""Everything that talks to another system: Kafka client, RocksDB, Avro, Spark, broker provisioning."""
