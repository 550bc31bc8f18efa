"""The log keeps its ``leader-epoch-checkpoint`` and ``partition.metadata`` as a broker's ``UnifiedLog`` does.

Append assigns epochs before the bytes reach the segment; truncation, full truncation, retention
and log start offset changes trim the cache; the loader reads the file, lets recovery assign the
epochs of the batches it walks, trims, and rebuilds a missing or malformed file from the batch
headers; cleaning leaves the cache alone. The topic id is checked before anything is written.
"""

from __future__ import annotations

import errno
import logging
import os
import uuid
from pathlib import Path

import pytest

from materializer.storage.errors import CorruptPartitionMetadataError, InconsistentTopicIdError, LogStorageError
from materializer.storage.leader_epoch_cache import LEADER_EPOCH_CHECKPOINT_FILE, EpochEntry
from materializer.storage.log import Log
from materializer.storage.log_cleaner import clean_log
from materializer.storage.log_config import LogConfig
from materializer.storage.partition_metadata import PARTITION_METADATA_FILE, topic_id_to_string
from materializer.storage.record_batch import Record
from materializer.storage.record_batch_builder import RecordBatchBuilder
from materializer.storage.retention import delete_old_segments

SMALL = {"segment_bytes": 400, "file_delete_delay_ms": 0}


def _batch(base_offset: int, epoch: int, count: int = 2, key: bytes | None = None) -> bytes:
    builder = RecordBatchBuilder(base_offset, partition_leader_epoch=epoch)
    for offset in range(base_offset, base_offset + count):
        builder.append(offset, 1_000 + offset, key if key is not None else b"k%d" % offset, b"v" * 20)
    return builder.build()


def _fill(log: Log, epochs: list[int], count: int = 2) -> None:
    for epoch in epochs:
        log.append_batch(_batch(log.log_end_offset, epoch, count))


def _checkpoint(log_dir: Path) -> bytes:
    return (log_dir / LEADER_EPOCH_CHECKPOINT_FILE).read_bytes()


def _entries(*pairs):
    return [EpochEntry(e, s) for e, s in pairs]


def test_append_assigns_each_new_epoch_at_its_first_batch(tmp_path):
    with Log.open(tmp_path / "t-0") as log:
        assert _checkpoint(log.dir) == b""  # created empty with the folder, as Kafka does
        _fill(log, [0, 0, 1, 1, 1, 4])
        assert log.leader_epoch_cache.entries() == _entries((0, 0), (1, 4), (4, 10))
        assert log.latest_epoch == 4
        assert _checkpoint(log.dir) == b"0\n3\n0 0\n1 4\n4 10\n"
        assert log.end_offset_for_epoch(1) == (1, 10) and log.end_offset_for_epoch(4) == (4, 12)
        assert log.end_offset_for_epoch(9) is None


def test_batches_without_an_epoch_leave_the_cache_alone(tmp_path):
    with Log.open(tmp_path / "t-0") as log:
        _fill(log, [-1, -1])
        assert log.latest_epoch is None and _checkpoint(log.dir) == b""
        log.append_records([Record(4, 1, b"k", b"v"), Record(5, 1, b"k", b"w")], partition_leader_epoch=3)
        assert [b.partition_leader_epoch for b in log.read_batches(4)] == [3]
        _fill(log, [-1])
        assert log.leader_epoch_cache.entries() == _entries((3, 4))


def test_the_epoch_is_on_disk_before_the_batch(tmp_path, monkeypatch):
    with Log.open(tmp_path / "t-0") as log:
        _fill(log, [0])

        def full(*_args, **_kwargs):
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr("materializer.storage.checkpoint_file.write_file_atomically", full)
        size = log.active_segment.size_in_bytes
        with pytest.raises(LogStorageError) as info:
            log.append_batch(_batch(2, 1))
        assert info.value.path.endswith(LEADER_EPOCH_CHECKPOINT_FILE)
        assert log.log_end_offset == 2 and log.active_segment.size_in_bytes == size  # the batch was not appended
        log.append_batch(_batch(2, 0))  # same epoch: no write needed, the append goes through
        assert log.log_end_offset == 4


