"""What a started :class:`~materializer.materializer.Materializer` holds, built together by :meth:`Session.open`.

A session is the clients, logs, store, applier and fetch path of one start, all present at once
(nothing is ``None`` once it exists) and closed together. Opening it follows Kafka's order for a
replica (``LogManager.loadLogs``, ``UnifiedLog.initializeTopicId``, ``AbstractFetcherThread``)::

    topic configs, fetcher bootstrap and watermarks asked at once ─▶ topic id compared with the
    partition folders' (a re-created topic's local copy dropped) ─▶ store opened (created or
    rebuilt: the topic marked incomplete) ─▶ logs opened (recovery) ─▶ an empty log aligned with
    the broker's log start ─▶ a log beyond the leader's high watermark cut ─▶ (consumer path) a
    transaction the replica path left open cut; (replica path before Fetch v12) OffsetsForLeaderEpoch
    ─▶ the store reconciled with the logs (replayed, partitions rebuilt, damage recovered) ─▶ entries
    below a log start offset dropped ─▶ the fetch path started

On any failure what was opened is closed again (the data dir's lock is the caller's).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
import uuid
from collections.abc import Callable, Container, Iterable, Mapping, MutableSequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from materializer.adapters.kafka_source import KafkaSource
from materializer.adapters.replica_fetch import ReplicaFetcher
from materializer.adapters.rocksdb_store import StateStore
from materializer.adapters.errors import LeaderNotAvailableError, StoreCorruptedError, TopicNotFoundError
from materializer.apply.applier import StoreApplier, UpdateCallback
from materializer.apply.committed import RecordCheck, rebuild_store_from_logs
from materializer.config import MaterializerOptions
from materializer.datadir.layout import state_dir, topic_config_path, topic_status_path
from materializer.datadir.markers import mark_complete, mark_incomplete, topic_status
from materializer.ingest import IngestContext
from materializer.ingest.appender import LogTruncation
from materializer.ingest.consumer import ConsumerIngest
from materializer.ingest.replica import ReplicaIngest
from materializer.datadir.lease import wall_ms
from materializer.progress import progress_bar
from materializer.stats import MaterializerStats
from materializer.storage.checkpoint import LOG_START_OFFSET_CHECKPOINT
from materializer.storage.compression import CompressionType
from materializer.storage.errors import CorruptRecordError
from materializer.storage.files import offset_from_file_name
from materializer.storage.log import Log
from materializer.storage.log_config import LogConfig
from materializer.storage.log_manager import TopicLogs
from materializer.datadir.formats import TopicFormats, write_topic_formats
from materializer.datadir.identity import check_local_copy, remove_deleted_folders

__all__ = ["LOCAL_SEGMENT_BYTES", "Session", "StoreMarker"]

logger = logging.getLogger(__name__)

#: How long the periodic look for added partitions waits for the consumer path's metadata, seconds
#: (a cluster that does not answer must not hold the run loop, or a stop, for the request timeout).
_METADATA_PROBE_S = 5.0

#: The local log's segment.bytes unless --config sets it: the topic's, capped at 64 MiB, so the
#: active segment (never cleaned) holds at most 64 MiB and the rest of the log gets compacted.
LOCAL_SEGMENT_BYTES = 64 * 1024 * 1024


def _compression_of(name: str) -> CompressionType:
    return CompressionType.NONE if name.strip().lower() == "producer" else CompressionType.from_name(name)


class StoreMarker:
    """The topic's completeness marker as a run keeps it: incomplete while the store is created,
    rebuilt or rewound (readers in other processes refuse the topic then, the logs stay readable),
    complete once the run has caught up (:func:`materializer.datadir.markers.mark_incomplete`)."""

    def __init__(self, data_dir: Path, topic: str, command: str) -> None:
        self._data_dir, self._topic, self._command = data_dir, topic, command
        self.loading = False
        #: Group mode: the partitions readers in other processes may serve and how they route keys
        #: (:func:`materializer.group.served.serve`); None: every partition.
        self.group: dict[str, Any] | None = None

    def mark_loading(self, what: str) -> None:
        """Mark the topic incomplete: ``what`` the run is doing to the store."""
        mark_incomplete(self._data_dir, self._topic, f"`materializer {self._command}` {what}",
                        f"wait until `materializer {self._command}` has caught up (or run `materializer run "
                        f"--until-caught-up` if it was stopped)", logs_usable=True)
        self.loading = True

    @property
    def command(self) -> str:
        """The command that writes the data dir (``run``), as markers and records name it."""
        return self._command

    def mark_complete(self) -> None:
        """Caught up: the store holds what the logs hold; mark the topic complete unless it is (with
        :attr:`group` as it is now).

        Raises:
            OSError: the marker cannot be written.
        """
        status = topic_status(self._data_dir, self._topic)
        if self.loading or status.state != "complete" or status.facts.get("group") != self.group:
            self._write_complete()
        self.loading = False

    @property
    def data_dir(self) -> Path:
        """The data dir whose marker of :attr:`topic` this keeps."""
        return self._data_dir

    @property
    def topic(self) -> str:
        """The topic whose marker this keeps."""
        return self._topic

    @property
    def path(self) -> Path:
        """The marker's file (:func:`materializer.datadir.layout.topic_status_path`)."""
        return topic_status_path(self._data_dir, self._topic)

    def complete_facts(self) -> dict[str, Any] | None:
        """The facts of the topic's complete marker as written now (``written_by``, ``group``, ...);
        None while the topic is not complete."""
        status = topic_status(self._data_dir, self._topic)
        return dict(status.facts) if status.state == "complete" else None

    def set_group(self, group: dict[str, Any]) -> None:
        """Group mode: ``group`` becomes :attr:`group` (what it says: :mod:`materializer.group.served`).
        Written into the complete marker at once when the topic is complete, else when it becomes
        complete (an incomplete topic is refused by readers anyway); unchanged (a metadata refresh,
        a rebalance that moved nothing here): no rewrite.

        Raises:
            OSError: the marker cannot be written.
        """
        if group == self.group:
            return
        self.group = group
        if not self.loading and topic_status(self._data_dir, self._topic).state == "complete":
            self._write_complete()

    def _write_complete(self) -> None:
        facts: dict[str, Any] = {"written_by": self._command}
        if self.group is not None:
            facts["group"] = self.group
        mark_complete(self._data_dir, self._topic, **facts)


