"""Three ``materializer run --group-id`` processes over a 12-partition topic: SIGKILL one, the two
others take its partitions over, restart it, it fetches only the delta; readers never see a
stale value (issue 25, Deliver 5).

Each member is a subprocess (``python -m materializer run --group-id G --metrics-port P``) with its
own data dir, in a KIP-848 group whose ``consumer.session.timeout.ms`` is 6 s (a group config, as
in test_group_materializer.py). A producer thread rewrites the keys ``k0``..``k<KEYS-1>`` with
values ``k<i>:<seq>``, ``seq`` growing by one with every write of that key.

Readers: a thread of the test process routes each read as an interactive query does, with the
group coordinator's current assignment (DescribeConsumerGroups, :func:`materializer.group.routing.owner_of`'s
request) mapped to the member's data dir by the member id its ``/health/ready`` names, opens
``MaterializedView.open(that data dir)`` afresh each round (as ``materializer get`` does) and reads
a sample of the keys routed there. A read is **correct** when it raises
:class:`PartitionNotAssignedError` or ``IncompleteDataDirError`` (the typed refusals), or returns a
value that (a) the producer wrote for that key (a missing key is not: every key is written before
the members start) and (b) is not **stale**: its ``seq`` is not below the largest ``seq`` already
returned for that key by an earlier read, from any member. A dead member's data dir may still be
routed to until its session times out: it serves the values it had at the kill, which no reader
has seen superseded, so that is not stale by (b); a value older than one a reader was already given
is. The test counts the violations (0 expected) and the reads answered by each member (each must
have answered some, so the check cannot pass vacuously).

Delta: the member killed is first caught up (its per-partition next offsets, from ``/metrics``,
equal the broker's log end offsets), so on restart a partition it held at the kill needs exactly the
records produced to it since, and a partition it did not hold at most the whole partition;
``materializer_fetched_records_total`` of the restarted process must not exceed that sum.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections import Counter, defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from materializer.adapters.errors import PartitionNotAssignedError
from materializer.adapters.group_members import GroupMembersClient
from materializer.local.ports import free_port
from materializer.group.routing import partition_for_key
from materializer.storage.errors import IncompleteDataDirError
from materializer.view import MaterializedView
from tests.integration.test_group_materializer import _group, _read_committed

pytestmark = pytest.mark.broker

PARTITIONS = 12
ALL = frozenset(range(PARTITIONS))
KEYS = 2000
BATCH = 100  # keys rewritten per producer round
SETTLE_S = 90.0  # generous bound on a loaded 2-core machine (never a timing assertion)
SAMPLE = 40  # keys read per member and reader round


def _seq(value: bytes) -> int:
    return int(value.rsplit(b":", 1)[1])


class Writer:
    """The producer thread: rewrites BATCH keys per round (murmur2, as the view routes), recording
    every value before it is sent; :meth:`pause` waits for the round in progress to be flushed."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True,
                                  "partitioner": "murmur2_random", "linger.ms": 5})
        self.topic = topic
        self.seqs = [0] * KEYS
        self.produced: dict[bytes, set[bytes]] = defaultdict(set)
        self.per_partition: Counter[int] = Counter()  # records acknowledged, by partition
        self.error: BaseException | None = None
        self._running = threading.Event()
        self._stop = threading.Event()
        self._idle = threading.Event()
        self._idle.set()
        self._next = 0
        self._lock = threading.Lock()
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def write(self, indexes: range) -> None:
        for i in indexes:
            key = f"k{i}".encode()
            value = f"k{i}:{self.seqs[i]}".encode()
            self.seqs[i] += 1
            with self._lock:
                self.produced[key].add(value)
            self.producer.produce(self.topic, key=key, value=value)
            self.per_partition[partition_for_key(key, PARTITIONS)] += 1
        assert self.producer.flush(30) == 0

    def _loop(self) -> None:
        try:
            while not self._stop.is_set():
                if not self._running.wait(0.1):
                    continue
                self._idle.clear()
                try:
                    if self._running.is_set():
                        start = self._next
                        self.write(range(start, min(start + BATCH, KEYS)))
                        self._next = 0 if start + BATCH >= KEYS else start + BATCH
                finally:
                    self._idle.set()
                time.sleep(0.2)  # about 400 records/s: each takeover and catch-up has a delta to fetch
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.error = exc

    def was_produced(self, key: bytes, value: bytes) -> bool:
        with self._lock:
            return value in self.produced[key]

    def resume(self) -> None:
        if not self.thread.is_alive():
            self.thread.start()
        self._running.set()

    def pause(self) -> None:
        self._running.clear()
        assert self._idle.wait(60)
        assert self.error is None, self.error

    def stop(self) -> None:
        self._running.clear()
        self._stop.set()
        if self.thread.is_alive():
            self.thread.join(60)


