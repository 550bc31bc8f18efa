"""The driver's plan of a ``kafkalog`` read: :class:`SegmentSplit` and :func:`plan_splits`.

Work is split by segment, not by Kafka partition: per partition folder, the driver makes the cheap
pass (batch headers, CRC-32C, ``.txnindex``: the aborted transactions and the last stable offset,
:func:`~materializer.storage.read_committed.scan_transactions`) and hands each split its segment
file, offset range ``[start_offset, end_offset)`` and the aborted transactions it needs.

The folders may be live: a broker's log dir, or the data dir ``materializer run`` fills while its
cleaner swaps segments in (``.cleaned``/``.swap`` files, then renames). Every look at a folder
waits such a swap out: a :class:`~materializer.storage.errors.UnfinishedSegmentSwapError` or a
file gone between listing and opening is looked at again after 0.1 s (a few times), while damage
(:class:`~materializer.storage.errors.CorruptRecordError`, a lost segment) fails at once with the
file and byte position. A materializer data dir's topic is planned only when complete
(:func:`materializer.datadir.markers.require_complete` without a store), and each split carries the
generation of the topic's data it was planned on (:func:`check_generation`).

Nothing is ever written to the folders. Follows Kafka's ``read_committed`` rules
(:mod:`materializer.storage.read_committed`) and the offsets of Spark's ``KafkaSource``.
"""

from __future__ import annotations

import itertools
import logging
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Iterator, Mapping, Sequence, TypeVar

from pyspark.sql.datasource import InputPartition

from materializer.datadir.lease import member_lease, read_lease, wall_ms  # stdlib and storage only: light
from materializer.datadir.lock import stopped_without_release  # likewise
from materializer.datadir.markers import require_complete, topic_status  # likewise
from materializer.storage.checkpoint import LOG_START_OFFSET_CHECKPOINT, read_offset_checkpoint
from materializer.storage.errors import (
    IncompleteDataDirError,
    LogNotFoundError,
    StorageError,
    UnfinishedSegmentSwapError,
)
from materializer.storage.files import (
    INDEX_FILE_SUFFIX,
    LOG_FILE_SUFFIX,
    TIME_INDEX_FILE_SUFFIX,
    TXN_INDEX_FILE_SUFFIX,
    find_partition_dirs,
    offset_from_file_name,
    topic_partition_dirs,
)
from materializer.storage.read_committed import (
    AbortedTxnSource,
    ReadOnlyPartition,
    TransactionScan,
    checked_segment_batches,
    scan_transactions,
)
from materializer.storage.record_batch import RecordBatch

__all__ = ["EARLIEST", "LATEST", "Offsets", "SegmentSplit", "check_generation", "plan_splits",
           "readable_end_offsets", "segment_batches"]

EARLIEST, LATEST = -2, -1
#: Offsets of a query's start or end: one per partition, or EARLIEST / LATEST for every partition.
Offsets = dict[int, int] | int
_SWAP_PAUSE_S = 0.1  # between two looks at a folder caught in a cleaner's segment swap
_T = TypeVar("_T")

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class SegmentSplit(InputPartition):
    """One segment's share of the read: records with offsets in ``[start_offset, end_offset)``.

    Attributes:
        topic / partition: the Kafka partition.
        log_path: the segment's ``.log`` file when it was planned.
        next_base_offset: the base offset of the next segment (None: the last segment).
        is_last: the partition's last segment, whose torn tail is a write in flight.
        start_offset / end_offset: the offsets to read, ``[start_offset, end_offset)``.
        read_committed: aborted transactions are removed (``isolation``).
        aborted: ``(producer id, first offset, last offset)`` of the aborted transactions that
            overlap the range (read_committed only).
        generation: the generation of the topic's data in its data dir when it was planned (None:
            no completeness marker, as in a broker's log dir).

    Immutable; pickled to the executor that reads it. A dataclass, as PySpark's data source docs
    write an ``InputPartition``.
    """

    topic: str
    partition: int
    log_path: str
    next_base_offset: int | None
    is_last: bool
    start_offset: int
    end_offset: int
    read_committed: bool
    aborted: tuple[tuple[int, int, int], ...]
    generation: str | None = None

    def __repr__(self) -> str:
        return (f"SegmentSplit({self.topic}-{self.partition}, {self.log_path}, "
                f"offsets [{self.start_offset}, {self.end_offset}))")


