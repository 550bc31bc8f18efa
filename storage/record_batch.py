"""Kafka v2 record batches (magic 2): reader, builder and file-level framing.

Mirrors ``org.apache.kafka.common.record.internal.DefaultRecordBatch``, ``DefaultRecord``,
``MemoryRecordsBuilder`` and ``FileLogInputStream``. Only magic 2 is
supported; legacy magic 0/1 message sets are rejected. Layout, all integers big-endian::

    RecordBatch =>
      BaseOffset => Int64
      Length => Int32                  batch size in bytes - 12 (LOG_OVERHEAD)
      PartitionLeaderEpoch => Int32    not covered by the CRC
      Magic => Int8                    2
      CRC => Uint32                    CRC-32C over [Attributes, end of batch)
      Attributes => Int16
      LastOffsetDelta => Int32         also the last sequence delta
      BaseTimestamp => Int64           first record's timestamp, -1 if empty, or the
                                       delete horizon when attribute bit 6 is set (KIP-534)
      MaxTimestamp => Int64            the log-append time for LogAppendTime batches
      ProducerId => Int64
      ProducerEpoch => Int16
      BaseSequence => Int32
      RecordsCount => Int32
      Records => [Record]              compressed as one stream when the codec is not none

    Attributes => bits 0-2 compression codec | bit 3 timestamp type (1 = LogAppendTime)
                | bit 4 transactional | bit 5 control | bit 6 delete horizon | 7-15 unused

    Record =>
      Length => Varint                 bytes after this field
      Attributes => Int8               unused, 0
      TimestampDelta => Varlong        record timestamp - BaseTimestamp
      OffsetDelta => Varint            record offset - BaseOffset
      KeyLength => Varint              -1 = null key
      Key => Bytes
      ValueLength => Varint            -1 = null value (tombstone)
      Value => Bytes
      HeadersCount => Varint
      Headers => [HeaderKeyLength => Varint, HeaderKey => UTF-8 String,
                  HeaderValueLength => Varint (-1 = null), HeaderValue => Bytes]

The builder (``RecordBatchBuilder``, ``build_empty_batch``) is in ``record_batch_builder``.

Record timestamps (``DefaultRecordBatch.RecordIterator``/``DefaultRecord.readFrom``):
``BaseTimestamp + TimestampDelta``, also for delete-horizon batches because
``MemoryRecordsBuilder`` computes the deltas against the horizon it stores there; in a
LogAppendTime batch every record's timestamp is the batch's MaxTimestamp.
"""

from __future__ import annotations

import mmap
import struct
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from enum import IntEnum
from typing import NamedTuple

import crc32c

from . import _native
from .compression import CompressionType, decompress
from .errors import CorruptRecordError
from .varint import INT32_MAX

__all__ = [
    "ATTRIBUTES_OFFSET",
    "BASE_OFFSET_OFFSET",
    "BASE_SEQUENCE_OFFSET",
    "BASE_TIMESTAMP_OFFSET",
    "BatchHeader",
    "BatchHeaderFields",
    "COMPRESSION_CODEC_MASK",
    "CONTROL_FLAG_MASK",
    "CRC_OFFSET",
    "CURRENT_MAGIC_VALUE",
    "DELETE_HORIZON_FLAG_MASK",
    "HEADER_SIZE_UP_TO_MAGIC",
    "HEADER_STRUCT",
    "LAST_OFFSET_DELTA_OFFSET",
    "LENGTH_OFFSET",
    "LOG_OVERHEAD",
    "MAGIC_OFFSET",
    "MAX_RECORD_OVERHEAD",
    "MAX_TIMESTAMP_OFFSET",
    "NO_PARTITION_LEADER_EPOCH",
    "NO_PRODUCER_EPOCH",
    "NO_PRODUCER_ID",
    "NO_SEQUENCE",
    "NO_TIMESTAMP",
    "PARTITION_LEADER_EPOCH_OFFSET",
    "PRODUCER_EPOCH_OFFSET",
    "PRODUCER_ID_OFFSET",
    "RECORDS_COUNT_OFFSET",
    "RECORDS_OFFSET",
    "RECORD_BATCH_OVERHEAD",
    "RECORD_OVERHEAD_V0",
    "Record",
    "RecordBatch",
    "TIMESTAMP_TYPE_MASK",
    "TRANSACTIONAL_FLAG_MASK",
    "TimestampType",
    "increment_sequence",
    "iter_batches",
]

