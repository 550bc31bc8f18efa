"""Every ``materializer spark`` command, and a ``kafkalog`` read, on a Spark standalone cluster (issue 25).

One :class:`~materializer.spark.standalone.LocalSparkCluster` (a master and two workers of one core
each, from the pip-installed PySpark) serves the whole module: executors run in JVMs the workers
launch, and their Python workers import ``materializer`` there, not in the driver. Each command
(``spark snapshot`` in Parquet and in SST, ``spark compact``, ``spark materialize
--available-now``) runs through the CLI with ``--master spark://...`` and with ``--master local[2]``
on a copy of a small topic's partition folders from the session broker (three partitions, four
codecs, a committed and an aborted transaction, tombstones, headers); the outputs are compared
(Parquet rows, SST store entries, cleaned segment bytes and checkpoints, the materialized table).
The cluster runs use paths relative to the test's working folder, which executors (whose working
folder is the worker's ``work/<app>/<executor>``) must not resolve themselves.

A run counts as "on the cluster" only when the master lists its application as completed, both
workers have an executor folder for it, and the executors' logs show finished tasks.
"""

from __future__ import annotations

import json
import os
import shutil
import time
import uuid
from pathlib import Path

import pytest
from click.testing import CliRunner

from materializer.cli import main as cli_main

from .test_ingest import Produced, produce
from .test_spark_kafkalog import _consumer_rows, _new_topic

pytestmark = pytest.mark.broker

NOW_MS = 1_800_000_000_000  # the compaction rounds' clock (delete horizons), the same for both runs


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    from materializer.spark.standalone import LocalSparkCluster

    with LocalSparkCluster(tmp_path_factory.mktemp("spark-standalone"), workers=2, cores_per_worker=1) as started:
        yield started


@pytest.fixture(scope="module")
def log_dir(kafka_broker, tmp_path_factory):
    """A copy of a small topic's partition folders (both masters read the very same files)."""
    topic = f"standalone-{uuid.uuid4().hex[:8]}"
    bootstrap = kafka_broker.bootstrap_servers
    _new_topic(kafka_broker, topic, 3)
    produced = Produced()
    produce(bootstrap, topic, produced, count=500, keys=80, codec="lz4", seed=1)
    produce(bootstrap, topic, produced, count=200, keys=80, codec="zstd", seed=2, transactional_id="sa-commit")
    produce(bootstrap, topic, produced, count=150, keys=80, codec="gzip", seed=3, transactional_id="sa-abort",
            abort=True)
    produce(bootstrap, topic, produced, count=150, keys=80, codec="none", seed=4)
    copy = tmp_path_factory.mktemp("logs")
    for p in range(3):
        shutil.copytree(kafka_broker.log_dirs / f"{topic}-{p}", copy / f"{topic}-{p}")
    return topic, bootstrap, copy


def _cli(*args: str) -> str:
    result = CliRunner().invoke(cli_main, list(args), catch_exceptions=False)
    assert result.exit_code == 0, result.output[-3000:]
    return result.output


def _on_cluster(cluster, run):
    """Run ``run()`` and return (its result, the id of the one application it ran on the cluster),
    after checking that both workers ran an executor for it and the executors finished tasks."""
    before = {app["id"] for app in cluster.status()["completedapps"]}
    result = run()
    deadline = time.monotonic() + 20
    while True:
        new = [app for app in cluster.status()["completedapps"] if app["id"] not in before]
        if new or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert len(new) == 1, f"expected one application completed on {cluster.master_url}, got {new}"
    app_id = new[0]["id"]
    executors = cluster.executor_dirs(app_id)
    assert {d.parent.parent.parent.name for d in executors} == {"worker-0", "worker-1"}, executors
    finished = sum((d / "stderr").read_text(errors="replace").count("Finished task") for d in executors)
    assert finished > 0, f"no executor of {app_id} finished a task"
    return result, app_id


def _parquet_rows(folder: Path) -> list[tuple]:
    import pyarrow.parquet as pq

    table = pq.read_table(folder)
    return sorted(zip(*(table.column(name).to_pylist() for name in sorted(table.column_names))))


def test_kafkalog_read_on_the_cluster_equals_local(cluster, log_dir):
    """The same rows on both masters (and as a read_committed consumer); the cluster's tasks ran in
    two executors of the two workers, whose Python workers import this very ``materializer``."""
    import materializer
    from materializer.spark.jobs import spark_session

    topic, bootstrap, logs = log_dir

    def rows(master):
        spark = spark_session(master)
        try:
            found = sorted((r.partition, r.offset, bytes(r.key), None if r.value is None else bytes(r.value))
                           for r in spark.read.format("kafkalog").option("path", str(logs)).option("topic", topic)
                           .option("minPartitions", "6").load().collect())

            def where(batches):
                import os
                import sys

                import pyarrow as pa

                import materializer as imported

                for _ in batches:
                    yield pa.RecordBatch.from_pydict({"python": [sys.executable], "package": [imported.__file__],
                                                      "cwd": [os.getcwd()]})

            places = spark.range(0, 4, 1, 4).mapInArrow(where, "python string, package string, cwd string").collect()
            executors = [e.host() for e in spark.sparkContext._jsc.sc().statusTracker().getExecutorInfos()]
            return found, places, spark.sparkContext.applicationId, executors
        finally:
            spark.stop()

    (cluster_rows, places, app_id, executors), completed = _on_cluster(cluster, lambda: rows(cluster.master_url))
    assert app_id == completed and app_id.startswith("app-")
    assert len(executors) == 3  # the driver and one executor per worker
    import sys

    assert {p.python for p in places} == {sys.executable} and {p.package for p in places} == {materializer.__file__}
    assert all(Path(p.cwd).is_relative_to(cluster.state_dir) for p in places), places  # the workers' work dirs
    local_rows, _, local_id, _ = rows("local[2]")
    assert local_id.startswith("local-")
    assert cluster_rows == local_rows
    expected = sorted((p, o, k, v) for p, o, k, v, _, _ in _consumer_rows(bootstrap, topic))
    assert cluster_rows == expected and len(expected) == 500 + 200 + 150


