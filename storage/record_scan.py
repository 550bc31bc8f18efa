"""Keys-only scan of a v2 batch's records, for the cleaner's two passes (no ``Record`` objects).

The cleaner needs, per record, only its absolute offset, its key and whether its value is null
(``Cleaner.buildOffsetMapForSegment`` and ``MemoryRecords.filterTo``'s ``shouldRetainRecord``).
:func:`scan_keys` walks the records section once and returns exactly that, so that a batch that
keeps every record is copied verbatim and a batch that changes decodes only the records it keeps
(:func:`record_ends` + :func:`decode_retained`).

The scan checks the record framing exactly as ``record_batch._decode_records`` (Kafka
``DefaultRecord.readFrom``) does - Length against the bytes left, varint limits, header framing,
every record ending where its Length says, no bytes after RecordsCount records - so a corrupt
records section raises the same :class:`~.errors.CorruptRecordError` either way. Record layout
(``DefaultRecord``)::

    Record => Length:Varint Attributes:Int8 TimestampDelta:Varlong OffsetDelta:Varint
              KeyLength:Varint Key:Bytes ValueLength:Varint Value:Bytes
              HeadersCount:Varint [HeaderKeyLength:Varint HeaderKey HeaderValueLength:Varint HeaderValue]
"""

from __future__ import annotations

from typing import NamedTuple

from .compression import CompressionType, decompress
from .record_batch import RECORDS_OFFSET, TIMESTAMP_TYPE_MASK, Record, RecordBatch, _decode_headers, _decode_records
from .varint import decode_unsigned_varint as _decode_raw_varint
from .varint import decode_varint

__all__ = ["KeyScan", "scan_keys", "decode_retained", "record_ends", "records_section"]


class KeyScan(NamedTuple):
    """What :func:`scan_keys` found in one batch; the lists are parallel, one entry per record.

    ``data`` is the uncompressed records section (:func:`record_ends` finds where each record
    ends in it). ``offsets`` are absolute offsets, ``keys`` the key bytes or ``None``,
    ``tombstones`` the indices of records whose value is null.
    """

    data: bytes
    offsets: list[int]
    keys: list[bytes | None]
    tombstones: list[int]


def records_section(batch: RecordBatch) -> bytes:
    """The batch's records section, decompressed (bytes after the 61-byte header).

    Raises:
        CorruptRecordError: unknown codec or a bad compressed stream.
    """
    codec = batch.compression_type
    body = batch.buffer[RECORDS_OFFSET:]
    if codec == CompressionType.NONE:
        return bytes(body)
    try:
        return decompress(codec, body)
    except ValueError as exc:
        raise batch._error(f"failed to decompress record stream: {exc}") from exc


def scan_keys(batch: RecordBatch) -> KeyScan:
    """Offsets, keys, tombstone flags and record ends of every record of ``batch``.

    Raises:
        CorruptRecordError: negative RecordsCount, a bad compressed stream, or a record whose
            framing is invalid (same checks and messages as :meth:`RecordBatch.records`).
    """
    header = batch.header
    count = header.records_count
    if count == 0:
        return KeyScan(b"", [], [], [])
    if count < 0:
        raise batch._error(f"found invalid record count {count} in magic v2 batch")
    data = records_section(batch)
    try:
        return _scan(data, count, header.base_offset)
    except (ValueError, IndexError, UnicodeDecodeError) as exc:
        raise batch._error(f"invalid records in batch at base offset {header.base_offset}: {exc}") from exc


