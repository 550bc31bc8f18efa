"""v2 record batches: golden bytes, round trips per codec, framing and corruption."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from materializer.storage.compression import CompressionType
from materializer.storage.control_record import (
    ControlRecordType,
    decode_end_txn_marker,
    encode_end_txn_marker,
    parse_control_record_type,
)
from materializer.storage.errors import CorruptRecordError
from materializer.storage.record_batch import (
    ATTRIBUTES_OFFSET,
    BASE_OFFSET_OFFSET,
    BASE_SEQUENCE_OFFSET,
    BASE_TIMESTAMP_OFFSET,
    CRC_OFFSET,
    HEADER_STRUCT,
    LAST_OFFSET_DELTA_OFFSET,
    LENGTH_OFFSET,
    LOG_OVERHEAD,
    MAGIC_OFFSET,
    MAX_TIMESTAMP_OFFSET,
    PARTITION_LEADER_EPOCH_OFFSET,
    PRODUCER_EPOCH_OFFSET,
    PRODUCER_ID_OFFSET,
    RECORD_BATCH_OVERHEAD,
    RECORDS_COUNT_OFFSET,
    TRANSACTIONAL_FLAG_MASK,
    BatchHeader,
    BatchHeaderFields,
    Record,
    RecordBatch,
    TimestampType,
    iter_batches,
)
from materializer.storage.record_batch_builder import RecordBatchBuilder, build_empty_batch

CODECS = list(CompressionType)


def crc32c_reference(data: bytes) -> int:
    """Bitwise CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), independent of the crc32c package."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def build(base_offset: int, records: list[Record], **kwargs) -> bytes:
    builder = RecordBatchBuilder(base_offset, **kwargs)
    for record in records:
        builder.append_record(record)
    return builder.build()


# --- layout --------------------------------------------------------------------------


def test_header_offsets_match_kafka() -> None:
    assert HEADER_STRUCT.size == RECORD_BATCH_OVERHEAD == 61
    assert LOG_OVERHEAD == 12
    assert (
        BASE_OFFSET_OFFSET,
        LENGTH_OFFSET,
        PARTITION_LEADER_EPOCH_OFFSET,
        MAGIC_OFFSET,
        CRC_OFFSET,
        ATTRIBUTES_OFFSET,
        LAST_OFFSET_DELTA_OFFSET,
        BASE_TIMESTAMP_OFFSET,
        MAX_TIMESTAMP_OFFSET,
        PRODUCER_ID_OFFSET,
        PRODUCER_EPOCH_OFFSET,
        BASE_SEQUENCE_OFFSET,
        RECORDS_COUNT_OFFSET,
    ) == (0, 8, 12, 16, 17, 21, 23, 27, 35, 43, 51, 53, 57)


def test_crc_reference_check_value() -> None:
    assert crc32c_reference(b"123456789") == 0xE3069283  # the standard CRC-32C check value


