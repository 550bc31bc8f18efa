"""Several topics in one process (issue 25, Deliver 3) against the session's real broker.

* ``materializer run --topic a --topic b --until-caught-up``: one data dir, a store per topic, each
  equal to what a read_committed consumer reads; readers in other processes (``get``) read either
  topic; a second start fetches only what was produced since, per topic; while a set runs, the
  data dir is locked for every other writer.
* Two group members, each a :class:`TopicSet` over ``orders`` (6 partitions), ``customers`` (6)
  and ``rates`` (2), in one KIP-848 group: ``customers`` is co-partitioned with ``orders`` (each
  member holds the same partitions of both), ``rates`` is assigned on its own (the group's
  assignor balances the 8 partitions of the lead topics ``orders`` and ``rates``); the stores are
  disjoint and together equal the topics; the combined health probes and metrics name every
  topic; when one member closes, the other holds every partition of the three topics and serves
  every key.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer

from materializer.adapters.errors import PartitionNotAssignedError
from materializer.config import MaterializerOptions
from materializer.datadir.lock import DataDirLock
from materializer.http_endpoints import EndpointServer
from materializer.metrics import MaterializerMetrics
from materializer.group.routing import partition_for_key
from materializer.storage.errors import DataDirLockedError
from materializer.topic_set import TopicSet
from tests.integration.test_group_materializer import _group, _read_committed, _wait

pytestmark = pytest.mark.broker

def _produce(bootstrap: str, topic: str, partitions: int, keys: range, tag: str) -> dict[bytes, bytes]:
    """``k<i>`` -> ``<tag>-<i>`` with Kafka's murmur2 partitioner (as views route keys)."""
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True,
                         "partitioner": "murmur2_random"})
    sent = {}
    for i in keys:
        key = f"k{i}".encode()
        sent[key] = f"{tag}-{i}".encode()
        producer.produce(topic, key=key, value=sent[key])
    assert producer.flush(30) == 0
    assert all(partition_for_key(k, partitions) < partitions for k in sent)
    return sent


def _options(**extra: Any) -> MaterializerOptions:
    return MaterializerOptions(progress=False, poll_timeout_ms=200, cleaner_threads=0, **extra)


def test_run_two_topics_in_one_data_dir(kafka_broker, kafka_materializer_topic_factory, tmp_path: Path) -> None:
    bootstrap = kafka_broker.bootstrap_servers
    a = kafka_materializer_topic_factory(partitions=3)
    b = kafka_materializer_topic_factory(partitions=2)
    sent_a = _produce(bootstrap, a, 3, range(300), "a")
    sent_b = _produce(bootstrap, b, 2, range(200), "b")
    data_dir = tmp_path / "data"

    result = subprocess.run(
        [sys.executable, "-m", "materializer", "run", "--bootstrap-servers", bootstrap, "--topic", a, "--topic", b,
         "--data-dir", str(data_dir), "--until-caught-up", "--no-progress", "--store-memory-mb", "16"],
        capture_output=True, text=True, timeout=300)  # both stores in one 16 MiB budget
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert any(line.startswith(f"{a}: fetched 300 records") and "300 live keys" in line for line in lines), lines
    assert any(line.startswith(f"{b}: fetched 200 records") and "200 live keys" in line for line in lines), lines
    assert {d.name for d in data_dir.iterdir() if d.is_dir() and d.name != "state"} >= {
        f"{a}-0", f"{a}-1", f"{a}-2", f"{b}-0", f"{b}-1"}
    assert (data_dir / "state" / a).is_dir() and (data_dir / "state" / b).is_dir()

    # Readers in other processes read either topic's store.
    def get(topic: str, key: bytes) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "materializer", "get", "--data-dir", str(data_dir), "--topic",
                               topic, key.decode()], capture_output=True, text=True, timeout=120)

    for topic, sent in ((a, sent_a), (b, sent_b)):
        found = get(topic, b"k7")
        assert found.returncode == 0 and found.stdout.strip() == sent[b"k7"].decode(), found.stderr

    # A second start fetches only the records produced since, per topic; the stores equal the topics.
    sent_a.update(_produce(bootstrap, a, 3, range(290, 320), "a2"))
    options = _options()
    with TopicSet(bootstrap, [a, b], data_dir, options=options) as topic_set:
        with pytest.raises(DataDirLockedError):  # one writer: the set holds the data dir
            DataDirLock.acquire(data_dir, "run")
        stats = topic_set.run(until_caught_up=True)
        assert stats[a].records_fetched == 30 and stats[b].records_fetched == 0
        for topic, partitions in ((a, 3), (b, 2)):
            truth = _read_committed(bootstrap, topic, partitions)
            served = {e.key: (e.partition, e.value) for e in topic_set.view(topic).items()}
            assert served == truth
        assert topic_set.view(a).get(b"k300") == b"a2-300"
    DataDirLock.acquire(data_dir, "run").release()  # released by close


