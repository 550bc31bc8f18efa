"""Control record keys and end-transaction markers (ControlRecordType, EndTransactionMarker)."""

from __future__ import annotations

import pytest

from materializer.storage.control_record import (
    ControlRecordType,
    EndTransactionMarker,
    control_record_key,
    decode_end_txn_marker,
    encode_end_txn_marker,
    parse_control_record_type,
)


def test_type_ids_match_kafka() -> None:
    assert {t.name: int(t) for t in ControlRecordType} == {
        "UNKNOWN": -1,
        "ABORT": 0,
        "COMMIT": 1,
        "LEADER_CHANGE": 2,
        "SNAPSHOT_HEADER": 3,
        "SNAPSHOT_FOOTER": 4,
        "KRAFT_VERSION": 5,
        "KRAFT_VOTERS": 6,
    }


def test_golden_commit_marker() -> None:
    key, value = encode_end_txn_marker(ControlRecordType.COMMIT, 7)
    assert key == bytes.fromhex("0000 0001")  # version 0, type COMMIT
    assert value == bytes.fromhex("0000 00000007")  # version 0, coordinator epoch 7
    assert decode_end_txn_marker(key, value) == EndTransactionMarker(ControlRecordType.COMMIT, 7)


def test_abort_marker_round_trip() -> None:
    key, value = encode_end_txn_marker(ControlRecordType.ABORT, -5)
    assert key == b"\x00\x00\x00\x00"
    marker = decode_end_txn_marker(key, value)
    assert marker.control_type is ControlRecordType.ABORT
    assert marker.coordinator_epoch == -5


@pytest.mark.parametrize("control_type", [t for t in ControlRecordType if t != ControlRecordType.UNKNOWN])
def test_parse_every_known_type(control_type: ControlRecordType) -> None:
    assert parse_control_record_type(control_record_key(control_type)) is control_type


def test_unknown_type_and_newer_version() -> None:
    assert parse_control_record_type(bytes.fromhex("0000 0063")) is ControlRecordType.UNKNOWN
    # a newer key version is parsed as version 0, trailing fields ignored
    assert parse_control_record_type(bytes.fromhex("0003 0001 ffff")) is ControlRecordType.COMMIT


@pytest.mark.parametrize("key", [None, b"", b"\x00\x00\x00", bytes.fromhex("ffff0001")])
def test_bad_keys(key: bytes | None) -> None:
    with pytest.raises(ValueError):
        parse_control_record_type(key)


def test_invalid_markers() -> None:
    with pytest.raises(ValueError, match="end transaction marker"):
        encode_end_txn_marker(ControlRecordType.LEADER_CHANGE, 1)
    with pytest.raises(ValueError, match="int32"):
        encode_end_txn_marker(ControlRecordType.COMMIT, 2**31)
    with pytest.raises(ValueError, match="UNKNOWN"):
        control_record_key(ControlRecordType.UNKNOWN)
    key = control_record_key(ControlRecordType.COMMIT)
    with pytest.raises(ValueError, match="null value"):
        decode_end_txn_marker(key, None)
    with pytest.raises(ValueError, match="4-byte value"):
        decode_end_txn_marker(key, b"\x00\x00\x00\x01")
    with pytest.raises(ValueError, match="negative|invalid version"):
        decode_end_txn_marker(key, bytes.fromhex("ffff 00000001"))
    with pytest.raises(ValueError, match="end transaction marker"):
        decode_end_txn_marker(control_record_key(ControlRecordType.LEADER_CHANGE), bytes(6))
