"""Tests for the Cleaner (re-expresses scenarios of Kafka's LogCleanerTest)."""

from __future__ import annotations

import os
import shutil

import pytest

from materializer.storage.cleaned_transaction_metadata import CleanedTransactionMetadata
from materializer.storage.cleaner import Cleaner
from materializer.storage.cleaner_manager import LogToClean
from materializer.storage.cleaner_stats import CleanerStats
from materializer.storage.errors import CorruptRecordError, LogCleaningAbortedError
from materializer.storage.log import Log
from materializer.storage.record_batch_builder import RecordBatchBuilder

from .cleaner_fixtures import (
    LARGE_TIMESTAMP,
    FakeOffsetMap,
    ProducerAppender,
    abort,
    append,
    batches,
    commit,
    interrupted_after_renames,
    key,
    keys_in_log,
    last_offsets_per_batch,
    last_sequences,
    make_log,
    now_ms,
    offsets_in_log,
    tombstone,
)


def make_cleaner(capacity: int = 2**31 - 1, **kw) -> Cleaner:
    return Cleaner(0, FakeOffsetMap(capacity), load_factor=0.75, **kw)


def ltc(log: Log, first_dirty: int = 0, uncleanable: int | None = None) -> LogToClean:
    return LogToClean.of(log, first_dirty, log.active_segment.base_offset if uncleanable is None else uncleanable)


def run_two_pass_clean(cleaner: Cleaner, log: Log, first_dirty: int, now: int, retention_ms: int = 86400000) -> int:
    cleaner.clean(ltc(log, first_dirty), now)
    return cleaner.clean(ltc(log, first_dirty), now + retention_ms + 1)[0]


def test_clean_segments(tmp_path):
    cleaner = make_cleaner()
    log = make_log(tmp_path)
    while log.number_of_segments < 4:
        append(log, log.log_end_offset, log.log_end_offset)
    assert keys_in_log(log) == list(range(log.log_end_offset))
    offset_map = FakeOffsetMap()
    for k in (1, 3, 5, 7, 9):
        offset_map.put(key(k), 2**63 - 1)
    segments = log.log_segments()[:3]
    stats = CleanerStats()
    expected_bytes_read = sum(s.size_in_bytes for s in segments)
    should_remain = [k for k in keys_in_log(log) if k not in (1, 3, 5, 7, 9)]
    cleaner.clean_segments(log, segments, offset_map, 0, stats, CleanedTransactionMetadata(),
                           last_records_of_active_producers={}, empty_batch_upper_bound_offset=segments[-1].read_next_offset())
    assert keys_in_log(log) == should_remain
    assert stats.bytes_read == expected_bytes_read


def _clean_all_keys_deleted(tmp_path, hw_at_group_end: bool):
    cleaner = make_cleaner()
    log = make_log(tmp_path)
    while log.number_of_segments < 4:
        append(log, log.log_end_offset, log.log_end_offset)
    offset_map = FakeOffsetMap()
    for k in keys_in_log(log):
        offset_map.put(key(k), 2**63 - 1)
    segments = log.log_segments()[:3]
    hw = segments[-1].read_next_offset() if hw_at_group_end else log.log_segments()[-1].read_next_offset()
    cleaner.clean_segments(log, segments, offset_map, 0, CleanerStats(), CleanedTransactionMetadata(),
                           last_records_of_active_producers={}, empty_batch_upper_bound_offset=hw)
    return log


def test_clean_segments_retaining_last_empty_batch(tmp_path):
    log = _clean_all_keys_deleted(tmp_path, True)
    assert log.number_of_segments == 2
    kept = list(batches(log))[:-len(list(log.log_segments()[-1].log.batches_from(0)))]
    assert len(kept) == 1
    assert kept[0].last_offset == log.log_segments()[-1].base_offset - 1
    assert kept[0].records_count == 0 and kept[0].size_in_bytes == 61


def test_clean_segments_not_retaining_last_empty_batch(tmp_path):
    log = _clean_all_keys_deleted(tmp_path, False)
    assert log.number_of_segments == 2
    assert list(log.log_segments()[0].log.batches_from(0)) == []


def test_cleaning_with_deletes(tmp_path):
    cleaner = make_cleaner()
    log = make_log(tmp_path)
    while log.number_of_segments < 2:
        append(log, log.log_end_offset, log.log_end_offset)
    leo = log.log_end_offset
    for k in range(0, leo, 2):
        tombstone(log, k)
    while log.number_of_segments < 4:
        append(log, log.log_end_offset, log.log_end_offset)
    cleaner.clean(ltc(log))
    keys = set(keys_in_log(log))
    assert not any(k in keys for k in range(0, leo, 2))


