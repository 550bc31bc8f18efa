"""LogSegment: re-expresses the applicable scenarios of Kafka's LogSegmentTest."""

import os

import pytest

from ._log_test_helpers import make_batch
from materializer.storage.errors import CorruptRecordError, SegmentOffsetOverflowError
from materializer.storage.log_config import LONG_MAX, LogConfig
from materializer.storage.offset_index import OffsetPosition
from materializer.storage.record_batch import RecordBatch
from materializer.storage.segment import LogSegment, RollParams
from materializer.storage.time_index import TimestampOffset


@pytest.fixture
def open_segment(tmp_path):
    opened = []

    def factory(base_offset=40, index_interval_bytes=10, **kwargs):
        kwargs.setdefault("segment_index_bytes", 4096)
        config = LogConfig(index_interval_bytes=index_interval_bytes, **kwargs)
        seg = LogSegment.open(tmp_path, base_offset, config)
        opened.append(seg)
        return seg

    yield factory
    for seg in opened:
        if not seg.log.closed:
            seg.close_handlers()


def append(seg, base, count=1, **kwargs):
    data = make_batch(base, count, **kwargs)
    seg.append(base + count - 1, data)
    return data


def first_offsets(seg, start):
    return [b.base_offset for _, b in seg.read_batches(start)]


def test_append_offset_overflow(open_segment):
    seg = open_segment(base_offset=40)
    with pytest.raises(SegmentOffsetOverflowError) as info:
        seg.append(39, make_batch(39))
    assert info.value.segment == 40 and info.value.offset == 39
    with pytest.raises(SegmentOffsetOverflowError):
        seg.append(40 + 2**31, make_batch(40 + 2**31))


def test_read_on_empty_segment(open_segment):
    seg = open_segment()
    assert first_offsets(seg, 40) == []


def test_read_before_first_offset(open_segment):
    seg = open_segment()
    append(seg, 50, 3)
    assert first_offsets(seg, 41) == [50]


def test_read_from_middle_of_batch(open_segment):
    seg = open_segment()
    append(seg, 50, 3)
    append(seg, 53, 3)
    batches = [b for _, b in seg.read_batches(51)]
    assert [b.base_offset for b in batches] == [50, 53]
    assert [r.offset for r in batches[0].records()] == [50, 51, 52]


def test_read_after_last(open_segment):
    seg = open_segment()
    append(seg, 50, 3)
    assert first_offsets(seg, 53) == []


def test_read_from_gap(open_segment):
    seg = open_segment()
    append(seg, 50, 2)
    append(seg, 60, 2)
    assert first_offsets(seg, 55) == [60]


def test_read_with_max_position(open_segment):
    seg = open_segment()
    first = append(seg, 50, 2)
    append(seg, 52, 2)
    assert [b.base_offset for _, b in seg.read_batches(50, max_position=len(first))] == [50]


def test_index_for_multiple_batches_in_one_append(open_segment):
    """Kafka testIndexForMultipleBatchesInMemoryRecords: interval 1 -> entries for offsets 1 and 2, not 0."""
    seg = open_segment(base_offset=0, index_interval_bytes=1)
    batches = [make_batch(i, timestamp=10 + i) for i in range(3)]
    seg.append(2, b"".join(batches))
    size = len(batches[0])
    assert seg.index.all_entries() == [OffsetPosition(1, size), OffsetPosition(2, 2 * size)]
    assert seg.time_index.all_entries() == [TimestampOffset(11, 1), TimestampOffset(12, 2)]


def test_non_monotonic_timestamps_for_multiple_batches(open_segment):
    seg = open_segment(base_offset=0, index_interval_bytes=1)
    batches = [make_batch(0, timestamp=1), make_batch(1, timestamp=0), make_batch(2, timestamp=2)]
    seg.append(2, b"".join(batches))
    assert seg.time_index.all_entries() == [TimestampOffset(1, 0), TimestampOffset(2, 2)]
    assert seg.max_timestamp_so_far == 2 and seg.offset_of_max_timestamp_so_far == 2


