"""One topic's part in a consumer group: the membership, the assignment the run loop applies, the
partitions served, the producers' partitioner, and the partitions kept after the group moved them.

Group mode (``Materializer(group_id=...)``; Kafka Streams' KTable instances splitting a topic) is
a collaborator of the :class:`~materializer.materializer.Materializer`, as Kafka Streams'
``TaskManager`` is of its ``StreamThread``: the Materializer owns the lifecycle, the run loop, the
cleaner threads and readiness, and calls its :class:`GroupMember` at a few named points:

* **start** (:meth:`GroupMember.start`): what the previous run of the data dir served is withdrawn
  (:func:`materializer.group.served.withdraw`), the group joined
  (:class:`~materializer.adapters.group_membership.GroupMembership`, KIP-848 or classic
  cooperative-sticky) and the first assignment waited for (``group_join_timeout_ms``; an empty
  one is legal): the session opens the assigned partitions only.
* **on a rebalance** (:meth:`GroupMember.rebalance`, before each step): the changes the
  membership's thread recorded (:class:`~materializer.group.assignment.AssignmentChanges`) are
  applied between two fetches: revoked partitions closed, assigned ones opened (a folder kept
  from an earlier assignment fetches only the delta), then the ``on_revoke`` / ``on_assign``
  callbacks, on the run loop's thread.
* **before each step** (:meth:`GroupMember.before_step`): partitions that caught up since they
  were opened are served; kept partitions expire (:mod:`materializer.group.kept`); the store's
  keys are sampled for the producers' partitioner (:mod:`materializer.group.partitioner`).
* **on serve** (:meth:`GroupMember.serve`): the partitions assigned here that have caught up are
  the ones served, in this process (:meth:`GroupMember.served`, the view's
  :class:`~materializer.view.ServedPartitions`) and to readers of the marker
  (:func:`materializer.group.served.serve`). A partition being healed is not caught up.
* **on close** (:meth:`GroupMember.leave`, then :meth:`GroupMember.close`): the member leaves the
  group first, so the others take its partitions over while it flushes; after a continuous run
  the marker names no partition as served any more; the folders count as let go from then.
* **on expiry** (:meth:`GroupMember.expire_kept`) and **for health** (:meth:`GroupMember.health`).

Nothing is committed to the group: the store's offsets are the truth on a restart.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from materializer.adapters.errors import BrokerUnreachableError, GroupMembershipError
from materializer.adapters.group_members import GroupMembersClient
from materializer.adapters.group_membership import GroupMembership, Partitions
from materializer.adapters.partition_owner import PartitionOwner, serving_client_id
from materializer.config import MaterializerOptions
from materializer.group import served
from materializer.group.assignment import AssignmentChanges
from materializer.group.kept import expired, kept_partitions, mark_released
from materializer.group.owners_cache import OwnersCache
from materializer.group.partitioner import KeyRouting, PartitionerDetection, PartitionerMismatchError
from materializer.periodic import INITIAL_TASK_DELAY_MS, Every
from materializer.session import Session, StoreMarker
from materializer.stats import MaterializerStats
from materializer.storage.files import partition_dir_name

if TYPE_CHECKING:
    from materializer.datadir.holder import DataDirHolder

__all__ = ["GroupMember", "PartitionsCallback", "await_first_assignment", "join_group"]

logger = logging.getLogger(__name__)

#: ``on_assign`` / ``on_revoke`` callback: the partitions (of the member's topic) just opened / closed.
PartitionsCallback = Callable[[frozenset[int]], None]

#: Pause before asking again for an assigned partition whose leader is not known yet, seconds.
_LEADER_RETRY_S = 0.1

#: How often the keys of partitions grown since their last sample are sampled (the producers'
#: partitioner, :mod:`materializer.group.partitioner`), seconds.
_ROUTING_SAMPLE_S = 2.0


def join_group(bootstrap_servers: str, options: MaterializerOptions, topics: list[str], *, client_id: str,
               on_assign: Callable[[Partitions], None],
               on_revoke: Callable[[Partitions], None]) -> GroupMembership:
    """A member of ``options.group_id`` subscribed to ``topics``, with the options' protocol,
    session timeout, client settings and static membership (``group_instance_id``). ``on_revoke``
    takes lost partitions too: their data is still correct, they are only not this member's any more.
    With ``options.serving_url``, the member's ``client.id`` carries it (issue 39).

    Raises:
        GroupMembershipError: the member cannot be created.
    """
    assert options.group_id is not None
    source_options = options.source_options()
    if options.serving_url is not None:  # the address rides in client.id (a -X client.id names the member)
        name = str(source_options.client_config.get("client.id") or client_id)
        client_id = serving_client_id(name, options.serving_url)
        source_options = dataclasses.replace(source_options, client_config={
            k: v for k, v in source_options.client_config.items() if k != "client.id"})
    return GroupMembership(bootstrap_servers, options.group_id, topics, protocol=options.group_protocol,
                           session_timeout_ms=options.group_session_timeout_ms, options=source_options,
                           group_instance_id=options.group_instance_id, client_id=client_id,
                           on_assign=on_assign, on_revoke=on_revoke, on_lost=on_revoke)


def await_first_assignment(membership: GroupMembership, arrived: Callable[[float], bool], *, group_id: str,
                           what: str, timeout_s: float, slice_s: float) -> None:
    """Wait up to ``timeout_s`` seconds for the first assignment of ``membership``:
    ``arrived(wait_s)`` waits up to ``wait_s`` seconds for it and says whether it came. In slices of
    ``slice_s`` seconds, so a membership that ends (a fatal error from the coordinator) fails at
    once; past the deadline a warning names ``group_id`` and ``what`` (the topics), and the member starts with no
    partition (an empty assignment is legal).

    Raises:
        GroupMembershipError: the membership ended with an error.
    """
    deadline = time.monotonic() + timeout_s
    while not arrived(max(0.0, min(slice_s, deadline - time.monotonic()))):
        if not membership.running and membership.error is not None:
            raise membership.error
        if time.monotonic() >= deadline:
            logger.warning("group %r: no partition of %s assigned within %g s (member %s%s); starting with none",
                           group_id, what, timeout_s, membership.member_id,
                           f", {membership.error}" if membership.error is not None else "")
            return


class GroupMember:
    """``topic``'s part in consumer group ``options.group_id`` (module docstring): what the
    :class:`~materializer.materializer.Materializer` delegates in group mode.

    Args:
        bootstrap_servers: ``host:port[,host:port]`` of the Kafka cluster.
        topic: the topic materialized.
        data_dir: the data directory (its partition folders are kept and expire here).
        options: ``group_id`` (required), the group's and the kept partitions' options.
        stats: where rebalances, dropped kept partitions and the partitioner's evidence are counted.
        stop_requested: set when the run is asked to stop (ends a wait for a partition's leader).
        wake: called on the membership's thread after each rebalance, to cut short a fetch waiting
            for records so the run loop applies the change at once.

    Thread-safety: the run loop's thread calls everything except :meth:`assigned`,
    :meth:`served`, :meth:`key_routing`, :meth:`owners` and :meth:`health` (any thread), and the
    membership's thread, which feeds :attr:`assignment`.
    """

    def __init__(self, bootstrap_servers: str, topic: str, data_dir: Path, options: MaterializerOptions,
                 stats: MaterializerStats, stop_requested: threading.Event, *, wake: Callable[[], None]) -> None:
        if options.group_id is None:
            raise ValueError("a GroupMember needs options.group_id")
        self.bootstrap_servers, self.topic, self.data_dir = bootstrap_servers, topic, data_dir
        self.options, self.stats = options, stats
        self.group_id: str = options.group_id
        self._stop_requested = stop_requested
        #: The assignment the membership's callbacks record for this topic (the run loop applies it).
        self.assignment = AssignmentChanges(topic, wake=wake)
        #: The membership (made by :meth:`start`, closed by :meth:`leave`), or None.
        self.membership: GroupMembership | None = None
        self._owns_membership = True  # False once share() handed in a TopicSet's
        self._applied_version = 0  # of the assignment, by the run loop
        self._serving: frozenset[int] = frozenset()  # open and caught up; replaced (never mutated) for other threads
        self._detection = PartitionerDetection(options.partitioner)  # the producers' partitioner, from samples
        stats.group_partitioner_candidates = len(self._detection.routing(0).families)
        self._routing_logged: KeyRouting | None = None
        self._members_client: GroupMembersClient | None = None  # made on the first refused read (owners)
        self._members_lock = threading.Lock()
        # refused reads ask through it: one describe per second at most, and anew after a rebalance here
        self._owners = OwnersCache(self._describe_owners, lambda: self.assignment.target()[0])
        self._kept_timer, self._routing_timer = self._timers(time.monotonic())
        self.assign_callbacks: list[PartitionsCallback] = []
        self.revoke_callbacks: list[PartitionsCallback] = []

    def _timers(self, now: float) -> tuple[Every, Every]:
        """The expiry of kept partitions (as often as retention, or every ``revoked_retention_ms``
        when shorter; first after Kafka's ``log.initial.task.delay.ms`` at most) and the samples
        of the keys that tell the producers' partitioner."""
        retention_s = self.options.retention_check_interval_ms / 1000.0
        revoked_ms = self.options.revoked_retention_ms
        kept_s = retention_s if revoked_ms <= 0 else min(retention_s, revoked_ms / 1000.0)
        return (Every(kept_s, now, first_s=min(kept_s, INITIAL_TASK_DELAY_MS / 1000.0)),
                Every(_ROUTING_SAMPLE_S, now))

    # -- membership: start, share, leave ------------------------------------------------------

    @property
    def joined(self) -> bool:
        """True while the member holds a membership (its own or a shared one)."""
        return self.membership is not None

    def start(self, withdraw: StoreMarker | None, bootstrap_answers: Callable[[], bool]) -> frozenset[int]:
        """At :meth:`Materializer.start`: withdraw what ``withdraw`` (the topic's marker; None: the
        caller did, as a TopicSet does for every topic) served, join the group (once: a start
        again after a re-created topic keeps the membership) and wait up to
        ``group_join_timeout_ms`` for the first assignment. The partitioner's samples start over
        (this store's only). Returns the assigned partitions, which count as applied.

        Raises:
            BrokerUnreachableError: the member cannot be created and no bootstrap server accepts a
                connection (``bootstrap_answers``; a continuous run waits for the cluster).
            GroupMembershipError: the member cannot be created or the membership failed.
            OSError: the marker cannot be written.
        """
        if withdraw is not None:
            served.withdraw(withdraw, self.group_id)
        if self.membership is None:
            joined = self.assignment.join()
            try:
                self.membership = join_group(self.bootstrap_servers, self.options, [self.topic],
                                             client_id=f"kafka-materializer-{self.topic}",
                                             on_assign=self.assignment.assign, on_revoke=self.assignment.revoke)
            except GroupMembershipError as exc:
                if not bootstrap_answers():  # a continuous run waits for the broker
                    raise BrokerUnreachableError(f"cannot join group {self.group_id!r}: {exc}") from exc
                raise
            await_first_assignment(self.membership, lambda wait_s: self.assignment.wait(joined, wait_s),
                                   group_id=self.group_id, what=self.topic,
                                   timeout_s=self.options.group_join_timeout_ms / 1000.0, slice_s=0.5)
        version, assigned = self.assignment.target()
        self._applied_version = version
        self._detection = PartitionerDetection(self.options.partitioner)
        return assigned

    def share(self, membership: GroupMembership) -> None:
        """Take part in ``membership``, owned by the caller (a TopicSet), instead of joining in
        :meth:`start`: the caller feeds :attr:`assignment` and closes the membership itself."""
        self.membership, self._owns_membership = membership, False

    def leave(self) -> None:
        """Leave the group now: revocations from here on are not applied (the session closes next)
        and nothing is served any more. A shared membership is only let go of. Idempotent."""
        membership, self.membership = self.membership, None
        if membership is not None:
            self.assignment.leave()
            owned, self._owns_membership = self._owns_membership, True
            if owned:
                membership.close()

    # -- the run loop: rebalances, what is served, periodic tasks ------------------------------

    def begin_run(self, session: Session) -> None:
        """A run begins (or starts again on a re-created topic): kept partitions already due expire,
        and the periodic tasks count from now."""
        self._kept_timer, self._routing_timer = self._timers(time.monotonic())
        self.expire_kept(session)

    def rebalance(self, session: Session, *, close: Callable[[Collection[int]], list[int]],
                  took_on: Callable[[Session, list[int]], list[int]]) -> None:
        """Apply the rebalances recorded since the last call: close the revoked partitions (``close``:
        :meth:`Materializer.close_partitions`), open the assigned ones (``took_on``: the
        Materializer's bookkeeping of partitions opened), then call the ``on_revoke`` and
        ``on_assign`` callbacks. A change that fails half-way is completed by the next call; so is
        an assigned partition whose leader is not known yet (asked for again 100 ms later, as a
        Kafka consumer retries after ``retry.backoff.ms``).

        Raises:
            GroupMembershipError: the membership ended (the group gives this member's partitions
                to others now: serving them on would go stale).
            what the callbacks raise.
        """
        membership = self.membership
        if membership is not None and not membership.running:
            raise membership.error or GroupMembershipError(
                f"group {self.group_id!r}: the membership ended", group=self.group_id, fatal=True)
        version, target = self.assignment.target()
        if version == self._applied_version:
            return
        # Revocations first, and with no request: a member cut off from the cluster must still stop
        # serving what the group took away.
        closed = close(set(session.logs) - target)
        if closed:
            self.expire_kept(session)  # a bound of 0 ms, or bytes now exceeded, acts at once
        if target - set(session.logs):
            # Readers route keys by the partition count the marker records: the assignment may
            # already cover partitions added since the last metadata refresh, and routing by the
            # old count would send a key produced to a new partition to its old one (a stale value).
            session.refresh_partition_count()
        opened = took_on(session, session.open_partitions(target - set(session.logs), defer_leaderless=True))
        if set(session.logs) != target:  # leaderless: left for the next round
            self._stop_requested.wait(_LEADER_RETRY_S)
        else:
            self._applied_version = version
            self.stats.group_rebalances += 1
        logger.info("group %r: materializing partitions %s of %s (closed %s, opened %s)", self.group_id,
                    sorted(session.logs), self.topic, closed, opened)
        for callbacks, changed in ((self.revoke_callbacks, closed), (self.assign_callbacks, opened)):
            if changed:
                for callback in list(callbacks):
                    callback(frozenset(changed))

    def before_step(self, session: Session, caught: Collection[int]) -> bool:
        """The periodic part of a step: the open partitions caught up since the last call
        (``caught``) are to be served once the store holds what was fetched of them (the apply
        worker drained), with the keys they hold sampled first so their marker routes by them;
        kept partitions that are due expire; partitions grown since their last sample are sampled.
        Returns True when what is served is to be published again (:meth:`serve`).

        Raises:
            PartitionerMismatchError: ``options.partitioner`` does not place a sampled key where it is.
            StoreError: the store cannot be read or written.
        """
        publish = False
        if (session.logs.keys() & caught) - self._serving:
            session.applier.drain()
            self._sample_routing(session)
            publish = True
        now = time.monotonic()
        if self._kept_timer.due(now):
            self.expire_kept(session)
        if self._routing_timer.due(now) and self._sample_routing(session):
            publish = True
        return publish

    def wait_for_change(self, timeout_s: float) -> None:
        """Nothing assigned, so nothing to fetch (a Fetch naming no partition would return at once):
        wait up to ``timeout_s`` seconds for a rebalance."""
        self.assignment.wait(self._applied_version, timeout_s)

    def serve(self, session: Session, caught: Collection[int], *, held_by: DataDirHolder | None,
              renew_lease: Callable[[Session], None] | None) -> None:
        """Serve the open partitions that have caught up (``caught``), in this process and for
        readers of the topic's marker (:func:`materializer.group.served.serve`); while leaving,
        none. ``held_by`` (a continuous run: the data dir lock's holder): readers serve them only
        while it holds the data dir. ``renew_lease`` (a continuous run): readers serve a member's
        partitions by its lease, so it is renewed before the marker names them.

        Raises:
            OSError: the marker cannot be written.
        """
        # leaving: the others take the partitions over; nothing is published as served again
        self._serving = frozenset() if self.assignment.leaving else frozenset(session.logs) & frozenset(caught)
        count = session.partition_count
        self._detection.saw_partition_count(count)  # a count that grew: keys under the old one
        if self._serving and renew_lease is not None:
            renew_lease(session)
        served.serve(session.marker, self.group_id, self._serving, count, self._detection.routing(count),
                     held_by=held_by)

    def _sample_routing(self, session: Session) -> bool:
        """Sample the keys of the store's partitions (served, catching up or kept) that are due
        (:meth:`PartitionerDetection.sample`: new, or grown twice over), so that reads route by the
        producers' partitioner; the metrics ``materializer_group_partitioner_candidates`` and
        ``materializer_group_misrouted_partitions`` follow. Returns True when keys were sampled.

        Raises:
            PartitionerMismatchError: ``options.partitioner`` does not place a sampled key where
                it is: reads would answer "absent" for keys the topic holds.
        """
        detection, count = self._detection, session.partition_count
        if not detection.sample(session.store):
            return False
        problem = detection.contradiction(count)
        if problem is not None:
            raise PartitionerMismatchError(f"group {self.group_id!r}, topic {self.topic!r}: {problem}")
        routing = detection.routing(count)
        misrouted = detection.unplaced(count) & set(session.logs)
        self.stats.group_misrouted_partitions.intersection_update(misrouted)
        self.stats.group_misrouted_partitions.update(misrouted)
        self.stats.group_partitioner_candidates = len(routing.families)
        if routing != self._routing_logged:
            self._routing_logged = routing
            log = logger.warning if not routing.candidates else logger.info
            log("group %r, topic %r: reads route keys by %s (%d keys sampled)", self.group_id, self.topic,
                routing.describe(), detection.sampled_keys)
        return True

    # -- closing and letting partitions go ----------------------------------------------------

    def released(self, closed: Collection[int]) -> None:
        """Partitions just closed (revoked, or :meth:`Materializer.close_partitions`): their
        ``revoked_retention_ms`` counts from now, and they are no longer misrouted here."""
        self.stats.group_misrouted_partitions.difference_update(closed)
        mark_released(self.data_dir / partition_dir_name(self.topic, p) for p in closed)

    def close(self, session: Session, *, withdraw: bool) -> None:
        """Close ``session`` as a member does: with ``withdraw`` (after a continuous run) the marker
        first names no partition as served any more (the other members take them over; a bounded
        run's share stays readable as of its end), then the session closes (also when a second
        Ctrl-C cut the withdraw short), and its partitions count as let go from now."""
        self._serving = frozenset()
        held = [log.dir for log in session.logs.values()]
        try:
            if withdraw:
                self._withdraw_served(session)
        finally:
            session.close()
            mark_released(held)  # a member that stops lets its partitions go now

    def _withdraw_served(self, session: Session) -> None:
        """The marker names no partition as served any more; a failure to write it is logged, not raised."""
        try:
            served.serve(session.marker, self.group_id, (), session.partition_count,
                         self._detection.routing(session.partition_count))
        except OSError as exc:
            logger.error("group %r: cannot withdraw the partitions %s served from %s (%s): readers on this host "
                         "refuse them once this process has let the data dir go; readers on other hosts go on serving "
                         "them although other members hold them now", self.group_id,
                         session.marker.group.get("partitions") if session.marker.group else [], session.marker.path,
                         exc)

    def expire_kept(self, session: Session, now_ms: int | None = None) -> list[int]:
        """Drop the partitions kept after the group moved them to other members once
        ``options.revoked_retention_ms`` passed since they were released, or while the kept
        folders exceed ``options.revoked_retention_bytes`` (oldest release first;
        :mod:`materializer.group.kept`, after Kafka Streams' ``StateDirectory.cleanRemovedTasks``).
        For each: its store entries first (one atomic range delete), then its folder (renamed to
        ``*-delete``, removed) and checkpoint entries. A partition assigned here (open, or waiting
        for its leader) is never dropped. A folder that cannot be listed or removed is logged and
        tried again at the next check. Returns the partitions dropped.

        Raises:
            StoreError: the store cannot be written.
        """
        held = set(session.logs) | self.assignment.target()[1]
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

    # -- what readers and health see (any thread) --------------------------------------------

    @property
    def partitions(self) -> frozenset[int]:
        """The partitions the group assigns this member now (some may not be open yet)."""
        return self.assignment.partitions

    def assigned(self, open_partitions: frozenset[int]) -> frozenset[int]:
        """Of ``open_partitions``, those still assigned (a revoked partition leaves at once, before
        the run loop closes it)."""
        return open_partitions & self.assignment.partitions

    def served(self) -> frozenset[int]:
        """The partitions reads are answered from now: assigned here and caught up since they were
        opened (a partition catching up holds entries older than what its previous owner served,
        as Kafka Streams does not query a restoring task's store)."""
        return self._serving & self.assignment.partitions

    def key_routing(self, partition_count: int) -> KeyRouting:
        """How reads route a key to its partition over ``partition_count`` partitions now: the
        configured partitioner, or the candidates the keys sampled so far fit."""
        return self._detection.routing(partition_count)

    def owners(self) -> Mapping[int, PartitionOwner]:
        """For a refused read: ``partition -> member`` of the group, as the group coordinator named
        it at most 1 s ago and since this member's last rebalance (one DescribeConsumerGroups per
        second at most: :mod:`materializer.group.owners_cache`; the admin client is made at the
        first call and kept).

        Raises:
            KafkaSourceError: the group cannot be described (that failure is kept as long).
        """
        return self._owners()

    def _describe_owners(self) -> Mapping[int, PartitionOwner]:
        with self._members_lock:
            if self._members_client is None:
                self._members_client = GroupMembersClient(self.bootstrap_servers, self.options.client_config,
                                                          timeout_s=self.options.request_timeout_ms / 1000.0)
            client = self._members_client
        return client.partition_owners(self.group_id, self.topic)

    def health(self, open_partitions: frozenset[int]) -> tuple[dict[str, Any], bool]:
        """The group's fields of :class:`~materializer.stats.MaterializerHealth` (``group_id``,
        ``member_id``, ``generation``, ``assigned_partitions``, ``group_error``), and whether the
        member is in the group (a member out of it is not caught up: its partitions go elsewhere)."""
        membership = self.membership
        error = None if membership is None else membership.error
        fields = {"group_id": self.group_id, "assigned_partitions": tuple(sorted(self.assigned(open_partitions))),
                  "member_id": None if membership is None else membership.member_id,
                  "generation": None if membership is None else membership.generation,
                  "group_error": None if error is None else str(error)}
        return fields, membership is not None and membership.running
