"""Spark session start and first job, with and without the driver's class-data-sharing archive.

A script, not a test. Each round runs two fresh Python processes back to back: one calls
``spark_session("local[2]", class_sharing=False)``, the other the default (the archive of
:mod:`materializer.spark.class_sharing`); each then runs one first job, the latest value
per key of 2,000,000 generated rows over 100,000 keys (``max_by`` aggregate, counted). An
uncounted first run writes the archive if the cache has none yet (``--cache`` sets the cache,
default a temporary folder, so the archive is the one this script made).

    .venv/bin/python benchmarks/bench_spark_start.py              # 3 rounds
    .venv/bin/python benchmarks/bench_spark_start.py --rounds 5
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time


def _child(class_sharing: bool) -> None:
    started = time.perf_counter()
    from pyspark.sql import functions as F

    from materializer.spark.jobs import spark_session

    spark = spark_session("local[2]", class_sharing=class_sharing)
    session_s = time.perf_counter() - started
    rows = spark.range(2_000_000).withColumn("k", F.col("id") % 100_000)
    keys = rows.groupBy("k").agg(F.max_by("id", "id").alias("v")).count()
    job_s = time.perf_counter() - started - session_s
    spark.stop()
    print(f"{session_s:.3f} {job_s:.3f} {keys}")


def _run(class_sharing: bool, cache: str) -> tuple[float, float]:
    env = {**os.environ, "KAFKA_MATERIALIZER_CACHE": cache}
    out = subprocess.run([sys.executable, __file__, "--child", "on" if class_sharing else "off"], env=env,
                         check=True, capture_output=True, text=True).stdout.split()
    if int(out[2]) != 100_000:
        raise RuntimeError(f"the first job counted {out[2]} keys, expected 100,000")
    return float(out[0]), float(out[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="off/on pairs (default 3)")
    parser.add_argument("--cache", default=None, help="cache root for the archive (default: a temporary folder)")
    parser.add_argument("--child", choices=["on", "off"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child(args.child == "on")
        return
    cache = args.cache or tempfile.mkdtemp(prefix="bench-spark-start-")
    print(f"command: {' '.join([sys.executable, *sys.argv])}")
    print(f"machine: {os.cpu_count()} CPUs, {platform.machine()}; Python {platform.python_version()}; "
          f"load average {os.getloadavg()[0]:.2f}; cache {cache}")
    _run(True, cache)  # uncounted: writes the archive when the cache has none
    for n in range(1, args.rounds + 1):
        for class_sharing in (False, True):
            session_s, job_s = _run(class_sharing, cache)
            label = "with archive   " if class_sharing else "without archive"
            print(f"  round {n} {label}: session {session_s:.2f} s, first job {job_s:.2f} s", flush=True)
    print(f"load average at the end {os.getloadavg()[0]:.2f}")
    if args.cache is None:
        shutil.rmtree(cache, ignore_errors=True)  # the ~140 MB archive this run made


if __name__ == "__main__":
    main()
