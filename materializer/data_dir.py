"""Who writes a data dir, and whether each of its topics is complete.

The files this module keeps (the whole layout is in :mod:`materializer.config`)::

    DIR/.lock                         exclusive flock of the one process writing DIR; JSON naming it
    DIR/topic-status/<topic>.json     the topic's completeness marker, written last by every command
                                      that builds or replaces the topic's data
    DIR/.staging-<topic>.<hex>/       a topic being built (restore), swapped into DIR at the end:
        <topic>-<p>/  state/<topic>/  topic-configs/<topic>.json      the new folders and config
        swap-intent.json              written when the swap begins: its point of no return
        old/                          DIR's previous folders of the topic, moved aside by the swap

**One writer per data dir** (Kafka ``LogManager.lockLogDirs``, ``FileLock`` on ``<log dir>/.lock``):
``run``, ``restore`` (every form), ``compact`` and ``spark compact`` take :class:`DataDirLock` before
they write anything but ``DIR`` itself. It is a ``flock`` taken without waiting, so the kernel
releases it on any exit (SIGKILL included) and a second writer fails at once with
:class:`~materializer.storage.errors.DataDirLockedError` naming the holder. Readers (``get``,
``export``, :class:`~materializer.view.MaterializedView`, ``kafkalog``) never take it nor wait for it.

**Completeness.** A topic's data is complete when its marker says so, or when the data dir holds its
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

**Swap** (:class:`TopicStaging`; restore from a log dir or a snapshot): the topic is built in a
staging folder inside ``DIR`` (same file system: renames are atomic), then::

    fsync the staging tree ─▶ swap-intent.json ─▶ marker incomplete ─▶ for each folder/file of the
    topic: DIR's ─▶ old/, staging's ─▶ DIR ─▶ DIR's other partition folders of the topic ─▶ old/
    ─▶ fsync folders ─▶ merge the checkpoint entries ─▶ marker complete ─▶ delete the staging folder

An interruption before the intent leaves ``DIR`` as it was (the next writer start deletes the
staging folder); from the intent on, every step can be redone, and the next writer start redoes
the remaining ones (:meth:`DataDirLock.acquire` rolls the swap forward). Readers refuse the topic
while the marker says incomplete.

Imports only the standard library, the storage engine and :mod:`materializer.interrupts`, so
readers in Spark's planning processes stay light.
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import json
import logging
import os
import secrets
import shutil
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Literal, Mapping, NamedTuple, TypeVar

from materializer.interrupts import signals_deferred
from materializer.storage.checkpoint import (
    CLEANER_OFFSET_CHECKPOINT,
    LOG_START_OFFSET_CHECKPOINT,
    RECOVERY_POINT_CHECKPOINT,
    update_offset_checkpoint,
)
from materializer.storage.file_lock import lock_file
from materializer.storage.errors import DataDirLockedError, IncompleteDataDirError
from materializer.storage.files import find_partition_dirs, flush_dir, partition_dir_name, write_file_atomically

__all__ = [
    "LOCK_FILE",
    "STAGING_PREFIX",
    "SWAP_INTENT_FILE",
    "DataDirHolder",
    "DataDirLock",
    "TopicStaging",
    "TopicStatus",
    "mark_complete",
    "mark_incomplete",
    "new_generation",
    "open_when_complete",
    "partition_dir",
    "read_holder",
    "require_complete",
    "state_dir",
    "stopped_without_release",
    "topic_config_path",
    "topic_status",
    "topic_status_path",
]

logger = logging.getLogger(__name__)

#: The lock file of a data dir (Kafka's ``LogManager.LockFileName``).
LOCK_FILE = ".lock"
#: Folder name prefix of a staging folder (``.staging-<topic>.<hex>``; never a partition folder name).
STAGING_PREFIX = ".staging-"
#: The swap's point of no return, inside the staging folder.
SWAP_INTENT_FILE = "swap-intent.json"
_OLD = "old"
_TOPIC_STATUS_DIR = "topic-status"
_LEGACY_RESTORE_PREFIX = ".restore-"  # temporary partition copies of restores before staging folders
_ACQUIRE_ATTEMPTS = 100  # lock files unlinked under us before we give up (only a pathological race)
_HOLDER_READ_ATTEMPTS = 10  # a holder that has just locked writes its JSON a moment later
_HOLDER_READ_PAUSE_S = 0.02
_PROBE_GRACE_S = 0.1  # a writer's lock retried this long: a reader's liveness probe holds it for microseconds

T = TypeVar("T")


# -- layout ----------------------------------------------------------------------------------------

def partition_dir(data_dir: Path | str, topic: str, partition: int) -> Path:
    """``DIR/<topic>-<partition>``: a partition's local log."""
    return Path(data_dir) / partition_dir_name(topic, partition)


