"""Testing the inventory application with kafka-materializer's pytest fixtures.

Run: ``pytest examples/test_harness`` (a real Apache Kafka broker is started from the official jars,
or use ``--kafka-bootstrap-servers`` / ``--kafka-broker=testcontainers``). No conftest.py: the
fixtures come with the package.
"""

from __future__ import annotations

import time

from inventory import TOPIC_CONFIG, Inventory

from materializer.testing.compaction_oracle import predict_compaction

# Small segments and no compaction lag, so the broker's cleaner compacts within a second.
FAST_COMPACTION = {**TOPIC_CONFIG, "segment.ms": "100", "min.cleanable.dirty.ratio": "0.01",
                   "delete.retention.ms": "60000"}


def _send(producer, topic: str, updates: list[tuple[str, str | None]]) -> None:
    for sku, quantity in updates:
        producer.produce(topic, key=sku.encode(), value=None if quantity is None else quantity.encode())
    assert producer.flush(30) == 0


def test_stock_survives_a_restart_and_fetches_only_the_tail(kafka_materializer_broker, kafka_materializer_topic_factory,
                                                           kafka_materializer_producer, tmp_path) -> None:
    topic = kafka_materializer_topic_factory(config=TOPIC_CONFIG)
    _send(kafka_materializer_producer, topic, [("apple", "5"), ("pear", "2"), ("apple", "3"), ("plum", "9")])
    inventory = Inventory(kafka_materializer_broker.bootstrap_servers, topic, tmp_path)
    assert inventory.refresh() == 4
    assert (inventory.stock("apple"), inventory.stock("pear"), inventory.stock("kiwi")) == (3, 2, None)
    inventory.close()

    _send(kafka_materializer_producer, topic, [("pear", None), ("kiwi", "1")])  # pear discontinued
    restarted = Inventory(kafka_materializer_broker.bootstrap_servers, topic, tmp_path)
    assert restarted.refresh() == 2  # only the records produced since the first run
    assert (restarted.stock("apple"), restarted.stock("pear"), restarted.stock("kiwi")) == (3, None, 1)
    restarted.close()


def test_local_compaction_equals_the_brokers(kafka_materializer_broker, kafka_materializer_topic_factory,
                                             kafka_materializer_producer, kafka_materializer_view,
                                             kafka_materializer_compaction) -> None:
    topic = kafka_materializer_topic_factory(config=FAST_COMPACTION)
    updates = [(f"sku-{i % 7}", None if i % 10 == 9 else str(i)) for i in range(60)]
    for chunk in range(0, 60, 20):  # three producer flushes, segments roll every 100 ms
        _send(kafka_materializer_producer, topic, updates[chunk:chunk + 20])
        time.sleep(0.3)
    _send(kafka_materializer_producer, topic, [("last", "0")])  # the active segment
    materializer = kafka_materializer_view(topic)
    latest: dict[bytes, bytes] = {}
    for sku, quantity in updates + [("last", "0")]:
        if quantity is None:
            latest.pop(sku.encode(), None)
        else:
            latest[sku.encode()] = quantity.encode()
    assert {entry.key: entry.value for entry in materializer.view().items()} == latest

    compared = kafka_materializer_compaction.assert_compacted_like_broker(topic)
    kept = compared[0].records
    assert len(kept) < compared[0].upto_offset  # the broker removed superseded updates
    assert len({r.key for r in kept}) == len(kept)  # one record per key is left below the checkpoint


def test_the_oracle_predicts_without_a_broker() -> None:
    kept = predict_compaction([(b"apple", b"5"), (b"pear", b"2"), (b"apple", b"3"), (b"pear", None), (b"fig", b"1")],
                              {"segment.bytes": "1024"}, upto_offset=4)
    assert [(r.offset, r.key, r.value) for r in kept] == [(2, b"apple", b"3"), (3, b"pear", None), (4, b"fig", b"1")]

