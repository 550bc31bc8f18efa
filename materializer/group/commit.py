"""The applied offsets of a running Materializer, committed to a Kafka consumer group for lag tools.

With ``MaterializerOptions.commit_group`` (``materializer run --commit-group GROUP``) the run loop
hands :class:`GroupCommitter` each partition's *applied* offset - the store's next offset to
apply, taken after the store write that made it durable - and it commits them to ``GROUP`` with
an OffsetCommit of a member-less ("simple") group (:mod:`materializer.adapters.group_offsets`).
A Kafka consumer commits the same number: the offset of the next record it will process. So
``kafka-consumer-groups.sh --describe --group GROUP`` and lag exporters (Burrow, kafka-lag-exporter,
KMinion) show the materializer's lag as ``LOG-END-OFFSET - CURRENT-OFFSET``.

Rules:

* The offsets are never read back: the store's offsets stay the truth on a restart.
* Never blocking the apply path: a commit is sent without waiting (its answer is taken at the
  next call; a commit sent while the broker is away is answered once it is back), at most one is
  in flight, at most one per ``commit_interval_ms``;
  only changed offsets are sent, and unchanged ones again once a minute, so the group's offsets
  do not expire (``offsets.retention.minutes``) while the topic is idle.
* On shutdown one last commit of the final offsets, waited for up to the request timeout
  (skipped while the broker is away).
* A failed commit is counted (``MaterializerStats.group_commit_failures``, the
  ``materializer_group_commit_failures_total`` metric) and logged once as a warning (the next
  failures of the same kind at DEBUG, until a commit succeeds again); the run goes on. A group
  with active members of its own (another application uses it) refuses member-less commits: the
  warning says so.
* Offsets may go down: a partition whose log was cut back to the leader's, or a topic re-created
  and materialized again, commits its lower applied offset.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future

from materializer.adapters.errors import GroupCommitError
from materializer.adapters.group_offsets import GroupOffsetsClient
from materializer.config import MaterializerOptions
from materializer.stats import MaterializerStats

__all__ = ["REFRESH_INTERVAL_S", "GroupCommitter"]

logger = logging.getLogger(__name__)

#: Unchanged offsets are committed again after this long, seconds (keeps them from expiring).
REFRESH_INTERVAL_S = 60.0


class GroupCommitter:
    """Commits ``topic``'s applied offsets to ``options.commit_group`` (module docstring).

    Args:
        bootstrap_servers: ``host:port[,host:port]``.
        topic: the topic.
        options: ``commit_group``, ``commit_interval_ms``, ``request_timeout_ms`` and the client
            settings (security) are used.
        stats: where commits, failures and the last committed offsets are counted.
        clock: monotonic seconds (tests may pass their own).

    Thread-safety: the run loop's thread only (it alone writes the ``group_*`` stats).

    Raises:
        ValueError: ``options.commit_group`` is None.
    """

    def __init__(self, bootstrap_servers: str, topic: str, options: MaterializerOptions, stats: MaterializerStats,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if options.commit_group is None:
            raise ValueError("GroupCommitter needs options.commit_group")
        self.group = options.commit_group
        self._bootstrap_servers, self._topic, self._options = bootstrap_servers, topic, options
        self._stats = stats
        self._clock = clock
        self._interval_s = options.commit_interval_ms / 1000.0
        self._client: GroupOffsetsClient | None = None
        self._in_flight: tuple[Future[None], dict[int, int]] | None = None
        self._last_sent_at = float("-inf")
        self._last_failure_kind: str | None = None

    def maybe_commit(self, offsets: Mapping[int, int]) -> None:
        """Account for a finished commit, then send ``offsets`` (partition -> applied offset) when
        none is in flight, the interval has passed and they changed (or a minute passed). Never
        waits for the broker."""
        self._collect()
        now = self._clock()
        if self._in_flight is not None or now - self._last_sent_at < self._interval_s:
            return
        pending = {p: o for p, o in offsets.items() if o >= 0}
        if not pending:
            return
        if pending == self._stats.group_committed_offsets and now - self._last_sent_at < REFRESH_INTERVAL_S:
            return
        self._send(pending, now)

    def flush(self, offsets: Mapping[int, int], timeout_s: float | None = None) -> bool:
        """Commit ``offsets`` now and wait up to ``timeout_s`` seconds (default: the request
        timeout) for the answer, after the commit in flight. Returns True when committed."""
        timeout_s = self._options.request_timeout_ms / 1000.0 if timeout_s is None else timeout_s
        deadline = self._clock() + timeout_s
        if self._in_flight is not None:
            self._wait(self._in_flight[0], deadline)
        self._collect()
        pending = {p: o for p, o in offsets.items() if o >= 0}
        if not pending or self._in_flight is not None:
            return not pending
        self._send(pending, self._clock())
        if self._in_flight is None:
            return False
        self._wait(self._in_flight[0], deadline)
        self._collect()
        return self._in_flight is None and self._stats.group_committed_offsets == pending

    def close(self) -> None:
        """Release the client (a commit still in flight is not waited for). Idempotent."""
        client, self._client = self._client, None
        self._in_flight = None
        if client is not None:
            client.close()

    # -- one commit ------------------------------------------------------------------------

    def _send(self, offsets: dict[int, int], now: float) -> None:
        self._last_sent_at = now
        try:
            if self._client is None:
                self._client = GroupOffsetsClient(self._bootstrap_servers, self.group, self._topic,
                                                  self._options.source_options())
            self._in_flight = (self._client.commit(offsets), offsets)
        except GroupCommitError as exc:
            self._failed(exc)

    def _wait(self, future: Future[None], deadline: float) -> None:
        """Serve the client's answers until ``future`` is done or ``deadline`` (clock seconds) passed."""
        while not future.done():
            remaining = deadline - self._clock()
            if remaining <= 0 or self._client is None:
                return
            self._client.poll(min(remaining, 0.1))

    def _collect(self) -> None:
        """Account for the commit in flight once it completed (its answer served by a poll)."""
        if self._client is not None:
            self._client.poll(0)
        if self._in_flight is None or not self._in_flight[0].done():
            return
        (future, offsets), self._in_flight = self._in_flight, None
        exc = future.exception()
        if exc is None:
            self._stats.group_commits += 1
            self._stats.group_committed_offsets = dict(offsets)
            if self._last_failure_kind is not None:
                logger.warning("committing the applied offsets of %s to consumer group %r works again", self._topic,
                               self.group)
                self._last_failure_kind = None
        else:
            self._failed(exc)

    def _failed(self, exc: BaseException) -> None:
        """Count a failed commit; warn once per kind of failure (the run goes on)."""
        self._stats.group_commit_failures += 1
        kind = "active" if isinstance(exc, GroupCommitError) and exc.active_members else type(exc).__name__
        if kind != self._last_failure_kind:
            logger.warning("%s; the materializer keeps running, its store's offsets stay the truth (retrying every "
                           "%.1f s)", exc, self._interval_s)
            self._last_failure_kind = kind
        else:
            logger.debug("group commit failed again: %s", exc)
