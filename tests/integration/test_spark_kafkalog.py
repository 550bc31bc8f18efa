"""`kafkalog` on Spark against a real broker's log dir (issue 8): same rows as a read_committed consumer.

A three-partition topic gets batches of every codec, a committed and an aborted transaction,
tombstones and headers; the broker's own partition folders (live, read in place, read-only) are
then read with ``spark.read.format("kafkalog")`` and compared row for row with what a
read_committed consumer reads from the broker. ``read_uncommitted`` shows the aborted records
(the pitfall of Spark's Kafka source, whose default is read_uncommitted); the snapshot job equals
the consumer's latest value per (partition, key); damage fails with the file and byte position.
"""

from __future__ import annotations

import json
import shutil
import time
import uuid

import pytest


from materializer.spark_jobs import executor_error, snapshot, spark_session

from .broker_reads import read_topic
from .test_ingest import CODECS, Produced, produce

pytestmark = pytest.mark.broker


@pytest.fixture(scope="module")
def spark():
    session = spark_session("local[2]")
    yield session
    session.stop()


@pytest.fixture(scope="module")
def produced_topic(kafka_broker):
    if kafka_broker.log_dirs is None:
        pytest.fail("kafkalog tests read the broker's log dir: this broker does not expose one (set KAFKA_LOG_DIRS)")
    from confluent_kafka.admin import AdminClient, NewTopic

    topic = f"kafkalog-{uuid.uuid4().hex[:8]}"
    bootstrap = kafka_broker.bootstrap_servers
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, num_partitions=3, replication_factor=1)])[topic].result(30)
    deadline = time.monotonic() + 30
    while not all(p.leader >= 0 for p in admin.list_topics(topic=topic, timeout=5).topics[topic].partitions.values()):
        assert time.monotonic() < deadline, "no partition leaders after 30 s"
        time.sleep(0.2)
    produced = Produced()
    for seed, codec in enumerate(CODECS):
        produce(bootstrap, topic, produced, count=400, keys=120, codec=codec, seed=seed)
    produce(bootstrap, topic, produced, count=300, keys=120, codec="lz4", seed=20, transactional_id="tx-commit")
    produce(bootstrap, topic, produced, count=300, keys=120, codec="zstd", seed=21, transactional_id="tx-abort",
            abort=True)
    produce(bootstrap, topic, produced, count=200, keys=120, codec="gzip", seed=22)
    return topic, bootstrap, kafka_broker.log_dirs


def _consumer_rows(bootstrap, topic, isolation="read_committed"):
    rows = []
    for partition, records in read_topic(bootstrap, topic, 3, isolation_level=isolation).items():
        for record, _ in records:
            rows.append((partition, record.offset, record.key, record.value, record.timestamp,
                         tuple((k, v) for k, v in record.headers)))
    return sorted(rows)


def _kafkalog_rows(spark, log_dir, topic, **options):
    reader = spark.read.format("kafkalog").option("path", str(log_dir)).option("topic", topic)
    reader = reader.option("includeHeaders", "true")
    for name, value in options.items():
        reader = reader.option(name, value)
    rows = []
    for row in reader.load().collect():
        millis = int(row.timestamp.timestamp() * 1000 + 0.5)
        rows.append((row.partition, row.offset, None if row.key is None else bytes(row.key),
                     None if row.value is None else bytes(row.value), millis,
                     tuple((h.key, None if h.value is None else bytes(h.value)) for h in row.headers)))
    return sorted(rows)


def test_kafkalog_equals_a_read_committed_consumer(spark, produced_topic):
    topic, bootstrap, log_dir = produced_topic
    expected = _consumer_rows(bootstrap, topic)
    assert len(expected) == 5 * 400 + 300 + 200
    assert _kafkalog_rows(spark, log_dir, topic) == expected
    schema = spark.read.format("kafkalog").option("path", str(log_dir)).option("topic", topic).load().schema
    assert [f.name for f in schema.fields] == ["key", "value", "topic", "partition", "offset", "timestamp",
                                               "timestampType"]  # Spark's Kafka source columns


def test_read_uncommitted_shows_the_aborted_transaction(spark, produced_topic):
    topic, bootstrap, log_dir = produced_topic
    uncommitted = _kafkalog_rows(spark, log_dir, topic, isolation="read_uncommitted")
    assert uncommitted == _consumer_rows(bootstrap, topic, "read_uncommitted")
    assert len(uncommitted) == len(_consumer_rows(bootstrap, topic)) + 300  # the pitfall: aborted records


