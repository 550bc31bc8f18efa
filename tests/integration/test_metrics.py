"""Issue "Metrics and logs": the Prometheus endpoint of a Materializer against a real broker.

Nothing here is timed: waits poll a condition with a generous deadline and fail only when it
never holds.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

from materializer import Materializer, MaterializerOptions

from .background_run import wait_until
from .test_ingest import Produced, produce

prometheus_parser = pytest.importorskip("prometheus_client.parser")
from materializer.metrics import MaterializerMetrics  # noqa: E402 - needs prometheus_client

pytestmark = pytest.mark.broker

RECORDS = 1200


def _scrape(port: int) -> dict[tuple[str, tuple], float]:
    """GET /metrics: (sample name, sorted labels without topic) -> value."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    samples = {}
    for family in prometheus_parser.text_string_to_metric_families(text):
        for sample in family.samples:
            labels = dict(sample.labels)
            labels.pop("topic", None)
            samples[(sample.name, tuple(sorted(labels.items())))] = sample.value
    return samples


def _per_partition(samples, name: str) -> dict[int, float]:
    return {int(dict(labels)["partition"]): value for (n, labels), value in samples.items() if n == name}


def _wait_for(condition, what: str, timeout_s: float = 60.0):
    return wait_until(condition, timeout_s, what)


@pytest.mark.parametrize("fetch", ["replica", "consumer"])
def test_metrics_endpoint_counts_applied_records_and_lag(kafka_broker, create_topic, tmp_path, fetch):
    topic = create_topic(partitions=2, config={"cleanup.policy": "compact"})
    bootstrap = kafka_broker.bootstrap_servers
    produced = Produced()
    produce(bootstrap, topic, produced, count=RECORDS, keys=300, seed=5)
    assert produced.count == RECORDS

    materializer = Materializer(bootstrap, topic, tmp_path, options=MaterializerOptions(cleaner_threads=0, fetch=fetch))
    metrics = MaterializerMetrics(materializer, statistics_interval_ms=200)
    port = metrics.serve(0)
    with metrics, materializer:
        # Started (store reconciled, partitions assigned), nothing consumed yet: the lag is everything.
        before = _scrape(port)
        lag = _per_partition(before, "materializer_partition_lag")
        assert set(lag) == {0, 1} and sum(lag.values()) == RECORDS and all(v > 0 for v in lag.values())
        assert sum(_per_partition(before, "materializer_partition_high_watermark").values()) == RECORDS
        assert sum(_per_partition(before, "materializer_partition_next_offset").values()) == 0
        assert before[("materializer_applied_records_total", ())] == 0
        assert before[("materializer_caught_up", ())] == 0 and before[("materializer_running", ())] == 0

        started = time.monotonic()
        thread = materializer.run_in_background()
        assert materializer.wait_until_caught_up(timeout_s=60)
        after = _scrape(port)
        elapsed = time.monotonic() - started
        assert after[("materializer_applied_records_total", ())] == RECORDS
        assert after[("materializer_fetched_records_total", ())] == RECORDS
        assert after[("materializer_applied_bytes_total", ())] > 0
        assert after[("materializer_appended_bytes_total", ())] > 0
        assert _per_partition(after, "materializer_partition_lag") == {0: 0, 1: 0}
        assert sum(_per_partition(after, "materializer_partition_next_offset").values()) == RECORDS
        assert after[("materializer_caught_up", ())] == 1 and after[("materializer_running", ())] == 1
        assert after[("materializer_failed", ())] == 0
        for name in ("fetch", "append", "fsync", "apply"):  # each took time, within the run's wall time
            assert 0 < after[(f"materializer_{name}_seconds_total", ())] <= elapsed, name

        # librdkafka's statistics (every 200 ms here) reach the endpoint while the loop polls; one
        # emitted during the catch-up counts fewer messages, so wait for one that has them all.
        # The replica path fetches with kafka-python: its librdkafka client fetches nothing.
        def all_received():
            samples = _scrape(port)
            received = sum(_per_partition(samples, "materializer_librdkafka_rx_messages_total").values())
            return samples if received == RECORDS else None

        if fetch == "consumer":
            stats = _wait_for(all_received, f"a librdkafka statistics document counting {RECORDS} messages")
            assert stats[("materializer_librdkafka_statistics_total", ())] >= 1
            assert set(_per_partition(stats, "materializer_librdkafka_consumer_lag")) <= {0, 1}

        materializer.stop()
        thread.join(timeout=60)
        assert not thread.is_alive()
        assert _scrape(port)[("materializer_running", ())] == 0
    with pytest.raises(urllib.error.URLError):  # closed with the metrics: the port is released
        _scrape(port)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_cli_run_serves_metrics_until_sigterm(kafka_broker, create_topic, tmp_path):
    topic = create_topic(partitions=1)
    bootstrap = kafka_broker.bootstrap_servers
    produced = Produced()
    produce(bootstrap, topic, produced, count=300, keys=50, seed=6)
    port = _free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "materializer", "--log-format", "json", "-v", "run", "--bootstrap-servers", bootstrap,
         "--topic", topic, "--data-dir", str(tmp_path / "data"), "--metrics-port", str(port), "--no-progress"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        def caught_up():
            try:
                samples = _scrape(port)
            except (urllib.error.URLError, ConnectionError):
                return None
            return samples if samples.get(("materializer_caught_up", ())) == 1 else None

        samples = _wait_for(caught_up, "the run's metrics endpoint reporting caught_up")
        assert samples[("materializer_applied_records_total", ())] == 300
        assert samples[("materializer_ready", ())] == 1 and samples[("materializer_live", ())] == 1
        for probe in ("live", "ready"):  # the Kubernetes probes on the same port
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health/{probe}", timeout=10) as response:
                assert response.status == 200 and json.loads(response.read())["ok"] is True
        assert _per_partition(samples, "materializer_partition_lag") == {0: 0}
    finally:
        process.send_signal(signal.SIGTERM)
        stdout, stderr = process.communicate(timeout=60)
    assert process.returncode == 0, stderr
    assert f"{topic}: fetched 300 records" in stdout
    lines = [json.loads(line) for line in stderr.splitlines() if line.strip()]  # every stderr line is JSON
    assert any("serving Prometheus metrics" in line["message"] for line in lines)
    assert {"ts", "level", "logger", "message"} <= set(lines[0])
