"""Cleaner throughput: our Kafka-exact cleaner vs. the broker's own LogCleaner on the same workload.

A script, not a test. Steps:

1. generate a keyed update stream (``--records`` records over ``--keys`` keys, ``--value-bytes``
   values, ``--batch-records`` records per batch, codec ``--compression``);
2. **local**: write it as a local log (``DIR/bench-0``, topic config saved as the materializer
   does, ``segment.bytes = --segment-bytes``) and run ``compact_topic`` (one cleaning round up to
   Kafka's own bound: the active segment); report MB/s and records/s from the round statistics
   (bytes/records read by the recopy pass over the round's elapsed time, the same definition
   as Kafka's "X MB of log processed in Y seconds (Z MB/sec)") and the wall time;
3. **broker** (unless ``--skip-broker``): start a LocalKafkaBroker (Kafka 4.3.1 jars,
   ``log.cleaner.dedupe.buffer.size = --dedupe-buffer-size``), create a compacted topic held back
   by ``min.compaction.lag.ms``, produce the same stream with confluent-kafka, release the
   cleaner and wait for its checkpoint to reach the active segment; parse the broker's own
   per-round statistics ("MB of log processed", "Start size: ... (N messages)") from its logs;
4. print both and the ratio local / broker, with the machine and the command line.

``--partitions P`` splits the same stream over P partitions (record ``i`` goes to partition
``key index % P``, so each key lives in one partition, as with keyed partitioning) on both sides;
``--threads N`` runs the broker with ``log.cleaner.threads = N`` and ours with
``compact_topic(threads=N)`` (both: ``dedupe buffer / N`` of offset map per thread). With several
partitions or threads the figure that counts is the elapsed time of the whole job: ours is the
wall time of ``compact_topic``; the broker's runs from its first round's "Beginning cleaning of
log" line to its last round's statistics line (logged after the swap), timestamps read from its
cleaner log. The ratio line compares those (broker elapsed / ours).

    .venv/bin/python benchmarks/bench_cleaner.py                       # 5M records, 500k keys
    .venv/bin/python benchmarks/bench_cleaner.py --records 1000000 --keys 100000
    .venv/bin/python benchmarks/bench_cleaner.py --partitions 4 --threads 2
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import random
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.integration helpers

from materializer.offline.compact import compact_topic  # noqa: E402
from materializer.datadir.layout import topic_config_path  # noqa: E402
from materializer.storage.compression import CompressionType  # noqa: E402
from materializer.storage.log import Log  # noqa: E402
from materializer.storage.log_config import LogConfig  # noqa: E402
from materializer.storage.log_loader import write_clean_shutdown_file  # noqa: E402
from materializer.storage.record_batch_builder import RecordBatchBuilder  # noqa: E402

MB = 1024.0 * 1024.0
TOPIC = "bench"
_ROUND = re.compile(
    r"cleaned log (?P<log>\S+) \(dirty section = \[(?P<start>\d+), (?P<end>\d+)\]\)\s*\n"
    r"\s*(?P<mb>[\d,.]+) MB of log processed in (?P<secs>[\d,.]+) seconds \((?P<rate>[\d,.]+) MB/sec\)\.[\s\S]*?"
    r"Indexed [\d,.]+ MB in (?P<index_secs>[\d,.]+) seconds[\s\S]*?"
    r"Start size: (?P<start_mb>[\d,.]+) MB \((?P<start_msgs>[\d,]+) messages\)\s*\n"
    r"\s*End size: (?P<end_mb>[\d,.]+) MB \((?P<end_msgs>[\d,]+) messages\)")
# log4j lines (LocalKafkaBroker's "[%d] %p %m (%c)%n") with their timestamps: a round's start
# (Cleaner.doClean's first line) and its statistics (CleanerThread.recordStats, after the swap)
_STAMP = r"^\[(?P<stamp>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})\] INFO "
_ROUND_BEGIN = re.compile(_STAMP + r"Cleaner \d+: Beginning cleaning of log (?P<log>\S+)", re.MULTILINE)
_ROUND_END = re.compile(_STAMP + r"[^\n]*\n?\s*Log cleaner thread \d+ cleaned log (?P<log>\S+) ", re.MULTILINE)


@dataclass
class Figures:
    """Throughput of one cleaner on the workload."""

    mb_read: float
    seconds: float
    records_read: int
    records_written: int
    rounds: int
    wall_s: float | None = None
    index_seconds: float | None = None
    cpu_s: float | None = None  # CPU seconds (user + system) the cleaner used: ours with its worker processes
    elapsed_s: float | None = None  # the whole job: ours = compact_topic's wall time; broker = first round start -> last round end

    @property
    def mb_per_s(self) -> float:
        return self.mb_read / self.seconds if self.seconds else float("inf")

    @property
    def records_per_s(self) -> float:
        return self.records_read / self.seconds if self.seconds else float("inf")


class Workload:
    """Deterministic stream: key indices drawn uniformly, values cycled from a random pool."""

    def __init__(self, records: int, keys: int, value_bytes: int, seed: int = 42) -> None:
        rng = random.Random(seed)
        self.records = records
        self.key_indices = [rng.randrange(keys) for _ in range(records)]
        pool = max(1, min(4096, records))
        self.values = [rng.randbytes(value_bytes // 2).hex().encode()[:value_bytes].ljust(value_bytes, b"0")
                       for _ in range(pool)]

    def key(self, i: int) -> bytes:
        return b"key-%09d" % self.key_indices[i]

    def partition(self, i: int, partitions: int) -> int:
        """Record ``i``'s partition: its key index modulo ``partitions`` (each key in one partition)."""
        return self.key_indices[i] % partitions

    def value(self, i: int) -> bytes:
        return self.values[i % len(self.values)]


