"""Rebuild a state store from local logs in bulk: the one loop behind store rebuilds and restores.

A ``read_committed`` reader per partition (:class:`~materializer.storage.read_committed.
CommittedReader`: aborted transactions and control batches skipped, reading stops at the last
stable offset) hands over whole committed batches. The native core takes them a group at a
time (``StoreEntries.add_batches``: one release of the interpreter lock per few MiB of batches,
lz4 decompressed natively, other codecs decompressed in Python first) straight into store entries
(latest value per ``(partition, key)``, tombstones as deletes, null keys skipped) with no Python
object per record; the entries then go to RocksDB in key order as SST files, puts and deletes
written by the native core without a Python object per key and ingested at once
(:meth:`StateStore.apply_store_entries`), with the next offsets written after them. All
partitions of one call share the entries, so a rebuild of a small topic is one write, not one per
partition.

Memory is bounded by ``chunk_bytes``: when the entries held reach it, the entries later records
replaced are dropped (``StoreEntries.compact``); when the latest entries alone still hold half of
it, they are written and the next offsets advanced to the end of the last batch taken, so a crash mid-way leaves a store whose
next offsets match its data (or lag it: see :meth:`StateStore.apply_entries`), never one that
claims offsets it does not hold.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Callable, NamedTuple

from materializer.adapters.rocksdb_store import StateStore
from materializer.storage import _native
from materializer.storage.read_committed import CommittedReader
from materializer.storage.compression import CompressionType
from materializer.storage.record_batch import TIMESTAMP_TYPE_MASK, RecordBatch
from materializer.storage.record_scan import records_section

__all__ = ["HeldEntries", "LoadResult", "load_committed", "load_committed_partitions", "DEFAULT_CHUNK_BYTES"]

DEFAULT_CHUNK_BYTES = 64 << 20
"""Bytes of entries (keys + values + 32 bytes each) held in memory before a write: 64 MiB."""


class LoadResult(NamedTuple):
    """What a load did for one partition: keyed records applied (puts and deletes before
    de-duplication), records skipped for a null key, the partition's next offset stored, and the
    bytes of the records applied (encoded store keys and values, before de-duplication)."""

    applied: int
    null_keys: int
    next_offset: int
    bytes_written: int = 0


class HeldEntries:
    """Entries taken by loads that did not write them yet (``load_committed_partitions(...,
    hold=...)``): a cold start's stretches then share one chunk, so a key written many times over
    the stretches is sorted and written once, not once per stretch.

    ``pending`` is each partition's next offset once the held entries are written; ``written`` the
    next offsets the loads did write (a chunk that filled), taken by the caller with
    :meth:`take_written`. Not thread-safe: one thread loads and writes at a time.
    """

    def __init__(self) -> None:
        self.entries = _native.StoreEntries()
        self.pending: dict[int, int] = {}
        self.written: dict[int, int] = {}

    def __bool__(self) -> bool:
        return bool(self.pending)

    def take_written(self) -> dict[int, int]:
        """The next offsets written since the last call."""
        written, self.written = self.written, {}
        return written

    def write(self, store: StateStore) -> dict[int, int]:
        """Write what is held (one atomic store write with the next offsets); returns the next
        offsets written (also in :attr:`written`). Raises what
        :meth:`StateStore.apply_store_entries` raises."""
        pending = dict(self.pending)
        if pending:
            store.apply_store_entries(self.entries, pending)
            self.written.update(pending)
            self.pending.clear()
        return pending

    def drop(self) -> None:
        """Forget what is held (its records are still in the log; the store's offsets replay them)."""
        self.entries = _native.StoreEntries()
        self.pending.clear()
        self.written.clear()

    def release(self) -> None:
        """Free the memory the entries keep for the next chunk (their arena and the one their
        last sort replaced, up to a few chunks), once what was held is written: a service
        keeps its ``HeldEntries`` after the cold start, and its next loads are small.

        Raises:
            ValueError: entries are still held (write or drop them first).
        """
        if self.pending:
            raise ValueError("entries are still held: write or drop them before releasing their memory")
        self.entries = _native.StoreEntries()


NATIVE_CODECS = frozenset((CompressionType.NONE, CompressionType.LZ4))
"""Codecs whose batches the native core decompresses and decodes in one call
(``StoreEntries.add_batches``); the others are decompressed in Python first."""

GROUP_BYTES = 4 << 20
"""Bytes of batches handed to the native core in one call (4 MiB): one release of the
interpreter lock per group instead of two per batch, while the reader's buffers stay small."""


class _BatchTaker:
    """Takes one partition's committed batches into ``entries``: in groups through the native
    core, one by one (decompressed in Python) where it declines a batch, and calls ``on_full``
    after any batch that brings the entries to ``chunk_bytes`` (the caller writes the chunk there);
    counts what it took. After the native core declines an lz4 batch (a frame Kafka's reader
    would refuse, liblz4's linked blocks), the partition's lz4 batches go the Python way: a
    producer writes all its frames alike, and declining each would cost a call per batch."""

    def __init__(self, entries: _native.StoreEntries, partition: int, start: int, end: int, *, chunk_bytes: int,
                 on_full: Callable[[RecordBatch], None]) -> None:
        self.entries, self.partition, self.start, self.end = entries, partition, start, end
        self.chunk_bytes, self.on_full = chunk_bytes, on_full
        self.native_codecs = NATIVE_CODECS
        self.applied = self.null_keys = self.taken_bytes = 0

    def take_group(self, group: list[RecordBatch]) -> None:
        """Take every batch of ``group`` (same errors as :meth:`take_one`)."""
        entries = self.entries
        while group:
            held = entries.held_bytes - 32 * len(entries)
            taken, records, nulls, declined = entries.add_batches([batch.buffer for batch in group], self.partition,
                                                                  self.start, self.end, self.chunk_bytes)
            self.applied += records
            self.null_keys += nulls
            self.taken_bytes += entries.held_bytes - 32 * len(entries) - held
            if declined is not None:
                if group[taken].compression_type == CompressionType.LZ4:
                    self.native_codecs = NATIVE_CODECS - {CompressionType.LZ4}
                self.take_one(group[taken])  # decompressed in Python; raises if it is really broken
                taken += 1
            if taken:
                self.on_full(group[taken - 1])
            group = group[taken:]
            if declined is not None and self.native_codecs != NATIVE_CODECS:
                for batch in group:  # the rest of this group the Python way too: no call per batch
                    self.take_one(batch)
                return

    def take_one(self, batch: RecordBatch) -> None:
        """Take one batch, its records section decompressed in Python, then ``on_full(batch)``.

        Raises:
            CorruptRecordError: the batch's records do not decompress or decode (file and position).
        """
        header = batch.header
        if header.records_count <= 0:
            batch.records()  # nothing to apply; a negative count raises with file and position
            return
        entries = self.entries
        log_append_time = header.max_timestamp if header.attributes & TIMESTAMP_TYPE_MASK else None
        held = entries.held_bytes - 32 * len(entries)
        try:
            taken, nulls, _ = entries.add_records(records_section(batch), header.records_count, header.base_offset,
                                                  header.base_timestamp, log_append_time, self.partition,
                                                  self.start, self.end)
        except ValueError as exc:
            raise batch.corruption_error(f"invalid records in batch at base offset {header.base_offset}: {exc}") from exc
        self.applied += taken
        self.null_keys += nulls
        self.taken_bytes += entries.held_bytes - 32 * len(entries) - held
        self.on_full(batch)


def load_committed(store: StateStore, partition: int, reader: CommittedReader, *,
                   chunk_bytes: int = DEFAULT_CHUNK_BYTES,
                   on_progress: Callable[[int], None] | None = None) -> LoadResult:
    """Apply the committed records ``reader`` yields (offsets in ``[start_offset,
    last_stable_offset)``) of ``partition`` to ``store``, and store the reader's next offset:
    :func:`load_committed_partitions` for one partition. Same errors."""
    return load_committed_partitions(store, {partition: reader}, chunk_bytes=chunk_bytes,
                                     on_progress=on_progress)[partition]


def load_committed_partitions(store: StateStore, readers: Mapping[int, CommittedReader], *,
                              chunk_bytes: int = DEFAULT_CHUNK_BYTES,
                              on_progress: Callable[[int], None] | None = None,
                              hold: HeldEntries | None = None) -> dict[int, LoadResult]:
    """Apply each partition's committed records (``readers[partition]``, offsets in
    ``[start_offset, last_stable_offset)``) to ``store`` and store each reader's next offset.

    Partitions are read in the mapping's order into shared chunks of at most ``chunk_bytes`` of
    entries (bytes: keys + values + 32 per record); each chunk is one atomic store write carrying
    the next offsets of the partitions it covers. ``on_progress(offsets)`` is called after each
    write with the offsets covered since the previous call (offsets, not records: gaps from
    compaction count).

    With ``hold``, the entries go into ``hold`` (joining what earlier loads left there) and the
    last chunk is left there unwritten; each result's ``next_offset`` is then where the next load
    of the partition starts, and ``hold.written`` says which next offsets reached the store.

    Returns:
        ``{partition: LoadResult}`` for every partition of ``readers``.

    Raises:
        CorruptRecordError: a batch whose records section does not decode (file and position).
        StoreError: the store cannot be written or an offset would move backwards.
    """
    holder = hold if hold is not None else HeldEntries()
    entries = holder.entries
    results: dict[int, LoadResult] = {}
    pending = holder.pending  # partitions with entries held: their next offset once written
    reported = {partition: reader.start_offset for partition, reader in readers.items()}

    def write() -> None:
        covered = sum(offset - reported.get(p, offset) for p, offset in pending.items())
        reported.update(holder.write(store))
        if on_progress is not None and covered > 0:
            on_progress(covered)

    for partition, reader in readers.items():
        start, end = reader.start_offset, reader.end_offset

        def on_full(batch: RecordBatch, partition: int = partition, start: int = start, end: int = end) -> None:
            # A full chunk first drops what later records replaced; it is written only when the
            # latest entries alone fill half of it (a topic that repeats its keys then ends in
            # one SST file, not one per chunk of records).
            if entries.held_bytes >= chunk_bytes and entries.compact() >= chunk_bytes // 2:
                pending[partition] = max(start, min(batch.next_offset, end))
                write()

        taker = _BatchTaker(entries, partition, start, end, chunk_bytes=chunk_bytes, on_full=on_full)
        group: list[RecordBatch] = []
        group_bytes = 0
        for batch in reader.batches():
            if batch.compression_type in taker.native_codecs:
                group.append(batch)
                group_bytes += len(batch.buffer)
                if group_bytes < GROUP_BYTES:
                    continue
                taker.take_group(group)
            else:
                taker.take_group(group)
                taker.take_one(batch)
            group, group_bytes = [], 0  # every batch up to ``batch`` is taken
        taker.take_group(group)
        pending[partition] = max(reader.next_offset, start)
        results[partition] = LoadResult(taker.applied, taker.null_keys, pending[partition], taker.taken_bytes)
    if hold is None:
        write()
    return results
