"""``kafkalog``: a Spark data source over Kafka partition folders, read with no broker (PySpark >= 4.0).

``spark.read.format("kafkalog").option("path", DIR).option("topic", T).load()`` reads a topic from a
broker's log dir (live or a copy), or from a materializer data dir, with the columns of Spark's own
Kafka source, so ``format("kafka")`` and ``format("kafkalog")`` swap::

    key binary, value binary, topic string, partition int, offset long,
    timestamp timestamp, timestampType int [, headers array<struct<key: string, value: binary>>]

Options (Spark's Kafka source names where they exist):

* ``path`` (required): a log dir holding ``<topic>-<partition>/`` folders (several, comma-separated).
* ``topic`` (required).
* ``startingOffsets`` / ``endingOffsets``: ``earliest`` / ``latest`` (defaults) or Spark's JSON
  ``{"<topic>": {"<partition>": offset}}`` with ``-2`` for earliest and ``-1`` for latest; the
  ending offset is exclusive.
* ``isolation`` (Spark: ``kafka.isolation.level``): ``read_committed`` (default) removes aborted
  transactions (``.txnindex`` files and ABORT markers) and stops at the last stable offset, as a
  read_committed consumer does; ``read_uncommitted`` returns every data record up to the log end.
* ``includeHeaders``: ``true`` adds the ``headers`` column.
* ``minPartitions`` (as Spark's Kafka source): at least this many splits where the batches allow,
  segments being cut at batch boundaries into pieces of about equal bytes (default: one split per
  segment). Each split costs a Spark task (~0.05 s on a 2 vCPU machine), so it pays only where
  segments are large or few next to the cores.

Work is split by segment, not by Kafka partition, so parallelism is not capped by the partition
count: the driver makes the cheap pass (batch headers, CRCs, ``.txnindex``: the aborted
transactions and the last stable offset of each partition) and hands each split its segment file,
offset range and the aborted transactions it needs; executors decode batches straight into Arrow
record batches. Control batches never appear. Damage (a corrupt batch, offsets out of order, a
folder with no segments, a segment whose ``.log`` is gone while its index files stay) fails the
job with the file and byte position (or the lost offsets), never a partial result. Missing index
files alone are no damage: the reader never needs them (Kafka rebuilds them on recovery).

Streaming (``spark.readStream.format("kafkalog")``, same options; ``endingOffsets`` not allowed):
offsets are ``{"<partition>": next offset}``; the latest offset of each partition is its last
stable offset on disk (read_committed) or log end offset, so a stream over a materializer data
dir that ``materializer run`` is filling follows the topic without the broker seeing a second
consumer. ``startingOffsets`` applies to the first batch only (Spark's checkpoint holds the rest);
partitions that appear later are read from their log start offset. A segment swap of the
materializer's cleaner in progress while offsets are planned is waited out (a few retries).
Records the cleaner removes below a batch's range before the batch reads it are not returned:
the stream then sees what a consumer of the compacted topic sees.

A materializer data dir is read only when its topic is complete enough
(:func:`materializer.data_dir.require_complete` without a store: a topic being restored or swapped,
or an interrupted ``spark compact`` output, is refused; ``run`` loading its store is not, its logs
are valid). Each split carries the generation of the topic's data it was planned on; an executor
refuses to read (or to finish reading) a split whose data dir has since been replaced by a restore.
Nothing is ever written to the folders, which may be on a read-only mount.

Mirrors ``org.apache.spark.sql.kafka010.KafkaSource``'s schema and offsets, over Kafka's
``read_committed`` rules (:mod:`materializer.storage.read_committed`).
"""

from __future__ import annotations

import itertools
import json
import time
from pathlib import Path
from typing import Iterator, Sequence

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.types import StructType

