"""``kafkalog``'s options, received as Spark hands them: names in any case.

Spark's option names ignore case (PySpark's data source docs: ``options`` is "a case-insensitive
dictionary"), so ``option("minpartitions", 3)`` is ``minPartitions``. The data source is driven
here without Spark, as Spark's planning processes drive it (``schema()``, ``reader(schema)``,
``streamReader(schema)``), over a partition folder written with the project's log: plain
batches, an aborted and a committed transaction.
"""

from __future__ import annotations

import json

import pytest
from pyspark.sql.types import StructType

from materializer.spark.source import KafkaLogDataSource
from materializer.spark.split_reader import KAFKALOG_SCHEMA
from materializer.spark.splits import plan_splits
from materializer.storage.log import Log
from materializer.storage.log_config import LogConfig

from tests.unit.storage.test_read_committed import LogWriter

TOPIC = "topic"


@pytest.fixture
def log_dir(tmp_path):
    """``topic-0`` in one segment: offsets 0-2 plain, 3-4 aborted (7), 5-6 committed (8), 9-12 plain."""
    log = Log.open(tmp_path / f"{TOPIC}-0", LogConfig(), had_clean_shutdown=True)
    writer = LogWriter(log)
    writer.plain(3)
    writer.txn(7, 2, key=b"a")
    writer.txn(8, 2, key=b"b")
    writer.end(7, commit=False)
    writer.end(8, commit=True)
    for _ in range(4):
        writer.plain(1, key=b"p%d" % writer.next_offset)
    log.close()
    return tmp_path


def _spelled(case: str, name: str) -> str:
    return {"spark": name, "lower": name.lower(), "upper": name.upper(), "title": name[:1].upper() + name[1:]}[case]


def _options(case: str, **values: str) -> dict[str, str]:
    return {_spelled(case, name): value for name, value in values.items()}


def _rows(reader, splits) -> list[tuple]:
    rows = []
    for split in splits:
        for batch in reader.read(split):
            rows.extend(zip(*(batch.column(name).to_pylist() for name in batch.schema.names)))
    return rows


@pytest.mark.parametrize("case", ["spark", "lower", "upper", "title"])
def test_option_names_are_case_insensitive(log_dir, case):
    given = _options(case, path=str(log_dir), topic=TOPIC, includeHeaders="true", minPartitions="3",
                     startingOffsets=json.dumps({TOPIC: {"0": 1}}), endingOffsets=json.dumps({TOPIC: {"0": 12}}),
                     isolation="read_uncommitted")
    source = KafkaLogDataSource(given)
    assert source.schema() == KAFKALOG_SCHEMA + ", headers array<struct<key: string, value: binary>>"
    reader = source.reader(StructType())
    splits = reader.partitions()
    assert splits == plan_splits([log_dir], TOPIC, starting={0: 1}, ending={0: 12}, read_committed=False,
                                 min_partitions=3)
    assert len(splits) == 3 and (splits[0].start_offset, splits[-1].end_offset) == (1, 12)
    rows = _rows(reader, splits)
    assert [row[4] for row in rows] == [1, 2, 3, 4, 5, 6, 9, 10, 11]  # the aborted 3-4 too: read_uncommitted
    assert all(len(row) == 8 for row in rows)  # the headers column


@pytest.mark.parametrize("name", ["kafka.isolation.level", "KAFKA.ISOLATION.LEVEL", "Kafka.Isolation.Level"])
def test_spark_kafka_isolation_level_in_any_case(log_dir, name):
    reader = KafkaLogDataSource({"Path": str(log_dir), "Topic": TOPIC, name: "READ_UNCOMMITTED"}).reader(StructType())
    assert {s.read_committed for s in reader.partitions()} == {False}
    committed = KafkaLogDataSource({"path": str(log_dir), "topic": TOPIC}).reader(StructType())
    assert [row[4] for row in _rows(committed, committed.partitions())] == [0, 1, 2, 5, 6, 9, 10, 11, 12]


def test_schema_without_headers_and_required_options(log_dir):
    assert KafkaLogDataSource({"INCLUDEHEADERS": "false"}).schema() == KAFKALOG_SCHEMA
    assert KafkaLogDataSource({}).schema() == KAFKALOG_SCHEMA  # no path needed to say the schema
    with pytest.raises(ValueError, match="options 'path' and 'topic' are required"):
        KafkaLogDataSource({"TOPIC": TOPIC}).reader(StructType())
    with pytest.raises(ValueError, match="minPartitions='x' is not a whole number"):
        KafkaLogDataSource({"Path": str(log_dir), "Topic": TOPIC, "MINPARTITIONS": "x"}).reader(StructType())
    with pytest.raises(ValueError, match="option startingOffsets='nope' is not earliest, latest"):
        KafkaLogDataSource({"Path": str(log_dir), "Topic": TOPIC, "startingoffsets": "nope"}).reader(StructType())


@pytest.mark.parametrize("case", ["spark", "lower", "upper"])
def test_stream_refuses_ending_offsets_in_any_case_and_starts_where_asked(log_dir, case):
    with pytest.raises(ValueError, match="endingOffsets is for batch queries"):
        KafkaLogDataSource(_options(case, path=str(log_dir), topic=TOPIC, endingOffsets="latest")).streamReader(
            StructType())
    stream = KafkaLogDataSource(_options(case, path=str(log_dir), topic=TOPIC, startingOffsets="latest")).streamReader(
        StructType())
    assert stream.initialOffset() == stream.latestOffset() == {"0": 13}
    earliest = KafkaLogDataSource(_options(case, path=str(log_dir), topic=TOPIC)).streamReader(StructType())
    assert earliest.initialOffset() == {"0": 0}
