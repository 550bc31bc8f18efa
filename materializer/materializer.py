"""The Materializer: Kafka topic -> local Kafka-format log per partition -> RocksDB key -> latest value.

Data flow of one loop iteration, replica path (``fetch="replica"``, the default)::

    ReplicaFetcher.receive ──▶ (next request sent at once) ──▶ VerbatimAppender: the leader's
    batches, byte for byte ──▶ Log.append_batch ──▶ Log.flush (fsync) ──▶ bound = LSO now
        ┄┄▶ ApplyWorker thread (while the next responses are appended; bounds merged):
            CommittedReader.from_log [store offset, bound) ──▶ StateStore.apply_store_entries

consumer path (``fetch="consumer"``)::

    KafkaSource.fetch ──▶ group by partition ──▶ v2 batches (broker offsets) ──▶ Log.append_batch
                                                                                   │ Log.flush (fsync)
                                                                                   ▼
                          StateStore.apply(records, next offset = last offset + 1)  (one WriteBatch)

Invariants:
    * The store never runs ahead of the log: a record reaches the store only after the batch
      holding it was appended and fsynced, so ``store next offset <= log end offset``.
    * Nothing the local log holds is fetched again: fetching resumes at each log's end offset.
    * On start the store is reconciled with the logs: missing or damaged -> rebuilt from the
      logs (records from the log start offset; tombstones delete); behind a log -> the log's
      tail is replayed; ahead of a log (the log lost data) -> rebuilt from the logs.
    * The store holds what a ``read_committed`` consumer has read: on the replica path it stops at
      each log's last stable offset (an open transaction holds later records back) and aborted
      data, kept in the log as the broker keeps it, is never applied.
    * On the replica path the store may trail the log by what the apply worker has not applied
      yet (it never passes an fsynced bound); the materializer reports itself caught up (ready)
      only once the worker has applied everything, and a stop applies what is queued first.

On the replica path the local batches are the broker's (:mod:`materializer.ingest.appender`). On
the consumer path they are rebuilt: one batch per run of consecutive fetched records of a
partition with one timestamp type (and, for LogAppendTime, one timestamp), capped at
``max_batch_bytes``, compressed with the topic's ``compression.type`` (``producer`` -> none)
unless overridden. Offsets, timestamps, keys, values and headers are the broker's; producer
ids, sequences, transactional flags, control batches and the broker's batch boundaries are not
kept (``read_committed`` already removed aborted records and markers, leaving offset gaps).

Records with a null key are appended to the log (the cleaner drops them on a compacted topic)
but cannot be materialized; they are counted in ``MaterializerStats.null_key_records``.

One data directory may hold several topics, and is written by one process at a time: :meth:`start`
takes its lock first (:class:`~materializer.data_dir.DataDirLock`, Kafka ``LogManager.lockLogDirs``),
before anything is written, and :meth:`close` releases it; a second writer fails at once naming
this one. The logs are opened and closed, and the data dir's checkpoints and per-directory
``.kafka_cleanshutdown`` marker maintained, by :class:`~materializer.storage.log_manager.TopicLogs`
(Kafka ``LogManager``). While the store is created empty or rebuilt, the topic's completeness
marker says so (:func:`~materializer.data_dir.mark_incomplete`: readers in other processes refuse
the topic rather than serve part of it) until the run is first caught up.

Background cleaning and retention while :meth:`Materializer.run` ingests (Kafka ``LogManager``)::

    run loop (this thread)           fetch ─▶ append (Log.lock) ─▶ flush ─▶ store.apply
                                     every retention_check_interval_ms: delete_old_segments
    kafka-log-cleaner-thread-N       grab filthiest log ─▶ Cleaner round (non-active segments
                                     only) ─▶ swap in .cleaned segments (Log.lock) ─▶ DIR/
                                     cleaner-offset-checkpoint ─▶ retention of compacted logs

* The :class:`~materializer.storage.log_cleaner.LogCleaner` runs ``cleaner_threads`` threads
  on a topic whose ``cleanup.policy`` contains ``compact``; it starts when ``run`` starts (after
  the logs are opened and the store reconciled) and is shut down - rounds in progress aborted,
  their ``.cleaned`` files removed - before ``run`` returns, also on Ctrl-C or an error.
* Cleaning never touches the active segment, the only one appends write to; it reads
  non-active segments without ``Log.lock`` and swaps cleaned segments in under it.
* Retention (:func:`~materializer.storage.retention.delete_old_segments`: ``retention.ms``,
  ``retention.bytes``, log start offset) runs from the run loop every
  ``retention_check_interval_ms`` (first after ``min(interval, 30 s)``, Kafka's
  ``log.initial.task.delay.ms``) - except on a compacted topic with the cleaner running, whose
  threads apply it after each cleaning attempt, as Kafka's do.

What the store holds is not changed by either:

* Cleaning keeps the latest record of every key (and tombstones until their delete horizon),
  so the store - already key -> latest value - is unaffected, and a store rebuilt from a
  compacted log equals the one materialized while ingesting.
* Retention deletes whole old segments and raises the log start offset; the store *keeps* the
  values it materialized from them. It mirrors what a long-running consumer has seen, not what
  the topic still holds: a consumer restoring from the broker (or a store rebuilt from the local
  log, e.g. after it was deleted) would no longer see keys whose only records were deleted by
  retention. Use ``cleanup.policy=compact`` for a topic whose full state must stay restorable.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import random
import signal
import socket
import threading
import time
import uuid
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, NamedTuple, Sequence

from materializer.adapters.kafka_source import FetchedRecord, KafkaSource
from materializer.adapters.replica_fetch import PartitionData, ReplicaFetcher
from materializer.adapters.rocksdb_store import StateStore, StoredValue
from materializer.adapters.avro_serde import schema_registry_client
from materializer.adapters.errors import (
    BrokerUnreachableError,
    DeserializationError,
    KafkaSourceError,
    StoreCorruptedError,
    StoreError,
    TopicIdChangedError,
    TopicNotFoundError,
)
from materializer.adapters.serdes import Serde, make_serde
from materializer.apply.worker import ApplyWorker
from materializer.config import MaterializerOptions, state_dir, topic_config_path
from materializer.data_dir import DataDirLock, mark_complete, mark_incomplete, topic_status
from materializer.progress import progress_bar, show_progress
from materializer.ingest.appender import LogTruncation, VerbatimAppender, last_fetched_epoch, truncation_target
from materializer.apply.store_loader import DEFAULT_CHUNK_BYTES, LoadResult, load_committed, load_committed_partitions
from materializer.storage.cleaner_manager import TopicPartition
from materializer.storage.cleaner_stats import CleanerStats
from materializer.storage.checkpoint import LOG_START_OFFSET_CHECKPOINT
from materializer.storage.compression import CompressionType
from materializer.storage.errors import CorruptRecordError
from materializer.storage.files import offset_from_file_name
from materializer.storage.log import Log
from materializer.storage.log_cleaner import LogCleaner
from materializer.storage.log_config import LogConfig
from materializer.storage.log_manager import TopicLogs
from materializer.storage.read_committed import AbortedTxnSource, CommittedReader
from materializer.storage.record_batch import Record, TimestampType
from materializer.storage.partition_metadata import topic_id_to_string
from materializer.storage.retention import delete_old_segments
from materializer.topic_identity import check_local_copy, drop_local_copy, remove_deleted_folders
from materializer.view import MaterializedView

__all__ = ["DEFAULT_STATISTICS_INTERVAL_MS", "LOCAL_SEGMENT_BYTES", "Materializer", "MaterializerHealth", "MaterializerStats", "rebuild_store_from_logs"]

logger = logging.getLogger(__name__)

_REPLAY_CHUNK_RECORDS = 10_000

#: The local log's segment.bytes unless --config sets it: the topic's, capped at 64 MiB, so the
#: active segment (never cleaned) holds at most 64 MiB and the rest of the log gets compacted.
LOCAL_SEGMENT_BYTES = 64 * 1024 * 1024

#: A continuous run whose broker is unreachable retries the fetch after this backoff, doubled up
#: to the maximum (librdkafka's reconnect.backoff.max.ms is 10 s too), seconds.
_RETRY_BACKOFF_INITIAL_S = 1.0
_RETRY_BACKOFF_MAX_S = 10.0

#: Bad records logged one by one before only every 10,000th is (``on_bad_record="skip"``).
_SKIP_WARNINGS = 10

#: Kafka ``log.initial.task.delay.ms``: the longest wait before the first retention check, ms.
_INITIAL_TASK_DELAY_MS = 30_000

#: How often the run loop copies the client's cached high watermarks into the stats, seconds.
_WATERMARK_REFRESH_S = 1.0

#: Consumer path: how often an idle run (fetches without records) compares the topic id, seconds.
_TOPIC_ID_CHECK_S = 1.0

#: librdkafka ``statistics.interval.ms`` asked for when a statistics callback is registered, ms.
DEFAULT_STATISTICS_INTERVAL_MS = 5_000


@dataclass
class MaterializerStats:
    """Counters of one Materializer (since it was created).

    Attributes:
        records_fetched: records received from the broker.
        bytes_fetched: key + value + header bytes received from the broker.
        batches_appended / bytes_appended: local batches and their bytes written to the logs.
        records_applied: records applied to the store from fetched data (puts + deletes).
        records_replayed: records applied to the store from the local logs on start.
        null_key_records: fetched records with a null key (logged, not materialized).
        records_skipped: records whose key or value did not decode in the configured format,
            with ``on_bad_record="skip"`` (logged, kept in the local log, not materialized).
        store_rebuilt: the store was rebuilt from the local logs on start.
        start_offsets: partition -> offset fetching started from.
        high_watermarks: partition -> high watermark seen on start.
        elapsed_s: seconds spent in ``run``.
        cleaner_rounds: cleaning rounds the background cleaner completed (aborted ones not counted).
        cleaner_bytes_read / cleaner_bytes_written: bytes its recopy passes read from the dirty
            segments and wrote to the cleaned ones (Kafka ``CleanerStats.bytesRead/bytesWritten``).
        cleaner_records_read / cleaner_records_written: records read and written by those passes.
        retention_checks: retention checks the run loop made.
        cleaner_checkpoints_reset: unreadable ``cleaner-offset-checkpoint`` files the cleaner logged
            and reset (Kafka's ``allCleanerCheckpoints`` rule: those logs are cleaned from their log
            start offsets).
        cleaner_threads_died: cleaner threads that stopped on an unexpected error (logged).
        retention_segments_deleted: segments the run loop's retention checks deleted (the
            cleaner threads' retention on compacted topics is not counted).
        bytes_applied: key + value bytes of the records applied to the store from fetched data.
        fetches: calls of ``KafkaSource.fetch`` by :meth:`Materializer.run`.
        fetch_s: seconds spent in those calls, waiting for records included (monotonic clock).
        append_s: seconds spent building local batches and appending them to the logs.
        fsync_s: seconds spent flushing (fsync) the logs after appends.
        apply_s: seconds spent applying fetched records to the store (on the replica path in the
            apply worker thread, overlapping fetch and append).
        next_offsets: partition -> next offset to fetch: the local log end offset (the store's
            next offset after each batch), or beyond trailing transaction markers once the
            client reported the end of the partition there.
        latest_high_watermarks: partition -> the highest high watermark known: the one read on
            start, then the client's cached value from fetch responses (refreshed at most once a
            second while running, no extra request).
        cleaner_max_dirty_ratio: the dirtiest compacted log's cleanable ratio (dirty bytes /
            cleanable bytes, 0..1) when the cleaner last chose a log (Kafka ``max-dirty-percent``
            / 100); 0.0 before the first round.
        replay_target_offsets: offsets the store replay or rebuild from the local logs on start
            has to read (all partitions; 0 when nothing was replayed).
        replay_done_offsets: offsets of it read so far (equals the target once done).
        log_truncations: cuts of a local log back to what the leader holds (a diverging epoch, a
            leader that lost data, a path switch realigning batches), each logged with partition,
            offsets and epochs; the store was rewound with each.
        offsets_truncated: offsets those cuts removed.
        store_rewinds: partitions whose store entries were rebuilt from a cut log.
        offset_gaps: partition -> offsets deleted on the broker (retention, DeleteRecords) before they
            were fetched, summed (the local log restarted at the broker's log start offset).
        topic_recreations: times the topic was found deleted and re-created (another topic id)
            and its local copy dropped and materialized again.
        store_entries_expired: store entries dropped because their record fell below the log start
            offset (retention, DeleteRecords): a key with no record left in the log is not served.
    """

    records_fetched: int = 0
    bytes_fetched: int = 0
    batches_appended: int = 0
    bytes_appended: int = 0
    records_applied: int = 0
    records_replayed: int = 0
    null_key_records: int = 0
    records_skipped: int = 0
    store_rebuilt: bool = False
    start_offsets: dict[int, int] = field(default_factory=dict)
    high_watermarks: dict[int, int] = field(default_factory=dict)
    elapsed_s: float = 0.0
    cleaner_rounds: int = 0
    cleaner_bytes_read: int = 0
    cleaner_bytes_written: int = 0
    cleaner_records_read: int = 0
    cleaner_records_written: int = 0
    retention_checks: int = 0
    retention_segments_deleted: int = 0
    cleaner_checkpoints_reset: int = 0
    cleaner_threads_died: int = 0
    bytes_applied: int = 0
    fetches: int = 0
    fetch_s: float = 0.0
    append_s: float = 0.0
    fsync_s: float = 0.0
    apply_s: float = 0.0
    next_offsets: dict[int, int] = field(default_factory=dict)
    latest_high_watermarks: dict[int, int] = field(default_factory=dict)
    cleaner_max_dirty_ratio: float = 0.0
    replay_target_offsets: int = 0
    replay_done_offsets: int = 0
    log_truncations: int = 0
    offsets_truncated: int = 0
    store_rewinds: int = 0
    offset_gaps: dict[int, int] = field(default_factory=dict)
    topic_recreations: int = 0
    store_entries_expired: int = 0

    def lag(self) -> dict[int, int]:
        """Partition -> offsets between the next offset and the latest high watermark known (>= 0)."""
        next_offsets = dict(self.next_offsets)
        return {p: max(0, high - next_offsets.get(p, 0)) for p, high in dict(self.latest_high_watermarks).items()}


@dataclass(frozen=True)
class MaterializerHealth:
    """What a service needs to know before serving from the store (:attr:`Materializer.health`).

    Attributes:
        running: the ingest loop is going (also while it waits for an unreachable broker).
        caught_up: every partition reached the high watermark seen at start, at least once, and
            nothing makes the store stale now: False while the broker is unreachable or the topic
            is gone, and after a re-created topic's local copy was dropped, until caught up again.
        failed: the exception that stopped ingest, else None (then serve nothing: it is stale).
        broker_reachable: the last request to the cluster was answered.
    """

    running: bool
    caught_up: bool
    failed: BaseException | None
    broker_reachable: bool = True


def _compression_of(name: str) -> CompressionType:
    return CompressionType.NONE if name.strip().lower() == "producer" else CompressionType.from_name(name)


def _chunks(items: Sequence[FetchedRecord]) -> Iterable[tuple[TimestampType, int, list[Record]]]:
    """Split one partition's records where the timestamp type (or a LogAppendTime timestamp) or the
    leader epoch changes: ``(timestamp type, leader epoch, records)``, each chunk one or more batches."""
    chunk: list[Record] = []
    chunk_type: TimestampType | None = None
    chunk_epoch = -1
    for item in items:
        if chunk and (item.timestamp_type != chunk_type or item.leader_epoch != chunk_epoch or (
                item.timestamp_type == TimestampType.LOG_APPEND_TIME and item.record.timestamp != chunk[0].timestamp)):
            yield chunk_type, chunk_epoch, chunk
            chunk = []
        chunk_type, chunk_epoch = item.timestamp_type, item.leader_epoch
        chunk.append(item.record)
    if chunk:
        yield chunk_type, chunk_epoch, chunk


def _after_last_rewind(items: list[FetchedRecord]) -> list[FetchedRecord]:
    """The records from the last one whose offset is not above its predecessor's on: a client that
    moved back (a seek after KIP-320 validation) delivers from its new position in order."""
    start = 0
    for i in range(1, len(items)):
        if items[i].record.offset <= items[i - 1].record.offset:
            start = i
    return items[start:]


def rebuild_store_from_logs(store: StateStore, logs: dict[int, Log], from_offsets: dict[int, int] | None = None,
                            keep: Callable[[int, Record], bool] | None = None,
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
    if keep is None:  # every partition in one bulk load: SST files and offset writes shared
        results = load_committed_partitions(store, readers, on_progress=on_progress)
    else:
        results = {partition: _apply_checked_records(store, partition, reader, keep, on_progress)
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
                            keep: Callable[[int, Record], bool] | None = None,
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
                           keep: Callable[[int, Record], bool] | None = None,
                           on_progress: Callable[[int], None] | None = None,
                           chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> LoadResult:
    """What :func:`apply_committed_records` does, from a reader the caller made (for example
    :meth:`CommittedReader.from_log` over a stretch just appended). Same errors."""
    if keep is None:
        return load_committed(store, partition, reader, chunk_bytes=chunk_bytes, on_progress=on_progress)
    return _apply_checked_records(store, partition, reader, keep, on_progress)


def _apply_checked_records(store: StateStore, partition: int, reader: CommittedReader,
                           keep: Callable[[int, Record], bool],
                           on_progress: Callable[[int], None] | None) -> LoadResult:
    """The record-by-record replay, for formats whose every record is checked by ``keep``."""
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


def _close_built_fetcher(built: Future) -> None:
    """Close the ReplicaFetcher a future built, if it built one."""
    if built.exception() is None:
        built.result().close()


class Materializer:
    """Mirror ``topic`` into ``data_dir`` (broker-style partition folders) and materialize it.

    Args:
        bootstrap_servers: ``host:port[,host:port]`` of the Kafka cluster.
        topic: topic to mirror.
        data_dir: the data directory (layout in :mod:`materializer.config`).
        options: fetch/write/store options (key/value formats and the Schema Registry among them).
        schema_registry: a ``SchemaRegistryClient`` for ``avro`` formats (default: one for
            ``options.schema_registry_url``).

    Use as a context manager (``start`` on enter, ``close`` on exit) or call :meth:`start`,
    :meth:`run` and :meth:`close`. Between them it holds the data dir's lock, naming it
    ``materializer <lock_command>`` (``run``; set :attr:`lock_command` before :meth:`start` to
    name another command). Not thread-safe except :meth:`stop`, :attr:`health` and
    :meth:`wait_until_caught_up` (a service calls them while :meth:`run_in_background` ingests).

    While :meth:`run` runs, a background :class:`LogCleaner` compacts the logs of a compacted
    topic and retention deletes old segments (see the module docstring). The store is not
    changed by either: it keeps the latest value of every key it materialized, including keys
    whose records retention has since deleted from the log (the view of a consumer that has been
    running all along; a restore from the broker or a store rebuilt from the local log would not
    see them).

    Raises (start/run):
        DataDirLockedError: another process writes ``data_dir`` (named in the message).
        KafkaSourceError: the cluster or topic cannot be read.
        StoreLockedError / StoreError: the state store cannot be opened or written.
        StorageError: a local log cannot be opened or appended.
        ValueError: an invalid topic config or override.
        DeserializationError: a record does not decode in the configured key/value format
            (``on_bad_record="fail"``); it names the partition and offset.
        SchemaRegistryError: the Schema Registry cannot be reached.
    """

    def __init__(self, bootstrap_servers: str, topic: str, data_dir: Path | str, *,
                 options: MaterializerOptions | None = None, schema_registry: Any = None) -> None:
        self.bootstrap_servers = bootstrap_servers
        self.topic = topic
        self.data_dir = Path(data_dir)
        self.options = options or MaterializerOptions()
        self.stats = MaterializerStats()
        self.logs: dict[int, Log] = {}
        self._topic_logs: TopicLogs | None = None
        self.store: StateStore | None = None
        self.source: KafkaSource | None = None  # metadata, watermarks, configs; records on the consumer path
        self.fetcher: ReplicaFetcher | None = None  # the replica path's Fetch API client
        self._appender: VerbatimAppender | None = None
        self._fetch_in_flight = False
        self._store_offsets: dict[int, int] = {}  # replica path: next offset committed in the store
        self._applier: ApplyWorker | None = None  # replica path: applies fsynced stretches (owns _store_offsets)
        self.log_config: LogConfig | None = None
        self.compression = CompressionType.NONE
        self.cleaner: LogCleaner | None = None
        self._cleaner_logs: dict[TopicPartition, Log] | None = None
        self._stats_lock = threading.Lock()
        self._stop_requested = threading.Event()
        self._caught_up = threading.Event()
        self._running = False
        self._failure: BaseException | None = None
        self._thread: threading.Thread | None = None
        self._update_callbacks: list[Callable[[bytes, "StoredValue | None", "StoredValue | None", int], None]] = []
        self._statistics_callbacks: list[Callable[[str], None]] = []
        self._statistics_interval_ms = DEFAULT_STATISTICS_INTERVAL_MS
        self._null_key_warned = False
        self._started = False
        self.topic_id: uuid.UUID | None = None  # the cluster's id of the topic (KIP-516), read on start
        self._caught_partitions: set[int] = set()
        self._broker_away_since: float | None = None  # monotonic; None while the broker answers
        self._backoff_s = _RETRY_BACKOFF_INITIAL_S
        self._topic_missing = False
        self._next_topic_id_check = 0.0  # consumer path, monotonic seconds
        self._damaged: dict[int, CorruptRecordError] = {}  # partition -> damage a cleaner thread found
        self._store_start_offsets: dict[int, int] = {}  # partition -> log start offset the store follows
        self.lock_command = "run"
        self._data_dir_lock: DataDirLock | None = None
        self._store_loading = False  # the topic is marked incomplete until caught up (_mark_store_loading)
        self.key_serde, self.value_serde = self._serdes(schema_registry)

    # -- lifecycle ---------------------------------------------------------------------------

    def __enter__(self) -> "Materializer":
        self.start()
        return self

    def _serdes(self, registry: Any) -> tuple[Serde, Serde]:
        options = self.options
        if registry is None and "avro" in (options.key_format, options.value_format) and options.schema_registry_url:
            registry = schema_registry_client(options.schema_registry_url, options.schema_registry_config)
        return (make_serde(options.key_format, topic=self.topic, field="key", schema_registry=registry),
                make_serde(options.value_format, topic=self.topic, field="value", schema_registry=registry))

    def view(self) -> MaterializedView:
        """Typed reads of this materializer's store through its key/value formats (:mod:`materializer.view`).

        The view reads the writer's store directly (every applied batch at once) and is valid
        until :meth:`close`.

        Raises:
            StoreError: not started.
        """
        if self.store is None:
            raise StoreError(f"{self!r} is not started: no store to view")
        return MaterializedView(self.store, key_serde=self.key_serde, value_serde=self.value_serde)

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def start(self) -> None:
        """Read topic metadata and configs, open the store and the logs, reconcile them, assign partitions."""
        if self._started:
            return
        created = not self.data_dir.exists()
        held = self._data_dir_lock is not None  # a start again (the topic re-created) keeps the data dir
        try:
            self._start()
        except BaseException:
            self._close_for_restart()
            if not held:
                self._release_data_dir()
            if created:  # a run that failed at once (no broker, unknown topic) leaves no empty data dir
                with contextlib.suppress(OSError):
                    os.rmdir(self.data_dir)
            raise
        self._started = True

    def _start(self) -> None:
        if self._data_dir_lock is None:
            self._data_dir_lock = DataDirLock.acquire(self.data_dir, self.lock_command)  # before anything is written
        source_options = self.options.source_options()
        if self._statistics_callbacks:
            source_options = dataclasses.replace(source_options, statistics_callback=self._on_client_statistics,
                                                 statistics_interval_ms=self._statistics_interval_ms)
        self.source = KafkaSource(self.bootstrap_servers, self.topic, source_options)
        # Broker round trips that do not depend on each other run at once: the topic's configs,
        # the replica fetcher's bootstrap and one watermark request per partition (~70 ms of a
        # ~150 ms start against a local broker).
        with ThreadPoolExecutor(max_workers=4, thread_name_prefix=f"materializer-start-{self.topic}") as pool:
            configs = pool.submit(self.source.topic_configs)
            if self.options.fetch == "replica":
                fetcher = pool.submit(ReplicaFetcher, self.bootstrap_servers, self.topic, source_options)
                topic_id = None
            else:
                fetcher, topic_id = None, pool.submit(self.source.topic_id)
            try:
                self._start_with(pool, configs, fetcher, topic_id)
            except BaseException:
                if fetcher is not None:  # a failed start closes the fetcher it did not take (close is idempotent)
                    fetcher.add_done_callback(_close_built_fetcher)
                raise

    def _start_with(self, pool: ThreadPoolExecutor, configs_future: Future,
                    fetcher_future: Future | None, topic_id_future: Future | None) -> None:
        """The body of :meth:`_start`, with the requests it started running in ``pool``."""
        partitions = self.source.partitions()
        configs = {**configs_future.result(), **self.options.config_overrides}
        if not {"segment.bytes", "internal.segment.bytes"} & set(self.options.config_overrides):
            # The local log rolls by its own size so that the cleaner has a compacted tail to work
            # on: a topic's 1 GiB segment.bytes would keep everything in the never-cleaned active
            # segment for a long time.
            topic_bytes = int(configs.get("internal.segment.bytes") or configs.get("segment.bytes") or 2**30)
            configs["segment.bytes"] = str(min(topic_bytes, LOCAL_SEGMENT_BYTES))
            configs.pop("internal.segment.bytes", None)
        self.log_config = LogConfig.from_kafka_configs(configs)
        if not self.log_config.compact:
            logger.warning("topic %s has cleanup.policy=%s: retention deletes old segments, and the state store "
                           "drops the keys whose records it deleted (as a consumer of the topic would not see them)",
                           self.topic, ",".join(self.log_config.cleanup_policy) or "''")
        config_path = topic_config_path(self.data_dir, self.topic)
        config_path.parent.mkdir(parents=True, exist_ok=True)
        self.log_config.save(config_path)
        self.compression = _compression_of(self.options.compression or self.log_config.compression_type)

        # The topic's identity (KIP-516) decides whether the local copy is this topic's at all.
        if fetcher_future is not None:
            self.fetcher = fetcher_future.result()
            self.topic_id = self.fetcher.topic_id
        else:
            self.topic_id = topic_id_future.result()
            if self.topic_id is None and self.options.fetch == "consumer":
                logger.info("the cluster reports no topic id for %s (before Kafka 2.8?): re-creation of the topic "
                            "is noticed by leader epochs only", self.topic)
        remove_deleted_folders(self.data_dir, self.topic)
        if check_local_copy(self.data_dir, self.topic, self.topic_id, partitions, self.options.on_topic_recreated):
            self.stats.topic_recreations += 1

        store_path = state_dir(self.data_dir, self.topic)
        store_existed = StateStore.exists(store_path)
        if not store_existed:
            self._mark_store_loading("loading a new state store")
        try:
            self.store = StateStore(store_path, self.options.store)
        except StoreCorruptedError as exc:
            logger.warning("%s; rebuilding it from the local log", exc)
            self._mark_store_loading("rebuilding a damaged state store")
            StateStore.destroy(store_path)
            store_existed = False
            self.store = StateStore(store_path, self.options.store)

        self._open_logs(partitions)
        watermarks = dict(zip(partitions, pool.map(self.source.watermark_offsets, partitions)))
        for partition, (low, high) in watermarks.items():
            self._align_empty_log(partition, low, high)
            self._truncate_above_high_watermark(partition, high)
        if self.fetcher is None:
            for partition in partitions:
                self._truncate_open_transaction(partition)
        elif not self.fetcher.supports_diverging_epoch():
            self._truncate_by_leader_epochs()
        self._reconcile_store_recovering_damage(store_existed)
        self._store_start_offsets = {p: self.store.start_offset(p) for p in self.logs}
        self._drop_below_log_start()

        for partition, (_, high) in watermarks.items():
            log = self.logs[partition]
            self.stats.start_offsets[partition] = log.log_end_offset
            self.stats.high_watermarks[partition] = high
            self.stats.next_offsets[partition] = log.log_end_offset
            self.stats.latest_high_watermarks[partition] = high
        if self.fetcher is not None:
            self.fetcher.expect_topic_id(self.topic_id)
            self._appender = VerbatimAppender(self.topic, self.logs, self.source.watermark_offsets,
                                              before_truncate=self._drain_applies)
            stored = self.store.offsets()
            self._store_offsets = {p: max(stored.get(p, log.log_start_offset), log.log_start_offset)
                                   for p, log in self.logs.items()}
            self._applier = ApplyWorker(self._apply_stable, name=f"materializer-apply-{self.topic}")
        else:
            # With the leader epoch of the last local record librdkafka validates each position
            # (KIP-320) and fetches from the divergence point when the leader's log diverged.
            self.source.assign(self.stats.start_offsets,
                               {p: last_fetched_epoch(log, log.log_end_offset) for p, log in self.logs.items()})
        logger.info("materializing %s from %s (%s fetch): start offsets %s, high watermarks %s", self.topic,
                    self.bootstrap_servers, self.options.fetch, self.stats.start_offsets, self.stats.high_watermarks)

    def _align_empty_log(self, partition: int, low: int, high: int) -> None:
        """Start an empty local log where a consumer with ``auto.offset.reset=earliest`` would fetch.

        An empty log at offset 0 of a topic whose broker log starts later mirrors the broker's log
        start offset. An empty log whose offset lies outside the broker's ``[log start offset, high
        watermark]`` (a ``log-start-offset-checkpoint`` past the local log end deletes the local
        segments on load, as Kafka's LogLoader does) would be fetched out of range on every start:
        it restarts at the broker's log start offset instead, and says so. The store's entries of
        that partition are dropped (:meth:`StateStore.drop_partition`; other partitions keep theirs)
        and re-materialized from what is fetched again.
        """
        log = self.logs[partition]
        if log.size_in_bytes != 0:
            return
        if log.log_end_offset == 0 and low > 0:  # a new local log; the broker's log starts later
            log.truncate_fully_and_start_at(low)
            return
        if not low <= log.log_end_offset <= high:
            logger.warning("the local log %s is empty at offset %d, outside the broker's offsets [%d, %d] of %s-%d "
                           "(a %s value beyond the local log end?); fetching it again from the broker's log start "
                           "offset %d", log.dir, log.log_end_offset, low, high, self.topic, partition,
                           self.data_dir / LOG_START_OFFSET_CHECKPOINT, low)
            log.truncate_fully_and_start_at(low)
            self._mark_store_loading(f"fetching partition {partition} again")
            dropped = self.store.drop_partition(partition)
            logger.warning("dropped the %d state store entries of %s-%d; they are re-materialized from what is "
                           "fetched again", dropped, self.topic, partition)

    def _truncate_above_high_watermark(self, partition: int, high: int) -> None:
        """A local log ending beyond the leader's high watermark holds offsets the leader no longer
        has (it lost data; clients only ever read below the high watermark): cut it there, as a
        follower without a usable epoch starts at the high watermark (``AbstractFetcherThread``
        ``truncateToHighWatermark``); below it the leader epochs decide (the first fetch)."""
        log = self.logs[partition]
        if log.log_end_offset > high:
            logger.warning("the local log %s ends at offset %d, beyond the broker's high watermark %d of %s-%d (the "
                           "leader lost data); truncating it to %d", log.dir, log.log_end_offset, high, self.topic,
                           partition, high)
            self._note_truncation(self._cut_log(partition, high, "leader's high watermark"))

    def _truncate_by_leader_epochs(self, max_rounds: int = 16) -> None:
        """Replica path against a broker whose Fetch cannot carry ``LastFetchedEpoch`` (before v12):
        ask each leader where the local latest epoch ends (OffsetsForLeaderEpoch, KIP-101) and cut
        by the follower's rule (:func:`~materializer.ingest.appender.truncation_target`), again with
        the new latest epoch while the answer was about an epoch the local log never had (KIP-279;
        ``AbstractFetcherThread.truncateToEpochEndOffsets``). Before the store is reconciled."""
        pending = {p for p, log in self.logs.items() if log.latest_epoch is not None}
        for _ in range(max_rounds):
            if not pending:
                return
            answers = self.fetcher.offsets_for_leader_epoch({p: self.logs[p].latest_epoch for p in pending})
            for partition, answer in answers.items():
                log = self.logs[partition]
                target, finished = truncation_target(log, answer, log.log_end_offset)
                if target < log.log_end_offset:
                    self._note_truncation(self._cut_log(partition, target, "OffsetsForLeaderEpoch"))
                if finished or log.latest_epoch is None:
                    pending.discard(partition)
            if not answers:
                time.sleep(0.1)  # no leader known yet: ask again after the metadata refresh
        logger.warning("%s: the leaders did not settle where partitions %s diverge after %d rounds; continuing",
                       self.topic, sorted(pending), max_rounds)

    def _truncate_open_transaction(self, partition: int) -> None:
        """Consumer path: a local log holding a transaction the replica path left open (no marker
        yet) would stay open forever, since a ``read_committed`` consumer never sees markers. Cut
        the log at the transaction's first offset; the consumer fetches that range again and gets
        what was committed, the COMMIT or ABORT marker only leaving an offset gap."""
        log = self.logs[partition]
        unstable = log.first_unstable_offset
        if unstable is not None and unstable < log.log_end_offset:
            logger.warning("%s holds a transaction still open at offset %d (written by the replica path); the "
                           "consumer path fetches offsets [%d, %d) again read_committed", log.dir, unstable, unstable,
                           log.log_end_offset)
            self._note_truncation(self._cut_log(partition, unstable, "open transaction"))

    def _partition_of(self, exc: CorruptRecordError) -> int | None:
        """The partition whose local log file ``exc`` names, or None (damage elsewhere, e.g. in a
        Fetch response)."""
        if exc.path is None:
            return None
        folder = Path(exc.path).parent
        return next((p for p, log in self.logs.items() if log.dir == folder), None)

    def _on_cleaner_damage(self, topic_partition: TopicPartition, exc: CorruptRecordError) -> None:
        """A cleaner thread found a corrupt batch: the run loop heals the log (:meth:`_heal`)."""
        with self._stats_lock:
            self._damaged[topic_partition[1]] = exc

    def _heal_reported_damage(self) -> None:
        with self._stats_lock:
            damaged, self._damaged = self._damaged, {}
        for partition, exc in sorted(damaged.items()):
            if partition in self.logs:
                self._heal(partition, exc)

    def _heal(self, partition: int, exc: CorruptRecordError) -> None:
        """Recover a partition's log from the damage a reader found while running (the apply
        worker, a cleaner thread), whatever the clean-shutdown marker said at start: the log is
        reopened with Kafka's recovery from the damaged segment on (cut at the first invalid
        batch, later segments deleted; :meth:`TopicLogs.recover_partition`), the store partition
        rewound to what the log now holds, and fetching resumes at the new log end offset, so the
        cut offsets come again from the broker. The cleaner and the apply worker are restarted
        around it; nothing else is lost.
        """
        log = self.logs[partition]
        from_offset = exc.offset if exc.offset is not None else offset_from_file_name(Path(exc.path).name)
        logger.warning("damaged local log: %s; recovering %s from offset %d (what is cut is fetched again from the "
                       "broker)", exc, log.dir, from_offset)
        self._stop_cleaner()
        applier, self._applier = self._applier, None
        if applier is not None:
            applier.close()  # it may hold the failure that brought us here; a new one takes over
        old_end, old_epoch = log.log_end_offset, log.latest_epoch
        log = self._topic_logs.recover_partition(partition, from_offset)
        new_epoch = log.latest_epoch
        self._note_truncation(LogTruncation(partition, old_end, log.log_end_offset,
                                            -1 if old_epoch is None else old_epoch,
                                            -1 if new_epoch is None else new_epoch, "damaged local log"))
        self._rewind_store(partition, log.log_end_offset)
        if self.fetcher is not None:
            self._store_offsets[partition] = min(self._store_offsets.get(partition, log.log_start_offset),
                                                 log.log_end_offset)
            self._applier = ApplyWorker(self._apply_stable, name=f"materializer-apply-{self.topic}")
        else:
            self.source.seek(partition, log.log_end_offset, last_fetched_epoch(log, log.log_end_offset))
        self._caught_partitions.discard(partition)
        self._start_cleaner()

    def _cut_log(self, partition: int, target: int, reason: str) -> LogTruncation:
        """Truncate one partition's log to ``target`` (at open, before the store is reconciled)."""
        log = self.logs[partition]
        old_end, old_epoch = log.log_end_offset, log.latest_epoch
        log.truncate_to(target)
        log.flush()
        new_epoch = log.latest_epoch
        return LogTruncation(partition, old_end, log.log_end_offset, -1 if old_epoch is None else old_epoch,
                             -1 if new_epoch is None else new_epoch, reason)

    def _note_truncation(self, truncation: LogTruncation) -> None:
        """Log and count one cut of a local log."""
        logger.warning("%s-%d: truncated the local log from offset %d (leader epoch %d) to %d (leader epoch %d): %s",
                       self.topic, truncation.partition, truncation.old_end_offset, truncation.old_epoch,
                       truncation.new_end_offset, truncation.new_epoch, truncation.reason)
        self.stats.log_truncations += 1
        self.stats.offsets_truncated += max(0, truncation.old_end_offset - truncation.new_end_offset)
        next_offset = self.logs[truncation.partition].log_end_offset
        self.stats.next_offsets[truncation.partition] = next_offset

    def _rewind_store(self, partition: int, cut_offset: int) -> None:
        """Make the store's ``partition`` hold exactly what its log holds after a cut at
        ``cut_offset``: when the store has applied offsets at or past the cut, its entries are
        dropped and rebuilt from the log (values and next offset; :meth:`StateStore.drop_partition`,
        then the committed records from the log start offset), before anything new of the partition
        is applied. A crash in between leaves the partition without a next offset, which the next
        start replays."""
        log = self.logs[partition]
        stored = self._store_offsets.get(partition) if self.fetcher is not None else None
        if stored is None:
            stored = self.store.offsets().get(partition)
        if stored is None or stored <= cut_offset:
            if self.fetcher is not None:
                self._store_offsets[partition] = max(stored or log.log_start_offset, log.log_start_offset)
            return
        self._mark_store_loading(f"rewinding partition {partition} to its cut log")
        dropped = self.store.drop_partition(partition)
        self._store_start_offsets[partition] = 0
        applied = rebuild_store_from_logs(self.store, {partition: log}, keep=self._replay_filter())
        next_offset = self.store.offsets().get(partition, log.log_start_offset)
        logger.warning("%s-%d: the state store had applied offsets up to %d; rewound it to the cut log (%d entries "
                       "dropped, %d records applied again, next offset %d)", self.topic, partition, stored, dropped,
                       applied, next_offset)
        self.stats.store_rewinds += 1
        self.stats.records_replayed += applied
        if self.fetcher is not None:
            self._store_offsets[partition] = next_offset

    def _open_logs(self, partitions: list[int]) -> None:
        self._topic_logs = TopicLogs.open(self.data_dir, self.topic, partitions, self.log_config, self.topic_id)
        self.logs = self._topic_logs.logs

    def _reconcile_store_recovering_damage(self, store_existed: bool) -> None:
        """:meth:`_reconcile_store`, recovering a log whose replay finds damage recovery at open missed.

        A torn or corrupt batch, or offsets out of order, in a segment below the recovery point
        (Kafka does not re-check those after a clean shutdown) would make a replay stop short and
        serve stale values. Instead the damaged log is recovered from the damaged offset on
        (:meth:`TopicLogs.recover_partition`: cut at the first invalid batch, later segments
        deleted), the store is rebuilt if it is now ahead of that log, and fetching resumes at the
        new log end offset, so the cut offsets are fetched again from the broker.
        """
        recovered: set[tuple[Path, int]] = set()
        while True:
            try:
                self._reconcile_store(store_existed)
                return
            except CorruptRecordError as exc:
                partition = next((p for p, log in self.logs.items()
                                  if exc.path is not None and Path(exc.path).parent == log.dir), None)
                if partition is None:
                    raise
                log = self.logs[partition]
                # The damaged batch's own offset may be unreadable: recover from its segment's base
                # offset then (recovery checks every batch from there and cuts at the first bad one).
                from_offset = exc.offset if exc.offset is not None else offset_from_file_name(Path(exc.path).name)
                if (log.dir, from_offset) in recovered:
                    raise
                recovered.add((log.dir, from_offset))
                logger.warning("damaged local log: %s; recovering %s from offset %d (what is cut is fetched "
                               "again from the broker)", exc, log.dir, from_offset)
                self._topic_logs.recover_partition(partition, from_offset)
                store_existed = True  # reconcile again: the store may now be ahead of the recovered log

    def _reconcile_store(self, store_existed: bool) -> None:
        store = self.store
        offsets = store.offsets()
        logs = self.logs
        has_data = any(log.log_end_offset > log.log_start_offset for log in logs.values())
        rebuild = not store_existed and has_data
        for partition, log in logs.items():
            next_offset = offsets.get(partition)
            if next_offset is not None and next_offset > log.log_end_offset:
                logger.warning("state store of %s-%d is at offset %d, beyond the local log end offset %d; "
                               "rebuilding the partition from the local log", self.topic, partition, next_offset,
                               log.log_end_offset)
            elif next_offset is not None and next_offset < log.log_start_offset < log.log_end_offset:
                logger.warning("state store of %s-%d is at offset %d, below the local log start offset %d; "
                               "rebuilding the partition from the local log", self.topic, partition, next_offset,
                               log.log_start_offset)
            else:
                continue
            # Partitions are independent in the store: the others keep their entries.
            store.drop_partition(partition)
            offsets.pop(partition, None)
            self.stats.store_rewinds += 1
        if rebuild:
            logger.warning("rebuilding the state store of %s from the local log in %s", self.topic, self.data_dir)
            self._mark_store_loading("rebuilding the state store from the local log")
            path = store.path
            store.close()
            StateStore.destroy(path)
            self.store = StateStore(path, self.options.store)
            self.stats.store_rebuilt = True
            self.stats.records_replayed += self._replay(logs, {p: log.log_start_offset for p, log in logs.items()},
                                                        "rebuilding store")
            return
        behind = {p: offsets.get(p, log.log_start_offset) for p, log in logs.items()
                  if offsets.get(p, log.log_start_offset) < log.log_end_offset}
        if behind:
            logger.info("replaying the local log tail into the state store: %s", behind)
            self.stats.records_replayed += self._replay({p: logs[p] for p in behind}, behind, "replaying log tail")

    def _replay(self, logs: dict[int, Log], from_offsets: dict[int, int], description: str) -> int:
        """:func:`rebuild_store_from_logs` into :attr:`store`, with its progress in the stats
        (``replay_target_offsets`` / ``replay_done_offsets``) and on a progress bar (``progress``
        option: by default only when stderr is a terminal). Returns the records applied."""
        target = sum(max(0, log.log_end_offset - from_offsets[p]) for p, log in logs.items())
        with self._stats_lock:
            self.stats.replay_target_offsets += target
        bar = progress_bar(self.options.progress, total=target, unit="offsets", desc=f"{self.topic}: {description}")

        def advanced(offsets: int) -> None:
            self.stats.replay_done_offsets += offsets
            bar.update(offsets)

        try:
            return rebuild_store_from_logs(self.store, logs, from_offsets, keep=self._replay_filter(),
                                           on_progress=advanced)
        finally:
            bar.close()

    def _mark_store_loading(self, what: str) -> None:
        """Mark the topic incomplete before the store is created empty, rebuilt or loses a partition's
        entries; the local logs stay readable (``logs_usable``). :meth:`_mark_store_complete` ends it."""
        mark_incomplete(self.data_dir, self.topic, f"`materializer {self.lock_command}` {what}",
                        f"wait until `materializer {self.lock_command}` has caught up (or run `materializer run "
                        f"--until-caught-up` if it was stopped)", logs_usable=True)
        self._store_loading = True

    def _mark_store_complete(self) -> None:
        """Caught up for the first time, or again after :meth:`_mark_store_loading` (a partition fetched
        again while running): the store holds what the logs hold; mark the topic complete unless it is."""
        if self._store_loading or topic_status(self.data_dir, self.topic).state != "complete":
            mark_complete(self.data_dir, self.topic, written_by=self.lock_command)
        self._store_loading = False

    def _replay_filter(self) -> Callable[[int, Record], bool] | None:
        return self._keep if self._checks_records else None

    def stop(self) -> None:
        """Ask :meth:`run` to return after the batch in progress (thread- and signal-safe); a fetch
        waiting for a broker that does not answer is given up at once."""
        self._stop_requested.set()
        fetcher = self.fetcher
        if fetcher is not None:
            fetcher.wakeup()

    def close(self) -> None:
        """Stop the background cleaner, flush and close the logs, write the checkpoints and the
        clean-shutdown marker (:meth:`TopicLogs.close`), close the store and the consumer. Idempotent.

        A :meth:`run_in_background` thread is stopped and joined first (it finishes its batch).
        """
        thread = self._thread
        if thread is not None and thread.is_alive() and thread is not threading.current_thread():
            self.stop()
            thread.join()
        try:
            self._close_for_restart()
        finally:
            self._release_data_dir()

    def _release_data_dir(self) -> None:
        lock, self._data_dir_lock = self._data_dir_lock, None
        if lock is not None:  # last: nothing of this materializer writes the data dir any more
            lock.release()

    def _close_for_restart(self) -> None:
        """What :meth:`close` does to the logs, the store and the clients (the data dir stays owned)."""
        try:
            applier, self._applier = self._applier, None
            if applier is not None:
                applier.close()
            self._stop_cleaner()
            if self._topic_logs is not None:
                self.logs = {}
                topic_logs, self._topic_logs = self._topic_logs, None
                topic_logs.close()
        finally:
            if self.store is not None:
                self.store.close()
                self.store = None
            if self.fetcher is not None:
                self.fetcher.close()
                self.fetcher = None
                self._fetch_in_flight = False
            if self.source is not None:
                self.source.close()
                self.source = None
            self._started = False

    # -- running -----------------------------------------------------------------------------

    def caught_up_partitions(self, eof_offsets: dict[int, int] | None = None) -> set[int]:
        """Partitions whose fetch position reached the high watermark seen at start: the local log
        end offset (on the replica path; after a gap it restarts at the broker's log start offset,
        so a broker whose log start offset passed its high watermark counts as reached), or the
        consumer's position, or where the client reported the end of the partition."""
        caught = {p for p, log in self.logs.items() if log.log_end_offset >= self.stats.high_watermarks.get(p, 0)}
        pending = [p for p in self.logs if p not in caught]
        if pending and self.source is not None and self.fetcher is None:
            positions = self.source.positions(pending)
            caught |= {p for p in pending if positions.get(p, -1) >= self.stats.high_watermarks[p]}
        if eof_offsets:
            caught |= {p for p, o in eof_offsets.items() if o >= self.stats.high_watermarks.get(p, 0)}
        return caught

    def run(self, until_caught_up: bool = False) -> MaterializerStats:
        """Fetch, append and materialize until stopped (Ctrl-C / :meth:`stop`) or, with
        ``until_caught_up``, until every partition reached the high watermark seen on start.

        Ctrl-C (SIGINT) or SIGTERM (main thread only) finishes the batch in progress and returns; a
        second signal raises ``KeyboardInterrupt`` at once. Returns :attr:`stats`.

        A continuous run outlives a broker that is away, at start too: it retries with capped
        exponential backoff and jitter for as long as it runs (``health.broker_reachable`` false,
        ``health.caught_up`` false meanwhile), logging one line when the broker goes away and one
        when it is back. A topic deleted while it runs keeps the store serving its last state
        (``caught_up`` false) until the topic is back; a topic re-created under the same name is
        materialized again from scratch (``on_topic_recreated``).

        Raises:
            BrokerUnreachableError: with ``until_caught_up``, the broker did not answer for
                ``broker_timeout_ms``.
            TopicIdChangedError: with ``until_caught_up`` the topic was deleted; or it was re-created
                and ``on_topic_recreated="fail"``.
            (and what :meth:`start` raises)
        """
        started = time.monotonic()
        previous_handler = self._install_sigint_handler()
        progress = None
        try:
            interval_s = self.options.retention_check_interval_ms / 1000.0
            next_retention_check = started + min(interval_s, _INITIAL_TASK_DELAY_MS / 1000.0)
            metadata_interval_s = self.options.metadata_refresh_interval_ms / 1000.0
            next_metadata_check = started + metadata_interval_s
            next_watermark_refresh = started + _WATERMARK_REFRESH_S
            self._running = True
            begin = True
            while not self._stop_requested.is_set():
                if begin or not self._started:
                    # The first round, or a start again after the topic's local copy was dropped.
                    if not self._start_for_run(until_caught_up, wait_for_topic=not begin):
                        break  # stopped while the broker (or the topic) was away
                    begin = False
                    self._start_cleaner()
                    if progress is not None:
                        progress.close()
                    progress = self._progress_bar()
                    self._caught_partitions = self.caught_up_partitions()
                if self._damaged:
                    self._heal_reported_damage()
                try:
                    if len(self._caught_partitions) == len(self.logs) and not self._away():
                        self._drain_applies()  # ready means the store holds what the logs hold
                        if self._store_loading or not self._caught_up.is_set():
                            self._mark_store_complete()
                        self._caught_up.set()
                    if time.monotonic() >= next_retention_check:
                        self.check_retention()
                        next_retention_check = time.monotonic() + interval_s
                    if not until_caught_up and time.monotonic() >= next_metadata_check:
                        next_metadata_check = time.monotonic() + metadata_interval_s
                        self.add_new_partitions()
                    if until_caught_up and self._caught_up.is_set():
                        break
                    fetch_started = time.monotonic()
                    if self.fetcher is not None:
                        before = {p: log.log_end_offset for p, log in self.logs.items()}
                        self._replica_step(fetch_started)
                        self._broker_back()
                        if progress is not None:
                            progress.update(sum(max(0, log.log_end_offset - before.get(p, log.log_end_offset))
                                                for p, log in self.logs.items()))
                        self._caught_partitions |= {p for p, log in self.logs.items()
                                                    if log.log_end_offset >= self.stats.high_watermarks.get(p, 0)}
                        continue
                    fetched_at = self._consumer_step(fetch_started, progress)
                    self._broker_back()
                except BrokerUnreachableError as exc:
                    if until_caught_up:
                        raise  # a bounded job: fail after --timeout, as documented
                    self._wait_for_broker(exc)
                    continue
                except TopicIdChangedError as exc:
                    self._topic_changed(exc, until_caught_up)
                    continue
                except TopicNotFoundError as exc:  # the metadata refresh of add_new_partitions, the fetcher's
                    if until_caught_up or self.topic_id is None:
                        raise
                    self._topic_changed(TopicIdChangedError(self.topic, self.topic_id, None, str(exc)),
                                        until_caught_up)
                    continue
                except CorruptRecordError as exc:
                    # Damage in a local log found by a reader of it (the apply worker): recover the log
                    # there and fetch the cut offsets again. Damage in what the broker sent fails the run.
                    partition = self._partition_of(exc)
                    if partition is None:
                        raise
                    self._heal(partition, exc)
                    continue
                if fetched_at >= next_watermark_refresh:
                    self._refresh_high_watermarks()
                    next_watermark_refresh = fetched_at + _WATERMARK_REFRESH_S
            if self._started:
                self._drain_applies()  # stopped or caught up: nothing fsynced is left unapplied
        except BaseException as exc:
            self._failure = exc
            raise
        finally:
            self._running = False
            try:
                self._stop_cleaner()
                if self._started and self._failure is None:
                    # The cleaner threads' retention may have moved a log start offset after the last
                    # apply: the store is left equal to its logs.
                    self._drain_applies()
                    self._drop_below_log_start()
            finally:
                if progress is not None:
                    progress.close()
                for signum, handler in (previous_handler or {}).items():
                    signal.signal(signum, handler)
                self.stats.elapsed_s += time.monotonic() - started
        return self.stats

    def _start_for_run(self, until_caught_up: bool, wait_for_topic: bool = False) -> bool:
        """:meth:`start`; a continuous run whose broker is away retries it with backoff until the
        broker answers or the run is stopped (a bounded run fails after ``broker_timeout_ms``);
        with ``wait_for_topic`` (a start again after the topic was dropped) a topic not in the
        metadata is waited for too. While no bootstrap server accepts a connection, nothing blocks
        for longer than a second, so a stop is quick. Returns False when stopped before it started."""
        if self._started:
            return True
        deadline = time.monotonic() + self.options.broker_timeout_ms / 1000.0
        attempts = 0
        while not self._stop_requested.is_set():
            attempts += 1
            try:
                if attempts > 1 and not self._bootstrap_answers():
                    raise BrokerUnreachableError(f"no broker of {self.bootstrap_servers} accepts connections (is "
                                                 f"the broker running and is --bootstrap-servers right?)")
                self.start()
                self._broker_back()
                return True
            except BrokerUnreachableError as exc:
                if until_caught_up:
                    if time.monotonic() >= deadline:
                        raise
                    self._stop_requested.wait(0.5)
                    continue
                self._wait_for_broker(exc)
            except KafkaSourceError as exc:
                # After a re-creation the new topic may not be in the metadata yet, or have no leaders.
                if until_caught_up or not wait_for_topic:
                    raise
                if not self._topic_missing:
                    logger.warning("%s; waiting for the topic", exc)
                    self._topic_missing = True
                self._stop_requested.wait(self._next_backoff())
        return False

    def _bootstrap_answers(self, timeout_s: float = 1.0) -> bool:
        """True when a TCP connection to one of the bootstrap servers succeeds (``host:port``)."""
        for address in self.bootstrap_servers.split(","):
            host, _, port = address.strip().rpartition(":")
            try:
                with socket.create_connection((host.strip("[]") or "localhost", int(port)), timeout=timeout_s):
                    return True
            except (OSError, ValueError):
                continue
        return False

    def _consumer_step(self, started: float, progress) -> float:
        """One round of the consumer path: fetch, check the topic id, append, apply. Returns when
        the fetch returned (monotonic seconds)."""
        try:
            fetch = self.source.fetch(self.options.batch_size, self.options.poll_timeout_ms)
        finally:
            fetched_at = time.monotonic()
            self.stats.fetches += 1
            self.stats.fetch_s += fetched_at - started
        before = {p: log.log_end_offset for p, log in self.logs.items()}
        if fetch.records or fetched_at >= self._next_topic_id_check:
            # Records fetched after a re-creation are another topic's: compare the ids before any
            # of them is written (one metadata request per fetch that returned records, and at most
            # one a second while idle, so a deletion is noticed).
            self._check_consumer_topic_id()
            self._next_topic_id_check = fetched_at + _TOPIC_ID_CHECK_S
        if fetch.records:
            self.process(fetch.records)
            self.stats.bytes_fetched += fetch.size_in_bytes
        for partition, offset in fetch.eof_offsets.items():  # past trailing transaction markers
            log = self.logs.get(partition)
            if log is not None and offset > log.log_end_offset:  # or past offsets deleted on the broker
                self._follow_client_position(partition, offset)
                self._drop_below_log_start([partition])
            if offset > self.stats.next_offsets.get(partition, 0):
                self.stats.next_offsets[partition] = offset
        if fetch.eof_offsets:
            self._refresh_high_watermarks()
        if progress is not None:
            progress.update(sum(max(0, self.logs[p].log_end_offset - before[p]) for p in before if p in self.logs))
        if len(self._caught_partitions) < len(self.logs):
            if fetch.eof_offsets or not fetch.records:  # maybe stopped below the HW at a txn marker
                self._caught_partitions |= self.caught_up_partitions(fetch.eof_offsets)
            else:
                self._caught_partitions |= {p for p, log in self.logs.items()
                                            if log.log_end_offset >= self.stats.high_watermarks[p]}
        return fetched_at

    def _check_consumer_topic_id(self) -> None:
        """Consumer path: the cluster's topic id must still be the local copy's.

        Raises:
            TopicIdChangedError: the topic is gone or has another id.
        """
        if self.topic_id is None:
            return
        found = self.source.topic_id()
        if found != self.topic_id:
            raise TopicIdChangedError(self.topic, self.topic_id, found)

    def _away(self) -> bool:
        """True while the data may be stale: the broker is unreachable or the topic is gone."""
        return self._broker_away_since is not None or self._topic_missing

    def _topic_changed(self, exc: TopicIdChangedError, until_caught_up: bool) -> None:
        """The cluster's topic is not the local copy's any more (deleted, or re-created).

        Deleted: a bounded run fails; a continuous one keeps serving the last state, reports
        ``caught_up=False`` and polls the metadata with backoff until the topic is back. Back under
        the same id: carry on. Under another id (or re-created at once): ``on_topic_recreated``
        decides: fail, or drop the local copy and start over from the new topic.

        Raises:
            TopicIdChangedError: a bounded run's topic was deleted, or ``on_topic_recreated="fail"``.
        """
        self._fetch_in_flight = False
        if exc.found is None:
            if until_caught_up:
                raise exc
            if not self._topic_missing:
                logger.warning("%s; the state store keeps serving its last state (caught_up=False) until the topic "
                               "is back", exc)
                self._topic_missing = True
                self._caught_up.clear()
            self._stop_requested.wait(self._next_backoff())
            found = self._cluster_topic_id()
            if found is None:
                return
            if found == exc.expected:
                logger.warning("topic %s is back (id %s)", self.topic, topic_id_to_string(found))
                self._topic_missing = False
                return
            exc = TopicIdChangedError(self.topic, exc.expected, found)
        if self.options.on_topic_recreated == "fail":
            raise exc
        logger.warning("%s: dropping its local logs and state store in %s and materializing the new topic", exc,
                       self.data_dir)
        self._restart_with_new_topic()

    def _cluster_topic_id(self) -> uuid.UUID | None:
        """The topic's id in the cluster now (a metadata request); None while it does not exist.

        Raises:
            BrokerUnreachableError: the cluster does not answer.
        """
        if self.fetcher is not None:
            self.fetcher.refresh_metadata()
            if not self.fetcher.partitions():
                return None
            return self.fetcher.topic_id_in_metadata()
        return self.source.topic_id()

    def _restart_with_new_topic(self) -> None:
        """Close everything but the data dir's ownership and drop the topic's local copy; :meth:`run`
        then starts again from the new topic (live: the same run goes on with new logs and store)."""
        self._stop_cleaner()
        self._close_for_restart()
        drop_local_copy(self.data_dir, self.topic)
        for per_partition in (self.stats.start_offsets, self.stats.high_watermarks, self.stats.next_offsets,
                              self.stats.latest_high_watermarks):
            per_partition.clear()
        self._caught_up.clear()
        self._caught_partitions = set()
        self._topic_missing = False
        self.stats.topic_recreations += 1

    def _refresh_high_watermarks(self) -> None:
        """Raise ``stats.latest_high_watermarks`` to the client's cached values (no request)."""
        latest = self.stats.latest_high_watermarks
        for partition, high in self.source.cached_high_watermarks(sorted(self.logs)).items():
            if high > latest.get(partition, -1):
                latest[partition] = high

    def on_client_statistics(self, callback: Callable[[str], None],
                             interval_ms: int = DEFAULT_STATISTICS_INTERVAL_MS) -> None:
        """Call ``callback(stats_json)`` with each librdkafka statistics document (JSON text, see
        librdkafka's STATISTICS.md) of the consumer, every ``interval_ms`` (librdkafka
        ``statistics.interval.ms``; a ``statistics.interval.ms`` in ``options.client_config`` wins).

        Called from the ingest thread, inside the fetch; an exception in a callback is logged and
        ignored. Register before :meth:`start` (the consumer is created there).

        Raises:
            RuntimeError: the materializer has already started.
            ValueError: ``interval_ms`` < 1.
        """
        if self._started:
            raise RuntimeError("register statistics callbacks before start(): the consumer already exists")
        if interval_ms < 1:
            raise ValueError(f"statistics interval must be >= 1 ms, got {interval_ms}")
        self._statistics_callbacks.append(callback)
        self._statistics_interval_ms = min(self._statistics_interval_ms, interval_ms) \
            if len(self._statistics_callbacks) > 1 else interval_ms

    def _on_client_statistics(self, stats_json: str) -> None:
        for callback in list(self._statistics_callbacks):
            callback(stats_json)

    def _next_backoff(self) -> float:
        """The next retry's wait, seconds: doubled from 1 s up to 10 s, with +-20% jitter (so
        that many instances do not retry in step; librdkafka's ``reconnect.backoff`` is jittered
        the same way)."""
        backoff = self._backoff_s
        self._backoff_s = min(backoff * 2, _RETRY_BACKOFF_MAX_S)
        return backoff * random.uniform(0.8, 1.2)

    def _wait_for_broker(self, exc: BaseException) -> None:
        """A continuous run outlives a broker that is away: say so once, sleep the next backoff
        (or until :meth:`stop`). The store keeps serving what it has; ``health.running`` stays
        true, ``health.caught_up`` and ``health.broker_reachable`` false, and the fetch resumes
        where it stopped."""
        self._fetch_in_flight = False
        if self._broker_away_since is None:
            self._broker_away_since = time.monotonic()
            self._caught_up.clear()
            logger.warning("%s; retrying with backoff (up to %.0f s) until it answers", exc, _RETRY_BACKOFF_MAX_S)
        else:
            logger.debug("broker still unreachable: %s", exc)
        self._stop_requested.wait(self._next_backoff())

    def _broker_back(self) -> None:
        """The broker answered: end an outage (one log line) and reset the backoff."""
        self._backoff_s = _RETRY_BACKOFF_INITIAL_S
        if self._broker_away_since is not None:
            logger.warning("the Kafka cluster %s answers again (unreachable for %.1f s)", self.bootstrap_servers,
                           time.monotonic() - self._broker_away_since)
            self._broker_away_since = None

    # -- services: background run, readiness, health, update callbacks ------------------------

    def run_in_background(self) -> threading.Thread:
        """Start :meth:`run` (continuous) in a daemon thread and return it; :meth:`stop` ends it.

        The service pattern: start, :meth:`wait_until_caught_up` before serving, watch
        :attr:`health` while serving (a failed ingest sets ``failed``; serve nothing stale), and
        :meth:`stop` then :meth:`close` (or leave the ``with`` block) at shutdown.

        Raises:
            RuntimeError: already running in the background.
        """
        if self._thread is not None and self._thread.is_alive():
            raise RuntimeError(f"materializer of {self.topic} is already running in the background")
        self.start()

        def target() -> None:
            try:
                self.run()
            except BaseException:  # noqa: BLE001 - kept in health.failed for the service to act on
                logger.exception("materializer of %s failed", self.topic)

        self._thread = threading.Thread(target=target, name=f"materializer-{self.topic}", daemon=True)
        self._thread.start()
        return self._thread

    def wait_until_caught_up(self, timeout_s: float | None = None) -> bool:
        """Block until every partition reached the high watermark seen at start (the store is then
        as fresh as the topic was when ingest began), ingest failed, or ``timeout_s`` passed. While
        the broker is away, or the topic is gone or being materialized again after a re-creation,
        it is not caught up.

        Returns:
            True when caught up, False on timeout.

        Raises:
            the exception that stopped ingest, if it failed.
        """
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while not self._caught_up.is_set():
            if self._failure is not None:
                raise self._failure
            remaining = 0.1 if deadline is None else min(0.1, deadline - time.monotonic())
            if remaining <= 0:
                return False
            self._caught_up.wait(remaining)
        return True

    @property
    def health(self) -> "MaterializerHealth":
        """``running`` (the ingest loop is going), ``caught_up`` (reached the start high
        watermarks at least once and nothing makes the store stale now: the broker answers, the
        topic exists), ``failed`` (the exception that stopped it, else None), ``broker_reachable``."""
        return MaterializerHealth(self._running, self._caught_up.is_set() and not self._away(), self._failure,
                                  self._broker_away_since is None)

    def on_update(self, callback: Callable[[bytes, "StoredValue | None", "StoredValue | None", int], None]) -> None:
        """Call ``callback(key, old, new, partition)`` after each record reaches the store.

        ``old``/``new`` are the key's :class:`StoredValue` in that partition before and after
        (``new`` is None for a tombstone, ``old`` None for a new key). Called from the ingest
        thread, after the store write committed, in offset order per partition; an exception in a
        callback stops ingest (``health.failed``). Costs one store read per record while any
        callback is registered, and on the replica path the store is then applied in the ingest
        thread, not by the apply worker (one registered while :meth:`run` ingests may first be
        called from the apply worker's thread, for the stretch it is applying).
        """
        self._update_callbacks.append(callback)

    def add_new_partitions(self) -> list[int]:
        """Start ingesting partitions added to the topic since :meth:`start` (called by :meth:`run`
        every ``metadata_refresh_interval_ms``; a subscribed Kafka consumer notices them on its
        metadata refresh the same way).

        Each new partition gets its local log (from the broker's log start offset), its place in
        the assignment (``incremental_assign``: the other partitions keep their positions) and, on a
        compacted topic, the cleaner's attention. Returns the partitions added.

        Raises:
            KafkaSourceError: the metadata or the watermarks cannot be read.
            StorageError: a new partition's log cannot be opened.
        """
        new = sorted(set(self.source.partitions()) - set(self.logs))
        if not new:
            return []
        self._drain_applies()  # the apply worker reads self.logs
        start_offsets = {}
        for partition in new:
            log = self._topic_logs.add_partition(partition)
            low, high = self.source.watermark_offsets(partition)
            self._align_empty_log(partition, low, high)
            log = self.logs[partition]
            start_offsets[partition] = log.log_end_offset
            self.stats.start_offsets[partition] = log.log_end_offset
            self.stats.high_watermarks[partition] = high
            self.stats.next_offsets[partition] = log.log_end_offset
            self.stats.latest_high_watermarks[partition] = high
            if self._cleaner_logs is not None:
                self._cleaner_logs[(self.topic, partition)] = log
            if self._appender is not None:
                self._store_offsets[partition] = log.log_start_offset
        if self.fetcher is None:
            self.source.add_partitions(start_offsets, {p: last_fetched_epoch(self.logs[p], offset)
                                                       for p, offset in start_offsets.items()})
        logger.info("topic %s has new partitions %s: ingesting them from offsets %s", self.topic, new, start_offsets)
        return new

    # -- background cleaning and retention ---------------------------------------------------

    def _start_cleaner(self) -> None:
        """Start the LogCleaner threads on the topic's logs (compacted topics; no-op when disabled)."""
        config = self.options.cleaner_config()
        if self.cleaner is not None or config is None or not self.logs or not self.log_config.compact:
            return
        logs = {(self.topic, partition): log for partition, log in self.logs.items()}
        self._cleaner_logs = logs  # the manager re-reads it: partitions added later are cleaned too
        cleaner = LogCleaner(self.data_dir, logs, config, on_round=self._add_cleaner_round,
                             on_damage=self._on_cleaner_damage)
        logger.info("starting %d log cleaner thread(s) on %s (dedupe buffer %d bytes, backoff %d ms)",
                    config.num_threads, self.topic, config.dedupe_buffer_size_bytes, config.backoff_ms)
        cleaner.startup()
        self.cleaner = cleaner

    def _stop_cleaner(self) -> None:
        """Shut the cleaner down and wait for its threads (a round in progress is aborted)."""
        cleaner, self.cleaner = self.cleaner, None
        self._cleaner_logs = None
        if cleaner is None:
            return
        cleaner.shutdown(timeout_s=None)
        with self._stats_lock:
            self.stats.cleaner_checkpoints_reset += cleaner.cleaner_manager.corrupt_checkpoints_reset
            self.stats.cleaner_threads_died += cleaner.dead_thread_count
        if cleaner.dead_thread_count:
            logger.warning("%d log cleaner thread(s) of %s died; see the log above", cleaner.dead_thread_count,
                           self.topic)

    def _add_cleaner_round(self, round_stats: CleanerStats) -> None:
        """Add one completed round's ``CleanerStats`` (called from a cleaner thread)."""
        with self._stats_lock:
            self.stats.cleaner_rounds += 1
            self.stats.cleaner_bytes_read += round_stats.bytes_read
            self.stats.cleaner_bytes_written += round_stats.bytes_written
            self.stats.cleaner_records_read += round_stats.messages_read
            self.stats.cleaner_records_written += round_stats.messages_written
            cleaner = self.cleaner
            if cleaner is not None:
                self.stats.cleaner_max_dirty_ratio = cleaner.cleaner_manager.dirtiest_log_cleanable_ratio

    def check_retention(self, now_ms: int | None = None) -> int:
        """Apply retention (:func:`delete_old_segments`) to every log now; returns segments deleted.

        Skipped while the background cleaner runs on this (compacted) topic: its threads apply
        retention to compacted logs themselves. The state store is left as it is (see the
        class docstring). ``now_ms`` defaults to the wall clock.
        """
        if self.cleaner is not None:
            return 0
        self._drain_applies()  # no apply reads a segment retention deletes
        deleted = 0
        for _, log in sorted(self.logs.items()):
            before = log.log_start_offset
            count = delete_old_segments(log, now_ms)
            if count:
                logger.info("retention deleted %d segment(s) of %s; log start offset %d -> %d", count, log.dir.name,
                            before, log.log_start_offset)
            deleted += count
        if deleted:
            self._drop_below_log_start()
        self.stats.retention_checks += 1
        self.stats.retention_segments_deleted += deleted
        return deleted

    def _install_sigint_handler(self):
        """SIGINT (Ctrl-C) and SIGTERM (what systemd and Kubernetes send) finish the batch in
        progress and make :meth:`run` return, so the caller closes cleanly (checkpoints, the
        clean-shutdown marker: no recovery or index rebuild on the next start). A second signal
        aborts at once (``KeyboardInterrupt``). Main thread only; returns the previous handlers."""
        if threading.current_thread() is not threading.main_thread():
            return None

        def on_signal(signum, frame):  # noqa: ARG001 - signal handler signature
            if self._stop_requested.is_set():
                raise KeyboardInterrupt
            name = signal.Signals(signum).name
            logger.warning("%s: finishing the current batch (send it again to abort)", name)
            self.stop()

        return {signum: signal.signal(signum, on_signal) for signum in (signal.SIGINT, signal.SIGTERM)}

    def _progress_bar(self):
        if not show_progress(self.options.progress):
            return None
        total = sum(max(0, self.stats.high_watermarks[p] - self.stats.start_offsets[p]) for p in self.logs)
        return progress_bar(True, total=total, unit="offsets", desc=self.topic)

    def process(self, fetched: Sequence[FetchedRecord]) -> None:
        """Append fetched records to their logs (fsynced), then apply them to the store in one batch.

        Local batches carry the leader epoch of the broker's batches (``Message.leader_epoch()``),
        so the log's leader epoch cache follows the broker's. A partition whose records start below
        the local log end offset was moved back by the client (librdkafka's KIP-320 validation found
        that the leader's log diverged there, or its position was reset): the local log is cut
        there and the partition's store rewound first. A partition whose records start above the
        local log end offset while the broker's log start offset is above it too lost offsets to
        retention or DeleteRecords before they were fetched: the local log restarts at the broker's
        log start offset and the gap is counted. With key/value formats other than ``bytes``, every
        keyed record is decoded first: with ``on_bad_record="fail"`` a bad one raises before
        anything of this fetch is written (the next start fetches it again).

        Raises:
            DeserializationError: a record does not decode (``on_bad_record="fail"``).
        """
        by_partition: dict[int, list[FetchedRecord]] = {}
        for item in fetched:
            by_partition.setdefault(item.partition, []).append(item)
        self.stats.records_fetched += len(fetched)
        new_items: dict[int, list[FetchedRecord]] = {}
        to_apply: dict[int, list[Record]] = {}
        for partition, items in by_partition.items():
            if partition not in self.logs:
                continue
            items = _after_last_rewind(items)
            if not self._follow_client_position(partition, items[0].record.offset):
                continue
            items = [item for item in items if item.record.offset >= self.logs[partition].log_end_offset]
            if items:
                new_items[partition] = items
                keyed = [item.record for item in items if item.record.key is not None]
                to_apply[partition] = [r for r in keyed if self._keep(partition, r)] if self._checks_records else keyed
        next_offsets: dict[int, int] = {}
        for partition, items in new_items.items():
            log = self.logs[partition]
            append_started = time.monotonic()
            for timestamp_type, epoch, records in _chunks(items):
                self._append(log, records, timestamp_type, epoch)
            flush_started = time.monotonic()
            log.flush()
            self.stats.append_s += flush_started - append_started
            self.stats.fsync_s += time.monotonic() - flush_started
            nulls = sum(1 for item in items if item.record.key is None)
            if nulls:
                self._note_null_keys(partition, nulls)
            next_offsets[partition] = items[-1].record.offset + 1
        self._follow_leader_log_start(self.source.cached_log_start_offsets(sorted(by_partition)))
        self._drop_below_log_start(p for p in by_partition if p in self.logs)  # the cleaner threads' retention
        for partition, records in to_apply.items():  # nothing below a log start offset is applied
            start = self.logs[partition].log_start_offset
            if records and records[0].offset < start:
                to_apply[partition] = [r for r in records if r.offset >= start]
        if next_offsets:
            updates = self._updates(to_apply) if self._update_callbacks else ()
            applied_bytes = sum(len(r.key) + len(r.value or b"") for records in to_apply.values() for r in records)
            apply_started = time.monotonic()
            self.stats.records_applied += self.store.apply(to_apply, next_offsets)
            self.stats.apply_s += time.monotonic() - apply_started
            self.stats.bytes_applied += applied_bytes
            for partition, offset in next_offsets.items():
                if offset > self.stats.next_offsets.get(partition, 0):
                    self.stats.next_offsets[partition] = offset
            for key, old, new, partition in updates:
                for callback in self._update_callbacks:
                    callback(key, old, new, partition)

    def _replica_step(self, started: float) -> None:
        """One round of the replica path: take the Fetch response in flight (sending one first if
        none is), send the next request at once (its offsets read off the batch frames), then
        append this response and apply what became stable while the next one travels."""
        fetcher, appender = self.fetcher, self._appender
        try:
            if not self._fetch_in_flight:
                fetcher.send(appender.positions(), self.options.poll_timeout_ms)
            self._fetch_in_flight = False  # receive() takes it, also when it raises
            fetched = fetcher.receive()
        finally:
            self.stats.fetches += 1
            self.stats.fetch_s += time.monotonic() - started
        if not self._stop_requested.is_set():
            fetcher.send(appender.positions_after(fetched), self.options.poll_timeout_ms)
            self._fetch_in_flight = True
        self.process_batches(fetched)

    def process_batches(self, fetched: Sequence[PartitionData]) -> None:
        """Append the leader's batches verbatim (:class:`VerbatimAppender`), fsync, then have every
        committed record that became stable applied to the store, read back ``read_committed``
        from the log: by the :class:`ApplyWorker` thread while the next response is appended, or
        here when update callbacks want the records in this thread. :meth:`run` waits for the
        worker before it reports the store caught up.

        Each partition's store offset moves to the last stable offset its log had once fsynced:
        data of committed transactions is applied when the COMMIT marker arrives (in offset order
        with everything else), aborted data never, and an open transaction holds later records
        back, as a ``read_committed`` consumer is held back (Kafka ``FetchIsolation.TXN_COMMITTED``).

        Raises:
            CorruptRecordError: a fetched batch fails its CRC check (nothing of it appended).
            DeserializationError: a record does not decode (``on_bad_record="fail"``); the log keeps
                it and the next start fails on it again (raised here or by the next call).
            StorageError / StoreError: the log or the store cannot be written (the store's errors
                are raised here or by the next call).
        """
        append_started = time.monotonic()
        appended = self._appender.append(fetched)
        for partition, high in appended.high_watermarks.items():
            if high > self.stats.latest_high_watermarks.get(partition, -1):
                self.stats.latest_high_watermarks[partition] = high
        flush_started = time.monotonic()
        for partition in {*appended.partitions, *appended.truncations}:
            self.logs[partition].flush()
        flushed = time.monotonic()
        if appended.truncations:
            # The appender drained the apply worker before each cut: the store offsets are ours now.
            for partition, truncation in sorted(appended.truncations.items()):
                self._note_truncation(truncation)
                self._rewind_store(partition, min(truncation.new_end_offset, truncation.old_end_offset))
            for partition, gap in appended.gaps.items():
                self.stats.offset_gaps[partition] = self.stats.offset_gaps.get(partition, 0) + gap.end - gap.start
            self._drop_below_log_start(appended.truncations)  # a restart at the leader's log start offset
        self._follow_leader_log_start(appended.log_start_offsets)
        self.stats.append_s += flush_started - append_started
        self.stats.fsync_s += flushed - flush_started
        self.stats.records_fetched += appended.records
        self.stats.bytes_fetched += appended.size_in_bytes
        self.stats.batches_appended += appended.batches
        self.stats.bytes_appended += appended.size_in_bytes
        # Durable bounds: the apply never reads past what this fsync covered, however far the
        # ingest thread has appended by the time it runs.
        bounds = {partition: self.logs[partition].last_stable_offset for partition in appended.partitions}
        if not bounds:
            return
        if self._update_callbacks or self._applier is None:
            self._drain_applies()
            self._apply_stable(bounds)
        else:
            self._applier.submit(bounds)

    def _follow_leader_log_start(self, leader_log_start_offsets: Mapping[int, int]) -> None:
        """Raise each local log start offset to the leader's (as far as the local log reaches), as a
        follower does (``UnifiedLog.maybeIncrementLogStartOffset``), and drop the store entries of
        records now below it (:meth:`_drop_below_log_start`). Retention deletes the segments
        below later. Rare (the broker's retention or DeleteRecords), so the apply worker is
        drained first: it never reads below a log start offset that moved under it."""
        raised = {}
        for partition, leader_start in leader_log_start_offsets.items():
            log = self.logs.get(partition)
            if log is not None and leader_start > log.log_start_offset and log.log_end_offset > log.log_start_offset:
                raised[partition] = min(leader_start, log.log_end_offset)
        if not raised:
            return
        self._drain_applies()
        for partition, new_start in raised.items():
            log = self.logs[partition]
            if log.maybe_increment_log_start_offset(new_start):
                logger.info("%s-%d: the log start offset follows the leader's to %d", self.topic, partition, new_start)
        self._drop_below_log_start(raised)

    def _drop_below_log_start(self, partitions: Iterable[int] | None = None) -> None:
        """Drop the store entries of records below each log start offset (they are gone from the log,
        so from what a consumer of the topic reads now and from a store rebuilt from the log;
        :meth:`StateStore.drop_below`). Caller: the store's only writer at that moment."""
        for partition in sorted(self.logs if partitions is None else partitions):
            log = self.logs[partition]
            start = log.log_start_offset
            if start <= self._store_start_offsets.get(partition, 0):
                continue
            dropped = self.store.drop_below(partition, start)
            self._store_start_offsets[partition] = start
            if self.fetcher is not None and self._store_offsets.get(partition, start) < start:
                self._store_offsets[partition] = start
            if dropped:
                logger.info("%s-%d: dropped %d state store entries whose latest record is below the log start "
                            "offset %d", self.topic, partition, dropped, start)
                self.stats.store_entries_expired += dropped

    def _drain_applies(self) -> None:
        """Wait for the apply worker to apply everything submitted (no-op without one).

        Raises:
            StoreError / StorageError / DeserializationError: what an apply raised.
        """
        if self._applier is not None:
            self._applier.drain()

    def _apply_stable(self, bounds: Mapping[int, int]) -> None:
        """Apply each partition's committed records from its store offset up to its bound
        (``partition -> end offset``, at most the log's last stable offset when it was fsynced):
        all of them in one bulk load (one SST file) unless records are checked or update
        callbacks want them one by one. Runs on the apply worker or, with callbacks, in the
        ingest thread; never both at once."""
        started = time.monotonic()
        readers = {}
        self._drop_below_log_start(bounds)  # retention by the cleaner threads moves log start offsets too
        for partition, end in bounds.items():
            log = self.logs[partition]
            start = self._store_offsets.get(partition, log.log_start_offset)
            if start < log.log_start_offset:
                # Retention (the cleaner's, on compact,delete topics) deleted records the store had not
                # applied: continue where the log starts, as a consumer with auto.offset.reset=earliest would.
                logger.warning("%s: offsets [%d, %d) were deleted by retention before they reached the state "
                               "store; continuing at the log start offset %d", log.dir.name, start,
                               log.log_start_offset, log.log_start_offset)
                start = log.log_start_offset
            if end > start:
                readers[partition] = CommittedReader.from_log(log, start, end)
        if self._update_callbacks:
            for partition, reader in readers.items():
                self._apply_with_updates(partition, reader)
        elif self._checks_records:
            for partition, reader in readers.items():
                self._applied(partition, _apply_checked_records(self.store, partition, reader, self._keep, None))
        elif readers:
            for partition, result in load_committed_partitions(self.store, readers).items():
                self._applied(partition, result)
        self.stats.apply_s += time.monotonic() - started

    def _apply_with_updates(self, partition: int, reader: CommittedReader) -> None:
        """Apply one partition's stretch record by record and call the update callbacks."""
        read = list(reader.records())
        records = [r for r in read if r.key is not None]
        keep = [r for r in records if self._keep(partition, r)] if self._checks_records else records
        updates = self._updates({partition: keep})
        applied = self.store.apply({partition: keep}, {partition: reader.next_offset})
        written = sum(len(r.key) + len(r.value or b"") for r in keep)
        self._applied(partition, LoadResult(applied, len(read) - len(records), reader.next_offset, written))
        for key, old, new, p in updates:
            for callback in self._update_callbacks:
                callback(key, old, new, p)

    def _applied(self, partition: int, result: LoadResult) -> None:
        """Account for one partition's applied stretch: store offset, stats, null keys."""
        self.stats.bytes_applied += result.bytes_written
        self._store_offsets[partition] = result.next_offset
        self.stats.records_applied += result.applied
        if result.next_offset > self.stats.next_offsets.get(partition, 0):
            self.stats.next_offsets[partition] = result.next_offset
        if result.null_keys:
            self._note_null_keys(partition, result.null_keys)

    @property
    def _checks_records(self) -> bool:
        return self.options.key_format != "bytes" or self.options.value_format != "bytes"

    def _keep(self, partition: int, record: Record) -> bool:
        """True when ``record``'s key and value decode in the configured formats (tombstone values
        are not decoded); False, logged and counted, for a bad one with ``on_bad_record="skip"``.

        Raises:
            DeserializationError: a bad record with ``on_bad_record="fail"``.
        """
        try:
            self.key_serde.decode(record.key, partition, record.offset)
            if record.value is not None:
                self.value_serde.decode(record.value, partition, record.offset)
        except DeserializationError as exc:
            if self.options.on_bad_record == "fail":
                raise
            self.stats.records_skipped += 1
            if self.stats.records_skipped <= _SKIP_WARNINGS or self.stats.records_skipped % 10_000 == 0:
                logger.warning("skipped (%d so far, kept in the local log, not materialized): %s",
                               self.stats.records_skipped, exc)
            return False
        return True

    def _updates(self, to_apply: dict[int, list[Record]]) -> list[tuple]:
        """(key, old, new, partition) of each record about to be applied, in order."""
        updates = []
        for partition, records in to_apply.items():
            current: dict[bytes, StoredValue | None] = {}
            for record in records:
                old = current[record.key] if record.key in current else self.store.get(record.key, partition)
                new = None if record.value is None else StoredValue(partition, record.offset, record.timestamp,
                                                                   record.value)
                current[record.key] = new
                updates.append((record.key, old, new, partition))
        return updates

    def _follow_client_position(self, partition: int, first_offset: int) -> bool:
        """Consumer path: cut or restart the local log where the client's records of ``partition``
        now start (see :meth:`process`). Returns False when the cut fell inside a local batch and
        so below ``first_offset``: the client is sent back to the new log end offset and these
        records are dropped (fetched again from there)."""
        log = self.logs[partition]
        end = log.log_end_offset
        if first_offset < end:
            truncation = self._cut_log(partition, first_offset, "the client fetches from a lower offset (the "
                                       "leader's log diverged, KIP-320 validation)")
            self._note_truncation(truncation)
            self._rewind_store(partition, truncation.new_end_offset)
            if log.log_end_offset < first_offset:
                self.source.seek(partition, log.log_end_offset, last_fetched_epoch(log, log.log_end_offset))
                return False
        elif first_offset > end:
            low = self.source.cached_log_start_offsets([partition]).get(partition, -1)
            if low > end:
                logger.warning("%s-%d: offsets [%d, %d) were deleted on the broker (retention or DeleteRecords) "
                               "before they were fetched; the local log restarts at the broker's log start offset "
                               "%d", self.topic, partition, end, low, low)
                log.truncate_fully_and_start_at(low)
                log.flush()
                self.stats.offset_gaps[partition] = self.stats.offset_gaps.get(partition, 0) + low - end
        return True

    def _append(self, log: Log, records: list[Record], timestamp_type: TimestampType, leader_epoch: int = -1) -> None:
        appended = log.append_records(records, compression=self.compression, timestamp_type=timestamp_type,
                                      max_batch_bytes=self.options.max_batch_bytes,
                                      partition_leader_epoch=leader_epoch)
        self.stats.batches_appended += appended.batches
        self.stats.bytes_appended += appended.size_in_bytes

    def _note_null_keys(self, partition: int, count: int) -> None:
        self.stats.null_key_records += count
        if not self._null_key_warned:
            self._null_key_warned = True
            logger.warning("%s-%d has records with a null key: they are kept in the local log but cannot be "
                           "materialized (counted in stats.null_key_records)", self.topic, partition)

    def __repr__(self) -> str:
        return f"Materializer({self.bootstrap_servers!r}, {self.topic!r}, {str(self.data_dir)!r})"
