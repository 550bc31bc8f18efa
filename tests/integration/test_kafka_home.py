"""``KAFKA_HOME`` (an unpacked Apache Kafka distribution) runs the local broker instead of the Maven
download (:func:`materializer.local.kafka_jars.kafka_lib`).

The distribution is assembled from the jars the Maven download cached (same file names as a
distribution's ``libs/``), linked into ``KAFKA_HOME/libs``; the Maven cache the commands see is an
empty folder, so a broker that starts and answers ran from ``KAFKA_HOME``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient

from materializer.local.kafka_jars import KAFKA_VERSION, ensure_kafka_jars

pytestmark = pytest.mark.broker


def _kafka_home(root: Path) -> Path:
    home = root / f"kafka_2.13-{KAFKA_VERSION}"
    (home / "libs").mkdir(parents=True)
    (home / "bin").mkdir()
    for jar in ensure_kafka_jars(KAFKA_VERSION).glob("*.jar"):
        (home / "libs" / jar.name).symlink_to(jar)
    return home


def _materializer(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "materializer", *args], capture_output=True, text=True, cwd=cwd,
                          env={**os.environ, **env}, timeout=180)


def test_broker_start_runs_the_distribution_in_kafka_home(tmp_path: Path) -> None:
    home = _kafka_home(tmp_path)
    empty_cache = tmp_path / "cache"
    env = {"KAFKA_HOME": str(home), "KAFKA_MATERIALIZER_CACHE": str(empty_cache)}
    state_dir = tmp_path / "broker"
    started = _materializer(["broker", "start", "--state-dir", str(state_dir), "--test-config"], env, tmp_path)
    try:
        assert started.returncode == 0, started.stderr
        bootstrap = started.stdout.strip()
        assert f"Apache Kafka {KAFKA_VERSION} broker started" in started.stderr
        metadata = AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=30)
        assert list(metadata.brokers) == [1]
        pid = int(_materializer(["broker", "status", "--state-dir", str(state_dir), "--json"], env, tmp_path)
                  .stdout.split('"pid": ')[1].split(",")[0])
        command_line = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        assert f"{home / 'libs'}/*".encode() in command_line
        assert not (empty_cache / f"kafka-{KAFKA_VERSION}" / "lib").exists()  # no Maven resolution
    finally:
        stopped = _materializer(["broker", "stop", "--state-dir", str(state_dir)], env, tmp_path)
    assert stopped.returncode == 0, stopped.stderr


def test_a_folder_that_is_not_a_distribution_is_one_error_line(tmp_path: Path) -> None:
    not_kafka = tmp_path / "not-kafka"
    (not_kafka / "libs").mkdir(parents=True)
    (not_kafka / "libs" / "something-1.0.jar").write_bytes(b"")
    done = _materializer(["broker", "start", "--state-dir", str(tmp_path / "b")], {"KAFKA_HOME": str(not_kafka)},
                         tmp_path)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr == (f"error: KAFKA_HOME={not_kafka} does not look like an unpacked Apache Kafka distribution "
                           f"(kafka_2.13-X.Y.Z.tgz): no broker jar libs/kafka_<scala>-<version>.jar in "
                           f"{not_kafka / 'libs'}\n")


def test_another_version_than_kafka_home_holds_is_refused(tmp_path: Path) -> None:
    home = _kafka_home(tmp_path)
    done = _materializer(["broker", "start", "--state-dir", str(tmp_path / "b"), "--kafka-version", "3.9.1"],
                         {"KAFKA_HOME": str(home)}, tmp_path)
    assert done.returncode == 2
    assert done.stderr.startswith(f"error: KAFKA_HOME={home} holds Apache Kafka {KAFKA_VERSION}, not the 3.9.1 asked for")
