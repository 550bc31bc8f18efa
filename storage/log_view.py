"""Read-only views of a ``Log`` that the cleaner and retention need, with Kafka's exact semantics.

* :func:`log_segments` - ``LogSegments.values(from, to)``: every segment from the one holding
  ``from_offset`` (the floor segment) up to, excluding, the segment whose base offset is
  ``to_offset``; empty when ``from_offset == to_offset``.
* :func:`non_active_log_segments_from` - ``LogSegments.nonActiveLogSegmentsFrom``.
* :func:`high_watermark` / :func:`last_stable_offset` - for a local log, the high watermark is
  the log end offset unless the ``Log`` carries one; the last stable offset is
  ``min(first offset of any still-open transaction, high watermark)``
  (``UnifiedLog.lastStableOffset``), open transactions coming from :mod:`.producer_state`.

Mirrors ``LogSegments`` and parts of ``UnifiedLog`` (``org.apache.kafka.storage.internals.log``,
Kafka 4.4). Callers must hold whatever lock keeps the segment list stable.
"""

from __future__ import annotations

from bisect import bisect_right
from typing import TYPE_CHECKING, Any

from .log_config import LONG_MAX

if TYPE_CHECKING:  # pragma: no cover
    from .log import Log
    from .segment import LogSegment

__all__ = [
    "all_segments",
    "active_segment",
    "log_segments",
    "non_active_log_segments_from",
    "segment_size",
    "largest_timestamp",
    "first_batch_timestamp",
    "last_modified_ms",
    "high_watermark",
    "last_stable_offset",
    "collect_aborted_transactions",
]



def all_segments(log: "Log") -> list["LogSegment"]:
    """The log's segments in base offset order (a new list)."""
    segments = log.segments
    if hasattr(segments, "values") and callable(segments.values):
        return list(segments.values())
    return list(segments)


def active_segment(log: "Log") -> "LogSegment":
    """The last segment (the one appends go to)."""
    return log.active_segment


def log_segments(log: "Log", from_offset: int, to_offset: int) -> list["LogSegment"]:
    """Segments overlapping ``[from_offset, to_offset)`` as Kafka's ``LogSegments.values(from, to)``.

    Starts at the segment whose base offset is the greatest ``<= from_offset`` (or the first
    segment if none) and stops before the first segment with base offset ``>= to_offset``.

    Raises:
        ValueError: ``to_offset < from_offset``.
    """
    if from_offset == to_offset:
        return []
    if to_offset < from_offset:
        raise ValueError(
            f"Invalid log segment range: requested segments in {log.dir} from offset {from_offset} "
            f"which is greater than limit offset {to_offset}"
        )
    segments = all_segments(log)
    bases = [s.base_offset for s in segments]
    start = max(bisect_right(bases, from_offset) - 1, 0)
    end = bisect_right(bases, to_offset - 1)
    return segments[start:end]


def non_active_log_segments_from(log: "Log", from_offset: int) -> list["LogSegment"]:
    """``log_segments(from_offset, active.base_offset)``, or ``[]`` if ``from_offset`` is beyond it."""
    active = active_segment(log)
    if from_offset > active.base_offset:
        return []
    return log_segments(log, from_offset, active.base_offset)


def segment_size(segment: "LogSegment") -> int:
    """The segment's ``.log`` size in bytes."""
    return segment.size_in_bytes


def _call_or_get(value: Any) -> Any:
    return value() if callable(value) else value


def largest_timestamp(segment: "LogSegment") -> int:
    """``LogSegment.largestTimestamp``: max batch timestamp (ms), or the file mtime if none >= 0."""
    return _call_or_get(segment.largest_timestamp)


def first_batch_timestamp(segment: "LogSegment") -> int:
    """``LogSegment.getFirstBatchTimestamp``: first batch's max timestamp (ms), ``LONG_MAX`` if empty."""
    return _call_or_get(segment.first_batch_timestamp)


def last_modified_ms(segment: "LogSegment") -> int:
    """The ``.log`` file's mtime in ms."""
    return _call_or_get(segment.last_modified_ms)


def high_watermark(log: "Log") -> int:
    """The log's high watermark: ``log.high_watermark`` if the log has one, else its log end offset."""
    value = getattr(log, "high_watermark", None)
    if value is None:
        return log.log_end_offset
    return _call_or_get(value)


def last_stable_offset(log: "Log") -> int:
    """``min(first unstable offset, high watermark)``: no cleaning at or past an open transaction."""
    return log.last_stable_offset


def collect_aborted_transactions(log: "Log", start_offset: int, upper_bound_offset: int) -> list:
    """Aborted transactions from the ``.txnindex`` files of the segment holding ``start_offset`` on.

    Kafka ``UnifiedLog.collectAbortedTransactions(start, upper)``, which calls
    ``LocalLog.collectAbortedTransactions(logStartOffset, start, upper)``: every entry with
    ``last_offset >= log_start_offset`` and ``first_offset < upper_bound_offset``, stopping after
    the first segment holding an entry whose ``last_stable_offset >= upper_bound_offset``.
    """
    segments = all_segments(log)
    bases = [s.base_offset for s in segments]
    index = bisect_right(bases, start_offset) - 1
    if index < 0:
        return []
    result = []
    for segment in segments[index:]:
        search = segment.collect_aborted_txns(log.log_start_offset, upper_bound_offset)
        result.extend(search.aborted_transactions)
        if search.is_complete:
            break
    return result
