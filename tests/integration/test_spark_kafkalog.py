"""`kafkalog` on Spark against a real broker's log dir (issue 8): same rows as a read_committed consumer.

A three-partition topic gets batches of every codec, a committed and an aborted transaction,
tombstones and headers; the broker's own partition folders (live, read in place, read-only) are
then read with ``spark.read.format("kafkalog")`` and compared row for row with what a
read_committed consumer and Spark's own Kafka source (``format("kafka")``, the connector resolved
with Maven, ``kafka.isolation.level=read_committed``) read from the broker. A second topic is
compacted by the broker (two cleaner rounds, tombstones past ``delete.retention.ms`` gone) and
ends with an aborted transaction the cleaner has not reached: the three readers agree again, and
Spark's Kafka source with its default read_uncommitted gets other latest values per key (the
pitfall). ``read_uncommitted`` shows the aborted records; the snapshot job equals the consumer's
latest value per (partition, key); a log dir the broker appends to while a transaction is open is
read up to the last stable offset; damage fails with the file and byte position. One Spark
session (with the connector) serves the whole module.
"""

from __future__ import annotations

import json
import shutil
import time
import uuid
from pathlib import Path

import pytest

from materializer.testing.compaction_oracle import BrokerFilesOnDisk
from materializer.spark.jobs import executor_error, snapshot, spark_session

from .broker_reads import read_topic
from .compaction_workloads import HOLD_CLEANING_MS, alter_topic_configs, wait_for_broker_cleaning
from .test_ingest import CODECS, Produced, produce

pytestmark = pytest.mark.broker


@pytest.fixture(scope="module")
def spark():
    session = spark_session("local[2]", kafka_connector=True)
    yield session
    session.stop()


def _new_topic(kafka_broker, name: str, partitions: int, config: dict[str, str] | None = None):
    """A topic on the broker with every partition led; returns the AdminClient used."""
    if kafka_broker.log_dirs is None:
        pytest.fail("kafkalog tests read the broker's log dir: this broker does not expose one (set KAFKA_LOG_DIRS)")
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": kafka_broker.bootstrap_servers})
    admin.create_topics([NewTopic(name, num_partitions=partitions, replication_factor=1,
                                  config=config or {})])[name].result(30)
    deadline = time.monotonic() + 30
    while not all(p.leader >= 0 for p in admin.list_topics(topic=name, timeout=5).topics[name].partitions.values()):
        assert time.monotonic() < deadline, "no partition leaders after 30 s"
        time.sleep(0.2)
    return admin


@pytest.fixture(scope="module")
def produced_topic(kafka_broker):
    topic = f"kafkalog-{uuid.uuid4().hex[:8]}"
    bootstrap = kafka_broker.bootstrap_servers
    _new_topic(kafka_broker, topic, 3)
    produced = Produced()
    for seed, codec in enumerate(CODECS):
        produce(bootstrap, topic, produced, count=400, keys=120, codec=codec, seed=seed)
    produce(bootstrap, topic, produced, count=300, keys=120, codec="lz4", seed=20, transactional_id="tx-commit")
    produce(bootstrap, topic, produced, count=300, keys=120, codec="zstd", seed=21, transactional_id="tx-abort",
            abort=True)
    produce(bootstrap, topic, produced, count=200, keys=120, codec="gzip", seed=22)
    return topic, bootstrap, kafka_broker.log_dirs


def _consumer_rows(bootstrap, topic, isolation="read_committed", partitions=3):
    rows = []
    for partition, records in read_topic(bootstrap, topic, partitions, isolation_level=isolation).items():
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


def _spark_kafka_rows(spark, bootstrap, topic, isolation=None):
    """Rows of Spark's own Kafka source (``format("kafka")``) over the whole topic, as ``_consumer_rows``.

    ``isolation=None`` leaves ``kafka.isolation.level`` at the connector's default (read_uncommitted).
    """
    reader = (spark.read.format("kafka").option("kafka.bootstrap.servers", bootstrap).option("subscribe", topic)
              .option("startingOffsets", "earliest").option("endingOffsets", "latest").option("includeHeaders", "true"))
    if isolation is not None:
        reader = reader.option("kafka.isolation.level", isolation)
    rows = []
    for row in reader.load().collect():
        millis = int(row.timestamp.timestamp() * 1000 + 0.5)
        rows.append((row.partition, row.offset, None if row.key is None else bytes(row.key),
                     None if row.value is None else bytes(row.value), millis,
                     tuple((h.key, None if h.value is None else bytes(h.value)) for h in row.headers or ())))
    return sorted(rows)


