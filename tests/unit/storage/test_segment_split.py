"""split_segment_at: an inactive segment is split at an offset, the tail byte for byte."""

from __future__ import annotations

import shutil
from pathlib import Path

from materializer.storage.log import Log
from materializer.storage.record_batch_builder import RecordBatchBuilder
from materializer.storage.segment_split import split_segment_at

from .cleaner_fixtures import ProducerAppender, batches, interrupted_after_renames, make_log


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


def test_an_interruption_between_any_two_renames_of_a_split_loses_nothing(tmp_path: Path) -> None:
    """A KeyboardInterrupt after any rename of the split's swap leaves files that open to the same
    records, without ``.cleaned`` or ``.swap`` files (the split's cleanup once deleted its new
    segments after their source was renamed ``.deleted``)."""
    template = make_log(tmp_path / "template", segment_bytes=10**6, file_delete_delay_ms=60_000)
    for base in range(0, 30, 5):
        template.append_batch(_batch(base, 5))
    template.roll()
    before = [r for b in batches(template) for r in b.records()]
    template.close()
    for interrupt_after in range(1, 100):
        directory = tmp_path / f"after-{interrupt_after}" / "topic-0"
        shutil.copytree(template.dir, directory)
        log = Log.open(directory, template.config, had_clean_shutdown=True)
        try:
            with interrupted_after_renames(interrupt_after):
                finished = split_segment_at(log, 13)
        except KeyboardInterrupt:
            finished = False
        log.close()  # as the command does on its way out
        reopened = Log.open(directory, template.config, had_clean_shutdown=True)
        assert [r for b in batches(reopened) for r in b.records()] == before, f"interrupted after {interrupt_after}"
        assert not list(directory.glob("*.cleaned")) and not list(directory.glob("*.swap"))
        reopened.close()
        if finished:
            break
    assert finished and interrupt_after > 8