def test_offsets_options_select_a_range(spark, produced_topic):
    topic, bootstrap, log_dir = produced_topic
    expected = [r for r in _consumer_rows(bootstrap, topic) if r[0] == 1 and 100 <= r[1] < 700]
    rows = _kafkalog_rows(spark, log_dir, topic, startingOffsets=json.dumps({topic: {"1": 100, "0": -1, "2": -1}}),
                          endingOffsets=json.dumps({topic: {"1": 700}}))
    assert rows == expected


def test_snapshot_equals_the_consumers_latest_values(spark, produced_topic, tmp_path):
    topic, bootstrap, log_dir = produced_topic
    latest = {}
    for partition, _, key, value, _, _ in _consumer_rows(bootstrap, topic):
        latest[(partition, key)] = value
    expected = {k: v for k, v in latest.items() if v is not None}
    manifest = snapshot(spark, [log_dir], topic, tmp_path / "snap")
    rows = spark.read.parquet(str(tmp_path / "snap")).collect()
    assert {(r.partition, bytes(r.key)): bytes(r.value) for r in rows} == expected
    assert manifest["rows"] == len(expected)
    ends = {p: rows_[-1][0].offset + 1 for p, rows_ in read_topic(bootstrap, topic, 3).items()}
    assert {int(p): o for p, o in manifest["partitions"].items()}.keys() == ends.keys()
    assert all(o >= ends[int(p)] for p, o in manifest["partitions"].items())


def test_damage_fails_with_file_and_position(spark, produced_topic, tmp_path):
    topic, _, log_dir = produced_topic
    copy = tmp_path / "copy"
    shutil.copytree(log_dir / f"{topic}-0", copy / f"{topic}-0")
    segment = sorted((copy / f"{topic}-0").glob("*.log"))[0]
    data = bytearray(segment.read_bytes())
    data[200] ^= 0xFF  # inside the first batch's CRC-covered bytes
    segment.write_bytes(bytes(data))
    with pytest.raises(Exception) as info:  # Spark wraps the planner's error in its own exception
        spark.read.format("kafkalog").option("path", str(copy)).option("topic", topic).load().count()
    line = executor_error(info.value)
    assert line.startswith("CorruptRecordError: ") and f"{segment} at byte position 0" in line, line
    with pytest.raises(Exception, match="no partition folder"):
        spark.read.format("kafkalog").option("path", str(tmp_path)).option("topic", "absent").load().count()


