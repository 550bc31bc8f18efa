"""Bad input on disk: every problem is reported with the file, the byte position (or line) and
what was expected, or repaired where Kafka repairs it; the CLI prints ONE line and exits non-zero.

Also the unit-level crash cases not covered by test_log_loader.py: a ``.log`` cut at every byte
position of its last batch (and at random positions across segments) and leftover
``.cleaned``/``.swap``/``.deleted`` files together with a torn tail.
"""

from __future__ import annotations

import random
import shutil
import struct

import pytest
from click.testing import CliRunner

from materializer.cli import main
from materializer.offline.restore import RestoreOptions, restore_from_log_dir
from materializer.storage.checkpoint import (
    LOG_START_OFFSET_CHECKPOINT,
    RECOVERY_POINT_CHECKPOINT,
    read_offset_checkpoint,
    write_offset_checkpoint,
)
from materializer.storage.errors import CorruptCheckpointError, CorruptRecordError
from materializer.storage.log import Log
from materializer.storage.log_config import LogConfig
from materializer.storage.read_committed import ReadOnlyPartition, read_committed
from materializer.storage.record_batch_builder import RecordBatchBuilder

CONFIG = LogConfig(segment_bytes=2000, index_interval_bytes=200)
TOPIC = "bad"


def _batch(base_offset: int, count: int = 3) -> bytes:
    builder = RecordBatchBuilder(base_offset)
    for offset in range(base_offset, base_offset + count):
        builder.append(offset, 1000 + offset, b"key-%d" % (offset % 7), b"value-%d-" % offset + b"z" * 40)
    return builder.build()


@pytest.fixture
def broker_dir(tmp_path):
    """A broker-like log dir: ``bad-0`` with several segments, closed cleanly, plus checkpoints."""
    log_dir = tmp_path / "broker"
    log = Log.open(log_dir / f"{TOPIC}-0", CONFIG, had_clean_shutdown=True)
    for base in range(0, 60, 3):
        log.append_batch(_batch(base))
    assert log.number_of_segments >= 3
    log.close()
    write_offset_checkpoint(log_dir / RECOVERY_POINT_CHECKPOINT, {(TOPIC, 0): 60})
    write_offset_checkpoint(log_dir / LOG_START_OFFSET_CHECKPOINT, {(TOPIC, 0): 0})
    return log_dir


def _segments(log_dir):
    return sorted((log_dir / f"{TOPIC}-0").glob("*.log"))


def _all_records():
    return [(o, b"key-%d" % (o % 7), b"value-%d-" % o + b"z" * 40) for o in range(60)]


def _latest(records):
    view = {}
    for offset, key, value in records:
        view[key] = (offset, value)
    return view


def _restore_cli(broker_dir, data_dir, *extra):
    return CliRunner().invoke(main, ["restore", "--from-log-dir", str(broker_dir), "--topic", TOPIC,
                                     "--data-dir", str(data_dir), *extra])


def _assert_one_line_error(result, *needles):
    assert result.exit_code != 0
    assert "Traceback" not in result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1, result.output
    assert lines[0].startswith("error: ")
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


# -- CRC mismatch ------------------------------------------------------------------------------

def _flip_byte_in_second_batch(path):
    data = bytearray(path.read_bytes())
    first_size = struct.unpack_from(">i", data, 8)[0] + 12
    data[first_size + 70] ^= 0x55  # inside the second batch's records
    path.write_bytes(bytes(data))
    return first_size


def test_crc_mismatch_names_file_position_and_both_crcs(broker_dir):
    path = _segments(broker_dir)[0]
    position = _flip_byte_in_second_batch(path)
    with pytest.raises(CorruptRecordError) as info:
        list(read_committed(ReadOnlyPartition(path.parent)))
    message = str(info.value)
    assert info.value.path == str(path) and info.value.position == position
    assert f"{path} at byte position {position}" in message
    assert "stored crc" in message and "computed crc" in message


def test_crc_mismatch_cli_prints_one_line(broker_dir, tmp_path):
    path = _segments(broker_dir)[0]
    position = _flip_byte_in_second_batch(path)
    result = _restore_cli(broker_dir, tmp_path / "data")
    _assert_one_line_error(result, str(path), f"byte position {position}", "stored crc")


