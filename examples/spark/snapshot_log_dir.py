"""Snapshot a Kafka log-dir backup with Spark, and warm a state store from the same backup, no broker.

Run:  python examples/spark/snapshot_log_dir.py [--log-dir DIR --topic TOPIC] [--out DIR]

With --log-dir, DIR is a broker's log dir or a copy of one (``<topic>-<partition>/`` folders).
Without it, a local Apache Kafka broker is started from the official jars in a temporary folder,
a compacted topic with tombstones and an aborted transaction is produced, and the broker is
stopped: its log dir is then the backup. Needs the ``spark`` extra (PySpark >= 4.0) and Java 17.
"""

from __future__ import annotations

import argparse
import contextlib
import tempfile
from pathlib import Path

TOPIC = "example-prices"


def make_backup(work: Path) -> Path:
    """A broker's log dir after producing to TOPIC, with the broker stopped."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    from materializer.local.kafka_broker import TEST_BROKER_CONFIG, LocalKafkaBroker

    broker = LocalKafkaBroker(work / "broker", extra_config=TEST_BROKER_CONFIG).start()
    try:
        bootstrap = broker.bootstrap_servers
        admin = AdminClient({"bootstrap.servers": bootstrap})
        admin.create_topics([NewTopic(TOPIC, 3, 1, config={"cleanup.policy": "compact"})])[TOPIC].result(30)
        producer = Producer({"bootstrap.servers": bootstrap, "compression.type": "zstd"})
        for i in range(3000):
            sku = f"sku-{i % 400:04d}"
            producer.produce(TOPIC, key=sku.encode(), value=None if i % 11 == 10 else f"{i / 100:.2f}".encode())
        producer.flush(30)
        aborted = Producer({"bootstrap.servers": bootstrap, "transactional.id": "example-aborted"})
        aborted.init_transactions(30)
        aborted.begin_transaction()
        for i in range(100):
            aborted.produce(TOPIC, key=f"sku-{i:04d}".encode(), value=b"never-committed")
        aborted.abort_transaction(30)
        del producer, aborted, admin  # close the clients before the broker goes
    finally:
        broker.stop()
    return broker.log_dirs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--log-dir", type=Path, help="a broker log dir or a copy of one (default: make one)")
    parser.add_argument("--topic", default=TOPIC)
    parser.add_argument("--out", type=Path, help="output folder (default: a temporary one)")
    args = parser.parse_args()

    from materializer.adapters.rocksdb_store import StateStore
    from materializer.datadir.layout import state_dir
    from materializer.offline.restore import restore_from_log_dir
    from materializer.spark.jobs import snapshot, spark_session

    with contextlib.ExitStack() as stack:
        work = args.out or Path(stack.enter_context(tempfile.TemporaryDirectory()))
        log_dir = args.log_dir or make_backup(work)

        spark = spark_session("local[2]")
        stack.callback(spark.stop)
        manifest = snapshot(spark, [log_dir], args.topic, work / "snapshot", mode="overwrite")
        print(f"Parquet snapshot: {manifest['rows']} live keys, next offsets {manifest['partitions']}")
        rows = spark.read.parquet(str(work / "snapshot"))
        print("five of them:", [(r.partition, bytes(r.key).decode(), bytes(r.value).decode())
                                for r in rows.orderBy("partition", "key").limit(5).collect()])

        restored = restore_from_log_dir(log_dir, args.topic, work / "warm")
        with StateStore(state_dir(work / "warm", args.topic), read_only=True) as store:
            warm = {(v.partition, k): v.value for k, v in store.items()}
        snap = {(r.partition, bytes(r.key)): bytes(r.value) for r in rows.collect()}
        print(f"warm store: {restored.live_keys} live keys; equal to the snapshot: {warm == snap}")
        if warm != snap:
            raise SystemExit("the snapshot and the warm store differ")


if __name__ == "__main__":
    main()
