"""The recopy filter of a cleaning round: which batches and records of a segment are kept
(Kafka ``Cleaner.cleanInto``, ``MemoryRecords.filterTo``, ``Cleaner.shouldRetainRecord``,
``MemoryRecords.buildRetainedRecordsInto``; Kafka 4.4).

Per batch (``checkBatchRetention``): the last batch of an active producer and the batch whose
next offset is the empty-batch upper bound are ``RETAIN_EMPTY``; aborted transactional data and
discardable markers past their delete horizon are ``DELETE``d whole; anything else is
``DELETE_EMPTY`` (dropped only if no record is retained). Per record (``shouldRetainRecord``):
see :mod:`.cleaner` for the rules and :func:`clean_into` for the fast paths.

The round itself (offset map, grouping, swap) is in :mod:`.cleaner`.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import compress
from operator import ge
from typing import TYPE_CHECKING, Callable

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
    RecordBatch,
    TimestampType,
)
from .record_batch_builder import RecordBatchBuilder, build_empty_batch
from .record_scan import decode_retained, record_ends, records_section, scan_keys

if TYPE_CHECKING:  # pragma: no cover
    from .segment import LogSegment

__all__ = ["DELETE", "DELETE_EMPTY", "RETAIN_EMPTY", "MappedSection", "check_fully_read", "clean_into", "rebuild_batch"]

# BatchRetention (MemoryRecords.RecordFilter.BatchRetention)
DELETE = 0
RETAIN_EMPTY = 1
DELETE_EMPTY = 2


@dataclass(frozen=True)
class MappedSection:
    """What a round's map pass knows about its offset map (see :func:`clean_into`)."""

    first_dirty_offset: int
    stored_offsets: set[int]
    simple_batches: set[tuple[int, int]]