def state_dir(data_dir: Path | str, topic: str) -> Path:
    """``DIR/state/<topic>``: the topic's RocksDB state store."""
    return Path(data_dir) / "state" / topic


def topic_config_path(data_dir: Path | str, topic: str) -> Path:
    """``DIR/topic-configs/<topic>.json``: the topic configs the local log was opened with."""
    return Path(data_dir) / "topic-configs" / f"{topic}.json"


def topic_status_path(data_dir: Path | str, topic: str) -> Path:
    """``DIR/topic-status/<topic>.json``: the topic's completeness marker (a folder of its own: in
    ``state/`` a topic ``a.json``'s store would share the name of topic ``a``'s marker)."""
    return Path(data_dir) / _TOPIC_STATUS_DIR / f"{topic}.json"


def _utc_now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# -- one writer ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class DataDirHolder:
    """What ``DIR/.lock`` says of the process holding it.

    Attributes:
        command: the ``materializer`` command (``run``, ``restore --from-log-dir``, ``compact`` ...).
        pid: its process id.
        since: when it took the lock, ISO 8601 UTC (``2026-11-24T11:40:03Z``).
        host: the host name it runs on.
    """

    command: str
    pid: int
    since: str
    host: str

    def describe(self) -> str:
        """```materializer run` (pid 1234, since 2026-11-24T11:40:03Z)``, the host named when not this one."""
        where = "" if self.host == socket.gethostname() else f" on {self.host}"
        return f"`materializer {self.command}` (pid {self.pid}{where}, since {self.since})"

    def is_running(self) -> bool:
        """The holder runs on this host and its pid is alive (a reader's hint, not a proof)."""
        if self.host != socket.gethostname():
            return False
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True


def _parse_holder(data: bytes) -> DataDirHolder | None:
    try:
        fields = json.loads(data)
        return DataDirHolder(str(fields["command"]), int(fields["pid"]), str(fields["since"]), str(fields["host"]))
    except (ValueError, KeyError, TypeError):
        return None


def read_holder(data_dir: Path | str) -> DataDirHolder | None:
    """The holder ``DIR/.lock`` names, or None (no file, or not written yet). Takes no lock."""
    try:
        return _parse_holder((Path(data_dir) / LOCK_FILE).read_bytes())
    except OSError:
        return None


