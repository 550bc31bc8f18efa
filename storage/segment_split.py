"""Split an inactive segment at an offset so that the offset becomes a segment base offset.

Kafka's cleaner only ever stops a round at a segment base offset (its first uncleanable offset
is the active segment's base or a segment base chosen by ``min.compaction.lag.ms``), so records
from there on are never recopied. When a caller forces a first uncleanable offset ``N`` inside a
segment (``materializer compact --upto-offset N``), splitting that segment at ``N`` first keeps
the same property: the segment ``[N, next)`` is not touched by the round, byte for byte.

The split goes through ``.cleaned`` files and ``Log.replace_segments`` (``.cleaned`` -> ``.swap``
-> ``.deleted``), so a crash at any point recovers to either the old or the new segments, as for
Kafka's own segment split (``LocalLog.splitOverflowedSegment``). Records and offsets are unchanged.
"""

from __future__ import annotations

import contextlib
import logging
from typing import TYPE_CHECKING

from .record_batch import NO_PRODUCER_ID, Record, RecordBatch, TimestampType
from .record_batch_builder import RecordBatchBuilder

if TYPE_CHECKING:  # pragma: no cover
    from .log import Log

__all__ = ["split_segment_at"]

logger = logging.getLogger("materializer.storage.log_cleaner")


def split_segment_at(log: "Log", offset: int) -> bool:
    """Make ``offset`` a segment base offset of ``log`` by splitting the inactive segment holding it.

    The segment ``[base, next)`` with ``base < offset < next`` is rewritten as ``[base, offset)``
    and ``[offset, next)``; both keep the source's mtime. A batch straddling ``offset`` is rebuilt
    as two batches, ``[base_offset, offset - 1]`` and ``[offset, last_offset]`` (same codec,
    timestamp type, leader epoch and delete horizon; records unchanged); every other batch is
    copied byte for byte. Batches of a producer (idempotent, transactional, control) are never
    split: then nothing is changed (a warning is logged).

    Returns True when the log was changed. Call with ``log.lock`` held; the active segment is
    never split (roll first).

    Raises:
        CorruptRecordError: the segment holds a corrupt batch (nothing is changed).
    """
    segments = log.log_segments()
    for i, segment in enumerate(segments):
        upper = segments[i + 1].base_offset if i + 1 < len(segments) else None
        if segment.base_offset < offset and (upper is None or offset < upper):
            break
    else:
        return False
    if upper is None:  # the active segment
        return False
    lower_batches: list[bytes] = []
    upper_batches: list[bytes] = []
    for _, batch in segment.log.batches_from(0):
        if batch.last_offset < offset:
            lower_batches.append(bytes(batch.buffer))
        elif batch.base_offset >= offset:
            upper_batches.append(bytes(batch.buffer))
        else:
            if batch.producer_id != NO_PRODUCER_ID or batch.is_transactional or batch.is_control_batch:
                logger.warning("not splitting %s at offset %d: batch [%d, %d] belongs to producer %d",
                               segment, offset, batch.base_offset, batch.last_offset, batch.producer_id)
                return False
            records = batch.records()
            below = [r for r in records if r.offset < offset]
            above = [r for r in records if r.offset >= offset]
            if below:
                lower_batches.append(_rebuild(batch, batch.base_offset, below, offset - 1))
            if above:
                upper_batches.append(_rebuild(batch, offset, above, batch.last_offset))
    if not upper_batches:
        return False
    mtime_ms = segment.last_modified_ms
    new_segments = [log.create_cleaned_segment(segment.base_offset), log.create_cleaned_segment(offset)]
    swapping = False
    try:
        for target, batches in zip(new_segments, (lower_batches, upper_batches)):
            for data in batches:
                target.append_batch(RecordBatch(data))
            target.on_become_inactive_segment()
            target.flush()
            target.set_last_modified_ms(mtime_ms)
        swapping = True
        log.replace_segments(new_segments, [segment])
    except BaseException:
        if not swapping:  # once the swap began, the new segments may hold the only copy: LogLoader finishes it
            for target in new_segments:
                with contextlib.suppress(Exception):
                    target.delete_if_exists()
        raise
    logger.info("split segment %d of %s at offset %d", segment.base_offset, log.dir, offset)
    return True


def _rebuild(batch: RecordBatch, base_offset: int, records: list[Record], last_offset: int) -> bytes:
    log_append_time = batch.max_timestamp if batch.timestamp_type == TimestampType.LOG_APPEND_TIME else None
    builder = RecordBatchBuilder(base_offset, compression=batch.compression_type, timestamp_type=batch.timestamp_type,
                                 partition_leader_epoch=batch.partition_leader_epoch,
                                 delete_horizon_ms=batch.delete_horizon_ms, log_append_time_ms=log_append_time)
    for record in records:
        builder.append_record(record)
    return builder.build(last_offset=last_offset)
