"""GroupMembership against the session's real broker, with both group protocols.

The session's broker is Kafka 4.x: ``consumer`` is KIP-848's protocol (the broker's group
coordinator assigns with its ``uniform`` assignor), ``classic`` is forced by the option (JoinGroup /
SyncGroup with the cooperative-sticky assignor, KIP-429). KIP-848 groups get
``consumer.session.timeout.ms`` = 6 s and ``consumer.heartbeat.interval.ms`` = 1 s as group
configs (IncrementalAlterConfigs on the GROUP resource; the test broker lowers the minimums
these may take, ``TEST_BROKER_CONFIG``); classic members set ``session.timeout.ms`` = 6 s.

Checked: one member holds all 12 partitions and never fetches (no Fetch request in the client's
statistics, no record returned by poll, no position); three members split 12 into disjoint
fours; a member that closes hands its partitions to the others, who keep theirs; a member in a
subprocess killed with SIGKILL loses its partitions after the session timeout (printed); a member
that joins later takes partitions from the others without them revoking the rest; unknown topics
and a group whose members use another assignor are typed errors naming the group.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType

from materializer.adapters.errors import GroupMembershipError
from materializer.adapters.group_membership import GroupMembership, Partitions

pytestmark = pytest.mark.broker

PARTITIONS = 12
SESSION_TIMEOUT_MS = 6_000
KIP848_HEARTBEAT_MS = 1_000
SETTLE_S = 90.0  # generous bound for rebalances on a loaded 2-core machine (never a timing assertion)


class Events:
    """The callbacks of one member, in order: ``(kind, partitions)``."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.items: list[tuple[str, Partitions]] = []

    def callbacks(self) -> dict[str, Callable[[Partitions], None]]:
        return {f"on_{kind}": (lambda parts, kind=kind: self._add(kind, parts)) for kind in ("assign", "revoke", "lost")}

    def _add(self, kind: str, parts: Partitions) -> None:
        with self.lock:
            self.items.append((kind, parts))

    def union(self, kind: str, since: int = 0) -> set[tuple[str, int]]:
        with self.lock:
            return set().union(*[parts for k, parts in self.items[since:] if k == kind])

    def held(self) -> frozenset[tuple[str, int]]:
        """What the callbacks say the member holds: assigned and not revoked or lost since."""
        held: set[tuple[str, int]] = set()
        with self.lock:
            for kind, parts in self.items:
                held = held | parts if kind == "assign" else held - parts
        return frozenset(held)

    def mark(self) -> int:
        with self.lock:
            return len(self.items)


def _group_for(admin: Any, protocol: str, session_timeout_ms: int = SESSION_TIMEOUT_MS) -> tuple[str, int]:
    """A fresh group id and the session timeout its members get, ms. KIP-848 groups get theirs as
    group configs (when the broker refuses, its own group.consumer.session.timeout.ms applies)."""
    group = f"group-{protocol}-{uuid.uuid4().hex[:10]}"
    if protocol != "consumer":
        return group, SESSION_TIMEOUT_MS
    resource = ConfigResource(ResourceType.GROUP, group, incremental_configs=[
        ConfigEntry("consumer.session.timeout.ms", str(session_timeout_ms),
                    incremental_operation=AlterConfigOpType.SET),
        ConfigEntry("consumer.heartbeat.interval.ms", str(KIP848_HEARTBEAT_MS),
                    incremental_operation=AlterConfigOpType.SET)])
    try:
        admin.incremental_alter_configs([resource])[resource].result(timeout=30)
    except Exception as exc:  # noqa: BLE001 - an external broker with the default minimums
        print(f"group configs refused ({exc}); the broker's session timeout applies")
        return group, 45_000
    return group, session_timeout_ms


@pytest.fixture(params=["consumer", "classic"])
def protocol(request: pytest.FixtureRequest, kafka_broker: Any) -> str:
    if request.param == "consumer" and int(kafka_broker.version.split(".")[0]) < 4:
        pytest.fail(f"the session's broker is Kafka {kafka_broker.version}: KIP-848 needs 4.0+")
    return request.param


@pytest.fixture
def topic(kafka_materializer_topic_factory: Callable[..., str]) -> str:
    return kafka_materializer_topic_factory(partitions=PARTITIONS)


@pytest.fixture
def members(kafka_broker: Any) -> Iterator[Callable[..., GroupMembership]]:
    """Factory ``members(group, topic, protocol, events=None, **kwargs)``; every member is closed at teardown."""
    made: list[GroupMembership] = []

    def make(group: str, topic: str, protocol: str, events: Events | None = None, **kwargs: Any) -> GroupMembership:
        member = GroupMembership(kafka_broker.bootstrap_servers, group, [topic], protocol=protocol,  # type: ignore[arg-type]
                                 session_timeout_ms=SESSION_TIMEOUT_MS, **(events.callbacks() if events else {}),
                                 **kwargs)
        made.append(member)
        return member

    yield make
    for member in made:
        member.close()