# One entry per header field, in order: (struct format character, Kafka field name).
_HEADER_FIELDS = (
    ("q", "BaseOffset"),  # Int64
    ("i", "Length"),  # Int32
    ("i", "PartitionLeaderEpoch"),  # Int32
    ("b", "Magic"),  # Int8
    ("I", "CRC"),  # Uint32
    ("h", "Attributes"),  # Int16
    ("i", "LastOffsetDelta"),  # Int32
    ("q", "BaseTimestamp"),  # Int64
    ("q", "MaxTimestamp"),  # Int64
    ("q", "ProducerId"),  # Int64
    ("h", "ProducerEpoch"),  # Int16
    ("i", "BaseSequence"),  # Int32
    ("i", "RecordsCount"),  # Int32
)
HEADER_STRUCT = struct.Struct(">" + "".join(fmt for fmt, _ in _HEADER_FIELDS))
"""The 61-byte v2 batch header (``DefaultRecordBatch.writeHeader``)."""


def _field_offset(name: str) -> int:
    """Byte offset of a header field, derived from the formats of the fields before it."""
    formats = [fmt for fmt, _ in _HEADER_FIELDS]
    index = [field for _, field in _HEADER_FIELDS].index(name)
    return struct.calcsize(">" + "".join(formats[:index]))


BASE_OFFSET_OFFSET = _field_offset("BaseOffset")  # 0
LENGTH_OFFSET = _field_offset("Length")  # 8
PARTITION_LEADER_EPOCH_OFFSET = _field_offset("PartitionLeaderEpoch")  # 12
MAGIC_OFFSET = _field_offset("Magic")  # 16
CRC_OFFSET = _field_offset("CRC")  # 17
ATTRIBUTES_OFFSET = _field_offset("Attributes")  # 21
LAST_OFFSET_DELTA_OFFSET = _field_offset("LastOffsetDelta")  # 23
BASE_TIMESTAMP_OFFSET = _field_offset("BaseTimestamp")  # 27
MAX_TIMESTAMP_OFFSET = _field_offset("MaxTimestamp")  # 35
PRODUCER_ID_OFFSET = _field_offset("ProducerId")  # 43
PRODUCER_EPOCH_OFFSET = _field_offset("ProducerEpoch")  # 51
BASE_SEQUENCE_OFFSET = _field_offset("BaseSequence")  # 53
RECORDS_COUNT_OFFSET = _field_offset("RecordsCount")  # 57
RECORDS_OFFSET = HEADER_STRUCT.size  # 61
RECORD_BATCH_OVERHEAD = RECORDS_OFFSET
LOG_OVERHEAD = LENGTH_OFFSET + 4
"""BaseOffset + Length: bytes of a batch not counted in its Length (``Records.LOG_OVERHEAD``)."""
HEADER_SIZE_UP_TO_MAGIC = MAGIC_OFFSET + 1
"""Bytes ``FileLogInputStream`` reads to frame a batch (``Records.HEADER_SIZE_UP_TO_MAGIC``)."""
RECORD_OVERHEAD_V0 = 14
"""Smallest legal Length field (``LegacyRecord.RECORD_OVERHEAD_V0``)."""
MAX_RECORD_OVERHEAD = 21
"""Upper bound of a record's framing bytes (``DefaultRecord.MAX_RECORD_OVERHEAD``)."""
CURRENT_MAGIC_VALUE = 2

_UP_TO_MAGIC_STRUCT = struct.Struct(">qiib")  # BaseOffset, Length, PartitionLeaderEpoch, Magic
_LENGTH_STRUCT = struct.Struct(">i")
_CRC_STRUCT = struct.Struct(">I")

COMPRESSION_CODEC_MASK = 0x07
_CODECS = tuple(CompressionType)  # by codec id: 0 none ... 4 zstd
assert all(codec == i for i, codec in enumerate(_CODECS))
TIMESTAMP_TYPE_MASK = 0x08
TRANSACTIONAL_FLAG_MASK = 0x10
CONTROL_FLAG_MASK = 0x20
DELETE_HORIZON_FLAG_MASK = 0x40

NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
NO_SEQUENCE = -1
NO_TIMESTAMP = -1
NO_PARTITION_LEADER_EPOCH = -1


class TimestampType(IntEnum):
    """Kafka ``TimestampType`` as stored in attribute bit 3 of a v2 batch."""

    CREATE_TIME = 0
    LOG_APPEND_TIME = 1


