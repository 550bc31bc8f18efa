"""Tests for clean_log (forced first uncleanable offset) and the LogCleaner threads."""

from __future__ import annotations

import logging

import pytest

from materializer.storage.checkpoint import CLEANER_OFFSET_CHECKPOINT, read_offset_checkpoint
from materializer.storage.cleaner import Cleaner
from materializer.storage.cleaner_config import CleanerConfig
from materializer.storage.cleaner_manager import LogCleaningPaused
from materializer.storage.log_cleaner import LogCleaner, clean_log
from materializer.storage.offset_map import SkimpyOffsetMap

from .cleaner_fixtures import ProducerAppender, append, batches, make_log, now_ms, tombstone

TP = ("topic", 0)


def records(log):
    return [(r.offset, r.key, r.value) for b in batches(log) if not b.is_control_batch for r in b.records()]


def _updates(log, count, keys=10):
    for i in range(count):
        append(log, i % keys, i, timestamp=now_ms())


def test_clean_log_default_range_writes_checkpoint(tmp_path):
    log = make_log(tmp_path)
    _updates(log, 100)
    result = clean_log(log)
    assert result.first_dirty_offset == 0
    assert result.end_offset == log.active_segment.base_offset
    assert read_offset_checkpoint(tmp_path / CLEANER_OFFSET_CHECKPOINT) == {TP: result.end_offset}
    latest = {}
    for offset, k, _ in records(log):
        assert offset >= result.end_offset or latest.setdefault(k, offset) == offset  # unique keys below end
    assert result.records_read > result.records_written


def test_clean_log_forced_offset_mid_segment(tmp_path):
    log = make_log(tmp_path, segment_bytes=10**6)
    _updates(log, 30)  # one active segment, keys 0..9 three times
    result = clean_log(log, first_uncleanable_offset=15)
    assert log.number_of_segments == 2  # the active segment was rolled first
    assert result.end_offset == 15
    assert read_offset_checkpoint(tmp_path / CLEANER_OFFSET_CHECKPOINT)[TP] == 15
    kept = records(log)
    below = [o for o, _, _ in kept if o < 15]
    # the map covers [0, 15): below 15 only the last occurrence (in [0, 15)) of each key survives
    assert below == list(range(5, 15))
    assert [o for o, _, _ in kept if o >= 15] == list(range(15, 30))


def test_clean_log_forced_offset_validation(tmp_path):
    log = make_log(tmp_path)
    _updates(log, 10)
    with pytest.raises(ValueError, match="log end offset"):
        clean_log(log, first_uncleanable_offset=11)
    txn_log = make_log(tmp_path, name="txn-0")
    _updates(txn_log, 3)
    ProducerAppender(txn_log, 5).append([1, 2])
    with pytest.raises(ValueError, match="last stable offset"):
        clean_log(txn_log, first_uncleanable_offset=txn_log.log_end_offset)


def test_clean_log_repeats_rounds_when_map_is_full(tmp_path):
    log = make_log(tmp_path, segment_bytes=10**6)
    for i in range(200):
        append(log, i, i)  # 200 distinct keys
    tiny_map = SkimpyOffsetMap(24 * 64)  # int(64 * 0.9) = 57 keys per round
    result = clean_log(log, first_uncleanable_offset=200, cleaner=Cleaner(offset_map=tiny_map))
    assert len(result.rounds) == 4
    assert [r.end_offset for r in result.rounds] == [57, 114, 171, 200]
    assert result.end_offset == 200
    assert [o for o, _, _ in records(log)] == list(range(200))


def test_clean_log_checkpoint_is_read_by_a_later_log_cleaner(tmp_path):
    # offline compaction (clean_log) first, the background LogCleaner of a later run afterwards
    log = make_log(tmp_path)
    _updates(log, 60)
    result = clean_log(log)
    cleaner = LogCleaner(tmp_path, {TP: log}, CleanerConfig(backoff_ms=10))
    assert cleaner.cleaner_manager.cleaning_state(TP) is None
    assert cleaner.cleaner_manager.all_cleaner_checkpoints()[TP] == result.end_offset


def test_tombstones_removed_by_later_round_after_horizon(tmp_path):
    log = make_log(tmp_path, delete_retention_ms=1000)
    _updates(log, 30)
    tombstone(log, 3, timestamp=now_ms())
    for i in range(30):
        append(log, 10 + i, i, timestamp=now_ms())
    t0 = now_ms()
    clean_log(log, now_ms=t0)
    assert any(k == b"3" and v is None for _, k, v in records(log))
    append(log, 77, 1)
    log.roll()
    clean_log(log, now_ms=t0 + 1000)
    assert not any(k == b"3" for _, k, _ in records(log))


def test_log_cleaner_threads_clean_filthiest_log_and_log_stats(tmp_path, caplog):
    log = make_log(tmp_path, min_cleanable_dirty_ratio=0.01)
    _updates(log, 200)
    config = CleanerConfig(num_threads=2, backoff_ms=20, dedupe_buffer_size_bytes=2 * 24 * 1000)
    caplog.set_level(logging.INFO, logger="materializer.storage.log_cleaner")
    with LogCleaner(tmp_path, {TP: log}, config) as cleaner:
        assert cleaner.await_cleaned(TP, log.active_segment.base_offset, timeout_s=20)
        assert cleaner.dead_thread_count == 0
    assert "size reduction" in caplog.text and "MB/sec" in caplog.text
    assert all(not t.is_alive() for t in cleaner.threads)


def test_log_cleaner_runs_retention_on_compacted_logs(tmp_path):
    log = make_log(tmp_path, cleanup_policy=("compact", "delete"), retention_ms=1, min_cleanable_dirty_ratio=0.99)
    for i in range(50):
        append(log, i, i, timestamp=1)
    assert log.number_of_segments > 1
    with LogCleaner(tmp_path, {TP: log}, CleanerConfig(backoff_ms=20)):
        import time

        deadline = time.monotonic() + 10
        while log.number_of_segments > 1 and time.monotonic() < deadline:
            time.sleep(0.02)
    assert log.number_of_segments == 1 and log.active_segment.size_in_bytes == 0


def test_abort_and_pause_with_running_threads(tmp_path):
    log = make_log(tmp_path, min_cleanable_dirty_ratio=0.01)
    _updates(log, 100)
    with LogCleaner(tmp_path, {TP: log}, CleanerConfig(backoff_ms=10)) as cleaner:
        cleaner.abort_and_pause_cleaning(TP)
        assert cleaner.cleaner_manager.cleaning_state(TP) == LogCleaningPaused(1)
        cleaner.resume_cleaning([TP])
        assert cleaner.await_cleaned(TP, log.active_segment.base_offset, timeout_s=20)


def test_clean_log_forced_offset_keeps_later_batches_verbatim(tmp_path):
    """Batches from N on are copied as they are: a tombstone there gets no delete horizon yet."""
    log = make_log(tmp_path, segment_bytes=10**6)
    _updates(log, 20)
    tombstone(log, 7, timestamp=now_ms())  # offset 20 (below N: gets a horizon)
    _updates(log, 5)
    tombstone(log, 4, timestamp=now_ms())  # offset 26 (at/after N: untouched)
    before = {b.base_offset: bytes(b.buffer) for b in batches(log)}
    clean_log(log, first_uncleanable_offset=25)
    after = {b.base_offset: b for b in batches(log)}
    assert after[20].has_delete_horizon
    assert not after[26].has_delete_horizon
    assert all(bytes(after[o].buffer) == before[o] for o in before if o >= 25)
