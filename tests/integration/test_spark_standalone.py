"""The ``materializer spark`` jobs, and a ``kafkalog`` read, on a Spark standalone cluster (issue 25).

One :class:`~materializer.spark.standalone.LocalSparkCluster` (a master and two workers of one core
each, from the pip-installed PySpark) serves the whole module: executors run in JVMs the workers
launch, and their Python workers import ``materializer`` there, not in the driver. A small topic of
the session broker (three partitions, four codecs, a committed and an aborted transaction,
tombstones, headers) is copied once; then, in ONE application on the cluster and one ``local[2]``
session, the jobs behind every ``materializer spark`` command run on it (the snapshot in Parquet
and in SST, ``spark_compact``, ``materialize_available_now``) and a ``kafkalog`` read, and the
outputs are compared: Parquet rows and manifests, SST store entries, cleaned segment bytes and
checkpoints, the materialized table. The commands themselves are thin (a session on ``--master``
around one of these jobs: :mod:`materializer.cli.spark`), so the command line runs once,
``spark snapshot --format sst --master ...``, at the end of each session: it gets that session
(``getOrCreate``) and stops it. Paths are relative to the working folder, which executors
(working in the worker's ``work/<app>/<executor>``) must not resolve themselves.

An application counts as "run on the cluster" only when the master lists it as completed, both
workers have an executor folder for it, and the executors' logs show finished tasks. Each
application on the cluster costs two executor JVMs and their Python workers (seconds on two
cores), so the module runs exactly one.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from .test_ingest import Produced, produce
from .test_spark_kafkalog import _consumer_rows, _new_topic

pytestmark = pytest.mark.broker

NOW_MS = 1_800_000_000_000  # the compaction rounds' clock (delete horizons), the same for both runs
COMPACT_CONFIGS = {"segment.bytes": "16384", "delete.retention.ms": "0"}


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


def _completed_app(cluster, before: set[str]) -> str:
    """The id of the one application the cluster completed since ``before``, after checking that
    both workers ran an executor for it and its executors finished tasks."""
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
    return app_id


def _run_jobs(master: str, logs: Path, topic: str, out: Path) -> dict[str, Any]:
    """In one session on ``master``: a kafkalog read, where the tasks' Python ran, and every job
    into ``out`` (paths relative to the working folder, which is ``out``)."""
    from materializer.spark.compact import spark_compact
    from materializer.spark.jobs import snapshot, spark_session
    from materializer.spark.streaming import materialize_available_now

    out.mkdir()
    cwd = os.getcwd()
    os.chdir(out)
    spark = spark_session(master)
    try:
        logs_arg = os.path.relpath(logs)
        # kafkalog's own ``path`` is resolved where Spark plans the read (the driver JVM's working
        # folder, as for Spark's file sources), which this process's chdir above does not move
        rows = sorted((r.partition, r.offset, bytes(r.key), None if r.value is None else bytes(r.value))
                      for r in spark.read.format("kafkalog").option("path", str(logs)).option("topic", topic)
                      .option("minPartitions", "6").load().collect())

        def where(batches):
            import os
            import sys

            import pyarrow as pa

            import materializer as imported

            with open(f"/proc/{os.getppid()}/cmdline", "rb") as cmdline:
                parent = cmdline.read().replace(b"\0", b" ").decode()
            for _ in batches:
                yield pa.RecordBatch.from_pydict({"python": [sys.executable], "package": [imported.__file__],
                                                  "cwd": [os.getcwd()], "parent": [parent]})

        places = spark.range(0, 4, 1, 4).mapInArrow(where, "python string, package string, cwd string, "
                                                           "parent string").collect()
        executors = [e.host() for e in spark.sparkContext._jsc.sc().statusTracker().getExecutorInfos()]
        app_id = spark.sparkContext.applicationId
        manifests = {fmt: snapshot(spark, [logs_arg], topic, f"snapshot-{fmt}", fmt=fmt) for fmt in ("parquet", "sst")}
        compacted = spark_compact(spark, [logs_arg], topic, "compacted", configs=COMPACT_CONFIGS, to_log_end=True,
                                  now_ms=NOW_MS)
        materialize_available_now(spark, [logs_arg], topic, "table", "table-checkpoint")
        # Last: the command line, whose session is this one (getOrCreate; an application costs two
        # executor JVMs and their Python workers), stopped when the command ends.
        from click.testing import CliRunner

        from materializer.cli import main as cli_main

        command = CliRunner().invoke(cli_main, ["spark", "snapshot", "--log-dir", logs_arg, "--topic", topic, "--out",
                                                "cli-snapshot", "--format", "sst", "--master", master],
                                     catch_exceptions=False)
        assert command.exit_code == 0, command.output[-3000:]
        assert spark.sparkContext._jsc is None  # the command stopped the session it got
        return {"rows": rows, "places": places, "executors": executors, "app_id": app_id,
                "manifests": manifests, "cli_output": command.output, "compacted": [{k: v for k, v in vars(r).items() if k != "elapsed_s"}
                                                      for r in compacted]}
    finally:
        spark.stop()  # idempotent
        os.chdir(cwd)


@pytest.fixture(scope="module")
def runs(cluster, log_dir, tmp_path_factory):
    """``{"cluster": ..., "local": ...}``: :func:`_run_jobs` on the cluster (one application) and on ``local[2]``."""
    topic, _, logs = log_dir
    root = tmp_path_factory.mktemp("runs")
    before = {app["id"] for app in cluster.status()["completedapps"]}
    on_cluster = _run_jobs(cluster.master_url, logs, topic, root / "cluster")
    on_cluster["completed_app_id"] = _completed_app(cluster, before)
    on_local = _run_jobs("local[2]", logs, topic, root / "local")
    return {"cluster": {**on_cluster, "out": root / "cluster"}, "local": {**on_local, "out": root / "local"}}


def _parquet_rows(folder: Path) -> list[tuple]:
    import pyarrow.parquet as pq

    table = pq.read_table(folder)
    return sorted(zip(*(table.column(name).to_pylist() for name in sorted(table.column_names))))


def _store_entries(snapshot_dir: Path, scratch: Path) -> list[tuple[bytes, bytes]]:
    """The entries of a store that ingests the snapshot's SST files (what ``restore --from-snapshot`` does)."""
    from rocksdict import Options, Rdict

    store = Rdict(str(scratch), Options(raw_mode=True))
    try:
        store.ingest_external_file(sorted(str(f) for f in (snapshot_dir / "sst").glob("*.sst")))
        return list(store.items())
    finally:
        store.close()


