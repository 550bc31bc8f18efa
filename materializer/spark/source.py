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

Option names are case-insensitive, as Spark's are (``minpartitions`` is ``minPartitions``).

Work is split by segment, not by Kafka partition, so parallelism is not capped by the partition
count: the driver makes the cheap pass (batch headers, CRCs, ``.txnindex``: the aborted
transactions and the last stable offset of each partition) and hands each split its segment file,
offset range and the aborted transactions it needs (:mod:`materializer.spark.splits`); executors
decode batches straight into Arrow record batches (:mod:`materializer.spark.split_reader`). Control batches never appear. Damage (a corrupt batch, offsets out of order, a
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
(:func:`materializer.datadir.markers.require_complete` without a store: a topic being restored or swapped,
or an interrupted ``spark compact`` output, is refused; ``run`` loading its store is not, its logs
are valid). Each split carries the generation of the topic's data it was planned on; an executor
refuses to read (or to finish reading) a split whose data dir has since been replaced by a restore.
Nothing is ever written to the folders, which may be on a read-only mount.

Mirrors ``org.apache.spark.sql.kafka010.KafkaSource``'s schema and offsets, over Kafka's
``read_committed`` rules (:mod:`materializer.storage.read_committed`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Iterator, Mapping

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.types import StructType

from materializer.spark.split_reader import kafkalog_schema, read_split
from materializer.spark.splits import EARLIEST, LATEST, Offsets, SegmentSplit, plan_splits, readable_end_offsets
from materializer.spark.worker_daemon import drop_bundled_zips_in_spark_worker

__all__ = ["KafkaLogDataSource"]


def _offsets_option(text: str | None, topic: str, default: int, name: str) -> Offsets:
    """``startingOffsets`` / ``endingOffsets`` (``text``) as :data:`Offsets` of ``topic``.

    Raises:
        ValueError: not ``earliest``, ``latest`` or Spark's JSON ``{"<topic>": {"<partition>": offset}}``.
    """
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


class _Options:
    """A query's options by name, names compared without case: Spark's option names ignore case
    (``option("STARTINGOFFSETS", ...)`` is ``startingOffsets``). PySpark hands a data source a
    case-insensitive dict; a plain one (a caller of :class:`KafkaLogDataSource`) is read the same."""

    def __init__(self, options: Mapping[str, str]) -> None:
        self._by_name = {str(name).lower(): value for name, value in options.items()}

    def get(self, name: str, default: str | None = None) -> str | None:
        """The value of option ``name`` (any case), or ``default``."""
        return self._by_name.get(name.lower(), default)

    def __contains__(self, name: str) -> bool:
        return name.lower() in self._by_name


def _include_headers(options: _Options) -> bool:
    return str(options.get("includeHeaders", "false")).lower() == "true"


@dataclass(frozen=True)
class _Query:
    """One query's options, parsed (the module docstring lists them)."""

    topic: str
    paths: tuple[str, ...]
    read_committed: bool
    include_headers: bool
    starting: Offsets
    ending: Offsets
    min_partitions: int | None

    @classmethod
    def parse(cls, options: _Options) -> _Query:
        """The query ``options`` describe.

        Raises:
            ValueError: ``path`` or ``topic`` missing, or an option's value is not one it takes.
        """
        topic, path = options.get("topic"), options.get("path")
        if not topic or not path:
            raise ValueError("kafkalog: options 'path' and 'topic' are required")
        isolation = str(options.get("isolation", options.get("kafka.isolation.level", "read_committed"))).lower()
        if isolation not in ("read_committed", "read_uncommitted"):
            raise ValueError(f"kafkalog: isolation {isolation!r}: expected read_committed or read_uncommitted")
        include_headers = _include_headers(options)
        starting = _offsets_option(options.get("startingOffsets"), topic, EARLIEST, "startingOffsets")
        ending = _offsets_option(options.get("endingOffsets"), topic, LATEST, "endingOffsets")
        min_partitions = options.get("minPartitions")
        try:
            minimum = None if min_partitions in (None, "") else int(str(min_partitions))
        except ValueError as exc:
            raise ValueError(f"kafkalog: option minPartitions={min_partitions!r} is not a whole number") from exc
        return cls(topic=topic, paths=tuple(p.strip() for p in path.split(",") if p.strip()),
                   read_committed=isolation == "read_committed", include_headers=include_headers,
                   starting=starting, ending=ending, min_partitions=minimum)

    def splits(self, starting: Offsets, ending: Offsets) -> list[SegmentSplit]:
        """:func:`plan_splits` of this query's folders and topic over ``[starting, ending)``."""
        return plan_splits(self.paths, self.topic, starting=starting, ending=ending,
                           read_committed=self.read_committed, min_partitions=self.min_partitions)


def _read_split_of(partition: InputPartition, include_headers: bool) -> Iterator[pa.RecordBatch]:
    """:func:`read_split` of a partition Spark hands back (one this module planned)."""
    if not isinstance(partition, SegmentSplit):
        raise TypeError(f"kafkalog: expected a SegmentSplit, got {type(partition).__name__}")
    return read_split(partition, include_headers)


class _KafkaLogReader(DataSourceReader):
    """A batch query: the splits of ``[startingOffsets, endingOffsets)``, each read on an executor."""

    def __init__(self, query: _Query) -> None:
        self.query = query

    def partitions(self) -> list[SegmentSplit]:
        return self.query.splits(self.query.starting, self.query.ending)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _read_split_of(partition, self.query.include_headers)


class _KafkaLogStreamReader(DataSourceStreamReader):
    """Micro-batches over partition folders that keep growing (see the module docstring).

    Offsets are ``{"<partition>": next offset}`` (JSON object keys are strings)."""

    def __init__(self, query: _Query) -> None:
        self.query = query

    def _ends(self) -> dict[int, tuple[int, int]]:
        return readable_end_offsets(self.query.paths, self.query.topic, read_committed=self.query.read_committed)

    def initialOffset(self) -> dict[str, int]:
        starting = self.query.starting
        offsets = {}
        for partition, (log_start, end) in self._ends().items():
            wanted = starting if isinstance(starting, int) else starting.get(partition, EARLIEST)
            offsets[str(partition)] = log_start if wanted == EARLIEST else end if wanted == LATEST else wanted
        return offsets

    def latestOffset(self) -> dict[str, int]:
        return {str(partition): end for partition, (_, end) in self._ends().items()}

    def partitions(self, start: dict, end: dict) -> list[SegmentSplit]:
        ending = {int(p): int(o) for p, o in end.items()}
        starting = {int(p): int(start.get(p, EARLIEST)) for p in end}
        return self.query.splits(starting, ending)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _read_split_of(partition, self.query.include_headers)

    def commit(self, end: dict) -> None:
        """Nothing to release: the folders are only read."""


class KafkaLogDataSource(DataSource):
    """The ``kafkalog`` format: register with ``spark.dataSource.register(KafkaLogDataSource)``
    (:func:`materializer.spark.jobs.spark_session` does it). See the module docstring.

    ``options``: the query's options, names in any case (Spark's rule).

    Raises (from :meth:`reader` / :meth:`streamReader`, when Spark plans the query):
        ValueError: ``path`` or ``topic`` missing, an option's value it does not take, or
            ``endingOffsets`` on a stream.
    """

    def __init__(self, options: dict[str, str]) -> None:
        super().__init__(options)
        self._options = _Options(options)  # the one place where option names lose their case

    @classmethod
    def name(cls) -> str:
        return "kafkalog"

    def schema(self) -> str:
        drop_bundled_zips_in_spark_worker()  # this runs in Spark's create_data_source process
        return kafkalog_schema(_include_headers(self._options))

    def reader(self, schema: StructType) -> DataSourceReader:
        drop_bundled_zips_in_spark_worker()  # in Spark's plan_data_source_read process
        return _KafkaLogReader(_Query.parse(self._options))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        drop_bundled_zips_in_spark_worker()
        query = _Query.parse(self._options)
        if "endingOffsets" in self._options:
            raise ValueError("kafkalog: endingOffsets is for batch queries; a stream reads until it is stopped")
        return _KafkaLogStreamReader(query)
