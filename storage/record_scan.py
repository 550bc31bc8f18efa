"""Keys-only scan of a v2 batch's records, for the cleaner's two passes (no ``Record`` objects).

The cleaner needs, per record, only its absolute offset, its key and whether its value is null
(``Cleaner.buildOffsetMapForSegment`` and ``MemoryRecords.filterTo``'s ``shouldRetainRecord``).
:func:`scan_keys` walks the records section once and returns exactly that, so that a batch that
keeps every record is copied verbatim and a batch that changes is re-encoded from the kept
records' bytes (:func:`encode_retained_batch`), never decoded into objects.

The scan is the native core's walk over the records section (``_native.scan_keys``), the same
walk and framing checks as the full decode (Kafka ``DefaultRecord.readFrom``; the readable
definition is :mod:`.record_reference`), so a corrupt records section raises the same
:class:`~.errors.CorruptRecordError` either way.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

from . import _native
from .compression import CompressionType, decompress
from .record_batch import DELETE_HORIZON_FLAG_MASK, RECORDS_OFFSET, TIMESTAMP_TYPE_MASK, BatchHeaderFields, RecordBatch
from .record_batch_builder import build_batch_from_section

if TYPE_CHECKING:
    from .offset_map import OffsetMap

__all__ = ["KeyScan", "scan_keys", "records_section", "map_batch_keys",
           "retained_by_map", "encode_retained_batch"]


class KeyScan(NamedTuple):
    """What :func:`scan_keys` found in one batch; the lists are parallel, one entry per record.

    ``data`` is the uncompressed records section. ``offsets`` are absolute offsets, ``keys`` the key bytes or ``None``,
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
        raise batch.corruption_error(f"failed to decompress record stream: {exc}") from exc


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
        raise batch.corruption_error(f"found invalid record count {count} in magic v2 batch")
    data = records_section(batch)
    try:
        return _scan(data, count, header.base_offset)
    except (ValueError, IndexError, UnicodeDecodeError) as exc:
        raise batch.corruption_error(f"invalid records in batch at base offset {header.base_offset}: {exc}") from exc


def _scan(data: bytes, count: int, base_offset: int) -> KeyScan:
    offsets, keys, tombstones = _native.scan_keys(data, count, base_offset)
    return KeyScan(data, offsets, keys, tombstones)


def map_batch_keys(batch: RecordBatch, offset_map: "OffsetMap", start: int, end: int,
                   max_entries: int) -> tuple[int, bool]:
    """:meth:`.offset_map.OffsetMap.map_records_section` for ``batch``: ``(records read, stopped)``.

    Raises:
        CorruptRecordError: negative RecordsCount, a bad compressed stream or invalid framing.
    """
    count = batch.header.records_count
    if count == 0:
        return 0, False
    if count < 0:
        raise batch.corruption_error(f"found invalid record count {count} in magic v2 batch")
    data = records_section(batch)
    try:
        return offset_map.map_records_section(data, count, batch.header.base_offset, start, end, max_entries)
    except ValueError as exc:
        raise batch.corruption_error(f"invalid records in batch at base offset {batch.header.base_offset}: {exc}") from exc


def retained_by_map(batch: RecordBatch, offset_map: "OffsetMap", retain_deletes: bool
                    ) -> tuple[bytes, list[int], bool, int]:
    """``(records section, kept record indices, a kept tombstone?, invalid records)`` of ``batch``
    from :meth:`.offset_map.OffsetMap.kept_in_section`.

    Raises:
        CorruptRecordError: negative RecordsCount, a bad compressed stream or invalid framing.
    """
    count = batch.header.records_count
    if count < 0:
        raise batch.corruption_error(f"found invalid record count {count} in magic v2 batch")
    data = records_section(batch) if count else b""
    try:
        found = offset_map.kept_in_section(data, count, batch.header.base_offset, retain_deletes)
    except ValueError as exc:
        raise batch.corruption_error(f"invalid records in batch at base offset {batch.header.base_offset}: {exc}") from exc
    return (data, *found)


def encode_retained_batch(batch: RecordBatch, data: bytes, indices: list[int],
                          delete_horizon_ms: int | None) -> bytes:
    """The cleaned copy of ``batch`` keeping records ``indices`` (ascending) of its records
    section ``data`` (Kafka ``MemoryRecords.buildRetainedRecordsInto``): the header fields of
    ``batch`` (:meth:`.record_batch.BatchHeaderFields.of`: same base offset, last offset,
    producer fields, codec and flags) with the delete-horizon bit set iff ``delete_horizon_ms``
    is given and new Base/MaxTimestamp; the kept records' bytes re-based on the new base
    timestamp (the delete horizon when given, KIP-534, ms) without decoding them into objects.

    Raises:
        CorruptRecordError: the records section does not decode.
    """
    header = batch.header
    log_append_time = header.max_timestamp if header.attributes & TIMESTAMP_TYPE_MASK else None
    try:
        section, base_timestamp, max_timestamp = _native.encode_retained(
            data, header.records_count, header.base_timestamp, log_append_time, indices, delete_horizon_ms)
    except ValueError as exc:
        raise batch.corruption_error(f"invalid records in batch at base offset {header.base_offset}: {exc}") from exc
    attributes = header.attributes & ~DELETE_HORIZON_FLAG_MASK
    if delete_horizon_ms is not None:
        attributes |= DELETE_HORIZON_FLAG_MASK
    cleaned = BatchHeaderFields.of(
        header, attributes=attributes, base_timestamp=base_timestamp,
        max_timestamp=log_append_time if log_append_time is not None else max_timestamp,
    )
    return build_batch_from_section(cleaned, len(indices), section)