def test_truncate_to_drops_the_entries_from_the_cut(tmp_path):
    with Log.open(tmp_path / "t-0", LogConfig(**SMALL)) as log:
        _fill(log, [0, 0, 2, 2, 5, 5])
        assert log.number_of_segments > 1
        assert log.truncate_to(6) is True
        assert log.leader_epoch_cache.entries() == _entries((0, 0), (2, 4))
        assert _checkpoint(log.dir) == b"0\n2\n0 0\n2 4\n"
        log.truncate_to(4)
        assert log.leader_epoch_cache.entries() == _entries((0, 0))


def test_truncate_to_at_or_past_the_end_still_drops_an_epoch_without_batches(tmp_path):
    with Log.open(tmp_path / "t-0") as log:
        _fill(log, [0, 0])
        log.leader_epoch_cache.assign(3, 4)  # a leader's (epoch, LEO) before its first batch
        assert log.truncate_to(10) is False
        assert log.leader_epoch_cache.entries() == _entries((0, 0))
        assert _checkpoint(log.dir) == b"0\n1\n0 0\n"


def test_full_truncation_clears_the_cache(tmp_path):
    with Log.open(tmp_path / "t-0", LogConfig(**SMALL)) as log:
        _fill(log, [0, 1, 2, 3, 4, 5])
        log.truncate_fully_and_start_at(40)
        assert log.leader_epoch_cache.entries() == [] and _checkpoint(log.dir) == b"0\n0\n"
        _fill(log, [7])
        assert log.leader_epoch_cache.entries() == _entries((7, 40))
    with Log.open(tmp_path / "u-0", LogConfig(**SMALL), log_start_offset=10) as log:
        log.truncate_fully_and_start_at(10)
        _fill(log, [1, 2])
        log.truncate_to(5)  # below the first segment's base offset: a full truncation
        assert log.leader_epoch_cache.entries() == [] and log.log_end_offset == 5


def test_raising_the_log_start_offset_drops_older_history(tmp_path):
    with Log.open(tmp_path / "t-0", LogConfig(**SMALL)) as log:
        _fill(log, [0, 0, 2, 2, 5, 5])
        assert log.maybe_increment_log_start_offset(5) is True
        assert log.leader_epoch_cache.entries() == _entries((2, 5), (5, 8))
        assert _checkpoint(log.dir) == b"0\n2\n2 5\n5 8\n"


def test_retention_drops_the_history_of_deleted_segments(tmp_path):
    config = LogConfig(segment_bytes=200, file_delete_delay_ms=0, retention_bytes=0, cleanup_policy=("delete",))
    with Log.open(tmp_path / "t-0", config) as log:
        _fill(log, [0, 0, 2, 2, 5, 5])
        bases = [s.base_offset for s in log.log_segments()]
        assert len(bases) >= 3
        delete_old_segments(log)
        start = log.log_start_offset
        assert start == log.log_segments()[0].base_offset > 0
        assert log.leader_epoch_cache.earliest_entry == EpochEntry(log.leader_epoch_cache.epoch_for_offset(start), start)
        assert all(e.start_offset >= start for e in log.leader_epoch_cache.entries())


def test_reopen_keeps_the_cache_and_trims_a_stale_file(tmp_path):
    log_dir = tmp_path / "t-0"
    with Log.open(log_dir) as log:
        _fill(log, [0, 1, 2])
    # A file written ahead of the log (Kafka writes truncations asynchronously): trimmed on load.
    (log_dir / LEADER_EPOCH_CHECKPOINT_FILE).write_text("0\n5\n0 0\n1 2\n2 4\n3 6\n4 9\n")
    with Log.open(log_dir, had_clean_shutdown=True, log_start_offset=3) as log:
        assert log.leader_epoch_cache.entries() == _entries((1, 3), (2, 4))
        assert _checkpoint(log_dir) == b"0\n2\n1 3\n2 4\n"


def test_recovery_after_a_crash_that_cut_a_segment(tmp_path):
    log_dir = tmp_path / "t-0"
    with Log.open(log_dir) as log:
        _fill(log, [0, 0, 1, 3, 3])
        cut_at = [s for s in log.log_segments()][0].size_in_bytes
        positions = [b.position for b in log.active_segment.log.batch_headers()]
    os.truncate(log_dir / "00000000000000000000.log", positions[3] + 30)  # inside the first batch of epoch 3
    assert cut_at > positions[3] + 30
    with Log.open(log_dir, had_clean_shutdown=False) as log:
        assert log.log_end_offset == 6
        assert log.leader_epoch_cache.entries() == _entries((0, 0), (1, 4))
        assert _checkpoint(log_dir) == b"0\n2\n0 0\n1 4\n"