@dataclass
class Session:
    """The started state of a materializer (module docstring). Build with :meth:`open`.

    Attributes:
        source: confluent-kafka: metadata, watermarks, topic configs and ids, and the records on the
            consumer path; None on the replica path once started (closed: the fetcher asks the
            metadata and watermarks itself, so a topic costs one Kafka client, not two).
        fetcher: the replica path's Fetch API client, or None on the consumer path.
        topic_logs: the topic's open logs (``logs``: partition -> Log, shared with every collaborator).
        log_config: the local logs' topic configuration.
        topic_id: the topic's id in the cluster (None: the cluster has no ids).
        context: what the fetch path works on (logs, applier, statistics).
        ingest: the fetch path.
        marker: the topic's completeness marker as the run keeps it.
        partition_count: the topic's partitions in the cluster's metadata (at start, and at each
            :meth:`add_partitions`), open or not.
    """

    source: KafkaSource | None
    fetcher: ReplicaFetcher | None
    topic_logs: TopicLogs
    log_config: LogConfig
    topic_id: uuid.UUID | None
    context: IngestContext
    ingest: ReplicaIngest | ConsumerIngest
    marker: StoreMarker
    partition_count: int = 0

    @property
    def logs(self) -> dict[int, Log]:
        """Partition -> open log."""
        return self.topic_logs.logs

    @property
    def store(self) -> StateStore:
        """The state store (the applier's: a rebuild at start replaces it)."""
        return self.context.applier.store

    @property
    def applier(self) -> StoreApplier:
        """The store's one writer."""
        return self.context.applier

    @classmethod
    def open(cls, bootstrap_servers: str, topic: str, data_dir: Path, options: MaterializerOptions, *,
             stats: MaterializerStats, marker: StoreMarker, check: RecordCheck | None,
             callbacks: MutableSequence[UpdateCallback], stop_requested: threading.Event,
             statistics_callback: Callable[[str], None] | None, statistics_interval_ms: int,
             partitions: Iterable[int] | None = None) -> "Session":
        """Open everything for ``topic`` in ``data_dir`` (module docstring for the order).

        ``partitions``: the partitions to open and fetch (a consumer-group member's assignment;
        partitions the topic does not have are ignored); None (default): every partition of the
        topic. The folders of the others are kept closed and untouched; the local copy is still
        compared with every partition of the topic (a re-created topic is noticed as without).

        Raises:
            KafkaSourceError: the cluster or the topic cannot be read (``TopicNotFoundError``,
                ``BrokerUnreachableError`` among them).
            TopicIdChangedError: the local copy is another topic's and ``on_topic_recreated="fail"``.
            StoreLockedError / StoreError: the state store cannot be opened or written.
            StorageError: a local log cannot be opened.
            ValueError: an invalid topic config or override.
        """
        source_options = options.source_options()
        if statistics_callback is not None:
            source_options = dataclasses.replace(source_options, statistics_callback=statistics_callback,
                                                 statistics_interval_ms=statistics_interval_ms)
        with contextlib.ExitStack() as opened:
            source = KafkaSource(bootstrap_servers, topic, source_options)
            opened.callback(source.close)
            # Broker round trips that do not depend on each other run at once: the topic's configs,
            # the replica fetcher's bootstrap and one watermark request per partition.
            with ThreadPoolExecutor(max_workers=4, thread_name_prefix=f"materializer-start-{topic}") as pool:
                configs = pool.submit(source.topic_configs)
                fetcher_built: Future[ReplicaFetcher] | None = None
                topic_id_read: Future[uuid.UUID | None] | None = None
                if options.fetch == "replica":
                    fetcher_built = pool.submit(ReplicaFetcher, bootstrap_servers, topic, source_options)
                    opened.callback(_close_built_fetcher, fetcher_built)
                else:
                    topic_id_read = pool.submit(source.topic_id)
                opener = _Opener(bootstrap_servers, topic, data_dir, options, stats, marker, source, pool)
                session = opener.open(configs, fetcher_built, topic_id_read, opened, check, callbacks,
                                      stop_requested, None if partitions is None else set(partitions))
            opened.pop_all()
        if session.fetcher is not None:
            # The fetcher follows the topic id, the metadata and the watermarks from here on: the
            # consumer's librdkafka threads and connections would only idle.
            session.source = None
            source.close()
        return session

    def add_partitions(self, allowed: Container[int] | None = None) -> list[int]:
        """Open the logs of partitions added to the topic since the start and start fetching them
        (from the broker's log start offset; a subscribed Kafka consumer notices new partitions on its
        metadata refresh the same way). Returns the partitions added. ``allowed``: only these may be
        opened (a consumer-group member's assignment); None: any. ``partition_count`` follows the
        metadata.

        Raises:
            KafkaSourceError: the metadata or the watermarks cannot be read.
            StorageError: a new partition's log cannot be opened.
        """
        in_topic = self._partitions_in_topic(_METADATA_PROBE_S)
        self.partition_count = len(in_topic)
        new = self.open_partitions((p for p in set(in_topic) - set(self.logs) if allowed is None or p in allowed),
                                   defer_leaderless=True)
        if new:
            logger.info("topic %s has new partitions %s: ingesting them from offsets %s", self.context.topic, new,
                        {p: self.context.stats.start_offsets[p] for p in new})
        return new

    def open_partitions(self, partitions: Iterable[int], *, defer_leaderless: bool = False) -> list[int]:
        """Open the logs of ``partitions`` (those not open yet) and start fetching them, each from
        its local log end offset: a folder kept from an earlier assignment continues where it
        ended, so only the delta is fetched, and the store, whose entries of the partition were
        kept too, applies the log's tail it had not applied yet; a new folder starts at the
        broker's log start offset (:func:`align_empty_log`). Their high watermarks now become
        their readiness targets (``stats.high_watermarks``). Returns the partitions opened, sorted.

        For partitions added to the topic (:meth:`add_partitions`) and for partitions a consumer
        group assigns (Kafka's ``ConsumerRebalanceListener.onPartitionsAssigned``). With
        ``defer_leaderless`` a partition whose leader is not known yet (just created) is left out,
        for the next call, instead of waiting for it; its folder is not created.

        Raises:
            LeaderNotAvailableError: a partition had no leader within the request timeout (not
                raised with ``defer_leaderless``).
            KafkaSourceError: the watermarks cannot be read.
            StorageError: a log cannot be opened.
        """
        # before any folder is made: a failure leaves nothing half-open
        asked_ms = wall_ms()  # the high watermarks are at least as of now (the store's lease dates them)
        watermarks = self._watermarks(sorted(set(partitions) - set(self.logs)), defer_leaderless=defer_leaderless)
        new = sorted(watermarks)
        if not new:
            return []
        self.applier.drain()  # the apply worker reads the logs
        stats = self.context.stats
        start_offsets = {}
        for partition in new:
            self.topic_logs.add_partition(partition)
            low, high = watermarks[partition]
            align_empty_log(self.context, self.store, self.marker, partition, low, high)
            log = self.logs[partition]
            start_offsets[partition] = log.log_end_offset
            stats.start_offsets[partition] = log.log_end_offset
            stats.high_watermarks[partition] = high
            stats.next_offsets[partition] = log.log_end_offset
            stats.latest_high_watermarks[partition] = high
            stats.high_watermarks_seen_ms[partition] = asked_ms
            self.applier.add_partition(partition)
        self.ingest.add_partitions(start_offsets)
        # A kept log may hold records its store partition has not applied (the store is never ahead).
        behind = {p: self.logs[p].last_stable_offset for p in new
                  if self.applier.applied_offsets().get(p, 0) < self.logs[p].last_stable_offset}
        self.applier.submit(behind)
        return new

    def refresh_partition_count(self) -> int:
        """Read the topic's partition count from the cluster's metadata now into
        :attr:`partition_count` (the modulus a consumer group's readers route keys with) and
        return it.

        Raises:
            TopicNotFoundError: the topic is not in the metadata.
            KafkaSourceError: the metadata cannot be read.
        """
        self.partition_count = len(self._partitions_in_topic())
        return self.partition_count

    def _partitions_in_topic(self, timeout_s: float | None = None) -> list[int]:
        """The topic's partitions in the cluster's metadata now, sorted (the consumer path waits up
        to ``timeout_s`` seconds, default its request timeout).

        Raises:
            TopicNotFoundError: the topic is not in the metadata.
            KafkaSourceError: the metadata cannot be read.
        """
        if self.source is not None:
            return self.source.partitions(timeout_s)
        assert self.fetcher is not None
        self.fetcher.refresh_metadata()
        in_topic = self.fetcher.partitions()
        if not in_topic:
            raise TopicNotFoundError(f"topic {self.context.topic!r} is not in the metadata of "
                                     f"{self.fetcher.bootstrap_servers}")
        return in_topic

    def _watermarks(self, partitions: list[int], *, defer_leaderless: bool) -> dict[int, tuple[int, int]]:
        """``partition -> (log start offset, high watermark)`` for ``partitions`` (the replica path
        asks every leader once for all of them). With ``defer_leaderless`` a partition whose leader is
        not known yet is left out (and logged) instead of waited for.

        Raises:
            LeaderNotAvailableError: without ``defer_leaderless``, a partition had no leader in time.
            KafkaSourceError: the watermarks cannot be read.
        """
        wait = not defer_leaderless

        def ask(batch: list[int]) -> dict[int, tuple[int, int]]:
            if self.fetcher is not None:
                return self.fetcher.watermarks(batch, wait_for_leader=wait)
            assert self.source is not None
            return {p: self.source.watermark_offsets(p, wait_for_leader=wait) for p in batch}

        if not partitions:
            return {}
        try:
            return ask(partitions)
        except LeaderNotAvailableError:
            if not defer_leaderless:
                raise
        watermarks: dict[int, tuple[int, int]] = {}
        for partition in partitions:  # one by one: those with a leader are taken on now
            try:
                watermarks.update(ask([partition]))
            except LeaderNotAvailableError as exc:
                logger.info("partition %s-%d has no leader yet, taking it on later: %s", self.context.topic,
                            partition, exc)
        return watermarks

    def close_partitions(self, partitions: Iterable[int]) -> list[int]:
        """Stop fetching ``partitions`` (those open) and close their logs, keeping their folders and
        their store entries: the apply worker is drained, each log flushed, closed and
        checkpointed (:meth:`TopicLogs.remove_partition`), and the partitions leave the fetch path
        and the per-partition statistics. :meth:`open_partitions` takes them on again later
        from where they ended. Returns the partitions closed, sorted.

        For partitions a consumer group revoked (Kafka's ``ConsumerRebalanceListener.onPartitionsRevoked``
        / ``onPartitionsLost``). The replica path needs nothing more (each Fetch names the open logs;
        an answer in flight for a closed partition is skipped); the consumer path unassigns them.

        Raises:
            StorageError / StoreError: a log cannot be flushed or checkpointed, or the drained
                apply failed.
        """
        closing = sorted(set(partitions) & set(self.logs))
        if not closing:
            return []
        stats = self.context.stats
        for partition in closing:
            self.applier.remove_partition(partition)  # drains: nothing reads the log any more
        self.ingest.remove_partitions(closing)
        for partition in closing:
            self.topic_logs.remove_partition(partition)
            stats.forget_partitions([partition])
        return closing

    def cluster_topic_id(self) -> uuid.UUID | None:
        """The topic's id in the cluster now (a metadata request); None while the topic does not exist.

        Raises:
            BrokerUnreachableError: the cluster does not answer.
        """
        if self.fetcher is not None:
            self.fetcher.refresh_metadata()
            if not self.fetcher.partitions():
                return None
            return self.fetcher.topic_id_in_metadata()
        assert self.source is not None  # the consumer path keeps its source
        return self.source.topic_id()

    def refresh_high_watermarks(self) -> None:
        """Raise ``stats.latest_high_watermarks`` to the consumer client's cached values (no request);
        the replica path reads them off each Fetch response instead."""
        if self.source is None:
            return
        latest = self.context.stats.latest_high_watermarks
        for partition, high in self.source.cached_high_watermarks(sorted(self.logs)).items():
            if high > latest.get(partition, -1):
                latest[partition] = high

    def settle(self) -> None:
        """Leave the store equal to the logs: the apply worker drained, and the keys whose latest
        record fell below a log start offset (retention since the last apply) dropped.

        Raises:
            StoreError: the drained apply failed, or the store cannot be written.
        """
        self.applier.drain()
        self.applier.drop_below_log_start()

    def caught_up(self, *, serving: bool, newly: bool) -> None:
        """Every open partition reached its readiness target: the store is made to hold what the logs
        hold (the apply worker drained). ``serving`` (a continuous run, which serves from now on):
        the store's background compaction resumes; a bounded run closes the store still in bulk
        mode, so its close does not wait for that compaction (the next open, with RocksDB's
        default options, compacts in the background). The topic's marker says complete when it
        is loading or the run is ``newly`` caught up.

        Raises:
            StoreError: the drained apply failed.
            OSError: the marker cannot be written.
        """
        self.applier.drain()
        if serving:
            self.store.set_bulk_loading(False)
        if self.marker.loading or newly:
            self.marker.mark_complete()

    def damaged_partition(self, exc: CorruptRecordError) -> int | None:
        """The open partition whose local log file ``exc`` names, or None (damage elsewhere, e.g. in
        a Fetch response)."""
        return _damaged_partition(exc, self.logs)

    def heal(self, partition: int, exc: CorruptRecordError, *, withdrawn: bool = False) -> None:
        """Recover ``partition``'s log from the damage ``exc`` a reader found while running (the apply
        worker, a cleaner thread), whatever the clean-shutdown marker said at start: the log is
        reopened with Kafka's recovery from the damaged batch's offset on (or its segment's base
        offset when that is unreadable; cut at the first invalid batch, later segments deleted:
        :meth:`TopicLogs.recover_partition`), the cut counted as a truncation, the store partition
        rewound to what the log now holds, and fetching resumes at the new log end offset, so the
        cut offsets come again from the broker. The apply worker is restarted first (the failed
        one keeps the failure that brought the run here); nothing else is lost.

        The partition counts as caught up again only at its old log end offset (or the newest high
        watermark known), not at the high watermark read when it was opened, which the cut may be
        far above. Readers in other processes: when the rewind takes entries out of the store, the
        topic's marker says the run is healing it (they refuse the topic meanwhile, as they would
        read older values), unless they were told already not to serve the partition
        (``withdrawn``: a group member withdrew it). The caller stops the cleaner threads around it.

        Raises:
            ValueError: ``exc`` names no file.
            StorageError: the log cannot be recovered.
            StoreError: the store cannot be rewound.
        """
        from_offset = _recovery_offset(exc)
        log = self.logs[partition]
        logger.warning("damaged local log: %s; recovering %s from offset %d (what is cut is fetched again from the "
                       "broker)", exc, log.dir, from_offset)
        self.applier.restart_worker()
        applied = self.applier.applied_offsets().get(partition, 0)
        old_end, old_epoch = log.log_end_offset, log.latest_epoch
        log = self.topic_logs.recover_partition(partition, from_offset)
        stats = self.context.stats
        stats.high_watermarks[partition] = max(stats.high_watermarks.get(partition, 0), old_end,
                                               stats.latest_high_watermarks.get(partition, 0))
        if not withdrawn and log.log_end_offset < applied:
            self.marker.mark_loading(f"healing partition {partition} (damage in its local log)")
        new_epoch = log.latest_epoch
        self.context.note_truncation(LogTruncation(partition, old_end, log.log_end_offset,
                                                   -1 if old_epoch is None else old_epoch,
                                                   -1 if new_epoch is None else new_epoch, "damaged local log"))
        self.applier.rewind(partition, log.log_end_offset)
        self.ingest.rewound(partition)

    def close(self) -> None:
        """Close the fetch path, the applier (what it did not apply is replayed at the next start), the
        logs (checkpoints, the clean-shutdown marker), the store and the clients. Idempotent."""
        try:
            self.applier.close()
            self.topic_logs.close()
        finally:
            self.store.close()
            self.ingest.close()
            if self.source is not None:
                self.source.close()


