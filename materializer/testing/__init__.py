"""Testing a Kafka application: the pytest plugin (a real broker, topics, producers, consumers)
and the compaction oracle (what a broker's LogCleaner keeps, to compare with)."""
