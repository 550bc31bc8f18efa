"""A cache that warms up from its local compacted copy at start-up and reports its time to ready.

Run:  python examples/service/cache_warmup.py --bootstrap-servers HOST:PORT [--topic T] [--data-dir DIR] \
          [--produce N]

The first start fetches the whole topic; every later start restores from ``--data-dir`` (local
log + RocksDB) and fetches only the records the broker got since. The cache keeps ingesting in a
background thread after it is ready. ``--produce N`` first writes N JSON records over 10% as many
keys (a stand-in for the application that owns the topic). Prints::

    ready in 0.412 s: 20000 live keys; fetched 1000 records from the broker, replayed 0 from the local log
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from materializer import Materializer, MaterializerOptions


def produce(bootstrap_servers: str, topic: str, count: int) -> None:
    """Write ``count`` JSON records (keys ``sku-NNNNN``, 10% as many keys as records) to a compacted ``topic``."""
    admin = AdminClient({"bootstrap.servers": bootstrap_servers})
    futures = admin.create_topics([NewTopic(topic, 2, 1, config={"cleanup.policy": "compact"})])
    try:
        futures[topic].result(30)
    except Exception as exc:  # noqa: BLE001 - an existing topic is fine
        if "already exists" not in str(exc).lower():
            raise
    producer = Producer({"bootstrap.servers": bootstrap_servers, "linger.ms": 20})
    keys = max(1, count // 10)
    start = time.time_ns()
    for i in range(count):
        sku = f"sku-{i % keys:05d}"
        producer.produce(topic, key=sku, value=json.dumps({"sku": sku, "price_cents": i, "at": start + i}))
        if i % 10_000 == 0:
            producer.poll(0)
    producer.flush(60)


def warm_up(bootstrap_servers: str, topic: str, data_dir: Path) -> None:
    """Start the cache, wait until it has caught up, print the figures, look a key up, stop."""
    started = time.monotonic()
    materializer = Materializer(bootstrap_servers, topic, data_dir,
                                options=MaterializerOptions(key_format="str", value_format="json", progress=False))
    materializer.run_in_background()
    try:
        if not materializer.wait_until_caught_up(timeout_s=300):
            raise SystemExit("not ready within 300 s")
        ready_s = time.monotonic() - started
        view = materializer.view()
        stats = materializer.stats
        print(f"ready in {ready_s:.3f} s: {len(view)} live keys; fetched {stats.records_fetched} records from the "
              f"broker, replayed {stats.records_replayed} from the local log")
        print("sku-00007 ->", view.get("sku-00007"))
    finally:
        materializer.stop()
        materializer.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap-servers", required=True)
    parser.add_argument("--topic", default="cache-warmup-skus")
    parser.add_argument("--data-dir", type=Path, default=Path("cache-data"))
    parser.add_argument("--produce", type=int, default=0, metavar="N", help="first produce N records")
    args = parser.parse_args()
    if args.produce:
        produce(args.bootstrap_servers, args.topic, args.produce)
    warm_up(args.bootstrap_servers, args.topic, args.data_dir)


if __name__ == "__main__":
    main()
