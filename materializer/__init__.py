"""kafka-materializer: a local Kafka-format log, Kafka-exact compaction and a RocksDB state store.

Public API (everything else lives in submodules)::

    from materializer import Materializer, MaterializerOptions

    with Materializer("localhost:9092", "prices", "data", options=MaterializerOptions()) as m:
        stats = m.run(until_caught_up=True)
        print(m.store.get(b"product-0001"))

Names are resolved lazily (PEP 562) so that ``import materializer.storage`` does not load the
Kafka client or RocksDB.

As a library it leaves logging to the application: the ``materializer`` logger (the parent of every
logger of the package, ``materializer.storage.log_cleaner`` included) has a
:class:`logging.NullHandler`, so nothing is printed until the application configures logging
(``logging.basicConfig``, its framework's set-up); the ``materializer`` command configures its own.

``materializer.__version__`` is the installed distribution's version (``kafka-materializer`` in
the package metadata, as ``materializer --version`` prints it): one source, ``pyproject.toml``.
"""

import importlib as _importlib
import logging as _logging
from typing import TYPE_CHECKING as _TYPE_CHECKING

# The library's records go where the application's logging sends them; with none configured,
# nowhere (not Python's last-resort stderr handler): the logging HOWTO's rule for libraries.
_logging.getLogger(__name__).addHandler(_logging.NullHandler())

__all__ = [
    "AdapterError",
    "KafkaSource",
    "KafkaSourceError",
    "KafkaSourceOptions",
    "KeyPartitionUndecidedError",
    "LogConfig",
    "Materializer",
    "MaterializerOptions",
    "MaterializerStats",
    "PartitionNotAssignedError",
    "PartitionOwner",
    "StateStore",
    "StateStoreOptions",
    "StoreCorruptedError",
    "StoreError",
    "StoreLockedError",
    "StoreMemory",
    "StoredValue",
    "TopicSet",
    "owner_of",
    "partition_for_key",
]

_ORIGINS: dict[str, str] = {
    "AdapterError": "materializer.adapters.errors",
    "KafkaSource": "materializer.adapters.kafka_source",
    "KafkaSourceError": "materializer.adapters.errors",
    "KafkaSourceOptions": "materializer.adapters.kafka_source",
    "LogConfig": "materializer.storage.log_config",
    "Materializer": "materializer.materializer",
    "MaterializerOptions": "materializer.config",
    "MaterializerStats": "materializer.stats",
    "KeyPartitionUndecidedError": "materializer.adapters.errors",
    "PartitionNotAssignedError": "materializer.adapters.errors",
    "PartitionOwner": "materializer.adapters.partition_owner",
    "StateStore": "materializer.adapters.rocksdb_store",
    "StateStoreOptions": "materializer.adapters.rocksdb_store",
    "StoreCorruptedError": "materializer.adapters.errors",
    "StoreError": "materializer.adapters.errors",
    "StoreLockedError": "materializer.adapters.errors",
    "StoreMemory": "materializer.adapters.rocksdb_store",
    "StoredValue": "materializer.adapters.rocksdb_store",
    "TopicSet": "materializer.topic_set",
    "owner_of": "materializer.group.routing",
    "partition_for_key": "materializer.group.routing",
}

if _TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs only
    from materializer.adapters.errors import (
        AdapterError,
        KafkaSourceError,
        KeyPartitionUndecidedError,
        PartitionNotAssignedError,
        StoreCorruptedError,
        StoreError,
        StoreLockedError,
    )
    from materializer.adapters.partition_owner import PartitionOwner
    from materializer.adapters.kafka_source import KafkaSource, KafkaSourceOptions
    from materializer.adapters.rocksdb_store import StateStore, StateStoreOptions, StoredValue, StoreMemory
    from materializer.config import MaterializerOptions
    from materializer.materializer import Materializer
    from materializer.group.routing import owner_of, partition_for_key
    from materializer.stats import MaterializerStats
    from materializer.storage.log_config import LogConfig
    from materializer.topic_set import TopicSet


_DISTRIBUTION = "kafka-materializer"

if _TYPE_CHECKING:  # pragma: no cover
    __version__: str


def __getattr__(name: str) -> object:
    if name == "__version__":
        return _installed_version()
    origin = _ORIGINS.get(name)
    if origin is None:
        raise AttributeError(f"module 'materializer' has no attribute {name!r}")
    value = getattr(_importlib.import_module(origin), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


def _installed_version() -> str:
    """The version in the installed ``kafka-materializer`` metadata (PEP 566), cached as
    ``__version__``.

    Raises:
        AttributeError: no such distribution is installed (the package was imported from a source
            tree that pip never installed), so there is no version to report.
    """
    from importlib.metadata import PackageNotFoundError, version

    try:
        found = version(_DISTRIBUTION)
    except PackageNotFoundError as exc:
        raise AttributeError(f"materializer.__version__: no installed distribution {_DISTRIBUTION!r} "
                             f"(imported from {__file__} without `pip install`)") from exc
    globals()["__version__"] = found
    return found