def test_log_cleaner_stats(tmp_path):
    cleaner = make_cleaner(4)  # 0.75 * 4 -> 3 keys fit
    log = make_log(tmp_path)
    for k in (0, 1, 0, 1, 0):
        append(log, k, k)
    log.roll()
    initial_size = log.size_in_bytes
    end_offset, stats = cleaner.clean(ltc(log, 2))
    assert end_offset == 5
    assert stats.messages_read == 5
    assert stats.bytes_read == initial_size
    assert stats.messages_written == 2
    assert stats.bytes_written == log.size_in_bytes
    assert stats.invalid_messages_read == 0
    assert stats.end_time_s >= stats.start_time_s


def test_log_cleaner_retains_producer_last_sequence(tmp_path):
    cleaner = make_cleaner(10)
    log = make_log(tmp_path)
    ts = now_ms()
    append(log, 0, 0)
    append(log, 0, 1, producer_id=1, producer_epoch=0, sequence=0, timestamp=ts)
    append(log, 0, 2, producer_id=2, producer_epoch=0, sequence=0, timestamp=ts)
    append(log, 0, 3, producer_id=3, producer_epoch=0, sequence=0, timestamp=ts)
    append(log, 1, 1, producer_id=2, producer_epoch=0, sequence=1, timestamp=ts)
    log.roll()
    cleaner.clean(ltc(log))
    assert last_offsets_per_batch(log) == [1, 3, 4]
    assert last_sequences(log) == {1: 0, 2: 1, 3: 0}
    assert keys_in_log(log) == [0, 1]
    assert offsets_in_log(log) == [3, 4]


def test_log_cleaner_retains_last_sequence_even_if_transaction_aborted(tmp_path):
    cleaner = make_cleaner(10)
    log = make_log(tmp_path)
    producer = ProducerAppender(log, 1)
    producer.append([1])
    producer.append([2, 3])
    abort(log, 1)
    log.roll()
    cleaner.clean(ltc(log))
    assert last_offsets_per_batch(log) == [2, 3]
    assert last_sequences(log) == {1: 2}
    assert keys_in_log(log) == []
    assert offsets_in_log(log) == [3]
    producer.append([1, 5])
    log.roll()
    cleaner.clean(ltc(log))
    assert last_offsets_per_batch(log) == [3, 5]
    assert last_sequences(log) == {1: 4}
    assert keys_in_log(log) == [1, 5]
    assert offsets_in_log(log) == [3, 4, 5]


def test_cleaning_with_keys_conflicting_with_txn_marker_keys(tmp_path):
    from materializer.storage.control_record import ControlRecordType, control_record_key

    cleaner = make_cleaner(10)
    log = make_log(tmp_path)
    ProducerAppender(log, 1).append([1])
    commit(log, 1)
    builder = RecordBatchBuilder(log.log_end_offset, producer_id=2, producer_epoch=0, base_sequence=0, is_transactional=True)
    builder.append(log.log_end_offset, now_ms(), control_record_key(ControlRecordType.COMMIT), b"foo")
    log.append_batch(builder.build())
    commit(log, 2)
    log.roll()
    assert offsets_in_log(log) == [0, 1, 2, 3]
    cleaner.clean(ltc(log))
    assert last_offsets_per_batch(log) == [0, 1, 2, 3]
    assert offsets_in_log(log) == [0, 1, 2, 3]


def test_partial_segment_clean(tmp_path):
    cleaner = make_cleaner(2)  # one key fits
    log = make_log(tmp_path)
    for k in (0, 1, 0, 1, 0):
        append(log, k, k)
    log.roll()
    cleaner.clean(ltc(log, 2))
    assert keys_in_log(log) == [1, 0, 1, 0]
    assert offsets_in_log(log) == [1, 2, 3, 4]
    cleaner.clean(ltc(log, 3))
    assert keys_in_log(log) == [0, 1, 0]
    assert offsets_in_log(log) == [2, 3, 4]
    cleaner.clean(ltc(log, 4))
    assert keys_in_log(log) == [1, 0]
    assert offsets_in_log(log) == [3, 4]


def _distinct_values_by_segment(log):
    return [len({r.value for _, b in s.log.batches_from(0) for r in b.records()}) for s in log.log_segments()]


def test_cleaning_with_uncleanable_section(tmp_path):
    cleaner = make_cleaner()
    log = make_log(tmp_path)
    n, num_cleanable, num_total = 10, 2, 7
    while log.number_of_segments <= num_cleanable:
        append(log, log.log_end_offset % n, log.log_end_offset)
    first_uncleanable = log.log_end_offset + 1
    while log.number_of_segments < num_total - 1:
        append(log, log.log_end_offset % n, log.log_end_offset)
    before = _distinct_values_by_segment(log)
    assert all(v > n for v in before[:-1])
    cleaner.clean(ltc(log, 0, first_uncleanable))
    after = _distinct_values_by_segment(log)
    for i in range(num_cleanable):
        assert after[i] < before[i]
    for i in range(num_cleanable, min(len(after), num_total)):
        assert after[i] == before[i]