class BatchHeader(NamedTuple):
    """The 61-byte v2 batch header, field by field (Kafka names in snake_case)."""

    base_offset: int
    length: int
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    records_count: int


_WRITTEN_ATTRIBUTE_BITS = (
    COMPRESSION_CODEC_MASK | TIMESTAMP_TYPE_MASK | TRANSACTIONAL_FLAG_MASK | CONTROL_FLAG_MASK | DELETE_HORIZON_FLAG_MASK
)


@dataclass(frozen=True, slots=True)
class BatchHeaderFields:
    """The v2 batch header fields a writer chooses (Kafka ``DefaultRecordBatch.writeHeader``'s
    arguments); Length, Magic, CRC and RecordsCount follow from the records written.

    One value for every batch writer (``RecordBatchBuilder.build``, ``build_batch_from_section``,
    ``build_empty_batch``) and for the cleaner's rewritten copies of a batch
    (:meth:`of` a batch read back, changed with :func:`dataclasses.replace`).

    Attributes (Kafka ``DefaultRecordBatch`` field, type, unit):
        base_offset: BaseOffset, Int64, the first offset of the batch.
        last_offset_delta: LastOffsetDelta, Int32, last offset - base offset (also the delta of
            the last sequence number).
        attributes: Attributes, Int16: bits 0-2 codec, 3 timestamp type (1 = LogAppendTime),
            4 transactional, 5 control, 6 delete horizon set (KIP-534).
        partition_leader_epoch: PartitionLeaderEpoch, Int32 (-1: none).
        base_timestamp: BaseTimestamp, Int64, ms: the first record's timestamp, the delete
            horizon when bit 6 is set, -1 in an empty batch.
        max_timestamp: MaxTimestamp, Int64, ms: the largest record timestamp, or the
            log-append time of a LogAppendTime batch.
        producer_id: ProducerId, Int64 (-1: none).
        producer_epoch: ProducerEpoch, Int16 (-1: none).
        base_sequence: BaseSequence, Int32 (-1: none).
    """

    base_offset: int
    last_offset_delta: int = 0
    attributes: int = 0
    partition_leader_epoch: int = NO_PARTITION_LEADER_EPOCH
    base_timestamp: int = NO_TIMESTAMP
    max_timestamp: int = NO_TIMESTAMP
    producer_id: int = NO_PRODUCER_ID
    producer_epoch: int = NO_PRODUCER_EPOCH
    base_sequence: int = NO_SEQUENCE

    @classmethod
    def of(cls, header: BatchHeader, *, attributes: int | None = None, base_timestamp: int | None = None,
           max_timestamp: int | None = None) -> "BatchHeaderFields":
        """The fields of a batch read back, which a copy of it starts from (Kafka
        ``MemoryRecords.buildRetainedRecordsInto`` and ``DefaultRecordBatch.writeEmptyHeader``
        take them from the original batch), with ``attributes`` / ``base_timestamp`` /
        ``max_timestamp`` (ms) replaced when given: one construction, as the cleaner makes one per
        rewritten batch. Attribute bits 7-15, which no Kafka writer sets, are not carried over."""
        return cls(
            header.base_offset, header.last_offset_delta,
            (header.attributes if attributes is None else attributes) & _WRITTEN_ATTRIBUTE_BITS,
            header.partition_leader_epoch,
            header.base_timestamp if base_timestamp is None else base_timestamp,
            header.max_timestamp if max_timestamp is None else max_timestamp,
            header.producer_id, header.producer_epoch, header.base_sequence,
        )

    @property
    def last_offset(self) -> int:
        """``base_offset + last_offset_delta``."""
        return self.base_offset + self.last_offset_delta

    @property
    def compression(self) -> CompressionType:
        """The codec of attribute bits 0-2.

        Raises:
            ValueError: codec ids 5-7 (none is defined).
        """
        return CompressionType(self.attributes & COMPRESSION_CODEC_MASK)

    @property
    def timestamp_type(self) -> "TimestampType":
        """Attribute bit 3: ``LOG_APPEND_TIME`` when set, else ``CREATE_TIME``."""
        return TimestampType.LOG_APPEND_TIME if self.attributes & TIMESTAMP_TYPE_MASK else TimestampType.CREATE_TIME

    @property
    def is_transactional(self) -> bool:
        """Attribute bit 4."""
        return bool(self.attributes & TRANSACTIONAL_FLAG_MASK)

    @property
    def is_control_batch(self) -> bool:
        """Attribute bit 5."""
        return bool(self.attributes & CONTROL_FLAG_MASK)


