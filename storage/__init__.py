"""Apache Kafka's log engine: record batches, segments, indexes, checkpoints and the cleaner.

Imports nothing of ``materializer`` or ``adapters``; mirrors Kafka's storage module (4.x).
"""