def test_log_to_clean(tmp_path):
    log = make_log(tmp_path, segment_bytes=100)
    for _ in range(6):
        log.append_records([__import__("materializer.storage.record_batch", fromlist=["Record"]).Record(
            log.log_end_offset, -1, b"1", bytes(25))])
    base = log.active_segment.base_offset
    assert LogToClean.of(log, base, base).total_bytes == log.size_in_bytes - log.active_segment.size_in_bytes


def test_log_to_clean_with_uncleanable_section(tmp_path):
    log = make_log(tmp_path, segment_bytes=100)
    for _ in range(6):
        append(log, 1, bytes(25))
    segs = log.log_segments()
    ltc_ = LogToClean.of(log, segs[2].base_offset, segs[4].base_offset)
    clean = segs[0].size_in_bytes + segs[1].size_in_bytes
    cleanable = segs[2].size_in_bytes + segs[3].size_in_bytes
    assert ltc_.clean_bytes == clean
    assert ltc_.cleanable_bytes == cleanable
    assert ltc_.total_bytes == clean + cleanable
    assert ltc_.cleanable_ratio == pytest.approx(cleanable / (clean + cleanable))


def test_cleaning_with_unkeyed_messages(tmp_path):
    cleaner = make_cleaner()
    log = make_log(tmp_path, cleanup_policy=("delete",))
    while log.number_of_segments < 2:
        append(log, None, log.log_end_offset)
    num_invalid = sum(1 for b in batches(log) for r in b.records() if r.key is None)
    size_with_unkeyed = log.size_in_bytes
    while log.number_of_segments < 3:
        append(log, log.log_end_offset, log.log_end_offset)
    expected_size = log.size_in_bytes - size_with_unkeyed
    stats = cleaner.clean(ltc(log))[1]
    assert sum(1 for b in batches(log) for r in b.records() if r.key is None) == 0
    assert log.size_in_bytes == expected_size
    assert stats.invalid_messages_read == num_invalid


def test_basic_transaction_aware_cleaning(tmp_path):
    cleaner = make_cleaner()
    log = make_log(tmp_path, segment_bytes=2048)
    p1, p2 = ProducerAppender(log, 1), ProducerAppender(log, 2)
    p1.append([1, 2])
    p2.append([2, 3])
    p1.append([3, 4])
    abort(log, 1)
    commit(log, 2)
    p1.append([2])
    commit(log, 1)
    aborted = log.collect_aborted_transactions(log.log_start_offset, log.log_end_offset)
    log.roll()
    cleaner.clean(ltc(log))
    assert keys_in_log(log) == [3, 2]
    assert offsets_in_log(log) == [3, 6, 7, 8, 9]
    assert log.collect_aborted_transactions(log.log_start_offset, log.log_end_offset) == aborted


def test_clean_with_transactions_spanning_segments(tmp_path):
    cleaner = make_cleaner()
    log = make_log(tmp_path)
    p1, p2, p3 = ProducerAppender(log, 1), ProducerAppender(log, 2), ProducerAppender(log, 3)
    p1.append([1, 2])
    p3.append([2, 3])
    p2.append([3, 4])
    log.roll()
    p2.append([5, 6])
    p3.append([6, 7])
    p1.append([7, 8])
    abort(log, 2)
    p3.append([8, 9])
    commit(log, 3)
    p1.append([9, 10])
    abort(log, 1)
    dirty = cleaner.clean(ltc(log))[0]
    assert keys_in_log(log) == [2, 3, 5, 6, 6, 7, 7, 8, 8, 9, 9, 10]
    log.roll()
    p2.append([11])
    p1.append([12])
    cleaner.clean(ltc(log, dirty))
    assert keys_in_log(log) == [2, 3, 6, 7, 8, 9, 11, 12]


def test_commit_marker_removal(tmp_path):
    cleaner = make_cleaner()
    log = make_log(tmp_path, segment_bytes=256)
    producer = ProducerAppender(log, 1)
    producer.append([1])
    producer.append([2, 3])
    commit(log, 1)
    producer.append([2])
    commit(log, 1)
    log.roll()
    dirty = cleaner.clean(ltc(log), LARGE_TIMESTAMP)[0]
    assert keys_in_log(log) == [1, 3, 2]
    assert offsets_in_log(log) == [0, 2, 3, 4, 5]
    producer.append([1, 3])
    commit(log, 1)
    log.roll()
    dirty = cleaner.clean(ltc(log, dirty), LARGE_TIMESTAMP)[0]
    assert keys_in_log(log) == [2, 1, 3]
    assert offsets_in_log(log) == [3, 4, 5, 6, 7, 8]
    dirty = cleaner.clean(ltc(log, dirty), LARGE_TIMESTAMP)[0]
    assert offsets_in_log(log) == [3, 4, 5, 6, 7, 8]
    cleaner.clean(ltc(log, dirty), 2**63 - 1)
    assert keys_in_log(log) == [2, 1, 3]
    assert offsets_in_log(log) == [4, 5, 6, 7, 8]


