"""A running ``run`` against a cluster that goes away, comes back, grows partitions or loses a leader (issue 37).

Each test runs a continuous Materializer (``run`` without ``--until-caught-up``) against a real
Apache Kafka broker and checks what an operator relies on:

* broker restarts, repeated, with a producer writing and (group mode) a member joining and one
  leaving around them: the run never dies, retries with backoff, catches up, and its store equals
  what a read_committed consumer reads (a member died with "a fetch is already in flight" in 6 of
  6 restarts before);
* every broker refusing connections: ``/health/ready`` answers 503 within seconds, not after
  ``broker_timeout_ms`` (30 s), and stays 503 until the broker is back;
* partitions added to the topic: taken on within seconds, with readiness 503 until they caught
  up (a run without a group noticed them at its next 5-minute metadata refresh before, ready all
  along while its export lacked their keys);
* a partition whose only replica's broker is down in a two-broker cluster: readiness names it,
  and ``LocalKafkaBroker.attach`` works on that broker-only node (it failed on ``int(None)``).
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest
from click.testing import CliRunner
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewPartitions, NewTopic

from materializer import Materializer, MaterializerOptions
from materializer.cli import main
from materializer.http_endpoints import EndpointServer
from materializer.local.kafka_broker import TEST_BROKER_CONFIG, LocalKafkaBroker

from .broker_reads import latest_per_partition_key, read_topic
from .leader_changes import create_topic

pytestmark = pytest.mark.broker

_T = TypeVar("_T")

#: How long a stopped broker stays away in the restart tests, seconds (the scenario of the issue:
#: the broker stopped for about 4 s, then started again; a duration, not a synchronisation).
_DOWN_S = 4.0


def _wait_for(condition: Callable[[], _T], what: str, timeout_s: float = 60.0) -> _T:
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out after {timeout_s} s waiting for {what}"
        time.sleep(0.05)


def _ready(port: int) -> tuple[int, dict[str, Any]]:
    """GET /health/ready: (status, JSON body)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health/ready", timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _truth(bootstrap: str, topic: str, partitions: int) -> dict[tuple[int, bytes], bytes]:
    """(partition, key) -> latest value, as a read_committed consumer reads the topic now."""
    return latest_per_partition_key(read_topic(bootstrap, topic, partitions))


def _store(materializer: Materializer) -> dict[tuple[int, bytes], bytes]:
    return {(v.partition, k): v.value for k, v in materializer.store.items()}


def _exported(data_dir: Path, topic: str) -> dict[tuple[int, bytes], bytes]:
    """What ``materializer export`` prints: (partition, key) -> value."""
    result = CliRunner().invoke(main, ["export", "--data-dir", str(data_dir), "--topic", topic])
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    return {(row["partition"], row["key"].encode()): row["value"].encode() for row in rows}