def test_snapshot_commands_on_the_cluster_equal_local(cluster, log_dir, tmp_path, monkeypatch):
    """``spark snapshot`` (Parquet) and ``spark snapshot --format sst``: the same rows, manifests
    and store entries from both masters. The cluster runs name their paths relative to the cwd."""
    from rocksdict import Options, Rdict

    topic, _, logs = log_dir
    monkeypatch.chdir(tmp_path)
    for fmt in ("parquet", "sst"):
        _on_cluster(cluster, lambda fmt=fmt: _cli("spark", "snapshot", "--log-dir", os.path.relpath(logs), "--topic",
                                                  topic, "--out", f"cluster-{fmt}", "--format", fmt,
                                                  "--master", cluster.master_url))
        _cli("spark", "snapshot", "--log-dir", str(logs), "--topic", topic, "--out", str(tmp_path / f"local-{fmt}"),
             "--format", fmt, "--master", "local[2]")
    manifests = {name: json.loads((tmp_path / name / "_manifest.json").read_text())
                 for name in ("cluster-parquet", "local-parquet", "cluster-sst", "local-sst")}
    assert manifests["cluster-parquet"] == manifests["local-parquet"] and manifests["local-parquet"]["rows"] > 0
    assert manifests["cluster-sst"] == manifests["local-sst"] and sorted(manifests["local-sst"]["files"]) == ["0", "1",
                                                                                                           "2"]
    assert _parquet_rows(tmp_path / "cluster-parquet") == _parquet_rows(tmp_path / "local-parquet")

    def store_entries(name):
        store = Rdict(str(tmp_path / f"{name}-store"), Options(raw_mode=True))
        try:
            store.ingest_external_file(sorted(str(f) for f in (tmp_path / name / "sst").glob("*.sst")))
            return list(store.items())
        finally:
            store.close()

    entries = store_entries("cluster-sst")
    assert entries == store_entries("local-sst") and len(entries) == manifests["local-sst"]["rows"]


def test_compact_command_on_the_cluster_equals_local(cluster, log_dir, tmp_path, monkeypatch):
    """``spark compact``: byte for byte the same cleaned segments, checkpoints and results."""
    topic, _, logs = log_dir
    monkeypatch.chdir(tmp_path)
    args = ["spark", "compact", "--topic", topic, "--to-log-end", "--now-ms", str(NOW_MS),
            "--config", "segment.bytes=16384", "--config", "delete.retention.ms=0"]
    cluster_out, _ = _on_cluster(cluster, lambda: _cli(*args, "--log-dir", os.path.relpath(logs), "--out", "cluster",
                                                       "--master", cluster.master_url))
    local_out = _cli(*args, "--log-dir", str(logs), "--out", str(tmp_path / "local"), "--master", "local[2]")
    assert cluster_out.replace("cluster", "OUT") == local_out.replace(str(tmp_path / "local"), "OUT")

    def files(root):
        return {str(f.relative_to(root)): f.read_bytes() for f in root.rglob("*")
                if f.is_file() and f.name not in ("_compaction.json", ".lock") and "topic-status" not in f.parts}

    cluster_files, local_files = files(tmp_path / "cluster"), files(tmp_path / "local")
    assert cluster_files.keys() == local_files.keys() and any(name.endswith(".log") for name in local_files)
    assert [n for n in cluster_files if cluster_files[n] != local_files[n]] == []

    def results(root):
        return [{k: v for k, v in r.items() if k != "elapsed_s"}
                for r in json.loads((root / "_compaction.json").read_text())]

    assert results(tmp_path / "cluster") == results(tmp_path / "local")
    assert all(r["records_written"] < r["records_read"] for r in results(tmp_path / "local"))


def test_materialize_command_on_the_cluster_equals_local(cluster, log_dir, tmp_path, monkeypatch):
    """``spark materialize --available-now``: the same latest table and next offsets."""
    topic, bootstrap, logs = log_dir
    monkeypatch.chdir(tmp_path)
    _on_cluster(cluster, lambda: _cli("spark", "materialize", "--log-dir", os.path.relpath(logs), "--topic", topic, "--out",
                                      "cluster", "--checkpoint", "cluster-ck", "--available-now",
                                      "--master", cluster.master_url))
    _cli("spark", "materialize", "--log-dir", str(logs), "--topic", topic, "--out", str(tmp_path / "local"),
         "--checkpoint", str(tmp_path / "local-ck"), "--available-now", "--master", "local[2]")
    from materializer.spark.streaming import latest_version_path

    pointers = [json.loads((tmp_path / name / "_latest").read_text()) for name in ("cluster", "local")]
    assert pointers[0]["next_offsets"] == pointers[1]["next_offsets"]
    cluster_rows = _parquet_rows(latest_version_path(tmp_path / "cluster"))
    assert cluster_rows == _parquet_rows(latest_version_path(tmp_path / "local"))
    latest = {}
    for partition, _, key, value, _, _ in _consumer_rows(bootstrap, topic):
        latest[(partition, key)] = value
    # columns sorted by name: key, offset, partition, timestamp, value
    assert {(r[2], r[0]): r[4] for r in cluster_rows} == {k: v for k, v in latest.items() if v is not None}