def test_deleted_batches_with_no_messages_read(tmp_path):
    cleaner = make_cleaner()
    log = make_log(tmp_path, segment_bytes=1000, max_message_bytes=100)
    producer = ProducerAppender(log, 1)
    producer.append([1])
    abort(log, 1)
    producer.append([2])
    producer.append([2])
    commit(log, 1)
    log.roll()
    cleaner.clean(ltc(log), LARGE_TIMESTAMP)
    assert keys_in_log(log) == [2]
    assert offsets_in_log(log) == [1, 3, 4]
    run_two_pass_clean(cleaner, log, 0, LARGE_TIMESTAMP)
    assert keys_in_log(log) == [2]
    assert offsets_in_log(log) == [3, 4]


def test_commit_marker_retention_with_empty_batch(tmp_path):
    cleaner = make_cleaner()
    log = make_log(tmp_path, segment_bytes=256)
    producer1, producer2 = ProducerAppender(log, 1), ProducerAppender(log, 2)
    producer1.append([2, 3])
    log.roll()
    producer2.append([2, 3])
    commit(log, 2)
    log.roll()
    append(log, 2, 2)
    append(log, 3, 3)
    commit(log, 1)
    log.roll()
    dirty = cleaner.clean(ltc(log), LARGE_TIMESTAMP)[0]
    assert keys_in_log(log) == [2, 3]
    assert offsets_in_log(log) == [4, 5, 6, 7]
    assert last_offsets_per_batch(log) == [1, 3, 4, 5, 6, 7]
    dirty = cleaner.clean(ltc(log, dirty), LARGE_TIMESTAMP)[0]
    assert offsets_in_log(log) == [4, 5, 6, 7]
    assert last_offsets_per_batch(log) == [1, 3, 4, 5, 6, 7]
    producer2.append([1])
    commit(log, 2)
    log.roll()
    dirty = cleaner.clean(ltc(log, dirty), LARGE_TIMESTAMP)[0]
    assert keys_in_log(log) == [2, 3, 1]
    assert offsets_in_log(log) == [4, 5, 6, 7, 8, 9]
    assert last_offsets_per_batch(log) == [1, 4, 5, 6, 7, 8, 9]
    run_two_pass_clean(cleaner, log, dirty, LARGE_TIMESTAMP)
    assert keys_in_log(log) == [2, 3, 1]
    assert offsets_in_log(log) == [5, 6, 7, 8, 9]
    assert last_offsets_per_batch(log) == [1, 5, 6, 7, 8, 9]


def test_clean_empty_control_batch(tmp_path):
    cleaner = make_cleaner()
    log = make_log(tmp_path, segment_bytes=256)
    commit(log, 1)
    append(log, 2, 2)
    append(log, 3, 3)
    log.roll()
    dirty = run_two_pass_clean(cleaner, log, 0, LARGE_TIMESTAMP)
    assert keys_in_log(log) == [2, 3]
    assert offsets_in_log(log) == [1, 2]
    assert last_offsets_per_batch(log) == [0, 1, 2]
    cleaner.clean(ltc(log, dirty), 2**63 - 1)
    assert offsets_in_log(log) == [1, 2]
    assert last_offsets_per_batch(log) == [0, 1, 2]


def test_committed_and_aborted_transaction_spanning_segments(tmp_path):
    for control in (commit, abort):
        cleaner = make_cleaner()
        log = make_log(tmp_path, name=f"{control.__name__}-0", segment_bytes=128)
        ProducerAppender(log, 1).append([1])
        log.roll()
        control(log, 1)
        log.roll()
        if control is commit:
            run_two_pass_clean(cleaner, log, 0, LARGE_TIMESTAMP)
            assert offsets_in_log(log) == [0, 1]
        else:
            cleaner.clean(ltc(log), LARGE_TIMESTAMP)
            assert offsets_in_log(log) == [1]
            cleaner.clean(ltc(log), 2**63 - 1)
            assert offsets_in_log(log) == [1]
        assert last_offsets_per_batch(log) == [0, 1]


def test_abort_marker_removal(tmp_path):
    cleaner = make_cleaner()
    log = make_log(tmp_path, segment_bytes=256)
    producer = ProducerAppender(log, 1)
    producer.append([1])
    producer.append([2, 3])
    abort(log, 1)
    producer.append([3])
    commit(log, 1)
    log.roll()
    dirty = cleaner.clean(ltc(log), LARGE_TIMESTAMP)[0]
    assert keys_in_log(log) == [3]
    assert offsets_in_log(log) == [3, 4, 5]
    run_two_pass_clean(cleaner, log, dirty, LARGE_TIMESTAMP)
    assert keys_in_log(log) == [3]
    assert offsets_in_log(log) == [4, 5]