def _all(topic: str) -> frozenset[tuple[str, int]]:
    return frozenset((topic, p) for p in range(PARTITIONS))


def _wait(condition: Callable[[], bool], timeout_s: float, what: Callable[[], str]) -> float:
    """Wait until ``condition()``; return the seconds it took. Fails with ``what()`` on timeout."""
    started = time.monotonic()
    while not condition():
        if time.monotonic() - started > timeout_s:
            pytest.fail(f"not within {timeout_s:g} s: {what()}")
        time.sleep(0.05)
    return time.monotonic() - started


def _split(topic: str, held: list[Partitions], sizes: list[int] | None = None) -> bool:
    """True when ``held`` are disjoint and cover every partition (with exactly ``sizes`` when given)."""
    union = frozenset().union(*held)
    return (union == _all(topic) and sum(map(len, held)) == PARTITIONS
            and (sizes is None or sorted(map(len, held)) == sorted(sizes)))


def _agreed(ms: list[GroupMembership], events: list[Events]) -> bool:
    """True when each member's callbacks have caught up with its assignment(), which changes before
    ``on_assign`` runs (as ``KafkaConsumer.assignment()`` does inside ``onPartitionsAssigned``)."""
    return all(e.held() == m.assignment() for m, e in zip(ms, events))


def _show(ms: list[GroupMembership]) -> Callable[[], str]:
    return lambda: "; ".join(f"{m.member_id}: {sorted(p for _, p in m.assignment())} ({m.error})" for m in ms)


def _produce(producer: Producer, topic: str, per_partition: int) -> None:
    for partition in range(PARTITIONS):
        for i in range(per_partition):
            producer.produce(topic, key=f"k{i}".encode(), value=b"v", partition=partition)
    assert producer.flush(30) == 0


def test_one_member_holds_every_partition_and_fetches_nothing(kafka_materializer_producer, kafka_admin, topic,
                                                             protocol, members) -> None:
    _produce(kafka_materializer_producer, topic, 5)  # records before joining ...
    group, _ = _group_for(kafka_admin, protocol)
    events = Events()
    member = members(group, topic, protocol, events, statistics_interval_ms=200)
    assert member.protocol == protocol
    assert member.wait_until(lambda held: held == _all(topic), SETTLE_S) == _all(topic)
    _produce(kafka_materializer_producer, topic, 5)  # ... and while it holds every partition
    # A fetch would go out within milliseconds of the assignment; wait for statistics taken well after it.
    _wait(lambda: member.fetch_requests is not None, 30, lambda: "no client statistics")
    time.sleep(2.0)
    assert member.records_received == 0
    assert member.fetch_requests == 0, f"the member sent {member.fetch_requests} Fetch requests"
    assert member.fetched_messages == 0
    assert events.union("assign") == set(_all(topic)) and not events.union("revoke")
    assert member.member_id and member.generation is not None and member.generation >= 1
    assert member.error is None and member.running
    member.close()
    assert member.assignment() == frozenset() and not member.running
    assert events.union("revoke") == set(_all(topic))  # closing revokes what it held
    member.close()  # idempotent


def test_three_members_split_twelve_partitions(kafka_admin, topic, protocol, members) -> None:
    group, _ = _group_for(kafka_admin, protocol)
    ms = [members(group, topic, protocol) for _ in range(3)]
    took = _wait(lambda: _split(topic, [m.assignment() for m in ms], [4, 4, 4]), SETTLE_S, _show(ms))
    print(f"{protocol}: three members balanced 4/4/4 after {took:.2f} s")
    assert len({m.member_id for m in ms}) == 3


def test_a_closed_member_hands_its_partitions_to_the_others(kafka_admin, topic, protocol, members) -> None:
    group, _ = _group_for(kafka_admin, protocol)
    events = [Events() for _ in range(3)]
    ms = [members(group, topic, protocol, e) for e in events]
    _wait(lambda: _split(topic, [m.assignment() for m in ms], [4, 4, 4]) and _agreed(ms, events), SETTLE_S, _show(ms))
    before = [m.assignment() for m in ms]
    marks = [e.mark() for e in events]
    started = time.monotonic()
    ms[0].close()
    took = _wait(lambda: _split(topic, [m.assignment() for m in ms[1:]]) and _agreed(ms[1:], events[1:]), SETTLE_S,
                 _show(ms))
    print(f"{protocol}: a closed member's partitions moved after {time.monotonic() - started:.2f} s "
          f"({took:.2f} s after close returned)")
    assert events[0].union("revoke", marks[0]) == set(before[0])
    moved = events[1].union("assign", marks[1]) | events[2].union("assign", marks[2])
    assert moved == set(before[0])
    for i in (1, 2):  # cooperative: the survivors kept what they had
        assert not events[i].union("revoke", marks[i]) and not events[i].union("lost", marks[i])
        assert before[i] <= ms[i].assignment()


