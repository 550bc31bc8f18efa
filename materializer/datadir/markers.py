"""Whether each topic of a data dir is complete: its marker ``DIR/topic-status/<topic>.json``,
written last by every command that builds or replaces the topic's data.

A topic's data is complete when its marker says so, or when the data dir holds its
state store and no marker (a data dir written before markers existed). Marker states::

    (none) ──mark_incomplete──▶ incomplete {operation, remedy} ──mark_complete──▶ complete {facts}
       complete ──mark_incomplete (a swap, a rebuild of the store)──▶ incomplete ──▶ complete

``logs_usable`` in an incomplete marker says that only the state store is being (re)built: the local
logs are a valid prefix of the topic (``run`` loading a new store), so ``kafkalog`` may read them.
``generation`` changes only when the topic's data is replaced as a whole (a swap, a new ``spark
compact`` output): a reader that planned its work on one generation (``kafkalog``'s splits) refuses
to finish on another. Every marker write is atomic (temporary file, fsync, rename, fsync of the
folder). A reader checks the marker before and after it opens the store
(:func:`open_when_complete`); once open, RocksDB keeps its files open, so it goes on reading the
state it opened even if a swap moves the folder away.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
from pathlib import Path
from typing import Any, Callable, Literal, Mapping, NamedTuple, TypeVar

from materializer.datadir.holder import read_holder, utc_now
from materializer.datadir.layout import state_dir, topic_status_path
from materializer.storage.errors import IncompleteDataDirError
from materializer.storage.files import flush_dir, write_file_atomically

__all__ = [
    "TopicStatus",
    "mark_complete",
    "mark_incomplete",
    "new_generation",
    "open_when_complete",
    "require_complete",
    "topic_status",
]

T = TypeVar("T")


class TopicStatus(NamedTuple):
    """A topic's completeness in a data dir (:func:`topic_status`).

    Attributes:
        topic: the topic.
        state: ``complete`` (the marker says so), ``incomplete`` (it says not, or cannot be read),
            ``legacy`` (no marker, a state store: written before markers, counts as complete) or
            ``absent`` (no marker, no store).
        has_store: the data dir holds the topic's state store (its ``CURRENT`` file).
        operation / remedy / since: of an incomplete marker: what is in progress or was
            interrupted, what to run, since when (ISO 8601 UTC).
        logs_usable: an incomplete marker says the local logs are a valid prefix of the topic.
        generation: changes when the topic's data is replaced (None without a marker).
        pid / host: the process that wrote an incomplete marker.
        facts: what a complete marker records (next offsets, live keys, the command...).
        raw: the marker's bytes (None without one): a reader compares them before and after it opens.
    """

    topic: str
    state: Literal["complete", "incomplete", "legacy", "absent"]
    has_store: bool
    operation: str | None = None
    remedy: str | None = None
    since: str | None = None
    logs_usable: bool = False
    generation: str | None = None
    pid: int | None = None
    host: str | None = None
    facts: Mapping[str, Any] = {}
    raw: bytes | None = None

    @property
    def complete(self) -> bool:
        """``complete`` or ``legacy``."""
        return self.state in ("complete", "legacy")


def _read_marker(data_dir: Path, topic: str) -> bytes | None:
    try:
        return topic_status_path(data_dir, topic).read_bytes()
    except FileNotFoundError:
        return None


def _status_of(data_dir: Path, topic: str, raw: bytes | None) -> TopicStatus:
    has_store = (state_dir(data_dir, topic) / "CURRENT").exists()
    if raw is None:
        return TopicStatus(topic, "legacy" if has_store else "absent", has_store)
    try:
        marker = json.loads(raw)
        complete = marker["complete"]
        if not isinstance(complete, bool):
            raise TypeError(f"'complete' is {complete!r}")
    except (ValueError, KeyError, TypeError) as exc:
        return TopicStatus(topic, "incomplete", has_store,
                           operation=f"its marker {topic_status_path(data_dir, topic)} is unreadable ({exc})",
                           remedy="run `materializer run` (or `materializer restore --overwrite`) to rebuild the topic",
                           raw=raw)
    common = {"topic": topic, "has_store": has_store, "generation": marker.get("generation"),
              "since": marker.get("since"), "raw": raw}
    if complete:
        facts = {k: v for k, v in marker.items() if k not in ("topic", "complete", "generation", "since")}
        return TopicStatus(state="complete", facts=facts, **common)
    return TopicStatus(state="incomplete", operation=marker.get("operation"), remedy=marker.get("remedy"),
                       logs_usable=bool(marker.get("logs_usable")), pid=marker.get("pid"), host=marker.get("host"),
                       **common)


def topic_status(data_dir: Path | str, topic: str) -> TopicStatus:
    """The completeness of ``topic`` in ``data_dir`` (reads the marker and looks for the store;
    writes nothing, takes no lock)."""
    data_dir = Path(data_dir)
    return _status_of(data_dir, topic, _read_marker(data_dir, topic))


def _write_marker(data_dir: Path, topic: str, marker: Mapping[str, Any]) -> None:
    path = topic_status_path(data_dir, topic)
    if not path.parent.is_dir():
        path.parent.mkdir(parents=True, exist_ok=True)
        flush_dir(path.parent.parent)
    write_file_atomically(path, (json.dumps(marker, sort_keys=True, default=str) + "\n").encode("utf-8"))


def new_generation() -> str:
    """A new generation id for :func:`mark_incomplete` of data that replaces the topic's as a whole."""
    return secrets.token_hex(8)


