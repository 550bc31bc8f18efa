"""Kafka's sparse offset index: maps offsets to byte positions in a segment's ``.log`` file.

Layout (``<base_offset>.index``), big-endian, 8-byte entries sorted by offset::

    OffsetIndexEntry =>
      RelativeOffset => Int32   offset - base_offset (base 50: offset 55 is stored as 5)
      Position       => Int32   byte position of a batch in the .log file

An entry ``(offset, position)`` says "the batch starting at ``position`` ends at ``offset``" (the
LogSegment appends the batch's *last* offset with its *start* position). Not checksummed: it is
rebuilt from the log on recovery.

Mirrors ``org.apache.kafka.storage.internals.log.OffsetIndex`` and ``OffsetPosition``.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import NamedTuple

from .errors import CorruptIndexError, InvalidOffsetError
from .index import AbstractIndex, IndexSearchType

__all__ = ["OffsetIndex", "OffsetPosition", "OFFSET_INDEX_ENTRY_SIZE"]

OFFSET_INDEX_ENTRY_SIZE = 8
_ENTRY = struct.Struct(
    ">"
    "i"  # RelativeOffset
    "i"  # Position
)


class OffsetPosition(NamedTuple):
    """An offset and the byte position of the batch the index associates with it."""

    offset: int
    position: int


class OffsetIndex(AbstractIndex):
    """Sparse offset -> position index of one segment (8-byte entries, offsets strictly increasing).

    ``lookup(target)`` returns the greatest entry with ``offset <= target``, or
    ``(base_offset, 0)``. Not thread-safe (see ``AbstractIndex``).
    """

    ENTRY_SIZE = OFFSET_INDEX_ENTRY_SIZE

    def __init__(self, path: Path, base_offset: int, max_index_size: int = -1, writable: bool = True):
        super().__init__(path, base_offset, max_index_size, writable)
        self._last_offset = self._read_last_offset()

    def _read_last_offset(self) -> int:
        if self._entries == 0:
            return self.base_offset
        return self.base_offset + _ENTRY.unpack_from(self._mapped, (self._entries - 1) * 8)[0]

    def _on_truncated(self) -> None:
        self._last_offset = self._read_last_offset()

    @property
    def last_offset(self) -> int:
        """Offset of the last entry, or ``base_offset`` when empty."""
        return self._last_offset

    def _compare_key(self, slot: int, search_type: IndexSearchType) -> int:
        relative, position = _ENTRY.unpack_from(self._mapped, slot * 8)
        return relative if search_type is IndexSearchType.KEY else position

    def _relative_key(self, target_offset: int) -> int:
        return target_offset - self.base_offset

    def entry(self, n: int) -> OffsetPosition:
        """Return the ``n``-th entry.

        Raises:
            IndexError: ``n`` is not in ``[0, entries)``.
        """
        if n < 0 or n >= self._entries:
            raise IndexError(f"attempt to fetch the {n}th entry from {self.path}, which has {self._entries} entries")
        relative, position = _ENTRY.unpack_from(self._mapped, n * 8)
        return OffsetPosition(self.base_offset + relative, position)

    def lookup(self, target_offset: int) -> OffsetPosition:
        """Return the entry with the greatest offset ``<= target_offset``, or ``(base_offset, 0)``."""
        slot = self._largest_lower_bound_slot_for(self._relative_key(target_offset), IndexSearchType.KEY)
        if slot == -1:
            return OffsetPosition(self.base_offset, 0)
        return self.entry(slot)

    def fetch_upper_bound_offset(self, fetch_offset_position: OffsetPosition, fetch_size: int) -> OffsetPosition | None:
        """Return an entry whose position is ``>= fetch position + fetch_size`` bytes (outside the
        fetched range), or None.

        Kafka ``OffsetIndex.fetchUpperBoundOffset``: "not generally the smallest such offset". It is
        the first such entry, except that a target equal to the first entry's position gives the
        second entry (None with one entry): ``AbstractIndex.binarySearch`` never compares slot 0.
        """
        slot = self._smallest_upper_bound_slot_for(fetch_offset_position.position + fetch_size, IndexSearchType.VALUE)
        if slot == -1:
            return None
        return self.entry(slot)

    def append(self, offset: int, position: int) -> None:
        """Append ``(offset, position)``.

        Raises:
            ValueError: the index is full (the segment should have rolled).
            InvalidOffsetError: ``offset`` is not greater than the last entry's offset.
            IndexOffsetOverflowError: ``offset`` is outside the int32 relative range.
            LogStorageError: the entry's page cannot be reserved on disk (nothing is written).
        """
        if self.is_full():
            raise ValueError(f"attempt to append to a full index {self.path} (size = {self._entries})")
        if self._entries != 0 and offset <= self._last_offset:
            raise InvalidOffsetError(
                f"attempt to append an offset ({offset}) to position {self._entries} no larger than "
                f"the last offset appended ({self._last_offset}) to {self.path}"
            )
        relative = self.relative_offset(offset)
        self._write_slot(self._entries, _ENTRY.pack(relative, position))
        self._entries += 1
        self._last_offset = offset

    def truncate_to(self, offset: int) -> None:
        """Remove the entry for ``offset`` and every entry with a larger offset."""
        slot = self._largest_lower_bound_slot_for(self._relative_key(offset), IndexSearchType.KEY)
        if slot < 0:
            new_entries = 0
        elif self.entry(slot).offset == offset:
            new_entries = slot
        else:
            new_entries = slot + 1
        self._truncate_to_entries(new_entries)

    def sanity_check(self) -> None:
        """Check the invariants Kafka checks when loading an index.

        Raises:
            CorruptIndexError: the last offset is below ``base_offset``, the file length is
                not a multiple of 8 bytes, or an entry's offset or position does not increase
                (checked for every entry, which Kafka does not).
        """
        if self._entries != 0 and self._last_offset < self.base_offset:
            raise CorruptIndexError(
                f"corrupt index found, index file ({self.path}) has non-zero size but the last offset "
                f"is {self._last_offset} which is less than the base offset {self.base_offset}"
            )
        if self._length % self.ENTRY_SIZE != 0:
            raise CorruptIndexError(
                f"index file {self.path} is corrupt, found {self._length} bytes which is neither positive "
                f"nor a multiple of {self.ENTRY_SIZE}"
            )
        self._check_entries_increase()

    def _check_entries_increase(self) -> None:
        """Every entry's relative offset and position above the previous one's, the first >= 0.

        Kafka checks only the last entry; a damaged middle entry would send a lookup to the wrong
        byte position (or a negative one). One ``struct.unpack`` of the valid entries (about 60 ms
        for the 262,144 entries of a full 1 GiB segment's index).
        """
        if self._entries == 0:
            return
        values = struct.unpack(f">{2 * self._entries}i", self._mapped[:self._entries * 8])
        previous_relative = previous_position = -1
        for slot in range(self._entries):
            relative, position = values[2 * slot], values[2 * slot + 1]
            if relative <= previous_relative or position <= previous_position:
                raise CorruptIndexError(
                    f"corrupt index found, index file ({self.path}) entry {slot} at byte position {slot * 8} "
                    f"(relative offset {relative}, position {position}) does not follow the previous entry "
                    f"(relative offset {previous_relative}, position {previous_position})")
            previous_relative, previous_position = relative, position

    def all_entries(self) -> list[OffsetPosition]:
        """Every valid entry, in order (for tools and tests)."""
        return [self.entry(i) for i in range(self._entries)]
