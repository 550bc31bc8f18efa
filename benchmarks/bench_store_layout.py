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
     per-column-family options), written by :class:`CfTopic`, a copy of ``StateStore.apply``'s
     loop onto the topic's handles, so both layouts pay the same Python per record.
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


class CfTopic:
    """One topic in the shared DB: StateStore.apply / get copied onto the topic's two CFs."""

    def __init__(self, db, n: int, write_options, path: Path) -> None:
        from materializer.adapters.rocksdb_store import FORMAT_VERSION, FORMAT_VERSION_KEY, _INT32
        self.path = path
        self._db = db
        self._data = db.get_column_family(f"t{n}.data")
        self._metadata = db.get_column_family(f"t{n}.metadata")
        self._data_handle = db.get_column_family_handle(f"t{n}.data")
        self._metadata_handle = db.get_column_family_handle(f"t{n}.metadata")
        if self._metadata.get(FORMAT_VERSION_KEY) is None:
            self._metadata.put(FORMAT_VERSION_KEY, _INT32.pack(FORMAT_VERSION))
        self._write_options = write_options
        self._offsets: dict[int, int] = {}

    def _require_open(self):
        return self._db

    def _check_forward(self, next_offsets) -> None:
        for partition, next_offset in next_offsets.items():
            current = self._offsets.get(partition)
            if current is not None and next_offset < current:
                raise RuntimeError("backwards")

    def apply(self, records_by_partition, next_offsets) -> int:
        from materializer.adapters.rocksdb_store import (
            _INT64, _next_offset_key, encode_store_key, encode_stored_value, map_rocksdb_errors)
        from rocksdict import WriteBatch
        db = self._require_open()
        self._check_forward(next_offsets)
        batch = WriteBatch(raw_mode=True)
        applied = 0
        for partition, records in records_by_partition.items():
            if not records:
                continue
            if partition not in next_offsets:
                raise ValueError("no next offset")
            if records[-1].offset >= next_offsets[partition]:
                raise ValueError("next offset not above")
            for record in records:
                if record.key is None:
                    raise ValueError("null key")
                store_key = encode_store_key(partition, record.key)
                if record.value is None:
                    batch.delete(store_key, self._data_handle)
                else:
                    batch.put(store_key, encode_stored_value(record.offset, record.timestamp, record.value),
                              self._data_handle)
                applied += 1
        for partition, next_offset in next_offsets.items():
            batch.put(_next_offset_key(partition), _INT64.pack(next_offset), self._metadata_handle)
        with map_rocksdb_errors(self.path):
            db.write(batch, self._write_options)
        self._offsets.update(next_offsets)
        return applied

    def get(self, key: bytes, partition: int):
        from materializer.adapters.rocksdb_store import decode_stored_value, encode_store_key, map_rocksdb_errors
        self._require_open()
        key = bytes(key)
        with map_rocksdb_errors(self.path):
            data = self._data.get(encode_store_key(partition, key))
        return None if data is None else decode_stored_value(partition, data, self.path)


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
        stores = [CfTopic(db, n, sopts.to_write_options(), dirs[0]) for n in range(topics)]
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
    del store  # a CfTopic keeps the shared DB (and its LOCK) alive
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
        stores = [CfTopic(db, n, sopts.to_write_options(), dirs[0]) for n in range(topics)]
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
