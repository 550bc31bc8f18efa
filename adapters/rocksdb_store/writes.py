"""Writing a state store: the ONE write path (:meth:`StoreWrites._writing`) and the record-by-record
writers on it (``apply``, ``drop_partition``, ``drop_below``).

Invariant: every write puts its data changes -- the puts, the deletes (a tombstone, a null value,
deletes the key in its partition and nothing in another partition, and records where it was in the
tombstones column family; a put does nothing more) -- AND the new next offsets in ONE ``WriteBatch``, so the values and the offsets they reflect are always consistent, and a next
offset never moves backwards (:class:`~materializer.adapters.errors.StoreError`). The only data that
reaches the store outside that batch are SST files the bulk writers ingest inside the same
:meth:`~StoreWrites._writing` block, before its batch (``rocksdb_store.bulk``: a crash between the
two leaves values ahead of the offsets, which a replay writes again, never offsets ahead of values).

Modelled on Quix Streams' ``RocksDBStorePartition.write`` (one batch for data and changelog
offset). Not thread-safe: one writer per store.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING

from rocksdict import Rdict, WriteBatch

from ..errors import StoreError
from .layout import (
    INT64,
    VALUE_PREFIX,
    encode_store_key,
    encode_stored_value,
    encode_tombstone,
    next_offset_key,
    partition_prefix,
    start_offset_key,
)
from .reads import StoreReads

__all__ = ["StoreWrites"]

_NONE: Mapping[int, int] = {}

if TYPE_CHECKING:  # pragma: no cover - a reader of the store does not load the record batch codec
    from ...storage.record_batch import Record


class StoreWrites(StoreReads):
    """The write path of :class:`~materializer.adapters.rocksdb_store.StateStore` (module docstring)."""

    def _require_writable(self, next_offsets: Mapping[int, int] = _NONE) -> Rdict:
        """The open RocksDB, when this store may take a write that sets ``next_offsets``.

        Raises:
            StoreError: the store is closed or read-only, or a next offset would move backwards.
        """
        db = self._require_open()
        if self.read_only:
            raise StoreError(f"state store {self.path} is open read-only")
        for partition, next_offset in next_offsets.items():
            current = self._offsets.get(partition)
            if current is not None and next_offset < current:
                raise StoreError(
                    f"state store {self.path}: refusing to move the next offset of partition {partition} "
                    f"backwards from {current} to {next_offset}")
        return db

    @contextlib.contextmanager
    def _writing(self, next_offsets: Mapping[int, int] = _NONE, *, start_offsets: Mapping[int, int] = _NONE,
                 forget: Iterable[int] = ()) -> Iterator[WriteBatch]:
        """THE write path: every write of the store's data and offsets goes through here.

        On entry, checks the store is open and writable and that no next offset moves backwards
        (:meth:`_require_writable`), and yields a ``WriteBatch`` (raw mode) for the caller's puts
        and deletes of the data column family. When the block ends without an exception, adds to
        that batch ``next_offsets`` (partition -> next offset to apply), ``start_offsets``
        (partition -> log start offset its entries follow) and, for each partition of ``forget``,
        the removal of both; writes the batch atomically (``WriteOptions`` of the store) and only
        then updates the next offsets in memory. An exception in the block writes nothing.

        Raises:
            StoreError: on entry as :meth:`_require_writable`; on exit RocksDB's failure (mapped).
        """
        db = self._require_writable(next_offsets)
        batch = WriteBatch(raw_mode=True)
        yield batch
        metadata = self._metadata_handle
        for partition, next_offset in next_offsets.items():
            batch.put(next_offset_key(partition), INT64.pack(next_offset), metadata)
        for partition, start_offset in start_offsets.items():
            batch.put(start_offset_key(partition), INT64.pack(start_offset), metadata)
        forgotten = tuple(forget)
        for partition in forgotten:
            batch.delete(next_offset_key(partition), metadata)
            batch.delete(start_offset_key(partition), metadata)
        with self._mapped_errors():
            db.write(batch, self._write_options)
        self._offsets.update(next_offsets)
        for partition in forgotten:
            self._offsets.pop(partition, None)

    def apply(self, records_by_partition: Mapping[int, Sequence[Record]], next_offsets: Mapping[int, int]) -> int:
        """Apply records in order and set next offsets, all in ONE atomic ``WriteBatch``.

        A record with a value puts ``(partition, key) -> (offset, timestamp, value)``; a record
        with a null value (tombstone) deletes ``(partition, key)`` and nothing in another
        partition, and records ``(partition, key) -> (offset, timestamp)`` in the tombstones
        column family (:meth:`tombstone`). Records of one partition must be in offset order.

        Args:
            records_by_partition: partition -> records to apply (keys must not be None).
            next_offsets: partition -> next offset to store (normally last applied offset + 1);
                every partition in ``records_by_partition`` must have one, above its last record.

        Returns:
            The number of records applied (puts + deletes).

        Raises:
            StoreError: a next offset would move backwards; the store is closed or read-only.
            ValueError: a record without key, or a next offset missing or not above a record.
        """
        applied = 0
        with self._writing(next_offsets) as batch:
            data, tombstones = self._data_handle, self._tombstones_handle
            for partition, records in records_by_partition.items():
                if not records:
                    continue
                if partition not in next_offsets:
                    raise ValueError(f"records for partition {partition} come without a next offset")
                if records[-1].offset >= next_offsets[partition]:
                    raise ValueError(f"next offset {next_offsets[partition]} of partition {partition} is not above "
                                     f"its last record offset {records[-1].offset}")
                for record in records:
                    if record.key is None:
                        raise ValueError(f"record at offset {record.offset} of partition {partition} has a null key")
                    store_key = encode_store_key(partition, record.key)
                    if record.value is None:
                        batch.delete(store_key, data)
                        if tombstones is not None:
                            batch.put(store_key, encode_tombstone(record.offset, record.timestamp), tombstones)
                    else:
                        batch.put(store_key, encode_stored_value(record.offset, record.timestamp, record.value), data)
                    applied += 1
        return applied

    def drop_partition(self, partition: int) -> int:
        """Delete every entry of ``partition`` and its next offset, in ONE atomic ``WriteBatch``.

        For a partition whose local log restarts elsewhere (it is then re-materialized from what is
        fetched again); other partitions are untouched. One range delete over the partition's
        contiguous keys, as Kafka Streams drops a task's store, and one over its tombstone records.

        Returns:
            The number of entries deleted.

        Raises:
            ValueError: ``partition`` outside [0, 2**31 - 2].
            StoreError: the store is closed or read-only, or RocksDB failed.
        """
        with self._writing(forget=(partition,)) as batch:
            if not 0 <= partition < 2**31 - 1:
                raise ValueError(f"partition {partition} is outside [0, {2**31 - 2}]")
            dropped = self.count(partition)
            batch.delete_range(partition_prefix(partition), partition_prefix(partition + 1), self._data_handle)
            if self._tombstones_handle is not None:
                batch.delete_range(partition_prefix(partition), partition_prefix(partition + 1),
                                   self._tombstones_handle)
        return dropped

    def drop_below(self, partition: int, start_offset: int) -> int:
        """Delete every entry of ``partition`` whose record offset is below ``start_offset``, record
        ``start_offset``, and raise the partition's next offset to it when below, in ONE atomic
        ``WriteBatch``.

        For a partition whose log start offset rose (retention, DeleteRecords on the broker, a
        log restarted at the broker's log start offset): a key whose latest record is below it has
        no record left in the log, so a consumer reading the topic now would not see it, nor would
        a store rebuilt from the log; a key with a later record keeps it. The records below it that
        were never applied are gone too, so the next offset is at least ``start_offset``. Reads
        every entry of the partition once (O(its keys), about 1-2 µs each); when every applied
        record is below ``start_offset``, one range delete after counting the keys. The tombstone
        records below ``start_offset`` go in the same batch (their tombstones are gone from the
        log). A no-op when ``start_offset`` is not above the recorded one.

        Returns:
            The number of entries deleted.

        Raises:
            StoreError: the store is closed or read-only, or RocksDB failed.
        """
        self._require_writable()  # a read-only store refuses even a no-op
        if start_offset <= self.start_offset(partition):
            return 0
        next_offset = self._offsets.get(partition)
        raised = {partition: start_offset} if next_offset is not None and next_offset < start_offset else _NONE
        head = partition_prefix(partition)
        with self._writing(raised, start_offsets={partition: start_offset}) as batch, self._mapped_errors():
            if next_offset is not None and next_offset <= start_offset:
                # every entry's record is below the next offset: the whole partition goes
                doomed = self.count(partition)
                batch.delete_range(head, partition_prefix(partition + 1), self._data_handle)
            else:
                doomed = 0
                offset_of = INT64.unpack_from
                for store_key, data in self._checked(self._data, head):
                    if not store_key.startswith(head):
                        break
                    if len(data) >= VALUE_PREFIX.size and offset_of(data, 0)[0] < start_offset:
                        batch.delete(store_key, self._data_handle)
                        doomed += 1
            if self._tombstones_handle is not None:
                for key, tombstone in self.tombstone_records(partition):
                    if tombstone.offset < start_offset:
                        batch.delete(head + key, self._tombstones_handle)
        return doomed

    def forget_tombstones(self, partition: int, keys: Iterable[bytes]) -> int:
        """Delete the tombstone records of ``keys`` in ``partition`` (ones whose tombstone is no
        longer in the local log: the cleaner removed it after ``delete.retention.ms``, or a later
        record of the key replaced it), in ONE ``WriteBatch``; no offset changes.

        Returns:
            The number of keys given.

        Raises:
            StoreError: the store is closed or read-only, or RocksDB failed.
        """
        forgotten = 0
        with self._writing() as batch:
            if self._tombstones_handle is not None:
                for key in keys:
                    batch.delete(encode_store_key(partition, key), self._tombstones_handle)
                    forgotten += 1
        return forgotten
