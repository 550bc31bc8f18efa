"""Issue 23 part 5 against a real broker: /health/live and /health/ready of a run, and the applied
offsets committed to a consumer group (--commit-group) as Kafka's own tools read them.

Waits poll a condition with a generous deadline and fail only when it never holds.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import pytest
from confluent_kafka import Consumer, ConsumerGroupTopicPartitions, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient

from materializer import Materializer, MaterializerOptions
from materializer.http_endpoints import EndpointServer
from materializer.local.kafka_broker import LocalKafkaBroker
from materializer.local.kafka_jars import KAFKA_VERSION, classpath, find_java, kafka_home

from .leader_changes import create_topic as create_topic_with_leaders
from .leader_changes import delete_topic
from .background_run import wait_until
from .test_ingest import Produced, produce

pytestmark = pytest.mark.broker


def _get(port: int, path: str) -> tuple[int, dict | str]:
    """GET ``path``: (status, JSON body or text)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as response:
            status, body = response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        status, body = exc.code, exc.read().decode()
    try:
        return status, json.loads(body)
    except json.JSONDecodeError:
        return status, body


def _wait_for(condition, what: str, timeout_s: float = 60.0):
    return wait_until(condition, timeout_s, what)


def _end_offsets(admin_bootstrap: str, topic: str, partitions: int) -> dict[int, int]:
    consumer = Consumer({"bootstrap.servers": admin_bootstrap, "group.id": "ops-conventions-probe"})
    try:
        return {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in range(partitions)}
    finally:
        consumer.close()


