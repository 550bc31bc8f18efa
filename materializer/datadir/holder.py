"""Who holds a data dir: the JSON that its writer puts in ``DIR/.lock``.

The file names the process holding the lock (:class:`DataDirHolder`: command, pid, since, host),
written by :class:`~materializer.datadir.lock.DataDirLock` once it holds the ``flock``. A refused
writer and the readers' messages quote it; readers read it without locking
(:func:`read_holder`). Only a courtesy: the ``flock`` is what excludes.
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import json
import logging
import os
import socket
from dataclasses import dataclass
from pathlib import Path

from materializer.datadir.layout import LOCK_FILE

__all__ = ["DataDirHolder", "read_holder", "utc_now", "write_holder"]

logger = logging.getLogger(__name__)


def utc_now() -> str:
    """Now, ISO 8601 UTC to the second (``2026-11-24T11:40:03Z``): a holder's and a marker's ``since``."""
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


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


def write_holder(fd: int, path: Path, holder: DataDirHolder) -> None:
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
