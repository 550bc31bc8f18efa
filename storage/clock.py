"""The wall clock in milliseconds, in one place (Kafka ``Time.SYSTEM.milliseconds()``).

Roll times, retention, delete horizons and cleaner lags compare record timestamps (ms since the
epoch) with this clock; tests pass their own ``now_ms`` where a function takes one.
"""

from __future__ import annotations

import time

__all__ = ["wall_clock_ms"]


def wall_clock_ms() -> int:
    """Milliseconds since the epoch, now."""
    return time.time_ns() // 1_000_000
