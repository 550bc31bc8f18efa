"""Peak memory of `materializer run` and `materializer compact` as the topic grows (issue 11).

For each size in ``--records`` (default 1M and 10M), a compacted topic gets that many records
(``--keys-per-record`` distinct keys per record: 10% by default, so 100k and 1M keys), produced
with confluent-kafka to a local Apache Kafka broker (official jars). Then, each in a fresh Python
process whose peak resident set size (``getrusage(RUSAGE_SELF).ru_maxrss``) is printed:

* ``materializer run --until-caught-up`` from an empty data dir (replica fetch, the default; the
  background cleaner off, so that only ingest and apply are measured);
* ``materializer compact`` of that data dir: one cleaning round over every partition with the
  default 128 MiB offset map (``log.cleaner.dedupe.buffer.size``), as Kafka sizes it.

"Flat in topic size" means the peak does not grow with the record count: ingest holds at most
one Fetch response (``fetch.max.bytes``, 50 MiB) and the entries of one apply; the cleaner's
offset map is bounded by the dedupe buffer, whatever the number of keys.

Run: ``.venv/bin/python benchmarks/bench_memory.py [--records 1000000,10000000]``.
"""

from __future__ import annotations

import argparse
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from confluent_kafka.admin import AdminClient, NewTopic

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_materializer import TOPIC, Workload, machine, produce  # noqa: E402

from materializer.local.kafka_broker import KAFKA_VERSION, TEST_BROKER_CONFIG, LocalKafkaBroker  # noqa: E402

# Runs one CLI command in this process and prints its peak RSS (KiB on Linux) on the last line.
_MEASURE = """
import resource, sys
from materializer.cli import main
try:
    main(sys.argv[1:], standalone_mode=False)
finally:
    print("maxrss_kib", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""


def measure(args: list[str]) -> tuple[float, float, str]:
    """Run ``materializer ARGS`` in a fresh interpreter: (seconds, peak RSS MiB, its output)."""
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", _MEASURE, *args], capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"materializer {shlex.join(args)} failed:\n{done.stdout}\n{done.stderr}")
    last = done.stdout.strip().splitlines()[-1]
    return seconds, int(last.split()[1]) / 1024.0, done.stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", default="1000000,10000000",
                        help="comma-separated topic sizes, records (default 1,000,000 and 10,000,000)")
    parser.add_argument("--keys-per-record", type=float, default=0.1, help="distinct keys / records (default 0.1)")
    parser.add_argument("--value-bytes", type=int, default=100, help="value size, bytes (default 100)")
    parser.add_argument("--partitions", type=int, default=4, help="topic partitions (default 4)")
    parser.add_argument("--compression", default="lz4", help="producer codec (default lz4)")
    args = parser.parse_args()
    sizes = [int(s) for s in args.records.split(",")]
    print(f"command: {shlex.join([sys.executable, *sys.argv])}")
    print(f"machine: {machine()}")
    work = Path(tempfile.mkdtemp(prefix="bench-memory-"))
    rows = []
    try:
        with LocalKafkaBroker(work / "broker", extra_config=dict(TEST_BROKER_CONFIG)) as broker:
            bootstrap = broker.bootstrap_servers
            print(f"broker: Kafka {KAFKA_VERSION} at {bootstrap}", flush=True)
            for records in sizes:
                keys = max(1, int(records * args.keys_per_record))
                topic = f"{TOPIC}-{records}"
                admin = AdminClient({"bootstrap.servers": bootstrap})
                admin.create_topics(
                    [NewTopic(topic, args.partitions, 1, config={"cleanup.policy": "compact"})])[topic].result(60)
                workload = Workload(keys, args.value_bytes, args.partitions, 0.01)
                import bench_materializer

                bench_materializer.TOPIC = topic  # produce() writes to the module's TOPIC
                produce_s = produce(bootstrap, workload, 0, records, args.compression)
                print(f"{records:,} records ({keys:,} keys) produced in {produce_s:.1f} s", flush=True)
                data_dir = work / f"data-{records}"
                run_s, run_mib, _ = measure(["run", "--bootstrap-servers", bootstrap, "--topic", topic,
                                             "--data-dir", str(data_dir), "--until-caught-up", "--no-progress",
                                             "--cleaner-threads", "0"])
                log_bytes = sum(f.stat().st_size for f in data_dir.glob(f"{topic}-*/*.log"))
                compact_s, compact_mib, _ = measure(["compact", "--data-dir", str(data_dir), "--topic", topic,
                                                     "--no-progress"])
                rows.append((records, keys, log_bytes, run_s, run_mib, compact_s, compact_mib))
                print(f"  run {run_s:.1f} s, peak RSS {run_mib:.0f} MiB; compact {compact_s:.1f} s, "
                      f"peak RSS {compact_mib:.0f} MiB", flush=True)
                shutil.rmtree(data_dir, ignore_errors=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"\n  {'records':>12} {'keys':>10} {'log MiB':>8} {'run s':>7} {'run RSS MiB':>12} "
          f"{'compact s':>10} {'compact RSS MiB':>16}")
    for records, keys, log_bytes, run_s, run_mib, compact_s, compact_mib in rows:
        print(f"  {records:>12,} {keys:>10,} {log_bytes / 2**20:>8.0f} {run_s:>7.1f} {run_mib:>12.0f} "
              f"{compact_s:>10.1f} {compact_mib:>16.0f}")


if __name__ == "__main__":
    main()