def plan_splits(paths: Sequence[Path | str], topic: str, *, starting: Offsets = EARLIEST,
                ending: Offsets = LATEST, read_committed: bool = True,
                min_partitions: int | None = None) -> list[SegmentSplit]:
    """The driver's pass: one :class:`SegmentSplit` per segment holding wanted offsets, or more
    with ``min_partitions``.

    Per partition: the log start offset (the log dir's ``log-start-offset-checkpoint`` when present),
    one header pass over every batch (framing, offsets in order, CRC-32C; the aborted transactions
    and the last stable offset, :func:`scan_transactions`), then the segments overlapping
    ``[start, end)``, where ``end`` is the last stable offset (read_committed) or the log end
    offset, lowered to ``endingOffsets``.

    ``min_partitions`` (Spark's Kafka source option ``minPartitions``): when the segments give
    fewer splits, segment ranges are cut at batch boundaries (a second header pass over those
    segments) into pieces of about ``total bytes / min_partitions`` bytes each; a split never
    holds less than one batch, so a topic with fewer batches gives fewer splits. Each split
    carries the aborted transactions that overlap its own offset range, so a transaction cut in
    two is removed (or kept) on both sides, as :func:`classify_batches` works on any run of
    batches.

    Raises:
        LogNotFoundError: a path is not a folder, or holds no partition folder of ``topic``.
        IncompleteDataDirError: a data dir's topic is being restored or was left incomplete
            (:func:`materializer.datadir.markers.require_complete` without a store).
        CorruptRecordError / CorruptIndexError / StorageError: damage, naming file and byte position.
        ValueError: an offset outside the partition's range; ``min_partitions`` below 1.
    """
    if min_partitions is not None and min_partitions < 1:
        raise ValueError(f"kafkalog: minPartitions must be at least 1, got {min_partitions}")
    roots = [Path(p).absolute() for p in paths]  # executors run in other folders (a cluster's work dirs)
    return _planned_unchanged(roots, topic, lambda generations: _plan_splits(
        roots, topic, generations, starting, ending, read_committed, min_partitions))


def _plan_splits(roots: list[Path], topic: str, generations: dict[str, str | None], starting: Offsets,
                 ending: Offsets, read_committed: bool, min_partitions: int | None) -> list[SegmentSplit]:
    """:func:`plan_splits` once the data dirs' generations are known."""
    folders = _served_folders(roots, topic)
    log_starts = _log_start_offsets(folders, topic)
    splits: list[SegmentSplit] = []
    for partition, folder in sorted(folders.items()):
        source, scan = _scan_partition(folder, log_starts.get(partition))
        limit = scan.last_stable_offset if read_committed else scan.log_end_offset
        start = starting if isinstance(starting, int) else starting.get(partition, EARLIEST)
        end = ending if isinstance(ending, int) else ending.get(partition, LATEST)
        start = source.log_start_offset if start == EARLIEST else limit if start == LATEST else start
        end = limit if end == LATEST else source.log_start_offset if end == EARLIEST else min(end, limit)
        if start < source.log_start_offset:
            raise ValueError(f"kafkalog: starting offset {start} of {topic}-{partition} is below its log start offset "
                             f"{source.log_start_offset} ({folder})")
        aborted = [(t.producer_id, t.first_offset, t.last_offset) for t in scan.aborted_transactions
                   if t.last_offset >= start and t.first_offset < end] if read_committed else []
        segments = source.segments
        for i, segment in enumerate(segments):
            upper = segments[i + 1].base_offset if i + 1 < len(segments) else None
            if start >= end or (upper is not None and upper <= start) or segment.base_offset >= end:
                continue
            splits.append(SegmentSplit(
                topic=topic, partition=partition, log_path=str(segment.log_path), next_base_offset=upper,
                is_last=i == len(segments) - 1, start_offset=max(start, segment.base_offset),
                end_offset=end if upper is None else min(end, upper), read_committed=read_committed,
                aborted=tuple(aborted), generation=generations.get(str(folder.parent))))
    if min_partitions is not None and len(splits) < min_partitions:
        splits = _cut_at_batches(splits, min_partitions)
    return splits


