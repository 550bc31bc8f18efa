"""What a service sees: warm start to ready by store size, reads from another process during ingest, Avro decode.

A script, not a test. On a LocalKafkaBroker (Kafka jars, temp dir):

1. **warm start to ready**, for each ``--sizes`` key count: a compacted topic with one 100-byte
   value per key (2 partitions) is materialized once (cold start, timed), then ``--tail``
   more records are produced and a Materializer on the same data directory is started in the
   background; "ready" = ``wait_until_caught_up`` returned. Compared in the same run with what a
   service does without a local copy: a plain confluent-kafka consumer re-reading the whole
   topic into a dict.
2. **reads from another process while ingest runs**: on the first size's store, ``materializer``
   ingests a producer's stream in the background while a second process opens the store
   read-only (:class:`~materializer.view.MaterializedView`, RocksDB secondary instance) and
   times random ``get`` calls for ``--read-seconds`` seconds (p50/p99/max), catching up with the
   writer every 100 ms (its time reported apart).
3. **Avro decode on read**: ``--avro-values`` Avro values (confluent-kafka's ``AvroSerializer``,
   5-field record) read through ``MaterializedView.items()`` against confluent-kafka's
   ``AvroDeserializer`` called on the same values; the registry is confluent-kafka's mock (the
   registry is asked once per schema id either way).

    .venv/bin/python benchmarks/bench_service.py                                 # 200k and 5M keys
    .venv/bin/python benchmarks/bench_service.py --sizes 200000 --read-seconds 5  # quick
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_materializer import machine  # noqa: E402
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition  # noqa: E402
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402

from materializer import Materializer, MaterializerOptions  # noqa: E402
from materializer.local.kafka_broker import TEST_BROKER_CONFIG, LocalKafkaBroker  # noqa: E402
from materializer.adapters.rocksdb_store import StateStore  # noqa: E402
from materializer.view import MaterializedView  # noqa: E402

PARTITIONS = 2
VALUE = b"v" * 100


def create_topic(bootstrap: str, topic: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, PARTITIONS, 1, config={"cleanup.policy": "compact"})])[topic].result(60)


def produce(bootstrap: str, topic: str, keys: range, stop: threading.Event | None = None) -> int:
    """One record per key of ``keys`` (``key-%010d``, 100-byte value); returns records produced."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "batch.num.messages": 10_000,
                         "batch.size": 1024 * 1024, "queue.buffering.max.messages": 1_000_000,
                         "compression.type": "lz4"})
    produced = 0
    for k in keys:
        if stop is not None and stop.is_set():
            break
        while True:
            try:
                producer.produce(topic, key=b"key-%010d" % k, value=VALUE)
                break
            except BufferError:
                producer.poll(0.05)
        produced += 1
        if produced % 10_000 == 0:
            producer.poll(0)
    if producer.flush(300):
        raise RuntimeError("the producer could not deliver within 300 s")
    return produced