class Member:
    """One ``materializer run --group-id`` subprocess with its data dir and metrics port."""

    def __init__(self, name: str, root: Path, bootstrap: str, topic: str, group: str) -> None:
        self.name, self.data_dir, self.topic = name, root / name, topic
        self.bootstrap, self.group = bootstrap, group
        self.log = root / f"{name}.out"
        self.process: subprocess.Popen[bytes] | None = None
        self.port = 0
        self.member_id: str | None = None

    def start(self) -> None:
        self.port = free_port()
        with open(self.log, "ab") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "materializer", "run", "--bootstrap-servers", self.bootstrap,
                 "--topic", self.topic, "--data-dir", str(self.data_dir), "--group-id", self.group,
                 "--metrics-port", str(self.port), "--no-progress"],
                stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def _get(self, path: str) -> bytes | None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=5) as answer:
                return bytes(answer.read())
        except urllib.error.HTTPError as refused:  # 503: not ready, with the same JSON
            return bytes(refused.read())
        except OSError:
            return None

    def ready(self) -> dict[str, Any] | None:
        """The ``/health/ready`` JSON (None while the endpoint does not answer)."""
        body = self._get("/health/ready")
        if body is None:
            return None
        answer: dict[str, Any] = json.loads(body)
        group = answer.get("detail", answer).get("group") or {}
        if group.get("member_id"):
            self.member_id = group["member_id"]
        return answer

    def metrics(self) -> dict[str, float]:
        """``/metrics`` samples: ``name`` or ``name{partition}`` -> value."""
        body = self._get("/metrics")
        assert body is not None, f"{self.name}: /metrics does not answer"
        samples: dict[str, float] = {}
        for line in body.decode().splitlines():
            if line.startswith("#") or not line.strip():
                continue
            name_labels, value = line.rsplit(" ", 1)
            name = name_labels.split("{", 1)[0]
            if 'partition="' in name_labels:
                name += "{" + name_labels.split('partition="', 1)[1].split('"', 1)[0] + "}"
            samples[name] = float(value)
        return samples

    def kill(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(30)

    def stop(self) -> None:
        if self.alive():
            assert self.process is not None
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(30)

    def output(self) -> str:
        return self.log.read_text(errors="replace")[-3000:]


def _detail(answer: dict[str, Any] | None) -> dict[str, Any]:
    return {} if answer is None else answer.get("detail", answer)


def _held(member: Member) -> tuple[bool, frozenset[int]] | None:
    """(ready, assigned partitions) from ``/health/ready``; None when it does not answer."""
    answer = member.ready()
    if answer is None:
        return None
    group = _detail(answer).get("group") or {}
    return bool(answer.get("ok")), frozenset(group.get("assigned_partitions", ()))


def _wait(condition: Callable[[], bool], what: Callable[[], str], timeout_s: float = SETTLE_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"not within {timeout_s:g} s: {what()}")
        time.sleep(0.2)


def _split(members: list[Member]) -> bool:
    """Every member ready and the assignments partition the 12 partitions."""
    states = [_held(m) for m in members]
    if any(s is None or not s[0] for s in states):
        return False
    held = [s[1] for s in states if s is not None]
    return sum(map(len, held)) == PARTITIONS and frozenset().union(*held) == ALL


def _show(members: list[Member]) -> Callable[[], str]:
    def show() -> str:
        parts = []
        for m in members:
            answer = m.ready()
            parts.append(f"{m.name} (alive={m.alive()}): {answer and (answer.get('ok'), answer.get('reasons'), _detail(answer).get('group'))}"
                         f"\n{m.output() if not m.alive() else ''}")
        return "; ".join(parts)
    return show


def _log_ends(bootstrap: str, topic: str) -> dict[int, int]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "unused-ends"})
    try:
        return {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in range(PARTITIONS)}
    finally:
        consumer.close()


