"""Kafka's time index: maps timestamps to offsets of a segment.

Layout (``<base_offset>.timeindex``), big-endian, 12-byte entries::

    TimeIndexEntry =>
      Timestamp      => Int64   the largest record timestamp (ms) seen at or before the offset
      RelativeOffset => Int32   offset - base_offset

Timestamps and offsets are both monotonically increasing; an entry is only added when its
timestamp is larger than the last one's. The last slot is reserved: a normal append sees the
index as full at ``max_entries - 1`` so that ``on_become_inactive_segment`` can always add the
final ``(max timestamp, offset)`` entry with ``skip_full_check=True``.

Mirrors ``org.apache.kafka.storage.internals.log.TimeIndex`` and ``TimestampOffset``.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import NamedTuple

from .errors import CorruptIndexError, InvalidOffsetError
from .index import AbstractIndex, IndexSearchType

__all__ = ["TimeIndex", "TimestampOffset", "TIME_INDEX_ENTRY_SIZE", "NO_TIMESTAMP"]

TIME_INDEX_ENTRY_SIZE = 12
NO_TIMESTAMP = -1
_ENTRY = struct.Struct(
    ">"
    "q"  # Timestamp
    "i"  # RelativeOffset
)


class TimestampOffset(NamedTuple):
    """A timestamp (ms) and the offset the time index associates with it."""

    timestamp: int
    offset: int


class TimeIndex(AbstractIndex):
    """Timestamp -> offset index of one segment (12-byte entries, reserved last slot).

    ``lookup(ts)`` returns the entry with the greatest timestamp ``<= ts`` or
    ``(-1, base_offset)``. Not thread-safe (see ``AbstractIndex``).
    """

    ENTRY_SIZE = TIME_INDEX_ENTRY_SIZE

    def __init__(self, path: Path, base_offset: int, max_index_size: int = -1, writable: bool = True):
        super().__init__(path, base_offset, max_index_size, writable)
        self._last_entry = self._read_last_entry()

    def _read_last_entry(self) -> TimestampOffset:
        if self._entries == 0:
            return TimestampOffset(NO_TIMESTAMP, self.base_offset)
        return self.entry(self._entries - 1)

    def _on_truncated(self) -> None:
        self._last_entry = self._read_last_entry()

    def is_full(self) -> bool:
        """True at ``max_entries - 1`` entries: the last slot is reserved."""
        return self._entries >= self.max_entries - 1

    @property
    def last_entry(self) -> TimestampOffset:
        """The last entry, or ``(-1, base_offset)`` when empty."""
        return self._last_entry

    def _compare_key(self, slot: int, search_type: IndexSearchType) -> int:
        timestamp, relative = _ENTRY.unpack_from(self._mapped, slot * 12)
        return timestamp if search_type is IndexSearchType.KEY else relative

    def entry(self, n: int) -> TimestampOffset:
        """Return the ``n``-th entry.

        Raises:
            IndexError: ``n`` is not in ``[0, entries)``.
        """
        if n < 0 or n >= self._entries:
            raise IndexError(f"attempt to fetch the {n}th entry from {self.path}, which has {self._entries} entries")
        timestamp, relative = _ENTRY.unpack_from(self._mapped, n * 12)
        return TimestampOffset(timestamp, self.base_offset + relative)

    def lookup(self, target_timestamp: int) -> TimestampOffset:
        """Return the entry with the greatest timestamp ``<= target_timestamp``, or ``(-1, base_offset)``."""
        slot = self._largest_lower_bound_slot_for(target_timestamp, IndexSearchType.KEY)
        if slot == -1:
            return TimestampOffset(NO_TIMESTAMP, self.base_offset)
        return self.entry(slot)

    def maybe_append(self, timestamp: int, offset: int, skip_full_check: bool = False) -> None:
        """Append ``(timestamp, offset)`` if ``timestamp`` is larger than the last entry's.

        Args:
            timestamp: record timestamp in ms.
            offset: absolute offset.
            skip_full_check: allow the reserved last slot (used when a segment becomes inactive).

        Raises:
            ValueError: the index is full, or ``timestamp`` goes backwards.
            InvalidOffsetError: ``offset`` is below the last entry's offset.
            IndexOffsetOverflowError: ``offset`` is outside the int32 relative range.
            LogStorageError: the entry's page cannot be reserved on disk (nothing is written).
        """
        if not skip_full_check and self.is_full():
            raise ValueError(f"attempt to append to a full time index {self.path} (size = {self._entries})")
        last = self._last_entry
        if self._entries != 0 and offset < last.offset:
            raise InvalidOffsetError(
                f"attempt to append an offset ({offset}) to slot {self._entries} no larger than the last "
                f"offset appended ({last.offset}) to {self.path}"
            )
        if self._entries != 0 and timestamp < last.timestamp:
            raise ValueError(
                f"attempt to append a timestamp ({timestamp}) to slot {self._entries} no larger than the "
                f"last timestamp appended ({last.timestamp}) to {self.path}"
            )
        if self._entries == 0 or timestamp > last.timestamp:
            if self._entries >= self.max_entries:
                raise ValueError(f"attempt to append to a full time index {self.path} (size = {self._entries})")
            relative = self.relative_offset(offset)
            self._write_slot(self._entries, _ENTRY.pack(timestamp, relative))
            self._entries += 1
            self._last_entry = TimestampOffset(timestamp, offset)

    def truncate_to(self, offset: int) -> None:
        """Remove every entry whose offset is ``>= offset``."""
        slot = self._largest_lower_bound_slot_for(offset - self.base_offset, IndexSearchType.VALUE)
        if slot < 0:
            new_entries = 0
        elif self.entry(slot).offset == offset:
            new_entries = slot
        else:
            new_entries = slot + 1
        self._truncate_to_entries(new_entries)

    def sanity_check(self) -> None:
        """Check Kafka's load-time invariants.

        Raises:
            CorruptIndexError: last timestamp below the first, last offset below ``base_offset``
                or a length that is not a multiple of 12 bytes.
        """
        last = self._last_entry
        if self._entries != 0 and last.timestamp < self.entry(0).timestamp:
            raise CorruptIndexError(
                f"corrupt time index found, time index file ({self.path}) has non-zero size but the last "
                f"timestamp is {last.timestamp} which is less than the first timestamp {self.entry(0).timestamp}"
            )
        if self._entries != 0 and last.offset < self.base_offset:
            raise CorruptIndexError(
                f"corrupt time index found, time index file ({self.path}) has non-zero size but the last "
                f"offset is {last.offset} which is less than the base offset {self.base_offset}"
            )
        if self._length % self.ENTRY_SIZE != 0:
            raise CorruptIndexError(
                f"time index file {self.path} is corrupt, found {self._length} bytes which is neither positive "
                f"nor a multiple of {self.ENTRY_SIZE}"
            )

    def all_entries(self) -> list[TimestampOffset]:
        """Every valid entry, in order (for tools and tests)."""
        return [self.entry(i) for i in range(self._entries)]