def consumer_into_dict(bootstrap: str, topic: str) -> tuple[float, int]:
    """What a service without a local copy does at start: re-read the topic into a dict. (seconds, keys)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-service", "enable.auto.commit": False,
                         "enable.partition.eof": True, "isolation.level": "read_committed"})
    started = time.perf_counter()
    consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
    state: dict[bytes, bytes] = {}
    at_end: set[int] = set()
    while len(at_end) < PARTITIONS:
        for message in consumer.consume(10_000, 1.0):
            if message.error():
                if message.error().code() == KafkaError._PARTITION_EOF:
                    at_end.add(message.partition())
                    continue
                raise RuntimeError(message.error())
            if message.value() is None:
                state.pop(message.key(), None)
            else:
                state[message.key()] = message.value()
    seconds = time.perf_counter() - started
    consumer.close()
    return seconds, len(state)


def time_to_ready(bootstrap: str, topic: str, data_dir: Path) -> tuple[float, Materializer]:
    """Start a Materializer in the background on ``data_dir``; seconds until it has caught up."""
    started = time.perf_counter()
    materializer = Materializer(bootstrap, topic, data_dir,
                                options=MaterializerOptions(progress=False, cleaner_threads=0))
    materializer.run_in_background()
    if not materializer.wait_until_caught_up(timeout_s=1800):
        raise RuntimeError("not caught up within 30 min")
    return time.perf_counter() - started, materializer


READER = r"""
import json, random, sys, time
from materializer.view import MaterializedView
data_dir, topic, keys, seconds = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
rng = random.Random(7)
opened = time.perf_counter()
view = MaterializedView.open(data_dir, topic, read_only=True)
open_s = time.perf_counter() - opened
gets, catch_ups, found = [], [], 0
deadline = time.perf_counter() + seconds
next_catch_up = time.perf_counter() + 0.1
while time.perf_counter() < deadline:
    key = b"key-%010d" % rng.randrange(keys)
    t = time.perf_counter()
    found += view.get(key) is not None
    gets.append(time.perf_counter() - t)
    if t >= next_catch_up:
        t = time.perf_counter()
        view.catch_up()
        catch_ups.append(time.perf_counter() - t)
        next_catch_up = t + 0.1
gets.sort(); catch_ups.sort()
pct = lambda xs, q: xs[min(len(xs) - 1, int(q * len(xs)))] * 1000
print(json.dumps({"open_ms": open_s * 1000, "gets": len(gets), "found": found, "p50_ms": pct(gets, 0.5),
                  "p99_ms": pct(gets, 0.99), "max_ms": gets[-1] * 1000, "catch_ups": len(catch_ups),
                  "catch_up_p50_ms": pct(catch_ups, 0.5), "catch_up_p99_ms": pct(catch_ups, 0.99)}))
