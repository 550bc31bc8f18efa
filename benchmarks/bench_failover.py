"""Failover: SIGKILL one of three group members -> every key served again; Materializer group mode
against Kafka Streams KTables (issue 25, Deliver 5).

A script, not a test. On a LocalKafkaBroker it creates one compacted topic (``--partitions`` 12, the
broker's cleaner held back, as bench_materializer.py's ``prepare_topic``) and produces ``--records``
records over ``--keys`` keys (100-byte values, ``--tombstone-ratio`` 10 % tombstones). Then, for
``--rounds`` rounds (the two cases interleaved, their order alternating, so a change of the machine's
load hits both alike):

**materializer**: three ``materializer run --group-id G --group-protocol consumer --metrics-port P``
processes (KIP-848; each its own data dir; a fresh group per round whose ``consumer.session.timeout.ms``
and ``consumer.heartbeat.interval.ms`` are set as group configs with IncrementalAlterConfigs, as
tests/integration/test_group_materializer.py does). Once each serves 4 partitions and is ready (held
for 1 s), one is SIGKILLed, and ``/health/ready`` of the two others is polled every ``--poll-ms`` (20)
until both are ready and together serve all partitions: *kill -> every key served again*. Split into
*detection* (kill -> the survivors' health lists all partitions as assigned, i.e. opened by their
run loops) and *catch-up* (assigned -> ready: the moved partitions fetched from the broker into the
survivors' local logs and stores). The first generation change a survivor reports is printed too.

**streams**: three JVMs of ``streams_failover/StreamsFailover.java`` (a KTable with
``topology.optimization=all``, so the source topic is the changelog; ``num.standby.replicas=0``; one
stream thread; Kafka Streams' default *classic* group protocol with ``session.timeout.ms`` and
``heartbeat.interval.ms`` equal to the materializer's; separate state dirs; a fresh application.id per
round whose committed offsets are first set to the end offsets, so a moved task restores its store
from the topic up to them). The three are started together (``group.initial.rebalance.delay.ms``
3000 on this broker, so the first generation holds all three and the assignment is 4/4/4). Once all
three are RUNNING with 4 tasks each (held for 1 s), one is SIGKILLed; each JVM prints timestamped
JSON lines (state changes, StateRestoreListener restore start / end, its active tasks polled every
``--poll-ms``), and *kill -> every key served again* is the moment both others are RUNNING and every
moved partition's restore ended. Detection = kill -> every moved partition appears in a survivor's
active tasks (or its restore starts); catch-up = detection -> served.

``--stop term`` stops the member cleanly instead, as a rolling restart does: SIGTERM for the
materializer (its run closes, leaving the group first) and ``KafkaStreams.close()`` with its
defaults for Streams (its consumers stay in the group, so the group waits out the session timeout);
times are then counted from the stop.

The member killed is one whose partitions have no folder in the others' data / state dirs (a kept
copy would make the catch-up a delta): with KIP-848 the first member holds all partitions for a
moment, so it is usually the first. ``prior copies`` is printed (0 when the catch-up is a full fetch /
restore).

    .venv/bin/python benchmarks/bench_failover.py                        # 1M records, 100k keys, 3 rounds
    .venv/bin/python benchmarks/bench_failover.py --records 100000 --keys 10000 --rounds 1
    .venv/bin/python benchmarks/bench_failover.py --stop term                              # clean stops

Prints the command, machine and load average per round, each round's figures, best and range per
case, the ratio Streams / Materializer (kill -> served, and after detection), and issue 25's goals
as met or not.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench_materializer, kafka_streams_restore

from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition  # noqa: E402
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType  # noqa: E402

from bench_materializer import TOPIC, Workload, machine, prepare_topic, watermarks  # noqa: E402
from kafka_streams_restore import ensure_streams_restore  # noqa: E402
from materializer.local.kafka_broker import KAFKA_VERSION, TEST_BROKER_CONFIG, LocalKafkaBroker  # noqa: E402
from materializer.local.kafka_jars import find_java  # noqa: E402

STREAMS_SOURCE = Path(__file__).resolve().parent / "streams_failover" / "StreamsFailover.java"
MEMBERS = 3
STABLE_S = 1.0  # the setup's split must hold this long before the kill


def wait_settled(now_held, args, everything: set[int], describe) -> list[set[int]]:
    """Poll ``now_held()`` -> (every member serving, partitions per member) every ``--poll-ms``
    until each member holds its share of ``everything`` for STABLE_S; returns what each holds.

    Raises:
        FailoverError: not settled within ``--settle-timeout-s`` (``describe()`` says where it stands).
    """
    share = args.partitions // MEMBERS
    deadline = time.monotonic() + args.settle_timeout_s
    stable_since = None
    while True:
        serving, held = now_held()
        settled = serving and set().union(*held) == everything and all(len(h) == share for h in held)
        now = time.monotonic()
        stable_since = (stable_since or now) if settled else None
        if stable_since is not None and now - stable_since >= STABLE_S:
            return held
        if now > deadline:
            raise FailoverError(f"not settled within {args.settle_timeout_s:g} s: {describe()}")
        time.sleep(args.poll_ms / 1000)
WATCH_S = 2.0  # after "served", keep polling this long to catch a drop (ready flapping)
CASES = ("materializer", "streams")


class FailoverError(RuntimeError):
    """A member never took over, crashed, or the setup never settled (message says which, with output)."""


@dataclass
class Failover:
    """One kill: seconds after the SIGKILL (wall clock ``time.time()`` / ``currentTimeMillis``)."""

    case: str
    served_s: float  # every partition served again by the survivors (ready / RUNNING + restored)
    detected_s: float  # the victim's partitions assigned to the survivors
    rebalance_s: float  # first sign of the rebalance at a survivor (generation change / REBALANCING)
    victim: int
    moved: list[int]
    prior_copies: int  # victim partitions with a folder in a survivor's data / state dir before the kill
    setup_s: float
    load: str
    flaps: list[str] = field(default_factory=list)
    notes: dict[str, Any] = field(default_factory=dict)

    @property
    def catch_up_s(self) -> float:
        """Seconds from every moved partition assigned to every key served again."""
        return self.served_s - self.detected_s


# -- shared helpers -----------------------------------------------------------------------------

def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (for a member's --metrics-port)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def load_text() -> str:
    """The 1, 5 and 15 minute load averages (os.getloadavg)."""
    return ", ".join(f"{x:.2f}" for x in os.getloadavg())


def tail(path: Path, chars: int = 3000) -> str:
    """The last ``chars`` characters of a log file ("" when unreadable)."""
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError:
        return ""


def choose_victim(held: list[set[int]], has_copy) -> tuple[int, int]:
    """The member whose partitions have the fewest folders in the other members' dirs
    (``has_copy(member, partition)``), preferring the lowest index; returns (member, copies)."""
    copies = [sum(1 for p in held[i] for j in range(len(held)) if j != i and has_copy(j, p))
              for i in range(len(held))]
    victim = min(range(len(held)), key=lambda i: (copies[i], i))
    return victim, copies[victim]


# -- materializer group members -------------------------------------------------------------------

def set_group_timeouts(admin: AdminClient, group: str, session_ms: int, heartbeat_ms: int) -> None:
    """KIP-848 group configs ``consumer.session.timeout.ms`` / ``consumer.heartbeat.interval.ms``."""
    resource = ConfigResource(ResourceType.GROUP, group, incremental_configs=[
        ConfigEntry("consumer.session.timeout.ms", str(session_ms), incremental_operation=AlterConfigOpType.SET),
        ConfigEntry("consumer.heartbeat.interval.ms", str(heartbeat_ms), incremental_operation=AlterConfigOpType.SET)])
    admin.incremental_alter_configs([resource])[resource].result(timeout=30)


def ready_probe(port: int) -> dict | None:
    """``/health/ready``'s JSON (200 or 503), None when the member does not answer."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health/ready", timeout=2) as answer:
            return json.loads(answer.read())
    except urllib.error.HTTPError as exc:
        return json.loads(exc.read())
    except (OSError, ValueError):
        return None


