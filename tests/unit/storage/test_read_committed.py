"""read_committed: a consumer's view of a partition with transactions (CompletedFetch rules)."""

from __future__ import annotations

import hashlib
import os
import random
import tracemalloc

import pytest

from materializer.storage.control_record import ControlRecordType, encode_end_txn_marker
from materializer.storage.errors import CorruptRecordError, InvalidOffsetError, StorageError
from materializer.storage.log import Log
from materializer.storage.log_config import LogConfig
from materializer.storage.read_committed import (
    AbortedTxnSource,
    CommittedReader,
    ReadOnlyPartition,
    read_committed,
    scan_transactions,
)
from materializer.storage.record_batch import CONTROL_FLAG_MASK, TRANSACTIONAL_FLAG_MASK, BatchHeaderFields
from materializer.storage.record_batch_builder import RecordBatchBuilder, build_empty_batch
from materializer.storage.transaction_index import AbortedTxn
from tests.fuzz_harness import batch_spans

SOURCES = list(AbortedTxnSource)


class LogWriter:
    """Appends plain, transactional and marker batches at consecutive offsets, remembering what a
    read_committed consumer must see."""

    def __init__(self, log: Log):
        self.log = log
        self.next_offset = log.log_end_offset
        self.pending: dict[int, list[tuple[int, bytes, bytes | None]]] = {}
        self.committed: list[tuple[int, bytes, bytes | None]] = []

    def plain(self, n: int = 1, key: bytes = b"k", value: bytes | None = b"v") -> None:
        builder = RecordBatchBuilder(self.next_offset)
        for i in range(n):
            builder.append(self.next_offset + i, 1000, key + b"%d" % i, value)
            self.committed.append((self.next_offset + i, key + b"%d" % i, value))
        self.log.append_batch(builder.build())
        self.next_offset += n

    def txn(self, producer_id: int, n: int = 1, key: bytes = b"t", value: bytes | None = b"x") -> None:
        builder = RecordBatchBuilder(self.next_offset, producer_id=producer_id, producer_epoch=0, base_sequence=0,
                                     is_transactional=True)
        for i in range(n):
            builder.append(self.next_offset + i, 1000, key + b"%d" % i, value)
            self.pending.setdefault(producer_id, []).append((self.next_offset + i, key + b"%d" % i, value))
        self.log.append_batch(builder.build())
        self.next_offset += n

    def end(self, producer_id: int, commit: bool) -> None:
        control = ControlRecordType.COMMIT if commit else ControlRecordType.ABORT
        builder = RecordBatchBuilder(self.next_offset, producer_id=producer_id, producer_epoch=0, base_sequence=-1,
                                     is_transactional=True, is_control_batch=True)
        key, value = encode_end_txn_marker(control, 0)
        builder.append(self.next_offset, 1000, key, value)
        self.log.append_batch(builder.build())
        self.next_offset += 1
        done = self.pending.pop(producer_id, [])
        if commit:
            self.committed.extend(done)

    def expected(self, start: int = 0, end: int | None = None) -> list[tuple[int, bytes, bytes | None]]:
        return sorted(r for r in self.committed if r[0] >= start and (end is None or r[0] < end))


def _view(records) -> list[tuple[int, bytes, bytes | None]]:
    return [(r.offset, r.key, r.value) for r in records]


@pytest.fixture
def new_log(tmp_path):
    logs = []

    def factory(name: str = "topic-0", **config) -> Log:
        log = Log.open(tmp_path / name, LogConfig(**config), had_clean_shutdown=True)
        logs.append(log)
        return log

    yield factory
    for log in logs:
        log.close()


def _interleaved(writer: LogWriter) -> None:
    writer.plain(2)
    writer.txn(7, 2, key=b"a")
    writer.txn(8, 1, key=b"b")
    writer.plain(1, key=b"p")
    writer.txn(7, 1, key=b"c")
    writer.end(7, commit=False)          # aborts offsets 2-3 and 6
    writer.plain(1, key=b"q", value=None)  # tombstone
    writer.txn(8, 2, key=b"d")
    writer.end(8, commit=True)           # commits 4, 9-10
    writer.txn(7, 1, key=b"e")           # same producer, next transaction
    writer.end(7, commit=True)


