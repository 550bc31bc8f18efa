"""One cleaning round over a compacted log (Kafka ``Cleaner`` and ``MemoryRecords.filterTo``).

A round (``Cleaner.doClean``):

1. **Offset map** - ``build_offset_map`` reads the dirty section
   ``[first_dirty_offset, first_uncleanable_offset)`` and maps every keyed record of a batch that
   is not aborted transactional data to its offset (later offsets win). The map holds at most
   ``int(slots * load_factor)`` keys; when full, the segment is only partly mapped and the round
   ends at ``end_offset = map.latest_offset + 1``; otherwise ``end_offset`` is the first
   uncleanable offset.
2. **Grouping** - ``group_segments_by_size`` groups ``log_segments(0, end_offset)`` (the whole
   log from offset 0, clean section included) greedily while the group's ``.log`` bytes stay
   ``<= segment.bytes``, each index's bytes ``<= segment.index.bytes`` and the offset range fits
   an int32.
3. **Recopy** - each group is copied into ``<first base>.log.cleaned`` batch by batch:

   * batch retention: the last batch of an active producer (``RETAIN_EMPTY``); else the batch
     whose ``next_offset`` equals the high watermark (4.4+; 4.0-4.3 used the round's first
     uncleanable offset, selectable with ``empty_batch_upper_bound="round"``); else aborted
     transactional data and discardable markers past their delete horizon are dropped whole;
   * record retention (``shouldRetainRecord``): records past ``map.latest_offset`` are kept;
     records without a key are dropped and counted invalid; otherwise a record is kept iff its
     offset is ``>= map.get(key)`` and it has a value or its batch's delete horizon has not
     passed; control records are kept unless the batch is being discarded;
   * an unchanged batch is copied byte for byte; a changed one is rebuilt with the same base
     offset, last offset (``overrideLastOffset``), producer id/epoch/base sequence, codec,
     timestamp type, flags and partition leader epoch; a batch that keeps a tombstone or a
     marker of an emptied transaction gets the delete horizon ``now + delete.retention.ms``
     (attribute bit 6, in BaseTimestamp) the first time it is recopied; a batch emptied but
     ``RETAIN_EMPTY`` becomes a 61-byte empty batch.

   The cleaned segment keeps the mtime of the group's last source segment and is swapped in
   with ``Log.replace_segments`` (``.cleaned`` -> ``.swap`` -> ``.deleted``).

The per-batch and per-record decisions of the recopy are in :mod:`.cleaner_filter`.

Only magic v2 batches exist in our logs, so Kafka's legacy (v0/v1) tombstone horizon is not
needed. Mirrors ``org.apache.kafka.storage.internals.log.Cleaner`` and
``org.apache.kafka.common.record.internal.MemoryRecords.filterTo``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Literal, Sequence

from .clock import wall_clock_ms
from .cleaned_transaction_metadata import CleanedTransactionMetadata
from .cleaner_filter import CleaningContext, check_fully_read, clean_into, should_discard_batch
from .cleaner_stats import CleanerStats
from .offset_map import DEFAULT_LOAD_FACTOR, OffsetMap, new_offset_map
from .record_scan import map_batch_keys
from .varint import INT32_MAX
from .producer_state_manager import DEFAULT_PRODUCER_ID_EXPIRATION_MS, LastRecord
from .record_batch import CONTROL_FLAG_MASK, LOG_OVERHEAD

if TYPE_CHECKING:  # pragma: no cover
    from .cleaner_manager import LogToClean
    from .log import Log
    from .segment import LogSegment

__all__ = ["Cleaner", "EmptyBatchUpperBound", "INT32_MAX"]

logger = logging.getLogger("materializer.storage.log_cleaner")

EmptyBatchUpperBound = Literal["high_watermark", "round"]


@dataclass(frozen=True)
class OffsetMapContext:
    """The values of one ``build_offset_map`` pass, shared by its per-segment calls.

    ``[start_offset, end_offset)`` is the dirty section; ``max_desired_map_size`` is
    ``int(slots * load_factor)`` keys. ``offset_map``, ``transaction_metadata`` and ``stats`` are
    filled in place.
    """

    topic_partition: tuple[str, int]
    offset_map: OffsetMap
    start_offset: int
    end_offset: int
    max_desired_map_size: int
    transaction_metadata: CleanedTransactionMetadata
    stats: CleanerStats


def _no_check(_topic_partition: tuple[str, int]) -> None:
    return None


class Cleaner:
    """Cleans one log at a time with its own offset map (one per cleaner thread; not thread-safe).

    Args:
        cleaner_id: number used in log messages.
        offset_map: the de-duplication map (default: 128 MiB budget, ``new_offset_map``).
        load_factor: fraction of ``offset_map.slots`` filled per round (``log.cleaner.io.buffer.load.factor``).
        io_buffer_size_bytes: output bytes gathered before one append to the cleaned segment, and
            bytes read between two ``check_done`` calls.
        check_done: called with ``(topic, partition)`` during a round; raises
            ``LogCleaningAbortedError`` to abort it (``LogCleanerManager.check_cleaning_aborted``).
        clock_ms: wall clock in ms (the delete horizon is ``clock_ms() + delete.retention.ms``).
        empty_batch_upper_bound: ``"high_watermark"`` (Kafka 4.4+) keeps an emptied batch whose
            next offset is the log's high watermark; ``"round"`` (Kafka 4.0-4.3) the one whose next
            offset is the round's first uncleanable offset. The default is ``"round"`` because the
            broker this project pins and tests against is Kafka 4.3.1.
        producer_id_expiration_ms: ``producer.id.expiration.ms`` for deciding active producers.

    Raises:
        ValueError: the map cannot hold even one key at ``load_factor``.
    """

    def __init__(
        self,
        cleaner_id: int = 0,
        offset_map: OffsetMap | None = None,
        *,
        load_factor: float = DEFAULT_LOAD_FACTOR,
        io_buffer_size_bytes: int = 262144,
        check_done: Callable[[tuple[str, int]], None] = _no_check,
        clock_ms: Callable[[], int] = wall_clock_ms,
        empty_batch_upper_bound: EmptyBatchUpperBound = "round",
        producer_id_expiration_ms: int = DEFAULT_PRODUCER_ID_EXPIRATION_MS,
    ):
        self.id = cleaner_id
        self.offset_map = offset_map if offset_map is not None else new_offset_map()
        self.load_factor = load_factor
        self.io_buffer_size_bytes = max(io_buffer_size_bytes, 1)
        self.check_done = check_done
        self.clock_ms = clock_ms
        if empty_batch_upper_bound not in ("high_watermark", "round"):
            raise ValueError(f"empty_batch_upper_bound must be 'high_watermark' or 'round', got {empty_batch_upper_bound!r}")
        self.empty_batch_upper_bound = empty_batch_upper_bound
        self.producer_id_expiration_ms = producer_id_expiration_ms
        if not self.offset_map.slots * load_factor > 1:
            raise ValueError(
                "offset map is too small to fit in even a single message, so log cleaning will never make progress. "
                "You can increase log.cleaner.dedupe.buffer.size or decrease log.cleaner.threads"
            )

    # -- round -----------------------------------------------------------------------------------

    def clean(self, cleanable: "LogToClean", now_ms: int | None = None) -> tuple[int, CleanerStats]:
        """Run one round on ``cleanable`` at ``now_ms`` (default: the clock).

        Returns ``(end_offset, stats)``: the first offset not cleaned (the new checkpoint).

        Raises:
            LogCleaningAbortedError: ``check_done`` aborted the round (the ``.cleaned`` files are removed).
            CorruptRecordError: a source segment holds a corrupt or truncated batch.
        """
        return self.do_clean(
            cleanable.log, cleanable.first_dirty_offset, cleanable.first_uncleanable_offset,
            self.clock_ms() if now_ms is None else now_ms,
        )

    def do_clean(
        self, log: "Log", first_dirty_offset: int, first_uncleanable_offset: int, current_time_ms: int,
        *, protect_from_offset: int | None = None,
    ) -> tuple[int, CleanerStats]:
        """One round over ``[first_dirty_offset, first_uncleanable_offset)`` (Kafka ``Cleaner.doClean``).

        The ``"high_watermark"`` emptied-batch rule uses the log's high watermark (its log end offset).
        ``protect_from_offset`` (ours, for a caller-forced first uncleanable offset): batches whose
        base offset is at or past it are copied verbatim when their segment is recopied - no
        filtering, no delete horizon - as if they lay in an uncleanable segment, which is where
        Kafka keeps them (its first uncleanable offset is a segment base offset).
        Returns ``(end_offset, stats)``.
        """
        tp = (log.topic, log.partition)
        logger.info("Beginning cleaning of log %s", log.dir.name)
        stats = CleanerStats()
        logger.info("Building offset map for %s...", log.dir.name)
        self.build_offset_map(log, first_dirty_offset, first_uncleanable_offset, self.offset_map, stats)
        end_offset = self.offset_map.latest_offset + 1
        stats.index_done()
        logger.info("Cleaning log %s (cleaning prior to offset %d)...", log.dir.name, end_offset)
        upper_bound = log.high_watermark if self.empty_batch_upper_bound == "high_watermark" else first_uncleanable_offset
        # producer expiration follows the wall clock (Kafka expires producers in a scheduled task),
        # not the round's current time, which only drives delete horizons
        active_producers = log.last_records_of_active_producers(self.clock_ms(), self.producer_id_expiration_ms)
        transaction_metadata = CleanedTransactionMetadata()
        groups = self.group_segments_by_size(
            log.log_segments(0, end_offset), log.config.segment_bytes, log.config.max_index_size, first_uncleanable_offset,
        )
        for group in groups:
            self.check_done(tp)
            self.clean_segments(
                log, group, self.offset_map, current_time_ms, stats, transaction_metadata,
                last_records_of_active_producers=active_producers, empty_batch_upper_bound_offset=upper_bound,
                protect_from_offset=protect_from_offset,
            )
        stats.buffer_utilization = self.offset_map.utilization
        stats.all_done()
        return end_offset, stats

    # -- offset map ------------------------------------------------------------------------------

    def build_offset_map(self, log: "Log", start: int, end: int, offset_map: OffsetMap, stats: CleanerStats) -> None:
        """Fill ``offset_map`` with ``key -> last offset`` for keyed records in ``[start, end)``.

        Aborted transactional data is skipped; stops early when the map reaches
        ``int(slots * load_factor)`` keys (Kafka ``Cleaner.buildOffsetMap``). Records at or past
        ``end`` are never mapped (Kafka's ``end`` is always a segment base offset, so this only
        matters for a caller-forced ``end``). Each batch is mapped by
        :meth:`.offset_map.OffsetMap.map_records_section`.

        Raises:
            LogCleaningAbortedError: ``check_done`` aborted the round.
            CorruptRecordError: a dirty segment holds a corrupt batch.
        """
        offset_map.clear()
        dirty = log.log_segments(start, end)
        logger.info(
            "Building offset map for log %s for %d segments in offset range [%d, %d).", log.dir.name, len(dirty), start, end
        )
        transaction_metadata = CleanedTransactionMetadata()
        transaction_metadata.add_aborted_transactions(log.collect_aborted_transactions(start, end))
        tp = (log.topic, log.partition)
        context = OffsetMapContext(
            topic_partition=tp, offset_map=offset_map, start_offset=start, end_offset=end,
            max_desired_map_size=int(offset_map.slots * self.load_factor),
            transaction_metadata=transaction_metadata, stats=stats,
        )
        for i, segment in enumerate(dirty):
            next_segment_start_offset = dirty[i + 1].base_offset if i + 1 < len(dirty) else end
            self.check_done(tp)
            full = self._build_offset_map_for_segment(context, segment, next_segment_start_offset)
            if full:
                logger.debug(
                    "Offset map is full, %d segments fully mapped, segment with base offset %d is partially mapped",
                    i, segment.base_offset,
                )
                break
        logger.info("Offset map for log %s complete.", log.dir.name)

    def _build_offset_map_for_segment(self, context: OffsetMapContext, segment: "LogSegment",
                                      next_segment_start_offset: int) -> bool:
        """Map the keyed records of ``segment`` in ``[start_offset, end_offset)`` (Kafka
        ``Cleaner.buildOffsetMapForSegment``); returns True when the map filled up part way.

        Control batches feed the transaction metadata; batches of aborted transactions
        (:func:`.cleaner_filter.should_discard_batch`) are counted, not mapped.

        Raises:
            LogCleaningAbortedError: ``check_done`` aborted the round.
            CorruptRecordError: the segment ends in a batch that claims more bytes than are left.
        """
        tp = context.topic_partition
        offset_map = context.offset_map
        start, end = context.start_offset, context.end_offset
        max_desired_map_size = context.max_desired_map_size
        transaction_metadata = context.transaction_metadata
        stats = context.stats
        position = segment.index.lookup(start).position
        bytes_since_check = 0
        end_position = position
        index_bytes = 0
        for batch_position, batch in segment.log.batches_from(position):
            header = batch.header
            if header.base_offset >= end:
                end_position = segment.size_in_bytes
                break
            size = header.length + LOG_OVERHEAD
            end_position = batch_position + size
            if bytes_since_check >= self.io_buffer_size_bytes:
                self.check_done(tp)
                bytes_since_check = 0
            bytes_since_check += size
            attributes = header.attributes
            if attributes & CONTROL_FLAG_MASK:
                transaction_metadata.on_control_batch_read(batch)
                stats.map_messages_read += 1
            elif should_discard_batch(batch, attributes, transaction_metadata):  # an aborted transaction
                stats.map_messages_read += header.records_count
            else:
                records_read, stopped = map_batch_keys(batch, offset_map, start, end, max_desired_map_size)
                stats.map_messages_read += records_read
                if stopped:
                    stats.map_bytes_read += index_bytes
                    return True
            last_offset = header.base_offset + header.last_offset_delta
            if last_offset >= start:
                offset_map.update_latest_offset(last_offset if last_offset < end else end - 1)
            index_bytes += size
        stats.map_bytes_read += index_bytes
        check_fully_read(segment, end_position)
        # skip offset gaps: fast forward to the last offset this segment may hold
        offset_map.update_latest_offset(next_segment_start_offset - 1)
        return False

    # -- grouping --------------------------------------------------------------------------------

    @staticmethod
    def group_segments_by_size(
        segments: Sequence["LogSegment"], max_size: int, max_index_size: int, first_uncleanable_offset: int
    ) -> list[list["LogSegment"]]:
        """Group consecutive segments so each group fits one cleaned segment (Kafka ``groupSegmentsBySize``).

        A segment joins the current group while the group's ``.log`` bytes stay ``<= max_size``,
        its offset-index and time-index bytes (``entries * entry size``) each stay
        ``<= max_index_size``, and - unless the segment is empty - the estimated last offset of
        the segment (next segment's base - 1, or ``first_uncleanable_offset - 1`` for the last)
        minus the group's first base offset fits an int32.
        """
        grouped: list[list[LogSegment]] = []
        remaining = list(segments)
        i = 0
        n = len(remaining)
        while i < n:
            group = [remaining[i]]
            log_size = remaining[i].size_in_bytes
            index_size = remaining[i].index.size_in_bytes
            time_index_size = remaining[i].time_index.size_in_bytes
            i += 1
            while i < n:
                candidate = remaining[i]
                if i + 1 < n:
                    last_offset_estimate = remaining[i + 1].base_offset - 1
                else:
                    last_offset_estimate = first_uncleanable_offset - 1
                if (
                    log_size + candidate.size_in_bytes <= max_size
                    and index_size + candidate.index.size_in_bytes <= max_index_size
                    and time_index_size + candidate.time_index.size_in_bytes <= max_index_size
                    and (candidate.size_in_bytes == 0 or last_offset_estimate - group[-1].base_offset <= INT32_MAX)
                ):
                    group.append(candidate)
                    log_size += candidate.size_in_bytes
                    index_size += candidate.index.size_in_bytes
                    time_index_size += candidate.time_index.size_in_bytes
                    i += 1
                else:
                    break
            grouped.append(group)
        return grouped

    # -- recopy ----------------------------------------------------------------------------------

    def clean_segments(
        self,
        log: "Log",
        segments: Sequence["LogSegment"],
        offset_map: OffsetMap,
        current_time_ms: int,
        stats: CleanerStats,
        transaction_metadata: CleanedTransactionMetadata,
        *,
        last_records_of_active_producers: dict[int, LastRecord],
        empty_batch_upper_bound_offset: int,
        protect_from_offset: int | None = None,
    ) -> None:
        """Copy ``segments`` into one ``.cleaned`` segment and swap it in (Kafka ``Cleaner.cleanSegments``).

        Batches with base offset ``>= protect_from_offset`` are copied verbatim (see ``do_clean``).

        Raises:
            LogCleaningAbortedError: aborted by ``check_done``; the ``.cleaned`` files are deleted.
        """
        cleaned = log.create_cleaned_segment(segments[0].base_offset)
        transaction_metadata.cleaned_index = cleaned.txn_index
        context = CleaningContext(
            topic_partition=(log.topic, log.partition), offset_map=offset_map,
            delete_retention_ms=log.config.delete_retention_ms, active_producers=last_records_of_active_producers,
            empty_batch_upper_bound_offset=empty_batch_upper_bound_offset, current_time_ms=current_time_ms,
            check_done=self.check_done, io_buffer_size_bytes=self.io_buffer_size_bytes,
            protect_from_offset=2**63 if protect_from_offset is None else protect_from_offset,
        )
        swapping = False
        try:
            for i, segment in enumerate(segments):
                upper_bound = segments[i + 1].base_offset if i + 1 < len(segments) else segment.read_next_offset()
                transaction_metadata.add_aborted_transactions(
                    log.collect_aborted_transactions(segment.base_offset, upper_bound)
                )
                logger.info("Cleaning %s in log %s into %d", segment, log.dir.name, cleaned.base_offset)
                clean_into(context, segment, cleaned, transaction_metadata, stats)
            cleaned.on_become_inactive_segment()
            cleaned.flush()
            cleaned.set_last_modified_ms(segments[-1].last_modified_ms)
            logger.info("Swapping in cleaned segment %s for segment(s) %s in log %s", cleaned, list(segments), log.dir.name)
            swapping = True
            log.replace_segments([cleaned], list(segments))
        except BaseException:  # LogCleaningAbortedError included: never leave a half-built .cleaned segment
            # Once the swap has begun the cleaned segment may be all that holds the group's records
            # (its sources renamed .deleted): an interrupted swap is LogLoader's to finish, never undone
            # here (Kafka deletes it only on LogCleaningAbortedException, raised before the swap). Not
            # even when its own suffix still reads .cleaned: a rename may be done before that is updated,
            # and deleting the other files would leave a lone .swap, a state Kafka's order never makes.
            if not swapping:
                cleaned.delete_if_exists()
            raise
