"""Unit tests for ``materializer compact`` (materializer/offline/compact.py) on local logs built in memory."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from materializer.cli.compact import compact
from materializer.offline.compact import CompactionError, compact_topic, find_partitions
from materializer.datadir.layout import topic_config_path
from materializer.storage.checkpoint import (
    CLEANER_OFFSET_CHECKPOINT,
    RECOVERY_POINT_CHECKPOINT,
    read_offset_checkpoint,
    write_offset_checkpoint,
)
from materializer.storage.compression import CompressionType
from materializer.storage.log import Log
from materializer.storage.log_config import LogConfig
from materializer.storage.log_loader import has_clean_shutdown_file, write_clean_shutdown_file
from materializer.storage.record_batch import Record

T0 = 1_700_000_000_000
TOPIC = "prices"
COMPACT = {"cleanup.policy": "compact", "segment.bytes": "600", "delete.retention.ms": "1000"}


def _records(count: int, keys: int, *, tombstone_every: int = 0, start: int = 0) -> list[Record]:
    out = []
    for offset in range(start, start + count):
        value = None if tombstone_every and offset % tombstone_every == tombstone_every - 1 else b"v%d" % offset
        out.append(Record(offset, T0 + offset, b"k%d" % (offset % keys), value, (("h", b"%d" % offset),)))
    return out


def _make_dir(tmp_path: Path, records_by_partition: dict[int, list[Record]], configs: dict[str, str] | None = None,
              *, compression: CompressionType = CompressionType.NONE) -> Path:
    data_dir = tmp_path / "data"
    config = LogConfig.from_kafka_configs(configs or COMPACT)
    path = topic_config_path(data_dir, TOPIC)
    path.parent.mkdir(parents=True, exist_ok=True)
    config.save(path)
    for partition, records in records_by_partition.items():
        with Log.open(data_dir / f"{TOPIC}-{partition}", config) as log:
            for i in range(0, len(records), 5):  # 5 records per batch
                log.append_records(records[i:i + 5], compression=compression)
    write_clean_shutdown_file(data_dir)
    return data_dir


def _read(data_dir: Path, partition: int = 0) -> list[Record]:
    config = LogConfig.load(topic_config_path(data_dir, TOPIC))
    log = Log.open(data_dir / f"{TOPIC}-{partition}", config, had_clean_shutdown=True)
    try:
        return list(log.read_records())
    finally:
        log.close()


def _expected(records: list[Record], upto: int, *, keep_tombstones: bool = True) -> list[Record]:
    """Kafka's result for one round over [0, upto): latest per key below upto, everything from upto on."""
    latest = {r.key: r.offset for r in records if r.offset < upto}
    kept = []
    for r in records:
        if r.offset >= upto:
            kept.append(r)
        elif latest[r.key] == r.offset and (r.value is not None or keep_tombstones):
            kept.append(r)
    return kept


def _run(*args: str):
    return CliRunner().invoke(compact, list(args))


def test_upto_offset_cleans_exactly_below_it(tmp_path: Path) -> None:
    records = _records(200, 17, tombstone_every=9)
    data_dir = _make_dir(tmp_path, {0: records})
    result = _run("--data-dir", str(data_dir), "--topic", TOPIC, "--upto-offset", "150")
    assert result.exit_code == 0, result.output
    assert _read(data_dir) == _expected(records, 150)
    assert read_offset_checkpoint(data_dir / CLEANER_OFFSET_CHECKPOINT) == {(TOPIC, 0): 150}
    assert "MB of log processed" in result.output and "size reduction" in result.output
    assert f"{TOPIC}-0: cleaned [0, 150) in 1 round(s)" in result.output
    assert has_clean_shutdown_file(data_dir)
    assert (TOPIC, 0) in read_offset_checkpoint(data_dir / RECOVERY_POINT_CHECKPOINT)


def test_upto_offset_beyond_active_segment_base_rolls_and_keeps_tail(tmp_path: Path) -> None:
    records = _records(60, 4)
    data_dir = _make_dir(tmp_path, {0: records}, {**COMPACT, "segment.bytes": "1048576"})  # one segment
    results = compact_topic(data_dir, TOPIC, upto_offset=57)
    assert [(r.first_dirty_offset, r.end_offset) for r in results] == [(0, 57)]
    assert _read(data_dir) == _expected(records, 57)  # keys of 57..59 repeat below 57 and are kept from 57 on
    # a second round up to the log end offset only maps [57, 60)
    results = compact_topic(data_dir, TOPIC, upto_offset=60)
    assert [(r.first_dirty_offset, r.end_offset) for r in results] == [(57, 60)]
    assert _read(data_dir) == _expected(records, 60)


