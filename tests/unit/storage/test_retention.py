"""Tests for segment retention (Kafka UnifiedLog.deleteOldSegments semantics)."""

from __future__ import annotations

from materializer.storage.retention import (
    deletable_segments,
    delete_log_start_offset_breached_segments,
    delete_old_segments,
    delete_retention_ms_breached_segments,
    delete_retention_size_breached_segments,
)

from .cleaner_fixtures import append, make_log, now_ms

DAY_MS = 86_400_000


def _log_with_segments(tmp_path, count, timestamps=None, **config):
    config.setdefault("cleanup_policy", ("delete",))
    log = make_log(tmp_path, segment_bytes=2048, **config)
    for i in range(count):
        ts = timestamps[i] if timestamps else now_ms()
        append(log, i, i, timestamp=ts)
        log.roll()
    return log


def test_retention_ms_deletes_old_segments_oldest_first(tmp_path):
    now = now_ms()
    ts = [now - 3 * DAY_MS, now - 2 * DAY_MS, now, now - 3 * DAY_MS]
    log = _log_with_segments(tmp_path, 4, ts, retention_ms=DAY_MS)
    assert delete_retention_ms_breached_segments(log, now) == 2  # stops at the first recent segment
    assert [s.base_offset for s in log.log_segments()] == [2, 3, 4]
    assert log.log_start_offset == 2


def test_retention_ms_negative_is_infinite(tmp_path):
    log = _log_with_segments(tmp_path, 3, [1, 1, 1], retention_ms=-1)
    assert delete_retention_ms_breached_segments(log, now_ms()) == 0


def test_retention_ms_uses_mtime_without_timestamps(tmp_path):
    log = _log_with_segments(tmp_path, 2, [-1, -1], retention_ms=DAY_MS)
    log.log_segments()[0].set_last_modified_ms(now_ms() - 2 * DAY_MS)
    assert delete_retention_ms_breached_segments(log, now_ms()) == 1


def test_retention_bytes(tmp_path):
    log = _log_with_segments(tmp_path, 5)
    segment_size = log.log_segments()[0].size_in_bytes
    log.config = log.config.__class__(**{**log.config.__dict__, "retention_bytes": 3 * segment_size})
    # size = 5 * s; diff = 2 * s -> the two oldest go
    assert delete_retention_size_breached_segments(log) == 2
    assert [s.base_offset for s in log.log_segments()] == [2, 3, 4, 5]


def test_retention_bytes_negative_or_not_reached(tmp_path):
    log = _log_with_segments(tmp_path, 3, retention_bytes=-1)
    assert delete_retention_size_breached_segments(log) == 0
    log = _log_with_segments(tmp_path / "b", 3, retention_bytes=10**9)
    assert delete_retention_size_breached_segments(log) == 0


def test_log_start_offset_breach(tmp_path):
    log = _log_with_segments(tmp_path, 4, cleanup_policy=("compact",))
    log.maybe_increment_log_start_offset(2)
    assert delete_log_start_offset_breached_segments(log) == 2
    assert [s.base_offset for s in log.log_segments()] == [2, 3, 4]


def test_compact_only_ignores_time_and_size(tmp_path):
    log = _log_with_segments(tmp_path, 3, [1, 1, 1], cleanup_policy=("compact",), retention_ms=1, retention_bytes=1)
    assert delete_old_segments(log, now_ms()) == 0
    log2 = _log_with_segments(tmp_path / "b", 3, [1, 1, 1], cleanup_policy=("compact", "delete"), retention_ms=1)
    assert delete_old_segments(log2, now_ms()) == 3


def test_empty_last_segment_never_deleted_and_active_segment_rolled(tmp_path):
    log = _log_with_segments(tmp_path, 2, [1, 1], retention_ms=1)
    assert log.active_segment.size_in_bytes == 0
    assert len(deletable_segments(log, lambda s, n: True)) == 2
    # a non-empty active segment breaching retention is deleted after rolling a new one (Kafka behaviour)
    append(log, 9, 9, timestamp=1)
    assert delete_old_segments(log, now_ms()) == 3
    assert log.number_of_segments == 1 and log.active_segment.size_in_bytes == 0
    assert log.log_start_offset == log.log_end_offset == 3


def test_high_watermark_bounds_deletion(tmp_path):
    log = _log_with_segments(tmp_path, 3, [1, 1, 1], retention_ms=1)
    log.high_watermark = 1
    assert delete_old_segments(log, now_ms()) == 1
