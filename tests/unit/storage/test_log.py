"""Log: append with roll rules, reads, timestamp lookup, swap, delete, truncate, reopen."""

import pytest

from ._log_test_helpers import make_batch
from materializer.storage.errors import CorruptRecordError, InvalidOffsetError
from materializer.storage.log import Log
from materializer.storage.log_config import LogConfig
from materializer.storage.record_batch import Record


@pytest.fixture
def open_log(tmp_path):
    logs = []

    def factory(name="topic-0", **config_kwargs):
        config_kwargs.setdefault("file_delete_delay_ms", 0)
        log = Log.open(tmp_path / name, LogConfig(**config_kwargs), had_clean_shutdown=False)
        logs.append(log)
        return log

    yield factory
    for log in logs:
        log.close()


def bases(log):
    return [s.base_offset for s in log.log_segments()]


def test_topic_partition_and_empty_log(open_log):
    log = open_log("my-topic-3")
    assert (log.topic, log.partition) == ("my-topic", 3)
    assert log.log_start_offset == 0 and log.log_end_offset == 0 and bases(log) == [0]
    assert list(log.read_records()) == []


def test_append_keeps_broker_offsets_and_gaps(open_log):
    log = open_log()
    log.append_batch(make_batch(0, 3))
    log.append_batch(make_batch(10, 2))
    assert log.log_end_offset == 12
    assert [r.offset for r in log.read_records()] == [0, 1, 2, 10, 11]
    with pytest.raises(InvalidOffsetError):
        log.append_batch(make_batch(11))


def test_append_rejects_corrupt_batch(open_log):
    log = open_log()
    data = bytearray(make_batch(0, 2))
    data[-1] ^= 0xFF
    with pytest.raises(CorruptRecordError):
        log.append_batch(bytes(data))
    assert log.log_end_offset == 0


def test_roll_by_segment_bytes(open_log):
    size = len(make_batch(0))
    log = open_log(segment_bytes=3 * size)
    for i in range(7):
        log.append_batch(make_batch(i))
    assert bases(log) == [0, 3, 6]  # a segment may reach exactly segment.bytes
    assert [s.size_in_bytes for s in log.log_segments()] == [3 * size, 3 * size, size]


def test_roll_by_segment_ms_uses_record_timestamps(open_log):
    log = open_log(segment_ms=100)
    log.append_batch(make_batch(0, timestamp=1000))
    log.append_batch(make_batch(1, timestamp=1100))
    assert bases(log) == [0]
    log.append_batch(make_batch(2, timestamp=1101))
    assert bases(log) == [0, 2]


def test_roll_by_max_compaction_lag_for_compacted_topic(open_log):
    log = open_log(cleanup_policy=("compact",), max_compaction_lag_ms=50)
    log.append_batch(make_batch(0, timestamp=1000))
    log.append_batch(make_batch(1, timestamp=1051))
    assert bases(log) == [0, 1]


def test_roll_when_index_full(open_log):
    log = open_log(segment_index_bytes=24, index_interval_bytes=0)  # time index: 2 slots, full at 1
    for i in range(5):
        log.append_batch(make_batch(i, timestamp=i))
    assert bases(log) == [0, 2, 4]


def test_roll_on_relative_offset_overflow(open_log):
    log = open_log()
    log.append_batch(make_batch(0))
    far = 2**31
    log.append_batch(make_batch(far))
    assert bases(log) == [0, far]
    assert log.log_end_offset == far + 1


def test_new_segment_base_is_incoming_batch_base(open_log):
    size = len(make_batch(0))
    log = open_log(segment_bytes=size)
    log.append_batch(make_batch(0))
    log.append_batch(make_batch(100))
    assert bases(log) == [0, 100]
    inactive = log.log_segments()[0]
    assert inactive.index.length == 0  # trimmed on roll


def test_reads(open_log):
    log = open_log(segment_bytes=400)
    offset = 0
    for _ in range(30):
        log.append_batch(make_batch(offset, 3))
        offset += 5  # gaps of 2
    assert len(log.log_segments()) > 3
    assert [b.base_offset for b in log.read_batches(6, 16)] == [5, 10, 15]
    assert [r.offset for r in log.read_records(6, 12)] == [6, 7, 10, 11]
    assert [r.offset for r in log.read_records(8, 11)] == [10]  # start in a gap
    assert list(log.read_batches(log.log_end_offset)) == []
    assert list(log.read_records(1000)) == []
    assert [r.offset for r in log.read_records()][:4] == [0, 1, 2, 5]
    for seg in log.log_segments()[1:]:  # reading across segment boundaries from their base
        assert next(log.read_batches(seg.base_offset)).base_offset == seg.base_offset