def test_abort_marker_retention_with_empty_batch(tmp_path):
    cleaner = make_cleaner()
    log = make_log(tmp_path, segment_bytes=256)
    producer = ProducerAppender(log, 1)
    producer.append([2, 3])
    abort(log, 1)
    log.roll()

    def assert_indexed():
        txns = log.collect_aborted_transactions(0, 100)
        assert [(t.producer_id, t.first_offset, t.last_offset) for t in txns] == [(1, 0, 2)]

    assert_indexed()
    dirty = cleaner.clean(ltc(log), LARGE_TIMESTAMP)[0]
    assert_indexed()
    assert keys_in_log(log) == [] and offsets_in_log(log) == [2]
    assert last_offsets_per_batch(log) == [1, 2]
    dirty = run_two_pass_clean(cleaner, log, dirty, LARGE_TIMESTAMP)
    assert_indexed()
    assert offsets_in_log(log) == [2] and last_offsets_per_batch(log) == [1, 2]
    producer.append([1])
    log.roll()
    dirty = cleaner.clean(ltc(log, dirty), LARGE_TIMESTAMP)[0]
    assert_indexed()
    assert keys_in_log(log) == [1]
    assert offsets_in_log(log) == [2, 3] and last_offsets_per_batch(log) == [2, 3]
    run_two_pass_clean(cleaner, log, dirty, LARGE_TIMESTAMP)
    assert keys_in_log(log) == [1]
    assert offsets_in_log(log) == [3] and last_offsets_per_batch(log) == [3]
    assert log.collect_aborted_transactions(0, 100) == []


def test_empty_batch_removal_with_sequence_reuse(tmp_path):
    cleaner = make_cleaner()
    log = make_log(tmp_path, segment_bytes=2048)
    ProducerAppender(log, 1).append([1])
    commit(log, 1)
    ProducerAppender(log, 1).append([2])
    commit(log, 1)
    append(log, 1, 1)
    append(log, 2, 1)
    log.roll()
    cleaner.clean(ltc(log), LARGE_TIMESTAMP)
    assert offsets_in_log(log) == [1, 3, 4, 5]
    assert last_offsets_per_batch(log) == [1, 2, 3, 4, 5]
    run_two_pass_clean(cleaner, log, 0, LARGE_TIMESTAMP)
    assert offsets_in_log(log) == [3, 4, 5]
    assert last_offsets_per_batch(log) == [2, 3, 4, 5]


def test_clean_tombstone(tmp_path):
    """A tombstone survives the round that sets its horizon, whatever its record timestamp."""
    cleaner = make_cleaner()
    log = make_log(tmp_path)
    append(log, 0, 0, timestamp=1)
    tombstone(log, 0, timestamp=1)  # very old record timestamp
    append(log, 1, 1, timestamp=1)
    log.roll()
    now = now_ms()
    dirty = cleaner.clean(ltc(log), now)[0]
    assert [(r.offset, r.value) for b in batches(log) for r in b.records()] == [(1, None), (2, b"1")]
    horizon_batch = [b for b in batches(log) if b.records_count and b.records()[0].value is None][0]
    assert horizon_batch.delete_horizon_ms == now + log.config.delete_retention_ms
    assert horizon_batch.records()[0].timestamp == 1  # record timestamps survive the new base timestamp
    append(log, 2, 2, timestamp=1)  # a later round needs a dirty section to run
    log.roll()
    dirty = cleaner.clean(ltc(log, dirty), now + log.config.delete_retention_ms - 1)[0]
    assert [r.offset for b in batches(log) for r in b.records()] == [1, 2, 3]
    append(log, 3, 3, timestamp=1)
    log.roll()
    cleaner.clean(ltc(log, dirty), now + log.config.delete_retention_ms)
    assert [r.offset for b in batches(log) for r in b.records()] == [2, 3, 4]


def test_unchanged_batches_are_copied_byte_for_byte(tmp_path):
    cleaner = make_cleaner()
    log = make_log(tmp_path, segment_bytes=4096)
    for i in range(20):
        append(log, i, i, timestamp=1000 + i)
    before = [bytes(b.buffer) for b in batches(log)]
    log.roll()
    cleaner.clean(ltc(log))
    assert [bytes(b.buffer) for b in batches(log)] == before