def test_snapshot_command_line(produced_topic, tmp_path):
    import subprocess
    import sys

    topic, bootstrap, log_dir = produced_topic
    command = [sys.executable, "-m", "materializer", "spark", "snapshot", "--log-dir", str(log_dir), "--topic", topic,
               "--out", str(tmp_path / "snap"), "--master", "local[1]"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    manifest = json.loads((tmp_path / "snap" / "_manifest.json").read_text())
    assert result.stdout.startswith(f"{topic}: {manifest['rows']} rows into ")
    missing = subprocess.run([*command[:-4], "--topic", "absent", "--out", str(tmp_path / "x")], capture_output=True,
                             text=True, timeout=300)
    assert missing.returncode != 0 and "no partition folder of topic 'absent'" in missing.stderr
    assert "Traceback" not in missing.stderr


def test_compact_on_spark_equals_the_sequential_cleaner_and_kafka_reads_it(spark, kafka_broker, produced_topic,
                                                                           tmp_path):
    """One Spark task per partition gives the bytes the cleaner gives partition after partition."""
    from materializer.compact import compact_topic
    from materializer.config import topic_config_path
    from materializer.spark_compact import spark_compact
    from materializer.storage.checkpoint import LOG_START_OFFSET_CHECKPOINT, update_offset_checkpoint
    from materializer.storage.log_config import LogConfig

    topic, _, log_dir = produced_topic
    now_ms = 1_800_000_000_000
    configs = {"segment.bytes": "16384", "delete.retention.ms": "0"}
    results = spark_compact(spark, [log_dir], topic, tmp_path / "spark", configs=configs, to_log_end=True,
                            now_ms=now_ms)
    assert [r.partition for r in results] == [0, 1, 2]
    assert all(r.size_after_bytes < r.size_before_bytes for r in results)

    sequential = tmp_path / "sequential"
    for p in range(3):
        shutil.copytree(log_dir / f"{topic}-{p}", sequential / f"{topic}-{p}",
                        ignore=shutil.ignore_patterns("*.snapshot", "partition.metadata", "leader-epoch-checkpoint"))
    config_path = topic_config_path(sequential, topic)
    config_path.parent.mkdir(parents=True)
    LogConfig.from_kafka_configs({**configs, "cleanup.policy": "compact"}).save(config_path)
    update_offset_checkpoint(sequential / LOG_START_OFFSET_CHECKPOINT, {(topic, p): 0 for p in range(3)})
    for r in results:
        compact_topic(sequential, topic, partition=r.partition, upto_offset=r.log_end_offset, now_ms=now_ms)
    for p in range(3):
        ours = {f.name: f.read_bytes() for f in (tmp_path / "spark" / f"{topic}-{p}").glob("*.log")}
        theirs = {f.name: f.read_bytes() for f in (sequential / f"{topic}-{p}").glob("*.log")}
        assert ours == theirs and ours

    # Kafka's own DumpLogSegments reads every cleaned segment; kafkalog keeps the latest value per key.
    for segment in sorted((tmp_path / "spark").glob(f"{topic}-*/*.log")):
        done = kafka_broker.run_tool("org.apache.kafka.tools.DumpLogSegments", ["--deep-iteration", "--files",
                                                                                str(segment)])
        assert done.returncode == 0 and "Exception" not in done.stdout + done.stderr, done.stderr[-2000:]
    before = snapshot(spark, [log_dir], topic, tmp_path / "snap-before")
    after = snapshot(spark, [tmp_path / "spark"], topic, tmp_path / "snap-after")
    rows = {name: {(r.partition, bytes(r.key)): (r.offset, bytes(r.value))
                   for r in spark.read.parquet(str(tmp_path / name)).collect()}
            for name in ("snap-before", "snap-after")}
    assert rows["snap-before"] == rows["snap-after"] and before["rows"] == after["rows"]


def test_sst_snapshot_restores_a_store_that_run_resumes(spark, produced_topic, tmp_path):
    """snapshot --format sst -> restore --from-snapshot -> export equals the consumer; run fetches only what is new.

    Last in this module: it produces more records to the shared topic.
    """
    import subprocess
    import sys

    topic, bootstrap, log_dir = produced_topic
    manifest = snapshot(spark, [log_dir], topic, tmp_path / "snap", fmt="sst")
    assert manifest["format"] == "sst" and sorted(manifest["files"]) == ["0", "1", "2"]
    data_dir = tmp_path / "data"

    def cli(*args):
        result = subprocess.run([sys.executable, "-m", "materializer", *args], capture_output=True, text=True,
                                timeout=300)
        assert result.returncode == 0, result.stderr[-2000:]
        return result.stdout

    restored = cli("restore", "--from-snapshot", str(tmp_path / "snap"), "--topic", topic, "--data-dir", str(data_dir))
    assert restored.startswith(f"{topic}: restored {manifest['rows']} live keys of 3 partitions")

    def exported():
        lines = cli("export", "--data-dir", str(data_dir), "--topic", topic, "--key-format", "bytes",
                    "--value-format", "bytes").splitlines()
        import base64
        return {(row["partition"], base64.b64decode(row["key_b64"])): base64.b64decode(row["value_b64"])
                for row in map(json.loads, lines)}

    def consumer_latest():
        latest = {}
        for partition, _, key, value, _, _ in _consumer_rows(bootstrap, topic):
            latest[(partition, key)] = value
        return {k: v for k, v in latest.items() if v is not None}

    assert exported() == consumer_latest()
    produce(bootstrap, topic, Produced(), count=90, keys=200, codec="none", seed=40)
    ran = cli("run", "--bootstrap-servers", bootstrap, "--topic", topic, "--data-dir", str(data_dir),
              "--until-caught-up", "--no-progress")
    assert ran.startswith(f"{topic}: fetched 90 records"), ran
    assert exported() == consumer_latest()
    # A second restore into the same data dir is refused, naming what is there.
    again = subprocess.run([sys.executable, "-m", "materializer", "restore", "--from-snapshot", str(tmp_path / "snap"),
                            "--topic", topic, "--data-dir", str(data_dir)], capture_output=True, text=True, timeout=120)
    assert again.returncode == 2 and "already holds data of topic" in again.stderr