class Record:
    """One record of a v2 batch with absolute offset and timestamp (Kafka ``DefaultRecord``).

    ``offset`` is absolute, ``timestamp`` in ms since the epoch (``NO_TIMESTAMP`` = -1
    allowed), ``key``/``value`` bytes or ``None`` (a ``None`` value is a tombstone),
    ``headers`` a tuple of ``(str key, bytes | None value)`` pairs. Equality and hash
    cover all five fields.
    """

    __slots__ = ("offset", "timestamp", "key", "value", "headers")

    def __init__(
        self,
        offset: int,
        timestamp: int,
        key: bytes | None,
        value: bytes | None,
        headers: Iterable[tuple[str, bytes | None]] = (),
    ) -> None:
        self.offset = offset
        self.timestamp = timestamp
        self.key = key
        self.value = value
        self.headers = headers if type(headers) is tuple else tuple((k, v) for k, v in headers)

    def _fields(self) -> tuple:
        return (self.offset, self.timestamp, self.key, self.value, self.headers)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Record):
            return NotImplemented
        return self._fields() == other._fields()

    def __hash__(self) -> int:
        return hash(self._fields())

    def __repr__(self) -> str:
        return (
            f"Record(offset={self.offset}, timestamp={self.timestamp}, key={self.key!r}, "
            f"value={self.value!r}, headers={self.headers!r})"
        )