@pytest.mark.parametrize("source", SOURCES)
def test_interleaved_transactions(new_log, source):
    log = new_log(segment_bytes=300)  # several segments: aborted data and its marker in different files
    writer = LogWriter(log)
    _interleaved(writer)
    assert log.number_of_segments > 2
    reader = CommittedReader(log, source=source)
    assert _view(reader.records()) == writer.expected()
    assert reader.next_offset == log.log_end_offset == reader.last_stable_offset
    assert reader.batches_skipped_aborted == 2
    assert reader.control_batches == 3


def test_scan_matches_the_txn_index_the_log_wrote(new_log):
    log = new_log(segment_bytes=300)
    _interleaved(LogWriter(log))
    from_index = scan_transactions(log, source=AbortedTxnSource.INDEX).aborted_transactions
    from_scan = scan_transactions(log, source=AbortedTxnSource.SCAN).aborted_transactions
    assert [(t.producer_id, t.first_offset, t.last_offset) for t in from_scan] == [(7, 2, 7)]
    if from_index:  # the Log keeps .txnindex files: both ways must agree exactly
        assert from_index == from_scan


def test_missing_txn_index_falls_back_to_markers(new_log):
    log = new_log(segment_bytes=300)
    writer = LogWriter(log)
    _interleaved(writer)
    for segment in log.log_segments():
        segment.txn_index.delete_if_exists()
    assert _view(read_committed(log)) == writer.expected()
    # the broker-only answer cannot know about the abort any more: aborted records come back
    leaked = _view(read_committed(log, source=AbortedTxnSource.INDEX))
    assert (2, b"a0", b"x") in leaked


def test_index_entry_wins_for_first_offset_before_log_start(new_log):
    log = new_log()
    writer = LogWriter(log)
    writer.txn(5, 3)
    writer.end(5, commit=False)
    log.active_segment.txn_index.reset()
    log.active_segment.txn_index.append(AbortedTxn(5, -10, 3, 4))  # as if the txn began before the log start
    scan = scan_transactions(log)
    assert scan.aborted_transactions == [AbortedTxn(5, -10, 3, 4)]
    assert _view(read_committed(log)) == []


def test_open_transaction_stops_at_last_stable_offset(new_log):
    log = new_log()
    writer = LogWriter(log)
    writer.plain(2)
    writer.txn(9, 2)          # open, first offset 2
    writer.plain(3, key=b"z")  # after the LSO: a consumer does not see it yet
    reader = CommittedReader(log)
    assert reader.last_stable_offset == 2
    assert reader.scan.open_transactions == {9: 2}
    assert _view(reader.records()) == writer.expected(end=2)
    assert reader.next_offset == 2
    writer.end(9, commit=True)
    assert _view(read_committed(log)) == writer.expected()


def test_start_offset_after_an_earlier_abort_of_the_same_producer(new_log):
    log = new_log()
    writer = LogWriter(log)
    writer.txn(3, 2)
    writer.end(3, commit=False)      # offsets 0-1 aborted, marker at 2
    writer.txn(3, 2, key=b"n")       # 3-4
    writer.end(3, commit=True)
    for start in range(0, 6):
        assert _view(read_committed(log, start)) == writer.expected(start=start), start


def test_start_offset_inside_an_aborted_transaction(new_log):
    log = new_log()
    writer = LogWriter(log)
    writer.txn(3, 1)
    writer.plain(1)
    writer.txn(3, 1)
    writer.end(3, commit=False)
    writer.plain(1, key=b"w")
    assert _view(read_committed(log, 2)) == writer.expected(start=2) == [(4, b"w0", b"v")]