def _close_built_fetcher(built: Future) -> None:
    """Close the ReplicaFetcher a future built, if it built one (a failed start)."""
    if built.done() and built.exception() is None:
        built.result().close()
    elif not built.done():
        built.add_done_callback(_close_built_fetcher)


class _Opener:
    """The steps of :meth:`Session.open`, each on what the previous ones opened."""

    def __init__(self, bootstrap_servers: str, topic: str, data_dir: Path, options: MaterializerOptions,
                 stats: MaterializerStats, marker: StoreMarker, source: KafkaSource, pool: ThreadPoolExecutor) -> None:
        self.bootstrap_servers, self.topic, self.data_dir, self.options = bootstrap_servers, topic, data_dir, options
        self.stats, self.marker, self.source, self.pool = stats, marker, source, pool

    def open(self, configs_future: Future, fetcher_built: Future | None, topic_id_read: Future | None,
             opened: contextlib.ExitStack, check: RecordCheck | None, callbacks: MutableSequence[UpdateCallback],
             stop_requested: threading.Event, assigned: set[int] | None) -> Session:
        topic, data_dir, options, stats = self.topic, self.data_dir, self.options, self.stats
        all_partitions = self.source.partitions()
        # check_local_copy needs every partition of the topic: a folder it does not know would look
        # like a partition of a re-created topic and drop the local copy.
        partitions = all_partitions if assigned is None else [p for p in all_partitions if p in assigned]
        # asked now, answered while the local copy is checked and the store and logs are opened
        asked_ms = wall_ms()
        watermarks_asked = [self.pool.submit(self.source.watermark_offsets, p) for p in partitions]
        log_config = self._log_config(configs_future.result())
        # what `get`/`export` decode with when not told (materializer.datadir.formats)
        write_topic_formats(data_dir, topic, TopicFormats(options.key_format, options.value_format,
                                                          options.schema_registry_url), written_by=self.marker.command)
        compression = _compression_of(options.compression or log_config.compression_type)

        # The topic's identity (KIP-516) decides whether the local copy is this topic's at all.
        fetcher = fetcher_built.result() if fetcher_built is not None else None
        if fetcher is not None:
            topic_id = fetcher.topic_id
        else:
            assert topic_id_read is not None
            topic_id = topic_id_read.result()
            if topic_id is None:
                logger.info("the cluster reports no topic id for %s (before Kafka 2.8?): re-creation of the topic "
                            "is noticed by leader epochs only", topic)
        remove_deleted_folders(data_dir, topic)
        if check_local_copy(data_dir, topic, topic_id, all_partitions, options.on_topic_recreated):
            stats.topic_recreations += 1
            # asked before the id was checked: they may be the old topic's
            asked_ms = wall_ms()
            watermarks_asked = [self.pool.submit(self.source.watermark_offsets, p) for p in partitions]

        store, store_existed = self._open_store()
        opened.callback(store.close)
        topic_logs = TopicLogs.open(data_dir, topic, partitions, log_config, topic_id)
        opened.callback(topic_logs.abandon)
        logs = topic_logs.logs
        applier = StoreApplier(store, logs, stats, topic=topic, check=check, callbacks=callbacks,
                               on_loading=self.marker.mark_loading, threaded=fetcher is not None)
        opened.callback(lambda: applier.store.close())  # the reconcile may replace the store
        opened.callback(applier.close)
        context = IngestContext(topic, logs, applier, stats, options, stop_requested)
        watermarks = dict(zip(partitions, (asked.result() for asked in watermarks_asked)))
        for partition, (low, high) in watermarks.items():
            align_empty_log(context, store, self.marker, partition, low, high)
            if logs[partition].log_end_offset > high:
                # The leader lost data (clients only ever read below the high watermark): cut there, as a
                # follower without a usable epoch starts at the high watermark (AbstractFetcherThread
                # truncateToHighWatermark); below it the leader epochs decide.
                logger.warning("the local log %s ends at offset %d, beyond the broker's high watermark %d of "
                               "%s-%d (the leader lost data); truncating it to %d", logs[partition].dir,
                               logs[partition].log_end_offset, high, topic, partition, high)
                context.cut(partition, high, "leader's high watermark")
        ingest: ReplicaIngest | ConsumerIngest
        if fetcher is not None:
            ingest = ReplicaIngest(context, fetcher, lambda partition: fetcher.watermarks([partition])[partition])
            if not fetcher.supports_diverging_epoch():
                ingest.truncate_by_leader_epochs()
        else:
            ingest = ConsumerIngest(context, self.source, compression, topic_id)
            ingest.truncate_open_transactions()
        store = _reconcile_recovering_damage(context, topic_logs, store, store_existed, self.marker, options)
        applier.begin(store)
        # A new or rebuilt store is loaded in bulk until the run has caught up (Session.caught_up)
        store.set_bulk_loading(self.marker.loading)
        applier.drop_below_log_start()
        for partition, (_, high) in watermarks.items():
            log = logs[partition]
            stats.start_offsets[partition] = log.log_end_offset
            stats.high_watermarks[partition] = high
            stats.next_offsets[partition] = log.log_end_offset
            stats.latest_high_watermarks[partition] = high
            stats.high_watermarks_seen_ms[partition] = asked_ms
        if fetcher is not None:
            fetcher.expect_topic_id(topic_id)
        else:
            assert isinstance(ingest, ConsumerIngest)
            ingest.assign()
        logger.info("materializing %s from %s (%s fetch): start offsets %s, high watermarks %s", topic,
                    self.bootstrap_servers, options.fetch, stats.start_offsets, stats.high_watermarks)
        return Session(self.source, fetcher, topic_logs, log_config, topic_id, context, ingest, self.marker,
                       partition_count=len(all_partitions))

    def _log_config(self, broker_configs: dict[str, str]) -> LogConfig:
        """The local logs' configuration: the broker's with the overrides, segment.bytes capped
        (:data:`LOCAL_SEGMENT_BYTES`), saved in ``DIR/topic-configs/<topic>.json``."""
        options = self.options
        configs = {**broker_configs, **options.config_overrides}
        if not {"segment.bytes", "internal.segment.bytes"} & set(options.config_overrides):
            # The local log rolls by its own size so that the cleaner has a compacted tail to work
            # on: a topic's 1 GiB segment.bytes would keep everything in the never-cleaned active
            # segment for a long time.
            topic_bytes = int(configs.get("internal.segment.bytes") or configs.get("segment.bytes") or 2**30)
            configs["segment.bytes"] = str(min(topic_bytes, LOCAL_SEGMENT_BYTES))
            configs.pop("internal.segment.bytes", None)
        log_config = LogConfig.from_kafka_configs(configs)
        if not log_config.compact:
            logger.warning("topic %s has cleanup.policy=%s: retention deletes old segments, and the state store "
                           "drops the keys whose records it deleted (as a consumer of the topic would not see them)",
                           self.topic, ",".join(log_config.cleanup_policy) or "''")
        config_path = topic_config_path(self.data_dir, self.topic)
        config_path.parent.mkdir(parents=True, exist_ok=True)
        log_config.save(config_path)
        return log_config

    def _open_store(self) -> tuple[StateStore, bool]:
        """The topic's store, and whether it existed; a damaged one is rebuilt (marked incomplete)."""
        path = state_dir(self.data_dir, self.topic)
        existed = StateStore.exists(path)
        if not existed:
            self.marker.mark_loading("loading a new state store")
        try:
            return StateStore(path, self.options.store), existed
        except StoreCorruptedError as exc:
            logger.warning("%s; rebuilding it from the local log", exc)
            self.marker.mark_loading("rebuilding a damaged state store")
            StateStore.destroy(path)
            return StateStore(path, self.options.store), False


