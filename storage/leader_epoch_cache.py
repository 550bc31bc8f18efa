"""Leader epochs of a partition: the ``leader-epoch-checkpoint`` file and its cache (KIP-101, KIP-279).

Each entry ``(epoch, start_offset)`` says that the leader of ``epoch`` wrote its first batch at
``start_offset``; entries increase in both fields. A follower (and this local replica) compares
its entries with the leader's to find where their logs diverge (``end_offset_for``).

File format (UTF-8; Kafka ``LeaderEpochCheckpointFile`` over ``CheckpointFile``)::

    0           <- version, must be exactly 0
    2           <- number of entries
    0 0         <- "<epoch> <start offset>", one space when written,
    5 1542         split on runs of whitespace when read

Every line ends in ``\\n`` (``BufferedWriter.newLine``). An empty file, or one that stops after the
version line, has no entries. Reading refuses (``CorruptCheckpointError`` naming the file and the
line): another version, a count that differs from the entry lines, a line that is not two int
tokens (a leading blank counts as a token, as in Java's ``split``), a negative epoch or offset,
and (beyond Kafka, which silently drops them on load) entries whose epochs or start offsets do not
increase. Every write replaces the whole file: ``.tmp``, fsync, atomic rename, fsync of the folder.

Mirrors ``org.apache.kafka.storage.internals.checkpoint.LeaderEpochCheckpointFile``,
``org.apache.kafka.server.common.CheckpointFile``,
``org.apache.kafka.storage.internals.epoch.LeaderEpochFileCache`` and
``org.apache.kafka.storage.internals.log.EpochEntry``.
"""

from __future__ import annotations

import logging
import re
import threading
from bisect import bisect_left, bisect_right
from pathlib import Path
from typing import Iterable, NamedTuple

from .checkpoint_file import INT64, java_int, read_checkpoint, write_checkpoint
from .errors import CorruptCheckpointError, LogStorageError

__all__ = [
    "LEADER_EPOCH_CHECKPOINT_FILE",
    "UNDEFINED_EPOCH",
    "UNDEFINED_EPOCH_OFFSET",
    "EpochEntry",
    "LeaderEpochCheckpointFile",
    "LeaderEpochFileCache",
    "entries_from_batch_epochs",
]

logger = logging.getLogger(__name__)

LEADER_EPOCH_CHECKPOINT_FILE = "leader-epoch-checkpoint"
UNDEFINED_EPOCH = -1
"""Kafka ``OffsetsForLeaderEpochResponse.UNDEFINED_EPOCH``: no epoch."""
UNDEFINED_EPOCH_OFFSET = -1
"""Kafka ``OffsetsForLeaderEpochResponse.UNDEFINED_EPOCH_OFFSET``: no end offset."""

_JAVA_WHITESPACE = re.compile(r"[ \t\n\x0b\f\r]+")  # Java's \s


class EpochEntry(NamedTuple):
    """One leader epoch and the first offset written under it (Kafka ``EpochEntry``)."""

    epoch: int
    start_offset: int