class _Writer:
    """A producer writing 300 keys round-robin from a thread until :meth:`stop`, 20 records at a
    time, each 20 delivered before the next (so the queue stays small while the broker is away and
    everything sent is in the topic once :meth:`stop` returns), riding out broker restarts."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self._producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "acks": "all",
                                   "enable.idempotence": True, "message.timeout.ms": 300_000, "log_level": 0})
        self._topic = topic
        self._stop = threading.Event()
        self.errors: list[str] = []
        self.sent = 0
        self.delivered = 0
        self._thread = threading.Thread(target=self._write, daemon=True)
        self._thread.start()

    def _delivered(self, err, msg) -> None:  # noqa: ARG002 - librdkafka's callback signature
        if err is not None:
            self.errors.append(err.str())
        else:
            self.delivered += 1

    def _write(self) -> None:
        while not self._stop.is_set():
            for _ in range(20):
                self._producer.produce(self._topic, key=b"key-%03d" % (self.sent % 300), value=b"v%d" % self.sent,
                                       on_delivery=self._delivered)
                self.sent += 1
            while self._producer.flush(1.0):
                pass  # the broker is away: librdkafka retries until message.timeout.ms
            self._stop.wait(0.02)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(330)
        assert not self._thread.is_alive(), "the producer did not deliver its last records"
        assert not self.errors, self.errors[:5]


def _options(**extra: Any) -> MaterializerOptions:
    return MaterializerOptions(progress=False, cleaner_threads=0, poll_timeout_ms=200, **extra)


@pytest.mark.parametrize("group", [False, True], ids=["without-group", "group"])
def test_a_running_member_survives_repeated_broker_restarts_and_rebalances_around_them(tmp_path, group):
    """Three restarts with a producer writing. In group mode a second member joins right before
    the second restart and leaves right before the third, so the first member's rebalances are
    applied while the cluster is away. The first member never fails, reports the outage, catches
    up after each restart, and ends with every partition equal to a read_committed consumer's view."""
    with LocalKafkaBroker(tmp_path / "broker", extra_config=TEST_BROKER_CONFIG, fast_start=True) as broker:
        bootstrap, topic = broker.bootstrap_servers, "restarted"
        create_topic(bootstrap, topic, 4)
        writer = _Writer(bootstrap, topic)
        group_id = "restarts" if group else None
        first = Materializer(bootstrap, topic, tmp_path / "a", options=_options(group_id=group_id))
        second: Materializer | None = None
        try:
            first.run_in_background()
            _wait_for(lambda: first.health.ready, "the first catch-up")
            for restart in range(3):
                if group and restart == 1:  # joins: the group moves partitions to it
                    second = Materializer(bootstrap, topic, tmp_path / "b", options=_options(group_id=group_id))
                    second.run_in_background()
                if group and restart == 2 and second is not None:  # leaves: its partitions come back
                    second.stop()
                    second.close()
                    second = None
                broker.stop()
                _wait_for(lambda: not first.health.broker_reachable, "the outage to be reported", timeout_s=15)
                time.sleep(_DOWN_S)
                assert first.health.failed is None and first.health.running, first.health
                broker.start()
                assert broker.bootstrap_servers == bootstrap
                _wait_for(lambda: first.health.ready, f"ready again after restart {restart + 1}", timeout_s=120)
                assert first.health.failed is None, first.health.failed
            # a loaded machine's producer may still be reconnecting: every key written once, then stop
            _wait_for(lambda: writer.delivered >= 300, "the producer to deliver every key", timeout_s=120)
            writer.stop()
            truth = _truth(bootstrap, topic, 4)
            assert len({key for _, key in truth}) == 300
            _wait_for(lambda: first.assigned_partitions() == frozenset(range(4)), "every partition back with the "
                      "first member", timeout_s=60)
            _wait_for(lambda: _store(first) == truth, "the store to equal the consumer's view", timeout_s=60)
            assert first.health.failed is None and first.stats.records_fetched > 0
        finally:
            if second is not None:
                second.close()
            first.close()


