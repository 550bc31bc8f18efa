"""Liveness and readiness (materializer.health), the HTTP endpoints that serve them, and the
consumer group committer's throttling and error handling (materializer.group.commit).

The broker tests are tests/integration/test_ops_conventions.py; here the probes' rules, the HTTP
routes, and a real ``materializer run`` process waiting for an absent broker without prometheus_client.
"""

from __future__ import annotations

import json
import logging
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import Future
from unittest.mock import MagicMock

import pytest

import materializer.group.commit as group_commit_module
from materializer.adapters.errors import GroupCommitError
from materializer.adapters.group_offsets import GroupOffsetsClient
from materializer.config import MaterializerOptions
from materializer.group.commit import REFRESH_INTERVAL_S, GroupCommitter
from materializer.health import RunHeartbeat, liveness, readiness
from materializer.http_endpoints import EndpointServer
from materializer.materializer import Materializer
from materializer.stats import MaterializerHealth, MaterializerStats


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _health(**fields) -> MaterializerHealth:
    base = dict(running=True, caught_up=True, failed=None, broker_reachable=True, topic_exists=True,
                loop_idle_s=0.5, liveness_timeout_s=120.0)
    return MaterializerHealth(**{**base, **fields})


# -- the probes' rules ---------------------------------------------------------------------------


def test_partitions_without_a_leader_are_named_in_readiness():
    unavailable = {1: "no leader in the cluster's metadata", 5: "in the topic but not taken on yet: no leader known "
                                                                "for it"}
    probe = readiness(_health(caught_up=False, unavailable_partitions=unavailable), {0: 0})
    assert probe.status_code == 503
    assert probe.reasons == ("no leader to fetch from for partition(s) 1: no leader in the cluster's metadata; 5: in "
                             "the topic but not taken on yet: no leader known for it; their keys may be missing or old",)
    assert probe.detail["unavailable_partitions"] == {"1": unavailable[1], "5": unavailable[5]}
    # while the whole cluster is away that is the reason; the partitions stay in the detail
    away = readiness(_health(caught_up=False, broker_reachable=False, unavailable_partitions=unavailable))
    assert away.reasons == ("the Kafka cluster does not answer; the store keeps its last state",)
    assert "unavailable_partitions" not in readiness(_health()).detail


def test_ready_and_live_when_caught_up_and_iterating():
    health = _health()
    assert health.live and health.ready
    assert liveness(health).status_code == 200 and readiness(health, {0: 0}).status_code == 200
    assert json.loads(readiness(health, {0: 0, 1: 0}).to_json()) == {
        "ok": True, "reasons": [], "running": True, "caught_up": True, "broker_reachable": True,
        "topic_exists": True, "lag": {"0": 0, "1": 0}}


def test_an_absent_broker_makes_a_run_not_ready_but_leaves_it_live():
    health = _health(caught_up=False, broker_reachable=False)
    assert health.live and not health.ready
    assert liveness(health).ok
    result = readiness(health)
    assert result.status_code == 503
    assert result.reasons == ("the Kafka cluster does not answer; the store keeps its last state",)


def test_a_deleted_topic_is_not_ready_and_says_so():
    result = readiness(_health(caught_up=False, topic_exists=False))
    assert not result.ok and "does not exist" in result.reasons[0]


def test_catching_up_names_the_offsets_left():
    result = readiness(_health(caught_up=False), {0: 70, 1: 30})
    assert not result.ok and result.reasons == ("catching up: the store has not reached the high watermarks yet "
                                                "(100 offsets to fetch)",)


def test_a_failed_run_is_neither_live_nor_ready():
    failure = RuntimeError("disk full")
    health = _health(failed=failure)
    assert not health.live and not health.ready
    assert liveness(health).reasons == ("ingest failed: RuntimeError: disk full",)
    assert readiness(health).reasons == ("ingest failed: RuntimeError: disk full",)


def test_a_wedged_loop_is_not_live():
    health = _health(loop_idle_s=130.0)
    assert not health.live
    result = liveness(health)
    assert result.status_code == 503
    assert result.reasons == ("the run loop made no progress for 130.0 s (liveness timeout 120.0 s)",)


def test_heartbeat_idle_time_beats_and_replay_progress():
    clock = FakeClock()
    heartbeat = RunHeartbeat(clock)
    clock.now += 5
    assert heartbeat.idle_s() == 5
    heartbeat.beat()
    assert heartbeat.idle_s() == 0
    # a replay advancing inside a start counts as progress; the first value seen is only remembered
    clock.now += 3
    assert heartbeat.idle_s(progress=10) == 3
    clock.now += 3
    assert heartbeat.idle_s(progress=20) == 0
    clock.now += 4
    assert heartbeat.idle_s(progress=20) == 4