def align_empty_log(context: IngestContext, store: StateStore, marker: StoreMarker | None, partition: int,
                    low: int, high: int) -> None:
    """Start an empty local log where a consumer with ``auto.offset.reset=earliest`` would fetch.

    An empty log at offset 0 of a topic whose broker log starts later mirrors the broker's log
    start offset. An empty log whose offset lies outside the broker's ``[log start offset, high
    watermark]`` (a ``log-start-offset-checkpoint`` past the local log end deletes the local
    segments on load, as Kafka's LogLoader does) would be fetched out of range on every start:
    it restarts at the broker's log start offset instead, and says so. The store's entries of
    that partition are dropped (:meth:`StateStore.drop_partition`; other partitions keep theirs)
    and re-materialized from what is fetched again.
    """
    log = context.logs[partition]
    if log.size_in_bytes != 0:
        return
    if log.log_end_offset == 0 and low > 0:  # a new local log; the broker's log starts later
        log.truncate_fully_and_start_at(low)
        return
    if not low <= log.log_end_offset <= high:
        logger.warning("the local log %s is empty at offset %d, outside the broker's offsets [%d, %d] of %s-%d "
                       "(a %s value beyond the local log end?); fetching it again from the broker's log start "
                       "offset %d", log.dir, log.log_end_offset, low, high, context.topic, partition,
                       Path(log.dir).parent / LOG_START_OFFSET_CHECKPOINT, low)
        log.truncate_fully_and_start_at(low)
        if marker is not None:
            marker.mark_loading(f"fetching partition {partition} again")
        dropped = store.drop_partition(partition)
        logger.warning("dropped the %d state store entries of %s-%d; they are re-materialized from what is "
                       "fetched again", dropped, context.topic, partition)


