"""Rebuild a state store from local logs in bulk: the one loop behind store rebuilds and restores.

A ``read_committed`` reader per partition (:class:`~materializer.storage.read_committed.
CommittedReader`: aborted transactions and control batches skipped, reading stops at the last
stable offset) hands over whole committed batches. The native core takes them a group at a
time (``StoreEntries.add_batches``: one release of the interpreter lock per few MiB of batches,
lz4 decompressed natively, other codecs decompressed in Python first) straight into store entries
(latest value per ``(partition, key)``, tombstones as deletes, null keys skipped) with no Python
object per record; the entries then go to RocksDB in key order as SST files, puts and deletes
written by the native core without a Python object per key and ingested at once
(:meth:`StateStore.apply_store_entries`), with the next offsets written after them. The
partitions of a small load share the entries, so a rebuild of a small topic is one write, not one
per partition; a large one holds its partitions in one group per core (partition ``p`` in group
``p % groups``), each loaded on a thread of its own, so the decode, the sorts and the SST writes
of a cold start or a rebuild use every core (no key is in two groups: each partition is a key
range of its own in the store).

Memory is bounded by ``chunk_bytes`` (shared evenly by the groups): when the entries held reach it, the entries later records
replaced are dropped (``StoreEntries.compact``); when the latest entries alone still hold half of
it, they are written and the next offsets advanced to the end of the last batch taken, so a crash mid-way leaves a store whose
next offsets match its data (or lag it: see :meth:`StateStore.apply_entries`), never one that
claims offsets it does not hold.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor, wait
from typing import Callable, NamedTuple

from materializer.adapters.rocksdb_store import StateStore
from materializer.storage import _native
from materializer.storage.read_committed import CommittedReader
from materializer.storage.compression import CompressionType
from materializer.storage.record_batch import TIMESTAMP_TYPE_MASK, RecordBatch
from materializer.storage.record_scan import records_section

__all__ = ["HeldEntries", "LoadResult", "load_committed", "load_committed_partitions", "apply_threads",
           "DEFAULT_CHUNK_BYTES", "PARALLEL_MIN_OFFSETS"]

DEFAULT_CHUNK_BYTES = 48 << 20
"""Bytes of entries (keys + values + 32 bytes each) held in memory before a write: 48 MiB (the
sorts keep a second arena of about as much; 64 MiB took a 10M-record cold start past 400 MiB
of peak RSS, no faster)."""


class LoadResult(NamedTuple):
    """What a load did for one partition: keyed records applied (puts and deletes before
    de-duplication), records skipped for a null key, the partition's next offset stored, and the
    bytes of the records applied (encoded store keys and values, before de-duplication)."""

    applied: int
    null_keys: int
    next_offset: int
    bytes_written: int = 0


def apply_threads() -> int:
    """Threads a large load runs its partition groups on: one per core this process may use, at most 4."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    return max(1, min(4, cores))


PARALLEL_MIN_OFFSETS = 200_000
"""Offsets a load must span (over its partitions) before its partition groups run on threads of
their own: below it, threads and smaller writes cost more than they save (a write of fewer
than ``bulk_min_entries`` puts leaves the native SST path, see
:meth:`StateStore.apply_store_entries`)."""


