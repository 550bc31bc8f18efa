"""Advisory whole-file locks: POSIX ``flock(2)`` through :mod:`fcntl`, the one module that imports it.

``fcntl`` exists on Linux and macOS only, so it is imported when a lock is first taken, not when
a module that locks is imported: the package, its public API and its pytest plugin
(``materializer.testing.pytest_plugin``, loaded by every pytest run in an environment that has
the package) import on Windows too. Taking a lock there raises :class:`FileLockUnavailableError`,
which names what needed the lock.

The locks are those Kafka's ``FileLock`` (``org.apache.kafka.common.utils.FileLock``) takes on a
log dir: advisory, per open file description, released when the file is closed or the process
dies.
"""

from __future__ import annotations

import sys
from types import ModuleType
from typing import Protocol

__all__ = ["FileLockUnavailableError", "lock_file", "unlock_file"]


class FileLockUnavailableError(OSError):
    """The platform has no ``fcntl`` (Windows): the file locks this package relies on cannot be taken."""


class _HasFileno(Protocol):
    def fileno(self) -> int: ...


def _fcntl(purpose: str) -> ModuleType:
    try:
        import fcntl
    except ImportError as exc:
        raise FileLockUnavailableError(
            f"file locks need fcntl (POSIX: Linux, macOS); {purpose} is not supported on {sys.platform}") from exc
    return fcntl


def lock_file(file: int | _HasFileno, *, purpose: str, shared: bool = False, blocking: bool = True) -> None:
    """Take an advisory ``flock`` on ``file`` (a descriptor or an open file): exclusive unless
    ``shared``; wait for it unless not ``blocking``.

    ``purpose`` says what needs the lock ("the data dir lock", ...), for the error on a platform
    without ``fcntl``.

    Raises:
        BlockingIOError: not ``blocking`` and another open file holds a conflicting lock.
        FileLockUnavailableError: no ``fcntl`` on this platform.
    """
    fcntl = _fcntl(purpose)
    operation = fcntl.LOCK_SH if shared else fcntl.LOCK_EX
    fcntl.flock(file, operation if blocking else operation | fcntl.LOCK_NB)


def unlock_file(file: int | _HasFileno) -> None:
    """Release the ``flock`` taken by :func:`lock_file` on ``file`` (closing the file releases it too)."""
    fcntl = _fcntl("unlocking a file")
    fcntl.flock(file, fcntl.LOCK_UN)
