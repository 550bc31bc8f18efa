"""Reading a state store: point lookups (one partition, or every partition with "last write wins
across partitions"), multi-gets, scans in key order, counts, and the offsets the values reflect.

When a key lives in more than one partition (after a partition-count increase, or producers with
different partitioners), :meth:`StoreReads.get` without a partition returns the value whose record
has the latest timestamp (on equal timestamps the lower partition number wins);
:meth:`StoreReads.get_all` returns every partition's value.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Iterator
from typing import cast

from .instance import StoreInstance
from .layout import (
    INT64,
    StoredValue,
    Tombstone,
    decode_store_key,
    decode_tombstone,
    decode_stored_value,
    encode_store_key,
    latest_across_partitions,
    partition_prefix,
    prefix_end,
    start_offset_key,
)

__all__ = ["StoreReads"]


class StoreReads(StoreInstance):
    """The read methods of :class:`~materializer.adapters.rocksdb_store.StateStore` (module docstring).

    Every method raises :class:`~materializer.adapters.errors.StoreError` when the store is closed
    or its reads were refused, and the mapped RocksDB errors.
    """

    def offsets(self) -> dict[int, int]:
        """Next offset to apply per partition (partitions never applied are absent)."""
        self._require_open()
        return dict(self._offsets)

    def partitions(self) -> list[int]:
        """Partitions applied so far (those with a next offset), ascending."""
        self._require_open()
        return sorted(self._offsets)

    def start_offset(self, partition: int) -> int:
        """The log start offset ``partition``'s entries follow (``drop_below``); 0 when never set."""
        self._require_open()
        with self._mapped_errors():
            data = self._metadata.get(start_offset_key(partition))
        return 0 if data is None else INT64.unpack(data)[0]

    def get(self, key: bytes, partition: int | None = None) -> StoredValue | None:
        """The live value of ``key``, or None when absent or deleted.

        Args:
            key: the record key bytes.
            partition: look only in this partition. None: every partition; when the key lives in
                several, the value whose record has the latest timestamp (equal timestamps: the
                lower partition number) -- "last write wins across partitions".

        Raises:
            StoreCorruptedError: the stored value is malformed.
        """
        self._require_open()
        key = bytes(key)
        if partition is not None:
            with self._mapped_errors():
                data = self._data.get(encode_store_key(partition, key))
            return None if data is None else decode_stored_value(partition, data, self.path)
        return latest_across_partitions(self.get_all(key).values())

    def get_all(self, key: bytes) -> dict[int, StoredValue]:
        """``partition -> StoredValue`` for every partition in which ``key`` is live (one multi-get).

        Raises:
            StoreCorruptedError: a stored value is malformed.
        """
        self._require_open()
        key = bytes(key)
        partitions = sorted(self._offsets)
        if not partitions:
            return {}
        with self._mapped_errors():
            found = self._multi_get([encode_store_key(p, key) for p in partitions])
        return {p: decode_stored_value(p, data, self.path)
                for p, data in zip(partitions, found) if data is not None}

    def _multi_get(self, store_keys: list[bytes]) -> list[bytes | None]:
        """One RocksDB multi-get of the data column family: each key's value, or None."""
        found = self._data.get(cast("list[str | int | float | bytes | bool]", store_keys))  # list: one multi-get
        return cast("list[bytes | None]", found)

    def items(self, partition: int | None = None) -> Iterator[tuple[bytes, StoredValue]]:
        """Every live ``(key, StoredValue)`` in (partition, key byte) order, or of one ``partition``.

        A key live in two partitions is yielded once for each.
        """
        self._require_open()
        prefix = b"" if partition is None else partition_prefix(partition)
        with self._mapped_errors():
            for store_key, data in self._checked(self._data, prefix):
                if not store_key.startswith(prefix):
                    break
                stored_partition, key = decode_store_key(store_key)
                yield key, decode_stored_value(stored_partition, data, self.path)

    def get_many(self, keys: Iterable[bytes], partition: int | None = None) -> dict[bytes, StoredValue]:
        """``key -> StoredValue`` for the live ``keys`` (absent ones left out), one multi-get.

        Without ``partition``, a key in several partitions gets the :meth:`get` rule (latest
        timestamp, then the lower partition).

        Raises:
            StoreCorruptedError: a stored value is malformed.
        """
        self._require_open()
        keys = [bytes(k) for k in keys]
        partitions = sorted(self._offsets) if partition is None else [partition]
        if not keys or not partitions:
            return {}
        prefixes = [partition_prefix(p) for p in partitions]  # encode_store_key, without a call per key
        with self._mapped_errors():
            found = self._multi_get([head + k for k in keys for head in prefixes])
        # the hot path of a multi-get of the query server: one pass, a value decoded only when found
        result: dict[bytes, StoredValue] = {}
        width, path = len(partitions), self.path
        for at, data in enumerate(found):
            if data is None:
                continue
            key, stored = keys[at // width], decode_stored_value(partitions[at % width], data, path)
            held = result.get(key)
            if held is None or latest_across_partitions((held, stored)) is stored:
                result[key] = stored
        return result

    def scan(self, start: bytes = b"", end: bytes | None = None, *, prefix: bytes | None = None,
             partition: int | None = None) -> Iterator[tuple[bytes, StoredValue]]:
        """Live ``(key, StoredValue)`` in key byte order, keys in ``[start, end)`` or starting with ``prefix``.

        Every partition's range is read and merged by key (a key live in two partitions is
        yielded once for each, lower partition first), or one ``partition``'s alone.
        """
        self._require_open()
        if prefix is not None:
            start, end = prefix, prefix_end(prefix)
        partitions = sorted(self._offsets) if partition is None else [partition]
        return heapq.merge(*(self._scan_partition(p, start, end) for p in partitions), key=lambda kv: kv[0])

    def _scan_partition(self, partition: int, start: bytes, end: bytes | None) -> Iterator[tuple[bytes, StoredValue]]:
        head = partition_prefix(partition)
        with self._mapped_errors():
            for store_key, data in self._checked(self._data, head + start):
                if not store_key.startswith(head):
                    return
                key = bytes(store_key[len(head):])
                if end is not None and key >= end:
                    return
                yield key, decode_stored_value(partition, data, self.path)

    def tombstone(self, key: bytes, partition: int) -> Tombstone | None:
        """Where ``key``'s latest tombstone applied in ``partition`` was, as the store recorded it
        with the delete; None when none was recorded (never deleted, deleted before the store
        recorded tombstones, or the record expired).

        Only meaningful for a key absent from ``partition``: a put after the tombstone leaves the
        record (puts cost nothing more), and the record may outlive the tombstone in the log (the
        cleaner removes tombstones after ``delete.retention.ms``): a reader confirms it against the
        local log before saying "deleted" (:mod:`materializer.deletions`).

        Raises:
            StoreCorruptedError: the record is malformed.
        """
        self._require_open()
        if self._tombstones is None:
            return None
        with self._mapped_errors():
            data = self._tombstones.get(encode_store_key(partition, bytes(key)))
        return None if data is None else decode_tombstone(partition, data, self.path)

    def tombstone_records(self, partition: int) -> Iterator[tuple[bytes, Tombstone]]:
        """Every ``(key, Tombstone)`` the store recorded in ``partition``, in key byte order."""
        self._require_open()
        if self._tombstones is None:
            return
        head = partition_prefix(partition)
        with self._mapped_errors():
            for store_key, data in self._checked(self._tombstones, head):
                if not store_key.startswith(head):
                    return
                yield bytes(store_key[len(head):]), decode_tombstone(partition, data, self.path)

    def tombstone_count(self) -> int:
        """Tombstone records the store holds, every partition (exact; iterates them)."""
        self._require_open()
        if self._tombstones is None:
            return 0
        with self._mapped_errors():
            return sum(1 for _ in self._checked(self._tombstones, keys_only=True))

    def count(self, partition: int | None = None) -> int:
        """Number of live (partition, key) entries, or of one ``partition`` (exact; iterates keys)."""
        self._require_open()
        if partition is None:
            with self._mapped_errors():
                return sum(1 for _ in self._checked(self._data, keys_only=True))
        prefix = partition_prefix(partition)
        count = 0
        with self._mapped_errors():
            for store_key in self._checked(self._data, prefix, keys_only=True):
                if not store_key.startswith(prefix):
                    break
                count += 1
        return count
