"""split_segment_at: an inactive segment is split at an offset, the tail byte for byte."""

from __future__ import annotations

from pathlib import Path

from materializer.storage.record_batch_builder import RecordBatchBuilder
from materializer.storage.segment_split import split_segment_at

from .cleaner_fixtures import ProducerAppender, batches, make_log


def _batch(base: int, count: int) -> bytes:
    builder = RecordBatchBuilder(base)
    for i in range(count):
        builder.append(base + i, 1000 + i, b"k%d" % (i % 3), b"v%d" % i)
    return builder.build()


def test_split_inside_a_batch_keeps_records_and_tail_bytes(tmp_path: Path) -> None:
    log = make_log(tmp_path, segment_bytes=10**6)
    for base in range(0, 30, 5):
        log.append_batch(_batch(base, 5))
    log.roll()
    before = [r for b in batches(log) for r in b.records()]
    tail = [bytes(b.buffer) for b in batches(log) if b.base_offset >= 15]
    assert split_segment_at(log, 13)
    assert [s.base_offset for s in log.log_segments()] == [0, 13, 30]
    assert [r for b in batches(log) for r in b.records()] == before
    upper = [b for _, b in log.log_segments()[1].log.batches_from(0)]
    assert (upper[0].base_offset, upper[0].last_offset) == (13, 14)
    assert [bytes(b.buffer) for b in upper[1:]] == tail
    assert not list(tmp_path.glob("**/*.cleaned")) and not list(tmp_path.glob("**/*.swap"))


def test_no_split_of_the_active_segment_a_producer_batch_or_a_base_offset(tmp_path: Path) -> None:
    log = make_log(tmp_path, segment_bytes=10**6)
    log.append_batch(_batch(0, 5))
    assert not split_segment_at(log, 3)  # active segment
    ProducerAppender(log, producer_id=4, transactional=False).append([1, 2, 3])  # offsets 5..7
    log.roll()
    bases = [s.base_offset for s in log.log_segments()]
    assert not split_segment_at(log, 6)  # would cut a producer's batch
    assert not split_segment_at(log, 0)  # already a base offset
    assert [s.base_offset for s in log.log_segments()] == bases
