"""Group members started without ``--partitioner`` find the producers' partitioner from the data,
and every reader routes by it (issue 37, items 1 and 7).

Before: ``run --group-id G`` routed keys with murmur2 unless told otherwise, so on a topic written
by confluent-kafka (librdkafka's default partitioner ``consistent_random``, CRC32) ``get`` on a
member's data dir answered exit 1 "not found" for most keys the topic holds; an explicit wrong
``--partitioner`` was a warning; a refused read said "no member ... holds it now" while one did.

Each test runs real members (``python -m materializer run --group-id``, two per group, in a
KIP-848 group with a 6 s session timeout) against the session's broker. The partition each key
is in is what the broker's delivery reports say (never what the code under test computes); a
never-written key's partition is :func:`partition_for_key`'s, itself checked against librdkafka's
and Java's producers in test_routing.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from confluent_kafka import Producer

from materializer.adapters.errors import KeyPartitionUndecidedError, PartitionNotAssignedError
from materializer.adapters.group_members import GroupMembersClient
from materializer.cli import main as cli_main
from materializer.config import MaterializerOptions
from materializer.datadir.markers import topic_status
from materializer.materializer import Materializer
from materializer.group.routing import partition_for_key
from materializer.view import MaterializedView
from tests.integration.test_group_materializer import _group
from tests.integration.serving_members import stop_process

pytestmark = pytest.mark.broker

PARTITIONS = 6
SETTLE_S = 120.0  # generous bound on a loaded 2-core machine (never a timing assertion)


def _produce(bootstrap: str, topic: str, records: dict[bytes, bytes | None], **config: Any) -> dict[bytes, int]:
    """Produce ``records`` (None: a tombstone) in order; key -> the partition the broker stored it in
    (the delivery reports)."""
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True, **config})
    placed: dict[bytes, int] = {}
    errors: list[Any] = []

    def delivered(err: Any, msg: Any) -> None:
        if err is not None:
            errors.append(err)
        else:
            placed[msg.key()] = msg.partition()

    for key, value in records.items():
        producer.produce(topic, key=key, value=value, on_delivery=delivered)
    assert producer.flush(30) == 0 and not errors, errors
    return placed


class _Member:
    """A ``materializer run --group-id`` subprocess (no ``--partitioner``, as the README starts it)."""

    def __init__(self, root: Path, name: str, bootstrap: str, topic: str, group: str, *extra: str) -> None:
        self.data_dir, self.topic, self.log = root / name, topic, root / f"{name}.out"
        with open(self.log, "wb") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "materializer", "run", "--bootstrap-servers", bootstrap, "--topic", topic,
                 "--data-dir", str(self.data_dir), "--group-id", group, "--no-progress", *extra],
                stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})

    def served(self) -> frozenset[int]:
        """The partitions its marker serves now (empty until it wrote one)."""
        group = topic_status(self.data_dir, self.topic).facts.get("group")
        return frozenset(group.get("partitions", ())) if isinstance(group, dict) else frozenset()

    def stop(self) -> None:
        stop_process(self.process)


@pytest.fixture
def two_members(kafka_broker: Any, kafka_admin: Any, tmp_path: Path) -> Iterator[Any]:
    """``two_members(topic)``: members ``a`` and ``b`` of a fresh group, returned once their markers
    split the topic's partitions between them; stopped at teardown."""
    started: list[_Member] = []

    def start(topic: str) -> tuple[_Member, _Member, str]:
        group = _group(kafka_admin)
        a, b = (_Member(tmp_path, name, kafka_broker.bootstrap_servers, topic, group) for name in "ab")
        started.extend((a, b))
        deadline = time.monotonic() + SETTLE_S
        while not (a.served() and b.served() and not a.served() & b.served()
                   and a.served() | b.served() == frozenset(range(PARTITIONS))):
            for m in (a, b):
                assert m.process.poll() is None, m.log.read_text()
            if time.monotonic() > deadline:
                pytest.fail(f"the members did not split the partitions: a {sorted(a.served())}, b {sorted(b.served())}")
            time.sleep(0.2)
        return a, b, group

    yield start
    for member in started:
        member.stop()


def _get(member: _Member, key: bytes, *extra: str) -> Any:
    """``materializer get`` in this process (click's runner: the same exit statuses and lines)."""
    return CliRunner().invoke(cli_main, ["get", "--data-dir", str(member.data_dir), "--topic", member.topic,
                                         key.decode(), *extra])


@pytest.mark.parametrize("producer", [{}, {"partitioner": "murmur2_random"}],
                         ids=["confluent-kafka-default", "murmur2-like-java"])
