"""The Materializer: Kafka topic -> local Kafka-format log per partition -> RocksDB key -> latest value.

What :class:`Materializer` owns:

* the lifecycle: the data dir's lock (:class:`~materializer.datadir.lock.DataDirLock`, taken before
  anything is written), :meth:`~Materializer.start`, :meth:`~Materializer.close`;
* the run loop (:meth:`~Materializer.run`): one fetch per step, the periodic tasks between them
  (:mod:`materializer.periodic`: retention, new partitions, high watermarks), and what a
  continuous run goes on from: a broker that is away, a topic deleted or re-created, damage in a
  local log;
* readiness, liveness and health for services, and the lease that tells readers how current the
  store is (:mod:`materializer.datadir.lease`, :mod:`materializer.run_lease`).

What it delegates:

* :class:`~materializer.session.Session`: what one start opens (clients, logs, store, applier,
  fetch path) in Kafka's order, closed together, and healing a damaged log (:meth:`Session.heal`);
* :class:`~materializer.background_cleaning.BackgroundCleaning`: the log cleaner threads;
  :class:`~materializer.broker_outage.BrokerOutage`: a cluster that is away, the retries' backoff;
* :class:`~materializer.group.member.GroupMember`, in group mode only: the membership, the
  rebalances, what is served, the producers' partitioner, the partitions kept;
* :class:`~materializer.group.commit.GroupCommitter` (``commit_group``): the applied offsets
  committed for lag tools.

How they work together, and the invariants they keep: ``docs/how-it-works.md``.
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
from pathlib import Path
from typing import Any, Callable, Iterable

from materializer.adapters.avro_serde import schema_registry_client
from materializer.adapters.errors import (
    BrokerUnreachableError,
    StoreError,
    TopicIdChangedError,
    TopicNotFoundError,
)
from materializer.adapters.group_membership import GroupMembership
from materializer.adapters.kafka_source import KafkaSource
from materializer.adapters.replica_fetch import ReplicaFetcher
from materializer.adapters.rocksdb_store import StateStore
from materializer.adapters.serdes import Serde, make_serde
from materializer.apply.applier import FormatCheck, UpdateCallback
from materializer.background_cleaning import BackgroundCleaning
from materializer.broker_outage import BrokerOutage
from materializer.config import MaterializerOptions
from materializer.datadir.lock import DataDirLock
from materializer.group.assignment import AssignmentChanges
from materializer.group.commit import GroupCommitter
from materializer.group.member import GroupMember, PartitionsCallback
from materializer.group.partitioner import KeyRouting, PartitionerDetection
from materializer.health import RunHeartbeat
from materializer.interrupts import restore_handlers, stop_after_the_batch
from materializer.partition_availability import unavailable_in
from materializer.periodic import RunTimers
from materializer.progress import NoProgress, progress_bar
from materializer.run_lease import RunLease
from materializer.session import Session, StoreMarker
from materializer.stats import MaterializerHealth, MaterializerStats
from materializer.storage.errors import CorruptRecordError
from materializer.storage.log import Log
from materializer.storage.log_cleaner import LogCleaner
from materializer.storage.log_config import LogConfig
from materializer.datadir.identity import drop_local_copy
from materializer.topic_presence import TopicPresence
from materializer.view import LiveLogs, MaterializedView, ServedPartitions

__all__ = ["DEFAULT_STATISTICS_INTERVAL_MS", "Materializer"]

logger = logging.getLogger(__name__)

#: Failures :meth:`Materializer.run` goes on from (``Materializer._recover``).
_RECOVERABLE = (BrokerUnreachableError, TopicIdChangedError, TopicNotFoundError, CorruptRecordError)

#: librdkafka ``statistics.interval.ms`` asked for when a statistics callback is registered, ms.
DEFAULT_STATISTICS_INTERVAL_MS = 5_000


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
            the partitions it assigns (group mode: :mod:`materializer.group.member`; :meth:`view`
            then serves the assigned partitions that have caught up, :meth:`close` leaves the
            group first, and the partitions the group moved elsewhere are kept until they expire:
            :meth:`expire_kept_partitions`).

    Use as a context manager (``start`` on enter, ``close`` on exit) or call :meth:`start`,
    :meth:`run` and :meth:`close`. Between them it holds the data dir's lock, naming it
    ``materializer <lock_command>`` (``run``; set :attr:`lock_command` before :meth:`start` to
    name another command). Not thread-safe except :meth:`stop`, :attr:`health` and
    :meth:`wait_until_caught_up` (a service calls them while :meth:`run_in_background` ingests).
    While :meth:`run` runs, cleaner threads compact a compacted topic's logs and retention
    deletes old segments; the store drops the keys whose latest record retention deleted.

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
        self._caught_up = threading.Event()
        self._outage = BrokerOutage(bootstrap_servers, self._stop_requested, on_away=self._caught_up.clear)
        self._presence = TopicPresence(topic, self.data_dir, self.options.on_topic_recreated, self._outage,
                                       self._stop_requested, self._caught_up)
        self._running = False
        self._failure: BaseException | None = None
        self._thread: threading.Thread | None = None
        self._update_callbacks: list[UpdateCallback] = []
        self._statistics_callbacks: list[Callable[[str], None]] = []
        self._statistics_interval_ms = DEFAULT_STATISTICS_INTERVAL_MS
        self._caught_partitions: set[int] = set()
        self._progress: Any = NoProgress()  # run's progress bar (tqdm, or NoProgress when off)
        self._heartbeat = RunHeartbeat()  # the run loop's progress, for liveness (materializer.health)
        self._lease: RunLease | None = None  # how current the store is, for readers (materializer.datadir.lease)
        self._group_commit = (GroupCommitter(bootstrap_servers, topic, self.options, self.stats)
                              if self.options.commit_group is not None else None)
        self._check = (FormatCheck(self.key_serde, self.value_serde, self.options.on_bad_record, self.stats)
                       if "bytes" != self.options.key_format or "bytes" != self.options.value_format else None)
        self._served: frozenset[int] = frozenset()  # the open partitions, replaced (never mutated) for other threads
        #: the last run() was bounded (until_caught_up): a group member's share stays served after close
        self._bounded = False
        self._member = (GroupMember(bootstrap_servers, topic, self.data_dir, self.options, self.stats,
                                    self._stop_requested, wake=self._wake_ingest)
                        if self.options.group_id is not None else None)

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
        member, served = self._member, None
        if member is not None:
            served = ServedPartitions(self.topic, member.group_id, self.served_partitions, self._partition_count,
                                      self.key_routing, assigned=self.assigned_partitions, owners=member.owners)
        lease = self._lease
        staleness = None if lease is None else (lambda: lease.staleness(None if served is None else served.partitions()))
        return MaterializedView(store, key_serde=self.key_serde, value_serde=self.value_serde, served=served,
                                staleness=staleness, max_staleness_ms=max_staleness_ms,
                                tombstone_log=LiveLogs(lambda: self.logs))

    @property
    def member_id(self) -> str | None:
        """:attr:`health`'s ``member_id`` without the rest of the probe (read on every query answer)."""
        membership = None if self._member is None else self._member.membership
        return None if membership is None else membership.member_id

    def assigned_partitions(self) -> frozenset[int]:
        """Group mode: the partitions this member holds now: open here and still assigned (a revoked
        partition leaves at once, before the run loop closes it); it serves those of them that
        have caught up (:meth:`served_partitions`). Without a group: every open partition.
        Thread-safe."""
        return self._served if self._member is None else self._member.assigned(self._served)

    def served_partitions(self) -> frozenset[int]:
        """Group mode: the partitions reads are answered from now: assigned here (as
        :meth:`assigned_partitions`) and caught up since they were opened, i.e. the store holds
        their records up to the high watermark read when they were opened; not while they catch up
        (:meth:`GroupMember.served`). Without a group: every open partition. Thread-safe."""
        return self._served if self._member is None else self._member.served()

    def _partition_count(self) -> int:
        session = self._session
        return 0 if session is None else session.partition_count

    def key_routing(self) -> KeyRouting:
        """Group mode: how reads route a key to its partition now: ``options.partitioner``, or the
        partitioners the keys sampled so far fit (:mod:`materializer.group.partitioner`; every
        partitioner while not started, the partition count being unknown). Without a group nothing
        is sampled: the configured partitioner, or every one. Thread-safe (an immutable snapshot)."""
        if self._member is None:
            return PartitionerDetection(self.options.partitioner).routing(self._partition_count())
        return self._member.key_routing(self._partition_count())

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
            assigned = None
            if self._member is not None:
                # what the previous run served goes stale once the group moves it: not served until
                # caught up (a TopicSet, which hands its lock in, withdraws every topic itself)
                withdraw = None if held else StoreMarker(self.data_dir, self.topic, self.lock_command)
                assigned = self._member.start(withdraw, self._outage.bootstrap_answers)
            self._session = Session.open(
                self.bootstrap_servers, self.topic, self.data_dir, self.options, stats=self.stats,
                marker=StoreMarker(self.data_dir, self.topic, self.lock_command), check=self._check,
                callbacks=self._update_callbacks, stop_requested=self._stop_requested,
                statistics_callback=self._on_client_statistics if self._statistics_callbacks else None,
                statistics_interval_ms=self._statistics_interval_ms, partitions=assigned)
            if self._lease is None:  # this lock holder's
                self._lease = RunLease.for_run(self.data_dir, self.topic, self._data_dir_lock.holder, self.options,
                                               None if self._member is None else self._member.membership)
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
        return None if self._member is None else self._member.assignment

    def share_data_dir_lock(self, lock: DataDirLock) -> None:
        """Several materializers on one data dir in this process (:class:`~materializer.topic_set.TopicSet`):
        use ``lock``, held by the caller, instead of taking it in :meth:`start`; :meth:`close`
        leaves it held. In group mode the caller also withdraws what the topic's marker served
        before it joins (:func:`materializer.group.served.withdraw`), as :meth:`start` does with
        its own lock. Call before :meth:`start`.

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
        if self._member is None:
            raise RuntimeError(f"{self!r} is not in group mode: no membership to share")
        if self._session is not None or self._member.joined:
            raise RuntimeError(f"{self!r} has already joined its group")
        self._member.share(membership)

    def leave_group(self) -> None:
        """Group mode: leave the group now (:meth:`close` does it first); revocations from here on
        are not applied, as the session closes next, and nothing is served any more: the other
        members take these partitions over, so :meth:`close` withdraws them from the topic's marker
        too (readers in other processes then refuse their keys, naming the partition, rather than
        serve values the new owners have moved past). A shared membership (:meth:`share_membership`)
        is only let go of: its owner closes it. Idempotent; a no-op outside group mode."""
        if self._member is not None:
            self._member.leave()

    def _serve(self, session: Session) -> None:
        """The open partitions are the served ones; in group mode those caught up only, here and for
        readers in other processes (:meth:`GroupMember.serve`): a continuous run's while it holds
        the data dir, its lease renewed first; a bounded run's for good."""
        self._served = frozenset(session.logs)
        if self._member is not None:
            lock = None if self._bounded else self._data_dir_lock
            self._member.serve(session, self._caught_partitions, held_by=None if lock is None else lock.holder,
                               renew_lease=None if self._bounded else self._renew_lease)

    def _renew_lease(self, session: Session) -> None:
        """Renew the lease now (a group member is about to name partitions as served: readers serve
        them by it)."""
        if self._lease is not None:
            self._lease.observe(session, away=self._away(), continuous=True, force=True)

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
        """Close what :meth:`start` opened; the data dir stays owned. In group mode the member closes
        it, after a continuous run withdrawing what it served first (:meth:`GroupMember.close`)."""
        self._cleaning.stop()
        self._served = frozenset()
        session, self._session = self._session, None
        if session is None:
            return
        if self._member is None:
            session.close()
        else:
            self._member.close(session, withdraw=not self._bounded)

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
        previous_handlers = stop_after_the_batch(self._stop_requested, self._stop_after_the_batch)
        self._bounded = until_caught_up
        timers = RunTimers.starting(self.options, started)
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
                    if self._member is not None:  # the group's rebalances since the last step
                        self._member.rebalance(self._live(), close=self.close_partitions, took_on=self._took_on)
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
        if self._member is not None:  # folders kept from earlier runs may be due already
            self._member.begin_run(self._live())
        self._progress.close()  # run's bar of offsets to fetch (tqdm), or a NoProgress when options.progress says no
        stats = self.stats
        self._progress = progress_bar(self.options.progress, unit="offsets", desc=self.topic,
                                      total=sum(max(0, stats.high_watermarks[p] - stats.start_offsets[p]) for p in self.logs),
                                      position=self.progress_position)
        self._caught_partitions = self._live().ingest.caught_up()
        return True

    def on_assign(self, callback: PartitionsCallback) -> None:
        """Group mode: call ``callback(partitions)`` after partitions the group assigned were opened
        (Kafka's ``ConsumerRebalanceListener.onPartitionsAssigned``). Called from :meth:`run`'s
        thread, after the change was applied (the partitions fetch from then on; readiness waits
        for them); not for the assignment :meth:`start` opens. An exception in a callback stops
        ingest (``health.failed``). Outside group mode it is never called."""
        if self._member is not None:
            self._member.assign_callbacks.append(callback)

    def on_revoke(self, callback: PartitionsCallback) -> None:
        """Group mode: call ``callback(partitions)`` after partitions revoked (or lost) by the group
        were closed (Kafka's ``ConsumerRebalanceListener.onPartitionsRevoked``): they are not
        fetched or served any more; their folders and store entries are kept. Called from
        :meth:`run`'s thread; an exception in a callback stops ingest (``health.failed``). Outside
        group mode it is never called."""
        if self._member is not None:
            self._member.revoke_callbacks.append(callback)

    def _step(self, until_caught_up: bool, timers: RunTimers) -> bool:
        """One round of :meth:`run`: the periodic tasks, then one fetch through the ingest path.
        Returns True when a bounded run (``until_caught_up``) is done."""
        session = self._live()
        if self._member is not None and self._member.before_step(session, self._caught_partitions):
            self._serve(session)  # partitions newly caught up, or new samples of the keys' partitioner
        if session.logs.keys() <= self._caught_partitions and not self._away():
            session.caught_up(serving=not until_caught_up, newly=not self._caught_up.is_set())
            self._caught_up.set()
        if self._lease is not None:
            self._lease.observe(session, away=self._away(), continuous=not until_caught_up)
        now = time.monotonic()
        if timers.retention.due(now):
            self.check_retention()
        if not until_caught_up and timers.metadata.due(now) and not self._away():
            # not while the cluster is away: the consumer path's metadata request would wait out
            # its whole request timeout each time (the outage handling asks the cluster itself)
            self.add_new_partitions()
        if until_caught_up and self._caught_up.is_set():
            return True
        if self._member is not None and not session.logs:
            self._member.wait_for_change(self.options.poll_timeout_ms / 1000.0)  # nothing assigned: nothing to fetch
            return False
        before = {p: log.log_end_offset for p, log in session.logs.items()}
        session.ingest.step()
        self._outage.after_round(session.ingest.unanswered_since(), bounded=until_caught_up)
        self._progress.update(sum(max(0, log.log_end_offset - before.get(p, log.log_end_offset))
                                  for p, log in session.logs.items()))
        if not session.logs.keys() <= self._caught_partitions:
            self._caught_partitions |= session.ingest.caught_up()
        if session.fetcher is None and timers.watermarks.due(time.monotonic()):
            session.refresh_high_watermarks()  # the replica path reads them off each response
        if self._group_commit is not None:
            self._group_commit.maybe_commit(session.applier.applied_offsets())
        return False

    def _recover(self, exc: Exception, until_caught_up: bool) -> None:
        """What :meth:`run` does when a round fails with one of ``_RECOVERABLE``: heal a damaged local
        log; wait for the broker, follow a deleted or re-created topic (:meth:`TopicPresence.recover`);
        raise what a bounded run (or damage in what the broker sent) cannot go on from."""
        session = self._live()
        if isinstance(exc, CorruptRecordError):
            # Damage in a local log found by a reader of it (the apply worker): recover the log there
            # and fetch the cut offsets again. Damage in what the broker sent fails the run.
            partition = session.damaged_partition(exc)
            if partition is None:
                raise exc
            self._heal(partition, exc)
        elif self._presence.recover(exc, session, self._lease, bounded=until_caught_up):
            self._restart_with_new_topic()

    def _end_run(self, previous_handlers: dict[int, Any] | None, started: float) -> None:
        """Leave :meth:`run`: stop the cleaner threads, leave the store equal to its logs (their
        retention may have moved a log start offset after the last apply), restore the signal
        handlers, count the elapsed time."""
        self._running = False
        try:
            self._cleaning.stop()
            if self._session is not None and self._failure is None:
                self._session.settle()
                if self._lease is not None:  # a bounded run's lease says when it was caught up
                    self._lease.observe(self._session, away=self._away(), continuous=not self._bounded, force=True)
                if self._group_commit is not None and not self._outage.away:
                    # the final offsets, so the group shows no lag after a bounded run
                    self._group_commit.flush(self._session.applier.applied_offsets())
        finally:
            self._progress.close()
            self._progress = NoProgress()
            restore_handlers(previous_handlers)
            self.stats.elapsed_s += time.monotonic() - started

    def _start_for_run(self, until_caught_up: bool, wait_for_topic: bool = False) -> bool:
        """:meth:`start`; a continuous run whose broker is away retries it with backoff until the
        broker answers or the run is stopped, a bounded run fails after ``broker_timeout_ms``
        (:meth:`BrokerOutage.retry`); with ``wait_for_topic`` (a start again after the topic was
        dropped) a topic not in the metadata, or without leaders yet, is waited for too. Returns
        False when stopped before it started."""
        if self._session is not None:
            return True
        return self._outage.retry(self.start, bounded=until_caught_up, timeout_s=self.options.broker_timeout_ms / 1000.0,
                                  beat=self._heartbeat.beat,
                                  topic_missing=self._presence.waiting if wait_for_topic and not until_caught_up else None)

    # -- what a run goes on from: the cluster away, the topic re-created, damage --------------

    def _away(self) -> bool:
        """True while the data may be stale: the broker is unreachable or the topic is gone."""
        return self._outage.away or self._presence.missing

    def _restart_with_new_topic(self) -> None:
        """Close the session (the data dir stays owned) and drop the topic's local copy; :meth:`run`
        then starts again from the new topic (live: the same run goes on with new logs and store)."""
        self._close_session()
        drop_local_copy(self.data_dir, self.topic)
        self.stats.forget_partitions()
        self._caught_up.clear()
        self._caught_partitions = set()
        self._presence.recreated()
        self.stats.topic_recreations += 1
        if self._lease is not None:
            self._lease.reset()

    def _heal(self, partition: int, exc: CorruptRecordError) -> None:
        """Heal a partition's log from the damage a reader found while running (the apply worker, a
        cleaner thread): :meth:`Session.heal`, with the cleaner threads stopped. Until the cut
        offsets are applied again the run is not caught up and, in group mode, not served."""
        session = self._live()
        # behind until the cut offsets come again: not ready, and (group mode) not served, from now on
        self._caught_up.clear()
        self._caught_partitions.discard(partition)
        self._serve(session)
        self._cleaning.stop()
        session.heal(partition, exc, withdrawn=self._member is not None)
        self._start_cleaning()

    # -- services: background run, readiness, health, callbacks ------------------------------

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
        member, group = self._member, dict[str, Any]()
        unavailable = unavailable_in(self._session, self._served, None if member is None else member.partitions)
        caught_up = self._caught_up.is_set() and not self._away() and not unavailable
        if member is not None:
            group, in_group = member.health(self._served)
            caught_up = caught_up and in_group
        return MaterializerHealth(self._running, caught_up, self._failure,
                                  not self._outage.away, topic_exists=not self._presence.missing,
                                  loop_idle_s=self._heartbeat.idle_s(progress=self.stats.store_progress()),
                                  liveness_timeout_s=self.options.effective_liveness_timeout_ms / 1000.0,
                                  unavailable_partitions=unavailable, **group)

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

    # -- partitions: taken on, opened, closed, kept --------------------------------------------

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
        return self._took_on(session, session.add_partitions(None if self._member is None else self._member.partitions))

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
        try:
            closed = session.close_partitions(wanted)
        finally:
            self._serve(session)
            if cleaning:
                self._start_cleaning()
        self._caught_partitions.difference_update(closed)
        if self._member is not None:
            self._member.released(closed)  # revoked_retention_ms counts from now
        return closed

    def expire_kept_partitions(self, now_ms: int | None = None) -> list[int]:
        """Group mode: drop the partitions kept after the group moved them to other members once
        ``options.revoked_retention_ms`` passed since they were released, or while the kept folders
        exceed ``options.revoked_retention_bytes``: store entries first, the folder last
        (:meth:`GroupMember.expire_kept`). A partition assigned here is never dropped. Returns the
        partitions dropped; outside group mode none. Called by :meth:`run` on its thread; not
        thread-safe otherwise.

        Raises:
            StoreError: not started, or the store cannot be written.
        """
        session = self._live()
        return [] if self._member is None else self._member.expire_kept(session, now_ms)

    # -- background cleaning and retention ---------------------------------------------------

    @property
    def cleaner(self) -> LogCleaner | None:
        """The background :class:`LogCleaner` while :meth:`run` runs on a compacted topic, else None."""
        return self._cleaning.cleaner

    def _start_cleaning(self) -> None:
        self._cleaning.start(self.logs, self.log_config)

    def check_retention(self, now_ms: int | None = None) -> int:
        """Apply retention (:func:`~materializer.storage.retention.delete_old_segments`) to every log
        now; returns segments deleted (:meth:`BackgroundCleaning.check_retention`).

        Skipped while the background cleaner runs on this (compacted) topic: its threads apply
        retention to compacted logs themselves. The store drops the keys whose latest record fell
        below a raised log start offset. ``now_ms`` defaults to the wall clock.
        """
        session = self._live()
        return self._cleaning.check_retention(session.logs, session.applier, now_ms)

    def _stop_after_the_batch(self, signum: int) -> None:
        """SIGINT or SIGTERM while :meth:`run` runs (:func:`~materializer.interrupts.stop_after_the_batch`):
        finish the batch in progress and return; a second signal aborts."""
        logger.warning("%s: finishing the current batch (send it again to abort)", signal.Signals(signum).name)
        self.stopped_by_signal = signum
        self.stop()

    def __repr__(self) -> str:
        return f"Materializer({self.bootstrap_servers!r}, {self.topic!r}, {str(self.data_dir)!r})"
