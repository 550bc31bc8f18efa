"""Statistics of one cleaning round and of one filthiest-log selection.

Mirrors Kafka's ``CleanerStats`` and ``PreCleanStats`` (``org.apache.kafka.storage.internals.log``)
and the per-round report that ``LogCleaner.CleanerThread.recordStats`` logs::

    Log cleaner thread 0 cleaned log t-0 (dirty section = [0, 1500])
    	12.3 MB of log processed in 1.2 seconds (10.3 MB/sec).
    	Indexed 6.1 MB in 0.4 seconds (15.2 Mb/sec, 33.3% of total time)
    	Buffer utilization: 0.1%
    	Cleaned 12.3 MB in 0.8 seconds (15.4 Mb/sec, 66.7% of total time)
    	Start size: 12.3 MB (120,000 messages)
    	End size: 1.2 MB (10,000 messages)
    	90.2% size reduction (91.7% fewer messages)

"MB" is 1024 * 1024 bytes, as in Kafka. Times come from ``time.monotonic`` (seconds).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

__all__ = ["CleanerStats", "PreCleanStats", "format_cleaner_stats"]

_MB = 1024.0 * 1024.0


def _clock_s() -> float:
    return time.monotonic()


@dataclass
class CleanerStats:
    """Counters of one cleaning round (Kafka ``CleanerStats``).

    ``bytes_read``/``messages_read`` count what the recopy pass read (bytes of every batch it
    passed, records of every batch it did not discard outright); ``bytes_written``/
    ``messages_written`` what it wrote. ``map_bytes_read``/``map_messages_read`` count the offset
    map pass. ``invalid_messages_read`` counts records without a key (dropped).
    ``buffer_utilization`` is the offset map's ``size / slots`` at the end of the round.
    """

    bytes_read: int = 0
    bytes_written: int = 0
    map_bytes_read: int = 0
    map_messages_read: int = 0
    messages_read: int = 0
    invalid_messages_read: int = 0
    messages_written: int = 0
    buffer_utilization: float = 0.0
    start_time_s: float = field(default_factory=_clock_s)
    map_complete_time_s: float = -1.0
    end_time_s: float = -1.0

    def read_messages(self, messages_read: int, bytes_read: int) -> None:
        """Add records and bytes read by the recopy pass."""
        self.messages_read += messages_read
        self.bytes_read += bytes_read

    def invalid_message(self) -> None:
        """Count one record without a key."""
        self.invalid_messages_read += 1

    def recopy_messages(self, messages_written: int, bytes_written: int) -> None:
        """Add records and bytes written to cleaned segments."""
        self.messages_written += messages_written
        self.bytes_written += bytes_written

    def index_messages_read(self, count: int) -> None:
        """Add records read while building the offset map."""
        self.map_messages_read += count

    def index_bytes_read(self, size_bytes: int) -> None:
        """Add bytes read while building the offset map."""
        self.map_bytes_read += size_bytes

    def index_done(self) -> None:
        """Mark the end of the offset map pass."""
        self.map_complete_time_s = _clock_s()

    def all_done(self) -> None:
        """Mark the end of the round."""
        self.end_time_s = _clock_s()

    @property
    def elapsed_secs(self) -> float:
        """Seconds from the start of the round to :meth:`all_done`."""
        return self.end_time_s - self.start_time_s

    @property
    def elapsed_index_secs(self) -> float:
        """Seconds from the start of the round to :meth:`index_done`."""
        return self.map_complete_time_s - self.start_time_s


@dataclass
class PreCleanStats:
    """What the last filthiest-log selection saw (Kafka ``PreCleanStats``)."""

    max_compaction_delay_ms: int = 0
    delayed_partitions: int = 0
    cleanable_partitions: int = 0

    def update_max_compaction_delay(self, delay_ms: int) -> None:
        """Record one log's compaction delay (ms past ``max.compaction.lag.ms``; 0 if none)."""
        self.max_compaction_delay_ms = max(self.max_compaction_delay_ms, delay_ms)
        if delay_ms > 0:
            self.delayed_partitions += 1

    def record_cleanable_partitions(self, count: int) -> None:
        """Record how many logs were eligible for cleaning."""
        self.cleanable_partitions = count


def _div(numerator: float, denominator: float) -> float:
    """Java double division: x/0 is +-Infinity or NaN rather than an error."""
    if denominator == 0:
        if numerator == 0 or math.isnan(numerator):
            return math.nan
        return math.copysign(math.inf, numerator)
    return numerator / denominator


def format_cleaner_stats(cleaner_id: int, log_name: str, from_offset: int, to_offset: int, stats: CleanerStats) -> str:
    """Kafka's per-round report (``LogCleaner.CleanerThread.recordStats``) as one string.

    ``[from_offset, to_offset]`` is the dirty section as Kafka prints it (first dirty offset and
    the new checkpoint).
    """
    elapsed = stats.elapsed_secs
    index_secs = stats.elapsed_index_secs
    clean_secs = elapsed - index_secs
    lines = [
        "",
        f"\tLog cleaner thread {cleaner_id} cleaned log {log_name} (dirty section = [{from_offset}, {to_offset}])",
        f"\t{stats.bytes_read / _MB:,.1f} MB of log processed in {elapsed:,.1f} seconds "
        f"({_div(stats.bytes_read, elapsed) / _MB:,.1f} MB/sec).",
        f"\tIndexed {stats.map_bytes_read / _MB:,.1f} MB in {index_secs:.1f} seconds "
        f"({_div(stats.map_bytes_read / _MB, index_secs):,.1f} Mb/sec, {_div(100 * index_secs, elapsed):.1f}% of total time)",
        f"\tBuffer utilization: {100 * stats.buffer_utilization:.1f}%",
        f"\tCleaned {stats.bytes_read / _MB:,.1f} MB in {clean_secs:.1f} seconds "
        f"({_div(stats.bytes_read / _MB, clean_secs):,.1f} Mb/sec, {_div(100 * clean_secs, elapsed):.1f}% of total time)",
        f"\tStart size: {stats.bytes_read / _MB:,.1f} MB ({stats.messages_read:,d} messages)",
        f"\tEnd size: {stats.bytes_written / _MB:,.1f} MB ({stats.messages_written:,d} messages)",
        f"\t{100.0 * (1.0 - _div(stats.bytes_written, stats.bytes_read)):.1f}% size reduction "
        f"({100.0 * (1.0 - _div(stats.messages_written, stats.messages_read)):.1f}% fewer messages)",
    ]
    return "\n".join(lines) + "\n"