def mark_incomplete(data_dir: Path | str, topic: str, operation: str, remedy: str, *, logs_usable: bool = False,
                    generation: str | None = None) -> None:
    """Write ``topic``'s marker as incomplete, before a command starts building or replacing its data.

    Args:
        operation: what is in progress, as a reader's error quotes it ("the first load of the state
            store by `materializer run`").
        remedy: what to run if it was interrupted ("run `materializer run --until-caught-up`").
        logs_usable: only the state store is being (re)built; the local logs stay readable.
        generation: the generation the data will have (:func:`new_generation`, when the topic's data
            is replaced as a whole); None keeps the current one (None if there is none).

    Raises:
        OSError: the marker cannot be written (named in the message).
    """
    data_dir = Path(data_dir)
    current = topic_status(data_dir, topic)
    marker = {"topic": topic, "complete": False, "operation": operation, "remedy": remedy,
              "logs_usable": logs_usable, "since": utc_now(), "pid": os.getpid(), "host": socket.gethostname(),
              "generation": generation or current.generation}
    _write_marker(data_dir, topic, marker)


def mark_complete(data_dir: Path | str, topic: str, *, generation: str | None = None, **facts: Any) -> None:
    """Write ``topic``'s marker as complete, last, once its data is whole (atomic: temporary file,
    fsync, rename, fsync of the folder).

    Args:
        generation: as :func:`mark_incomplete` (None keeps the current one).
        facts: JSON-serializable facts worth keeping (``written_by``, ``next_offsets``, ``live_keys``).

    Raises:
        OSError: the marker cannot be written.
    """
    data_dir = Path(data_dir)
    current = topic_status(data_dir, topic)
    marker = {**facts, "topic": topic, "complete": True, "since": utc_now(),
              "generation": generation or current.generation}
    _write_marker(data_dir, topic, marker)


def _refusal(data_dir: Path, status: TopicStatus, needs_store: bool) -> IncompleteDataDirError | None:
    topic = status.topic
    if status.state == "incomplete" and not (status.logs_usable and not needs_store):
        since = f" (since {status.since})" if status.since else ""
        holder = read_holder(data_dir)
        if holder is not None and holder.pid == status.pid and holder.is_running():
            state = f"it is still in progress: {holder.describe()}"
        else:
            state = "it did not finish"
        return IncompleteDataDirError(
            f"topic {topic!r} in {data_dir} is incomplete: {status.operation or 'a command that writes it'}{since}; "
            f"{state}; {status.remedy or 'run `materializer run` to complete it'}")
    if needs_store and not status.has_store:
        return IncompleteDataDirError(f"no state store for topic {topic!r} in {data_dir} "
                                      f"(run `materializer run` or `materializer restore` first)")
    return None


def require_complete(data_dir: Path | str, topic: str, *, needs_store: bool = True) -> TopicStatus:
    """Refuse ``topic`` unless a reader may serve it whole; returns its :class:`TopicStatus`.

    Complete means a complete marker, or a store without a marker (legacy). An empty complete store
    is complete (0 rows); a missing one is not.

    Args:
        needs_store: the reader reads the state store (``get``, ``export``, views). False for readers
            of the local logs (``kafkalog``): no store is needed, and an incomplete marker with
            ``logs_usable`` (``run`` loading a new store) does not refuse.

    Raises:
        IncompleteDataDirError: the marker says incomplete (the message names what was in
            progress or interrupted, whether it still runs, and what to run), or ``needs_store``
            and no store: "no state store for topic T in DIR (run `materializer run` or
            `materializer restore` first)".
    """
    data_dir = Path(data_dir)
    status = topic_status(data_dir, topic)
    refusal = _refusal(data_dir, status, needs_store)
    if refusal is not None:
        raise refusal
    return status


def open_when_complete(data_dir: Path | str, topic: str, opener: Callable[[], T], closer: Callable[[T], None], *,
                       attempts: int = 3, seen: Callable[[TopicStatus], None] | None = None) -> T:
    """``opener()`` (a reader opening the topic's store) if the topic is complete before and after it
    and its marker did not change meanwhile (a swap or rebuild that began while it opened would mix
    two states); otherwise ``closer`` what was opened and try again, up to ``attempts`` times. An
    error of ``opener`` while the marker changed is such a race too (tried again), else raised.
    ``seen`` is called with the status (marker bytes and facts) the opened store goes with (a
    reader that follows the writer compares them later: :meth:`materializer.view.MaterializedView.catch_up`).

    Raises:
        IncompleteDataDirError: as :func:`require_complete`, or the marker changed on every attempt.
        whatever ``opener`` raises.
    """
    data_dir = Path(data_dir)
    for _ in range(attempts):
        raw = _read_marker(data_dir, topic)
        status = _status_of(data_dir, topic, raw)
        refusal = _refusal(data_dir, status, needs_store=True)
        if refusal is not None:
            raise refusal
        try:
            opened = opener()
        except Exception:
            if _read_marker(data_dir, topic) != raw:
                continue  # the store was being replaced under the opener (files gone): not damage
            raise
        if _read_marker(data_dir, topic) == raw:
            if seen is not None:
                seen(status)
            return opened
        closer(opened)
    raise IncompleteDataDirError(f"topic {topic!r} in {data_dir} changed {attempts} times while it was being opened "
                                 f"(a restore or a rebuild is replacing it); try again")