def _caught_up(members: list[Member], ends: dict[int, int]) -> bool:
    """Each member's assigned partitions fetched to the broker's log end offsets, and ready."""
    for m in members:
        state = _held(m)
        if state is None or not state[0]:
            return False
        samples = m.metrics()
        if any(samples.get(f"materializer_partition_next_offset{{{p}}}") != ends[p] for p in state[1]):
            return False
    return True


def _owned_keys_equal_truth(members: list[Member], truth: dict[bytes, tuple[int, bytes]]) -> None:
    """Every key, read from the member that holds its partition, equals the read_committed value."""
    served: dict[bytes, bytes] = {}
    for m in members:
        state = _held(m)
        assert state is not None
        with MaterializedView.open(m.data_dir, m.topic) as view:
            for key, (partition, _) in truth.items():
                if partition in state[1]:
                    served[key] = view.get(key)
    assert served == {k: v for k, (_, v) in truth.items()}


class Reader:
    """The reader thread (module docstring): routed reads, stale/wrong values counted."""

    def __init__(self, bootstrap: str, topic: str, group: str, members: list[Member], writer: Writer) -> None:
        self.topic, self.group, self.members, self.writer = topic, group, members, writer
        self.client = GroupMembersClient(bootstrap, timeout_s=10)
        self.keys_of: dict[int, list[bytes]] = defaultdict(list)
        for i in range(KEYS):
            key = f"k{i}".encode()
            self.keys_of[partition_for_key(key, PARTITIONS)].append(key)
        self.newest: dict[bytes, int] = {}
        self.reads: Counter[str] = Counter()
        self.refusals: Counter[str] = Counter()
        self.violations: list[str] = []
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        random.seed(25)
        try:
            while not self._stop.is_set():
                self._round()
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.error = exc

    def _round(self) -> None:
        owners = self.client.partition_owners(self.group, self.topic)
        by_member = {m.member_id: m for m in self.members if m.member_id}
        routed: dict[str, list[int]] = defaultdict(list)
        for partition, owner in owners.items():
            if owner.member_id in by_member:
                routed[owner.member_id].append(partition)
        if not routed:
            time.sleep(0.1)
        for member_id, partitions in routed.items():
            member = by_member[member_id]
            keys = random.sample([k for p in partitions for k in self.keys_of[p]], SAMPLE)
            try:
                view = MaterializedView.open(member.data_dir, self.topic)
            except IncompleteDataDirError:
                self.refusals[f"{member.name}: incomplete"] += 1
                continue
            with view:
                for key in keys:
                    self._read(member, view, key)

    def _read(self, member: Member, view: MaterializedView, key: bytes) -> None:
        try:
            value = view.get(key)
        except PartitionNotAssignedError:
            self.refusals[f"{member.name}: not assigned"] += 1
            return
        self.reads[member.name] += 1
        if value is None or not self.writer.was_produced(key, value):
            self.violations.append(f"{member.name} (pid {member.process and member.process.pid}) "
                                   f"gave {key!r} -> {value!r}: never produced")
            return
        seq, newest = _seq(value), self.newest.get(key, -1)
        if seq < newest:
            self.violations.append(f"{member.name} (pid {member.process and member.process.pid}) gave {key!r} "
                                   f"-> {value!r}, stale: seq {newest} was returned before")
        else:
            self.newest[key] = seq

    def stop(self) -> None:
        self._stop.set()
        self.thread.join(60)
        assert not self.thread.is_alive()
        if self.error is not None:
            raise self.error