def test_start_offset_below_log_start(new_log):
    log = new_log()
    LogWriter(log).plain(3)
    log.maybe_increment_log_start_offset(2)
    with pytest.raises(InvalidOffsetError):
        CommittedReader(log, start_offset=1)


def test_empty_control_batch_left_by_the_cleaner_is_skipped(new_log):
    log = new_log()
    writer = LogWriter(log)
    log.append_batch(build_empty_batch(BatchHeaderFields(
        0, attributes=TRANSACTIONAL_FLAG_MASK | CONTROL_FLAG_MASK, partition_leader_epoch=0, max_timestamp=1000,
        producer_id=4, producer_epoch=0, base_sequence=-1)))
    writer.next_offset = 1
    writer.plain(2)
    reader = CommittedReader(log)
    assert _view(reader.records()) == writer.expected()
    assert reader.control_batches == 1


def test_random_histories_against_a_model(new_log):
    rng = random.Random(1234)
    for round_number in range(25):
        log = new_log(f"r{round_number}-0", segment_bytes=rng.choice([250, 600, 1 << 20]))
        writer = LogWriter(log)
        open_producers: set[int] = set()
        for _ in range(rng.randint(5, 60)):
            action = rng.random()
            producer = rng.randint(1, 4)
            if action < 0.3:
                writer.plain(rng.randint(1, 3), key=b"p%d-" % writer.next_offset)
            elif action < 0.75 or producer not in open_producers:
                writer.txn(producer, rng.randint(1, 3), key=b"t%d-" % writer.next_offset,
                           value=None if rng.random() < 0.1 else b"x")
                open_producers.add(producer)
            else:
                writer.end(producer, commit=rng.random() < 0.5)
                open_producers.discard(producer)
        lso = min((recs[0][0] for recs in writer.pending.values() if recs), default=writer.next_offset)
        starts = sorted({0, lso, *(rng.randint(0, writer.next_offset) for _ in range(3))})
        for source in SOURCES:
            for start in starts:
                reader = CommittedReader(log, start_offset=start, source=source)
                assert reader.last_stable_offset == lso
                assert _view(reader.records()) == writer.expected(start, lso), (round_number, source, start)


def _fingerprint(folder):
    return {p.name: (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns) for p in folder.iterdir()}


def test_read_only_partition_reads_in_place_without_modifying(new_log):
    log = new_log(segment_bytes=300)
    writer = LogWriter(log)
    _interleaved(writer)
    log.close()
    folder = log.dir
    os.chmod(folder, 0o555)
    try:
        before = _fingerprint(folder)
        partition = ReadOnlyPartition(folder)
        assert (partition.topic, partition.partition) == ("topic", 0)
        for source in SOURCES:
            assert _view(read_committed(partition, source=source)) == writer.expected()
        assert _view(read_committed(str(folder))) == writer.expected()
        assert _fingerprint(folder) == before
    finally:
        os.chmod(folder, 0o755)


def test_read_only_partition_tolerates_a_torn_tail_only_in_the_last_segment(new_log):
    log = new_log(segment_bytes=300)
    writer = LogWriter(log)
    for _ in range(6):
        writer.plain(2)
    log.close()
    segments = sorted(log.dir.glob("*.log"))
    assert len(segments) >= 2
    last = segments[-1]
    size = last.stat().st_size
    with open(last, "r+b") as f:
        f.truncate(size - 5)
    records = _view(read_committed(ReadOnlyPartition(log.dir)))
    assert records and records[-1][0] < writer.expected()[-1][0]
    first = segments[0]
    first_size = first.stat().st_size
    with open(first, "r+b") as f:
        f.truncate(first_size - 5)
    with pytest.raises(CorruptRecordError) as info:
        list(read_committed(ReadOnlyPartition(log.dir)))
    message = str(info.value)
    assert str(first) in message and "incomplete record batch" in message
    assert info.value.path == str(first)
    assert info.value.position is not None and 0 <= info.value.position < first_size


