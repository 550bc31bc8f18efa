"""Streaming kafkalog + `spark materialize` over a data dir that `materializer run` is filling (issue 8, items 2-3).

The broker sees one consumer (the run); the Spark job only reads the run's partition folders, while
the run's background cleaner compacts them. The job is SIGKILLed once it has written a version,
records keep arriving, and a restarted job (--available-now) must end with exactly the latest
value per (partition, key) that a read_committed consumer reads: nothing lost, nothing twice.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest

from materializer.spark.streaming import latest_version_path

from .broker_reads import latest_per_partition_key, read_topic
from .test_ingest import Produced, produce

pytestmark = pytest.mark.broker


def _materializer(*args, **kwargs):
    return subprocess.Popen([sys.executable, "-m", "materializer", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **kwargs)


def test_streaming_materialization_killed_and_restarted_loses_and_duplicates_nothing(kafka_broker, create_topic,
                                                                                   tmp_path):
    from materializer.spark.jobs import spark_session

    topic = create_topic(partitions=2, config={"cleanup.policy": "compact", "segment.bytes": "1048576"})
    bootstrap = kafka_broker.bootstrap_servers
    produced = Produced()
    produce(bootstrap, topic, produced, count=3000, keys=400, seed=1)
    data_dir, out, checkpoint = tmp_path / "data", tmp_path / "table", tmp_path / "checkpoint"
    run = _materializer("run", "--bootstrap-servers", bootstrap, "--topic", topic, "--data-dir", str(data_dir),
                        "--no-progress", "--config", "segment.bytes=32768", "--config", "min.cleanable.dirty.ratio=0.01",
                        "--cleaner-backoff-ms", "200")
    job_args = ["spark", "materialize", "--log-dir", str(data_dir), "--topic", topic, "--out", str(out),
                "--checkpoint", str(checkpoint), "--master", "local[2]"]
    try:
        deadline = time.monotonic() + 60
        while not list(data_dir.glob(f"{topic}-*/*.log")):
            assert run.poll() is None and time.monotonic() < deadline, "run did not start"
            time.sleep(0.2)
        job = _materializer(*job_args, "--trigger-interval-s", "1")
        _wait_for_version(job, out, 0)
        produce(bootstrap, topic, produced, count=3000, keys=400, seed=2)  # a batch only runs for new data
        _wait_for_version(job, out, 1)
        produce(bootstrap, topic, produced, count=1500, keys=400, seed=3)
        time.sleep(1.5)  # likely inside a batch now
        job.send_signal(signal.SIGKILL)
        job.wait(timeout=60)
        produce(bootstrap, topic, produced, count=1000, keys=400, seed=4)
        expected = latest_per_partition_key(read_topic(bootstrap, topic, 2))
        deadline = time.monotonic() + 120
        while not _run_caught_up(data_dir, topic, expected):
            assert run.poll() is None and time.monotonic() < deadline, "run did not catch up"
            time.sleep(0.5)
    finally:
        run.send_signal(signal.SIGTERM)
        run.communicate(timeout=60)

    restarted = subprocess.run([sys.executable, "-m", "materializer", *job_args, "--available-now"],
                               capture_output=True, text=True, timeout=600)
    assert restarted.returncode == 0, restarted.stderr[-3000:]
    spark = spark_session("local[1]")
    try:
        rows = spark.read.parquet(str(latest_version_path(out))).collect()
    finally:
        spark.stop()
    table = [((r.partition, bytes(r.key)), bytes(r.value)) for r in rows]
    assert len(table) == len(dict(table)), "a (partition, key) appears twice"
    assert dict(table) == expected


def _wait_for_version(job, out, version: int, timeout_s: float = 240) -> None:
    deadline = time.monotonic() + timeout_s
    while latest_version_path(out) is None or int(latest_version_path(out).name[2:]) < version:
        assert job.poll() is None, job.communicate()[1][-3000:]
        assert time.monotonic() < deadline, f"the streaming job wrote no version {version}"
        time.sleep(0.2)


def _run_caught_up(data_dir, topic, expected) -> bool:
    """The run's store reflects the broker's high watermark of both partitions (read-only peek)."""
    from materializer.adapters.errors import StoreError
    from materializer.storage.errors import IncompleteDataDirError
    from materializer.view import MaterializedView

    try:
        with MaterializedView.open(data_dir, topic) as view:
            state = {(e.partition, e.key): e.value for e in view.items()}
    except (StoreError, IncompleteDataDirError):  # no store yet, or its first load is not done
        return False
    return state == expected
