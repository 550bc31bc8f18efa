"""Rebuild a state store from a local log in bulk: the one loop behind store rebuilds and restores.

A ``read_committed`` reader (:class:`~materializer.storage.read_committed.CommittedReader`: aborted
transactions and control batches skipped, reading stops at the last stable offset) hands over whole
committed batches; the native core decodes each records section straight into store entries
(``_native.StoreEntries``: latest value per ``(partition, key)``, tombstones as deletes, null keys
skipped) with no Python object per record; the entries then go to RocksDB in key order as one SST
file ingested at once (:meth:`StateStore.apply_entries`), with the next offset written after it.

Memory is bounded by ``chunk_bytes``: when the entries held reach it they are written and the
next offset advanced to the end of the last batch taken, so a crash mid-way leaves a store whose
next offset matches its data (or lags it: see :meth:`StateStore.apply_entries`), never one that
claims offsets it does not hold.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

from materializer.adapters.rocksdb_store import StateStore
from materializer.storage import _native
from materializer.storage.read_committed import CommittedReader
from materializer.storage.record_batch import TIMESTAMP_TYPE_MASK
from materializer.storage.record_scan import records_section

__all__ = ["LoadResult", "load_committed", "DEFAULT_CHUNK_BYTES"]

DEFAULT_CHUNK_BYTES = 64 << 20
"""Bytes of entries (keys + values + 32 bytes each) held in memory before a write: 64 MiB."""


class LoadResult(NamedTuple):
    """What :func:`load_committed` did: keyed records applied (puts and deletes before
    de-duplication), records skipped for a null key, the partition's next offset stored, and the
    bytes of the records applied (encoded store keys and values, before de-duplication)."""

    applied: int
    null_keys: int
    next_offset: int
    bytes_written: int = 0


def load_committed(store: StateStore, partition: int, reader: CommittedReader, *,
                   chunk_bytes: int = DEFAULT_CHUNK_BYTES,
                   on_progress: Callable[[int], None] | None = None) -> LoadResult:
    """Apply the committed records ``reader`` yields (offsets in ``[start_offset,
    last_stable_offset)``) of ``partition`` to ``store``, and store the reader's next offset.

    ``on_progress(offsets)`` is called after each write with the offsets covered since the
    previous call (offsets, not records: gaps from compaction count).

    Raises:
        CorruptRecordError: a batch whose records section does not decode (file and position).
        StoreError: the store cannot be written or an offset would move backwards.
    """
    start, end = reader.start_offset, reader.end_offset
    entries = _native.StoreEntries()
    applied = null_keys = written = 0
    reported = start
    for batch in reader.batches():
        header = batch.header
        if header.records_count <= 0:
            batch.records()  # nothing to apply; a negative count raises with file and position
            continue
        log_append_time = header.max_timestamp if header.attributes & TIMESTAMP_TYPE_MASK else None
        try:
            taken, nulls, _ = entries.add_records(records_section(batch), header.records_count, header.base_offset,
                                                  header.base_timestamp, log_append_time, partition, start, end)
        except ValueError as exc:
            raise batch._error(f"invalid records in batch at base offset {header.base_offset}: {exc}") from exc
        applied += taken
        null_keys += nulls
        if entries.held_bytes >= chunk_bytes:
            written_to = max(start, min(batch.next_offset, end))
            written += _write(store, entries, {partition: written_to})
            if on_progress is not None:
                on_progress(written_to - reported)
            reported = written_to
    next_offset = max(reader.next_offset, start)
    written += _write(store, entries, {partition: next_offset})
    if on_progress is not None and next_offset > reported:
        on_progress(next_offset - reported)
    return LoadResult(applied, null_keys, next_offset, written)


def _write(store: StateStore, entries: _native.StoreEntries, next_offsets: dict[int, int]) -> int:
    """Write and reset ``entries`` with ``next_offsets``; returns the bytes of the records taken
    (their encoded keys and values, before de-duplication: ``held_bytes`` less 32 per record)."""
    taken_bytes = entries.held_bytes - 32 * len(entries)
    store.apply_entries(*entries.take_sorted(), next_offsets)
    return taken_bytes