def test_without_upto_offset_the_active_segment_stays_dirty(tmp_path: Path) -> None:
    records = _records(300, 10)
    data_dir = _make_dir(tmp_path, {0: records})
    config = LogConfig.from_kafka_configs(COMPACT)
    with Log.open(data_dir / f"{TOPIC}-0", config, had_clean_shutdown=True) as log:
        active_base = log.active_segment.base_offset
    assert active_base > 0
    (result,) = compact_topic(data_dir, TOPIC)
    assert result.end_offset == active_base
    assert _read(data_dir) == _expected(records, active_base)


def test_every_partition_and_single_partition(tmp_path: Path) -> None:
    recs = {p: _records(80 + 10 * p, 7 + p) for p in range(3)}
    data_dir = _make_dir(tmp_path, recs, compression=CompressionType.ZSTD)
    assert find_partitions(data_dir, TOPIC) == [0, 1, 2]
    result = _run("--data-dir", str(data_dir), "--topic", TOPIC, "--partition", "1", "--upto-offset", "50")
    assert result.exit_code == 0, result.output
    assert read_offset_checkpoint(data_dir / CLEANER_OFFSET_CHECKPOINT) == {(TOPIC, 1): 50}
    assert _read(data_dir, 0) == recs[0]
    assert _read(data_dir, 1) == _expected(recs[1], 50)
    result = _run("--data-dir", str(data_dir), "--topic", TOPIC, "--upto-offset", "70", "--quiet")
    assert result.exit_code == 0, result.output
    assert read_offset_checkpoint(data_dir / CLEANER_OFFSET_CHECKPOINT) == {(TOPIC, p): 70 for p in range(3)}
    for p in range(3):
        assert _read(data_dir, p) == _expected(recs[p], 70)
    assert "3 partitions" in result.output and "MB of log processed" not in result.output


def test_tombstones_removed_by_a_later_round_after_delete_retention(tmp_path: Path) -> None:
    records = _records(100, 5, tombstone_every=3)
    data_dir = _make_dir(tmp_path, {0: records})
    compact_topic(data_dir, TOPIC, upto_offset=60, now_ms=T0)
    assert _read(data_dir) == _expected(records, 60)
    # horizon = T0 + 1000; a round at T0 + 1000 removes the tombstones it recopies
    compact_topic(data_dir, TOPIC, upto_offset=100, now_ms=T0 + 1000)
    below_60 = [r for r in _read(data_dir) if r.offset < 60]
    assert all(r.value is not None for r in below_60)
    tail = [r for r in _read(data_dir) if r.offset >= 60]
    assert tail == [r for r in _expected(records, 100) if r.offset >= 60]  # new tombstones survive their first round


def test_small_dedupe_buffer_runs_several_rounds(tmp_path: Path) -> None:
    records = _records(400, 150)
    data_dir = _make_dir(tmp_path, {0: records})
    # 24 * 100 bytes = 100 slots, 90 keys per round
    (result,) = compact_topic(data_dir, TOPIC, upto_offset=400, dedupe_buffer_size_bytes=2400)
    assert [(r.first_dirty_offset, r.end_offset) for r in result.rounds] == [(0, 90), (90, 180), (180, 270),
                                                                             (270, 360), (360, 400)]
    assert result.end_offset == 400
    assert _read(data_dir) == _expected(records, 400)


@pytest.mark.parametrize("args, message", [
    (["--topic", "other"], "no saved topic config"),
    (["--topic", TOPIC, "--partition", "5"], "no local log for prices-5"),
    (["--topic", TOPIC, "--upto-offset", "1000"], "beyond the log end offset"),
])
def test_errors_are_one_line_and_exit_2(tmp_path: Path, args: list[str], message: str) -> None:
    data_dir = _make_dir(tmp_path, {0: _records(30, 3)})
    result = CliRunner().invoke(compact, ["--data-dir", str(data_dir), *args])
    assert result.exit_code == 2
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], result.output


def test_missing_data_dir_and_delete_policy(tmp_path: Path) -> None:
    with pytest.raises(CompactionError, match="does not exist"):
        compact_topic(tmp_path / "nope", TOPIC)
    data_dir = _make_dir(tmp_path, {0: _records(10, 3)}, {"cleanup.policy": "delete"})
    with pytest.raises(CompactionError, match="cleanup.policy=delete"):
        compact_topic(data_dir, TOPIC)


def test_corrupt_cleaner_checkpoint_is_reported(tmp_path: Path) -> None:
    data_dir = _make_dir(tmp_path, {0: _records(10, 3)})
    (data_dir / CLEANER_OFFSET_CHECKPOINT).write_text("7\n0\n")
    result = CliRunner().invoke(compact, ["--data-dir", str(data_dir), "--topic", TOPIC])
    assert result.exit_code == 2 and "error: " in result.output