def test_readiness_turns_503_within_seconds_when_every_broker_refuses_connections(tmp_path):
    """broker_timeout_ms stays at 30 s: a refused connection to every bootstrap broker is an outage
    at once (503 within 5 s of the broker's port closing), and it stays one through the retries
    while the broker is away (it used to read 200 again after each backoff)."""
    with LocalKafkaBroker(tmp_path / "broker", extra_config=TEST_BROKER_CONFIG, fast_start=True) as broker:
        bootstrap, topic = broker.bootstrap_servers, "refused"
        create_topic(bootstrap, topic, 2)
        writer = _Writer(bootstrap, topic)
        options = _options(broker_timeout_ms=30_000, request_timeout_ms=30_000)
        with Materializer(bootstrap, topic, tmp_path / "data", options=options) as materializer, \
                EndpointServer(materializer) as server:
            port = server.serve(0)
            materializer.run_in_background()
            _wait_for(lambda: _ready(port)[0] == 200, "/health/ready 200")
            stopping = time.monotonic()
            broker.stop()  # a controlled shutdown, then the JVM's exit closes the port
            stopped = time.monotonic()
            # (the controlled shutdown may first leave the partitions leaderless: 503 for that
            # reason, with the broker still answering; the outage must follow within the bound)
            status, body = _wait_for(lambda: (lambda r: r if r[0] == 503 and r[1]["broker_reachable"] is False
                                              else None)(_ready(port)),
                                     "/health/ready 503 naming the outage with every broker refusing", timeout_s=5)
            assert "does not answer" in " ".join(body["reasons"]), body
            reported_s, stop_s = time.monotonic() - stopping, stopped - stopping
            while time.monotonic() < stopped + 12:  # several backoffs (1, 2, 4 s): never ready meanwhile
                status, body = _ready(port)
                assert status == 503, body
                time.sleep(0.1)
            assert materializer.health.live and materializer.health.failed is None
            broker.start()
            _wait_for(lambda: _ready(port)[0] == 200, "/health/ready 200 after the broker is back", timeout_s=90)
            writer.stop()
            truth = _truth(bootstrap, topic, 2)
            _wait_for(lambda: _store(materializer) == truth, "the store to equal the consumer's view")
        print(f"readiness 503 {reported_s:.2f} s after broker.stop() was called ({stop_s:.2f} s until the JVM "
              f"exited; broker_timeout_ms 30000)")


def test_partitions_added_to_a_running_topic_are_taken_on_within_seconds_and_hold_readiness(
        kafka_broker, tmp_path):
    """No group, the default metadata_refresh_interval_ms (5 min): partitions 4 to 6 added while
    the run is ready are taken on within seconds, /health/ready answers 503 until their records are
    in the store (held open here by an update callback that waits on the first record of a new
    partition), then 200, and the export equals a read_committed consumer's view of all 7."""
    bootstrap = kafka_broker.bootstrap_servers
    topic = f"grown-{time.time_ns()}"
    create_topic(bootstrap, topic, 4)
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for i in range(2_000):
        producer.produce(topic, key=b"old-%04d" % (i % 500), value=b"v%d" % i)
    assert producer.flush(30) == 0
    new_partition_seen, release = threading.Event(), threading.Event()

    def hold_the_first_new_record(key, old, new, partition) -> None:  # noqa: ARG001 - on_update's signature
        if partition >= 4 and not new_partition_seen.is_set():
            new_partition_seen.set()
            release.wait(60)

    with Materializer(bootstrap, topic, tmp_path / "data", options=_options()) as materializer, \
            EndpointServer(materializer) as server:
        port = server.serve(0)
        materializer.on_update(hold_the_first_new_record)
        materializer.run_in_background()
        _wait_for(lambda: _ready(port)[0] == 200, "/health/ready 200")
        admin = AdminClient({"bootstrap.servers": bootstrap})
        admin.create_partitions([NewPartitions(topic, 7)])[topic].result(30)
        grown = time.monotonic()
        _wait_for(lambda: len(producer.list_topics(topic, timeout=10).topics[topic].partitions) == 7,
                  "the producer to see 7 partitions")
        for i in range(3_000):
            producer.produce(topic, key=b"new-%04d" % i, value=b"w%d" % i, partition=4 + i % 3)
        assert producer.flush(30) == 0
        status, body = _wait_for(lambda: (lambda r: r if r[0] == 503 else None)(_ready(port)),
                                 "/health/ready 503 once the new partitions are noticed", timeout_s=15)
        noticed_s = time.monotonic() - grown
        # noticed: not taken on yet while their leaders are being elected, or taken on and catching up
        assert set(body.get("unavailable_partitions", {})) <= {"4", "5", "6"}, body
        assert "catching up" in " ".join(body["reasons"]) or body.get("unavailable_partitions"), body
        assert new_partition_seen.wait(20), "no record of a new partition reached the store"
        status, body = _ready(port)  # a new partition's first record is being applied: not ready
        assert status == 503 and "catching up" in " ".join(body["reasons"]), body
        release.set()
        _wait_for(lambda: _ready(port)[0] == 200, "/health/ready 200 once the new partitions caught up",
                  timeout_s=30)
        assert sorted(materializer.logs) == list(range(7))
        materializer.stop()
    truth = _truth(bootstrap, topic, 7)
    assert {p for p, _ in truth} == set(range(7))
    assert _exported(tmp_path / "data", topic) == truth
    print(f"added partitions noticed (readiness 503) {noticed_s:.2f} s after create_partitions")


