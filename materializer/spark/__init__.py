"""Everything the ``spark`` extra serves: the ``kafkalog`` data source, the Python worker daemon,
the driver's class-data sharing, Spark's Kafka connector jars, and the jobs (snapshot, compact,
streaming materialization)."""
