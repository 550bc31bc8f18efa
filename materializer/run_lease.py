"""The lease a ``run`` keeps: the data dir's lease writer, fed from the run's session.

The file and what readers make of it are :mod:`materializer.datadir.lease`'s. This module says,
at each look of the run loop, which partitions the run holds and which of them are current: their
store holds everything below the latest high watermark known, as of when the Fetch that brought
it was sent (:func:`current_as_of`); and it sets the writer up from the run's options (its
interval, and in group mode the group's session timeout: :meth:`RunLease.for_run`).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

from materializer.datadir.holder import DataDirHolder
from materializer.datadir.lease import LeaseWriter, wall_ms

if TYPE_CHECKING:
    from materializer.adapters.group_membership import GroupMembership
    from materializer.config import MaterializerOptions
    from materializer.session import Session

__all__ = ["RunLease", "current_as_of"]

logger = logging.getLogger(__name__)

#: librdkafka's ``fetch.wait.max.ms`` default: the consumer path's answers are at most about this old.
_LIBRDKAFKA_FETCH_WAIT_MS = 500


class RunLease(LeaseWriter):
    """A ``run``'s :class:`~materializer.datadir.lease.LeaseWriter`, built with :meth:`for_run` and
    fed by :meth:`observe` from the run loop.

    Attributes:
        fetch_wait_ms: the consumer path's longest fetch wait, ms (its answers' age).
    """

    fetch_wait_ms: int = _LIBRDKAFKA_FETCH_WAIT_MS

    @classmethod
    def for_run(cls, data_dir: Path | str, topic: str, holder: DataDirHolder, options: "MaterializerOptions",
                membership: "GroupMembership | None" = None) -> "RunLease":
        """:meth:`~materializer.datadir.lease.LeaseWriter.start` for a ``run`` with ``options``:
        ``lease_interval_ms``, librdkafka's ``fetch.wait.max.ms`` from ``client_config`` and, in group
        mode, the group's session timeout (``membership``'s: a KIP-848 group's own, else
        ``group_session_timeout_ms``); the interval is cut to a third of the session timeout when
        longer (a healthy member must never look lapsed)."""
        interval_ms, timeout_ms = options.lease_interval_ms, None
        if options.group_id is not None:
            timeout_ms = options.group_session_timeout_ms
            if membership is not None:
                timeout_ms = membership.session_timeout_ms(timeout_ms)
            if 3 * interval_ms > timeout_ms:
                logger.info("group %r: renewing the lease of %s every %d ms, a third of the group's session timeout "
                            "(%d ms), instead of every %d ms", options.group_id, topic, max(1, timeout_ms // 3),
                            timeout_ms, interval_ms)
                interval_ms = max(1, timeout_ms // 3)
        lease = cls.start(data_dir, topic, holder, interval_ms=interval_ms, group_id=options.group_id,
                          session_timeout_ms=timeout_ms)
        lease.fetch_wait_ms = int(options.client_config.get("fetch.wait.max.ms", _LIBRDKAFKA_FETCH_WAIT_MS))
        return lease

    def observe(self, session: "Session", *, away: bool, continuous: bool, force: bool = False) -> None:
        """One look at the run (from the run loop, after it drained the apply worker once caught up):
        once ``interval_ms`` passed since the last look (at once with ``force``: the marker is about
        to name partitions as served, a run ends), each open partition whose store holds
        everything below the latest high watermark known (:func:`current_as_of`) gets that high
        watermark's ``as_of_ms``, and the lease is written if anything changed. ``away``: the
        broker is unreachable or the topic gone, so nothing is current. ``continuous``: the run is
        not bounded (a group member's session timeout is recorded only then).
        """
        if not force and not self.due():
            return  # looked at once per interval: the in-process view's age is at most that much older
        current = {} if away else current_as_of(session, self.fetch_wait_ms)
        self.record(session.logs, current, continuous=continuous)


def current_as_of(session: "Session", fetch_wait_ms: int = _LIBRDKAFKA_FETCH_WAIT_MS) -> dict[int, int]:
    """``partition -> as_of_ms`` of each open partition whose store holds everything below the
    latest high watermark known (``stats.latest_high_watermarks``): its fetch position reached it
    (the local log end, or the client's position past trailing transaction markers) and the store
    applied the log's committed records (up to its last stable offset). The time is when the fetch
    that brought that high watermark was sent (``stats.high_watermarks_seen_ms``); on the consumer
    path, ``2 x fetch_wait_ms`` before now while the client reports the cluster reachable (its
    cached high watermarks are refreshed first).
    """
    stats = session.context.stats
    source = session.source
    seen = stats.high_watermarks_seen_ms
    if source is not None:  # the consumer path: librdkafka's cached high watermarks, no request
        if not source.reachable:
            return {}
        cached = source.cached_high_watermarks(sorted(session.logs))
        answered = wall_ms() - 2 * fetch_wait_ms
        for partition, cached_high in cached.items():
            if cached_high > stats.latest_high_watermarks.get(partition, -1):
                stats.latest_high_watermarks[partition] = cached_high
            seen[partition] = answered
    applied = session.applier.applied_offsets()
    highs, positions = stats.latest_high_watermarks, stats.next_offsets
    current = {}
    for partition, log in session.logs.items():
        high, when = highs.get(partition), seen.get(partition)
        if high is None or when is None:
            continue
        reached = max(log.log_end_offset, positions.get(partition, 0)) >= high
        if reached and applied.get(partition, -1) >= log.last_stable_offset:
            current[partition] = when
    return current