def test_offset_for_timestamp(open_log):
    log = open_log(segment_bytes=300, index_interval_bytes=1)
    for i in range(20):
        log.append_batch(make_batch(i * 2, 2, timestamps=[100 * i, 100 * i + 50]))
    assert log.offset_for_timestamp(0) == 0
    assert log.offset_for_timestamp(150) == 3
    assert log.offset_for_timestamp(151) == 4
    assert log.offset_for_timestamp(1950) == 39
    assert log.offset_for_timestamp(5000) is None


def test_append_records(open_log):
    log = open_log()
    records = [Record(o, 1000 + o, b"k%d" % o, None if o == 3 else b"v") for o in (0, 1, 3, 7)]
    appended = log.append_records(records, max_batch_bytes=100)
    assert appended.size_in_bytes == log.size_in_bytes
    assert appended.batches == 4  # 71 bytes after one record + the next estimate (43 bytes) > 100
    assert list(log.read_records()) == records
    assert log.log_end_offset == 8


def test_reopen_keeps_data_and_offsets(tmp_path):
    config = LogConfig(segment_bytes=300, index_interval_bytes=50)
    log = Log.open(tmp_path / "t-0", config)
    for i in range(40):
        log.append_batch(make_batch(i * 2, 2))
    before = [r.offset for r in log.read_records()]
    segment_bases = bases(log)
    log.close()
    for clean in (True, False):
        again = Log.open(tmp_path / "t-0", config, had_clean_shutdown=clean)
        assert bases(again) == segment_bases
        assert again.log_end_offset == 80 and again.recovery_truncations == []
        assert [r.offset for r in again.read_records()] == before
        again.close()


def test_log_segments_range_and_next_base(open_log):
    size = len(make_batch(0))
    log = open_log(segment_bytes=size)
    for b in (0, 10, 20, 30):
        log.append_batch(make_batch(b))
    segs = log.log_segments()
    assert log.log_segments(15, 30) == segs[1:3]
    assert log.log_segments(10, 20) == segs[1:2]
    assert log.log_segments(20, 20) == []
    assert log.log_segments(-1, 11) == segs[0:2]
    with pytest.raises(ValueError):
        log.log_segments(20, 10)
    assert log.next_segment_base_after(segs[1]) == 20
    assert log.next_segment_base_after(segs[-1]) is None


def _copy_into_cleaned(log, sources, keep=lambda b: True):
    cleaned = log.create_cleaned_segment(sources[0].base_offset)
    for seg in sources:
        for _, batch in seg.read_batches(seg.base_offset):
            if keep(batch):
                cleaned.append(batch.last_offset, bytes(batch.buffer))
    cleaned.on_become_inactive_segment()
    cleaned.flush()
    return cleaned


def test_replace_segments(open_log):
    size = len(make_batch(0))
    log = open_log(segment_bytes=2 * size)
    for i in range(7):
        log.append_batch(make_batch(i))
    old = log.log_segments()[:2]
    cleaned = _copy_into_cleaned(log, old, keep=lambda b: b.base_offset % 2 == 1)
    assert cleaned.log_path.name.endswith(".log.cleaned")
    deleted = log.replace_segments([cleaned], old)
    assert [s.base_offset for s in deleted] == [2]
    assert bases(log) == [0, 4, 6]
    names = sorted(p.name for p in log.dir.iterdir())
    assert not any(n.endswith((".cleaned", ".swap", ".deleted")) for n in names)
    assert "00000000000000000002.log" not in names
    assert [r.offset for r in log.read_records()] == [1, 3, 4, 5, 6]


