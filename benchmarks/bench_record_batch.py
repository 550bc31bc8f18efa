"""Throughput of the v2 record-batch codec (build and parse), in records per second.

Run: /tmp/venv/bin/python benchmarks/bench_record_batch.py [--records N] [--value-bytes B]
     [--batch-records R] [--codecs none,zstd,...]

Builds N records (16-byte keys, B-byte values, one header-less record per offset) into
batches of R records with RecordBatchBuilder, then parses them back with iter_batches +
ensure_valid + records(). Values are half random, half repeated bytes so that the
compressed codecs have something to do. Best of 3 runs is reported.
"""

from __future__ import annotations

import argparse
import os
import time

from materializer.storage.compression import CompressionType
from materializer.storage.record_batch import iter_batches
from materializer.storage.record_batch_builder import RecordBatchBuilder


def make_records(count: int, value_bytes: int) -> list[tuple[bytes, bytes]]:
    half = value_bytes // 2
    filler = b"x" * (value_bytes - half)
    return [(b"key-%012d" % i, os.urandom(half) + filler) for i in range(count)]


def build(records: list[tuple[bytes, bytes]], codec: CompressionType, batch_records: int) -> bytes:
    out = []
    ts = 1_700_000_000_000
    for start in range(0, len(records), batch_records):
        builder = RecordBatchBuilder(start, compression=codec)
        for offset in range(start, min(start + batch_records, len(records))):
            key, value = records[offset]
            builder.append(offset, ts + offset, key, value)
        out.append(builder.build())
    return b"".join(out)


def parse(log: bytes) -> int:
    count = 0
    for _, batch in iter_batches(log):
        batch.ensure_valid()
        count += len(batch.records())
    return count


def best_of(runs: int, fn) -> float:
    best = float("inf")
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--value-bytes", type=int, default=100)
    parser.add_argument("--batch-records", type=int, default=1000)
    parser.add_argument("--codecs", default="none,zstd")
    args = parser.parse_args()
    records = make_records(args.records, args.value_bytes)
    print(f"{args.records} records, {args.value_bytes}-byte values, {args.batch_records} records/batch")
    for name in args.codecs.split(","):
        codec = CompressionType.from_name(name)
        log = build(records, codec, args.batch_records)
        if parse(log) != args.records:
            raise SystemExit("round trip lost records")
        build_s = best_of(3, lambda: build(records, codec, args.batch_records))
        parse_s = best_of(3, lambda: parse(log))
        print(
            f"{codec.name_kafka:>6}: build {args.records / build_s:>10,.0f} records/s   "
            f"parse {args.records / parse_s:>10,.0f} records/s   ({len(log):,} bytes on disk)"
        )


if __name__ == "__main__":
    main()