class RecordBatch:
    """A read-only view over exactly one v2 batch's bytes (Kafka ``DefaultRecordBatch``).

    Construction only reads the Length field; the header is unpacked on first use.
    The CRC is not checked until :meth:`is_valid`/:meth:`ensure_valid` is called.
    ``path``/``position`` (file and byte position of the batch) only label errors.

    Raises:
        CorruptRecordError: the buffer is shorter than the batch's Length field claims,
            or (on header access) shorter than the 61-byte header.
    """

    __slots__ = ("_buffer", "_header", "path", "position")

    def __init__(
        self,
        buffer: bytes | bytearray | memoryview,
        *,
        path: str | None = None,
        position: int | None = None,
    ) -> None:
        view = buffer if isinstance(buffer, memoryview) else memoryview(buffer)
        if view.format != "B" or view.ndim != 1:
            view = view.cast("B")
        self.path = None if path is None else str(path)
        self.position = position
        if len(view) < LOG_OVERHEAD:
            raise CorruptRecordError(
                f"record batch buffer of {len(view)} bytes is shorter than the {LOG_OVERHEAD}-byte log overhead",
                path=self.path,
                position=position,
            )
        size = _LENGTH_STRUCT.unpack_from(view, LENGTH_OFFSET)[0] + LOG_OVERHEAD
        if size < LOG_OVERHEAD or size > len(view):
            raise CorruptRecordError(
                f"record batch claims {size} bytes but the buffer holds {len(view)}",
                path=self.path,
                position=position,
            )
        self._buffer = view if size == len(view) else view[:size]
        self._header: BatchHeader | None = None

    def corruption_error(self, message: str) -> CorruptRecordError:
        """A :class:`CorruptRecordError` with ``message``, naming this batch's file and byte position."""
        return CorruptRecordError(message, path=self.path, position=self.position)

    @property
    def header(self) -> BatchHeader:
        """All 13 header fields (raises CorruptRecordError if the batch is under 61 bytes)."""
        header = self._header
        if header is None:
            if len(self._buffer) < RECORD_BATCH_OVERHEAD:
                raise self.corruption_error(
                    f"record batch is corrupt (the size {len(self._buffer)} is smaller than "
                    f"the minimum allowed overhead {RECORD_BATCH_OVERHEAD})"
                )
            header = self._header = BatchHeader._make(HEADER_STRUCT.unpack_from(self._buffer, 0))
        return header

    @property
    def buffer(self) -> memoryview:
        """The whole batch, header included (``size_in_bytes`` bytes)."""
        return self._buffer

    @property
    def size_in_bytes(self) -> int:
        """Total bytes of the batch on disk: Length + 12."""
        return len(self._buffer)

    @property
    def base_offset(self) -> int:
        return self.header.base_offset

    @property
    def last_offset(self) -> int:
        """``base_offset + last_offset_delta`` (kept through compaction)."""
        header = self.header
        return header.base_offset + header.last_offset_delta

    @property
    def next_offset(self) -> int:
        return self.last_offset + 1

    @property
    def magic(self) -> int:
        return self._buffer[MAGIC_OFFSET]

    @property
    def crc(self) -> int:
        """The stored CRC-32C (uint32)."""
        return self.header.crc

    @property
    def attributes(self) -> int:
        return self.header.attributes

    @property
    def compression_type(self) -> CompressionType:
        """Raises CorruptRecordError for codec ids 5-7."""
        codec = self.header.attributes & COMPRESSION_CODEC_MASK
        if codec < len(_CODECS):
            return _CODECS[codec]  # an Enum call costs ~1 us, twice per batch in the cleaner
        raise self.corruption_error(f"unknown compression codec id {codec}")

    @property
    def timestamp_type(self) -> TimestampType:
        if self.header.attributes & TIMESTAMP_TYPE_MASK:
            return TimestampType.LOG_APPEND_TIME
        return TimestampType.CREATE_TIME

    @property
    def is_transactional(self) -> bool:
        return bool(self.header.attributes & TRANSACTIONAL_FLAG_MASK)

    @property
    def is_control_batch(self) -> bool:
        return bool(self.header.attributes & CONTROL_FLAG_MASK)

    @property
    def has_delete_horizon(self) -> bool:
        return bool(self.header.attributes & DELETE_HORIZON_FLAG_MASK)

    @property
    def delete_horizon_ms(self) -> int | None:
        """The KIP-534 delete horizon (ms) stored in BaseTimestamp, or ``None`` if bit 6 is clear."""
        header = self.header
        return header.base_timestamp if header.attributes & DELETE_HORIZON_FLAG_MASK else None

    @property
    def base_timestamp(self) -> int:
        return self.header.base_timestamp

    @property
    def max_timestamp(self) -> int:
        return self.header.max_timestamp

    @property
    def producer_id(self) -> int:
        return self.header.producer_id

    @property
    def producer_epoch(self) -> int:
        return self.header.producer_epoch

    @property
    def base_sequence(self) -> int:
        return self.header.base_sequence

    @property
    def last_sequence(self) -> int:
        """``base_sequence + last_offset_delta`` wrapping past int32 max (``incrementSequence``)."""
        header = self.header
        if header.base_sequence == NO_SEQUENCE:
            return NO_SEQUENCE
        return increment_sequence(header.base_sequence, header.last_offset_delta)

    @property
    def partition_leader_epoch(self) -> int:
        return self.header.partition_leader_epoch

    @property
    def records_count(self) -> int:
        return self.header.records_count

    def compute_crc(self) -> int:
        """CRC-32C over [ATTRIBUTES_OFFSET, end of batch), computed on the view (no copy)."""
        return crc32c.crc32c(self._buffer[ATTRIBUTES_OFFSET:])

    def is_valid(self) -> bool:
        """True if the batch holds a full header and its stored CRC matches (``isValid``)."""
        if len(self._buffer) < RECORD_BATCH_OVERHEAD:
            return False
        return self.crc == self.compute_crc()

    def ensure_valid(self, path: str | None = None, position: int | None = None) -> None:
        """Check size and CRC as ``DefaultRecordBatch.ensureValid`` does.

        ``path``/``position`` override the labels given at construction.

        Raises:
            CorruptRecordError: size under 61 bytes, or stored CRC != computed CRC
                (message names file, byte position, both CRCs).
        """
        path = self.path if path is None else str(path)
        position = self.position if position is None else position
        if len(self._buffer) < RECORD_BATCH_OVERHEAD:
            raise CorruptRecordError(
                f"record batch is corrupt (the size {len(self._buffer)} is smaller than "
                f"the minimum allowed overhead {RECORD_BATCH_OVERHEAD})",
                path=path,
                position=position,
            )
        stored = self.crc
        computed = self.compute_crc()
        if stored != computed:
            raise CorruptRecordError(
                f"record batch is corrupt (stored crc = {stored}, computed crc = {computed})",
                path=path,
                position=position,
            )

    def records(self) -> list[Record]:
        """Decompress and decode all records with absolute offsets and timestamps.

        Raises:
            CorruptRecordError: undecodable records section (bad codec stream, a record
                overrunning the batch, bytes left after RecordsCount records, ...).
        """
        header = self.header
        count = header.records_count
        if count == 0:
            return []
        if count < 0:
            raise self.corruption_error(f"found invalid record count {count} in magic v2 batch")
        codec = self.compression_type
        body = self._buffer[RECORDS_OFFSET:]
        data: bytes | memoryview
        if codec == CompressionType.NONE:
            data = body  # read in place by the native decoder
        else:
            try:
                data = decompress(codec, body)
            except ValueError as exc:
                raise self.corruption_error(f"failed to decompress record stream: {exc}") from exc
        if header.attributes & TIMESTAMP_TYPE_MASK:
            log_append_time = header.max_timestamp
        else:
            log_append_time = None
        try:
            return _decode_records(data, count, header.base_offset, header.base_timestamp, log_append_time)
        except (ValueError, IndexError, UnicodeDecodeError) as exc:
            raise self.corruption_error(f"invalid records in batch at base offset {header.base_offset}: {exc}") from exc

    def __iter__(self) -> Iterator[Record]:
        return iter(self.records())

    def __repr__(self) -> str:
        if len(self._buffer) < RECORD_BATCH_OVERHEAD:
            return f"RecordBatch(size={len(self._buffer)}, truncated header)"
        h = self.header
        return (
            f"RecordBatch(offsets=[{h.base_offset}, {self.last_offset}], count={h.records_count}, "
            f"size={len(self._buffer)}, compression={self.compression_type.name_kafka}, "
            f"timestamp_type={self.timestamp_type.name}, transactional={self.is_transactional}, "
            f"control={self.is_control_batch}, delete_horizon_ms={self.delete_horizon_ms}, crc={h.crc})"
        )


