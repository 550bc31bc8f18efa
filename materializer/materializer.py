"""The Materializer: Kafka topic -> local Kafka-format log per partition -> RocksDB key -> latest value.

A :class:`Materializer` composes (the route of a record goes one way)::

    ingest/ (fetch path) ──▶ storage/ (Log.append, fsync) ──▶ apply/ (StoreApplier) ──▶ RocksDB

* :class:`~materializer.session.Session` (built by :meth:`Materializer.start`): the clients, the
  topic's logs, the store, the applier and the fetch path of one start, opened in Kafka's order
  (topic id compared, logs recovered and aligned with the leader, store reconciled) and closed together.
* the fetch path (:mod:`materializer.ingest`): the replica path (the leader's batches appended
  verbatim, the store applied from the log by the apply worker thread) or the consumer path
  (records through confluent-kafka, local batches rebuilt); both follow the leader's truth (topic
  ids, leader epochs, log start offsets) as a Kafka follower does.
* the applier (:mod:`materializer.apply`): the store's one writer.
* the background cleaning (:class:`~materializer.background_cleaning.BackgroundCleaning`): the
  log cleaner threads of a compacted topic; :class:`~materializer.broker_outage.BrokerOutage`: a
  cluster that is away and the backoff of the retries.
* :class:`~materializer.health.RunHeartbeat`: when the run loop last made progress (liveness);
  :class:`~materializer.group_commit.GroupCommitter` (``commit_group``): the applied offsets
  committed to a consumer group for lag tools, never read back.
* this class: the lifecycle, the data dir's lock, the run loop (a broker that is away, a topic
  re-created or deleted, damage found while running), retention, readiness and health for services.

Invariants:
    * The store never runs ahead of the log: a record reaches the store only after the batch
      holding it was appended and fsynced, so ``store next offset <= log end offset``.
    * Nothing the local log holds is fetched again: fetching resumes at each log's end offset.
    * On start the store is reconciled with the logs: missing or damaged -> rebuilt from the
      logs (records from the log start offset; tombstones delete); behind a log -> the log's
      tail is replayed; ahead of a log (the log lost data) -> that partition rebuilt from its log.
    * The store holds what a ``read_committed`` consumer reads from the topic now: on the replica
      path it stops at each log's last stable offset (an open transaction holds later records
      back) and aborted data, kept in the log as the broker keeps it, is never applied; a key whose
      latest record fell below a log start offset (retention, DeleteRecords) is dropped.
    * The materializer reports itself caught up (ready) only once the apply worker has applied
      everything, the broker answers and the topic is the one the logs hold.

Records with a null key are appended to the log (the cleaner drops them on a compacted topic)
but cannot be materialized; they are counted in ``MaterializerStats.null_key_records``.

One data directory may hold several topics, and is written by one process at a time: :meth:`start`
takes its lock first (:class:`~materializer.datadir.lock.DataDirLock`, Kafka ``LogManager.lockLogDirs``),
before anything is written, and :meth:`close` releases it; a second writer fails at once naming
this one. While the store is created empty, rebuilt or rewound, the topic's completeness marker
says so (readers in other processes refuse the topic rather than serve part of it) until the run
is caught up again.

Background cleaning and retention while :meth:`Materializer.run` ingests (Kafka ``LogManager``)::

    run loop (this thread)           fetch ─▶ append (Log.lock) ─▶ flush ─▶ store apply
                                     every retention_check_interval_ms: delete_old_segments
    kafka-log-cleaner-thread-N       grab filthiest log ─▶ Cleaner round (non-active segments
                                     only) ─▶ swap in .cleaned segments (Log.lock) ─▶ DIR/
                                     cleaner-offset-checkpoint ─▶ retention of compacted logs

* The :class:`~materializer.storage.log_cleaner.LogCleaner` runs ``cleaner_threads`` threads
  on a topic whose ``cleanup.policy`` contains ``compact``; it starts when ``run`` starts (after
  the logs are opened and the store reconciled) and is shut down - rounds in progress aborted,
  their ``.cleaned`` files removed - before ``run`` returns, also on Ctrl-C or an error. A corrupt
  batch it finds heals the log while the run goes on.
* Cleaning never touches the active segment, the only one appends write to; it reads
  non-active segments without ``Log.lock`` and swaps cleaned segments in under it.
* Retention (:func:`~materializer.storage.retention.delete_old_segments`: ``retention.ms``,
  ``retention.bytes``, log start offset) runs from the run loop every
  ``retention_check_interval_ms`` (first after ``min(interval, 30 s)``, Kafka's
  ``log.initial.task.delay.ms``) - except on a compacted topic with the cleaner running, whose
  threads apply it after each cleaning attempt, as Kafka's do. Cleaning keeps the latest record
  of every key, so the store is unaffected; retention raises the log start offset, and the store
  drops the keys whose latest record fell below it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import signal
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

from materializer.adapters.avro_serde import schema_registry_client
from materializer.adapters.errors import (
    BrokerUnreachableError,
    GroupMembershipError,
    KafkaSourceError,
    StoreError,
    TopicIdChangedError,
    TopicNotFoundError,
)
from materializer.adapters.group_members import GroupMembersClient
from materializer.adapters.partition_owner import PartitionOwner
from materializer.adapters.group_membership import GroupMembership
from materializer.adapters.kafka_source import KafkaSource
from materializer.adapters.replica_fetch import ReplicaFetcher
from materializer.adapters.rocksdb_store import StateStore
from materializer.adapters.serdes import Serde, make_serde
from materializer.apply.applier import FormatCheck, UpdateCallback
from materializer.background_cleaning import BackgroundCleaning
from materializer.broker_outage import BrokerOutage
from materializer.config import MaterializerOptions
from materializer.datadir.layout import topic_status_path
from materializer.datadir.lock import DataDirLock
from materializer.group_assignment import AssignmentChanges
from materializer.group_commit import GroupCommitter
from materializer.health import RunHeartbeat
from materializer.kept_partitions import expired, kept_partitions, mark_released
from materializer.partition_availability import unavailable_in
from materializer.ingest.appender import LogTruncation
from materializer.progress import NoProgress, progress_bar, show_progress
from materializer.run_lease import RunLease
from materializer.session import Session, StoreMarker
from materializer.stats import MaterializerHealth, MaterializerStats
from materializer.storage.errors import CorruptRecordError
from materializer.storage.files import offset_from_file_name
from materializer.storage.log import Log
from materializer.storage.log_cleaner import LogCleaner
from materializer.storage.log_config import LogConfig
from materializer.storage.partition_metadata import topic_id_to_string
from materializer.storage.retention import delete_old_segments
from materializer.datadir.identity import drop_local_copy
from materializer.partitioner_detection import KeyRouting, PartitionerDetection, PartitionerMismatchError
from materializer.view import MaterializedView, ServedPartitions

__all__ = ["DEFAULT_STATISTICS_INTERVAL_MS", "Materializer"]

logger = logging.getLogger(__name__)

#: Kafka ``log.initial.task.delay.ms``: the longest wait before the first retention check, ms.
_INITIAL_TASK_DELAY_MS = 30_000

#: How often the run loop copies the client's cached high watermarks into the stats, seconds.
_WATERMARK_REFRESH_S = 1.0

#: The longest a continuous run goes without reading the topic's partitions, seconds (the default
#: consumer heartbeat interval of a KIP-848 group, at which members learn the group's assignment
#: after partitions are added): added partitions are taken on (and readiness waits for them)
#: within seconds, not at the next ``metadata_refresh_interval_ms``. Readers route keys by this
#: count: a member still on the old count after producers moved to the new one would route a key
#: to its old partition. One metadata request per topic; none while the cluster is away.
_PARTITION_PROBE_S = 5.0

#: Failures :meth:`Materializer.run` goes on from (``Materializer._recover``).
_RECOVERABLE = (BrokerUnreachableError, TopicIdChangedError, TopicNotFoundError, CorruptRecordError)


#: Pause before asking again for an assigned partition whose leader is not known yet, seconds.
_LEADER_RETRY_S = 0.1

#: Group mode: how often the run loop samples the keys of partitions grown since their last sample
#: (the producers' partitioner, :mod:`materializer.partitioner_detection`), seconds.
_ROUTING_SAMPLE_S = 2.0


class _Every:
    """A periodic task of the run loop: :meth:`due` is True once per ``interval_s`` seconds (the
    first time after ``first_s``)."""

    def __init__(self, interval_s: float, now: float, first_s: float | None = None) -> None:
        self.interval_s = interval_s
        self.next = now + (interval_s if first_s is None else first_s)

    def due(self, now: float) -> bool:
        if now < self.next:
            return False
        self.next = now + self.interval_s
        return True


@dataclass
class _RunTimers:
    """The run loop's periodic tasks: retention (Kafka ``log.retention.check.interval.ms``, first
    after ``log.initial.task.delay.ms``), the metadata refresh (new partitions), the consumer
    path's high watermark refresh, and in group mode the expiry of kept partitions (as often as
    retention, or every ``revoked_retention_ms`` when shorter) and the samples of the keys that tell
    the producers' partitioner."""

    retention: _Every
    metadata: _Every
    watermarks: _Every
    kept: _Every
    routing: _Every

    @classmethod
    def starting(cls, options: MaterializerOptions, now: float) -> _RunTimers:
        retention_s = options.retention_check_interval_ms / 1000.0
        kept_s = retention_s if options.revoked_retention_ms <= 0 else min(retention_s, options.revoked_retention_ms / 1000.0)
        return cls(retention=_Every(retention_s, now, first_s=min(retention_s, _INITIAL_TASK_DELAY_MS / 1000.0)),
                   metadata=_Every(min(options.metadata_refresh_interval_ms / 1000.0, _PARTITION_PROBE_S), now),
                   watermarks=_Every(_WATERMARK_REFRESH_S, now),
                   kept=_Every(kept_s, now, first_s=min(kept_s, _INITIAL_TASK_DELAY_MS / 1000.0)),
                   routing=_Every(_ROUTING_SAMPLE_S, now))