def test_read_only_partition_refuses_an_unfinished_swap(new_log):
    log = new_log()
    LogWriter(log).plain(1)
    log.close()
    (log.dir / "00000000000000000000.log.swap").write_bytes(b"")
    with pytest.raises(StorageError, match="interrupted segment swap"):
        ReadOnlyPartition(log.dir)


def test_header_pass_checks_crc(new_log):
    log = new_log()
    LogWriter(log).plain(3)
    log.close()
    path = log.dir / "00000000000000000000.log"
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptRecordError, match="crc") as info:
        list(read_committed(ReadOnlyPartition(log.dir)))
    assert info.value.path == str(path) and info.value.position == 0


def test_memory_stays_bounded_for_a_large_transaction(new_log):
    log = new_log()
    writer = LogWriter(log)
    for _ in range(200):  # one aborted transaction of 200 batches x 100 records x ~1 KiB
        writer.txn(1, 100, value=b"x" * 1000)
    writer.end(1, commit=False)
    writer.plain(1)
    assert log.size_in_bytes > 20_000_000
    tracemalloc.start()
    try:
        assert _view(read_committed(log)) == writer.expected()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 8_000_000, peak


def _three_segment_log(new_log) -> tuple[Log, LogWriter, list]:
    log = new_log(segment_bytes=300)
    writer = LogWriter(log)
    for _ in range(9):
        writer.plain(2)
    segments = sorted(log.dir.glob("*.log"))
    assert len(segments) >= 3
    return log, writer, segments


def _batch_positions(path) -> list[int]:
    return [start for start, _ in batch_spans(path.read_bytes())]


def test_open_log_reader_refuses_a_middle_segment_cut_mid_batch(new_log, tmp_path):
    # Issue 7.2: a store rebuild replayed short, silently, over a damaged non-last segment.
    log, writer, segments = _three_segment_log(new_log)
    middle = segments[1]
    log.close()
    size = middle.stat().st_size
    positions = _batch_positions(middle)
    with open(middle, "r+b") as f:
        f.truncate(size - 7)
    reopened = Log.open(log.dir, LogConfig(segment_bytes=300), had_clean_shutdown=True)  # no recovery: below the recovery point
    try:
        with pytest.raises(CorruptRecordError) as info:
            list(read_committed(reopened))
        assert info.value.path == str(middle)
        assert info.value.position == positions[-1] and "incomplete record batch" in str(info.value)
        # Everything below info.value.offset was intact and read.
        assert info.value.offset == int(middle.name[:20]) + 2 * (len(positions) - 1)
    finally:
        reopened.close()


