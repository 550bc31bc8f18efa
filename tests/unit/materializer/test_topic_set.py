"""Several topics in one process without a broker: co-partition groups, the set's arguments, the
shared lock and membership hand-over, and the combined probes and metrics (the broker tests are
tests/integration/test_topic_set.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from materializer.cli import main
from materializer.cli.options import EXIT_FAILURE
from materializer.datadir.lock import DataDirLock
from materializer.health import ProbeResult, combined
from materializer.http_endpoints import EndpointServer
from materializer.materializer import Materializer
from materializer.metrics import MaterializerMetrics
from materializer.storage.errors import DataDirLockedError
from materializer.topic_set import TopicSet, co_partition_leads


def test_topics_with_the_same_partition_count_follow_the_first_of_them():
    leads = co_partition_leads({"orders": 12, "rates": 3, "customers": 12, "fx": 3, "audit": 1})
    assert leads == {"orders": "orders", "rates": "rates", "customers": "orders", "fx": "rates", "audit": "audit"}
    assert co_partition_leads({"only": 4}) == {"only": "only"}
    with pytest.raises(ValueError, match="'t' has 0 partitions"):
        co_partition_leads({"t": 0})


def test_a_set_needs_distinct_topics(tmp_path: Path):
    with pytest.raises(ValueError, match="at least one topic"):
        TopicSet("127.0.0.1:1", [], tmp_path)
    with pytest.raises(ValueError, match="more than once: a"):
        TopicSet("127.0.0.1:1", ["a", "b", "a"], tmp_path)
    topic_set = TopicSet("127.0.0.1:1", ["b", "a"], tmp_path)
    assert topic_set.topics == ["b", "a"] and topic_set["a"].topic == "a"
    assert topic_set.lead_of("a") == "a"  # before start (and without a group) every topic leads itself
    with pytest.raises(KeyError, match="'c' is not materialized here"):
        topic_set.view("c")


def test_a_shared_lock_is_used_and_left_held(tmp_path: Path):
    lock = DataDirLock.acquire(tmp_path / "d", "run")
    try:
        m = Materializer("127.0.0.1:1", "t", tmp_path / "d")
        m.share_data_dir_lock(lock)
        with pytest.raises(RuntimeError, match="already holds the lock"):
            m.share_data_dir_lock(lock)
        m.close()  # the caller's lock stays held
        assert lock.held
        with pytest.raises(DataDirLockedError):
            DataDirLock.acquire(tmp_path / "d", "run")
    finally:
        lock.release()


def test_a_membership_is_shared_only_in_group_mode(tmp_path: Path):
    with pytest.raises(RuntimeError, match="not in group mode"):
        Materializer("127.0.0.1:1", "t", tmp_path).share_membership(object())  # type: ignore[arg-type]
    grouped = Materializer("127.0.0.1:1", "t", tmp_path, group_id="g")
    assert grouped.assignment is not None and grouped.assignment.topic == "t"
    membership = object()
    grouped.share_membership(membership)  # type: ignore[arg-type]
    with pytest.raises(RuntimeError, match="already joined"):
        grouped.share_membership(membership)  # type: ignore[arg-type]
    grouped.leave_group()  # lets go of it without closing it (object() has no close)


def test_combined_probe_holds_when_every_topic_holds():
    ok = ProbeResult(True, (), {"caught_up": True})
    behind = ProbeResult(False, ("catching up: 5 offsets left",), {"caught_up": False})
    both = combined({"a": ok, "b": behind})
    assert not both.ok and both.reasons == ("b: catching up: 5 offsets left",)
    assert both.detail == {"topics": {"a": {"ok": True, "caught_up": True}, "b": {"ok": False, "caught_up": False}}}
    assert combined({"a": ok, "b": ok}).ok
    with pytest.raises(ValueError):
        combined({})


def test_one_endpoint_and_one_registry_for_several_topics(tmp_path: Path):
    pytest.importorskip("prometheus_client")
    a = Materializer("127.0.0.1:1", "a", tmp_path)
    b = Materializer("127.0.0.1:1", "b", tmp_path)
    server = EndpointServer([a, b])
    ready = server.ready()
    assert not ready.ok and set(ready.detail["topics"]) == {"a", "b"}  # neither is running
    assert any(reason.startswith("a: ") for reason in ready.reasons) and any(r.startswith("b: ") for r in ready.reasons)
    with pytest.raises(ValueError):
        EndpointServer([])
    metrics = MaterializerMetrics(a, statistics_interval_ms=0)
    MaterializerMetrics(b, statistics_interval_ms=0, registry=metrics.registry)
    exposed = metrics.render().decode()
    assert exposed.count("# TYPE materializer_applied_records_total counter") == 1  # one family, two samples
    assert 'materializer_applied_records_total{topic="a"} 0.0' in exposed
    assert 'materializer_applied_records_total{topic="b"} 0.0' in exposed
    with pytest.raises(ValueError, match="topic 'a' are already on this registry"):
        MaterializerMetrics(a, statistics_interval_ms=0, registry=metrics.registry)


def test_run_refuses_a_topic_named_twice(tmp_path: Path):
    result = CliRunner().invoke(main, ["run", "--bootstrap-servers", "127.0.0.1:1", "--topic", "a", "--topic", "a",
                                       "--data-dir", str(tmp_path / "d"), "--until-caught-up"])
    assert result.exit_code == EXIT_FAILURE and "more than once" in result.output
    assert not (tmp_path / "d").exists()


def test_run_with_two_topics_and_no_broker_fails_naming_the_broker(tmp_path: Path):
    result = CliRunner().invoke(main, ["run", "--bootstrap-servers", "127.0.0.1:1", "--topic", "a", "--topic", "b",
                                       "--data-dir", str(tmp_path / "d"), "--until-caught-up", "--timeout", "1"])
    assert result.exit_code == EXIT_FAILURE and "cannot read metadata" in result.output, result.output
    assert not (tmp_path / "d").exists() or not any((tmp_path / "d").iterdir())  # nothing left behind but the folder


@pytest.mark.parametrize("group", [False, True], ids=["topics", "group"])
def test_a_continuous_run_of_two_topics_waits_for_the_broker_and_stops_at_once(tmp_path: Path, group: bool):
    """No broker at start: the set keeps retrying (never a request that waits out --timeout, 30 s
    here), and SIGTERM ends it within seconds with each topic's summary and exit 0."""
    import signal
    import subprocess
    import sys
    import time

    args = ["run", "--bootstrap-servers", "127.0.0.1:1", "--topic", "a", "--topic", "b", "--data-dir",
            str(tmp_path / "d"), "--timeout", "30"] + (["--group-id", "g"] if group else [])
    stderr_path = tmp_path / "stderr"
    with open(stderr_path, "w") as stderr_file:
        process = subprocess.Popen([sys.executable, "-m", "materializer", *args], stdout=subprocess.PIPE,
                                   stderr=stderr_file, text=True)
    try:
        deadline = time.monotonic() + 20  # the run found the broker away and waits with backoff
        while "retrying with backoff" not in stderr_path.read_text():
            assert process.poll() is None, (process.communicate(), stderr_path.read_text())
            assert time.monotonic() < deadline, f"no retry logged in 20 s: {stderr_path.read_text()}"
            time.sleep(0.05)
        process.send_signal(signal.SIGTERM)
        out, _ = process.communicate(timeout=10)  # within seconds, not after a request's --timeout of 30 s
    finally:
        process.kill()
    err = stderr_path.read_text()
    assert process.returncode == 0, err
    assert [line.split(":")[0] for line in out.splitlines()] == ["a", "b"], out
    assert "retrying with backoff" in err and "accepts connections" in err, err
    assert not (tmp_path / "d").exists()  # a run that never started leaves no data dir


