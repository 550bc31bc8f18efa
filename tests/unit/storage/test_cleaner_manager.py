"""Tests for LogCleanerManager (re-expresses scenarios of Kafka's LogCleanerManagerTest)."""

from __future__ import annotations

import dataclasses
import threading
import time

import pytest

from materializer.storage.checkpoint import CLEANER_OFFSET_CHECKPOINT, read_offset_checkpoint, write_offset_checkpoint
from materializer.storage.cleaner_manager import (
    LOG_CLEANING_ABORTED,
    LOG_CLEANING_IN_PROGRESS,
    IllegalCleaningStateError,
    LogCleanerManager,
    LogCleaningError,
    LogCleaningPaused,
    LogToClean,
    cleanable_offsets,
    max_compaction_delay,
)
from materializer.storage.errors import LogCleaningAbortedError

from .cleaner_fixtures import ProducerAppender, abort, append, make_log, now_ms

HOUR_MS = 3_600_000


def write_records(log, num_batches: int, batches_per_segment: int = 5) -> None:
    for i in range(num_batches):
        append(log, log.log_end_offset, log.log_end_offset, timestamp=now_ms())
        if i % batches_per_segment == 0:
            log.roll()
    log.roll()


def increasingly_filthy_logs(tmp_path, partitions):
    logs = {}
    num_batches = 20
    for tp in partitions:
        log = make_log(tmp_path, name=f"{tp[0]}-{tp[1]}", segment_bytes=2048, retention_ms=1,
                       min_cleanable_dirty_ratio=0.05)
        write_records(log, num_batches)
        logs[tp] = log
        num_batches += 5
    return logs


def manager_with_checkpoint(tmp_path, logs, offset):
    manager = LogCleanerManager(tmp_path, logs)
    for tp in logs:
        manager.update_checkpoints(tmp_path, (tp, offset))
    return manager


TPS = [("wishing-well", 0), ("wishing-well", 1), ("wishing-well", 2)]


def test_grab_filthiest_compacted_log_returns_log_with_dirtiest_ratio(tmp_path):
    logs = increasingly_filthy_logs(tmp_path, TPS)
    manager = manager_with_checkpoint(tmp_path, logs, 20)
    filthiest = manager.grab_filthiest_compacted_log(now_ms())
    assert filthiest.topic_partition == TPS[2]
    assert manager.cleaning_state(TPS[2]) is LOG_CLEANING_IN_PROGRESS


def test_grab_filthiest_compacted_log_ignores_uncleanable_partitions(tmp_path):
    logs = increasingly_filthy_logs(tmp_path, TPS)
    manager = manager_with_checkpoint(tmp_path, logs, 20)
    manager.mark_partition_uncleanable(logs[TPS[2]].dir.parent, TPS[2])
    assert manager.grab_filthiest_compacted_log(now_ms()).topic_partition == TPS[1]


def test_grab_filthiest_compacted_log_ignores_in_progress_partitions(tmp_path):
    logs = increasingly_filthy_logs(tmp_path, TPS)
    manager = manager_with_checkpoint(tmp_path, logs, 20)
    manager.set_cleaning_state(TPS[2], LOG_CLEANING_IN_PROGRESS)
    assert manager.grab_filthiest_compacted_log(now_ms()).topic_partition == TPS[1]


def test_grab_filthiest_compacted_log_ignores_both(tmp_path):
    logs = increasingly_filthy_logs(tmp_path, TPS)
    manager = manager_with_checkpoint(tmp_path, logs, 20)
    manager.set_cleaning_state(TPS[2], LOG_CLEANING_IN_PROGRESS)
    manager.mark_partition_uncleanable(logs[TPS[1]].dir.parent, TPS[1])
    assert manager.grab_filthiest_compacted_log(now_ms()) is None


def test_grab_filthiest_compacted_log_wraps_errors(tmp_path, monkeypatch):
    logs = increasingly_filthy_logs(tmp_path, [("A", 1)])
    manager = manager_with_checkpoint(tmp_path, logs, 1)
    import materializer.storage.cleaner_manager as cm

    def boom(*_a, **_k):
        raise RuntimeError("Error!")

    monkeypatch.setattr(cm, "max_compaction_delay", boom)
    with pytest.raises(LogCleaningError) as info:
        manager.grab_filthiest_compacted_log(now_ms())
    assert info.value.topic_partition == ("A", 1)
    assert isinstance(info.value.__cause__, RuntimeError)


