"""Before and after a change: the same cases timed with two installed checkouts, alternating, on one broker.

A script, not a test. It starts one LocalKafkaBroker, creates a compacted topic (``--partitions``
partitions, lz4, the broker's cleaner held back) and produces ``--records`` records over ``--keys``
keys with the workload of ``bench_materializer.py``. Then, ``--rounds`` times, for each
interpreter given with ``--python`` in turn (each a virtualenv holding one checkout installed), it
times in a fresh process:

1. **cold replica**: ``Materializer.start`` + ``run(until_caught_up=True)`` into an empty data dir,
   ``fetch="replica"`` (close excluded);
2. **cold consumer**: the same with ``fetch="consumer"``;
3. **warm start**: the data dir of 1 again (log and store kept, nothing to fetch): start + run;
4. **store rebuild**: the data dir of 1 with its state store deleted: start + run (the store is
   rebuilt from the local log, nothing fetched);
5. **compact**: ``materializer compact`` on a copy of the data dir of 1 (the whole process, so
   import time is in it: the same for both checkouts only if their imports cost the same).

Only the public API (``Materializer``, ``MaterializerOptions``) and the CLI are used, so any two
checkouts since the API settled can be compared. Alternating the checkouts round by round puts the
machine's noise on both (after one uncounted warm-up round); the table gives the best and the median per case and the ratio of medians.

    python benchmarks/bench_checkouts.py --python /work/wt-before/.venv/bin/python --python .venv/bin/python
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_materializer import TOPIC, Workload, machine, produce  # noqa: E402
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402

from materializer.local.kafka_broker import TEST_BROKER_CONFIG, LocalKafkaBroker  # noqa: E402

#: Runs in the checkout's interpreter: prints the seconds of start + run (close excluded) as JSON.
DRIVER = """
import json, sys, time
from materializer import Materializer, MaterializerOptions
bootstrap, topic, data_dir, fetch = sys.argv[1:5]
options = MaterializerOptions(progress=False, fetch=fetch, cleaner_threads=0,
                              config_overrides={"min.compaction.lag.ms": "0"})
started = time.perf_counter()
m = Materializer(bootstrap, topic, data_dir, options=options)
try:
    m.start()
    stats = m.run(until_caught_up=True)
    seconds = time.perf_counter() - started
finally:
    m.close()
