"""Kafka's offset checkpoint files: ``recovery-point-offset-checkpoint``, ``log-start-offset-checkpoint``,
``cleaner-offset-checkpoint`` (one per log dir).

Format (UTF-8, LF line ends)::

    0                   <- version, must be 0
    2                   <- number of entries
    my-topic 0 1234     <- "<topic> <partition> <offset>", single spaces when written,
    my-topic 1 77          split on runs of whitespace when read

An empty file means no entries. Writes go to ``<file>.tmp``, are fsynced, then atomically
renamed over the target and the folder is fsynced.

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

from .errors import CorruptCheckpointError
from .file_lock import lock_file, unlock_file
from .files import write_file_atomically

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
CHECKPOINT_VERSION = 0
_WHITESPACE = re.compile(r"\s+")


def _parse_int(text: str, path: Path, line_number: int, line: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise CorruptCheckpointError(f"malformed line {line_number} in checkpoint file {path}: {line!r}") from None


def read_offset_checkpoint(path: Path) -> dict[tuple[str, int], int]:
    """Read a checkpoint file into ``{(topic, partition): offset}``.

    A missing or empty file yields ``{}``.

    Raises:
        CorruptCheckpointError: wrong version, a malformed line, bytes that are not UTF-8, or a
            count that does not match the number of entry lines (the message names the file and
            the line).
    """
    path = Path(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return {}
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line_number = raw.count(b"\n", 0, exc.start) + 1
        raise CorruptCheckpointError(f"checkpoint file {path} is not UTF-8 text: byte position {exc.start} "
                                     f"(line {line_number}) holds 0x{raw[exc.start]:02x}") from None
    if text == "":
        return {}
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    version = _parse_int(lines[0].strip(), path, 1, lines[0])
    if version != CHECKPOINT_VERSION:
        raise CorruptCheckpointError(f"unrecognized version of the checkpoint file {path}: {version} (line 1, expected {CHECKPOINT_VERSION})")
    if len(lines) < 2:
        raise CorruptCheckpointError(f"checkpoint file {path} ends before the entry count (line 2)")
    expected = _parse_int(lines[1].strip(), path, 2, lines[1])
    entries: dict[tuple[str, int], int] = {}
    count = 0
    for line_number, line in enumerate(lines[2:], start=3):
        parts = _WHITESPACE.split(line.strip())
        if len(parts) != 3 or not parts[0]:
            raise CorruptCheckpointError(f"malformed line {line_number} in checkpoint file {path}: {line!r}")
        partition = _parse_int(parts[1], path, line_number, line)
        offset = _parse_int(parts[2], path, line_number, line)
        entries[(parts[0], partition)] = offset
        count += 1
    if count != expected:
        raise CorruptCheckpointError(
            f"expected {expected} entries in checkpoint file {path}, but found only {count} (line 2)"
        )
    return entries


def write_offset_checkpoint(path: Path, offsets: Mapping[tuple[str, int], int]) -> None:
    """Atomically replace ``path`` with ``offsets`` in Kafka's checkpoint format.

    Entries are written sorted by (topic, partition). The file is written to ``<path>.tmp``,
    fsynced, renamed over ``path``, and the folder is fsynced.

    Raises:
        ValueError: a topic contains whitespace (it could not be read back).
        OSError: the file cannot be written (named in the message).
    """
    path = Path(path)
    lines = [str(CHECKPOINT_VERSION), str(len(offsets))]
    for (topic, partition), offset in sorted(offsets.items()):
        if not topic or _WHITESPACE.search(topic):
            raise ValueError(f"topic {topic!r} cannot be written to a checkpoint file")
        lines.append(f"{topic} {int(partition)} {int(offset)}")
    write_file_atomically(path, ("\n".join(lines) + "\n").encode("utf-8"))


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
