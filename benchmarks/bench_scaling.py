"""How the materializer's costs grow with the topic: cold start, warm start, compact, restore and
peak RSS at one topic size per run (issue 24, Deliver 3), and the cold start with one core busy.

A script, not a test. On a LocalKafkaBroker (official Kafka jars) it creates the compacted topic of
``bench_materializer.py`` (``--records`` records over ``--keys`` keys, ``--value-bytes`` values,
1% tombstones, 4 partitions, lz4, the broker's cleaner held back) and then, ``--repeat`` rounds,
each case in a fresh Python process that prints its own seconds and peak RSS
(``getrusage(RUSAGE_SELF).ru_maxrss``):

* **cold start**: ``Materializer.run(until_caught_up=True)`` (replica fetch) from an empty data
  dir, seconds to ready (every partition at the high watermark seen at start, all in RocksDB;
  close excluded);
* **cold start, one core busy**: the same while another process spins on one core (the machine's
  load about one higher), run right after the quiet one in the same round;
* **warm start**: the same on the caught-up data dir (log and store kept, nothing new to fetch);
* **compact**: ``compact_topic`` of every partition up to its log end offset (one cleaning round,
  one thread) on a copy of the caught-up data dir;
* **restore**: the compacted copy with its state store deleted, ``Materializer.run``: the store is
  rebuilt from the local compacted log (nothing fetched), seconds to ready.

The cases run round-robin (round 1: every case, then round 2 ...); the best round is kept and the
range printed. Compare sizes by ratios within the machine's noise (2 cores), and print the load.

    .venv/bin/python benchmarks/bench_scaling.py --records 1000000 --keys 100000
    .venv/bin/python benchmarks/bench_scaling.py --records 5000000 --keys 1000000 --repeat 2
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_materializer import MB, TOPIC, Workload, log_bytes, machine, prepare_topic  # noqa: E402

from materializer.datadir.layout import partition_dir, state_dir  # noqa: E402
from materializer.local.kafka_broker import KAFKA_VERSION, TEST_BROKER_CONFIG, LocalKafkaBroker  # noqa: E402

CASES = ("cold", "cold_busy", "warm", "compact", "restore")
TITLES = {"cold": "cold start (empty data dir)", "cold_busy": "cold start, another process busy on one core",
          "warm": "warm start (log and store kept)", "compact": "compact (one round, every partition)",
          "restore": "restore (store rebuilt from the compacted log)"}


def child(case: str, data_dir: Path, bootstrap: str, partitions: int) -> None:
    """One measurement in this fresh process: prints ``{"seconds", "rss_mib", ...}`` as JSON."""
    import resource

    from bench_materializer import run_materializer, store_key_count

    from materializer.offline.compact import compact_topic
    from materializer.storage.log import Log
    from materializer.storage.log_config import LogConfig

    notes: dict[str, object] = {}
    if case == "compact":
        ends = {}  # each partition's log end offset: the round cleans the whole log, as bench_materializer's case 5
        for p in range(partitions):
            log = Log.open(partition_dir(data_dir, TOPIC, p), LogConfig(), had_clean_shutdown=True)
            ends[p] = log.log_end_offset
            log.close()
        started = time.perf_counter()
        done = []
        for p in range(partitions):
            done += compact_topic(data_dir, TOPIC, partition=p, upto_offset=ends[p])
        seconds = time.perf_counter() - started
        notes["records"] = sum(c.records_read for c in done)
        notes["kept"] = sum(c.records_written for c in done)
        rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    else:
        run = run_materializer(bootstrap, data_dir)
        rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # before the count below reads the store
        seconds = run.seconds - run.parts["close"]
        notes["records"] = run.notes["records_fetched"] if case != "restore" else run.notes["records_replayed"]
        notes["fetched"] = run.notes["records_fetched"]
        notes["entries"] = store_key_count(data_dir)
    print(json.dumps({"seconds": seconds, "rss_mib": rss_mib, **notes}))


def measure(case: str, data_dir: Path, bootstrap: str, partitions: int) -> dict:
    """Run ``case`` in a fresh interpreter; returns its JSON line plus the load average."""
    load = os.getloadavg()[0]
    done = subprocess.run([sys.executable, __file__, "--child", case, str(data_dir), bootstrap, str(partitions)],
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"case {case} failed:\n{done.stdout}\n{done.stderr}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    result["load"] = load
    return result


def busy_core() -> subprocess.Popen:
    """Another process spinning on one core until killed."""
    return subprocess.Popen([sys.executable, "-c", "while True: pass"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1_000_000, help="records produced (default 1,000,000)")
    parser.add_argument("--keys", type=int, default=100_000, help="distinct keys (default 100,000)")
    parser.add_argument("--value-bytes", type=int, default=100, help="value size, bytes (default 100)")
    parser.add_argument("--partitions", type=int, default=4, help="topic partitions (default 4)")
    parser.add_argument("--repeat", type=int, default=3, help="rounds, best kept (default 3)")
    parser.add_argument("--child", nargs=4, metavar=("CASE", "DIR", "BOOTSTRAP", "PARTITIONS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        case, data_dir, bootstrap, partitions = args.child
        child(case, Path(data_dir), bootstrap, int(partitions))
        return
    # what prepare_topic reads of bench_materializer's arguments
    args.compression, args.segment_bytes, args.tombstone_ratio = "lz4", 16 << 20, 0.01
    print(f"command: {' '.join([sys.executable, *sys.argv])}")
    print(f"machine: {machine()}")
    print(f"workload: {args.records:,} records, {args.keys:,} keys, {args.value_bytes}-byte values, 1% tombstones, "
          f"{args.partitions} partitions, lz4; best of {args.repeat}", flush=True)
    work = Path(tempfile.mkdtemp(prefix="bench-scaling-"))
    results: dict[str, list[dict]] = {case: [] for case in CASES}
    try:
        workload = Workload(args.keys, args.value_bytes, args.partitions, args.tombstone_ratio)
        with LocalKafkaBroker(work / "broker", extra_config=dict(TEST_BROKER_CONFIG)) as broker:
            bootstrap = broker.bootstrap_servers
            print(f"broker: Kafka {KAFKA_VERSION} at {bootstrap}", flush=True)
            r: dict = {}
            prepare_topic(args, bootstrap, broker, workload, r)
            for round_ in range(args.repeat):
                print(f"  round {round_ + 1}/{args.repeat} (load average {os.getloadavg()[0]:.2f})", flush=True)
                data_dir = work / "cold"
                shutil.rmtree(data_dir, ignore_errors=True)
                results["cold"].append(measure("cold", data_dir, bootstrap, args.partitions))
                busy_dir = work / "cold-busy"
                shutil.rmtree(busy_dir, ignore_errors=True)
                spinner = busy_core()
                try:
                    time.sleep(0.5)
                    results["cold_busy"].append(measure("cold", busy_dir, bootstrap, args.partitions))
                finally:
                    spinner.kill()
                    spinner.wait()
                shutil.rmtree(busy_dir, ignore_errors=True)
                results["warm"].append(measure("warm", data_dir, bootstrap, args.partitions))
                compacted = work / "compacted"
                shutil.rmtree(compacted, ignore_errors=True)
                shutil.copytree(data_dir, compacted)
                results["compact"].append(measure("compact", compacted, bootstrap, args.partitions))
                shutil.rmtree(state_dir(compacted, TOPIC))
                results["restore"].append(measure("restore", compacted, bootstrap, args.partitions))
                for case in CASES:
                    last = results[case][-1]
                    print(f"    {case}: {last['seconds']:.2f} s, peak RSS {last['rss_mib']:.0f} MiB, "
                          f"{last['records']:,} records (load {last['load']:.2f})", flush=True)
            local_log = log_bytes(work / "cold", args.partitions)
            compacted_log = log_bytes(work / "compacted", args.partitions)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"\n{args.records:,} records, {args.keys:,} keys; local log {local_log / MB:,.1f} MiB, compacted "
          f"{compacted_log / MB:,.1f} MiB; best of {args.repeat} (fastest-slowest), peak RSS of the best round:")
    print(f"  {'case':<48} {'seconds':>8} {'rounds':>12} {'peak RSS MiB':>13}")
    for case in CASES:
        runs = results[case]
        fastest = min(runs, key=lambda run: run["seconds"])
        spread = f"{fastest['seconds']:.2f}-{max(run['seconds'] for run in runs):.2f}"
        print(f"  {TITLES[case]:<48} {fastest['seconds']:>8.2f} {spread:>12} {fastest['rss_mib']:>13.0f}")
    ratios = [busy["seconds"] / quiet["seconds"] for busy, quiet in zip(results["cold_busy"], results["cold"])]
    print(f"  cold start busy / quiet, per round: {', '.join(f'{ratio:.2f}' for ratio in ratios)}")
    entries = {case: results[case][-1].get("entries") for case in ("cold", "warm", "restore")}
    print(f"  live entries after cold start / warm start / restore (last round): {entries}")


if __name__ == "__main__":
    main()