_KILLED_MEMBER = textwrap.dedent("""
    import sys, time
    from materializer.adapters.group_membership import GroupMembership
    bootstrap, group, topic, protocol, session_ms = sys.argv[1:6]
    member = GroupMembership(bootstrap, group, [topic], protocol=protocol, session_timeout_ms=int(session_ms))
    while True:
        print("held", len(member.assignment()), flush=True)
        time.sleep(0.2)
""")


def test_a_killed_member_loses_its_partitions_after_the_session_timeout(kafka_broker, kafka_admin, topic, protocol,
                                                                        members) -> None:
    group, session_ms = _group_for(kafka_admin, protocol)
    ms = [members(group, topic, protocol) for _ in range(2)]
    child = subprocess.Popen([sys.executable, "-c", _KILLED_MEMBER, kafka_broker.bootstrap_servers, group, topic,
                              protocol, str(session_ms)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                             text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        _wait(lambda: _split(topic, [m.assignment() for m in ms] + [_all(topic) - ms[0].assignment()
                                                                    - ms[1].assignment()], [4, 4, 4]),
              SETTLE_S, _show(ms))
        assert child.stdout is not None
        assert any(line.strip() == "held 4" for line in _lines(child.stdout, 10.0)), "the child holds no partition"
        held = ms[0].assignment() | ms[1].assignment()
        os.kill(child.pid, signal.SIGKILL)
        child.wait(10)
        took = _wait(lambda: _split(topic, [m.assignment() for m in ms]), session_ms / 1000 + SETTLE_S, _show(ms))
        print(f"{protocol}: a SIGKILLed member's partitions moved {took:.2f} s after the kill "
              f"(session timeout {session_ms / 1000:g} s, load {os.getloadavg()[0]:.2f})")
        assert held < ms[0].assignment() | ms[1].assignment()
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(10)


_KILLED_STATIC_MEMBER = _KILLED_MEMBER.replace("session_timeout_ms=int(session_ms))",
                                              "session_timeout_ms=int(session_ms), group_instance_id='static-1')")


def test_a_static_member_restarted_within_the_session_timeout_fails_instead_of_idling(
        kafka_broker, kafka_admin, topic, members, tmp_path) -> None:
    """Found by an operator campaign: a static member (KIP-345 instance id) SIGKILLed and started
    again before the session timeout expired its old instance is refused by a KIP-848 coordinator
    (UNRELEASED_INSTANCE_ID, fatal in librdkafka). The member kept polling the dead client, said
    running, and its run reported ready holding nothing, for good. The membership must end with
    the fatal error, at once."""
    from materializer.adapters.errors import GroupMembershipError

    # the killed instance holds its id for the session timeout: long enough for both joins below
    group, session_ms = _group_for(kafka_admin, "consumer", session_timeout_ms=60_000)
    child = subprocess.Popen([sys.executable, "-c", _KILLED_STATIC_MEMBER, kafka_broker.bootstrap_servers, group,
                              topic, "consumer", str(session_ms)], stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        assert child.stdout is not None
        assert any(line.strip() == f"held {PARTITIONS}" for line in _lines(child.stdout, SETTLE_S)), \
            "the child never held the topic"
        os.kill(child.pid, signal.SIGKILL)
        child.wait(10)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(10)
    again = members(group, topic, "consumer", group_instance_id="static-1")
    with pytest.raises(GroupMembershipError) as raised:
        again.wait_for_assignment(SETTLE_S)
    assert raised.value.fatal and not again.running, raised.value
    assert "group-instance-id" in str(raised.value) and "session timeout" in str(raised.value), raised.value

    # `run --group-instance-id static-1` fails its start at once (exit 2), not after its join timeout
    from materializer.config import MaterializerOptions
    from materializer.materializer import Materializer

    options = MaterializerOptions(progress=False, cleaner_threads=0, group_protocol="consumer",
                                  group_instance_id="static-1", group_join_timeout_ms=120_000)
    started = time.monotonic()
    with pytest.raises(GroupMembershipError, match="group-instance-id"):
        with Materializer(kafka_broker.bootstrap_servers, topic, tmp_path, options=options, group_id=group):
            pass
    assert time.monotonic() - started < 60, "the start waited for its join timeout"


def _lines(stream: Any, timeout_s: float) -> Iterator[str]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        line = stream.readline()
        if not line:
            return
        yield line


def test_a_late_member_takes_partitions_and_the_others_keep_the_rest(kafka_admin, topic, protocol,
                                                                      members) -> None:
    group, _ = _group_for(kafka_admin, protocol)
    events = [Events() for _ in range(3)]
    ms = [members(group, topic, protocol, e) for e in events[:2]]
    _wait(lambda: _split(topic, [m.assignment() for m in ms], [6, 6]) and _agreed(ms, events), SETTLE_S, _show(ms))
    before = [m.assignment() for m in ms]
    marks = [e.mark() for e in events[:2]]
    ms.append(members(group, topic, protocol, events[2]))
    took = _wait(lambda: _split(topic, [m.assignment() for m in ms], [4, 4, 4]) and _agreed(ms, events), SETTLE_S,
                 _show(ms))
    print(f"{protocol}: a third member balanced the group after {took:.2f} s")
    for i in (0, 1):
        revoked = events[i].union("revoke", marks[i])
        assert not events[i].union("assign", marks[i])  # an eager protocol would revoke all 6 and re-add 4
        assert len(revoked) == 2 and revoked <= before[i] and not revoked & ms[i].assignment()
        assert ms[i].assignment() == before[i] - revoked
    assert events[2].union("assign") == set(ms[2].assignment())
    assert set(ms[2].assignment()) == events[0].union("revoke", marks[0]) | events[1].union("revoke", marks[1])


def test_unknown_topic_is_a_typed_error(kafka_broker) -> None:
    with pytest.raises(GroupMembershipError, match="topic 'no-such-topic-.*' does not exist") as failure:
        GroupMembership(kafka_broker.bootstrap_servers, "g-unknown", [f"no-such-topic-{uuid.uuid4().hex[:8]}"])
    assert failure.value.group == "g-unknown" and failure.value.code == "UNKNOWN_TOPIC_OR_PART"


def test_a_group_with_another_assignor_is_a_typed_error(kafka_broker, topic) -> None:
    """A classic group whose member uses the eager range assignor: a cooperative-sticky member is refused
    (INCONSISTENT_GROUP_PROTOCOL), and the error names the group and the broker's reason."""
    group = f"group-range-{uuid.uuid4().hex[:8]}"
    other = Consumer({"bootstrap.servers": kafka_broker.bootstrap_servers, "group.id": group,
                      "group.protocol": "classic", "partition.assignment.strategy": "range"})
    other.subscribe([topic])
    try:
        deadline = time.monotonic() + SETTLE_S
        while not other.assignment() and time.monotonic() < deadline:
            other.poll(0.1)
        with GroupMembership(kafka_broker.bootstrap_servers, group, [topic], protocol="classic") as member:
            with pytest.raises(GroupMembershipError, match="INCONSISTENT_GROUP_PROTOCOL") as failure:
                member.wait_for_assignment(15)
            assert failure.value.group == group and failure.value.code == "INCONSISTENT_GROUP_PROTOCOL"
            assert repr(group) in str(failure.value)
    finally:
        other.close()


def test_owned_settings_are_refused(kafka_broker, topic) -> None:
    from materializer.adapters.kafka_source import KafkaSourceOptions

    with pytest.raises(GroupMembershipError, match="session.timeout.ms"):
        GroupMembership(kafka_broker.bootstrap_servers, "g", [topic],
                        options=KafkaSourceOptions(client_config={"session.timeout.ms": "6000"}))


def test_auto_chooses_the_consumer_protocol_on_kafka_4(kafka_broker, topic, members) -> None:
    if int(kafka_broker.version.split(".")[0]) < 4:
        pytest.fail(f"the session's broker is Kafka {kafka_broker.version}: KIP-848 needs 4.0+")
    member = members(f"group-auto-{uuid.uuid4().hex[:8]}", topic, "auto")
    assert member.protocol == "consumer"
    assert member.wait_until(lambda held: held == _all(topic), SETTLE_S) == _all(topic)


def test_auto_falls_back_to_classic_on_kafka_3(tmp_path) -> None:
    """Kafka 3.9 advertises only ConsumerGroupHeartbeat v0 (early access, off by default); librdkafka
    would retry it forever without a word, so ``auto`` must choose the classic protocol."""
    from confluent_kafka.admin import AdminClient, NewTopic

    from materializer.local.kafka_broker import TEST_BROKER_CONFIG, LocalKafkaBroker

    with LocalKafkaBroker(tmp_path / "kafka-3.9", version="3.9.1", extra_config=TEST_BROKER_CONFIG,
                          fast_start=True) as broker:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap_servers})
        admin.create_topics([NewTopic("t", 3, 1)])["t"].result(timeout=30)
        with GroupMembership(broker.bootstrap_servers, "g", ["t"], session_timeout_ms=SESSION_TIMEOUT_MS) as member:
            assert member.protocol == "classic"
            assert member.wait_until(lambda held: len(held) == 3, SETTLE_S) == {("t", 0), ("t", 1), ("t", 2)}
