"""Store rebuild from a compacted local log, by key count (no broker): records/s and peak RSS.

A script, not a test. For each ``--keys`` size it writes a local log holding one record per key
(what a fully compacted topic holds: ``--value-bytes`` values, keys in random order, lz4
batches of 500 records, 4 partitions, 64 MiB segments), then times ``rebuild_store_from_logs`` into an empty state store in a
child process (so its peak RSS, ``ru_maxrss``, is its own). ``bench_materializer.py`` compares the
rebuild with a consumer re-reading the topic from a broker.

    .venv/bin/python benchmarks/bench_rebuild.py                        # 100k, 1M and 5M keys
    .venv/bin/python benchmarks/bench_rebuild.py --keys 100000,5000000
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PARTITIONS = 4


def _write(root: Path, keys: int, value_bytes: int) -> None:
    from materializer.storage.compression import CompressionType
    from materializer.storage.log import Log
    from materializer.storage.log_config import LogConfig
    from materializer.storage.record_batch_builder import RecordBatchBuilder

    value = os.urandom(value_bytes)
    config = LogConfig(segment_bytes=64 << 20)
    for partition in range(PARTITIONS):
        log = Log.open(root / f"bench-{partition}", config, had_clean_shutdown=True)
        # a compacted log holds its keys in the order they were last written, not in key order
        order = list(range(partition, keys, PARTITIONS))
        random.Random(partition).shuffle(order)
        for offset in range(0, len(order), 500):
            builder = RecordBatchBuilder(offset, compression=CompressionType.LZ4)
            for n in range(offset, min(offset + 500, len(order))):
                builder.append(n, 1_700_000_000_000 + n, b"key-%012d" % order[n], value)
            log.append_batch(builder.build())
        log.close()


def _rebuild(root: Path) -> None:
    from materializer.adapters.rocksdb_store import StateStore
    from materializer.apply.committed import rebuild_store_from_logs
    from materializer.storage.log import Log
    from materializer.storage.log_config import LogConfig

    logs = {p: Log.open(root / f"bench-{p}", LogConfig(segment_bytes=64 << 20), had_clean_shutdown=True)
            for p in range(PARTITIONS)}
    store = StateStore(root / "state")
    start = time.perf_counter()
    applied = rebuild_store_from_logs(store, logs)
    elapsed = time.perf_counter() - start
    store.close()
    rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"{applied} {elapsed:.3f} {rss_mib:.0f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", default="100000,1000000,5000000", help="comma-separated key counts")
    parser.add_argument("--value-bytes", type=int, default=100)
    parser.add_argument("--rebuild", type=Path, help=argparse.SUPPRESS)  # the child process
    args = parser.parse_args()
    if args.rebuild:
        _rebuild(args.rebuild)
        return
    print(f"command: {' '.join([sys.executable, *sys.argv])}")
    print(f"machine: {os.cpu_count()} CPUs, {platform.machine()}; Python {platform.python_version()}; "
          f"load average {os.getloadavg()[0]:.2f}")
    for keys in (int(k) for k in args.keys.split(",")):
        root = Path(tempfile.mkdtemp(prefix="bench-rebuild-"))
        try:
            _write(root, keys, args.value_bytes)
            out = subprocess.run([sys.executable, __file__, "--rebuild", str(root)], check=True,
                                 capture_output=True, text=True).stdout.split()
            applied, seconds, rss = int(out[0]), float(out[1]), out[2]
            print(f"  {keys:>10,} keys: rebuilt {applied:,} records in {seconds:.2f} s = "
                  f"{applied / seconds:,.0f} records/s; peak RSS {rss} MiB")
        finally:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