def test_index_rule_is_strictly_greater(open_segment):
    data = make_batch(0)
    seg = open_segment(base_offset=0, index_interval_bytes=len(data))
    for i in range(4):
        seg.append(i, make_batch(i))
    # after batch 0: len bytes (not > interval); after batch 1: 2*len > interval -> entry for batch 2
    assert [e.offset for e in seg.index.all_entries()] == [2]


def test_truncate(open_segment):
    seg = open_segment()
    offset = 40
    for _ in range(30):
        append(seg, offset, 2)
        offset += 2
    removed = seg.truncate_to(51)  # the batch holding 51 (50-51) goes entirely
    assert removed > 0
    assert seg.read_next_offset() == 50
    assert first_offsets(seg, 48) == [48]
    assert seg.index.last_offset < 50
    append(seg, 50, 2)
    assert first_offsets(seg, 50) == [50]


def test_truncate_empty_segment(open_segment):
    seg = open_segment()
    assert seg.truncate_to(0) == 0
    assert seg.truncate_to(40) == 0
    assert seg.index.max_entries == 4096 // 8


def test_reload_largest_timestamp_after_truncation(open_segment):
    seg = open_segment(base_offset=0, index_interval_bytes=1)
    for i in range(10):
        append(seg, i, timestamp=100 + i)
    assert seg.max_timestamp_so_far == 109
    seg.truncate_to(5)
    assert seg.max_timestamp_so_far == 104
    assert seg.offset_of_max_timestamp_so_far == 4


def test_truncate_full_and_reappend(open_segment):
    seg = open_segment(base_offset=40)
    append(seg, 40, 2, timestamp=500)
    append(seg, 42, 2, timestamp=600)
    seg.truncate_to(40)
    assert seg.size_in_bytes == 0 and seg.first_batch_timestamp() == LONG_MAX
    append(seg, 40, 1, timestamp=700)
    assert first_offsets(seg, 40) == [40]
    assert seg.first_batch_timestamp() == 700


def test_truncate_to_offset_in_gap(open_segment):
    seg = open_segment(base_offset=0)
    append(seg, 0, 2)
    append(seg, 10, 2)
    seg.truncate_to(5)  # offset in the gap: batch 10-11 is removed
    assert seg.read_next_offset() == 2


def test_find_offset_by_timestamp(open_segment):
    seg = open_segment(base_offset=40, index_interval_bytes=1)
    for i in range(10):
        append(seg, 40 + 2 * i, 2, timestamps=[1000 + 20 * i, 1010 + 20 * i])
    assert seg.find_offset_by_timestamp(1000).offset == 40
    assert seg.find_offset_by_timestamp(1005).offset == 41
    assert seg.find_offset_by_timestamp(1011).offset == 42
    assert seg.find_offset_by_timestamp(1190).offset == 59
    assert seg.find_offset_by_timestamp(2000) is None
    assert seg.find_offset_by_timestamp(0, starting_offset=45).offset == 45


def test_next_offset_calculation(open_segment):
    seg = open_segment()
    assert seg.read_next_offset() == 40
    append(seg, 50, 3)
    assert seg.read_next_offset() == 53


def test_change_file_suffixes(open_segment, tmp_path):
    seg = open_segment()
    append(seg, 40, 2)
    seg.index  # materialize
    seg.change_file_suffixes("", ".deleted")
    assert seg.has_suffix(".deleted")
    assert seg.log_path.name == "00000000000000000040.log.deleted" and seg.log_path.exists()
    assert (tmp_path / "00000000000000000040.index.deleted").exists()
    assert (tmp_path / "00000000000000000040.timeindex.deleted").exists()
    seg.change_file_suffixes(".deleted", "")
    assert (tmp_path / "00000000000000000040.log").exists()


def _fill(seg, n=100, base=0):
    for i in range(n):
        append(seg, base + i, timestamp=1000 + i)