def _served_folders(roots: Sequence[Path], topic: str) -> dict[int, Path]:
    """``partition -> folder`` of ``topic`` in ``roots`` (:func:`topic_partition_dirs`), without the
    partitions a consumer-group member's data dir keeps but does not serve: the group moved them to
    other members, and their logs stop where this member let them go, older than the topic. One
    warning names them. The member's complete marker says what it serves
    (:func:`materializer.group.served.serve`); so the members' data dirs read together give
    the whole topic, each partition from the member that serves it. A continuous member killed
    (:func:`materializer.datadir.lock.stopped_without_release`), or whose lease is older than the
    group's session timeout (frozen, stuck: :func:`materializer.datadir.lease.member_lease`), serves none.

    Raises:
        LogNotFoundError: a root is not a folder, or none holds a served folder of ``topic``.
        StorageError: one partition is served from two roots.
    """
    groups = {root: topic_status(root, topic).facts.get("group") for root in roots}
    if not any(isinstance(group, dict) for group in groups.values()):
        return topic_partition_dirs(roots, topic)  # no group member among them: every folder
    for root in roots:
        if not root.is_dir():
            raise LogNotFoundError(f"log dir {root} does not exist or is not a folder")
    served: dict[int, Path] = {}
    for root, group in groups.items():
        wanted = {int(p) for p in group.get("partitions", ())} if isinstance(group, dict) else None
        stopped = None
        if wanted and isinstance(group, dict):
            stopped = stopped_without_release(root, group.get("served_by"))
            if stopped is None and group.get("served_by") is not None:  # frozen or stuck: its lease lapsed
                deadline, lapsed = member_lease(read_lease(root, topic), group.get("served_by"), wanted,
                                                generation=topic_status(root, topic).generation)
                stopped = lapsed if deadline is None or wall_ms() >= deadline else None
            if stopped is not None:  # killed, frozen or stuck while serving: the group moves its partitions
                logger.warning("kafkalog: %s was written by a member of consumer group %r; %s: none of its "
                               "partitions is read", root, group.get("group_id"), stopped)
                wanted = set()
        left_out = []
        for (_, partition), folder in find_partition_dirs([root], topic).items():
            if wanted is not None and partition not in wanted:
                left_out.append(partition)
            elif partition in served:
                raise StorageError(f"partition {partition} of topic {topic!r} is in two log dirs: {served[partition]} "
                                   f"and {folder}")
            else:
                served[partition] = folder
        if left_out and stopped is None:
            assert isinstance(group, dict)
            logger.warning("kafkalog: %s is a member of consumer group %r and does not serve partitions %s of %s "
                           "(kept since the group moved them, older than the topic): left out; read the members' "
                           "data dirs together for the whole topic", root, group.get("group_id"), left_out, topic)
    if not served:
        raise LogNotFoundError(f"no partition folder of topic {topic!r} served in {', '.join(map(str, roots))}: the "
                               f"consumer-group members there serve none")
    return served


def _cut_at_batches(splits: list[SegmentSplit], min_partitions: int) -> list[SegmentSplit]:
    """``splits`` cut at batch base offsets into pieces of about ``total bytes / min_partitions``
    bytes (bytes of the batches each split reads), each piece with the aborted transactions that
    overlap its offsets. A segment that vanished since the scan (a cleaner's swap) stays one split:
    the executor looks its offsets up again anyway (:func:`segment_batches`)."""
    sizes: list[list[tuple[int, int]]] = []  # per split: (base offset, bytes) of the batches it reads
    for split in splits:
        try:
            found = checked_segment_batches(split.log_path, split.next_base_offset, is_last=split.is_last)
            sizes.append([(batch.base_offset, batch.size_in_bytes) for _, batch in found
                          if batch.last_offset >= split.start_offset and batch.base_offset < split.end_offset])
        except FileNotFoundError:  # a cleaner swapped the segment since the scan: read it whole
            sizes.append([])
    target = max(1, sum(size for batches in sizes for _, size in batches) / min_partitions)
    cut: list[SegmentSplit] = []
    for split, batches in zip(splits, sizes):
        total = sum(size for _, size in batches)
        pieces = max(1, min(len(batches), round(total / target)))
        bounds, done = [split.start_offset], 0
        for base_offset, size in batches:
            if done >= total * len(bounds) / pieces and base_offset > bounds[-1]:
                bounds.append(base_offset)
            done += size
        bounds.append(split.end_offset)
        for first, after in zip(bounds, bounds[1:]):
            aborted = tuple(t for t in split.aborted if t[2] >= first and t[1] < after)
            cut.append(replace(split, start_offset=first, end_offset=after, aborted=aborted))
    return cut


