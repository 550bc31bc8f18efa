"""The RocksDB state store: per partition, key -> latest value of one topic, with each partition's next offset.

The public face is this package (``from materializer.adapters.rocksdb_store import StateStore``);
its modules, one responsibility each:

* :mod:`~.layout`: the on-disk format (column families, key and value encodings, metadata keys);
* :mod:`~.errors`: RocksDB failures translated once into :class:`~materializer.adapters.errors.StoreError` kinds;
* :mod:`~.options`, :mod:`~.memory`: the RocksDB settings and the memory budget stores share;
* :mod:`~.instance`: opening the RocksDB (format version), its handles and next offsets;
* :mod:`~.reads`: point lookups, multi-gets, scans, counts;
* :mod:`~.writes`: THE write path -- data and next offsets in one ``WriteBatch``, offsets forward
  only -- and the record writers on it;
* :mod:`~.bulk`: SST files ingested in bulk (rebuilds, cold starts, snapshots) on that same path,
  and :class:`StoreSstWriter`;
* :mod:`~.secondary`: a reader beside the writer (a RocksDB secondary instance following it);
* :mod:`~.store`: :class:`StateStore`, all of the above.

A store written by another format version (version 1 keyed the data by key alone) is a
:class:`~materializer.adapters.errors.StoreCorruptedError`, which the Materializer answers by
rebuilding the store from the local log.

Modelled on Quix Streams' ``RocksDBStorePartition`` (one batch for data and changelog offset).
"""

from __future__ import annotations

from .bulk import BULK_LOAD_MAX_L0_FILES, SST_BLOCK_SIZE, SST_FILE_MIN_ENTRIES, StoreSstWriter
from .errors import map_rocksdb_error, map_rocksdb_errors
from .layout import (
    DATA_CF_NAME,
    FORMAT_VERSION,
    FORMAT_VERSION_KEY,
    METADATA_CF_NAME,
    StoredValue,
    decode_store_key,
    decode_stored_value,
    encode_store_key,
    encode_stored_value,
    latest_across_partitions,
)
from .memory import StoreMemory
from .options import StateStoreOptions
from .secondary import READER_ATTEMPTS
from .store import StateStore

__all__ = [
    "BULK_LOAD_MAX_L0_FILES",
    "DATA_CF_NAME",
    "FORMAT_VERSION",
    "FORMAT_VERSION_KEY",
    "METADATA_CF_NAME",
    "READER_ATTEMPTS",
    "SST_BLOCK_SIZE",
    "SST_FILE_MIN_ENTRIES",
    "StateStore",
    "StateStoreOptions",
    "StoreMemory",
    "StoreSstWriter",
    "StoredValue",
    "decode_store_key",
    "decode_stored_value",
    "encode_store_key",
    "encode_stored_value",
    "latest_across_partitions",
    "map_rocksdb_error",
    "map_rocksdb_errors",
]