def test_recovery_fixes_corrupt_index(open_segment):
    seg = open_segment(base_offset=0, index_interval_bytes=1)
    _fill(seg)
    good = seg.index.all_entries()
    seg.index.truncate()
    for i in range(5):
        seg.index.append(i + 1, 999999)
    assert seg.recover() == 0
    assert seg.index.all_entries() == good
    for i in range(100):
        assert first_offsets(seg, i)[0] == i


def test_recovery_fixes_corrupt_time_index(open_segment):
    seg = open_segment(base_offset=0, index_interval_bytes=1)
    _fill(seg)
    seg.time_index.truncate()
    seg.time_index.maybe_append(1, 1)
    seg.recover()
    for i in range(100):
        assert seg.find_offset_by_timestamp(1000 + i).offset == i


def test_recovery_truncates_at_corrupt_batch(open_segment):
    seg = open_segment(base_offset=0)
    _fill(seg, 20)
    positions = [p for p, _ in seg.log.batches_from(0)]
    bad = positions[7]
    seg.log.flush()
    with open(seg.log_path, "r+b") as f:
        f.seek(bad + 70)  # inside the records, covered by the CRC
        byte = f.read(1)
        f.seek(bad + 70)
        f.write(bytes([byte[0] ^ 0xFF]))
    size = seg.size_in_bytes
    # a strict read names the file and the byte position
    batch = [b for p, b in seg.log.batches_from(bad)][0]
    with pytest.raises(CorruptRecordError) as info:
        batch.ensure_valid()
    assert info.value.position == bad and str(seg.log_path) in str(info.value)
    assert seg.recover() == size - bad
    assert seg.read_next_offset() == 7
    assert seg.size_in_bytes == bad


def test_recovery_keeps_complete_batches_on_torn_write(open_segment):
    seg = open_segment(base_offset=0)
    _fill(seg, 10)
    seg.log.flush()
    size = seg.size_in_bytes
    with open(seg.log_path, "ab") as f:
        f.write(make_batch(10)[:30])  # torn trailing write
    reopened = LogSegment.open(seg.dir, 0, seg.config)
    assert reopened.recover() == 30
    assert reopened.size_in_bytes == size and reopened.read_next_offset() == 10
    reopened.close()


def test_recovery_truncates_garbage_length(open_segment):
    seg = open_segment(base_offset=0)
    _fill(seg, 3)
    seg.log.flush()
    size = seg.size_in_bytes
    with open(seg.log_path, "ab") as f:
        f.write(b"\x00" * 100)  # preallocated-style zeros: length 0 < 14
    reopened = LogSegment.open(seg.dir, 0, seg.config)
    with pytest.raises(CorruptRecordError) as info:
        list(reopened.log.batches_from(0))
    assert info.value.position == size
    assert reopened.recover() == 100
    reopened.close()


def test_preallocated_segment_trimmed_on_close(tmp_path):
    config = LogConfig(segment_bytes=10_000, preallocate=True)
    seg = LogSegment.open(tmp_path, 0, config, preallocate=True)
    assert os.path.getsize(seg.log_path) == 10_000
    data = make_batch(0, 3)
    seg.append(2, data)
    assert seg.size_in_bytes == len(data)
    seg.close()
    assert os.path.getsize(tmp_path / "00000000000000000000.log") == len(data)


def test_first_batch_timestamp(open_segment):
    seg = open_segment()
    assert seg.first_batch_timestamp() == LONG_MAX
    append(seg, 40, 2, timestamp=123)
    assert seg.first_batch_timestamp() == 124  # batch max timestamp


