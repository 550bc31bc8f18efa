"""Appending the leader's record batches verbatim to the local logs (the replica fetch path).

:class:`VerbatimAppender` takes what :class:`~materializer.adapters.replica_fetch.ReplicaFetcher`
returns and appends each complete batch as the broker stores it (``Log.append_batch``: CRC
checked, offset and time indexes, the leader epoch cache, producer state and the ``.txnindex`` of
ABORT markers kept as a broker keeps them, Kafka ``UnifiedLog.appendAsFollower``). It owns the
fetch position of every partition (the log end offset, with the epoch of the last local batch as
``LastFetchedEpoch``) and every cut of a local log the leader asks for.

Rules (Kafka ``AbstractFetcherThread`` and ``ReplicaFetcherThread.processPartitionData`` for a
follower; ``shared/docs/kafka-follower-semantics.md`` sections 3.3-3.5):

* A response is used only when it answers the partition's current position (offset and
  ``LastFetchedEpoch``); an answer to an older request (a pipelined fetch crossing a cut) is
  dropped and fetched again.
* **Divergence.** A ``DivergingEpoch`` answer (the leader's log differs from the local one after
  some offset: an unclean leader election, a leader that lost its unflushed tail) truncates the
  local log to the divergence point by :func:`truncation_target` (``getOffsetTruncationState``)
  before anything else is fetched; when the leader's epoch is one the local log does not know, the
  log is cut to where the local epoch before it ends and the next fetch asks again (KIP-279). Every
  cut is reported in :attr:`AppendedFetch.truncations`, so the caller rewinds the state store to
  exactly what the truncated log holds.
* Batches ending below the position are skipped; a gap before a batch (offsets removed by the
  broker's cleaner) is kept, as in the broker's log. A batch stamped with a leader epoch above the
  ``CurrentLeaderEpoch`` the request carried is not appended, nor anything after it (KAFKA-18723).
* The leader's ``LogStartOffset`` of each response is reported, with records or without
  (:attr:`AppendedFetch.log_start_offsets`): the caller raises the local log start offset to it
  as far as the local log reaches (``UnifiedLog.maybeIncrementLogStartOffset``), so records below
  it are never applied, by this fetch or by a later rebuild, even inside a batch that starts below it.
* A batch starting below the log end offset (the local log ends inside one of the broker's
  batches: it was written by the consumer path, whose batches have other boundaries) is not cut:
  the broker's batches are fetched again from a batch boundary the broker also has (the start of
  the local batch holding that base offset, again lower until both agree), and the local log is
  truncated there only when the batch that replaces its tail is in hand, and appended at once.
* ``OFFSET_OUT_OF_RANGE`` (``AbstractFetcherThread.fetchOffsetAndTruncate``): the leader's log
  start and end are asked; a local log ending beyond the leader's high watermark (the leader lost
  data) is truncated to it; a local log ending below the leader's log start offset (retention or
  DeleteRecords removed offsets before they were fetched) is emptied and restarted at the leader's
  log start offset (``truncateFullyAndStartAt``), and the gap is reported.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from materializer.adapters.replica_fetch import OFFSET_OUT_OF_RANGE, EpochEndOffset, FetchPosition, PartitionData
from materializer.storage.errors import CorruptRecordError
from materializer.storage.log import Log
from materializer.storage.record_batch import iter_batches

__all__ = ["AppendedFetch", "LogTruncation", "OffsetGap", "VerbatimAppender", "last_fetched_epoch",
           "truncation_target"]

logger = logging.getLogger(__name__)


class LogTruncation(NamedTuple):
    """A cut of one partition's local log back to ``new_end_offset`` (every record at or after it
    removed), or its restart at a higher ``new_end_offset`` (every record removed).

    Attributes:
        partition: the partition.
        old_end_offset / new_end_offset: the log end offset before and after.
        old_epoch / new_epoch: the local latest leader epoch before and after (-1: none).
        reason: why (``diverging epoch``, ``leader's high watermark``, ``log start offset``, ``realign``).
    """

    partition: int
    old_end_offset: int
    new_end_offset: int
    old_epoch: int
    new_epoch: int
    reason: str


class OffsetGap(NamedTuple):
    """Offsets ``[start, end)`` of a partition that the broker deleted (retention, DeleteRecords)
    before they were fetched: the local log restarted at ``end``, the broker's log start offset."""

    partition: int
    start: int
    end: int


@dataclass
class AppendedFetch:
    """What one :meth:`VerbatimAppender.append` did.

    Attributes:
        partitions: partitions that got at least one batch (to be flushed and applied).
        batches / records / size_in_bytes: batches appended, records in them (the batches' record
            counts, control records included), bytes appended (the broker's batch bytes).
        high_watermarks: partition -> the leader's high watermark in its response.
        truncations: partition -> the cut of its local log this call made (the store must be
            rewound to what the log holds before anything of that partition is applied).
        gaps: partition -> offsets the broker deleted before they were fetched.
        log_start_offsets: partition -> the leader's log start offset in its response.
    """

    partitions: list[int]
    batches: int = 0
    records: int = 0
    size_in_bytes: int = 0
    high_watermarks: dict[int, int] = field(default_factory=dict)
    truncations: dict[int, LogTruncation] = field(default_factory=dict)
    gaps: dict[int, OffsetGap] = field(default_factory=dict)
    log_start_offsets: dict[int, int] = field(default_factory=dict)


def last_fetched_epoch(log: Log, offset: int) -> int:
    """The leader epoch of the local record just below ``offset`` (Kafka ``LastFetchedEpoch``): the
    epoch of the cache entry holding ``offset - 1``, or -1 when the local log knows none."""
    if offset <= 0:
        return -1
    epoch = log.leader_epoch_cache.epoch_for_offset(offset - 1)
    return -1 if epoch is None else epoch


def truncation_target(log: Log, leader: EpochEndOffset, fetch_offset: int) -> tuple[int, bool]:
    """Where to truncate ``log`` after the leader answered ``leader`` about the local latest epoch.

    Kafka ``AbstractFetcherThread.getOffsetTruncationState``:

    * leader end offset -1 (the leader knows no such epoch): the fetch offset; finished.
    * leader epoch -1 (an old leader without epochs): ``min(leader end, LEO)``; finished.
    * the local log has no epoch ``<=`` the leader's: ``min(leader end, LEO)``; finished.
    * the local log's largest epoch ``<=`` the leader's is another one (an epoch the leader never
      had): where that local epoch ends, ``min(local end, LEO)``; NOT finished: the next fetch
      sends the new local latest epoch and the leader answers again (KIP-279).
    * the same epoch: ``min(local end, leader end, LEO)``; finished.

    Returns:
        ``(target offset, finished)``; the target is never above the log end offset.
    """
    log_end = log.log_end_offset
    if leader.end_offset < 0:
        return min(fetch_offset, log_end), True
    if leader.epoch < 0:
        return min(leader.end_offset, log_end), True
    local_epoch, local_end = log.leader_epoch_cache.end_offset_for(leader.epoch, log_end)
    if local_epoch < 0:
        return min(leader.end_offset, log_end), True
    if local_epoch != leader.epoch:
        return min(local_end, log_end), False
    return min(local_end, leader.end_offset, log_end), True


class VerbatimAppender:
    """Append fetched batches to ``logs`` byte for byte (module docstring for the rules).

    Args:
        topic: the topic (for messages).
        logs: partition -> open :class:`Log`; the dict is read live (partitions added later count).
        watermarks: ``partition -> (log start offset, high watermark)`` from the cluster (asked
            only after ``OFFSET_OUT_OF_RANGE``).
        before_truncate: called before a log is cut back (no reader of the log may be running
            then: the Materializer waits for its apply worker).
    """

    def __init__(self, topic: str, logs: Mapping[int, Log], watermarks: Callable[[int], tuple[int, int]],
                 before_truncate: Callable[[], None] | None = None) -> None:
        self.topic = topic
        self.logs = logs
        self._watermarks = watermarks
        self._before_truncate = before_truncate
        self._realign_at: dict[int, int] = {}  # a batch boundary below the log end offset to fetch from

    def positions(self) -> dict[int, FetchPosition]:
        """Partition -> where to fetch next: the log end offset (or a realignment boundary below it)
        with the epoch of the local record before it as ``LastFetchedEpoch``."""
        return {partition: self._fetch_position(partition, log) for partition, log in self.logs.items()}

    def _position(self, partition: int, log: Log) -> int:
        realign = self._realign_at.get(partition)
        return log.log_end_offset if realign is None else realign

    def _fetch_position(self, partition: int, log: Log) -> FetchPosition:
        offset = self._position(partition, log)
        return FetchPosition(offset, last_fetched_epoch(log, offset))

    def positions_after(self, fetched: Sequence[PartitionData]) -> dict[int, FetchPosition]:
        """The positions once ``fetched`` is appended, read off the batch frames alone (so the next
        request can be sent before the appends). Partitions without usable data, or whose answer
        asks for a cut, keep theirs (that pipelined request is dropped when it comes back)."""
        positions = self.positions()
        for part in fetched:
            position = positions.get(part.partition)
            if (part.error or part.diverging_epoch is not None or not part.records or position is None
                    or position.offset != part.fetch_offset):
                continue
            end = epoch = None
            for _, batch in iter_batches(part.records):
                if part.current_leader_epoch >= 0 and batch.partition_leader_epoch > part.current_leader_epoch:
                    break
                end, epoch = batch.next_offset, batch.partition_leader_epoch
            if end is not None and end > part.fetch_offset:
                positions[part.partition] = FetchPosition(end, epoch if epoch is not None and epoch >= 0
                                                          else position.last_fetched_epoch)
        return positions

    def append(self, fetched: Sequence[PartitionData]) -> AppendedFetch:
        """Append the complete batches of ``fetched`` to their logs (not flushed); truncate where the
        leader's answer says the local log diverged or lies outside the leader's log.

        Raises:
            CorruptRecordError: a batch from the leader fails its CRC or framing check (named by
                partition, offset and position in the response); nothing of it is appended.
            KafkaSourceError: the watermarks cannot be read after ``OFFSET_OUT_OF_RANGE``.
        """
        result = AppendedFetch([])
        for part in fetched:
            partition = part.partition
            log = self.logs.get(partition)
            if log is None:
                continue
            if part.high_watermark >= 0:
                result.high_watermarks[partition] = part.high_watermark
            if part.fetch_offset != self._position(partition, log) or \
                    part.last_fetched_epoch != last_fetched_epoch(log, part.fetch_offset):
                continue  # the answer to an older request (a cut came in between): fetched again
            if part.error == OFFSET_OUT_OF_RANGE:
                self._out_of_range(partition, log, result)
                continue
            if part.diverging_epoch is not None:
                self._diverged(part, part.diverging_epoch, log, result)
                continue
            if part.error:
                continue
            # Every answer carries the leader's log start offset, records or none: retention or
            # DeleteRecords move it on an idle partition too, and a follower follows it from any
            # response (ReplicaFetcherThread.processPartitionData, also for an empty record set).
            if part.log_start_offset >= 0:
                result.log_start_offsets[partition] = part.log_start_offset
            if part.records and self._append_partition(part, log, result):
                result.partitions.append(partition)
        return result

    def _truncate(self, partition: int, log: Log, target: int, reason: str, result: AppendedFetch) -> None:
        """Cut ``log`` back to ``target`` (after the caller's ``before_truncate``) and report it."""
        old_end, old_epoch = log.log_end_offset, log.latest_epoch
        if self._before_truncate is not None:
            self._before_truncate()
        if target > log.log_end_offset:  # the leader's log starts after the local end: nothing local is kept
            log.truncate_fully_and_start_at(target)
        else:
            log.truncate_to(target)  # below the first segment: truncate_fully_and_start_at, as Kafka's truncateTo
        new_epoch = log.latest_epoch
        truncation = LogTruncation(partition, old_end, log.log_end_offset,
                                   -1 if old_epoch is None else old_epoch, -1 if new_epoch is None else new_epoch,
                                   reason)
        earlier = result.truncations.get(partition)
        if earlier is not None:  # two cuts in one call: report the whole stretch
            truncation = truncation._replace(old_end_offset=earlier.old_end_offset, old_epoch=earlier.old_epoch)
        result.truncations[partition] = truncation

    def _diverged(self, part: PartitionData, diverging: EpochEndOffset, log: Log, result: AppendedFetch) -> None:
        """A ``DivergingEpoch`` answer: truncate by the follower's rule (no records of it are used)."""
        target, finished = truncation_target(log, diverging, part.fetch_offset)
        logger.warning("%s-%d: the leader's log diverges from the local one (it ends epoch %d at offset %d; the local "
                       "log ends at %d, epoch %s); truncating the local log to offset %d%s", self.topic,
                       part.partition, diverging.epoch, diverging.end_offset, log.log_end_offset,
                       log.latest_epoch, target, "" if finished else " and asking the leader again")
        self._realign_at.pop(part.partition, None)
        if target < log.log_end_offset:
            self._truncate(part.partition, log, target, "diverging epoch", result)

    def _append_partition(self, part: PartitionData, log: Log, result: AppendedFetch) -> bool:
        label = f"Fetch response of {self.topic}-{part.partition} at offset {part.fetch_offset}"
        appended = False
        for position, batch in iter_batches(part.records, path=label):
            if batch.last_offset < self._position(part.partition, log):
                continue
            if 0 <= part.current_leader_epoch < batch.partition_leader_epoch:
                # KAFKA-18723: a leader epoch above the one the request was sent under is not ours to
                # take yet (the metadata is behind): stop here, fetch again after a refresh.
                logger.info("%s-%d: batch at offset %d carries leader epoch %d above the current %d; fetching "
                            "it again", self.topic, part.partition, batch.base_offset, batch.partition_leader_epoch,
                            part.current_leader_epoch)
                break
            if batch.base_offset < log.log_end_offset:
                cut = self._cut_for(part, log, batch.base_offset)
                if cut is None:
                    return appended  # fetched again from a lower boundary
                # the log start offset follows a cut below it: this batch holds those records
                self._truncate(part.partition, log, cut, "realign", result)
            self._realign_at.pop(part.partition, None)
            try:
                log.append_batch(batch)
            except CorruptRecordError as exc:
                raise CorruptRecordError(f"{label}: the batch at byte {position} (base offset {batch.base_offset}) "
                                         f"is invalid: {exc}; nothing of it was appended") from exc
            appended = True
            result.batches += 1
            result.records += batch.header.records_count
            result.size_in_bytes += batch.size_in_bytes
        return appended

    def _cut_for(self, part: PartitionData, log: Log, broker_base_offset: int) -> int | None:
        """Where to truncate ``log`` so that the broker's batch at ``broker_base_offset`` follows
        at once (see module), or None after choosing a lower boundary to fetch from first."""
        realign = self._realign_at.get(part.partition)
        if realign is not None and part.fetch_offset == realign <= broker_base_offset:
            return realign  # the broker holds nothing in [realign, base): that gap is the broker's too
        if broker_base_offset < log.log_start_offset:
            return broker_base_offset  # all the local data lies inside this broker batch
        local = next(iter(log.read_batches(broker_base_offset)), None)
        boundary = broker_base_offset if local is None else min(local.base_offset, broker_base_offset)
        if boundary == broker_base_offset:
            return boundary
        self._realign_at[part.partition] = boundary
        logger.warning("the local log %s ends inside the broker's batch starting at offset %d (written by the "
                       "consumer path?); fetching the broker's batches from offset %d, where the local log will be "
                       "cut back when they arrive", log.dir, broker_base_offset, boundary)
        return None

    def _out_of_range(self, partition: int, log: Log, result: AppendedFetch) -> None:
        """``OFFSET_OUT_OF_RANGE``: ask the leader's log start and high watermark, then cut or restart
        the local log (``AbstractFetcherThread.fetchOffsetAndTruncate``)."""
        low, high = self._watermarks(partition)
        self._realign_at.pop(partition, None)
        end = log.log_end_offset
        if end > high:
            logger.warning("%s-%d: the local log ends at offset %d, beyond the leader's high watermark %d (the "
                           "leader lost data: an unclean leader election or a lost unflushed tail); truncating the "
                           "local log to %d", self.topic, partition, end, high, high)
            self._truncate(partition, log, high, "leader's high watermark", result)
        elif end < low:
            logger.warning("%s-%d: offsets [%d, %d) were deleted on the broker (retention or DeleteRecords) before "
                           "they were fetched; the local log restarts at the broker's log start offset %d (the "
                           "state store keeps what it applied before; keys last written in the gap keep older "
                           "values)", self.topic, partition, end, low, low)
            self._truncate(partition, log, low, "log start offset", result)
            result.gaps[partition] = OffsetGap(partition, end, low)
        # else: inside the leader's range again (a leader change): fetch the same offset again