def test_golden_bytes() -> None:
    """Two records written out by hand from the DefaultRecord/DefaultRecordBatch layout."""
    record_1 = bytes.fromhex(
        "18"  # Length = 12 (zig-zag 24)
        "00"  # Attributes
        "00"  # TimestampDelta = 0
        "00"  # OffsetDelta = 0
        "02" "6b"  # KeyLength = 1, "k"
        "02" "76"  # ValueLength = 1, "v"
        "02"  # HeadersCount = 1
        "02" "68"  # HeaderKeyLength = 1, "h"
        "02" "31"  # HeaderValueLength = 1, "1"
    )
    record_2 = bytes.fromhex(
        "0c"  # Length = 6
        "00"  # Attributes
        "0a"  # TimestampDelta = 5
        "04"  # OffsetDelta = 2 (an offset gap)
        "01"  # KeyLength = -1 (null)
        "01"  # ValueLength = -1 (tombstone)
        "00"  # HeadersCount = 0
    )
    records_section = record_1 + record_2
    after_crc = (
        bytes.fromhex(
            "0000"  # Attributes: no compression, CreateTime
            "00000002"  # LastOffsetDelta
            "00000000000003e8"  # BaseTimestamp = 1000
            "00000000000003ed"  # MaxTimestamp = 1005
            "ffffffffffffffff"  # ProducerId = -1
            "ffff"  # ProducerEpoch = -1
            "ffffffff"  # BaseSequence = -1
            "00000002"  # RecordsCount
        )
        + records_section
    )
    crc = crc32c_reference(after_crc)
    expected = (
        bytes.fromhex(
            "0000000000000005"  # BaseOffset = 5
            "00000045"  # Length = 81 - 12
            "00000007"  # PartitionLeaderEpoch = 7
            "02"  # Magic
        )
        + struct.pack(">I", crc)
        + after_crc
    )
    assert len(expected) == 81

    builder = RecordBatchBuilder(5, partition_leader_epoch=7)
    builder.append(5, 1000, b"k", b"v", [("h", b"1")])
    builder.append(7, 1005, None, None)
    assert builder.estimated_size_in_bytes == 81
    built = builder.build()
    assert built == expected

    batch = RecordBatch(expected)
    batch.ensure_valid()
    assert batch.header == BatchHeader(5, 69, 7, 2, crc, 0, 2, 1000, 1005, -1, -1, -1, 2)
    assert batch.crc == batch.compute_crc() == crc
    assert batch.records() == [
        Record(5, 1000, b"k", b"v", (("h", b"1"),)),
        Record(7, 1005, None, None),
    ]


# --- round trips ---------------------------------------------------------------------


def sample_records(base: int) -> list[Record]:
    return [
        Record(base, 1_700_000_000_000, b"key-a", b"value-a"),
        Record(base + 1, 1_700_000_000_500, None, b"null key"),
        Record(base + 2, 1_699_999_999_000, b"key-b", None),  # tombstone, earlier timestamp
        Record(base + 5, 1_700_000_000_100, b"key-c", b"x" * 5000, (("h1", b"v1"), ("h-null", None))),
        Record(base + 6, -1, b"", b""),  # NO_TIMESTAMP, empty (non-null) key and value
        Record(base + 1_000_000, 1_700_000_900_000, "ключ".encode(), b"\x00\xff", (("ü-key", b""),)),
    ]


@pytest.mark.parametrize("codec", CODECS)
def test_round_trip(codec: CompressionType) -> None:
    records = sample_records(1000)
    raw = build(1000, records, compression=codec, producer_id=42, producer_epoch=3, base_sequence=17)
    batch = RecordBatch(raw)
    batch.ensure_valid()
    assert batch.is_valid()
    assert batch.size_in_bytes == len(raw)
    assert batch.buffer.tobytes() == raw
    assert batch.magic == 2
    assert batch.compression_type is codec
    assert batch.timestamp_type is TimestampType.CREATE_TIME
    assert batch.base_offset == 1000
    assert batch.last_offset == 1_001_000
    assert batch.next_offset == 1_001_001
    assert batch.records_count == 6
    assert batch.base_timestamp == 1_700_000_000_000  # the first record's, not the smallest
    assert batch.max_timestamp == 1_700_000_900_000
    assert (batch.producer_id, batch.producer_epoch, batch.base_sequence) == (42, 3, 17)
    assert batch.last_sequence == 17 + 1_000_000
    assert not batch.is_transactional and not batch.is_control_batch
    assert not batch.has_delete_horizon and batch.delete_horizon_ms is None
    assert batch.partition_leader_epoch == -1
    assert batch.records() == records
    assert list(batch) == records


