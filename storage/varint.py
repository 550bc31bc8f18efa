"""Zig-zag protobuf varints, as Kafka writes them inside v2 records.

Mirrors ``org.apache.kafka.common.utils.ByteUtils`` (``writeVarint``/``writeVarlong``,
``readVarint``/``readVarlong``, ``sizeOfVarint``/``sizeOfVarlong``)::

    Varint  => zig-zag int32,  then 7 bits per byte, least significant group first,
               high bit of each byte = "more bytes follow"; 1..5 bytes
    Varlong => zig-zag int64, same encoding; 1..10 bytes

Zig-zag maps signed to unsigned so small magnitudes stay short:
``0 -> 0, -1 -> 1, 1 -> 2, -2 -> 3, ...`` i.e. ``(v << 1) ^ (v >> 63)``.
For values inside the int32 range the int32 and int64 encodings are byte-for-byte
identical, so one set of functions serves both (Kafka's ``Varint`` and ``Varlong``).

The decoder accepts up to 10 bytes (a Varlong); callers that need Kafka's 5-byte
Varint limit check the range of the result.
"""

from __future__ import annotations

__all__ = [
    "INT32_MAX",
    "INT32_MIN",
    "INT64_MAX",
    "INT64_MIN",
    "MAX_VARLONG_BYTES",
    "decode_unsigned_varint",
    "decode_varint",
    "encode_varint",
    "size_of_varint",
    "write_varint",
]

INT32_MIN = -(2**31)
INT32_MAX = 2**31 - 1
INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1
MAX_VARLONG_BYTES = 10
"""Longest legal encoding (a zig-zag int64 needs at most ceil(64 / 7) bytes)."""

# Encodings of the values whose zig-zag form fits one or two bytes, i.e. [-8192, 8191].
# Record lengths, offset deltas, key/value lengths and most timestamp deltas live here,
# so the builder's hot path is a list lookup instead of a loop.
_CACHE_MIN = -8192
_CACHE_MAX = 8191


def _encode_slow(value: int) -> bytes:
    if value < INT64_MIN or value > INT64_MAX:
        raise ValueError(f"varint value {value} is outside the int64 range")
    zigzag = (value << 1) ^ (value >> 63)
    out = bytearray()
    while zigzag > 0x7F:
        out.append((zigzag & 0x7F) | 0x80)
        zigzag >>= 7
    out.append(zigzag)
    return bytes(out)


_ENCODED: list[bytes] = [_encode_slow(v) for v in range(_CACHE_MIN, _CACHE_MAX + 1)]


def encode_varint(value: int) -> bytes:
    """Return the zig-zag varint encoding of ``value`` (1..10 bytes).

    Kafka ``ByteUtils.writeVarint``/``writeVarlong``.

    Raises:
        ValueError: ``value`` is outside the int64 range.
    """
    if _CACHE_MIN <= value <= _CACHE_MAX:
        return _ENCODED[value - _CACHE_MIN]
    return _encode_slow(value)


def write_varint(value: int, out: bytearray) -> None:
    """Append the zig-zag varint encoding of ``value`` to ``out``.

    Raises:
        ValueError: ``value`` is outside the int64 range.
    """
    if _CACHE_MIN <= value <= _CACHE_MAX:
        out += _ENCODED[value - _CACHE_MIN]
    else:
        out += _encode_slow(value)


def decode_varint(buf: bytes | bytearray | memoryview, pos: int) -> tuple[int, int]:
    """Decode one zig-zag varint starting at byte ``pos`` of ``buf``.

    Kafka ``ByteUtils.readVarint``/``readVarlong``.

    Returns:
        ``(value, next_pos)``: the signed value and the position just after the varint.

    Raises:
        ValueError: the buffer ends inside the varint, or it is longer than 10 bytes.
    """
    try:
        b = buf[pos]
        if b < 0x80:
            return (b >> 1) ^ -(b & 1), pos + 1
        result = b & 0x7F
        shift = 7
        pos += 1
        while True:
            b = buf[pos]
            pos += 1
            result |= (b & 0x7F) << shift
            if b < 0x80:
                return (result >> 1) ^ -(result & 1), pos
            shift += 7
            if shift >= 70:
                raise ValueError(f"varint longer than {MAX_VARLONG_BYTES} bytes ending at position {pos}")
    except IndexError:
        raise ValueError(f"buffer of {len(buf)} bytes ends inside a varint") from None


def decode_unsigned_varint(buf: bytes | bytearray | memoryview, pos: int) -> tuple[int, int]:
    """Decode the raw unsigned varint at ``pos`` without undoing the zig-zag mapping.

    Callers apply ``(raw >> 1) ^ -(raw & 1)`` themselves (the record decoder's inline
    fast path does). Kafka ``ByteUtils.readUnsignedVarint``, extended to 10 bytes.

    Returns:
        ``(raw, next_pos)``.

    Raises:
        ValueError: the buffer ends inside the varint, or it is longer than 10 bytes.
    """
    result = 0
    shift = 0
    try:
        while True:
            b = buf[pos]
            pos += 1
            result |= (b & 0x7F) << shift
            if b < 0x80:
                return result, pos
            shift += 7
            if shift >= 70:
                raise ValueError(f"varint longer than {MAX_VARLONG_BYTES} bytes ending at position {pos}")
    except IndexError:
        raise ValueError(f"buffer of {len(buf)} bytes ends inside a varint") from None


def size_of_varint(value: int) -> int:
    """Number of bytes ``encode_varint(value)`` produces (Kafka ``ByteUtils.sizeOfVarlong``)."""
    if value < INT64_MIN or value > INT64_MAX:
        raise ValueError(f"varint value {value} is outside the int64 range")
    zigzag = (value << 1) ^ (value >> 63)
    return max(1, (zigzag.bit_length() + 6) // 7)