def stopped_without_release(data_dir: Path | str, served_by: Any) -> str | None:
    """Whether the writer a marker names in ``served_by`` (``{"pid", "host", "since"}`` of its
    :class:`DataDirHolder`), which served partitions of ``data_dir`` only while it held it, has
    stopped without taking them back (SIGKILL, a crash, a stop that could not write the marker):
    a description of that, or None while it may still hold the data dir.

    It has stopped when another writer holds the data dir now (``DIR/.lock`` names it), or when
    nothing holds ``DIR/.lock`` and it ran on this host: the kernel drops a ``flock`` with its
    process, also for a reader in another PID namespace or on a read-only mount. A writer on
    another host is not judged by an unlocked file (its file system may not carry locks between
    hosts): None. The probe is a shared non-blocking lock let go at once; a writer starting
    meanwhile retries (:meth:`DataDirLock.acquire`). A frozen writer (SIGSTOP) still holds it: readers
    judge that one by its lease (:func:`materializer.lease.member_lease`).
    """
    if not isinstance(served_by, Mapping):
        return None
    try:
        pid, host, since = int(served_by["pid"]), str(served_by["host"]), served_by.get("since")
    except (KeyError, TypeError, ValueError):
        return None
    held = _lock_held(Path(data_dir))
    holder = read_holder(data_dir)
    # None: not written yet (a writer locks, then writes its name) or unreadable: taken as the same
    same = holder is None or (holder.pid, holder.host) == (pid, host) and since in (None, holder.since)
    local = host == socket.gethostname()
    where = "" if local else f" on {host}"
    if held and not same:
        assert holder is not None
        return (f"the member process that served this data dir's partitions (pid {pid}{where}) has stopped without "
                f"letting them go: {holder.describe()} holds the data dir now")
    if held is False and local:
        return (f"the member process that served this data dir's partitions (pid {pid}) has stopped without "
                "letting them go")
    return None


