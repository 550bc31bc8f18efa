"""Error types raised by ``materializer.adapters`` (everything that talks to another system).

Hierarchy::

    AdapterError
    ├── BrokerProvisioningError   resolving jars / formatting / starting / stopping a local broker
    ├── KafkaSourceError          consuming from a Kafka cluster (materializer.adapters.kafka_source)
    └── StoreError                the RocksDB state store (materializer.adapters.rocksdb_store)
        ├── StoreCorruptedError   the store's files are unreadable or inconsistent
        └── StoreLockedError      another process holds the store's lock

Storage-engine errors (corrupt segments, indexes, checkpoints) live in
``materializer.storage.errors`` and are not subclasses of :class:`AdapterError`.
"""

from __future__ import annotations

__all__ = [
    "AdapterError",
    "BrokerProvisioningError",
    "BrokerUnreachableError",
    "KafkaSourceError",
    "StoreError",
    "StoreCorruptedError",
    "StoreLockedError",
]


class AdapterError(Exception):
    """Root of every error raised by ``materializer.adapters``."""


class BrokerProvisioningError(AdapterError):
    """A local Apache Kafka broker could not be provisioned, started, reached or stopped.

    The message names the failing command (``mvn ...``, ``java ... kafka.Kafka ...``) and
    includes the last lines of its output or of the broker log, so it can be read without
    opening any file.
    """


class KafkaSourceError(AdapterError):
    """Consuming records from a Kafka cluster failed (metadata, fetch, deserialization)."""


class BrokerUnreachableError(KafkaSourceError):
    """The cluster did not answer within the broker timeout (transient: it may come back)."""


class StoreError(AdapterError):
    """The RocksDB state store failed."""


class StoreCorruptedError(StoreError):
    """The RocksDB state store's files are unreadable or inconsistent."""


class StoreLockedError(StoreError):
    """Another process holds the RocksDB state store's lock."""
