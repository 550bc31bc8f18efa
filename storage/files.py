"""File names of a partition folder: segment file suffixes and the 20-digit base-offset prefix.

Layout of one partition folder ``<log dir>/<topic>-<partition>/`` (Kafka ``LogFileUtils``)::

    00000000000000000000.log        batches, FileRecords
    00000000000000000000.index      OffsetIndex   (8-byte entries)
    00000000000000000000.timeindex  TimeIndex     (12-byte entries)
    00000000000000000000.txnindex   TransactionIndex (34-byte entries, created lazily)

Temporary suffixes appended to those names: ``.cleaned`` (cleaner output), ``.swap``
(being swapped in), ``.deleted`` (awaiting physical removal).

Mirrors ``org.apache.kafka.storage.internals.log.LogFileUtils``.
"""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path
from typing import Sequence

__all__ = [
    "find_partition_dirs",
    "topic_partition_dirs",
    "write_file_atomically",
    "LOG_FILE_SUFFIX",
    "INDEX_FILE_SUFFIX",
    "TIME_INDEX_FILE_SUFFIX",
    "TXN_INDEX_FILE_SUFFIX",
    "CLEANED_FILE_SUFFIX",
    "SWAP_FILE_SUFFIX",
    "DELETED_FILE_SUFFIX",
    "DELETE_DIR_SUFFIX",
    "FUTURE_DIR_SUFFIX",
    "filename_prefix_from_offset",
    "offset_from_file_name",
    "log_file",
    "offset_index_file",
    "time_index_file",
    "transaction_index_file",
    "is_log_file",
    "is_index_file",
    "parse_partition_dir_name",
    "partition_dir_name",
    "replace_suffix",
    "flush_dir",
    "delete_log_dir",
    "rename_if_exists",
]

LOG_FILE_SUFFIX = ".log"
INDEX_FILE_SUFFIX = ".index"
TIME_INDEX_FILE_SUFFIX = ".timeindex"
TXN_INDEX_FILE_SUFFIX = ".txnindex"
CLEANED_FILE_SUFFIX = ".cleaned"
SWAP_FILE_SUFFIX = ".swap"
DELETED_FILE_SUFFIX = ".deleted"
DELETE_DIR_SUFFIX = "-delete"
FUTURE_DIR_SUFFIX = "-future"

_PREFIX_DIGITS = 20


def filename_prefix_from_offset(offset: int) -> str:
    """Return ``offset`` zero-padded to 20 digits, the name stem of a segment's files.

    Raises:
        ValueError: ``offset`` is negative.
    """
    if offset < 0:
        raise ValueError(f"a segment base offset cannot be negative: {offset}")
    return str(offset).zfill(_PREFIX_DIGITS)


def offset_from_file_name(name: str) -> int:
    """Return the base offset encoded in a segment file name (the digits before the first dot).

    Accepts names with temporary suffixes (``00000000000000000042.log.swap`` -> 42).

    Raises:
        ValueError: the name does not start with an offset.
    """
    stem = os.path.basename(name).split(".", 1)[0]
    if not stem.isdigit():
        raise ValueError(f"not a segment file name: {name!r}")
    return int(stem)


def _segment_file(dir_path: Path, base_offset: int, suffix: str, extra: str) -> Path:
    return Path(dir_path) / (filename_prefix_from_offset(base_offset) + suffix + extra)


def log_file(dir_path: Path, base_offset: int, file_suffix: str = "") -> Path:
    """Path of the ``.log`` file of the segment at ``base_offset`` (plus an optional temp suffix)."""
    return _segment_file(dir_path, base_offset, LOG_FILE_SUFFIX, file_suffix)


def offset_index_file(dir_path: Path, base_offset: int, file_suffix: str = "") -> Path:
    """Path of the ``.index`` file of the segment at ``base_offset``."""
    return _segment_file(dir_path, base_offset, INDEX_FILE_SUFFIX, file_suffix)


def time_index_file(dir_path: Path, base_offset: int, file_suffix: str = "") -> Path:
    """Path of the ``.timeindex`` file of the segment at ``base_offset``."""
    return _segment_file(dir_path, base_offset, TIME_INDEX_FILE_SUFFIX, file_suffix)


def transaction_index_file(dir_path: Path, base_offset: int, file_suffix: str = "") -> Path:
    """Path of the ``.txnindex`` file of the segment at ``base_offset``."""
    return _segment_file(dir_path, base_offset, TXN_INDEX_FILE_SUFFIX, file_suffix)


def is_log_file(path: Path | str) -> bool:
    """True for a plain ``.log`` segment file (no temporary suffix)."""
    return str(path).endswith(LOG_FILE_SUFFIX)


def is_index_file(path: Path | str) -> bool:
    """True for a plain ``.index``, ``.timeindex`` or ``.txnindex`` file (no temporary suffix)."""
    name = str(path)
    return name.endswith((INDEX_FILE_SUFFIX, TIME_INDEX_FILE_SUFFIX, TXN_INDEX_FILE_SUFFIX))


def parse_partition_dir_name(name: str) -> tuple[str, int]:
    """Split ``<topic>-<partition>`` into ``(topic, partition)``.

    Topic names may contain dashes; the partition is the text after the last one.

    Raises:
        ValueError: no dash, empty topic or a non-numeric partition.
    """
    base = os.path.basename(str(name).rstrip("/"))
    topic, sep, partition = base.rpartition("-")
    if not sep or not topic or not partition.isdigit():
        raise ValueError(f"not a partition folder name (<topic>-<partition>): {name!r}")
    return topic, int(partition)


