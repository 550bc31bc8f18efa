"""kafkalog on Spark against Spark's own Kafka source and the project's restore, on the same topic (issue 8).

A script, not a test. A LocalKafkaBroker (Kafka jars, temp dir) gets ``--records`` records over
``--keys`` keys in ``--partitions`` partitions (``bench_materializer.Workload``: 60-byte values,
6 % tombstones, ``--compression``, no transactions; ``--no-broker`` writes the same records with the project's Kafka-format writer
instead). The broker's own partition folders are then read in place, and one run measures:

1. a local[2] session with Spark's Kafka connector (resolved with Maven, see
   :mod:`materializer.spark.connector_jars`): the time to start it, then the latest-value-per-key
   snapshot to Parquet as its first job (the "seconds after the session starts" figure), then best
   of ``--repeat``: the snapshot again, ``kafkalog`` count, and Spark's Kafka source count reading
   the same topic from the broker (``kafka.isolation.level=read_committed``, as kafkalog);
2. ``kafkalog`` count on local[1] (warm-up, then best of ``--repeat``, as on local[2]): the
   split-by-segment scaling;
3. ``materializer restore --from-log-dir`` of the same folders (copy + check + RocksDB), the
   project's single-process path.

Python worker memory: a thread samples ``VmHWM`` (peak resident set) of every Python process below
this one that runs PySpark's daemon or workers; the largest is printed per session.

    .venv/bin/python benchmarks/bench_spark.py                    # 1M records, 100k keys, ~5 min
    .venv/bin/python benchmarks/bench_spark.py --records 200000 --repeat 1

Compare ratios within one run; the machine may be busy.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

def write_corpus(log_dir: Path, topic: str, workload, count: int, compression: str) -> None:
    """``workload``'s first ``count`` records into local partition folders with the project's writer (batches of
    500 per partition)."""
    from materializer.storage.compression import CompressionType
    from materializer.storage.log import Log
    from materializer.storage.log_config import LogConfig
    from materializer.storage.record_batch import Record, TimestampType

    config = LogConfig(segment_bytes=8 * 1024 * 1024, segment_index_bytes=1024 * 1024)
    logs = [Log.open(log_dir / f"{topic}-{p}", config, had_clean_shutdown=True) for p in range(workload.partitions)]
    pending: list[list[Record]] = [[] for _ in range(workload.partitions)]
    codec = CompressionType.from_name(compression)
    for i, (partition, key, value) in enumerate(workload.records(0, count)):
        log = logs[partition]
        pending[partition].append(Record(log.log_end_offset + len(pending[partition]), 1_700_000_000_000 + i, key,
                                         value))
        if len(pending[partition]) == 500:
            log.append_records(pending[partition], compression=codec, timestamp_type=TimestampType.CREATE_TIME)
            pending[partition] = []
    for log, rest in zip(logs, pending):
        if rest:
            log.append_records(rest, compression=codec, timestamp_type=TimestampType.CREATE_TIME)
        log.close()


class PythonWorkerPeak:
    """Largest ``VmHWM`` (peak RSS, bytes) of PySpark daemon/worker processes below this process.

    Sampled every 0.2 s from ``/proc`` (Linux); forked workers keep the daemon's command line
    (``-m pyspark.daemon``). A forked worker's figure counts the pages it shares with the daemon.
    """

    def __init__(self) -> None:
        self.peaks: dict[int, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> "PythonWorkerPeak":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    @property
    def max_bytes(self) -> int:
        return max(self.peaks.values(), default=0)

    def _run(self) -> None:
        me = os.getpid()
        while not self._stop.wait(0.2):
            parents: dict[int, int] = {}
            for entry in os.listdir("/proc"):
                if entry.isdigit():
                    try:
                        stat = Path(f"/proc/{entry}/stat").read_text()
                        parents[int(entry)] = int(stat.rsplit(")", 1)[1].split()[1])
                    except (OSError, ValueError, IndexError):
                        pass
            for pid in parents:
                ancestor, depth = parents.get(pid), 0
                while ancestor not in (None, 0, 1, me) and depth < 10:
                    ancestor, depth = parents.get(ancestor), depth + 1
                if ancestor != me or pid == me:
                    continue
                try:
                    command = Path(f"/proc/{pid}/cmdline").read_bytes()
                    if b"pyspark.daemon" not in command and b"pyspark.worker" not in command:
                        continue  # the JVM's class path names pyspark too
                    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                        if line.startswith("VmHWM:"):
                            self.peaks[pid] = max(self.peaks.get(pid, 0), int(line.split()[1]) * 1024)
                except OSError:
                    pass


def best(repeat: int, action) -> tuple[float, object]:
    times, result = [], None
    for _ in range(repeat):
        started = time.perf_counter()
        result = action()
        times.append(time.perf_counter() - started)
    return min(times), result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--keys", type=int, default=100_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--compression", default="lz4")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--no-broker", action="store_true", help="write the folders with the project's writer; "
                        "no broker, no Spark Kafka source")
    args = parser.parse_args()

    import contextlib

    import pyspark

    from bench_materializer import TOPIC, Workload, produce  # the same update stream and producer

    from materializer.local.kafka_broker import KAFKA_VERSION, TEST_BROKER_CONFIG, LocalKafkaBroker
    from materializer.offline.restore import RestoreOptions, restore_from_log_dir
    from materializer.spark.jobs import snapshot, spark_session

    work = Path(tempfile.mkdtemp(prefix="bench-spark-"))
    workload = Workload(args.keys, 60, args.partitions, 0.06)
    print("$ " + " ".join([Path(sys.executable).name, *sys.argv]))
    try:
        with contextlib.ExitStack() as stack:
            started = time.perf_counter()
            if args.no_broker:
                log_dir, bootstrap = work / "logs", None
                write_corpus(log_dir, TOPIC, workload, args.records, args.compression)
                how = "project writer"
            else:
                broker = stack.enter_context(LocalKafkaBroker(work / "broker", extra_config=TEST_BROKER_CONFIG))
                from confluent_kafka.admin import AdminClient, NewTopic

                bootstrap, log_dir = broker.bootstrap_servers, broker.log_dirs
                admin = AdminClient({"bootstrap.servers": bootstrap})
                admin.create_topics([NewTopic(TOPIC, num_partitions=args.partitions, replication_factor=1)])[
                    TOPIC].result(30)
                del admin  # its client would log connection errors once the broker stops
                time.sleep(1)
                produce(bootstrap, workload, 0, args.records, args.compression)
                how = f"Kafka {KAFKA_VERSION} broker, read in place from its log dir"
            size = sum(p.stat().st_size for p in log_dir.glob(f"{TOPIC}-*/*.log"))
            cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                        if line.startswith("model name")), platform.machine())
            print(f"{platform.node()}: {os.cpu_count()} CPUs ({cpu}), Python {platform.python_version()}, PySpark "
                  f"{pyspark.__version__}, load {os.getloadavg()[0]:.2f}; {args.records:,d} records, {args.keys:,d} "
                  f"keys, {args.partitions} partitions, {args.compression}, {size / 1e6:.1f} MB of segments ({how}, "
                  f"written in {time.perf_counter() - started:.1f} s); best of {args.repeat}", flush=True)
            figures = run_spark(args, TOPIC, log_dir, bootstrap, work, snapshot, spark_session)

            def restore():
                target = work / "restored"
                shutil.rmtree(target, ignore_errors=True)
                return restore_from_log_dir(log_dir, TOPIC, target, options=RestoreOptions())

            seconds, result = best(args.repeat, restore)
            print(f"materializer restore (one process, into RocksDB): {args.records:,d} records in {seconds:.2f} s = "
                  f"{args.records / seconds:,.0f} records/s; {result.live_keys:,d} live keys")
        print("\nratios (one run):")
        print(f"  kafkalog count local[1] -> local[2]: {figures['local[1]'] / figures['local[2]']:.2f}x faster")
        if "kafka" in figures:
            print(f"  kafkalog count vs Spark's Kafka source count (local[2]): "
                  f"{figures['kafka'] / figures['local[2]']:.2f}x")
        print(f"  kafkalog count local[2] vs restore: {seconds / figures['local[2]']:.2f}x")
    finally:
        shutil.rmtree(work, ignore_errors=True)


def run_spark(args, topic: str, log_dir: Path, bootstrap: str | None, work: Path, snapshot,
              spark_session) -> dict[str, float]:
    """The Spark part of the run (see the module doc); returns seconds of each count."""
    figures: dict[str, float] = {}
    for master in ("local[2]", "local[1]"):
        with PythonWorkerPeak() as workers:
            started = time.perf_counter()
            connector = master == "local[2]" and bootstrap is not None
            try:
                spark = spark_session(master, kafka_connector=connector)
            except Exception as exc:  # noqa: BLE001 - report what Maven answered, measure the rest
                print(f"Spark's Kafka connector unavailable, not compared: {exc}")
                connector, spark = False, spark_session(master)
            session_s = time.perf_counter() - started
            reader = spark.read.format("kafkalog").option("path", str(log_dir)).option("topic", topic)
            if master == "local[2]":
                out = work / "snapshot"
                manifest = snapshot(spark, [log_dir], topic, out, mode="overwrite")
                first_s = time.perf_counter() - started
                print(f"{master}: session started in {session_s:.1f} s; the snapshot (latest per key -> Parquet) of "
                      f"{args.records:,d} records, its first job, done {first_s - session_s:.1f} s after that "
                      f"({first_s:.1f} s from asking for the session), {manifest['rows']:,d} keys")
                seconds, manifest = best(args.repeat, lambda: snapshot(spark, [log_dir], topic, out, mode="overwrite"))
                print(f"{master}: snapshot again: {seconds:.2f} s")
            reader.load().count()  # warm-up on both masters: the planning processes, the count's code
            seconds, count = best(args.repeat, lambda: reader.load().count())
            figures[master] = seconds
            print(f"{master}: kafkalog count: {count:,d} rows in {seconds:.2f} s = {count / seconds:,.0f} records/s")
            if connector:
                kafka = (spark.read.format("kafka").option("kafka.bootstrap.servers", bootstrap)
                         .option("subscribe", topic).option("startingOffsets", "earliest")
                         .option("endingOffsets", "latest").option("kafka.isolation.level", "read_committed"))
                kafka.load().count()  # warm-up: the connector's classes and consumers
                seconds, kafka_count = best(args.repeat, lambda: kafka.load().count())
                figures["kafka"] = seconds
                print(f"{master}: Spark's Kafka source count (from the broker): {kafka_count:,d} rows in "
                      f"{seconds:.2f} s = {kafka_count / seconds:,.0f} records/s; same count as kafkalog: "
                      f"{kafka_count == count}")
            spark.stop()
        print(f"{master}: Python worker peak RSS {workers.max_bytes / 2**20:,.0f} MiB "
              f"(largest of {len(workers.peaks)} PySpark Python processes)", flush=True)
    return figures


if __name__ == "__main__":
    main()
