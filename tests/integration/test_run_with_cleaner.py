"""``materializer run`` with the background log cleaner on a real broker's compacted topic.

1. ``run --until-caught-up`` with small local segments and the cleaner on: whatever it cleaned
   keeps Kafka's invariants, and ``export`` equals the latest value per key as a plain
   read_committed consumer sees it.
2. ``run`` as a process (no ``--until-caught-up``) over more updates: the cleaner compacts
   everything ingested before into non-active segments while it runs; Ctrl-C (SIGINT) stops it
   cleanly (exit 130, no ``.cleaned``/``.swap`` files, clean-shutdown marker); the local log shrank,
   the same invariants hold, ``export`` still equals the consumer's view and a store rebuilt from
   the compacted log equals it too.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from materializer.adapters.rocksdb_store import StateStore
from materializer.cli import CLEANER_LOG_FILE, main
from materializer.apply.committed import rebuild_store_from_logs
from materializer.storage.checkpoint import CLEANER_OFFSET_CHECKPOINT, read_offset_checkpoint
from materializer.storage.log import Log
from materializer.storage.log_config import LogConfig
from materializer.storage.log_loader import CLEAN_SHUTDOWN_FILE

from ..unit.materializer.test_background_cleaner import _assert_cleaned_below_checkpoint
from .broker_reads import latest_per_key, read_topic
from .test_ingest import Produced, produce

pytestmark = pytest.mark.broker

PARTITIONS = 2
LOCAL_CONFIGS = ["--config", "segment.bytes=8192", "--config", "min.cleanable.dirty.ratio=0.01"]


def _run_args(bootstrap: str, topic: str, data_dir: Path) -> list[str]:
    return ["run", "--bootstrap-servers", bootstrap, "--topic", topic, "--data-dir", str(data_dir),
            "--batch-size", "500", *LOCAL_CONFIGS, "--cleaner-backoff-ms", "20", "--cleaner-threads", "1",
            "--dedupe-buffer-size", str(4 << 20)]


def _export(data_dir: Path, topic: str) -> dict[bytes, tuple[int, int, bytes]]:
    result = CliRunner().invoke(main, ["export", "--data-dir", str(data_dir), "--topic", topic])
    assert result.exit_code == 0, result.output
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    return {line["key"].encode(): (line["partition"], line["offset"],
                                   line["value"].encode() if "value" in line else base64.b64decode(line["value_b64"]))
            for line in lines}


def _check_local_logs(data_dir: Path, topic: str, expected: dict[bytes, tuple[int, int, bytes]]) -> None:
    """Kafka's cleaning invariants below each checkpoint, and a store rebuilt from the local logs equals ``expected``."""
    checkpoints = read_offset_checkpoint(data_dir / CLEANER_OFFSET_CHECKPOINT) \
        if (data_dir / CLEANER_OFFSET_CHECKPOINT).exists() else {}
    assert not [p for p in data_dir.rglob("*") if p.suffix in (".cleaned", ".swap")]
    now_ms = time.time_ns() // 1_000_000
    logs = {p: Log.open(data_dir / f"{topic}-{p}", LogConfig(), had_clean_shutdown=True) for p in range(PARTITIONS)}
    try:
        for partition, log in logs.items():
            checkpoint = checkpoints.get((topic, partition), log.log_start_offset)
            assert log.log_start_offset <= checkpoint <= log.log_end_offset
            _assert_cleaned_below_checkpoint(log, checkpoint, now_ms)
        with StateStore(data_dir / "rebuilt-store") as store:
            rebuild_store_from_logs(store, logs)
            assert {k: (v.partition, v.offset, v.value) for k, v in store.items()} == expected
    finally:
        for log in logs.values():
            log.close()
        StateStore.destroy(data_dir / "rebuilt-store")


def test_run_until_caught_up_and_as_a_process_with_the_cleaner(kafka_broker, create_topic, tmp_path):
    bootstrap = kafka_broker.bootstrap_servers
    topic = create_topic(partitions=PARTITIONS, config={"cleanup.policy": "compact"})
    produced = Produced()
    produce(bootstrap, topic, produced, count=8000, keys=150, codec="lz4", seed=11, tombstone_ratio=0.1)

    # 1. run --until-caught-up with the cleaner on
    result = CliRunner().invoke(main, [*_run_args(bootstrap, topic, tmp_path), "--until-caught-up"])
    assert result.exit_code == 0, result.output
    assert f"{topic}: fetched 8000 records" in result.stdout
    expected = latest_per_key(read_topic(bootstrap, topic, PARTITIONS))
    assert expected == produced.expected_state()
    assert _export(tmp_path, topic) == expected
    _check_local_logs(tmp_path, topic, expected)
    first_end = {p: max(o for (pp, o, _) in produced.latest.values() if pp == p) + 1 for p in range(PARTITIONS)}

    # 2. more updates; `materializer run` as a process until the cleaner caught up with part 1, then Ctrl-C
    produce(bootstrap, topic, produced, count=8000, keys=150, codec="zstd", seed=12, tombstone_ratio=0.1)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    process = subprocess.Popen([sys.executable, "-m", "materializer", *_run_args(bootstrap, topic, tmp_path)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True)
    checkpoint_path = tmp_path / CLEANER_OFFSET_CHECKPOINT
    try:
        deadline = time.monotonic() + 25
        cleaned = False
        while time.monotonic() < deadline and process.poll() is None:
            if checkpoint_path.exists():
                checkpoints = read_offset_checkpoint(checkpoint_path)
                if all(checkpoints.get((topic, p), 0) >= first_end[p] for p in range(PARTITIONS)):
                    cleaned = True
                    break
            time.sleep(0.05)
        assert process.poll() is None, process.communicate()
        process.send_signal(signal.SIGINT)
        stdout, stderr = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert cleaned, f"the cleaner did not clean past {first_end} while running; stderr:\n{stderr}"
    assert process.returncode == 130, stderr  # a clean stop, reported as the interruption it is
    assert "SIGINT: finishing the current batch" in stderr and "; cleaner: " in stdout, (stdout, stderr)
    assert stderr.endswith("error: interrupted (SIGINT); the run stopped after its current batch (summary above)\n")
    assert (tmp_path / CLEAN_SHUTDOWN_FILE).exists()
    report = (tmp_path / CLEANER_LOG_FILE).read_text()
    assert f"cleaned log {topic}-0 (dirty section = [" in report and "% size reduction" in report

    # finish ingesting whatever the interrupted run had not fetched yet, then compare everything
    result = CliRunner().invoke(main, [*_run_args(bootstrap, topic, tmp_path), "--until-caught-up"])
    assert result.exit_code == 0, result.output
    expected = latest_per_key(read_topic(bootstrap, topic, PARTITIONS))
    assert expected == produced.expected_state()
    assert _export(tmp_path, topic) == expected
    _check_local_logs(tmp_path, topic, expected)
    records_kept = 0
    for partition in range(PARTITIONS):
        with Log.open(tmp_path / f"{topic}-{partition}", LogConfig(), had_clean_shutdown=True) as log:
            records_kept += sum(1 for _ in log.read_records())
    assert records_kept < 16000 // 2  # the log shrank: far fewer records kept than were produced