@pytest.mark.parametrize("compression", [0, 1, 2, 3, 4])
def test_rebuilt_batch_keeps_header_fields(tmp_path, compression):
    cleaner = make_cleaner()
    log = make_log(tmp_path, segment_bytes=4096)
    builder = RecordBatchBuilder(0, compression=compression, producer_id=7, producer_epoch=3, base_sequence=11,
                                 partition_leader_epoch=5)
    for i in range(4):
        builder.append(i, 1000 + i, key(i % 2), b"v%d" % i, headers=(("h", b"x"),))
    log.append_batch(builder.build())
    append(log, 9, 9, timestamp=2000)
    log.roll()
    cleaner.clean(ltc(log))
    rebuilt = list(batches(log))[0]
    assert (rebuilt.base_offset, rebuilt.last_offset) == (0, 3)
    assert (rebuilt.producer_id, rebuilt.producer_epoch, rebuilt.base_sequence, rebuilt.last_sequence) == (7, 3, 11, 14)
    assert rebuilt.partition_leader_epoch == 5 and int(rebuilt.compression_type) == compression
    assert [(r.offset, r.timestamp, r.key, r.value, r.headers) for r in rebuilt.records()] == [
        (2, 1002, b"0", b"v2", (("h", b"x"),)), (3, 1003, b"1", b"v3", (("h", b"x"),))]
    assert not rebuilt.has_delete_horizon


def test_build_offset_map(tmp_path):
    cleaner = make_cleaner()
    log = make_log(tmp_path)
    for i in range(500):
        append(log, i, i)
    segments = log.log_segments()

    def check(start, end):
        offset_map = FakeOffsetMap(1000)
        stats = CleanerStats()
        cleaner.build_offset_map(log, start, end, offset_map, stats)
        assert offset_map.latest_offset == end - 1
        assert offset_map.size == end - start
        for i in range(start, end):
            assert offset_map.get(key(i)) == i
        assert offset_map.get(key(start - 1)) == -1 and offset_map.get(key(end)) == -1

    check(0, segments[1].base_offset)
    check(segments[1].base_offset, segments[3].base_offset)
    check(segments[3].base_offset, log.log_end_offset)


def test_build_partial_offset_map(tmp_path):
    cleaner = make_cleaner(3)  # int(3 * 0.75) = 2 keys
    log = make_log(tmp_path)
    for i in range(1, 6):  # keys 1..5 at offsets 0..4
        append(log, i, i)
    log.roll()
    offset_map = FakeOffsetMap(3)
    cleaner.build_offset_map(log, 2, log.active_segment.base_offset, offset_map, CleanerStats())
    assert offset_map.size == 2
    assert offset_map.latest_offset == 3
    assert [offset_map.get(key(k)) for k in (1, 2, 3, 4, 5)] == [-1, -1, 2, 3, -1]


def test_cleaning_beyond_missing_offsets(tmp_path):
    cleaner = make_cleaner()
    log = make_log(tmp_path, segment_bytes=1024 * 1024)
    for offset in (0, 10, 20, 1000, 2000):
        append(log, offset % 3, offset, offset=offset)
    log.roll()
    end, _ = cleaner.clean(ltc(log))
    assert end == log.active_segment.base_offset == 2001
    # several segments with gaps
    log2 = make_log(tmp_path, name="gaps-0", segment_bytes=1024 * 1024)
    for offset in (0, 5):
        append(log2, 1, offset, offset=offset)
    log2.roll(100)
    append(log2, 2, 1, offset=200)
    log2.roll(300)
    append(log2, 3, 1, offset=400)
    end, _ = cleaner.clean(ltc(log2))
    assert end == log2.active_segment.base_offset == 300


def test_segment_grouping(tmp_path):
    log = make_log(tmp_path, segment_bytes=300, index_interval_bytes=1)
    while log.number_of_segments < 10:
        append(log, 1, b"hello")
    segs = log.log_segments()
    groups = Cleaner.group_segments_by_size(segs, 2**31 - 1, 2**31 - 1, log.log_end_offset)
    assert len(groups) == 1 and len(groups[0]) == len(segs)
    groups = Cleaner.group_segments_by_size(segs, 1, 2**31 - 1, log.log_end_offset)
    assert all(len(g) == 1 for g in groups) and len(groups) == len(segs)
    groups = Cleaner.group_segments_by_size(segs, 2**31 - 1, 1, log.log_end_offset)
    assert all(len(g) == 1 for g in groups) and len(groups) == len(segs)
    log_size = sum(s.size_in_bytes for s in segs[:3]) + 1
    groups = Cleaner.group_segments_by_size(segs, log_size, 2**31 - 1, log.log_end_offset)
    assert all(len(g) == 3 for g in groups[:-1])
    index_size = sum(s.index.size_in_bytes for s in segs[:3]) + 1
    groups = Cleaner.group_segments_by_size(segs, 2**31 - 1, index_size, log.log_end_offset)
    assert all(len(g) == 3 for g in groups[:-1])
    assert [s.base_offset for g in groups for s in g] == [s.base_offset for s in segs]