class LeaderEpochCheckpointFile:
    """The ``leader-epoch-checkpoint`` file at ``path`` (see the module docstring for the format)."""

    def __init__(self, path: Path):
        self.path = Path(path)

    def exists(self) -> bool:
        """True when the file exists."""
        return self.path.exists()

    def create_if_missing(self) -> None:
        """Create an empty file (no entries) unless one exists, as Kafka's ``CheckpointFile`` does when
        it is opened.

        Raises:
            LogStorageError: the file cannot be created (a full disk, a read-only file system).
        """
        try:
            with open(self.path, "xb"):
                pass
        except FileExistsError:
            pass
        except OSError as exc:
            raise LogStorageError(f"creating {self.path} failed: {exc.strerror or exc}", path=str(self.path),
                                  position=0, errno=exc.errno) from exc

    def read(self) -> list[EpochEntry]:
        """The entries in file order; ``[]`` for a missing or empty file
        (:func:`~materializer.storage.checkpoint_file.read_checkpoint`).

        Raises:
            CorruptCheckpointError: the file is malformed (the message names the file and the line).
            OSError: the file exists but cannot be read.
        """
        entries: list[EpochEntry] = []

        def entry(line: str, number: int) -> EpochEntry | None:
            tokens = _JAVA_WHITESPACE.split(line)
            while tokens and tokens[-1] == "":
                tokens.pop()  # Java's split drops trailing empty strings (not leading ones)
            if len(tokens) != 2:
                return None
            epoch, start = java_int(tokens[0]), java_int(tokens[1], INT64)
            if epoch is None or start is None:
                return None
            if epoch < 0 or start < 0:
                raise CorruptCheckpointError(f"invalid leader epoch entry on line {number} of {self.path}: {line!r} "
                                             f"(epoch and start offset must not be negative)")
            if entries and (epoch <= entries[-1].epoch or start <= entries[-1].start_offset):
                raise CorruptCheckpointError(
                    f"leader epoch entry on line {number} of {self.path} ({line!r}) does not follow "
                    f"{entries[-1].epoch} {entries[-1].start_offset}: epochs and start offsets must increase")
            entries.append(EpochEntry(epoch, start))
            return entries[-1]

        return read_checkpoint(self.path, entry, description="leader epoch checkpoint file",
                               expected_format="'<epoch> <start offset>'")

    def write(self, entries: Iterable[EpochEntry]) -> None:
        """Replace the file with ``entries`` (``.tmp``, fsync, rename, fsync of the folder).

        Raises:
            LogStorageError: the write failed (a full disk, a read-only file system); the old file
                is untouched.
        """
        try:
            write_checkpoint(self.path, (f"{entry.epoch} {entry.start_offset}" for entry in entries))
        except OSError as exc:
            raise LogStorageError(str(exc), path=str(self.path), position=0, errno=exc.errno) from exc

    def __repr__(self) -> str:
        return f"LeaderEpochCheckpointFile(path={str(self.path)!r})"


def entries_from_batch_epochs(batch_epochs: Iterable[tuple[int, int]],
                              initial: Iterable[EpochEntry] = ()) -> list[EpochEntry]:
    """Fold ``(partition_leader_epoch, base_offset)`` of batches (offset order) into entries by the
    recovery rule of Kafka ``LogSegment.recover``: a batch whose epoch is ``>= 0`` and above the latest
    epoch so far starts a new entry; every other batch changes nothing.

    ``initial`` are entries already known (the cache before the batches).
    """
    entries = list(initial)
    latest = entries[-1].epoch if entries else None
    for epoch, base_offset in batch_epochs:
        if epoch >= 0 and (latest is None or epoch > latest):
            while entries and entries[-1].start_offset >= base_offset:
                entries.pop()  # assign's rule; a valid log never gets here
            entries.append(EpochEntry(epoch, base_offset))
            latest = epoch
    return entries


def _checked_entries(entries: Iterable[EpochEntry]) -> list[EpochEntry]:
    """``entries`` as a list of ``EpochEntry``.

    Raises:
        ValueError: an entry is negative, or epochs or start offsets do not increase.
    """
    checked = [EpochEntry(*entry) for entry in entries]
    for i, entry in enumerate(checked):
        if entry.epoch < 0 or entry.start_offset < 0 or (
                i > 0 and (entry.epoch <= checked[i - 1].epoch or entry.start_offset <= checked[i - 1].start_offset)):
            raise ValueError(f"leader epoch entries must be non-negative and increase in epoch and start offset: "
                             f"{checked}")
    return checked