def assigned(probe: dict | None) -> set[int]:
    """The partitions a ``/health/ready`` answer's group detail lists as served (KIP-848 assignment, opened)."""
    return set(((probe or {}).get("group") or {}).get("assigned_partitions") or ())


def run_materializer_case(args, work: Path, bootstrap: str, admin: AdminClient, round_no: int) -> Failover:
    """Three ``materializer run --group-id`` members; SIGKILL one; poll the others (module docstring)."""
    everything = set(range(args.partitions))
    group = f"failover-mat-{round_no}-{uuid.uuid4().hex[:8]}"
    set_group_timeouts(admin, group, args.session_timeout_ms, args.heartbeat_interval_ms)
    base = work / f"mat-{round_no}"
    procs: list[subprocess.Popen] = []
    ports = [free_port() for _ in range(MEMBERS)]
    dirs = [base / f"member-{i}" for i in range(MEMBERS)]
    logs = [base / f"member-{i}.log" for i in range(MEMBERS)]
    base.mkdir(parents=True)
    started = time.time()
    try:
        for i in range(MEMBERS):
            cmd = [sys.executable, "-m", "materializer", "run", "--bootstrap-servers", bootstrap, "--topic", TOPIC,
                   "--data-dir", str(dirs[i]), "--group-id", group, "--group-protocol", "consumer",
                   "--group-session-timeout-ms", str(args.session_timeout_ms), "--metrics-port", str(ports[i]),
                   "--no-progress", *shlex.split(args.member_args)]
            with open(logs[i], "w") as log:
                procs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL))
        if round_no == 0:
            print(f"    member command: {shlex.join(cmd)}", flush=True)

        def check_alive(indices) -> None:
            for i in indices:
                if procs[i].poll() is not None:
                    raise FailoverError(f"materializer member {i} exited with {procs[i].returncode}:\n{tail(logs[i])}")

        # Setup: each ready with its share, held STABLE_S.
        probes: list = []

        def members_now() -> tuple[bool, list[set[int]]]:
            nonlocal probes
            check_alive(range(MEMBERS))
            probes = [ready_probe(port) for port in ports]
            return all(p is not None and p["ok"] for p in probes), [assigned(p) for p in probes]

        held = wait_settled(members_now, args, everything,
                            lambda: "materializer members: " + "; ".join(f"{i}: {p}" for i, p in enumerate(probes)))
        setup_s = time.time() - started
        generations = [p["group"]["generation"] for p in probes if p is not None]
        victim, prior = choose_victim(held, lambda j, p: (dirs[j] / f"{TOPIC}-{p}").exists())
        survivors = [i for i in range(MEMBERS) if i != victim]
        moved = sorted(held[victim])
        load = load_text()

        killed = time.time()
        procs[victim].send_signal(signal.SIGKILL if args.stop == "kill" else signal.SIGTERM)
        rebalance = detected = served = None
        lag_at_served = -1
        timeline: list[str] = []  # each survivor's probe when it changes (ok, assigned, reasons)
        last_seen: dict[int, tuple] = {}
        flaps: list[str] = []
        samples = 0
        deadline = time.monotonic() + args.failover_timeout_s
        while True:
            check_alive(survivors)
            probes_now = {i: ready_probe(ports[i]) for i in survivors}
            now = time.time() - killed
            samples += 1
            union = set().union(*(assigned(probes_now[i]) for i in survivors))
            for i, probe in probes_now.items():
                seen: tuple[Any, ...] = (None,) if probe is None else (probe["ok"], tuple(sorted(assigned(probe))),
                                                      probe["group"]["generation"], tuple(probe["reasons"]))
                if last_seen.get(i) != seen:
                    last_seen[i] = seen
                    timeline.append(f"+{now:.2f} s member {i}: " + ("no answer" if probe is None else (
                        f"ok={seen[0]} assigned={list(seen[1])} generation={seen[2]} reasons={list(seen[3])}")))
            if rebalance is None and any(
                    (probes_now[i] or {}).get("group", {}).get("generation") != generations[i] for i in survivors):
                rebalance = now
            if detected is None and union == everything:
                detected = now
            whole = union == everything and all(p is not None and p["ok"] for p in probes_now.values())
            if served is None and whole:
                served = now
                lag_at_served = sum(sum((p or {}).get("lag", {}).values()) for p in probes_now.values())
            elif served is not None and not whole:
                flaps.append(f"+{now:.2f} s: " + "; ".join(
                    f"member {i}: ok={(p or {}).get('ok')} assigned={sorted(assigned(p))} "
                    f"reasons={(p or {}).get('reasons')}" for i, p in probes_now.items()))
            if served is not None and now - served >= WATCH_S:
                break
            if time.monotonic() > deadline:
                raise FailoverError(f"materializer survivors did not serve every partition within "
                                    f"{args.failover_timeout_s:g} s of the kill: "
                                    + "; ".join(f"{i}: {p}" for i, p in probes_now.items()))
            time.sleep(args.poll_ms / 1000)
        assert detected is not None
        stop_members(procs)
        # The survivors' run summaries: together they fetched every partition once (their own and the moved).
        fetched = sum(int(m.group(1)) for i in survivors
                      for m in [re.search(r"fetched (\d+) records", logs[i].read_text())] if m)
        return Failover("materializer", served, detected, rebalance if rebalance is not None else float("nan"),
                        victim, moved, prior, setup_s, load, flaps,
                        notes={"samples": samples, "lag_at_served": lag_at_served, "survivors_fetched": fetched,
                               "timeline": timeline})
    finally:
        stop_members(procs)
        if not args.keep:
            shutil.rmtree(base, ignore_errors=True)


