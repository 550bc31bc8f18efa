"""Kafka's offset checkpoint files: ``recovery-point-offset-checkpoint``, ``log-start-offset-checkpoint``,
``cleaner-offset-checkpoint`` (one per log dir).

Format (UTF-8, LF line ends)::

    0                   <- version, must be 0
    2                   <- number of entries
    my-topic 0 1234     <- "<topic> <partition> <offset>", single spaces when written,
    my-topic 1 77          split on runs of whitespace when read

The version and count lines, reading and atomic writing are every checkpoint's
(:mod:`materializer.storage.checkpoint_file`); this module holds the offset entries' format.

Unlike a broker, which owns every log of its log dirs, one data dir may be shared by several
processes (one per topic), each owning its topic's entries. :func:`update_offset_checkpoint`
therefore merges instead of overwriting: it reads, changes and rewrites the file while holding
an exclusive ``flock`` on ``<file>.lock``, keeping the entries it was not asked to change.

Mirrors ``org.apache.kafka.server.common.CheckpointFile`` and
``org.apache.kafka.storage.internals.checkpoint.OffsetCheckpointFile``.
"""

from __future__ import annotations

import contextlib
import logging
import re
from pathlib import Path
from typing import Callable, Iterable, Iterator, Mapping

from .checkpoint_file import CHECKPOINT_VERSION, INT64, java_int, read_checkpoint, write_checkpoint
from .errors import CorruptCheckpointError
from .file_lock import lock_file, unlock_file

__all__ = [
    "RECOVERY_POINT_CHECKPOINT",
    "LOG_START_OFFSET_CHECKPOINT",
    "CLEANER_OFFSET_CHECKPOINT",
    "CHECKPOINT_VERSION",
    "read_offset_checkpoint",
    "write_offset_checkpoint",
    "update_offset_checkpoint",
]

logger = logging.getLogger(__name__)

TopicPartition = tuple[str, int]

RECOVERY_POINT_CHECKPOINT = "recovery-point-offset-checkpoint"
LOG_START_OFFSET_CHECKPOINT = "log-start-offset-checkpoint"
CLEANER_OFFSET_CHECKPOINT = "cleaner-offset-checkpoint"
_WHITESPACE = re.compile(r"\s+")


def _offset_entry(line: str, _line_number: int) -> tuple[TopicPartition, int] | None:
    """``"<topic> <partition> <offset>"`` (split on runs of whitespace; Kafka's
    ``OffsetCheckpointFile.Formatter.fromString``), or None when the line is not one."""
    parts = _WHITESPACE.split(line.strip())
    if len(parts) != 3 or not parts[0]:
        return None
    partition, offset = java_int(parts[1]), java_int(parts[2], INT64)
    if partition is None or offset is None:
        return None
    return (parts[0], partition), offset


def read_offset_checkpoint(path: Path) -> dict[tuple[str, int], int]:
    """Read a checkpoint file into ``{(topic, partition): offset}``.

    A missing or empty file, or one that stops after its version line, yields ``{}``
    (:func:`~materializer.storage.checkpoint_file.read_checkpoint`).

    Raises:
        CorruptCheckpointError: wrong version, a malformed line, bytes that are not UTF-8, or a
            count that does not match the number of entry lines (the message names the file and
            the line).
    """
    return dict(read_checkpoint(path, _offset_entry, description="checkpoint file",
                                expected_format="'<topic> <partition> <offset>'"))


def write_offset_checkpoint(path: Path, offsets: Mapping[tuple[str, int], int]) -> None:
    """Atomically replace ``path`` with ``offsets`` in Kafka's checkpoint format.

    Entries are written sorted by (topic, partition). The file is written to ``<path>.tmp``,
    fsynced, renamed over ``path``, and the folder is fsynced.

    Raises:
        ValueError: a topic contains whitespace (it could not be read back).
        OSError: the file cannot be written (named in the message).
    """
    lines = []
    for (topic, partition), offset in sorted(offsets.items()):
        if not topic or _WHITESPACE.search(topic):
            raise ValueError(f"topic {topic!r} cannot be written to a checkpoint file")
        lines.append(f"{topic} {int(partition)} {int(offset)}")
    write_checkpoint(Path(path), lines)


def update_offset_checkpoint(
    path: Path,
    updates: Mapping[TopicPartition, int] | Callable[[Mapping[TopicPartition, int]], Mapping[TopicPartition, int]] = {},  # noqa: B006 - never mutated
    remove: Iterable[TopicPartition] | Callable[[TopicPartition], bool] = (),
    *,
    replace_corrupt: bool = False,
) -> dict[TopicPartition, int]:
    """Merge entries into the checkpoint file ``path`` under an exclusive ``flock`` of ``<path>.lock``.

    Under the lock the current entries are read, the entries in ``remove`` (keys, or a
    predicate on ``(topic, partition)``) are dropped, ``updates`` are set, and the file is
    rewritten (:func:`write_offset_checkpoint`) unless nothing changed (a missing file is created,
    except by a conditional update that changes nothing). Every other
    entry is kept, so processes sharing a data dir (one per topic) do not lose each other's.

    Args:
        path: the checkpoint file (created if missing).
        updates: entries to set, or a function of the current entries returning them (for a
            conditional update, e.g. "lower it if above").
        remove: entries to drop before ``updates`` are applied.
        replace_corrupt: a corrupt file is logged and replaced (its entries are lost: the logs
            they belonged to are recovered in full on their next open) instead of raising.

    Returns:
        The entries the file holds afterwards.

    Raises:
        CorruptCheckpointError: the current file is corrupt and ``replace_corrupt`` is False.
        ValueError: a topic contains whitespace.
    """
    path = Path(path)
    with _exclusive_file_lock(path):
        try:
            current = read_offset_checkpoint(path)
        except CorruptCheckpointError as exc:
            if not replace_corrupt:
                raise
            logger.warning("replacing corrupt %s: %s", path, exc)
            current = {}
        if callable(remove):
            entries = {tp: offset for tp, offset in current.items() if not remove(tp)}
        else:
            entries = dict(current)
            for tp in remove:
                entries.pop(tp, None)
        entries.update(updates(current) if callable(updates) else updates)
        if entries != current or (not callable(updates) and not path.exists()):
            write_offset_checkpoint(path, entries)
        return entries


@contextlib.contextmanager
def _exclusive_file_lock(checkpoint: Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``<checkpoint>.lock`` (processes sharing a data dir)."""
    with open(checkpoint.with_name(checkpoint.name + ".lock"), "a+b") as handle:
        lock_file(handle, purpose="the checkpoint file lock")
        try:
            yield
        finally:
            unlock_file(handle)
