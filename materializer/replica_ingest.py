"""Appending the leader's record batches verbatim to the local logs (the replica fetch path).

:class:`VerbatimAppender` takes what :class:`~materializer.adapters.replica_fetch.ReplicaFetcher`
returns and appends each complete batch as the broker stores it (``Log.append_batch``: CRC
checked, offset and time indexes, producer state and the ``.txnindex`` of ABORT markers kept as a
broker keeps them, Kafka ``UnifiedLog.appendAsFollower``). It owns the fetch position of every
partition: the log end offset, except after ``OFFSET_OUT_OF_RANGE``.

Rules (Kafka ``AbstractFetcherThread`` for a follower; a consumer's for what a follower would
do but a copy must not):

* A response is used only when it answers the partition's current position; an answer to an
  older request (a pipelined fetch crossing a reset) is dropped and fetched again.
* Batches ending below the position are skipped; a gap before a batch (offsets removed by the
  broker's cleaner) is kept, as in the broker's log.
* A batch starting below the log end offset (the local log ends inside one of the broker's
  batches: it was written by the consumer path, whose batches have other boundaries) is not cut:
  the broker's batches are fetched again from a batch boundary the broker also has (the start of
  the local batch holding that base offset, again lower until both agree), and the local log is
  truncated there only when the batch that replaces its tail is in hand, and appended at once.
  So the log never ends below what the state store already holds while it waits for a response,
  and nothing is lost: what is cut is appended again, record for record, from the same response.
* ``OFFSET_OUT_OF_RANGE`` with the log end below the broker's log start offset (retention or
  DeleteRecords removed offsets before they were fetched) continues at the broker's log start
  offset, as a consumer with ``auto.offset.reset=earliest`` would, and says so; the local log keeps
  what it has (a follower would delete it). A log end above the broker's high watermark (the
  topic was recreated, or an unclean leader election lost data) stops with an error.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from materializer.adapters.replica_fetch import OFFSET_OUT_OF_RANGE, PartitionData
from materializer.storage.errors import CorruptRecordError, StorageError
from materializer.storage.log import Log
from materializer.storage.record_batch import iter_batches

__all__ = ["AppendedFetch", "VerbatimAppender"]

logger = logging.getLogger(__name__)


@dataclass
class AppendedFetch:
    """What one :meth:`VerbatimAppender.append` did.

    Attributes:
        partitions: partitions that got at least one batch (to be flushed and applied).
        batches / records / size_in_bytes: batches appended, records in them (control records
            included), bytes appended (the broker's batch bytes).
        high_watermarks: partition -> the leader's high watermark in its response.
        resets: partition -> the broker's log start offset fetching continued at after
            ``OFFSET_OUT_OF_RANGE``: nothing below it is to be materialized (the first batch
            fetched there may hold records below it, as the broker's does).
    """

    partitions: list[int]
    batches: int = 0
    records: int = 0
    size_in_bytes: int = 0
    high_watermarks: dict[int, int] | None = None
    resets: dict[int, int] | None = None


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
        self._positions: dict[int, int] = {}  # after OFFSET_OUT_OF_RANGE: above the log end offset
        self._realign_at: dict[int, int] = {}  # a batch boundary below the log end offset to fetch from

    def positions(self) -> dict[int, int]:
        """Partition -> next offset to fetch (the log end offset unless a reset moved it on)."""
        return {partition: self._position(partition, log) for partition, log in self.logs.items()}

    def _position(self, partition: int, log: Log) -> int:
        realign = self._realign_at.get(partition)
        if realign is not None:
            return realign
        return max(self._positions.get(partition, 0), log.log_end_offset)

    def positions_after(self, fetched: Sequence[PartitionData]) -> dict[int, int]:
        """The positions once ``fetched`` is appended, read off the batch frames alone (so the next
        request can be sent before the appends). Partitions without usable data keep theirs."""
        positions = self.positions()
        for part in fetched:
            if part.error or not part.records or positions.get(part.partition) != part.fetch_offset:
                continue
            end = None
            for _, batch in iter_batches(part.records):
                end = batch.next_offset
            if end is not None and end > part.fetch_offset:
                positions[part.partition] = end
        return positions

    def append(self, fetched: Sequence[PartitionData]) -> AppendedFetch:
        """Append the complete batches of ``fetched`` to their logs (not flushed).

        Raises:
            CorruptRecordError: a batch from the leader fails its CRC or framing check (named by
                partition, offset and position in the response); nothing of it is appended.
            StorageError: the local log ends beyond the broker's high watermark.
            KafkaSourceError: the watermarks cannot be read after ``OFFSET_OUT_OF_RANGE``.
        """
        result = AppendedFetch([], high_watermarks={}, resets={})
        for part in fetched:
            partition = part.partition
            log = self.logs.get(partition)
            if log is None:
                continue
            if part.high_watermark >= 0:
                result.high_watermarks[partition] = part.high_watermark
            if part.error == OFFSET_OUT_OF_RANGE:
                reset = self._out_of_range(partition, log)
                if reset is not None:
                    result.resets[partition] = reset
                continue
            if part.error or not part.records or part.fetch_offset != self._position(partition, log):
                continue
            if self._append_partition(part, log, result):
                result.partitions.append(partition)
        return result

    def _append_partition(self, part: PartitionData, log: Log, result: AppendedFetch) -> bool:
        label = f"Fetch response of {self.topic}-{part.partition} at offset {part.fetch_offset}"
        appended = False
        for position, batch in iter_batches(part.records, path=label):
            if batch.last_offset < self._position(part.partition, log):
                continue
            if batch.base_offset < log.log_end_offset:
                cut = self._cut_for(part, log, batch.base_offset)
                if cut is None:
                    return appended  # fetched again from a lower boundary
                if self._before_truncate is not None:
                    self._before_truncate()
                log.truncate_to(cut)  # the log start offset follows a cut below it: this batch holds those records
            self._realign_at.pop(part.partition, None)
            try:
                log.append_batch(batch)
            except CorruptRecordError as exc:
                raise CorruptRecordError(f"{label}: the batch at byte {position} (base offset {batch.base_offset}) "
                                         f"is invalid: {exc}; nothing of it was appended") from exc
            self._positions.pop(part.partition, None)
            appended = True
            result.batches += 1
            result.records += batch.last_offset - batch.base_offset + 1
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

    def _out_of_range(self, partition: int, log: Log) -> int | None:
        low, high = self._watermarks(partition)
        position = self._position(partition, log)
        if position > high:
            raise StorageError(
                f"the local log {log.dir} ends at offset {position}, beyond the broker's high watermark {high} of "
                f"{self.topic}-{partition} (topic recreated, or data lost by an unclean leader election?); delete "
                f"{log.dir} and the state store to fetch the partition again")
        if position < low:
            logger.warning("%s-%d: offsets [%d, %d) were deleted on the broker (retention or DeleteRecords) before "
                           "they were fetched; continuing at the broker's log start offset %d, as a consumer with "
                           "auto.offset.reset=earliest would (keys last written there keep older values)",
                           self.topic, partition, position, low, low)
            self._positions[partition] = low
            self._realign_at.pop(partition, None)
            return low
        return None  # inside the broker's range again (a leader change): fetch the same offset again