from ..data_dir import require_complete, topic_status  # standard library and storage only: light to import
from materializer.storage import _native
from materializer.storage.checkpoint import LOG_START_OFFSET_CHECKPOINT, read_offset_checkpoint
from materializer.storage.errors import IncompleteDataDirError, LogNotFoundError, StorageError
from materializer.storage.files import (
    INDEX_FILE_SUFFIX,
    LOG_FILE_SUFFIX,
    TIME_INDEX_FILE_SUFFIX,
    TXN_INDEX_FILE_SUFFIX,
    offset_from_file_name,
    topic_partition_dirs,
)
from materializer.storage.read_committed import (
    AbortedTxnSource,
    BatchKind,
    ReadOnlyPartition,
    checked_segment_batches,
    classify_batches,
    scan_transactions,
)
from materializer.storage.record_batch import TIMESTAMP_TYPE_MASK
from materializer.storage.record_scan import records_section
from materializer.storage.transaction_index import AbortedTxn
from materializer.spark.worker_daemon import drop_bundled_zips_in_spark_worker

__all__ = ["KafkaLogDataSource", "SegmentSplit", "plan_splits", "readable_end_offsets", "splits_frame", "KAFKALOG_SCHEMA"]

KAFKALOG_SCHEMA = ("key binary, value binary, topic string, partition int, offset long, timestamp timestamp, "
                   "timestampType int")
_HEADERS_COLUMN = ", headers array<struct<key: string, value: binary>>"
EARLIEST, LATEST = -2, -1


class SegmentSplit(InputPartition):
    """One segment's share of the read: records with offsets in ``[start_offset, end_offset)``.

    ``aborted`` holds ``(producer id, first offset, last offset)`` of the aborted transactions that
    overlap the range (read_committed only); ``is_last`` says a torn tail is a write in flight;
    ``generation`` the generation of the topic's data in its data dir when it was planned (None:
    no completeness marker, as in a broker's log dir). Pickled to the executor that reads it.
    """

    def __init__(self, topic: str, partition: int, log_path: str, next_base_offset: int | None, is_last: bool,
                 start_offset: int, end_offset: int, read_committed: bool,
                 aborted: tuple[tuple[int, int, int], ...], generation: str | None = None) -> None:
        super().__init__(log_path)
        self.topic = topic
        self.partition = partition
        self.log_path = log_path
        self.next_base_offset = next_base_offset
        self.is_last = is_last
        self.start_offset = start_offset
        self.end_offset = end_offset
        self.read_committed = read_committed
        self.aborted = aborted
        self.generation = generation

    def __repr__(self) -> str:
        return (f"SegmentSplit({self.topic}-{self.partition}, {self.log_path}, "
                f"offsets [{self.start_offset}, {self.end_offset}))")


def _partition_folders(paths: Sequence[Path], topic: str) -> dict[int, Path]:
    return topic_partition_dirs(paths, topic)


def _offsets_option(text: str | None, topic: str, default: int, name: str) -> dict[int, int] | int:
    if text is None or text == "":
        return default
    lowered = text.strip().lower()
    if lowered == "earliest":
        return EARLIEST
    if lowered == "latest":
        return LATEST
    try:
        parsed = json.loads(text)
        return {int(p): int(o) for p, o in parsed[topic].items()}
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"kafkalog: option {name}={text!r} is not earliest, latest or Spark's JSON "
                         f'{{"{topic}": {{"0": offset, ...}}}}') from exc


def _generations(roots: Sequence[Path], topic: str) -> dict[str, str | None]:
    """Root -> generation of ``topic``'s data there, refusing a topic being built or replaced.

    Raises:
        IncompleteDataDirError: a root's marker says the topic is incomplete (and its logs are not
            usable: a restore's swap, an interrupted ``spark compact``); the message says what to run.
    """
    return {str(root): require_complete(root, topic, needs_store=False).generation for root in roots}


def _check_generation(split: SegmentSplit) -> None:
    """Refuse a split whose data dir's topic was replaced (or is being) since it was planned."""
    root = Path(split.log_path).parent.parent
    status = topic_status(root, split.topic)
    if status.state == "incomplete" and not status.logs_usable:
        require_complete(root, split.topic, needs_store=False)  # raises, saying what is in progress
    if status.generation != split.generation:
        raise IncompleteDataDirError(f"topic {split.topic!r} in {root} was replaced (restored) while this query read "
                                     f"it; run the query again")