def test_should_roll(open_segment):
    seg = open_segment(base_offset=0)
    params = RollParams(max_segment_ms=100, max_segment_bytes=1000, max_timestamp_in_messages=0,
                        max_offset_in_messages=0, messages_size=10, now_ms=0)
    assert not seg.should_roll(params)
    append(seg, 0, timestamp=1000)
    assert not seg.should_roll(params._replace(max_timestamp_in_messages=1100))
    assert seg.should_roll(params._replace(max_timestamp_in_messages=1101))
    assert seg.should_roll(params._replace(max_segment_bytes=seg.size_in_bytes + 9, max_timestamp_in_messages=1000))
    assert not seg.should_roll(params._replace(max_segment_bytes=seg.size_in_bytes + 10, max_timestamp_in_messages=1000))
    assert seg.should_roll(params._replace(max_offset_in_messages=2**31, max_timestamp_in_messages=1000))


def test_on_become_inactive_segment(open_segment):
    seg = open_segment(base_offset=0, index_interval_bytes=100000)
    append(seg, 0, timestamp=5)
    append(seg, 1, timestamp=50)
    seg.on_become_inactive_segment()
    assert seg.time_index.all_entries() == [TimestampOffset(50, 1)]
    assert seg.index.length == 0 and seg.time_index.length == 12


def test_batches_are_labelled_with_file_and_position(open_segment):
    seg = open_segment()
    first = append(seg, 40)
    append(seg, 41)
    (_, b0), (p1, b1) = list(seg.read_batches(40))
    assert isinstance(b1, RecordBatch) and p1 == len(first)
    assert b1.position == p1 and b1.path == str(seg.log_path)


def test_delete(open_segment):
    seg = open_segment()
    append(seg, 40)
    seg.index
    seg.delete_if_exists()
    assert seg.deleted()


@pytest.mark.parametrize("index_interval_bytes, batches", [(1, 1300), (700, 300)])
def test_offset_and_timestamp_searches_equal_a_scan_of_every_batch(open_segment, index_interval_bytes, batches):
    """translate_offset and find_offset_by_timestamp (index lookup, then a scan: Kafka
    ``LogSegment.translateOffset`` / ``findOffsetByTimestamp``) for every offset and around every
    timestamp, against a scan of the batches as appended. Batches of 1-4 records with offset gaps
    inside and between them, timestamps that mostly rise; every batch indexed (1,300 entries: more
    than the 1,024 of the warm section) or one entry per ~700 bytes."""
    import random

    from materializer.storage.file_records import LogOffsetPosition

    rng = random.Random(batches)
    seg = open_segment(base_offset=100, index_interval_bytes=index_interval_bytes, segment_index_bytes=64 * 1024)
    layout = []  # (position, last offset, size, [(offset, timestamp)])
    offset = 100
    for n in range(batches):
        offsets = [offset]
        for _ in range(rng.randint(0, 3)):
            offsets.append(offsets[-1] + rng.choice((1, 1, 1, 2)))
        timestamps = [10_000 + 10 * n + rng.randrange(-25, 25) for _ in offsets]
        data = make_batch(offsets[0], offsets=offsets, timestamps=timestamps, value_bytes=rng.choice((0, 10, 150)))
        layout.append((seg.size_in_bytes, offsets[-1], len(data), list(zip(offsets, timestamps))))
        seg.append(offsets[-1], data)
        offset = offsets[-1] + rng.choice((1, 1, 3))
    if index_interval_bytes == 1:  # every batch after the first (more than 1 byte appended since the last entry)
        assert seg.index.entries == batches - 1
    records = [record for *_, batch_records in layout for record in batch_records]

    for target in range(99, offset + 2):
        expected = next((LogOffsetPosition(last, position, size) for position, last, size, _ in layout
                         if last >= target), None)
        assert seg.translate_offset(target) == expected, target

    starts = [None, 100, *rng.sample([o for o, _ in records], 5)]
    for target in sorted({t + d for _, t in records for d in (-1, 0, 1)} | {0, 2**62}):
        for start in starts if target % 7 == 0 else [None]:
            expected = next(((t, o) for o, t in records if t >= target and (start is None or o >= start)), None)
            found = seg.find_offset_by_timestamp(target, start)
            assert (None if found is None else (found.timestamp, found.offset)) == expected, (target, start)