def test_recovery_assigns_epochs_missing_from_a_stale_file(tmp_path):
    """Kafka's testLogRecoversForLeaderEpoch: entries lost from the file come back from the batches."""
    log_dir = tmp_path / "t-0"
    with Log.open(log_dir) as log:
        for offset, epoch in enumerate([1, 2, 2, 3]):
            log.append_batch(_batch(offset, epoch, count=1))
        assert log.leader_epoch_cache.entries() == _entries((1, 0), (2, 1), (3, 3))
        log.leader_epoch_cache.truncate_from_end(1)  # deliberately lose entries
    assert _checkpoint(log_dir) == b"0\n1\n1 0\n"
    with Log.open(log_dir, had_clean_shutdown=False) as log:
        assert log.leader_epoch_cache.entries() == _entries((1, 0), (2, 1), (3, 3))


def test_missing_file_is_rebuilt_from_the_batch_headers(tmp_path, caplog):
    log_dir = tmp_path / "t-0"
    with Log.open(log_dir, LogConfig(**SMALL)) as log:
        _fill(log, [-1, 0, 0, 2, 2, 5, -1])
        expected = log.leader_epoch_cache.entries()
        written = _checkpoint(log_dir)
    assert expected == _entries((0, 2), (2, 6), (5, 10))
    (log_dir / LEADER_EPOCH_CHECKPOINT_FILE).unlink()  # a folder from before this file was kept
    with caplog.at_level(logging.INFO, logger="materializer.storage.log_loader"):
        with Log.open(log_dir, LogConfig(**SMALL), had_clean_shutdown=True) as log:
            assert log.leader_epoch_cache.entries() == expected
    assert _checkpoint(log_dir) == written
    assert any("Rebuilt the leader epoch cache" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("text, line", [("0\n2\n0 0\n", "line 2"), ("0\n1\nzero 0\n", "line 3"), ("7\n", "line 1")])
def test_malformed_file_is_rebuilt_with_a_warning_naming_file_and_line(tmp_path, caplog, text, line):
    log_dir = tmp_path / "t-0"
    with Log.open(log_dir) as log:
        _fill(log, [0, 3, 3])
        written = _checkpoint(log_dir)
    (log_dir / LEADER_EPOCH_CHECKPOINT_FILE).write_text(text)
    with caplog.at_level(logging.WARNING, logger="materializer.storage.log_loader"):
        with Log.open(log_dir, had_clean_shutdown=True) as log:
            assert log.leader_epoch_cache.entries() == _entries((0, 0), (3, 2))
    assert _checkpoint(log_dir) == written
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(str(log_dir / LEADER_EPOCH_CHECKPOINT_FILE) in m and line in m for m in warnings), warnings


def test_malformed_file_of_an_empty_log_is_replaced(tmp_path):
    log_dir = tmp_path / "t-0"
    Log.open(log_dir).close()
    (log_dir / LEADER_EPOCH_CHECKPOINT_FILE).write_text("garbage")
    with Log.open(log_dir) as log:
        assert log.leader_epoch_cache.entries() == []
    assert _checkpoint(log_dir) == b"0\n0\n"


def test_a_log_end_below_the_log_start_clears_the_cache(tmp_path):
    log_dir = tmp_path / "t-0"
    with Log.open(log_dir) as log:
        _fill(log, [0, 1])
    with Log.open(log_dir, log_start_offset=50, had_clean_shutdown=True) as log:
        assert log.log_end_offset == 50 and log.leader_epoch_cache.entries() == []
        assert _checkpoint(log_dir) == b"0\n0\n"


def test_cleaning_keeps_every_epoch_entry(tmp_path):
    config = LogConfig(cleanup_policy=("compact",), segment_bytes=600, file_delete_delay_ms=0)
    log_dir = tmp_path / "t-0"
    with Log.open(log_dir, config, had_clean_shutdown=True) as log:
        for i, epoch in enumerate([0, 0, 0, 2, 2, 2, 4, 4, 4, 4, 4, 4, 4, 4]):
            log.append_batch(_batch(log.log_end_offset, epoch, count=1, key=b"same-key-%d" % (i % 2)))
        before = log.leader_epoch_cache.entries()
        file_before = _checkpoint(log_dir)
        result = clean_log(log)
        assert result.records_read > result.records_written  # batches went, among them first ones of epochs
        kept_bases = [b.base_offset for b in log.read_batches()]
        assert 0 not in kept_bases and 3 not in kept_bases
        assert log.leader_epoch_cache.entries() == before == _entries((0, 0), (2, 3), (4, 6))
        assert _checkpoint(log_dir) == file_before
        # every remaining batch still maps to its own epoch
        for batch in log.read_batches():
            assert log.leader_epoch_cache.epoch_for_offset(batch.base_offset) == batch.partition_leader_epoch
    with Log.open(log_dir, config, had_clean_shutdown=True) as log:
        assert log.leader_epoch_cache.entries() == before


def test_batch_headers_walk_every_batch_without_its_records(tmp_path):
    with Log.open(tmp_path / "t-0") as log:
        for i in range(300):
            log.append_batch(_batch(log.log_end_offset, i // 100, count=1 + i % 3))
        big = RecordBatchBuilder(log.log_end_offset, partition_leader_epoch=9)
        big.append(log.log_end_offset, 1, b"k", os.urandom(50_000))
        log.append_batch(big.build())
        records = log.active_segment.log
        walked = [(h.position, h.base_offset, h.size_in_bytes, h.partition_leader_epoch) for h in records.batch_headers()]
        framed = [(p, b.base_offset, b.size_in_bytes, b.partition_leader_epoch) for p, b in records.batches_from(0)]
        assert walked == framed and len(walked) == 301
        assert [h.base_offset for h in records.batch_headers(framed[5][0], framed[9][0])] == [f[1] for f in framed[5:9]]


# -- topic identity ---------------------------------------------------------------------------------


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def test_open_with_a_topic_id_writes_partition_metadata_first(tmp_path):
    log_dir = tmp_path / "t-0"
    topic_id = uuid.uuid4()
    with Log.open(log_dir, topic_id=topic_id) as log:
        assert log.topic_id == topic_id
        _fill(log, [0])
    assert (log_dir / PARTITION_METADATA_FILE).read_text() == f"version: 0\ntopic_id: {topic_id_to_string(topic_id)}"
    with Log.open(log_dir) as log:
        assert log.topic_id == topic_id
    with Log.open(log_dir, topic_id=topic_id) as log:
        assert log.topic_id == topic_id and log.log_end_offset == 2


def test_another_topic_id_is_refused_and_nothing_is_written(tmp_path):
    log_dir = tmp_path / "t-0"
    old, new = uuid.uuid4(), uuid.uuid4()
    with Log.open(log_dir, topic_id=old) as log:
        _fill(log, [0, 1])
    (log_dir / "00000000000000000000.deleted").write_bytes(b"x")  # the loader would delete this
    before = _snapshot(log_dir)
    with pytest.raises(InconsistentTopicIdError) as info:
        Log.open(log_dir, topic_id=new, had_clean_shutdown=False)
    assert (info.value.expected, info.value.found) == (new, old)
    assert info.value.path == str(log_dir / PARTITION_METADATA_FILE)
    assert topic_id_to_string(old) in str(info.value) and topic_id_to_string(new) in str(info.value)
    assert _snapshot(log_dir) == before


def test_assign_topic_id(tmp_path):
    log_dir = tmp_path / "t-0"
    topic_id = uuid.uuid4()
    with Log.open(log_dir) as log:
        _fill(log, [0])
        assert log.topic_id is None and not (log_dir / PARTITION_METADATA_FILE).exists()
        log.assign_topic_id(topic_id)
        assert log.topic_id == topic_id
        log.assign_topic_id(topic_id)  # the same id: nothing to do
        before = _snapshot(log_dir)
        with pytest.raises(InconsistentTopicIdError):
            log.assign_topic_id(uuid.uuid4())
        assert _snapshot(log_dir) == before and log.topic_id == topic_id
        with pytest.raises(ValueError):
            log.assign_topic_id(uuid.UUID(int=0))
    with Log.open(log_dir) as log:
        assert log.topic_id == topic_id


def test_a_malformed_partition_metadata_is_an_error_naming_the_file(tmp_path):
    log_dir = tmp_path / "t-0"
    Log.open(log_dir).close()
    (log_dir / PARTITION_METADATA_FILE).write_text("version: 0\n")
    with pytest.raises(CorruptPartitionMetadataError) as info:
        Log.open(log_dir, topic_id=uuid.uuid4())
    assert info.value.line == 2 and str(log_dir / PARTITION_METADATA_FILE) in str(info.value)
