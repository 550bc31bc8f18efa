"""Two instances of a service that join each customer's latest order with the customer, locally.

Run:  python examples/service/orders_join.py --bootstrap-servers HOST:PORT [--data-dir DIR]

Both topics are keyed by customer id and have 6 partitions, so they are co-partitioned: the
instance that holds partition p of ``orders`` holds partition p of ``customers`` too, and each
customer's latest order (the store keeps the latest value per key, a KTable) finds its customer in
the same instance's store, a KTable-KTable join as Kafka Streams would make it (which requires the
same co-partitioning). The two instances here are two ``TopicSet`` members of one consumer group, each with its
own data dir, as two processes of a service would be. The records are produced with
confluent-kafka's default partitioner (librdkafka's ``consistent_random``), which the members are
told, so reads route each key to the partition it was written to. Prints, per instance::

    instance a: partitions [0, 2, 4] of orders and customers; 31 latest orders joined locally, 0 customers missing
"""

from __future__ import annotations

import argparse
import json
import time
import uuid
from pathlib import Path

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from materializer import MaterializerOptions, TopicSet

PARTITIONS = 6
CUSTOMERS = 60
ORDERS = 300


def produce(bootstrap_servers: str, orders: str, customers: str) -> None:
    """Create both topics (compacted, 6 partitions each) and write customers and their orders, keyed by
    customer id."""
    admin = AdminClient({"bootstrap.servers": bootstrap_servers})
    topics = [NewTopic(t, PARTITIONS, 1, config={"cleanup.policy": "compact"}) for t in (orders, customers)]
    for future in admin.create_topics(topics).values():
        future.result(30)
    producer = Producer({"bootstrap.servers": bootstrap_servers, "linger.ms": 20})  # default partitioner
    for c in range(CUSTOMERS):
        producer.produce(customers, key=f"customer-{c:03d}", value=json.dumps({"name": f"Customer {c}"}))
    for o in range(ORDERS):
        customer = f"customer-{o % CUSTOMERS:03d}"
        producer.produce(orders, key=customer, value=json.dumps({"order": o, "cents": 100 + o}))
    producer.flush(60)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap-servers", required=True)
    parser.add_argument("--data-dir", type=Path, default=Path("orders-join-data"))
    args = parser.parse_args()
    suffix = uuid.uuid4().hex[:6]
    orders, customers = f"example-orders-{suffix}", f"example-customers-{suffix}"
    produce(args.bootstrap_servers, orders, customers)
    options = MaterializerOptions(key_format="str", value_format="json", progress=False,
                                  partitioner="consistent_random")
    group = f"orders-svc-{suffix}"
    instances = {name: TopicSet(args.bootstrap_servers, [orders, customers], args.data_dir / name, options=options,
                                group_id=group) for name in ("a", "b")}
    try:
        for instance in instances.values():
            instance.run_in_background()
        deadline = time.monotonic() + 120
        while True:  # both instances hold their share, caught up (the second one's join moves half)
            held = {name: set(i[orders].served_partitions()) for name, i in instances.items()}
            if all(held.values()) and set.union(*held.values()) == set(range(PARTITIONS)) \
                    and all(set(i[customers].served_partitions()) == held[n] for n, i in instances.items()):
                break
            if time.monotonic() > deadline:
                raise SystemExit(f"the instances did not split the topics within 120 s: {held}")
            time.sleep(0.1)
        for name, instance in instances.items():
            customer_view = instance.view(customers)
            joined = missing = 0
            # each instance joins the orders it holds with customers from its own store, no remote call
            for entry in instance.view(orders).items():
                if customer_view.get(entry.key) is None:
                    missing += 1
                else:
                    joined += 1
            print(f"instance {name}: partitions {sorted(held[name])} of orders and customers; {joined} latest "
                  f"orders joined locally, {missing} customers missing")
    finally:
        for instance in instances.values():
            instance.close()


if __name__ == "__main__":
    main()