def clean_into(
    tp: tuple[str, int],
    source: "LogSegment",
    dest: "LogSegment",
    offset_map: OffsetMap,
    delete_retention_ms: int,
    transaction_metadata: CleanedTransactionMetadata,
    active_producers: dict[int, LastRecord],
    empty_batch_upper_bound_offset: int,
    stats: CleanerStats,
    current_time_ms: int,
    protect_from_offset: int | None = None,
    mapped_section: "MappedSection | None" = None,
    *,
    check_done: Callable[[tuple[str, int]], None],
    io_buffer_size_bytes: int,
) -> None:
    """Filter ``source`` into ``dest`` (Kafka ``Cleaner.cleanInto`` + ``MemoryRecords.filterTo``).

    Records are decided from a keys-only scan (:func:`.record_scan.scan_keys`); only the kept
    records of a batch that changes are decoded. With ``mapped_section`` (the map was built by
    this round's ``build_offset_map``), a keyed record of a non-transactional data batch with
    an offset in ``[first_dirty_offset, latest_offset]`` was put into the map, so it is kept iff
    its offset is still stored there (``offset >= map.get(key)`` without hashing the key), and
    a batch the map pass found simple is decided from its offset range alone.
    """
    protect_from = 2**63 if protect_from_offset is None else protect_from_offset
    latest_offset = offset_map.latest_offset
    map_get = offset_map.get
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
        attributes = header.attributes
        is_control = bool(attributes & CONTROL_FLAG_MASK)
        producer_id = header.producer_id
        last_offset = header.base_offset + header.last_offset_delta
        horizon = header.base_timestamp if attributes & DELETE_HORIZON_FLAG_MASK else None

        # -- checkBatchRetention
        if is_control:
            can_discard = transaction_metadata.on_control_batch_read(batch)
            discard_batch_records = can_discard and horizon is not None and horizon <= current_time_ms
        elif attributes & TRANSACTIONAL_FLAG_MASK or transaction_metadata.has_pending_aborts:
            can_discard = discard_batch_records = transaction_metadata.on_batch_read(batch)
        else:  # non-transactional data with no aborted transaction ahead: never discarded
            can_discard = discard_batch_records = False
        last_record = active_producers.get(producer_id) if producer_id > -1 else None
        if last_record is None:
            is_last_of_producer = False
        elif last_record.last_data_offset is not None:
            is_last_of_producer = last_offset == last_record.last_data_offset
        else:
            is_last_of_producer = is_control and header.producer_epoch == last_record.producer_epoch
        if is_last_of_producer:
            retention = RETAIN_EMPTY
        elif last_offset + 1 == empty_batch_upper_bound_offset:
            retention = RETAIN_EMPTY
        elif discard_batch_records:
            retention = DELETE
        else:
            retention = DELETE_EMPTY
        contains_marker_for_empty_txn = can_discard and is_control

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

        # -- filterBatch / shouldRetainRecord
        base_offset = header.base_offset
        data = None  # set when ``retained`` holds record indices into this records section
        scan = None
        if is_control:
            records = batch.records()
            count = len(records)
            retained = [] if discard_batch_records else records
            write_original = True
            contains_tombstones = any(r.value is None for r in retained)
        elif (
            mapped_section is not None
            and last_offset <= latest_offset
            and (base_offset, header.crc) in mapped_section.simple_batches
        ):
            # simple batch (see build_offset_map): record i has offset base_offset + i and a key
            count = header.records_count
            offset_range = range(base_offset, last_offset + 1)
            stored = mapped_section.stored_offsets
            contains_tombstones = False
            if stored.issuperset(offset_range):
                retained = offset_range
                write_original = True
            else:
                write_original = False
                retained = sorted(stored.intersection(offset_range))
                if retained:
                    data = records_section(batch)
                    retained = [offset - base_offset for offset in retained]
        else:
            scan = scan_keys(batch)
            offsets = scan.offsets
            keys = scan.keys
            count = len(offsets)
            if discard_batch_records or count == 0:
                keep = []
            elif None not in keys:
                if (
                    mapped_section is not None
                    and not attributes & TRANSACTIONAL_FLAG_MASK
                    and min(offsets) >= mapped_section.first_dirty_offset
                    and max(offsets) <= latest_offset
                ):
                    keep = list(map(mapped_section.stored_offsets.__contains__, offsets))
                else:
                    keep = list(map(ge, offsets, offset_map.get_many(keys)))
                    if max(offsets) > latest_offset:
                        keep = [k or offset > latest_offset for k, offset in zip(keep, offsets)]
            else:
                keep = []
                for offset, record_key in zip(offsets, keys):
                    if offset > latest_offset:
                        keep.append(True)
                    elif record_key is None:
                        invalid += 1
                        keep.append(False)
                    else:
                        keep.append(offset >= map_get(record_key))
            contains_tombstones = False
            if keep:
                retain_deletes = horizon is None or current_time_ms < horizon
                for i in scan.tombstones:
                    if keep[i]:
                        if retain_deletes or offsets[i] > latest_offset:
                            contains_tombstones = True
                        else:
                            keep[i] = False
            write_original = all(keep)
            retained = list(compress(range(count), keep))
            data = scan.data
        messages_read += count

        if retained:
            need_horizon = (contains_tombstones or contains_marker_for_empty_txn) and horizon is None
            if write_original and not need_horizon:
                out_batch = batch
            else:
                if need_horizon:
                    # Java long arithmetic: an overflowing horizon is negative, i.e. none
                    horizon_ms = (current_time_ms + delete_retention_ms + 2**63) % 2**64 - 2**63
                    if horizon_ms < 0:
                        horizon_ms = None
                else:
                    horizon_ms = horizon
                if data is not None:  # kept record indices: decode only those
                    retained = decode_retained(batch, data, record_ends(data, count), retained)
                out_batch = RecordBatch(rebuild_batch(batch, retained, horizon_ms))
            messages_written += len(retained)
        elif retention == RETAIN_EMPTY:
            out_batch = RecordBatch(build_empty_batch(
                header.base_offset, last_offset, max_timestamp=header.max_timestamp,
                producer_id=producer_id, producer_epoch=header.producer_epoch,
                base_sequence=header.base_sequence, is_transactional=bool(attributes & TRANSACTIONAL_FLAG_MASK),
                is_control_batch=is_control, partition_leader_epoch=header.partition_leader_epoch,
                timestamp_type=batch.timestamp_type,
            ))
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

def rebuild_batch(batch: RecordBatch, retained: list, delete_horizon_ms: int | None) -> bytes:
    """``MemoryRecords.buildRetainedRecordsInto``: same header fields, retained records, last offset kept."""
    header = batch.header
    timestamp_type = batch.timestamp_type
    builder = RecordBatchBuilder(
        header.base_offset,
        compression=batch.compression_type,
        timestamp_type=timestamp_type,
        producer_id=header.producer_id,
        producer_epoch=header.producer_epoch,
        base_sequence=header.base_sequence,
        is_transactional=batch.is_transactional,
        is_control_batch=batch.is_control_batch,
        partition_leader_epoch=header.partition_leader_epoch,
        delete_horizon_ms=delete_horizon_ms,
        log_append_time_ms=header.max_timestamp if timestamp_type == TimestampType.LOG_APPEND_TIME else None,
    )
    for record in retained:
        builder.append(record.offset, record.timestamp, record.key, record.value, record.headers)
    return builder.build(last_offset=batch.last_offset)