def _reconcile_recovering_damage(context: IngestContext, topic_logs: TopicLogs, store: StateStore,
                                 store_existed: bool, marker: StoreMarker, options: MaterializerOptions) -> StateStore:
    """:func:`_reconcile`, recovering a log whose replay finds damage recovery at open missed.

    A torn or corrupt batch, or offsets out of order, in a segment below the recovery point
    (Kafka does not re-check those after a clean shutdown) would make a replay stop short and
    serve stale values. Instead the damaged log is recovered from the damaged offset on
    (:meth:`TopicLogs.recover_partition`: cut at the first invalid batch, later segments
    deleted), the store is rebuilt if it is now ahead of that log, and fetching resumes at the
    new log end offset, so the cut offsets are fetched again from the broker. Returns the store
    (a new one when it was rebuilt whole).
    """
    recovered: set[tuple[Path, int]] = set()
    while True:
        try:
            return _reconcile(context, store, store_existed, marker, options)
        except CorruptRecordError as exc:
            partition = _damaged_partition(exc, topic_logs.logs)
            if partition is None:
                raise
            log = topic_logs.logs[partition]
            from_offset = _recovery_offset(exc)
            if (log.dir, from_offset) in recovered:
                raise
            recovered.add((log.dir, from_offset))
            logger.warning("damaged local log: %s; recovering %s from offset %d (what is cut is fetched "
                           "again from the broker)", exc, log.dir, from_offset)
            topic_logs.recover_partition(partition, from_offset)
            store = context.applier.store  # a rebuild that failed half-way left a new store
            store_existed = True  # reconcile again: the store may now be ahead of the recovered log


