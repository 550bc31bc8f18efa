"""Builder of Kafka v2 record batches (``MemoryRecordsBuilder`` for magic 2).

Writes the layout documented in :mod:`.record_batch` (``DefaultRecordBatch``,
``DefaultRecord.writeTo``): records are encoded into an uncompressed body as they are
appended (varints), the body is compressed as a whole when the codec is not none, then
the 61-byte header is packed and the CRC-32C computed over [Attributes, end).
``build_empty_batch`` mirrors ``DefaultRecordBatch.writeEmptyHeader``.

Callers import the builder from here; :mod:`.record_batch` (the reader) knows nothing of it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import crc32c

from .compression import CompressionType, compress
from .record_batch import (
    _CRC_STRUCT,
    ATTRIBUTES_OFFSET,
    COMPRESSION_CODEC_MASK,
    CONTROL_FLAG_MASK,
    CRC_OFFSET,
    CURRENT_MAGIC_VALUE,
    DELETE_HORIZON_FLAG_MASK,
    HEADER_STRUCT,
    LOG_OVERHEAD,
    NO_PARTITION_LEADER_EPOCH,
    NO_PRODUCER_EPOCH,
    NO_PRODUCER_ID,
    NO_SEQUENCE,
    NO_TIMESTAMP,
    RECORD_BATCH_OVERHEAD,
    TIMESTAMP_TYPE_MASK,
    TRANSACTIONAL_FLAG_MASK,
    BatchHeaderFields,
    Record,
    TimestampType,
)
from .varint import INT32_MAX, INT64_MAX, encode_varint

__all__ = ["RecordBatchBuilder", "build_empty_batch", "estimate_record_size_upper_bound"]


class RecordBatchBuilder:
    """Builds one v2 batch (Kafka ``MemoryRecordsBuilder`` for magic 2).

    Records are encoded into an uncompressed body as they are appended; :meth:`build`
    compresses the body as a whole, then packs the header and the CRC-32C.
    BaseTimestamp is the first record's timestamp, or ``delete_horizon_ms`` when given
    (attribute bit 6 set, record deltas computed against it). MaxTimestamp is the largest
    record timestamp for CreateTime, and ``log_append_time_ms`` for LogAppendTime
    (defaulting to the largest record timestamp, which is what a batch read back from a
    LogAppendTime batch carries). Not thread-safe; one builder builds one batch.

    Raises:
        ValueError: an argument is outside its Kafka field's range, or producer fields
            break ``MemoryRecordsBuilder.validateProducerState`` (checked in build).
    """

    __slots__ = (
        "base_offset",
        "compression",
        "timestamp_type",
        "producer_id",
        "producer_epoch",
        "base_sequence",
        "is_transactional",
        "is_control_batch",
        "partition_leader_epoch",
        "delete_horizon_ms",
        "log_append_time_ms",
        "_body",
        "_count",
        "_last_offset",
        "_base_timestamp",
        "_max_timestamp",
    )

    def __init__(
        self,
        base_offset: int,
        *,
        compression: CompressionType | int = CompressionType.NONE,
        timestamp_type: TimestampType | int = TimestampType.CREATE_TIME,
        producer_id: int = NO_PRODUCER_ID,
        producer_epoch: int = NO_PRODUCER_EPOCH,
        base_sequence: int = NO_SEQUENCE,
        is_transactional: bool = False,
        is_control_batch: bool = False,
        partition_leader_epoch: int = NO_PARTITION_LEADER_EPOCH,
        delete_horizon_ms: int | None = None,
        log_append_time_ms: int | None = None,
    ) -> None:
        _check_range("base_offset", base_offset, 0, INT64_MAX)
        _check_range("producer_id", producer_id, -(2**63), INT64_MAX)
        _check_range("producer_epoch", producer_epoch, -(2**15), 2**15 - 1)
        _check_range("base_sequence", base_sequence, -(2**31), INT32_MAX)
        _check_range("partition_leader_epoch", partition_leader_epoch, -(2**31), INT32_MAX)
        if delete_horizon_ms == NO_TIMESTAMP:
            delete_horizon_ms = None
        if delete_horizon_ms is not None:
            _check_range("delete_horizon_ms", delete_horizon_ms, 0, INT64_MAX)
        if log_append_time_ms is not None:
            _check_range("log_append_time_ms", log_append_time_ms, NO_TIMESTAMP, INT64_MAX)
        self.base_offset = base_offset
        self.compression = CompressionType(compression)
        self.timestamp_type = TimestampType(timestamp_type)
        self.producer_id = producer_id
        self.producer_epoch = producer_epoch
        self.base_sequence = base_sequence
        self.is_transactional = bool(is_transactional)
        self.is_control_batch = bool(is_control_batch)
        self.partition_leader_epoch = partition_leader_epoch
        self.delete_horizon_ms = delete_horizon_ms
        self.log_append_time_ms = log_append_time_ms
        self._body = bytearray()
        self._count = 0
        self._last_offset: int | None = None
        self._base_timestamp: int | None = delete_horizon_ms
        self._max_timestamp = NO_TIMESTAMP

    @classmethod
    def like(cls, fields: BatchHeaderFields, *, delete_horizon_ms: int | None) -> "RecordBatchBuilder":
        """A builder for a rewritten copy of the batch whose header is ``fields`` (Kafka
        ``MemoryRecords.buildRetainedRecordsInto``): same base offset, codec, timestamp type,
        producer id, epoch and base sequence, transactional and control flags and partition
        leader epoch; a LogAppendTime batch keeps its log-append time (MaxTimestamp).
        ``delete_horizon_ms`` (ms, or None for none) becomes the copy's delete horizon.

        Raises:
            ValueError: as the constructor, or codec ids 5-7 in ``fields.attributes``.
        """
        timestamp_type = fields.timestamp_type
        return cls(
            fields.base_offset,
            compression=fields.compression,
            timestamp_type=timestamp_type,
            producer_id=fields.producer_id,
            producer_epoch=fields.producer_epoch,
            base_sequence=fields.base_sequence,
            is_transactional=fields.is_transactional,
            is_control_batch=fields.is_control_batch,
            partition_leader_epoch=fields.partition_leader_epoch,
            delete_horizon_ms=delete_horizon_ms,
            log_append_time_ms=fields.max_timestamp if timestamp_type == TimestampType.LOG_APPEND_TIME else None,
        )

    @property
    def is_empty(self) -> bool:
        return self._count == 0

    @property
    def records_count(self) -> int:
        return self._count

    @property
    def last_offset(self) -> int | None:
        """Offset of the last appended record, ``None`` before the first append."""
        return self._last_offset

    @property
    def estimated_size_in_bytes(self) -> int:
        """Header plus uncompressed record bytes so far (an upper estimate when compressing)."""
        return RECORD_BATCH_OVERHEAD + len(self._body)

    def append(
        self,
        offset: int,
        timestamp: int,
        key: bytes | bytearray | memoryview | None,
        value: bytes | bytearray | memoryview | None,
        headers: Sequence[tuple[str, bytes | None]] = (),
    ) -> None:
        """Append one record at absolute ``offset`` with ``timestamp`` (ms).

        Raises:
            ValueError: offset not above the previous one or below ``base_offset``,
                offset delta beyond int32, negative timestamp other than -1, or a header
                key that is not a ``str``.
        """
        last = self._last_offset
        if last is not None and offset <= last:
            raise ValueError(
                f"illegal offset {offset} following previous offset {last} (offsets must increase monotonically)"
            )
        offset_delta = offset - self.base_offset
        if offset_delta < 0 or offset_delta > INT32_MAX:
            raise ValueError(
                f"offset {offset} is outside [base_offset, base_offset + 2**31 - 1] for base offset {self.base_offset}"
            )
        if timestamp < 0 and timestamp != NO_TIMESTAMP:
            raise ValueError(f"invalid negative timestamp {timestamp}")
        base_timestamp = self._base_timestamp
        if base_timestamp is None:
            base_timestamp = self._base_timestamp = timestamp
        body = bytearray(b"\x00")  # Attributes => Int8
        body += encode_varint(timestamp - base_timestamp)
        body += encode_varint(offset_delta)
        if key is None:
            body += b"\x01"  # zig-zag -1
        else:
            body += encode_varint(len(key))
            body += key
        if value is None:
            body += b"\x01"
        else:
            body += encode_varint(len(value))
            body += value
        if headers:
            _encode_headers(headers, body)
        else:
            body += b"\x00"
        out = self._body
        out += encode_varint(len(body))
        out += body
        self._count += 1
        self._last_offset = offset
        if timestamp > self._max_timestamp:
            self._max_timestamp = timestamp

    def append_record(self, record: Record) -> None:
        """Append ``record`` at its own offset and timestamp (see :meth:`append`)."""
        self.append(record.offset, record.timestamp, record.key, record.value, record.headers)

    def build(self, last_offset: int | None = None) -> bytes:
        """Return the finished batch bytes; ``b""`` if no record was appended.

        ``last_offset`` overrides LastOffsetDelta (``MemoryRecordsBuilder.overrideLastOffset``),
        so a cleaned batch keeps the original batch's offset and sequence range.

        Raises:
            ValueError: ``last_offset`` below the last appended offset or beyond int32 delta;
                invalid producer state (transactional without producer id, producer id
                without epoch, or without base sequence outside a control batch).
        """
        appended_last_offset, base_timestamp = self._last_offset, self._base_timestamp
        if appended_last_offset is None or base_timestamp is None:  # nothing appended
            return b""
        self._validate_producer_state()
        if last_offset is None:
            last_offset = appended_last_offset
        elif last_offset < appended_last_offset:
            raise ValueError(f"last_offset {last_offset} is below the last appended offset {appended_last_offset}")
        last_offset_delta = last_offset - self.base_offset
        if last_offset_delta > INT32_MAX:
            raise ValueError(f"last_offset {last_offset} is more than 2**31 - 1 above base offset {self.base_offset}")
        records_section: bytes | bytearray
        if self.compression == CompressionType.NONE:
            records_section = self._body
        else:
            records_section = compress(self.compression, self._body)
        if self.timestamp_type == TimestampType.LOG_APPEND_TIME:
            max_timestamp = self.log_append_time_ms
            if max_timestamp is None:
                max_timestamp = self._max_timestamp
        else:
            max_timestamp = self._max_timestamp
        attributes = _attributes(
            self.compression,
            self.timestamp_type,
            self.is_transactional,
            self.is_control_batch,
            self.delete_horizon_ms is not None,
        )
        fields = BatchHeaderFields(
            self.base_offset, last_offset_delta, attributes, self.partition_leader_epoch, base_timestamp,
            max_timestamp, self.producer_id, self.producer_epoch, self.base_sequence,
        )
        return _pack_batch(fields, self._count, records_section)

    def _validate_producer_state(self) -> None:
        if self.is_transactional and self.producer_id == NO_PRODUCER_ID:
            raise ValueError("cannot write transactional messages without a valid producer ID")
        if self.producer_id != NO_PRODUCER_ID:
            if self.producer_epoch == NO_PRODUCER_EPOCH:
                raise ValueError("invalid negative producer epoch")
            if self.base_sequence < 0 and not self.is_control_batch:
                raise ValueError("invalid negative sequence number used")


def _encode_headers(headers: Sequence[tuple[str, bytes | None]], out: bytearray) -> None:
    out += encode_varint(len(headers))
    for header_key, header_value in headers:
        if not isinstance(header_key, str):
            raise ValueError(f"record header key must be a str, got {type(header_key).__name__}")
        encoded_key = header_key.encode("utf-8")
        out += encode_varint(len(encoded_key))
        out += encoded_key
        if header_value is None:
            out += b"\x01"
        else:
            out += encode_varint(len(header_value))
            out += header_value


def _check_range(name: str, value: int, low: int, high: int) -> None:
    if not isinstance(value, int) or not low <= value <= high:
        raise ValueError(f"{name} must be an integer in [{low}, {high}], got {value!r}")


def _attributes(
    compression: CompressionType,
    timestamp_type: TimestampType,
    is_transactional: bool,
    is_control_batch: bool,
    has_delete_horizon: bool,
) -> int:
    """Attributes word (``DefaultRecordBatch.computeAttributes``)."""
    attributes = int(compression) & COMPRESSION_CODEC_MASK
    if timestamp_type == TimestampType.LOG_APPEND_TIME:
        attributes |= TIMESTAMP_TYPE_MASK
    if is_transactional:
        attributes |= TRANSACTIONAL_FLAG_MASK
    if is_control_batch:
        attributes |= CONTROL_FLAG_MASK
    if has_delete_horizon:
        attributes |= DELETE_HORIZON_FLAG_MASK
    return attributes


def _pack_batch(fields: BatchHeaderFields, records_count: int, records_section: bytes | bytearray) -> bytes:
    """The 61-byte header of ``fields`` with ``records_count``, Length and CRC-32C filled in, then
    ``records_section`` (as stored: compressed when the codec is not none) (Kafka
    ``DefaultRecordBatch.writeHeader``)."""
    size = RECORD_BATCH_OVERHEAD + len(records_section)
    header = bytearray(
        HEADER_STRUCT.pack(
            fields.base_offset,  # BaseOffset
            size - LOG_OVERHEAD,  # Length
            fields.partition_leader_epoch,  # PartitionLeaderEpoch
            CURRENT_MAGIC_VALUE,  # Magic
            0,  # CRC, filled in below
            fields.attributes,  # Attributes
            fields.last_offset_delta,  # LastOffsetDelta
            fields.base_timestamp,  # BaseTimestamp
            fields.max_timestamp,  # MaxTimestamp
            fields.producer_id,  # ProducerId
            fields.producer_epoch,  # ProducerEpoch
            fields.base_sequence,  # BaseSequence
            records_count,  # RecordsCount
        )
    )
    crc = crc32c.crc32c(records_section, crc32c.crc32c(memoryview(header)[ATTRIBUTES_OFFSET:]))
    _CRC_STRUCT.pack_into(header, CRC_OFFSET, crc)
    return bytes(header + records_section)


def _check_last_offset_delta(fields: BatchHeaderFields) -> None:
    if not 0 <= fields.last_offset_delta <= INT32_MAX:
        raise ValueError(f"last_offset {fields.last_offset} must be in [base_offset, base_offset + 2**31 - 1]")


def build_batch_from_section(fields: BatchHeaderFields, records_count: int, records_section: bytes) -> bytes:
    """A v2 batch with header ``fields`` around ``records_section`` (``records_count`` uncompressed
    ``DefaultRecord``s whose offset deltas are relative to ``fields.base_offset`` and timestamp
    deltas to ``fields.base_timestamp``), compressed with the codec of ``fields.attributes`` and
    with its CRC; what :meth:`RecordBatchBuilder.build` writes for the same records
    (``MemoryRecordsBuilder`` with an overridden last offset).

    Raises:
        ValueError: ``fields.last_offset_delta`` outside ``[0, 2**31 - 1]``, or codec ids 5-7.
    """
    _check_last_offset_delta(fields)
    compression = fields.compression
    if compression != CompressionType.NONE:
        records_section = compress(compression, records_section)
    return _pack_batch(fields, records_count, records_section)


def build_empty_batch(fields: BatchHeaderFields) -> bytes:
    """A 61-byte batch with no records (``DefaultRecordBatch.writeEmptyHeader``).

    Kept by the cleaner to preserve producer state. From ``fields`` it takes BaseOffset,
    LastOffsetDelta, PartitionLeaderEpoch, MaxTimestamp (the emptied batch's), the producer
    id, epoch and base sequence, and the timestamp type, transactional and control bits;
    as Kafka writes it, the codec is none, BaseTimestamp -1, no delete horizon, RecordsCount 0.

    Raises:
        ValueError: a negative base offset, or ``fields.last_offset_delta`` outside
            ``[0, 2**31 - 1]``.
    """
    _check_range("base_offset", fields.base_offset, 0, INT64_MAX)
    _check_last_offset_delta(fields)
    empty = replace(
        fields,
        attributes=fields.attributes & (TIMESTAMP_TYPE_MASK | TRANSACTIONAL_FLAG_MASK | CONTROL_FLAG_MASK),
        base_timestamp=NO_TIMESTAMP,
    )
    return _pack_batch(empty, 0, b"")


def estimate_record_size_upper_bound(record: Record) -> int:
    """Upper bound of ``record``'s encoded size in a v2 batch, bytes (``DefaultRecord``: length,
    attributes, deltas and lengths as varints of at most 5-10 bytes; header names in UTF-8,
    at most 3 bytes per character)."""
    size = 40 + len(record.key or b"") + len(record.value or b"")
    for name, value in record.headers:
        size += 10 + len(name) * 3 + len(value or b"")
    return size
