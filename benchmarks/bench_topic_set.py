"""Several topics in one process (TopicSet, ``run --topic a --topic b``) against one process per
topic: what each costs, caught up and idle (issue 25, Deliver 3).

A LocalKafkaBroker (Kafka 4.3.1 jars) in a temp dir; ``--topics`` topics of 6 partitions, each with
``--records`` records of 100-byte values on 10,000 keys. For each count N of topics (1, then
powers of two up to ``--topics``):

* one process: a TopicSet over the N topics, run until caught up (cold start), then idle 2 s;
* N processes: one single-topic Materializer process per topic, started together, the same.

Each process reports its OS threads (``/proc/self/task``), sockets (``/proc/self/fd``), resident
memory (``VmRSS``) and the seconds from start to caught up; the N-process row sums threads,
sockets and RSS, and takes the slowest process's time. Every process materializes into its own
fresh data dir.

    .venv/bin/python benchmarks/bench_topic_set.py                 # 8 topics, 20,000 records each
    .venv/bin/python benchmarks/bench_topic_set.py --topics 16 --records 100000
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from confluent_kafka import Producer  # noqa: E402
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402

from materializer.local.kafka_broker import KAFKA_VERSION, TEST_BROKER_CONFIG, LocalKafkaBroker  # noqa: E402

PARTITIONS = 6


def _process_figures() -> dict[str, int]:
    sockets = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            sockets += os.readlink(f"/proc/self/fd/{fd}").startswith("socket:")
        except OSError:
            continue  # closed while listing
    status = Path("/proc/self/status").read_text()
    rss_kib = int(status.split("VmRSS:")[1].split()[0])
    return {"threads": len(os.listdir("/proc/self/task")), "sockets": sockets, "rss_mib": rss_kib // 1024}


def child(bootstrap: str, data_dir: str, topics: list[str]) -> None:
    """Materialize ``topics`` from this process until caught up, idle 2 s, print one JSON line."""
    from materializer.config import MaterializerOptions
    from materializer.topic_set import TopicSet

    started = time.monotonic()
    topic_set = TopicSet(bootstrap, topics, data_dir, options=MaterializerOptions(progress=False))
    topic_set.run_in_background()
    if not topic_set.wait_until_caught_up(600):
        raise SystemExit("not caught up within 600 s")
    caught_up_s = time.monotonic() - started
    time.sleep(2.0)
    figures = _process_figures()
    topic_set.stop()
    topic_set.close()
    print(json.dumps({"caught_up_s": caught_up_s, **figures}), flush=True)


def _spawn(bootstrap: str, data_dir: Path, topics: list[str]) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, __file__, "--child", bootstrap, str(data_dir), *topics],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)


def _collect(processes: list[subprocess.Popen[str]]) -> list[dict[str, float]]:
    results = []
    for process in processes:
        out, _ = process.communicate(timeout=900)
        if process.returncode != 0:
            raise SystemExit(f"a child failed (exit {process.returncode})")
        results.append(json.loads(out.strip().splitlines()[-1]))
    return results


def _produce(bootstrap: str, topics: list[str], records: int) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "compression.type": "lz4"})
    value = b"v" * 100
    for topic in topics:
        for i in range(records):
            while True:
                try:
                    producer.produce(topic, key=f"key-{i % 10_000:05d}".encode(), value=value)
                    break
                except BufferError:  # the local queue is full: let deliveries drain it
                    producer.poll(0.1)
            producer.poll(0)
    producer.flush(120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--topics", type=int, default=8, help="largest number of topics (default 8)")
    parser.add_argument("--records", type=int, default=20_000, help="records per topic (default 20,000)")
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child[0], args.child[1], args.child[2:])
        return
    print("command:", " ".join([Path(sys.executable).name, *sys.argv]))
    load = os.getloadavg()
    print(f"machine: {platform.platform()}, {os.cpu_count()} cores, load {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; "
          f"Python {platform.python_version()}; Kafka {KAFKA_VERSION}")
    counts = [1]
    while counts[-1] * 2 <= args.topics:
        counts.append(counts[-1] * 2)
    if counts[-1] != args.topics:
        counts.append(args.topics)
    with tempfile.TemporaryDirectory(prefix="bench-topic-set-") as tmp:
        work = Path(tmp)
        with LocalKafkaBroker(work / "broker", extra_config=dict(TEST_BROKER_CONFIG)) as broker:
            bootstrap = broker.bootstrap_servers
            topics = [f"set-{i}-{uuid.uuid4().hex[:6]}" for i in range(args.topics)]
            admin = AdminClient({"bootstrap.servers": bootstrap})
            for future in admin.create_topics([NewTopic(t, PARTITIONS, 1) for t in topics]).values():
                future.result(60)
            _produce(bootstrap, topics, args.records)
            print(f"{args.topics} topics x {PARTITIONS} partitions x {args.records} records (100-byte values)")
            print(f"{'topics':>6} | {'layout':<13} | {'caught up s':>11} | {'threads':>7} | {'sockets':>7} | {'RSS MiB':>7}")
            for n in counts:
                chosen = topics[:n]
                one = _collect([_spawn(bootstrap, work / f"one-{n}", chosen)])[0]
                many = _collect([_spawn(bootstrap, work / f"many-{n}-{i}", [t]) for i, t in enumerate(chosen)])
                rows = [("one process", one["caught_up_s"], one["threads"], one["sockets"], one["rss_mib"]),
                        ("one per topic", max(r["caught_up_s"] for r in many),
                         sum(r["threads"] for r in many), sum(r["sockets"] for r in many),
                         sum(r["rss_mib"] for r in many))]
                for layout, seconds, threads, sockets, rss in rows:
                    print(f"{n:>6} | {layout:<13} | {seconds:>11.2f} | {threads:>7} | {sockets:>7} | {rss:>7}")


if __name__ == "__main__":
    main()