def stop_members(procs: list[subprocess.Popen]) -> None:
    """SIGTERM (a clean stop: the run's summary line) every member still running; SIGKILL after 30 s."""
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# -- Kafka Streams instances ----------------------------------------------------------------------

class StreamsInstance:
    """One StreamsFailover JVM; a thread collects its JSON lines (``events``, each with ``t`` in s)."""

    def __init__(self, cmd: list[str], log: Path) -> None:
        self.log = log
        self._stderr: IO[bytes] = open(log, "wb")
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr,
                                     text=True)
        self.events: list[dict] = []
        self.lock = threading.Lock()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith("{"):
                event = json.loads(line)
                event["t"] = event["t"] / 1000.0
                with self.lock:
                    self.events.append(event)

    def snapshot(self) -> list[dict]:
        """A copy of the events read so far."""
        with self.lock:
            return list(self.events)

    def state(self) -> str | None:
        """The last KafkaStreams.State reported (None before the first change)."""
        states = [e["to"] for e in self.snapshot() if e["event"] == "state"]
        return states[-1] if states else None

    def tasks(self) -> set[int]:
        """The source partitions of the active tasks last reported."""
        tasks = [e["partitions"] for e in self.snapshot() if e["event"] == "tasks"]
        return set(tasks[-1]) if tasks else set()

    def errors(self) -> list[str]:
        """Uncaught exceptions the instance reported."""
        return [e["message"] for e in self.snapshot() if e["event"] == "error"]

    def send(self, line: str) -> None:
        """Write one line to the instance's stdin ("go" starts it, "stop" closes it)."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def check(self, name: str) -> None:
        """Raises FailoverError (with its stderr) when the JVM exited or Kafka Streams failed."""
        if self.proc.poll() is not None or self.errors() or self.state() in ("ERROR", "PENDING_ERROR"):
            raise FailoverError(f"Kafka Streams {name} failed (exit {self.proc.poll()}, state {self.state()}, "
                                f"errors {self.errors()}):\n{tail(self.log)}")

    def close(self) -> None:
        """SIGKILL the JVM if it still runs (the measurement is over), close its stderr file."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self._stderr.close()


