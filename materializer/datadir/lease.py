"""How current a topic's state store is: the lease its writer renews, and what readers make of it.

A writer that follows the topic (``materializer run``, continuous or ``--until-caught-up``) keeps
``DIR/topic-lease/<topic>.json``, apart from the completeness marker (``DIR/topic-status/``): a
lease renewed every few seconds must not change the marker's bytes, which a view compares before
and after each catch-up to notice a rebuild or a swap (:meth:`materializer.view.MaterializedView.catch_up`).
It is written atomically (a temporary file renamed over it) and not fsynced: after a power loss it
may be older or gone, which only makes the store look older (or its age unknown), never newer.
Readers (``get``, ``export``, views, ``kafkalog``) only read it, so a read-only mount will do.

**What the age measures.** For each partition the writer holds, the lease records ``as_of_ms``:
the wall-clock time (ms since the epoch, the writer's clock) at which the writer *sent* the latest
Fetch request whose answer's high watermark the state store has applied everything below (every
record a ``read_committed`` consumer reads below it: up to the last stable offset, as the store
is). Records the broker had committed by that time are in the store; records committed later may
not be. The **age** of what a reader serves is ``now - min(as_of_ms)`` over the partitions it
reads, on the reader's clock (a clock skew between hosts adds to it). ``as_of_ms`` moves only on
evidence: an answer from the partition's leader, appended and applied. A writer that cannot write
(a full disk), cannot reach its broker, has lost the topic (deleted), is frozen (SIGSTOP) or has
stopped leaves it where it was, so readers see the age grow; nothing renews it by a timer. On the
consumer fetch path (librdkafka) the answers are the client's cached high watermarks: a partition
counts as answered at each check while the client reports the cluster reachable, ``2 x
fetch.wait.max.ms`` (1 s) before the check.

The file (JSON)::

    {"topic", "writer": {"command", "pid", "host", "since"}, "continuous": bool,
     "interval_ms", "generation", "written_ms",
     "as_of_ms": {"<partition>": ms | null, ...},   # null: held, not current since the writer started
     "group_id": str | null, "session_timeout_ms": ms | null,   # a continuous group member
     "topic_deleted_ms": ms | null}                  # the writer found the topic deleted in the cluster

``generation`` is the completeness marker's when the lease was written: a lease of other data (a
restore swapped new data in since) says nothing of this data, and its age is unknown.

**Group members** (``run --group-id``, continuous): readers refuse a member's served partitions
once their age exceeds the group's session timeout recorded in the lease, as the group coordinator
then moves them to other members (Kafka ``GroupCoordinator`` expires a member whose heartbeats
stop for ``session.timeout.ms``): a frozen member still holds the data dir's lock, but it stops
renewing. A member's lease must name the process the marker's ``served_by`` names; the writer
renews it before the marker names a partition.

This module keeps the file: its readers and its writer (:class:`LeaseWriter`). What is current
in a running ``run`` (its session's high watermarks and applied offsets) is the run's to say:
:class:`materializer.run_lease.RunLease` feeds the writer from there. Imports only the standard
library, the storage engine and the data dir's layout, holder and markers (readers in Spark's
planning processes stay light).
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Self

from materializer.datadir.holder import DataDirHolder
from materializer.datadir.layout import lease_path
from materializer.datadir.markers import topic_status
from materializer.storage.errors import StorageError

__all__ = [
    "Lease",
    "LeaseWriter",
    "StaleStoreError",
    "Staleness",
    "member_lease",
    "read_lease",
    "staleness_of",
    "wall_ms",
]

logger = logging.getLogger(__name__)


def wall_ms() -> int:
    """The wall clock, ms since the epoch (the clock of ``as_of_ms``)."""
    return int(time.time() * 1000)


def _iso(ms: int) -> str:
    return datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


class StaleStoreError(StorageError):
    """A reader refused a store older than the bound it was given (``--max-staleness-ms``,
    ``max_staleness_ms``), or whose age it cannot know under such a bound (no lease).

    Attributes:
        staleness: what the reader knew (:class:`Staleness`).
    """

    def __init__(self, message: str, staleness: "Staleness") -> None:
        super().__init__(message)
        self.staleness = staleness


# -- reading -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Lease:
    """A topic's lease as read (module docstring for the fields' meaning).

    Attributes:
        topic: the topic.
        writer: ``{"command", "pid", "host", "since"}`` of the data dir lock's holder that wrote it.
        continuous: written by a continuous run (else ``--until-caught-up``: as of its end).
        interval_ms: how often the writer renews it at most, ms.
        generation: the completeness marker's generation it was written under (None: none).
        written_ms: when it was last written, ms since the epoch (writer's clock).
        as_of_ms: partition -> as of when the store holds that partition (None: held, never current
            since the writer started).
        group_id / session_timeout_ms: a continuous group member's group and session timeout, ms.
        topic_deleted_ms: the writer found the topic deleted in the cluster at this time (None: not).
    """

    topic: str
    writer: Mapping[str, Any]
    continuous: bool
    interval_ms: int
    generation: str | None
    written_ms: int
    as_of_ms: Mapping[int, int | None]
    group_id: str | None = None
    session_timeout_ms: int | None = None
    topic_deleted_ms: int | None = None

    def describe_writer(self) -> str:
        """```materializer run` (pid 1234, since 2026-11-24T11:40:03Z)``."""
        return (f"`materializer {self.writer.get('command', 'run')}` (pid {self.writer.get('pid')}, "
                f"since {self.writer.get('since')})")

    def written_by(self, served_by: Any) -> bool:
        """The writer is the process ``served_by`` (a marker's ``{"pid", "host", "since"}``) names."""
        if not isinstance(served_by, Mapping):
            return False
        return all(str(self.writer.get(k)) == str(served_by.get(k)) for k in ("pid", "host", "since"))


def read_lease(data_dir: Path | str, topic: str) -> Lease | None:
    """``topic``'s lease in ``data_dir``, or None when there is none or it cannot be read (a power
    loss can leave it empty: its age is then unknown). Writes nothing, takes no lock."""
    try:
        fields = json.loads(lease_path(data_dir, topic).read_bytes())
        return Lease(
            topic=str(fields["topic"]), writer=dict(fields["writer"]), continuous=bool(fields["continuous"]),
            interval_ms=int(fields["interval_ms"]), generation=fields.get("generation"),
            written_ms=int(fields["written_ms"]),
            as_of_ms={int(p): None if t is None else int(t) for p, t in dict(fields["as_of_ms"]).items()},
            group_id=fields.get("group_id"),
            session_timeout_ms=None if fields.get("session_timeout_ms") is None else int(fields["session_timeout_ms"]),
            topic_deleted_ms=None if fields.get("topic_deleted_ms") is None else int(fields["topic_deleted_ms"]))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


@dataclass(frozen=True)
class Staleness:
    """How old what a reader serves is (module docstring: what the age measures).

    Attributes:
        as_of_ms: the store held every record the broker had committed by this time, ms since
            the epoch, for every partition read; None: unknown (``unknown`` says why).
        age_ms: ``now - as_of_ms`` when it was computed (>= 0), ms; None: unknown.
        unknown: why the age is unknown (no lease, a partition never current...), else None.
        topic_deleted_ms: the writer found the topic deleted in the cluster then (the store holds
            its last state), ms since the epoch; None: not.
        writer: who renews (or renewed) the lease, for messages; None without a lease.
    """

    as_of_ms: int | None
    age_ms: int | None
    unknown: str | None = None
    topic_deleted_ms: int | None = None
    writer: str | None = None

    def describe(self) -> str:
        """One phrase: ``as of 2026-11-29T01:40:00.123Z (1234 ms ago, per the lease of `materializer run`
        (pid 1234, since ...))``, or ``age unknown: <why>``, and the topic's deletion if found."""
        if self.as_of_ms is None or self.age_ms is None:
            text = f"age unknown: {self.unknown}"
        else:
            text = f"as of {_iso(self.as_of_ms)} ({self.age_ms} ms ago, per the lease of {self.writer})"
        if self.topic_deleted_ms is not None:
            text += (f"; the topic was deleted in the cluster (found at {_iso(self.topic_deleted_ms)}): this is "
                     "its last state")
        return text

    def check(self, max_staleness_ms: int | None, what: str, bound: str) -> None:
        """Refuse an age over ``max_staleness_ms`` (None: no bound), or an unknown one under a bound.

        Args:
            what: what is read, for the message ("topic 'orders' in data").
            bound: the bound's name as the caller spells it (``--max-staleness-ms``).

        Raises:
            StaleStoreError: one line naming the age, the bound and why.
        """
        if max_staleness_ms is None:
            return
        if self.age_ms is None:
            raise StaleStoreError(f"{what}: {self.describe()}; refused under {bound} {max_staleness_ms}", self)
        if self.age_ms > max_staleness_ms:
            raise StaleStoreError(f"{what} is {self.age_ms} ms old, more than {bound} {max_staleness_ms}: "
                                  f"{self.describe()}", self)


def staleness_of(lease: Lease | None, partitions: Iterable[int], *, generation: str | None,
                 now_ms: int | None = None) -> Staleness:
    """The :class:`Staleness` of reading ``partitions`` of a store whose lease is ``lease`` (read
    before the store was opened or caught up: the store is at least that current) and whose
    completeness marker has ``generation``.

    Unknown when there is no lease, when it was written under another generation (other data), or
    when a partition read has no ``as_of_ms`` (held but never current since its writer started, or
    not in the lease). No partition (an empty topic): as of the lease's last write.
    """
    now = wall_ms() if now_ms is None else now_ms
    if lease is None:
        return Staleness(None, None, "no lease (written by a command that keeps none, such as `materializer "
                                     "restore`, or before leases existed)")
    writer = lease.describe_writer()
    deleted = lease.topic_deleted_ms
    if lease.generation != generation:
        return Staleness(None, None, f"the lease of {writer} is of earlier data (the topic was restored since)",
                         writer=writer)
    wanted = sorted(set(partitions))
    missing = [p for p in wanted if lease.as_of_ms.get(p) is None]
    if missing:
        return Staleness(None, None, f"partition(s) {', '.join(map(str, missing))} not current since {writer} "
                                     "started", deleted, writer)
    as_of = min((t for p in wanted if (t := lease.as_of_ms.get(p)) is not None), default=lease.written_ms)
    return Staleness(as_of, max(0, now - as_of), None, deleted, writer)


def member_lease(lease: Lease | None, served_by: Any, partitions: Iterable[int], *,
                 generation: str | None) -> tuple[int | None, str]:
    """A continuous consumer-group member's served ``partitions`` (its marker's ``served_by``):
    ``(deadline_ms, why)``: readers may serve them until ``deadline_ms`` (wall clock, ms since the
    epoch: their ``as_of_ms`` plus the session timeout), after which ``why`` says why they are
    refused. ``deadline_ms`` None: refused now (no lease of that process, or one without their
    ``as_of_ms``).
    """
    pid = served_by.get("pid") if isinstance(served_by, Mapping) else None
    member = f"the member process that served this data dir's partitions (pid {pid})"
    if lease is None or not lease.written_by(served_by) or lease.session_timeout_ms is None:
        return None, f"{member} has written no lease for them (readers need one to serve a member's partitions)"
    staleness = staleness_of(lease, partitions, generation=generation)
    if staleness.as_of_ms is None:
        return None, f"{member} has not renewed its lease for them: {staleness.unknown}"
    timeout = lease.session_timeout_ms
    return staleness.as_of_ms + timeout, (
        f"{member} has not renewed its lease since {_iso(staleness.as_of_ms)}, longer than the group's session "
        f"timeout ({timeout} ms): frozen (SIGSTOP, a paused VM) or stuck, its data is older than what the group's "
        f"new owner serves")


# -- writing -----------------------------------------------------------------------------------

class LeaseWriter:
    """The lease of one topic, kept by the data dir's writer (module docstring). Build with :meth:`start`;
    the writer's owner tells it at each look what it holds and what is current (:meth:`record`).

    Args:
        data_dir / topic: the lease's place.
        holder: the data dir lock's holder (this process), named in the lease.
        interval_ms: renew at most this often, ms.
        generation: the completeness marker's generation the store is under.
        carried: ``as_of_ms`` of the lease found on disk (the store still holds those partitions as
            of then), so a writer that starts after a long stop shows that age until it is current.
        group_id / session_timeout_ms: a consumer-group member's group and session timeout, ms
            (recorded while it runs continuously: readers refuse its partitions past it).

    Not thread-safe: the run loop's thread uses it (:meth:`staleness` may be read from any thread).
    """

    def __init__(self, data_dir: Path | str, topic: str, holder: DataDirHolder, *, interval_ms: int,
                 generation: str | None, carried: Mapping[int, int] | None = None, group_id: str | None = None,
                 session_timeout_ms: int | None = None) -> None:
        self.data_dir, self.topic, self.holder = Path(data_dir), topic, holder
        self.interval_ms, self.generation = interval_ms, generation
        self.group_id, self.session_timeout_ms = group_id, session_timeout_ms
        #: partition -> as of when the store holds it (None: held, not current since the start)
        self.as_of_ms: dict[int, int | None] = dict(carried or {})
        self.held: frozenset[int] = frozenset()  # the partitions open now
        self.continuous = True
        self.topic_deleted_ms: int | None = None
        self._written: bytes | None = None  # the content last written (without its time)
        self._next_write = 0.0  # monotonic
        self._failing = False

    @classmethod
    def start(cls, data_dir: Path | str, topic: str, holder: DataDirHolder, *, interval_ms: int,
              group_id: str | None = None, session_timeout_ms: int | None = None) -> Self:
        """The writer of ``topic``'s lease, carrying the ``as_of_ms`` of the lease on disk when it is
        of the same data (the marker's generation)."""
        generation = topic_status(data_dir, topic).generation
        previous = read_lease(data_dir, topic)
        carried = ({p: t for p, t in previous.as_of_ms.items() if t is not None}
                   if previous is not None and previous.generation == generation else {})
        return cls(data_dir, topic, holder, interval_ms=interval_ms, generation=generation, carried=carried,
                   group_id=group_id, session_timeout_ms=session_timeout_ms)

    def due(self) -> bool:
        """``interval_ms`` passed since the lease was last written (or it never was)."""
        return time.monotonic() >= self._next_write

    def record(self, held: Iterable[int], current: Mapping[int, int], *, continuous: bool) -> None:
        """One look at the writer: it holds the partitions ``held`` (open now); ``current`` maps each
        whose store holds everything below the latest high watermark known to when the Fetch that
        brought it was sent (``as_of_ms``, which only moves forward); ``continuous``: the run is not
        bounded (a group member's session timeout is recorded only then). Writes the lease if
        anything changed (:meth:`write`)."""
        self.continuous = continuous
        self.held = frozenset(held)
        for partition, as_of in current.items():
            previous = self.as_of_ms.get(partition)
            self.as_of_ms[partition] = as_of if previous is None else max(previous, as_of)
        self.write()

    def topic_deleted(self, at_ms: int | None = None) -> None:
        """The run found the topic deleted in the cluster: record it (written at once)."""
        if self.topic_deleted_ms is None:
            self.topic_deleted_ms = wall_ms() if at_ms is None else at_ms
            self.write()

    def topic_back(self) -> None:
        """The topic is back under the same id: the deletion no longer holds (written at once)."""
        if self.topic_deleted_ms is not None:
            self.topic_deleted_ms = None
            self.write()

    def reset(self) -> None:
        """The topic's local copy was dropped (re-created in the cluster): nothing is current, nothing
        deleted; the marker's generation is read again."""
        self.as_of_ms.clear()
        self.topic_deleted_ms = None
        self.generation = topic_status(self.data_dir, self.topic).generation

    def staleness(self, partitions: Iterable[int] | None = None) -> Staleness:
        """The writer's own store (an in-process view): its :class:`Staleness` now, over
        ``partitions`` (None: every partition open). Any thread."""
        wanted = sorted(self.held if partitions is None else partitions)
        as_of = dict(self.as_of_ms)
        writer = f"this process ({self.holder.describe()})"
        missing = [p for p in wanted if as_of.get(p) is None]
        if missing:
            return Staleness(None, None, f"partition(s) {', '.join(map(str, missing))} not current since {writer} "
                                         "started", self.topic_deleted_ms, writer)
        now = wall_ms()
        when = min((t for p in wanted if (t := as_of.get(p)) is not None), default=now)
        return Staleness(when, max(0, now - when), None, self.topic_deleted_ms, writer)

    def write(self) -> bool:
        """Write the lease now unless its content is the one last written (a temporary file renamed
        over it, no fsync). Returns whether the lease on disk is now this writer's latest. An
        ``OSError`` is logged (once per streak, naming the file), not raised: readers see the age
        grow until a write succeeds."""
        self._next_write = time.monotonic() + self.interval_ms / 1000.0
        continuous = self.continuous
        document = {
            "topic": self.topic,
            "writer": {"command": self.holder.command, "pid": self.holder.pid, "host": self.holder.host,
                       "since": self.holder.since},
            "continuous": continuous, "interval_ms": self.interval_ms, "generation": self.generation,
            "as_of_ms": {str(p): self.as_of_ms.get(p) for p in sorted(self.held | set(self.as_of_ms))},
            "group_id": self.group_id, "session_timeout_ms": self.session_timeout_ms if continuous else None,
            "topic_deleted_ms": self.topic_deleted_ms,
        }
        content = json.dumps(document, sort_keys=True).encode("utf-8")
        if content == self._written:
            return True
        path = lease_path(self.data_dir, self.topic)
        tmp = path.with_name(f".{path.name}.tmp")
        try:
            path.parent.mkdir(exist_ok=True)
            with open(tmp, "wb") as out:
                out.write(json.dumps({**document, "written_ms": wall_ms()}, sort_keys=True).encode("utf-8") + b"\n")
            os.replace(tmp, path)
        except OSError as exc:
            if not self._failing:
                logger.warning("cannot renew the lease %s (%s): readers see the age of topic %s's store grow until "
                               "it can", path, exc.strerror or exc, self.topic)
                self._failing = True
            try:
                os.unlink(tmp)
            except OSError:
                pass
            return False
        if self._failing:
            logger.warning("renewed the lease %s again", path)
            self._failing = False
        self._written = content
        return True