def test_a_partition_whose_leader_is_down_shows_in_readiness(tmp_path):
    """A two-broker cluster; partition 1's only replica is on node 2, a broker-only node that joined
    node 1's cluster. Node 2 is stopped through a handle attached from its state file (attach
    failed on its ``controller_port: null``): /health/ready answers 503 naming partition 1 while
    partition 0 goes on being fetched, and 200 again once node 2 is back and caught up."""
    with LocalKafkaBroker(tmp_path / "node1", extra_config=TEST_BROKER_CONFIG, fast_start=True) as node1, \
            LocalKafkaBroker(tmp_path / "node2", extra_config=TEST_BROKER_CONFIG, fast_start=True,
                             join=node1, node_id=2) as node2:
        bootstrap, topic = node1.bootstrap_servers, "split"
        admin = AdminClient({"bootstrap.servers": bootstrap})
        admin.create_topics([NewTopic(topic, num_partitions=2, replica_assignment=[[1], [2]],
                                      config={"cleanup.policy": "compact"})])[topic].result(30)
        _wait_for(lambda: all(p.leader >= 0 for p in admin.list_topics(topic, timeout=10).topics[topic]
                              .partitions.values()), "leaders for both partitions")
        producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
        for i in range(400):
            producer.produce(topic, key=b"k%03d" % (i % 100), value=b"v%d" % i, partition=i % 2)
        assert producer.flush(30) == 0
        with Materializer(bootstrap, topic, tmp_path / "data", options=_options()) as materializer, \
                EndpointServer(materializer) as server:
            port = server.serve(0)
            materializer.run_in_background()
            _wait_for(lambda: _ready(port)[0] == 200, "/health/ready 200")

            attached = LocalKafkaBroker.attach(tmp_path / "node2")
            assert (attached.node_id, attached.controller_port) == (2, None)
            assert attached.bootstrap_servers == node2.bootstrap_servers and attached.is_running()
            attached.stop()
            assert not node2.is_running()
            status, body = _wait_for(
                lambda: (lambda r: r if r[0] == 503 and "1" in r[1].get("unavailable_partitions", {}) else None)(
                    _ready(port)), "/health/ready 503 naming partition 1", timeout_s=30)
            assert list(body["unavailable_partitions"]) == ["1"] and body["broker_reachable"] is True, body
            assert any(reason.startswith("no leader to fetch from for partition(s) 1: ")
                       for reason in body["reasons"]), body
            for i in range(100):  # partition 0 is still followed
                producer.produce(topic, key=b"late-%03d" % i, value=b"x%d" % i, partition=0)
            assert producer.flush(30) == 0
            _wait_for(lambda: (0, b"late-099") in _store(materializer), "partition 0's new records")
            assert _ready(port)[0] == 503

            try:
                attached.start()  # back in node 1's cluster as node 2, from what its state file recorded
                _wait_for(lambda: _ready(port)[0] == 200, "/health/ready 200 with node 2 back", timeout_s=90)
                truth = _truth(bootstrap, topic, 2)
                _wait_for(lambda: _store(materializer) == truth, "the store to equal the consumer's view")
            finally:
                attached.stop()
