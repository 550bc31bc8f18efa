"""The readable definition of a v2 records section, field by field (Kafka ``DefaultRecord.readFrom``).

The native core (``storage/native``, imported as ``materializer.storage._native``) runs the same
walk over the bytes for speed; this module is what it is held to: the tests decode the same
vectors (every codec, control batches, delete horizons, empty batches, torn tails and mutated
bytes) through both and expect equal records or an error from both. Nothing on a user's path
calls it. Record layout::

    Record => Length:Varint Attributes:Int8 TimestampDelta:Varlong OffsetDelta:Varint
              KeyLength:Varint Key:Bytes ValueLength:Varint Value:Bytes
              HeadersCount:Varint [HeaderKeyLength:Varint HeaderKey HeaderValueLength:Varint HeaderValue]

A negative Key/Value/HeaderValue length means null. Checks (and their messages): Length within
the bytes left, a non-negative header count and header key size, each record ending exactly where
its Length says, and no bytes left after RecordsCount records.
"""

from __future__ import annotations

from .record_batch import Record
from .varint import decode_varint

__all__ = ["decode_records_reference", "scan_keys_reference"]


def _read_bytes(data: bytes, pos: int, size: int, length: int, record_end: int) -> tuple[bytes | None, int]:
    if size < 0:
        return None, pos
    if pos + size > len(data):
        raise ValueError(f"invalid record size: expected to read {length} bytes in record payload, "
                         f"but instead read {length + pos + size - record_end}")
    return bytes(data[pos:pos + size]), pos + size


def _records(data: bytes, count: int):
    """Yield ``(timestamp_delta, offset_delta, key, value, headers)`` per record."""
    end = len(data)
    pos = 0
    for _ in range(max(count, 0)):
        length, pos = decode_varint(data, pos)
        if length < 0 or length > end - pos:
            raise ValueError(f"invalid record size: expected {length} bytes in record payload, "
                             f"but only {end - pos} remain")
        record_end = pos + length
        pos += 1  # Attributes: unused by v2 records
        timestamp_delta, pos = decode_varint(data, pos)
        offset_delta, pos = decode_varint(data, pos)
        key_size, pos = decode_varint(data, pos)
        key, pos = _read_bytes(data, pos, key_size, length, record_end)
        value_size, pos = decode_varint(data, pos)
        value, pos = _read_bytes(data, pos, value_size, length, record_end)
        header_count, pos = decode_varint(data, pos)
        if header_count < 0:
            raise ValueError(f"found invalid number of record headers {header_count}")
        headers = []
        for _ in range(header_count):
            header_key_size, pos = decode_varint(data, pos)
            if header_key_size < 0:
                raise ValueError(f"invalid negative header key size {header_key_size}")
            header_key, pos = _read_bytes(data, pos, header_key_size, length, record_end)
            header_value_size, pos = decode_varint(data, pos)
            header_value, pos = _read_bytes(data, pos, header_value_size, length, record_end)
            # Java's new String(bytes, UTF_8) replaces malformed input rather than failing
            headers.append(((header_key or b"").decode("utf-8", "replace"), header_value))
        if pos != record_end:
            raise ValueError(f"invalid record size: expected to read {length} bytes in record payload, "
                             f"but instead read {length + pos - record_end}")
        yield timestamp_delta, offset_delta, key, value, tuple(headers)
    if pos != end:
        raise ValueError(f"incorrect declared batch size, {end - pos} bytes remain after {count} records")


def decode_records_reference(data: bytes, count: int, base_offset: int, base_timestamp: int,
                             log_append_time: int | None) -> list[Record]:
    """Decode ``count`` records (absolute offsets; timestamps in ms, ``log_append_time`` for all
    records of a LogAppendTime batch). Raises ValueError on malformed input."""
    return [
        Record(base_offset + offset_delta,
               base_timestamp + timestamp_delta if log_append_time is None else log_append_time,
               key, value, headers)
        for timestamp_delta, offset_delta, key, value, headers in _records(data, count)
    ]


def scan_keys_reference(data: bytes, count: int, base_offset: int) -> tuple[list[int], list[bytes | None], list[int]]:
    """``(offsets, keys, tombstone indices)`` as the native ``scan_keys`` returns them."""
    offsets: list[int] = []
    keys: list[bytes | None] = []
    tombstones: list[int] = []
    for index, (_, offset_delta, key, value, _) in enumerate(_records(data, count)):
        offsets.append(base_offset + offset_delta)
        keys.append(key)
        if value is None:
            tombstones.append(index)
    return offsets, keys, tombstones
