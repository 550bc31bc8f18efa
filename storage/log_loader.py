"""Opening a partition folder: finish or roll back interrupted swaps, load segments, recover.

Steps (Kafka ``LogLoader.load``):

1. delete every ``*.deleted`` file; collect ``*.cleaned`` and ``*.swap`` files;
   delete ``.swap`` files whose base offset is ``>=`` the smallest ``.cleaned`` base offset
   (an incomplete split), then delete every ``.cleaned`` file;
2. for the remaining ``.swap`` log files compute ``[min swap base, max swap next offset)`` and
   delete every non-swap file whose base offset lies in that range (segments already replaced
   but not yet renamed ``.deleted``);
3. rename every ``.swap`` file to its final name;
4. load the segments in base offset order; delete index files without a ``.log`` file; a
   missing or corrupt index makes the segment be recovered (indexes rebuilt);
5. without a clean shutdown, recover every segment from the one holding the recovery point on:
   validate every batch (framing, CRC-32C, offset range), rebuild the indexes, cut the file at the
   first invalid byte and delete every later segment (logged with file and byte position and
   reported in ``LoadedLog.truncations``);
6. if the log end offset is below the log start offset, delete every segment (and clear the
   leader epoch cache); create an empty segment at the log start offset if none is left; regrow
   the active segment's indexes;
7. leader epochs: the cache is read from ``leader-epoch-checkpoint`` first and every segment
   recovered in steps 4-6 assigns the epochs of its valid batches; then the entries starting at or
   after the log end offset and those before the log start offset checkpoint are dropped
   (``truncateFromEnd(nextOffset)``, ``truncateFromStart(logStartOffsetCheckpoint)``).
   Deviation from Kafka (which takes the log dir offline on a malformed file and creates an empty
   file when it is missing): a malformed file (warning naming the file and the line), or a missing
   one while the log holds batches (a folder written before this file was kept), is rebuilt from
   the batch headers of every segment with the rule of ``LogSegment.recover``; every v2 batch
   carries its partition leader epoch, so nothing is lost. A missing file with no batch is created
   empty, as Kafka creates it.

Mirrors ``org.apache.kafka.storage.internals.log.LogLoader`` and ``CleanShutdownFileHandler``.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import NamedTuple

from .errors import CorruptCheckpointError, CorruptRecordError, CorruptIndexError, InvalidOffsetError
from .files import (
    CLEANED_FILE_SUFFIX,
    DELETED_FILE_SUFFIX,
    SWAP_FILE_SUFFIX,
    is_index_file,
    is_log_file,
    log_file,
    offset_from_file_name,
    replace_suffix,
    time_index_file,
)
from .log_config import LONG_MAX, LogConfig
from .leader_epoch_cache import (
    LEADER_EPOCH_CHECKPOINT_FILE,
    LeaderEpochCheckpointFile,
    LeaderEpochFileCache,
    entries_from_batch_epochs,
)
from .log_segments import LogSegments
from .segment import LogSegment

__all__ = [
    "CLEAN_SHUTDOWN_FILE",
    "LoadedLog",
    "LogLoader",
    "RecoveryTruncation",
    "has_clean_shutdown_file",
    "write_clean_shutdown_file",
    "delete_clean_shutdown_file",
]

logger = logging.getLogger(__name__)

CLEAN_SHUTDOWN_FILE = ".kafka_cleanshutdown"


def has_clean_shutdown_file(log_dir: Path) -> bool:
    """True if ``<log_dir>/.kafka_cleanshutdown`` exists (the log dir holds partition folders)."""
    return (Path(log_dir) / CLEAN_SHUTDOWN_FILE).exists()


def write_clean_shutdown_file(log_dir: Path) -> None:
    """Create the clean-shutdown marker after every log in ``log_dir`` was flushed and closed."""
    path = Path(log_dir) / CLEAN_SHUTDOWN_FILE
    with open(path, "w", encoding="utf-8") as f:
        f.write("")
        f.flush()
        os.fsync(f.fileno())


def delete_clean_shutdown_file(log_dir: Path) -> None:
    """Remove the clean-shutdown marker (done once the logs of ``log_dir`` are loaded)."""
    try:
        os.remove(Path(log_dir) / CLEAN_SHUTDOWN_FILE)
    except FileNotFoundError:
        pass


class RecoveryTruncation(NamedTuple):
    """Bytes cut from a ``.log`` file during recovery: the file, the byte position of the cut, and
    the segments deleted after it (their ``.log`` paths)."""

    path: Path
    position: int
    bytes_truncated: int
    deleted_segments: tuple[Path, ...]


class LoadedLog(NamedTuple):
    """Result of ``LogLoader.load``: segments, offsets (Kafka ``LoadedLogOffsets``) and the loaded
    leader epoch cache."""

    segments: LogSegments
    log_start_offset: int
    recovery_point: int
    next_offset: int
    truncations: list[RecoveryTruncation]
    leader_epoch_cache: LeaderEpochFileCache


class LogLoader:
    """Loads one partition folder (see the module docstring). Single-threaded, before the log is used."""

    def __init__(self, dir_path: Path, config: LogConfig, *, log_start_offset_checkpoint: int = 0,
                 recovery_point_checkpoint: int = 0, had_clean_shutdown: bool = False):
        self.dir = Path(dir_path)
        self.config = config
        self.log_start_offset_checkpoint = log_start_offset_checkpoint
        self.recovery_point_checkpoint = recovery_point_checkpoint
        self.had_clean_shutdown = had_clean_shutdown
        self.segments = LogSegments()
        self.truncations: list[RecoveryTruncation] = []
        self.leader_epoch_cache, self._epoch_rebuild_reason = self._open_leader_epoch_cache()

    def _open_leader_epoch_cache(self) -> tuple[LeaderEpochFileCache, str | None]:
        """The cache as the file holds it, and why it must be rebuilt from batch headers (None: it
        need not be)."""
        path = self.dir / LEADER_EPOCH_CHECKPOINT_FILE
        if not path.exists():
            return LeaderEpochFileCache(path, entries=()), f"{path} is missing"
        try:
            return LeaderEpochFileCache(path), None
        except CorruptCheckpointError as exc:
            logger.warning("%s; rebuilding the leader epoch cache from the batch headers of %s", exc, self.dir)
            return LeaderEpochFileCache(path, entries=()), str(exc)

    def _files(self) -> list[Path]:
        return sorted(p for p in self.dir.iterdir() if p.is_file())

    def load(self) -> LoadedLog:
        """Run every step and return the loaded segments and offsets."""
        swap_files = self._remove_temp_files_and_collect_swap_files()
        min_swap, max_swap = LONG_MAX, -1
        for swap in swap_files:
            if not is_log_file(replace_suffix(swap, SWAP_FILE_SUFFIX, "")):
                continue
            base = offset_from_file_name(swap.name)
            segment = LogSegment.open(self.dir, base, self.config, file_suffix=SWAP_FILE_SUFFIX)
            logger.info("Found log file %s from interrupted swap operation, which is recoverable from %s files by renaming",
                        swap, SWAP_FILE_SUFFIX)
            min_swap = min(min_swap, base)
            max_swap = max(max_swap, segment.read_next_offset())
            segment.close()
        for path in self._files():
            if path.name.endswith(SWAP_FILE_SUFFIX):
                continue
            try:
                offset = offset_from_file_name(path.name)
            except ValueError:
                continue
            if min_swap <= offset < max_swap:
                logger.info("Deleting segment file %s that is compacted but has not been deleted yet", path)
                path.unlink(missing_ok=True)
        for path in self._files():
            if path.name.endswith(SWAP_FILE_SUFFIX):
                logger.info("Recovering file %s by renaming from %s files", path, SWAP_FILE_SUFFIX)
                os.replace(path, replace_suffix(path, SWAP_FILE_SUFFIX, ""))
        self._load_segment_files()
        self._drop_segments_after_a_cut()
        recovery_point, next_offset = self._recover_log()
        active = self.segments.last_segment()
        assert active is not None  # _recover_log leaves at least one segment
        active.resize_indexes(self.config.max_index_size)
        self._finish_leader_epoch_cache(next_offset)
        first = self.segments.first_segment()
        assert first is not None
        log_start_offset = max(self.log_start_offset_checkpoint, first.base_offset)
        return LoadedLog(self.segments, log_start_offset, recovery_point, next_offset, self.truncations,
                         self.leader_epoch_cache)

    def _finish_leader_epoch_cache(self, next_offset: int) -> None:
        """Rebuild the cache if it must be, then drop entries past the log end offset and before the
        log start offset checkpoint (Kafka ``LogLoader.load``)."""
        cache = self.leader_epoch_cache
        if self._epoch_rebuild_reason is not None:
            batch_epochs = ((header.partition_leader_epoch, header.base_offset)
                            for segment in self.segments.values() for header in segment.log.batch_headers())
            entries = entries_from_batch_epochs(batch_epochs)
            if entries or any(segment.size_in_bytes > 0 for segment in self.segments.values()):
                logger.info("Rebuilt the leader epoch cache of %s from its batch headers (%s): %s", self.dir,
                            self._epoch_rebuild_reason, entries)
                cache.replace_all(entries)
            elif cache.path.exists():
                cache.clear_and_flush()  # a malformed file, and no batch to rebuild from
            else:
                LeaderEpochCheckpointFile(cache.path).create_if_missing()
            self._epoch_rebuild_reason = None
        cache.truncate_from_end(next_offset)
        cache.truncate_from_start(self.log_start_offset_checkpoint)

    def _remove_temp_files_and_collect_swap_files(self) -> list[Path]:
        swap_files: list[Path] = []
        cleaned_files: list[Path] = []
        min_cleaned = LONG_MAX
        for path in self._files():
            name = path.name
            if name.endswith(DELETED_FILE_SUFFIX):
                logger.debug("Deleting stray temporary file %s", path)
                path.unlink(missing_ok=True)
            elif name.endswith(CLEANED_FILE_SUFFIX):
                min_cleaned = min(min_cleaned, offset_from_file_name(name))
                cleaned_files.append(path)
            elif name.endswith(SWAP_FILE_SUFFIX):
                swap_files.append(path)
        valid: list[Path] = []
        for path in swap_files:
            if offset_from_file_name(path.name) >= min_cleaned:
                logger.debug("Deleting invalid swap file %s (min cleaned file offset %d)", path, min_cleaned)
                path.unlink(missing_ok=True)
            else:
                valid.append(path)
        for path in cleaned_files:
            logger.debug("Deleting stray .cleaned file %s", path)
            path.unlink(missing_ok=True)
        return valid

    def _load_segment_files(self) -> None:
        for path in self._files():
            if is_index_file(path):
                if not log_file(self.dir, offset_from_file_name(path.name)).exists():
                    logger.warning("Found an orphaned index file %s, with no corresponding log file", path)
                    path.unlink(missing_ok=True)
            elif is_log_file(path):
                base = offset_from_file_name(path.name)
                time_index_newly_created = not time_index_file(self.dir, base).exists()
                segment = LogSegment.open(self.dir, base, self.config)
                try:
                    segment.sanity_check(time_index_newly_created)
                except FileNotFoundError:
                    if self.had_clean_shutdown or base < self.recovery_point_checkpoint:
                        logger.error("Could not find offset index file corresponding to log file %s, "
                                     "recovering segment and rebuilding index files", path)
                    self._recover_segment(segment)
                except CorruptIndexError as exc:
                    logger.warning("Found a corrupted index file corresponding to log file %s due to %s, "
                                   "recovering segment and rebuilding index files", path, exc)
                    self._recover_segment(segment)
                self.segments.add(segment)

    def _drop_segments_after_a_cut(self) -> None:
        """Delete the segments after one that recovery at load cut (deviation from Kafka).

        Kafka's ``loadSegmentFiles`` recovers a segment whose index fails its sanity check and
        keeps the later segments, so the offsets cut from a middle segment become a hole that no
        reader notices and no follower refetches. Deleting the later segments, as
        ``recoverLog`` does after an unclean shutdown, moves the log end offset back to the cut, so
        a materializer fetches the lost offsets again (and a strict restore refuses the copy).
        """
        cut = [t for t in self.truncations if t.bytes_truncated > 0 and not t.deleted_segments]
        if not cut:
            return
        first = min(cut, key=lambda t: offset_from_file_name(t.path.name))
        base = offset_from_file_name(first.path.name)
        later = [s for s in self.segments.values() if s.base_offset > base]
        if not later:
            return
        logger.warning("Segment %s was cut at byte position %d during load; deleting the %d later segment(s) so "
                       "that the log ends at the cut", first.path, first.position, len(later))
        deleted = tuple(self._remove_and_delete_segments(later))
        self.truncations[self.truncations.index(first)] = first._replace(deleted_segments=deleted)

    def _epoch_cache_for_recovery(self) -> LeaderEpochFileCache | None:
        """The cache recovered segments assign their epochs to; None when it is rebuilt at the end."""
        return self.leader_epoch_cache if self._epoch_rebuild_reason is None else None

    def _recover_segment(self, segment: LogSegment) -> int:
        truncated = segment.recover(leader_epoch_cache=self._epoch_cache_for_recovery())
        if truncated > 0:
            self.truncations.append(
                RecoveryTruncation(segment.log_path, segment.size_in_bytes, truncated, ()))
        return truncated

    def _remove_and_delete_segments(self, segments: list[LogSegment]) -> list[Path]:
        paths = []
        for segment in segments:
            self.segments.remove(segment.base_offset)
            paths.append(segment.log_path)
            logger.info("Deleting segment %s as part of log recovery", segment)
            segment.delete_if_exists()
        return paths

    def _recover_log(self) -> tuple[int, int]:
        if not self.had_clean_shutdown:
            unflushed = self.segments.values(self.recovery_point_checkpoint, LONG_MAX)
            for i, segment in enumerate(unflushed):
                logger.info("Recovering unflushed segment %d of %s", segment.base_offset, self.dir)
                following = self.segments.higher_segment(segment.base_offset)
                try:
                    truncated = segment.recover(
                        next_segment_base_offset=following.base_offset if following is not None else None,
                        leader_epoch_cache=self._epoch_cache_for_recovery())
                except (InvalidOffsetError, OSError) as exc:
                    logger.warning("Found invalid offset during recovery of %s (%s); truncating the segment to "
                                   "its base offset %d", segment.log_path, exc, segment.base_offset)
                    truncated = segment.truncate_to(segment.base_offset)
                if truncated > 0:
                    position = segment.size_in_bytes
                    logger.warning("Corruption found in segment %s: truncated %d bytes at byte position %d; "
                                   "next offset is now %d", segment.log_path, truncated, position,
                                   segment.read_next_offset())
                    deleted = self._remove_and_delete_segments(unflushed[i + 1:])
                    self.truncations.append(RecoveryTruncation(segment.log_path, position, truncated, tuple(deleted)))
                    break
        log_end_offset = self._delete_segments_if_log_start_greater_than_log_end()
        active = self.segments.last_segment()
        if active is None:
            active = LogSegment.open(self.dir, self.log_start_offset_checkpoint, self.config,
                                     preallocate=self.config.preallocate)
            self.segments.add(active)
        if self.had_clean_shutdown and log_end_offset is not None:
            return log_end_offset, log_end_offset
        if log_end_offset is None:
            log_end_offset = active.read_next_offset()
        return min(self.recovery_point_checkpoint, log_end_offset), log_end_offset

    def _delete_segments_if_log_start_greater_than_log_end(self) -> int | None:
        last = self.segments.last_segment()
        if last is None:
            return None
        try:
            log_end_offset = last.read_next_offset(strict=True)
        except CorruptRecordError as exc:
            # Kafka trusts the active segment after a clean shutdown; a damaged one here gave a
            # garbage log end offset and deleted every segment. Recover it instead (cut at the damage).
            logger.warning("The last segment of %s is damaged (%s); recovering it", self.dir, exc)
            self._recover_segment(last)
            log_end_offset = last.read_next_offset()
        if log_end_offset >= self.log_start_offset_checkpoint:
            return log_end_offset
        logger.warning("Deleting all segments of %s because log end offset (%d) is smaller than log start offset %d",
                       self.dir, log_end_offset, self.log_start_offset_checkpoint)
        self._remove_and_delete_segments(self.segments.values())
        self.leader_epoch_cache.clear_and_flush()
        self._epoch_rebuild_reason = None
        return None
