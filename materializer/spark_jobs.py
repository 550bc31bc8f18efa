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

Mirrors Kafka's ``LogCleaner`` result (latest offset per key wins) over ``read_committed`` reads.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import click

__all__ = ["executor_error", "snapshot", "spark", "spark_session"]


def spark_session(master: str = "local[2]", app_name: str = "kafka-materializer"):
    """A ``SparkSession`` with the ``kafkalog`` data source registered.

    Python workers run this interpreter (``PYSPARK_PYTHON`` defaults to ``sys.executable``), so they
    import the same ``materializer``. The UI is off.

    Raises:
        ImportError: pyspark (the ``spark`` extra) is not installed.
    """
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from materializer.adapters.spark_source import KafkaLogDataSource

    session = (SparkSession.builder.master(master).appName(app_name)
               .config("spark.ui.enabled", "false")
               .config("spark.sql.session.timeZone", "UTC")
               .getOrCreate())
    session.dataSource.register(KafkaLogDataSource)
    return session


def snapshot(spark, log_dirs: list[Path | str], topic: str, out: Path | str, *, keep_tombstones: bool = False,
             mode: str = "error") -> dict:
    """Write the latest value per (partition, key) of ``topic`` to Parquet under ``out``.

    Args:
        spark: a session from :func:`spark_session`.
        log_dirs: folders holding ``<topic>-<partition>/`` folders.
        topic: the topic.
        out: the output folder (Parquet files and ``_manifest.json``).
        keep_tombstones: keep keys whose latest record is a tombstone, with a null value.
        mode: Spark's save mode (``error``: refuse an existing ``out``; ``overwrite``).

    Returns:
        the manifest: ``{"topic", "partitions": {partition: next offset}, "rows"}``.

    Raises:
        LogNotFoundError / CorruptRecordError / StorageError (from the driver's pass) or Spark's
        error wrapping them (from an executor): damage, naming the file and byte position.
    """
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    from materializer.adapters.spark_source import plan_splits

    paths = ",".join(str(p) for p in log_dirs)
    splits = plan_splits([Path(p) for p in log_dirs], topic)
    next_offsets: dict[int, int] = {}
    for split in splits:
        next_offsets[split.partition] = max(next_offsets.get(split.partition, 0), split.end_offset)
    records = (spark.read.format("kafkalog").option("path", paths).option("topic", topic).load()
               .where(F.col("key").isNotNull()))
    latest = Window.partitionBy("partition", "key").orderBy(F.col("offset").desc())
    rows = (records.withColumn("_rank", F.row_number().over(latest)).where(F.col("_rank") == 1).drop("_rank"))
    if not keep_tombstones:
        rows = rows.where(F.col("value").isNotNull())
    rows = rows.select("partition", "key", "value", "offset", "timestamp")
    rows.write.mode(mode).parquet(str(out))
    count = spark.read.parquet(str(out)).count()
    manifest = {"topic": topic, "partitions": {str(p): o for p, o in sorted(next_offsets.items())}, "rows": count}
    (Path(out) / "_manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def executor_error(exc: BaseException) -> str:
    """The line of a Spark error that carries our exception (file and byte position), else its first line."""
    text = str(exc)
    for line in text.splitlines():
        for marker in ("materializer.storage.errors.", "materializer.adapters.errors."):
            if marker in line:
                return line[line.index(marker) + len(marker):].strip()
    return text.strip().splitlines()[0] if text.strip() else type(exc).__name__


@click.group()
def spark() -> None:
    """Jobs on Spark (PySpark >= 4.0, the `spark` extra) over Kafka partition folders, no broker needed."""


@spark.command("snapshot")
@click.option("--log-dir", "log_dirs", multiple=True, required=True,
              type=click.Path(exists=True, file_okay=False, path_type=Path),
              help="A folder holding <topic>-<partition>/ folders (a broker's log dir or a copy); repeatable.")
@click.option("--topic", required=True, help="Kafka topic name.")
@click.option("--out", required=True, type=click.Path(path_type=Path), help="Output folder (Parquet + _manifest.json).")
@click.option("--keep-tombstones", is_flag=True, help="Keep keys whose latest record is a tombstone (null value).")
@click.option("--overwrite", is_flag=True, help="Replace --out if it exists.")
@click.option("--master", default="local[2]", show_default=True, help="Spark master URL.")
def snapshot_command(log_dirs: tuple[Path, ...], topic: str, out: Path, keep_tombstones: bool, overwrite: bool,
                     master: str) -> None:
    """Latest value per (partition, key) of TOPIC from its partition folders, into Parquet.

    Kafka's compaction result for a read_committed reader: the highest offset per key in each
    partition, aborted transactions and markers skipped, tombstoned keys dropped. Prints the rows
    written and each partition's next offset (also in OUT/_manifest.json).
    """
    session = spark_session(master)
    try:
        manifest = snapshot(session, list(log_dirs), topic, out, keep_tombstones=keep_tombstones,
                            mode="overwrite" if overwrite else "error")
    except Exception as exc:  # noqa: BLE001 - Spark wraps an executor's error in its own exception types
        from pyspark.errors import PySparkException

        if isinstance(exc, PySparkException) or type(exc).__name__ == "Py4JJavaError":
            raise click.ClickException(executor_error(exc)) from exc
        raise
    finally:
        session.stop()
    click.echo(f"{topic}: {manifest['rows']} rows into {out}; next offsets {manifest['partitions']}")
