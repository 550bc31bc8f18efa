"""Materializer.close_partitions / open_partitions against the real broker, both fetch paths: the
building blocks of a consumer group's revocation and assignment (issue 25).

A closed partition keeps its local log and its store entries; a run goes on without it (readiness
and the per-partition statistics leave it out, its folder is not touched); opened again, it
fetches only what the topic got since it was closed, and its store catches up from there.
"""

from __future__ import annotations

import pytest
from confluent_kafka import Producer

from materializer.config import MaterializerOptions
from materializer.materializer import Materializer

pytestmark = pytest.mark.broker

PARTITIONS = 3


def _produce(bootstrap: str, topic: str, partitions: list[int], count: int, tag: str) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True})
    for partition in partitions:
        for i in range(count):
            producer.produce(topic, key=f"k{i}".encode(), value=f"{tag}-{partition}-{i}".encode(), partition=partition)
    assert producer.flush(30) == 0


@pytest.mark.parametrize("fetch", ["replica", "consumer"])
def test_a_closed_partition_is_kept_and_fetches_only_the_delta_when_opened(kafka_broker, create_topic, tmp_path,
                                                                          fetch) -> None:
    bootstrap = kafka_broker.bootstrap_servers
    topic = create_topic(partitions=PARTITIONS)
    _produce(bootstrap, topic, list(range(PARTITIONS)), 10, "first")
    with Materializer(bootstrap, topic, tmp_path, options=MaterializerOptions(fetch=fetch, progress=False)) as m:
        m.run(until_caught_up=True)
        assert m.store is not None and m.store.offsets() == {0: 10, 1: 10, 2: 10}

        assert m.close_partitions([1, 7]) == [1]
        assert m.close_partitions([1]) == []
        assert sorted(m.logs) == [0, 2]
        folder = tmp_path / f"{topic}-1"
        assert folder.is_dir()
        assert set(m.stats.lag()) == {0, 2} and set(m.stats.high_watermarks) == {0, 2}
        assert m.store.offsets()[1] == 10 and m.view().get(b"k3", partition=1) == b"first-1-3"

        _produce(bootstrap, topic, [1], 5, "second")
        fetched = m.stats.records_fetched
        m.run(until_caught_up=True)  # partition 1 is not fetched: caught up at once
        assert m.stats.records_fetched == fetched
        assert m.store.offsets()[1] == 10

        assert m.open_partitions([0, 1]) == [1]
        assert not m.health.caught_up  # until partition 1 reached its high watermark of now
        m.run(until_caught_up=True)
        assert m.health.caught_up
        assert m.stats.records_fetched - fetched == 5  # the delta only, not the 15 the partition holds
        assert m.logs[1].log_end_offset == 15 and m.store.offsets() == {0: 10, 1: 15, 2: 10}
        view = m.view()
        assert [view.get(f"k{i}".encode(), partition=1) for i in (3, 7)] == [b"second-1-3", b"first-1-7"]
        assert set(m.stats.lag()) == {0, 1, 2}