def _latest(rows):
    """(partition, key) -> value of the latest row; a tombstone removes the key."""
    latest = {}
    for partition, _, key, value, _, _ in rows:
        latest[(partition, key)] = value
    return {k: v for k, v in latest.items() if v is not None}


def test_kafkalog_equals_a_read_committed_consumer_and_sparks_kafka_source(spark, produced_topic):
    topic, bootstrap, log_dir = produced_topic
    expected = _consumer_rows(bootstrap, topic)
    assert len(expected) == 5 * 400 + 300 + 200
    assert _kafkalog_rows(spark, log_dir, topic) == expected
    assert _spark_kafka_rows(spark, bootstrap, topic, "read_committed") == expected
    schema = spark.read.format("kafkalog").option("path", str(log_dir)).option("topic", topic).load().schema
    assert [f.name for f in schema.fields] == ["key", "value", "topic", "partition", "offset", "timestamp",
                                               "timestampType"]  # Spark's Kafka source columns


def test_min_partitions_cuts_segments_and_reads_the_same_rows(spark, produced_topic):
    """``minPartitions`` (Spark's Kafka source option): more splits than segments, cut at batch
    boundaries, and the rows are still exactly the read_committed consumer's."""
    from materializer.spark.splits import plan_splits

    topic, bootstrap, log_dir = produced_topic
    whole, cut = plan_splits([log_dir], topic), plan_splits([log_dir], topic, min_partitions=24)
    assert len(cut) >= 2 * len(whole)
    frame = (spark.read.format("kafkalog").option("path", str(log_dir)).option("topic", topic)
             .option("minPartitions", "24").load())
    assert frame.rdd.getNumPartitions() == len(cut)
    assert _kafkalog_rows(spark, log_dir, topic, minPartitions="24") == _consumer_rows(bootstrap, topic)


def test_read_uncommitted_shows_the_aborted_transaction(spark, produced_topic):
    topic, bootstrap, log_dir = produced_topic
    uncommitted = _kafkalog_rows(spark, log_dir, topic, isolation="read_uncommitted")
    assert uncommitted == _consumer_rows(bootstrap, topic, "read_uncommitted")
    assert len(uncommitted) == len(_consumer_rows(bootstrap, topic)) + 300  # the pitfall: aborted records
    assert _spark_kafka_rows(spark, bootstrap, topic) == uncommitted  # Spark's Kafka source by default


