"""A consumer-group member's assignment, handed from the membership's thread to the run loop.

:class:`~materializer.adapters.group_membership.GroupMembership` calls its rebalance callbacks
(Kafka's ``ConsumerRebalanceListener.onPartitionsAssigned`` / ``onPartitionsRevoked`` /
``onPartitionsLost``) on its own polling thread. The logs, the store and the fetch path belong to
:meth:`Materializer.run <materializer.materializer.Materializer.run>`'s thread, so the callbacks
only record the change here (:class:`AssignmentChanges`) and wake the run loop; the loop applies
the change between two fetches (:meth:`GroupMember.rebalance <materializer.group.member.GroupMember.rebalance>`:
``close_partitions`` / ``open_partitions``).

What is recorded is the *target*: the set of partitions the member holds after every callback so
far. The run loop compares it with the partitions it has open, so changes net out by
construction: a partition revoked and assigned again before the loop looked is neither closed
nor reopened. A revocation needs no handshake with the coordinator: nothing is committed, and
the other members fetch on their own (the replica path is a read-only follower), so the callback
returns at once and the KIP-848 coordinator is not held up.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from materializer.adapters.group_membership import Partitions

__all__ = ["AssignmentChanges"]


class AssignmentChanges:
    """The partitions of ``topic`` that a group member holds, as its rebalance callbacks say.

    Thread-safe: :meth:`assign` / :meth:`revoke` come from the membership's thread, :meth:`target`
    and :meth:`wait` from any other.

    Args:
        topic: the topic the member materializes (pairs of other topics are ignored).
        wake: called (on the membership's thread) after every change, to cut short a fetch that
            waits for records so the run loop applies the change at once.
    """

    def __init__(self, topic: str, wake: Callable[[], None] | None = None) -> None:
        self.topic = topic
        self._wake = wake
        self._lock = threading.Condition()
        self._target: frozenset[int] = frozenset()
        self._version = 0
        self._leaving = False

    def assign(self, partitions: Partitions) -> None:
        """``on_assign``: ``partitions`` were added to the assignment."""
        self._change(lambda target, mine: target | mine, partitions)

    def revoke(self, partitions: Partitions) -> None:
        """``on_revoke`` / ``on_lost``: ``partitions`` left the assignment (lost ones too: their data
        is still correct, they are only not this member's any more)."""
        self._change(lambda target, mine: target - mine, partitions)

    def _change(self, how: Callable[[frozenset[int], frozenset[int]], frozenset[int]], partitions: Partitions) -> None:
        mine = frozenset(p for topic, p in partitions if topic == self.topic)
        with self._lock:
            if self._leaving or not mine:
                return
            self._target = how(self._target, mine)
            self._version += 1
            self._lock.notify_all()
        if self._wake is not None:
            self._wake()

    def join(self) -> int:
        """A new membership starts: nothing is assigned yet and changes are recorded again. Returns
        the version to :meth:`wait` after for the first assignment."""
        with self._lock:
            self._leaving = False
            self._target = frozenset()
            self._version += 1
            return self._version

    def leave(self) -> None:
        """The member is leaving the group (``Materializer.close``): the revocation of everything that
        closing the membership brings is not recorded (the session is closed next anyway)."""
        with self._lock:
            self._leaving = True

    @property
    def leaving(self) -> bool:
        """True once :meth:`leave` was called: nothing is served from here on."""
        return self._leaving

    def target(self) -> tuple[int, frozenset[int]]:
        """``(version, partitions)``: the assignment after the last callback, and a number that
        grows with each change (0: no assignment came yet)."""
        with self._lock:
            return self._version, self._target

    @property
    def partitions(self) -> frozenset[int]:
        """The assignment after the last callback."""
        return self._target

    def wait(self, after_version: int, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` seconds for a change after ``after_version``; True when one came."""
        with self._lock:
            return self._lock.wait_for(lambda: self._version > after_version, timeout_s)