def machine() -> str:
    cpu = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    java = shutil.which("java")
    java_version = ""
    if java:
        done = subprocess.run([java, "-version"], capture_output=True, text=True)
        java_version = (done.stderr.splitlines() or [""])[0]
    return (f"{os.cpu_count()} CPUs (nproc), {cpu}; Python {platform.python_version()} ({platform.machine()}); "
            f"{java_version}")


def build_local(data_dir: Path, workload: Workload, *, batch_records: int, compression: str, segment_bytes: int,
                partitions: int = 1) -> int:
    """Write the workload as ``data_dir/bench-<p>`` (``partitions`` logs); returns bytes written."""
    config = LogConfig.from_kafka_configs({"cleanup.policy": "compact", "segment.bytes": str(segment_bytes),
                                           "file.delete.delay.ms": "0"})
    path = topic_config_path(data_dir, TOPIC)
    path.parent.mkdir(parents=True, exist_ok=True)
    config.save(path)
    codec = CompressionType.from_name(compression)
    now = time.time_ns() // 1_000_000
    size = 0
    for partition in range(partitions):
        indices = [i for i in range(workload.records) if workload.partition(i, partitions) == partition]
        with Log.open(data_dir / f"{TOPIC}-{partition}", config, had_clean_shutdown=True) as log:
            offset = 0
            while offset < len(indices):
                end = min(offset + batch_records, len(indices))
                builder = RecordBatchBuilder(offset, compression=codec)
                for offset_in_log in range(offset, end):
                    i = indices[offset_in_log]
                    builder.append(offset_in_log, now, workload.key(i), workload.value(i))
                log.append_batch(builder.build())
                offset = end
            size += log.size_in_bytes
    write_clean_shutdown_file(data_dir)
    return size


