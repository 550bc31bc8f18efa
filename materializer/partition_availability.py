"""Which partitions a run should materialize but cannot fetch now, and why (readiness names them).

A store that lacks a partition, or whose copy of one has stopped following its leader, may answer
"absent" for keys the topic holds or serve values older than the broker's: the run is not ready
while any partition is in that state (:attr:`MaterializerHealth.unavailable_partitions`,
``/health/ready``). Two kinds:

* **not taken on**: a partition of the topic (in group mode: assigned to this member) that has
  no open log, because it has no leader yet (just added with ``create_partitions``, or its only
  replica's broker is down). :meth:`Session.add_partitions` defers such a partition to a later
  metadata probe; until then the store has none of its keys.
* **leaderless**: an open partition whose last fetch could not ask a leader
  (``Ingest.leaderless``): none in the metadata (its leader's broker went down and no in-sync
  replica took over: Kafka's ``NO_LEADER``), or the leader named there does not answer. Its keys
  are as of its last fetch.

Both clear by themselves once a leader answers; the run then reports ready again after the usual
catch-up (a partition taken on late waits for its high watermark like any other).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from materializer.session import Session

__all__ = ["unavailable_partitions", "unavailable_in"]


def unavailable_partitions(wanted: Iterable[int], open_partitions: Collection[int],
                           leaderless: Mapping[int, str], *, group: bool = False) -> dict[int, str]:
    """Partition -> why it cannot be materialized now, sorted by partition (module docstring).

    Args:
        wanted: the partitions the run should materialize: the topic's (``range(partition_count)``)
            or, in group mode, those assigned to this member.
        open_partitions: the partitions with an open log.
        leaderless: open partitions the last fetch found no answering leader for, with why
            (``Ingest.leaderless``; entries of partitions no longer open are ignored).
        group: group mode (the reason of a partition not taken on says "assigned").
    """
    pending = ("assigned here but not taken on yet (no leader known for it, or the assignment is being applied)"
               if group else "in the topic but not taken on yet: no leader known for it")
    result = {p: pending for p in wanted if p not in open_partitions}
    result.update((p, why) for p, why in leaderless.items() if p in open_partitions)
    return dict(sorted(result.items()))


def unavailable_in(session: Session | None, open_partitions: Collection[int],
                   assigned: Collection[int] | None) -> dict[int, str]:
    """:func:`unavailable_partitions` of a run's ``session`` (None: not started, nothing) as of its
    last fetch and metadata probe: the topic's partitions (``session.partition_count``) or, in
    group mode, the ``assigned`` ones. Thread-safe (a health probe's thread)."""
    if session is None:
        return {}
    wanted = range(session.partition_count) if assigned is None else assigned
    return unavailable_partitions(wanted, open_partitions, session.ingest.leaderless(), group=assigned is not None)