def _planned_unchanged(roots: Sequence[Path], topic: str, plan, attempts: int = 3):
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


def _log_start_offsets(roots: Sequence[Path], topic: str) -> dict[int, int]:
    log_starts: dict[int, int] = {}
    for root in roots:
        for (checkpoint_topic, partition), offset in read_offset_checkpoint(root / LOG_START_OFFSET_CHECKPOINT).items():
            if checkpoint_topic == topic:
                log_starts[partition] = offset
    return log_starts


def readable_end_offsets(paths: Sequence[Path | str], topic: str, *, read_committed: bool = True,
                         attempts: int = 5) -> dict[int, tuple[int, int]]:
    """``partition -> (log start offset, end)`` where ``end`` is the last stable offset
    (read_committed) or the log end offset: the streaming source's latest offsets.

    A folder caught in the middle of a segment swap (``.cleaned``/``.swap`` files) is read again
    after 0.1 s, up to ``attempts`` times.

    Raises:
        LogNotFoundError / CorruptRecordError / StorageError / IncompleteDataDirError: as :func:`plan_splits`.
    """
    roots = [Path(p) for p in paths]

    def plan(generations: dict[str, str | None]) -> dict[int, tuple[int, int]]:
        log_starts = _log_start_offsets(roots, topic)
        ends: dict[int, tuple[int, int]] = {}
        for partition, folder in sorted(_partition_folders(roots, topic).items()):
            source, scan = _scan_partition(folder, log_starts.get(partition), attempts)
            ends[partition] = (source.log_start_offset,
                               scan.last_stable_offset if read_committed else scan.log_end_offset)
        return ends

    return _planned_unchanged(roots, topic, plan)


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


def _scan_partition(folder: Path, log_start_offset: int | None, attempts: int = 5):
    """``(ReadOnlyPartition, TransactionScan)`` of ``folder``, read again (after 0.1 s, up to
    ``attempts`` times) when a cleaner's segment swap is in progress or a file vanishes meanwhile.

    Raises:
        LogNotFoundError: a segment's ``.log`` is missing while its index files are there (after
            the retries).
        CorruptRecordError / StorageError: damage, naming file and byte position.
    """
    for attempt in range(attempts):
        try:
            source = ReadOnlyPartition(folder, log_start_offset=log_start_offset)
            scan = scan_transactions(source, source=AbortedTxnSource.AUTO, verify_crc=True)
            missing = _missing_segment(folder, source, scan.log_end_offset, log_start_offset)
            if missing is None:
                return source, scan
            if attempt == attempts - 1:
                raise LogNotFoundError(missing)
        except FileNotFoundError:
            if attempt == attempts - 1:
                raise
        except StorageError as exc:  # CorruptRecordError and other damage are never retried
            if "interrupted segment swap" not in str(exc) or attempt == attempts - 1:
                raise
        time.sleep(0.1)
    raise AssertionError("unreachable")