class HeldEntries:
    """Entries taken by loads that did not write them yet (``load_committed_partitions(...,
    hold=...)``): a cold start's stretches then share chunks, so a key written many times over
    the stretches is sorted and written once, not once per stretch.

    The entries are kept in ``slots`` groups, partition ``p`` always in slot ``p % slots``, so
    that a large load can decode, sort and write each slot's partitions on a thread of its own
    while every partition's records stay in offset order in one place. (A slot's files span the
    key ranges of its partitions, so they interleave with other slots' files in key order, but
    never hold the same key.)

    ``pending`` is each partition's next offset once the held entries are written; ``written`` the
    next offsets the loads did write (a chunk that filled), taken by the caller with
    :meth:`take_written`. One load at a time; within it, one thread per slot.

    Raises:
        ValueError: ``slots < 1``.
    """

    def __init__(self, slots: int = 1) -> None:
        if slots < 1:
            raise ValueError(f"slots must be at least 1, not {slots}")
        self._slots = [_native.StoreEntries() for _ in range(slots)]
        self.pending: dict[int, int] = {}
        self.written: dict[int, int] = {}
        self._lock = threading.Lock()  # pending and written: a slot's thread writes while another adds

    def __bool__(self) -> bool:
        with self._lock:
            return bool(self.pending)

    @property
    def slots(self) -> int:
        """How many groups the partitions are held in."""
        return len(self._slots)

    def slot_of(self, partition: int) -> int:
        """The slot ``partition``'s entries are held in."""
        return partition % len(self._slots)

    def entries(self, slot: int) -> _native.StoreEntries:
        """The entries held in ``slot``."""
        return self._slots[slot]

    @property
    def held_bytes(self) -> int:
        """Bytes held over all slots (``StoreEntries.held_bytes``)."""
        return sum(entries.held_bytes for entries in self._slots)

    def hold(self, partition: int, next_offset: int) -> None:
        """Note that ``partition``'s entries up to ``next_offset`` are held."""
        with self._lock:
            self.pending[partition] = next_offset

    def take_written(self) -> dict[int, int]:
        """The next offsets written since the last call."""
        with self._lock:
            written, self.written = self.written, {}
        return written

    def write(self, store: StateStore, slot: int | None = None) -> dict[int, int]:
        """Write what ``slot`` holds (every slot by default), one atomic store write per slot
        with the next offsets of its partitions; returns the next offsets written (also in
        :attr:`written`). Every slot at once: the slots that hold entries are written on threads
        of their own (the native core sorts and writes SST files without the interpreter lock),
        so the last write of a cold start uses every core. When a slot fails, its entries and
        next offsets are dropped (the store's offsets replay them from the log), the slots
        written by then stay written (their offsets are in :attr:`written`) and a failure is
        raised (the lowest slot's). Raises what :meth:`StateStore.apply_store_entries` raises."""
        with self._lock:
            slots = sorted({self.slot_of(p) for p in self.pending}) if slot is None else [slot]
        if len(slots) <= 1:
            return self._write_slot(store, slots[0]) if slots else {}
        written: dict[int, int] = {}
        with ThreadPoolExecutor(max_workers=len(slots) - 1, thread_name_prefix="materializer-write") as pool:
            others = [pool.submit(self._write_slot, store, current) for current in slots[1:]]
            try:
                written.update(self._write_slot(store, slots[0]))
            finally:
                wait(others)  # no write outlives the call, even when this one failed
        for future in others:
            written.update(future.result())  # the first failure is raised here
        return written

    def _write_slot(self, store: StateStore, slot: int) -> dict[int, int]:
        """Write what ``slot`` holds in one atomic store write; returns the next offsets written."""
        with self._lock:
            pending = {p: offset for p, offset in self.pending.items() if self.slot_of(p) == slot}
        if not pending:
            return {}
        # the slots' threads write at once: one SST file each, not one per core each (a
        # 10M-record cold start otherwise piled up 96 L0 files and a full manual compaction)
        try:
            store.apply_store_entries(self._slots[slot], pending,
                                      max_files=max(1, (os.cpu_count() or 1) // len(self._slots)))
        except BaseException:
            # The native write may have consumed the entries: drop them and their offsets, so no
            # later write can store these offsets without their data (the log still holds it).
            with self._lock:
                for partition in pending:
                    del self.pending[partition]
                self._slots[slot] = _native.StoreEntries()
            raise
        with self._lock:
            for partition in pending:
                del self.pending[partition]
            self.written.update(pending)
        return pending

    def drop(self) -> None:
        """Forget what is held (its records are still in the log; the store's offsets replay them)."""
        self._slots = [_native.StoreEntries() for _ in self._slots]
        with self._lock:
            self.pending.clear()
            self.written.clear()

    def release(self) -> None:
        """Free the memory the entries keep for the next chunk (their arena and the one their
        last sort replaced, up to a few chunks per slot), once what was held is written: a
        service keeps its ``HeldEntries`` after the cold start, and its next loads are small.
        The call returns at once: new, empty slots replace the old ones, whose pages are freed
        on a thread of its own.

        Raises:
            ValueError: entries are still held (write or drop them first).
        """
        if self:
            raise ValueError("entries are still held: write or drop them before releasing their memory")
        released, self._slots = self._slots, [_native.StoreEntries() for _ in self._slots]
        # The kernel takes a few milliseconds per chunk to free the pages: done on a thread of its
        # own (without the interpreter lock), so that a cold start is ready without waiting for it.
        # Not a daemon (explicitly: a thread inherits its creator's flag, and the apply worker is one):
        # the interpreter waits for it at exit instead of stopping it inside native code.
        threading.Thread(target=_free_memory, args=(released,), name="materializer-free", daemon=False).start()


def _free_memory(released: list[_native.StoreEntries]) -> None:
    for entries in released:
        entries.free_memory()


class _Progress:
    """``on_progress`` of one load, told the next offsets each write stored (from any slot's thread)."""

    def __init__(self, readers: Mapping[int, CommittedReader], on_progress: Callable[[int], None] | None) -> None:
        self._reported = {partition: reader.start_offset for partition, reader in readers.items()}
        self._on_progress = on_progress
        self._lock = threading.Lock()

    def written(self, next_offsets: Mapping[int, int]) -> None:
        with self._lock:  # one callback at a time, in the order the writes were counted
            covered = sum(offset - self._reported.get(p, offset) for p, offset in next_offsets.items())
            self._reported.update(next_offsets)
            if self._on_progress is not None and covered > 0:
                self._on_progress(covered)


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

    The partitions are held in slots (:class:`HeldEntries`: ``hold``'s, or one per core when the
    load spans :data:`PARALLEL_MIN_OFFSETS` offsets, else one); each slot's partitions are read in
    the mapping's order into shared chunks of at most ``chunk_bytes / slots`` bytes of entries
    (keys + values + 32 per record), each chunk one atomic store write carrying the next offsets
    of the partitions it covers. Slots run on threads of their own when the load spans
    :data:`PARALLEL_MIN_OFFSETS` offsets: the native core decodes, sorts and writes SST files
    with the interpreter lock released, so a cold start's apply uses the cores the fetch leaves
    idle; partitions are disjoint key ranges of the store, so no key is in two slots. A slot that
    fails stops the others at their next batch group; the first failure is raised.
    ``on_progress(offsets)`` is called after each write with the offsets covered since the
    previous call (offsets, not records: gaps from compaction count), one call at a time.

    With ``hold``, the entries go into ``hold`` (joining what earlier loads left there) and each
    slot's last chunk is left there unwritten; each result's ``next_offset`` is then where the
    next load of the partition starts, and ``hold.written`` says which next offsets reached the
    store.

    Returns:
        ``{partition: LoadResult}`` for every partition of ``readers``.

    Raises:
        CorruptRecordError: a batch whose records section does not decode (file and position).
        StoreError: the store cannot be written or an offset would move backwards.
    """
    spans = sum(max(0, reader.end_offset - reader.start_offset) for reader in readers.values())
    parallel = spans >= PARALLEL_MIN_OFFSETS
    holder = hold if hold is not None else HeldEntries(min(apply_threads(), len(readers)) if parallel else 1)
    groups: dict[int, dict[int, CommittedReader]] = {}
    for partition, reader in readers.items():
        groups.setdefault(holder.slot_of(partition), {})[partition] = reader
    progress = _Progress(readers, on_progress)
    slot_chunk_bytes = max(1, chunk_bytes // holder.slots)

    stop = threading.Event()  # set by a slot that fails (or is interrupted): the others stop too

    def load(slot: int, group: dict[int, CommittedReader]) -> dict[int, LoadResult]:
        try:
            return _load_slot(store, holder, slot, group, slot_chunk_bytes, progress, stop,
                              write_last=hold is None)
        except BaseException:
            stop.set()
            raise

    if not parallel or len(groups) == 1:
        return {partition: result for slot, group in groups.items() for partition, result in load(slot, group).items()}
    first, *others = groups.items()
    with ThreadPoolExecutor(max_workers=len(others), thread_name_prefix="materializer-load") as pool:
        running = [pool.submit(load, slot, group) for slot, group in others]
        try:
            results = load(*first)
        except _LoadStopped:
            results = {}  # another slot failed first: its error is raised below
        finally:
            wait(running)  # no slot's thread outlives the load, even when this one failed
    failures = [exc for exc in (future.exception() for future in running) if exc is not None]
    first_failure = next((exc for exc in failures if not isinstance(exc, _LoadStopped)), None)
    if first_failure is not None:
        raise first_failure
    for future in running:
        results.update(future.result())
    return results


class _LoadStopped(Exception):
    """A slot stopped because another slot of the same load failed."""


def _load_slot(store: StateStore, holder: HeldEntries, slot: int, readers: Mapping[int, CommittedReader],
               chunk_bytes: int, progress: _Progress, stop: threading.Event, *,
               write_last: bool) -> dict[int, LoadResult]:
    """:func:`load_committed_partitions` for the partitions of one slot (``readers``, all held in
    it); raises :class:`_LoadStopped` at the next batch group once ``stop`` is set."""
    entries = holder.entries(slot)
    results: dict[int, LoadResult] = {}

    def write() -> None:
        progress.written(holder.write(store, slot))

    for partition, reader in readers.items():
        start, end = reader.start_offset, reader.end_offset

        def on_full(batch: RecordBatch, partition: int = partition, start: int = start, end: int = end) -> None:
            # A full chunk first drops what later records replaced; it is written only when the
            # latest entries alone fill half of it (a topic that repeats its keys then ends in
            # one SST file, not one per chunk of records).
            if entries.held_bytes >= chunk_bytes and entries.compact() >= chunk_bytes // 2:
                holder.hold(partition, max(start, min(batch.next_offset, end)))
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
                if stop.is_set():
                    raise _LoadStopped
                taker.take_group(group)
            else:
                taker.take_group(group)
                taker.take_one(batch)
            group, group_bytes = [], 0  # every batch up to ``batch`` is taken
        taker.take_group(group)
        next_offset = max(reader.next_offset, start)
        holder.hold(partition, next_offset)
        results[partition] = LoadResult(taker.applied, taker.null_keys, next_offset, taker.taken_bytes)
    if stop.is_set():
        raise _LoadStopped
    if write_last:
        write()
    return results