print(json.dumps({"seconds": seconds, "fetched": stats.records_fetched, "rebuilt": stats.store_rebuilt}))
"""

CASES = ("cold replica", "cold consumer", "warm start", "store rebuild", "compact")


def run_driver(python: str, bootstrap: str, data_dir: Path, fetch: str) -> dict:
    """One Materializer run in ``python``'s checkout; returns the driver's JSON line."""
    # run outside any checkout: ``python -c`` puts the working directory first on sys.path, and a
    # checkout there would shadow the interpreter's own
    done = subprocess.run([python, "-c", DRIVER, bootstrap, TOPIC, str(data_dir), fetch],
                          capture_output=True, text=True, check=False, cwd=data_dir.parent)
    if done.returncode != 0:
        raise RuntimeError(f"{python}: driver failed (exit {done.returncode}):\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def compact_seconds(python: str, data_dir: Path) -> float:
    """Wall seconds of ``materializer compact`` on ``data_dir`` run by ``python``."""
    started = time.perf_counter()
    subprocess.run([python, "-m", "materializer", "compact", "--data-dir", str(data_dir), "--topic", TOPIC,
                    "--quiet", "--no-progress"], check=True, capture_output=True, cwd=data_dir.parent)
    return time.perf_counter() - started


def one_round(python: str, bootstrap: str, work: Path, cases: tuple[str, ...]) -> dict[str, float]:
    """``cases`` (of :data:`CASES`) once with ``python``; returns seconds per case. The store
    rebuild and compact start from the data dir of a cold replica run (made uncounted when that
    case is not asked for)."""
    seconds: dict[str, float] = {}
    replica_dir, consumer_dir = work / "replica", work / "consumer"
    for path in (replica_dir, consumer_dir, work / "compact"):
        shutil.rmtree(path, ignore_errors=True)
    work.mkdir(parents=True, exist_ok=True)
    cold = run_driver(python, bootstrap, replica_dir, "replica")["seconds"]
    if "cold replica" in cases:
        seconds["cold replica"] = cold
    if "cold consumer" in cases:
        seconds["cold consumer"] = run_driver(python, bootstrap, consumer_dir, "consumer")["seconds"]
    if "compact" in cases:
        shutil.copytree(replica_dir, work / "compact")
    if "warm start" in cases:  # the caught-up data dir again: log and store kept, nothing to fetch
        warm = run_driver(python, bootstrap, replica_dir, "replica")
        if warm["fetched"] or warm["rebuilt"]:
            raise RuntimeError(f"{python}: the warm start fetched {warm['fetched']} records (rebuilt: {warm['rebuilt']})")
        seconds["warm start"] = warm["seconds"]
    if "store rebuild" in cases:
        shutil.rmtree(replica_dir / "state")
        rebuild = run_driver(python, bootstrap, replica_dir, "replica")
        if not rebuild["rebuilt"] or rebuild["fetched"]:
            raise RuntimeError(f"{python}: the store rebuild fetched {rebuild['fetched']} records (rebuilt: "
                               f"{rebuild['rebuilt']})")
        seconds["store rebuild"] = rebuild["seconds"]
    if "compact" in cases:
        seconds["compact"] = compact_seconds(python, work / "compact")
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", action="append", required=True,
                        help="interpreter of a virtualenv holding one checkout (give two or more)")
    parser.add_argument("--records", type=int, default=1_000_000, help="records produced (default 1,000,000)")
    parser.add_argument("--keys", type=int, default=100_000, help="distinct keys (default 100,000)")
    parser.add_argument("--partitions", type=int, default=4, help="topic partitions (default 4)")
    parser.add_argument("--rounds", type=int, default=5, help="rounds; each runs every checkout once (default 5)")
    parser.add_argument("--case", action="append", choices=CASES, default=None,
                        help="a case to time (repeatable; default: all five)")
    args = parser.parse_args()
    args.python = [os.path.abspath(python) for python in args.python]  # the drivers run in the work dir
    cases = tuple(args.case or CASES)

    print(f"command: {shlex.join([sys.executable, *sys.argv])}")
    print(f"machine: {machine()}", flush=True)
    work = Path(tempfile.mkdtemp(prefix="bench-checkouts-"))
    times: dict[str, dict[str, list[float]]] = {p: {c: [] for c in cases} for p in args.python}
    try:
        with LocalKafkaBroker(work / "broker", extra_config=TEST_BROKER_CONFIG) as broker:
            bootstrap = broker.bootstrap_servers
            admin = AdminClient({"bootstrap.servers": bootstrap})
            config = {"cleanup.policy": "compact", "compression.type": "lz4", "min.compaction.lag.ms": "3600000",
                      "segment.bytes": str(16 * 1024 * 1024)}
            admin.create_topics([NewTopic(TOPIC, args.partitions, 1, config=config)])[TOPIC].result(30)
            workload = Workload(args.keys, 100, args.partitions, 0.01)
            print(f"produced {args.records:,} records in {produce(bootstrap, workload, 0, args.records, 'lz4'):.1f} s",
                  flush=True)
            one_round(args.python[0], bootstrap, work / "run", cases)  # warm-up, not counted: the broker's JIT, page cache
            for round_no in range(args.rounds):
                for python in args.python:
                    seconds = one_round(python, bootstrap, work / "run", cases)
                    for case, s in seconds.items():
                        times[python][case].append(s)
                    print(f"round {round_no + 1} {python}: "
                          + ", ".join(f"{c} {s:.2f} s" for c, s in seconds.items()), flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    first = args.python[0]
    print(f"\n{'case':<15}" + "".join(f"{'best / median ' + str(i + 1):>24}" for i in range(len(args.python)))
          + "   median ratio (n / 1)")
    for case in cases:
        cells = [(min(times[p][case]), statistics.median(times[p][case])) for p in args.python]
        ratios = " ".join(f"{statistics.median(times[p][case]) / statistics.median(times[first][case]):.2f}"
                          for p in args.python[1:])
        print(f"{case:<15}" + "".join(f"{best:>12.2f}{median:>12.2f}" for best, median in cells) + f"   {ratios}")
    for i, python in enumerate(args.python):
        print(f"  {i + 1}: {python}")


if __name__ == "__main__":
    main()
