"""Peak RSS of several state stores written at once, each sized by RocksDB alone against all of them
under one ``StoreMemory`` budget (``materializer run --store-memory-mb``).

A script, not a test. Each case runs in a fresh process: ``--stores`` state stores (as a process
with a store per topic holds them) each take ``--mb-per-store`` MiB of updates through
``StateStore.apply`` (the steady-state write path: a WriteBatch into the memtables; a cold start's
bulk load writes SST files instead), 1,000 records of ``--value-bytes`` random bytes per apply, the
stores taking turns. Prints per case: seconds, write MB/s, the process's peak RSS (ru_maxrss), the
SST files flushed, and the budget's cache and memtable use at the end.

    .venv/bin/python benchmarks/bench_store_memory.py                      # 8 stores x 96 MiB, budgets 0 and 64 MiB
    .venv/bin/python benchmarks/bench_store_memory.py --budgets 0,32,128
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def one_case(stores: int, mb_per_store: int, value_bytes: int, budget_mb: int, work: Path) -> dict:
    """Write the stores in this process; returns the figures."""
    from materializer.adapters.rocksdb_store import StateStore, StateStoreOptions, StoreMemory
    from materializer.storage.record_batch import Record

    memory = StoreMemory(budget_mb << 20) if budget_mb else None
    options = StateStoreOptions(memory=memory)
    opened = [StateStore(work / f"store-{n}", options) for n in range(stores)]
    values = [os.urandom(value_bytes) for _ in range(4096)]
    per_apply = 1000
    rounds = max(1, (mb_per_store << 20) // (per_apply * (value_bytes + 13)))
    started = time.perf_counter()
    for round_ in range(rounds):
        for n, store in enumerate(opened):
            first = round_ * per_apply
            batch = [Record(first + i, 0, b"key-%08d" % (first + i), values[(first + i) % len(values)])
                     for i in range(per_apply)]
            store.apply({n: batch}, {n: first + per_apply})
    seconds = time.perf_counter() - started
    written = stores * rounds * per_apply * (value_bytes + 13)
    figures = {"seconds": seconds, "mb_per_s": written / seconds / 1e6, "written_mb": written / 1e6,
               "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
               "sst_files": sum(len(list((work / f"store-{n}").glob("*.sst"))) for n in range(stores)),
               "cache_mib": memory.used_bytes / 2**20 if memory else None,
               "memtables_mib": memory.memtable_bytes / 2**20 if memory else None}
    for store in opened:
        store.close()
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stores", type=int, default=8, help="state stores written at once (default 8)")
    parser.add_argument("--mb-per-store", type=int, default=96, help="MiB of updates per store (default 96)")
    parser.add_argument("--value-bytes", type=int, default=100, help="value size, bytes (default 100)")
    parser.add_argument("--budgets", default="0,64",
                        help="comma-separated StoreMemory budgets, MiB; 0 = none (default 0,64)")
    parser.add_argument("--case", type=int, default=None, help=argparse.SUPPRESS)  # one case, in a child
    args = parser.parse_args()
    if args.case is not None:
        with tempfile.TemporaryDirectory(prefix="bench-store-memory-") as work:
            print(json.dumps(one_case(args.stores, args.mb_per_store, args.value_bytes, args.case, Path(work))))
        return
    print(f"command: {shlex.join([sys.executable, *sys.argv])}")
    print(f"machine: {os.cpu_count()} CPUs; {args.stores} stores x {args.mb_per_store} MiB of updates, "
          f"{args.value_bytes}-byte values, 1,000 records per apply")
    print(f"{'budget':>10} {'seconds':>8} {'MB/s':>7} {'peak RSS MiB':>13} {'SST files':>10} {'cache MiB':>10} "
          f"{'memtables MiB':>14}")
    for budget in (int(b) for b in args.budgets.split(",")):
        child = subprocess.run([sys.executable, __file__, "--stores", str(args.stores), "--mb-per-store",
                                str(args.mb_per_store), "--value-bytes", str(args.value_bytes), "--case", str(budget)],
                               capture_output=True, text=True, check=True)
        r = json.loads(child.stdout.splitlines()[-1])
        label = f"{budget} MiB" if budget else "none"
        cache = "-" if r["cache_mib"] is None else f"{r['cache_mib']:.1f}"
        memtables = "-" if r["memtables_mib"] is None else f"{r['memtables_mib']:.1f}"
        print(f"{label:>10} {r['seconds']:8.2f} {r['mb_per_s']:7.0f} {r['peak_rss_mib']:13.0f} {r['sst_files']:10d} "
              f"{cache:>10} {memtables:>14}", flush=True)


if __name__ == "__main__":
    main()