def test_delete_segments_with_delay(open_log):
    size = len(make_batch(0))
    log = open_log(segment_bytes=size, file_delete_delay_ms=60000)
    for i in range(3):
        log.append_batch(make_batch(i))
    first = log.log_segments()[0]
    assert log.delete_segments([first], "retention") == 1
    assert log.log_start_offset == 1 and bases(log) == [1, 2]
    assert (log.dir / "00000000000000000000.log.deleted").exists()
    assert log.delete_pending_files(now_ms=0) == 0
    assert log.delete_pending_files(now_ms=2**62) == 1
    assert not (log.dir / "00000000000000000000.log.deleted").exists()
    with pytest.raises(InvalidOffsetError):
        list(log.read_batches(0))


def test_delete_all_segments_rolls_first(open_log):
    log = open_log()
    log.append_batch(make_batch(0, 5))
    log.delete_segments(log.log_segments(), "retention")
    assert bases(log) == [5] and log.log_start_offset == 5 and log.log_end_offset == 5


def test_truncate_to(open_log):
    size = len(make_batch(10, 2))
    log = open_log(segment_bytes=2 * size)
    for i in range(6):
        log.append_batch(make_batch(i * 2, 2))
    assert bases(log) == [0, 4, 8]
    assert not log.truncate_to(100)
    assert log.truncate_to(6)  # a batch boundary: the log ends exactly there
    assert log.log_end_offset == 6 and bases(log) == [0, 4]
    assert [r.offset for r in log.read_records()] == [0, 1, 2, 3, 4, 5]
    # Inside the batch [4, 5]: the whole batch goes and the log ends at its base offset, so record 4
    # is fetched again instead of leaving a hole below a log end offset of 5.
    assert log.truncate_to(5)
    assert log.log_end_offset == 4 and bases(log) == [0, 4]
    assert [r.offset for r in log.read_records()] == [0, 1, 2, 3]
    log.append_batch(make_batch(4, 1))
    assert [r.offset for r in log.read_records()][-1] == 4


def test_truncate_fully(open_log):
    log = open_log()
    log.append_batch(make_batch(10, 3))
    log.truncate_fully_and_start_at(20)
    assert bases(log) == [20] and log.log_start_offset == 20 and log.log_end_offset == 20


def test_log_start_offset(open_log):
    log = open_log()
    log.append_batch(make_batch(0, 10))
    assert log.maybe_increment_log_start_offset(4)
    assert not log.maybe_increment_log_start_offset(2)
    assert [r.offset for r in log.read_records()][0] == 4
    with pytest.raises(InvalidOffsetError):
        log.maybe_increment_log_start_offset(11)


def _txn_batch(offset, producer_id, *, control=None):
    from materializer.storage.control_record import encode_end_txn_marker
    from materializer.storage.record_batch_builder import RecordBatchBuilder

    builder = RecordBatchBuilder(offset, producer_id=producer_id, producer_epoch=0, base_sequence=-1 if control else 0,
                                 is_transactional=True, is_control_batch=control is not None)
    if control is None:
        builder.append(offset, 1000, b"k", b"v")
    else:
        key, value = encode_end_txn_marker(control, 0)
        builder.append(offset, 1000, key, value)
    return builder.build()


def test_aborted_transactions_go_to_txn_index(open_log, tmp_path):
    from materializer.storage.control_record import ControlRecordType
    from materializer.storage.transaction_index import AbortedTxn

    log = open_log()
    log.append_batch(_txn_batch(0, 7))
    log.append_batch(_txn_batch(1, 8))
    log.append_batch(_txn_batch(2, 7, control=ControlRecordType.ABORT))
    log.append_batch(_txn_batch(3, 8, control=ControlRecordType.COMMIT))
    log.append_batch(_txn_batch(4, 9))
    log.append_batch(_txn_batch(5, 9, control=ControlRecordType.ABORT))
    assert log.active_segment.txn_index.all_aborted_txns() == [AbortedTxn(7, 0, 2, 1), AbortedTxn(9, 4, 5, 6)]
    assert [r.offset for r in log.read_records()] == [0, 1, 4]
    log.close()
    # state of open transactions is rebuilt from the log after reopening
    again = Log.open(log.dir, log.config, had_clean_shutdown=True)
    again.append_batch(_txn_batch(6, 11))
    again.append_batch(_txn_batch(7, 12))
    again.close()
    third = Log.open(log.dir, log.config, had_clean_shutdown=True)
    third.append_batch(_txn_batch(8, 11, control=ControlRecordType.ABORT))
    assert third.active_segment.txn_index.all_aborted_txns()[-1] == AbortedTxn(11, 6, 8, 7)
    third.close()