def test_members_without_partitioner_answer_every_key_on_its_owner_and_refuse_it_elsewhere(
        kafka_broker, kafka_materializer_topic_factory, two_members, producer) -> None:
    bootstrap = kafka_broker.bootstrap_servers
    topic = kafka_materializer_topic_factory(partitions=PARTITIONS, config={"cleanup.policy": "compact"})
    values = {f"k{i}".encode(): f"v{i}".encode() for i in range(300)}
    placed = _produce(bootstrap, topic, values, **producer)
    deleted = [f"k{i}".encode() for i in range(0, 300, 15)]
    assert _produce(bootstrap, topic, dict.fromkeys(deleted), **producer) == {k: placed[k] for k in deleted}
    live = {k: v for k, v in values.items() if k not in deleted}
    if not producer:  # librdkafka's consistent_random: CRC32, checked here without the code under test
        assert all(placed[k] == zlib.crc32(k) % PARTITIONS for k in values)
    a, b, group = two_members(topic)

    def owner(partition: int) -> tuple[Any, Any]:
        return (a, b) if partition in a.served() else (b, a)

    # views (MaterializedView.open) on both data dirs: every key on its owner, refused on the other
    with MaterializedView.open(a.data_dir, topic) as view_a, MaterializedView.open(b.data_dir, topic) as view_b:
        views = {a: view_a, b: view_b}
        wrong: list[str] = []
        for key, partition in placed.items():
            mine, other = owner(partition)
            try:
                found = views[mine].get(key)
            except PartitionNotAssignedError as exc:
                found = exc
            if found != live.get(key):
                wrong.append(f"{key!r} of partition {partition}: {found!r} on its owner")
            try:
                answer = views[other].get(key)
            except PartitionNotAssignedError:
                continue
            wrong.append(f"{key!r} of partition {partition}: {answer!r} on the member without it")
        assert not wrong, f"{len(wrong)} of {len(placed)} keys: {wrong[:5]}"

    # `get`: exit 0 with the value on the owner, exit 1 for a deleted or never-written key there, exit 2
    # elsewhere (never 1)
    never = [f"never-{i}".encode() for i in range(4)]
    name = "consistent_random" if not producer else "murmur2"
    for key in [*list(live)[:40], *deleted[:5], *never]:
        partition = placed[key] if key in placed else partition_for_key(key, PARTITIONS, partitioner=name)
        mine, other = owner(partition)
        answered, refused = _get(mine, key), _get(other, key)
        if key in live:
            assert (answered.exit_code, answered.stdout) == (0, live[key].decode() + "\n"), (key, answered.output)
        elif key in deleted:  # its tombstone is still in the owner's local log: it says so
            assert answered.exit_code == 1 and "deleted at offset" in answered.stderr, (key, answered.output)
        else:
            assert answered.exit_code == 1 and "not found" in answered.stderr, (key, answered.output)
        assert refused.exit_code == 2 and refused.stderr.startswith("error: "), (key, refused.output)
        assert f"partition {partition} of topic {topic!r} is not assigned" in refused.stderr, refused.stderr

    # the real command line, and a refusal that asks the group which member holds the key
    key = next(iter(live))
    mine, other = owner(placed[key])
    command = [sys.executable, "-m", "materializer", "get", "--topic", topic, key.decode()]
    found = subprocess.run([*command, "--data-dir", str(mine.data_dir)], capture_output=True, text=True, timeout=120)
    assert (found.returncode, found.stdout) == (0, live[key].decode() + "\n"), found.stderr
    refused = subprocess.run([*command, "--data-dir", str(other.data_dir), "--bootstrap-servers", bootstrap],
                             capture_output=True, text=True, timeout=120)
    holder = GroupMembersClient(bootstrap).partition_owners(group, topic)[placed[key]]
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1, refused.stderr
    assert f"it is held by member {holder.member_id!r} of group {group!r}" in refused.stderr, refused.stderr


def test_an_explicit_partitioner_the_data_contradicts_fails_the_run(
        kafka_broker, kafka_admin, kafka_materializer_topic_factory, tmp_path) -> None:
    bootstrap = kafka_broker.bootstrap_servers
    topic = kafka_materializer_topic_factory(partitions=PARTITIONS)
    _produce(bootstrap, topic, {f"k{i}".encode(): b"v" for i in range(200)})  # confluent-kafka's default
    result = subprocess.run(
        [sys.executable, "-m", "materializer", "run", "--bootstrap-servers", bootstrap, "--topic", topic,
         "--data-dir", str(tmp_path / "m"), "--group-id", _group(kafka_admin), "--partitioner", "murmur2",
         "--until-caught-up", "--no-progress"], capture_output=True, text=True, timeout=180)
    assert result.returncode == 2, (result.stdout, result.stderr)
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, result.stderr
    assert "the partitioner 'murmur2'" in errors[0] and "key b'k" in errors[0], errors[0]
    assert "--partitioner consistent" in errors[0] and "consistent_random" in errors[0], errors[0]