class LeaderEpochFileCache:
    """The epoch entries of one partition, kept in memory and written to ``path``.

    Deviation from Kafka: ``truncate_from_end`` and ``truncate_from_start`` write the file
    synchronously (Kafka schedules those writes, relying on the loader to truncate again after a
    crash; a synchronous write is simpler and at least as safe). Every mutation writes the file
    first and changes memory only when the write succeeded.

    Thread-safety: mutations hold an internal lock; readers see one consistent list of entries
    (replaced whole on every change) without locking.
    """

    def __init__(self, path: Path, *, entries: Iterable[EpochEntry] | None = None):
        """Load the cache from ``path``, or (``entries`` given) hold ``entries`` without reading the
        file (Kafka's ``withCheckpoint`` constructor); nothing is written until the next change.

        Raises:
            CorruptCheckpointError: (``entries`` None) the file is malformed (file and line named).
            ValueError: ``entries`` do not increase in epoch and start offset, or one is negative.
        """
        self.checkpoint = LeaderEpochCheckpointFile(path)
        self._lock = threading.Lock()
        self._entries: list[EpochEntry] = (self.checkpoint.read() if entries is None
                                           else _checked_entries(entries))

    @property
    def path(self) -> Path:
        """The ``leader-epoch-checkpoint`` file."""
        return self.checkpoint.path

    # -- writes -----------------------------------------------------------------------------------

    def _publish(self, entries: list[EpochEntry]) -> None:
        """Write ``entries`` to the file, then make them the cache's (caller holds ``_lock``)."""
        self.checkpoint.write(entries)
        self._entries = entries

    def assign(self, epoch: int, start_offset: int) -> bool:
        """Record that ``epoch`` starts at ``start_offset`` (Kafka ``LeaderEpochFileCache.assign``).

        Nothing changes when the latest entry has the same epoch and a start offset ``<=
        start_offset``. Otherwise every tail entry whose epoch is ``>= epoch`` or whose start offset
        is ``>= start_offset`` is removed (logged as a warning when that removes more than an entry
        at the same offset), the entry is appended and the file is written synchronously.

        Returns:
            True when the cache (and the file) changed.

        Raises:
            ValueError: ``epoch`` or ``start_offset`` is negative.
            LogStorageError: the file could not be written (the cache is unchanged).
        """
        if epoch < 0 or start_offset < 0:
            raise ValueError(f"received invalid partition leader epoch entry (epoch {epoch}, "
                             f"start offset {start_offset}) for {self.path}")
        latest = self.latest_entry
        if latest is not None and epoch == latest.epoch and start_offset >= latest.start_offset:
            return False  # the common case (every batch of an epoch), decided without the lock
        with self._lock:
            entries = list(self._entries)
            if entries and epoch == entries[-1].epoch and start_offset >= entries[-1].start_offset:
                return False
            removed: list[EpochEntry] = []
            while entries and (entries[-1].epoch >= epoch or entries[-1].start_offset >= start_offset):
                removed.append(entries.pop())
            entries.append(EpochEntry(epoch, start_offset))
            self._publish(entries)
        if len(removed) > 1 or (removed and removed[0].start_offset != start_offset):
            logger.warning("New epoch entry %s caused truncation of conflicting entries %s in %s; the cache now "
                           "holds %d entries", EpochEntry(epoch, start_offset), removed[::-1], self.path, len(entries))
        return True

    def truncate_from_end(self, end_offset: int) -> list[EpochEntry]:
        """Remove every entry whose start offset is ``>= end_offset`` (Kafka ``truncateFromEnd``); a
        negative ``end_offset`` (``UNDEFINED_EPOCH_OFFSET``) removes nothing. The file is written
        synchronously when something was removed.

        Returns:
            The removed entries, in ascending order.

        Raises:
            LogStorageError: the file could not be written (the cache is unchanged).
        """
        with self._lock:
            entries = list(self._entries)
            if end_offset < 0 or not entries or entries[-1].start_offset < end_offset:
                return []
            removed: list[EpochEntry] = []
            while entries and entries[-1].start_offset >= end_offset:
                removed.append(entries.pop())
            self._publish(entries)
        removed.reverse()
        logger.debug("Cleared entries %s from %s after truncating to end offset %d", removed, self.path, end_offset)
        return removed

    def truncate_from_start(self, start_offset: int) -> list[EpochEntry]:
        """Drop history before ``start_offset`` (Kafka ``truncateFromStart``): every entry whose start
        offset is ``<= start_offset`` is removed and the last of them is put back starting at
        ``start_offset`` (so ``truncate_from_start(6)`` keeps an entry at 6). The file is written
        synchronously when the entries changed.

        Returns:
            The removed entries, in ascending order (the last one is back with ``start_offset``).

        Raises:
            LogStorageError: the file could not be written (the cache is unchanged).
        """
        with self._lock:
            entries = list(self._entries)
            cut = bisect_right([entry.start_offset for entry in entries], start_offset)
            if cut == 0:
                return []
            removed = entries[:cut]
            updated = [EpochEntry(removed[-1].epoch, start_offset), *entries[cut:]]
            if updated != self._entries:
                self._publish(updated)
        logger.debug("Cleared entries %s from %s after truncating to start offset %d", removed, self.path,
                     start_offset)
        return removed

    def clear_and_flush(self) -> None:
        """Remove every entry and write the (empty) file (Kafka ``clearAndFlush``).

        Raises:
            LogStorageError: the file could not be written (the cache is unchanged).
        """
        with self._lock:
            self._publish([])

    def replace_all(self, entries: Iterable[EpochEntry]) -> None:
        """Replace every entry with ``entries`` (already ordered) and write the file once (used to
        rebuild the cache from batch headers).

        Raises:
            ValueError: ``entries`` do not increase in epoch and start offset, or one is negative.
            LogStorageError: the file could not be written (the cache is unchanged).
        """
        checked = _checked_entries(entries)
        with self._lock:
            self._publish(checked)

    def flush(self) -> None:
        """Write the current entries to the file.

        Raises:
            LogStorageError: the file could not be written.
        """
        with self._lock:
            self._publish(list(self._entries))

    # -- reads ------------------------------------------------------------------------------------

    def entries(self) -> list[EpochEntry]:
        """Every entry in ascending order (a copy; Kafka ``epochEntries``)."""
        return list(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def latest_entry(self) -> EpochEntry | None:
        """The entry with the highest epoch, or None when empty."""
        entries = self._entries
        return entries[-1] if entries else None

    @property
    def latest_epoch(self) -> int | None:
        """The highest epoch, or None when empty (Kafka ``latestEpoch``)."""
        entries = self._entries
        return entries[-1].epoch if entries else None

    @property
    def earliest_entry(self) -> EpochEntry | None:
        """The entry with the lowest epoch, or None when empty."""
        entries = self._entries
        return entries[0] if entries else None

    def epoch_entry(self, epoch: int) -> EpochEntry | None:
        """The entry of ``epoch``, or None."""
        entries = self._entries
        i = bisect_left([entry.epoch for entry in entries], epoch)
        return entries[i] if i < len(entries) and entries[i].epoch == epoch else None

    def previous_entry(self, epoch: int) -> EpochEntry | None:
        """The entry with the highest epoch below ``epoch``, or None (Kafka ``previousEntry``)."""
        entries = self._entries
        i = bisect_left([entry.epoch for entry in entries], epoch)
        return entries[i - 1] if i > 0 else None

    def previous_epoch(self, epoch: int | None = None) -> int | None:
        """The highest epoch below ``epoch`` (below the latest epoch when ``epoch`` is None), or None
        (Kafka ``previousEpoch()`` and ``previousEpoch(int)``)."""
        if epoch is None:
            epoch = self.latest_epoch
            if epoch is None:
                return None
        entry = self.previous_entry(epoch)
        return None if entry is None else entry.epoch

    def next_epoch(self, epoch: int) -> int | None:
        """The lowest epoch above ``epoch``, or None (Kafka ``nextEpoch``)."""
        entries = self._entries
        i = bisect_right([entry.epoch for entry in entries], epoch)
        return entries[i].epoch if i < len(entries) else None

    def epoch_for_offset(self, offset: int) -> int | None:
        """The epoch of ``offset``: the epoch of the last entry starting at or before it, or None when
        every entry starts after it (Kafka ``epochForOffset``)."""
        entries = self._entries
        i = bisect_right([entry.start_offset for entry in entries], offset)
        return entries[i - 1].epoch if i > 0 else None

    def end_offset_for(self, requested_epoch: int, log_end_offset: int) -> tuple[int, int]:
        """``(epoch, end offset)`` for ``requested_epoch`` (Kafka ``endOffsetFor``, what a leader answers
        to ``OffsetsForLeaderEpoch`` and a Fetch's ``LastFetchedEpoch``).

        Five cases:

        1. ``requested_epoch == UNDEFINED_EPOCH`` (-1): ``(-1, -1)``;
        2. it is the latest epoch: ``(requested_epoch, log_end_offset)``;
        3. no epoch is above it (this includes an empty cache): ``(-1, -1)``;
        4. no epoch is at or below it: ``(requested_epoch, start offset of the first epoch)``;
        5. otherwise: ``(largest epoch <= requested_epoch, start offset of the first epoch above it)``.
        """
        entries = self._entries
        if requested_epoch == UNDEFINED_EPOCH:
            return UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET
        if entries and entries[-1].epoch == requested_epoch:
            return requested_epoch, log_end_offset
        i = bisect_right([entry.epoch for entry in entries], requested_epoch)
        if i == len(entries):
            return UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET
        higher = entries[i]
        if i == 0:
            return requested_epoch, higher.start_offset
        return entries[i - 1].epoch, higher.start_offset

    def __repr__(self) -> str:
        return f"LeaderEpochFileCache(path={str(self.path)!r}, entries={self._entries})"
