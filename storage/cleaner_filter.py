"""The recopy filter of a cleaning round: which batches and records of a segment are kept
(Kafka ``Cleaner.cleanInto``, ``MemoryRecords.filterTo``, ``Cleaner.shouldRetainRecord``,
``MemoryRecords.buildRetainedRecordsInto``).

Per batch (``checkBatchRetention`` -> :func:`check_batch_retention`, with ``shouldDiscardBatch``
-> :func:`should_discard_batch`): the last batch of an active producer and the batch whose
next offset is the empty-batch upper bound are ``RETAIN_EMPTY``; aborted transactional data and
discardable markers past their delete horizon are ``DELETE``d whole; anything else is
``DELETE_EMPTY`` (dropped only if no record is retained). Per record (``shouldRetainRecord`` ->
:func:`retain_records`, for a whole batch at once): see :mod:`.cleaner` for the rules. The
round's values travel in one frozen :class:`CleaningContext`.

The round itself (offset map, grouping, swap) is in :mod:`.cleaner`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, NamedTuple, Sequence

from .cleaned_transaction_metadata import CleanedTransactionMetadata
from .cleaner_stats import CleanerStats
from .errors import CorruptRecordError
from .offset_map import OffsetMap
from .producer_state_manager import LastRecord
from .record_batch import (
    CONTROL_FLAG_MASK,
    DELETE_HORIZON_FLAG_MASK,
    LOG_OVERHEAD,
    TRANSACTIONAL_FLAG_MASK,
    BatchHeaderFields,
    Record,
    RecordBatch,
)
from .record_batch_builder import RecordBatchBuilder, build_empty_batch
from .record_scan import encode_retained_batch, retained_by_map, scan_keys

if TYPE_CHECKING:  # pragma: no cover
    from .segment import LogSegment

__all__ = [
    "DELETE",
    "DELETE_EMPTY",
    "RETAIN_EMPTY",
    "BatchRetentionResult",
    "CleaningContext",
    "RetainedRecords",
    "check_batch_retention",
    "check_fully_read",
    "clean_into",
    "rebuild_batch",
    "retain_records",
    "should_discard_batch",
]

# BatchRetention (MemoryRecords.RecordFilter.BatchRetention)
DELETE = 0
RETAIN_EMPTY = 1
DELETE_EMPTY = 2


@dataclass(frozen=True)
class CleaningContext:
    """The values one cleaning round passes to every :func:`clean_into` call.

    Kafka captures them in the ``RecordFilter`` that ``Cleaner.cleanInto`` builds per segment.

    Attributes:
        topic_partition: ``(topic, partition)``, passed to ``check_done``.
        offset_map: key -> last offset of the round's dirty section.
        delete_retention_ms: ``delete.retention.ms``, for the delete horizon of new tombstones.
        active_producers: ``Log.last_records_of_active_producers`` at the start of the round.
        empty_batch_upper_bound_offset: a batch whose next offset equals it is kept, emptied if
            need be (the high watermark, or the round's first uncleanable offset).
        current_time_ms: the round's time; drives delete horizons.
        check_done: raises ``LogCleaningAbortedError`` when the round must stop.
        io_buffer_size_bytes: bytes read between two ``check_done`` calls.
        protect_from_offset: batches with base offset at or past it are copied verbatim
            (``2**63`` when the caller forced no first uncleanable offset).
    """

    topic_partition: tuple[str, int]
    offset_map: OffsetMap
    delete_retention_ms: int
    active_producers: dict[int, LastRecord]
    empty_batch_upper_bound_offset: int
    current_time_ms: int
    check_done: Callable[[tuple[str, int]], None]
    io_buffer_size_bytes: int
    protect_from_offset: int = 2**63


class BatchRetentionResult(NamedTuple):
    """Kafka ``RecordFilter.BatchRetentionResult`` plus the ``discardBatchRecords`` flag the record
    filter reads: ``retention`` is ``DELETE``, ``RETAIN_EMPTY`` or ``DELETE_EMPTY``."""

    retention: int
    discard_batch_records: bool
    contains_marker_for_empty_txn: bool


class RetainedRecords(NamedTuple):
    """The records of one batch the filter keeps (see :func:`retain_records`).

    ``records_count`` is how many records the batch holds; ``retained`` holds ``Record`` objects, or record indices into ``data`` (the batch's records
    section) when ``data`` is not None; ``write_original`` means every record is kept unchanged.
    """

    records_count: int
    retained: Sequence[Any]
    write_original: bool
    contains_tombstones: bool
    data: Any
    invalid: int


def should_discard_batch(batch: RecordBatch, attributes: int, transaction_metadata: CleanedTransactionMetadata) -> bool:
    """Kafka ``Cleaner.shouldDiscardBatch``: a control batch whose transaction is done, or a
    transactional data batch of an aborted transaction (``CleanedTransactionMetadata``).

    Non-transactional data with no aborted transaction ahead is never discarded (and the
    transaction metadata is not consulted for it).
    """
    if attributes & CONTROL_FLAG_MASK:
        return transaction_metadata.on_control_batch_read(batch)
    if attributes & TRANSACTIONAL_FLAG_MASK or transaction_metadata.has_pending_aborts:
        return transaction_metadata.on_batch_read(batch)
    return False


def check_batch_retention(context: CleaningContext, batch: RecordBatch,
                          transaction_metadata: CleanedTransactionMetadata) -> BatchRetentionResult:
    """Kafka ``RecordFilter.checkBatchRetention`` (in ``Cleaner.cleanInto``).

    A control batch's records are discarded only once its delete horizon (ms) has passed
    ``current_time_ms``; the last batch of an active producer (its last data offset, or its
    current-epoch marker when it has none) and the batch ending at
    ``empty_batch_upper_bound_offset`` are ``RETAIN_EMPTY``; else a discardable batch is
    ``DELETE`` and any other ``DELETE_EMPTY``.
    """
    header = batch.header
    attributes = header.attributes
    is_control = bool(attributes & CONTROL_FLAG_MASK)
    last_offset = header.base_offset + header.last_offset_delta
    can_discard = should_discard_batch(batch, attributes, transaction_metadata)
    if is_control:
        horizon = header.base_timestamp if attributes & DELETE_HORIZON_FLAG_MASK else None
        discard_batch_records = can_discard and horizon is not None and horizon <= context.current_time_ms
    else:
        discard_batch_records = can_discard
    producer_id = header.producer_id
    last_record = context.active_producers.get(producer_id) if producer_id > -1 else None
    if last_record is None:
        is_last_of_producer = False
    elif last_record.last_data_offset is not None:
        is_last_of_producer = last_offset == last_record.last_data_offset
    else:
        is_last_of_producer = is_control and header.producer_epoch == last_record.producer_epoch
    if is_last_of_producer:
        retention = RETAIN_EMPTY
    elif last_offset + 1 == context.empty_batch_upper_bound_offset:
        retention = RETAIN_EMPTY
    elif discard_batch_records:
        retention = DELETE
    else:
        retention = DELETE_EMPTY
    return BatchRetentionResult(retention, discard_batch_records, can_discard and is_control)


def retain_records(context: CleaningContext, batch: RecordBatch, discard_batch_records: bool) -> RetainedRecords:
    """Kafka ``RecordFilter.shouldRetainRecord`` for every record of ``batch``.

    A record is kept when its batch's records are not discarded and: its offset is past the map's
    latest offset; or it has a key whose offset is ``>= offset_map.get(key)`` (a null key counts
    as an invalid record and is dropped), and it is not a tombstone whose batch's delete horizon
    has passed. A control batch keeps its marker unless ``discard_batch_records``. Data records
    are decided by the map in one pass over the records section
    (:meth:`.offset_map.OffsetMap.kept_in_section`), whatever the map's kind.

    Raises:
        CorruptRecordError: the records section does not decode.
    """
    header = batch.header
    if header.attributes & CONTROL_FLAG_MASK:
        records = batch.records()
        retained = [] if discard_batch_records else records
        return RetainedRecords(len(records), retained, True, any(r.value is None for r in retained), None, 0)
    if discard_batch_records:  # read (and framing-checked) but none kept
        scan = scan_keys(batch)
        return RetainedRecords(len(scan.offsets), [], True, False, scan.data, 0)
    horizon = header.base_timestamp if header.attributes & DELETE_HORIZON_FLAG_MASK else None
    retain_deletes = horizon is None or context.current_time_ms < horizon  # KIP-534
    data, kept, contains_tombstones, invalid = retained_by_map(batch, context.offset_map, retain_deletes)
    return RetainedRecords(header.records_count, kept, len(kept) == header.records_count, contains_tombstones,
                           data, invalid)


def clean_into(context: CleaningContext, source: "LogSegment", dest: "LogSegment",
               transaction_metadata: CleanedTransactionMetadata, stats: CleanerStats) -> None:
    """Filter ``source`` into ``dest`` (Kafka ``Cleaner.cleanInto`` + ``MemoryRecords.filterTo``).

    Per batch: :func:`check_batch_retention`, then :func:`retain_records`; a batch whose records
    all stay (and needs no new delete horizon) is copied as it is, one that loses records is
    rebuilt from the kept ones (only those are decoded), and a ``RETAIN_EMPTY`` batch that keeps
    nothing is written as an empty batch. Updates ``stats`` (bytes and messages read/written).

    Raises:
        LogCleaningAbortedError: ``context.check_done`` aborted the round.
        CorruptRecordError: ``source`` ends in a batch that claims more bytes than are left.
    """
    tp = context.topic_partition
    check_done = context.check_done
    io_buffer_size_bytes = context.io_buffer_size_bytes
    protect_from = context.protect_from_offset
    append_to_dest = dest.append_batch
    bytes_since_check = 0
    end_position = 0
    bytes_read = bytes_written = messages_read = messages_written = invalid = 0
    check_done(tp)
    for position, batch in source.log.batches_from(0):
        header = batch.header
        size = header.length + LOG_OVERHEAD
        end_position = position + size
        if bytes_since_check >= io_buffer_size_bytes:
            check_done(tp)
            bytes_since_check = 0
        bytes_since_check += size
        retention, discard_batch_records, contains_marker_for_empty_txn = check_batch_retention(
            context, batch, transaction_metadata)

        bytes_read += size
        if header.base_offset >= protect_from:
            # past a caller-forced first uncleanable offset: kept as it is (transaction state above
            # still tracked, so kept ABORT markers are re-indexed in the cleaned .txnindex)
            messages_read += header.records_count
            messages_written += header.records_count
            bytes_written += size
            append_to_dest(batch)
            continue
        if retention == DELETE:
            continue

        count, retained, write_original, contains_tombstones, data, invalid_in_batch = retain_records(
            context, batch, discard_batch_records)
        invalid += invalid_in_batch
        messages_read += count

        attributes = header.attributes
        if retained:
            horizon = header.base_timestamp if attributes & DELETE_HORIZON_FLAG_MASK else None
            need_horizon = (contains_tombstones or contains_marker_for_empty_txn) and horizon is None
            if write_original and not need_horizon:
                out_batch = batch
            else:
                horizon_ms: int | None
                if need_horizon:
                    # Java long arithmetic: an overflowing horizon is negative, i.e. none
                    horizon_ms = (context.current_time_ms + context.delete_retention_ms + 2**63) % 2**64 - 2**63
                    if horizon_ms < 0:
                        horizon_ms = None
                else:
                    horizon_ms = horizon
                if data is not None:  # kept record indices: their bytes re-based, never decoded
                    out_batch = RecordBatch(encode_retained_batch(batch, data, list(retained), horizon_ms))
                else:
                    out_batch = RecordBatch(rebuild_batch(batch, list(retained), horizon_ms))
            messages_written += len(retained)
        elif retention == RETAIN_EMPTY:
            out_batch = RecordBatch(build_empty_batch(BatchHeaderFields.of(header)))
        else:
            continue
        bytes_written += out_batch.size_in_bytes
        # per batch appends index exactly like Kafka's per-chunk append (LogSegment indexes per batch)
        append_to_dest(out_batch)
    stats.bytes_read += bytes_read
    stats.bytes_written += bytes_written
    stats.messages_read += messages_read
    stats.messages_written += messages_written
    stats.invalid_messages_read += invalid
    check_fully_read(source, end_position)


def check_fully_read(source: "LogSegment", end_position: int) -> None:
    """Kafka fails a round on a trailing batch that claims more bytes than the segment has left.

    Raises:
        CorruptRecordError: ``end_position`` (end of the last complete batch) is before the
            segment's end.
    """
    size = source.size_in_bytes
    if end_position < size:
        head = source.log.read(end_position, LOG_OVERHEAD)
        claimed = int.from_bytes(head[8:12], "big", signed=True) + LOG_OVERHEAD if len(head) == LOG_OVERHEAD else "?"
        raise CorruptRecordError(
            f"Log segment may be corrupt, batch size {claimed} > {size - end_position} bytes left in segment",
            path=str(source.log_path), position=end_position,
        )

def rebuild_batch(batch: RecordBatch, retained: list[Record], delete_horizon_ms: int | None) -> bytes:
    """Kafka ``MemoryRecords.buildRetainedRecordsInto`` from decoded records: a copy of ``batch``
    with its header fields (:meth:`.record_batch.BatchHeaderFields.of`, last offset kept) holding
    the ``retained`` records, with the delete horizon ``delete_horizon_ms`` (ms; None: none).

    Raises:
        ValueError: ``retained`` records out of order or outside the batch's offset range.
    """
    fields = BatchHeaderFields.of(batch.header)
    builder = RecordBatchBuilder.like(fields, delete_horizon_ms=delete_horizon_ms)
    for record in retained:
        builder.append(record.offset, record.timestamp, record.key, record.value, record.headers)
    return builder.build(last_offset=fields.last_offset)
