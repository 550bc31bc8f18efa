"""Materialize a Kafka topic with the Python API, then resume after more records arrive.

Run:  python examples/materialize_topic.py [--bootstrap-servers HOST:PORT] [--data-dir DIR]

Without --bootstrap-servers a local Apache Kafka broker is started from the official jars in a
temporary folder (Java 17 needed; the first run downloads them with Maven) and stopped at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import tempfile
from pathlib import Path

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from materializer import Materializer, MaterializerOptions
from materializer.local.kafka_broker import TEST_BROKER_CONFIG, LocalKafkaBroker

TOPIC = "example-user-emails"


def produce(bootstrap_servers: str, start: int, count: int) -> None:
    producer = Producer({"bootstrap.servers": bootstrap_servers, "compression.type": "lz4"})
    for i in range(start, start + count):
        user = f"user-{i % 50:02d}"
        value = None if i % 9 == 8 else f"{user}+{i}@example.com".encode()  # every 9th record is a tombstone
        producer.produce(TOPIC, key=user.encode(), value=value, headers=[("origin", b"example")])
    producer.flush(30)


def materialize(bootstrap_servers: str, data_dir: Path) -> None:
    options = MaterializerOptions(compression="zstd")
    with Materializer(bootstrap_servers, TOPIC, data_dir, options=options) as materializer:
        stats = materializer.run(until_caught_up=True)
        print(f"fetched {stats.records_fetched} records, appended {stats.bytes_appended} bytes in "
              f"{stats.batches_appended} batches, {materializer.store.count()} live keys")
        print("user-07 ->", materializer.store.get(b"user-07"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap-servers")
    parser.add_argument("--data-dir", type=Path)
    args = parser.parse_args()
    with contextlib.ExitStack() as stack:
        data_dir = args.data_dir or Path(stack.enter_context(tempfile.TemporaryDirectory())) / "data"
        bootstrap = args.bootstrap_servers
        if bootstrap is None:
            broker_dir = Path(stack.enter_context(tempfile.TemporaryDirectory())) / "broker"
            bootstrap = stack.enter_context(LocalKafkaBroker(broker_dir, extra_config=TEST_BROKER_CONFIG)).bootstrap_servers
        admin = AdminClient({"bootstrap.servers": bootstrap})
        futures = admin.create_topics([NewTopic(TOPIC, 2, 1, config={"cleanup.policy": "compact"})])
        with contextlib.suppress(Exception):  # already exists
            futures[TOPIC].result(30)

        produce(bootstrap, 0, 1000)
        materialize(bootstrap, data_dir)       # first run: everything
        produce(bootstrap, 1000, 200)
        materialize(bootstrap, data_dir)       # second run: only the 200 new records are fetched
        print("local log folders:", sorted(p.name for p in data_dir.iterdir() if p.name.startswith(TOPIC)))


if __name__ == "__main__":
    main()