@pytest.mark.parametrize("codec", CODECS)
def test_log_append_time(codec: CompressionType) -> None:
    records = sample_records(0)
    raw = build(0, records, compression=codec, timestamp_type=TimestampType.LOG_APPEND_TIME,
                log_append_time_ms=1_800_000_000_000)
    batch = RecordBatch(raw)
    batch.ensure_valid()
    assert batch.timestamp_type is TimestampType.LOG_APPEND_TIME
    assert batch.attributes & 0x08
    assert batch.max_timestamp == 1_800_000_000_000
    # DefaultRecordBatch.RecordIterator: every record gets the batch's MaxTimestamp
    assert [r.timestamp for r in batch.records()] == [1_800_000_000_000] * len(records)
    assert [r.offset for r in batch.records()] == [r.offset for r in records]


def test_log_append_time_defaults_to_max_record_timestamp() -> None:
    # rebuilding a LogAppendTime batch from its own records keeps MaxTimestamp
    first = RecordBatch(build(0, sample_records(0), timestamp_type=TimestampType.LOG_APPEND_TIME,
                              log_append_time_ms=1_800_000_000_000))
    rebuilt = RecordBatch(build(0, first.records(), timestamp_type=TimestampType.LOG_APPEND_TIME))
    assert rebuilt.max_timestamp == 1_800_000_000_000
    assert rebuilt.records() == first.records()


@pytest.mark.parametrize("codec", CODECS)
def test_delete_horizon(codec: CompressionType) -> None:
    records = sample_records(50)[:4]
    horizon = 1_700_086_400_000
    raw = build(50, records, compression=codec, delete_horizon_ms=horizon)
    batch = RecordBatch(raw)
    batch.ensure_valid()
    assert batch.has_delete_horizon
    assert batch.attributes & 0x40
    assert batch.delete_horizon_ms == horizon == batch.base_timestamp
    assert batch.max_timestamp == max(r.timestamp for r in records)
    # KIP-534: deltas are computed against the horizon, absolute timestamps survive
    assert batch.records() == records


def test_delete_horizon_minus_one_means_none() -> None:
    batch = RecordBatch(build(0, sample_records(0)[:1], delete_horizon_ms=-1))
    assert not batch.has_delete_horizon


@pytest.mark.parametrize("codec", CODECS)
def test_transaction_marker_batch(codec: CompressionType) -> None:
    key, value = encode_end_txn_marker(ControlRecordType.COMMIT, 4)
    builder = RecordBatchBuilder(
        99, compression=codec, producer_id=7, producer_epoch=2, is_transactional=True, is_control_batch=True,
        partition_leader_epoch=3,
    )
    builder.append(99, 1_700_000_000_000, key, value)
    batch = RecordBatch(builder.build())
    batch.ensure_valid()
    assert batch.is_transactional and batch.is_control_batch
    assert batch.attributes & 0x30 == 0x30
    assert batch.base_sequence == -1 and batch.last_sequence == -1
    (record,) = batch.records()
    assert parse_control_record_type(record.key) is ControlRecordType.COMMIT
    assert decode_end_txn_marker(record.key, record.value).coordinator_epoch == 4


def test_transactional_data_batch() -> None:
    raw = build(0, sample_records(0)[:2], producer_id=7, producer_epoch=0, base_sequence=0, is_transactional=True)
    batch = RecordBatch(raw)
    assert batch.is_transactional and not batch.is_control_batch


def test_last_offset_override_for_cleaned_batches() -> None:
    builder = RecordBatchBuilder(100, producer_id=1, producer_epoch=0, base_sequence=2**31 - 3)
    builder.append(102, 5, b"k", b"v")
    batch = RecordBatch(builder.build(last_offset=110))
    assert (batch.base_offset, batch.last_offset, batch.records_count) == (100, 110, 1)
    assert batch.records() == [Record(102, 5, b"k", b"v")]
    assert batch.last_sequence == 7  # incrementSequence wraps past int32 max
    with pytest.raises(ValueError, match="below the last appended offset"):
        builder.build(last_offset=101)


def test_large_batch_multi_block_codecs() -> None:
    records = [Record(i, 1000 + i, b"%d" % i, bytes([i % 256]) * 300) for i in range(2000)]
    for codec in CODECS:
        batch = RecordBatch(build(0, records, compression=codec))
        batch.ensure_valid()
        assert batch.records() == records