def test_liveness_timeout_default_follows_the_request_timeout():
    assert MaterializerOptions().effective_liveness_timeout_ms == 120_000
    assert MaterializerOptions(request_timeout_ms=60_000).effective_liveness_timeout_ms == 240_000
    assert MaterializerOptions(liveness_timeout_ms=5_000).effective_liveness_timeout_ms == 5_000
    with pytest.raises(ValueError, match="liveness_timeout_ms"):
        MaterializerOptions(liveness_timeout_ms=0)
    with pytest.raises(ValueError, match="commit_group"):
        MaterializerOptions(commit_group=" ")


# -- the HTTP routes ------------------------------------------------------------------------------


def _get(port: int, path: str, method: str = "GET") -> tuple[int, str, str]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", method=method)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.headers["Content-Type"], response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers["Content-Type"], exc.read().decode()


def test_endpoints_route_probes_metrics_and_unknown_paths(tmp_path):
    prometheus = pytest.importorskip("prometheus_client")
    assert prometheus
    from materializer.metrics import MaterializerMetrics

    materializer = Materializer("127.0.0.1:1", "prices", tmp_path)  # never started: not running
    with MaterializerMetrics(materializer, statistics_interval_ms=0) as metrics, \
            EndpointServer(materializer, metrics) as server:
        port = server.serve(0)
        status, content_type, body = _get(port, "/health/ready")
        assert (status, content_type) == (503, "application/json")
        assert json.loads(body)["reasons"] == ["the run loop is not running"]
        status, _, body = _get(port, "/health/live?verbose=1")  # a query string does not change the route
        assert status == 200 and json.loads(body)["running"] is False
        status, content_type, body = _get(port, "/metrics")
        assert status == 200 and content_type.startswith("text/plain")
        assert 'materializer_ready{topic="prices"} 0.0' in body and 'materializer_live{topic="prices"} 1.0' in body
        assert _get(port, "/health/ready", method="HEAD")[:2] == (503, "application/json")
        status, _, body = _get(port, "/healthz")
        assert status == 404 and "/health/live" in body
        with pytest.raises(RuntimeError, match="already served"):
            server.serve(0)
    with pytest.raises(urllib.error.URLError):  # closed: the port is released
        _get(port, "/health/live")


def test_endpoints_port_in_use_names_the_address(tmp_path):
    materializer = Materializer("127.0.0.1:1", "prices", tmp_path)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(OSError, match=f"cannot serve metrics and health on 127.0.0.1:{port}"):
            EndpointServer(materializer).serve(port)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


_WITHOUT_PROMETHEUS = ("import sys; sys.modules['prometheus_client'] = None; sys.modules['prometheus_client.core'] = None; "
                       "from materializer.__main__ import entry; sys.argv[0] = 'materializer'; entry()")