def test_ratio_must_be_strictly_greater(tmp_path):
    tp = ("foo", 0)
    logs = increasingly_filthy_logs(tmp_path, [tp])
    manager = manager_with_checkpoint(tmp_path, logs, 10)
    ratio = LogToClean.of(logs[tp], 10, logs[tp].active_segment.base_offset).cleanable_ratio
    logs[tp].config = dataclasses.replace(logs[tp].config, min_cleanable_dirty_ratio=ratio)
    assert manager.grab_filthiest_compacted_log(now_ms()) is None
    logs[tp].config = dataclasses.replace(logs[tp].config, min_cleanable_dirty_ratio=ratio - 1e-9)
    assert manager.grab_filthiest_compacted_log(now_ms()).topic_partition == tp


def test_max_compaction_lag_forces_cleaning(tmp_path):
    tp = ("foo", 0)
    log = make_log(tmp_path, name="foo-0", segment_bytes=2048, min_cleanable_dirty_ratio=1.0,
                   max_compaction_lag_ms=HOUR_MS)
    old = now_ms() - 2 * HOUR_MS
    for i in range(5):
        append(log, i, i, timestamp=old)
    log.roll()
    append(log, 9, 9, timestamp=now_ms())
    manager = LogCleanerManager(tmp_path, {tp: log})
    assert max_compaction_delay(log, 0, now_ms()) > 0
    assert manager.grab_filthiest_compacted_log(now_ms()).needs_compaction_now


def test_dirty_offset_reset_if_larger_than_end_offset(tmp_path):
    tp = ("foo", 0)
    logs = increasingly_filthy_logs(tmp_path, [tp])
    manager = manager_with_checkpoint(tmp_path, logs, 200)
    assert manager.grab_filthiest_compacted_log(now_ms()).first_dirty_offset == 0


def test_dirty_offset_reset_if_smaller_than_start_offset(tmp_path):
    tp = ("foo", 0)
    logs = increasingly_filthy_logs(tmp_path, [tp])
    logs[tp].maybe_increment_log_start_offset(10)
    manager = manager_with_checkpoint(tmp_path, logs, 0)
    assert manager.grab_filthiest_compacted_log(now_ms()).first_dirty_offset == 10


def test_log_start_offset_larger_than_active_segment_base_offset(tmp_path):
    tp = ("foo", 0)
    log = make_log(tmp_path, name="foo-0", segment_bytes=2048)
    for _ in range(9):
        append(log, 1, 1)
    assert log.number_of_segments == 1
    log.maybe_increment_log_start_offset(2)
    manager = manager_with_checkpoint(tmp_path, {tp: log}, 0)
    assert manager.grab_filthiest_compacted_log(now_ms()) is None


def test_dirty_offset_larger_than_active_segment_base_offset(tmp_path):
    tp = ("foo", 0)
    log = make_log(tmp_path, name="foo-0", segment_bytes=2048)
    for _ in range(6):
        append(log, 1, 1)
    assert log.number_of_segments == 1 and log.active_segment.base_offset == 0
    manager = manager_with_checkpoint(tmp_path, {tp: log}, 3)
    assert manager.grab_filthiest_compacted_log(now_ms()) is None


def test_checkpoint_updated_for_invalid_offset_even_without_cleaning(tmp_path):
    tp = ("foo", 0)
    logs = increasingly_filthy_logs(tmp_path, [tp])
    logs[tp].maybe_increment_log_start_offset(20)
    manager = manager_with_checkpoint(tmp_path, logs, 15)
    logs[tp].config = dataclasses.replace(logs[tp].config, min_cleanable_dirty_ratio=1.0)
    assert manager.grab_filthiest_compacted_log(now_ms()) is None
    assert manager.all_cleaner_checkpoints()[tp] == 20


