"""How records reach the local logs: the replica fetch path (:mod:`.replica`: the leader's batches,
appended verbatim as a follower appends them) and the consumer path (:mod:`.consumer`: records
through confluent-kafka, local batches rebuilt). Both sit behind one small interface,
:class:`Ingest`, and share :class:`IngestContext`: the logs, the store's applier, the statistics,
and the one way a local log is cut back (:meth:`IngestContext.cut`, always logged and counted).

A record goes one way: ingest (fetch, append, fsync) -> the applier (:mod:`materializer.apply`) ->
the store. Nothing here writes the store itself.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from materializer.apply.applier import StoreApplier
from materializer.config import MaterializerOptions
from materializer.ingest.appender import LogTruncation
from materializer.stats import MaterializerStats
from materializer.storage.log import Log

__all__ = ["Ingest", "IngestContext"]

logger = logging.getLogger(__name__)


@dataclass
class IngestContext:
    """What both fetch paths work on (one per started materializer).

    Attributes:
        topic: the topic.
        logs: partition -> open log (the dict is shared and read live: partitions added later count).
        applier: the store's one writer.
        stats: the run's statistics.
        options: the materializer's options.
        stop_requested: set when the run is asked to stop (the replica path then sends no next request).
    """

    topic: str
    logs: dict[int, Log]
    applier: StoreApplier
    stats: MaterializerStats
    options: MaterializerOptions
    stop_requested: threading.Event

    def note_truncation(self, truncation: LogTruncation) -> None:
        """Log and count one cut of a local log (partition, old and new end offsets and epochs)."""
        logger.warning("%s-%d: truncated the local log from offset %d (leader epoch %d) to %d (leader epoch %d): %s",
                       self.topic, truncation.partition, truncation.old_end_offset, truncation.old_epoch,
                       truncation.new_end_offset, truncation.new_epoch, truncation.reason)
        self.stats.log_truncations += 1
        self.stats.offsets_truncated += max(0, truncation.old_end_offset - truncation.new_end_offset)
        self.stats.next_offsets[truncation.partition] = self.logs[truncation.partition].log_end_offset

    def cut(self, partition: int, target: int, reason: str) -> LogTruncation:
        """Truncate a partition's log to ``target`` (a target inside a batch cuts at its base offset:
        :meth:`Log.truncate_to`), fsync, and note it. The store is not touched: the caller rewinds it
        (:meth:`StoreApplier.rewind`) or reconciles it at start."""
        log = self.logs[partition]
        old_end, old_epoch = log.log_end_offset, log.latest_epoch
        log.truncate_to(target)
        log.flush()
        new_epoch = log.latest_epoch
        truncation = LogTruncation(partition, old_end, log.log_end_offset, -1 if old_epoch is None else old_epoch,
                                   -1 if new_epoch is None else new_epoch, reason)
        self.note_truncation(truncation)
        return truncation

    def follow_leader_log_start(self, leader_log_start_offsets: Mapping[int, int]) -> None:
        """Raise each local log start offset to the leader's (as far as the local log reaches), as a
        follower does from every fetch response, records or none
        (``ReplicaFetcherThread.processPartitionData`` -> ``UnifiedLog.maybeIncrementLogStartOffset``;
        the leader's moves by retention or DeleteRecords, KIP-107), then have the store drop the
        entries whose latest record is now below any log start offset that moved: the leader's, or
        the local one the cleaner threads' retention moved. Called every round by both fetch paths;
        a comparison per partition unless a log start moved. Retention deletes the segments below
        later. A raise is rare, so the apply worker is drained first: it never reads below a log
        start offset that moved under it."""
        raised = {}
        for partition, leader_start in leader_log_start_offsets.items():
            log = self.logs.get(partition)
            if log is not None and leader_start > log.log_start_offset and log.log_end_offset > log.log_start_offset:
                raised[partition] = min(leader_start, log.log_end_offset)
        if raised:
            self.applier.drain()
            for partition, new_start in raised.items():
                if self.logs[partition].maybe_increment_log_start_offset(new_start):
                    logger.info("%s-%d: the log start offset follows the leader's to %d", self.topic, partition,
                                new_start)
        self.applier.drop_below_log_start()


class Ingest(Protocol):
    """One fetch path (replica or consumer).

    Errors of :meth:`step` that the run loop acts on: ``BrokerUnreachableError`` (wait and retry),
    ``TopicIdChangedError`` / ``TopicNotFoundError`` (the topic is gone or another one),
    ``CorruptRecordError`` naming a local file (heal that log).
    """

    def step(self) -> None:
        """One round: fetch, append and fsync, hand what became stable to the applier."""

    def caught_up(self) -> set[int]:
        """Partitions whose fetch position reached the high watermark seen at start."""

    def rewound(self, partition: int) -> None:
        """The partition's log was cut or reopened outside a step (a heal): fetch from its new end."""

    def add_partitions(self, start_offsets: Mapping[int, int]) -> None:
        """Fetch these new partitions too, from these offsets."""

    def remove_partitions(self, partitions: Sequence[int]) -> None:
        """Stop fetching these partitions (their logs are being closed)."""

    def wakeup(self) -> None:
        """Give up a fetch waiting for a broker that does not answer (thread- and signal-safe)."""

    def interrupted(self) -> None:
        """A step failed (the broker away, the topic changed): the next one starts afresh."""

    def unanswered_since(self) -> float | None:
        """Since when (``time.monotonic()`` seconds) the cluster has not answered this path's fetches;
        None while it answers."""

    def leaderless(self) -> Mapping[int, str]:
        """Open partitions that have no leader to fetch from now, each with why (thread-safe)."""

    def close(self) -> None:
        """Close the path's client. Idempotent."""
