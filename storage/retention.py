"""Segment retention: deleting whole old segments by time, size and log start offset.

Kafka ``UnifiedLog.deleteOldSegments`` (no tiered storage):

* ``cleanup.policy`` contains ``delete`` (``delete`` or ``compact,delete``): segments below the
  log start offset, then ``retention.bytes``, then ``retention.ms``;
* otherwise (``compact`` only, or empty = infinite retention): only segments below the log
  start offset.

Each rule walks the segments oldest first and stops at the first segment that must stay
(``deletableSegments``). A segment is a candidate only if its upper bound (next segment's base
offset, or the log end offset for the last one) is ``<= high watermark`` (= log end offset for
our local log, so every segment qualifies); an empty last segment is never deleted. Rules:

* log start offset: the *next* segment's base offset is ``<= log_start_offset``;
* ``retention.bytes`` (``>= 0``): with ``diff = log size - retention.bytes`` (nothing when the
  log is smaller), delete while ``diff - segment size >= 0``, subtracting each deleted size;
* ``retention.ms`` (``>= 0``): ``now_ms - segment.largest_timestamp > retention.ms``, where the
  largest timestamp falls back to the file mtime when the segment has no timestamps.

As in Kafka, the active segment itself may be deleted (a new empty segment is rolled at the
log end offset first, inside ``Log.delete_segments``); the log start offset then moves to the
first remaining segment. Files go to ``.deleted`` and are removed after ``file.delete.delay.ms``
(``Log.delete_pending_files``, called at the end of :func:`delete_old_segments`).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Callable, Optional

from .clock import wall_clock_ms

if TYPE_CHECKING:  # pragma: no cover
    from .log import Log
    from .segment import LogSegment

__all__ = [
    "deletable_segments",
    "delete_old_segments",
    "delete_log_start_offset_breached_segments",
    "delete_retention_size_breached_segments",
    "delete_retention_ms_breached_segments",
]

logger = logging.getLogger(__name__)

DeletionCondition = Callable[["LogSegment", Optional["LogSegment"]], bool]



def deletable_segments(log: "Log", predicate: DeletionCondition) -> list["LogSegment"]:
    """Oldest segments for which ``predicate(segment, next_segment)`` holds, stopping at the first that fails.

    Mirrors ``UnifiedLog.deletableSegments``: a segment whose upper bound offset is above the
    high watermark stops the walk; an empty last segment is never returned.
    """
    segments = log.log_segments()
    hw = log.high_watermark
    deletable = []
    for i, segment in enumerate(segments):
        next_segment = segments[i + 1] if i + 1 < len(segments) else None
        is_last_segment_and_empty = next_segment is None and segment.size_in_bytes == 0
        upper_bound_offset = next_segment.base_offset if next_segment is not None else log.log_end_offset
        if hw >= upper_bound_offset and predicate(segment, next_segment) and not is_last_segment_and_empty:
            deletable.append(segment)
        else:
            break
    return deletable


def _delete(log: "Log", predicate: DeletionCondition, reason: str) -> int:
    with log.lock:
        deletable = deletable_segments(log, predicate)
        if not deletable:
            return 0
        return log.delete_segments(deletable, reason)


def delete_log_start_offset_breached_segments(log: "Log") -> int:
    """Delete segments wholly below the log start offset; returns how many."""

    def breached(segment: "LogSegment", next_segment: "LogSegment | None") -> bool:
        return next_segment is not None and next_segment.base_offset <= log.log_start_offset

    return _delete(log, breached, f"log start offset {log.log_start_offset} breach")


def delete_retention_size_breached_segments(log: "Log") -> int:
    """Delete the oldest segments while the log exceeds ``retention.bytes``; returns how many."""
    retention_bytes = log.config.retention_bytes
    with log.lock:
        log_size = log.size_in_bytes
        if retention_bytes < 0 or log_size < retention_bytes:
            return 0
        diff = [log_size - retention_bytes]

        def breached(segment: "LogSegment", _next: "LogSegment | None") -> bool:
            size = segment.size_in_bytes
            if diff[0] - size >= 0:
                diff[0] -= size
                return True
            return False

        return _delete(log, breached, f"retention size {retention_bytes} breach")


def delete_retention_ms_breached_segments(log: "Log", now_ms: int) -> int:
    """Delete the oldest segments whose largest timestamp is more than ``retention.ms`` before ``now_ms``."""
    retention_ms = log.config.retention_ms
    if retention_ms < 0:
        return 0

    def breached(segment: "LogSegment", _next: "LogSegment | None") -> bool:
        ts = segment.largest_timestamp
        if now_ms < ts:
            logger.warning("%s contains future timestamp(s), making it ineligible to be deleted", segment)
        return now_ms - ts > retention_ms

    return _delete(log, breached, f"retention time {retention_ms}ms breach")


def delete_old_segments(log: "Log", now_ms: int | None = None) -> int:
    """Apply the log's retention rules (see the module docstring); returns segments deleted.

    Also removes ``.deleted`` files whose ``file.delete.delay.ms`` has passed.
    """
    now = wall_clock_ms() if now_ms is None else now_ms
    if log.config.delete:
        deleted = (
            delete_log_start_offset_breached_segments(log)
            + delete_retention_size_breached_segments(log)
            + delete_retention_ms_breached_segments(log, now)
        )
    else:
        deleted = delete_log_start_offset_breached_segments(log)
    log.delete_pending_files(now)
    return deleted