#: librdkafka ``statistics.interval.ms`` asked for when a statistics callback is registered, ms.
DEFAULT_STATISTICS_INTERVAL_MS = 5_000

#: ``on_assign`` / ``on_revoke`` callback: the partitions (of the materializer's topic) just opened / closed.
PartitionsCallback = Callable[[frozenset[int]], None]


class Materializer:
    """Mirror ``topic`` into ``data_dir`` (broker-style partition folders) and materialize it.

    Args:
        bootstrap_servers: ``host:port[,host:port]`` of the Kafka cluster.
        topic: topic to mirror.
        data_dir: the data directory (layout in :mod:`materializer.datadir.layout`).
        options: fetch/write/store options (key/value formats and the Schema Registry among them).
        schema_registry: a ``SchemaRegistryClient`` for ``avro`` formats (default: one for
            ``options.schema_registry_url``).
        group_id: shortcut for ``options.group_id``: join this consumer group and materialize only
            the partitions it assigns (see "Group mode" below).

    Group mode (``group_id``; Kafka Streams' KTable instances splitting a topic): :meth:`start`
    joins the group (:class:`~materializer.adapters.group_membership.GroupMembership`, KIP-848 or
    classic cooperative-sticky) and waits for the first assignment (``group_join_timeout_ms``; an
    empty one is legal), then opens only the assigned partitions. While :meth:`run` runs, each
    rebalance is applied between two fetches: revoked partitions are closed (:meth:`close_partitions`),
    assigned ones opened (:meth:`open_partitions`; a folder kept from an earlier assignment fetches
    only the delta), then the :meth:`on_assign` / :meth:`on_revoke` callbacks run on the run
    loop's thread. Readiness means every assigned partition caught up (it drops on an assignment
    that adds partitions). :meth:`view` serves assigned partitions only and raises
    :class:`~materializer.adapters.errors.PartitionNotAssignedError` for a key another member holds.
    :meth:`close` leaves the group first, so the others take over while this one flushes. The
    folders (and store entries) of unassigned partitions are kept, never opened, until the
    partition is assigned here again or they expire (``options.revoked_retention_ms`` /
    ``revoked_retention_bytes``: :meth:`expire_kept_partitions`). Nothing is committed to the group.

    Use as a context manager (``start`` on enter, ``close`` on exit) or call :meth:`start`,
    :meth:`run` and :meth:`close`. Between them it holds the data dir's lock, naming it
    ``materializer <lock_command>`` (``run``; set :attr:`lock_command` before :meth:`start` to
    name another command). Not thread-safe except :meth:`stop`, :attr:`health` and
    :meth:`wait_until_caught_up` (a service calls them while :meth:`run_in_background` ingests).

    While :meth:`run` runs, a background :class:`LogCleaner` compacts the logs of a compacted
    topic and retention deletes old segments (see the module docstring); the store drops the keys
    whose latest record retention deleted, as a consumer reading the topic now would not see them.

    Raises (start/run):
        DataDirLockedError: another process writes ``data_dir`` (named in the message).
        KafkaSourceError: the cluster or topic cannot be read.
        TopicIdChangedError: the local copy is another topic's and ``on_topic_recreated="fail"``.
        StoreLockedError / StoreError: the state store cannot be opened or written.
        StorageError: a local log cannot be opened or appended.
        ValueError: an invalid topic config or override.
        DeserializationError: a record does not decode in the configured key/value format
            (``on_bad_record="fail"``); it names the partition and offset.
        SchemaRegistryError: the Schema Registry cannot be reached.
        GroupMembershipError: group mode: the member cannot join the group (a KafkaSourceError; no
            bootstrap server accepting connections is a BrokerUnreachableError, which a continuous
            run waits out), or the membership ended with a fatal error while running.
        ValueError: ``group_id`` equals ``options.commit_group`` (at construction).
    """

    def __init__(self, bootstrap_servers: str, topic: str, data_dir: Path | str, *,
                 options: MaterializerOptions | None = None, schema_registry: Any = None,
                 group_id: str | None = None) -> None:
        self.bootstrap_servers = bootstrap_servers
        self.topic = topic
        self.data_dir = Path(data_dir)
        self.options = options or MaterializerOptions()
        if group_id is not None:
            self.options = dataclasses.replace(self.options, group_id=group_id)  # validated again
        self.stats = MaterializerStats()
        self.lock_command = "run"
        #: The terminal line of run's progress bar (tqdm ``position``): a TopicSet gives each topic its own.
        self.progress_position = 0
        self.key_serde, self.value_serde = self._serdes(schema_registry)
        self._session: Session | None = None
        self._data_dir_lock: DataDirLock | None = None
        self._owns_data_dir_lock = True  # False once share_data_dir_lock handed in a TopicSet's
        self._stop_requested = threading.Event()
        #: The signal (SIGINT, SIGTERM) that made :meth:`run` stop after its batch, else None.
        self.stopped_by_signal: int | None = None
        self._cleaning = BackgroundCleaning(self.data_dir, topic, self.options, self.stats)
        self._outage = BrokerOutage(bootstrap_servers, self._stop_requested)
        self._caught_up = threading.Event()
        self._running = False
        #: the last run() was bounded (until_caught_up): its share stays served after close
        self._bounded = False
        self._failure: BaseException | None = None
        self._thread: threading.Thread | None = None
        self._update_callbacks: list[UpdateCallback] = []
        self._statistics_callbacks: list[Callable[[str], None]] = []
        self._statistics_interval_ms = DEFAULT_STATISTICS_INTERVAL_MS
        self._caught_partitions: set[int] = set()
        self._progress: Any = NoProgress()  # run's progress bar (tqdm, or NoProgress when off)
        self._topic_missing = False
        self._heartbeat = RunHeartbeat()  # the run loop's progress, for liveness (materializer.health)
        self._lease: RunLease | None = None  # how current the store is, for readers (materializer.datadir.lease)
        self._group_commit = (GroupCommitter(bootstrap_servers, topic, self.options, self.stats)
                              if self.options.commit_group is not None else None)
        self._check = (FormatCheck(self.key_serde, self.value_serde, self.options.on_bad_record, self.stats)
                       if "bytes" != self.options.key_format or "bytes" != self.options.value_format else None)
        # Group mode: the membership (created by start, closed first by close), the assignment its
        # callbacks record, the version of it the run loop applied, and the partitions served.
        self._membership: GroupMembership | None = None
        self._owns_membership = True  # False once share_membership handed in a TopicSet's
        self._group = (AssignmentChanges(topic, wake=self._wake_ingest)
                       if self.options.group_id is not None else None)
        self._applied_version = 0
        self._served: frozenset[int] = frozenset()  # the open partitions, replaced (never mutated) for other threads
        # group mode: the open partitions caught up (readers serve these only), replaced likewise
        self._queryable: frozenset[int] = frozenset()
        # group mode: the producers' partitioner, from samples of the store's keys (_sample_routing)
        self._detection = PartitionerDetection(self.options.partitioner)
        self.stats.group_partitioner_candidates = len(self._detection.routing(0).families)
        self._routing_logged: KeyRouting | None = None
        self._members_client: GroupMembersClient | None = None  # made on the first refused read (_group_owners)
        self._members_lock = threading.Lock()
        self._assign_callbacks: list[PartitionsCallback] = []
        self._revoke_callbacks: list[PartitionsCallback] = []

    def _serdes(self, registry: Any) -> tuple[Serde, Serde]:
        options = self.options
        if registry is None and "avro" in (options.key_format, options.value_format) and options.schema_registry_url:
            registry = schema_registry_client(options.schema_registry_url, options.schema_registry_config)
        return (make_serde(options.key_format, topic=self.topic, field="key", schema_registry=registry),
                make_serde(options.value_format, topic=self.topic, field="value", schema_registry=registry))

    # -- what a started materializer holds (None before start and after close) ----------------

    @property
    def store(self) -> StateStore | None:
        """The state store."""
        return None if self._session is None else self._session.store

    @property
    def logs(self) -> dict[int, Log]:
        """Partition -> open local log (empty before start)."""
        return {} if self._session is None else self._session.logs

    @property
    def source(self) -> KafkaSource | None:
        """The confluent-kafka client of the consumer path (metadata, watermarks, configs, records);
        None before start and on the replica path once started (its fetcher asks those itself)."""
        return None if self._session is None else self._session.source

    @property
    def fetcher(self) -> ReplicaFetcher | None:
        """The replica path's Fetch API client (None on the consumer path)."""
        return None if self._session is None else self._session.fetcher

    @property
    def log_config(self) -> LogConfig | None:
        """The local logs' topic configuration."""
        return None if self._session is None else self._session.log_config

    @property
    def topic_id(self) -> uuid.UUID | None:
        """The topic's id in the cluster (KIP-516), read on start."""
        return None if self._session is None else self._session.topic_id

    # -- lifecycle ---------------------------------------------------------------------------

    def __enter__(self) -> "Materializer":
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def view(self, *, max_staleness_ms: int | None = None) -> MaterializedView:
        """Typed reads of this materializer's store through its key/value formats (:mod:`materializer.view`).

        The view reads the writer's store directly (every applied batch at once) and is valid
        until :meth:`close`. In group mode it serves the partitions assigned here that have caught
        up only (:meth:`served_partitions`, read on every call) and routes a key to its partition
        by the producers' partitioner (``options.partitioner``, or the one found from the data:
        :meth:`key_routing`); a key of another member's partition, or of one assigned here that is
        still catching up, raises :class:`~materializer.adapters.errors.PartitionNotAssignedError`,
        naming the member that holds it (one DescribeConsumerGroups per refusal) (:class:`ServedPartitions`).
        Its :attr:`~MaterializedView.staleness` is this run's own record of how current the store is
        (the lease it renews, :mod:`materializer.datadir.lease`), which ages while the run cannot make
        progress; ``max_staleness_ms`` refuses reads past it.

        Raises:
            StoreError: not started.
        """
        store = self.store
        if store is None:
            raise StoreError(f"{self!r} is not started: no store to view")
        served = None
        if self._group is not None:
            assert self.options.group_id is not None
            served = ServedPartitions(self.topic, self.options.group_id, self.served_partitions,
                                      self._partition_count, self.key_routing,
                                      assigned=self.assigned_partitions, owners=self._group_owners)
        lease = self._lease
        staleness = None if lease is None else (lambda: lease.staleness(None if served is None else served.partitions()))
        return MaterializedView(store, key_serde=self.key_serde, value_serde=self.value_serde, served=served,
                                staleness=staleness, max_staleness_ms=max_staleness_ms)

    def assigned_partitions(self) -> frozenset[int]:
        """Group mode: the partitions this member holds now: open here and still assigned (a revoked
        partition leaves at once, before the run loop closes it); it serves those of them that
        have caught up (:meth:`served_partitions`). Without a group: every open partition.
        Thread-safe."""
        if self._group is None:
            return self._served
        return self._served & self._group.partitions

    def served_partitions(self) -> frozenset[int]:
        """Group mode: the partitions reads are answered from now: assigned here (as
        :meth:`assigned_partitions`) and caught up since they were opened, i.e. the store holds
        their records up to the high watermark read when they were opened. A partition assigned
        here is not served while it catches up: its kept entries (from an earlier assignment) or
        its missing ones are older than what its previous owner served, as Kafka Streams does
        not query a restoring task's store. Without a group: every open partition. Thread-safe."""
        if self._group is None:
            return self._served
        return self._queryable & self._group.partitions

    def _partition_count(self) -> int:
        session = self._session
        return 0 if session is None else session.partition_count

    def key_routing(self) -> KeyRouting:
        """Group mode: how reads route a key to its partition now: ``options.partitioner``, or the
        partitioners the keys sampled so far fit (:mod:`materializer.partitioner_detection`; every
        partitioner while not started, the partition count being unknown). Thread-safe (an
        immutable snapshot)."""
        return self._detection.routing(self._partition_count())

    def _group_owners(self) -> Mapping[int, PartitionOwner]:
        """Group mode, for a refused read: ``partition -> member`` of the group now (one
        DescribeConsumerGroups; the admin client is made at the first call and kept).

        Raises:
            KafkaSourceError: the group cannot be described.
        """
        assert self.options.group_id is not None
        with self._members_lock:
            if self._members_client is None:
                self._members_client = GroupMembersClient(self.bootstrap_servers, self.options.client_config,
                                                          timeout_s=self.options.request_timeout_ms / 1000.0)
            client = self._members_client
        return client.partition_owners(self.options.group_id, self.topic)

    def start(self) -> None:
        """Take the data dir's lock, then open the session (:meth:`Session.open`: topic metadata and
        configs, the topic id compared, the store and the logs opened and reconciled, the fetch path
        started). A start again (after the topic was re-created) keeps the lock it holds.

        Raises:
            what :class:`Materializer` lists for start.
        """
        if self._session is not None:
            return
        created = not self.data_dir.exists()
        held = self._data_dir_lock is not None
        try:
            if self._data_dir_lock is None:  # before anything is written
                self._data_dir_lock = DataDirLock.acquire(self.data_dir, self.lock_command)
            if self._group is not None and not held:
                # what the previous run served goes stale once the group moves it: not served until
                # caught up (a TopicSet, which hands its lock in, withdraws every topic itself)
                StoreMarker(self.data_dir, self.topic, self.lock_command).withdraw(self.options.group_id or "")
            assigned = self._join_group() if self._group is not None else None
            self._session = Session.open(
                self.bootstrap_servers, self.topic, self.data_dir, self.options, stats=self.stats,
                marker=StoreMarker(self.data_dir, self.topic, self.lock_command), check=self._check,
                callbacks=self._update_callbacks, stop_requested=self._stop_requested,
                statistics_callback=self._on_client_statistics if self._statistics_callbacks else None,
                statistics_interval_ms=self._statistics_interval_ms, partitions=assigned)
            self._detection = PartitionerDetection(self.options.partitioner)  # this store's samples only
            if self._lease is None:  # this lock holder's
                self._lease = RunLease.for_run(self.data_dir, self.topic, self._data_dir_lock.holder, self.options,
                                               self._membership)
            self._serve(self._session)
        except BaseException:
            if not held:
                self.leave_group()
                try:  # a session _serve failed on is still open: closed while the lock is held
                    self._close_session()
                except Exception:  # noqa: BLE001 - the start's own error is the one raised
                    logger.warning("closing %s's session after a failed start failed", self.topic, exc_info=True)
                finally:
                    self._release_data_dir()
            if created:  # a run that failed at once (no broker, unknown topic) leaves no empty data dir
                with contextlib.suppress(OSError):
                    os.rmdir(self.data_dir)
            raise

    def _join_group(self) -> frozenset[int]:
        """Group mode: join the group (once; a start again after a re-created topic keeps the
        membership) and wait up to ``group_join_timeout_ms`` for the first assignment. Returns the
        assigned partitions, which the run loop counts as applied.

        Raises:
            GroupMembershipError: the member cannot be created or the membership failed.
        """
        options, group_id = self.options, self.options.group_id
        assert self._group is not None and group_id is not None
        if self._membership is None:
            joined = self._group.join()
            try:
                self._membership = GroupMembership(
                    self.bootstrap_servers, group_id, [self.topic], protocol=options.group_protocol,
                    session_timeout_ms=options.group_session_timeout_ms, options=options.source_options(),
                    group_instance_id=options.group_instance_id, client_id=f"kafka-materializer-{self.topic}", on_assign=self._group.assign,
                    on_revoke=self._group.revoke, on_lost=self._group.revoke)
            except GroupMembershipError as exc:
                if not self._outage.bootstrap_answers():  # a continuous run waits for the broker
                    raise BrokerUnreachableError(f"cannot join group {group_id!r}: {exc}") from exc
                raise
            timeout_s = options.group_join_timeout_ms / 1000.0
            deadline = time.monotonic() + timeout_s
            # in slices: a membership that ends (a fatal error from the coordinator) fails the start at once
            while not self._group.wait(joined, max(0.0, min(0.5, deadline - time.monotonic()))):
                membership = self._membership
                if not membership.running and membership.error is not None:
                    raise membership.error
                if time.monotonic() >= deadline:
                    logger.warning("group %r: no partition of %s assigned within %g s (member %s%s); starting with "
                                   "none", options.group_id, self.topic, timeout_s, membership.member_id,
                                   f", {membership.error}" if membership.error is not None else "")
                    break
        version, assigned = self._group.target()
        self._applied_version = version
        return assigned

    def waiting_for_broker(self, failure: BaseException | None) -> None:
        """A caller waits for the cluster on this materializer's behalf before :meth:`run` starts it
        (a :class:`~materializer.topic_set.TopicSet` joining its group): liveness counts the wait
        as progress, as the run's own waits, and :attr:`health` says whether the cluster answers
        (``failure``: why it does not; None: it answered). No log line: the caller logs."""
        self._heartbeat.beat()
        self._outage.mark(away=failure is not None)

    @property
    def assignment(self) -> AssignmentChanges | None:
        """Group mode: the assignment the membership's callbacks record for this topic (the run loop
        applies it), else None."""
        return self._group

    def share_data_dir_lock(self, lock: DataDirLock) -> None:
        """Several materializers on one data dir in this process (:class:`~materializer.topic_set.TopicSet`):
        use ``lock``, held by the caller, instead of taking it in :meth:`start`; :meth:`close`
        leaves it held. In group mode the caller also withdraws what the topic's marker served
        before it joins (:meth:`StoreMarker.withdraw`), as :meth:`start` does with its own lock.
        Call before :meth:`start`.

        Raises:
            RuntimeError: already started, or holding a lock of its own.
        """
        if self._session is not None or self._data_dir_lock is not None:
            raise RuntimeError(f"{self!r} already holds the lock of {self.data_dir}")
        self._data_dir_lock, self._owns_data_dir_lock = lock, False

    def share_membership(self, membership: GroupMembership) -> None:
        """Group mode with several topics in one process (:class:`~materializer.topic_set.TopicSet`):
        take part in ``membership``, owned by the caller, instead of joining the group in
        :meth:`start`. The caller feeds :attr:`assignment` from the membership's callbacks (after
        :meth:`AssignmentChanges.join`), waits for the first assignment, and closes the membership
        itself; :meth:`close` only stops recording changes. Call before :meth:`start`.

        Raises:
            RuntimeError: not in group mode, or already started or joined.
        """
        if self._group is None:
            raise RuntimeError(f"{self!r} is not in group mode: no membership to share")
        if self._session is not None or self._membership is not None:
            raise RuntimeError(f"{self!r} has already joined its group")
        self._membership, self._owns_membership = membership, False

    def leave_group(self) -> None:
        """Group mode: leave the group now (:meth:`close` does it first); revocations from here on
        are not applied, as the session closes next, and nothing is served any more: the other
        members take these partitions over, so :meth:`close` withdraws them from the topic's marker
        too (readers in other processes then refuse their keys, naming the partition, rather than
        serve values the new owners have moved past). A shared membership (:meth:`share_membership`)
        is only let go of: its owner closes it. Idempotent; a no-op outside group mode."""
        membership, self._membership = self._membership, None
        if membership is not None:
            assert self._group is not None
            self._group.leave()
            owned, self._owns_membership = self._owns_membership, True
            if owned:
                membership.close()

    def _serve(self, session: Session) -> None:
        """The open partitions are the served ones; in group mode those caught up since they were
        opened only (:meth:`served_partitions`), for this process's view and for readers in other
        processes (:meth:`StoreMarker.serve`)."""
        self._served = frozenset(session.logs)
        if self._group is not None and self.options.group_id is not None:
            # leaving: the others take the partitions over; nothing is published as served again
            self._queryable = frozenset() if self._group.leaving else self._served & frozenset(self._caught_partitions)
            lock = self._data_dir_lock
            self._detection.saw_partition_count(session.partition_count)  # a count that grew: keys under the old one
            if self._lease is not None and self._queryable and not self._bounded:
                # readers serve a member's partitions by its lease: renewed before the marker names them
                self._lease.observe(session, away=self._away(), continuous=True, force=True)
            session.marker.serve(self.options.group_id, self._queryable, session.partition_count,
                                 self._detection.routing(session.partition_count),
                                 held_by=lock.holder if lock is not None and not self._bounded else None)

    def _serve_caught_up(self, session: Session) -> None:
        """Group mode: serve the open partitions that have caught up since the last call, once the
        store holds what was fetched of them (the apply worker drained), with the keys they hold
        sampled first (:meth:`_sample_routing`), so their marker routes by them."""
        if self._group is not None and (session.logs.keys() & self._caught_partitions) - self._queryable:
            session.applier.drain()
            self._sample_routing(session, serve=False)
            self._serve(session)

    def _sample_routing(self, session: Session, *, serve: bool = True) -> None:
        """Group mode: sample the keys of the store's partitions (served, catching up or kept) that
        are due (:meth:`PartitionerDetection.sample`: new, or grown twice over), so that reads route
        by the producers' partitioner; the marker follows (``serve``), and so do the metrics
        ``materializer_group_partitioner_candidates`` and ``materializer_group_misrouted_partitions``.

        Raises:
            PartitionerMismatchError: ``options.partitioner`` does not place a sampled key where it
                is: reads would answer "absent" for keys the topic holds.
        """
        detection, count = self._detection, session.partition_count
        if not detection.sample(session.store):
            return
        problem = detection.contradiction(count)
        if problem is not None:
            raise PartitionerMismatchError(f"group {self.options.group_id!r}, topic {self.topic!r}: {problem}")
        routing = detection.routing(count)
        misrouted = detection.unplaced(count) & set(session.logs)
        self.stats.group_misrouted_partitions.intersection_update(misrouted)
        self.stats.group_misrouted_partitions.update(misrouted)
        self.stats.group_partitioner_candidates = len(routing.families)
        if routing != self._routing_logged:
            self._routing_logged = routing
            log = logger.warning if not routing.candidates else logger.info
            log("group %r, topic %r: reads route keys by %s (%d keys sampled)", self.options.group_id, self.topic,
                routing.describe(), detection.sampled_keys)
        if serve:
            self._serve(session)

    def _wake_ingest(self) -> None:
        """The membership's thread after a rebalance: cut a fetch waiting for records short."""
        session = self._session
        if session is not None and self._running:
            session.ingest.wakeup()

    def stop(self) -> None:
        """Ask :meth:`run` to return after the batch in progress (thread- and signal-safe); a fetch
        waiting for a broker that does not answer is given up at once."""
        self._stop_requested.set()
        session = self._session
        if session is not None:
            session.ingest.wakeup()

    def close(self) -> None:
        """Stop the background cleaner, close the session (logs flushed with their checkpoints and the
        clean-shutdown marker, the store, the clients) and release the data dir. Idempotent.

        A :meth:`run_in_background` thread is stopped and joined first (it finishes its batch). In
        group mode the member leaves the group before anything else, so the other members take its
        partitions over while this one flushes.
        """
        self.leave_group()
        thread = self._thread
        if thread is not None and thread.is_alive() and thread is not threading.current_thread():
            self.stop()
            thread.join()
        try:
            self._close_session()
        finally:
            if self._group_commit is not None:
                self._group_commit.close()
            self._release_data_dir()

    def _close_session(self) -> None:
        """Close what :meth:`start` opened; the data dir stays owned. In group mode, after a
        continuous run, the marker first stops naming any partition as served (:meth:`leave_group`;
        a bounded run's share stays readable as of its end, as a bounded run's topic does)."""
        self._cleaning.stop()
        self._served = self._queryable = frozenset()
        session, self._session = self._session, None
        if session is None:
            return
        try:
            if self._group is not None and self.options.group_id is not None and not self._bounded:
                self._withdraw_served(session)
        finally:  # a second Ctrl-C during the withdraw still closes the logs and the store
            held = [log.dir for log in session.logs.values()] if self._group is not None else []
            session.close()
            mark_released(held)  # a member that stops lets its partitions go now

    def _withdraw_served(self, session: Session) -> None:
        """Group mode, closing after a continuous run: the marker names no partition as served any
        more (the other members take them over); a failure to write it is logged, not raised."""
        assert self.options.group_id is not None
        try:
            session.marker.serve(self.options.group_id, (), session.partition_count,
                                 self._detection.routing(session.partition_count))
        except OSError as exc:
            logger.error("group %r: cannot withdraw the partitions %s served from %s (%s): readers on this host "
                         "refuse them once this process has let the data dir go; readers on other hosts go on "
                         "serving them although other members hold them now", self.options.group_id,
                         session.marker.group.get("partitions") if session.marker.group else [],
                         topic_status_path(self.data_dir, self.topic), exc)

    def _release_data_dir(self) -> None:
        lock, self._data_dir_lock = self._data_dir_lock, None
        self._lease = None  # the lease names the lock's holder: a start again takes a new one
        owned, self._owns_data_dir_lock = self._owns_data_dir_lock, True
        if lock is not None and owned:  # last: nothing of this materializer writes the data dir any more
            lock.release()  # (a shared one is the caller's: a TopicSet releases it after every topic closed)

    def _live(self) -> Session:
        """The session of a started materializer.

        Raises:
            StoreError: not started.
        """
        if self._session is None:
            raise StoreError(f"{self!r} is not started")
        return self._session

    # -- running -----------------------------------------------------------------------------

    def caught_up_partitions(self) -> set[int]:
        """Partitions whose fetch position reached the high watermark seen at start."""
        return self._live().ingest.caught_up()

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
        materialized again from scratch (``on_topic_recreated``). Damage a cleaner thread or the
        apply worker finds in a local log is healed while it runs.

        Raises:
            BrokerUnreachableError: with ``until_caught_up``, the broker did not answer for
                ``broker_timeout_ms``.
            TopicIdChangedError: with ``until_caught_up`` the topic was deleted; or it was re-created
                and ``on_topic_recreated="fail"``.
            (and what :meth:`start` raises)
        """
        started = time.monotonic()
        previous_handlers = self._install_signal_handlers()
        self._bounded = until_caught_up
        timers = _RunTimers.starting(self.options, started)
        self._running = True
        try:
            if self._session is not None:  # served for good (a bounded run's share) or while this process runs
                self._serve(self._session)
            first = True
            while not self._stop_requested.is_set():
                self._heartbeat.beat()
                if first or self._session is None:
                    # The first round, or a start again after the topic's local copy was dropped.
                    if not self._begin(until_caught_up, wait_for_topic=not first):
                        break  # stopped while the broker (or the topic) was away
                    first = False
                for partition, damage in sorted(self._cleaning.take_damage().items()):
                    if partition in self.logs:
                        self._heal(partition, damage)
                try:
                    self._apply_assignment()
                    if self._step(until_caught_up, timers):
                        break  # caught up
                except _RECOVERABLE as exc:
                    self._recover(exc, until_caught_up)
            if self._session is not None:
                self._session.applier.drain()  # stopped or caught up: nothing fsynced is left unapplied
        except BaseException as exc:
            self._failure = exc
            raise
        finally:
            self._end_run(previous_handlers, started)
        return self.stats

    def _begin(self, until_caught_up: bool, wait_for_topic: bool) -> bool:
        """Start (or start again) for :meth:`run`: the session, the cleaner threads, a progress bar
        and the partitions already caught up. False when stopped while waiting."""
        if not self._start_for_run(until_caught_up, wait_for_topic=wait_for_topic):
            return False
        self._start_cleaning()
        self.expire_kept_partitions()  # folders kept from earlier runs may be due already
        self._progress.close()
        self._progress = self._progress_bar()
        self._caught_partitions = self._live().ingest.caught_up()
        return True

    def _apply_assignment(self) -> None:
        """Group mode: apply the rebalances recorded since the last call (:class:`AssignmentChanges`):
        close the revoked partitions, open the assigned ones, then call the :meth:`on_revoke` and
        :meth:`on_assign` callbacks. A change that fails half-way is completed by the next call; so
        is an assigned partition whose leader is not known yet (it is asked for again 100 ms later,
        as a Kafka consumer retries after ``retry.backoff.ms``)."""
        group, session = self._group, self._session
        if group is None or session is None:
            return
        membership = self._membership
        if membership is not None and not membership.running:
            # The group gives this member's partitions to others now: serving them on would go stale.
            raise membership.error or GroupMembershipError(
                f"group {self.options.group_id!r}: the membership ended", group=self.options.group_id or "", fatal=True)
        version, target = group.target()
        if version == self._applied_version:
            return
        # Revocations first, and with no request: a member cut off from the cluster must still stop
        # serving what the group took away.
        closed = self.close_partitions(set(session.logs) - target)
        if closed:
            self.expire_kept_partitions()  # a bound of 0 ms, or bytes now exceeded, acts at once
        if target - set(session.logs):
            # Readers route keys by the partition count the marker records: the assignment may
            # already cover partitions added since the last metadata refresh, and routing by the
            # old count would send a key produced to a new partition to its old one (a stale value).
            session.refresh_partition_count()
        opened = self._took_on(session, session.open_partitions(target - set(session.logs), defer_leaderless=True))
        if set(session.logs) != target:  # leaderless: left for the next round
            self._stop_requested.wait(_LEADER_RETRY_S)
        else:
            self._applied_version = version
            self.stats.group_rebalances += 1
        logger.info("group %r: materializing partitions %s of %s (closed %s, opened %s)", self.options.group_id,
                    sorted(session.logs), self.topic, closed, opened)
        for callbacks, changed in ((self._revoke_callbacks, closed), (self._assign_callbacks, opened)):
            if changed:
                for callback in list(callbacks):
                    callback(frozenset(changed))

    def on_assign(self, callback: PartitionsCallback) -> None:
        """Group mode: call ``callback(partitions)`` after partitions the group assigned were opened
        (Kafka's ``ConsumerRebalanceListener.onPartitionsAssigned``). Called from :meth:`run`'s
        thread, after the change was applied (the partitions fetch from then on; readiness waits
        for them); not for the assignment :meth:`start` opens. An exception in a callback stops
        ingest (``health.failed``)."""
        self._assign_callbacks.append(callback)

    def on_revoke(self, callback: PartitionsCallback) -> None:
        """Group mode: call ``callback(partitions)`` after partitions revoked (or lost) by the group
        were closed (Kafka's ``ConsumerRebalanceListener.onPartitionsRevoked``): they are not
        fetched or served any more; their folders and store entries are kept. Called from
        :meth:`run`'s thread; an exception in a callback stops ingest (``health.failed``)."""
        self._revoke_callbacks.append(callback)

    def _step(self, until_caught_up: bool, timers: _RunTimers) -> bool:
        """One round of :meth:`run`: the periodic tasks, then one fetch through the ingest path.
        Returns True when a bounded run (``until_caught_up``) is done."""
        session = self._live()
        self._serve_caught_up(session)
        if session.logs.keys() <= self._caught_partitions and not self._away():
            session.applier.drain()  # ready means the store holds what the logs hold
            if not until_caught_up:
                # Serving from now on: background compaction resumes. A bounded run closes the store
                # still in bulk mode, so its close does not wait for that compaction; the next open
                # (with RocksDB's default options) compacts in the background.
                session.applier.store.set_bulk_loading(False)
            if session.marker.loading or not self._caught_up.is_set():
                session.marker.mark_complete()
            self._caught_up.set()
        if self._lease is not None:
            self._lease.observe(session, away=self._away(), continuous=not until_caught_up)
        now = time.monotonic()
        if timers.retention.due(now):
            self.check_retention()
        if self._group is not None and timers.kept.due(now):
            self.expire_kept_partitions()
        if self._group is not None and timers.routing.due(now):
            self._sample_routing(session)
        if not until_caught_up and timers.metadata.due(now) and not self._away():
            # not while the cluster is away: the consumer path's metadata request would wait out
            # its whole request timeout each time (the outage handling asks the cluster itself)
            self.add_new_partitions()
        if until_caught_up and self._caught_up.is_set():
            return True
        if self._group is not None and not session.logs:
            # nothing assigned: nothing to fetch (a Fetch naming no partition would return at once)
            self._group.wait(self._applied_version, self.options.poll_timeout_ms / 1000.0)
            return False
        before = {p: log.log_end_offset for p, log in session.logs.items()}
        session.ingest.step()
        self._outage.after_round(session.ingest.unanswered_since(), bounded=until_caught_up)
        self._progress.update(sum(max(0, log.log_end_offset - before.get(p, log.log_end_offset))
                                  for p, log in session.logs.items()))
        if not session.logs.keys() <= self._caught_partitions:
            self._caught_partitions |= session.ingest.caught_up()
        if session.fetcher is None and timers.watermarks.due(time.monotonic()):
            self._refresh_high_watermarks()  # the replica path reads them off each response
        if self._group_commit is not None:
            self._group_commit.maybe_commit(session.applier.applied_offsets())
        return False

    def _recover(self, exc: Exception, until_caught_up: bool) -> None:
        """What :meth:`run` does when a round fails with one of ``_RECOVERABLE``: wait for the broker,
        follow a re-created or deleted topic, heal a damaged local log; raise what a bounded run (or
        damage in what the broker sent) cannot go on from."""
        session = self._live()
        if isinstance(exc, BrokerUnreachableError):
            if until_caught_up:
                raise exc  # a bounded job: fail after --timeout, as documented
            session.ingest.interrupted()
            self._wait_for_broker(exc)
        elif isinstance(exc, TopicIdChangedError):
            session.ingest.interrupted()
            self._topic_changed(exc, until_caught_up)
        elif isinstance(exc, TopicNotFoundError):  # the metadata refresh of add_new_partitions
            if until_caught_up or self.topic_id is None:
                raise exc
            self._topic_changed(TopicIdChangedError(self.topic, self.topic_id, None, str(exc)), until_caught_up)
        elif isinstance(exc, CorruptRecordError):
            # Damage in a local log found by a reader of it (the apply worker): recover the log there
            # and fetch the cut offsets again. Damage in what the broker sent fails the run.
            partition = self._partition_of(exc)
            if partition is None:
                raise exc
            self._heal(partition, exc)
        else:
            raise exc

    def _end_run(self, previous_handlers: dict[int, Any] | None, started: float) -> None:
        """Leave :meth:`run`: stop the cleaner threads, leave the store equal to its logs (their
        retention may have moved a log start offset after the last apply), restore the signal
        handlers, count the elapsed time."""
        self._running = False
        try:
            self._cleaning.stop()
            if self._session is not None and self._failure is None:
                self._session.applier.drain()
                self._session.applier.drop_below_log_start()
                if self._lease is not None:  # a bounded run's lease says when it was caught up
                    self._lease.observe(self._session, away=self._away(), continuous=not self._bounded, force=True)
                if self._group_commit is not None and not self._outage.away:
                    # the final offsets, so the group shows no lag after a bounded run
                    self._group_commit.flush(self._session.applier.applied_offsets())
        finally:
            self._progress.close()
            self._progress = NoProgress()
            for signum, handler in (previous_handlers or {}).items():
                signal.signal(signum, handler)
            self.stats.elapsed_s += time.monotonic() - started

    def _start_for_run(self, until_caught_up: bool, wait_for_topic: bool = False) -> bool:
        """:meth:`start`; a continuous run whose broker is away retries it with backoff until the
        broker answers or the run is stopped (a bounded run fails after ``broker_timeout_ms``);
        with ``wait_for_topic`` (a start again after the topic was dropped) a topic not in the
        metadata, or without leaders yet, is waited for too. While no bootstrap server accepts a
        connection, nothing blocks for longer than a second, so a stop is quick. Returns False when
        stopped before it started."""
        if self._session is not None:
            return True
        deadline = time.monotonic() + self.options.broker_timeout_ms / 1000.0
        attempts = 0
        while not self._stop_requested.is_set():
            attempts += 1
            self._heartbeat.beat()  # waiting for a broker (or a topic) is progress, not a wedge
            try:
                # a continuous run probes first, so a Ctrl-C is not held up by a metadata request
                # that waits out --timeout on a broker that is away at start
                if (attempts > 1 or not until_caught_up) and not self._outage.bootstrap_answers():
                    raise BrokerUnreachableError(f"no broker of {self.bootstrap_servers} accepts connections (is "
                                                 f"the broker running and is --bootstrap-servers right?)")
                self.start()
                self._outage.answered()
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
                self._stop_requested.wait(self._outage.next_backoff())
        return False

    def _refresh_high_watermarks(self) -> None:
        """Raise ``stats.latest_high_watermarks`` to the client's cached values (consumer path, no request)."""
        session = self._live()
        if session.source is None:
            return  # the replica path: each Fetch response carries the high watermark
        latest = self.stats.latest_high_watermarks
        for partition, high in session.source.cached_high_watermarks(sorted(session.logs)).items():
            if high > latest.get(partition, -1):
                latest[partition] = high

    # -- the leader's truth: topics deleted or re-created, damage ------------------------------

    def _away(self) -> bool:
        """True while the data may be stale: the broker is unreachable or the topic is gone."""
        return self._outage.away or self._topic_missing

    def _topic_changed(self, exc: TopicIdChangedError, until_caught_up: bool) -> None:
        """The cluster's topic is not the local copy's any more (deleted, or re-created).

        Deleted: a bounded run fails; a continuous one keeps serving the last state, reports
        ``caught_up=False`` and polls the metadata with backoff until the topic is back. Back under
        the same id: carry on. Under another id (or re-created at once): ``on_topic_recreated``
        decides: fail, or drop the local copy and start over from the new topic.

        Raises:
            TopicIdChangedError: a bounded run's topic was deleted, or ``on_topic_recreated="fail"``.
        """
        if exc.found is None:
            if until_caught_up:
                raise exc
            if not self._topic_missing:
                logger.warning("%s; the state store keeps serving its last state (caught_up=False) until the topic "
                               "is back", exc)
                self._topic_missing = True
                self._caught_up.clear()
                if self._lease is not None:  # readers say so; the lease's age grows from here
                    self._lease.topic_deleted()
            self._stop_requested.wait(self._outage.next_backoff())
            try:
                found = self._cluster_topic_id()
            except BrokerUnreachableError as away:  # asked again after the broker's backoff
                self._wait_for_broker(away)
                return
            if found is None:
                return
            if found == exc.expected:
                logger.warning("topic %s is back (id %s)", self.topic, topic_id_to_string(found))
                self._topic_missing = False
                if self._lease is not None:
                    self._lease.topic_back()
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
        session = self._live()
        if session.fetcher is not None:
            session.fetcher.refresh_metadata()
            if not session.fetcher.partitions():
                return None
            return session.fetcher.topic_id_in_metadata()
        assert session.source is not None  # the consumer path keeps its source
        return session.source.topic_id()

    def _restart_with_new_topic(self) -> None:
        """Close the session (the data dir stays owned) and drop the topic's local copy; :meth:`run`
        then starts again from the new topic (live: the same run goes on with new logs and store)."""
        self._close_session()
        drop_local_copy(self.data_dir, self.topic)
        for per_partition in (self.stats.start_offsets, self.stats.high_watermarks, self.stats.next_offsets,
                              self.stats.latest_high_watermarks, self.stats.high_watermarks_seen_ms):
            per_partition.clear()
        self._caught_up.clear()
        self._caught_partitions = set()
        self._topic_missing = False
        self.stats.topic_recreations += 1
        if self._lease is not None:
            self._lease.reset()

    def _partition_of(self, exc: CorruptRecordError) -> int | None:
        """The partition whose local log file ``exc`` names, or None (damage elsewhere, e.g. in a
        Fetch response)."""
        if exc.path is None:
            return None
        folder = Path(exc.path).parent
        return next((p for p, log in self.logs.items() if log.dir == folder), None)

    def _heal(self, partition: int, exc: CorruptRecordError) -> None:
        """Recover a partition's log from the damage a reader found while running (the apply
        worker, a cleaner thread), whatever the clean-shutdown marker said at start: the log is
        reopened with Kafka's recovery from the damaged segment on (cut at the first invalid
        batch, later segments deleted; :meth:`TopicLogs.recover_partition`), the store partition
        rewound to what the log now holds, and fetching resumes at the new log end offset, so the
        cut offsets come again from the broker. The cleaner and the apply worker are restarted
        around it; nothing else is lost.

        Until the cut offsets are fetched and applied again the run is not caught up (readiness
        drops) and, in group mode, the partition is not served (here and by readers in other
        processes); without a group, when the rewind takes entries out of the store, readers in
        other processes refuse the topic meanwhile (its marker says the run is healing it), as
        they would read older values.
        """
        session = self._live()
        log = session.logs[partition]
        assert exc.path is not None
        from_offset = exc.offset if exc.offset is not None else offset_from_file_name(Path(exc.path).name)
        logger.warning("damaged local log: %s; recovering %s from offset %d (what is cut is fetched again from the "
                       "broker)", exc, log.dir, from_offset)
        # behind until the cut offsets come again: not ready, and (group mode) not served, from now on
        self._caught_up.clear()
        self._caught_partitions.discard(partition)
        self._serve(session)
        self._cleaning.stop()
        session.applier.restart_worker()  # the failed one keeps the failure that brought us here
        applied = session.applier.applied_offsets().get(partition, 0)
        old_end, old_epoch = log.log_end_offset, log.latest_epoch
        log = session.topic_logs.recover_partition(partition, from_offset)
        # caught up again only at the old end (or the newest high watermark known), not at the
        # high watermark read when the partition was opened, which the cut may be far above
        stats = self.stats
        stats.high_watermarks[partition] = max(stats.high_watermarks.get(partition, 0), old_end,
                                               stats.latest_high_watermarks.get(partition, 0))
        if self._group is None and log.log_end_offset < applied:
            # the rewind below takes served entries out of the store (a group withdrew the partition above)
            session.marker.mark_loading(f"healing partition {partition} (damage in its local log)")
        new_epoch = log.latest_epoch
        session.context.note_truncation(LogTruncation(partition, old_end, log.log_end_offset,
                                                      -1 if old_epoch is None else old_epoch,
                                                      -1 if new_epoch is None else new_epoch, "damaged local log"))
        session.applier.rewind(partition, log.log_end_offset)
        session.ingest.rewound(partition)
        self._start_cleaning()

    # -- a broker that is away ---------------------------------------------------------------

    def _wait_for_broker(self, exc: BaseException) -> None:
        """A continuous run outlives a broker that is away: the store keeps serving what it has;
        ``health.running`` stays true, ``health.caught_up`` and ``health.broker_reachable`` false,
        and the fetch resumes where it stopped after the next backoff (:class:`BrokerOutage`)."""
        if not self._outage.away:
            self._caught_up.clear()
        self._outage.wait(exc)

    def on_client_statistics(self, callback: Callable[[str], None],
                             interval_ms: int = DEFAULT_STATISTICS_INTERVAL_MS) -> None:
        """Call ``callback(stats_json)`` with each librdkafka statistics document (JSON text, see
        librdkafka's STATISTICS.md) of the consumer, every ``interval_ms`` (librdkafka
        ``statistics.interval.ms``; a ``statistics.interval.ms`` in ``options.client_config`` wins).

        Called from the ingest thread, inside the fetch; an exception in a callback is logged and
        ignored. Register before :meth:`start` (the consumer is created there). On the replica
        path (``fetch="replica"``) the consumer is closed once started: no documents after that.

        Raises:
            RuntimeError: the materializer has already started.
            ValueError: ``interval_ms`` < 1.
        """
        if self._session is not None:
            raise RuntimeError("register statistics callbacks before start(): the consumer already exists")
        if interval_ms < 1:
            raise ValueError(f"statistics interval must be >= 1 ms, got {interval_ms}")
        self._statistics_callbacks.append(callback)
        self._statistics_interval_ms = min(self._statistics_interval_ms, interval_ms) \
            if len(self._statistics_callbacks) > 1 else interval_ms

    def _on_client_statistics(self, stats_json: str) -> None:
        for callback in list(self._statistics_callbacks):
            callback(stats_json)

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
    def health(self) -> MaterializerHealth:
        """``running`` (the ingest loop is going), ``caught_up`` (reached the start high
        watermarks at least once and nothing makes the store stale now: the broker answers, the
        topic exists), ``failed`` (the exception that stopped it, else None), ``broker_reachable``,
        ``topic_exists``, ``loop_idle_s``, and the Kubernetes-style ``live`` / ``ready``
        (:mod:`materializer.health`), ``unavailable_partitions`` (not caught up while a partition
        has no leader to fetch from or is not taken on yet); in group mode also ``group_id``,
        ``member_id``, ``generation``, ``assigned_partitions`` and ``group_error`` (not caught up
        while the member is out of the group). Thread-safe."""
        group: dict[str, Any] = {}
        unavailable = unavailable_in(self._session, self._served, None if self._group is None else self._group.partitions)
        caught_up = self._caught_up.is_set() and not self._away() and not unavailable
        if self._group is not None:
            membership = self._membership
            error = None if membership is None else membership.error
            left = membership is None or not membership.running
            group = {"group_id": self.options.group_id, "assigned_partitions": tuple(sorted(self.assigned_partitions())),
                     "member_id": None if membership is None else membership.member_id,
                     "generation": None if membership is None else membership.generation,
                     "group_error": None if error is None else str(error)}
            caught_up = caught_up and not left
        return MaterializerHealth(self._running, caught_up, self._failure,
                                  not self._outage.away, topic_exists=not self._topic_missing,
                                  loop_idle_s=self._heartbeat.idle_s(progress=self._store_progress()),
                                  liveness_timeout_s=self.options.effective_liveness_timeout_ms / 1000.0,
                                  unavailable_partitions=unavailable, **group)

    def _store_progress(self) -> tuple[int, int, int]:
        """Counters that move while the store is written outside a loop iteration (a replay or
        rebuild inside a start, the apply worker): liveness counts their moves as progress."""
        stats = self.stats
        return stats.replay_done_offsets, stats.records_applied, stats.records_replayed

    def on_update(self, callback: UpdateCallback) -> None:
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
        every ``metadata_refresh_interval_ms``; :meth:`Session.add_partitions`); on a compacted topic
        the cleaner takes them on too, and readiness waits for them (``caught_up`` is false until
        they reach their high watermark). A partition whose leader is not known yet is taken on at
        a later call. In group mode only those assigned to this member. Returns the partitions added.

        Raises:
            KafkaSourceError: the metadata or the watermarks cannot be read.
            StorageError: a new partition's log cannot be opened.
        """
        session = self._live()
        return self._took_on(session, session.add_partitions(None if self._group is None else self._group.partitions))

    def open_partitions(self, partitions: Iterable[int]) -> list[int]:
        """Start materializing ``partitions`` (those not open) again, or for the first time: each
        continues from its local log end offset, so a partition closed by :meth:`close_partitions`
        fetches only what the topic got since (:meth:`Session.open_partitions`). Readiness waits for
        them: ``caught_up`` is false until they reach their high watermark of now. Returns the
        partitions opened.

        The building block of a consumer group's assignment (``ConsumerRebalanceListener.onPartitionsAssigned``).
        Not thread-safe: call it while :meth:`run` is not running, or from its thread.

        Raises:
            StoreError: not started.
            KafkaSourceError: the watermarks cannot be read.
            StorageError: a log cannot be opened.
        """
        session = self._live()
        return self._took_on(session, session.open_partitions(partitions))

    def _took_on(self, session: Session, opened: list[int]) -> list[int]:
        """Bookkeeping for partitions just opened: the cleaner takes them on, and readiness waits
        until they reach their high watermark. Returns ``opened``."""
        if opened:
            # not ready before the new partitions are published as served: health never shows them
            # served and ready while they have not caught up
            self._caught_partitions.difference_update(opened)
            self._caught_up.clear()
            self._cleaning.add_partitions(session.logs, opened)
        self._serve(session)
        return opened

    def close_partitions(self, partitions: Iterable[int]) -> list[int]:
        """Stop materializing ``partitions`` (those open) and keep their local logs and store entries
        for a later :meth:`open_partitions` (:meth:`Session.close_partitions`). Readiness and the
        per-partition statistics leave them out from now on. Returns the partitions closed.

        The building block of a consumer group's revocation (``ConsumerRebalanceListener.onPartitionsRevoked``).
        Not thread-safe: call it while :meth:`run` is not running, or from its thread.

        Raises:
            StoreError: not started, or the drained apply failed.
            StorageError: a log cannot be flushed or checkpointed.
        """
        session = self._live()
        wanted = set(partitions) & set(session.logs)
        if not wanted:
            return []
        cleaning = self._cleaning.running
        self._cleaning.stop()  # no cleaner round may hold a log that is being closed
        folders = [session.logs[p].dir for p in wanted]
        try:
            closed = session.close_partitions(wanted)
        finally:
            self._serve(session)
            if cleaning:
                self._start_cleaning()
        self._caught_partitions.difference_update(closed)
        self.stats.group_misrouted_partitions.difference_update(closed)
        mark_released(folders)  # revoked_retention_ms counts from now
        return closed

    def expire_kept_partitions(self, now_ms: int | None = None) -> list[int]:
        """Group mode: drop the partitions kept after the group moved them to other members once
        ``options.revoked_retention_ms`` passed since they were released, or while the kept folders
        exceed ``options.revoked_retention_bytes`` (oldest release first;
        :mod:`materializer.kept_partitions`, after Kafka Streams' ``StateDirectory.cleanRemovedTasks``).
        For each: its store entries first (one atomic range delete), then its folder (renamed to
        ``*-delete``, removed) and checkpoint entries. A partition assigned here (open, or waiting
        for its leader) is never dropped. Returns the partitions dropped; outside group mode none.
        Called by :meth:`run` on its thread; not thread-safe otherwise.

        A folder that cannot be listed or removed (a disk error) is logged and tried again at the
        next check; its store entries are gone by then, so if the partition comes back first its
        log is applied again.

        Raises:
            StoreError: not started, or the store cannot be written.
        """
        session = self._live()
        group = self._group
        if group is None:
            return []
        held = set(session.logs) | group.target()[1]
        try:
            kept = kept_partitions(self.data_dir, self.topic, held)
        except OSError as exc:
            logger.warning("could not list the kept partitions of %s in %s: %s", self.topic, self.data_dir, exc)
            return []
        doomed = expired(kept, self.options.revoked_retention_ms, self.options.revoked_retention_bytes, now_ms)
        if not doomed:
            return []
        session.applier.drain()  # the store is written by the run loop only while nothing is applied
        dropped = []
        for kept_partition in doomed:
            entries = session.store.drop_partition(kept_partition.partition)
            try:
                session.topic_logs.delete_partition(kept_partition.partition)
            except OSError as exc:
                logger.warning("could not delete %s (tried again at the next check): %s", kept_partition.folder, exc)
                continue
            dropped.append(kept_partition.partition)
            self.stats.group_kept_partitions_dropped += 1
            logger.info("dropped partition %s-%d, kept since the group moved it elsewhere (%d bytes of log, %d store "
                        "entries): revoked_retention_ms=%d, revoked_retention_bytes=%d", self.topic,
                        kept_partition.partition, kept_partition.size_bytes, entries,
                        self.options.revoked_retention_ms, self.options.revoked_retention_bytes)
        return dropped

    # -- background cleaning and retention ---------------------------------------------------

    @property
    def cleaner(self) -> LogCleaner | None:
        """The background :class:`LogCleaner` while :meth:`run` runs on a compacted topic, else None."""
        return self._cleaning.cleaner

    def _start_cleaning(self) -> None:
        self._cleaning.start(self.logs, self.log_config)

    def check_retention(self, now_ms: int | None = None) -> int:
        """Apply retention (:func:`delete_old_segments`) to every log now; returns segments deleted.

        Skipped while the background cleaner runs on this (compacted) topic: its threads apply
        retention to compacted logs themselves. The store drops the keys whose latest record fell
        below a raised log start offset. ``now_ms`` defaults to the wall clock.
        """
        if self._cleaning.running:
            return 0
        session = self._live()
        session.applier.drain()  # no apply reads a segment retention deletes
        deleted = 0
        for _, log in sorted(session.logs.items()):
            before = log.log_start_offset
            count = delete_old_segments(log, now_ms)
            if count:
                logger.info("retention deleted %d segment(s) of %s; log start offset %d -> %d", count, log.dir.name,
                            before, log.log_start_offset)
            deleted += count
        if deleted:
            session.applier.drop_below_log_start()
        self.stats.retention_checks += 1
        self.stats.retention_segments_deleted += deleted
        return deleted

    def _install_signal_handlers(self) -> dict[int, Any] | None:
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
            self.stopped_by_signal = signum
            self.stop()

        return {signum: signal.signal(signum, on_signal) for signum in (signal.SIGINT, signal.SIGTERM)}

    def _progress_bar(self) -> Any:
        """run's bar of offsets to fetch (tqdm), or a NoProgress when ``options.progress`` says no."""
        if not show_progress(self.options.progress):
            return NoProgress()
        total = sum(max(0, self.stats.high_watermarks[p] - self.stats.start_offsets[p]) for p in self.logs)
        return progress_bar(True, total=total, unit="offsets", desc=self.topic, position=self.progress_position)

    def __repr__(self) -> str:
        return f"Materializer({self.bootstrap_servers!r}, {self.topic!r}, {str(self.data_dir)!r})"
