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

Mirrors Kafka's ``LogCleaner`` result (latest offset per key wins) over ``read_committed`` reads.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from pathlib import Path
from typing import Iterator

import click

__all__ = ["executor_error", "snapshot", "spark", "spark_session"]


def spark_session(master: str = "local[2]", app_name: str = "kafka-materializer", *, kafka_connector: bool = False,
                  class_sharing: bool = True):
    """A ``SparkSession`` with the ``kafkalog`` data source registered.

    The UI and console progress bars are off; on a ``local`` master, shuffles use
    ``2 x cores`` partitions (at least 4) instead of Spark's 200.

    Python workers run this interpreter (``PYSPARK_PYTHON`` defaults to ``sys.executable``), so they
    import the same ``materializer``. They fork from
    :mod:`materializer.spark.worker_daemon` (``spark.python.daemon.module``), which has
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


def snapshot(spark, log_dirs: list[Path | str], topic: str, out: Path | str, *, keep_tombstones: bool = False,
             mode: str = "error", fmt: str = "parquet") -> dict:
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

    from materializer.spark.source import plan_splits, splits_frame

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
    manifest: dict = {"topic": topic, "format": fmt,
                      "partitions": {str(p): o for p, o in sorted(next_offsets.items())}}
    if fmt == "parquet":
        from pyspark.sql import Observation

        # the rows counted as the write passes them (no second job reading the files back)
        written = Observation("snapshot")
        rows.observe(written, F.count(F.lit(1)).alias("rows")).write.mode(mode).parquet(str(out))
        manifest["rows"] = written.get["rows"]
    elif fmt == "sst":
        manifest.update(_write_sst_files(rows.where(F.col("value").isNotNull()), Path(out), len(next_offsets), mode))
    else:
        raise ValueError(f"unknown snapshot format {fmt!r}; expected parquet or sst")
    (Path(out) / "_manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def _write_sst_files(rows, out: Path, kafka_partitions: int, mode: str) -> dict:
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


def _sst_writer(sst_dir: str):
    """The executor function of :func:`_write_sst_files` (a closure over plain strings only)."""

    def write(batches):
        import pyarrow as pa

        from materializer.adapters.rocksdb_store import StoreSstWriter

        writer = None
        done = []

        def finish():
            if writer is not None and writer.finish():
                done.append((writer_partition, writer.path.name, writer.entries))

        writer_partition = None
        for batch in batches:
            columns = batch.to_pydict()
            for partition, key, value, offset, timestamp in zip(columns["partition"], columns["key"],
                                                                columns["value"], columns["offset"],
                                                                columns["timestamp"]):
                if partition != writer_partition:
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


@contextlib.contextmanager
def _session_for_command(master: str) -> Iterator:
    """A session for one CLI command, stopped at the end; Spark's wrapped executor errors become one
    ``error:`` line carrying our exception (file and byte position)."""
    session = spark_session(master)
    try:
        yield session
    except Exception as exc:  # noqa: BLE001 - Spark wraps an executor's error in its own exception types
        from pyspark.errors import PySparkException

        if isinstance(exc, PySparkException) or type(exc).__name__ == "Py4JJavaError":
            raise click.ClickException(executor_error(exc)) from exc
        raise
    finally:
        session.stop()


@click.group()
def spark() -> None:
    """Jobs on Spark (PySpark >= 4.0, the `spark` extra) over Kafka partition folders, no broker needed."""


@spark.command("snapshot")
@click.option("--log-dir", "log_dirs", multiple=True, required=True,
              type=click.Path(exists=True, file_okay=False, path_type=Path),
              help="A folder holding <topic>-<partition>/ folders (a broker's log dir or a copy); repeatable.")
@click.option("--topic", required=True, help="Kafka topic name.")
@click.option("--out", required=True, type=click.Path(path_type=Path),
              help="Output folder (Parquet or sst/*.sst, and _manifest.json).")
@click.option("--format", "fmt", type=click.Choice(["parquet", "sst"]), default="parquet", show_default=True,
              help="parquet, or sst: one RocksDB SST per partition for `materializer restore --from-snapshot`.")
@click.option("--keep-tombstones", is_flag=True, help="Keep keys whose latest record is a tombstone (null value).")
@click.option("--overwrite", is_flag=True, help="Replace --out if it exists.")
@click.option("--master", default="local[2]", show_default=True, help="Spark master URL.")
def snapshot_command(log_dirs: tuple[Path, ...], topic: str, out: Path, fmt: str, keep_tombstones: bool,
                     overwrite: bool, master: str) -> None:
    """Latest value per (partition, key) of TOPIC from its partition folders, into Parquet.

    Kafka's compaction result for a read_committed reader: the highest offset per key in each
    partition, aborted transactions and markers skipped, tombstoned keys dropped. Prints the rows
    written and each partition's next offset (also in OUT/_manifest.json).
    """
    with _session_for_command(master) as session:
        manifest = snapshot(session, list(log_dirs), topic, out, keep_tombstones=keep_tombstones,
                            mode="overwrite" if overwrite else "error", fmt=fmt)
    click.echo(f"{topic}: {manifest['rows']} rows into {out}; next offsets {manifest['partitions']}")


@spark.command("compact")
@click.option("--log-dir", "log_dirs", multiple=True, required=True,
              type=click.Path(exists=True, file_okay=False, path_type=Path),
              help="A folder holding <topic>-<partition>/ folders (only read); repeatable.")
@click.option("--topic", required=True, help="Kafka topic name.")
@click.option("--out", required=True, type=click.Path(path_type=Path),
              help="Output data directory: cleaned <topic>-<partition>/ folders and checkpoints.")
@click.option("--config", "config_items", multiple=True, metavar="KEY=VALUE",
              help="Topic config (Kafka name, e.g. delete.retention.ms=86400000); repeatable.")
@click.option("--to-log-end", is_flag=True, help="Clean the active segment too (up to the log end offset).")
@click.option("--now-ms", type=int, default=None, help="The rounds' clock, ms since the epoch [default: now].")
@click.option("--overwrite", is_flag=True, help="Replace --out if it exists.")
@click.option("--master", default="local[2]", show_default=True, help="Spark master URL.")
def compact_command(log_dirs: tuple[Path, ...], topic: str, out: Path, config_items: tuple[str, ...],
                    to_log_end: bool, now_ms: int | None, overwrite: bool, master: str) -> None:
    """Kafka's log cleaner on every partition of TOPIC in parallel (one Spark task each), into OUT.

    The input folders are copied, never changed; OUT holds Kafka-format cleaned segments that
    DumpLogSegments, `materializer dump-log` and `kafkalog` read. Prints each partition's sizes.
    OUT is locked while the job runs (another writer of OUT makes it fail at once) and marked
    complete at the end; an interrupted job (Ctrl-C: exit 130, SIGTERM: 143) leaves OUT marked
    incomplete: run it again with --overwrite.
    """
    from materializer.config import parse_config_overrides
    from materializer.interrupts import sigterm_interrupts
    from materializer.spark.compact import spark_compact

    configs = parse_config_overrides(config_items)
    with sigterm_interrupts(), _session_for_command(master) as session:
        results = spark_compact(session, list(log_dirs), topic, out, configs=configs, to_log_end=to_log_end,
                                now_ms=now_ms, overwrite=overwrite)
    for r in results:
        click.echo(f"{topic}-{r.partition}: {r.size_before_bytes} -> {r.size_after_bytes} bytes, records "
                   f"{r.records_read} read / {r.records_written} written, cleaned up to offset "
                   f"{r.cleaner_checkpoint} of [{r.log_start_offset}, {r.log_end_offset})")
    click.echo(f"{topic}: {len(results)} partitions cleaned into {out}")


@spark.command("materialize")
@click.option("--log-dir", "log_dirs", multiple=True, required=True,
              type=click.Path(exists=True, file_okay=False, path_type=Path),
              help="A folder holding <topic>-<partition>/ folders, e.g. the data dir `materializer run` fills; "
                   "repeatable.")
@click.option("--topic", required=True, help="Kafka topic name.")
@click.option("--out", required=True, type=click.Path(path_type=Path),
              help="Table folder: Parquet versions v=<batch id>/ and the _latest pointer.")
@click.option("--checkpoint", required=True, type=click.Path(path_type=Path),
              help="Spark checkpoint location (keep it with --out: together they give exactly-once output).")
@click.option("--available-now", is_flag=True, help="Process what is on disk now, then stop.")
@click.option("--trigger-interval-s", type=click.FloatRange(min=0.1), default=10.0, show_default=True,
              help="Seconds between micro-batches when running continuously.")
@click.option("--master", default="local[2]", show_default=True, help="Spark master URL.")
def materialize_command(log_dirs: tuple[Path, ...], topic: str, out: Path, checkpoint: Path, available_now: bool,
                        trigger_interval_s: float, master: str) -> None:
    """Keep OUT = latest value per (partition, key) of TOPIC, one Parquet version per micro-batch.

    Reads partition folders with the streaming kafkalog source (no broker); tombstones remove keys.
    A killed and restarted job loses and duplicates nothing (Spark's checkpoint + idempotent
    versions). Ctrl-C or SIGTERM stops it after the current batch.
    """
    import signal

    from materializer.spark.streaming import latest_version_path, materialize_available_now, materialize_stream

    with _session_for_command(master) as session:
        if available_now:
            materialize_available_now(session, list(log_dirs), topic, out, checkpoint)
        else:
            query = materialize_stream(session, list(log_dirs), topic, out, checkpoint,
                                       trigger_interval_s=trigger_interval_s)
            signal.signal(signal.SIGTERM, lambda *_: query.stop())
            try:
                query.awaitTermination()
            except KeyboardInterrupt:
                query.stop()
    click.echo(f"{topic}: latest version {latest_version_path(out)}")