def readable_end_offsets(paths: Sequence[Path | str], topic: str, *, read_committed: bool = True,
                         attempts: int = 5) -> dict[int, tuple[int, int]]:
    """``partition -> (log start offset, end)`` where ``end`` is the last stable offset
    (read_committed) or the log end offset: the streaming source's latest offsets.

    A folder caught in the middle of a segment swap (``.cleaned``/``.swap`` files) is read again
    after 0.1 s, up to ``attempts`` times.

    Raises:
        LogNotFoundError / CorruptRecordError / StorageError / IncompleteDataDirError: as :func:`plan_splits`.
    """
    roots = [Path(p).absolute() for p in paths]  # executors run in other folders (a cluster's work dirs)

    def plan(generations: dict[str, str | None]) -> dict[int, tuple[int, int]]:
        folders = _served_folders(roots, topic)
        log_starts = _log_start_offsets(folders, topic)
        ends: dict[int, tuple[int, int]] = {}
        for partition, folder in sorted(folders.items()):
            source, scan = _scan_partition(folder, log_starts.get(partition), attempts)
            ends[partition] = (source.log_start_offset,
                               scan.last_stable_offset if read_committed else scan.log_end_offset)
        return ends

    return _planned_unchanged(roots, topic, plan)


def _scan_partition(folder: Path, log_start_offset: int | None,
                    attempts: int = 5) -> tuple[ReadOnlyPartition, TransactionScan]:
    """``(ReadOnlyPartition, TransactionScan)`` of ``folder``, read again (after 0.1 s, up to
    ``attempts`` times) when a cleaner's segment swap is in progress or a file vanishes meanwhile.

    Raises:
        LogNotFoundError: a segment's ``.log`` is missing while its index files are there (after
            the retries).
        UnfinishedSegmentSwapError: the folder still holds a swap's files after the retries.
        CorruptRecordError / StorageError: damage, naming file and byte position.
    """

    def scan() -> tuple[ReadOnlyPartition, TransactionScan]:
        source = ReadOnlyPartition(folder, log_start_offset=log_start_offset)
        scanned = scan_transactions(source, source=AbortedTxnSource.AUTO, verify_crc=True)
        missing = _missing_segment(folder, source, scanned.log_end_offset, log_start_offset)
        if missing is not None:
            raise _SegmentLost(missing)
        return source, scanned

    try:
        return _waiting_out_swaps(scan, attempts, _SegmentLost)
    except _SegmentLost as exc:
        raise LogNotFoundError(str(exc)) from None


class _SegmentLost(Exception):
    """A segment's ``.log`` is missing while its index files are there (see :func:`_missing_segment`):
    looked at again, as the middle of a cleaner's swap looks the same for an instant."""


def _missing_segment(folder: Path, source: ReadOnlyPartition, log_end_offset: int,
                     checkpointed_log_start: int | None) -> str | None:
    """Why ``folder`` lacks a segment, or ``None``: an index file (``.index``, ``.timeindex``,
    ``.txnindex``) whose ``.log`` is gone, at or above the checkpointed log start offset (any, when
    the log dir has no ``log-start-offset-checkpoint``), means that segment's records were lost,
    which no reader could tell from a compaction gap. (Kafka's own segment
    deletion renames every file of a segment to ``.deleted`` first, and its cleaner's swap renames
    the ``.log`` before the indexes, so a live folder never shows such an orphan for long.)"""
    bases = sorted(segment.base_offset for segment in source.segments)
    for path in sorted(folder.iterdir()):
        if path.suffix not in (INDEX_FILE_SUFFIX, TIME_INDEX_FILE_SUFFIX, TXN_INDEX_FILE_SUFFIX):
            continue
        try:
            base = offset_from_file_name(path.name)
        except ValueError:
            continue
        if (base in bases or path.with_suffix(LOG_FILE_SUFFIX).exists()
                or (checkpointed_log_start is not None and base < checkpointed_log_start)):
            continue
        upper = min((b for b in bases if b > base), default=log_end_offset)
        return (f"{path}: index file of a segment with base offset {base} whose {path.with_suffix(LOG_FILE_SUFFIX).name}"
                f" is missing: offsets from {base} up to {upper} are lost")
    return None


def _waiting_out_swaps(read: Callable[[], _T], attempts: int, *transient: type[Exception]) -> _T:
    """``read()``, called again after 0.1 s, up to ``attempts`` calls in all, while it raises
    :class:`UnfinishedSegmentSwapError` (a cleaner's segment swap in progress in the folder),
    ``FileNotFoundError`` (a file renamed or deleted between listing and opening: the swap's
    renames) or one of ``transient``; the last call's error propagates. Damage
    (:class:`CorruptRecordError`, any other :class:`StorageError`) is never retried.

    Raises:
        ValueError: ``attempts`` below 1.
    """
    retried: tuple[type[Exception], ...] = (UnfinishedSegmentSwapError, FileNotFoundError, *transient)
    for attempt in range(1, attempts + 1):
        try:
            return read()
        except retried:
            if attempt == attempts:
                raise
        time.sleep(_SWAP_PAUSE_S)
    raise ValueError(f"attempts must be at least 1, got {attempts}")


