"""RocksDB failures translated once into the store's errors (:class:`~materializer.adapters.errors.StoreError`
and its kinds): the only place that reads RocksDB's status text.

A held ``LOCK`` file -> :class:`StoreLockedError`; ``Corruption`` / missing files / unknown column
families -> :class:`StoreCorruptedError` (the Materializer answers it by rebuilding the store from
the local log); anything else -> :class:`StoreError`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from ..errors import StoreCorruptedError, StoreError, StoreLockedError

__all__ = ["map_rocksdb_error", "map_rocksdb_errors"]


def map_rocksdb_error(exc: BaseException, path: Path | str, *, opened_as: Path | str | None = None) -> StoreError:
    """Translate a rocksdict/RocksDB exception into the most specific :class:`StoreError`.

    rocksdict raises plain ``Exception`` whose text starts with RocksDB's status
    (``"IO error: ..."``, ``"Corruption: ..."``, ``"Invalid argument: ..."``); this is the only
    place that reads that text. ``opened_as``: the folder RocksDB was opened at, if not ``path``
    (a reader's folder of links); the message names ``path`` instead.
    """
    message = str(exc) or type(exc).__name__
    if opened_as is not None:
        message = message.replace(str(opened_as), str(path))
    lowered = message.lower()
    if "/lock:" in lowered or "lock hold by current process" in lowered or "while lock file" in lowered:
        return StoreLockedError(
            f"state store {path} is locked by another materializer (RocksDB: {message}); "
            f"stop the other process or use another --data-dir")
    if ("corruption" in lowered or "may be corrupted" in lowered or "no such file or directory" in lowered
            or "column famil" in lowered):
        return StoreCorruptedError(
            f"state store {path} is damaged (RocksDB: {message}); delete it to rebuild it from the local log")
    return StoreError(f"state store {path} failed (RocksDB: {message})")


@contextlib.contextmanager
def map_rocksdb_errors(path: Path | str, *, opened_as: Path | str | None = None) -> Iterator[None]:
    """Context manager: re-raise any non-:class:`StoreError` exception via :func:`map_rocksdb_error`."""
    try:
        yield
    except StoreError:
        raise
    except Exception as exc:  # rocksdict raises bare Exception
        raise map_rocksdb_error(exc, path, opened_as=opened_as) from exc
