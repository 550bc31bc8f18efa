"""The segments of one partition, kept sorted by base offset.

Mirrors ``org.apache.kafka.storage.internals.log.LogSegments``. Writers are
serialized by ``Log.lock``. Readers that do not hold the lock (the background cleaner choosing
and reading non-active segments while the ingesting thread rolls) get a consistent snapshot from
``values()``: a segment is in the map before its base offset is listed and unlisted before it
leaves the map, and readers copy the list of base offsets before looking segments up (Kafka uses
a ``ConcurrentSkipListMap`` for the same reason).
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right, insort
from typing import Iterator

from .log_config import LONG_MAX
from .segment import LogSegment

__all__ = ["LogSegments"]


class LogSegments:
    """A sorted map ``base_offset -> LogSegment``."""

    def __init__(self) -> None:
        self._by_base: dict[int, LogSegment] = {}
        self._bases: list[int] = []

    def add(self, segment: LogSegment) -> LogSegment | None:
        """Insert or replace the segment at ``segment.base_offset``; returns the replaced one."""
        base = segment.base_offset
        previous = self._by_base.get(base)
        self._by_base[base] = segment  # mapped before listed: lock-free readers never miss it
        if previous is None:
            insort(self._bases, base)
        return previous

    def remove(self, base_offset: int) -> LogSegment | None:
        """Remove the segment at ``base_offset`` (if any) and return it."""
        segment = self._by_base.get(base_offset)
        if segment is not None:
            del self._bases[bisect_left(self._bases, base_offset)]  # unlisted before unmapped
            del self._by_base[base_offset]
        return segment

    def clear(self) -> None:
        """Forget every segment (files untouched)."""
        self._by_base.clear()
        self._bases.clear()

    def close(self) -> None:
        """Close every segment."""
        for segment in self.values():
            segment.close()

    def __len__(self) -> int:
        return len(self._bases)

    def __iter__(self) -> Iterator[LogSegment]:
        return iter(self.values())

    def __contains__(self, base_offset: object) -> bool:
        return base_offset in self._by_base

    def contains(self, base_offset: int) -> bool:
        """True if a segment starts at ``base_offset``."""
        return base_offset in self._by_base

    def get(self, base_offset: int) -> LogSegment | None:
        """The segment starting at ``base_offset``, or None."""
        return self._by_base.get(base_offset)

    def base_offsets(self) -> list[int]:
        """Base offsets in ascending order (a copy)."""
        return list(self._bases)

    def values(self, from_offset: int | None = None, to_offset: int | None = None) -> list[LogSegment]:
        """Segments in base offset order; with bounds, Kafka's ``LogSegments.values(from, to)``.

        With both bounds: from the floor segment of ``from_offset`` (or the first segment when
        none is at or below it) up to, excluding, any segment with base offset ``>= to_offset``;
        empty when ``from_offset == to_offset``.

        Raises:
            ValueError: ``to_offset < from_offset``.
        """
        if from_offset is None and to_offset is None:
            return self._lookup(self._bases[:])
        lo = from_offset if from_offset is not None else -1
        hi = to_offset if to_offset is not None else LONG_MAX
        if lo == hi:
            return []
        if hi < lo:
            raise ValueError(f"invalid log segment range: from offset {lo} is greater than limit offset {hi}")
        bases = self._bases[:]  # one snapshot for both searches and the slice
        start = max(bisect_right(bases, lo) - 1, 0)
        end = bisect_left(bases, hi)
        return self._lookup(bases[start:end])

    def _lookup(self, bases: list[int]) -> list[LogSegment]:
        """The segments of ``bases`` still in the map (a concurrent remove may have dropped one)."""
        by_base = self._by_base
        return [segment for segment in map(by_base.get, bases) if segment is not None]

    def floor_segment(self, offset: int) -> LogSegment | None:
        """The segment with the greatest base offset ``<= offset``, or None."""
        i = bisect_right(self._bases, offset) - 1
        return self._by_base[self._bases[i]] if i >= 0 else None

    def higher_segment(self, offset: int) -> LogSegment | None:
        """The segment with the smallest base offset ``> offset``, or None."""
        i = bisect_right(self._bases, offset)
        return self._by_base[self._bases[i]] if i < len(self._bases) else None

    def lower_segment(self, offset: int) -> LogSegment | None:
        """The segment with the greatest base offset ``< offset``, or None."""
        i = bisect_left(self._bases, offset) - 1
        return self._by_base[self._bases[i]] if i >= 0 else None

    def first_segment(self) -> LogSegment | None:
        """The segment with the smallest base offset, or None."""
        return self._by_base[self._bases[0]] if self._bases else None

    def last_segment(self) -> LogSegment | None:
        """The active (last) segment, or None."""
        return self._by_base[self._bases[-1]] if self._bases else None

    def size_in_bytes(self) -> int:
        """Total ``.log`` bytes."""
        return sum(s.size_in_bytes for s in list(self._by_base.values()))
