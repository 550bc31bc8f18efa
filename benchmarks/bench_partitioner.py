"""Key routing speed: ns per key of ``partition_for_key`` for each partitioner, and of the bare
hashes (native ``murmur2``/``fnv1a``, ``zlib.crc32``) against ``Utils.murmur2`` in pure Python.

A script, not a test. ``--keys`` random keys of ``--key-bytes`` bytes (default 200,000 of 16
bytes), each function timed over all of them ``--repeat`` times (best run kept); 12 partitions.
The machine's load average is printed: compare ratios within one run.

    .venv/bin/python benchmarks/bench_partitioner.py
    .venv/bin/python benchmarks/bench_partitioner.py --key-bytes 40
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import shlex
import sys
import time
import zlib
from collections.abc import Callable

from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from materializer.group.routing import PARTITIONERS, partition_for_key  # noqa: E402
from materializer.storage import _native  # noqa: E402
# Kafka's Utils.murmur2 over Python ints, the unit tests' own reading of the Java code: what the
# native core replaces
from tests.unit.materializer.test_routing import _reference_murmur2 as python_murmur2  # noqa: E402


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            return next(line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.machine()


def ns_per_key(function: Callable[[bytes], object], keys: list[bytes], repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter_ns()
        for key in keys:
            function(key)
        best = min(best, (time.perf_counter_ns() - start) / len(keys))
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--keys", type=int, default=200_000)
    parser.add_argument("--key-bytes", type=int, default=16)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    rng = random.Random(25)
    keys = [rng.randbytes(args.key_bytes) for _ in range(args.keys)]
    print("$", shlex.join([os.path.relpath(sys.executable), *sys.argv]))
    print(f"Python {platform.python_version()}, {_cpu_model()}, {os.cpu_count()} cpus, load average "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}; {args.keys} keys of {args.key_bytes} bytes")
    cases: list[tuple[str, Callable[[bytes], object]]] = [
        ("murmur2 pure Python", python_murmur2),
        ("murmur2 native", _native.murmur2),
        ("fnv1a native", _native.fnv1a),
        ("crc32 (zlib)", zlib.crc32),
    ]
    cases += [(f"partition_for_key {name}", lambda key, name=name: partition_for_key(key, 12, partitioner=name))
              for name in PARTITIONERS]
    for label, function in cases:
        print(f"{label:<40} {ns_per_key(function, keys, args.repeat):8.0f} ns/key")
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