def test_deletable_logs_by_policy(tmp_path):
    for policy, expected in ((("delete",), 0), (("compact", "delete"), 1), (("compact",), 1)):
        name = "-".join(policy)
        log = make_log(tmp_path, name=f"{name}-0", cleanup_policy=policy)
        append(log, 1, 1)
        manager = LogCleanerManager(tmp_path, {(name, 0): log})
        assert len(manager.deletable_logs()) == expected


def test_logs_under_cleanup_ineligible_for_compaction(tmp_path):
    tp = ("log", 0)
    log = make_log(tmp_path, name="log-0", cleanup_policy=("delete",))
    append(log, 1, 1)
    log.roll()
    append(log, 2, 2)
    manager = LogCleanerManager(tmp_path, {tp: log})
    deletable = manager.pause_cleaning_for_non_compacted_partitions()
    assert len(deletable) == 1
    log.config = dataclasses.replace(log.config, cleanup_policy=("compact",), min_cleanable_dirty_ratio=0)
    assert manager.grab_filthiest_compacted_log(now_ms()) is None
    manager.resume_cleaning(list(deletable))
    cleanable = manager.grab_filthiest_compacted_log(now_ms())
    assert cleanable is not None
    log.config = dataclasses.replace(log.config, cleanup_policy=("delete",))
    assert len(manager.pause_cleaning_for_non_compacted_partitions()) == 0
    manager.done_deleting([cleanable.topic_partition])
    assert len(manager.pause_cleaning_for_non_compacted_partitions()) == 1


def test_update_checkpoints_add_and_remove(tmp_path):
    tp = ("log", 0)
    log = make_log(tmp_path, name="log-0")
    manager = LogCleanerManager(tmp_path, {tp: log})
    manager.update_checkpoints(tmp_path, (tp, 107))
    assert manager.all_cleaner_checkpoints()[tp] == 107
    manager.update_checkpoints(tmp_path, partition_to_remove=tp)
    assert tp not in manager.all_cleaner_checkpoints()


def test_update_checkpoints_drops_partitions_not_hosted(tmp_path):
    tp = ("log", 0)
    log = make_log(tmp_path, name="log-0")
    write_offset_checkpoint(tmp_path / CLEANER_OFFSET_CHECKPOINT, {("log", 7): 5})
    manager = LogCleanerManager(tmp_path, {tp: log})
    manager.update_checkpoints(tmp_path, (tp, 3))
    assert read_offset_checkpoint(tmp_path / CLEANER_OFFSET_CHECKPOINT) == {tp: 3}


def test_update_checkpoints_keeps_other_topics_sharing_the_data_dir(tmp_path):
    # One materializer process per topic may share a data dir: another topic's entry stays.
    tp = ("log", 0)
    log = make_log(tmp_path, name="log-0")
    write_offset_checkpoint(tmp_path / CLEANER_OFFSET_CHECKPOINT, {("other-topic", 0): 5})
    manager = LogCleanerManager(tmp_path, {tp: log})
    manager.update_checkpoints(tmp_path, (tp, 3))
    assert read_offset_checkpoint(tmp_path / CLEANER_OFFSET_CHECKPOINT) == {tp: 3, ("other-topic", 0): 5}


def test_maybe_truncate_checkpoint_only_lowers(tmp_path):
    tp = ("log", 0)
    log = make_log(tmp_path, name="log-0")
    manager = LogCleanerManager(tmp_path, {tp: log})
    manager.update_checkpoints(tmp_path, (tp, 107))
    manager.maybe_truncate_checkpoint(tmp_path, tp, 200)
    assert manager.all_cleaner_checkpoints()[tp] == 107
    manager.maybe_truncate_checkpoint(tmp_path, tp, 50)
    assert manager.all_cleaner_checkpoints()[tp] == 50


def _eight_segments(tmp_path, **config):
    log = make_log(tmp_path, segment_bytes=1024, **config)
    while log.number_of_segments < 8:
        append(log, log.log_end_offset, log.log_end_offset, timestamp=now_ms())
    return log


def test_cleanable_offsets_for_none(tmp_path):
    log = _eight_segments(tmp_path)
    log.high_watermark = 50
    offsets = cleanable_offsets(log, 0, now_ms())
    assert offsets.first_dirty_offset == 0
    assert offsets.first_uncleanable_dirty_offset == 50