def test_crc_mismatch_with_repair_keeps_what_kafka_keeps(broker_dir, tmp_path):
    path = _segments(broker_dir)[0]
    _flip_byte_in_second_batch(path)
    result = restore_from_log_dir(broker_dir, TOPIC, tmp_path / "data", options=RestoreOptions(repair=True))
    # Kafka's recovery (no clean shutdown) cuts at the corrupt batch and drops every later segment
    assert result.partitions[0].log_end_offset == 3
    assert result.partitions[0].truncations


# -- batch length larger than the file ---------------------------------------------------------

def _grow_length_of_last_batch(path):
    data = bytearray(path.read_bytes())
    position = 0
    while True:
        size = struct.unpack_from(">i", data, position + 8)[0] + 12
        if position + size >= len(data):
            break
        position += size
    struct.pack_into(">i", data, position + 8, 1_000_000)
    path.write_bytes(bytes(data))
    return position, len(data)


def test_length_past_end_of_a_non_active_segment_is_an_error(broker_dir, tmp_path):
    path = _segments(broker_dir)[0]
    position, size = _grow_length_of_last_batch(path)
    with pytest.raises(CorruptRecordError) as info:
        list(read_committed(ReadOnlyPartition(path.parent)))
    message = str(info.value)
    assert info.value.path == str(path) and info.value.position == position
    assert "1000012 bytes" in message and f"{size}-byte file" in message
    line = _assert_one_line_error(_restore_cli(broker_dir, tmp_path / "data"), str(path),
                                  f"byte position {position}", "needs 1000012 bytes")
    assert "--repair" in line


def test_length_past_end_of_the_active_segment_is_refused_by_strict_restore_and_cut_by_repair(broker_dir, tmp_path):
    # Issue 7.5: a backup whose last segment is cut short is an error in strict mode, not a warning.
    path = _segments(broker_dir)[-1]
    _grow_length_of_last_batch(path)
    with pytest.raises(CorruptRecordError) as info:
        restore_from_log_dir(broker_dir, TOPIC, tmp_path / "strict")
    assert info.value.path == str(path) and info.value.position is not None
    assert "incomplete record batch" in str(info.value) and "--repair" in str(info.value)
    result = restore_from_log_dir(broker_dir, TOPIC, tmp_path / "data", options=RestoreOptions(repair=True))
    restored = result.partitions[0]
    assert restored.log_end_offset == 57  # the last batch (57-59) is cut, everything before kept
    assert [t.bytes_truncated > 0 for t in restored.truncations] == [True]


# -- index pointing past the end ---------------------------------------------------------------

