"""Committed records of a local log into the state store: a store rebuilt from its logs, a stretch
of one partition applied in bulk or record by record (the replay at start, an offline restore, a
partition rewound after its log was cut).

Records are read as a ``read_committed`` consumer reads them
(:class:`~materializer.storage.read_committed.CommittedReader`: aborted transactional batches and
control batches skipped, reading stops at the last stable offset). Without a record check the
records never become Python objects: :func:`~materializer.apply.store_loader.load_committed_partitions`
decodes them in the native core and writes SST files; with one (a key/value format check), they
are applied record by record, every 10,000 in one atomic write.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Callable, NamedTuple

from materializer.adapters.errors import StoreError
from materializer.adapters.rocksdb_store import StateStore
from materializer.apply.store_loader import DEFAULT_CHUNK_BYTES, LoadResult, load_committed, load_committed_partitions
from materializer.storage.log import Log
from materializer.storage.read_committed import AbortedTxnSource, CommittedReader
from materializer.storage.record_batch import Record

__all__ = ["AppliedRecords", "RecordCheck", "apply_checked_records", "apply_committed_reader",
           "apply_committed_records", "rebuild_store_from_logs"]

logger = logging.getLogger(__name__)

_REPLAY_CHUNK_RECORDS = 10_000

#: ``(partition, record) -> apply it?``: a key/value format check (:class:`materializer.apply.applier.FormatCheck`).
RecordCheck = Callable[[int, Record], bool]


def rebuild_store_from_logs(store: StateStore, logs: dict[int, Log], from_offsets: dict[int, int] | None = None,
                            keep: RecordCheck | None = None,
                            on_progress: Callable[[int], None] | None = None) -> int:
    """Apply each log's committed records from ``from_offsets[p]`` (default: its log start offset)
    into ``store``, the way a ``read_committed`` consumer reads them (:class:`CommittedReader`):
    aborted transactional batches and control batches are skipped, and reading stops at the last
    stable offset. Each partition's next offset becomes that reader's next offset (the log end
    offset unless a transaction in the log is still open).

    Logs written by the Materializer hold only committed, non-transactional batches; logs
    restored from a broker's folder may hold transactions and markers.
    Tombstones delete; null-key records are skipped, and so are records for which
    ``keep(partition, record)`` is False (the Materializer's key/value format check). Returns the
    records applied.

    ``on_progress(offsets)`` is called after each atomic store write with
    the offsets read since the previous call; over a whole call the offsets add up to
    ``sum(log end offset - from offset)`` (a partition counts as fully read once done, an open
    transaction's tail included).

    Raises:
        CorruptRecordError: a batch of a local log is damaged (file and byte position named).
        StoreError: the store cannot be written.
    """
    readers = {partition: CommittedReader(log, start_offset=(from_offsets or {}).get(partition, log.log_start_offset))
               for partition, log in sorted(logs.items())}
    bulk_loading = store.bulk_loading
    store.set_bulk_loading(True)  # no background compaction while the SST files come in
    try:
        applied = _load(store, logs, readers, keep, on_progress)
    except BaseException:
        with contextlib.suppress(StoreError):  # a closed store: the load's own error is the one to see
            store.set_bulk_loading(bulk_loading)
        raise
    store.set_bulk_loading(bulk_loading)
    return applied


def _load(store: StateStore, logs: dict[int, Log], readers: dict[int, CommittedReader], keep: RecordCheck | None,
          on_progress: Callable[[int], None] | None) -> int:
    if keep is None:  # every partition in one bulk load: SST files and offset writes shared
        results = load_committed_partitions(store, readers, on_progress=on_progress)
    else:
        results = {partition: apply_checked_records(store, partition, reader, keep, on_progress)
                   for partition, reader in readers.items()}
    for partition, reader in readers.items():
        _note_open_transaction(logs[partition], reader, on_progress)
    return sum(result.applied for result in results.values())


class AppliedRecords(NamedTuple):
    """What :func:`apply_committed_records` did: records ``applied`` to the store, records skipped
    for a ``null_keys``, how many ``aborted_transactions`` the reader knew of, and the partition's
    ``next_offset`` now committed in the store."""

    applied: int
    null_keys: int
    aborted_transactions: int
    next_offset: int


def apply_committed_records(store: StateStore, partition: int, log: Log, start_offset: int, *,
                            keep: RecordCheck | None = None,
                            on_progress: Callable[[int], None] | None = None,
                            source: AbortedTxnSource = AbortedTxnSource.AUTO, verify_crc: bool = True,
                            chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> AppliedRecords:
    """Apply ``log``'s committed records from ``start_offset`` on to ``store`` as ``partition``.

    Read as a ``read_committed`` consumer (:class:`CommittedReader` with ``source`` and
    ``verify_crc``); the last write commits the reader's next offset (the last stable offset).
    Without ``keep`` the records never become Python objects: :func:`~materializer.apply.store_loader.
    load_committed` decodes them in the native core and writes them in bulk (an SST file per
    ``chunk_bytes`` of entries). With ``keep`` (a key/value format check) they are applied record
    by record, every 10,000 in one atomic write, skipping those for which ``keep(partition,
    record)`` is False. Null-key records are skipped. ``on_progress`` as in
    :func:`rebuild_store_from_logs`. Logs a warning when an open transaction stops reading
    before the log end offset.

    Raises:
        InvalidOffsetError: ``start_offset`` is below the log start offset.
        CorruptRecordError / CorruptIndexError: see :func:`.read_committed.scan_transactions`.
        StoreError: the store cannot be written.
    """
    reader = CommittedReader(log, start_offset=start_offset, source=source, verify_crc=verify_crc)
    applied, null_keys, next_offset, _ = apply_committed_reader(store, partition, reader, keep=keep,
                                                                on_progress=on_progress, chunk_bytes=chunk_bytes)
    _note_open_transaction(log, reader, on_progress)
    return AppliedRecords(applied, null_keys, len(reader.scan.aborted_transactions), next_offset)


def _note_open_transaction(log: Log, reader: CommittedReader, on_progress: Callable[[int], None] | None) -> None:
    """After ``reader`` is exhausted: count an open transaction's tail as read and warn that it is
    not materialized."""
    if reader.next_offset < log.log_end_offset:
        if on_progress is not None:
            on_progress(log.log_end_offset - reader.next_offset)
        logger.warning("%s: a transaction open at offset %d is not materialized (log end offset %d)",
                       log.dir, reader.next_offset, log.log_end_offset)


def apply_committed_reader(store: StateStore, partition: int, reader: CommittedReader, *,
                           keep: RecordCheck | None = None,
                           on_progress: Callable[[int], None] | None = None,
                           chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> LoadResult:
    """What :func:`apply_committed_records` does, from a reader the caller made (for example
    :meth:`CommittedReader.from_log` over a stretch just appended). Same errors."""
    if keep is None:
        return load_committed(store, partition, reader, chunk_bytes=chunk_bytes, on_progress=on_progress)
    return apply_checked_records(store, partition, reader, keep, on_progress)


def apply_checked_records(store: StateStore, partition: int, reader: CommittedReader, keep: RecordCheck,
                          on_progress: Callable[[int], None] | None = None) -> LoadResult:
    """The record-by-record apply, for formats whose every record is checked by ``keep`` (null keys
    skipped and counted; every 10,000 records one atomic write with the next offset).

    Raises:
        DeserializationError: ``keep`` refused a record with ``on_bad_record="fail"``.
        CorruptRecordError: a batch of the log is damaged (file and byte position named).
        StoreError: the store cannot be written.
    """
    applied = null_keys = written = 0
    start = reported = reader.start_offset
    chunk: list[Record] = []
    for record in reader.records():
        if record.key is None:
            null_keys += 1
        elif keep(partition, record):
            chunk.append(record)
            written += len(record.key) + len(record.value or b"")
        if len(chunk) >= _REPLAY_CHUNK_RECORDS:
            applied += store.apply({partition: chunk}, {partition: chunk[-1].offset + 1})
            if on_progress is not None:
                on_progress(chunk[-1].offset + 1 - reported)
                reported = chunk[-1].offset + 1
            chunk = []
    next_offset = max(reader.next_offset, chunk[-1].offset + 1 if chunk else start)
    applied += store.apply({partition: chunk}, {partition: next_offset})
    if on_progress is not None and next_offset > reported:
        on_progress(next_offset - reported)
    return LoadResult(applied, null_keys, next_offset, written)
