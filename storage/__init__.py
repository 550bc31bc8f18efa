"""Apache Kafka's log engine: record batches, segments, indexes, checkpoints and the cleaner.

Imports nothing of ``materializer`` or ``adapters``; mirrors Kafka's storage module
(Kafka 4.3, the pinned and tested broker: see "Kafka version" in docs/how-it-works.md).
"""