def test_empty_builder_builds_nothing() -> None:
    builder = RecordBatchBuilder(0)
    assert builder.is_empty and builder.last_offset is None
    assert builder.build() == b""


def test_build_empty_batch() -> None:
    raw = build_empty_batch(BatchHeaderFields(
        10, last_offset_delta=9, attributes=TRANSACTIONAL_FLAG_MASK, partition_leader_epoch=2, max_timestamp=1234,
        producer_id=5, producer_epoch=1, base_sequence=30,
    ))
    assert len(raw) == 61
    batch = RecordBatch(raw)
    batch.ensure_valid()
    assert batch.header == BatchHeader(10, 49, 2, 2, batch.crc, 0x10, 9, -1, 1234, 5, 1, 30, 0)
    assert batch.records() == []
    assert batch.last_sequence == 39
    assert batch.compute_crc() == crc32c_reference(raw[ATTRIBUTES_OFFSET:])
    with pytest.raises(ValueError):
        build_empty_batch(BatchHeaderFields(10, last_offset_delta=-1))


# --- builder validation --------------------------------------------------------------


def test_append_validation() -> None:
    builder = RecordBatchBuilder(10)
    with pytest.raises(ValueError, match="outside"):
        builder.append(9, 0, None, b"v")
    with pytest.raises(ValueError, match="outside"):
        builder.append(10 + 2**31, 0, None, b"v")
    with pytest.raises(ValueError, match="negative timestamp"):
        builder.append(10, -2, None, b"v")
    with pytest.raises(ValueError, match="header key must be a str"):
        builder.append(10, 0, None, b"v", [(b"bytes-key", b"v")])
    builder = RecordBatchBuilder(10)
    builder.append(10, 0, None, b"v")
    with pytest.raises(ValueError, match="increase monotonically"):
        builder.append(10, 0, None, b"v")
    builder.append(10 + 2**31 - 1, 0, None, b"v")  # the largest legal delta
    assert RecordBatch(builder.build()).last_offset == 10 + 2**31 - 1


@pytest.mark.parametrize(
    "kwargs",
    [
        {"producer_epoch": 2**15},
        {"base_sequence": 2**31},
        {"partition_leader_epoch": -(2**31) - 1},
        {"delete_horizon_ms": -5},
        {"compression": 9},
        {"timestamp_type": 2},
    ],
)
def test_constructor_validation(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        RecordBatchBuilder(0, **kwargs)
    with pytest.raises(ValueError):
        RecordBatchBuilder(-1)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"is_transactional": True}, "without a valid producer ID"),
        ({"producer_id": 3}, "producer epoch"),
        ({"producer_id": 3, "producer_epoch": 0}, "sequence"),
    ],
)
def test_producer_state_validation(kwargs: dict, message: str) -> None:
    builder = RecordBatchBuilder(0, **kwargs)
    builder.append(0, 0, None, b"v")
    with pytest.raises(ValueError, match=message):
        builder.build()


# --- iter_batches framing ------------------------------------------------------------


def three_batches() -> tuple[bytes, list[bytes]]:
    parts = [
        build(0, [Record(0, 1, b"a", b"1"), Record(1, 2, b"b", b"2")]),
        build(2, [Record(2, 3, b"c", b"3")], compression=CompressionType.ZSTD),
        build_empty_batch(BatchHeaderFields(3, last_offset_delta=1, max_timestamp=4)),
    ]
    return b"".join(parts), parts


def test_iter_batches_positions() -> None:
    log, parts = three_batches()
    found = list(iter_batches(log))
    positions = [0, len(parts[0]), len(parts[0]) + len(parts[1])]
    assert [p for p, _ in found] == positions
    assert [b.base_offset for _, b in found] == [0, 2, 3]
    assert [b.buffer.tobytes() for _, b in found] == parts
    # start mid-file at a batch boundary
    assert [p for p, _ in iter_batches(log, positions[1])] == positions[1:]
    assert list(iter_batches(b"")) == []


