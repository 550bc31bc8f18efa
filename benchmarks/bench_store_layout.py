"""One RocksDB per topic (the project's layout) against ONE RocksDB with a column family per topic,
both under one shared ``StoreMemory`` budget or none (issue 25, Deliver 3: "one store, a column
family per topic"). A script, not a test: the measurement behind keeping one store per topic.

Each case runs in a fresh subprocess (peak RSS = that process's VmHWM). Per case: ``--topics`` N
topics, each written ``--records`` records (16-byte keys drawn from ``--keys`` keys,
``--value-bytes`` values) in WriteBatches of ``--batch`` puts plus the partition's next offset,
the topics written round-robin as one process materializing several topics writes them.

Layouts:
  a  N separate databases: real :class:`StateStore` objects (``StateStoreOptions(memory=...)``),
     written with ``StateStore.apply``, read with ``StateStore.get(key, partition=0)``.
  b  ONE database; per topic two column families ``t<n>.data`` and ``t<n>.metadata`` (the same
     per-column-family options), each written and read by the store's own code attached to the
     topic's column families (:func:`cf_topic`: ``StateStore.apply``'s write path, ``get``), so
     both layouts run the same Python per record.
Budget: 0 = none; M = one ``StoreMemory(M MiB)`` shared by everything in the process.

Prints, per layout, N and budget (ranges over ``--repeats``): write time, peak RSS, open files
(fds), files / SST / WAL files in the database folders, L0 files, close and reopen times, 100k
random point reads after the reopen, and the time to drop one topic's state.

    .venv/bin/python benchmarks/bench_store_layout.py                       # N = 8 and 32, 3 repeats
    .venv/bin/python benchmarks/bench_store_layout.py --topics 8 --repeats 1
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def proc_status() -> dict[str, int]:
    out = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(("VmHWM", "VmRSS")):
            k, v = line.split(":")
            out[k] = int(v.split()[0]) // 1024  # MiB
    return out


def fd_count() -> int:
    return len(os.listdir("/proc/self/fd"))


def dir_stats(dirs: list[Path]) -> dict[str, float]:
    files = sst = wal = wal_bytes = 0
    size = 0
    for d in dirs:
        for root, _, names in os.walk(d):
            for n in names:
                p = os.path.join(root, n)
                try:
                    st = os.stat(p)
                except FileNotFoundError:
                    continue
                files += 1
                size += st.st_size
                sst += n.endswith(".sst")
                if n.endswith(".log") and n != "LOG":
                    wal += 1
                    wal_bytes += st.st_size
    return {"files": files, "sst": sst, "wal": wal, "wal_mib": wal_bytes / 2**20, "disk_mib": size / 2**20}


def l0_files(stores) -> int:
    return sum(s._data.property_int_value("rocksdb.num-files-at-level0") or 0 for s in stores)


def pending_mib(stores) -> float:
    return sum(s._data.property_int_value("rocksdb.estimate-pending-compaction-bytes") or 0 for s in stores) / 2**20


def cf_topic(db, n: int, options, path: Path):
    """Topic ``n`` of the shared DB: a store on its two column families ``t<n>.data`` and
    ``t<n>.metadata``, written and read by the store's own code (``StateStore.apply`` through the one
    write path, ``StateStore.get``): the product's ``StoreWrites`` attached to those column families
    instead of a RocksDB of its own."""
    from materializer.adapters.rocksdb_store.writes import StoreWrites

    topic = StoreWrites()
    topic.path, topic.options, topic.read_only = path, options, False
    topic._write_options = options.to_write_options()
    topic._attach(db, f"t{n}.data", f"t{n}.metadata", existed=False)  # writes the format version once
    return topic


def one_case(layout: str, topics: int, budget_mb: int, args, work: Path) -> dict:
    from materializer.adapters.rocksdb_store import StateStore, StateStoreOptions
    from materializer.adapters.rocksdb_store import StoreMemory
    from materializer.storage.record_batch import Record
    from rocksdict import Rdict

    fig: dict = {"baseline_rss_mib": proc_status()["VmRSS"]}
    memory = StoreMemory(budget_mb << 20) if budget_mb else None
    sopts = StateStoreOptions(memory=memory)

    def cf_names() -> list[str]:
        return [f"t{n}.{kind}" for n in range(topics) for kind in ("data", "metadata")]

    # -- open
    t0 = time.perf_counter()
    if layout == "a":
        dirs = [work / f"store-{n}" for n in range(topics)]
        stores = [StateStore(d, sopts) for d in dirs]
        db = None
    else:
        dirs = [work / "shared"]
        db = Rdict(str(dirs[0]), sopts.to_options(),
                   column_families={name: sopts.to_options() for name in cf_names()})
        stores = [cf_topic(db, n, sopts, dirs[0]) for n in range(topics)]
    fig["open_s"] = time.perf_counter() - t0

    # -- data
    keys = [b"key-%012d" % i for i in range(args.keys)]  # 16 bytes
    assert all(len(k) == 16 for k in keys[:3])
    rng = random.Random(1234)
    values = [rng.randbytes(args.value_bytes) for _ in range(4096)]
    seq = [rng.randrange(args.keys) for _ in range(args.records)]  # key index per offset
    rounds = args.records // args.batch

    # -- write, topics round-robin
    t0 = time.perf_counter()
    per = args.batch
    for r in range(rounds):
        first = r * per
        for n, store in enumerate(stores):
            shift = n * 7919
            batch = [Record(first + i, 1_700_000_000_000 + first + i, keys[(seq[first + i] + shift) % args.keys],
                            values[(first + i + n) & 4095]) for i in range(per)]
            store.apply({0: batch}, {0: first + per})
    fig["write_s"] = time.perf_counter() - t0
    del store  # a topic of the shared DB keeps it (and its LOCK) alive
    fig["records"] = rounds * per * topics
    st = proc_status()
    fig["hwm_after_write_mib"] = st["VmHWM"]
    fig["rss_after_write_mib"] = st["VmRSS"]
    fig["fds_after_write"] = fd_count()
    fig["l0_after_write"] = l0_files(stores)
    fig["pending_mib_after_write"] = pending_mib(stores)
    fig.update({f"{k}_after_write": v for k, v in dir_stats(dirs).items()})
    if memory is not None:
        fig["cache_mib"] = memory.used_bytes / 2**20
        fig["memtables_mib"] = memory.memtable_bytes / 2**20

    # -- close and reopen
    t0 = time.perf_counter()
    if layout == "a":
        for s in stores:
            s.close()
    else:
        stores = []
        gc.collect()
        db.close()
        db = None
    fig["close_s"] = time.perf_counter() - t0
    fig.update({f"{k}_after_close": v for k, v in dir_stats(dirs).items()})
    t0 = time.perf_counter()
    if layout == "a":
        stores = [StateStore(d, sopts) for d in dirs]
    else:
        db = Rdict(str(dirs[0]), sopts.to_options(),
                   column_families={name: sopts.to_options() for name in cf_names()})
        stores = [cf_topic(db, n, sopts, dirs[0]) for n in range(topics)]
    fig["reopen_s"] = time.perf_counter() - t0
    fig["fds_after_reopen"] = fd_count()
    fig["l0_after_reopen"] = l0_files(stores)

    # -- random reads
    rr = random.Random(99)
    picks = [(rr.randrange(topics), keys[rr.randrange(args.keys)]) for _ in range(args.reads)]
    t0 = time.perf_counter()
    found = 0
    for n, k in picks:
        found += stores[n].get(k, 0) is not None
    fig["read_s"] = time.perf_counter() - t0
    fig["read_found"] = found
    fig["fds_after_read"] = fd_count()

    # -- drop one topic's state
    t0 = time.perf_counter()
    if layout == "a":
        stores[0].close()
        StateStore.destroy(dirs[0])
    else:
        db.drop_column_family("t0.data")
        db.drop_column_family("t0.metadata")
    fig["drop_topic_s"] = time.perf_counter() - t0
    fig["disk_mib_after_drop"] = dir_stats(dirs)["disk_mib"]

    if layout == "a":
        for s in stores[1:]:
            s.close()
    else:
        stores = []
        db.close()
    fig["disk_mib_after_drop_close"] = dir_stats(dirs)["disk_mib"]
    fig["hwm_end_mib"] = proc_status()["VmHWM"]
    return fig


COLS = [("write_s", "write s", "{:.1f}"), ("hwm_after_write_mib", "HWM@write", "{:.0f}"),
        ("hwm_end_mib", "HWM end", "{:.0f}"), ("rss_after_write_mib", "RSS@write", "{:.0f}"),
        ("fds_after_write", "fds", "{:.0f}"), ("fds_after_reopen", "fds reopen", "{:.0f}"),
        ("files_after_write", "files", "{:.0f}"), ("sst_after_write", "sst", "{:.0f}"),
        ("wal_after_write", "wal", "{:.0f}"), ("wal_mib_after_write", "wal MiB", "{:.0f}"),
        ("l0_after_write", "L0@write", "{:.0f}"), ("l0_after_reopen", "L0@reopen", "{:.0f}"), ("close_s", "close s", "{:.2f}"),
        ("reopen_s", "reopen s", "{:.2f}"), ("read_s", "reads s", "{:.2f}"),
        ("drop_topic_s", "drop s", "{:.3f}"), ("memtables_mib", "memtbl MiB", "{:.0f}")]


def fmt_range(vals, f):
    vals = [v for v in vals if v is not None]
    if not vals:
        return "-"
    lo, hi = min(vals), max(vals)
    a, b = f.format(lo), f.format(hi)
    return a if a == b else f"{a}-{b}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--topics", default="8,32")
    p.add_argument("--layouts", default="a,b")
    p.add_argument("--budgets", default="64,0")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--records", type=int, default=200_000)
    p.add_argument("--keys", type=int, default=50_000)
    p.add_argument("--value-bytes", type=int, default=100)
    p.add_argument("--batch", type=int, default=1000)
    p.add_argument("--reads", type=int, default=100_000)
    p.add_argument("--out", default=None, help="append each case's figures to this JSON Lines file")
    p.add_argument("--case", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.case:
        layout, topics, budget = args.case.split(",")
        work = Path(tempfile.mkdtemp(prefix=f"bench-store-layout-{layout}-{topics}-{budget}-"))
        try:
            fig = one_case(layout, int(topics), int(budget), args, work)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        print(json.dumps(fig))
        return

    print("command:", shlex.join([sys.executable, *sys.argv]))
    print(f"nproc {os.cpu_count()}, loadavg at start {Path('/proc/loadavg').read_text().strip()}")
    results: dict[tuple, list[dict]] = {}
    passthru = ["--records", str(args.records), "--keys", str(args.keys), "--value-bytes", str(args.value_bytes),
                "--batch", str(args.batch), "--reads", str(args.reads)]
    cases = [(lay, int(t), int(b)) for t in args.topics.split(",") for b in args.budgets.split(",")
             for lay in args.layouts.split(",")]
    with open(args.out or os.devnull, "a") as out:
        for rep in range(args.repeats):
            for layout, topics, budget in cases:  # interleave layouts within each repeat
                t0 = time.perf_counter()
                child = subprocess.run([sys.executable, __file__, *passthru, "--case", f"{layout},{topics},{budget}"],
                                       capture_output=True, text=True)
                if child.returncode:
                    print(child.stderr, file=sys.stderr)
                    raise SystemExit(f"case {layout},{topics},{budget} failed")
                fig = json.loads(child.stdout.splitlines()[-1])
                fig.update(layout=layout, topics=topics, budget=budget, rep=rep,
                           process_s=time.perf_counter() - t0, loadavg=Path("/proc/loadavg").read_text().split()[0])
                out.write(json.dumps(fig) + "\n")
                out.flush()
                results.setdefault((layout, topics, budget), []).append(fig)
                print(f"  rep {rep} {layout} N={topics} budget={budget}: write {fig['write_s']:.1f}s "
                      f"HWM {fig['hwm_end_mib']} MiB load {fig['loadavg']}", flush=True)
    print(f"loadavg at end {Path('/proc/loadavg').read_text().strip()}")
    print("| layout | N | budget MiB | " + " | ".join(c[1] for c in COLS) + " |")
    print("|" + "---|" * (3 + len(COLS)))
    for (layout, topics, budget), figs in results.items():
        cells = [fmt_range([f.get(k) for f in figs], fm) for k, _, fm in COLS]
        print(f"| {layout} | {topics} | {budget or 'none'} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