def _damaged_partition(exc: CorruptRecordError, logs: Mapping[int, Log]) -> int | None:
    """The partition of ``logs`` whose log folder holds the file ``exc`` names, or None (damage
    elsewhere)."""
    if exc.path is None:
        return None
    folder = Path(exc.path).parent
    return next((p for p, log in logs.items() if log.dir == folder), None)


def _recovery_offset(exc: CorruptRecordError) -> int:
    """Where recovery from the damage ``exc`` names starts: the damaged batch's offset, or, when that
    is unreadable, its segment's base offset (recovery checks every batch from there and cuts at
    the first bad one).

    Raises:
        ValueError: ``exc`` names no file.
    """
    if exc.path is None:
        raise ValueError(f"{exc} names no file of a local log")
    return exc.offset if exc.offset is not None else offset_from_file_name(Path(exc.path).name)


def _reconcile(context: IngestContext, store: StateStore, store_existed: bool, marker: StoreMarker,
               options: MaterializerOptions) -> StateStore:
    """Reconcile the store with the logs at start: a missing store is rebuilt from the logs (when they
    hold anything), a partition whose store is ahead of its log (the log lost data) or behind its log
    start (retention passed records it never applied) is rebuilt alone, and every partition's log tail
    beyond the store is replayed. Returns the store (a new one when it was rebuilt whole)."""
    logs, stats, topic = context.logs, context.stats, context.topic
    offsets = store.offsets()
    has_data = any(log.log_end_offset > log.log_start_offset for log in logs.values())
    for partition, log in logs.items():
        next_offset = offsets.get(partition)
        if next_offset is not None and next_offset > log.log_end_offset:
            logger.warning("state store of %s-%d is at offset %d, beyond the local log end offset %d; rebuilding the "
                           "partition from the local log", topic, partition, next_offset, log.log_end_offset)
        elif next_offset is not None and next_offset < log.log_start_offset < log.log_end_offset:
            logger.warning("state store of %s-%d is at offset %d, below the local log start offset %d; rebuilding the "
                           "partition from the local log", topic, partition, next_offset, log.log_start_offset)
        else:
            continue
        # Partitions are independent in the store: the others keep their entries. Readers (a view
        # catching up in another process) must not see the partition empty or half replayed.
        marker.mark_loading(f"rebuilding partition {partition} of the state store from the local log")
        store.drop_partition(partition)
        offsets.pop(partition, None)
        stats.store_rewinds += 1
    if not store_existed and has_data:
        logger.warning("rebuilding the state store of %s from the local log in %s", topic, Path(store.path).parent)
        marker.mark_loading("rebuilding the state store from the local log")
        path = store.path
        store.close()
        StateStore.destroy(path)
        store = StateStore(path, options.store)
        context.applier.store = store
        stats.store_rebuilt = True
        stats.records_replayed += _replay(context, store, dict(logs), {p: log.log_start_offset for p, log in logs.items()},
                                          "rebuilding store", options)
        return store
    behind = {p: offsets.get(p, log.log_start_offset) for p, log in logs.items()
              if offsets.get(p, log.log_start_offset) < log.log_end_offset}
    if behind:
        logger.info("replaying the local log tail into the state store: %s", behind)
        stats.records_replayed += _replay(context, store, {p: logs[p] for p in behind}, behind, "replaying log tail",
                                          options)
    return store


def _replay(context: IngestContext, store: StateStore, logs: dict[int, Log], from_offsets: dict[int, int],
            description: str, options: MaterializerOptions) -> int:
    """:func:`rebuild_store_from_logs` into ``store``, with its progress in the stats
    (``replay_target_offsets`` / ``replay_done_offsets``) and on a progress bar (``progress``
    option: by default only when stderr is a terminal). Returns the records applied."""
    stats = context.stats
    target = sum(max(0, log.log_end_offset - from_offsets[p]) for p, log in logs.items())
    stats.replay_target_offsets += target
    bar = progress_bar(options.progress, total=target, unit="offsets", desc=f"{context.topic}: {description}")

    def advanced(offsets: int) -> None:
        stats.replay_done_offsets += offsets
        bar.update(offsets)

    try:
        return rebuild_store_from_logs(store, logs, from_offsets, keep=context.applier.check, on_progress=advanced)
    finally:
        bar.close()