@pytest.fixture(scope="module")
def compacted_topic(kafka_broker):
    """A 2-partition topic the broker compacted twice (tombstones past delete.retention.ms removed in the
    second round), then a tail the cleaner is held off: plain records and one aborted transaction."""
    topic = f"kafkalog-compacted-{uuid.uuid4().hex[:8]}"
    bootstrap, log_dir = kafka_broker.bootstrap_servers, kafka_broker.log_dirs
    delete_retention_ms = 1000
    admin = _new_topic(kafka_broker, topic, 2, {
        "cleanup.policy": "compact", "internal.segment.bytes": "32768", "min.cleanable.dirty.ratio": "0.01",
        "min.compaction.lag.ms": str(HOLD_CLEANING_MS), "delete.retention.ms": str(delete_retention_ms)})
    for seed, codec in enumerate(CODECS):
        produce(bootstrap, topic, Produced(), count=300, keys=80, codec=codec, seed=seed, tombstone_ratio=0.25)
    produce(bootstrap, topic, Produced(), count=200, keys=80, codec="snappy", seed=10, transactional_id="c-commit")
    produce(bootstrap, topic, Produced(), count=200, keys=80, codec="gzip", seed=11, transactional_id="c-abort",
            abort=True)
    # updates of keys 0..19 only, so that the latest records of keys 20..79 (a quarter of them tombstones)
    # leave the active segment and are cleaned in the first round, which sets their delete horizon
    produce(bootstrap, topic, Produced(), count=800, keys=20, codec="lz4", seed=12, tombstone_ratio=0.0)
    alter_topic_configs(admin, topic, {"min.compaction.lag.ms": "0"}, settle_s=0)
    first = wait_for_broker_cleaning(log_dir, topic, [0, 1])
    first_round_done = time.monotonic()
    alter_topic_configs(admin, topic, {"min.compaction.lag.ms": str(HOLD_CLEANING_MS)})
    # keys 0..19 again: dirty data for a second round, which removes the tombstones past their horizon.
    # The round needs a rolled segment in each partition; how many records that takes depends on how
    # the producer batched them (its linger timing), so produce until both rolled.
    disk = BrokerFilesOnDisk(bootstrap, log_dir)
    for seed in range(15, 15 + 8):
        produce(bootstrap, topic, Produced(), count=400, keys=20, codec="lz4", seed=seed, tombstone_ratio=0.0)
        if all(disk.active_segment_base(topic, p) > first[p] for p in (0, 1)):
            break
    else:
        raise AssertionError(f"no segment rolled in {topic} after 3,200 more records")
    time.sleep(max(0.0, delete_retention_ms / 1000 + 0.5 - (time.monotonic() - first_round_done)))
    alter_topic_configs(admin, topic, {"min.compaction.lag.ms": "0"}, settle_s=0)
    second = wait_for_broker_cleaning(log_dir, topic, [0, 1])
    assert all(second[p] > first[p] for p in (0, 1))
    alter_topic_configs(admin, topic, {"min.compaction.lag.ms": str(HOLD_CLEANING_MS)})
    produce(bootstrap, topic, Produced(), count=150, keys=80, codec="zstd", seed=13, transactional_id="c-late-abort",
            abort=True)
    produce(bootstrap, topic, Produced(), count=40, keys=80, codec="none", seed=14, tombstone_ratio=0.2)
    return topic, bootstrap, log_dir, first


def test_broker_compacted_topic_three_readers_agree(spark, compacted_topic):
    """kafkalog == Spark's Kafka source (read_committed) == a read_committed consumer on a compacted topic."""
    topic, bootstrap, log_dir, first = compacted_topic
    expected = _consumer_rows(bootstrap, topic, partitions=2)
    offsets = {p: [r[1] for r in expected if r[0] == p] for p in (0, 1)}
    assert all(o[-1] - o[0] + 1 > len(o) for o in offsets.values()), "the broker's cleaner left no offset gap"
    old = [r for r in expected if r[1] < first[r[0]] and r[2] >= b"key-00020"]
    assert len(old) >= 20 and all(r[3] is not None for r in old), "tombstones past delete.retention.ms must be gone"
    assert any(r[3] is None for r in expected), "the uncleaned tail keeps tombstones"
    assert _kafkalog_rows(spark, log_dir, topic) == expected
    assert _spark_kafka_rows(spark, bootstrap, topic, "read_committed") == expected


def test_sparks_kafka_source_default_read_uncommitted_gives_other_latest_values(spark, compacted_topic):
    """The pitfall: Spark's Kafka source defaults to read_uncommitted, so an aborted transaction's values
    become the latest per key, silently; kafkalog's read_uncommitted reproduces exactly those rows."""
    topic, bootstrap, log_dir, _ = compacted_topic
    committed = _latest(_consumer_rows(bootstrap, topic, partitions=2))
    uncommitted_rows = _spark_kafka_rows(spark, bootstrap, topic)
    uncommitted = _latest(uncommitted_rows)
    differing = {k for k in committed.keys() | uncommitted.keys() if committed.get(k) != uncommitted.get(k)}
    assert len(differing) >= 20, len(differing)
    # every difference comes from the late aborted transaction (its values start with "zstd-13-")
    assert all((uncommitted.get(k) or b"zstd-13-").startswith(b"zstd-13-") for k in differing)
    assert uncommitted_rows == _kafkalog_rows(spark, log_dir, topic, isolation="read_uncommitted")
    assert _latest(_kafkalog_rows(spark, log_dir, topic)) == committed


