"""Offset checkpoint files: Kafka's CheckpointFile format, round trips and malformed files."""

import pytest

from materializer.storage.checkpoint import (
    CLEANER_OFFSET_CHECKPOINT,
    read_offset_checkpoint,
    write_offset_checkpoint,
)
from materializer.storage.errors import CorruptCheckpointError


def test_round_trip_and_exact_bytes(tmp_path):
    path = tmp_path / CLEANER_OFFSET_CHECKPOINT
    offsets = {("my-topic", 1): 77, ("my-topic", 0): 1234, ("a.b_c", 3): 0}
    write_offset_checkpoint(path, offsets)
    assert path.read_bytes() == b"0\n3\na.b_c 3 0\nmy-topic 0 1234\nmy-topic 1 77\n"
    assert read_offset_checkpoint(path) == offsets
    assert not (tmp_path / (CLEANER_OFFSET_CHECKPOINT + ".tmp")).exists()


def test_empty_and_missing(tmp_path):
    assert read_offset_checkpoint(tmp_path / "missing") == {}
    empty = tmp_path / "empty"
    empty.write_text("")
    assert read_offset_checkpoint(empty) == {}
    write_offset_checkpoint(empty, {})
    assert empty.read_text() == "0\n0\n"
    assert read_offset_checkpoint(empty) == {}
    empty.write_text("0\n")  # CheckpointReadBuffer.read: no count line = no entries
    assert read_offset_checkpoint(empty) == {}


def test_reads_any_whitespace(tmp_path):
    path = tmp_path / "cp"
    path.write_text("0\n1\nt  2\t9\n")
    assert read_offset_checkpoint(path) == {("t", 2): 9}


@pytest.mark.parametrize(
    "text, line",
    [
        ("1\n0\n", "line 1"),
        ("x\n0\n", "line 1"),
        ("0\n2\nt 0 1\n", "line 2"),
        ("0\n1\nt 0 1\nt 1 2\n", "line 2"),
        ("0\n1\nt 0\n", "line 3"),
        ("0\n1\nt x 1\n", "line 3"),
        ("0\n1\nt 0 1_000\n", "line 3"),  # Long.parseLong, not Python's int()
        (" 0\n0\n", "line 1"),            # Integer.parseInt does not trim
    ],
)
def test_malformed_files_name_file_and_line(tmp_path, text, line):
    path = tmp_path / "bad-checkpoint"
    path.write_text(text)
    with pytest.raises(CorruptCheckpointError) as info:
        read_offset_checkpoint(path)
    assert str(path) in str(info.value) and line in str(info.value)


def test_topic_with_space_rejected(tmp_path):
    with pytest.raises(ValueError):
        write_offset_checkpoint(tmp_path / "cp", {("a b", 0): 1})


def test_non_utf8_bytes_name_file_line_and_position(tmp_path):
    path = tmp_path / "recovery-point-offset-checkpoint"
    path.write_bytes(b"0\n1\nprices 0 1\xff2\n")
    with pytest.raises(CorruptCheckpointError) as info:
        read_offset_checkpoint(path)
    assert str(path) in str(info.value) and "byte position 14 (line 3)" in str(info.value)