def commit_end_offsets(bootstrap: str, admin: AdminClient, group: str, partitions: int) -> None:
    """Set ``group``'s committed offsets to the end offsets: a deployed KTable application's state, so
    a moved task restores its store from the source topic up to them (StoreChangelogReader)."""
    _, high = watermarks(bootstrap, partitions)
    request = ConsumerGroupTopicPartitions(group, [TopicPartition(TOPIC, p, high[p]) for p in range(partitions)])
    for future in admin.alter_consumer_group_offsets([request]).values():
        future.result(30)


def run_streams_case(args, work: Path, bootstrap: str, admin: AdminClient, classpath: str, round_no: int) -> Failover:
    """Three StreamsFailover JVMs; SIGKILL one; read the others' events (module docstring)."""
    everything = set(range(args.partitions))
    app_id = f"failover-streams-{round_no}-{uuid.uuid4().hex[:8]}"
    commit_end_offsets(bootstrap, admin, app_id, args.partitions)
    base = work / f"streams-{round_no}"
    base.mkdir(parents=True)
    state_dirs = [base / f"state-{i}" for i in range(MEMBERS)]
    instances: list[StreamsInstance] = []
    started = time.time()
    try:
        for i in range(MEMBERS):
            cmd = [find_java(), "-cp", classpath, STREAMS_SOURCE.stem, "--bootstrap", bootstrap, "--topic", TOPIC,
                   "--app-id", app_id, "--state-dir", str(state_dirs[i]),
                   "--session-timeout-ms", str(args.session_timeout_ms),
                   "--heartbeat-interval-ms", str(args.heartbeat_interval_ms), "--poll-ms", str(args.poll_ms)]
            instances.append(StreamsInstance(cmd, base / f"instance-{i}.stderr"))
        if round_no == 0:
            print(f"    instance command: {shlex.join(cmd)}", flush=True)
        deadline = time.monotonic() + args.settle_timeout_s
        while not all(any(e["event"] == "built" for e in s.snapshot()) for s in instances):
            for i, s in enumerate(instances):
                s.check(f"instance {i}")
            if time.monotonic() > deadline:
                raise FailoverError("Kafka Streams instances not built within the settle timeout")
            time.sleep(0.05)
        for s in instances:
            s.send("go")

        def instances_now() -> tuple[bool, list[set[int]]]:
            for i, s in enumerate(instances):
                s.check(f"instance {i}")
            return all(s.state() == "RUNNING" for s in instances), [s.tasks() for s in instances]

        held = wait_settled(instances_now, args, everything, lambda: "Kafka Streams instances: " + "; ".join(
            f"{i}: {s.state()} {sorted(s.tasks())}" for i, s in enumerate(instances)))
        setup_s = time.time() - started
        victim, prior = choose_victim(held, lambda j, p: (state_dirs[j] / app_id / f"0_{p}").exists())
        survivors = [i for i in range(MEMBERS) if i != victim]
        moved = sorted(held[victim])
        load = load_text()

        killed = time.time()
        if args.stop == "kill":
            instances[victim].proc.send_signal(signal.SIGKILL)
        else:  # KafkaStreams.close(), what a SIGTERM's shutdown hook runs
            instances[victim].send("stop")
        deadline = time.monotonic() + args.failover_timeout_s
        served_at = None
        flaps: list[str] = []
        while True:
            for i in survivors:
                instances[i].check(f"instance {i}")
            events = {i: [e for e in instances[i].snapshot() if e["t"] >= killed] for i in survivors}
            ended = {e["partition"]: e for i in survivors for e in events[i]
                     if e["event"] == "restore_end" and e["partition"] in moved}
            whole = (all(instances[i].state() == "RUNNING" for i in survivors) and len(ended) == len(moved)
                     and set().union(*(instances[i].tasks() for i in survivors)) == everything)
            now = time.time() - killed
            if served_at is None and whole:
                served_at = now
            elif served_at is not None and not whole:
                flaps.append(f"+{now:.2f} s: " + "; ".join(
                    f"instance {i}: {instances[i].state()} {sorted(instances[i].tasks())}" for i in survivors))
            if served_at is not None and now - served_at >= WATCH_S:
                break
            if time.monotonic() > deadline:
                raise FailoverError(f"Kafka Streams survivors did not run every task within "
                                    f"{args.failover_timeout_s:g} s of the kill: "
                                    + "; ".join(f"{i}: {instances[i].state()} {sorted(instances[i].tasks())} "
                                                f"restored {sorted(ended)}" for i in survivors))
            time.sleep(args.poll_ms / 1000)

        # The figures from the survivors' own timestamps (not from this loop's sampling).
        def first(i: int, predicate) -> float | None:
            times = [e["t"] - killed for e in events[i] if predicate(e)]
            return min(times) if times else None

        assigned_at = {}
        for p in moved:
            seen = [t for i in survivors for t in (
                first(i, lambda e, p=p: e["event"] == "tasks" and p in e["partitions"]),
                first(i, lambda e, p=p: e["event"] == "restore_start" and e["partition"] == p)) if t is not None]
            assigned_at[p] = min(seen)
        detected = max(assigned_at.values())
        restore_end = max(e["t"] - killed for e in ended.values())
        running = [max(e["t"] - killed for e in events[i] if e["event"] == "state" and e["to"] == "RUNNING")
                   for i in survivors if any(e["event"] == "state" and e["to"] == "RUNNING" for e in events[i])]
        served = max([restore_end, *running])
        rebalancing = [t for i in survivors for t in [first(i, lambda e: e["event"] == "state"
                                                             and e["to"] == "REBALANCING")] if t is not None]
        restored = sum(e["restored"] for e in ended.values())
        return Failover("streams", served, detected, min(rebalancing) if rebalancing else float("nan"),
                        victim, moved, prior, setup_s, load, flaps,
                        notes={"records_restored": restored, "restore_end_s": restore_end,
                               "polled_served_s": served_at})
    finally:
        for s in instances:
            s.close()
        if not args.keep:
            shutil.rmtree(base, ignore_errors=True)