def test_waiting_for_the_set_ends_on_a_failure_or_a_stop(tmp_path: Path):
    topic_set = TopicSet("127.0.0.1:1", ["a", "b"], tmp_path)

    def failed(timeout_s=None):
        raise RuntimeError("b failed")

    topic_set.materializers["b"].wait_until_caught_up = failed  # type: ignore[method-assign]
    with pytest.raises(RuntimeError, match="b failed"):
        topic_set.wait_until_caught_up()  # not stuck on "a", which the failure stopped short of caught up
    del topic_set.materializers["b"].wait_until_caught_up
    topic_set.stop()
    assert topic_set.wait_until_caught_up() is False


def test_a_group_set_waiting_for_the_broker_is_live_and_says_the_broker_is_away(tmp_path: Path):
    import threading
    import time

    from materializer.health import liveness

    topic_set = TopicSet("127.0.0.1:1", ["a", "b"], tmp_path / "d", group_id="g")
    runner = threading.Thread(target=topic_set.run)
    runner.start()
    try:
        # each topic says the broker is away and is live, its loop beating at each retry: its idle
        # time falls back at least twice (the retries after the 1 s and the 2 s backoffs)
        beats = {topic: 0 for topic in topic_set.topics}
        idle: dict[str, float] = {}
        deadline = time.monotonic() + 20
        while min(beats.values()) < 2:
            assert time.monotonic() < deadline, f"beats seen per topic in 20 s: {beats}"
            for topic, health in topic_set.health.items():
                assert liveness(health).ok, health
                if not health.broker_reachable:
                    beats[topic] += health.loop_idle_s < idle.get(topic, -1.0)
                    idle[topic] = health.loop_idle_s
            time.sleep(0.05)
    finally:
        topic_set.stop()
        runner.join(10)
        topic_set.close()
    assert not runner.is_alive()


