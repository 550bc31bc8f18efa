"""The consumer path: records through confluent-kafka, local batches rebuilt, the store applied from them.

One round (:meth:`ConsumerIngest.step`)::

    KafkaSource.fetch ──▶ topic id compared ──▶ group by partition ──▶ v2 batches (broker offsets,
    leader epochs) ──▶ Log.append_batch ──▶ Log.flush (fsync) ──▶ StoreApplier.apply_records
    (records and next offsets in one atomic write)

The local batches are rebuilt: one batch per run of consecutive fetched records of a partition with
one timestamp type (and, for LogAppendTime, one timestamp) and one leader epoch, capped at
``max_batch_bytes``, compressed with the topic's ``compression.type`` (``producer`` -> none) unless
overridden. Offsets, timestamps, keys, values, headers and leader epochs are the broker's; producer
ids, sequences, transactional flags, control batches and the broker's batch boundaries are not kept
(``read_committed`` already removed aborted records and markers, leaving offset gaps).

Following the leader (KIP-320): each partition is assigned with the leader epoch of its last local
record, so librdkafka validates the position with OffsetsForLeaderEpoch and, where the leader's log
diverged, fetches from the divergence point: records below the local log end offset mean a cut
there. Records (or an end of partition) above the local end while the broker's log start offset is
above it too mean offsets deleted before they were fetched: the log restarts at the broker's log start.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence

from materializer.adapters.errors import TopicIdChangedError
from materializer.adapters.kafka_source import FetchedRecord, KafkaSource
from materializer.ingest import IngestContext
from materializer.ingest.appender import last_fetched_epoch
from materializer.storage.compression import CompressionType
from materializer.storage.log import Log
from materializer.storage.record_batch import Record, TimestampType

__all__ = ["ConsumerIngest"]

logger = logging.getLogger(__name__)

#: How often an idle run (fetches without records) compares the topic id, seconds.
TOPIC_ID_CHECK_S = 1.0


def _chunks(items: Sequence[FetchedRecord]) -> Iterable[tuple[TimestampType, int, list[Record]]]:
    """Split one partition's records where the timestamp type (or a LogAppendTime timestamp) or the
    leader epoch changes: ``(timestamp type, leader epoch, records)``, each chunk one or more batches."""
    chunk: list[Record] = []
    chunk_type = TimestampType.CREATE_TIME
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


class ConsumerIngest:
    """The consumer path behind :class:`~materializer.ingest.Ingest` (module docstring).

    Args:
        context: the logs, the applier, the statistics.
        source: the confluent-kafka source (partitions assigned by :meth:`assign`).
        compression: codec of the local batches.
        topic_id: the topic's id the logs hold (None: a cluster without ids, nothing to compare).
    """

    def __init__(self, context: IngestContext, source: KafkaSource, compression: CompressionType,
                 topic_id: uuid.UUID | None) -> None:
        self._context = context
        self.source = source
        self._compression = compression
        self._topic_id = topic_id
        self._next_topic_id_check = 0.0  # monotonic seconds
        self._eof_offsets: dict[int, int] = {}  # where the client last reported the end of a partition

    def truncate_open_transactions(self) -> None:
        """A local log holding a transaction the replica path left open (no marker yet) would stay
        open forever, since a ``read_committed`` consumer never sees markers: cut each such log at the
        transaction's first offset; the consumer fetches that range again and gets what was committed,
        the COMMIT or ABORT marker only leaving an offset gap. At start, before the store is reconciled."""
        for partition, log in sorted(self._context.logs.items()):
            unstable = log.first_unstable_offset
            if unstable is not None and unstable < log.log_end_offset:
                logger.warning("%s holds a transaction still open at offset %d (written by the replica path); the "
                               "consumer path fetches offsets [%d, %d) again read_committed", log.dir, unstable,
                               unstable, log.log_end_offset)
                self._context.cut(partition, unstable, "open transaction")

    def assign(self) -> None:
        """Assign every partition from its log end offset, with the leader epoch of the last local
        record: librdkafka validates each position (KIP-320) before it fetches.

        Raises:
            KafkaSourceError: the assignment fails.
        """
        logs = self._context.logs
        self.source.assign({p: log.log_end_offset for p, log in logs.items()},
                           {p: last_fetched_epoch(log, log.log_end_offset) for p, log in logs.items()})

    def step(self) -> None:
        """Fetch, compare the topic id, append and apply; note where the client reported a
        partition's end.

        Raises:
            BrokerUnreachableError: the cluster has been unreachable for ``broker_timeout_ms``.
            TopicIdChangedError: the topic is gone or has another id (checked before anything of the
                fetch is written).
            DeserializationError: a record does not decode (``on_bad_record="fail"``).
            KafkaSourceError / StorageError / StoreError: the fetch, the log or the store failed.
        """
        context, stats = self._context, self._context.stats
        started = time.monotonic()
        try:
            fetch = self.source.fetch(context.options.batch_size, context.options.poll_timeout_ms)
        finally:
            fetched_at = time.monotonic()
            stats.fetches += 1
            stats.fetch_s += fetched_at - started
        if fetch.records or fetched_at >= self._next_topic_id_check:
            # Records fetched after a re-creation are another topic's: compare the ids before any
            # of them is written (one metadata request per fetch that returned records, and at most
            # one a second while idle, so a deletion is noticed).
            self.check_topic_id()
            self._next_topic_id_check = fetched_at + TOPIC_ID_CHECK_S
        if fetch.records:
            self.process(fetch.records)
            stats.bytes_fetched += fetch.size_in_bytes
        for partition, offset in fetch.eof_offsets.items():  # past trailing transaction markers
            log = context.logs.get(partition)
            if log is not None and offset > log.log_end_offset:  # or past offsets deleted on the broker
                self._follow_client_position(partition, offset)
                context.applier.drop_below_log_start([partition])
            if offset > stats.next_offsets.get(partition, 0):
                stats.next_offsets[partition] = offset
        self._eof_offsets = fetch.eof_offsets
        if fetch.eof_offsets:
            self.refresh_high_watermarks()
        # Idle partitions too: retention or DeleteRecords move the broker's log start offset without
        # a record to fetch (the client's cached value, from its last fetch response: no request).
        context.follow_leader_log_start(self.source.cached_log_start_offsets(sorted(context.logs)))

    def check_topic_id(self) -> None:
        """The cluster's topic id must still be the logs'.

        Raises:
            TopicIdChangedError: the topic is gone or has another id.
        """
        if self._topic_id is None:
            return
        found = self.source.topic_id()
        if found != self._topic_id:
            raise TopicIdChangedError(self._context.topic, self._topic_id, found)

    def refresh_high_watermarks(self) -> None:
        """Raise ``stats.latest_high_watermarks`` to the client's cached values (no request)."""
        latest = self._context.stats.latest_high_watermarks
        for partition, high in self.source.cached_high_watermarks(sorted(self._context.logs)).items():
            if high > latest.get(partition, -1):
                latest[partition] = high

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
        keyed record is checked first: with ``on_bad_record="fail"`` a bad one raises before
        anything of this fetch is written (the next start fetches it again).

        Raises:
            DeserializationError: a record does not decode (``on_bad_record="fail"``).
            StorageError / StoreError: the log or the store cannot be written.
        """
        context, stats, logs = self._context, self._context.stats, self._context.logs
        check = context.applier.check
        by_partition: dict[int, list[FetchedRecord]] = {}
        for item in fetched:
            if item.partition in logs:  # a partition closed since the fetch (close_partitions) is skipped
                by_partition.setdefault(item.partition, []).append(item)
        stats.records_fetched += sum(map(len, by_partition.values()))
        new_items: dict[int, list[FetchedRecord]] = {}
        to_apply: dict[int, list[Record]] = {}
        for partition, items in by_partition.items():
            if partition not in logs:
                continue
            items = _after_last_rewind(items)
            if not self._follow_client_position(partition, items[0].record.offset):
                continue
            items = [item for item in items if item.record.offset >= logs[partition].log_end_offset]
            if items:
                new_items[partition] = items
                keyed = [item.record for item in items if item.record.key is not None]
                to_apply[partition] = [r for r in keyed if check(partition, r)] if check is not None else keyed
        next_offsets: dict[int, int] = {}
        for partition, items in new_items.items():
            log = logs[partition]
            append_started = time.monotonic()
            for timestamp_type, epoch, records in _chunks(items):
                self._append(log, records, timestamp_type, epoch)
            flush_started = time.monotonic()
            log.flush()
            stats.append_s += flush_started - append_started
            stats.fsync_s += time.monotonic() - flush_started
            nulls = sum(1 for item in items if item.record.key is None)
            if nulls:
                context.applier.note_null_keys(partition, nulls)
            next_offsets[partition] = items[-1].record.offset + 1
        # the leader's log start offsets, and the cleaner threads' retention, before these are applied
        context.follow_leader_log_start(self.source.cached_log_start_offsets(sorted(by_partition)))
        for partition, records in to_apply.items():  # nothing below a log start offset is applied
            start = logs[partition].log_start_offset
            if records and records[0].offset < start:
                to_apply[partition] = [r for r in records if r.offset >= start]
        context.applier.apply_records(to_apply, next_offsets)

    def _follow_client_position(self, partition: int, first_offset: int) -> bool:
        """Cut or restart the local log where the client's records of ``partition`` now start (see
        :meth:`process`). Returns False when the cut fell inside a local batch and so below
        ``first_offset``: the client is sent back to the new log end offset and these records are
        dropped (fetched again from there)."""
        context = self._context
        log = context.logs[partition]
        end = log.log_end_offset
        if first_offset < end:
            truncation = context.cut(partition, first_offset, "the client fetches from a lower offset (the leader's "
                                     "log diverged, KIP-320 validation)")
            context.applier.rewind(partition, truncation.new_end_offset)
            if log.log_end_offset < first_offset:
                self.rewound(partition)
                return False
        elif first_offset > end:
            low = self.source.cached_log_start_offsets([partition]).get(partition, -1)
            if low > end:
                logger.warning("%s-%d: offsets [%d, %d) were deleted on the broker (retention or DeleteRecords) "
                               "before they were fetched; the local log restarts at the broker's log start offset "
                               "%d", context.topic, partition, end, low, low)
                log.truncate_fully_and_start_at(low)
                log.flush()
                context.stats.offset_gaps[partition] = context.stats.offset_gaps.get(partition, 0) + low - end
        return True

    def _append(self, log: Log, records: list[Record], timestamp_type: TimestampType, leader_epoch: int) -> None:
        appended = log.append_records(records, compression=self._compression, timestamp_type=timestamp_type,
                                      max_batch_bytes=self._context.options.max_batch_bytes,
                                      partition_leader_epoch=leader_epoch)
        self._context.stats.batches_appended += appended.batches
        self._context.stats.bytes_appended += appended.size_in_bytes

    def caught_up(self) -> set[int]:
        """Partitions whose log end offset, or the client's position (past trailing transaction
        markers), or the end of partition the client reported last, reached the start high watermark."""
        context = self._context
        highs = context.stats.high_watermarks
        caught = {p for p, log in context.logs.items() if log.log_end_offset >= highs.get(p, 0)}
        pending = [p for p in context.logs if p not in caught]
        if pending:
            positions = self.source.positions(pending)
            caught |= {p for p in pending if positions.get(p, -1) >= highs.get(p, 0)}
        caught |= {p for p, offset in self._eof_offsets.items() if offset >= highs.get(p, 0)}
        return caught

    def rewound(self, partition: int) -> None:
        """Send the client back to the partition's log end offset (with its last epoch, validated);
        the end of partition reported before no longer counts as caught up."""
        self._eof_offsets.pop(partition, None)
        log = self._context.logs[partition]
        self.source.seek(partition, log.log_end_offset, last_fetched_epoch(log, log.log_end_offset))

    def add_partitions(self, start_offsets: Mapping[int, int]) -> None:
        """Add new partitions to the assignment from these offsets (the others keep their positions)."""
        logs = self._context.logs
        self.source.add_partitions(start_offsets, {p: last_fetched_epoch(logs[p], offset)
                                                   for p, offset in start_offsets.items()})

    def remove_partitions(self, partitions: Sequence[int]) -> None:
        """Take these partitions out of the assignment (the others keep their positions)."""
        self.source.remove_partitions(partitions)
        for partition in partitions:
            self._eof_offsets.pop(partition, None)

    def wakeup(self) -> None:
        """Nothing to give up: a consumer fetch waits at most ``poll_timeout_ms``."""

    def interrupted(self) -> None:
        """Nothing to reset: the client keeps its positions."""

    def unanswered_since(self) -> float | None:
        """Since when librdkafka has reported the cluster unreachable (:attr:`KafkaSource.unreachable_since`)."""
        return self.source.unreachable_since

    def leaderless(self) -> dict[int, str]:
        """Open partitions without a leader in the metadata the source last read
        (:meth:`KafkaSource.partitions`; librdkafka fetches the others and waits for these)."""
        logs = self._context.logs
        return {p: "no leader in the cluster's metadata" for p in self.source.partitions_without_leader if p in logs}

    def close(self) -> None:
        """The source is closed by its owner (it also serves metadata on the replica path)."""
