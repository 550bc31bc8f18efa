"""One partition's local log: ordered segments, append with roll, read, lookup, swap, delete, truncate.

The local log keeps the broker's offsets: a batch may start after the log end offset (offset
gaps left by compaction or transactions), and the log end offset is the last batch's
``next_offset``. A new segment's base offset is the base offset of the batch that caused the roll.

Roll rules (``UnifiedLog.maybeRoll`` / ``LogSegment.shouldRoll``): roll before appending when
``size + incoming > segment.bytes``; or the segment is non-empty and the incoming max timestamp
minus the segment's first batch max timestamp exceeds ``segment.ms`` (``min(segment.ms,
max.compaction.lag.ms)`` for compacted topics) minus jitter (wall clock since creation when the
first batch has no timestamp); or an index is full; or the incoming last offset does not fit the
segment's int32 relative offsets.

Producers and transactions: the log owns one ``ProducerStateManager`` (producer epochs, last
data offsets, open transactions), rebuilt from batch headers on first use and updated on every
append after that; it answers the first unstable offset, the last stable offset and the active
producers. For every ABORT marker the log appends ``AbortedTxn(producer id, first offset, marker
offset, last stable offset)`` to the active segment's ``.txnindex`` (Kafka ``ProducerAppendInfo``
/ ``LogSegment.updateTxnIndex``).

Topic identity and leader epochs (KIP-516, KIP-101, KIP-279): the log owns its folder's
``partition.metadata`` (the topic id, written before any batch when the caller names the topic
id) and its ``LeaderEpochFileCache`` (``leader-epoch-checkpoint``), kept as ``UnifiedLog`` keeps
it: every appended batch whose partition leader epoch is ``>= 0`` is assigned before its bytes
reach the segment; ``truncate_to`` drops the entries from the cut on (``truncate_fully_and_start_at``
clears them); every raise of the log start offset drops the history before it; cleaning leaves the
cache alone (cleaned batches keep their epochs, and an epoch's start offset stays even when its
first batch is cleaned away, as on a broker).

Thread-safety: a Log has one writer. ``append_batch``, ``append_records``, ``roll``,
``replace_segments``, ``delete_segments``, ``truncate_to`` and ``close`` take ``Log.lock`` (a
``threading.RLock``); callers that need a stable view across calls (the cleaner) hold it too.
Readers (``read_batches``) take a snapshot of the segment list and each segment's size under the
lock and read without it; a segment deleted meanwhile is renamed, not removed, until
``file.delete.delay.ms`` has passed (see ``delete_pending_files``).

Mirrors ``UnifiedLog`` and ``LocalLog`` (``org.apache.kafka.storage.internals.log``).
"""

from __future__ import annotations

import logging
import threading
import uuid
from pathlib import Path
from typing import Iterable, Iterator, NamedTuple, Sequence

from .clock import wall_clock_ms
from .errors import ClosedSegmentError, InconsistentTopicIdError, InvalidOffsetError, StorageError
from .files import (
    CLEANED_FILE_SUFFIX,
    DELETED_FILE_SUFFIX,
    SWAP_FILE_SUFFIX,
    flush_dir,
    log_file,
    offset_index_file,
    parse_partition_dir_name,
    time_index_file,
    transaction_index_file,
)
from .leader_epoch_cache import LEADER_EPOCH_CHECKPOINT_FILE, LeaderEpochFileCache
from .log_config import LONG_MAX, LogConfig
from .log_loader import LogLoader, RecoveryTruncation, has_clean_shutdown_file
from .log_segments import LogSegments
from .partition_metadata import PartitionMetadataFile, topic_id_to_string
from .record_batch import Record, RecordBatch
from .record_batch_builder import RecordBatchBuilder, estimate_record_size_upper_bound
from .compression import CompressionType
from .producer_state_manager import DEFAULT_PRODUCER_ID_EXPIRATION_MS, LastRecord, ProducerStateManager
from .transaction_index import AbortedTxn
from .record_batch import TimestampType
from .segment import LogSegment, RollParams

__all__ = ["AppendedBatches", "DEFAULT_MAX_BATCH_BYTES", "Log"]

logger = logging.getLogger(__name__)

DEFAULT_MAX_BATCH_BYTES = 1 << 20
"""Default cap of one batch built by ``Log.append_records``, bytes (uncompressed estimate)."""


class AppendedBatches(NamedTuple):
    """What ``Log.append_records`` appended: ``batches`` built and their ``size_in_bytes`` on disk."""

    batches: int
    size_in_bytes: int



