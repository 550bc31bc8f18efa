"""kafkalog on Spark against the project's own restore, on the same partition folders (issue 8).

A script, not a test. It writes ``--records`` records over ``--keys`` keys into ``--partitions``
local partition folders (our Kafka-format writer, ``--compression``, 6 % tombstones; no broker:
the format is the broker's), then measures, best of ``--repeat``:

1. ``kafkalog`` count on ``local[1]`` and ``local[2]`` (the split-by-segment scaling);
2. the snapshot job (latest value per key to Parquet) on ``local[2]``;
3. ``materializer restore --from-log-dir`` of the same folders (copy + check + RocksDB), the
   project's single-process path a user would otherwise take.

Spark's own Kafka source cannot be compared here: ``spark-sql-kafka-0-10_2.13`` resolves, but its
dependency ``spark-token-provider-kafka-0-10_2.13`` (4.0.1) is not served by Maven Central to this
machine. Compare ratios within one run; the machine may be busy.

    .venv/bin/python benchmarks/bench_spark.py                    # 1M records, 100k keys
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import shutil
import tempfile
import time
from pathlib import Path


def write_corpus(log_dir: Path, topic: str, records: int, keys: int, partitions: int, compression: str) -> None:
    from materializer.storage.compression import CompressionType
    from materializer.storage.log import Log
    from materializer.storage.log_config import LogConfig
    from materializer.storage.record_batch import Record, TimestampType

    rng = random.Random(1)
    config = LogConfig(segment_bytes=8 * 1024 * 1024, segment_index_bytes=1024 * 1024)
    logs = [Log.open(log_dir / f"{topic}-{p}", config, had_clean_shutdown=True) for p in range(partitions)]
    pending: list[list[Record]] = [[] for _ in range(partitions)]
    codec = CompressionType.from_name(compression)
    for i in range(records):
        key = b"key-%07d" % rng.randrange(keys)
        partition = hash(key) % partitions
        log = logs[partition]
        value = None if rng.random() < 0.06 else rng.randbytes(60)
        pending[partition].append(Record(log.log_end_offset + len(pending[partition]), 1_700_000_000_000 + i, key,
                                         value))
        if len(pending[partition]) == 500:
            log.append_records(pending[partition], compression=codec, timestamp_type=TimestampType.CREATE_TIME)
            pending[partition] = []
    for log, rest in zip(logs, pending):
        if rest:
            log.append_records(rest, compression=codec, timestamp_type=TimestampType.CREATE_TIME)
        log.close()


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
    args = parser.parse_args()

    from materializer.restore import RestoreOptions, restore_from_log_dir
    from materializer.spark_jobs import snapshot, spark_session

    topic = "bench"
    work = Path(tempfile.mkdtemp(prefix="bench-spark-"))
    try:
        started = time.perf_counter()
        write_corpus(work / "logs", topic, args.records, args.keys, args.partitions, args.compression)
        size = sum(p.stat().st_size for p in (work / "logs").rglob("*.log"))
        print(f"{platform.node()}: {os.cpu_count()} CPUs, Python {platform.python_version()}, load "
              f"{os.getloadavg()[0]:.2f}; {args.records:,d} records, {args.keys:,d} keys, {args.partitions} partitions, "
              f"{args.compression}, {size / 1e6:.1f} MB of segments (written in {time.perf_counter() - started:.1f} s)")
        figures = {}
        for master in ("local[1]", "local[2]"):
            spark = spark_session(master)
            reader = spark.read.format("kafkalog").option("path", str(work / "logs")).option("topic", topic)
            reader.load().count()  # warm-up: JVM, Python workers
            seconds, count = best(args.repeat, lambda: reader.load().count())
            figures[master] = seconds
            print(f"kafkalog count, {master}: {count:,d} rows in {seconds:.2f} s = {count / seconds:,.0f} records/s")
            if master == "local[2]":
                out = work / "snapshot"
                seconds, manifest = best(args.repeat, lambda: snapshot(spark, [work / "logs"], topic, out,
                                                                       mode="overwrite"))
                print(f"snapshot (latest per key -> Parquet), {master}: {manifest['rows']:,d} keys in {seconds:.2f} s")
            spark.stop()
        print(f"local[1] -> local[2]: {figures['local[1]'] / figures['local[2]']:.2f}x faster")

        def restore():
            target = work / "restored"
            shutil.rmtree(target, ignore_errors=True)
            return restore_from_log_dir(work / "logs", topic, target, options=RestoreOptions())

        seconds, result = best(args.repeat, restore)
        print(f"materializer restore (one process, into RocksDB): {args.records:,d} records in {seconds:.2f} s = "
              f"{args.records / seconds:,.0f} records/s; {result.live_keys:,d} live keys")
        print(f"kafkalog count local[2] vs restore: {seconds / figures['local[2]']:.2f}x")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
