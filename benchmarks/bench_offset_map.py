"""The cleaner's offset map: RAM per key and put/get speed, native table vs the dict-backed map.

A script, not a test. For ``--keys`` distinct keys (default 900,000: what a 24,000,000-byte
budget of 1,000,000 slots takes per round at Kafka's load factor 0.9) it builds each map, puts
every key in batches of 100 (as the cleaner's map pass does per batch) and looks them all up, and
prints the resident-memory growth (``/proc/self/statm``, so native memory counts) per key.

    .venv/bin/python benchmarks/bench_offset_map.py
    .venv/bin/python benchmarks/bench_offset_map.py --keys 4500000 --slots 5000000
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import sys
import time

from materializer.storage.offset_map import BYTES_PER_ENTRY, DigestDictOffsetMap, SkimpyOffsetMap

_PAGE = os.sysconf("SC_PAGE_SIZE")


def _rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * _PAGE


def _measure(kind, slots: int, keys: list[bytes]) -> tuple[float, float, float]:
    gc.collect()
    before = _rss_bytes()
    offset_map = kind(slots * BYTES_PER_ENTRY)
    start = time.perf_counter()
    for i in range(0, len(keys), 100):
        offset_map.put_many(keys[i:i + 100], list(range(i, i + len(keys[i:i + 100]))))
    put_s = time.perf_counter() - start
    start = time.perf_counter()
    for i in range(0, len(keys), 100):
        offset_map.get_many(keys[i:i + 100])
    get_s = time.perf_counter() - start
    grown = _rss_bytes() - before
    assert offset_map.size == len(keys)
    del offset_map
    return grown / len(keys), put_s / len(keys) * 1e6, get_s / len(keys) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=900_000, help="distinct keys put (default 900,000)")
    parser.add_argument("--slots", type=int, default=1_000_000, help="map slots (24 bytes each; default 1,000,000)")
    args = parser.parse_args()
    keys = [b"product-%012d" % i for i in range(args.keys)]
    print(f"command: {' '.join([sys.executable, *sys.argv])}")
    print(f"machine: {os.cpu_count()} CPUs, {platform.processor() or platform.machine()}; Python {platform.python_version()}")
    print(f"{args.keys:,} keys in {args.slots:,} slots ({args.slots * BYTES_PER_ENTRY:,} bytes of budget)")
    for name, kind in (("native SkimpyOffsetMap", SkimpyOffsetMap), ("DigestDictOffsetMap (dict)", DigestDictOffsetMap)):
        per_key, put_us, get_us = _measure(kind, args.slots, keys)
        print(f"  {name:28s} RSS {per_key:6.1f} bytes/key   put {put_us:.3f} us/key   get {get_us:.3f} us/key")


if __name__ == "__main__":
    main()