def test_cli_run_without_prometheus_client_serves_probes_while_the_broker_is_absent(tmp_path):
    """A continuous run whose broker never answers: live (it retries with backoff, a restart would
    not help), not ready (naming the broker), /metrics 503 naming the extra; SIGTERM ends it."""
    port = _free_port()
    absent = f"127.0.0.1:{_free_port()}"
    process = subprocess.Popen(
        [sys.executable, "-c", _WITHOUT_PROMETHEUS, "run", "--bootstrap-servers", absent, "--topic", "t",
         "--data-dir", str(tmp_path / "data"), "--metrics-port", str(port), "--timeout", "1",
         "--liveness-timeout-ms", "15000", "--no-progress"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                status, _, body = _get(port, "/health/live")
                break
            except (urllib.error.URLError, ConnectionError):
                assert process.poll() is None, process.communicate()
                assert time.monotonic() < deadline, "the endpoints never answered"
                time.sleep(0.1)
        assert status == 200, body
        status, _, body = _get(port, "/metrics")
        assert status == 503 and "pip install 'kafka-materializer[metrics]'" in body
        # across several backoffs (1, 2, 4 s...) it stays live and never ready: sampled until the
        # loop has beaten at three retries (its idle time fell back three times)
        deadline = time.monotonic() + 40
        seen_unreachable = False
        retries, idle = 0, -1.0
        while retries < 3:
            assert time.monotonic() < deadline, f"{retries} retries seen in 40 s"
            live_status, _, live_body = _get(port, "/health/live")
            assert live_status == 200, live_body
            ready_status, _, ready_body = _get(port, "/health/ready")
            assert ready_status == 503, ready_body
            seen_unreachable |= "does not answer" in ready_body
            now_idle = json.loads(live_body)["loop_idle_s"]
            retries += now_idle < idle
            idle = now_idle
            time.sleep(0.1)
        assert seen_unreachable
    finally:
        process.send_signal(signal.SIGTERM)
        stdout, stderr = process.communicate(timeout=60)
    assert process.returncode == 0, stderr
    assert "serving only /health/live and /health/ready" in stderr


# -- the group committer -------------------------------------------------------------------------


@pytest.fixture
def commits(monkeypatch):
    """The committer's client replaced by a spec'd mock; returns (client, sent futures)."""
    client = MagicMock(spec_set=GroupOffsetsClient)
    sent: list[tuple[dict[int, int], Future]] = []

    def commit(offsets):
        future: Future = Future()
        sent.append((dict(offsets), future))
        return future

    client.commit.side_effect = commit
    monkeypatch.setattr(group_commit_module, "GroupOffsetsClient", lambda *args, **kwargs: client)
    return client, sent


def _committer(clock, interval_ms=1000) -> tuple[GroupCommitter, MaterializerStats]:
    stats = MaterializerStats()
    options = MaterializerOptions(commit_group="lag-tools", commit_interval_ms=interval_ms)
    return GroupCommitter("127.0.0.1:1", "prices", options, stats, clock=clock), stats


def test_commits_are_throttled_one_in_flight_and_skip_unchanged_offsets(commits):
    client, sent = commits
    clock = FakeClock()
    committer, stats = _committer(clock)
    committer.maybe_commit({0: 10, 1: 5})
    assert [offsets for offsets, _ in sent] == [{0: 10, 1: 5}]
    clock.now += 5
    committer.maybe_commit({0: 20, 1: 5})  # the first is still in flight: nothing more is sent
    assert len(sent) == 1
    sent[0][1].set_result(None)
    committer.maybe_commit({0: 20, 1: 5})
    assert stats.group_commits == 1 and stats.group_committed_offsets == {0: 10, 1: 5}
    assert [offsets for offsets, _ in sent][-1] == {0: 20, 1: 5}
    sent[-1][1].set_result(None)
    clock.now += 0.5
    committer.maybe_commit({0: 30, 1: 5})  # within the interval
    assert len(sent) == 2 and stats.group_committed_offsets == {0: 20, 1: 5}
    clock.now += 1
    committer.maybe_commit({0: 20, 1: 5})  # unchanged: not sent again before the refresh interval
    assert len(sent) == 2
    clock.now += REFRESH_INTERVAL_S
    committer.maybe_commit({0: 20, 1: 5})
    assert len(sent) == 3
    committer.close()
    client.close.assert_called_once_with()


def test_a_refused_commit_is_counted_and_warned_once(commits, caplog):
    _, sent = commits
    clock = FakeClock()
    committer, stats = _committer(clock)
    caplog.set_level(logging.DEBUG, logger="materializer.group.commit")
    refused = GroupCommitError("cannot commit offsets of prices-0 to consumer group 'lag-tools': the group has "
                               "active members", active_members=True)
    for _ in range(3):
        committer.maybe_commit({0: 10})
        sent[-1][1].set_exception(refused)
        clock.now += 2
    committer.maybe_commit({0: 10})
    assert stats.group_commit_failures == 3 and stats.group_commits == 0
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "active members" in warnings[0].getMessage()
    sent[-1][1].set_result(None)
    clock.now += 2
    committer.maybe_commit({0: 10})
    assert stats.group_commits == 1 and stats.group_committed_offsets == {0: 10}
    assert "works again" in caplog.records[-1].getMessage()


def test_flush_waits_for_the_final_commit(commits):
    _, sent = commits
    clock = FakeClock()
    committer, stats = _committer(clock)

    def answer_when_sent(offsets):
        future: Future = Future()
        future.set_result(None)
        sent.append((dict(offsets), future))
        return future

    commits[0].commit.side_effect = answer_when_sent
    assert committer.flush({0: 7, 1: 3}, timeout_s=1)
    assert stats.group_committed_offsets == {0: 7, 1: 3}
    assert committer.flush({}, timeout_s=1) and len(sent) == 1  # nothing to commit: nothing sent


def test_flush_gives_up_after_its_timeout(commits):
    _, sent = commits
    committer, stats = _committer(time.monotonic)
    started = time.monotonic()
    assert not committer.flush({0: 7}, timeout_s=0.3)  # the coordinator never answers
    assert 0.25 <= time.monotonic() - started < 5
    assert len(sent) == 1 and stats.group_commits == 0