def test_the_application_ran_on_the_cluster(runs, cluster):
    """The master completed the session's application; its tasks ran in one executor per worker,
    in the workers' folders, with this interpreter importing this very ``materializer``, in Python
    workers forked from :mod:`materializer.spark.worker_daemon`."""
    import materializer

    ran = runs["cluster"]
    assert ran["app_id"] == ran["completed_app_id"] and ran["app_id"].startswith("app-")
    assert len(ran["executors"]) == 3  # the driver and one executor per worker
    assert {p.python for p in ran["places"]} == {sys.executable}
    assert {p.package for p in ran["places"]} == {materializer.__file__}
    assert all(Path(p.cwd).is_relative_to(cluster.state_dir) for p in ran["places"]), ran["places"]
    # forked from the project's worker daemon (spark.python.daemon.module reaches the executors)
    assert all("-m materializer.spark.worker_daemon pyspark.worker" in p.parent for p in ran["places"])
    assert runs["local"]["app_id"].startswith("local-")


def test_kafkalog_read_on_the_cluster_equals_local_and_the_consumer(runs, log_dir):
    topic, bootstrap, _ = log_dir
    expected = sorted((p, o, k, v) for p, o, k, v, _, _ in _consumer_rows(bootstrap, topic))
    assert len(expected) == 500 + 200 + 150
    assert runs["cluster"]["rows"] == runs["local"]["rows"] == expected


def test_snapshots_on_the_cluster_equal_local(runs, tmp_path):
    """Parquet and SST snapshots: the same manifests, rows and store entries."""
    cluster, local = runs["cluster"], runs["local"]
    assert cluster["manifests"] == local["manifests"] and local["manifests"]["parquet"]["rows"] > 0
    assert sorted(local["manifests"]["sst"]["files"]) == ["0", "1", "2"]
    assert _parquet_rows(cluster["out"] / "snapshot-parquet") == _parquet_rows(local["out"] / "snapshot-parquet")
    entries = _store_entries(cluster["out"] / "snapshot-sst", tmp_path / "cluster-store")
    assert entries == _store_entries(local["out"] / "snapshot-sst", tmp_path / "local-store")
    assert len(entries) == local["manifests"]["sst"]["rows"]


def test_compaction_on_the_cluster_equals_local(runs):
    """``spark_compact``: byte for byte the same cleaned segments and checkpoints, the same results."""
    cluster, local = runs["cluster"], runs["local"]
    assert cluster["compacted"] == local["compacted"]
    assert all(r["records_written"] < r["records_read"] for r in local["compacted"])

    def files(root):
        return {str(f.relative_to(root)): f.read_bytes() for f in root.rglob("*")
                if f.is_file() and f.name not in ("_compaction.json", ".lock") and "topic-status" not in f.parts}

    cluster_files, local_files = files(cluster["out"] / "compacted"), files(local["out"] / "compacted")
    assert cluster_files.keys() == local_files.keys() and any(name.endswith(".log") for name in local_files)
    assert [name for name in cluster_files if cluster_files[name] != local_files[name]] == []


def test_materialized_table_on_the_cluster_equals_local_and_the_consumer(runs, log_dir):
    from materializer.spark.streaming import latest_version_path

    topic, bootstrap, _ = log_dir
    cluster, local = runs["cluster"], runs["local"]
    pointers = [json.loads((run["out"] / "table" / "_latest").read_text()) for run in (cluster, local)]
    assert pointers[0]["next_offsets"] == pointers[1]["next_offsets"]
    rows = _parquet_rows(latest_version_path(cluster["out"] / "table"))
    assert rows == _parquet_rows(latest_version_path(local["out"] / "table"))
    latest = {}
    for partition, _, key, value, _, _ in _consumer_rows(bootstrap, topic):
        latest[(partition, key)] = value
    # columns in name order: key, offset, partition, timestamp, value
    assert {(r[2], r[0]): r[4] for r in rows} == {k: v for k, v in latest.items() if v is not None}


def test_the_command_line_on_the_cluster_equals_local(runs, log_dir):
    """``materializer spark snapshot --format sst --master spark://...`` (paths relative to the
    working folder) in the cluster's application: the local run's manifest and store entries."""
    topic, _, _ = log_dir
    cluster, local = runs["cluster"], runs["local"]
    rows = local["manifests"]["sst"]["rows"]
    assert cluster["cli_output"] == local["cli_output"] and cluster["cli_output"].startswith(
        f"{topic}: {rows} rows into cli-snapshot")
    manifests = [json.loads((run["out"] / "cli-snapshot" / "_manifest.json").read_text()) for run in (cluster, local)]
    assert manifests[0] == manifests[1] == local["manifests"]["sst"]
    assert _store_entries(cluster["out"] / "cli-snapshot", cluster["out"] / "cli-store") == _store_entries(
        local["out"] / "cli-snapshot", local["out"] / "cli-store")
