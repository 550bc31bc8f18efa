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
  the local log is truncated back to a batch boundary the broker also has (the start of the local
  batch holding that base offset, again until both agree) and the broker's batches are fetched
  from there. Nothing is lost: what is cut is fetched again, record for record.
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
    """

    def __init__(self, topic: str, logs: Mapping[int, Log], watermarks: Callable[[int], tuple[int, int]]) -> None:
        self.topic = topic
        self.logs = logs
        self._watermarks = watermarks
        self._positions: dict[int, int] = {}

    def positions(self) -> dict[int, int]:
        """Partition -> next offset to fetch (the log end offset unless a reset moved it on)."""
        return {partition: self._position(partition, log) for partition, log in self.logs.items()}

    def _position(self, partition: int, log: Log) -> int:
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
            end = log.log_end_offset
            if batch.last_offset < max(end, part.fetch_offset):
                continue
            if batch.base_offset < end:
                if self._realign(log, batch.base_offset) != batch.base_offset:
                    return appended  # fetched again from the new log end offset
                # cut exactly where this batch begins: append it now, leaving no window in which the
                # log ends below what the store already holds
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

    def _realign(self, log: Log, broker_base_offset: int) -> int:
        """Cut ``log`` back so that it ends where one of the broker's batches begins (see module);
        returns the new log end offset."""
        if broker_base_offset < log.log_start_offset:
            cut = broker_base_offset  # all the local data lies inside this broker batch
        else:
            local = next(iter(log.read_batches(broker_base_offset)), None)
            cut = broker_base_offset if local is None else min(local.base_offset, broker_base_offset)
        log.truncate_to(cut)  # the log start offset follows a cut below it: the broker's batch holds those records
        logger.warning("the local log %s ended inside the broker's batch starting at offset %d (written by the "
                       "consumer path?); cut it back to offset %d to fetch the broker's batches verbatim from there",
                       log.dir, broker_base_offset, cut)
        return cut

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
            return low
        return None  # inside the broker's range again (a leader change): fetch the same offset again

