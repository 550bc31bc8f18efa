"""The query server under load (issue 39's goals): local and forwarded gets, multi-gets, and ingest
while serving, driven by ``oha`` (a load generator from crates.io), not a hand-rolled loop.

A script, not a test. On a LocalKafkaBroker it creates two compacted topics (``--partitions`` 4):
``serve`` with ``--records`` records over ``--keys`` keys (100-byte ``str`` values, 1 % tombstones,
each record sent to the partition Java's producer picks for its key, murmur2, so the members'
routing agrees), and ``ingest`` with ``--ingest-records`` records for the last case. Cases:

* **local get**: one ``materializer run --topic serve --serve 127.0.0.1:P`` process (no group),
  ready; ``oha -q RATE -z DURATION`` GETs of random keys that exist (a URL list drawn from the
  workload's live keys), at a fixed rate (``--rate`` 1,000 requests/s, ``--duration-s`` 10 s).
  Goal: p99 <= 2 ms.
* **group local / forwarded get**: two ``run --group-id G --serve`` members (KIP-848), ready with
  2 partitions each. The same fixed-rate load, first with keys member A holds (sent to A), then
  with keys member B holds sent to A, which forwards each to B in one hop. Goal: p99 <= 5 ms.
* **multi-get**: ``POST /v1/topics/serve/keys:batch`` with ``--batch-keys`` (1,000) random live
  keys per request, as fast as ``-c --batch-concurrency`` connections go for the duration, against
  the single process and against group member A with its own keys; keys/s = 200 answers/s x keys per
  request. Goal: >= 100,000 keys/s per member.
* **ingest while serving**: ``run --topic serve --topic ingest --serve`` into an empty data dir.
  Once ``serve`` is ready (~1 s), ``ingest`` is still cold-starting; from then until ``ingest`` is
  ready its records/s (offsets fetched in that window, from ``/health/ready``'s lag) and the
  process's CPU seconds are measured, with ``oha -q RATE`` GETs of ``serve`` keys running meanwhile
  ("loaded") and without ("alone"). The two alternate for ``--repeat`` rounds; best of each.
  Goal: loaded >= 0.8 x alone.

Each fixed-rate case prints p50 / p90 / p99 / max latency (ms), the achieved rate, the status codes
and the server process's CPU seconds per 1,000 requests (``/proc/PID/stat``). Every case is
preceded by an uncounted 2 s warm-up at the same rate.

oha: ``cargo install oha --locked --root ~/.cache/kafka-materializer/oha`` (the script finds it on
PATH or there, or takes ``--oha PATH``). Kafka Streams interactive queries are not measured here
(Streams has no HTTP layer of its own; see RESULTS.md).

    .venv/bin/python benchmarks/bench_serve.py                         # ~4 min
    .venv/bin/python benchmarks/bench_serve.py --cases local,batch --duration-s 5
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from confluent_kafka import Producer  # noqa: E402
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402

from bench_materializer import machine  # noqa: E402
from materializer.group.routing import partition_for_key  # noqa: E402
from materializer.local.kafka_broker import KAFKA_VERSION, TEST_BROKER_CONFIG, LocalKafkaBroker  # noqa: E402

SERVE_TOPIC = "serve"
INGEST_TOPIC = "ingest"
OHA_CACHE = Path.home() / ".cache" / "kafka-materializer" / "oha"
OHA_INSTALL = f"cargo install oha --locked --root {OHA_CACHE}"
CASES = ("local", "forwarded", "batch", "ingest")
TICK_S = 0.02
CLK_TCK = os.sysconf("SC_CLK_TCK")


class BenchError(RuntimeError):
    """A member never got ready, exited, or oha failed (message says which, with output)."""


# -- tools ---------------------------------------------------------------------------------------

def find_oha(given: str | None) -> str:
    """oha's path: ``--oha``, PATH, or the cache ``cargo install --root`` fills; else exit 2 saying how."""
    for candidate in (given, shutil.which("oha"), str(OHA_CACHE / "bin" / "oha")):
        if candidate and Path(candidate).is_file() and os.access(candidate, os.X_OK):
            return candidate
    sys.exit(f"error: oha (the load generator) not found; install it with:\n    {OHA_INSTALL}")


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` and its threads (``/proc/PID/stat``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def load_text() -> str:
    return ", ".join(f"{x:.2f}" for x in os.getloadavg())


def free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Load:
    """One oha run: latencies in ms, achieved answers/s, status code counts, server CPU seconds."""

    p50: float
    p90: float
    p99: float
    max: float
    rate: float
    statuses: dict[str, int]
    errors: dict[str, int]
    cpu_s: float
    seconds: float

    def ok(self) -> int:
        return self.statuses.get("200", 0)


def oha(exe: str, urls: Path | str, *, rate: int | None, duration_s: float, connections: int,
        server_pid: int | None, method: str = "GET", body: Path | None = None) -> Load:
    """Run oha on ``urls`` (a file of URLs, one per line, or one URL) and parse its JSON summary."""
    cmd = [exe, "--no-tui", "--output-format", "json", "-z", f"{duration_s}s", "-c", str(connections)]
    if rate is not None:
        cmd += ["-q", str(rate)]
    if method != "GET":
        cmd += ["-m", method, "-T", "application/json"]
    if body is not None:
        cmd += ["-D", str(body)]
    cmd += ["--urls-from-file", str(urls)] if isinstance(urls, Path) else [urls]
    cpu0 = cpu_seconds(server_pid) if server_pid else 0.0
    started = time.monotonic()
    done = subprocess.run(cmd, capture_output=True, text=True)
    seconds = time.monotonic() - started
    cpu = cpu_seconds(server_pid) - cpu0 if server_pid else 0.0
    if done.returncode != 0:
        raise BenchError(f"oha failed ({shlex.join(cmd)}): {done.stderr[-2000:]}")
    out = json.loads(done.stdout)
    pct = out["latencyPercentiles"]
    ms = {k: 1000 * (pct.get(k) or 0.0) for k in ("p50", "p90", "p99")}
    statuses = {str(k): v for k, v in (out.get("statusCodeDistribution") or {}).items()}
    answered = sum(statuses.values())
    return Load(ms["p50"], ms["p90"], ms["p99"], 1000 * (out["summary"].get("slowest") or 0.0),
                answered / out["summary"]["total"] if out["summary"].get("total") else 0.0, statuses,
                {k: v for k, v in (out.get("errorDistribution") or {}).items() if "deadline" not in k}, cpu, seconds)


def load_line(name: str, load: Load, *, keys_per_request: int = 1) -> str:
    rate = f"{load.rate:9,.0f} req/s" + (f" = {load.ok() * keys_per_request / load.seconds:10,.0f} keys/s"
                                        if keys_per_request > 1 else "")
    per_k = 1000 * load.cpu_s / max(1, sum(load.statuses.values()))
    errors = f" errors {load.errors}" if load.errors else ""
    return (f"  {name:<34} p50 {load.p50:6.2f}  p90 {load.p90:6.2f}  p99 {load.p99:6.2f}  max {load.max:7.2f} ms"
            f"  {rate}  cpu {load.cpu_s:5.2f} s ({per_k:.2f} s/1k req)  {load.statuses}{errors}")


def baseline_tree(rev: str, dest: Path) -> Path:
    """``git archive REV`` of this repository in ``dest``, importable as ``materializer`` from
    ``PYTHONPATH=dest``: its ``storage/`` and ``adapters/`` linked in as the packages the wheel maps them
    to, and this tree's built native core copied into its ``storage/`` (a baseline that changed the
    native crate needs its own build)."""
    root = Path(__file__).resolve().parent.parent
    dest.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(root), "archive", rev], capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    for name in ("storage", "adapters"):
        (dest / "materializer" / name).symlink_to(dest / name)
    for native in (root / "storage").glob("_native*.so"):
        shutil.copy2(native, dest / "storage" / native.name)
    return dest


# -- workload ------------------------------------------------------------------------------------

def make_topics(bootstrap: str, args) -> dict[int, list[bytes]]:
    """Create and fill both topics; returns partition -> live keys of ``serve``."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    config = {"cleanup.policy": "compact", "compression.type": "lz4", "min.compaction.lag.ms": str(3_600_000)}
    futures = admin.create_topics([NewTopic(t, args.partitions, 1, config=config) for t in (SERVE_TOPIC, INGEST_TOPIC)])
    for future in futures.values():
        future.result(30)
    rng = random.Random(42)
    values = [rng.randbytes(51).hex()[:args.value_bytes].encode() for _ in range(1024)]
    live: dict[bytes, int] = {}
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "batch.size": 1024 * 1024,
                         "compression.type": "lz4", "queue.buffering.max.messages": 1_000_000})

    def send(topic: str, count: int, keys: int) -> None:
        for i in range(count):
            key = b"key-%09d" % rng.randrange(keys)
            value = None if rng.random() < 0.01 else values[i % len(values)]
            partition = partition_for_key(key, args.partitions)
            while True:
                try:
                    producer.produce(topic, key=key, value=value, partition=partition)
                    break
                except BufferError:
                    producer.poll(0.05)
            if topic == SERVE_TOPIC:
                if value is None:
                    live.pop(key, None)
                else:
                    live[key] = partition
        if producer.flush(300):
            raise BenchError("the producer did not deliver within 300 s")

    started = time.monotonic()
    send(SERVE_TOPIC, args.records, args.keys)
    send(INGEST_TOPIC, args.ingest_records, args.ingest_records // 10)
    by_partition: dict[int, list[bytes]] = {p: [] for p in range(args.partitions)}
    for key, partition in live.items():
        by_partition[partition].append(key)
    print(f"  produced {args.records:,} + {args.ingest_records:,} records in {time.monotonic() - started:.1f} s; "
          f"{len(live):,} live keys in {SERVE_TOPIC!r}", flush=True)
    return by_partition


def url_file(path: Path, base: str, keys: list[bytes], count: int, seed: int) -> Path:
    """``count`` GET URLs of keys drawn at random from ``keys``."""
    rng = random.Random(seed)
    path.write_text("".join(f"{base}/v1/topics/{SERVE_TOPIC}/keys/{rng.choice(keys).decode()}\n"
                            for _ in range(count)))
    return path


def batch_body(path: Path, keys: list[bytes], count: int, seed: int) -> Path:
    rng = random.Random(seed)
    path.write_text(json.dumps([k.decode() for k in rng.sample(keys, count)]))
    return path


# -- members -------------------------------------------------------------------------------------

class Member:
    """One ``materializer run --serve`` process."""

    def __init__(self, work: Path, name: str, bootstrap: str, topics: tuple[str, ...], extra: list[str],
                 tree: Path | None = None) -> None:
        self.serve_port, self.metrics_port = free_port(), free_port()
        self.url = f"http://127.0.0.1:{self.serve_port}"
        self.log = work / f"{name}.log"
        self.cmd = [sys.executable, "-m", "materializer", "run", "--bootstrap-servers", bootstrap,
                    *(a for t in topics for a in ("--topic", t)), "--data-dir", str(work / name),
                    "--value-format", "str", "--serve", f"127.0.0.1:{self.serve_port}",
                    "--metrics-port", str(self.metrics_port), "--no-progress", *extra]
        env = dict(os.environ)
        if tree is not None:  # the baseline's materializer package first on the path (baseline_tree)
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(tree), env.get("PYTHONPATH")]))
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen(self.cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         env=env, cwd=work)  # not the checkout: its package would come first
        self.started = time.monotonic()

    def probe(self) -> dict[str, Any] | None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/health/ready", timeout=2) as answer:
                return json.loads(answer.read())
        except urllib.error.HTTPError as exc:
            return json.loads(exc.read())
        except (OSError, ValueError):
            return None

    def check(self) -> None:
        if self.proc.poll() is not None:
            raise BenchError(f"{self.cmd[3:]} exited with {self.proc.returncode}:\n"
                             f"{self.log.read_text(errors='replace')[-3000:]}")

    def wait(self, done, timeout_s: float = 180.0) -> dict[str, Any]:
        """Poll /health/ready every TICK_S until ``done(probe)``; returns that probe."""
        deadline = time.monotonic() + timeout_s
        while True:
            self.check()
            probe = self.probe()
            if probe is not None and done(probe):
                return probe
            if time.monotonic() > deadline:
                raise BenchError(f"not ready within {timeout_s:g} s: {probe}")
            time.sleep(TICK_S)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def topic_probe(probe: dict[str, Any], topic: str) -> dict[str, Any]:
    """One topic's part of a several-topic run's /health/ready answer (``{"topics": {topic: {...}}}``)."""
    return (probe.get("topics") or {}).get(topic) or {}


# -- cases ---------------------------------------------------------------------------------------

def fixed_rate(exe: str, args, urls: Path, pid: int) -> Load:
    oha(exe, urls, rate=args.rate, duration_s=2, connections=args.connections, server_pid=None)  # warm-up
    return oha(exe, urls, rate=args.rate, duration_s=args.duration_s, connections=args.connections, server_pid=pid)


def flat_out(exe: str, args, url: str, body: Path, pid: int) -> Load:
    oha(exe, url, rate=None, duration_s=2, connections=args.batch_concurrency, server_pid=None, method="POST",
        body=body)
    return oha(exe, url, rate=None, duration_s=args.duration_s, connections=args.batch_concurrency, server_pid=pid,
               method="POST", body=body)


def case_single(exe: str, args, work: Path, bootstrap: str, keys: dict[int, list[bytes]], cases: set[str],
                label: str, tree: Path | None) -> None:
    member = Member(work, f"single-{label}", bootstrap, (SERVE_TOPIC,), shlex.split(args.member_args), tree)
    try:
        member.wait(lambda p: p.get("ok"))
        print(f"  member command: {shlex.join(member.cmd)}\n  load average before: {load_text()}", flush=True)
        every = [k for part in keys.values() for k in part]
        if "local" in cases:
            urls = url_file(work / "local.urls", member.url, every, 50_000, 1)
            print(load_line(f"[{label}] local get (no group)", fixed_rate(exe, args, urls, member.proc.pid)), flush=True)
        if "batch" in cases:
            body = batch_body(work / "batch.json", every, args.batch_keys, 2)
            load = flat_out(exe, args, f"{member.url}/v1/topics/{SERVE_TOPIC}/keys:batch", body, member.proc.pid)
            print(load_line(f"[{label}] multi-get x{args.batch_keys} (no group)", load, keys_per_request=args.batch_keys),
                  flush=True)
    finally:
        member.stop()


def case_group(exe: str, args, work: Path, bootstrap: str, keys: dict[int, list[bytes]], cases: set[str],
               label: str, tree: Path | None) -> None:
    group = f"bench-serve-{uuid.uuid4().hex[:8]}"
    extra = ["--group-id", group, "--group-protocol", "consumer", *shlex.split(args.member_args)]
    members = [Member(work, f"member-{label}-{i}", bootstrap, (SERVE_TOPIC,), extra, tree) for i in range(2)]
    try:
        share = args.partitions // 2

        def settled(probe: dict[str, Any]) -> bool:
            return bool(probe.get("ok")) and len((probe.get("group") or {}).get("assigned_partitions") or ()) == share

        probes = [m.wait(settled) for m in members]
        held = [set(p["group"]["assigned_partitions"]) for p in probes]
        if held[0] & held[1] or len(held[0] | held[1]) != args.partitions:
            raise BenchError(f"the members do not split the partitions: {held}")
        a, b = members
        print(f"  member A holds {sorted(held[0])}, B {sorted(held[1])}; load average before: {load_text()}",
              flush=True)
        own = [k for p in held[0] for k in keys[p]]
        theirs = [k for p in held[1] for k in keys[p]]
        if "forwarded" in cases:
            urls = url_file(work / "group-local.urls", a.url, own, 50_000, 3)
            print(load_line(f"[{label}] group get, A's keys to A", fixed_rate(exe, args, urls, a.proc.pid)), flush=True)
            urls = url_file(work / "forwarded.urls", a.url, theirs, 50_000, 4)
            cpu_b = cpu_seconds(b.proc.pid)
            load = fixed_rate(exe, args, urls, a.proc.pid)
            print(load_line(f"[{label}] forwarded get, B's keys to A", load)
                  + f"  (B's cpu incl. warm-up {cpu_seconds(b.proc.pid) - cpu_b:.2f} s)", flush=True)
        if "batch" in cases:
            body = batch_body(work / "group-batch.json", own, args.batch_keys, 5)
            load = flat_out(exe, args, f"{a.url}/v1/topics/{SERVE_TOPIC}/keys:batch", body, a.proc.pid)
            print(load_line(f"[{label}] multi-get x{args.batch_keys}, A's keys to A", load, keys_per_request=args.batch_keys),
                  flush=True)
            body = batch_body(work / "mixed-batch.json", own + theirs, args.batch_keys, 6)
            load = flat_out(exe, args, f"{a.url}/v1/topics/{SERVE_TOPIC}/keys:batch", body, a.proc.pid)
            print(load_line(f"[{label}] multi-get x{args.batch_keys}, half B's, to A", load, keys_per_request=args.batch_keys),
                  flush=True)
    finally:
        for member in members:
            member.stop()


@dataclass
class Ingest:
    records: int
    seconds: float
    cpu_s: float
    load: Load | None

    @property
    def rate(self) -> float:
        return self.records / self.seconds


def ingest_round(exe: str, args, work: Path, bootstrap: str, keys: dict[int, list[bytes]], loaded: bool,
                 name: str, tree: Path | None) -> Ingest:
    member = Member(work, name, bootstrap, (SERVE_TOPIC, INGEST_TOPIC), shlex.split(args.member_args), tree)
    try:
        probe = member.wait(lambda p: topic_probe(p, SERVE_TOPIC).get("ok") is True)
        lag = topic_probe(probe, INGEST_TOPIC).get("lag") or {}
        behind = sum(lag.values())
        if topic_probe(probe, INGEST_TOPIC).get("ok") or behind < args.ingest_records // 2:
            raise BenchError(f"{INGEST_TOPIC!r} is nearly caught up when {SERVE_TOPIC!r} is ready ({behind} "
                             f"offsets behind): raise --ingest-records")
        cpu0, started = cpu_seconds(member.proc.pid), time.monotonic()
        runner = None
        if loaded:
            every = [k for part in keys.values() for k in part]
            urls = url_file(work / f"{name}.urls", member.url, every, 50_000, 7)
            cmd = [exe, "--no-tui", "--output-format", "json", "-z", "600s", "-c", str(args.connections),
                   "-q", str(args.rate), "--urls-from-file", str(urls)]
            runner = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        member.wait(lambda p: topic_probe(p, INGEST_TOPIC).get("ok") is True, timeout_s=600)
        seconds, cpu = time.monotonic() - started, cpu_seconds(member.proc.pid) - cpu0
        load = None
        if runner is not None:
            runner.send_signal(signal.SIGINT)  # oha prints its summary on Ctrl-C
            out, err = runner.communicate(30)
            try:
                parsed = json.loads(out)
                pct = parsed["latencyPercentiles"]
                statuses = {str(k): v for k, v in (parsed.get("statusCodeDistribution") or {}).items()}
                load = Load(*(1000 * (pct.get(k) or 0.0) for k in ("p50", "p90", "p99")),
                            1000 * (parsed["summary"].get("slowest") or 0.0), sum(statuses.values()) / seconds,
                            statuses, dict(parsed.get("errorDistribution") or {}), cpu, seconds)
            except (ValueError, KeyError) as exc:
                print(f"    (oha's summary unreadable: {exc}: {err[-500:]})")
        return Ingest(behind, seconds, cpu, load)
    finally:
        member.stop()


def case_ingest(exe: str, args, work: Path, bootstrap: str, keys: dict[int, list[bytes]], label: str,
                tree: Path | None) -> None:
    results: dict[bool, list[Ingest]] = {False: [], True: []}
    for round_no in range(args.repeat):
        for loaded in ((False, True) if round_no % 2 == 0 else (True, False)):
            name = f"ingest-{label}-{round_no}-{'loaded' if loaded else 'alone'}"
            run = ingest_round(exe, args, work, bootstrap, keys, loaded, name, tree)
            results[loaded].append(run)
            extra = "" if run.load is None else "\n  " + load_line("    reads meanwhile", run.load)
            print(f"  round {round_no + 1} {'loaded' if loaded else 'alone ':<6}: {run.records:,} records in "
                  f"{run.seconds:.2f} s = {run.rate:,.0f} records/s, cpu {run.cpu_s:.2f} s; load average "
                  f"{load_text()}{extra}", flush=True)
            shutil.rmtree(work / name, ignore_errors=True)
    alone = max(results[False], key=lambda r: r.rate)
    loaded_best = max(results[True], key=lambda r: r.rate)
    ratio = loaded_best.rate / alone.rate
    print(f"  [{label}] ingest while serving {args.rate:,} req/s: best {loaded_best.rate:,.0f} records/s "
          f"(cpu {loaded_best.cpu_s:.2f} s) vs alone {alone.rate:,.0f} records/s (cpu {alone.cpu_s:.2f} s): "
          f"{ratio:.2f}x (goal >= 0.8x: {'met' if ratio >= 0.8 else 'NOT met'})", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=200_000, help="records of the served topic (default 200,000)")
    parser.add_argument("--keys", type=int, default=100_000, help="its distinct keys (default 100,000)")
    parser.add_argument("--value-bytes", type=int, default=100)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--ingest-records", type=int, default=1_000_000,
                        help="records of the topic cold-started while serving (default 1,000,000)")
    parser.add_argument("--rate", type=int, default=1000, help="fixed request rate of the get cases (default 1,000/s)")
    parser.add_argument("--duration-s", type=float, default=10.0, help="seconds of each measured load (default 10)")
    parser.add_argument("--connections", type=int, default=8, help="oha connections of the fixed-rate cases")
    parser.add_argument("--batch-keys", type=int, default=1000, help="keys per multi-get request (default 1,000)")
    parser.add_argument("--batch-concurrency", type=int, default=4, help="oha connections of the multi-get cases")
    parser.add_argument("--repeat", type=int, default=2, help="rounds of the ingest case (default 2)")
    parser.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, of {','.join(CASES)}")
    parser.add_argument("--member-args", default="", help="extra arguments for every `materializer run`")
    parser.add_argument("--baseline", default=None, metavar="REV",
                        help="also run every case with the materializer package of git revision REV (e.g. main), "
                             "each step of the two alternating: a before/after in one run")
    parser.add_argument("--oha", default=None, help="oha's path (default: PATH, then the cache)")
    parser.add_argument("--work-dir", type=Path, default=None, help="keep files here instead of a temp dir")
    args = parser.parse_args()
    cases = {c.strip() for c in args.cases.split(",") if c.strip()}
    if not cases or cases - set(CASES):
        parser.error(f"--cases: choose from {','.join(CASES)}")
    exe = find_oha(args.oha)
    version = subprocess.run([exe, "--version"], capture_output=True, text=True).stdout.strip()
    print(f"command: {shlex.join([sys.executable, *sys.argv])}")
    print(f"machine: {machine()}")
    print(f"load generator: {version} ({exe})")
    print(f"workload: {args.records:,} records over {args.keys:,} keys in {SERVE_TOPIC!r}, {args.value_bytes}-byte "
          f"str values, 1% tombstones, {args.partitions} partitions; {args.rate:,} req/s for {args.duration_s:g} s "
          f"over {args.connections} connections; multi-get {args.batch_keys} keys x {args.batch_concurrency} "
          f"connections; ingest {args.ingest_records:,} records, {args.repeat} rounds", flush=True)
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="bench-serve-"))
    work.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    try:
        with LocalKafkaBroker(work / "broker", extra_config=TEST_BROKER_CONFIG) as broker:
            bootstrap = broker.bootstrap_servers
            print(f"broker: Kafka {KAFKA_VERSION} at {bootstrap}", flush=True)
            keys = make_topics(bootstrap, args)
            print("\nlatency in ms (oha: request sent -> answer read), rate = answers/s, cpu = the server "
                  "process's CPU seconds during the measured load", flush=True)
            trees: list[tuple[str, Path | None]] = [("this", None)]
            if args.baseline:
                trees.insert(0, (f"base {args.baseline}", baseline_tree(args.baseline, work / "baseline")))
            for step in ("single", "group", "ingest"):  # each step for each tree, so a load change hits both
                for label, tree in trees:
                    if step == "single" and cases & {"local", "batch"}:
                        case_single(exe, args, work, bootstrap, keys, cases, label, tree)
                    if step == "group" and cases & {"forwarded", "batch"}:
                        case_group(exe, args, work, bootstrap, keys, cases, label, tree)
                    if step == "ingest" and "ingest" in cases:
                        case_ingest(exe, args, work, bootstrap, keys, label, tree)
        print(f"\ntotal wall time {time.monotonic() - started:.0f} s; load average {load_text()}")
    finally:
        if args.work_dir is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