def _corrupt_index(log_path, new_position=10_000_000):
    index = log_path.with_suffix(".index")
    data = bytearray(index.read_bytes())
    assert len(data) >= 8
    for slot in range(len(data) // 8):
        relative, _ = struct.unpack_from(">ii", data, slot * 8)
        struct.pack_into(">ii", data, slot * 8, relative, new_position + slot)
    index.write_bytes(bytes(data))
    return index


def test_index_past_end_in_broker_copy_is_reported_and_rebuilt(broker_dir, tmp_path, caplog):
    index = _corrupt_index(_segments(broker_dir)[0])
    result = restore_from_log_dir(broker_dir, TOPIC, tmp_path / "data")
    assert result.partitions[0].log_end_offset == 60
    assert any(str(index) in r.getMessage() and "byte position 0" in r.getMessage()
               and "points to byte position 10000000" in r.getMessage() for r in caplog.records)
    log = Log.open(tmp_path / "data" / f"{TOPIC}-0", CONFIG)
    try:
        assert [(r.offset, r.key, r.value) for r in log.read_records(10)] == _all_records()[10:]
    finally:
        log.close()


def test_index_past_end_after_clean_shutdown_is_rebuilt_or_reported(broker_dir):
    segments = _segments(broker_dir)
    _corrupt_index(segments[-1])
    log = Log.open(segments[-1].parent, CONFIG, had_clean_shutdown=True)
    try:
        assert log.log_end_offset == 60
    finally:
        log.close()


# -- checkpoint with a wrong version -----------------------------------------------------------

def test_checkpoint_wrong_version_names_file_and_line(broker_dir, tmp_path):
    checkpoint = broker_dir / RECOVERY_POINT_CHECKPOINT
    checkpoint.write_text("1\n1\nbad 0 60\n")
    with pytest.raises(CorruptCheckpointError) as info:
        read_offset_checkpoint(checkpoint)
    assert str(checkpoint) in str(info.value) and "line 1" in str(info.value)
    line = _assert_one_line_error(_restore_cli(broker_dir, tmp_path / "data"), str(checkpoint), "line 1")
    assert "expected 0" in line


# -- other CLI failures are one line too ---------------------------------------------------------

def test_missing_topic_and_existing_destination_are_one_line(broker_dir, tmp_path):
    _assert_one_line_error(CliRunner().invoke(main, ["restore", "--from-log-dir", str(broker_dir), "--topic", "nope",
                                                     "--data-dir", str(tmp_path / "d")]), "nope-0")
    _assert_one_line_error(_restore_cli(tmp_path / "missing", tmp_path / "d"), str(tmp_path / "missing"))
    assert _restore_cli(broker_dir, tmp_path / "d").exit_code == 0
    _assert_one_line_error(_restore_cli(broker_dir, tmp_path / "d"), "--overwrite")
    result = _restore_cli(broker_dir, tmp_path / "d", "--overwrite")
    assert result.exit_code == 0, result.output
    assert "bad-0: offsets [0, 60), 60 records applied" in result.output


def test_restore_then_export_matches_the_log(broker_dir, tmp_path):
    import json

    assert _restore_cli(broker_dir, tmp_path / "d").exit_code == 0
    result = CliRunner().invoke(main, ["export", "--data-dir", str(tmp_path / "d"), "--topic", TOPIC])
    assert result.exit_code == 0, result.output
    rows = {json.loads(line)["key"].encode(): (json.loads(line)["offset"], json.loads(line)["value"].encode())
            for line in result.stdout.splitlines()}
    assert rows == _latest(_all_records())


# -- unit-level crash cases --------------------------------------------------------------------

def _reopen_records(folder):
    log = Log.open(folder, CONFIG)  # no clean-shutdown marker: full recovery
    try:
        return [(r.offset, r.key, r.value) for r in log.read_records()], log.log_end_offset
    finally:
        log.close()


def test_torn_last_batch_at_every_byte_keeps_every_complete_batch(broker_dir, tmp_path):
    source = broker_dir / f"{TOPIC}-0"
    last = _segments(broker_dir)[-1]
    size = last.stat().st_size
    data = last.read_bytes()
    last_batch_start = size - (struct.unpack_from(">i", data, 0)[0] + 12)
    for cut in range(last_batch_start, size):
        folder = tmp_path / f"cut{cut}" / f"{TOPIC}-0"
        shutil.copytree(source, folder)
        with open(folder / last.name, "r+b") as f:
            f.truncate(cut)
        records, log_end_offset = _reopen_records(folder)
        assert log_end_offset == 57 and records == _all_records()[:57], cut
        shutil.rmtree(folder.parent)


def test_random_cuts_across_segments_lose_no_complete_batch(broker_dir, tmp_path):
    rng = random.Random(99)
    source = broker_dir / f"{TOPIC}-0"
    segments = _segments(broker_dir)
    for attempt in range(40):
        folder = tmp_path / f"r{attempt}" / f"{TOPIC}-0"
        shutil.copytree(source, folder)
        victim_index = rng.randrange(len(segments))
        victim = folder / segments[victim_index].name
        cut = rng.randrange(victim.stat().st_size + 1)
        # a crash only tears the tail: later segments cannot exist in a real crash, drop them
        for later in segments[victim_index + 1:]:
            for path in folder.glob(later.stem + ".*"):
                path.unlink()
        with open(victim, "r+b") as f:
            f.truncate(cut)
        complete = [p for p in ReadOnlyPartition(folder).segments]
        expected_end = 0
        for segment in complete:
            for _, batch in segment.batches():
                expected_end = batch.next_offset
        records, log_end_offset = _reopen_records(folder)
        assert log_end_offset == expected_end, (attempt, victim.name, cut)
        assert records == _all_records()[:expected_end]
        shutil.rmtree(folder.parent)


def test_leftover_temp_files_and_torn_tail_together(broker_dir, tmp_path):
    folder = broker_dir / f"{TOPIC}-0"
    segments = _segments(broker_dir)
    # an interrupted cleaning: a .cleaned copy of the first segment, a stale .deleted file
    shutil.copy(segments[0], segments[0].with_name(segments[0].name + ".cleaned"))
    shutil.copy(segments[1], segments[1].with_name(segments[1].name + ".deleted"))
    with open(segments[-1], "r+b") as f:
        f.truncate(segments[-1].stat().st_size - 7)
    records, log_end_offset = _reopen_records(folder)
    assert log_end_offset == 57 and records == _all_records()[:57]
    leftovers = [p.name for p in folder.iterdir() if p.name.endswith((".cleaned", ".deleted", ".swap"))]
    assert leftovers == []
