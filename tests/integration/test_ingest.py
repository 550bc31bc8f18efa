"""End to end on a real Apache Kafka broker: ingest a topic into a Kafka-format local log and materialize it.

Checks, against what this test produced and what a plain confluent-kafka consumer reads:
every local record (offset, timestamp, key, value, headers) equals the broker's; the state store
holds exactly the latest value per key (tombstones delete); every producer codec is read;
read_committed skips aborted transactions and still finishes "until caught up" although the
high watermark sits above the last record (transaction markers); LogAppendTime topics keep
their timestamp type; Kafka's own DumpLogSegments reads the local segments.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from confluent_kafka import TIMESTAMP_LOG_APPEND_TIME, Producer

from materializer.local.kafka_broker import DUMP_LOG_SEGMENTS_CLASS
from materializer.config import MaterializerOptions
from materializer.materializer import Materializer
from materializer.storage.log import Log
from materializer.storage.log_config import LogConfig
from materializer.storage.read_committed import read_committed
from materializer.storage.record_batch import Record, TimestampType

from .broker_reads import read_topic

pytestmark = pytest.mark.broker

CODECS = ("none", "gzip", "snappy", "lz4", "zstd")


@dataclass
class Produced:
    """What a test produced, from the delivery reports: key -> (partition, offset, value)."""

    latest: dict[bytes, tuple[int, int, bytes | None]] = field(default_factory=dict)
    count: int = 0

    def record(self, partition: int, offset: int, key: bytes, value: bytes | None) -> None:
        previous = self.latest.get(key)
        if previous is not None and previous[0] != partition:
            raise AssertionError(f"key {key!r} went to partitions {previous[0]} and {partition}")
        if previous is None or offset > previous[1]:
            self.latest[key] = (partition, offset, value)
        self.count += 1

    def expected_state(self) -> dict[bytes, tuple[int, int, bytes]]:
        return {k: (p, o, v) for k, (p, o, v) in self.latest.items() if v is not None}


def produce(bootstrap: str, topic: str, produced: Produced, *, count: int, keys: int, codec: str = "none",
            seed: int = 1, tombstone_ratio: float = 0.1, transactional_id: str | None = None,
            abort: bool = False, batch_bytes: int | None = None) -> None:
    """Produce ``count`` records over ``keys`` keys with headers and tombstones; record deliveries.
    ``batch_bytes`` caps the producer's batches (``batch.size``): the broker's batches, which the
    replica path keeps, are then small enough for small local segments."""
    rng = random.Random(f"{seed}-{codec}-{transactional_id}")
    config = {"bootstrap.servers": bootstrap, "compression.type": codec, "linger.ms": 5, "acks": "all"}
    if batch_bytes is not None:
        config["batch.size"] = batch_bytes
    if transactional_id:
        config["transactional.id"] = transactional_id
    producer = Producer(config)
    errors: list[str] = []
    delivered: list[tuple[int, int, bytes, bytes | None]] = []

    def on_delivery(err, msg) -> None:
        if err is not None:
            errors.append(err.str())
        else:
            delivered.append((msg.partition(), msg.offset(), msg.key(), msg.value()))

    if transactional_id:
        producer.init_transactions(30)
        producer.begin_transaction()
    for i in range(count):
        key = f"key-{rng.randrange(keys):05d}".encode()
        value = None if rng.random() < tombstone_ratio else f"{codec}-{seed}-{i}-".encode() + rng.randbytes(rng.randrange(0, 60))
        headers = [("codec", codec.encode()), ("i", str(i).encode()), ("empty", None)] if i % 3 else None
        producer.produce(topic, key=key, value=value, headers=headers, on_delivery=on_delivery)
        if i % 500 == 499:
            producer.poll(0)
    if transactional_id:
        if abort:
            producer.flush(30)
            producer.abort_transaction(30)
        else:
            producer.commit_transaction(30)
    assert producer.flush(30) == 0 and not errors, errors
    if not abort:
        for partition, offset, key, value in delivered:
            produced.record(partition, offset, key, value)


def local_records(data_dir: Path, topic: str, partition: int) -> list[Record]:
    with Log.open(data_dir / f"{topic}-{partition}", LogConfig(), had_clean_shutdown=True) as log:
        return list(log.read_records())


def materialize(bootstrap: str, topic: str, data_dir: Path, **options):
    with Materializer(bootstrap, topic, data_dir, options=MaterializerOptions(**options)) as materializer:
        stats = materializer.run(until_caught_up=True)
        state = {key: (stored.partition, stored.offset, stored.value) for key, stored in materializer.store.items()}
    return stats, state


@pytest.mark.parametrize("fetch", ["replica", "consumer"])
def test_ingest_every_codec_with_transactions(kafka_broker, create_topic, tmp_path, fetch):
    partitions = 4
    topic = create_topic(partitions=partitions, config={"cleanup.policy": "compact"})
    bootstrap = kafka_broker.bootstrap_servers
    produced = Produced()
    for codec in CODECS:
        produce(bootstrap, topic, produced, count=1200, keys=700, codec=codec)
    produce(bootstrap, topic, produced, count=300, keys=700, codec="zstd", transactional_id=f"{topic}-tx")
    produce(bootstrap, topic, produced, count=200, keys=700, codec="lz4", transactional_id=f"{topic}-tx2",
            abort=True)  # aborted: read_committed must skip these; the HW ends on a marker

    started = time.monotonic()
    stats, state = materialize(bootstrap, topic, tmp_path, batch_size=2000, fetch=fetch)
    elapsed = time.monotonic() - started

    assert state == produced.expected_state()
    expected_total = produced.count
    assert expected_total == 5 * 1200 + 300
    # The replica path fetches what the broker stores: the aborted records and one marker per
    # transaction and partition too; the consumer path gets the committed records only.
    markers = 2 * partitions
    assert stats.records_fetched == (expected_total + 200 + markers if fetch == "replica" else expected_total)
    broker = read_topic(bootstrap, topic, partitions)
    for partition in range(partitions):
        theirs = [record for record, _ in broker[partition]]
        with Log.open(tmp_path / f"{topic}-{partition}", LogConfig(), had_clean_shutdown=True) as log:
            assert list(read_committed(log)) == theirs
        assert stats.high_watermarks[partition] > theirs[-1].offset + 1  # markers / aborted records at the end
    print(f"\ningest: {stats.records_fetched} records, {stats.bytes_fetched} bytes fetched, "
          f"{stats.batches_appended} batches / {stats.bytes_appended} bytes appended in {elapsed:.2f} s "
          f"(run {stats.elapsed_s:.2f} s)")

    # Kafka's own tool reads the local segment (format check by the reference implementation)
    segment = tmp_path / f"{topic}-0" / "00000000000000000000.log"
    result = kafka_broker.run_tool(DUMP_LOG_SEGMENTS_CLASS, ["--deep-iteration", "--files", str(segment)])
    assert result.returncode == 0, result.stderr
    assert "Found" not in result.stdout and "corrupt" not in result.stdout.lower(), result.stdout[-2000:]
    def offsets(dump: str) -> list[int]:
        return [int(line.split("offset: ")[1].split()[0]) for line in dump.splitlines() if line.startswith("| offset: ")]

    if fetch == "consumer":
        assert offsets(result.stdout) == [record.offset for record, _ in broker[0]]
    else:  # the broker's own segment, aborted records and markers included
        (broker_segment,) = sorted(kafka_broker.partition_dir(topic, 0).glob("*.log"))
        theirs = kafka_broker.run_tool(DUMP_LOG_SEGMENTS_CLASS, ["--deep-iteration", "--files", str(broker_segment)])
        assert offsets(result.stdout) == offsets(theirs.stdout)
        assert len(offsets(result.stdout)) > len(broker[0])


def test_log_append_time_topic_and_local_compression(kafka_broker, create_topic, tmp_path):
    topic = create_topic(partitions=2, config={"cleanup.policy": "compact", "message.timestamp.type": "LogAppendTime",
                                               "compression.type": "gzip"})
    bootstrap = kafka_broker.bootstrap_servers
    produced = Produced()
    produce(bootstrap, topic, produced, count=800, keys=100, codec="snappy")
    stats, state = materialize(bootstrap, topic, tmp_path)
    assert state == produced.expected_state()
    broker = read_topic(bootstrap, topic, 2)
    for partition in range(2):
        assert {ts_type for _, ts_type in broker[partition]} == {TIMESTAMP_LOG_APPEND_TIME}
        assert local_records(tmp_path, topic, partition) == [record for record, _ in broker[partition]]
        with Log.open(tmp_path / f"{topic}-{partition}", LogConfig(), had_clean_shutdown=True) as log:
            batches = list(log.read_batches())
        assert {b.timestamp_type for b in batches} == {TimestampType.LOG_APPEND_TIME}
        assert {b.compression_type.name_kafka for b in batches} == {"gzip"}  # the topic's compression.type
        assert all(r.timestamp == b.max_timestamp for b in batches for r in b.records())


def test_null_keys_are_logged_not_materialized(kafka_broker, create_topic, tmp_path):
    topic = create_topic(partitions=1, config={"cleanup.policy": "delete"})
    bootstrap = kafka_broker.bootstrap_servers
    producer = Producer({"bootstrap.servers": bootstrap})
    for i in range(10):
        producer.produce(topic, key=None if i % 2 else b"k%d" % i, value=b"v%d" % i)
    assert producer.flush(30) == 0
    stats, state = materialize(bootstrap, topic, tmp_path, compression="lz4")
    assert stats.null_key_records == 5 and stats.records_applied == 5
    assert sorted(state) == [b"k0", b"k2", b"k4", b"k6", b"k8"]
    assert [r.key for r in local_records(tmp_path, topic, 0)] == [None if i % 2 else b"k%d" % i for i in range(10)]


def test_broker_gone_is_a_clear_error_not_a_hang(kafka_broker, tmp_path):
    from materializer.adapters.errors import KafkaSourceError

    started = time.monotonic()
    with pytest.raises(KafkaSourceError, match="cannot read metadata"):
        Materializer("127.0.0.1:9", "t", tmp_path,
                     options=MaterializerOptions(request_timeout_ms=1500, broker_timeout_ms=1500)).start()
    assert time.monotonic() - started < 15


@pytest.mark.parametrize("fetch", ["replica", "consumer"])
def test_a_new_store_is_bulk_loaded_until_caught_up_and_a_kept_one_is_not(kafka_broker, create_topic, tmp_path,
                                                                         monkeypatch, fetch):
    """A cold start switches RocksDB's background compaction off for the new store; a continuous run
    switches it on again once caught up, a bounded run closes the store in bulk mode (its close does
    not wait for a compaction); a restart over a kept store never switches it off."""
    from materializer.adapters.rocksdb_store import StateStore

    from .background_run import BackgroundRun, wait_until

    switches: list[tuple[bool, bool]] = []  # (switched on, store already holding offsets)
    original = StateStore.set_bulk_loading

    def recorded(store: StateStore, enabled: bool) -> None:
        switches.append((enabled, bool(store.offsets())))
        original(store, enabled)

    monkeypatch.setattr(StateStore, "set_bulk_loading", recorded)
    topic = create_topic(partitions=2)
    bootstrap = kafka_broker.bootstrap_servers
    producer = Producer({"bootstrap.servers": bootstrap})
    for i in range(200):
        producer.produce(topic, key=b"k%d" % (i % 50), value=b"v%d" % i, partition=i % 2)
    assert producer.flush(30) == 0
    stats, state = materialize(bootstrap, topic, tmp_path / "bounded", fetch=fetch)
    assert stats.records_applied == 200 and len(state) == 50
    assert switches == [(True, False)], switches  # on at the start, with nothing stored yet

    switches.clear()
    with Materializer(bootstrap, topic, tmp_path / "continuous", options=MaterializerOptions(fetch=fetch)) as m:
        run = BackgroundRun(m)
        try:
            wait_until(lambda: m.wait_until_caught_up(0.1) and not m.store.bulk_loading, 60, "caught up, bulk mode off")
        finally:
            run.stop()
    assert switches[0] == (True, False) and switches[-1] == (False, True), switches

    switches.clear()
    producer.produce(topic, key=b"k1", value=b"again", partition=1)
    assert producer.flush(30) == 0
    _, state = materialize(bootstrap, topic, tmp_path / "bounded", fetch=fetch)
    assert state[b"k1"][2] == b"again"
    assert True not in [enabled for enabled, _ in switches], switches