def test_a_second_signal_leaves_a_busy_topic_unclosed_and_the_data_dir_locked(tmp_path: Path, monkeypatch):
    """Ctrl-C twice: close() does not wait for a topic busy in a long store replay (which does not
    look at stop()); it is left as a crash leaves it, and the data dir stays locked meanwhile."""
    import os
    import signal
    import threading
    import time

    release = threading.Event()
    busy = {"a": threading.Event(), "b": threading.Event()}

    def busy_run(self, until_caught_up=False):  # a replay that does not look at stop()
        busy[self.topic].set()
        release.wait(30)

    monkeypatch.setattr(Materializer, "run", busy_run)
    topic_set = TopicSet("127.0.0.1:1", ["a", "b"], tmp_path / "d")

    def twice() -> None:
        for event in busy.values():  # both topics are busy
            assert event.wait(30)
        os.kill(os.getpid(), signal.SIGINT)
        assert topic_set._stop_requested.wait(30)  # the first signal was handled: the second aborts
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=twice, daemon=True).start()
    with pytest.raises(KeyboardInterrupt):
        topic_set.run()
    started = time.monotonic()
    topic_set.close()
    assert time.monotonic() - started < 5  # a second per busy topic, not the replay's 30 s
    with pytest.raises(DataDirLockedError):
        DataDirLock.acquire(tmp_path / "d", "run")
    release.set()  # the replays end: a close now closes them and lets the data dir go
    topic_set._aborted = False
    topic_set.close()
    DataDirLock.acquire(tmp_path / "d", "run").release()


def test_run_gives_every_topic_one_store_memory_budget(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """``--store-memory-mb`` makes one StoreMemory that the stores of every topic share (the
    TopicSet hands one StateStoreOptions to each topic's Materializer)."""
    import materializer.topic_set as topic_set_module  # `run` imports TopicSet from there as it runs

    made: list[TopicSet] = []

    class Stop(Exception):
        pass

    def topic_set(*args, **kwargs):
        made.append(TopicSet(*args, **kwargs))
        raise Stop

    monkeypatch.setattr(topic_set_module, "TopicSet", topic_set)
    result = CliRunner().invoke(main, ["run", "--bootstrap-servers", "127.0.0.1:1", "--topic", "a", "--topic", "b",
                                       "--data-dir", str(tmp_path / "d"), "--store-memory-mb", "48"])
    assert isinstance(result.exception, Stop)
    a, b = (made[0].materializers[t].options.store.memory for t in ("a", "b"))
    assert a is b and a is not None and a.limit_bytes == 48 << 20
    assert made[0].materializers["a"].options.store.to_options() is not None
    made[0].close()
