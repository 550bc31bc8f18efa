"""The executor's part of a ``kafkalog`` read: one :class:`~materializer.spark.splits.SegmentSplit`
decoded into Arrow record batches of Spark's Kafka source schema::

    key binary, value binary, topic string, partition int, offset long,
    timestamp timestamp, timestampType int [, headers array<struct<key: string, value: binary>>]

:func:`read_split` looks the split's segment up again (a cleaner may have swapped it since the
plan), checks every batch's CRC-32C, removes control batches and (read_committed) the aborted
transactions of the split, and hands each kept batch's records to the native core, which writes
the Arrow buffers directly. :func:`splits_frame` runs it on Spark's executors for splits planned
on the driver, without Spark's data source planning.

Mirrors the columns of ``org.apache.spark.sql.kafka010.KafkaSource``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable, Iterator, Sequence

import pyarrow as pa

from materializer.spark.splits import SegmentSplit, check_generation, segment_batches
from materializer.storage import _native
from materializer.storage.read_committed import BatchKind, classify_batches
from materializer.storage.record_batch import TIMESTAMP_TYPE_MASK, RecordBatch
from materializer.storage.record_scan import records_section
from materializer.storage.transaction_index import AbortedTxn

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["KAFKALOG_SCHEMA", "kafkalog_schema", "read_split", "splits_frame"]

KAFKALOG_SCHEMA = ("key binary, value binary, topic string, partition int, offset long, timestamp timestamp, "
                   "timestampType int")
_HEADERS_COLUMN = ", headers array<struct<key: string, value: binary>>"


def kafkalog_schema(include_headers: bool) -> str:
    """:data:`KAFKALOG_SCHEMA`, plus the ``headers`` column if ``include_headers`` (Spark DDL)."""
    return KAFKALOG_SCHEMA + (_HEADERS_COLUMN if include_headers else "")


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
    check_generation(split)
    aborted = [AbortedTxn(p, first, last, last + 1) for p, first, last in split.aborted]
    start, end = split.start_offset, split.end_offset
    batches = (batch for _, batch in segment_batches(split) if batch.last_offset >= start)
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
            raise batch.corruption_error(f"invalid records in batch at base offset {header.base_offset}: {exc}") from exc
        if columns.rows >= max_rows or columns.data_bytes >= max_data_bytes:
            yield _to_arrow(columns.take(), split.topic, include_headers)
    check_generation(split)  # what was read (and yielded) belongs to the planned data, or the task fails
    if columns.rows:
        yield _to_arrow(columns.take(), split.topic, include_headers)


def splits_frame(spark: SparkSession, splits: Sequence[SegmentSplit], include_headers: bool = False) -> DataFrame:
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
    schema = kafkalog_schema(include_headers)
    chosen = tuple(splits)
    if not chosen:
        return spark.createDataFrame([], schema)

    def read(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            for index in batch.column(0).to_pylist():
                yield from read_split(chosen[index], include_headers)

    return spark.range(0, len(chosen), 1, len(chosen)).mapInArrow(read, schema)


def _crc_checked(batches: Iterable[RecordBatch]) -> Iterator[RecordBatch]:
    for batch in batches:
        batch.ensure_valid()
        yield batch


def _until(batches: Iterable[RecordBatch], end: int) -> Iterator[RecordBatch]:
    for batch in batches:
        if batch.base_offset >= end:
            return
        yield batch


def _binary_array(buffers: tuple[bytes | None, bytes, bytes, int], length: int,
                  arrow_type: pa.DataType | None = None) -> pa.Array:
    validity, offsets, data, nulls = buffers
    return pa.Array.from_buffers(arrow_type or pa.binary(), length, [None if validity is None else pa.py_buffer(validity),
                                                      pa.py_buffer(offsets), pa.py_buffer(data)], null_count=nulls)


def _to_arrow(buffers: dict[str, Any], topic: str, include_headers: bool) -> pa.RecordBatch:
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