def _key_where(condition: Any, prefix: str) -> Iterator[bytes]:
    return (key for key in (f"{prefix}-{i}".encode() for i in range(1_000_000)) if condition(key))


def test_a_tiny_topic_refuses_what_its_keys_cannot_tell_yet(kafka_broker, kafka_materializer_topic_factory,
                                                            two_members) -> None:
    """One key per partition, each placed alike by murmur2, CRC32 and FNV-1a, so no sample rules a
    family out; plus keys in partition 0 that CRC32 put there and murmur2 puts in partitions 1-5
    (a key of partition 0 rules nothing out: a topic may once have had one partition). A member
    that does not hold partition 0 must refuse those keys, not answer "not found" from their
    murmur2 partition."""
    bootstrap = kafka_broker.bootstrap_servers
    topic = kafka_materializer_topic_factory(partitions=PARTITIONS)
    names = ("murmur2", "consistent", "fnv1a")
    alike = {p: next(_key_where(lambda k, p=p: all(partition_for_key(k, PARTITIONS, partitioner=n) == p
                                                      for n in names), f"alike{p}")) for p in range(1, PARTITIONS)}
    split = {q: next(_key_where(lambda k, q=q: zlib.crc32(k) % PARTITIONS == 0 and partition_for_key(k, PARTITIONS) == q,
                                f"split{q}")) for q in range(1, PARTITIONS)}
    values = {k: b"value-" + k for k in [*alike.values(), *split.values()]}
    placed = _produce(bootstrap, topic, values)  # confluent-kafka's default: consistent_random
    assert all(placed[k] == 0 for k in split.values()) and all(placed[k] == p for p, k in alike.items())
    a, b, _ = two_members(topic)
    holder_of_0, other = (a, b) if 0 in a.served() else (b, a)

    for key, partition in placed.items():
        mine, elsewhere = (a, b) if partition in a.served() else (b, a)
        answered, refused = _get(mine, key), _get(elsewhere, key)
        assert (answered.exit_code, answered.stdout) == (0, values[key].decode() + "\n"), (key, answered.output)
        assert refused.exit_code == 2 and refused.stderr.startswith("error: "), (key, refused.output)
    for key in split.values():  # live keys whose partition the data cannot tell the member without partition 0
        refused = _get(other, key)
        assert "may be in partitions 0, " in refused.stderr and "--partitioner" in refused.stderr, refused.stderr
        with MaterializedView.open(other.data_dir, topic) as view, pytest.raises(KeyPartitionUndecidedError):
            view.get(key)
        with MaterializedView.open(holder_of_0.data_dir, topic) as view:
            assert view.get(key) == values[key]
    # a never-written key is "not found" only on a member that holds every partition it may be in
    for key in (f"absent-{i}".encode() for i in range(20)):
        may_be_in = {partition_for_key(key, PARTITIONS, partitioner=n) for n in names}
        for member in (a, b):
            expected = 1 if may_be_in <= member.served() else 2
            assert _get(member, key).exit_code == expected, (key, may_be_in, sorted(member.served()))


def test_an_in_process_members_refusal_names_the_member_that_holds_the_key(
        kafka_broker, kafka_admin, kafka_materializer_topic_factory, tmp_path) -> None:
    bootstrap = kafka_broker.bootstrap_servers
    topic = kafka_materializer_topic_factory(partitions=PARTITIONS)
    placed = _produce(bootstrap, topic, {f"k{i}".encode(): b"v" for i in range(200)})
    group = _group(kafka_admin)
    options = MaterializerOptions(progress=False, poll_timeout_ms=200, cleaner_threads=0, group_protocol="consumer")
    members = [Materializer(bootstrap, topic, tmp_path / name, options=options, group_id=group) for name in "ab"]
    try:
        for m in members:
            m.run_in_background()
        deadline = time.monotonic() + SETTLE_S
        while not (all(m.health.ready and m.served_partitions() for m in members)
                   and members[0].served_partitions() | members[1].served_partitions() == set(range(PARTITIONS))):
            assert time.monotonic() < deadline, [m.health for m in members]
            time.sleep(0.1)
        a, b = members
        key = next(k for k, p in placed.items() if p in b.served_partitions())
        with pytest.raises(PartitionNotAssignedError) as refused:
            a.view().get(key)
        assert refused.value.owner is not None and refused.value.owner.member_id == b.health.member_id, refused.value
        assert a.view().get(next(k for k, p in placed.items() if p in a.served_partitions())) == b"v"
        assert a.key_routing().partitioner == "consistent_random" == b.key_routing().partitioner
    finally:
        for m in members:
            m.close()