def segment_batches(split: SegmentSplit, attempts: int = 5) -> Iterator[tuple[int, RecordBatch]]:
    """The batches of the segment that holds ``split.start_offset`` now, its file already mapped.

    Between the driver's plan and this read, a cleaner working on the folder (``materializer run``'s)
    may have replaced segments: grouped several into one file named by the first base offset, or
    swapped in a cleaned copy. So the segment is looked up again here, with its current next base
    offset, and mapped at once (a later swap cannot change what is mapped); a file that vanishes
    between listing and opening is looked up again.

    Raises:
        StorageError: the offsets are no longer in the folder (retention deleted them).
        UnfinishedSegmentSwapError: the folder still holds a swap's files after the retries.
        CorruptRecordError: as :func:`checked_segment_batches`.
    """
    folder = Path(split.log_path).parent

    def open_segment() -> Iterator[tuple[int, RecordBatch]]:
        segments = ReadOnlyPartition(folder).segments
        holder = [i for i, seg in enumerate(segments) if seg.base_offset <= split.start_offset]
        if not holder:
            raise StorageError(f"{folder}: offsets [{split.start_offset}, {split.end_offset}) of {split.topic}-"
                               f"{split.partition} are no longer on disk (the log starts at "
                               f"{segments[0].base_offset if segments else 'no segment'}; retention deleted them)")
        i = holder[-1]
        upper = segments[i + 1].base_offset if i + 1 < len(segments) else None
        batches = checked_segment_batches(segments[i].log_path, upper, is_last=upper is None)
        first = next(batches, None)  # opens and maps the file now
        return iter(()) if first is None else itertools.chain([first], batches)

    return _waiting_out_swaps(open_segment, attempts)


def _log_start_offsets(folders: Mapping[int, Path], topic: str) -> dict[int, int]:
    """Partition -> log start offset from the ``log-start-offset-checkpoint`` of the log dir each
    partition's folder is in (a partition absent there: none)."""
    checkpoints: dict[Path, dict[tuple[str, int], int]] = {}
    log_starts: dict[int, int] = {}
    for partition, folder in folders.items():
        root = folder.parent
        if root not in checkpoints:
            checkpoints[root] = read_offset_checkpoint(root / LOG_START_OFFSET_CHECKPOINT)
        offset = checkpoints[root].get((topic, partition))
        if offset is not None:
            log_starts[partition] = offset
    return log_starts


def _generations(roots: Sequence[Path], topic: str) -> dict[str, str | None]:
    """Root -> generation of ``topic``'s data there, refusing a topic being built or replaced.

    Raises:
        IncompleteDataDirError: a root's marker says the topic is incomplete (and its logs are not
            usable: a restore's swap, an interrupted ``spark compact``); the message says what to run.
    """
    return {str(root): require_complete(root, topic, needs_store=False).generation for root in roots}


def _planned_unchanged(roots: Sequence[Path], topic: str, plan: Callable[[dict[str, str | None]], _T],
                       attempts: int = 3) -> _T:
    """``plan(generations)`` over data dirs whose topic's generation did not change meanwhile (a
    restore's swap that began while the driver planned is planned again, up to ``attempts`` times).

    Raises:
        IncompleteDataDirError: as :func:`_generations`, or the generation changed on every attempt.
    """
    for _ in range(attempts):
        generations = _generations(roots, topic)
        planned = plan(generations)
        if _generations(roots, topic) == generations:
            return planned
    raise IncompleteDataDirError(f"topic {topic!r} in {', '.join(map(str, roots))} was replaced {attempts} times "
                                 f"while the query was planned; run it again")


def check_generation(split: SegmentSplit) -> None:
    """Refuse a split whose data dir's topic was replaced (or is being) since it was planned:
    the executor checks before it reads a split and once it has read it all.

    Raises:
        IncompleteDataDirError: the topic's completeness marker says it is being replaced (the
            message says what is in progress), or its generation is no longer ``split.generation``.
    """
    root = Path(split.log_path).parent.parent
    status = topic_status(root, split.topic)
    if status.state == "incomplete" and not status.logs_usable:
        require_complete(root, split.topic, needs_store=False)  # raises, saying what is in progress
    if status.generation != split.generation:
        raise IncompleteDataDirError(f"topic {split.topic!r} in {root} was replaced (restored) while this query read "
                                     f"it; run the query again")
