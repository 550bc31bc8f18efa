"""Several topics materialized by one process: ``materializer run --topic a --topic b``.

A :class:`TopicSet` runs one :class:`~materializer.materializer.Materializer` per topic on one data
dir, with what they must share shared once:

* **the data dir's lock** (Kafka ``LogManager.lockLogDirs``): taken once for the set; each topic's
  materializer uses it (:meth:`Materializer.share_data_dir_lock`), and it is released after every
  topic closed;
* **in group mode, one consumer-group member** (:class:`~materializer.adapters.group_membership.GroupMembership`)
  for all the topics, with **co-partitioning**: topics with the same partition count form a
  co-partition group, and partition ``p`` of every topic of a group is held by the member that
  holds partition ``p`` of the group's lead topic (the first of them named). This is Kafka
  Streams' rule for the topics of a join (``CopartitionedTopicsEnforcer``: same partition count;
  ``StreamsPartitionAssignor``: one task per partition number, holding that partition of every
  co-partitioned topic). The member subscribes to the lead topics only and the assignor
  (KIP-848 ``uniform``/``range``, or classic cooperative-sticky) assigns their partitions; the
  other topics of a group follow their lead (:func:`co_partition_leads`). The group's description
  (``kafka-consumer-groups --describe``, :func:`~materializer.group.routing.owner_of`) therefore names the
  lead topics; route a key of another topic with its lead (:meth:`TopicSet.lead_of`).

Each topic keeps what is its own: its partition folders, its state store (``state/<topic>/``), its
completeness marker (readers in other processes: ``materializer get --topic``), its fetch path
and its run loop, on a thread of its own. :meth:`TopicSet.view` gives a topic's view.

Invariants (each topic's, as :class:`Materializer` keeps them, plus):
    * One writer of the data dir: the set's lock is held from :meth:`TopicSet.start` until every
      topic's materializer closed.
    * Co-partitioned: in group mode, after every rebalance callback a topic's assigned partitions
      equal its lead's (both recorded in that callback, on the membership's thread), except a lead
      partition its follower lacks (counts grown unequally), which is logged.
    * A topic that fails stops the set: :meth:`TopicSet.run` stops the others and raises its
      error (a service serving several topics must not serve some of them stale).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from materializer.adapters.errors import BrokerUnreachableError, GroupMembershipError, KafkaSourceError
from materializer.adapters.group_members import GroupMembersClient
from materializer.adapters.group_membership import GroupMembership, Partitions
from materializer.broker_outage import BrokerOutage
from materializer.config import MaterializerOptions
from materializer.datadir.lock import DataDirLock
from materializer.group import served
from materializer.group.assignment import AssignmentChanges
from materializer.group.member import await_first_assignment, join_group
from materializer.interrupts import restore_handlers, stop_after_the_batch
from materializer.materializer import Materializer
from materializer.session import StoreMarker
from materializer.stats import MaterializerHealth, MaterializerStats
from materializer.view import MaterializedView

__all__ = ["TopicSet", "co_partition_leads"]

logger = logging.getLogger(__name__)

#: How often :meth:`TopicSet.run` looks at its topics' threads (a failure, all done), seconds.
_WATCH_S = 0.2

#: After an abort (a second Ctrl-C), how long close() waits for each topic's thread, seconds.
_ABORTED_JOIN_S = 1.0


def co_partition_leads(partition_counts: Mapping[str, int]) -> dict[str, str]:
    """Topic -> the lead of its co-partition group: the first topic (in the mapping's order) with
    the same partition count (Kafka Streams co-partitions the topics of a join by equal partition
    counts). A topic whose count no earlier topic has leads itself.

    >>> co_partition_leads({"orders": 12, "customers": 12, "rates": 3})
    {'orders': 'orders', 'customers': 'orders', 'rates': 'rates'}

    Raises:
        ValueError: a partition count below 1.
    """
    leads: dict[str, str] = {}
    lead_of_count: dict[int, str] = {}
    for topic, count in partition_counts.items():
        if count < 1:
            raise ValueError(f"topic {topic!r} has {count} partitions: at least 1 needed")
        leads[topic] = lead_of_count.setdefault(count, topic)
    return leads


class TopicSet:
    """Materialize ``topics`` into one data dir from one process (module docstring).

    Args:
        bootstrap_servers: ``host:port[,host:port]`` of the Kafka cluster.
        topics: the topics, each once (the first of each co-partition group leads it).
        data_dir: the data directory (layout in :mod:`materializer.datadir.layout`), shared by the topics.
        options: the options of every topic's materializer (key/value formats among them: one
            format for all the topics).
        schema_registry: a ``SchemaRegistryClient`` for ``avro`` formats (default: one per topic
            from ``options.schema_registry_url``).
        group_id: shortcut for ``options.group_id``: one member of this consumer group for all the
            topics, co-partitioned (module docstring).

    Attributes:
        materializers: topic -> its :class:`Materializer` (in the order given). Register
            ``on_update`` / ``on_assign`` / ``on_revoke`` callbacks on them before :meth:`start`.

    Use as a context manager (``start`` on enter, ``close`` on exit) or call :meth:`start`,
    :meth:`run` and :meth:`close`. Not thread-safe except :meth:`stop`, :attr:`health`,
    :meth:`wait_until_caught_up` and :meth:`view`.

    Raises (construction):
        ValueError: no topic, a topic named twice, or ``group_id`` equal to ``options.commit_group``.
    """

    def __init__(self, bootstrap_servers: str, topics: Iterable[str], data_dir: Path | str, *,
                 options: MaterializerOptions | None = None, schema_registry: Any = None,
                 group_id: str | None = None) -> None:
        names = list(topics)
        if not names:
            raise ValueError("a TopicSet needs at least one topic")
        twice = sorted({t for t in names if names.count(t) > 1})
        if twice:
            raise ValueError(f"topic(s) named more than once: {', '.join(twice)}")
        self.bootstrap_servers = bootstrap_servers
        self.data_dir = Path(data_dir)
        self.materializers: dict[str, Materializer] = {
            topic: Materializer(bootstrap_servers, topic, data_dir, options=options, schema_registry=schema_registry,
                                group_id=group_id) for topic in names}
        for line, materializer in enumerate(self.materializers.values()):
            materializer.progress_position = line  # one progress bar line per topic
        first = next(iter(self.materializers.values()))
        self.options = first.options
        self.group_id = self.options.group_id
        self._leads: dict[str, str] = {topic: topic for topic in names}
        self._lock: DataDirLock | None = None
        self._membership: GroupMembership | None = None
        self._started = False
        self._stop_requested = threading.Event()
        self._thread: threading.Thread | None = None  # run_in_background's
        self._threads: list[threading.Thread] = []  # run's, one per topic
        self._aborted = False  # a second signal: close() waits for the topics' threads briefly only
        #: The signal (SIGINT, SIGTERM) that made :meth:`run` stop, else None.
        self.stopped_by_signal: int | None = None

    @property
    def topics(self) -> list[str]:
        """The topics, in the order given."""
        return list(self.materializers)

    def lead_of(self, topic: str) -> str:
        """The lead topic of ``topic``'s co-partition group (itself when it leads, and always
        outside group mode, or before :meth:`start` read the partition counts). Route a key of
        ``topic`` with :func:`~materializer.group.routing.owner_of` on the lead: the group's members are
        assigned the lead topics' partitions.

        Raises:
            KeyError: ``topic`` is not in the set.
        """
        if topic not in self.materializers:
            raise KeyError(f"topic {topic!r} is not materialized here (topics: {', '.join(self.materializers)})")
        return self._leads[topic]

    def __enter__(self) -> "TopicSet":
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __getitem__(self, topic: str) -> Materializer:
        """The materializer of ``topic``.

        Raises:
            KeyError: ``topic`` is not in the set.
        """
        self.lead_of(topic)  # the KeyError naming the topics
        return self.materializers[topic]

    def view(self, topic: str) -> MaterializedView:
        """Typed reads of ``topic``'s store (:meth:`Materializer.view`; in group mode it serves the
        partitions assigned here that have caught up, and raises
        :class:`~materializer.adapters.errors.PartitionNotAssignedError` for the others).

        Raises:
            KeyError: ``topic`` is not in the set.
            StoreError: not started.
        """
        return self[topic].view()

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        """Take the data dir's lock; in group mode read the topics' partition counts, withdraw what
        their markers served before, join the group once for all the topics and wait up to
        ``group_join_timeout_ms`` for the first assignment; then start every topic's materializer
        (:meth:`Materializer.start`), in the order given. Idempotent.

        Raises:
            DataDirLockedError: another process writes the data dir.
            TopicNotFoundError / BrokerUnreachableError / KafkaSourceError: group mode: a topic's
                partition count cannot be read.
            GroupMembershipError: group mode: the member cannot join.
            what :meth:`Materializer.start` raises.
        """
        if self._started:
            return
        with self._closed_on_failure():
            if not self._prepare(wait_for_broker=False):
                return  # stopped meanwhile: no topic starts (nor joins the group on its own)
            for materializer in self.materializers.values():
                materializer.start()
            self._started = True

    @contextlib.contextmanager
    def _closed_on_failure(self) -> Iterator[None]:
        """Close what a failed start opened; a data dir it created is removed when left empty (as
        :meth:`Materializer.start` does)."""
        created = not self.data_dir.exists()
        try:
            yield
        except BaseException:
            self.close()
            if created:
                with contextlib.suppress(OSError):
                    os.rmdir(self.data_dir)
            raise

    def _prepare(self, *, wait_for_broker: bool) -> bool:
        """What the topics share, before any of them starts: the data dir's lock and, in group mode,
        the membership. With ``wait_for_broker`` (a continuous run) a cluster that does not answer
        is waited for with backoff (:class:`~materializer.broker_outage.BrokerOutage`), as a
        single topic's run waits. Returns False when stopped while waiting.

        Raises:
            as :meth:`start`.
        """
        if self._lock is None:
            self._lock = DataDirLock.acquire(self.data_dir, "run")
            for materializer in self.materializers.values():
                materializer.share_data_dir_lock(self._lock)
        outage = BrokerOutage(self.bootstrap_servers, self._stop_requested)
        while self.group_id is not None and self._membership is None:
            if self._stop_requested.is_set():
                return False
            try:
                if wait_for_broker and not outage.bootstrap_answers():  # no request that waits out --timeout
                    raise BrokerUnreachableError(f"no broker of {self.bootstrap_servers} accepts connections (is "
                                                 f"the broker running and is --bootstrap-servers right?)")
                self._join_group()
            except (BrokerUnreachableError, GroupMembershipError) as exc:
                unreachable = isinstance(exc, BrokerUnreachableError) or not outage.bootstrap_answers()
                if not (wait_for_broker and unreachable):
                    raise
                for materializer in self.materializers.values():
                    materializer.waiting_for_broker(exc)  # live while it waits; health: broker unreachable
                outage.wait(exc)
        outage.answered()
        for materializer in self.materializers.values():
            materializer.waiting_for_broker(None)
        return True

    def _join_group(self) -> None:
        """Group mode: co-partition the topics, then one member for all of them (module docstring)."""
        options, group_id = self.options, self.group_id
        assert group_id is not None
        counts_client = GroupMembersClient(self.bootstrap_servers, options.client_config,
                                           timeout_s=options.request_timeout_ms / 1000.0)
        counts = {topic: counts_client.partition_count(topic) for topic in self.materializers}
        self._leads = co_partition_leads(counts)
        leads = sorted(set(self._leads.values()), key=self.topics.index)
        followers = {lead: [t for t, its_lead in self._leads.items() if its_lead == lead] for lead in leads}
        logger.info("group %r: co-partitioned topics %s; the member subscribes to %s", group_id,
                    "; ".join(", ".join(group) for group in followers.values()), ", ".join(leads))
        changes: dict[str, AssignmentChanges] = {}
        joined: dict[str, int] = {}
        for topic, materializer in self.materializers.items():
            # What the previous run served goes stale once the group moves it (as Materializer.start).
            served.withdraw(StoreMarker(self.data_dir, topic, "run"), group_id)
            assert materializer.assignment is not None
            changes[topic] = materializer.assignment
            joined[topic] = changes[topic].join()

        lonely: set[tuple[str, int]] = set()  # (follower, partition) warned about

        def has_peer(follower: str, partition: int) -> bool:
            # a partition added to the lead: the follower's count is read again (grown too, usually)
            if partition >= counts[follower]:
                try:
                    counts[follower] = max(counts[follower], counts_client.partition_count(follower))
                except KafkaSourceError as exc:
                    logger.warning("cannot read the partition count of %s: %s", follower, exc)
            if partition < counts[follower]:
                return True
            if (follower, partition) not in lonely:
                lonely.add((follower, partition))
                logger.warning("group %r: partition %d of %s has no peer in %s (%d partitions): co-partitioned "
                               "topics need equal partition counts; it is materialized once the set starts again "
                               "with the counts equal", group_id, partition, self._leads[follower], follower,
                               counts[follower])
            return False

        def spread(kind: str) -> Callable[[Partitions], None]:
            # a lead's partitions, and the same partitions of the topics that follow it
            def callback(partitions: Partitions) -> None:
                by_topic: dict[str, set[tuple[str, int]]] = {}
                for lead, p in partitions:
                    for topic in followers.get(lead, ()):
                        if topic == lead or has_peer(topic, p):
                            by_topic.setdefault(topic, set()).add((topic, p))
                for topic, pairs in by_topic.items():
                    getattr(changes[topic], kind)(frozenset(pairs))
            return callback

        membership = join_group(self.bootstrap_servers, options, leads, client_id=f"kafka-materializer-{leads[0]}",
                                on_assign=spread("assign"), on_revoke=spread("revoke"))

        def arrived(wait_s: float) -> bool:  # the first assignment, of any lead topic
            if not any(changes[lead].target()[0] > joined[lead] for lead in leads):
                changes[leads[0]].wait(joined[leads[0]], wait_s)
            return any(changes[lead].target()[0] > joined[lead] for lead in leads)

        try:  # as Materializer.start waits for its topic's
            await_first_assignment(membership, arrived, group_id=group_id, what=", ".join(leads),
                                   timeout_s=options.group_join_timeout_ms / 1000.0, slice_s=0.1)
        except BaseException:
            membership.close()  # a join tried again starts from a new membership
            raise
        self._membership = membership
        for materializer in self.materializers.values():
            materializer.share_membership(membership)

    def run(self, until_caught_up: bool = False) -> dict[str, MaterializerStats]:
        """Run every topic's :meth:`Materializer.run` on a thread of its own until stopped (Ctrl-C,
        SIGTERM, :meth:`stop`) or, with ``until_caught_up``, until every topic caught up. The first
        topic that fails stops the others; its error is raised once they returned.

        Ctrl-C (SIGINT) or SIGTERM (main thread only) makes every topic finish its batch and
        return; a second signal raises ``KeyboardInterrupt`` here, and :meth:`close` then waits a
        second for each topic: one still busy (a long store replay) is left unclosed, as a crash
        leaves it (its logs are recovered at the next start), with the data dir locked until the
        process exits.

        A continuous run waits out a cluster that does not answer, at start too (in group mode
        before it joins), as :meth:`Materializer.run` does.

        Returns:
            topic -> that topic's :class:`MaterializerStats`.

        Raises:
            DataDirLockedError: another process writes the data dir.
            GroupMembershipError / BrokerUnreachableError / TopicNotFoundError: group mode: a
                bounded run cannot join, or a continuous one meets another error than an
                unreachable cluster while joining.
            what :meth:`Materializer.run` raises, for the first topic that failed.
        """
        previous_handlers = stop_after_the_batch(self._stop_requested, self._stop_after_the_batch, aborted=self._abort)
        try:
            with self._closed_on_failure():
                # each topic's run starts it (a continuous one waits out a broker that is away)
                prepared = self._prepare(wait_for_broker=not until_caught_up)
            if prepared:
                self._run_topics(until_caught_up)
        finally:
            restore_handlers(previous_handlers)
        return {topic: m.stats for topic, m in self.materializers.items()}

    def _run_topics(self, until_caught_up: bool) -> None:
        """Each topic's :meth:`Materializer.run` on a thread of its own, until all returned; the
        first failure stops the others and is raised."""
        failures: dict[str, BaseException] = {}

        def run_one(topic: str, materializer: Materializer) -> None:
            try:
                materializer.run(until_caught_up=until_caught_up)
            except BaseException as exc:  # noqa: BLE001 - raised once every topic returned
                failures.setdefault(topic, exc)
                self.stop()

        self._threads = threads = [
            threading.Thread(target=run_one, args=(topic, m), name=f"materializer-{topic}", daemon=True)
            for topic, m in self.materializers.items()]
        for thread in threads:
            thread.start()
        for thread in threads:
            while thread.is_alive():
                thread.join(_WATCH_S)  # in slices: the main thread's signal handlers run in between
        if failures:
            topic, first = next(iter(failures.items()))
            if len(failures) > 1:
                logger.error("topics that failed besides %s: %s", topic,
                             "; ".join(f"{t}: {exc!r}" for t, exc in list(failures.items())[1:]))
            raise first

    def stop(self) -> None:
        """Ask every topic's :meth:`Materializer.run` to return after its batch (thread- and signal-safe)."""
        self._stop_requested.set()
        for materializer in self.materializers.values():
            materializer.stop()

    def close(self) -> None:
        """Leave the group first (so the other members take the partitions over while this one
        flushes), stop every topic and wait for it to finish its batch (after an abort, a second at
        most: see :meth:`run`), close every topic's materializer, then release the data dir's lock.
        Idempotent.

        Raises:
            the first error a topic's :meth:`Materializer.close` raised (the others are closed all the same).
        """
        for materializer in self.materializers.values():
            materializer.leave_group()  # the run loops stop looking at the membership; its revocations are not applied
        membership, self._membership = self._membership, None
        if membership is not None:
            membership.close()
        self.stop()
        if self._thread is not None and self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join()  # run_in_background's run: it joins the topics' threads
        busy = []  # topics still running after an abort (a second signal): left as a crash leaves them
        for topic, thread in zip(self.materializers, self._threads):
            if thread.is_alive() and thread is not threading.current_thread():
                # each topic finishes its batch (or store replay) before its materializer closes
                thread.join(_ABORTED_JOIN_S if self._aborted else None)
            if thread.is_alive():
                busy.append(topic)
        first: BaseException | None = None
        for topic, materializer in self.materializers.items():
            if topic in busy:
                continue
            try:
                materializer.close()
            except BaseException as exc:  # noqa: BLE001 - every topic closes; the first error is raised
                first = first or exc
        if busy:  # the data dir stays locked until the process exits: they may still write it
            logger.warning("aborted: %s still busy, left unclosed (recovered at the next start, as after a crash)",
                           ", ".join(busy))
            return
        lock, self._lock = self._lock, None
        if lock is not None:
            lock.release()
        self._started = False
        if first is not None:
            raise first

    # -- services ----------------------------------------------------------------------------

    def run_in_background(self) -> threading.Thread:
        """Start :meth:`run` (continuous) in a daemon thread and return it; :meth:`stop` ends it,
        :meth:`close` stops and joins it.

        Raises:
            RuntimeError: already running in the background.
            what :meth:`start` raises.
        """
        self.start()

        def target() -> None:
            try:
                self.run()
            except BaseException:  # noqa: BLE001 - kept in each topic's health.failed
                logger.exception("materializer of %s failed", ", ".join(self.topics))

        if self._thread is not None and self._thread.is_alive():
            raise RuntimeError(f"{self!r} is already running in the background")
        self._thread = threading.Thread(target=target, name="materializer-topics", daemon=True)
        self._thread.start()
        return self._thread

    def wait_until_caught_up(self, timeout_s: float | None = None) -> bool:
        """Block until every topic caught up (:meth:`Materializer.wait_until_caught_up`), a topic's
        ingest failed, the set was stopped, or ``timeout_s`` seconds passed. Returns True when
        caught up.

        Raises:
            the exception that stopped a topic's ingest, if one failed (the first topic's, in order).
        """
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            # wait_until_caught_up(0) answers at once, raising a failure, for each topic
            if all([m.wait_until_caught_up(0) for m in self.materializers.values()]):
                return True
            if self._stop_requested.is_set() or (deadline is not None and time.monotonic() >= deadline):
                return False
            time.sleep(_WATCH_S if deadline is None else max(0.0, min(_WATCH_S, deadline - time.monotonic())))

    @property
    def health(self) -> dict[str, MaterializerHealth]:
        """topic -> its :attr:`Materializer.health`. Thread-safe."""
        return {topic: m.health for topic, m in self.materializers.items()}

    @property
    def caught_up(self) -> bool:
        """Every topic caught up (its ``health.caught_up``). Thread-safe."""
        return all(h.caught_up for h in self.health.values())

    def _stop_after_the_batch(self, signum: int) -> None:
        """SIGINT or SIGTERM while :meth:`run` runs (:func:`~materializer.interrupts.stop_after_the_batch`,
        installed in the thread that runs the set; the topics' runs on other threads install none):
        every topic finishes its batch; a second signal raises ``KeyboardInterrupt`` there."""
        logger.warning("%s: finishing the current batch of every topic (send it again to abort)",
                       signal.Signals(signum).name)
        self.stopped_by_signal = signum
        for materializer in self.materializers.values():
            materializer.stopped_by_signal = signum
        self.stop()

    def _abort(self) -> None:
        self._aborted = True  # close() then waits only briefly for each topic

    def __repr__(self) -> str:
        return f"TopicSet({self.bootstrap_servers!r}, {self.topics!r}, {str(self.data_dir)!r})"