def test_segment_grouping_with_sparse_offsets(tmp_path):
    log = make_log(tmp_path, segment_bytes=400, index_interval_bytes=1)
    while log.number_of_segments == 1:
        append(log, 1, b"hello")
    append(log, 1, b"hello", offset=2**31 - 2)
    append(log, 1, b"hello")
    groups = Cleaner.group_segments_by_size(log.log_segments(), 2**31 - 1, 2**31 - 1, log.log_end_offset)
    assert len(groups) == 1
    append(log, 1, b"hello")
    groups = Cleaner.group_segments_by_size(log.log_segments(), 2**31 - 1, 2**31 - 1, log.log_end_offset)
    assert len(groups) == 2


def test_segment_grouping_with_sparse_offsets_and_empty_segments(tmp_path):
    cleaner = make_cleaner()
    log = make_log(tmp_path, segment_bytes=1024 * 1024)
    for i in range(3):
        append(log, 1, b"val")
        append(log, 1, b"val", offset=(i + 1) * (2**31) - 1)
        if i < 2:
            log.roll()
    log.roll()
    append(log, 1, b"val")
    first_uncleanable = log.log_end_offset - 1
    assert log.number_of_segments == 4
    assert len(Cleaner.group_segments_by_size(log.log_segments(), 2**31 - 1, 2**31 - 1, first_uncleanable)) == 3
    cleaner.clean(ltc(log, 0, first_uncleanable))
    assert log.number_of_segments == 4 and log.log_segments()[0].size_in_bytes == 0
    assert len(Cleaner.group_segments_by_size(log.log_segments(), 2**31 - 1, 2**31 - 1, first_uncleanable)) == 2
    cleaner.clean(ltc(log, 0, first_uncleanable))
    assert log.number_of_segments == 3


def test_clean_segments_with_abort(tmp_path):
    def abort_check(_tp):
        raise LogCleaningAbortedError("aborted")

    cleaner = make_cleaner(check_done=abort_check)
    log = make_log(tmp_path)
    while log.number_of_segments < 3:
        append(log, log.log_end_offset, log.log_end_offset)
    offset_map = FakeOffsetMap()
    with pytest.raises(LogCleaningAbortedError):
        cleaner.clean_segments(log, log.log_segments()[:2], offset_map, 0, CleanerStats(), CleanedTransactionMetadata(),
                               last_records_of_active_producers={}, empty_batch_upper_bound_offset=-1)
    assert not [p for p in os.listdir(log.dir) if p.endswith(".cleaned")]


def test_corrupt_message_size_larger_than_bytes_available(tmp_path):
    cleaner = make_cleaner()
    log = make_log(tmp_path)
    while log.number_of_segments < 2:
        append(log, log.log_end_offset, log.log_end_offset)
    first = log.log_segments()[0]
    size = first.size_in_bytes
    with open(first.log_path, "r+b") as f:
        f.truncate(size - 5)
    log.close()
    reopened = Log.open(log.dir, log.config, had_clean_shutdown=True)
    seg = reopened.log_segments()[0]
    if seg.size_in_bytes == size - 5:  # recovery skipped (clean shutdown): the cleaner must notice
        with pytest.raises(CorruptRecordError):
            cleaner.clean(ltc(reopened))


def test_round_keeps_last_source_mtime(tmp_path):
    cleaner = make_cleaner()
    log = make_log(tmp_path)
    while log.number_of_segments < 3:
        append(log, log.log_end_offset % 3, log.log_end_offset)
    first = log.log_segments()[0]
    first.set_last_modified_ms(1_600_000_000_000)
    cleaner.clean(ltc(log, 0, log.log_segments()[1].base_offset))
    assert log.log_segments()[0].last_modified_ms == 1_600_000_000_000


def _rename_segment_files(directory, base_offset: int, old_suffix: str, new_suffix: str, exts=None) -> None:
    prefix = f"{base_offset:020d}"
    for name in os.listdir(directory):
        for ext in exts or (".log", ".index", ".timeindex", ".txnindex"):
            if name == prefix + ext + old_suffix:
                os.replace(directory / name, directory / (prefix + ext + new_suffix))


def _restore_deleted(directory) -> None:
    for name in os.listdir(directory):
        if name.endswith(".deleted"):
            os.replace(directory / name, directory / name[: -len(".deleted")])



def _committed_state(log: Log) -> dict[bytes, bytes]:
    """Key -> latest value as a read_committed consumer of ``log`` sees them."""
    from materializer.storage.read_committed import read_committed

    state: dict[bytes, bytes] = {}
    for record in read_committed(log):
        if record.value is None:
            state.pop(record.key, None)
        else:
            state[record.key] = bytes(record.value)
    return state


