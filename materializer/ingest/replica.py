"""The replica fetch path: the leader's record batches, appended verbatim, the store applied from the log.

One round (:meth:`ReplicaIngest.step`)::

    ReplicaFetcher.receive ──▶ (next request sent at once, its positions read off the batch frames)
        ──▶ VerbatimAppender: the leader's batches byte for byte (cuts where the leader diverged)
        ──▶ Log.flush (fsync) ──▶ bound = each log's last stable offset now
        ┄┄▶ StoreApplier.submit: the ApplyWorker applies [store offset, bound) read_committed while
            the next responses are appended

Each partition's store offset moves to the last stable offset its log had once fsynced: data of
committed transactions is applied when the COMMIT marker arrives (in offset order with everything
else), aborted data never, and an open transaction holds later records back, as a
``read_committed`` consumer is held back (Kafka ``FetchIsolation.TXN_COMMITTED``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence

from materializer.adapters.replica_fetch import PartitionData, ReplicaFetcher
from materializer.ingest import IngestContext
from materializer.ingest.appender import VerbatimAppender, truncation_target
from materializer.datadir.lease import wall_ms

__all__ = ["ReplicaIngest"]

logger = logging.getLogger(__name__)


class ReplicaIngest:
    """The replica path behind :class:`~materializer.ingest.Ingest` (module docstring).

    Args:
        context: the logs, the applier, the statistics.
        fetcher: the started Fetch API client (it expects the topic id the logs hold).
        watermarks: ``partition -> (log start offset, high watermark)`` from the cluster (asked after
            ``OFFSET_OUT_OF_RANGE`` only).
    """

    def __init__(self, context: IngestContext, fetcher: ReplicaFetcher,
                 watermarks: Callable[[int], tuple[int, int]]) -> None:
        self._context = context
        self.fetcher = fetcher
        self._appender = VerbatimAppender(context.topic, context.logs, watermarks,
                                          before_truncate=context.applier.drain)
        self._sent_ms = 0  # when the request in flight was sent (wall clock, ms)

    def step(self) -> None:
        """Take the Fetch response in flight (sending a request first if none is), send the next one
        at once, then append this response and hand what became stable to the applier.

        Whether a fetch is in flight is the fetcher's to know (:attr:`ReplicaFetcher.in_flight`):
        when this round fails after the next request went out (the append, or the run loop's own
        requests before the next round, met a cluster that went away), that fetch stays in flight
        until the next round takes its answer (one to a position the logs left is dropped by the
        appender) or :meth:`interrupted` abandons it.

        Raises:
            BrokerUnreachableError: no leader answered for ``broker_timeout_ms``.
            TopicIdChangedError: the metadata no longer names the topic the logs hold.
            CorruptRecordError: a fetched batch fails its CRC check, or (naming a local file) the apply
                worker found damage in a local log.
            KafkaSourceError / StorageError / StoreError / DeserializationError: see :meth:`append`.
        """
        context, fetcher, appender = self._context, self.fetcher, self._appender
        started = time.monotonic()
        try:
            if not fetcher.in_flight:
                self._sent_ms = wall_ms()
                fetcher.send(appender.positions(), context.options.poll_timeout_ms)
            fetched = fetcher.receive()  # takes the fetch, also when it raises
        finally:
            context.stats.fetches += 1
            context.stats.fetch_s += time.monotonic() - started
        sent_ms = self._sent_ms
        if not context.stop_requested.is_set():
            self._sent_ms = wall_ms()
            fetcher.send(appender.positions_after(fetched), context.options.poll_timeout_ms)
        self.append(fetched, sent_ms)

    def append(self, fetched: Sequence[PartitionData], sent_ms: int | None = None) -> None:
        """Append the leader's batches verbatim (:class:`VerbatimAppender`), fsync, rewind the store
        of every partition the leader cut back, follow the leader's log start offsets, then hand each
        partition's new last stable offset to the applier as its durable bound. ``sent_ms``: when
        the request was sent (wall clock, ms), which dates the high watermarks of its answer
        (``stats.high_watermarks_seen_ms``, the store's lease: :mod:`materializer.datadir.lease`).

        Raises:
            CorruptRecordError: a fetched batch fails its CRC check (nothing of it appended).
            DeserializationError: a record does not decode (``on_bad_record="fail"``); the log keeps
                it and the next start fails on it again (raised here or by the next call).
            StorageError / StoreError: the log or the store cannot be written (the store's errors
                are raised here or by the next call).
        """
        context, stats, logs = self._context, self._context.stats, self._context.logs
        append_started = time.monotonic()
        appended = self._appender.append(fetched)
        for partition, high in appended.high_watermarks.items():
            if high > stats.latest_high_watermarks.get(partition, -1):
                stats.latest_high_watermarks[partition] = high
            if sent_ms is not None:
                stats.high_watermarks_seen_ms[partition] = sent_ms
        flush_started = time.monotonic()
        for partition in {*appended.partitions, *appended.truncations}:
            logs[partition].flush()
        flushed = time.monotonic()
        if appended.truncations:
            # The appender drained the apply worker before each cut: the store offsets are ours now.
            for partition, truncation in sorted(appended.truncations.items()):
                context.note_truncation(truncation)
                context.applier.rewind(partition, min(truncation.new_end_offset, truncation.old_end_offset))
            for partition, gap in appended.gaps.items():
                stats.offset_gaps[partition] = stats.offset_gaps.get(partition, 0) + gap.end - gap.start
        # also drops what a restart at the leader's log start, or the cleaner threads' retention, left below it
        context.follow_leader_log_start(appended.log_start_offsets)
        stats.append_s += flush_started - append_started
        stats.fsync_s += flushed - flush_started
        stats.records_fetched += appended.records
        stats.bytes_fetched += appended.size_in_bytes
        stats.batches_appended += appended.batches
        stats.bytes_appended += appended.size_in_bytes
        # Durable bounds: the apply never reads past what this fsync covered, however far this
        # thread has appended by the time it runs.
        context.applier.submit({partition: logs[partition].last_stable_offset for partition in appended.partitions})

    def caught_up(self) -> set[int]:
        """Partitions whose log end offset reached the high watermark seen at start (after a gap the
        log restarts at the broker's log start offset, so a log start past the high watermark counts)."""
        highs = self._context.stats.high_watermarks
        return {p for p, log in self._context.logs.items() if log.log_end_offset >= highs.get(p, 0)}

    def truncate_by_leader_epochs(self, max_rounds: int = 16) -> None:
        """Against a broker whose Fetch cannot carry ``LastFetchedEpoch`` (before v12): ask each
        leader where the local latest epoch ends (OffsetsForLeaderEpoch, KIP-101) and cut by the
        follower's rule (:func:`~materializer.ingest.appender.truncation_target`), again with the new
        latest epoch while the answer was about an epoch the local log never had (KIP-279;
        ``AbstractFetcherThread.truncateToEpochEndOffsets``). At start, before the store is reconciled.

        Raises:
            BrokerUnreachableError / KafkaSourceError: the leaders cannot be asked.
        """
        logs = self._context.logs
        pending = {p for p, log in logs.items() if log.latest_epoch is not None}
        for _ in range(max_rounds):
            if not pending:
                return
            epochs = {p: epoch for p in pending if (epoch := logs[p].latest_epoch) is not None}
            answers = self.fetcher.offsets_for_leader_epoch(epochs)
            for partition, answer in answers.items():
                log = logs[partition]
                target, finished = truncation_target(log, answer, log.log_end_offset)
                if target < log.log_end_offset:
                    self._context.cut(partition, target, "OffsetsForLeaderEpoch")
                if finished or log.latest_epoch is None:
                    pending.discard(partition)
            if not answers:
                time.sleep(0.1)  # no leader known yet: ask again after the metadata refresh
        logger.warning("%s: the leaders did not settle where partitions %s diverge after %d rounds; continuing",
                       self._context.topic, sorted(pending), max_rounds)

    def rewound(self, partition: int) -> None:
        """Nothing to do: positions are read off the logs, and the answer to the request in flight for
        the old position is dropped by the appender (it answers another position)."""

    def add_partitions(self, start_offsets: Mapping[int, int]) -> None:
        """Positions are read off the logs, which hold the new partitions; the request in flight was
        sent without them and, when the others have nothing new, waits out ``poll_timeout_ms`` at
        the leader: it is given up, so the next request (at once) names them."""
        if self.fetcher.in_flight:
            self.fetcher.wakeup()

    def remove_partitions(self, partitions: Sequence[int]) -> None:
        """Nothing to do: positions are read off the logs, which no longer hold these partitions; an
        answer in flight for one of them is skipped by the appender."""

    def wakeup(self) -> None:
        """Give up the fetch in flight (:meth:`ReplicaFetcher.wakeup`)."""
        self.fetcher.wakeup()

    def interrupted(self) -> None:
        """After a failed round (the cluster away, the topic changed) the fetch in flight, if any, is
        abandoned (:meth:`ReplicaFetcher.abandon`: its answer would be as old as the failure, and
        its connections may lead to a broker that is gone): the next round sends a request first."""
        self.fetcher.abandon()

    def unanswered_since(self) -> float | None:
        """Since when the fetches have failed to reach a leader (``time.monotonic()`` seconds), None
        while the last one got every answer (:attr:`ReplicaFetcher.unreachable_since`)."""
        return self.fetcher.unreachable_since

    def leaderless(self) -> dict[int, str]:
        """Open partitions the last fetch could not ask a leader for, with why
        (:meth:`ReplicaFetcher.leaderless`). Thread-safe."""
        return self.fetcher.leaderless()

    def close(self) -> None:
        """Close the fetcher. Idempotent."""
        self.fetcher.close()
