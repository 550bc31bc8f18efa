"""Standby replicas against the real broker (issue 40, first slice): two ``materializer run
--group-id G --standby-replicas 1`` processes over a 6-partition topic each follow the other's
partitions as standbys; one is stopped (SIGTERM) or killed (SIGKILL), and the survivor serves its
partitions after fetching only what was produced since it last fetched them.

With two members and one replica the placement is forced (each partition's only possible standby is
the member that does not own it), so the survivor holds every partition of the victim as a standby
whatever the coordinator assigned, and every one of them is a promotion. The bound on what the
survivor fetches comes from the broker's offsets (the log end offsets before the stop and once the
survivor serves everything), not from the member's own counters: without standbys it would fetch
the victim's partitions from their start (about half the topic), here only the records produced
after the stop. The values it serves equal a read_committed consumer's.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from materializer.group.routing import partition_for_key
from materializer.local.ports import free_port
from materializer.view import MaterializedView
from tests.integration.test_group_failover import Member, _detail, _held, _show, _wait
from tests.integration.test_group_materializer import _group, _read_committed

pytestmark = pytest.mark.broker

PARTITIONS = 6
ALL = frozenset(range(PARTITIONS))
KEYS = 600
AFTER_STOP = 60  # records produced to the victim's partitions after it stopped


class StandbyMember(Member):
    """A ``materializer run --group-id --standby-replicas 1`` subprocess."""

    def start(self) -> None:
        self.port = free_port()
        with open(self.log, "ab") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "materializer", "run", "--bootstrap-servers", self.bootstrap,
                 "--topic", self.topic, "--data-dir", str(self.data_dir), "--group-id", self.group,
                 "--standby-replicas", "1", "--metrics-port", str(self.port), "--no-progress"],
                stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})


def _standbys(member: Member) -> dict[int, dict[str, Any]]:
    """``/health/ready``'s standby partitions: partition -> {log_end_offset, high_watermark, lag, ...}."""
    group = _detail(member.ready()).get("group") or {}
    return {int(p): v for p, v in (group.get("standby_partitions") or {}).items()}


def _log_ends(bootstrap: str, topic: str) -> dict[int, int]:
    """The broker's log end offsets (high watermarks) of the topic's partitions now."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "unused-ends"})
    try:
        return {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in range(PARTITIONS)}
    finally:
        consumer.close()


def _produce(bootstrap: str, topic: str, keys: list[bytes], tag: str) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True,
                         "partitioner": "murmur2_random"})
    for key in keys:
        producer.produce(topic, key=key, value=f"{tag}-{key.decode()}".encode())
    assert producer.flush(30) == 0


def _following_each_other(a: Member, b: Member, ends: dict[int, int]) -> bool:
    """Both ready, owning three partitions each, each following the other's as standbys, fetched up to ``ends``."""
    states = [_held(a), _held(b)]
    if any(s is None or not s[0] for s in states):
        return False
    held_a, held_b = (s[1] for s in states if s is not None)
    if held_a | held_b != ALL or held_a & held_b:
        return False
    for member, others in ((a, held_b), (b, held_a)):
        standbys = _standbys(member)
        if set(standbys) != others or any(standbys[p]["log_end_offset"] != ends[p] for p in others):
            return False
        samples = member.metrics()
        if any(samples.get(f"materializer_partition_next_offset{{{p}}}") != ends[p] for p in ALL):
            return False
    return True


@pytest.mark.parametrize("stop", [signal.SIGKILL, signal.SIGTERM], ids=["sigkill", "sigterm"])
def test_the_survivor_serves_the_victims_partitions_after_fetching_only_the_delta(
        kafka_broker, kafka_admin, kafka_materializer_topic_factory, tmp_path: Path, stop: signal.Signals) -> None:
    bootstrap = kafka_broker.bootstrap_servers
    topic = kafka_materializer_topic_factory(partitions=PARTITIONS)
    group = _group(kafka_admin)
    keys = [f"k{i}".encode() for i in range(KEYS)]
    _produce(bootstrap, topic, keys, "one")
    a, b = members = [StandbyMember(name, tmp_path, bootstrap, topic, group) for name in ("a", "b")]
    try:
        for m in members:
            m.start()
        ends = _log_ends(bootstrap, topic)
        _wait(lambda: _following_each_other(a, b, ends), _show(members))
        held_a = (_held(a) or (False, frozenset()))[1]
        assert held_a and all((b.data_dir / f"{topic}-{p}").is_dir() for p in held_a)
        before = b.metrics()
        assert before["materializer_group_standby_partitions"] == len(held_a)
        assert before.get("materializer_group_standby_promotions_total") == 0

        # The victim goes; records arrive for its partitions meanwhile.
        stopped = time.monotonic()
        assert a.process is not None
        a.process.send_signal(stop)
        a.process.wait(60)
        late = [k for k in keys if partition_for_key(k, PARTITIONS) in held_a][:AFTER_STOP]
        _produce(bootstrap, topic, late, "two")
        after = _log_ends(bootstrap, topic)
        produced = {p: after[p] - ends[p] for p in ALL}
        assert sum(produced.values()) == len(late) and all(produced[p] == 0 for p in ALL - held_a)

        def serves_everything() -> bool:
            state = _held(b)
            samples = b.metrics()
            return (state is not None and state[0] and state[1] == ALL
                    and all(samples.get(f"materializer_partition_next_offset{{{p}}}") == after[p] for p in ALL))

        _wait(serves_everything, _show([b]))
        dark_s = time.monotonic() - stopped
        samples = b.metrics()
        fetched = samples["materializer_fetched_records_total"] - before["materializer_fetched_records_total"]
        promotions = samples["materializer_group_standby_promotions_total"]
        lacking = samples["materializer_group_standby_promotion_offsets_total"]
        print(f"{signal.Signals(stop).name}: b serves all {PARTITIONS} partitions {dark_s:.1f} s after the stop; "
              f"{promotions:g} promotions lacking {lacking:g} offsets; fetched {fetched:g} records since the stop "
              f"({sum(produced.values())} produced, {sum(ends[p] for p in held_a)} in the victim's partitions before)")
        assert promotions == len(held_a)
        # b follows every partition, so the records produced since the stop are all it may fetch; the
        # offsets lacking at promotion are at most those (it kept fetching them as a standby meanwhile)
        assert fetched <= sum(produced.values())
        assert lacking <= sum(produced.values())
        assert _standbys(b) == {}
        truth = _read_committed(bootstrap, topic, PARTITIONS)
        with MaterializedView.open(b.data_dir, topic) as view:
            assert {k: view.get(k) for k in truth} == {k: v for k, (_, v) in truth.items()}
        assert all(truth[k][1] == f"two-{k.decode()}".encode() for k in late)
    finally:
        for m in members:
            m.stop()
