"""SIGTERM stops `materializer run` cleanly, and client settings reach librdkafka (issue 9, items 2 and 4).

SIGTERM is what systemd and Kubernetes send: the run finishes its batch, prints its summary, exits
0 and writes the clean-shutdown marker, so the next start runs no recovery and rebuilds no index.
``-X`` and ``--command-config`` settings are passed to librdkafka: an unknown one is refused by
librdkafka itself, named in one error line.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest

from materializer.storage.log_loader import CLEAN_SHUTDOWN_FILE

from .test_ingest import Produced, produce

pytestmark = pytest.mark.broker


def _run(bootstrap, topic, data_dir, *extra):
    return [sys.executable, "-m", "materializer", "-v", "run", "--bootstrap-servers", bootstrap, "--topic", topic,
            "--data-dir", str(data_dir), *extra]


def test_sigterm_stops_run_cleanly_and_the_next_start_recovers_nothing(kafka_broker, create_topic, tmp_path):
    topic = create_topic(partitions=2, config={"cleanup.policy": "compact"})
    bootstrap = kafka_broker.bootstrap_servers
    produce(bootstrap, topic, Produced(), count=2000, keys=300, seed=1)
    process = subprocess.Popen(_run(bootstrap, topic, tmp_path, "--config", "segment.bytes=8192"),
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not list(tmp_path.glob(f"{topic}-*/*.log")) or sum(
            p.stat().st_size for p in tmp_path.glob(f"{topic}-*/*.log")) < 20_000:
        assert time.monotonic() < deadline and process.poll() is None, "run did not ingest"
        time.sleep(0.2)
    time.sleep(1.0)
    process.send_signal(signal.SIGTERM)
    stdout, stderr = process.communicate(timeout=60)
    assert process.returncode == 0, stderr[-2000:]
    assert "SIGTERM: finishing the current batch" in stderr and "Traceback" not in stderr
    assert stdout.startswith(f"{topic}: fetched 2000 records")
    assert (tmp_path / CLEAN_SHUTDOWN_FILE).exists()

    again = subprocess.run(_run(bootstrap, topic, tmp_path, "--until-caught-up", "--config", "segment.bytes=8192"),
                           capture_output=True, text=True, timeout=120)
    assert again.returncode == 0, again.stderr[-2000:]
    assert "Recovering" not in again.stderr and "rebuilding index" not in again.stderr.lower()
    assert "corrupt" not in again.stderr.lower()
    assert again.stdout.startswith(f"{topic}: fetched 0 records")


def test_client_settings_reach_librdkafka(kafka_broker, create_topic, tmp_path):
    topic = create_topic(partitions=1)
    bootstrap = kafka_broker.bootstrap_servers
    properties = tmp_path / "client.properties"
    properties.write_text("client.id=materializer-test\nno.such.librdkafka.setting=1\n")
    result = subprocess.run(_run(bootstrap, topic, tmp_path / "data", "--until-caught-up", "--command-config",
                                 str(properties)), capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stderr[-2000:]
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("error: ") and "no.such.librdkafka.setting" in last
    ok = subprocess.run(_run(bootstrap, topic, tmp_path / "data", "--until-caught-up", "--command-config",
                             str(properties), "-X", "no.such.librdkafka.setting=", "-X", "client.id=other"),
                        capture_output=True, text=True, timeout=120)
    assert ok.returncode == 2  # an empty value is still passed, and still refused: -X wins over the file
    properties.write_text("client.id=materializer-test\n")
    fine = subprocess.run(_run(bootstrap, topic, tmp_path / "data", "--until-caught-up", "--command-config",
                               str(properties), "-X", "fetch.wait.max.ms=50"), capture_output=True, text=True,
                          timeout=120)
    assert fine.returncode == 0, fine.stderr[-2000:]
