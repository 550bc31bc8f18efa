"""Materializer group mode (``group_id``, ``run --group-id``) against the session's real broker
(issue 25): members of one consumer group split a topic's partitions and each materializes its own.

Two Materializers in one process (each with its own data dir, run in background threads; KIP-848
with the replica fetch, classic cooperative-sticky with the consumer fetch) join one group on a 12-partition topic: each holds 6, each is ready, their
stores are disjoint and together equal what a read_committed consumer reads; a view read of a key
the other member holds raises PartitionNotAssignedError. One closes: the other takes all 12 and
serves every key; records produced meanwhile to the closed member's partitions are fetched by it,
restarted in its data dir, as a delta only (per partition it held before). The CLI's
``--group-id`` runs a bounded member and refuses ``--commit-group`` equal to ``--group-id``.

KIP-848 groups get ``consumer.session.timeout.ms`` = 6 s and a 1 s heartbeat as group configs
(as in test_group_membership.py), classic members a 6 s ``session.timeout.ms``.
"""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType

from materializer.adapters.errors import PartitionNotAssignedError
from materializer.adapters.group_membership import GroupMembership
from materializer.config import MaterializerOptions
from materializer.health import readiness
from materializer.materializer import Materializer
from materializer.metrics import MaterializerMetrics
from materializer.group.routing import partition_for_key
from materializer.storage.checkpoint import RECOVERY_POINT_CHECKPOINT, read_offset_checkpoint
from materializer.storage.log_loader import CLEAN_SHUTDOWN_FILE
from materializer.view import MaterializedView

pytestmark = pytest.mark.broker

PARTITIONS = 12
KEYS = 240
SETTLE_S = 90.0  # generous bound on a loaded 2-core machine (never a timing assertion)
ALL = frozenset(range(PARTITIONS))


def _group(admin: Any) -> str:
    """A fresh KIP-848 group with a 6 s session timeout and a 1 s heartbeat (group configs)."""
    group = f"group-mat-{uuid.uuid4().hex[:10]}"
    resource = ConfigResource(ResourceType.GROUP, group, incremental_configs=[
        ConfigEntry("consumer.session.timeout.ms", "6000", incremental_operation=AlterConfigOpType.SET),
        ConfigEntry("consumer.heartbeat.interval.ms", "1000", incremental_operation=AlterConfigOpType.SET)])
    try:
        admin.incremental_alter_configs([resource])[resource].result(timeout=30)
    except Exception as exc:  # noqa: BLE001 - an external broker with the default minimums
        print(f"group configs refused ({exc}); the broker's session timeout applies")
    return group


def _produce(bootstrap: str, topic: str, keys: range, tag: str, only: frozenset[int] | None = None) -> dict[bytes, bytes]:
    """Produce ``k<i>`` -> ``<tag>-<i>`` with Kafka's murmur2 partitioner (as the view routes keys);
    with ``only``, just the keys of those partitions. Returns what was produced."""
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True,
                         "partitioner": "murmur2_random"})
    sent = {}
    for i in keys:
        key = f"k{i}".encode()
        if only is not None and partition_for_key(key, PARTITIONS) not in only:
            continue
        sent[key] = f"{tag}-{i}".encode()
        producer.produce(topic, key=key, value=sent[key])
    assert producer.flush(30) == 0
    return sent


