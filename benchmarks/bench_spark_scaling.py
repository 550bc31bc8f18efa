"""Where a ``kafkalog`` count's wall time and CPU go, on local[1] and local[2] (issue 8's scaling goal).

A script, not a test. Reads an existing log dir (``--log-dir``, e.g. a copy of the broker folders
``bench_spark.py`` produces) or writes ``--records`` records with the project's writer (one segment per
partition, batches of 500). Per master: a session with Spark's event log on, a warm-up count, then
``--repeat`` timed ``spark.read.format("kafkalog")...load().count()``, each with:

* wall seconds of ``load()`` (the ``create_data_source`` planning process) and of ``count()``;
* from the event log (``SparkListenerJobStart``/``TaskStart``/``TaskEnd``/``JobEnd``): the time from
  ``count()`` being called to job submit (analysis, ``plan_data_source_read``), job submit to the
  first task launch, the task times (launch -> finish, and executor run/CPU ms), and the last task
  end to job end and to ``count()`` returning;
* CPU seconds (``/proc``, user + system) of the driver JVM (split into its task threads, JIT
  compiler threads, GC threads and the rest) and of the Python processes below it, by worker
  module (``worker``: the executor's tasks; ``create_data_source``, ``plan_data_source_read``:
  Spark's planning processes), over the count.

Then Spark's own floor for a Python query on that master: ``mapInArrow`` of a function that
returns nothing over 4 and 16 tasks, counted (the difference is the cost of 12 more tasks).

``--job snapshot`` times ``materializer.spark.jobs.snapshot`` (Parquet, what ``materializer spark
snapshot`` runs) instead of the count, and from the event log derives Amdahl's law for it: over
the call's wall time, the seconds in which no task ran anywhere (driver planning, scheduling,
commit: the serial part ``S``) and the task slots' busy seconds (``W``, launch to finish, summed
over tasks); one core would need ``T1 = S + W``, so the serial fraction is ``S / T1``, records/s
per executor core is ``records / W``, and the predicted speed-up on ``n`` cores is ``T1 / (S + W /
n)``. The serial part is also given by where it falls: from the call to the first task's launch
(the driver's :func:`~materializer.spark.splits.plan_splits`, building the query, Spark's planning,
job submit), gaps between tasks (stage boundaries, jobs), and from the last task's end to the
return (Parquet commit, ``_manifest.json``); after the timed runs, ``plan_splits`` alone is timed
once on the driver. The master ``standalone`` is a :class:`~materializer.spark.standalone.LocalSparkCluster`
started here (``--workers`` workers of one core each): executors in their own JVMs.

    .venv/bin/python benchmarks/bench_spark_scaling.py --log-dir /tmp/copy-of-broker-log-dir --topic bench
    .venv/bin/python benchmarks/bench_spark_scaling.py --records 1000000
    .venv/bin/python benchmarks/bench_spark_scaling.py --records 1000000 --job snapshot --masters standalone

Run it under the bench lock; compare figures within one run (the machine may be busy).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def _stat(path: Path) -> list[str] | None:
    try:
        return path.read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def descendants(root: int) -> list[int]:
    """Process ids below ``root`` (from ``/proc/*/stat`` parent ids)."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = _stat(Path(f"/proc/{entry}/stat"))
            if fields:
                parents[int(entry)] = int(fields[1])
    found, frontier = [], [root]
    while frontier:
        parent = frontier.pop()
        children = [pid for pid, ppid in parents.items() if ppid == parent]
        found.extend(children)
        frontier.extend(children)
    return found


def cpu_sample(jvm: int) -> dict[str, float]:
    """CPU seconds (user + system) so far: ``jvm.<thread group>`` per JVM thread group, ``python``
    for every Python process below the JVM (with the children they reaped)."""
    sample: dict[str, float] = {}
    for task in Path(f"/proc/{jvm}/task").iterdir():
        fields = _stat(task / "stat")
        comm = (task / "comm").read_text().strip() if fields else ""
        if not fields:
            continue
        group = ("task" if comm.startswith("Executor task") else "jit" if "Compiler" in comm
                 else "gc" if comm.startswith("GC") or "G1" in comm else "other")
        sample[f"jvm.{group}"] = sample.get(f"jvm.{group}", 0.0) + (int(fields[11]) + int(fields[12])) / CLOCK_TICKS
    for pid in descendants(jvm):
        fields = _stat(Path(f"/proc/{pid}/stat"))
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if fields:
            # "-m <daemon module> <worker module>": the worker module tells tasks from planning
            role = command[3].decode().rsplit(".", 1)[-1] if len(command) > 3 and command[1] == b"-m" else "other"
            sample[f"python.{role}.{pid}"] = sum(int(f) for f in fields[11:15]) / CLOCK_TICKS
    return sample


def cpu_delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    delta = {"jvm.task": 0.0, "jvm.jit": 0.0, "jvm.gc": 0.0, "jvm.other": 0.0}
    for key, value in after.items():
        group = key.rsplit(".", 1)[0] if key.startswith("python.") else key
        delta[group] = delta.get(group, 0.0) + value - before.get(key, 0.0)
    return delta


def events(log_dir: Path) -> list[dict]:
    """The newest session's event log so far (one JSON event per line)."""
    out = []
    files = [p for p in log_dir.iterdir() if p.is_file() and not p.name.startswith(".")]
    for path in sorted(files, key=lambda p: p.stat().st_mtime)[-1:]:
        with open(path) as f:
            for line in f:
                try:
                    out.append(json.loads(line))
                except ValueError:
                    pass  # a line being written
    return out


def timeline(all_events: list[dict], called_ms: float, returned_ms: float) -> dict:
    """Milestones of the jobs that ran between ``called_ms`` and ``returned_ms`` (epoch ms)."""
    jobs = [e for e in all_events if e["Event"] == "SparkListenerJobStart" and called_ms <= e["Submission Time"]
            <= returned_ms]
    ids = {j["Job ID"] for j in jobs}
    stage_ids = {s for j in jobs for s in j["Stage IDs"]}
    ends = [e for e in all_events if e["Event"] == "SparkListenerJobEnd" and e["Job ID"] in ids]
    tasks = [e for e in all_events if e["Event"] == "SparkListenerTaskEnd" and e["Stage ID"] in stage_ids]
    if not jobs or not tasks:
        return {}
    submit = min(j["Submission Time"] for j in jobs)
    launches = sorted(t["Task Info"]["Launch Time"] for t in tasks)
    finishes = sorted(t["Task Info"]["Finish Time"] for t in tasks)
    metrics = [t.get("Task Metrics") or {} for t in tasks]
    return {
        "jobs": len(jobs), "tasks": len(tasks),
        "to_submit": (submit - called_ms) / 1e3,
        "submit_to_first_task": (launches[0] - submit) / 1e3,
        "first_task_to_last_end": (finishes[-1] - launches[0]) / 1e3,
        "last_end_to_return": (returned_ms - finishes[-1]) / 1e3,
        "task_s": sorted(round((t["Task Info"]["Finish Time"] - t["Task Info"]["Launch Time"]) / 1e3, 3)
                         for t in tasks),
        "run_ms": sum(m.get("Executor Run Time", 0) for m in metrics),
        "cpu_ms": sum(m.get("Executor CPU Time", 0) for m in metrics) / 1e6,
        "job_end": (max(e["Completion Time"] for e in ends) - submit) / 1e3 if ends else None,
    }


def amdahl(all_events: list[dict], called_ms: float, returned_ms: float, records: int,
           cores: tuple[int, ...] = (2, 4, 8, 16)) -> dict:
    """Amdahl's law for the jobs that ran between ``called_ms`` and ``returned_ms`` (see the module
    docstring): ``serial_s`` (no task running anywhere), ``work_s`` (task slots busy, summed),
    ``serial_fraction``, ``records_per_core_s`` and ``speedup`` per core count in ``cores``."""
    jobs = [e for e in all_events if e["Event"] == "SparkListenerJobStart" and called_ms <= e["Submission Time"]
            <= returned_ms]
    stage_ids = {s for j in jobs for s in j["Stage IDs"]}
    tasks = sorted((t["Task Info"]["Launch Time"], t["Task Info"]["Finish Time"]) for t in all_events
                   if t["Event"] == "SparkListenerTaskEnd" and t["Stage ID"] in stage_ids)
    if not tasks:
        return {}
    busy_ms, end = 0.0, float("-inf")  # length of the union of the task intervals
    gaps_ms = 0.0  # serial seconds between the first task's launch and the last task's end
    for start, finish in tasks:
        if finish > end:
            if end != float("-inf") and start > end:
                gaps_ms += start - end
            busy_ms += finish - max(start, end)
            end = finish
    wall_s = (returned_ms - called_ms) / 1e3
    serial_s = wall_s - busy_ms / 1e3
    work_s = sum(finish - start for start, finish in tasks) / 1e3
    one_core_s = serial_s + work_s
    return {"wall_s": wall_s, "jobs": len(jobs), "tasks": len(tasks), "serial_s": serial_s, "work_s": work_s,
            "serial_parts": {"to_first_task": (tasks[0][0] - called_ms) / 1e3, "between_tasks": gaps_ms / 1e3,
                             "after_last_task": (returned_ms - end) / 1e3},
            "serial_fraction": serial_s / one_core_s, "records_per_core_s": records / work_s,
            "speedup": {n: one_core_s / (serial_s + work_s / n) for n in cores}}


def _nothing(batches):
    for _ in batches:
        pass
    return iter(())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--log-dir", type=Path)
    parser.add_argument("--topic", default="bench")
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=3, help="untimed counts first (JIT, Python workers)")
    parser.add_argument("--masters", default="local[2],local[1]",
                        help="in this order, one JVM (as bench_spark.py); 'standalone': a local standalone cluster")
    parser.add_argument("--job", choices=["count", "snapshot"], default="count",
                        help="what is timed: a kafkalog count, or the snapshot job (with Amdahl's figures)")
    parser.add_argument("--workers", type=int, default=2, help="workers (one core each) of the 'standalone' master")
    parser.add_argument("--conf", action="append", default=[], help="extra Spark setting key=value")
    parser.add_argument("--option", action="append", default=[], help="kafkalog option key=value")
    args = parser.parse_args()

    from materializer.spark.jobs import spark_session

    work = Path(tempfile.mkdtemp(prefix="bench-spark-scaling-"))
    clusters: list = []  # LocalSparkCluster, stopped at the end
    try:
        log_dir = args.log_dir
        if log_dir is None:
            sys.path.insert(0, str(Path(__file__).parent))
            from bench_materializer import Workload
            from bench_spark import write_corpus

            log_dir = work / "logs"
            write_corpus(log_dir, args.topic, Workload(100_000, 60, 4, 0.06), args.records, "lz4")
        size = sum(p.stat().st_size for p in log_dir.glob(f"{args.topic}-*/*.log"))
        print(f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}; {log_dir} ({size / 1e6:.1f} MB of segments); "
              f"extra conf {args.conf}, options {args.option}", flush=True)
        best: dict[str, float] = {}
        event_dir = work / "events"
        event_dir.mkdir()
        conf = {"spark.eventLog.enabled": "true", "spark.eventLog.dir": str(event_dir), "spark.eventLog.rolling.enabled": "false",
                "spark.eventLog.compress": "false",
                **dict(c.split("=", 1) for c in args.conf)}
        # read when the JVM starts (one JVM serves both sessions, as in bench_spark.py)
        os.environ["PYSPARK_SUBMIT_ARGS"] = " ".join(f"--conf {k}={v}" for k, v in conf.items()) + " pyspark-shell"
        for master in args.masters.split(","):
            url = master
            if master == "standalone":
                from materializer.spark.standalone import LocalSparkCluster

                clusters.append(LocalSparkCluster(work / "cluster", workers=args.workers).start())
                url = clusters[-1].master_url
                print(f"standalone: {url}, {args.workers} workers x 1 core, started in "
                      f"{clusters[-1].startup_s:.1f} s; load {os.getloadavg()[0]:.2f}", flush=True)
            spark = spark_session(url)
            if args.job == "snapshot":
                snapshot_figures(spark, master, log_dir, args, work, event_dir)
                spark.stop()
                continue
            jvm = spark.sparkContext._gateway.proc.pid
            reader = spark.read.format("kafkalog").option("path", str(log_dir)).option("topic", args.topic)
            for option in args.option:
                reader = reader.option(*option.split("=", 1))
            for _ in range(args.warmup):
                rows = reader.load().count()
            for _ in range(args.repeat):
                cpu_before = cpu_sample(jvm)
                called = time.time() * 1e3
                frame = reader.load()
                loaded = time.time() * 1e3
                rows = frame.count()
                returned = time.time() * 1e3
                cpu = cpu_delta(cpu_before, cpu_sample(jvm))
                wall = (returned - called) / 1e3
                best[master] = min(best.get(master, wall), wall)
                line = timeline(events(event_dir), loaded, returned)
                total_cpu = sum(cpu.values())
                print(f"{master}: {rows:,d} rows in {wall:.3f} s (load() {(loaded - called) / 1e3:.3f} s); "
                      f"CPU {total_cpu:.2f} s = {total_cpu / wall:.2f} cores: "
                      + ", ".join(f"{k} {v:.2f}" for k, v in cpu.items()) + f"; load {os.getloadavg()[0]:.2f}",
                      flush=True)
                if line:
                    print(f"    count() -> job submit {line['to_submit']:.3f} s, -> first task "
                          f"{line['submit_to_first_task']:.3f} s, tasks span {line['first_task_to_last_end']:.3f} s, "
                          f"last task end -> return {line['last_end_to_return']:.3f} s; {line['tasks']} tasks "
                          f"{line['task_s']} (executor run {line['run_ms'] / 1e3:.2f} s, JVM CPU "
                          f"{line['cpu_ms'] / 1e3:.2f} s)", flush=True)
            for tasks in (4, 16):  # Spark's own cost of a Python query: mapInArrow doing nothing, then count
                empty = spark.range(0, tasks, 1, tasks).mapInArrow(_nothing, "id long")
                for _ in range(args.warmup):
                    empty.count()
                seconds = []
                for _ in range(args.repeat):
                    started = time.perf_counter()
                    empty.count()
                    seconds.append(time.perf_counter() - started)
                print(f"{master}: empty mapInArrow count, {tasks} tasks: best {min(seconds):.3f} s; load "
                      f"{os.getloadavg()[0]:.2f}", flush=True)
            spark.stop()
        if len(best) == 2:
            print(f"best: {best}; local[1] -> local[2] {best['local[1]'] / best['local[2]']:.2f}x")
    finally:
        for cluster in clusters:
            cluster.stop()
        shutil.rmtree(work, ignore_errors=True)


