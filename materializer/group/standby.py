"""A group member's standby partitions (``--standby-replicas N``, issue 40): which it follows, and
how far behind they are.

A standby partition is a partition another member owns that this member follows read-only into
its own local log and store, through the same fetch path as the partitions it owns: it is simply
one more open partition (``session.logs``) that is not served here, counts for neither readiness
nor the consumer group's commits, and is written by nothing but this member's fetches. When the
coordinator assigns it here, it is already open: the member serves it once it has fetched up to the
high watermark of that moment, which is the delta since its last fetch
(:meth:`GroupMember.rebalance <materializer.group.member.GroupMember.rebalance>`). A standby that is
no longer placed here is closed like a revoked partition and kept (:mod:`materializer.group.kept`)
until it expires.

Which partitions: :class:`StandbyPlanner`, a thread of the member, describes the group about once a
second and after each rebalance of this member (one DescribeConsumerGroups:
:meth:`GroupMembersClient.describe <materializer.adapters.group_members.GroupMembersClient.describe>`),
computes every partition's standbys with :func:`~materializer.group.standby_placement.place_standbys`
(the same function on the same snapshot in every member: they agree without talking), and hands
its own share to the run loop through :meth:`AssignmentChanges.set_standby
<materializer.group.assignment.AssignmentChanges.set_standby>`. A describe that fails keeps the
standbys as they were (logged once); the owned partitions never depend on it.

How far behind (:func:`standby_lag`): per standby partition, the latest high watermark a fetch
brought, when the fetch that brought it was sent, and the fetch position, as Kafka Streams'
``LagInfo`` (KIP-535) reports a standby's offset lag, plus the time since that last successful
fetch (KIP-535 deferred time lag; here each fetch response carries the high watermark).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from materializer.adapters.group_members import GroupDescription
from materializer.group.assignment import AssignmentChanges
from materializer.group.standby_placement import place_standbys, standbys_of
from materializer.stats import MaterializerStats

__all__ = ["STANDBY_PLAN_INTERVAL_S", "StandbyPlanner", "standby_lag"]

logger = logging.getLogger(__name__)

#: How often a member describes its group to place standbys, seconds (the owners cache's age too).
STANDBY_PLAN_INTERVAL_S = 1.0


class StandbyPlanner:
    """Places this member's standby partitions (module docstring) on a thread of its own.

    Args:
        replicas: N, standby copies per partition (``MaterializerOptions.standby_replicas``, >= 1).
        describe: one DescribeConsumerGroups of the group about the topic (raises what it raises).
        me: this member's member id now (None before it joined).
        partition_count: the topic's partition count now (0: unknown; the owned partitions count then).
        assignment: where the standbys go (:meth:`AssignmentChanges.set_standby`), and whose changes
            (this member's rebalances) make it plan again at once.
        label: ``group ..., topic ...`` for log lines.
        interval_s: seconds between two plans when nothing changes here.

    Thread-safety: :meth:`plan` and :meth:`close` from any thread; the thread calls :meth:`plan`.
    """

    def __init__(self, replicas: int, describe: Callable[[], GroupDescription], me: Callable[[], str | None],
                 partition_count: Callable[[], int], assignment: AssignmentChanges, *, label: str,
                 interval_s: float = STANDBY_PLAN_INTERVAL_S) -> None:
        if replicas < 1:
            raise ValueError(f"a StandbyPlanner needs replicas >= 1, got {replicas}")
        self.replicas, self.label, self.interval_s = replicas, label, interval_s
        self._describe, self._me, self._partition_count = describe, me, partition_count
        self._assignment = assignment
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        #: The last describe's failure (kept until one succeeds), for health; None when it worked.
        self.error: str | None = None
        #: Plans made (describes that succeeded).
        self.plans = 0

    def plan(self) -> frozenset[int] | None:
        """Describe the group, place every partition's standbys and hand this member's to the run
        loop. Returns them, or None when the describe failed or this member is not in the group yet
        (the standbys stay as they were)."""
        me = self._me()
        if me is None:
            return None
        try:
            description = self._describe()
        except Exception as exc:  # noqa: BLE001 - a failed describe keeps the standbys; reported in health
            if self.error is None:
                logger.warning("%s: cannot describe the group to place standby replicas (keeping the standbys as they "
                               "are; retried every %g s): %s", self.label, self.interval_s, exc)
            self.error = str(exc)
            return None
        if self.error is not None:
            logger.info("%s: describing the group to place standby replicas works again", self.label)
            self.error = None
        self.plans += 1
        names = {m.member_id: m.stable for m in description.members}
        mine = names.get(me)
        if mine is None:  # not in the coordinator's answer yet: the others do not count it either
            return None
        count = self._partition_count()
        owners = {p: names.get(owner.member_id) for p, owner in description.owners.items()}
        placement = place_standbys(names.values(), owners, self.replicas, range(count) if count else None)
        standby = standbys_of(mine, placement)
        if self._assignment.set_standby(standby):
            logger.info("%s: following partitions %s as standby replicas (%d members, %d replicas)", self.label,
                        sorted(standby), len(names), self.replicas)
        return standby

    def start(self) -> None:
        """Plan now and then on the planner's thread (a daemon) until :meth:`close`. Idempotent."""
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._loop, name=f"standby-planner {self.label}", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.plan()
            seen, deadline = self._assignment.target()[0], time.monotonic() + self.interval_s
            while not self._stop.is_set() and (left := deadline - time.monotonic()) > 0:
                if self._assignment.wait(seen, min(left, 0.2)):  # this member's rebalance: plan again now
                    break

    def close(self, timeout_s: float = 2.0) -> None:
        """Stop the thread; wait up to ``timeout_s`` seconds for a describe in flight (the daemon
        thread is left to end by itself after that). Idempotent."""
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout_s)


def standby_lag(partitions: Iterable[int], stats: MaterializerStats, now_ms: int | None = None
                ) -> dict[int, Mapping[str, Any]]:
    """Per standby partition (sorted): ``{"log_end_offset", "high_watermark", "lag",
    "fetched_ms_ago"}``: the fetch position (next offset), the latest high watermark a fetch
    brought, the offsets between them, and milliseconds since the fetch that brought that high
    watermark was sent (None before the first one). Read from ``stats``, which the run loop writes:
    any thread (each value is an instantaneous sample, as Kafka Streams' ``LagInfo``)."""
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    highs, seen = dict(stats.latest_high_watermarks), dict(stats.high_watermarks_seen_ms)
    positions = dict(stats.next_offsets)
    lag: dict[int, Mapping[str, Any]] = {}
    for partition in sorted(partitions):
        position, high = positions.get(partition, 0), highs.get(partition)
        when = seen.get(partition)
        lag[partition] = {"log_end_offset": position, "high_watermark": high,
                          "lag": None if high is None else max(0, high - position),
                          "fetched_ms_ago": None if when is None else max(0, now_ms - when)}
    return lag