@pytest.mark.parametrize("cut", [1, 10, 17, 30, 60])
def test_truncated_trailing_batch_stops_silently(cut: int) -> None:
    log, parts = three_batches()
    truncated = log[:-cut] if cut < len(parts[-1]) else log[: len(parts[0]) + len(parts[1])]
    found = list(iter_batches(truncated))
    assert [b.base_offset for _, b in found] == [0, 2]


def test_huge_length_is_incomplete_not_corrupt() -> None:
    log, _ = three_batches()
    garbage = bytearray(61)
    struct.pack_into(">qiib", garbage, 0, 10, 2**31 - 1, 0, 99)
    assert [b.base_offset for _, b in iter_batches(log + bytes(garbage))] == [0, 2, 3]


def test_small_size_is_corrupt(tmp_path: Path) -> None:
    log, parts = three_batches()
    bad = bytearray(log)
    position = len(parts[0])
    struct.pack_into(">i", bad, position + LENGTH_OFFSET, 13)
    path = str(tmp_path / "00000000000000000000.log")
    batches = iter_batches(bytes(bad), path=path)
    assert next(batches)[0] == 0
    with pytest.raises(CorruptRecordError) as info:
        next(batches)
    assert info.value.path == path
    assert info.value.position == position
    assert "13" in str(info.value) and path in str(info.value) and str(position) in str(info.value)


@pytest.mark.parametrize("magic", [0, 1, 3])
def test_unsupported_magic(magic: int) -> None:
    log, parts = three_batches()
    bad = bytearray(log)
    bad[len(parts[0]) + MAGIC_OFFSET] = magic
    with pytest.raises(CorruptRecordError, match=f"magic {magic} not supported") as info:
        list(iter_batches(bytes(bad), path="seg.log"))
    assert info.value.position == len(parts[0])


def test_length_between_14_and_61_fails_on_use() -> None:
    # FileLogInputStream frames it; DefaultRecordBatch.ensureValid rejects it
    short = bytearray(30)
    struct.pack_into(">qiib", short, 0, 0, 18, 0, 2)
    ((position, batch),) = list(iter_batches(bytes(short), path="x.log"))
    assert batch.size_in_bytes == 30 and not batch.is_valid()
    with pytest.raises(CorruptRecordError, match="smaller than the minimum allowed overhead 61"):
        batch.ensure_valid()
    with pytest.raises(CorruptRecordError):
        batch.base_offset


# --- corruption ----------------------------------------------------------------------


@pytest.mark.parametrize("flip_at", [ATTRIBUTES_OFFSET, BASE_TIMESTAMP_OFFSET + 3, RECORDS_COUNT_OFFSET + 3, 70, -1])
def test_flipped_bit_fails_crc_naming_file_and_position(tmp_path: Path, flip_at: int) -> None:
    log, parts = three_batches()
    path = tmp_path / "00000000000000000000.log"
    bad = bytearray(log)
    position = len(parts[0])
    target = position + flip_at if flip_at >= 0 else position + len(parts[1]) - 1
    bad[target] ^= 0x04
    path.write_bytes(bytes(bad))
    batches = list(iter_batches(path.read_bytes(), path=str(path)))
    batches[0][1].ensure_valid()
    corrupt = batches[1][1]
    assert not corrupt.is_valid()
    stored, computed = corrupt.crc, corrupt.compute_crc()
    with pytest.raises(CorruptRecordError) as info:
        corrupt.ensure_valid()
    message = str(info.value)
    assert str(path) in message and f"byte position {position}" in message
    assert f"stored crc = {stored}" in message and f"computed crc = {computed}" in message
    assert info.value.path == str(path) and info.value.position == position


def test_crc_does_not_cover_partition_leader_epoch() -> None:
    raw = bytearray(build(0, [Record(0, 1, b"k", b"v")]))
    struct.pack_into(">i", raw, PARTITION_LEADER_EPOCH_OFFSET, 12345)
    batch = RecordBatch(bytes(raw))
    batch.ensure_valid()
    assert batch.partition_leader_epoch == 12345