def plan_splits(paths: Sequence[Path | str], topic: str, *, starting: dict[int, int] | int = EARLIEST,
                ending: dict[int, int] | int = LATEST, read_committed: bool = True,
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
            (:func:`materializer.data_dir.require_complete` without a store).
        CorruptRecordError / CorruptIndexError / StorageError: damage, naming file and byte position.
        ValueError: an offset outside the partition's range; ``min_partitions`` below 1.
    """
    if min_partitions is not None and min_partitions < 1:
        raise ValueError(f"kafkalog: minPartitions must be at least 1, got {min_partitions}")
    roots = [Path(p) for p in paths]
    return _planned_unchanged(roots, topic, lambda generations: _plan_splits(
        roots, topic, generations, starting, ending, read_committed, min_partitions))


def _plan_splits(roots: list[Path], topic: str, generations: dict[str, str | None], starting: dict[int, int] | int,
                 ending: dict[int, int] | int, read_committed: bool, min_partitions: int | None) -> list[SegmentSplit]:
    """:func:`plan_splits` once the data dirs' generations are known."""
    folders = _partition_folders(roots, topic)
    log_starts = _log_start_offsets(roots, topic)
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
            splits.append(SegmentSplit(topic, partition, str(segment.log_path), upper, i == len(segments) - 1,
                                       max(start, segment.base_offset), end if upper is None else min(end, upper),
                                       read_committed, tuple(aborted), generations.get(str(folder.parent))))
    if min_partitions is not None and len(splits) < min_partitions:
        splits = _cut_at_batches(splits, min_partitions)
    return splits


def _cut_at_batches(splits: list[SegmentSplit], min_partitions: int) -> list[SegmentSplit]:
    """``splits`` cut at batch base offsets into pieces of about ``total bytes / min_partitions``
    bytes (bytes of the batches each split reads), each piece with the aborted transactions that
    overlap its offsets. A segment that vanished since the scan (a cleaner's swap) stays one split:
    the executor looks its offsets up again anyway (:func:`_open_segment_of`)."""
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
            cut.append(SegmentSplit(split.topic, split.partition, split.log_path, split.next_base_offset,
                                    split.is_last, first, after, split.read_committed, aborted, split.generation))
    return cut


def read_split(split: SegmentSplit, include_headers: bool, max_rows: int = 65_536,
               max_data_bytes: int = 256 << 20) -> Iterator[pa.RecordBatch]:
    """Decode one split into Arrow record batches (the executor's part).

    Each record batch the split keeps is decompressed and its records section handed to the
    native core (``_native.ArrowColumns``), which writes the Arrow buffers directly: no Python
    object per record. An Arrow batch is cut at ``max_rows`` rows or ``max_data_bytes`` bytes of
    keys, values and headers (Arrow's binary offsets are int32).

    Raises:
        CorruptRecordError: a batch fails its framing, offset or CRC check (file and byte position).
        IncompleteDataDirError: the topic's data dir was replaced (restored) since the split was
            planned, or is being replaced (checked before reading and once everything is read).
    """
    _check_generation(split)
    aborted = [AbortedTxn(p, first, last, last + 1) for p, first, last in split.aborted]
    start, end = split.start_offset, split.end_offset
    batches = (batch for _, batch in _open_segment_of(split) if batch.last_offset >= start)
    columns = _native.ArrowColumns(include_headers)
    for batch, kind in classify_batches(_until(_crc_checked(batches), end), aborted, start, end):
        if kind is BatchKind.CONTROL or (kind is BatchKind.ABORTED and split.read_committed):
            continue
        header = batch.header
        if header.records_count <= 0:
            batch.records()  # empty: nothing to add; a negative count raises with file and position
            continue
        log_append_time = header.max_timestamp if header.attributes & TIMESTAMP_TYPE_MASK else None
        try:
            columns.add_records(records_section(batch), header.records_count, header.base_offset,
                                header.base_timestamp, log_append_time, int(batch.timestamp_type),
                                split.partition, start, end)
        except ValueError as exc:
            raise batch._error(f"invalid records in batch at base offset {header.base_offset}: {exc}") from exc
        if columns.rows >= max_rows or columns.data_bytes >= max_data_bytes:
            yield _to_arrow(columns.take(), split.topic, include_headers)
    _check_generation(split)  # what was read (and yielded) belongs to the planned data, or the task fails
    if columns.rows:
        yield _to_arrow(columns.take(), split.topic, include_headers)


def splits_frame(spark, splits: Sequence[SegmentSplit], include_headers: bool = False):
    """The rows ``format("kafkalog")`` gives for ``splits``, planned here on the driver: a DataFrame
    of :data:`KAFKALOG_SCHEMA` (plus ``headers`` if ``include_headers``), one task per split.

    For jobs that already hold their splits (:func:`materializer.spark.jobs.snapshot` writes the
    splits' end offsets into its manifest): the executors read exactly those splits with
    :func:`read_split`, and Spark's Python data source planning (``pyspark.sql.worker``
    ``create_data_source`` and ``plan_data_source_read``, each a Python process of its own on the
    driver, started on first use) is not involved. ``splits`` travel with the task closure, not
    as a Spark broadcast: each task gets the list (paths, offsets, aborted transactions).

    Raises (when an action runs): Spark's error wrapping :class:`CorruptRecordError` /
    :class:`StorageError` from an executor, as the data source's read does.
    """
    schema = KAFKALOG_SCHEMA + (_HEADERS_COLUMN if include_headers else "")
    chosen = tuple(splits)
    if not chosen:
        return spark.createDataFrame([], schema)

    def read(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            for index in batch.column(0).to_pylist():
                yield from read_split(chosen[index], include_headers)

    return spark.range(0, len(chosen), 1, len(chosen)).mapInArrow(read, schema)


def _binary_array(buffers: tuple, length: int, arrow_type: pa.DataType | None = None) -> pa.Array:
    validity, offsets, data, nulls = buffers
    return pa.Array.from_buffers(arrow_type or pa.binary(), length, [None if validity is None else pa.py_buffer(validity),
                                                      pa.py_buffer(offsets), pa.py_buffer(data)], null_count=nulls)


def _to_arrow(buffers: dict, topic: str, include_headers: bool) -> pa.RecordBatch:
    """The Arrow record batch of Spark's Kafka source schema over the native core's buffers."""
    rows = buffers["rows"]
    arrays = [
        _binary_array(buffers["key"], rows), _binary_array(buffers["value"], rows),
        pa.repeat(pa.scalar(topic, pa.string()), rows),
        pa.Array.from_buffers(pa.int32(), rows, [None, pa.py_buffer(buffers["partition"])]),
        pa.Array.from_buffers(pa.int64(), rows, [None, pa.py_buffer(buffers["offset"])]),
        pa.Array.from_buffers(pa.timestamp("us", tz="UTC"), rows, [None, pa.py_buffer(buffers["timestamp"])]),
        pa.Array.from_buffers(pa.int32(), rows, [None, pa.py_buffer(buffers["timestampType"])]),
    ]
    names = ["key", "value", "topic", "partition", "offset", "timestamp", "timestampType"]
    if include_headers:
        header_rows = buffers["header_rows"]
        entries = pa.StructArray.from_arrays(
            [_binary_array(buffers["header_key"], header_rows, pa.string()),
             _binary_array(buffers["header_value"], header_rows)], names=["key", "value"])
        arrays.append(pa.ListArray.from_arrays(pa.Array.from_buffers(pa.int32(), rows + 1,
                                                                     [None, pa.py_buffer(buffers["header_list"])]),
                                               entries))
        names.append("headers")
    return pa.RecordBatch.from_arrays(arrays, names=names)


def _open_segment_of(split: SegmentSplit, attempts: int = 5) -> Iterator[tuple[int, object]]:
    """The batches of the segment that holds ``split.start_offset`` now, its file already mapped.

    Between the driver's plan and this read, a cleaner working on the folder (``materializer run``'s)
    may have replaced segments: grouped several into one file named by the first base offset, or
    swapped in a cleaned copy. So the segment is looked up again here, with its current next base
    offset, and mapped at once (a later swap cannot change what is mapped); a file that vanishes
    between listing and opening is looked up again.

    Raises:
        StorageError: the offsets are no longer in the folder (retention deleted them).
        CorruptRecordError: as :func:`checked_segment_batches`.
    """
    folder = Path(split.log_path).parent
    for attempt in range(attempts):
        try:
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
        except FileNotFoundError:
            if attempt == attempts - 1:
                raise
        except StorageError as exc:  # a segment swap in progress (.cleaned/.swap files present)
            if "interrupted segment swap" not in str(exc) or attempt == attempts - 1:
                raise
        else:
            return iter(()) if first is None else itertools.chain([first], batches)
        time.sleep(0.1)
    raise AssertionError("unreachable")


def _crc_checked(batches):
    for batch in batches:
        batch.ensure_valid()
        yield batch


def _until(batches, end: int):
    for batch in batches:
        if batch.base_offset >= end:
            return
        yield batch


class _KafkaLogReader(DataSourceReader):
    def __init__(self, options: dict[str, str]):
        options = {str(k).lower(): v for k, v in options.items()}  # Spark's option names ignore case
        self.options = options
        topic = options.get("topic")
        path = options.get("path")
        if not topic or not path:
            raise ValueError("kafkalog: options 'path' and 'topic' are required")
        isolation = str(options.get("isolation", options.get("kafka.isolation.level", "read_committed"))).lower()
        if isolation not in ("read_committed", "read_uncommitted"):
            raise ValueError(f"kafkalog: isolation {isolation!r}: expected read_committed or read_uncommitted")
        self.topic = topic
        self.paths = [p.strip() for p in path.split(",") if p.strip()]
        self.read_committed = isolation == "read_committed"
        self.include_headers = str(options.get("includeheaders", "false")).lower() == "true"
        self.starting = _offsets_option(options.get("startingoffsets"), topic, EARLIEST, "startingOffsets")
        self.ending = _offsets_option(options.get("endingoffsets"), topic, LATEST, "endingOffsets")
        min_partitions = options.get("minpartitions")
        try:
            self.min_partitions = None if min_partitions in (None, "") else int(min_partitions)
        except ValueError as exc:
            raise ValueError(f"kafkalog: option minPartitions={min_partitions!r} is not a whole number") from exc

    def partitions(self) -> list[SegmentSplit]:
        return plan_splits(self.paths, self.topic, starting=self.starting, ending=self.ending,
                           read_committed=self.read_committed, min_partitions=self.min_partitions)

    def read(self, partition: SegmentSplit) -> Iterator[pa.RecordBatch]:
        return read_split(partition, self.include_headers)


class _KafkaLogStreamReader(DataSourceStreamReader):
    """Micro-batches over partition folders that keep growing (see the module docstring)."""

    def __init__(self, options: dict[str, str]):
        self.batch = _KafkaLogReader(options)
        if "endingoffsets" in self.batch.options:
            raise ValueError("kafkalog: endingOffsets is for batch queries; a stream reads until it is stopped")

    def _ends(self) -> dict[int, tuple[int, int]]:
        return readable_end_offsets(self.batch.paths, self.batch.topic, read_committed=self.batch.read_committed)

    def initialOffset(self) -> dict:
        starting = self.batch.starting
        offsets = {}
        for partition, (log_start, end) in self._ends().items():
            wanted = starting if isinstance(starting, int) else starting.get(partition, EARLIEST)
            offsets[str(partition)] = log_start if wanted == EARLIEST else end if wanted == LATEST else wanted
        return offsets

    def latestOffset(self) -> dict:
        return {str(partition): end for partition, (_, end) in self._ends().items()}

    def partitions(self, start: dict, end: dict) -> list[SegmentSplit]:
        ending = {int(p): int(o) for p, o in end.items()}
        starting = {int(p): int(start.get(p, EARLIEST)) for p in end}
        return plan_splits(self.batch.paths, self.batch.topic, starting=starting, ending=ending,
                           read_committed=self.batch.read_committed, min_partitions=self.batch.min_partitions)

    def read(self, partition: SegmentSplit) -> Iterator[pa.RecordBatch]:
        return read_split(partition, self.batch.include_headers)

    def commit(self, end: dict) -> None:
        """Nothing to release: the folders are only read."""


class KafkaLogDataSource(DataSource):
    """The ``kafkalog`` format: register with ``spark.dataSource.register(KafkaLogDataSource)``
    (:func:`materializer.spark.jobs.spark_session` does it). See the module docstring."""

    @classmethod
    def name(cls) -> str:
        return "kafkalog"

    def schema(self) -> str:
        drop_bundled_zips_in_spark_worker()  # this runs in Spark's create_data_source process
        options = {str(k).lower(): v for k, v in self.options.items()}
        include = str(options.get("includeheaders", "false")).lower() == "true"
        return KAFKALOG_SCHEMA + (_HEADERS_COLUMN if include else "")

    def reader(self, schema: StructType) -> DataSourceReader:
        drop_bundled_zips_in_spark_worker()  # in Spark's plan_data_source_read process
        return _KafkaLogReader(dict(self.options))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        drop_bundled_zips_in_spark_worker()
        return _KafkaLogStreamReader(dict(self.options))