def partition_dir_name(topic: str, partition: int) -> str:
    """Return ``<topic>-<partition>``, the folder name of one partition.

    Raises:
        ValueError: empty topic or negative partition.
    """
    if not topic or partition < 0:
        raise ValueError(f"invalid topic partition: {topic!r} {partition}")
    return f"{topic}-{partition}"


def replace_suffix(path: Path, old_suffix: str, new_suffix: str) -> Path:
    """Return ``path`` with the trailing ``old_suffix`` replaced by ``new_suffix`` (Kafka ``Utils.replaceSuffix``).

    Raises:
        ValueError: ``path`` does not end with ``old_suffix``.
    """
    text = str(path)
    if not text.endswith(old_suffix):
        raise ValueError(f"expected {text!r} to end with {old_suffix!r}")
    return Path(text[: len(text) - len(old_suffix)] + new_suffix)


def flush_dir(dir_path: Path) -> None:
    """fsync a directory so renames and creations in it are durable (Kafka ``Utils.flushDir``)."""
    fd = os.open(str(dir_path), os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def rename_if_exists(source: Path, target: Path) -> Path:
    """Move ``source`` to ``target`` in one atomic rename (``os.replace``: an existing ``target``
    is replaced) and return ``target``; a missing ``source`` is no error, since a segment's index
    files are created lazily (Kafka ``Utils.atomicMoveWithFallback`` behind ``FileRecords.renameTo``
    and ``AbstractIndex.renameTo``, which likewise skip a file that does not exist). Open handles
    and memory maps of the file stay valid. The folder is not fsynced: callers that need the
    rename durable flush it (:func:`flush_dir`).

    Raises:
        OSError: the rename failed for another reason (the path named).
    """
    try:
        os.replace(source, target)
    except FileNotFoundError:
        pass
    return Path(target)


def delete_log_dir(folder: Path) -> None:
    """Delete a partition folder the way Kafka's ``LogManager.asyncDelete`` does: rename it to
    ``<folder>.<32 hex>-delete`` (``LocalLog.logDeleteDirName``), make the rename durable, then
    remove it, so a crash never leaves half a folder under the partition's name (the leftover
    ``-delete`` folder is not a partition folder and is removed later).

    Raises:
        OSError: the folder cannot be renamed or removed (the path named).
    """
    doomed = folder.with_name(f"{folder.name}.{uuid.uuid4().hex}{DELETE_DIR_SUFFIX}")
    folder.rename(doomed)
    flush_dir(folder.parent)
    shutil.rmtree(doomed)


def write_file_atomically(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data``: write ``<path>.tmp``, fsync it, rename it over ``path``, fsync
    the folder (Kafka ``Utils.atomicMoveWithFallback`` after a flushed write), so a crash leaves the
    old file or the new one, never a mix.

    Raises:
        OSError: the write, fsync or rename failed (a full disk, a read-only file system); the
            message names the file, and the temporary file is removed.
    """
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
        flush_dir(path.parent)
    except OSError as exc:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise OSError(exc.errno, f"writing {path} failed: {exc.strerror or exc}") from exc


def find_partition_dirs(log_dirs: Path | Sequence[Path], topic: str | None = None) -> dict[tuple[str, int], Path]:
    """``(topic, partition) -> folder`` of every ``<topic>-<partition>`` folder in ``log_dirs``
    (only ``topic``'s when given), as a broker's LogManager finds them in its ``log.dirs``.

    Names must be canonical (``prices-07`` is not partition 7); other folders (``*-delete``,
    ``*.future``, ``state``) are skipped.

    Raises:
        StorageError: one partition has a folder in two of the log dirs.
    """
    from .errors import StorageError  # files.py is imported by errors' users; keep the import local

    roots = [Path(log_dirs)] if isinstance(log_dirs, (str, Path)) else [Path(d) for d in log_dirs]
    found: dict[tuple[str, int], Path] = {}
    for root in roots:
        for child in sorted(root.iterdir()):
            try:
                key = parse_partition_dir_name(child.name)
            except ValueError:
                continue
            if (topic is not None and key[0] != topic) or child.name != partition_dir_name(*key) \
                    or not child.is_dir():
                continue
            if key in found:
                raise StorageError(f"partition {key[1]} of topic {key[0]!r} is in two log dirs: {found[key]} and {child}")
            found[key] = child
    return found


def topic_partition_dirs(log_dirs: Path | Sequence[Path], topic: str) -> dict[int, Path]:
    """``partition -> folder`` of ``topic`` in ``log_dirs``, for readers that need at least one.

    Raises:
        LogNotFoundError: a log dir is not a folder, or none holds a folder of ``topic``.
        StorageError: one partition has a folder in two of the log dirs.
    """
    from .errors import LogNotFoundError

    roots = [Path(log_dirs)] if isinstance(log_dirs, (str, Path)) else [Path(d) for d in log_dirs]
    for root in roots:
        if not root.is_dir():
            raise LogNotFoundError(f"log dir {root} does not exist or is not a folder")
    found = {partition: path for (_, partition), path in find_partition_dirs(roots, topic).items()}
    if not found:
        raise LogNotFoundError(f"no partition folder of topic {topic!r} ({topic}-0, {topic}-1, ...) in "
                               f"{', '.join(map(str, roots))}")
    return found