def test_ensure_valid_explicit_labels() -> None:
    raw = bytearray(build(0, [Record(0, 1, b"k", b"v")]))
    raw[-1] ^= 1
    with pytest.raises(CorruptRecordError, match="other.log at byte position 77"):
        RecordBatch(bytes(raw)).ensure_valid(path="other.log", position=77)


def test_buffer_shorter_than_length_field() -> None:
    raw = build(0, [Record(0, 1, b"k", b"v")])
    with pytest.raises(CorruptRecordError, match="claims"):
        RecordBatch(raw[:-1])
    with pytest.raises(CorruptRecordError):
        RecordBatch(raw[:5])
    # a longer buffer is cut to the batch
    assert RecordBatch(raw + b"trailing").size_in_bytes == len(raw)


def recrc(raw: bytearray) -> bytes:
    struct.pack_into(">I", raw, CRC_OFFSET, crc32c_reference(bytes(raw[ATTRIBUTES_OFFSET:])))
    return bytes(raw)


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda raw: struct.pack_into(">i", raw, RECORDS_COUNT_OFFSET, 3), "invalid records"),
        (lambda raw: struct.pack_into(">i", raw, RECORDS_COUNT_OFFSET, 1), "remain after 1 records"),
        (lambda raw: struct.pack_into(">i", raw, RECORDS_COUNT_OFFSET, -1), "invalid record count -1"),
        (lambda raw: raw.__setitem__(RECORD_BATCH_OVERHEAD, 0x7E), "invalid record size"),
        (lambda raw: struct.pack_into(">h", raw, ATTRIBUTES_OFFSET, 6), "unknown compression codec id 6"),
        (lambda raw: struct.pack_into(">h", raw, ATTRIBUTES_OFFSET, 4), "failed to decompress"),
    ],
)
def test_undecodable_records_raise_corrupt_record_error(mutate, message: str) -> None:
    raw = bytearray(build(0, [Record(0, 1, b"k", b"v"), Record(1, 2, b"k2", b"v2")]))
    mutate(raw)
    batch = RecordBatch(recrc(raw), path="p.log", position=0)
    batch.ensure_valid()  # CRC fine, the content is not
    with pytest.raises(CorruptRecordError, match=message):
        batch.records()


def test_record_equality_and_repr() -> None:
    a = Record(1, 2, b"k", None, [("h", None)])
    b = Record(1, 2, b"k", None, (("h", None),))
    assert a == b and hash(a) == hash(b)
    assert a != Record(1, 2, b"k", b"", (("h", None),))
    assert "offset=1" in repr(a)
    assert not hasattr(a, "__dict__")
    assert RecordBatch.__slots__ and RecordBatchBuilder.__slots__


@pytest.mark.parametrize("codec", [CompressionType.NONE, CompressionType.GZIP])
def test_batch_header_fields_of_a_batch_rebuild_it_byte_for_byte(codec) -> None:
    from materializer.storage.record_batch_builder import build_batch_from_section
    from materializer.storage.record_scan import records_section

    builder = RecordBatchBuilder(40, compression=codec, producer_id=3, producer_epoch=2, base_sequence=7,
                                 is_transactional=True, partition_leader_epoch=5,
                                 timestamp_type=TimestampType.LOG_APPEND_TIME, log_append_time_ms=9_000)
    builder.append(40, 1000, b"k", b"v")
    builder.append(42, 1500, None, None)
    raw = builder.build(last_offset=44)
    batch = RecordBatch(raw)
    fields = BatchHeaderFields.of(batch.header)
    assert (fields.last_offset, fields.compression, fields.timestamp_type, fields.is_transactional,
            fields.is_control_batch) == (44, codec, TimestampType.LOG_APPEND_TIME, True, False)
    assert build_batch_from_section(fields, 2, records_section(batch)) == raw