class Log:
    """A partition's log in ``dir`` (``<topic>-<partition>``). Create with ``Log.open``."""

    def __init__(self, dir_path: Path, config: LogConfig, segments: LogSegments, *, log_start_offset: int,
                 recovery_point: int, log_end_offset: int, truncations: list[RecoveryTruncation] | None = None,
                 leader_epoch_cache: LeaderEpochFileCache | None = None, topic_id: uuid.UUID | None = None):
        self.dir = Path(dir_path)
        self.config = config
        try:
            self.topic, self.partition = parse_partition_dir_name(self.dir.name)
        except ValueError:
            self.topic, self.partition = self.dir.name, -1
        self._segments = segments
        self.log_start_offset = log_start_offset
        self.recovery_point = recovery_point
        self._log_end_offset = log_end_offset
        self.recovery_truncations: list[RecoveryTruncation] = list(truncations or [])
        self.lock = threading.RLock()
        self._pending_deletes: list[tuple[int, LogSegment]] = []
        self._need_dir_flush = False
        self._closed = False
        self._high_watermark: int | None = None
        self._producer_state: ProducerStateManager | None = None  # rebuilt on first use
        self._partition_metadata = PartitionMetadataFile(self.dir)
        self._topic_id = topic_id
        self._leader_epoch_cache = (leader_epoch_cache if leader_epoch_cache is not None
                                    else LeaderEpochFileCache(self.dir / LEADER_EPOCH_CHECKPOINT_FILE))

    # -- open/close ------------------------------------------------------------------------------

    @classmethod
    def open(cls, dir_path: Path, config: LogConfig | None = None, *, log_start_offset: int | None = None,
             recovery_point: int | None = None, had_clean_shutdown: bool | None = None,
             topic_id: uuid.UUID | None = None) -> "Log":
        """Open (creating if needed) the partition folder ``dir_path`` and run ``LogLoader``.

        Args:
            dir_path: the partition folder (``<log dir>/<topic>-<partition>``).
            config: topic configuration (Kafka defaults when None).
            log_start_offset: from ``log-start-offset-checkpoint``; 0 when None.
            recovery_point: from ``recovery-point-offset-checkpoint``; segments from the one holding
                it on are recovered after an unclean shutdown; 0 (recover everything) when None.
            had_clean_shutdown: skip recovery; None means "``<log dir>/.kafka_cleanshutdown`` exists".
            topic_id: the topic id the folder must belong to (Kafka ``UnifiedLog.initializeTopicId``):
                checked against ``partition.metadata`` before anything is written; when the file is
                missing it is written (fsynced) before the log is loaded, so before any batch can be
                appended. Whether data without the file may be adopted is the caller's decision
                (open without ``topic_id`` first and look at ``Log.topic_id``).

        ``Log.recovery_truncations`` lists what recovery cut from which file.

        Raises:
            InconsistentTopicIdError: ``partition.metadata`` holds another topic id than ``topic_id``
                (nothing was written).
            CorruptPartitionMetadataError: ``partition.metadata`` is malformed (file and line named).
            ValueError: ``topic_id`` is the zero uuid.
            StorageError: loading failed (see ``LogLoader``).
        """
        dir_path = Path(dir_path)
        config = config or LogConfig()
        metadata = PartitionMetadataFile(dir_path)
        found = metadata.read()
        if topic_id is not None:
            _check_topic_id(metadata, topic_id, found)
        dir_path.mkdir(parents=True, exist_ok=True)
        if topic_id is not None and found is None:
            metadata.write(topic_id)
            found = topic_id
        if had_clean_shutdown is None:
            had_clean_shutdown = has_clean_shutdown_file(dir_path.parent)
        loaded = LogLoader(dir_path, config, log_start_offset_checkpoint=log_start_offset or 0,
                           recovery_point_checkpoint=recovery_point or 0,
                           had_clean_shutdown=had_clean_shutdown).load()
        return cls(dir_path, config, loaded.segments, log_start_offset=loaded.log_start_offset,
                   recovery_point=loaded.recovery_point, log_end_offset=loaded.next_offset,
                   truncations=loaded.truncations, leader_epoch_cache=loaded.leader_epoch_cache, topic_id=found)

    def flush(self) -> None:
        """fsync segments holding offsets at or after the recovery point; advance it to the log end offset."""
        with self.lock:
            for segment in self._segments.values(self.recovery_point, LONG_MAX) or [self.active_segment]:
                segment.flush()
            if self._need_dir_flush:
                flush_dir(self.dir)
                self._need_dir_flush = False
            self.recovery_point = max(self.recovery_point, self._log_end_offset)

    def close(self) -> None:
        """Flush, then close every segment (final time index entries, trimmed files)."""
        with self.lock:
            if self._closed:
                return
            self.flush()
            self._segments.close()
            for _, segment in self._pending_deletes:
                segment.close_handlers()
            self._closed = True

    def __enter__(self) -> "Log":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- state -----------------------------------------------------------------------------------

    @property
    def segments(self) -> LogSegments:
        """The live sorted segment map (Kafka ``LocalLog.segments``; hold ``lock`` while using it).

        For a list use :meth:`log_segments`.
        """
        return self._segments

    def log_segments(self, from_offset: int | None = None, to_offset: int | None = None) -> list[LogSegment]:
        """The segments in base offset order, a new list (Kafka ``UnifiedLog.logSegments``).

        With bounds, Kafka's ``LogSegments.values(from, to)``: from the segment holding
        ``from_offset`` (the first segment when none starts at or below it) up to, excluding, the
        first segment with base offset ``>= to_offset``; empty when ``from_offset == to_offset``.

        Raises:
            ValueError: ``to_offset < from_offset``.
        """
        return self._segments.values(from_offset, to_offset)

    def non_active_log_segments_from(self, from_offset: int) -> list[LogSegment]:
        """``log_segments(from_offset, active segment's base offset)``, or ``[]`` when ``from_offset``
        is beyond that base offset (Kafka ``UnifiedLog.nonActiveLogSegmentsFrom``)."""
        active = self.active_segment
        if from_offset > active.base_offset:
            return []
        return self._segments.values(from_offset, active.base_offset)

    @property
    def active_segment(self) -> LogSegment:
        """The last segment, the one appends go to (a log always has one: ``LogLoader`` and
        ``delete_segments`` create an empty one when none is left).

        Raises:
            StorageError: the log has no segment.
        """
        segment = self._segments.last_segment()
        if segment is None:
            raise StorageError(f"log {self.dir} has no segment")
        return segment

    @property
    def log_end_offset(self) -> int:
        """The next offset to be appended (last batch's ``next_offset``)."""
        return self._log_end_offset

    @property
    def size_in_bytes(self) -> int:
        """Total ``.log`` bytes of all segments."""
        return self._segments.size_in_bytes()

    @property
    def number_of_segments(self) -> int:
        """How many segments the log has."""
        return len(self._segments)

    def next_segment_base_after(self, segment: LogSegment) -> int | None:
        """Base offset of the segment after ``segment``, or None for the active segment."""
        higher = self._segments.higher_segment(segment.base_offset)
        return None if higher is None else higher.base_offset

    def segment_upper_bound_offset(self, segment: LogSegment) -> int:
        """Exclusive upper offset of ``segment``: the next segment's base offset, or the log end offset."""
        nxt = self.next_segment_base_after(segment)
        return self._log_end_offset if nxt is None else nxt

    # -- topic identity, leader epochs -----------------------------------------------------------

    @property
    def topic_id(self) -> uuid.UUID | None:
        """The topic id in the folder's ``partition.metadata``, or None when it has none."""
        return self._topic_id

    def assign_topic_id(self, topic_id: uuid.UUID) -> None:
        """Give a log opened without a topic id its ``partition.metadata`` (tmp, fsync, rename); a
        no-op when the file already holds ``topic_id`` (Kafka ``UnifiedLog.assignTopicId``).

        Raises:
            InconsistentTopicIdError: the folder already belongs to another topic id (nothing written).
            ValueError: ``topic_id`` is the zero uuid.
            OSError: the file could not be written (the message names it).
        """
        with self.lock:
            _check_topic_id(self._partition_metadata, topic_id, self._topic_id)
            if self._topic_id is None:
                self._partition_metadata.write(topic_id)
                self._topic_id = topic_id

    @property
    def leader_epoch_cache(self) -> LeaderEpochFileCache:
        """The log's ``LeaderEpochFileCache`` (Kafka ``UnifiedLog.leaderEpochCache``); the log keeps it
        up to date on append, truncation and log start offset changes."""
        return self._leader_epoch_cache

    @property
    def latest_epoch(self) -> int | None:
        """The highest leader epoch of the log's batches, or None when none is known (Kafka
        ``UnifiedLog.latestEpoch``; a Fetch's ``LastFetchedEpoch``)."""
        return self._leader_epoch_cache.latest_epoch

    def end_offset_for_epoch(self, leader_epoch: int) -> tuple[int, int] | None:
        """``(epoch, end offset)`` of ``leader_epoch`` in this log (Kafka ``UnifiedLog.endOffsetForEpoch``,
        :meth:`LeaderEpochFileCache.end_offset_for` with the log end offset), or None when undefined."""
        epoch, end_offset = self._leader_epoch_cache.end_offset_for(leader_epoch, self._log_end_offset)
        return None if end_offset < 0 else (epoch, end_offset)

    # -- producer state, stable offsets ----------------------------------------------------------

    @property
    def producer_state_manager(self) -> ProducerStateManager:
        """The log's ``ProducerStateManager`` (Kafka ``UnifiedLog.producerStateManager``).

        Rebuilt from every segment's batch headers on first use after open, ``truncate_to`` or
        ``delete_segments``; updated by every append after that. Hold ``lock`` while using it.

        Raises:
            CorruptRecordError: a control record's key cannot be parsed during the rebuild.
        """
        with self.lock:
            if self._producer_state is None:
                self._producer_state = ProducerStateManager.from_segments(self._segments.values())
            return self._producer_state

    @property
    def high_watermark(self) -> int:
        """The high watermark: the log end offset, unless set lower (a follower's view of the leader).

        Setting it to None goes back to the log end offset.
        """
        hw = self._high_watermark
        return self._log_end_offset if hw is None else hw

    @high_watermark.setter
    def high_watermark(self, offset: int | None) -> None:
        self._high_watermark = offset

    @property
    def first_unstable_offset(self) -> int | None:
        """First offset of the oldest open transaction, or None (Kafka ``UnifiedLog.firstUnstableOffset``)."""
        with self.lock:
            return self.producer_state_manager.first_unstable_offset()

    @property
    def last_stable_offset(self) -> int:
        """``min(first unstable offset, high watermark)`` (Kafka ``UnifiedLog.lastStableOffset``):
        nothing at or past it is cleaned or read by a ``read_committed`` consumer."""
        with self.lock:
            unstable = self.producer_state_manager.first_unstable_offset()
            hw = self.high_watermark
            return hw if unstable is None else min(unstable, hw)

    def last_records_of_active_producers(
        self, now_ms: int, producer_id_expiration_ms: int = DEFAULT_PRODUCER_ID_EXPIRATION_MS,
    ) -> dict[int, LastRecord]:
        """Producer id -> ``LastRecord`` of every producer not expired at ``now_ms`` (ms since the
        epoch; Kafka ``UnifiedLog.lastRecordsOfActiveProducers``)."""
        with self.lock:
            return self.producer_state_manager.last_records_of_active_producers(now_ms, producer_id_expiration_ms)

    def collect_aborted_transactions(self, start_offset: int, upper_bound_offset: int) -> list[AbortedTxn]:
        """Aborted transactions from the ``.txnindex`` files of the segment holding ``start_offset`` on.

        Kafka ``UnifiedLog.collectAbortedTransactions(start, upper)`` ->
        ``LocalLog.collectAbortedTransactions(logStartOffset, start, upper)``: every entry with
        ``last_offset >= log_start_offset`` and ``first_offset < upper_bound_offset``, stopping after
        the first segment holding an entry whose ``last_stable_offset >= upper_bound_offset``; ``[]``
        when no segment starts at or below ``start_offset``.
        """
        if self._segments.floor_segment(start_offset) is None:
            return []
        result: list[AbortedTxn] = []
        for segment in self._segments.values(start_offset, LONG_MAX):
            search = segment.collect_aborted_txns(self.log_start_offset, upper_bound_offset)
            result.extend(search.aborted_transactions)
            if search.is_complete:
                break
        return result

    # -- append ----------------------------------------------------------------------------------

    def append_batch(self, batch: bytes | memoryview | RecordBatch) -> None:
        """Append one complete v2 batch (its CRC is checked), rolling first if a roll rule fires.

        The batch's partition leader epoch, when ``>= 0``, is assigned to the leader epoch cache at
        its base offset before the bytes go into the segment (Kafka ``UnifiedLog.append``; Kafka
        refuses a negative epoch there, this log accepts one, from the consumer path, and leaves the
        cache alone).

        Raises:
            CorruptRecordError: the batch fails its CRC or framing check.
            InvalidOffsetError: ``base_offset < log_end_offset``.
            LogStorageError: the segment or the leader epoch checkpoint could not be written.
        """
        if not isinstance(batch, RecordBatch):
            batch = RecordBatch(batch)
        batch.ensure_valid()
        with self.lock:
            if batch.base_offset < self._log_end_offset:
                raise InvalidOffsetError(
                    f"out of order offsets: batch base offset {batch.base_offset} is below the log end offset "
                    f"{self._log_end_offset} of {self.dir}"
                )
            producer_state = self._producer_state
            if producer_state is None and batch.is_transactional:
                producer_state = self.producer_state_manager  # an ABORT marker needs the open transactions
            epoch = batch.partition_leader_epoch
            if epoch >= 0:
                self._leader_epoch_cache.assign(epoch, batch.base_offset)
            segment = self._maybe_roll(batch)
            segment.append_batch(batch)
            self._log_end_offset = batch.next_offset
            if producer_state is not None:
                completed = producer_state.update(batch)
                if completed is not None and completed.is_aborted:
                    # Kafka ProducerAppendInfo -> CompletedTxn -> LogSegment.updateTxnIndex
                    segment.update_txn_index(AbortedTxn(completed.producer_id, completed.first_offset,
                                                        completed.last_offset,
                                                        producer_state.last_stable_offset(completed)))

    def append_batches(self, batches: Iterable[bytes | memoryview | RecordBatch]) -> None:
        """``append_batch`` for each batch in order."""
        for batch in batches:
            self.append_batch(batch)

    def append_records(self, records: Sequence[Record], *, compression: CompressionType = CompressionType.NONE,
                       timestamp_type: TimestampType = TimestampType.CREATE_TIME,
                       max_batch_bytes: int = DEFAULT_MAX_BATCH_BYTES,
                       partition_leader_epoch: int = -1) -> AppendedBatches:
        """Build batches from ``records`` (their offsets are kept) and append them.

        ``partition_leader_epoch`` is stamped into every batch (the leader's epoch of these records,
        e.g. from the consumer's ``Message.leader_epoch()``; -1 = unknown, left out of the cache).

        A batch is closed before a record whose estimated size
        (``estimate_record_size_upper_bound``) would take its uncompressed size past
        ``min(max_batch_bytes, max.message.bytes, segment.bytes)`` bytes: Kafka's cleaner and
        readers rely on ``max.message.bytes``, and Kafka rejects a batch larger than
        ``segment.bytes``. A single record larger than that cap gets a batch of its own. With
        ``LOG_APPEND_TIME`` every batch carries the first record's timestamp as its LogAppendTime.

        Returns how many batches and bytes were appended.

        Raises:
            InvalidOffsetError: the first offset is below the log end offset.
            ValueError: offsets do not increase.
        """
        if not records:
            return AppendedBatches(0, 0)
        max_bytes = min(max_batch_bytes, self.config.max_message_bytes, self.config.segment_bytes)
        log_append_time = records[0].timestamp if timestamp_type == TimestampType.LOG_APPEND_TIME else None
        batches = written = 0
        builder: RecordBatchBuilder | None = None
        for record in records:
            if builder is not None and (builder.estimated_size_in_bytes + estimate_record_size_upper_bound(record)
                                        > max_bytes):
                data = builder.build()
                self.append_batch(data)
                batches, written = batches + 1, written + len(data)
                builder = None
            if builder is None:
                builder = RecordBatchBuilder(record.offset, compression=compression, timestamp_type=timestamp_type,
                                             log_append_time_ms=log_append_time,
                                             partition_leader_epoch=partition_leader_epoch)
            builder.append_record(record)
        if builder is not None and not builder.is_empty:
            data = builder.build()
            self.append_batch(data)
            batches, written = batches + 1, written + len(data)
        return AppendedBatches(batches, written)

    def _maybe_roll(self, batch: RecordBatch) -> LogSegment:
        segment = self.active_segment
        params = RollParams(
            max_segment_ms=self.config.max_segment_ms(),
            max_segment_bytes=self.config.segment_bytes,
            max_timestamp_in_messages=batch.max_timestamp,
            max_offset_in_messages=batch.last_offset,
            messages_size=batch.size_in_bytes,
            now_ms=wall_clock_ms(),
        )
        if segment.should_roll(params):
            logger.debug("Rolling new log segment for %s at offset %d (log size = %d bytes)",
                         self.dir, batch.base_offset, segment.size_in_bytes)
            return self.roll(batch.base_offset)
        return segment

    def roll(self, expected_next_offset: int | None = None) -> LogSegment:
        """Start a new active segment at ``max(expected_next_offset, log_end_offset)``.

        The old active segment gets its final time index entry and trimmed files. An empty
        active segment at that base offset is replaced.

        Raises:
            InvalidOffsetError: a non-empty segment already starts at the new base offset.
        """
        with self.lock:
            new_offset = max(expected_next_offset or 0, self._log_end_offset)
            active = self._segments.last_segment()
            existing = self._segments.get(new_offset)
            if existing is not None:
                if existing is active and active.size_in_bytes == 0:
                    logger.warning("Trying to roll a new log segment with start offset %d =max(provided offset = %s, "
                                   "LEO = %d) while it already exists and is active with size 0", new_offset,
                                   expected_next_offset, self._log_end_offset)
                    # replaced in place by the add below: readers without the lock always see an active segment
                    active.delete_if_exists()
                    active = self._segments.lower_segment(new_offset)
                else:
                    raise InvalidOffsetError(
                        f"trying to roll a new log segment for {self.dir} with start offset {new_offset}, "
                        f"which already exists (size {existing.size_in_bytes} bytes)"
                    )
            elif active is not None and new_offset < active.base_offset:
                raise InvalidOffsetError(
                    f"trying to roll a new log segment for {self.dir} with start offset {new_offset} lower than "
                    f"the start offset {active.base_offset} of the active segment"
                )
            for path in (log_file(self.dir, new_offset), offset_index_file(self.dir, new_offset),
                         time_index_file(self.dir, new_offset), transaction_index_file(self.dir, new_offset)):
                if path.exists():
                    logger.warning("Newly rolled segment file %s already exists; deleting it first", path)
                    path.unlink()
            if active is not None:
                active.on_become_inactive_segment()
            segment = LogSegment.open(self.dir, new_offset, self.config, preallocate=self.config.preallocate)
            self._segments.add(segment)
            self._need_dir_flush = True
            return segment

    # -- read ------------------------------------------------------------------------------------

    def read_batches(self, start_offset: int | None = None, end_offset: int | None = None) -> Iterator[RecordBatch]:
        """Yield batches from the one containing ``start_offset`` (or the first after a gap) on,
        stopping before the first batch with base offset ``>= end_offset``.

        ``start_offset`` defaults to the log start offset; reading stops at the log end offset
        as of the call. The segments are taken at the call, so retention raising the log start
        offset later does not fail the read. A segment deleted at once under the read (a cleaner
        swap or retention with ``file.delete.delay.ms`` = 0; Kafka avoids the race with the delay,
        ``UnifiedLog.deleteSegmentFiles``) is read on from the next offset in what the log holds
        then, as a fetch at that offset would: the cleaned copy keeps the latest record of every
        key, and offsets below a raised log start offset are gone.

        Raises:
            InvalidOffsetError: ``start_offset`` is below the log start offset.
            ClosedSegmentError: the log itself was closed during the read.
        """
        with self.lock:
            start = self.log_start_offset if start_offset is None else start_offset
            if start < self.log_start_offset:
                raise InvalidOffsetError(
                    f"offset {start} is below the log start offset {self.log_start_offset} of {self.dir}")
            end = self._log_end_offset if end_offset is None else min(end_offset, self._log_end_offset)
            if start >= end:
                return iter(())
            located = self._locate(start, end)
        return self._read_on(located, start, end)

    def _locate(self, start: int, end: int) -> tuple[list[LogSegment], list[int], int | None]:
        """The segments holding ``[start, end)``, their sizes now, and the byte position of
        ``start`` in the first (None: past its last batch). Under :attr:`lock`: a roll may remap
        (trim) an index file."""
        segments = self._segments.values(start, end)
        sizes = [s.size_in_bytes for s in segments]
        found = segments[0].translate_offset(start) if segments else None
        return segments, sizes, None if found is None else found.position

    def _read_on(self, located: tuple[list[LogSegment], list[int], int | None], start: int,
                 end: int) -> Iterator[RecordBatch]:
        """:meth:`_read_segments`, located again from the next offset when a segment was closed
        under it (see :meth:`read_batches`); a second failure at the same offset is raised."""
        resume, failed_at = start, None
        while True:
            try:
                for batch in self._read_segments(*located, end):
                    resume = batch.last_offset + 1
                    yield batch
                return
            except ClosedSegmentError:
                if failed_at == resume:
                    raise
                failed_at = resume
            with self.lock:
                resume = max(resume, self.log_start_offset)
                if resume >= end:
                    return
                located = self._locate(resume, end)

    @staticmethod
    def _read_segments(segments: list[LogSegment], sizes: list[int], first_position: int | None,
                       end: int) -> Iterator[RecordBatch]:
        for i, segment in enumerate(segments):
            if i == 0:
                if first_position is None:
                    continue
                source = segment.log.batches_from(first_position, sizes[0])
            else:
                source = segment.log.batches_from(0, sizes[i])
            for _, batch in source:
                if batch.base_offset >= end:
                    return
                yield batch

    def read_records(self, start_offset: int | None = None, end_offset: int | None = None, *,
                     include_control: bool = False) -> Iterator[Record]:
        """Yield records with offsets in ``[start_offset, end_offset)``; control batches are skipped
        unless ``include_control`` (no transaction filtering: aborted records are returned)."""
        start = self.log_start_offset if start_offset is None else start_offset
        for batch in self.read_batches(start, end_offset):
            if batch.is_control_batch and not include_control:
                continue
            for record in batch.records():
                if record.offset < start:
                    continue
                if end_offset is not None and record.offset >= end_offset:
                    return
                yield record

    def offset_for_timestamp(self, timestamp_ms: int) -> int | None:
        """Offset of the first record with timestamp ``>= timestamp_ms`` at or after the log start
        offset, or None (Kafka ``fetchOffsetByTimestamp``)."""
        with self.lock:
            for segment in self._segments.values():
                if segment.largest_timestamp >= timestamp_ms:
                    found = segment.find_offset_by_timestamp(timestamp_ms,
                                                             max(self.log_start_offset, segment.base_offset))
                    if found is not None:
                        return found.offset
            return None

    # -- swap, delete ----------------------------------------------------------------------------

    def create_cleaned_segment(self, base_offset: int) -> LogSegment:
        """Create ``<base>.log.cleaned`` (and its indexes), deleting stale ``.cleaned`` files first
        (Kafka ``LocalLog.createNewCleanedSegment``)."""
        for path in (log_file(self.dir, base_offset, CLEANED_FILE_SUFFIX),
                     offset_index_file(self.dir, base_offset, CLEANED_FILE_SUFFIX),
                     time_index_file(self.dir, base_offset, CLEANED_FILE_SUFFIX),
                     transaction_index_file(self.dir, base_offset, CLEANED_FILE_SUFFIX)):
            path.unlink(missing_ok=True)
        return LogSegment.open(self.dir, base_offset, self.config, file_suffix=CLEANED_FILE_SUFFIX,
                               preallocate=self.config.preallocate)

    def replace_segments(self, new_segments: Sequence[LogSegment], old_segments: Sequence[LogSegment], *,
                         is_recovered_swap_file: bool = False) -> list[LogSegment]:
        """Swap ``new_segments`` (``.cleaned``) in for ``old_segments``, crash-safely.

        Order (Kafka ``LocalLog.replaceSegments``): new segments renamed ``.cleaned -> .swap`` in
        descending base offset order and added to the map; each old segment (ascending) removed
        from the map unless it has the first new segment's base offset, renamed ``.deleted`` and
        scheduled for deletion; new segments renamed ``.swap -> ""``; the folder fsynced.
        A crash at any step is repaired by ``LogLoader``. Returns the old segments deleted and
        not replaced by a new segment with the same base offset.
        """
        with self.lock:
            sorted_new = sorted(new_segments, key=lambda s: s.base_offset)
            if not sorted_new:
                raise ValueError("replace_segments needs at least one new segment")
            sorted_old = sorted((s for s in old_segments if self._segments.get(s.base_offset) is s),
                                key=lambda s: s.base_offset)
            for segment in reversed(sorted_new):
                if not is_recovered_swap_file:
                    segment.change_file_suffixes(CLEANED_FILE_SUFFIX, SWAP_FILE_SUFFIX)
            for segment in reversed(sorted_new):
                self._segments.add(segment)
            new_bases = {s.base_offset for s in sorted_new}
            deleted_not_replaced = []
            for segment in sorted_old:
                if segment.base_offset != sorted_new[0].base_offset:
                    self._segments.remove(segment.base_offset)
                self._delete_segment_files([segment])
                if segment.base_offset not in new_bases:
                    deleted_not_replaced.append(segment)
            for segment in sorted_new:
                segment.change_file_suffixes(SWAP_FILE_SUFFIX, "")
            flush_dir(self.dir)
            return deleted_not_replaced

    def _delete_segment_files(self, segments: Sequence[LogSegment]) -> None:
        """Rename to ``.deleted``; remove now when ``file.delete.delay.ms`` is 0, else later."""
        for segment in segments:
            if not segment.has_suffix(DELETED_FILE_SUFFIX):
                segment.change_file_suffixes("", DELETED_FILE_SUFFIX)
        delay = self.config.file_delete_delay_ms
        if delay <= 0:
            for segment in segments:
                logger.info("Deleting segment files %s", segment)
                segment.delete_if_exists()
        else:
            due = wall_clock_ms() + delay
            self._pending_deletes.extend((due, s) for s in segments)

    def delete_pending_files(self, now_ms: int | None = None) -> int:
        """Remove ``.deleted`` segments whose ``file.delete.delay.ms`` has passed; returns how many."""
        now = wall_clock_ms() if now_ms is None else now_ms
        with self.lock:
            due = [s for t, s in self._pending_deletes if t <= now]
            self._pending_deletes = [(t, s) for t, s in self._pending_deletes if t > now]
        for segment in due:
            logger.info("Deleting segment files %s", segment)
            segment.delete_if_exists()
        return len(due)

    def delete_segments(self, segments: Sequence[LogSegment], reason: str = "") -> int:
        """Remove ``segments`` from the log and delete their files (renamed ``.deleted`` first).

        Rolls a new empty segment first when every segment is deleted, then raises the log start
        offset to the first remaining segment's base offset (Kafka ``UnifiedLog.deleteSegments``).
        Returns how many segments were deleted.
        """
        with self.lock:
            to_delete = [s for s in segments if self._segments.get(s.base_offset) is s]
            if not to_delete:
                return 0
            if len(to_delete) == len(self._segments):
                self.roll()
            for segment in to_delete:
                self._segments.remove(segment.base_offset)
                logger.info("Deleting segment %s of %s due to %s", segment, self.dir, reason or "request")
            self._delete_segment_files(to_delete)
            self._producer_state = None  # rebuilt from what remains (Kafka truncateHead drops producers)
            self.maybe_increment_log_start_offset(self.log_segments()[0].base_offset)
            return len(to_delete)

    # -- offsets, truncation ---------------------------------------------------------------------

    def maybe_increment_log_start_offset(self, new_log_start_offset: int) -> bool:
        """Raise the log start offset (never lowers it); the leader epoch history before it goes
        (Kafka ``maybeIncrementLogStartOffset`` -> ``truncateFromStart``). Returns True if it changed.

        Raises:
            InvalidOffsetError: ``new_log_start_offset`` is beyond the log end offset.
            LogStorageError: the leader epoch checkpoint could not be written.
        """
        with self.lock:
            if new_log_start_offset > self._log_end_offset:
                raise InvalidOffsetError(
                    f"cannot increment the log start offset of {self.dir} to {new_log_start_offset} since it is "
                    f"larger than the log end offset {self._log_end_offset}")
            if new_log_start_offset > self.log_start_offset:
                self.log_start_offset = new_log_start_offset
                self._leader_epoch_cache.truncate_from_start(new_log_start_offset)
                return True
            return False

    set_log_start_offset = maybe_increment_log_start_offset

    def truncate_to(self, target_offset: int) -> bool:
        """Remove every batch from the one containing ``target_offset`` on; the log end offset becomes
        ``target_offset`` and the leader epoch entries starting at or after it go (Kafka
        ``UnifiedLog.truncateTo``). Returns False when there is nothing to remove; even then epoch
        entries starting at or after the log end offset (an epoch without a batch) go.

        Deviation from Kafka, whose targets are always batch boundaries of the leader's log: a
        target inside a local batch (a log whose batches are not the leader's, as the consumer path
        writes them) removes that whole batch and the log end offset becomes its base offset, so
        the records of that batch below the target are fetched again rather than left as a hole.
        Read :attr:`log_end_offset` afterwards for where the log now ends.

        Raises:
            ValueError: ``target_offset`` is negative.
            LogStorageError: the leader epoch checkpoint could not be written.
        """
        if target_offset < 0:
            raise ValueError(f"cannot truncate partition {self.dir} to a negative offset ({target_offset})")
        with self.lock:
            if target_offset >= self._log_end_offset:
                self._leader_epoch_cache.truncate_from_end(self._log_end_offset)
                return False
            if target_offset > self.log_start_offset:
                holding = next(iter(self.read_batches(target_offset)), None)
                if holding is not None and holding.base_offset < target_offset:
                    target_offset = max(holding.base_offset, self.log_start_offset)
            if self.log_segments()[0].base_offset > target_offset:
                self.truncate_fully_and_start_at(target_offset)
                return True
            doomed = [s for s in self._segments.values() if s.base_offset > target_offset]
            for segment in doomed:
                self._segments.remove(segment.base_offset)
            if doomed:
                self._delete_segment_files(doomed)
            self.active_segment.truncate_to(target_offset)
            self._log_end_offset = target_offset
            self._leader_epoch_cache.truncate_from_end(target_offset)
            self._producer_state = None
            self.recovery_point = min(self.recovery_point, target_offset)
            self.log_start_offset = min(self.log_start_offset, target_offset)
            return True

    def truncate_fully_and_start_at(self, new_offset: int) -> None:
        """Delete every segment and start an empty log at ``new_offset``; the leader epoch cache is
        cleared and its file written (Kafka ``UnifiedLog.truncateFullyAndStartAt``).

        Raises:
            LogStorageError: the leader epoch checkpoint could not be written.
        """
        with self.lock:
            doomed = self._segments.values()
            for segment in doomed:
                self._segments.remove(segment.base_offset)
            self._delete_segment_files(doomed)
            self._leader_epoch_cache.clear_and_flush()
            self._segments.add(LogSegment.open(self.dir, new_offset, self.config, preallocate=self.config.preallocate))
            self._log_end_offset = new_offset
            self.log_start_offset = new_offset
            self.recovery_point = new_offset
            self._producer_state = None

    def __repr__(self) -> str:
        return (f"Log(dir={str(self.dir)!r}, log_start_offset={self.log_start_offset}, "
                f"log_end_offset={self._log_end_offset}, segments={len(self._segments)})")


def _check_topic_id(metadata: PartitionMetadataFile, expected: uuid.UUID, found: uuid.UUID | None) -> None:
    """Refuse a folder whose ``partition.metadata`` holds another id than ``expected``.

    Raises:
        InconsistentTopicIdError: ``found`` is another id.
        ValueError: ``expected`` is the zero uuid.
        TypeError: ``expected`` is not a ``uuid.UUID``.
    """
    if not isinstance(expected, uuid.UUID):
        raise TypeError(f"a topic id is a uuid.UUID, not {type(expected).__name__}")
    if expected.int == 0:
        raise ValueError(f"the zero uuid is not a topic id (partition folder {metadata.dir})")
    if found is not None and found != expected:
        raise InconsistentTopicIdError(
            f"partition folder {metadata.dir} belongs to topic id {topic_id_to_string(found)} "
            f"(in {metadata.path}), not to topic id {topic_id_to_string(expected)}: another incarnation of the topic",
            path=str(metadata.path), expected=expected, found=found)
