"""Broker-level settings of the log cleaner (Kafka ``CleanerConfig`` and its defaults).

| field (Kafka property)                                        | default                   |
|---------------------------------------------------------------|---------------------------|
| ``num_threads`` (``log.cleaner.threads``)                     | 1                         |
| ``dedupe_buffer_size_bytes`` (``log.cleaner.dedupe.buffer.size``) | 134217728 (all threads) |
| ``dedupe_buffer_load_factor`` (``log.cleaner.io.buffer.load.factor``) | 0.9               |
| ``io_buffer_size_bytes`` (``log.cleaner.io.buffer.size``)     | 524288 (all threads)      |
| ``max_message_size_bytes`` (``message.max.bytes``)            | 1048588                   |
| ``max_io_bytes_per_second`` (``log.cleaner.io.max.bytes.per.second``) | unlimited         |
| ``backoff_ms`` (``log.cleaner.backoff.ms``)                   | 15000                     |

The hash is always MD5; the offset map takes as much of its budget as its entries need (Kafka's
24-byte entries; up to 1/8 more while its last growth copies, see ``offset_map``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .varint import INT32_MAX

__all__ = ["CleanerConfig"]



@dataclass(frozen=True)
class CleanerConfig:
    """Cleaner settings; sizes in bytes, times in ms (see the module docstring)."""

    num_threads: int = 1
    dedupe_buffer_size_bytes: int = 134217728
    dedupe_buffer_load_factor: float = 0.9
    io_buffer_size_bytes: int = 524288
    max_message_size_bytes: int = 1048588
    max_io_bytes_per_second: float = math.inf
    backoff_ms: int = 15000

    def __post_init__(self) -> None:
        if self.num_threads < 1:
            raise ValueError(f"log.cleaner.threads must be >= 1, got {self.num_threads}")
        if not 0 < self.dedupe_buffer_load_factor <= 1:
            raise ValueError(f"dedupe buffer load factor must be in (0, 1], got {self.dedupe_buffer_load_factor}")
        if self.backoff_ms < 0:
            raise ValueError(f"log.cleaner.backoff.ms must be >= 0, got {self.backoff_ms}")

    @property
    def offset_map_memory_bytes(self) -> int:
        """Offset map budget per thread: ``min(dedupe_buffer_size / threads, Int.MAX)`` (as ``LogCleaner``)."""
        return min(self.dedupe_buffer_size_bytes // self.num_threads, INT32_MAX)

    @property
    def io_buffer_size_per_thread_bytes(self) -> int:
        """Read (and write) buffer per thread: ``io_buffer_size / threads / 2``."""
        return self.io_buffer_size_bytes // self.num_threads // 2
