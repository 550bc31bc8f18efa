"""Every example runs, as a user would run it, and prints what it promises."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.broker

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_materialize_topic_example(kafka_broker, tmp_path):
    result = subprocess.run([sys.executable, str(EXAMPLES / "materialize_topic.py"), "--bootstrap-servers",
                             kafka_broker.bootstrap_servers, "--data-dir", str(tmp_path / "data")],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    first, second = [line for line in result.stdout.splitlines() if line.startswith("fetched ")]
    assert first.startswith("fetched 1000 records") and second.startswith("fetched 200 records")
    assert "local log folders: ['example-user-emails-0', 'example-user-emails-1']" in result.stdout


def test_spark_snapshot_example(tmp_path):
    result = subprocess.run([sys.executable, str(EXAMPLES / "spark" / "snapshot_log_dir.py"), "--out",
                             str(tmp_path)], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "warm store: " in result.stdout and "equal to the snapshot: True" in result.stdout
    live = int(result.stdout.split("Parquet snapshot: ")[1].split(" live keys")[0])
    assert 300 < live <= 400  # 400 SKUs, every 11th update a tombstone; the aborted transaction never counts
