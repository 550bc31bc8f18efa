"""One log segment: a ``.log`` file of batches and its offset, time and transaction indexes.

The segment's base offset is ``<=`` every offset in it and ``>`` every offset of the previous
segment. Files are ``<base>.log``, ``<base>.index``, ``<base>.timeindex`` and (created lazily)
``<base>.txnindex``, each with an optional temporary suffix (``.cleaned``, ``.swap``, ``.deleted``).

Index rule (per batch): while appending, for every batch, if the bytes appended
since the last index entry are ``> index.interval.bytes`` (strict), an offset index entry
``(batch last offset, batch start position)`` and a time index entry for the largest timestamp
so far are added. The counter lives in memory only and restarts at 0 when the segment is
reopened or truncated, exactly as in Kafka; ``recover()`` applies the same rule from scratch.

Thread-safety: not thread-safe; the owning ``Log`` serializes writers with ``Log.lock``.

Mirrors ``org.apache.kafka.storage.internals.log.LogSegment``, ``LazyIndex`` and ``RollParams``.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Iterator, NamedTuple

from .clock import wall_clock_ms
from .errors import CorruptIndexError, CorruptRecordError, SegmentOffsetOverflowError
from .index import INT32_MAX
from .file_records import FileRecords, LogOffsetPosition, TimestampAndOffset
from .files import (
    CLEANED_FILE_SUFFIX,
    log_file,
    offset_index_file,
    rename_if_exists,
    replace_suffix,
    time_index_file,
    transaction_index_file,
)
from .log_config import LONG_MAX, LogConfig
from .offset_index import OffsetIndex
from .record_batch import RecordBatch, iter_batches
from .time_index import TimeIndex, TimestampOffset
from .transaction_index import AbortedTxn, TransactionIndex, TxnIndexSearchResult

if TYPE_CHECKING:  # pragma: no cover
    from .leader_epoch_cache import LeaderEpochFileCache

__all__ = ["LogSegment", "RollParams"]

logger = logging.getLogger(__name__)


class RollParams(NamedTuple):
    """Inputs of ``LogSegment.should_roll`` (Kafka ``RollParams``); times in ms, sizes in bytes."""

    max_segment_ms: int
    max_segment_bytes: int
    max_timestamp_in_messages: int
    max_offset_in_messages: int
    messages_size: int
    now_ms: int



class LogSegment:
    """A segment of a partition's log (see the module docstring for files and invariants)."""

    def __init__(self, log: FileRecords, dir_path: Path, base_offset: int, config: LogConfig, *,
                 file_suffix: str = "", roll_jitter_ms: int = 0):
        self.log = log
        self.dir = Path(dir_path)
        self.base_offset = base_offset
        self.config = config
        self.index_interval_bytes = config.index_interval_bytes
        self.roll_jitter_ms = roll_jitter_ms
        self._offset_index_path = offset_index_file(self.dir, base_offset, file_suffix)
        self._time_index_path = time_index_file(self.dir, base_offset, file_suffix)
        self._offset_index: OffsetIndex | None = None
        self._time_index: TimeIndex | None = None
        self.txn_index = TransactionIndex(base_offset, transaction_index_file(self.dir, base_offset, file_suffix))
        self._bytes_since_last_index_entry = 0
        self._max_timestamp_and_offset_so_far: TimestampOffset | None = None  # None = not loaded yet
        self._rolling_based_timestamp: int | None = None  # first batch max timestamp, loaded lazily
        self._created_ms = wall_clock_ms()

    @classmethod
    def open(cls, dir_path: Path, base_offset: int, config: LogConfig, *, file_suffix: str = "",
             preallocate: bool = False) -> "LogSegment":
        """Open (or create) the segment at ``base_offset`` in ``dir_path``.

        Indexes are opened lazily on first use, preallocated to ``segment.index.bytes`` when new.
        ``preallocate`` extends a new ``.log`` file to ``segment.bytes``.
        """
        records = FileRecords.open(log_file(dir_path, base_offset, file_suffix),
                                   init_file_size=config.segment_bytes, preallocate=preallocate)
        return cls(records, dir_path, base_offset, config, file_suffix=file_suffix,
                   roll_jitter_ms=config.random_segment_jitter_ms())

    # -- files -------------------------------------------------------------------------------

    @property
    def index(self) -> OffsetIndex:
        """The offset index (opened on first use)."""
        if self._offset_index is None:
            self._offset_index = OffsetIndex(self._offset_index_path, self.base_offset, self.config.max_index_size)
        return self._offset_index

    @property
    def time_index(self) -> TimeIndex:
        """The time index (opened on first use)."""
        if self._time_index is None:
            self._time_index = TimeIndex(self._time_index_path, self.base_offset, self.config.max_index_size)
        return self._time_index

    @property
    def log_path(self) -> Path:
        """Path of the ``.log`` file (with its current suffix)."""
        return self.log.path

    @property
    def offset_index_path(self) -> Path:
        """Path of the ``.index`` file."""
        return self._offset_index_path

    @property
    def time_index_path(self) -> Path:
        """Path of the ``.timeindex`` file."""
        return self._time_index_path

    @property
    def size_in_bytes(self) -> int:
        """Logical size of the ``.log`` file in bytes."""
        return self.log.size_in_bytes

    @property
    def last_modified_ms(self) -> int:
        """mtime of the ``.log`` file in ms."""
        return self.log.last_modified_ms()

    def set_last_modified_ms(self, ms: int) -> None:
        """Set the mtime of the ``.log`` and index files (the cleaner keeps the source segment's)."""
        self.log.set_last_modified_ms(ms)
        for path in (self._offset_index_path, self._time_index_path):
            if path.exists():
                os.utime(path, ns=(ms * 1_000_000, ms * 1_000_000))

    # -- timestamps ----------------------------------------------------------------------------

    def _read_max_timestamp_and_offset_so_far(self) -> TimestampOffset:
        if self._max_timestamp_and_offset_so_far is None:
            self._max_timestamp_and_offset_so_far = self.time_index.last_entry
        return self._max_timestamp_and_offset_so_far

    @property
    def max_timestamp_so_far(self) -> int:
        """Largest batch max timestamp (ms) appended so far, -1 if none."""
        return self._read_max_timestamp_and_offset_so_far().timestamp

    @property
    def offset_of_max_timestamp_so_far(self) -> int:
        """Last offset of the batch holding ``max_timestamp_so_far``."""
        return self._read_max_timestamp_and_offset_so_far().offset

    @property
    def largest_record_timestamp(self) -> int | None:
        """``max_timestamp_so_far`` if ``>= 0`` else None."""
        ts = self.max_timestamp_so_far
        return ts if ts >= 0 else None

    @property
    def largest_timestamp(self) -> int:
        """``max_timestamp_so_far`` if ``>= 0``, else the file mtime in ms (used by retention.ms)."""
        ts = self.max_timestamp_so_far
        return ts if ts >= 0 else self.last_modified_ms

    def _load_first_batch_timestamp(self) -> None:
        if self._rolling_based_timestamp is None:
            for _, batch in self.log.batches_from(0):
                self._rolling_based_timestamp = batch.max_timestamp
                break

    def first_batch_timestamp(self) -> int:
        """The first batch's max timestamp in ms, or ``2**63 - 1`` if none (used by max.compaction.lag.ms)."""
        self._load_first_batch_timestamp()
        ts = self._rolling_based_timestamp
        return ts if ts is not None and ts >= 0 else LONG_MAX

    def time_waited_for_roll(self, now_ms: int, message_timestamp_ms: int) -> int:
        """ms since the first batch's timestamp by record time, or wall clock since creation when it has none."""
        self._load_first_batch_timestamp()
        ts = self._rolling_based_timestamp
        if ts is not None and ts >= 0:
            return message_timestamp_ms - ts
        return now_ms - self._created_ms

    def should_roll(self, roll_params: RollParams) -> bool:
        """True if the incoming batches must go to a new segment (size, time, full index, offset overflow)."""
        size = self.log.size_in_bytes
        if size > roll_params.max_segment_bytes - roll_params.messages_size:
            return True
        if size > 0 and (self.time_waited_for_roll(roll_params.now_ms, roll_params.max_timestamp_in_messages)
                         > roll_params.max_segment_ms - self.roll_jitter_ms):
            return True
        return (self.index.is_full() or self.time_index.is_full()
                or not self.index.can_append_offset(roll_params.max_offset_in_messages))

    # -- append --------------------------------------------------------------------------------

    def _ensure_offset_in_range(self, offset: int) -> None:
        if not self.index.can_append_offset(offset):
            raise SegmentOffsetOverflowError(
                f"detected offset overflow at offset {offset} in segment {self.log_path} (base offset {self.base_offset})",
                segment=self.base_offset, offset=offset,
            )

    def append(self, largest_offset: int, batches: bytes | memoryview | RecordBatch) -> None:
        """Append already framed batches whose last offset is ``largest_offset``.

        Adds index entries per batch (see the module docstring).

        Raises:
            SegmentOffsetOverflowError: ``largest_offset - base_offset`` does not fit an int32.
        """
        if isinstance(batches, RecordBatch):
            self.append_batch(batches)
            return
        data = batches
        if len(data) == 0:
            return
        self._ensure_offset_in_range(largest_offset)
        parsed = [batch for _, batch in iter_batches(data, 0, path=str(self.log_path))]
        position = self.log.size_in_bytes
        if position == 0 and parsed:
            self._rolling_based_timestamp = parsed[0].max_timestamp
        self.log.append(data)
        for batch in parsed:
            self._index_batch(batch, position)
            position += batch.size_in_bytes

    def append_batch(self, batch: RecordBatch) -> None:
        """Append one batch (the hot path of ``Log.append_batch``).

        Raises:
            SegmentOffsetOverflowError: its last offset does not fit the segment's relative range.
        """
        self._ensure_offset_in_range(batch.last_offset)
        position = self.log.size_in_bytes
        if position == 0:
            self._rolling_based_timestamp = batch.max_timestamp
        self.log.append(batch.buffer)
        self._index_batch(batch, position)

    def _index_batch(self, batch: RecordBatch, position: int) -> None:
        max_so_far = self._read_max_timestamp_and_offset_so_far()
        if batch.max_timestamp > max_so_far.timestamp:
            max_so_far = TimestampOffset(batch.max_timestamp, batch.last_offset)
            self._max_timestamp_and_offset_so_far = max_so_far
        if self._bytes_since_last_index_entry > self.index_interval_bytes:
            self.index.append(batch.last_offset, position)
            self.time_index.maybe_append(max_so_far.timestamp, max_so_far.offset)
            self._bytes_since_last_index_entry = 0
        self._bytes_since_last_index_entry += batch.size_in_bytes

    def append_from_file(self, records: FileRecords, start_position: int) -> int:
        """Copy batches from ``records`` starting at ``start_position`` bytes until one would overflow
        this segment's offset range; returns the bytes copied (Kafka ``appendFromFile``)."""
        copied = 0
        for position, batch in records.batches_from(start_position):
            if not self.index.can_append_offset(batch.last_offset):
                break
            self.append_batch(batch)
            copied = position + batch.size_in_bytes - start_position
        return copied

    def update_txn_index(self, aborted_txn: AbortedTxn) -> None:
        """Record an aborted transaction whose ABORT marker is in this segment."""
        self.txn_index.append(aborted_txn)

    def collect_aborted_txns(self, fetch_offset: int, upper_bound_offset: int) -> TxnIndexSearchResult:
        """Aborted transactions of this segment overlapping ``[fetch_offset, upper_bound_offset)``."""
        return self.txn_index.collect_aborted_txns(fetch_offset, upper_bound_offset)

    # -- read ----------------------------------------------------------------------------------

    def translate_offset(self, offset: int, starting_file_position: int = 0) -> LogOffsetPosition | None:
        """Locate the batch containing ``offset`` (or the first batch after it): index lookup, then scan.

        Returns ``(batch last offset, position, size)`` or None when every batch ends before ``offset``.
        """
        mapping = self.index.lookup(offset)
        return self.log.search_for_offset_from_position(offset, max(mapping.position, starting_file_position))

    def read_batches(self, start_offset: int, max_position: int | None = None) -> Iterator[tuple[int, RecordBatch]]:
        """Yield ``(position, batch)`` from the batch containing ``start_offset`` up to ``max_position`` bytes.

        Nothing is yielded if ``start_offset`` is after the last batch.
        """
        found = self.translate_offset(start_offset)
        if found is None:
            return iter(())
        return self.log.batches_from(found.position, max_position)

    def find_offset_by_timestamp(self, timestamp_ms: int, starting_offset: int | None = None) -> TimestampAndOffset | None:
        """First record with timestamp ``>= timestamp_ms`` and offset ``>= starting_offset``, or None."""
        start = self.base_offset if starting_offset is None else starting_offset
        entry = self.time_index.lookup(timestamp_ms)
        position = self.index.lookup(max(entry.offset, start)).position
        return self.log.search_for_timestamp(timestamp_ms, position, start)

    def read_next_offset(self, *, strict: bool = False) -> int:
        """Next offset after the last batch (scans from the last index entry), or ``base_offset`` if empty.

        ``strict``: also check that offsets increase from the index entry on and stay in the
        segment's Int32 range, that every scanned batch passes its CRC and that nothing but whole
        batches follows (the log end offset is only as good as the last batch's base offset,
        which the CRC does not cover).

        Raises:
            CorruptRecordError: (``strict``) a check failed, naming the file and byte position.
        """
        start = self.index.lookup(self.index.last_offset).position if self.index.entries else 0
        next_offset = self.base_offset
        end = start
        path = str(self.log_path)
        for position, batch in self.log.batches_from(start):
            if strict:
                batch.ensure_valid(path=path, position=position)
                # The first batch scanned is the indexed one (its last offset is the entry's).
                lowest = next_offset if end > start else self.base_offset
                if batch.base_offset < lowest or batch.last_offset < batch.base_offset or \
                        (end == start and self.index.entries and batch.last_offset != self.index.last_offset) or \
                        batch.last_offset - self.base_offset > INT32_MAX:
                    raise CorruptRecordError(
                        f"batch offsets [{batch.base_offset}, {batch.last_offset}] do not follow offset {lowest} "
                        f"in the segment based at {self.base_offset}", path=path, position=position)
            next_offset = batch.next_offset
            end = position + batch.size_in_bytes
        if strict and end < self.log.size_in_bytes:
            raise CorruptRecordError(f"{self.log.size_in_bytes - end} bytes after the last batch do not form a batch",
                                     path=path, position=end)
        return next_offset

    def has_overflow(self) -> bool:
        """True if the last offset does not fit the relative offset range (legacy segments)."""
        next_offset = self.read_next_offset()
        return next_offset > self.base_offset and not self.index.can_append_offset(next_offset - 1)

    # -- recovery, truncation ------------------------------------------------------------------

    def sanity_check(self, time_index_newly_created: bool) -> None:
        """Check the indexes after load.

        Raises:
            FileNotFoundError: the offset index file is missing (the caller recovers).
            CorruptIndexError: an index fails its sanity check.
        """
        if not self._offset_index_path.exists():
            raise FileNotFoundError(f"offset index file {self._offset_index_path} does not exist")
        if time_index_newly_created:
            self.time_index.resize(0)
        self.index.sanity_check()
        # Beyond Kafka's OffsetIndex.sanityCheck: positions only grow, so checking the last entry
        # catches an index that outlived a truncated .log (it would make read_next_offset lie).
        if self.index.entries > 0:
            last = self.index.entry(self.index.entries - 1)
            if last.position >= self.log.size_in_bytes:
                raise CorruptIndexError(
                    f"{self._offset_index_path}: entry {self.index.entries - 1} (byte position "
                    f"{(self.index.entries - 1) * 8}) points at .log position {last.position}; "
                    f"expected a position below the .log size {self.log.size_in_bytes} bytes")
        self.time_index.sanity_check()
        self.txn_index.sanity_check()

    def recover(self, on_batch=None, *, next_segment_base_offset: int | None = None,
                leader_epoch_cache: "LeaderEpochFileCache | None" = None) -> int:
        """Rebuild the indexes from the ``.log`` file and cut it at the first invalid byte.

        ``next_segment_base_offset``: the base offset of the segment after this one, if any; a
        batch reaching it is invalid (segments never overlap).

        ``leader_epoch_cache``: each valid batch whose partition leader epoch is ``>= 0`` and above
        the cache's latest epoch is assigned to it at its base offset (Kafka
        ``LogSegment.recover(producerStateManager, leaderEpochCache)``).

        Every batch is checked (framing, CRC-32C, offset range); ``on_batch(segment, batch)`` is
        called for each valid batch. Deviation from Kafka (which rebuilds the ``.txnindex`` from
        producer state): the existing ``.txnindex`` is kept and cut to the valid batches; a
        corrupt one is emptied.

        Returns:
            bytes truncated from the end of the file (0 when everything was valid).

        A batch whose base offset is not above the previous batch's last offset, or whose last
        offset does not fit the segment's Int32 relative offsets, is treated as invalid too (the
        base offset is not covered by the CRC).
        """
        self.index.reset()
        self.time_index.reset()
        try:
            self.txn_index.sanity_check()
        except CorruptIndexError as exc:
            logger.warning("Resetting corrupt transaction index %s: %s", self.txn_index.path, exc)
            self.txn_index.reset()
        next_offset = self.base_offset
        self._max_timestamp_and_offset_so_far = TimestampOffset(-1, self.base_offset)
        valid_bytes = 0
        last_index_entry = 0
        path = str(self.log_path)
        try:
            for position, batch in self.log.batches_from(0):
                batch.ensure_valid(path=path, position=position)
                if batch.base_offset < next_offset:
                    # Not covered by the CRC: a base offset that goes backwards is damage, cut here.
                    raise CorruptRecordError(
                        f"batch base offset {batch.base_offset} is below {next_offset}, the next offset "
                        f"after the previous batch (or the segment's base offset)", path=path, position=position)
                if next_segment_base_offset is not None and batch.last_offset >= next_segment_base_offset:
                    raise CorruptRecordError(
                        f"batch last offset {batch.last_offset} is not below the next segment's base offset "
                        f"{next_segment_base_offset}", path=path, position=position)
                try:
                    self._ensure_offset_in_range(batch.last_offset)
                except SegmentOffsetOverflowError as exc:
                    # v2 segments never hold legacy overflowed batches (Kafka's splitOverflowedSegment
                    # case): a last offset outside the segment's Int32 range is damage.
                    raise CorruptRecordError(str(exc), path=path, position=position) from exc
                if batch.max_timestamp > self._max_timestamp_and_offset_so_far.timestamp:
                    self._max_timestamp_and_offset_so_far = TimestampOffset(batch.max_timestamp, batch.last_offset)
                if valid_bytes - last_index_entry > self.index_interval_bytes:
                    self.index.append(batch.last_offset, valid_bytes)
                    self.time_index.maybe_append(*self._max_timestamp_and_offset_so_far)
                    last_index_entry = valid_bytes
                valid_bytes += batch.size_in_bytes
                next_offset = batch.next_offset
                if leader_epoch_cache is not None:
                    epoch = batch.partition_leader_epoch
                    latest = leader_epoch_cache.latest_epoch
                    if epoch >= 0 and (latest is None or epoch > latest):
                        leader_epoch_cache.assign(epoch, batch.base_offset)
                if on_batch is not None:
                    on_batch(self, batch)
        except CorruptRecordError as exc:
            logger.warning("Found invalid messages in log segment %s at byte position %d: %s", path, valid_bytes, exc)
        truncated = self.log.size_in_bytes - valid_bytes
        if truncated > 0:
            logger.warning("Truncated %d invalid bytes at the end of segment %s (at byte position %d) during recovery",
                           truncated, path, valid_bytes)
        self.log.truncate_to(valid_bytes)
        self.txn_index.truncate_to(next_offset)
        self.index.trim_to_valid_size()
        self.time_index.maybe_append(*self._max_timestamp_and_offset_so_far, skip_full_check=True)
        self.time_index.trim_to_valid_size()
        self._bytes_since_last_index_entry = 0
        self._rolling_based_timestamp = None
        return truncated

    def truncate_to(self, offset: int) -> int:
        """Remove every batch from the one containing ``offset`` on, with their index entries.

        Returns the bytes removed (0 if ``offset`` is after the last batch).
        """
        mapping = self.translate_offset(offset)
        self.index.truncate_to(offset)
        self.time_index.truncate_to(offset)
        self.txn_index.truncate_to(offset)
        self.index.resize(self.config.max_index_size)
        self.time_index.resize(self.config.max_index_size)
        removed = 0 if mapping is None else self.log.truncate_to(mapping.position)
        if self.log.size_in_bytes == 0:
            self._created_ms = wall_clock_ms()
            self._rolling_based_timestamp = None
        self._bytes_since_last_index_entry = 0
        if self.max_timestamp_so_far >= 0:
            self._max_timestamp_and_offset_so_far = self._read_largest_timestamp()
        return removed

    def _read_largest_timestamp(self) -> TimestampOffset:
        last_entry = self.time_index.last_entry
        position = self.index.lookup(last_entry.offset).position
        after = self.log.largest_timestamp_after(position)
        if after.timestamp > last_entry.timestamp:
            return TimestampOffset(after.timestamp, after.offset)
        return last_entry

    # -- lifecycle -----------------------------------------------------------------------------

    def resize_indexes(self, size: int) -> None:
        """Resize both index files to ``size`` bytes (rounded to whole entries)."""
        self.index.resize(size)
        self.time_index.resize(size)

    def on_become_inactive_segment(self) -> None:
        """Add the final time index entry and trim the indexes and the ``.log`` file (on roll)."""
        self.time_index.maybe_append(self.max_timestamp_so_far, self.offset_of_max_timestamp_so_far, skip_full_check=True)
        self.index.trim_to_valid_size()
        self.time_index.trim_to_valid_size()
        self.log.trim()

    def flush(self) -> None:
        """fsync the ``.log`` file and the indexes.

        Like Kafka's ``LogSegment.flush`` this opens lazily-opened indexes, so every flushed
        segment (an empty rolled one too) has its ``.index`` and ``.timeindex`` on disk and a
        reopen after a clean shutdown finds no index missing.
        """
        self.log.flush()
        self.index.flush()
        self.time_index.flush()
        self.txn_index.flush()

    def close(self) -> None:
        """Add the final time index entry, trim and close every file."""
        if self._max_timestamp_and_offset_so_far is not None and self._time_index is not None:
            try:
                self.time_index.maybe_append(*self._max_timestamp_and_offset_so_far, skip_full_check=True)
            except ValueError as exc:
                logger.warning("could not append the final time index entry of %s: %s", self.log_path, exc)
        if self._offset_index is not None:
            self._offset_index.close()
        if self._time_index is not None:
            self._time_index.close()
        self.log.close()
        self.txn_index.close()

    def close_handlers(self) -> None:
        """Close file handles without trimming or flushing."""
        if self._offset_index is not None:
            self._offset_index.close_handler()
        if self._time_index is not None:
            self._time_index.close_handler()
        self.log.close_handlers()

    def change_file_suffixes(self, old_suffix: str, new_suffix: str) -> None:
        """Rename every file of the segment from ``old_suffix`` to ``new_suffix`` (``""`` = none)."""
        self.log.rename_to(replace_suffix(self.log.path, old_suffix, new_suffix))
        old_offset_path, old_time_path = self._offset_index_path, self._time_index_path
        self._offset_index_path = replace_suffix(old_offset_path, old_suffix, new_suffix)
        self._time_index_path = replace_suffix(old_time_path, old_suffix, new_suffix)
        for index, old_path, new_path in ((self._offset_index, old_offset_path, self._offset_index_path),
                                          (self._time_index, old_time_path, self._time_index_path)):
            if index is not None:
                index.rename_to(new_path)
            else:
                rename_if_exists(old_path, new_path)
        self.txn_index.rename_to(replace_suffix(self.txn_index.path, old_suffix, new_suffix))

    def has_suffix(self, suffix: str) -> bool:
        """True if every file name of the segment ends with ``suffix``."""
        return all(str(p).endswith(suffix) for p in
                   (self.log.path, self._offset_index_path, self._time_index_path, self.txn_index.path))

    def delete_if_exists(self) -> None:
        """Close and delete every file of the segment."""
        self.log.delete_if_exists()
        for index, path in ((self._offset_index, self._offset_index_path), (self._time_index, self._time_index_path)):
            if index is not None:
                index.delete_if_exists()
            else:
                try:
                    os.remove(path)
                except FileNotFoundError:
                    pass
        self.txn_index.delete_if_exists()

    delete = delete_if_exists

    def deleted(self) -> bool:
        """True when none of the segment's files exist."""
        return not any(p.exists() for p in
                       (self.log.path, self._offset_index_path, self._time_index_path, self.txn_index.path))

    @property
    def is_cleaned(self) -> bool:
        """True for a cleaner output segment (files end with ``.cleaned``)."""
        return str(self.log.path).endswith(CLEANED_FILE_SUFFIX)

    def __repr__(self) -> str:
        return (f"LogSegment(base_offset={self.base_offset}, size={self.log.size_in_bytes}, "
                f"path={str(self.log.path)!r})")