def _cpu_seconds() -> float:
    """User + system CPU seconds of this process and its reaped children (the cleaner workers)."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def _process_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (``/proc/<pid>/stat``), e.g. the broker's JVM."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_local(data_dir: Path, dedupe_buffer_size: int, threads: int = 1) -> Figures:
    """``compact_topic`` in a child process of its own session, as the broker's JVM runs in its own:
    with the kernel's autogroup scheduling (``/proc/sys/kernel/sched_autogroup_enabled``) each
    session shares one slice of the CPU, so on a loaded machine a cleaner left in this script's
    session would get less CPU than the broker does in its own."""
    done = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--local-child", str(data_dir),
                           str(dedupe_buffer_size), str(threads)],
                          check=True, capture_output=True, text=True, start_new_session=True)
    return Figures(**json.loads(done.stdout.splitlines()[-1]))


def run_local_here(data_dir: Path, dedupe_buffer_size: int, threads: int = 1) -> Figures:
    """``compact_topic`` in this process: its figures (the elapsed time is its wall time)."""
    cpu = _cpu_seconds()
    started = time.perf_counter()
    results = compact_topic(data_dir, TOPIC, dedupe_buffer_size_bytes=dedupe_buffer_size, threads=threads)
    wall = time.perf_counter() - started
    cpu = _cpu_seconds() - cpu
    rounds = [r for result in results for r in result.rounds]
    return Figures(mb_read=sum(r.bytes_read for r in results) / MB, seconds=sum(r.stats.elapsed_secs for r in rounds),
                   records_read=sum(r.records_read for r in results),
                   records_written=sum(r.records_written for r in results),
                   rounds=len(rounds), wall_s=wall, index_seconds=sum(r.stats.elapsed_index_secs for r in rounds),
                   elapsed_s=wall, cpu_s=cpu)


def run_broker(state_dir: Path, workload: Workload, *, batch_records: int, compression: str, segment_bytes: int,
               dedupe_buffer_size: int, timeout_s: float, partitions: int = 1, threads: int = 1) -> Figures:
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    from materializer.local.kafka_broker import TEST_BROKER_CONFIG, LocalKafkaBroker
    from tests.integration.compaction_workloads import (
        HOLD_CLEANING_MS,
        alter_topic_configs,
        broker_log_text,
        wait_for_broker_cleaning,
    )

    config = {**TEST_BROKER_CONFIG, "log.cleaner.dedupe.buffer.size": str(dedupe_buffer_size),
              "log.cleaner.threads": str(threads)}
    with LocalKafkaBroker(state_dir, extra_config=config) as broker:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap_servers})
        topic_config = {"cleanup.policy": "compact", "segment.bytes": str(segment_bytes),
                        "min.cleanable.dirty.ratio": "0.01", "min.compaction.lag.ms": str(HOLD_CLEANING_MS)}
        admin.create_topics([NewTopic(TOPIC, partitions, 1, config=topic_config)])[TOPIC].result(30)
        while not all((broker.partition_dir(TOPIC, p) / "00000000000000000000.log").exists() for p in range(partitions)):
            time.sleep(0.05)
        producer = Producer({"bootstrap.servers": broker.bootstrap_servers, "compression.type": compression,
                             "linger.ms": 20, "batch.num.messages": batch_records, "batch.size": 16 * 1024 * 1024,
                             "queue.buffering.max.messages": 1_000_000, "enable.idempotence": False, "acks": 1})
        started = time.perf_counter()
        for i in range(workload.records):
            while True:
                try:
                    producer.produce(TOPIC, key=workload.key(i), value=workload.value(i),
                                     partition=workload.partition(i, partitions))
                    break
                except BufferError:
                    producer.poll(0.05)
            if i % 10_000 == 0:
                producer.poll(0)
        if producer.flush(300):
            raise RuntimeError("producer could not deliver the workload")
        print(f"  produced {workload.records:,} records in {time.perf_counter() - started:.1f} s", flush=True)
        time.sleep(2.0)  # let the broker settle after the produce burst (its CPU is measured from here)
        cpu = _process_cpu_seconds(broker.pid)
        alter_topic_configs(admin, TOPIC, {"min.compaction.lag.ms": "0"}, settle_s=0)
        started = time.perf_counter()
        wait_for_broker_cleaning(broker.log_dirs, TOPIC, list(range(partitions)), timeout_s=timeout_s)
        wall = time.perf_counter() - started
        cpu = _process_cpu_seconds(broker.pid) - cpu  # the whole JVM over the cleaning: an upper bound
        names = {f"{TOPIC}-{p}" for p in range(partitions)}
        deadline = time.monotonic() + 30  # the statistics are logged right after the checkpoint is written
        while True:
            text = broker_log_text(broker.cleaner_log)
            rounds = [m for m in _ROUND.finditer(text) if m["log"] in names]
            if {m["log"] for m in rounds} == names or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        if not rounds:
            raise RuntimeError(f"no cleaner statistics for {TOPIC} in {broker.cleaner_log} or server.log")

        def num(text: str) -> float:
            return float(text.replace(",", ""))

        def stamps(pattern: re.Pattern[str]) -> list[float]:
            return [datetime.strptime(m["stamp"], "%Y-%m-%d %H:%M:%S,%f").timestamp()
                    for m in pattern.finditer(text) if m["log"] in names]

        begins, ends = stamps(_ROUND_BEGIN), stamps(_ROUND_END)
        elapsed = max(ends) - min(begins) if begins and ends else None
        return Figures(mb_read=sum(num(m["mb"]) for m in rounds), seconds=sum(num(m["secs"]) for m in rounds),
                       records_read=int(sum(num(m["start_msgs"]) for m in rounds)),
                       records_written=int(sum(num(m["end_msgs"]) for m in rounds)), rounds=len(rounds),
                       wall_s=wall, index_seconds=sum(num(m["index_secs"]) for m in rounds), elapsed_s=elapsed,
                       cpu_s=cpu)


def describe(name: str, figures: Figures) -> str:
    wall = f", wall {figures.wall_s:.1f} s" if figures.wall_s is not None else ""
    if figures.index_seconds is not None:
        wall += (f"; offset map {figures.index_seconds:.2f} s, "
                 f"recopy {figures.seconds - figures.index_seconds:.2f} s")
    if figures.elapsed_s is not None:
        wall += f"; elapsed (whole job) {figures.elapsed_s:.2f} s"
    if figures.cpu_s is not None and figures.wall_s:
        wall += f"; CPU {figures.cpu_s:.2f} s ({figures.cpu_s / figures.wall_s:.2f} cores)"
    return (f"{name:>7}: {figures.mb_read:,.1f} MB / {figures.records_read:,d} records processed in "
            f"{figures.seconds:.2f} s over {figures.rounds} round(s) -> {figures.mb_per_s:,.1f} MB/s, "
            f"{figures.records_per_s:,.0f} records/s; wrote {figures.records_written:,d} records{wall}")


def main() -> None:
    if sys.argv[1:2] == ["--local-child"]:  # run_local's child: DIR DEDUPE THREADS -> Figures as JSON
        data_dir, dedupe, threads = sys.argv[2:5]
        print(json.dumps(dataclasses.asdict(run_local_here(Path(data_dir), int(dedupe), int(threads)))))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=5_000_000, help="records in the log (default 5,000,000)")
    parser.add_argument("--keys", type=int, default=500_000, help="distinct keys (default 500,000)")
    parser.add_argument("--value-bytes", type=int, default=100, help="value size, bytes (default 100)")
    parser.add_argument("--batch-records", type=int, default=100, help="records per batch (default 100)")
    parser.add_argument("--compression", default="none", choices=["none", "gzip", "snappy", "lz4", "zstd"])
    parser.add_argument("--segment-bytes", type=int, default=64 * 1024 * 1024,
                        help="segment.bytes of both logs (default 64 MiB; the broker needs >= 1 MiB)")
    parser.add_argument("--dedupe-buffer-size", type=int, default=128 * 1024 * 1024,
                        help="log.cleaner.dedupe.buffer.size of both cleaners, bytes (default Kafka's 128 MiB)")
    parser.add_argument("--partitions", type=int, default=1, help="partitions the stream is split over (default 1)")
    parser.add_argument("--threads", type=int, default=1,
                        help="cleaner threads: the broker's log.cleaner.threads and compact_topic(threads=) (default 1)")
    parser.add_argument("--skip-broker", action="store_true", help="measure only our cleaner")
    parser.add_argument("--broker-timeout", type=float, default=1800.0, help="seconds to wait for the broker's cleaner")
    parser.add_argument("--work-dir", type=Path, default=None, help="keep files here instead of a temp dir")
    args = parser.parse_args()

    print(f"command: {shlex.join([sys.executable, *sys.argv])}")
    print(f"machine: {machine()}")
    print(f"workload: {args.records:,} records, {args.keys:,} keys, {args.value_bytes}-byte values, "
          f"{args.batch_records} records/batch, codec {args.compression}, segment.bytes {args.segment_bytes:,}, "
          f"dedupe buffer {args.dedupe_buffer_size:,} bytes, {args.partitions} partition(s), "
          f"{args.threads} cleaner thread(s)", flush=True)
    print(f"load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    started = time.perf_counter()
    workload = Workload(args.records, args.keys, args.value_bytes)
    print(f"  generated the stream in {time.perf_counter() - started:.1f} s", flush=True)
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="bench-cleaner-"))
    try:
        data_dir = work / "local"
        started = time.perf_counter()
        size = build_local(data_dir, workload, batch_records=args.batch_records, compression=args.compression,
                           segment_bytes=args.segment_bytes, partitions=args.partitions)
        print(f"  wrote the local log ({size / MB:,.1f} MB) in {time.perf_counter() - started:.1f} s", flush=True)
        load = os.getloadavg()[0]
        local = run_local(data_dir, args.dedupe_buffer_size, args.threads)
        print(describe("local", local) + f"; load average before {load:.2f}", flush=True)
        if args.skip_broker:
            return
        shutil.rmtree(data_dir, ignore_errors=True)
        broker = run_broker(work / "broker", workload, batch_records=args.batch_records, compression=args.compression,
                            segment_bytes=args.segment_bytes, dedupe_buffer_size=args.dedupe_buffer_size,
                            timeout_s=args.broker_timeout, partitions=args.partitions, threads=args.threads)
        print(describe("broker", broker) + f"; load average after {os.getloadavg()[0]:.2f}")
        print(f"  ratio local/broker: {local.mb_per_s / broker.mb_per_s:.3f} x MB/s, "
              f"{local.records_per_s / broker.records_per_s:.3f} x records/s (summed round times)")
        if broker.elapsed_s and local.elapsed_s:
            print(f"  ratio of the whole job (broker elapsed / ours): {broker.elapsed_s / local.elapsed_s:.3f} x")
        if broker.cpu_s and local.cpu_s:
            print(f"  ratio of CPU seconds (broker JVM / ours): {broker.cpu_s / local.cpu_s:.3f} x")
    finally:
        if args.work_dir is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
