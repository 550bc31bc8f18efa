"""What a running :class:`~materializer.materializer.Materializer` counts and reports: its
statistics (:class:`MaterializerStats`, read by the CLI summary and the Prometheus metrics) and its
health (:class:`MaterializerHealth`, what a service checks before serving)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

__all__ = ["MaterializerHealth", "MaterializerStats"]


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
        high_watermarks_seen_ms: partition -> when the request that brought the latest high
            watermark was sent (the watermark request at start, then each Fetch whose answer carried
            one), wall clock, ms since the epoch: what the store's lease dates it by
            (:mod:`materializer.datadir.lease`).
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
        group_commits: OffsetCommit requests of ``commit_group`` the broker accepted (requests).
        group_rebalances: group mode: assignment changes the run loop applied (partitions closed
            and/or opened at once count as one).
        group_kept_partitions_dropped: group mode: partitions the group had moved elsewhere whose
            kept local log and store entries were dropped (``revoked_retention_ms`` / ``_bytes``).
        group_misrouted_partitions: group mode: partitions open here with sampled keys that the
            routing (the configured ``partitioner``, or the detected candidates) does not place
            there under the current partition count: written before the partition count grew (or
            by another partitioner), so reads of such keys look in another partition.
        group_partitioner_candidates: group mode: hash families (murmur2, CRC32, FNV-1a) reads
            route keys by: 1 when configured or detected; more while the sampled keys cannot tell
            them apart (reads the candidates route differently look in each, and are refused
            when one is another member's); 0 when no known partitioner places every sampled key.
        group_commit_failures: OffsetCommit requests of ``commit_group`` that failed (requests).
        group_committed_offsets: partition -> offset last accepted for ``commit_group`` (the
            store's next offset to apply when it was committed).
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
    high_watermarks_seen_ms: dict[int, int] = field(default_factory=dict)
    cleaner_max_dirty_ratio: float = 0.0
    replay_target_offsets: int = 0
    replay_done_offsets: int = 0
    log_truncations: int = 0
    offsets_truncated: int = 0
    store_rewinds: int = 0
    offset_gaps: dict[int, int] = field(default_factory=dict)
    topic_recreations: int = 0
    store_entries_expired: int = 0
    group_commits: int = 0
    group_commit_failures: int = 0
    group_committed_offsets: dict[int, int] = field(default_factory=dict)
    group_rebalances: int = 0
    group_kept_partitions_dropped: int = 0
    group_misrouted_partitions: set[int] = field(default_factory=set)
    group_partitioner_candidates: int = 0

    def forget_partitions(self, partitions: Iterable[int] | None = None) -> None:
        """Drop the per-partition figures of ``partitions`` (None: of every partition): start
        offsets, high watermarks, next offsets, the latest high watermarks and when they were seen
        (a partition closed; a topic's local copy dropped)."""
        for per_partition in (self.start_offsets, self.high_watermarks, self.next_offsets,
                              self.latest_high_watermarks, self.high_watermarks_seen_ms):
            if partitions is None:
                per_partition.clear()
            else:
                for partition in partitions:
                    per_partition.pop(partition, None)

    def store_progress(self) -> tuple[int, int, int]:
        """Counters that move while the store is written outside a run loop iteration (a replay or
        rebuild inside a start, the apply worker): liveness counts their moves as progress
        (:class:`materializer.health.RunHeartbeat`)."""
        return self.replay_done_offsets, self.records_applied, self.records_replayed

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
        topic_exists: the topic is in the cluster's metadata (False from a deletion seen while
            running until it is back).
        loop_idle_s: seconds since the run loop last made progress (an iteration, a start
            attempt, a step of a store replay); :mod:`materializer.health`.
        liveness_timeout_s: how long the loop may make no progress before it counts as wedged,
            seconds (``MaterializerOptions.liveness_timeout_ms``).
        group_id: group mode: the consumer group (``MaterializerOptions.group_id``), else None.
        member_id: group mode: the member id the group knows this materializer by (None before joining).
        generation: group mode: the classic generation id or KIP-848 member epoch (None when unknown).
        assigned_partitions: group mode: the partitions assigned and open, sorted (each served once
            it has caught up: ``Materializer.served_partitions``); empty without a group.
        group_error: group mode: the last error the group membership reported, else None; a
            membership that ended keeps ``caught_up`` false (nothing it serves is known to be ours).
        unavailable_partitions: partition -> why the run cannot fetch it now (no leader in the
            metadata, a leader that does not answer, a partition of the topic not taken on yet);
            ``caught_up`` is false while any is (:mod:`materializer.partition_availability`).
    """

    running: bool
    caught_up: bool
    failed: BaseException | None
    broker_reachable: bool = True
    topic_exists: bool = True
    loop_idle_s: float = 0.0
    liveness_timeout_s: float = float("inf")
    group_id: str | None = None
    member_id: str | None = None
    generation: int | None = None
    assigned_partitions: tuple[int, ...] = ()
    group_error: str | None = None
    unavailable_partitions: Mapping[int, str] = field(default_factory=dict)

    @property
    def live(self) -> bool:
        """The run loop makes progress (Kubernetes liveness; :func:`materializer.health.liveness`):
        not failed and idle for at most ``liveness_timeout_s``. Broker reachability does not count."""
        return self.failed is None and self.loop_idle_s <= self.liveness_timeout_s

    @property
    def ready(self) -> bool:
        """The store serves a complete state (Kubernetes readiness; :func:`materializer.health.readiness`):
        running, not failed, and ``caught_up``."""
        return self.running and self.failed is None and self.caught_up