def increment_sequence(sequence: int, increment: int) -> int:
    """Kafka ``DefaultRecordBatch.incrementSequence``: ``sequence + increment``, wrapping past
    int32 max to 0 (producer sequences are int32)."""
    if sequence > INT32_MAX - increment:
        return increment - (INT32_MAX - sequence) - 1
    return sequence + increment


def _decode_records(
    data: bytes | memoryview, count: int, base_offset: int, base_timestamp: int, log_append_time: int | None
) -> list[Record]:
    """Decode ``count`` records from an uncompressed records section (``DefaultRecord.readFrom``).

    The loop over the bytes is the native core's (``_native.decode_records``); its framing
    checks and messages are those of the readable reference, :mod:`.record_reference`.
    Raises ValueError on malformed input.
    """
    offsets, timestamps, keys, values, headers = _native.decode_records(
        data, count, base_offset, base_timestamp, log_append_time)
    return list(map(Record, offsets, timestamps, keys, values, headers))


def iter_batches(
    buffer: bytes | bytearray | memoryview | mmap.mmap,
    start_position: int = 0,
    *,
    path: str | None = None,
) -> Iterator[tuple[int, RecordBatch]]:
    """Yield ``(position, batch)`` for each batch of a concatenation of batches (a .log file).

    Framing follows ``FileLogInputStream.nextBatch``: iteration stops silently when 17
    bytes (``HEADER_SIZE_UP_TO_MAGIC``) or fewer remain, or when the batch at the current
    position is incomplete (its Length reaches past the buffer, however large it is).
    CRCs are NOT checked here; call :meth:`RecordBatch.ensure_valid`. Each batch is a
    zero-copy memoryview slice of ``buffer`` (bytes, bytearray or mmap): it keeps the buffer
    alive, and an mmap cannot be closed while a batch still references it.

    Raises:
        CorruptRecordError: Length field < 14 (``RECORD_OVERHEAD_V0``) or magic != 2,
            naming ``path`` and the batch's byte position.
    """
    view = buffer if isinstance(buffer, memoryview) else memoryview(buffer)
    if view.format != "B" or view.ndim != 1:
        view = view.cast("B")
    label = None if path is None else str(path)
    end = len(view)
    position = start_position
    unpack_from = _UP_TO_MAGIC_STRUCT.unpack_from
    while position < end - HEADER_SIZE_UP_TO_MAGIC:
        _, length, _, magic = unpack_from(view, position)
        if length < RECORD_OVERHEAD_V0:
            raise CorruptRecordError(
                f"found record size {length} smaller than minimum record overhead ({RECORD_OVERHEAD_V0})",
                path=label,
                position=position,
            )
        size = length + LOG_OVERHEAD
        if position > end - size:
            return
        if magic != CURRENT_MAGIC_VALUE:
            raise CorruptRecordError(
                f"magic {magic} not supported (only v2 record batches can be read)",
                path=label,
                position=position,
            )
        yield position, RecordBatch(view[position : position + size], path=label, position=position)
        position += size