def _group_offsets(bootstrap: str, group: str, topic: str) -> dict[int, int] | None:
    """The group's committed offsets of ``topic`` (OffsetFetch through a new AdminClient: one
    created before a broker restart may never get an answer again); None when the request fails."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)], request_timeout=10)
    try:
        result = futures[group].result(timeout=30)
    except KafkaException:
        return None
    return {tp.partition: tp.offset for tp in result.topic_partitions if tp.topic == topic and tp.offset >= 0}


def test_probes_not_ready_before_catch_up_ready_after_live_until_wedged(kafka_broker, create_topic, tmp_path):
    topic = create_topic(partitions=2, config={"cleanup.policy": "compact"})
    bootstrap = kafka_broker.bootstrap_servers
    produced = Produced()
    produce(bootstrap, topic, produced, count=600, keys=100, seed=23)
    options = MaterializerOptions(cleaner_threads=0, liveness_timeout_ms=1500)
    materializer = Materializer(bootstrap, topic, tmp_path, options=options)

    # An update callback runs in the run loop's thread: holding it wedges the loop mid catch-up.
    entered, release = threading.Event(), threading.Event()

    def hold_first_update(key, old, new, partition):
        if not entered.is_set():
            entered.set()
            release.wait(60)

    materializer.on_update(hold_first_update)
    with EndpointServer(materializer) as server, materializer:
        port = server.serve(0)
        status, body = _get(port, "/health/ready")
        assert status == 503 and body["reasons"] == ["the run loop is not running"], body
        status, body = _get(port, "/health/live")
        assert status == 200 and body["ok"] is True, body
        status, text = _get(port, "/metrics")  # no MaterializerMetrics given: says what to install
        assert status == 503 and "kafka-materializer[metrics]" in text

        thread = materializer.run_in_background()
        assert entered.wait(60), "the first record never reached the store"
        status, body = _get(port, "/health/ready")
        assert status == 503 and body["caught_up"] is False and body["running"] is True, body
        assert body["reasons"][0].startswith("catching up"), body
        # the loop stays wedged past the 1.5 s liveness timeout: /health/live turns 503, naming why
        status, body = _wait_for(lambda: (lambda r: r if r[0] == 503 else None)(_get(port, "/health/live")),
                                 "/health/live answering 503 for a wedged run loop", timeout_s=30)
        assert "no progress" in body["reasons"][0] and body["broker_reachable"] is True, body
        assert _get(port, "/health/ready")[0] == 503

        release.set()
        assert materializer.wait_until_caught_up(timeout_s=60)
        status, body = _get(port, "/health/ready")
        assert status == 200 and body == {**body, "ok": True, "reasons": [], "caught_up": True}, body
        assert body["lag"] == {"0": 0, "1": 0}
        assert _get(port, "/health/live")[0] == 200
        assert materializer.health.live and materializer.health.ready
        materializer.stop()
        thread.join(timeout=60)
        assert not thread.is_alive()
        assert _get(port, "/health/ready")[0] == 503  # stopped: serve from elsewhere


def test_cli_commit_group_equals_end_offsets_for_kafka_tools(kafka_broker, create_topic, tmp_path):
    topic = create_topic(partitions=3, config={"cleanup.policy": "compact"})
    bootstrap = kafka_broker.bootstrap_servers
    produced = Produced()
    produce(bootstrap, topic, produced, count=900, keys=150, seed=24)
    group = f"materializer-{topic}"
    result = subprocess.run(
        [sys.executable, "-m", "materializer", "run", "--bootstrap-servers", bootstrap, "--topic", topic,
         "--data-dir", str(tmp_path / "data"), "--until-caught-up", "--no-progress", "--commit-group", group],
        capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stderr
    ends = _end_offsets(bootstrap, topic, 3)
    assert sum(ends.values()) == 900
    assert _group_offsets(bootstrap, group, topic) == ends

    # Kafka's own tool reads the same offsets and reports no lag.
    lib = kafka_home(KAFKA_VERSION) / "lib"
    described = subprocess.run(
        [find_java(), "-cp", classpath(lib), "org.apache.kafka.tools.consumer.group.ConsumerGroupCommand",
         "--bootstrap-server", bootstrap, "--describe", "--group", group],
        capture_output=True, text=True, timeout=120)
    assert described.returncode == 0, described.stderr
    rows = [line.split() for line in described.stdout.splitlines() if line.split()[:2] == [group, topic]]
    assert len(rows) == 3, described.stdout
    for row in rows:  # GROUP TOPIC PARTITION CURRENT-OFFSET LOG-END-OFFSET LAG ...
        partition, current, end, lag = int(row[2]), int(row[3]), int(row[4]), row[5]
        assert current == end == ends[partition] and lag == "0", described.stdout


def test_commit_group_with_active_members_warns_keeps_running_then_commits(kafka_broker, create_topic, tmp_path,
                                                                         caplog):
    topic = create_topic(partitions=2, config={"cleanup.policy": "compact"})
    bootstrap = kafka_broker.bootstrap_servers
    produced = Produced()
    produce(bootstrap, topic, produced, count=400, keys=80, seed=25)
    group = f"taken-{topic}"
    member = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False,
                       "auto.offset.reset": "earliest"})
    member.subscribe([topic])
    _wait_for(lambda: member.poll(0.5) is not None and member.assignment(), "the other application's consumer joining")

    options = MaterializerOptions(cleaner_threads=0, commit_group=group, commit_interval_ms=200)
    caplog.set_level("WARNING", logger="materializer.group.commit")
    with Materializer(bootstrap, topic, tmp_path, options=options) as materializer:
        thread = materializer.run_in_background()
        assert materializer.wait_until_caught_up(timeout_s=60)
        _wait_for(lambda: materializer.stats.group_commit_failures >= 2, "refused commits to a group with members")
        assert materializer.stats.group_commits == 0
        health = materializer.health
        assert health.ready and health.live and health.failed is None  # a refused commit never stops the run
        warnings = [r.getMessage() for r in caplog.records if "active members" in r.getMessage()]
        assert len(warnings) == 1 and group in warnings[0], caplog.text  # once, not once a commit

        member.close()  # the other application leaves: the group is empty and takes our commits
        ends = _end_offsets(bootstrap, topic, 2)
        _wait_for(lambda: _group_offsets(bootstrap, group, topic) == ends, "the applied offsets in the group")
        # the run loop accounts for a finished commit at its next round
        _wait_for(lambda: materializer.stats.group_commits >= 1, "the accepted commit counted")
        assert materializer.stats.group_committed_offsets == ends
        assert any("works again" in r.getMessage() for r in caplog.records)

        produce(bootstrap, topic, produced, count=100, keys=80, seed=26)  # commits follow what is applied
        later = _end_offsets(bootstrap, topic, 2)
        _wait_for(lambda: _group_offsets(bootstrap, group, topic) == later, "the new applied offsets in the group")
        materializer.stop()
        thread.join(timeout=60)


def test_broker_outage_turns_ready_off_and_on_while_live_throughout(tmp_path):
    """A dedicated broker stopped for longer than the request timeout: /health/ready 503 naming the
    cluster while /health/live stays 200 (a restart would not bring the broker back); after the
    broker is back and the run caught up, ready again and the group commits resume."""
    broker = LocalKafkaBroker(tmp_path / "broker").start()
    try:
        bootstrap = broker.bootstrap_servers
        topic, group = "outage", "outage-lag"
        create_topic_with_leaders(bootstrap, topic, 2)
        produce(bootstrap, topic, Produced(), count=500, keys=100, seed=27)
        # liveness timeout above request timeout + the longest backoff (12 s)
        options = MaterializerOptions(broker_timeout_ms=2_000, request_timeout_ms=2_000, cleaner_threads=0,
                                      liveness_timeout_ms=15_000, commit_group=group, commit_interval_ms=200)
        with Materializer(bootstrap, topic, tmp_path / "data", options=options) as materializer, \
                EndpointServer(materializer) as server:
            port = server.serve(0)
            thread = materializer.run_in_background()
            assert materializer.wait_until_caught_up(60)
            assert _get(port, "/health/ready")[0] == 200
            ends = _end_offsets(bootstrap, topic, 2)
            _wait_for(lambda: _group_offsets(bootstrap, group, topic) == ends, "the applied offsets in the group")

            broker.stop()
            status, body = _wait_for(lambda: (lambda r: r if r[0] == 503 else None)(_get(port, "/health/ready")),
                                     "/health/ready answering 503 without a broker", timeout_s=60)
            assert "does not answer" in " ".join(body["reasons"]) and body["broker_reachable"] is False, body
            until = time.monotonic() + 10  # several backoffs: live all along
            while time.monotonic() < until:
                live_status, live_body = _get(port, "/health/live")
                assert live_status == 200, live_body
                time.sleep(0.5)
            assert materializer.health.running and materializer.health.failed is None

            broker.start()
            assert broker.bootstrap_servers == bootstrap
            produce(bootstrap, topic, Produced(), count=200, keys=100, seed=28)
            _wait_for(lambda: _get(port, "/health/ready")[0] == 200, "/health/ready 200 after the broker is back",
                      timeout_s=90)
            later = _end_offsets(bootstrap, topic, 2)
            assert sum(later.values()) == 700
            _wait_for(lambda: _group_offsets(bootstrap, group, topic) == later, "the group commits resuming")
            materializer.stop()
            thread.join(timeout=60)
    finally:
        broker.stop()


def test_ready_off_while_the_topic_is_deleted_on_again_once_the_new_one_is_caught_up(kafka_broker, tmp_path):
    bootstrap = kafka_broker.bootstrap_servers
    topic = f"ops-recreated-{time.time_ns()}"
    group = f"lag-{topic}"
    create_topic_with_leaders(bootstrap, topic, 2)
    produce(bootstrap, topic, Produced(), count=600, keys=100, seed=29)
    options = MaterializerOptions(cleaner_threads=0, request_timeout_ms=5_000, broker_timeout_ms=5_000,
                                  commit_group=group, commit_interval_ms=200)
    with Materializer(bootstrap, topic, tmp_path, options=options) as materializer, \
            EndpointServer(materializer) as server:
        port = server.serve(0)
        thread = materializer.run_in_background()
        assert materializer.wait_until_caught_up(60)
        before = _end_offsets(bootstrap, topic, 2)
        _wait_for(lambda: _group_offsets(bootstrap, group, topic) == before, "the first offsets in the group")

        delete_topic(bootstrap, topic)
        status, body = _wait_for(lambda: (lambda r: r if r[0] == 503 else None)(_get(port, "/health/ready")),
                                 "/health/ready answering 503 for a deleted topic", timeout_s=60)
        assert body["topic_exists"] is False and "does not exist" in " ".join(body["reasons"]), body
        assert _get(port, "/health/live")[0] == 200

        create_topic_with_leaders(bootstrap, topic, 2)  # re-created: another topic id, materialized again
        produce(bootstrap, topic, Produced(), count=50, keys=20, seed=30)
        after = _end_offsets(bootstrap, topic, 2)
        _wait_for(lambda: _get(port, "/health/ready")[0] == 200 and materializer.stats.topic_recreations == 1,
                  "/health/ready 200 once the re-created topic is caught up", timeout_s=90)
        assert materializer.store is not None and materializer.store.count() <= 20
        # the group follows the store down to the new topic's offsets
        _wait_for(lambda: _group_offsets(bootstrap, group, topic) == after, "the new topic's offsets in the group")
        assert all(after[p] < before[p] for p in after)
        materializer.stop()
        thread.join(timeout=60)