def test_three_members_survive_a_sigkill_and_the_restarted_one_fetches_only_the_delta(
        kafka_broker, kafka_admin, kafka_materializer_topic_factory, tmp_path) -> None:
    started = time.monotonic()
    bootstrap = kafka_broker.bootstrap_servers
    topic = kafka_materializer_topic_factory(partitions=PARTITIONS)
    group = _group(kafka_admin)
    writer = Writer(bootstrap, topic)
    writer.write(range(KEYS))  # every key exists before the members start
    members = [Member(name, tmp_path, bootstrap, topic, group) for name in ("a", "b", "c")]
    reader: Reader | None = None
    try:
        for m in members:
            m.start()
        _wait(lambda: _split(members), _show(members))
        held = {m.name: (_held(m) or (False, frozenset()))[1] for m in members}
        assert all(3 <= len(h) <= 5 for h in held.values()), held  # about four each
        _owned_keys_equal_truth(members, _read_committed(bootstrap, topic))
        reader = Reader(bootstrap, topic, group, members, writer)
        writer.resume()
        time.sleep(2)

        # The victim is caught up, then SIGKILLed; the producer goes on.
        a, b, c = members
        writer.pause()
        ends = _log_ends(bootstrap, topic)
        _wait(lambda: _caught_up(members, ends), _show(members))
        held_at_kill = (_held(c) or (False, frozenset()))[1]
        assert held_at_kill == held["c"]
        c.kill()
        produced_before_kill = Counter(writer.per_partition)
        writer.resume()
        _wait(lambda: _split([a, b]), _show([a, b]))
        time.sleep(2)
        writer.pause()
        ends = _log_ends(bootstrap, topic)
        _wait(lambda: _caught_up([a, b], ends), _show([a, b]))
        _owned_keys_equal_truth([a, b], _read_committed(bootstrap, topic))

        # c restarts in its data dir while the producer goes on; partitions come back to it.
        kept = {int(d.name.rsplit("-", 1)[1]) for d in c.data_dir.iterdir() if d.name.startswith(f"{topic}-")}
        writer.resume()
        c.start()
        _wait(lambda: _split(members), _show(members))
        time.sleep(2)
        writer.pause()
        ends = _log_ends(bootstrap, topic)
        _wait(lambda: _caught_up(members, ends), _show(members))
        reader.stop()
        back = (_held(c) or (False, frozenset()))[1]
        fetched = c.metrics()["materializer_fetched_records_total"]
        since_kill = {p: writer.per_partition[p] - produced_before_kill[p] for p in range(PARTITIONS)}
        bound = sum(since_kill[p] if p in held_at_kill else ends[p] for p in back)
        print(f"c held {sorted(held_at_kill)} at the kill (folders {sorted(kept)}), got {sorted(back)} back; "
              f"fetched {fetched:g} records, bound {bound} ({sum(since_kill[p] for p in held_at_kill)} produced "
              f"to its old partitions since the kill)")
        assert fetched <= bound
        if back <= held_at_kill:
            assert fetched == bound
        _owned_keys_equal_truth(members, _read_committed(bootstrap, topic))

        print(f"reads {dict(reader.reads)}, refusals {dict(reader.refusals)}, "
              f"{len(reader.violations)} violations; {time.monotonic() - started:.1f} s")
        assert not reader.violations, reader.violations[:20]
        assert all(reader.reads[m.name] > 0 for m in members), reader.reads
    finally:
        writer.stop()
        if reader is not None and reader.thread.is_alive():
            reader._stop.set()
            reader.thread.join(60)
        for m in members:
            m.stop()
