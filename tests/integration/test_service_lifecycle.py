"""A service's lifecycle on the Materializer (issue 9, item 4): background run, readiness, updates, health."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import Producer

from materializer import Materializer, MaterializerOptions

from .test_ingest import Produced, produce

pytestmark = pytest.mark.broker


def test_background_run_ready_updates_and_health(kafka_broker, create_topic, tmp_path):
    topic = create_topic(partitions=2, config={"cleanup.policy": "compact"})
    bootstrap = kafka_broker.bootstrap_servers
    produced = Produced()
    produce(bootstrap, topic, produced, count=1500, keys=200, seed=3)
    updates = []
    options = MaterializerOptions(cleaner_threads=0)
    with Materializer(bootstrap, topic, tmp_path, options=options) as materializer:
        materializer.on_update(lambda key, old, new, partition: updates.append((key, old, new, partition)))
        assert not materializer.health.caught_up
        materializer.run_in_background()
        assert materializer.wait_until_caught_up(timeout_s=60)
        health = materializer.health
        assert health.running and health.caught_up and health.failed is None
        assert {k: v.value for k, v in materializer.store.items()} == {
            k: v for k, (_, _, v) in produced.expected_state().items()}
        assert len(updates) == 1500  # one callback per keyed record, in offset order per partition

        # A new value and a tombstone reach the callbacks with the values they replaced.
        key = next(iter(produced.expected_state()))
        partition = produced.expected_state()[key][0]
        before = materializer.store.get(key, partition)
        producer = Producer({"bootstrap.servers": bootstrap})
        producer.produce(topic, key=key, value=b"fresh", partition=partition)
        producer.produce(topic, key=key, value=None, partition=partition)
        assert producer.flush(30) == 0
        deadline = time.monotonic() + 30
        while len(updates) < 1502 and time.monotonic() < deadline:
            time.sleep(0.1)
        (k1, old1, new1, p1), (k2, old2, new2, p2) = updates[-2:]
        assert (k1, p1, old1, new1.value) == (key, partition, before, b"fresh")
        assert (k2, old2, new2) == (key, new1, None)
        assert materializer.store.get(key, partition) is None

        # A callback that raises stops ingest; the service sees it in health.
        materializer.on_update(lambda *args: (_ for _ in ()).throw(RuntimeError("callback broke")))
        producer.produce(topic, key=b"x", value=b"y", partition=0)
        assert producer.flush(30) == 0
        deadline = time.monotonic() + 30
        while materializer.health.failed is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert isinstance(materializer.health.failed, RuntimeError) and not materializer.health.running
        with pytest.raises(RuntimeError, match="callback broke"):
            materializer._caught_up.clear() or materializer.wait_until_caught_up(timeout_s=1)