def test_checkpoint_of_other_partitions_is_kept(tmp_path: Path) -> None:
    data_dir = _make_dir(tmp_path, {0: _records(40, 3)})
    write_offset_checkpoint(data_dir / CLEANER_OFFSET_CHECKPOINT, {("other", 3): 12})
    compact_topic(data_dir, TOPIC, upto_offset=30)
    assert read_offset_checkpoint(data_dir / CLEANER_OFFSET_CHECKPOINT) == {("other", 3): 12, (TOPIC, 0): 30}


def test_a_data_dir_another_writer_holds_is_refused_at_once_and_left_as_it_was(tmp_path: Path) -> None:
    import os

    from materializer.datadir.lock import DataDirLock
    from materializer.storage.errors import DataDirLockedError

    data_dir = _make_dir(tmp_path, {0: _records(40, 3)})
    before = {p.relative_to(data_dir): p.read_bytes() for p in data_dir.rglob("*") if p.is_file() and p.name != ".lock"}
    with DataDirLock.acquire(data_dir, "run"):
        with pytest.raises(DataDirLockedError, match=rf"is being written by `materializer run` \(pid {os.getpid()}, "
                                                     r"since \d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ\)"):
            compact_topic(data_dir, TOPIC, upto_offset=10)
        result = _run("--data-dir", str(data_dir), "--topic", TOPIC, "--upto-offset", "10")
        assert result.exit_code == 2 and result.output.count("\n") == 1, result.output
        assert result.output.startswith(f"error: {data_dir} is being written by `materializer run` (pid {os.getpid()}")
        after = {p.relative_to(data_dir): p.read_bytes() for p in data_dir.rglob("*")
                 if p.is_file() and p.name != ".lock"}
        assert after == before  # no checkpoint, no marker, no segment touched
    compact_topic(data_dir, TOPIC, upto_offset=10)  # free again
    assert read_offset_checkpoint(data_dir / CLEANER_OFFSET_CHECKPOINT) == {(TOPIC, 0): 10}


def test_upto_offset_inside_a_segment_splits_it_so_the_tail_is_untouched(tmp_path: Path) -> None:
    """Broker semantics: records from N on are not recopied, so their tombstones get no horizon yet."""
    records = _records(100, 8, tombstone_every=4)
    data_dir = _make_dir(tmp_path, {0: records}, {**COMPACT, "segment.bytes": "1048576"})  # one segment
    config = LogConfig.load(topic_config_path(data_dir, TOPIC))
    with Log.open(data_dir / f"{TOPIC}-0", config, had_clean_shutdown=True) as log:
        tail_before = [bytes(b.buffer) for b in log.read_batches(55) if b.base_offset >= 55]
    compact_topic(data_dir, TOPIC, upto_offset=53, now_ms=T0)  # 53 lies inside the batch [50, 54]
    with Log.open(data_dir / f"{TOPIC}-0", config, had_clean_shutdown=True) as log:
        assert 53 in [s.base_offset for s in log.log_segments()]
        above = [b for b in log.read_batches(53) if b.base_offset >= 53]
        assert above[0].base_offset == 53 and above[0].last_offset == 54 and above[0].delete_horizon_ms is None
        assert [bytes(b.buffer) for b in above[1:]] == tail_before  # byte for byte
        below = [b for b in log.read_batches(0, 53)]
        assert below[-1].next_offset == 53
    assert _read(data_dir) == _expected(records, 53)
    # a round at the horizon removes only the tombstones below 53; those from 53 on get their first horizon
    compact_topic(data_dir, TOPIC, upto_offset=100, now_ms=T0 + 1000)
    kept = _read(data_dir)
    latest = {r.key: r for r in records}
    assert kept == sorted((r for r in latest.values() if r.value is not None or r.offset >= 53),
                          key=lambda r: r.offset)


def test_nothing_cleanable_says_why(tmp_path):
    # Issue 9.6: "nothing to clean" with no reason left users guessing (all data in the active segment).
    from click.testing import CliRunner

    from materializer.cli import main
    from materializer.storage.compression import CompressionType
    from materializer.storage.log import Log
    from materializer.storage.log_config import LogConfig
    from materializer.storage.record_batch import Record, TimestampType

    config = LogConfig(cleanup_policy=("compact",), segment_index_bytes=4096)
    (tmp_path / "topic-configs").mkdir()
    config.save(tmp_path / "topic-configs" / "t.json")
    with Log.open(tmp_path / "t-0", config) as log:
        log.append_records([Record(i, 1000 + i, b"k", b"v") for i in range(10)], compression=CompressionType.NONE,
                           timestamp_type=TimestampType.CREATE_TIME)
    result = CliRunner().invoke(main, ["compact", "--data-dir", str(tmp_path), "--topic", "t", "--quiet"])
    assert result.exit_code == 0, result.output
    assert "nothing to clean" in result.output and "in the active segment, which is never cleaned" in result.output
    assert "segment.bytes=1073741824" in result.output