def _read_committed(bootstrap: str, topic: str, partitions: int = PARTITIONS) -> dict[bytes, tuple[int, bytes]]:
    """Key -> (partition, latest value) as a read_committed consumer reads the whole topic (of
    ``partitions`` partitions) now."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"probe-{uuid.uuid4().hex[:8]}",
                         "isolation.level": "read_committed", "enable.auto.commit": False,
                         "enable.partition.eof": True})
    try:
        ends = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in range(partitions)}
        consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        seen: dict[bytes, tuple[int, bytes]] = {}
        positions = dict.fromkeys(range(partitions), 0)
        deadline = time.monotonic() + 60
        while any(positions[p] < ends[p] for p in positions) and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None or message.error() is not None:
                continue
            seen[message.key()] = (message.partition(), message.value())
            positions[message.partition()] = message.offset() + 1
        return seen
    finally:
        consumer.close()


def _wait(condition: Callable[[], bool], what: Callable[[], str], timeout_s: float = SETTLE_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"not within {timeout_s:g} s: {what()}")
        time.sleep(0.05)


def _show(ms: list[Materializer]) -> Callable[[], str]:
    return lambda: "; ".join(f"{m.health.member_id}: {m.health.assigned_partitions} ready={m.health.ready} "
                             f"({m.health.group_error})" for m in ms)


def _open(m: Materializer) -> set[int] | None:
    """The partitions ``m`` has open (its run loop changes them while this reads: None then)."""
    try:
        return set(m.logs)
    except RuntimeError:  # dictionary changed size during iteration
        return None


def _split(ms: list[Materializer], sizes: list[int]) -> bool:
    """Every partition held once, in ``sizes``, each member ready and done applying its rebalances
    (a revoked partition leaves assigned_partitions at once, the open logs a loop round later)."""
    held = [set(m.health.assigned_partitions) for m in ms]
    return (set().union(*held) == ALL and sorted(map(len, held)) == sorted(sizes)
            and all(m.health.ready and _open(m) == h for m, h in zip(ms, held)))


def _served(m: Materializer) -> dict[bytes, tuple[int, bytes]]:
    return {entry.key: (entry.partition, entry.value) for entry in m.view().items()}


@pytest.fixture
def members(kafka_broker: Any, tmp_path: Path) -> Iterator[Callable[..., Materializer]]:
    """Factory ``members(topic, group, name, protocol, fetch)``: a group-mode Materializer in
    ``tmp_path/name``, run in the background; every one is closed at teardown."""
    made: list[Materializer] = []

    def make(topic: str, group: str, name: str, protocol: str = "auto", fetch: str = "replica") -> Materializer:
        options = MaterializerOptions(progress=False, poll_timeout_ms=200, cleaner_threads=0, fetch=fetch,  # type: ignore[arg-type]
                                      metadata_refresh_interval_ms=5_000, group_protocol=protocol,  # type: ignore[arg-type]
                                      group_session_timeout_ms=6_000)
        m = Materializer(kafka_broker.bootstrap_servers, topic, tmp_path / name, options=options, group_id=group)
        made.append(m)
        m.run_in_background()
        return m

    yield make
    for m in made:
        m.close()


@pytest.mark.parametrize(("protocol", "fetch"), [("consumer", "replica"), ("classic", "consumer")])
def test_two_members_split_the_topic_and_a_restarted_one_fetches_only_the_delta(
        kafka_broker, kafka_admin, kafka_materializer_topic_factory, members, protocol, fetch) -> None:
    bootstrap = kafka_broker.bootstrap_servers
    topic = kafka_materializer_topic_factory(partitions=PARTITIONS)
    _produce(bootstrap, topic, range(KEYS), "first")
    group = _group(kafka_admin)

    a = members(topic, group, "a", protocol, fetch)
    assigned_to_a: list[frozenset[int]] = []
    revoked_from_a: list[frozenset[int]] = []
    ready_when_assigned: list[bool] = []
    a.on_assign(assigned_to_a.append)
    a.on_assign(lambda _: ready_when_assigned.append(a.health.ready))  # the run loop's thread, after opening
    a.on_revoke(revoked_from_a.append)
    b = members(topic, group, "b", protocol, fetch)
    _wait(lambda: _split([a, b], [6, 6]), _show([a, b]))
    held_a, held_b = set(a.health.assigned_partitions), set(b.health.assigned_partitions)
    assert set(a.logs) == held_a and set(b.logs) == held_b  # only the assigned partitions are open
    assert a.health.group_id == group and a.health.member_id and a.health.member_id != b.health.member_id
    assert set().union(*revoked_from_a) == held_b  # a held all 12 first, then gave b's away
    ready = readiness(a.health, a.stats.lag())
    assert ready.ok and ready.detail["group"]["assigned_partitions"] == sorted(held_a)
    assert set(ready.detail["lag"]) == {str(p) for p in held_a}  # per-partition numbers: assigned only
    with MaterializerMetrics(a, statistics_interval_ms=0) as metrics:
        exposed = metrics.render().decode()
    assert f'materializer_group_assigned_partitions{{topic="{topic}"}} 6.0' in exposed

    # Disjoint stores whose union is the topic as a read_committed consumer reads it.
    truth = _read_committed(bootstrap, topic)
    assert len(truth) == KEYS
    served_a, served_b = _served(a), _served(b)
    assert not set(served_a) & set(served_b)
    assert {**served_a, **served_b} == truth
    assert {p for p, _ in served_a.values()} == held_a and a.view().count() == len(served_a)

    # A key b holds is not served by a: the view names its partition.
    key_of_b = next(k for k, (p, _) in truth.items() if p in held_b)
    with pytest.raises(PartitionNotAssignedError) as raised:
        a.view().get(key_of_b)
    assert raised.value.partition == truth[key_of_b][0] and raised.value.group_id == group
    assert raised.value.owner is not None and raised.value.owner.member_id == b.health.member_id  # the group was asked
    with pytest.raises(PartitionNotAssignedError):
        a.view().count(partition=truth[key_of_b][0])
    assert b.view().get(key_of_b) == truth[key_of_b][1]
    with MaterializedView.open(a.data_dir, topic) as beside:  # a reader in another process (get, export)
        with pytest.raises(PartitionNotAssignedError):
            beside.get(key_of_b)  # a's kept entries of the partitions it gave b are not served
        assert beside.count() == len(served_a) and beside.get(next(iter(served_a))) == served_a[next(iter(served_a))][1]

    # b leaves: a takes all 12 over and serves every key.
    ends_b = {p: b.logs[p].log_end_offset for p in held_b}
    b.close()
    # b's data dir serves none of them any more (a moves them on from now on; found by an operator
    # campaign: a stopped member's readers served what it held as of the stop, with exit 0)
    with MaterializedView.open(b.data_dir, topic) as beside_b:
        with pytest.raises(PartitionNotAssignedError):
            beside_b.get(key_of_b)
    _wait(lambda: _split([a], [PARTITIONS]), _show([a]))
    assert set().union(*assigned_to_a) == held_b and a.stats.group_rebalances >= 2
    assert ready_when_assigned and not any(ready_when_assigned)  # readiness dropped until b's caught up
    view = a.view()
    assert all(view.get(key) == value for key, (_, value) in truth.items())
    assert _served(a) == truth

    # Records for b's former partitions while b is away; b restarts in its data dir.
    delta = _produce(bootstrap, topic, range(KEYS, 2 * KEYS), "second", only=frozenset(held_b))
    per_partition = {p: sum(1 for k in delta if partition_for_key(k, PARTITIONS) == p) for p in held_b}
    b2 = members(topic, group, "b", protocol, fetch)
    _wait(lambda: _split([a, b2], [6, 6]) and a.view().count() + b2.view().count() == KEYS + len(delta),
          _show([a, b2]))
    back = set(b2.health.assigned_partitions)
    for p in back & held_b:  # a partition it held before continues from its kept log
        assert b2.stats.start_offsets[p] == ends_b[p], (p, b2.stats.start_offsets, ends_b)
        assert b2.logs[p].log_end_offset == ends_b[p] + per_partition[p]
    if back <= held_b:
        assert b2.stats.records_fetched == sum(per_partition[p] for p in back)
    print(f"b got {sorted(back)} back (held {sorted(held_b)}); fetched {b2.stats.records_fetched} records, "
          f"{len(delta)} were produced while it was away")
    # kept folders of partitions it does not hold now stay closed (and are not deleted)
    assert set(b2.logs) == back
    assert all((b2.data_dir / f"{topic}-{p}").is_dir() for p in held_b)
    truth = _read_committed(bootstrap, topic)
    assert {**_served(a), **_served(b2)} == truth


def test_cli_run_with_group_id_materializes_the_assigned_partitions(
        kafka_broker, kafka_admin, kafka_materializer_topic_factory, tmp_path) -> None:
    bootstrap = kafka_broker.bootstrap_servers
    topic = kafka_materializer_topic_factory(partitions=PARTITIONS)
    produced = _produce(bootstrap, topic, range(KEYS), "first")
    group = _group(kafka_admin)
    data_dir = tmp_path / "data"
    # Another member holds the topic first; the CLI's member takes half of it.
    with GroupMembership(bootstrap, group, [topic]) as other:
        other.wait_until(lambda held: len(held) == PARTITIONS, SETTLE_S)
        result = subprocess.run(
            [sys.executable, "-m", "materializer", "run", "--bootstrap-servers", bootstrap, "--topic", topic,
             "--data-dir", str(data_dir), "--until-caught-up", "--no-progress", "--group-id", group],
            capture_output=True, text=True, timeout=180)
        assert result.returncode == 0, result.stderr
    found = re.search(rf"member of group {re.escape(repr(group))} with partitions \[([0-9, ]*)\]", result.stdout)
    assert found is not None, result.stdout
    mine = {int(p) for p in found.group(1).split(",") if p.strip()}
    assert 0 < len(mine) < PARTITIONS, mine  # the other member kept the rest
    keys = sum(1 for k in produced if partition_for_key(k, PARTITIONS) in mine)
    assert f"{keys} live keys" in result.stdout
    assert {d.name for d in data_dir.iterdir() if d.name.startswith(f"{topic}-")} == {f"{topic}-{p}" for p in mine}

    # Readers in other processes serve the member's partitions only, never another member's.
    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "materializer", *args, "--data-dir", str(data_dir),
                               "--topic", topic], capture_output=True, text=True, timeout=120)

    exported = cli("export")
    assert exported.returncode == 0, exported.stderr
    lines = [json.loads(line) for line in exported.stdout.splitlines()]
    assert {line["key"].encode(): line["value"].encode() for line in lines} == {
        k: v for k, v in produced.items() if partition_for_key(k, PARTITIONS) in mine}
    assert f"consumer group {group!r}" in exported.stderr
    mine_key = next(k for k in produced if partition_for_key(k, PARTITIONS) in mine)
    other_key = next(k for k in produced if partition_for_key(k, PARTITIONS) not in mine)
    found_value = cli("get", mine_key.decode())
    assert found_value.returncode == 0 and found_value.stdout.strip() == produced[mine_key].decode()
    refused = cli("get", other_key.decode())
    assert refused.returncode == 2, refused
    assert f"partition {partition_for_key(other_key, PARTITIONS)} of topic {topic!r} is not assigned" in refused.stderr
    with MaterializedView.open(data_dir, topic) as view:
        with pytest.raises(PartitionNotAssignedError):
            view.get(other_key)
        assert view.get(mine_key) == produced[mine_key] and view.count() == len(lines)


def test_cli_refuses_commit_group_equal_to_group_id(kafka_broker, tmp_path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "materializer", "run", "--bootstrap-servers", kafka_broker.bootstrap_servers,
         "--topic", "any", "--data-dir", str(tmp_path / "data"), "--until-caught-up", "--group-id", "g",
         "--commit-group", "g"],
        capture_output=True, text=True, timeout=60)
    assert result.returncode != 0
    assert "commit_group and group_id are both 'g'" in result.stderr
    assert not (tmp_path / "data").exists()


def test_a_member_keeps_the_folders_of_partitions_assigned_elsewhere(
        kafka_broker, kafka_admin, kafka_materializer_topic_factory, tmp_path) -> None:
    """A data dir holding every partition (a run without a group) joins a group where another member
    holds half: the other folders are kept closed (not taken for a re-created topic's), nothing is
    fetched again, and the clean close writes the clean-shutdown marker."""
    bootstrap = kafka_broker.bootstrap_servers
    topic = kafka_materializer_topic_factory(partitions=PARTITIONS)
    produced = _produce(bootstrap, topic, range(KEYS), "first")
    options = MaterializerOptions(progress=False, cleaner_threads=0)
    with Materializer(bootstrap, topic, tmp_path, options=options) as whole:
        whole.run(until_caught_up=True)
        ends = {p: log.log_end_offset for p, log in whole.logs.items()}
    group = _group(kafka_admin)
    with GroupMembership(bootstrap, group, [topic]) as other:
        other.wait_until(lambda held: len(held) == PARTITIONS, SETTLE_S)
        with Materializer(bootstrap, topic, tmp_path, options=options, group_id=group) as member:
            member.run(until_caught_up=True)
            mine = set(member.logs)
            assert 0 < len(mine) < PARTITIONS, mine
            assert member.stats.topic_recreations == 0 and member.stats.records_fetched == 0
            assert {p: member.logs[p].log_end_offset for p in mine} == {p: ends[p] for p in mine}
            assert member.view().count() == sum(1 for k in produced if partition_for_key(k, PARTITIONS) in mine)
            assert member.store is not None and set(member.store.offsets()) == set(range(PARTITIONS))  # kept
    assert all((tmp_path / f"{topic}-{p}").is_dir() for p in range(PARTITIONS))
    assert (tmp_path / CLEAN_SHUTDOWN_FILE).exists()


def test_kept_partitions_expire_and_only_the_assigned_ones_stay(
        kafka_broker, kafka_admin, kafka_materializer_topic_factory, tmp_path) -> None:
    """``revoked_retention_ms=0``: a data dir holding every partition joins a group where another
    member holds half; the run drops the other half's folders, checkpoint entries and store entries
    (store first, folder last), keeps its own untouched (nothing fetched), and serves them."""
    bootstrap = kafka_broker.bootstrap_servers
    topic = kafka_materializer_topic_factory(partitions=PARTITIONS)
    produced = _produce(bootstrap, topic, range(KEYS), "first")
    options = MaterializerOptions(progress=False, cleaner_threads=0)
    with Materializer(bootstrap, topic, tmp_path, options=options) as whole:
        whole.run(until_caught_up=True)
    group = _group(kafka_admin)
    with GroupMembership(bootstrap, group, [topic]) as other:
        other.wait_until(lambda held: len(held) == PARTITIONS, SETTLE_S)
        dropping = dataclasses.replace(options, revoked_retention_ms=0)
        with Materializer(bootstrap, topic, tmp_path, options=dropping, group_id=group) as member:
            member.run(until_caught_up=True)
            mine = set(member.logs)
            assert 0 < len(mine) < PARTITIONS, mine
            assert member.stats.records_fetched == 0
            assert member.stats.group_kept_partitions_dropped == PARTITIONS - len(mine)
            assert member.store is not None and set(member.store.offsets()) == mine
            assert member.store.count() == sum(1 for k in produced if partition_for_key(k, PARTITIONS) in mine)
    assert {p for p in range(PARTITIONS) if (tmp_path / f"{topic}-{p}").is_dir()} == mine
    assert not list(tmp_path.glob("*-delete"))
    assert {p for t, p in read_offset_checkpoint(tmp_path / RECOVERY_POINT_CHECKPOINT) if t == topic} == mine
    assert (tmp_path / CLEAN_SHUTDOWN_FILE).exists()


@pytest.mark.parametrize("protocol", ["consumer", "classic"])
def test_a_static_member_restarting_gets_its_partitions_back_without_a_rebalance(
        kafka_broker, kafka_admin, kafka_materializer_topic_factory, tmp_path, protocol) -> None:
    """KIP-345 static membership (``group_instance_id``): a member that stops and starts again
    within the session timeout (30 s here) keeps its partitions: the other member is not
    rebalanced meanwhile, and the restarted one fetches only what its partitions got meanwhile."""
    bootstrap = kafka_broker.bootstrap_servers
    topic = kafka_materializer_topic_factory(partitions=PARTITIONS)
    _produce(bootstrap, topic, range(KEYS), "first")
    group = f"group-static-{uuid.uuid4().hex[:10]}"
    resource = ConfigResource(ResourceType.GROUP, group, incremental_configs=[
        ConfigEntry("consumer.session.timeout.ms", "30000", incremental_operation=AlterConfigOpType.SET),
        ConfigEntry("consumer.heartbeat.interval.ms", "1000", incremental_operation=AlterConfigOpType.SET)])
    kafka_admin.incremental_alter_configs([resource])[resource].result(timeout=30)

    def member(name: str) -> Materializer:
        options = MaterializerOptions(progress=False, poll_timeout_ms=200, cleaner_threads=0,
                                      group_protocol=protocol, group_session_timeout_ms=30_000,  # type: ignore[arg-type]
                                      fetch="replica" if protocol == "consumer" else "consumer",
                                      group_instance_id=f"instance-{name}")
        m = Materializer(bootstrap, topic, tmp_path / name, options=options, group_id=group)
        m.run_in_background()
        return m

    a, b = member("a"), member("b")
    try:
        _wait(lambda: _split([a, b], [6, 6]), _show([a, b]))
        held_by_a, b_rebalances = set(a.health.assigned_partitions), b.stats.group_rebalances
        a.close()
        sent = _produce(bootstrap, topic, range(KEYS, 2 * KEYS), "second", only=frozenset(held_by_a))
        time.sleep(3)  # well inside the 30 s session timeout
        assert set(b.health.assigned_partitions) == ALL - held_by_a and b.stats.group_rebalances == b_rebalances
        a = member("a")
        _wait(lambda: _split([a, b], [6, 6]), _show([a, b]))
        assert set(a.health.assigned_partitions) == held_by_a and b.stats.group_rebalances == b_rebalances
        assert a.stats.records_fetched == len(sent)  # the delta only
        truth = _read_committed(bootstrap, topic)
        assert _served(a) == {k: v for k, v in truth.items() if v[0] in held_by_a}
    finally:
        a.close()
        b.close()


@pytest.mark.parametrize("partitioner", ["auto", "consistent_random", "murmur2"])
def test_reads_route_keys_with_the_producers_partitioner_and_a_contradicted_one_fails_the_run(
        kafka_broker, kafka_admin, kafka_materializer_topic_factory, tmp_path, partitioner) -> None:
    """confluent-kafka's producers place keys with librdkafka's consistent_random (CRC32), not
    Java's murmur2: a member routing reads with murmur2 would look keys up in the wrong partition.
    Detected (the default) or configured as consistent_random, every key is read back; configured
    as murmur2, the run fails naming the partitioner that places the keys (issue 37: it was a
    warning, and reads answered absent)."""
    from materializer.group.partitioner import PartitionerMismatchError

    bootstrap = kafka_broker.bootstrap_servers
    topic = kafka_materializer_topic_factory(partitions=6)
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all"})  # librdkafka's default partitioner
    sent = {f"k{i}".encode(): f"v{i}".encode() for i in range(300)}
    for key, value in sent.items():
        producer.produce(topic, key=key, value=value)
    assert producer.flush(30) == 0
    options = MaterializerOptions(progress=False, poll_timeout_ms=200, cleaner_threads=0, group_protocol="consumer",
                                  partitioner=partitioner)
    with Materializer(bootstrap, topic, tmp_path / "m", options=options, group_id=_group(kafka_admin)) as m:
        if partitioner == "murmur2":
            with pytest.raises(PartitionerMismatchError, match="'murmur2' .* does not place key b'k.*consistent_random"):
                m.run(until_caught_up=True)
            return
        m.run_in_background()
        _wait(lambda: m.health.ready and m.served_partitions() == frozenset(range(6)), _show([m]))
        view = m.view()
        found = {key: view.get(key) for key in sent}
        with MaterializerMetrics(m, statistics_interval_ms=0) as metrics:
            exposed = metrics.render().decode()
        routing = m.key_routing()
    assert found == sent and not m.stats.group_misrouted_partitions
    assert f'materializer_group_partitioner_candidates{{topic="{topic}"}} 1.0' in exposed  # one family: CRC32
    assert routing.partitioner == "consistent_random"
    assert routing.source == ("detected" if partitioner == "auto" else "configured")


def test_reads_route_by_the_grown_partition_count_never_to_the_old_partition(
        kafka_broker, kafka_admin, kafka_materializer_topic_factory, tmp_path) -> None:
    """Found by an operator campaign: after a partition-count increase the members held the new
    partitions, but their markers kept the old count until the next metadata refresh (300 s), so
    readers routed a key re-produced to its new partition (murmur2 over 9) to its old one (over
    6) and served the old value with exit 0. Each rebalance now reads the count again: a read
    returns the new value or names the partition held elsewhere."""
    from confluent_kafka.admin import NewPartitions

    bootstrap = kafka_broker.bootstrap_servers
    topic = kafka_materializer_topic_factory(partitions=6)
    keys = [f"k{i}".encode() for i in range(300)]

    def produce(tag: str) -> dict[bytes, int]:
        """Produce ``<tag>-<key>`` for every key; returns key -> the partition the broker stored it in."""
        producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "partitioner": "murmur2_random"})
        placed: dict[bytes, int] = {}
        for key in keys:
            producer.produce(topic, key=key, value=tag.encode() + b"-" + key,
                             on_delivery=lambda err, msg: err is None and placed.__setitem__(msg.key(), msg.partition()))
        assert producer.flush(30) == 0 and len(placed) == len(keys)
        return placed

    produce("old")
    group = _group(kafka_admin)
    options = MaterializerOptions(progress=False, poll_timeout_ms=200, cleaner_threads=0, group_protocol="consumer")
    assert options.metadata_refresh_interval_ms == 300_000  # the default: not what picks the count up here
    members = [Materializer(bootstrap, topic, tmp_path / name, options=options, group_id=group) for name in "ab"]
    try:
        for m in members:
            m.run_in_background()

        def split(count: int) -> bool:
            held = [m.served_partitions() for m in members]
            return (set().union(*held) == set(range(count)) and all(held)
                    and all(m.health.ready and _open(m) == set(m.health.assigned_partitions) for m in members))

        _wait(lambda: split(6), _show(members))
        kafka_admin.create_partitions([NewPartitions(topic, 9)])[topic].result(timeout=30)
        _wait(lambda: split(9), _show(members))
        placed = produce("new")  # a producer started now places keys over 9 partitions
        assert placed == {key: partition_for_key(key, 9) for key in keys}
        assert sum(placed[key] != partition_for_key(key, 6) for key in keys) > 100  # moved: their old value stays
        truth = {key: (placed[key], b"new-" + key) for key in keys}

        def applied() -> bool:  # every key's new value in its owner's store (read by partition, not routed)
            owners = {p: m for m in members for p in m.served_partitions()}
            return all(p in owners and (owners[p].view().get(key, partition=p) or b"").startswith(b"new-")
                       for key, (p, _) in truth.items())

        _wait(applied, _show(members))

        # A moved key is live in two partitions now (its old value stays in its old one): a member
        # answers it only when it serves every partition the key may be in, with the latest value;
        # else it refuses, naming a partition it does not serve. Never the old value, never absent.
        served: dict[bytes, list[bytes]] = {key: [] for key in keys}
        refusals = 0
        for m in members:
            with MaterializedView.open(m.data_dir, topic) as beside:  # what `get` reads
                for key in keys:
                    try:
                        served[key].append(beside.get(key))
                    except PartitionNotAssignedError as refused:
                        refusals += 1
                        assert refused.partition not in m.served_partitions(), refused
        stale = {key: values for key, values in served.items() if any(v is None or not v.startswith(b"new-")
                                                                      for v in values)}
        assert not stale, f"{len(stale)} keys served with an old value or as absent, e.g. {next(iter(stale.items()))}"
        assert refusals + sum(map(len, served.values())) == 2 * len(keys)
    finally:
        for m in members:
            m.close()