def test_cleanable_offsets_active_segment(tmp_path):
    log = _eight_segments(tmp_path)
    offsets = cleanable_offsets(log, 0, now_ms())
    assert offsets.first_dirty_offset == 0
    assert offsets.first_uncleanable_dirty_offset == log.active_segment.base_offset


def test_cleanable_offsets_for_time(tmp_path):
    log = make_log(tmp_path, segment_bytes=1024, min_compaction_lag_ms=HOUR_MS)
    t0 = now_ms() - HOUR_MS - 1
    while log.number_of_segments < 4:
        append(log, log.log_end_offset, log.log_end_offset, timestamp=t0)
    active_at_t0 = log.active_segment.base_offset
    t1 = now_ms()
    while log.number_of_segments < 8:
        append(log, log.log_end_offset, log.log_end_offset, timestamp=t1)
    offsets = cleanable_offsets(log, 0, t1)
    assert offsets.first_dirty_offset == 0
    assert offsets.first_uncleanable_dirty_offset == active_at_t0


def test_cleanable_offsets_for_short_time(tmp_path):
    log = make_log(tmp_path, segment_bytes=1024, min_compaction_lag_ms=HOUR_MS)
    t0 = now_ms()
    while log.number_of_segments < 8:
        append(log, log.log_end_offset, log.log_end_offset, timestamp=t0)
    offsets = cleanable_offsets(log, 0, t0 + HOUR_MS + 1)
    assert offsets.first_uncleanable_dirty_offset == log.active_segment.base_offset


def test_cleanable_offsets_needs_checkpoint_reset(tmp_path):
    tp = ("foo", 0)
    log = increasingly_filthy_logs(tmp_path, [tp])[tp]
    log.maybe_increment_log_start_offset(10)
    assert not cleanable_offsets(log, 15, now_ms()).force_update_checkpoint
    log.maybe_increment_log_start_offset(20)
    assert cleanable_offsets(log, 15, now_ms()).force_update_checkpoint
    assert cleanable_offsets(log, 25, now_ms()).force_update_checkpoint


def test_undecided_transactional_data_not_cleanable(tmp_path):
    log = make_log(tmp_path, segment_bytes=1024, min_compaction_lag_ms=HOUR_MS)
    producer = ProducerAppender(log, 15)
    producer.append([1, 2])
    producer.append([3])
    log.roll()
    later = now_ms() + HOUR_MS + 1
    offsets = cleanable_offsets(log, 0, later)
    assert (offsets.first_dirty_offset, offsets.first_uncleanable_dirty_offset) == (0, 0)
    abort(log, 15, timestamp=later)
    log.roll()
    offsets = cleanable_offsets(log, 0, later)
    assert (offsets.first_dirty_offset, offsets.first_uncleanable_dirty_offset) == (0, 3)
    offsets = cleanable_offsets(log, 0, later + HOUR_MS + 1)
    assert offsets.first_uncleanable_dirty_offset == 4


def test_done_cleaning(tmp_path):
    tp = ("topic", 0)
    log = _eight_segments(tmp_path)
    manager = LogCleanerManager(tmp_path, {tp: log})
    with pytest.raises(IllegalCleaningStateError):
        manager.done_cleaning(tp, tmp_path, 1)
    manager.set_cleaning_state(tp, LogCleaningPaused(1))
    with pytest.raises(IllegalCleaningStateError):
        manager.done_cleaning(tp, tmp_path, 1)
    manager.set_cleaning_state(tp, LOG_CLEANING_IN_PROGRESS)
    manager.done_cleaning(tp, tmp_path, 1)
    assert manager.cleaning_state(tp) is None
    assert manager.all_cleaner_checkpoints()[tp] == 1
    manager.set_cleaning_state(tp, LOG_CLEANING_ABORTED)
    manager.done_cleaning(tp, tmp_path, 5)
    assert manager.cleaning_state(tp) == LogCleaningPaused(1)
    assert manager.all_cleaner_checkpoints()[tp] == 1