def _scan(data: bytes, count: int, base_offset: int) -> KeyScan:
    offsets: list[int] = []
    keys: list[bytes | None] = []
    tombstones: list[int] = []
    add_offset = offsets.append
    add_key = keys.append
    end = len(data)
    pos = 0
    for index in range(count):
        # Length => Varint (one or two bytes inline, as in _decode_records)
        b = data[pos]
        pos += 1
        if b >= 0x80:
            b2 = data[pos]
            if b2 < 0x80:
                b = (b & 0x7F) | (b2 << 7)
                pos += 1
            else:
                b, pos = _decode_raw_varint(data, pos - 1)
        length = (b >> 1) ^ -(b & 1)
        record_end = pos + length
        if length < 0 or record_end > end:
            raise ValueError(
                f"invalid record size: expected {length} bytes in record payload, "
                f"but only {end - pos} remain"
            )
        # Attributes => Int8 (unused); TimestampDelta => Varlong, skipped
        b = data[pos + 1]
        pos += 2
        if b >= 0x80:
            if data[pos] < 0x80:
                pos += 1
            else:
                _, pos = _decode_raw_varint(data, pos - 1)
        # OffsetDelta => Varint
        b = data[pos]
        pos += 1
        if b >= 0x80:
            b2 = data[pos]
            if b2 < 0x80:
                b = (b & 0x7F) | (b2 << 7)
                pos += 1
            else:
                b, pos = _decode_raw_varint(data, pos - 1)
        add_offset(base_offset + ((b >> 1) ^ -(b & 1)))
        # KeyLength => Varint, Key => Bytes
        b = data[pos]
        pos += 1
        if b >= 0x80:
            b2 = data[pos]
            if b2 < 0x80:
                b = (b & 0x7F) | (b2 << 7)
                pos += 1
            else:
                b, pos = _decode_raw_varint(data, pos - 1)
        if b & 1:  # negative: null key
            add_key(None)
        else:
            size = b >> 1
            add_key(data[pos : pos + size])
            pos += size
        # ValueLength => Varint, Value => Bytes (skipped)
        b = data[pos]
        pos += 1
        if b >= 0x80:
            b2 = data[pos]
            if b2 < 0x80:
                b = (b & 0x7F) | (b2 << 7)
                pos += 1
            else:
                b, pos = _decode_raw_varint(data, pos - 1)
        if b & 1:
            tombstones.append(index)
        else:
            pos += b >> 1
        # HeadersCount => Varint (decoded only to check the framing)
        if data[pos] == 0:
            pos += 1
        else:
            header_count, pos = decode_varint(data, pos)
            _, pos = _decode_headers(data, pos, header_count)
        if pos != record_end:
            raise ValueError(
                f"invalid record size: expected to read {length} bytes in record payload, "
                f"but instead read {length + pos - record_end}"
            )
    if pos != end:
        raise ValueError(f"incorrect declared batch size, {end - pos} bytes remain after {count} records")
    return KeyScan(data, offsets, keys, tombstones)


def decode_retained(batch: RecordBatch, data: bytes, ends: list[int], indices: list[int]) -> list[Record]:
    """Decode only records ``indices`` (ascending) of a records section, as :meth:`RecordBatch.records` would.

    ``data`` is the batch's uncompressed records section and ``ends`` its record end positions
    (:attr:`KeyScan.data`/:attr:`KeyScan.ends`, or :func:`records_section`/:func:`record_ends`).

    Raises:
        CorruptRecordError: a selected record does not decode.
    """
    pieces = [data[(ends[i - 1] if i else 0) : ends[i]] for i in indices]
    header = batch.header
    log_append_time = header.max_timestamp if header.attributes & TIMESTAMP_TYPE_MASK else None
    try:
        return _decode_records(b"".join(pieces), len(pieces), header.base_offset, header.base_timestamp, log_append_time)
    except (ValueError, IndexError, UnicodeDecodeError) as exc:
        raise batch._error(f"invalid records in batch at base offset {header.base_offset}: {exc}") from exc


def record_ends(data: bytes, count: int) -> list[int]:
    """End position of each of ``count`` records in ``data``, from the Length fields alone.

    For a records section :func:`scan_keys` already accepted (same bytes): it trusts the
    framing and checks nothing beyond it.
    """
    ends: list[int] = []
    add_end = ends.append
    pos = 0
    for _ in range(count):
        b = data[pos]
        if b < 0x80:
            pos += 1
        elif data[pos + 1] < 0x80:
            b = (b & 0x7F) | (data[pos + 1] << 7)
            pos += 2
        else:
            b, pos = _decode_raw_varint(data, pos)
        pos += (b >> 1) ^ -(b & 1)
        add_end(pos)
    return ends