# -- main -----------------------------------------------------------------------------------------

def describe(run: Failover) -> str:
    """One round's line."""
    if run.case == "streams":
        notes = f"; {run.notes['records_restored']:,d} records restored"
    else:
        notes = (f"; lag when served {run.notes['lag_at_served']}, survivors fetched "
                 f"{run.notes['survivors_fetched']:,d} records in all")
    return (f"kill -> served {run.served_s:6.2f} s (rebalance seen {run.rebalance_s:.2f} s, assigned "
            f"{run.detected_s:.2f} s, catch-up {run.catch_up_s:.2f} s); killed member {run.victim} "
            f"holding {run.moved}, prior copies {run.prior_copies}; setup {run.setup_s:.0f} s; "
            f"load {run.load}{notes}" + (f"; READY DROPPED {len(run.flaps)} time(s): {run.flaps[:3]}" if run.flaps else ""))


def spread(values: list[float]) -> str:
    """``best (best-worst) median m``, seconds."""
    return f"{min(values):6.2f} ({min(values):.2f}-{max(values):.2f}) median {statistics.median(values):.2f}"


def main() -> None:
    """Parse the options, start the broker, produce the topic, run the rounds, print the report."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1_000_000, help="records produced (default 1,000,000)")
    parser.add_argument("--keys", type=int, default=100_000, help="distinct keys (default 100,000)")
    parser.add_argument("--value-bytes", type=int, default=100, help="value size, bytes (default 100)")
    parser.add_argument("--partitions", type=int, default=12, help="topic partitions (default 12; a multiple of 3)")
    parser.add_argument("--tombstone-ratio", type=float, default=0.1, help="fraction of tombstones (default 0.1)")
    parser.add_argument("--compression", default="lz4", choices=["none", "gzip", "snappy", "lz4", "zstd"],
                        help="producer codec and the topic's compression.type (default lz4)")
    parser.add_argument("--segment-bytes", type=int, default=16 * 1024 * 1024, help="topic segment.bytes (16 MiB)")
    parser.add_argument("--rounds", type=int, default=3, help="kills per case, interleaved (default 3)")
    parser.add_argument("--stop", choices=("kill", "term"), default="kill",
                        help="how the member is stopped: kill (SIGKILL, a crash; default) or term (a clean stop, as "
                             "a rolling restart does: SIGTERM for the materializer, which leaves the group first; "
                             "KafkaStreams.close() with its defaults for Streams)")
    parser.add_argument("--cases", default=",".join(CASES), help="comma-separated, of " + ",".join(CASES))
    parser.add_argument("--session-timeout-ms", type=int, default=6000,
                        help="both sides' group session timeout, ms (default 6000, the classic minimum)")
    parser.add_argument("--heartbeat-interval-ms", type=int, default=1000, help="both sides' heartbeat, ms (1000)")
    parser.add_argument("--poll-ms", type=int, default=20, help="health / task polling interval, ms (default 20)")
    parser.add_argument("--settle-timeout-s", type=float, default=300.0, help="setup bound, s (default 300)")
    parser.add_argument("--failover-timeout-s", type=float, default=180.0, help="kill -> served bound, s (180)")
    parser.add_argument("--timeline-above-s", type=float, default=3.0,
                        help="print the survivors' readiness changes when a catch-up takes longer, s (3)")
    parser.add_argument("--member-args", default="-v",
                        help="more arguments of each `materializer run` member (default -v: INFO logs in its log file; "
                             "--debug for the clients' debug logs)")
    parser.add_argument("--keep", action="store_true", help="keep the members' dirs and logs")
    parser.add_argument("--work-dir", type=Path, default=None, help="keep files here instead of a temp dir")
    args = parser.parse_args()
    cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    if not cases or set(cases) - set(CASES):
        parser.error(f"--cases: choose from {','.join(CASES)}")
    if args.partitions % MEMBERS:
        parser.error(f"--partitions must be a multiple of {MEMBERS}")

    print(f"command: {shlex.join([sys.executable, *sys.argv])}")
    print(f"machine: {machine()}")
    print(f"workload: {args.records:,} records, {args.keys:,} keys, {args.value_bytes}-byte values, "
          f"{args.tombstone_ratio:.0%} tombstones, {args.partitions} partitions, codec {args.compression}; "
          f"{MEMBERS} members; session timeout {args.session_timeout_ms} ms, heartbeat "
          f"{args.heartbeat_interval_ms} ms on both sides; {args.rounds} round(s) of {','.join(cases)}", flush=True)
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="bench-failover-"))
    workload = Workload(args.keys, args.value_bytes, args.partitions, args.tombstone_ratio)
    runs: dict[str, list[Failover]] = {c: [] for c in cases}
    total_started = time.perf_counter()
    try:
        classpath = ensure_streams_restore(source=STREAMS_SOURCE) if "streams" in cases else ""
        # group.initial.rebalance.delay.ms (classic groups only): the three Streams instances join one generation.
        config = {**TEST_BROKER_CONFIG, "group.initial.rebalance.delay.ms": "3000"}
        with LocalKafkaBroker(work / "broker", extra_config=config) as broker:
            bootstrap = broker.bootstrap_servers
            print(f"broker: Kafka {KAFKA_VERSION} at {bootstrap}, started in {broker.startup_s:.1f} s", flush=True)
            admin = prepare_topic(args, bootstrap, broker, workload, {})
            for round_no in range(args.rounds):
                print(f"  round {round_no + 1}/{args.rounds} (load average {load_text()})", flush=True)
                order = cases if round_no % 2 == 0 else cases[::-1]
                for case in order:
                    if case == "materializer":
                        run = run_materializer_case(args, work, bootstrap, admin, round_no)
                    else:
                        run = run_streams_case(args, work, bootstrap, admin, classpath, round_no)
                    runs[case].append(run)
                    print(f"    {case:<12} {describe(run)}", flush=True)
                    if run.case == "materializer" and (run.catch_up_s > args.timeline_above_s or run.flaps):
                        print("      survivors' /health/ready after the kill:\n"
                              + "\n".join(f"        {line}" for line in run.notes["timeline"]), flush=True)
            del admin  # its client closed before the broker stops (no "connection refused" lines)
        print(f"\ntotal wall time {time.perf_counter() - total_started:.0f} s; load average now {load_text()}")
        report(args, runs)
    finally:
        if args.work_dir is None:
            shutil.rmtree(work, ignore_errors=True)


def report(args, runs: dict[str, list[Failover]]) -> None:
    """Best and range per case, the ratios, issue 25's goals."""
    print(f"\nresults ({args.records:,} records, {args.partitions} partitions, {MEMBERS} members, one {'SIGKILLed' if args.stop == 'kill' else 'stopped cleanly'}; "
          f"session timeout {args.session_timeout_ms} ms; best (range) of {args.rounds}, seconds after the kill):")
    for title, value in (("kill -> served", lambda r: r.served_s),
                         ("kill -> first sign of the rebalance", lambda r: r.rebalance_s),
                         ("kill -> assigned (detection)", lambda r: r.detected_s),
                         ("assigned -> served (catch-up)", lambda r: r.catch_up_s)):
        print(f"  {title:<36} " + "   ".join(f"{case} {spread([value(r) for r in case_runs])}"
                                              for case, case_runs in runs.items()))
    flapped = [(case, r.flaps) for case, case_runs in runs.items() for r in case_runs if r.flaps]
    for case, flaps in flapped:
        print(f"  {case}: readiness dropped after served: {flaps}")
    if "materializer" not in runs:
        return
    mat = runs["materializer"]
    bound = args.session_timeout_ms / 1000 + 1
    best_mat = min(r.served_s for r in mat)
    worst_mat = max(r.served_s for r in mat)
    print(f"\ngoal 1: every key served again within session timeout + 1 s = {bound:.1f} s: best {best_mat:.2f} s, "
          f"worst {worst_mat:.2f} s -> {'MET' if worst_mat <= bound else 'met in the best round only' if best_mat <= bound else 'NOT MET'}")
    if "streams" not in runs:
        return
    st = runs["streams"]
    best_st = min(r.served_s for r in st)
    ratio = best_st / best_mat
    per_round = [s.served_s / m.served_s for m, s in zip(mat, st)]
    after_mat = min(r.catch_up_s for r in mat)
    after_st = min(r.catch_up_s for r in st)
    print(f"goal 2: >= 5x faster than Kafka Streams' rebalance + restore: {best_st:.2f} / {best_mat:.2f} s = "
          f"{ratio:.2f}x (per round {', '.join(f'{x:.2f}x' for x in per_round)}) -> "
          f"{'MET' if ratio >= 5 else 'NOT MET'}")
    print(f"  medians: kill -> served {statistics.median(r.served_s for r in st):.2f} / "
          f"{statistics.median(r.served_s for r in mat):.2f} s, per-round ratio median "
          f"{statistics.median(per_round):.2f}x")
    catch_up_rounds = [s.catch_up_s / m.catch_up_s for m, s in zip(mat, st) if m.catch_up_s > 0]
    print(f"  after detection (assigned -> served), best: materializer {after_mat:.2f} s, streams {after_st:.2f} s = "
          f"{after_st / after_mat:.1f}x; per round {', '.join(f'{x:.1f}x' for x in catch_up_rounds)}"
          if after_mat > 0 else "")
    print(f"  kill -> assigned: materializer {min(r.detected_s for r in mat):.2f} s, "
          f"streams {min(r.detected_s for r in st):.2f} s "
          + (f"(both wait out the {args.session_timeout_ms} ms session timeout: a SIGKILLed member sends no LeaveGroup)"
             if args.stop == "kill" else "(a stopping materializer leaves the group; Kafka Streams' close() does "
             "not, so the group waits out its session timeout)"))


if __name__ == "__main__":
    main()
