"""The data pipeline on Spark: a session with ``kafkalog`` registered, and the snapshot job.

``snapshot`` turns a topic's partition folders (a broker's log dir, a copy, or a materializer data
dir) into the latest value per (partition, key) under Kafka's compaction rules, in Parquet, with
no broker::

    materializer spark snapshot --log-dir /backups/kafka-logs --topic prices --out /tmp/prices-snapshot

What a key keeps is what Kafka's cleaner leaves for a read_committed consumer once every segment
is cleaned: the record with the highest offset for the key in its partition (partitions are
independent: the same key in two partitions gives two rows), aborted transactions and control
batches never count, and a key whose latest record is a tombstone is dropped (``keep_tombstones``
keeps it as a row with a null value, as the cleaner keeps a tombstone until its delete horizon).
``_manifest.json`` beside the Parquet files records, per partition, the next offset the snapshot
reflects (a consumer resumes there).

``--format sst`` writes, on the executors, one sorted RocksDB SST file per Kafka partition in the
state store's own key/value layout (``sst/partition-<p>.sst``); ``materializer restore
--from-snapshot OUT`` ingests them into a new store (RocksDB ``IngestExternalFile``: no per-key
writes) with the manifest's next offsets, and ``materializer run`` resumes fetching there.

The ``materializer spark`` commands over these jobs live in :mod:`materializer.cli.spark`.

Mirrors Kafka's ``LogCleaner`` result (latest offset per key wins) over ``read_committed`` reads.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["executor_error", "snapshot", "spark_session"]


def spark_session(master: str = "local[2]", app_name: str = "kafka-materializer", *, kafka_connector: bool = False,
                  class_sharing: bool = True) -> SparkSession:
    """A ``SparkSession`` with the ``kafkalog`` data source registered.

    The UI and console progress bars are off; on a ``local`` master, shuffles use
    ``2 x cores`` partitions (at least 4) instead of Spark's 200.

    Python workers run this interpreter (``PYSPARK_PYTHON`` defaults to ``sys.executable``), so they
    import the same ``materializer``. On a cluster (``spark://...``: executors in other JVMs, other
    folders, maybe other nodes) that path must hold the same environment on every node, and the
    jobs hand executors absolute paths only (docs/spark.md, "On a standalone cluster"). Python
    workers fork from :mod:`materializer.spark.worker_daemon` (``spark.python.daemon.module``), which has
    pyarrow and the kafkalog reader imported already and keeps PySpark's bundled zips and jars off
    ``sys.path`` (on Python 3.11 they cost every task a re-read of their directories). That
    setting covers every Python UDF of the session, so executors need this package installed (as
    they do to read ``kafkalog``); nothing is started or warmed up before the first job.

    ``kafka_connector=True`` also puts Spark's own Kafka connector (``format("kafka")``, resolved
    once with Maven into the cache by :mod:`materializer.spark.connector_jars`) in
    ``spark.jars``. It only takes effect when this call starts the JVM: an already running session
    is returned as it is.

    ``class_sharing=True`` (the default, unless ``spark.driver.extraJavaOptions`` is set in the
    environment's Spark defaults) starts the driver JVM with a class-data-sharing archive of
    Spark's classes (:mod:`materializer.spark.class_sharing`): the first session writes
    it when its process exits, later ones start and run their first job about a third faster.

    Raises:
        ImportError: pyspark (the ``spark`` extra) is not installed.
        SparkConnectorProvisioningError: ``kafka_connector`` and Maven cannot resolve the connector.
    """
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    from materializer.spark.source import KafkaLogDataSource
    from materializer.spark.worker_daemon import DAEMON_MODULE

    builder = (SparkSession.builder.master(master).appName(app_name)
               .config("spark.python.daemon.module", DAEMON_MODULE)
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.session.timeZone", "UTC"))
    if master.startswith("local"):
        # 200 shuffle partitions (Spark's default, sized for clusters) cost more in task overhead
        # than the shuffles of these jobs on one machine; streaming queries cannot coalesce them.
        builder = builder.config("spark.sql.shuffle.partitions", str(max(4, 2 * (os.cpu_count() or 2))))
    jars: list[str] = []
    if kafka_connector:
        from materializer.spark.connector_jars import spark_kafka_connector_jars

        jars = [str(jar) for jar in spark_kafka_connector_jars()]
        builder = builder.config("spark.jars", ",".join(jars))
    dump = None
    if class_sharing and SparkContext._active_spark_context is None and not _user_driver_java_options():
        import pyspark

        from materializer.spark.class_sharing import driver_java_options

        options, dump = driver_java_options(pyspark.__version__, jars)
        if options:
            builder = builder.config("spark.driver.extraJavaOptions", options)
    session = builder.getOrCreate()
    if dump is not None:
        from materializer.spark.class_sharing import note_driver_pid

        process = getattr(session.sparkContext._gateway, "proc", None)
        if process is not None:
            note_driver_pid(dump, process.pid)
    session.dataSource.register(KafkaLogDataSource)
    return session


def _user_driver_java_options() -> bool:
    """True when the user passes driver JVM options already (``PYSPARK_SUBMIT_ARGS`` or
    ``spark-defaults.conf``): theirs win, no archive is added."""
    if "extraJavaOptions" in os.environ.get("PYSPARK_SUBMIT_ARGS", ""):
        return True
    conf_dir = os.environ.get("SPARK_CONF_DIR") or (Path(os.environ["SPARK_HOME"]) / "conf"
                                                   if os.environ.get("SPARK_HOME") else None)
    if conf_dir is None:
        return False
    try:
        return "spark.driver.extraJavaOptions" in (Path(conf_dir) / "spark-defaults.conf").read_text()
    except OSError:
        return False


def snapshot(spark: SparkSession, log_dirs: list[Path | str], topic: str, out: Path | str, *,
             keep_tombstones: bool = False, mode: str = "error", fmt: str = "parquet") -> dict[str, Any]:
    """Write the latest value per (partition, key) of ``topic`` to Parquet under ``out``.

    Args:
        spark: a session from :func:`spark_session`.
        log_dirs: folders holding ``<topic>-<partition>/`` folders.
        topic: the topic.
        out: the output folder (Parquet files and ``_manifest.json``).
        keep_tombstones: keep keys whose latest record is a tombstone, with a null value.
        mode: Spark's save mode (``error``: refuse an existing ``out``; ``overwrite``).
        fmt: ``parquet``, or ``sst`` (one RocksDB SST file per Kafka partition; tombstones are
            never kept there: a state store holds live keys only). ``out`` must be on a file
            system every executor and the driver share (local mode: any folder).

    Returns:
        the manifest: ``{"topic", "format", "partitions": {partition: next offset}, "rows"}``, and
        for ``sst`` ``"files": {partition: file name under out/sst}``.

    Raises:
        LogNotFoundError / CorruptRecordError / StorageError (from the driver's pass) or Spark's
        error wrapping them (from an executor): damage, naming the file and byte position.
    """
    from pyspark.sql import functions as F

    from materializer.spark.split_reader import splits_frame
    from materializer.spark.splits import plan_splits

    # Executors resolve a relative path against their own folder (on a cluster: the worker's work
    # dir), so every path handed to them is made absolute here, against the driver's.
    out = Path(out).absolute()
    # One driver pass: the manifest's next offsets are exactly the ends of the splits read.
    splits = plan_splits([Path(p) for p in log_dirs], topic)
    next_offsets: dict[int, int] = {}
    for split in splits:
        next_offsets[split.partition] = max(next_offsets.get(split.partition, 0), split.end_offset)
    records = splits_frame(spark, splits).where(F.col("key").isNotNull())
    # one hash aggregate (the record with the highest offset of each key), not a sort-based window
    latest = F.max_by(F.struct("value", "offset", "timestamp"), "offset").alias("latest")
    rows = records.groupBy("partition", "key").agg(latest).select("partition", "key", "latest.*")
    if not keep_tombstones:
        rows = rows.where(F.col("value").isNotNull())
    manifest: dict[str, Any] = {"topic": topic, "format": fmt,
                      "partitions": {str(p): o for p, o in sorted(next_offsets.items())}}
    if fmt == "parquet":
        from pyspark.sql import Observation

        # the rows counted as the write passes them (no second job reading the files back)
        written = Observation("snapshot")
        rows.observe(written, F.count(F.lit(1)).alias("rows")).write.mode(mode).parquet(str(out))
        manifest["rows"] = written.get["rows"]
    elif fmt == "sst":
        manifest.update(_write_sst_files(rows.where(F.col("value").isNotNull()), out, len(next_offsets), mode))
    else:
        raise ValueError(f"unknown snapshot format {fmt!r}; expected parquet or sst")
    (out / "_manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def _write_sst_files(rows: DataFrame, out: Path, kafka_partitions: int, mode: str) -> dict[str, Any]:
    """One SST per Kafka partition, written by the executors; returns ``{"rows", "files"}``."""
    import shutil

    from pyspark.sql import functions as F

    if out.exists():
        if mode != "overwrite":
            raise FileExistsError(f"{out} already exists; use --overwrite to replace it")
        shutil.rmtree(out)
    sst_dir = out / "sst"
    sst_dir.mkdir(parents=True)
    # All rows of a Kafka partition go to one task, sorted as the store orders its keys (Spark
    # compares binary columns as unsigned bytes, RocksDB's bytewise comparator does the same).
    ordered = (rows.withColumn("timestamp", F.unix_millis("timestamp"))  # exact: kafkalog stores ms * 1000 µs
               .repartition(max(1, kafka_partitions), "partition").sortWithinPartitions("partition", "key"))
    written = ordered.mapInArrow(_sst_writer(str(sst_dir)), "partition int, file string, entries long").collect()
    files = {str(row["partition"]): row["file"] for row in sorted(written, key=lambda r: r["partition"])}
    return {"rows": sum(row["entries"] for row in written), "files": files}


def _sst_writer(sst_dir: str) -> Callable[[Iterable[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The executor function of :func:`_write_sst_files` (a closure over plain strings only)."""

    def write(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import pyarrow as pa

        from materializer.adapters.rocksdb_store import StoreSstWriter

        writer: StoreSstWriter | None = None
        writer_partition: int | None = None
        done: list[tuple[int | None, str, int]] = []  # (partition, file name, entries) per SST file written

        def finish() -> None:
            if writer is not None and writer.finish():
                done.append((writer_partition, writer.path.name, writer.entries))

        for batch in batches:
            columns = batch.to_pydict()
            for partition, key, value, offset, timestamp in zip(columns["partition"], columns["key"],
                                                                columns["value"], columns["offset"],
                                                                columns["timestamp"]):
                if writer is None or partition != writer_partition:
                    finish()
                    writer_partition = partition
                    writer = StoreSstWriter(f"{sst_dir}/partition-{partition}.sst")
                writer.put(partition, key, offset, timestamp, value)
        finish()
        if done:
            partitions, files, entries = zip(*done)
            yield pa.RecordBatch.from_pydict({"partition": list(partitions), "file": list(files),
                                              "entries": list(entries)},
                                             schema=pa.schema([("partition", pa.int32()), ("file", pa.string()),
                                                               ("entries", pa.int64())]))

    return write


def executor_error(exc: BaseException) -> str:
    """The line of a Spark error that carries our exception (file and byte position), else its first line."""
    text = str(exc)
    for line in text.splitlines():
        for marker in ("materializer.storage.errors.", "materializer.adapters.errors."):
            if marker in line:
                return line[line.index(marker) + len(marker):].strip()
    return text.strip().splitlines()[0] if text.strip() else type(exc).__name__
