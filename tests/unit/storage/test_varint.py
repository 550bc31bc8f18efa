"""Zig-zag varints (Kafka ByteUtils): byte tables around every length boundary."""

from __future__ import annotations

import pytest

from materializer.storage.varint import (
    INT32_MAX,
    INT32_MIN,
    INT64_MAX,
    INT64_MIN,
    decode_unsigned_varint,
    decode_varint,
    encode_varint,
    size_of_varint,
    write_varint,
)

# (value, encoding) written out by hand from the protobuf zig-zag rules.
GOLDEN = [
    (0, "00"),
    (-1, "01"),
    (1, "02"),
    (-2, "03"),
    (63, "7e"),
    (-64, "7f"),
    (64, "8001"),  # first 2-byte value
    (-65, "8101"),
    (300, "d804"),
    (8191, "fe7f"),  # last 2-byte value
    (-8192, "ff7f"),
    (8192, "808001"),  # first 3-byte value
    (-8193, "818001"),
    (2**20 - 1, "feff7f"),
    (2**20, "80808001"),
    (2**27 - 1, "feffff7f"),
    (2**27, "8080808001"),
    (INT32_MAX, "feffffff0f"),
    (INT32_MIN, "ffffffff0f"),
    (2**31, "8080808010"),  # int64 only from here on
    (-(2**31) - 1, "8180808010"),
    (2**34 - 1, "feffffff7f"),
    (2**34, "808080808001"),
    (INT64_MAX, "feffffffffffffffff01"),
    (INT64_MIN, "ffffffffffffffffff01"),
]


def reference_encode(value: int) -> bytes:
    """Independent re-statement: zig-zag to unsigned 64 bits, then 7-bit groups LSB first."""
    unsigned = (value * 2) if value >= 0 else (-value * 2 - 1)
    out = []
    while True:
        group = unsigned % 128
        unsigned //= 128
        if unsigned:
            out.append(group + 128)
        else:
            out.append(group)
            return bytes(out)


def boundary_values() -> list[int]:
    values = set()
    for groups in range(1, 11):
        # the largest magnitudes whose zig-zag form needs `groups` 7-bit groups, and one past
        limit = 2 ** (7 * groups - 1)
        for v in (limit - 1, limit, -limit, -limit - 1):
            if INT64_MIN <= v <= INT64_MAX:
                values.add(v)
    values.update((INT32_MAX, INT32_MIN, INT64_MAX, INT64_MIN, 0, 1, -1))
    return sorted(values)


@pytest.mark.parametrize(("value", "encoded"), GOLDEN)
def test_golden_encoding(value: int, encoded: str) -> None:
    expected = bytes.fromhex(encoded)
    assert encode_varint(value) == expected
    assert size_of_varint(value) == len(expected)
    assert decode_varint(expected, 0) == (value, len(expected))
    out = bytearray(b"\xaa")
    write_varint(value, out)
    assert bytes(out) == b"\xaa" + expected


@pytest.mark.parametrize("value", boundary_values())
def test_boundaries_match_reference(value: int) -> None:
    encoded = reference_encode(value)
    assert encode_varint(value) == encoded
    assert size_of_varint(value) == len(encoded)
    # decode in the middle of a buffer, from bytes, bytearray and memoryview
    buf = b"\xff\xff" + encoded + b"\x05"
    for view in (buf, bytearray(buf), memoryview(buf)):
        assert decode_varint(view, 2) == (value, 2 + len(encoded))
    raw, next_pos = decode_unsigned_varint(buf, 2)
    assert next_pos == 2 + len(encoded)
    assert (raw >> 1) ^ -(raw & 1) == value


def test_every_small_value_round_trips() -> None:
    # covers the whole 1- and 2-byte cache and both edges beyond it
    for value in range(-20000, 20000):
        encoded = encode_varint(value)
        assert encoded == reference_encode(value)
        assert decode_varint(encoded, 0) == (value, len(encoded))


def test_sizes_per_length() -> None:
    assert [size_of_varint(2 ** (7 * n - 1) - 1) for n in range(1, 10)] == list(range(1, 10))
    assert size_of_varint(INT64_MAX) == 10


def test_decode_sequence_of_varints() -> None:
    values = [0, -1, 300, INT64_MIN, 5, INT32_MAX]
    buf = b"".join(encode_varint(v) for v in values)
    pos = 0
    decoded = []
    while pos < len(buf):
        value, pos = decode_varint(buf, pos)
        decoded.append(value)
    assert decoded == values


@pytest.mark.parametrize("value", [INT64_MAX + 1, INT64_MIN - 1, 2**70])
def test_out_of_range_values_rejected(value: int) -> None:
    with pytest.raises(ValueError, match="int64"):
        encode_varint(value)
    with pytest.raises(ValueError, match="int64"):
        size_of_varint(value)
    with pytest.raises(ValueError):
        write_varint(value, bytearray())


@pytest.mark.parametrize("encoded", ["", "80", "ff", "8080", "ffffffffffffffffff"])
def test_truncated_varint(encoded: str) -> None:
    with pytest.raises(ValueError, match="ends inside a varint"):
        decode_varint(bytes.fromhex(encoded), 0)
    with pytest.raises(ValueError, match="ends inside a varint"):
        decode_unsigned_varint(bytes.fromhex(encoded), 0)


def test_overlong_varint() -> None:
    eleven = b"\x80" * 10 + b"\x01"
    with pytest.raises(ValueError, match="longer than 10 bytes"):
        decode_varint(eleven, 0)
    with pytest.raises(ValueError, match="longer than 10 bytes"):
        decode_unsigned_varint(eleven, 0)