def test_after_the_partition_count_grew_no_member_answers_absent_or_an_older_value(
        kafka_broker, kafka_admin, kafka_materializer_topic_factory, tmp_path) -> None:
    """Keys produced over 4 partitions, the topic grown to 6 (CreatePartitions), some keys produced
    again (the producer routes them over 6: many now live in two partitions). Each member must
    answer a key with its latest value (the latest record of it in any partition) or refuse it
    (exit 2); never "not found" for a key the topic holds, never an older value. Before growth was
    taken into account, the member holding a key's partition under 6 answered exit 1 for keys
    written under 4, and the member holding the old partition served the older value."""
    from confluent_kafka.admin import NewPartitions

    bootstrap = kafka_broker.bootstrap_servers
    topic = kafka_materializer_topic_factory(partitions=4, config={"cleanup.policy": "compact"})
    murmur2 = {"partitioner": "murmur2_random"}
    latest = {f"k{i}".encode(): f"before-{i}".encode() for i in range(200)}
    before = _produce(bootstrap, topic, latest, **murmur2)
    group = _group(kafka_admin)
    a, b = (_Member(tmp_path, name, bootstrap, topic, group) for name in "ab")
    try:
        kafka_admin.create_partitions([NewPartitions(topic, 6)])[topic].result(30)
        deadline = time.monotonic() + SETTLE_S
        metadata = GroupMembersClient(bootstrap)
        while metadata.partition_count(topic) != 6:  # the producer below must see 6 partitions
            assert time.monotonic() < deadline
            time.sleep(0.2)
        again = {k: b"after-" + k for k in list(latest)[::2]}
        after = _produce(bootstrap, topic, again, **murmur2)
        latest.update(again)
        moved = [k for k in again if after[k] != before[k]]
        assert moved, "no key moved to another partition with the count"
        # both members hold all 6 partitions between them, with every record applied
        ends: dict[int, int] = {}
        for partition in [*before.values(), *after.values()]:
            ends[partition] = ends.get(partition, 0) + 1  # one record per produce: offsets 0..n-1
        while True:
            served = [m.served() for m in (a, b)]
            if (served[0] | served[1] == frozenset(range(6)) and not served[0] & served[1]
                    and all(_applied(m, topic, ends) for m in (a, b))):
                break
            for m in (a, b):
                assert m.process.poll() is None, m.log.read_text()
            assert time.monotonic() < deadline, f"members did not settle over 6 partitions: {served}"
            time.sleep(0.3)
        answered = wrong = 0
        for key, value in latest.items():
            for member in (a, b):
                result = _get(member, key)
                if result.exit_code == 0:
                    answered += 1
                    if result.stdout != value.decode() + "\n":
                        wrong += 1
                        print(f"{key!r}: {result.stdout.strip()!r} on {member.data_dir.name}, latest {value!r}")
                elif result.exit_code != 2:
                    wrong += 1
                    print(f"{key!r}: exit {result.exit_code} {result.stderr.strip()} on {member.data_dir.name}")
        print(f"{answered} of {2 * len(latest)} reads answered, the others refused")
        assert wrong == 0, f"{wrong} wrong answers ({answered} answered) of {2 * len(latest)} reads"
        refusal = next(r for r in (_get(m, k) for k in moved for m in (a, b)) if r.exit_code == 2)
        assert "count grew" in refusal.stderr, refusal.stderr
    finally:
        for m in (a, b):
            m.stop()


def _applied(member: _Member, topic: str, ends: dict[int, int]) -> bool:
    """The member's store holds every record of the partitions its marker serves (next offsets at
    the ends the delivery reports gave)."""
    served = member.served()
    if not served:
        return False
    try:
        with MaterializedView.open(member.data_dir, topic) as view:
            offsets = view.offsets()
    except Exception:  # noqa: BLE001 - not complete yet: asked again
        return False
    return all(offsets.get(p, 0) >= ends.get(p, 0) for p in served)