def test_live_log_dir_read_stops_at_the_last_stable_offset(spark, kafka_broker):
    """While a transaction is open on partition 0 and a producer keeps appending to both partitions, a read of
    the broker's live folders returns partition 0 exactly up to the open transaction's first offset (the last
    stable offset) and a clean prefix of partition 1; after the commit, everything."""
    import threading

    from confluent_kafka import Producer

    topic = f"kafkalog-live-{uuid.uuid4().hex[:8]}"
    bootstrap, log_dir = kafka_broker.bootstrap_servers, kafka_broker.log_dirs
    _new_topic(kafka_broker, topic, 2)
    produce(bootstrap, topic, Produced(), count=400, keys=50, codec="lz4", seed=30)
    txn = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"{topic}-open", "linger.ms": 1})
    txn.init_transactions(30)
    txn.begin_transaction()
    first_open = []
    txn.produce(topic, key=b"open", value=b"in-flight", partition=0,
                on_delivery=lambda err, msg: first_open.append(msg.offset()))
    txn.flush(30)
    stop = threading.Event()

    def append():
        plain = Producer({"bootstrap.servers": bootstrap, "linger.ms": 2, "compression.type": "zstd"})
        i = 0
        while not stop.is_set():
            plain.produce(topic, key=b"live-%d" % (i % 30), value=b"v-%d" % i, partition=i % 2)
            i += 1
            if i % 50 == 0:
                plain.poll(0)
                time.sleep(0.005)
        plain.flush(30)

    appender = threading.Thread(target=append)
    appender.start()
    try:
        time.sleep(0.5)
        rows = _kafkalog_rows(spark, log_dir, topic)
    finally:
        stop.set()
        appender.join(60)
    (lso,) = first_open
    consumer = _consumer_rows(bootstrap, topic, "read_uncommitted", 2)  # the open transaction is still open
    part0 = [r for r in rows if r[0] == 0]
    assert part0 == [r for r in consumer if r[0] == 0 and r[1] < lso] and part0
    part1 = [r for r in rows if r[0] == 1]
    consumer1 = [r for r in consumer if r[0] == 1]
    assert part1 == consumer1[:len(part1)] and len(part1) > 200
    txn.commit_transaction(30)
    committed = _consumer_rows(bootstrap, topic, partitions=2)
    assert any(r[0] == 0 and r[1] == lso for r in committed)
    assert _kafkalog_rows(spark, log_dir, topic) == committed


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
    first_batch_end = 12 + int.from_bytes(data[8:12], "big")  # base offset (8 bytes) + batch length (4 bytes)
    data[first_batch_end - 1] ^= 0xFF  # the first batch's last byte, inside its CRC-covered bytes (the
    # producer decides how long that batch is: a fixed position fell into the second one once)
    segment.write_bytes(bytes(data))
    with pytest.raises(Exception) as info:  # Spark wraps the planner's error in its own exception
        spark.read.format("kafkalog").option("path", str(copy)).option("topic", topic).load().count()
    line = executor_error(info.value)
    assert line.startswith("CorruptRecordError: ") and f"{segment} at byte position 0" in line, line
    from materializer.storage.errors import CorruptRecordError

    with pytest.raises(CorruptRecordError) as info:  # the snapshot plans its splits on the driver itself
        snapshot(spark, [copy], topic, tmp_path / "snap")
    assert f"{segment} at byte position 0" in str(info.value)
    with pytest.raises(Exception) as info:
        spark.read.format("kafkalog").option("path", str(tmp_path)).option("topic", "absent").load().count()
    line = executor_error(info.value)
    assert line.startswith("LogNotFoundError: no partition folder of topic 'absent'") and str(tmp_path) in line, line


