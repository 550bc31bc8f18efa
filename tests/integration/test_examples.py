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


def _warm_up(bootstrap: str, data_dir: Path, produce: int) -> str:
    result = subprocess.run([sys.executable, str(EXAMPLES / "service" / "cache_warmup.py"), "--bootstrap-servers",
                             bootstrap, "--topic", "example-cache-skus", "--data-dir", str(data_dir),
                             "--produce", str(produce)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout


def test_cache_warmup_example_restores_locally_and_fetches_only_the_tail(kafka_broker, tmp_path):
    first = _warm_up(kafka_broker.bootstrap_servers, tmp_path / "cache", 5000)
    assert ": 500 live keys; fetched 5000 records from the broker" in first
    second = _warm_up(kafka_broker.bootstrap_servers, tmp_path / "cache", 300)
    assert ": 500 live keys; fetched 300 records from the broker, replayed 0 from the local log" in second
    # The second producer run wrote sku-00007 last at i = 277 (300 records over 30 keys: i % 30 == 7).
    assert "sku-00007 -> {'sku': 'sku-00007', 'price_cents': 277," in second