@pytest.mark.parametrize("bit", [0, 5, 40, 63])
def test_a_flipped_base_offset_bit_is_an_error_not_a_short_read(new_log, bit):
    # Issue 7.3: the base offset is outside the CRC; offsets must increase and stay in the segment.
    log, writer, segments = _three_segment_log(new_log)
    middle = segments[1]
    log.close()
    positions = _batch_positions(middle)
    data = bytearray(middle.read_bytes())
    target = positions[1]
    data[target + 7 - bit // 8] ^= 1 << (bit % 8)
    middle.write_bytes(bytes(data))
    for partition in (ReadOnlyPartition(log.dir), Log.open(log.dir, LogConfig(segment_bytes=300), had_clean_shutdown=True)):
        try:
            with pytest.raises(CorruptRecordError) as info:
                list(read_committed(partition))
            assert info.value.path == str(middle)
            assert info.value.position in (positions[1], positions[2])  # the flipped batch, or the one after it
            assert "offset" in str(info.value)
        finally:
            if isinstance(partition, Log):
                partition.close()


def test_recovery_cuts_at_a_base_offset_that_goes_backwards(new_log):
    log, writer, segments = _three_segment_log(new_log)
    last = segments[-1]
    log.close()
    positions = _batch_positions(last)
    assert len(positions) >= 2
    data = bytearray(last.read_bytes())
    data[positions[1]:positions[1] + 8] = (0).to_bytes(8, "big")  # below the segment's base offset
    last.write_bytes(bytes(data))
    recovered = Log.open(log.dir, LogConfig(segment_bytes=300), recovery_point=0, had_clean_shutdown=False)
    try:
        assert recovered.log_end_offset == int(last.name[:20]) + 2
        assert _view(read_committed(recovered)) == writer.expected(end=recovered.log_end_offset)
    finally:
        recovered.close()


def test_strict_read_only_partition_refuses_a_torn_last_segment(new_log):
    log = new_log(segment_bytes=300)
    writer = LogWriter(log)
    for _ in range(6):
        writer.plain(2)
    log.close()
    last = sorted(log.dir.glob("*.log"))[-1]
    size = last.stat().st_size
    with open(last, "r+b") as f:
        f.truncate(size - 5)
    assert _view(read_committed(ReadOnlyPartition(log.dir)))  # lenient: a write in flight
    with pytest.raises(CorruptRecordError) as info:
        list(read_committed(ReadOnlyPartition(log.dir, strict=True)))
    assert info.value.path == str(last) and "incomplete record batch" in str(info.value)


@pytest.mark.parametrize("delete_delay_ms", [0, 60000])
def test_live_reader_reads_on_when_the_cleaner_swaps_its_segments_away(new_log, delete_delay_ms):
    """A reader of a live log holds its segments from creation. When the cleaner swaps them out
    and file.delete.delay.ms = 0 deletes (closes) them at once, the reader goes on from its next
    offset in the cleaned log; the latest value per key it yields is the log's."""
    from materializer.storage.cleaner import Cleaner
    from materializer.storage.log_cleaner import clean_log

    log = new_log(segment_bytes=300, cleanup_policy="compact", file_delete_delay_ms=delete_delay_ms)
    writer = LogWriter(log)
    for round_no in range(12):
        writer.plain(3, key=b"k", value=b"v%d" % round_no)  # keys k0..k2 updated every round
    log.roll()
    latest = {key: value for _, key, value in writer.expected()}

    reader = CommittedReader.from_log(log, 0)
    records = iter(reader.records())
    seen = {}
    first = next(records)
    seen[first.key] = first.value
    result = clean_log(log, cleaner=Cleaner())  # swaps in cleaned segments; delay 0: the old files are closed now
    assert result.rounds and result.end_offset == log.active_segment.base_offset
    for record in records:
        seen[record.key] = record.value
    assert seen == latest


def test_a_bound_inside_a_batch_leaves_the_rest_of_it_to_the_next_read(new_log):
    """from_log with an end offset inside a batch: the records below it are read and next_offset
    stops at it (not at the batch's end), so a read from there yields the rest of that batch."""
    log = new_log()
    writer = LogWriter(log)
    writer.plain(10)  # one batch, offsets 0-9
    writer.plain(2)  # offsets 10-11
    first = CommittedReader.from_log(log, 0, end_offset=4)
    assert _view(first.records()) == writer.expected(0, 4)
    assert first.next_offset == 4
    rest = CommittedReader.from_log(log, first.next_offset)
    assert _view(rest.records()) == writer.expected(4)
    assert rest.next_offset == 12


def test_log_read_batches_reads_on_past_a_segment_retention_deleted(new_log):
    """Log.read_batches takes its segments at the call; retention deleting them at once
    (file.delete.delay.ms = 0) moves the read to the new log start offset, no error."""
    from materializer.storage.retention import delete_log_start_offset_breached_segments

    log = new_log(segment_bytes=300, file_delete_delay_ms=0)
    writer = LogWriter(log)
    for _ in range(12):
        writer.plain(3)
    batches = log.read_batches(0)
    assert next(batches).base_offset == 0
    new_start = log.log_segments()[2].base_offset
    log.maybe_increment_log_start_offset(new_start)
    assert delete_log_start_offset_breached_segments(log) == 2
    offsets = [batch.base_offset for batch in batches]  # what was read before the delete may come first
    assert offsets == sorted(set(offsets))
    assert [o for o in offsets if o >= new_start] == list(range(new_start, log.log_end_offset, 3))