def test_damage_mid_segment_and_a_lost_segment_fail_with_the_file(spark, compacted_topic, tmp_path):
    """A corrupt batch in the middle of a segment names that segment and the batch's byte position; a
    segment whose ``.log`` is gone while its index files stay names the orphan index and the lost offsets."""
    topic, _, log_dir, _ = compacted_topic
    copy = tmp_path / "copy"
    shutil.copytree(log_dir / f"{topic}-1", copy / f"{topic}-1")
    all_segments = sorted((copy / f"{topic}-1").glob("*.log"))
    assert len(all_segments) >= 2  # the broker's cleaned segment and its active one

    def second_batch_of(segment: Path) -> int | None:
        """Byte position of the segment's second batch; None when it holds one batch (the broker's
        cleaner may have merged a cleaned segment's records into one)."""
        data = segment.read_bytes()
        second = 12 + int.from_bytes(data[8:12], "big")  # base offset (8 bytes) + batch length (4 bytes)
        return second if second + 61 <= len(data) else None  # 61: a v2 batch header

    # the first segment with a batch in its middle: the damaged one must not be the partition's last
    segments = [seg for seg in all_segments[:-1] if second_batch_of(seg) is not None] + all_segments[-1:]
    second_batch = second_batch_of(segments[0])
    assert second_batch is not None, [seg.stat().st_size for seg in all_segments]
    data = bytearray(segments[0].read_bytes())
    data[second_batch + 40] ^= 0xFF  # inside the CRC-covered part of the second batch
    segments[0].write_bytes(bytes(data))

    def fails_with():
        with pytest.raises(Exception) as info:
            spark.read.format("kafkalog").option("path", str(copy)).option("topic", topic).load().count()
        return executor_error(info.value)

    line = fails_with()
    assert line.startswith("CorruptRecordError: ") and f"{segments[0]} at byte position {second_batch}" in line, line
    segments[0].unlink()
    line = fails_with()
    orphan = segments[0].with_suffix(".index")
    assert line.startswith(f"LogNotFoundError: {orphan}: index file of a segment with base offset "), line


def test_missing_index_files_change_no_row(spark, produced_topic, tmp_path):
    """``.index``/``.timeindex``/``.txnindex`` are derived files (Kafka rebuilds them when it recovers a
    segment): without them kafkalog reads the same rows, aborted records still removed (ABORT markers)."""
    topic, bootstrap, log_dir = produced_topic
    copy = tmp_path / "copy"
    for p in range(3):
        shutil.copytree(log_dir / f"{topic}-{p}", copy / f"{topic}-{p}",
                        ignore=shutil.ignore_patterns("*.index", "*.timeindex", "*.txnindex"))
    assert not list(copy.rglob("*index"))
    assert _kafkalog_rows(spark, copy, topic) == _consumer_rows(bootstrap, topic)


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
    from materializer.offline.compact import compact_topic
    from materializer.datadir.layout import topic_config_path
    from materializer.spark.compact import spark_compact
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


def test_python_workers_fork_from_our_daemon_without_pysparks_archives(spark):
    """Executor tasks run in workers forked from ``materializer.spark.worker_daemon``, whose
    ``sys.path`` holds none of the zips and jars Spark puts first on ``PYTHONPATH`` (each costs a
    directory re-read per task on Python 3.11), and that import pyspark from the installed package."""
    import os

    import pyspark

    package = os.path.dirname(os.path.realpath(pyspark.__file__))

    def report(batches):
        import importlib
        import os
        import sys

        import pyarrow as pa

        for _ in batches:
            importlib.invalidate_caches()  # as pyspark's setup_spark_files does for every task
            with open(f"/proc/{os.getppid()}/cmdline", "rb") as cmdline:
                parent = cmdline.read().replace(b"\0", b" ").decode()
            archives = [p for p in list(sys.path) + list(sys.path_importer_cache)
                        if ".zip" in p or ".jar" in p]
            yield pa.RecordBatch.from_pydict({"parent": [parent], "pyspark": [sys.modules["pyspark"].__file__],
                                              "archives": [archives]})

    row = spark.range(1).mapInArrow(report, "parent string, pyspark string, archives array<string>").collect()[0]
    assert "-m materializer.spark.worker_daemon pyspark.worker" in row.parent
    assert os.path.realpath(row.pyspark).startswith(package + os.sep) and ".zip" not in row.pyspark
    assert [a for a in row.archives if os.path.realpath(a.split(".zip")[0].split(".jar")[0]).startswith(package)] == []