def test_group_members_co_partition_topics_and_one_takes_over(
        kafka_broker, kafka_admin, kafka_materializer_topic_factory, tmp_path: Path) -> None:
    bootstrap = kafka_broker.bootstrap_servers
    counts = {kafka_materializer_topic_factory(partitions=n): n for n in (6, 6, 2)}  # orders, customers, rates
    orders, customers, rates = counts
    sent = {topic: _produce(bootstrap, topic, n, range(120), topic[:5]) for topic, n in counts.items()}
    group = _group(kafka_admin)
    options = _options(group_protocol="consumer", group_session_timeout_ms=6_000)
    members = [TopicSet(bootstrap, [orders, customers, rates], tmp_path / name, options=options, group_id=group)
               for name in ("m1", "m2")]
    try:
        for member in members:
            member.run_in_background()
        assert members[0].lead_of(customers) == orders and members[0].lead_of(rates) == rates

        def held(member: TopicSet, topic: str) -> set[int]:
            return set(member[topic].health.assigned_partitions)

        def split() -> bool:
            for topic, n in counts.items():
                parts = [held(m, topic) for m in members]
                if parts[0] & parts[1] or parts[0] | parts[1] != set(range(n)):
                    return False
            if not all(held(m, orders) for m in members):  # the assignor balances the lead topics' partitions
                return False
            return all(held(m, customers) == held(m, orders) for m in members) and all(m.caught_up for m in members)

        def show() -> str:
            return "; ".join(f"{t}: {[sorted(held(m, t)) for m in members]}" for t in counts) + \
                f"; caught up {[m.caught_up for m in members]}"

        _wait(split, show)
        truth = {topic: _read_committed(bootstrap, topic, n) for topic, n in counts.items()}
        for topic in counts:
            served = [{e.key: (e.partition, e.value) for e in m.view(topic).items()} for m in members]
            assert not set(served[0]) & set(served[1])
            assert {**served[0], **served[1]} == truth[topic]
        # co-partitioned: a key's customers partition is held where its orders partition is
        key = next(k for k, (p, _) in truth[customers].items() if p in held(members[1], customers))
        assert members[1].view(customers).get(key) == sent[customers][key]
        assert members[1].view(orders).get(key) == sent[orders][key]
        with pytest.raises(PartitionNotAssignedError) as raised:
            members[0].view(customers).get(key)
        assert raised.value.topic == customers and raised.value.group_id == group

        # One port for every topic: each probe holds when every topic's does; metrics per topic.
        m0 = list(members[0].materializers.values())
        ready = EndpointServer(m0).ready()
        assert ready.ok and set(ready.detail["topics"]) == set(counts), ready
        metrics = MaterializerMetrics(m0[0], statistics_interval_ms=0)
        for m in m0[1:]:
            MaterializerMetrics(m, statistics_interval_ms=0, registry=metrics.registry)
        exposed = metrics.render().decode()
        for topic in counts:
            assert f'materializer_group_assigned_partitions{{topic="{topic}"}} {len(held(members[0], topic))}.0' \
                in exposed

        # One member leaves: the other holds every partition of the three topics and serves every key.
        members[0].close()
        _wait(lambda: all(held(members[1], t) == set(range(n)) for t, n in counts.items()) and members[1].caught_up,
              show)
        for topic in counts:
            assert {e.key: (e.partition, e.value) for e in members[1].view(topic).items()} == truth[topic]
    finally:
        for member in members:
            member.close()
