"""One writer per data dir (Kafka ``LogManager.lockLogDirs``, ``FileLock`` on ``<log dir>/.lock``).

``run``, ``restore`` (every form), ``compact`` and ``spark compact`` take :class:`DataDirLock` before
they write anything but ``DIR`` itself. It is a ``flock`` taken without waiting, so the kernel
releases it on any exit (SIGKILL included) and a second writer fails at once with
:class:`~materializer.storage.errors.DataDirLockedError` naming the holder
(:class:`~materializer.datadir.holder.DataDirHolder`). Readers (``get``, ``export``,
:class:`~materializer.view.MaterializedView`, ``kafkalog``) never take it nor wait for it; they may
ask whether a writer that served partitions has stopped (:func:`stopped_without_release`).

A writer start first finishes what an interrupted writer left
(:func:`~materializer.datadir.swap.finish_interrupted`).
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
from pathlib import Path
from typing import Any, Mapping

from materializer.datadir.holder import DataDirHolder, read_holder, utc_now, write_holder
from materializer.datadir.layout import LOCK_FILE
from materializer.datadir.swap import finish_interrupted
from materializer.storage.errors import DataDirLockedError
from materializer.storage.file_lock import lock_file

__all__ = ["DataDirLock", "stopped_without_release"]

_ACQUIRE_ATTEMPTS = 100  # lock files unlinked under us before we give up (only a pathological race)
_HOLDER_READ_ATTEMPTS = 10  # a holder that has just locked writes its JSON a moment later
_HOLDER_READ_PAUSE_S = 0.02
_PROBE_GRACE_S = 0.1  # a writer's lock retried this long: a reader's liveness probe holds it for microseconds


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
    judge that one by its lease (:func:`materializer.datadir.lease.member_lease`).
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
        for ``command``, then finish what an interrupted writer left
        (:func:`~materializer.datadir.swap.finish_interrupted`: a swap rolled forward, staging folders deleted).

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
        holder = DataDirHolder(command, os.getpid(), utc_now(), socket.gethostname())
        lock = cls(data_dir, fd, holder, created_dir)
        try:
            write_holder(fd, path, holder)
            finish_interrupted(data_dir)
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