"""


def reads_during_ingest(bootstrap: str, topic: str, data_dir: Path, keys: int, seconds: float) -> dict:
    stop = threading.Event()
    produced = [0]

    def keep_producing() -> None:
        produced[0] = produce(bootstrap, topic, range(keys, keys * 100), stop)

    _, materializer = time_to_ready(bootstrap, topic, data_dir)
    producer = threading.Thread(target=keep_producing, daemon=True)
    producer.start()
    applied_before = materializer.stats.records_applied
    try:
        done = subprocess.run([sys.executable, "-c", READER, str(data_dir), topic, str(keys), str(seconds)],
                              capture_output=True, text=True, timeout=seconds + 120)
        if done.returncode != 0:
            raise RuntimeError(done.stderr[-2000:])
        result = json.loads(done.stdout)
        result["applied_during"] = materializer.stats.records_applied - applied_before
    finally:
        stop.set()
        producer.join()
        materializer.close()
    return result


def avro_decode(values: int) -> dict:
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    from materializer.adapters.avro_serde import AvroSerde
    from materializer.storage.record_batch import Record

    registry = SchemaRegistryClient.new_client({"url": "mock://bench"})
    schema = {"type": "record", "name": "Profile", "fields": [
        {"name": "id", "type": "long"}, {"name": "name", "type": "string"}, {"name": "email", "type": "string"},
        {"name": "score", "type": "double"}, {"name": "active", "type": "boolean"}]}
    ctx = SerializationContext("profiles", MessageField.VALUE)
    serializer = AvroSerializer(registry, json.dumps(schema))
    encoded = [serializer({"id": i, "name": f"user {i}", "email": f"user{i}@example.com", "score": i / 7,
                           "active": i % 2 == 0}, ctx) for i in range(values)]
    with tempfile.TemporaryDirectory() as tmp:
        with StateStore(Path(tmp) / "store") as store:
            for start in range(0, values, 50_000):
                chunk = [Record(i, i, b"user-%09d" % i, encoded[i]) for i in range(start, min(values, start + 50_000))]
                store.apply({0: chunk}, {0: chunk[-1].offset + 1})
            view = MaterializedView(store, value_serde=AvroSerde(registry, topic="profiles"))
            started = time.perf_counter()
            count = sum(1 for _ in view.items())
            view_s = time.perf_counter() - started
            raw_started = time.perf_counter()
            raw = sum(1 for _ in store.items())
            raw_s = time.perf_counter() - raw_started
    deserializer = AvroDeserializer(registry)
    started = time.perf_counter()
    for value in encoded:
        deserializer(value, ctx)
    confluent_s = time.perf_counter() - started
    assert count == raw == values
    return {"view_per_s": values / view_s, "store_bytes_per_s": values / raw_s,
            "avro_deserializer_per_s": values / confluent_s}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="200000,5000000", help="key counts, comma-separated")
    parser.add_argument("--tail", type=int, default=2000, help="records produced before each warm start")
    parser.add_argument("--read-seconds", type=float, default=10.0)
    parser.add_argument("--avro-values", type=int, default=200_000)
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    print(machine())
    print(f"command: {' '.join(sys.argv)}\n", flush=True)

    avro = avro_decode(args.avro_values)
    print(f"Avro decode on read ({args.avro_values:,d} values): MaterializedView.items() "
          f"{avro['view_per_s']:,.0f} values/s; the same store's raw bytes {avro['store_bytes_per_s']:,.0f}/s; "
          f"confluent-kafka AvroDeserializer {avro['avro_deserializer_per_s']:,.0f} values/s "
          f"({avro['view_per_s'] / avro['avro_deserializer_per_s']:.1f}x)\n", flush=True)

    with tempfile.TemporaryDirectory() as tmp, \
            LocalKafkaBroker(Path(tmp) / "broker", extra_config=TEST_BROKER_CONFIG) as broker:
        bootstrap = broker.bootstrap_servers
        rows = []
        for size in sizes:
            topic = f"service-{size}"
            create_topic(bootstrap, topic)
            started = time.perf_counter()
            produce(bootstrap, topic, range(size))
            produce_s = time.perf_counter() - started
            data_dir = Path(tmp) / topic
            cold_s, materializer = time_to_ready(bootstrap, topic, data_dir)
            materializer.close()
            produce(bootstrap, topic, range(size, size + args.tail))
            warm_s, materializer = time_to_ready(bootstrap, topic, data_dir)
            fetched = materializer.stats.records_fetched
            materializer.close()
            baseline_s, baseline_keys = consumer_into_dict(bootstrap, topic)
            assert baseline_keys == size + args.tail
            rows.append((size, produce_s, cold_s, warm_s, fetched, baseline_s))
            print(f"{size:>10,d} keys: produce {produce_s:6.1f} s | cold start {cold_s:6.2f} s | warm start to "
                  f"ready {warm_s:6.3f} s (fetched {fetched:,d}) | consumer re-reading the topic into a dict "
                  f"{baseline_s:6.2f} s ({baseline_s / warm_s:.0f}x the warm start)", flush=True)
        if len(rows) > 1:
            print(f"warm start, largest vs smallest store: {rows[-1][3] / rows[0][3]:.2f}x "
                  f"({rows[-1][0] // rows[0][0]}x the keys)\n")

        first = sizes[0]
        reads = reads_during_ingest(bootstrap, f"service-{first}", Path(tmp) / f"service-{first}", first,
                                    args.read_seconds)
        print(f"reads from another process while ingest runs ({first:,d}-key store, {reads['applied_during']:,d} "
              f"records applied meanwhile): {reads['gets']:,d} gets, p50 {reads['p50_ms']:.3f} ms, "
              f"p99 {reads['p99_ms']:.3f} ms, max {reads['max_ms']:.1f} ms; reader open {reads['open_ms']:.0f} ms; "
              f"catch_up every 100 ms: p50 {reads['catch_up_p50_ms']:.2f} ms, p99 {reads['catch_up_p99_ms']:.2f} ms")


if __name__ == "__main__":
    main()