def snapshot_figures(spark, master: str, log_dir: Path, args, work: Path, event_dir: Path) -> None:
    """``--job snapshot``: ``--warmup`` untimed snapshots, then ``--repeat`` timed ones with :func:`amdahl`'s figures."""
    from materializer.spark.jobs import snapshot

    for run in range(args.warmup + args.repeat):
        called = time.time() * 1e3
        manifest = snapshot(spark, [log_dir], args.topic, work / "snapshot", mode="overwrite")
        returned = time.time() * 1e3
        if run < args.warmup:
            continue
        records = sum(manifest["partitions"].values())
        figures = amdahl(events(event_dir), called, returned, records)
        if not figures:
            print(f"{master}: no task in the event log", flush=True)
            continue
        print(f"{master}: snapshot of {records:,d} records ({manifest['rows']:,d} keys) in {figures['wall_s']:.2f} s, "
              f"{figures['jobs']} jobs, {figures['tasks']} tasks; serial (no task running) {figures['serial_s']:.2f} s, "
              f"task slots busy {figures['work_s']:.2f} s -> serial fraction {figures['serial_fraction']:.3f}, "
              f"{figures['records_per_core_s']:,.0f} records/s per executor core; Amdahl speed-up over one core: "
              + ", ".join(f"{n} cores {x:.2f}x" for n, x in figures["speedup"].items())
              + f"; load {os.getloadavg()[0]:.2f}", flush=True)
        parts = figures["serial_parts"]
        print(f"    serial parts: call -> first task launch {parts['to_first_task']:.2f} s, gaps between tasks "
              f"{parts['between_tasks']:.2f} s, last task end -> return {parts['after_last_task']:.2f} s", flush=True)
    from materializer.spark.splits import plan_splits

    started = time.perf_counter()
    splits = plan_splits([log_dir], args.topic)
    print(f"{master}: the driver's plan_splits alone: {len(splits)} splits in {time.perf_counter() - started:.2f} s; "
          f"load {os.getloadavg()[0]:.2f}", flush=True)


if __name__ == "__main__":
    main()
