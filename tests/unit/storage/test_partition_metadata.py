"""``partition.metadata`` and Kafka's ``Uuid`` string form (KIP-516).

Vectors re-expressed from Kafka's ``UuidTest``, ``PartitionMetadataFileTest`` and
``PartitionMetadataReadBufferTest``; the integration test ``test_leader_epoch_files.py`` compares
our file with a real broker's.
"""

from __future__ import annotations

import uuid

import pytest

from materializer.storage.errors import CorruptPartitionMetadataError, StorageError
from materializer.storage.partition_metadata import (
    PARTITION_METADATA_FILE,
    PartitionMetadataFile,
    topic_id_from_string,
    topic_id_to_string,
)

ZERO = uuid.UUID(int=0)
ONE = uuid.UUID(int=1)  # Kafka Uuid.ONE_UUID / METADATA_TOPIC_ID = new Uuid(0L, 1L)
# UuidTest's literal; its 16 bytes decoded by hand from the base64 alphabet.
KAFKA_LITERAL = "UXyU9i5ARn6W00ON2taeWA"
KAFKA_LITERAL_UUID = uuid.UUID("517c94f6-2e40-467e-96d3-438ddad69e58")


def test_uuid_strings_are_kafkas():
    assert topic_id_to_string(ZERO) == "AAAAAAAAAAAAAAAAAAAAAA"
    assert topic_id_to_string(ONE) == "AAAAAAAAAAAAAAAAAAAAAQ"
    # new Uuid(34L, 98L): most significant long first, big-endian
    assert topic_id_to_string(uuid.UUID(int=(34 << 64) | 98)) == "AAAAAAAAACIAAAAAAAAAYg"
    assert topic_id_from_string(KAFKA_LITERAL) == KAFKA_LITERAL_UUID
    assert topic_id_to_string(KAFKA_LITERAL_UUID) == KAFKA_LITERAL
    # URL-safe alphabet: 6-bit groups 62 and 63 are "-" and "_", never "+" or "/"
    assert topic_id_to_string(uuid.UUID(bytes=b"\xfb\xff\xbf" * 5 + b"\xfb")) == "-_-_-_-_-_-_-_-_-_-_-w"


def test_string_round_trip_including_the_zero_uuid():
    for _ in range(100):
        topic_id = uuid.uuid4()
        text = topic_id_to_string(topic_id)
        assert len(text) == 22
        assert topic_id_from_string(text) == topic_id
    assert topic_id_from_string("AAAAAAAAAAAAAAAAAAAAAA") == ZERO  # Uuid.fromString accepts it
    assert topic_id_from_string("AAAAAAAAAAAAAAAAAAAAAQ==") == ONE  # Java's decoder takes full padding


@pytest.mark.parametrize("text", [
    "A" * 43,                    # UuidTest: base64 of 32 bytes (too long, > 24 chars)
    "AAAAAA",                    # UuidTest: base64 of 4 bytes
    "AAAAAAAAAAAAAAAAAAAAAAAAA",  # 25 chars
    "AAAAAAAAAAAAAAAAAAAA",      # 15 bytes
    "AAAAAAAAAAAAAAAAAAAAA",     # 21 chars: a last unit of one character
    "AAAAAAAAAAAAAAAAAAAAAA=",   # incomplete padding
    "AAAAAAAAAAAAAAAAAAAA+A",    # standard alphabet, not URL-safe
    "AAAAAAAAAAAAAAAAAAAA/A",
    "AAAAAAAAAAAAAAAAAAAA A",
    "",
])
def test_from_string_refuses_what_kafka_refuses(text):
    with pytest.raises(ValueError):
        topic_id_from_string(text)


def test_write_is_byte_exact_with_no_trailing_newline(tmp_path):
    file = PartitionMetadataFile(tmp_path)
    file.write(KAFKA_LITERAL_UUID)
    path = tmp_path / PARTITION_METADATA_FILE
    assert path.read_bytes() == b"version: 0\ntopic_id: UXyU9i5ARn6W00ON2taeWA"
    assert file.read() == KAFKA_LITERAL_UUID
    assert not (tmp_path / (PARTITION_METADATA_FILE + ".tmp")).exists()
    other = uuid.uuid4()
    file.write(other)  # replaced whole
    assert file.read() == other


def test_missing_file_reads_none(tmp_path):
    assert PartitionMetadataFile(tmp_path).read() is None
    assert not PartitionMetadataFile(tmp_path).exists()


@pytest.mark.parametrize("text", [
    f"version: 0\ntopic_id: {KAFKA_LITERAL}\n",      # PartitionMetadataReadBufferTest's valid file
    f"version: 0\r\ntopic_id: {KAFKA_LITERAL}",      # readLine ends a line at \r\n too
    f"version:\t 3\ntopic_id:  {KAFKA_LITERAL}\nx",  # ":\s+", a higher version, later lines ignored
])
def test_reader_accepts_what_kafka_accepts(tmp_path, text):
    (tmp_path / PARTITION_METADATA_FILE).write_text(text, newline="")
    assert PartitionMetadataFile(tmp_path).read() == KAFKA_LITERAL_UUID


@pytest.mark.parametrize("text, line", [
    ("", 1),                                          # empty file
    ("version: 0\n", 2),                              # topic id line missing
    ("version: 0\ntopic_id: not-a-uuid\n", 2),        # malformed id
    ("version: 0\ntopic_id: AAAAAAAAAAAAAAAAAAAAAA", 2),  # the zero uuid
    ("version: -1\ntopic_id: " + KAFKA_LITERAL, 1),   # version below 0
    ("version:0\ntopic_id: " + KAFKA_LITERAL, 1),     # no whitespace after the colon
    ("version: x\ntopic_id: " + KAFKA_LITERAL, 1),
    ("version: 0 \ntopic_id: " + KAFKA_LITERAL, 1),   # Integer.parseInt refuses the blank
    ("topic_id: " + KAFKA_LITERAL + "\nversion: 0", 1),  # keys in the wrong order
    ("version: 0\ntopic_id: " + KAFKA_LITERAL + " ", 2),
])
def test_malformed_files_name_the_file_and_the_line(tmp_path, text, line):
    path = tmp_path / PARTITION_METADATA_FILE
    path.write_text(text, newline="")
    with pytest.raises(CorruptPartitionMetadataError) as info:
        PartitionMetadataFile(tmp_path).read()
    assert isinstance(info.value, StorageError)
    assert info.value.path == str(path) and info.value.line == line
    assert str(path) in str(info.value) and f"line {line}" in str(info.value)


def test_not_utf8_names_the_byte_position(tmp_path):
    (tmp_path / PARTITION_METADATA_FILE).write_bytes(b"version: 0\ntopic_id: \xff")
    with pytest.raises(CorruptPartitionMetadataError) as info:
        PartitionMetadataFile(tmp_path).read()
    assert info.value.line == 2 and "byte position 21" in str(info.value)


def test_zero_id_is_never_written(tmp_path):
    with pytest.raises(ValueError):
        PartitionMetadataFile(tmp_path).write(ZERO)
    with pytest.raises(TypeError):
        PartitionMetadataFile(tmp_path).write(KAFKA_LITERAL)  # type: ignore[arg-type]
    assert not (tmp_path / PARTITION_METADATA_FILE).exists()