def test_done_deleting(tmp_path):
    tp = ("log", 0)
    log = make_log(tmp_path, name="log-0", cleanup_policy=("compact", "delete"))
    manager = LogCleanerManager(tmp_path, {tp: log})
    with pytest.raises(IllegalCleaningStateError):
        manager.done_deleting([tp])
    manager.set_cleaning_state(tp, LogCleaningPaused(1))
    with pytest.raises(IllegalCleaningStateError):
        manager.done_deleting([tp])
    manager.set_cleaning_state(tp, LOG_CLEANING_IN_PROGRESS)
    manager.done_deleting([tp])
    assert manager.cleaning_state(tp) is None
    manager.set_cleaning_state(tp, LOG_CLEANING_ABORTED)
    manager.done_deleting([tp])
    assert manager.cleaning_state(tp) == LogCleaningPaused(1)


def test_pause_resume_counting(tmp_path):
    tp = ("log", 0)
    manager = LogCleanerManager(tmp_path, {tp: make_log(tmp_path, name="log-0")})
    manager.abort_and_pause_cleaning(tp)
    manager.abort_and_pause_cleaning(tp)
    assert manager.cleaning_state(tp) == LogCleaningPaused(2)
    manager.resume_cleaning([tp])
    assert manager.cleaning_state(tp) == LogCleaningPaused(1)
    manager.resume_cleaning([tp])
    assert manager.cleaning_state(tp) is None
    with pytest.raises(IllegalCleaningStateError):
        manager.resume_cleaning([tp])
    manager.set_cleaning_state(tp, LOG_CLEANING_ABORTED)
    with pytest.raises(IllegalCleaningStateError):
        manager.abort_and_pause_cleaning(tp)


def test_abort_and_pause_waits_for_the_cleaner(tmp_path):
    tp = ("log", 0)
    manager = LogCleanerManager(tmp_path, {tp: make_log(tmp_path, name="log-0")})
    manager.set_cleaning_state(tp, LOG_CLEANING_IN_PROGRESS)
    aborted = threading.Event()

    def cleaner_thread():
        while True:
            try:
                manager.check_cleaning_aborted(tp)
            except LogCleaningAbortedError:
                aborted.set()
                manager.done_cleaning(tp, tmp_path, 0)
                return
            time.sleep(0.01)

    worker = threading.Thread(target=cleaner_thread)
    worker.start()
    manager.abort_and_pause_cleaning(tp, timeout_s=5)
    worker.join(5)
    assert aborted.is_set()
    assert manager.cleaning_state(tp) == LogCleaningPaused(1)
    with pytest.raises(TimeoutError):
        manager.set_cleaning_state(tp, LOG_CLEANING_IN_PROGRESS)
        manager.abort_and_pause_cleaning(tp, timeout_s=0.05)


def test_maintain_uncleanable_partitions(tmp_path):
    tp = ("log", 0)
    logs = {tp: make_log(tmp_path, name="log-0")}
    manager = LogCleanerManager(tmp_path, logs)
    manager.mark_partition_uncleanable(tmp_path, tp)
    manager.mark_partition_uncleanable(tmp_path, ("gone", 1))
    manager.maintain_uncleanable_partitions()
    assert manager.uncleanable_partitions(tmp_path) == {tp}


@pytest.mark.parametrize("garbage", [b"0\n2\nwishing-well 0 x\n", b"\xff\xfe\x00", b"7\n0\n"])
def test_corrupt_checkpoint_is_logged_reset_and_cleaning_goes_on(tmp_path, garbage, caplog):
    # Issue 7.5: a corrupt cleaner-offset-checkpoint killed the background cleaner thread. Kafka's
    # allCleanerCheckpoints logs the failure and cleans those logs from their log start offsets.
    logs = increasingly_filthy_logs(tmp_path, TPS)
    manager = manager_with_checkpoint(tmp_path, logs, 20)
    checkpoint = manager.checkpoint_path(tmp_path)
    checkpoint.write_bytes(garbage)
    filthiest = manager.grab_filthiest_compacted_log(now_ms())
    assert filthiest is not None and filthiest.first_dirty_offset == logs[filthiest.topic_partition].log_start_offset
    assert manager.corrupt_checkpoints_reset == 1
    assert any(str(checkpoint) in r.getMessage() and r.levelname == "ERROR" for r in caplog.records)
    manager.done_cleaning(filthiest.topic_partition, tmp_path, 30)
    assert read_offset_checkpoint(checkpoint)[filthiest.topic_partition] == 30  # the file works again