def _lock_held(data_dir: Path) -> bool | None:
    """True when a process holds ``DIR/.lock``, False when none does (or there is no lock file),
    None when it cannot be told (no ``fcntl``). Takes a shared lock without waiting and lets it go."""
    try:
        fd = os.open(data_dir / LOCK_FILE, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    except OSError:
        return None
    try:
        lock_file(fd, purpose="checking the data dir lock", shared=True, blocking=False)
    except BlockingIOError:
        return True
    except OSError:  # FileLockUnavailableError included
        return None
    finally:
        os.close(fd)  # closing lets a lock taken here go
    return False


class DataDirLock:
    """The exclusive lock of one data dir's writer (Kafka ``LogManager.lockLogDirs``: a ``FileLock``
    on ``<log dir>/.lock``, ``tryLock`` without waiting, "Failed to acquire lock on file .lock in DIR.
    A Kafka instance in another process or thread is using this directory.").

    ``DIR/.lock`` is locked with ``flock(LOCK_EX | LOCK_NB)`` on a descriptor of this process: the
    kernel releases it when the descriptor closes, whatever ends the process. The file then holds
    JSON naming the holder (:class:`DataDirHolder`), which a refused writer and the readers' messages
    quote. Not inherited by child processes (close-on-exec). Use :meth:`acquire` and :meth:`release`,
    or a ``with`` block.

    Attributes:
        data_dir: the data dir.
        holder: this process's :class:`DataDirHolder`.
        created_dir: :meth:`acquire` created ``data_dir``; :meth:`release` removes it again when
            nothing but the lock file is left in it (a command that failed at once leaves no data dir).
    """

    def __init__(self, data_dir: Path, fd: int, holder: DataDirHolder, created_dir: bool) -> None:
        self.data_dir = data_dir
        self.holder = holder
        self.created_dir = created_dir
        self._fd: int | None = fd

    @classmethod
    def acquire(cls, data_dir: Path | str, command: str) -> "DataDirLock":
        """Lock ``data_dir`` (created if missing; nothing else is written before the lock is held)
        for ``command``, then finish what an interrupted writer left (:func:`_finish_interrupted`:
        a swap rolled forward, staging folders deleted).

        Args:
            data_dir: the data dir.
            command: what holds it, as ``materializer <command>`` reads (``run``, ``compact`` ...).

        Raises:
            DataDirLockedError: another process (or another lock of this one) holds it; the message
                names the data dir and the holder, at once (no waiting).
            OSError: the folder or the lock file cannot be created (a read-only file system ...).
        """
        data_dir = Path(data_dir)
        path = data_dir / LOCK_FILE
        created_dir = False
        for _ in range(_ACQUIRE_ATTEMPTS):
            # A holder that created DIR removes the lock file and DIR on release when nothing else
            # was written (see release): then make DIR again and lock the file at the path now.
            try:
                data_dir.mkdir(parents=True)
                created_dir = True
            except FileExistsError:
                pass
            try:
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            except FileNotFoundError:
                continue  # DIR was removed between the mkdir and the open
            try:
                _lock_unless_held(fd)
            except BlockingIOError:
                os.close(fd)
                raise _locked_error(data_dir) from None
            except BaseException:
                os.close(fd)
                raise
            try:
                same = os.path.samestat(os.fstat(fd), os.stat(path))
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)  # we locked a file its holder had unlinked
        else:
            raise DataDirLockedError(f"{data_dir} is being created and removed by other processes as fast as this one "
                                     f"locks it; try again", data_dir=str(data_dir))
        holder = DataDirHolder(command, os.getpid(), _utc_now(), socket.gethostname())
        lock = cls(data_dir, fd, holder, created_dir)
        try:
            _write_holder(fd, path, holder)
            _finish_interrupted(data_dir)
        except BaseException:
            lock.release()
            raise
        return lock

    @property
    def held(self) -> bool:
        """The lock is still held."""
        return self._fd is not None

    def release(self) -> None:
        """Release the lock (idempotent). The lock file stays (Kafka's does), unless this lock created
        ``data_dir`` and nothing else is in it: then both are removed."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            if self.created_dir and os.listdir(self.data_dir) == [LOCK_FILE]:
                with contextlib.suppress(OSError):  # still locked while unlinked: no one else can hold it
                    os.unlink(self.data_dir / LOCK_FILE)
                    os.rmdir(self.data_dir)
        except OSError:
            pass
        finally:
            os.close(fd)

    def __enter__(self) -> "DataDirLock":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.release()

    def __repr__(self) -> str:
        return f"DataDirLock({str(self.data_dir)!r}, {self.holder.describe()}, held={self.held})"


def _lock_unless_held(fd: int) -> None:
    """Lock the data dir's lock file exclusively without waiting for a holder, but through a
    reader's probe (:func:`_lock_held` holds a shared lock for microseconds): a conflict is
    retried for up to ``_PROBE_GRACE_S`` before it is taken for a holder.

    Raises:
        BlockingIOError: another process holds the lock.
    """
    deadline = time.monotonic() + _PROBE_GRACE_S
    while True:
        try:
            lock_file(fd, purpose="the data dir lock", blocking=False)
            return
        except BlockingIOError:
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.005)


def _write_holder(fd: int, path: Path, holder: DataDirHolder) -> None:
    """Write ``holder`` into the locked file: over the previous holder's bytes, then cut to length
    (on a full disk the file's block is reused). Only a courtesy to the refused and to readers: the
    flock is what excludes, so a disk too full for it is logged, not fatal (the command fails at
    its first real write, naming that file)."""
    data = json.dumps(holder.__dict__).encode("utf-8") + b"\n"
    try:
        os.pwrite(fd, data, 0)
        os.ftruncate(fd, len(data))
    except OSError as exc:
        if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise OSError(exc.errno, f"writing {path} failed: {exc.strerror or exc}") from exc
        logger.warning("could not write the holder of %s into it (%s); the lock is held all the same", path.parent,
                       exc.strerror or exc)
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)


def _locked_error(data_dir: Path) -> DataDirLockedError:
    holder = None
    for attempt in range(_HOLDER_READ_ATTEMPTS):
        holder = read_holder(data_dir)
        if holder is not None:
            break
        if attempt + 1 < _HOLDER_READ_ATTEMPTS:
            time.sleep(_HOLDER_READ_PAUSE_S)
    who = holder.describe() if holder is not None else "another process (it has not written its name yet)"
    return DataDirLockedError(f"{data_dir} is being written by {who}; stop it first or use another --data-dir",
                              data_dir=str(data_dir), holder=holder)


# -- completeness markers --------------------------------------------------------------------------

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
              "logs_usable": logs_usable, "since": _utc_now(), "pid": os.getpid(), "host": socket.gethostname(),
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
    marker = {**facts, "topic": topic, "complete": True, "since": _utc_now(),
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


# -- staging and swap ------------------------------------------------------------------------------

class TopicStaging:
    """A folder ``DIR/.staging-<topic>.<hex>/`` in which a command builds a topic's partition folders,
    state store and topic config, swapped into ``DIR`` by :meth:`commit` (module docstring).

    Only the holder of ``DIR``'s :class:`DataDirLock` may use one. As a context manager it deletes
    the folder when the block exits before :meth:`commit` wrote the intent (an error, Ctrl-C); a
    SIGKILL leaves it to the next writer start, which deletes it too.

    Attributes:
        data_dir: the data dir.
        topic: the topic.
        path: the staging folder.
    """

    def __init__(self, lock: DataDirLock, topic: str) -> None:
        if not lock.held:
            raise ValueError(f"{lock!r} is not held: only the data dir's writer stages a topic")
        self.data_dir = lock.data_dir
        self.topic = topic
        self.path = lock.data_dir / f"{STAGING_PREFIX}{topic}.{secrets.token_hex(4)}"
        self.path.mkdir()
        self._intent_written = False

    def partition_dir(self, partition: int) -> Path:
        """Where partition ``partition``'s new folder is built."""
        return partition_dir(self.path, self.topic, partition)

    def state_dir(self) -> Path:
        """Where the new state store is built."""
        return state_dir(self.path, self.topic)

    def topic_config_path(self) -> Path:
        """Where the new topic config is written."""
        return topic_config_path(self.path, self.topic)

    def commit(self, *, recovery_points: Mapping[int, int], log_start_offsets: Mapping[int, int], operation: str,
               facts: Mapping[str, Any] | None = None) -> None:
        """Swap the staged topic into ``DIR`` (module docstring) and mark it complete.

        Args:
            recovery_points / log_start_offsets: partition -> offset, merged into ``DIR``'s
                checkpoints (the topic's other entries are dropped, and its entries in
                ``cleaner-offset-checkpoint``: the new logs have not been cleaned).
            operation: what built it ("restore --from-log-dir"), for the marker and the logs.
            facts: kept in the complete marker.

        Raises:
            OSError: before the intent is written the staged data is left to the context manager
                (``DIR`` untouched); after it, to the next writer start, which finishes the swap.
        """
        staged = sorted(p for (_, p) in find_partition_dirs(self.path, self.topic))
        _fsync_tree(self.path)
        intent = {"topic": self.topic, "operation": operation, "partitions": staged,
                  "recovery_points": {str(p): o for p, o in recovery_points.items()},
                  "log_start_offsets": {str(p): o for p, o in log_start_offsets.items()},
                  "facts": dict(facts or {}), "generation": new_generation()}
        try:
            with signals_deferred():  # the intent, a few renames and fsyncs: Ctrl-C takes effect after them
                write_file_atomically(self.path / SWAP_INTENT_FILE,
                                      json.dumps(intent, sort_keys=True).encode("utf-8"))
                self._intent_written = True
                _roll_forward(self.data_dir, self.path, intent)
        except KeyboardInterrupt as exc:
            if self._intent_written and not self.path.exists():  # the signal came during the swap, held until now
                exc.add_note(f"it came after the new data of topic {self.topic!r} was swapped into {self.data_dir}")
            raise

    def discard(self) -> None:
        """Delete the staging folder unless its swap began (then the next writer start finishes it)."""
        if not self._intent_written:
            shutil.rmtree(self.path, ignore_errors=True)

    def __enter__(self) -> "TopicStaging":
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self.path.exists():
            self.discard()


def _fsync_tree(root: Path) -> None:
    """fsync every file and folder under ``root`` (the staged data is durable before it is swapped in).

    Raises:
        OSError: naming the file that could not be synced.
    """
    for folder, _, files in os.walk(root):
        for path in [*(os.path.join(folder, name) for name in files), folder]:
            try:
                fd = os.open(path, os.O_RDONLY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
            except OSError as exc:
                raise OSError(exc.errno, f"syncing {path} failed: {exc.strerror or exc}") from exc


def _roll_forward(data_dir: Path, staging: Path, intent: Mapping[str, Any]) -> None:
    """Do the swap steps that are not done yet (each can be redone; see the module docstring)."""
    topic = intent["topic"]
    generation = intent["generation"]
    mark_incomplete(data_dir, topic, f"`materializer {intent['operation']}` swapping the new data of the topic in",
                    "the next command that writes the data dir (`materializer run`, `restore`, `compact`) "
                    "finishes the swap", generation=generation)
    old = staging / _OLD
    partitions = [int(p) for p in intent["partitions"]]
    items = [partition_dir_name(topic, p) for p in partitions]
    items += [str(state_dir(Path(), topic)), str(topic_config_path(Path(), topic))]
    for relative in items:
        new, target = staging / relative, data_dir / relative
        if not os.path.lexists(new):
            continue  # moved in already
        if os.path.lexists(target):
            (old / relative).parent.mkdir(parents=True, exist_ok=True)
            os.rename(target, old / relative)
        target.parent.mkdir(parents=True, exist_ok=True)
        os.rename(new, target)
    for (_, partition), folder in sorted(find_partition_dirs(data_dir, topic).items()):
        if partition not in partitions:  # a partition the new data does not have
            old.mkdir(exist_ok=True)
            os.rename(folder, old / folder.name)
    for folder in (data_dir, data_dir / "state", data_dir / "topic-configs"):
        if folder.is_dir():
            flush_dir(folder)

    def of_topic(topic_partition: tuple[str, int]) -> bool:
        return topic_partition[0] == topic

    for name, offsets in ((RECOVERY_POINT_CHECKPOINT, intent["recovery_points"]),
                          (LOG_START_OFFSET_CHECKPOINT, intent["log_start_offsets"])):
        update_offset_checkpoint(data_dir / name, {(topic, int(p)): int(o) for p, o in offsets.items()},
                                 remove=of_topic, replace_corrupt=True)
    if (data_dir / CLEANER_OFFSET_CHECKPOINT).exists():
        update_offset_checkpoint(data_dir / CLEANER_OFFSET_CHECKPOINT, remove=of_topic, replace_corrupt=True)
    mark_complete(data_dir, topic, generation=generation, written_by=intent["operation"], **intent["facts"])
    shutil.rmtree(staging)
    logger.info("%s: swapped the new data of topic %s into %s", intent["operation"], topic, data_dir)


def _finish_interrupted(data_dir: Path) -> None:
    """What a writer start does first, under the lock: roll every begun swap forward, delete every
    staging folder whose swap did not begin (and older restores' ``.restore-*`` copies)."""
    for child in sorted(data_dir.iterdir()):
        if not child.is_dir() or child.is_symlink():
            continue
        if child.name.startswith(STAGING_PREFIX):
            intent_path = child / SWAP_INTENT_FILE
            try:
                intent = json.loads(intent_path.read_bytes())
            except FileNotFoundError:
                intent = None
            except ValueError as exc:  # written atomically: only damage makes it unreadable
                raise IncompleteDataDirError(f"{intent_path} is unreadable ({exc}): the swap it describes cannot be "
                                             f"finished; move {child} away and restore the topic again") from exc
            if intent is None:
                logger.warning("deleting %s, left by a command that was interrupted before it changed %s",
                               child, data_dir)
                shutil.rmtree(child)
            else:
                logger.warning("finishing the swap of topic %s that `materializer %s` began in %s", intent["topic"],
                               intent["operation"], data_dir)
                with signals_deferred():
                    _roll_forward(data_dir, child, intent)
        elif child.name.startswith(_LEGACY_RESTORE_PREFIX):
            logger.warning("deleting %s, a partial copy left by an interrupted restore", child)
            shutil.rmtree(child)
