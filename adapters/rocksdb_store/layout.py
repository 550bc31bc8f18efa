"""The state store's on-disk format: its column families, how keys and values are encoded, and the
metadata entries beside them. Pure functions and constants; nothing here touches RocksDB.

One RocksDB per topic at ``<data dir>/state/<topic>/``, opened through rocksdict in raw mode
(keys and values are bytes, nothing is pickled). Column families::

    data       StoreKey -> StoredValue
                 StoreKey    => Partition Int32 (big-endian) + key bytes
                 StoredValue => Offset    Int64 (big-endian; offset of the record that wrote the value)
                                Timestamp Int64 (big-endian; that record's timestamp, ms)
                                Value     Bytes (the record value, unchanged; may be empty)
    tombstones StoreKey -> Offset Int64 (big-endian) + Timestamp Int64 (big-endian, ms)
                 where the key's latest tombstone applied was (written with its delete, in the same
                 batch; a later put leaves it: it is read only for a key absent from ``data``, and
                 confirmed against the local log by its reader first). A store
                 written before it existed lacks the column family (its writer adds it on open;
                 a reader sees no tombstone); the format version is unchanged (no entry of
                 ``data`` or ``metadata`` changed; an older materializer refuses the store as
                 damaged, "column families not opened", and rebuilds it from the local log)
    metadata   b"format_version"          -> Int32 (FORMAT_VERSION)
               b"next_offset:" + Int32 p  -> Int64  next offset to apply from partition p
               b"start_offset:" + Int32 p -> Int64  log start offset the partition's entries follow
                                                    (entries of records below it were dropped)
    default    unused

Partitions are independent, as Kafka compacts each partition on its own (Kafka's LogCleaner
cleans one TopicPartition at a time; a Kafka Streams store is one per task): the same key in two
partitions is two entries. Keys are partition-major, so one partition's keys are contiguous (it can
be scanned or dropped alone, and a per-partition SST file never overlaps another's).
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from pathlib import Path
from typing import NamedTuple

from ..errors import StoreCorruptedError

__all__ = [
    "COLUMN_FAMILIES",
    "DATA_CF_NAME",
    "FORMAT_VERSION",
    "FORMAT_VERSION_KEY",
    "INT32",
    "INT64",
    "METADATA_CF_NAME",
    "NEXT_OFFSET_KEY_PREFIX",
    "START_OFFSET_KEY_PREFIX",
    "StoredValue",
    "TOMBSTONES_CF_NAME",
    "Tombstone",
    "decode_tombstone",
    "encode_tombstone",
    "VALUE_PREFIX",
    "decode_store_key",
    "decode_stored_value",
    "encode_store_key",
    "encode_stored_value",
    "latest_across_partitions",
    "next_offset_key",
    "partition_prefix",
    "prefix_end",
    "start_offset_key",
]

DATA_CF_NAME = "data"
METADATA_CF_NAME = "metadata"
TOMBSTONES_CF_NAME = "tombstones"
COLUMN_FAMILIES = (DATA_CF_NAME, METADATA_CF_NAME, TOMBSTONES_CF_NAME)
#: Version 1 keyed the data by key alone; version 2 puts the partition first.
FORMAT_VERSION = 2
FORMAT_VERSION_KEY = b"format_version"
NEXT_OFFSET_KEY_PREFIX = b"next_offset:"
START_OFFSET_KEY_PREFIX = b"start_offset:"

VALUE_PREFIX = struct.Struct(
    ">"
    "q"  # Offset => Int64
    "q"  # Timestamp => Int64
)
INT32 = struct.Struct(">i")
INT64 = struct.Struct(">q")


class StoredValue(NamedTuple):
    """A live key's value and the record it came from.

    Attributes:
        partition: the Kafka partition the record was read from.
        offset: the record's offset in that partition.
        timestamp: the record's timestamp, ms since the epoch (CreateTime or LogAppendTime).
        value: the record value, unchanged (may be empty; a tombstone is never stored).
    """

    partition: int
    offset: int
    timestamp: int
    value: bytes


class Tombstone(NamedTuple):
    """Where a key's latest tombstone applied was: a record with a null value (Kafka's tombstone).

    Attributes:
        partition: the Kafka partition of the record.
        offset: its offset there.
        timestamp: its timestamp, ms since the epoch (CreateTime or LogAppendTime; -1: none).
    """

    partition: int
    offset: int
    timestamp: int


def encode_tombstone(offset: int, timestamp: int) -> bytes:
    """The tombstones column family value: Int64 offset + Int64 timestamp (ms), big-endian."""
    return VALUE_PREFIX.pack(offset, timestamp)


def decode_tombstone(partition: int, data: bytes, path: Path | str = "<store>") -> Tombstone:
    """The :class:`Tombstone` of ``partition`` held in ``data`` (from :func:`encode_tombstone`).

    Raises:
        StoreCorruptedError: ``data`` is not 16 bytes.
    """
    if len(data) != VALUE_PREFIX.size:
        raise StoreCorruptedError(f"state store {path}: tombstone record of {len(data)} bytes in partition "
                                  f"{partition}; expected {VALUE_PREFIX.size}")
    offset, timestamp = VALUE_PREFIX.unpack(data)
    return Tombstone(partition, offset, timestamp)


def partition_prefix(partition: int) -> bytes:
    """The 4 bytes every data key of ``partition`` starts with (Int32, big-endian)."""
    return INT32.pack(partition)


def encode_store_key(partition: int, key: bytes) -> bytes:
    """The data column family key of ``key`` in ``partition``: Int32 partition (big-endian) + key bytes."""
    return INT32.pack(partition) + key


def decode_store_key(store_key: bytes) -> tuple[int, bytes]:
    """``(partition, key)`` of a data column family key (the inverse of :func:`encode_store_key`).

    Raises:
        ValueError: shorter than the 4-byte partition prefix.
    """
    if len(store_key) < INT32.size:
        raise ValueError(f"store key of {len(store_key)} bytes is shorter than its 4-byte partition prefix")
    return INT32.unpack_from(store_key, 0)[0], bytes(store_key[INT32.size:])


def encode_stored_value(offset: int, timestamp: int, value: bytes) -> bytes:
    """The data column family value: Int64 offset + Int64 timestamp (ms) + the value bytes."""
    return VALUE_PREFIX.pack(offset, timestamp) + value


def decode_stored_value(partition: int, data: bytes, path: Path | str = "<store>") -> StoredValue:
    """The :class:`StoredValue` of ``partition`` held in ``data`` (from :func:`encode_stored_value`).

    Raises:
        StoreCorruptedError: ``data`` is shorter than its 16-byte offset/timestamp prefix.
    """
    if len(data) < VALUE_PREFIX.size:
        raise StoreCorruptedError(
            f"state store {path}: stored value of {len(data)} bytes in partition {partition} is shorter "
            f"than its {VALUE_PREFIX.size}-byte offset/timestamp prefix")
    offset, timestamp = VALUE_PREFIX.unpack_from(data, 0)
    return StoredValue(partition, offset, timestamp, bytes(data[VALUE_PREFIX.size:]))


def next_offset_key(partition: int) -> bytes:
    """The metadata key of ``partition``'s next offset."""
    return NEXT_OFFSET_KEY_PREFIX + INT32.pack(partition)


def start_offset_key(partition: int) -> bytes:
    """The metadata key of the log start offset ``partition``'s entries follow."""
    return START_OFFSET_KEY_PREFIX + INT32.pack(partition)


def prefix_end(prefix: bytes) -> bytes | None:
    """The smallest key above every key starting with ``prefix`` (None: no upper bound)."""
    stripped = prefix.rstrip(b"\xff")
    return None if not stripped else stripped[:-1] + bytes([stripped[-1] + 1])


def latest_across_partitions(values: Iterable[StoredValue]) -> StoredValue | None:
    """The value a key has when it lives in several partitions: "last write wins across partitions".

    The value whose record has the latest timestamp (ms); on equal timestamps the lower partition
    number. None for no values. Kafka orders records only within a partition, so this is the
    closest to "the latest write" a reader of several partitions can tell.
    """
    return min(values, key=lambda v: (-v.timestamp, v.partition), default=None)
