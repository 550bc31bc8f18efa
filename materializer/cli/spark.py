"""``materializer spark snapshot|compact|materialize``: the Spark jobs from the command line.

A thin layer over :mod:`materializer.spark` (the ``spark`` extra): each command starts a session
(:func:`~materializer.spark.jobs.spark_session` on ``--master``), runs one job and stops the
session. Spark wraps an executor's error in its own exception types; the commands print the line
that carries the project's error (file and byte position) as one ``error:`` line
(:func:`~materializer.spark.jobs.executor_error`). Wired into the main CLI with
``main.add_command(spark)``; pyspark is imported only when a command runs.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator, TypeVar

import click

from materializer.cli.conventions import CommandError
from materializer.interrupts import Terminated
from materializer.spark.jobs import executor_error, snapshot, spark_session

__all__ = ["spark"]

_F = TypeVar("_F", bound=Callable[..., Any])


@contextlib.contextmanager
def _session_for_command(master: str) -> Iterator[Any]:
    """A session for one CLI command, stopped at the end; Spark's wrapped executor errors become one
    ``error:`` line carrying our exception (file and byte position)."""
    with _signals_noted() as signals_arrived:
        try:
            session = spark_session(master)
        except KeyboardInterrupt:
            _stop_half_started_driver_jvm()
            raise
        except Exception as exc:
            noted = signals_arrived()
            if not noted:
                raise
            # Py4J turns an interrupt that arrives while it waits on the JVM's socket into its own
            # Py4JError ("Error while sending or receiving"): it is still the user's Ctrl-C.
            _stop_half_started_driver_jvm()
            interrupt = Terminated() if noted[-1] == signal.SIGTERM else KeyboardInterrupt()
            raise interrupt from exc
    try:
        yield session
    except Exception as exc:  # noqa: BLE001 - Spark wraps an executor's error in its own exception types
        from pyspark.errors import PySparkException

        if isinstance(exc, PySparkException) or type(exc).__name__ == "Py4JJavaError":
            raise CommandError(executor_error(exc)) from exc
        raise
    finally:
        session.stop()


@contextlib.contextmanager
def _signals_noted() -> Iterator[Callable[[], list[int]]]:
    """While the block runs (main thread only), yields a function that returns the numbers of the
    signals that arrived so far, so an interrupt a library swallowed can be recognised.

    Through CPython's wakeup fd (:func:`signal.set_wakeup_fd`: the C-level handler writes each signal
    number to it), not a Python handler: PySpark's SparkContext replaces the SIGINT handler while it
    starts. The previous wakeup fd comes back after.
    """
    if threading.current_thread() is not threading.main_thread():
        yield list
        return
    read_fd, write_fd = os.pipe()
    os.set_blocking(read_fd, False)
    os.set_blocking(write_fd, False)
    noted: list[int] = []

    def arrived() -> list[int]:
        with contextlib.suppress(BlockingIOError):
            noted.extend(os.read(read_fd, 512))
        return noted

    previous = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
    try:
        yield arrived
    finally:
        signal.set_wakeup_fd(previous)
        os.close(read_fd)
        os.close(write_fd)


def _stop_half_started_driver_jvm() -> None:
    """SIGTERM the driver JVM a Ctrl-C left behind while PySpark started it.

    PySpark starts the JVM with SIGINT ignored (``pyspark.java_gateway.launch_gateway``, so that
    Ctrl-C reaches only Python), and one interrupted before the session existed is stopped by
    nobody: it outlived the command by minutes. It is the child of this process running
    ``org.apache.spark.deploy.SparkSubmit``; found through ``/proc`` (Linux; elsewhere nothing is done).
    """
    proc = Path("/proc")
    if not proc.is_dir():
        return
    me = str(os.getpid())
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            parent = stat[stat.rindex(")") + 2:].split()[1]  # fields after "(comm)": state, ppid, ...
            command = (entry / "cmdline").read_bytes()
        except (OSError, ValueError, IndexError):
            continue  # gone meanwhile, or not ours to read
        if parent == me and b"org.apache.spark.deploy.SparkSubmit" in command:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(entry.name), signal.SIGTERM)
            _wait_until_exited(entry)


def _wait_until_exited(entry: Path, timeout_s: float = 10.0) -> None:
    """Wait (at most ``timeout_s``) until the process of ``/proc/<pid>`` ``entry`` exited (gone or a
    zombie), so what it prints while it shuts down comes before the command's own last line."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            return
        if stat[stat.rindex(")") + 2:].split()[0] in ("Z", "X"):
            return
        time.sleep(0.05)


def _log_dir_option(help_text: str) -> Callable[[_F], _F]:
    """``--log-dir`` (repeatable, an existing folder), with the command's own help."""
    return click.option("--log-dir", "log_dirs", multiple=True, required=True,
                        type=click.Path(exists=True, file_okay=False, path_type=Path), help=help_text)


_topic_option = click.option("--topic", required=True, help="Kafka topic name.")
_overwrite_option = click.option("--overwrite", is_flag=True, help="Replace --out if it exists.")
_master_option = click.option("--master", default="local[2]", show_default=True,
                              help="Spark master URL: local[N], or a cluster's (spark://HOST:PORT, ...), whose executors "
                                   "need this Python environment and the log dirs at the same paths.")


@click.group()
def spark() -> None:
    """Jobs on Spark (PySpark >= 4.0, the `spark` extra) over Kafka partition folders, no broker needed."""


@spark.command("snapshot")
@_log_dir_option("A folder holding <topic>-<partition>/ folders (a broker's log dir or a copy); repeatable.")
@_topic_option
@click.option("--out", required=True, type=click.Path(path_type=Path),
              help="Output folder (Parquet or sst/*.sst, and _manifest.json).")
@click.option("--format", "fmt", type=click.Choice(["parquet", "sst"]), default="parquet", show_default=True,
              help="parquet, or sst: one RocksDB SST per partition for `materializer restore --from-snapshot`.")
@click.option("--keep-tombstones", is_flag=True, help="Keep keys whose latest record is a tombstone (null value).")
@_overwrite_option
@_master_option
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
@_log_dir_option("A folder holding <topic>-<partition>/ folders (only read); repeatable.")
@_topic_option
@click.option("--out", required=True, type=click.Path(path_type=Path),
              help="Output data directory: cleaned <topic>-<partition>/ folders and checkpoints.")
@click.option("--config", "config_items", multiple=True, metavar="KEY=VALUE",
              help="Topic config (Kafka name, e.g. delete.retention.ms=86400000); repeatable.")
@click.option("--to-log-end", is_flag=True, help="Clean the active segment too (up to the log end offset).")
@click.option("--now-ms", type=int, default=None, help="The rounds' clock, ms since the epoch [default: now].")
@_overwrite_option
@_master_option
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
@_log_dir_option("A folder holding <topic>-<partition>/ folders, e.g. the data dir `materializer run` fills; "
                 "repeatable.")
@_topic_option
@click.option("--out", required=True, type=click.Path(path_type=Path),
              help="Table folder: Parquet versions v=<batch id>/ and the _latest pointer.")
@click.option("--checkpoint", required=True, type=click.Path(path_type=Path),
              help="Spark checkpoint location (keep it with --out: together they give exactly-once output).")
@click.option("--available-now", is_flag=True, help="Process what is on disk now, then stop.")
@click.option("--trigger-interval-s", type=click.FloatRange(min=0.1), default=10.0, show_default=True,
              help="Seconds between micro-batches when running continuously.")
@_master_option
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