@pytest.mark.parametrize("cleaned_before", [False, True])
def test_an_interruption_between_any_two_renames_of_a_round_loses_nothing(tmp_path, cleaned_before):
    """A KeyboardInterrupt (Ctrl-C, or SIGTERM through ``materializer.interrupts``) raised after any
    rename of a round leaves files that open to the same committed state, without ``.cleaned`` or
    ``.swap`` files. The round's cleanup once deleted a cleaned segment whose swap had begun, i.e.
    the only copy of its group once the sources were renamed ``.deleted`` (``materializer compact``
    stopped by SIGTERM lost a segment). ``cleaned_before``: the round merges already cleaned
    segments into groups of several."""
    template = tmp_path / "template"
    log = make_log(template, segment_bytes=400, file_delete_delay_ms=60_000)
    txn = ProducerAppender(log, 7)
    for i in range(60):
        if i % 9 == 4:
            txn.append([i % 7, i % 5])
        elif i % 9 == 6:
            commit(log, 7)
        else:
            append(log, i % 6, i)
    if cleaned_before:
        make_cleaner().clean(ltc(log))
    expected = _committed_state(log)
    assert len(expected) == 7
    log.close()

    for interrupt_after in range(1, 200):
        directory = tmp_path / f"after-{interrupt_after}" / "topic-0"
        shutil.copytree(log.dir, directory)
        log = Log.open(directory, log.config, had_clean_shutdown=True)
        try:
            with interrupted_after_renames(interrupt_after):
                make_cleaner().clean(ltc(log))
            finished = True
        except KeyboardInterrupt:
            finished = False
        log.close()  # as the command does on its way out
        reopened = Log.open(directory, log.config, had_clean_shutdown=True)  # closed, as the command closes it
        assert _committed_state(reopened) == expected, f"interrupted after rename {interrupt_after}"
        assert not [n for n in os.listdir(directory) if n.endswith((".cleaned", ".swap"))]
        reopened.close()
        if finished:
            break
    assert finished and interrupt_after > 20  # every rename of the round was an interruption point

def test_recovery_after_crash(tmp_path):
    """Crash at each step of the .cleaned -> .swap -> .deleted protocol, then reopen (Kafka testRecoveryAfterCrash)."""
    cleaner = make_cleaner()
    config = dict(segment_bytes=300, index_interval_bytes=1, file_delete_delay_ms=3_600_000)
    log = make_log(tmp_path, **config)
    directory = log.dir
    message_count = 0
    while log.number_of_segments < 10:
        append(log, log.log_end_offset, log.log_end_offset)
        message_count += 1
    all_keys = keys_in_log(log)
    offset_map = FakeOffsetMap()

    def clean_first_nine():
        for k in range(1, message_count, 2):
            offset_map.put(key(k), 2**63 - 1)
        cleaner.clean_segments(log, log.log_segments()[:9], offset_map, 0, CleanerStats(), CleanedTransactionMetadata(),
                               last_records_of_active_producers={}, empty_batch_upper_bound_offset=-1)

    def recover_and_check(expected_keys):
        recovered = Log.open(directory, log.config, had_clean_shutdown=False)
        assert keys_in_log(recovered) == expected_keys
        assert not [n for n in os.listdir(directory) if n.endswith((".cleaned", ".swap"))]
        return recovered

    def fill():
        nonlocal message_count
        while log.number_of_segments < 10:
            append(log, log.log_end_offset, log.log_end_offset)
            message_count += 1

    clean_first_nine()
    log.close()
    # 1) crash after the .cleaned files were written, before any rename to .swap: clean aborted
    _rename_segment_files(directory, 0, "", ".cleaned")
    _restore_deleted(directory)
    log = recover_and_check(all_keys)

    clean_first_nine()
    log.close()
    # 2) crash after some .cleaned files were renamed to .swap: clean aborted
    _rename_segment_files(directory, 0, "", ".cleaned")
    _rename_segment_files(directory, 0, ".cleaned", ".swap", exts=(".log",))
    _restore_deleted(directory)
    log = recover_and_check(all_keys)

    clean_first_nine()
    cleaned_keys = keys_in_log(log)
    log.close()
    # 3) crash after the swap files exist, before old segments were renamed .deleted: swap completed
    _rename_segment_files(directory, 0, "", ".swap")
    _restore_deleted(directory)
    log = recover_and_check(cleaned_keys)

    fill()
    clean_first_nine()
    cleaned_keys = keys_in_log(log)
    log.close()
    # 4) crash after the swap files exist and old segments were renamed .deleted: swap completed
    _rename_segment_files(directory, 0, "", ".swap")
    log = recover_and_check(cleaned_keys)

    fill()
    clean_first_nine()
    cleaned_keys = keys_in_log(log)
    log.close()
    # 5) crash after some swap files were renamed to their final names
    _rename_segment_files(directory, 0, "", ".swap", exts=(".timeindex",))
    log = recover_and_check(cleaned_keys)

    fill()
    clean_first_nine()
    cleaned_keys = keys_in_log(log)
    log.close()
    # 6) swap complete, asynchronous deletion of .deleted files not done
    log = recover_and_check(cleaned_keys)
    log.close()
