"""The group's ``partition -> member`` answer, kept for a moment (issue 39: the query server).

Every read a member refuses (another member's partition, one no member holds during a rebalance)
asks the group coordinator who holds the partition (one DescribeConsumerGroups), and the query
server forwards each such read there. A burst of requests during a rebalance, or steady forwarded
traffic, would be a describe per request. :class:`OwnersCache` keeps one answer (or one failure)
for at most :data:`OWNERS_TTL_S`, and drops it when this member's own assignment changes (a
rebalance callback); concurrent callers wait for the one describe in flight instead of each
sending their own.

Never wrong, only late: an owner named from the cache is the one the coordinator named at most
1 s before. A forward to a member that has lost the partition meanwhile is answered by it with
503 (it refuses a key it does not serve, and never forwards a forwarded request again); a
partition cached as without an owner is 503 with ``Retry-After: 1``, as it was. Kafka's own
clients cache group metadata the same way between refreshes (``metadata.max.age.ms``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from typing import Generic, TypeVar

__all__ = ["OWNERS_TTL_S", "OwnersCache"]

#: Seconds an answer of the group coordinator is reused (the 503's ``Retry-After`` is 1 s too).
OWNERS_TTL_S = 1.0

T = TypeVar("T")


class OwnersCache(Generic[T]):
    """``describe()``'s answer (a ``partition -> owner`` mapping), or the exception it raised,
    reused for ``ttl_s`` seconds while ``epoch()`` stays the same.

    Args:
        describe: asks the group coordinator (raises what it raises).
        epoch: a number that changes when this member's assignment changes (the rebalance
            callbacks' version); a new value drops the kept answer.
        ttl_s: seconds an answer is reused (0: never).
        clock: monotonic seconds (tests pass their own).

    Thread-safe: one describe at a time; callers that arrive meanwhile get its outcome.
    """

    def __init__(self, describe: Callable[[], Mapping[int, T]], epoch: Callable[[], int], *,
                 ttl_s: float = OWNERS_TTL_S, clock: Callable[[], float] = time.monotonic) -> None:
        self._describe, self._epoch, self._ttl_s, self._clock = describe, epoch, ttl_s, clock
        self._lock = threading.Lock()
        self._kept: tuple[float, int, Mapping[int, T] | Exception] | None = None  # (asked at, epoch, outcome)
        #: Describes sent so far (a figure for tests and metrics).
        self.describes = 0

    def __call__(self) -> Mapping[int, T]:
        """The owners (kept, or asked now).

        Raises:
            what ``describe`` raised, for as long as that outcome is kept.
        """
        with self._lock:
            epoch, now = self._epoch(), self._clock()
            kept = self._kept
            if kept is None or kept[1] != epoch or not 0 <= now - kept[0] < self._ttl_s:
                self.describes += 1
                try:
                    outcome: Mapping[int, T] | Exception = self._describe()
                except Exception as exc:  # noqa: BLE001 - kept and raised again below, to each caller
                    outcome = exc
                kept = self._kept = (now, epoch, outcome)
        if isinstance(kept[2], Exception):
            raise kept[2]
        return kept[2]

    def clear(self) -> None:
        """Drop the kept answer: the next call asks."""
        with self._lock:
            self._kept = None
