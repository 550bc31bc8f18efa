"""The operations fault campaign (issue 21, deliverable 10): the broker's truth changes, or an operator acts.

The byte-level fuzzer (``tests/fuzz_harness.py``) and the kill campaign (``tests/kill_campaign.py``)
check that the local log is exact *inside*. This campaign checks the boundary, through the CLI only
(every command is a subprocess of ``python -m materializer``, so signals and exit statuses are
real), against a real Apache Kafka broker.

The contract every trial checks
-------------------------------
Each command ends **exact** or with a **clear refusal**, never with exit 0 and wrong data, and
nothing intact is lost:

* *exact*: what ``materializer export --data-dir D --topic T`` prints equals the latest value per
  (partition, key) that a ``read_committed`` consumer of the broker reads at that moment (from the
  log start offset to the last stable offset; :func:`broker_truth`);
* *clear refusal*: exit status 2 and exactly one line starting ``error:`` on stderr, no traceback
  (130 for Ctrl-C);
* after a refusal or an interruption, a rerun of the command, or ``run --until-caught-up``, ends
  exact; readers (``export``) in between serve an exact state or refuse, never a partial one.

Each trial is classified by its worst step (:data:`OUTCOMES`, best to worst):

``exact``           every command ended exact (a second writer's required refusal included);
``refused``         some command refused clearly, nothing was served wrong, and the follow-up
                    ended exact or refused clearly again;
``crash``           a traceback, an exit status outside the contract (``Aborted!`` exit 1 on
                    Ctrl-C, exit 0 followed by a reader refusing), a continuous ``run`` that ended
                    while it should keep going;
``hang``            a command did not return within its time limit, or a continuous ``run`` did not
                    catch up within its deadline while serving only values the topic holds;
``silently-wrong``  exit 0 (or a reader's exit 0) with data that differs from the broker's, a value
                    the topic does not hold (any more), a second writer accepted, a refused writer or
                    a reader that changed the data dir, a deleted topic re-created by ``run``, or a
                    health report of ``caught_up`` while the broker was away.

``refused`` is within the contract but not what any scenario here expects: each follows the broker,
so every trial must end ``exact`` (:data:`EXPECTED_OUTCOMES`), the uninterrupted calibration runs of
``interrupted-writers`` above all. A refusal a step requires (the second writer; a rerun of
``restore`` without ``--overwrite`` on a data dir that already holds the topic) is checked there and
noted, and an interrupted command that exits 2 instead of with its signal's status is marked
``refused``.

"Lagging" versus "wrong": every value the harness produces is unique (``<tag>:<seq>``) and a
:class:`Ledger` holds every value committed to each (partition, key) of the current incarnation of
the topic (a transaction's values once it commits; values the broker lost by a cut are dropped). An
exported value missing from the ledger is *dead* (an older incarnation's, a cut tail's, an aborted
or open transaction's, or below the log start offset): wrong, not late.

Scenarios (:data:`SCENARIOS`)
-----------------------------
``topic-recreated``          delete and re-create the topic (shorter, longer, more or fewer
                             partitions), between runs and while a continuous ``run`` runs, on both
                             fetch paths.
``leader-divergence``        a dedicated broker is stopped, each partition's last segment cut at a
                             batch boundary (``.index``/``.timeindex`` deleted so it rebuilds them),
                             restarted (its leader epoch goes up, checked in ``leader-epoch-checkpoint``),
                             different records produced at the same offsets and beyond; then ``run``
                             on a data dir of each fetch path.
``log-start-past-local-end`` ``delete_records`` to the high watermark after the local copy (with and
                             without records after it), and to an offset inside a batch before a
                             fresh run (then a rebuild of the store from the local log).
``interrupted-writers``      SIGINT, SIGTERM or SIGKILL at a random moment of ``restore
                             --from-log-dir`` (fresh or ``--overwrite``), ``restore --from-snapshot``,
                             ``compact`` and ``run`` (continuous or ``--until-caught-up``, the fetch
                             path switched between restarts while a transaction stays open across
                             the switch and commits or aborts later).
``two-writers``              ``run`` + ``run``, ``run`` + ``restore --overwrite``, ``run`` +
                             ``compact`` on one data dir: the second is refused at once (and writes
                             nothing), the first ends exact.
``read-only-readers``        ``get`` and ``export`` on a read-only bind mount of a data dir (root
                             only), and on the data dir itself: they work or refuse, and write nothing.
``broker-paused``            a dedicated broker's JVM is SIGSTOPped for a minute while a continuous
                             ``run`` (with ``--metrics-port``) runs, then SIGCONTed, then restarted:
                             the run keeps going, reports ``materializer_caught_up 0`` while the
                             broker is away, and ends exact.
``broker-restarts``          a dedicated broker stopped for ~4 s and started again, three times, while a
                             continuous ``run`` runs (with ``--group-id``, a second member joining right
                             before the second restart and leaving right before the third; or without
                             a group) and records are produced between restarts: the run survives each
                             restart, reports ``materializer_caught_up 0`` while the broker is away, and
                             ends exact (issue 37).
``log-start-while-running`` retention or ``delete_records`` moves the broker's log start offset
                             under a continuous ``run`` (both paths, with and without ``--group-id``):
                             its export follows within seconds, the expired-entries counter is exact.
``long-lived-view``          a view held open across SIGTERM and SIGKILL restarts of ``run`` answers
                             every key as of the offsets it reports.
``partitions-added``         partitions added (2 to 4) under a continuous ``run`` (both paths, with and
                             without ``--group-id``), records produced to all: its export takes the new
                             partitions in within seconds and it is caught up again.

Not covered: ``spark snapshot`` and ``spark compact`` write only their ``--out`` folder and start a
JVM each (~20 s on two cores), too slow for a CI trial. ``restore --from-snapshot`` is covered with
an SST snapshot the harness writes itself with :class:`materializer.adapters.rocksdb_store.StoreSstWriter`
(what the Spark job's executors call) from the consumer's records, so no Spark is needed.

Running it
----------
``python -m tests.ops_campaign --trials N --seed S [--scenario NAME ...]`` starts a local broker (the
Kafka jars: ``make broker-jars``), runs ``N`` trials of each scenario and prints one row per
scenario (trial counts per outcome, seconds per trial) and the wall time; exit status 1 when a trial
ended outside its scenario's expected outcomes (:data:`EXPECTED_OUTCOMES`: exact only, for every
scenario here). ``-v`` prints every trial's notes. The CI test is
``tests/integration/test_operations_campaign.py``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Protocol, Sequence

__all__ = [
    "OUTCOMES",
    "SCENARIOS",
    "BrokerTruth",
    "EXPECTED_OUTCOMES",
    "Ledger",
    "Trial",
    "broker_truth",
    "expected_outcomes",
    "main",
    "run_scenario",
    "summary_table",
]

#: Trial outcomes, best to worst; a trial takes the worst outcome of its steps.
OUTCOMES = ("exact", "refused", "crash", "hang", "silently-wrong")
_RANK = {name: rank for rank, name in enumerate(OUTCOMES)}
#: Outcomes within the contract (nothing served wrong, no crash, no hang).
ACCEPTABLE = frozenset({"exact", "refused"})
#: The outcomes each scenario's trials may end in, which the CI test and ``main`` require: a
#: refusal is a clear failure, but a failure all the same where the documented behaviour is to
#: follow the broker (docs/how-it-works.md, "Following the leader") or to serve (readers on a
#: read-only mount, a continuous run through a broker pause). Refusals a scenario's contract
#: requires (the second writer; a rerun of ``restore`` without ``--overwrite`` on a data dir that
#: holds the topic) are checked by that step and noted, not marked. A scenario not listed here may
#: end exact only.
EXPECTED_OUTCOMES: dict[str, frozenset[str]] = {
    "topic-recreated": frozenset({"exact"}),
    "leader-divergence": frozenset({"exact"}),
    "log-start-past-local-end": frozenset({"exact"}),
    "interrupted-writers": frozenset({"exact"}),
    "two-writers": frozenset({"exact"}),
    "read-only-readers": frozenset({"exact"}),
    "broker-paused": frozenset({"exact"}),
}


def expected_outcomes(scenario: str) -> frozenset[str]:
    """The outcomes ``scenario``'s trials may end in (:data:`EXPECTED_OUTCOMES`, else exact only)."""
    return EXPECTED_OUTCOMES.get(scenario, frozenset({"exact"}))


_CLI = [sys.executable, "-m", "materializer"]
_FETCH_PATHS = ("replica", "consumer")
_COMMAND_TIMEOUT_S = 60.0      # any finite command (restore, compact, export, get) returns within this
_RUN_TIMEOUT_S = 45.0          # `run --until-caught-up --timeout 10` returns within this, else it hangs
_RUN_BROKER_TIMEOUT_S = "10"   # --timeout of every `run`, seconds
_CATCH_UP_DEADLINE_S = 20.0    # a continuous run serves the topic exactly within this after producing stops
_STOP_TIMEOUT_S = 30.0         # a continuous run exits within this after SIGTERM
_PAUSE_S = 60.0                # broker-paused: how long the JVM stays stopped
_RESTART_DOWN_S = 4.0          # broker-restarts: how long the broker stays stopped each time


# ---------------------------------------------------------------------------------------------- trials

@dataclass
class Trial:
    """One trial: its scenario, variant (what was done), outcome, notes (why) and wall seconds."""

    scenario: str
    variant: str
    seed: int
    outcome: str = "exact"
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def mark(self, outcome: str, note: str) -> None:
        """Record a step's ``outcome`` (one of :data:`OUTCOMES`); the trial keeps the worst."""
        if outcome not in _RANK:
            raise ValueError(f"unknown outcome {outcome!r}")
        if _RANK[outcome] > _RANK[self.outcome]:
            self.outcome = outcome
        self.notes.append(f"[{outcome}] {_one_line(note)}")

    def note(self, text: str) -> None:
        """A remark that does not change the outcome."""
        self.notes.append(_one_line(text))

    def line(self) -> str:
        return f"{self.scenario} {self.variant} (seed {self.seed}): {self.outcome} in {self.seconds:.1f} s"


def _one_line(text: str) -> str:
    return " | ".join(line.strip() for line in text.strip().splitlines())


class SharedBroker(Protocol):
    """The broker most scenarios share: the pytest plugin's ``KafkaBrokerHandle`` or a
    :class:`~materializer.local.kafka_broker.LocalKafkaBroker`."""

    @property
    def bootstrap_servers(self) -> str: ...

    def partition_dir(self, topic: str, partition: int) -> Path: ...


# ---------------------------------------------------------------------------------------------- commands

@dataclass
class Done:
    """A finished (or killed) CLI command: exit status (negative: killed by that signal; None: it
    did not exit within its time limit and was SIGKILLed), output, wall seconds."""

    args: list[str]
    rc: int | None
    stdout: str
    stderr: str
    seconds: float
    timed_out: bool = False

    @property
    def error_lines(self) -> list[str]:
        return [line for line in self.stderr.splitlines() if line.startswith("error:")]

    @property
    def clear_refusal(self) -> bool:
        """Exit 2, exactly one ``error:`` line on stderr, no traceback (the CLI contract)."""
        return self.rc == 2 and len(self.error_lines) == 1 and "Traceback" not in self.stderr

    @property
    def traceback(self) -> bool:
        return "Traceback (most recent call last)" in self.stderr

    def brief(self) -> str:
        """``materializer <command>: rc=N, <last stderr lines>`` for notes."""
        command = " ".join(a for a in self.args[3:5] if not a.startswith("-"))
        tail = " | ".join(line.strip() for line in self.stderr.strip().splitlines()[-2:])[:300]
        status = "no exit (killed)" if self.timed_out else f"rc={self.rc}"
        return f"`{command}` {status} after {self.seconds:.1f} s" + (f": {tail}" if tail else "")


def _cli_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MATERIALIZER_", "FAULT_"))}
    env.pop("KAFKA_BOOTSTRAP_SERVERS", None)
    env["PYTHONUNBUFFERED"] = "1"
    return env


class Running:
    """A CLI command started in its own session (so a hang can be killed whole); its output goes to
    files in ``out_dir`` (a pipe could fill and block it)."""

    _counter = 0

    def __init__(self, args: Sequence[str], out_dir: Path) -> None:
        Running._counter += 1
        self.args = [*_CLI, *args]
        stem = out_dir / f"cmd-{Running._counter:04d}"
        self._out_path, self._err_path = stem.with_suffix(".out"), stem.with_suffix(".err")
        self._out, self._err = open(self._out_path, "wb"), open(self._err_path, "wb")
        self.started = time.monotonic()
        self.done: Done | None = None
        self.reported = False  # its end was already judged (a continuous run that ended by itself)
        self.proc = subprocess.Popen(self.args, stdin=subprocess.DEVNULL, stdout=self._out, stderr=self._err,
                                     env=_cli_env(), start_new_session=True)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def send(self, sig: int) -> bool:
        """Send ``sig`` to the command's process; False when it had already exited."""
        if not self.alive():
            return False
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.proc.pid, sig)
        return True

    def wait(self, timeout_s: float) -> Done:
        """Wait up to ``timeout_s``; a command still running then is SIGKILLed (with its process
        group) and reported ``timed_out``. Later calls return the same result."""
        if self.done is not None:
            return self.done
        timed_out = False
        try:
            self.proc.wait(timeout=max(0.0, timeout_s))
        except subprocess.TimeoutExpired:
            timed_out = True
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        seconds = time.monotonic() - self.started
        self._out.close()
        self._err.close()
        self.done = Done(self.args, None if timed_out else self.proc.returncode,
                         self._out_path.read_text(errors="replace"), self._err_path.read_text(errors="replace"),
                         seconds, timed_out)
        return self.done

    def kill(self) -> None:
        """SIGKILL the whole process group (cleanup)."""
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


# ---------------------------------------------------------------------------------------------- the oracle

@dataclass
class BrokerTruth:
    """What a read_committed consumer reads from the broker at one moment.

    ``latest``: (partition, key) -> value of its latest record (a tombstone removes the key);
    ``where``: (partition, key) -> (offset, timestamp ms) of that record; ``history``: (partition,
    key) -> every value read; ``end_offsets``: partition -> where the consumer stopped (the last
    stable offset, the high watermark when no transaction is open); ``partitions``: how many.
    """

    latest: dict[tuple[int, str], str]
    where: dict[tuple[int, str], tuple[int, int]]
    history: dict[tuple[int, str], set[str]]
    end_offsets: dict[int, int]
    partitions: int


def topic_partitions(admin: Any, topic: str) -> int:
    """The topic's partition count from Metadata (0 when the topic does not exist)."""
    metadata = admin.list_topics(topic=topic, timeout=10).topics.get(topic)
    if metadata is None or metadata.error is not None:
        return 0
    return len(metadata.partitions)


def broker_truth(bootstrap: str, topic: str, *, timeout_s: float = 30.0) -> BrokerTruth:
    """Read every partition of ``topic`` from its log start offset to its end with a read_committed
    consumer in no group (confluent-kafka), as :func:`materializer.testing.compaction_oracle.read_topic_records`
    does, but from ``OFFSET_BEGINNING`` so that a log start offset moved by ``delete_records`` or
    retention is followed.

    Raises:
        AssertionError: a fetch error, or a partition not read to its end within ``timeout_s``.
    """
    from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition
    from confluent_kafka.admin import AdminClient

    partitions = topic_partitions(AdminClient({"bootstrap.servers": bootstrap}), topic)
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"ops-truth-{time.time_ns()}",
                         "enable.auto.commit": False, "enable.partition.eof": True,
                         "isolation.level": "read_committed", "auto.offset.reset": "earliest"})
    latest: dict[tuple[int, str], str] = {}
    where: dict[tuple[int, str], tuple[int, int]] = {}
    history: dict[tuple[int, str], set[str]] = {}
    end_offsets: dict[int, int] = {}
    try:
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
        deadline = time.monotonic() + timeout_s
        while len(end_offsets) < partitions and time.monotonic() < deadline:
            for msg in consumer.consume(1000, timeout=0.5):
                partition = msg.partition()
                if msg.error():
                    assert msg.error().code() == KafkaError._PARTITION_EOF, msg.error()
                    end_offsets.setdefault(partition, msg.offset())
                    continue
                if partition in end_offsets:
                    continue
                key = msg.key().decode()
                value = msg.value()
                if value is None:
                    latest.pop((partition, key), None)
                    where.pop((partition, key), None)
                else:
                    text = value.decode()
                    latest[(partition, key)] = text
                    where[(partition, key)] = (msg.offset(), msg.timestamp()[1])
                    history.setdefault((partition, key), set()).add(text)
    finally:
        consumer.close()
    assert len(end_offsets) == partitions, f"the consumer did not read {topic} to its end in {timeout_s} s"
    return BrokerTruth(latest, where, history, end_offsets, partitions)


class Ledger:
    """Every value committed to each (partition, key) of the current incarnation of a topic.

    Values come from delivery reports (a transaction's once it commits), so the broker's cleaner
    compacting the topic does not make a late value look dead. :meth:`reset` starts a new
    incarnation (topic re-created, records deleted); :meth:`reset_from` takes what the broker holds
    (after a cut tail).
    """

    def __init__(self) -> None:
        self.values: dict[tuple[int, str], set[str]] = {}

    def add(self, partition: int, key: str, value: str | None) -> None:
        if value is not None:
            self.values.setdefault((partition, key), set()).add(value)

    def reset(self) -> None:
        self.values = {}

    def reset_from(self, truth: BrokerTruth) -> None:
        self.values = {pk: set(values) for pk, values in truth.history.items()}

    def dead(self, state: Mapping[tuple[int, str], str]) -> list[tuple[int, str, str]]:
        """Entries of ``state`` whose value was never committed to that (partition, key) here."""
        return [(p, k, v) for (p, k), v in sorted(state.items()) if v not in self.values.get((p, k), ())]


def describe_difference(state: Mapping[tuple[int, str], str], truth: Mapping[tuple[int, str], str],
                        limit: int = 3) -> str | None:
    """None when equal, else ``N missing, N not on the broker, N different`` with examples."""
    if dict(state) == dict(truth):
        return None
    missing = sorted(set(truth) - set(state))
    extra = sorted(set(state) - set(truth))
    different = sorted(pk for pk in set(state) & set(truth) if state[pk] != truth[pk])
    parts = [f"{len(state)} entries exported, {len(truth)} on the broker: {len(missing)} missing, "
             f"{len(extra)} not on the broker, {len(different)} with another value"]
    if missing:
        parts.append(f"missing {missing[:limit]}")
    if extra:
        parts.append(f"extra {[(p, k, state[(p, k)]) for p, k in extra[:limit]]}")
    if different:
        parts.append(f"different {[(p, k, state[(p, k)], truth[(p, k)]) for p, k in different[:limit]]}")
    return "; ".join(parts)


# ---------------------------------------------------------------------------------------------- producing

def produce(bootstrap: str, topic: str, ledger: Ledger, *, count: int, keys: int, tag: str, rng: random.Random,
            tombstone_ratio: float = 0.1, batch_bytes: int = 4096, linger_ms: int = 5,
            partition: int | None = None, every_key_first: bool = False) -> int:
    """Produce ``count`` records over keys ``k00000``.. with unique values ``<tag>:<seq>`` (tombstones
    at ``tombstone_ratio``), ``batch_bytes`` per producer batch (small: many broker batches);
    deliveries go into ``ledger``. With ``every_key_first``, each of the ``keys`` keys is written
    once first (shuffled; on top of ``count``), so no earlier value of any key stays the latest.
    Returns the records delivered.

    Raises:
        AssertionError: a delivery failed.
    """
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": linger_ms, "batch.size": batch_bytes,
                         "acks": "all", "enable.idempotence": True, "log_level": 3})
    errors: list[str] = []
    delivered = 0

    def on_delivery(err: Any, msg: Any) -> None:
        nonlocal delivered
        if err is not None:
            errors.append(err.str())
            return
        delivered += 1
        ledger.add(msg.partition(), msg.key().decode(), None if msg.value() is None else msg.value().decode())

    first = rng.sample(range(keys), keys) if every_key_first else []
    for seq in range(len(first) + count):
        key = f"k{first[seq] if seq < len(first) else rng.randrange(keys):05d}".encode()
        value = None if rng.random() < tombstone_ratio else f"{tag}:{seq}".encode()
        extra = {} if partition is None else {"partition": partition}
        while True:
            try:
                producer.produce(topic, key=key, value=value, on_delivery=on_delivery, **extra)
                break
            except BufferError:
                producer.poll(0.05)
        producer.poll(0)
    remaining = producer.flush(60)
    assert remaining == 0 and not errors, f"produce to {topic}: {remaining} undelivered, errors {errors[:3]}"
    return delivered


class Transaction:
    """A transactional producer whose transaction can stay open across commands; its values join
    the ledger only on commit."""

    def __init__(self, bootstrap: str, topic: str, transactional_id: str) -> None:
        from confluent_kafka import Producer

        self.topic = topic
        self.producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": transactional_id,
                                  "linger.ms": 5, "acks": "all", "log_level": 3})
        self.producer.init_transactions(30)
        self.pending: list[tuple[int, str, str | None]] = []
        self.open = False

    def begin(self, *, count: int, keys: int, tag: str, rng: random.Random) -> None:
        """Begin a transaction and produce ``count`` records in it (delivered, not committed)."""
        errors: list[str] = []

        def on_delivery(err: Any, msg: Any) -> None:
            if err is not None:
                errors.append(err.str())
            else:
                self.pending.append((msg.partition(), msg.key().decode(),
                                     None if msg.value() is None else msg.value().decode()))

        self.producer.begin_transaction()
        self.open = True
        for seq in range(count):
            value = f"{tag}:{seq}".encode()
            self.producer.produce(self.topic, key=f"k{rng.randrange(keys):05d}".encode(), value=value,
                                  on_delivery=on_delivery)
        assert self.producer.flush(30) == 0 and not errors, f"transactional produce: {errors[:3]}"

    def end(self, ledger: Ledger, *, commit: bool) -> None:
        """Commit (values join ``ledger``) or abort the open transaction."""
        if commit:
            self.producer.commit_transaction(30)
            for partition, key, value in self.pending:
                ledger.add(partition, key, value)
        else:
            self.producer.abort_transaction(30)
        self.pending = []
        self.open = False


# ---------------------------------------------------------------------------------------------- topics

def create_topic(admin: Any, topic: str, partitions: int, config: Mapping[str, str], *,
                 timeout_s: float = 30.0) -> None:
    """Create ``topic`` and wait until every partition has a leader.

    Raises:
        confluent_kafka.KafkaException: the broker refused (e.g. TOPIC_ALREADY_EXISTS).
        AssertionError: no leaders within ``timeout_s``.
    """
    from confluent_kafka.admin import NewTopic

    admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1,
                                  config=dict(config))])[topic].result(timeout_s)
    wait_for_leaders(admin, topic, partitions, timeout_s)


def wait_for_leaders(admin: Any, topic: str, partitions: int, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        metadata = admin.list_topics(topic=topic, timeout=5).topics.get(topic)
        if metadata is not None and metadata.error is None and len(metadata.partitions) == partitions \
                and all(p.leader >= 0 for p in metadata.partitions.values()):
            return
        time.sleep(0.2)
    raise AssertionError(f"topic {topic} has no leaders for its {partitions} partitions after {timeout_s} s")


def topic_id(admin: Any, topic: str) -> str | None:
    """The topic's id (KIP-516) from DescribeTopics, or None when it does not exist."""
    from confluent_kafka import KafkaException, TopicCollection

    try:
        return str(admin.describe_topics(TopicCollection([topic]))[topic].result(10).topic_id)
    except KafkaException:
        return None


def delete_topic(admin: Any, topic: str, *, timeout_s: float = 30.0) -> bool:
    """Delete ``topic`` and wait until the broker no longer has that incarnation. Returns False
    when a topic of the same name but another id appeared meanwhile (someone re-created it)."""
    old = topic_id(admin, topic)
    admin.delete_topics([topic])[topic].result(timeout_s)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        now = topic_id(admin, topic)
        if now is None:
            return True
        if now != old:
            return False
        time.sleep(0.1)
    raise AssertionError(f"topic {topic} still exists {timeout_s} s after its deletion")


def high_watermarks(bootstrap: str, topic: str, partitions: int) -> dict[int, int]:
    """partition -> high watermark (a read_uncommitted query of the broker)."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"ops-hw-{time.time_ns()}"})
    try:
        return {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in range(partitions)}
    finally:
        consumer.close()


def copy_log_dir(broker: SharedBroker, topic: str, partitions: int, target: Path) -> Path:
    """A copy of the broker's folders of ``topic`` (and its checkpoint files) in ``target``, as an
    operator copies a broker's log dir; the broker keeps running (nothing is produced meanwhile)."""
    target.mkdir(parents=True)
    source_root = None
    for partition in range(partitions):
        source = broker.partition_dir(topic, partition)
        source_root = source.parent
        shutil.copytree(source, target / source.name)
    assert source_root is not None
    for name in ("recovery-point-offset-checkpoint", "log-start-offset-checkpoint"):
        with contextlib.suppress(FileNotFoundError):
            shutil.copy2(source_root / name, target / name)
    return target


def write_sst_snapshot(truth: BrokerTruth, topic: str, out: Path) -> Path:
    """An SST snapshot of ``truth`` in the layout ``materializer spark snapshot --format sst``
    writes (``sst/partition-<p>.sst`` and ``_manifest.json`` with each partition's next offset),
    written with the same :class:`StoreSstWriter` the Spark job's executors use."""
    from materializer.adapters.rocksdb_store import StoreSstWriter

    (out / "sst").mkdir(parents=True)
    files: dict[str, str] = {}
    rows = 0
    for partition in range(truth.partitions):
        entries = sorted((k.encode(), v.encode()) for (p, k), v in truth.latest.items() if p == partition)
        writer = StoreSstWriter(out / "sst" / f"partition-{partition}.sst")
        for key, value in entries:
            offset, timestamp = truth.where[(partition, key.decode())]
            writer.put(partition, key, offset, timestamp, value)
        if writer.finish():
            files[str(partition)] = writer.path.name
            rows += writer.entries
    manifest = {"topic": topic, "format": "sst", "rows": rows, "files": files,
                "partitions": {str(p): o for p, o in sorted(truth.end_offsets.items())}}
    (out / "_manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return out


# ---------------------------------------------------------------------------------------------- a trial's context

class Context:
    """What a scenario round works with: the shared broker, a scratch folder, a seeded random
    generator, and the judging steps that mark its trials."""

    def __init__(self, scenario: str, broker: SharedBroker, workdir: Path, seed: int, index: int) -> None:
        from confluent_kafka.admin import AdminClient

        self.scenario = scenario
        self.broker = broker
        self.dir = workdir
        self.seed = seed
        self.index = index
        self.rng = random.Random(f"{scenario}-{seed}-{index}")
        self.admin = AdminClient({"bootstrap.servers": broker.bootstrap_servers})
        self.trials: list[Trial] = []
        self._running: list[Running] = []
        self.out_dir = workdir / "commands"
        self.out_dir.mkdir(parents=True, exist_ok=True)

    # -- bookkeeping
    @property
    def bootstrap(self) -> str:
        return self.broker.bootstrap_servers

    def trial(self, variant: str) -> Trial:
        trial = Trial(self.scenario, variant, self.seed)
        self.trials.append(trial)
        return trial

    def topic(self, suffix: str = "") -> str:
        return f"ops-{self.scenario}-{self.seed}-{self.index}{suffix}-{time.time_ns() % 1_000_000_000}"

    def variant(self, choices: Sequence[Any]) -> Any:
        """Variants cycle with the trial index, so N trials cover the first N variants."""
        return choices[self.index % len(choices)]

    @contextlib.contextmanager
    def on_broker(self, broker: SharedBroker) -> Iterator[None]:
        """Commands, truths and admin requests go to ``broker`` (a dedicated one) inside the block."""
        from confluent_kafka.admin import AdminClient

        saved = self.broker, self.admin
        self.broker, self.admin = broker, AdminClient({"bootstrap.servers": broker.bootstrap_servers})
        try:
            yield
        finally:
            self.broker, self.admin = saved

    # -- commands
    def start(self, args: Sequence[str]) -> Running:
        running = Running(args, self.out_dir)
        self._running.append(running)
        return running

    def cli(self, args: Sequence[str], timeout_s: float = _COMMAND_TIMEOUT_S) -> Done:
        return self.start(args).wait(timeout_s)

    def cleanup(self) -> None:
        for running in self._running:
            running.kill()

    def run_args(self, topic: str, data_dir: Path, fetch: str, *, until_caught_up: bool = True,
                 extra: Sequence[str] = ()) -> list[str]:
        args = ["run", "--bootstrap-servers", self.bootstrap, "--topic", topic, "--data-dir", str(data_dir),
                "--fetch", fetch, "--timeout", _RUN_BROKER_TIMEOUT_S, "--no-progress", *extra]
        return [*args, "--until-caught-up"] if until_caught_up else args

    # -- reading
    def truth(self, topic: str) -> BrokerTruth:
        return broker_truth(self.bootstrap, topic)

    def export(self, data_dir: Path, topic: str) -> tuple[Done, dict[tuple[int, str], str] | None]:
        """``export``'s result and, on exit 0, its (partition, key) -> value."""
        done = self.cli(["export", "--data-dir", str(data_dir), "--topic", topic, "--no-progress"])
        if done.rc != 0:
            return done, None
        state: dict[tuple[int, str], str] = {}
        for line in done.stdout.splitlines():
            row = json.loads(line)
            key = row["key"] if "key" in row else repr(row.get("key_b64"))
            value = row["value"] if "value" in row else repr(row.get("value_b64"))
            state[(int(row["partition"]), key)] = value
        return done, state

    # -- judging
    def judge_finished(self, trial: Trial, done: Done, data_dir: Path, topic: str, ledger: Ledger, label: str,
                       *, followups: Sequence[Sequence[str]] = (), truth: BrokerTruth | None = None) -> str:
        """Judge a command that should leave ``data_dir`` exact (exit 0) or refuse clearly; after a
        refusal or a hang, readers may not serve a dead value; after a refusal ``followups`` (a
        rerun, then ``run --until-caught-up``...) are tried in turn until one exits 0, which must be
        exact. Returns the outcome of this step."""
        if done.timed_out:
            trial.mark("hang", f"{label}: {done.brief()}")
            self.check_readers(trial, data_dir, topic, ledger, f"after {label} hung")
            return "hang"  # a rerun would hang as long again; the trial is a hang already
        if done.rc == 0:
            return self.expect_exact(trial, data_dir, topic, label, done, truth=truth)
        elif done.clear_refusal:
            trial.mark("refused", f"{label}: {done.error_lines[0][:300]}")
            self.check_readers(trial, data_dir, topic, ledger, f"after {label} refused")
        else:
            trial.mark("crash", f"{label}: {done.brief()}")
            self.check_readers(trial, data_dir, topic, ledger, f"after {label} crashed")
        if followups:
            again = self.cli(followups[0], timeout_s=_RUN_TIMEOUT_S)
            return self.judge_finished(trial, again, data_dir, topic, ledger, f"{label}, then {_name(followups[0])}",
                                       followups=followups[1:])
        return "refused" if done.clear_refusal else "crash"

    def expect_exact(self, trial: Trial, data_dir: Path, topic: str, label: str, done: Done | None = None, *,
                     truth: BrokerTruth | None = None) -> str:
        """``export`` must exit 0 and equal the broker's truth now (or ``truth``)."""
        truth = truth or self.truth(topic)
        exported, state = self.export(data_dir, topic)
        if state is None:
            if exported.clear_refusal and done is not None:
                trial.mark("crash", f"{label} exited 0 but export refuses: {exported.error_lines[0][:200]}")
                return "crash"
            trial.mark("crash" if not exported.clear_refusal else "refused", f"{label}: export {exported.brief()}")
            return trial.outcome
        difference = describe_difference(state, truth.latest)
        if difference is None:
            trial.note(f"{label}: exact ({len(state)} entries)")
            return "exact"
        trial.mark("silently-wrong", f"{label} exited 0 and export exited 0 with wrong data: {difference}")
        return "silently-wrong"

    def check_readers(self, trial: Trial, data_dir: Path, topic: str, ledger: Ledger, label: str, *,
                      acceptable: Sequence[BrokerTruth] | None = None) -> None:
        """After an interruption or refusal: ``export`` refuses clearly, or serves no dead value
        (``acceptable`` given: serves exactly one of those states)."""
        exported, state = self.export(data_dir, topic)
        if state is None:
            if not exported.clear_refusal:
                trial.mark("crash", f"{label}: export {exported.brief()}")
            return
        if acceptable is not None:
            if any(describe_difference(state, t.latest) is None for t in acceptable):
                return
            closest = min((describe_difference(state, t.latest) or "" for t in acceptable), key=len)
            trial.mark("silently-wrong", f"{label}: export exited 0 with a state that is neither the previous nor "
                                         f"the new one: {closest}")
            return
        dead = ledger.dead(state)
        if dead:
            trial.mark("silently-wrong", f"{label}: export exited 0 serving {len(dead)} values the topic does not "
                                         f"hold, e.g. {dead[:3]}")

    def await_exact(self, trial: Trial, running: Running, data_dir: Path, topic: str, ledger: Ledger, label: str,
                    deadline_s: float = _CATCH_UP_DEADLINE_S) -> bool:
        """A continuous ``run`` must serve the broker's truth within ``deadline_s``. Missing it:
        silently-wrong when it serves dead values, hang when it only lags; the run ending meanwhile:
        refused (clear) or crash."""
        truth = self.truth(topic)
        deadline = time.monotonic() + deadline_s
        state: dict[tuple[int, str], str] | None = None
        while True:
            if not running.alive():
                done = running.wait(0)
                running.reported = True
                outcome = "refused" if done.clear_refusal else "crash"
                trial.mark(outcome, f"{label}: the continuous run ended: {done.brief()}")
                return False
            _, state = self.export(data_dir, topic)
            if state is not None and describe_difference(state, truth.latest) is None:
                trial.note(f"{label}: exact after {deadline_s - (deadline - time.monotonic()):.1f} s")
                return True
            if time.monotonic() >= deadline:
                break
            time.sleep(0.5)
        dead = ledger.dead(state or {})
        if dead:
            trial.mark("silently-wrong", f"{label}: after {deadline_s:.0f} s the running store serves {len(dead)} "
                                         f"values the topic does not hold, e.g. {dead[:3]}; "
                                         f"{describe_difference(state or {}, truth.latest)}")
        else:
            trial.mark("hang", f"{label}: not caught up after {deadline_s:.0f} s: "
                               f"{describe_difference(state or {}, truth.latest)}")
        return False

    def stop_continuous(self, trial: Trial, running: Running, label: str) -> Done:
        """SIGTERM a continuous run: it prints its summary and exits 0 (deliverable 8)."""
        running.send(signal.SIGTERM)
        done = running.wait(_STOP_TIMEOUT_S)
        if running.reported:
            return done
        if done.timed_out:
            trial.mark("hang", f"{label}: SIGTERM: {done.brief()}")
        elif done.rc != 0:
            trial.mark("refused" if done.clear_refusal else "crash", f"{label}: SIGTERM: {done.brief()}")
        return done


def _name(args: Sequence[str]) -> str:
    return " ".join(a for a in args if a in ("run", "restore", "compact", "export", "--until-caught-up",
                                             "--overwrite", "--from-snapshot", "--from-log-dir"))


def _acceptable_exit(sig: int, done: Done) -> bool:
    """Exit statuses an interrupted command may have: it finished (0), refused clearly (2), was
    killed by the signal, or (Ctrl-C) exited 130; SIGTERM: 0 (summary) or 143."""
    if done.rc == 0 or done.clear_refusal or done.rc == -sig:
        return True
    return (sig == signal.SIGINT and done.rc == 130) or (sig == signal.SIGTERM and done.rc == 143)


# ---------------------------------------------------------------------------------------------- dedicated brokers

@contextlib.contextmanager
def dedicated_broker(state_dir: Path) -> Iterator[Any]:
    """A broker of its own (fixed ports and log dir across restarts), for cutting its log or
    pausing it; stopped at the end (SIGCONT first, in case it was paused)."""
    from materializer.local.kafka_broker import TEST_BROKER_CONFIG, LocalKafkaBroker

    broker = LocalKafkaBroker(state_dir, extra_config=TEST_BROKER_CONFIG, fast_start=True).start()
    try:
        yield broker
    finally:
        if broker.pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(broker.pid, signal.SIGCONT)
        broker.stop()


def latest_leader_epoch(partition_dir: Path) -> int:
    """The last epoch of a partition folder's ``leader-epoch-checkpoint`` (version, count, then
    ``epoch start_offset`` lines; ``LeaderEpochCheckpointFile``), -1 when it has no entry."""
    lines = (partition_dir / "leader-epoch-checkpoint").read_text().split("\n")
    entries = [line.split() for line in lines[2:] if line.strip()]
    return int(entries[-1][0]) if entries else -1


def cut_last_segment(partition_dir: Path, rng: random.Random) -> tuple[int, int]:
    """With the broker stopped: cut the partition's newest segment at a random batch boundary (at
    least one batch kept in the folder, at least one lost), delete its ``.index``, ``.timeindex``
    and ``.txnindex`` (the broker rebuilds them) and producer snapshots past the cut.
    Returns (the new log end offset, the records cut)."""
    from materializer.storage.record_batch import iter_batches

    segments = sorted(partition_dir.glob("*.log"))
    segment = segments[-1]
    data = segment.read_bytes()
    batches = [(position, batch.base_offset, batch.last_offset, batch.records_count)
               for position, batch in iter_batches(data, path=str(segment))]
    first_cut = 1 if len(segments) == 1 else 0
    assert len(batches) > first_cut, f"{segment} holds {len(batches)} batches, too few to cut"
    cut = rng.randint(max(first_cut, len(batches) // 2), len(batches) - 1)
    position, new_end, _, _ = batches[cut]
    lost = sum(count for _, _, _, count in batches[cut:])
    with open(segment, "r+b") as f:
        f.truncate(position)
    for suffix in (".index", ".timeindex", ".txnindex"):
        segment.with_suffix(suffix).unlink(missing_ok=True)
    for snapshot in partition_dir.glob("*.snapshot"):
        if int(snapshot.name.split(".")[0]) > new_end:
            snapshot.unlink()
    return new_end, lost


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _metrics(port: int) -> dict[str, float] | None:
    """The topic-wide samples of a run's Prometheus endpoint (every metric carries a ``topic``
    label; per-partition ones are left out), None when it does not answer."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=3) as response:
            text = response.read().decode()
    except OSError:
        return None
    samples: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name_and_labels, _, value = line.rpartition(" ")
            name = name_and_labels.partition("{")[0]
            if "partition=" in name_and_labels:
                continue  # per-partition samples: not what the scenarios read
            with contextlib.suppress(ValueError):
                samples[name] = float(value)
    return samples


def _tree(data_dir: Path) -> dict[str, tuple[int, int]]:
    """relative path -> (size, mtime ns) of every file under ``data_dir``."""
    tree: dict[str, tuple[int, int]] = {}
    for path in sorted(data_dir.rglob("*")):
        if path.is_file():
            stat = path.stat()
            tree[str(path.relative_to(data_dir))] = (stat.st_size, stat.st_mtime_ns)
    return tree


def _tree_changes(before: Mapping[str, tuple[int, int]], after: Mapping[str, tuple[int, int]]) -> list[str]:
    changes = [f"+{p}" for p in sorted(set(after) - set(before))]
    changes += [f"-{p}" for p in sorted(set(before) - set(after))]
    changes += [f"~{p}" for p in sorted(set(before) & set(after)) if before[p] != after[p]]
    return changes


# ---------------------------------------------------------------------------------------------- scenarios

_SHAPES = {  # name -> (partitions before, records before, partitions after, records after)
    "shorter": (2, 1500, 2, 300),
    "longer": (2, 800, 2, 2500),
    "more-partitions": (2, 1200, 4, 1200),
    "fewer-partitions": (3, 1200, 1, 900),
}


def scenario_topic_recreated(ctx: Context) -> None:
    """Delete and re-create the topic under its name, between runs or while a continuous run
    runs; the data dir must follow the new topic (or refuse) and never serve the old one."""
    when, fetch = ctx.variant([("between", "replica"), ("during", "consumer"), ("between", "consumer"),
                               ("during", "replica")])
    shape = ctx.rng.choice(sorted(_SHAPES))
    p1, n1, p2, n2 = _SHAPES[shape]
    trial = ctx.trial(f"{when}-runs/{fetch}/{shape}")
    topic = ctx.topic()
    config = {"cleanup.policy": "compact"}
    create_topic(ctx.admin, topic, p1, config)
    ledger = Ledger()
    produce(ctx.bootstrap, topic, ledger, count=n1, keys=300, tag="old", rng=ctx.rng)
    data_dir = ctx.dir / "data"
    run_until = ctx.run_args(topic, data_dir, fetch)

    def recreate() -> None:
        if not delete_topic(ctx.admin, topic):
            trial.mark("silently-wrong", "a topic of this name re-appeared right after its deletion: the running "
                                         "`run` re-created it (Metadata with auto-creation)")
        ledger.reset()
        for attempt in range(3):
            try:
                create_topic(ctx.admin, topic, p2, config)
                return
            except Exception as exc:  # noqa: BLE001 - TOPIC_ALREADY_EXISTS: the run re-created it meanwhile
                if "TOPIC_ALREADY_EXISTS" not in str(exc):
                    raise
                trial.mark("silently-wrong", "re-creating the topic failed with TOPIC_ALREADY_EXISTS: the running "
                                             "`run` re-created the deleted topic (Metadata with auto-creation)")
                if attempt < 2:
                    delete_topic(ctx.admin, topic)
        wait_for_leaders(ctx.admin, topic, topic_partitions(ctx.admin, topic))
        trial.note("the trial goes on with the topic the run re-created")

    if when == "between":
        ctx.judge_finished(trial, ctx.cli(run_until, _RUN_TIMEOUT_S), data_dir, topic, ledger, "first run")
        recreate()
        produce(ctx.bootstrap, topic, ledger, count=n2, keys=300, tag="new", rng=ctx.rng)
        ctx.judge_finished(trial, ctx.cli(run_until, _RUN_TIMEOUT_S), data_dir, topic, ledger,
                           "run after the re-creation", followups=[run_until])
        return
    running = ctx.start(ctx.run_args(topic, data_dir, fetch, until_caught_up=False,
                                     extra=["--metadata-refresh-interval-ms", "500"]))
    if ctx.await_exact(trial, running, data_dir, topic, ledger, "first catch-up"):
        recreate()
        produce(ctx.bootstrap, topic, ledger, count=n2, keys=300, tag="new", rng=ctx.rng)
        if ctx.await_exact(trial, running, data_dir, topic, ledger, "continuous run after the re-creation"):
            ctx.stop_continuous(trial, running, "continuous run")
            ctx.expect_exact(trial, data_dir, topic, "after SIGTERM")
        else:
            ctx.stop_continuous(trial, running, "continuous run")
    else:
        ctx.stop_continuous(trial, running, "continuous run")
    ctx.judge_finished(trial, ctx.cli(run_until, _RUN_TIMEOUT_S), data_dir, topic, ledger,
                       "run --until-caught-up afterwards", followups=[run_until])


def scenario_leader_divergence(ctx: Context) -> None:
    """One dedicated broker loses the tail of each partition (its last segment cut at a batch
    boundary while stopped), restarts with a higher leader epoch and takes different records at
    the same offsets and beyond; a data dir of each fetch path then runs. One trial per path."""
    trials = {fetch: ctx.trial(fetch) for fetch in _FETCH_PATHS}
    with dedicated_broker(ctx.dir / "broker") as broker, ctx.on_broker(broker):
        bootstrap = broker.bootstrap_servers
        topic = ctx.topic()
        partitions = 2
        create_topic(ctx.admin, topic, partitions, {"cleanup.policy": "delete"})
        ledger = Ledger()
        produce(bootstrap, topic, ledger, count=2000, keys=400, tag="before", rng=ctx.rng, batch_bytes=1024)
        data_dirs = {fetch: ctx.dir / f"data-{fetch}" for fetch in _FETCH_PATHS}
        for fetch in _FETCH_PATHS:
            done = ctx.cli(ctx.run_args(topic, data_dirs[fetch], fetch), _RUN_TIMEOUT_S)
            ctx.judge_finished(trials[fetch], done, data_dirs[fetch], topic, ledger, "first run")
        old_ends = high_watermarks(bootstrap, topic, partitions)
        epochs = {p: latest_leader_epoch(broker.partition_dir(topic, p)) for p in range(partitions)}
        broker.stop()
        cuts = {p: cut_last_segment(broker.partition_dir(topic, p), ctx.rng) for p in range(partitions)}
        broker.start()
        assert broker.bootstrap_servers == bootstrap, "the broker came back on other ports"
        wait_for_leaders(ctx.admin, topic, partitions)
        ledger.reset_from(ctx.truth(topic))  # the cut records are gone for good
        for round_ in range(10):  # different records at the cut offsets and past the old ends
            produce(bootstrap, topic, ledger, count=800, keys=400, tag=f"after{round_}", rng=ctx.rng, batch_bytes=1024)
            now = high_watermarks(bootstrap, topic, partitions)
            if all(now[p] > old_ends[p] for p in range(partitions)):
                break
        new_epochs = {p: latest_leader_epoch(broker.partition_dir(topic, p)) for p in range(partitions)}
        assert all(new_epochs[p] > epochs[p] for p in range(partitions)), \
            f"the leader epoch did not go up across the restart: {epochs} -> {new_epochs}"
        for fetch in _FETCH_PATHS:
            trials[fetch].note(f"cut (new end, records lost) per partition {cuts}; ends {old_ends} -> {now}; "
                               f"leader epochs {epochs} -> {new_epochs}")
            args = ctx.run_args(topic, data_dirs[fetch], fetch)
            ctx.judge_finished(trials[fetch], ctx.cli(args, _RUN_TIMEOUT_S), data_dirs[fetch], topic, ledger,
                               "run after the divergence", followups=[args])


def scenario_log_start_past_local_end(ctx: Context) -> None:
    """``delete_records`` past the local log end (with or without records after it), or inside a
    batch before a fresh run; ``run --until-caught-up`` must return, exact.

    ``past-end-empty`` takes the contract literally: the broker then serves nothing, so values the
    store applied from records deleted since must go (a follower whose log end is below the
    leader's log start offset truncates fully and starts there, and the store is rewound with its
    log). ``past-end-then-more`` rewrites every key after the deleted range, so it holds whichever
    way that is read."""
    variant, fetch = ctx.variant([("past-end-empty", "replica"), ("inside-batch", "replica"),
                                  ("past-end-then-more", "consumer"), ("past-end-empty", "consumer"),
                                  ("inside-batch", "consumer"), ("past-end-then-more", "replica")])
    trial = ctx.trial(f"{variant}/{fetch}")
    topic = ctx.topic()
    partitions = 1 if variant == "inside-batch" else 2
    create_topic(ctx.admin, topic, partitions, {"cleanup.policy": ctx.rng.choice(["delete", "compact,delete"])})
    ledger = Ledger()
    data_dir = ctx.dir / "data"
    run_until = ctx.run_args(topic, data_dir, fetch)
    from confluent_kafka import TopicPartition

    if variant == "inside-batch":
        # one producer batch of 600 records (linger 1 s, 1 MiB batches), then log start offset 300
        produce(ctx.bootstrap, topic, ledger, count=600, keys=200, tag="batched", rng=ctx.rng,
                batch_bytes=1 << 20, linger_ms=1000)
        cut = 300
        with contextlib.suppress(FileNotFoundError, OSError):
            from materializer.storage.record_batch import iter_batches

            for segment in sorted(ctx.broker.partition_dir(topic, 0).glob("*.log")):
                for _, batch in iter_batches(segment.read_bytes()):
                    if batch.last_offset - batch.base_offset >= 2:
                        cut = (batch.base_offset + batch.last_offset + 1) // 2
                        break
        ctx.admin.delete_records([TopicPartition(topic, 0, cut)])[TopicPartition(topic, 0, cut)].result(30)
        ledger.reset_from(ctx.truth(topic))
        trial.note(f"log start offset {cut}, inside a batch")
        ctx.judge_finished(trial, ctx.cli(run_until, _RUN_TIMEOUT_S), data_dir, topic, ledger, "fresh run",
                           followups=[run_until])
        shutil.rmtree(data_dir / "state" / topic, ignore_errors=True)
        ctx.judge_finished(trial, ctx.cli(run_until, _RUN_TIMEOUT_S), data_dir, topic, ledger,
                           "rebuild of the store from the local log", followups=[run_until])
        return
    produce(ctx.bootstrap, topic, ledger, count=1200, keys=300, tag="local", rng=ctx.rng)
    ctx.judge_finished(trial, ctx.cli(run_until, _RUN_TIMEOUT_S), data_dir, topic, ledger, "first run")
    produce(ctx.bootstrap, topic, ledger, count=900, keys=300, tag="deleted", rng=ctx.rng)
    ends = high_watermarks(ctx.bootstrap, topic, partitions)
    wanted = [TopicPartition(topic, p, ends[p]) for p in range(partitions)]
    for future in ctx.admin.delete_records(wanted).values():
        future.result(30)
    ledger.reset()
    if variant == "past-end-then-more":
        # every key rewritten after the deleted range: the result does not depend on whether values
        # applied before the deletion should stay (past-end-empty is the case where it does)
        produce(ctx.bootstrap, topic, ledger, count=400, keys=300, tag="after", rng=ctx.rng, every_key_first=True)
    trial.note(f"log start offsets {ends} (the local copy ended below them)")
    ctx.judge_finished(trial, ctx.cli(run_until, _RUN_TIMEOUT_S), data_dir, topic, ledger,
                       "run --until-caught-up past the log start", followups=[run_until])


_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGKILL)


def _interrupt(ctx: Context, trial: Trial, args: Sequence[str], sig: int, delay_s: float, label: str) -> Done:
    """Start ``args``, send ``sig`` after ``delay_s``, wait; an exit status outside the contract
    is a crash, no exit a hang."""
    running = ctx.start(args)
    time.sleep(delay_s)
    sent = running.send(sig)
    done = running.wait(_RUN_TIMEOUT_S)
    what = f"{label}: {signal.Signals(sig).name} after {delay_s:.2f} s" + ("" if sent else " (already exited)")
    if done.timed_out:
        trial.mark("hang", f"{what}: {done.brief()}")
    elif not _acceptable_exit(sig, done):
        trial.mark("crash", f"{what}: {done.brief()}")
    elif done.rc == 2:  # clear, but a refusal is no answer to a signal (130, 143, killed, or done: 0)
        trial.mark("refused", f"{what}: {done.error_lines[0][:300]}")
    else:
        trial.note(f"{what}: rc={done.rc}")
    return done


def _rerun_restore(ctx: Context, trial: Trial, args: list[str]) -> Done:
    """Rerun an interrupted ``restore``. Without ``--overwrite`` on a data dir that already holds the
    topic (the interrupted one had swapped its data in, or left an incomplete topic) the rerun must
    refuse, naming ``--overwrite`` (the contract, noted); then it runs again with ``--overwrite``."""
    done = ctx.cli(args)
    if "--overwrite" not in args and done.clear_refusal and "use --overwrite" in done.error_lines[0]:
        trial.note(f"rerun without --overwrite refused as it must: {done.error_lines[0][:200]}")
        done = ctx.cli([*args, "--overwrite"])
    return done


def scenario_interrupted_writers(ctx: Context) -> None:
    """SIGINT/SIGTERM/SIGKILL at a random moment of each command that writes a data dir."""
    command = ctx.variant(["restore-log-dir", "run-switching-paths", "restore-snapshot", "compact"])
    {"restore-log-dir": _interrupt_restore_log_dir, "restore-snapshot": _interrupt_restore_snapshot,
     "compact": _interrupt_compact, "run-switching-paths": _interrupt_runs}[command](ctx)


def _transactional_topic(ctx: Context, partitions: int, ledger: Ledger) -> str:
    """A compacted topic with records in small batches, one committed and one aborted transaction."""
    topic = ctx.topic()
    create_topic(ctx.admin, topic, partitions, {"cleanup.policy": "compact"})
    produce(ctx.bootstrap, topic, ledger, count=2500, keys=400, tag="a", rng=ctx.rng, batch_bytes=1024)
    txn = Transaction(ctx.bootstrap, topic, f"{topic}-txn")
    txn.begin(count=50, keys=400, tag="committed", rng=ctx.rng)
    txn.end(ledger, commit=True)
    txn.begin(count=50, keys=400, tag="aborted", rng=ctx.rng)
    txn.end(ledger, commit=False)
    produce(ctx.bootstrap, topic, ledger, count=500, keys=400, tag="b", rng=ctx.rng, batch_bytes=1024)
    return topic


def _interrupt_restore_log_dir(ctx: Context) -> None:
    sig = ctx.rng.choice(_SIGNALS)
    overwrite = ctx.rng.random() < 0.5
    trial = ctx.trial(f"restore --from-log-dir{' --overwrite' if overwrite else ''}/{signal.Signals(sig).name}")
    ledger = Ledger()
    partitions = 3
    topic = _transactional_topic(ctx, partitions, ledger)
    old_source = copy_log_dir(ctx.broker, topic, partitions, ctx.dir / "broker-copy-old")
    old_truth = ctx.truth(topic)
    produce(ctx.bootstrap, topic, ledger, count=2000, keys=400, tag="c", rng=ctx.rng, batch_bytes=1024)
    source = copy_log_dir(ctx.broker, topic, partitions, ctx.dir / "broker-copy")
    new_truth = ctx.truth(topic)
    data_dir = ctx.dir / "data"

    def restore_args(src: Path, target: Path) -> list[str]:
        return ["restore", "--from-log-dir", str(src), "--topic", topic, "--data-dir", str(target), "--no-progress",
                *(["--overwrite"] if overwrite else [])]

    acceptable = [new_truth]
    if overwrite:
        done = ctx.cli(restore_args(old_source, data_dir))
        ctx.judge_finished(trial, done, data_dir, topic, ledger, "restore of the older copy", truth=old_truth)
        acceptable.append(old_truth)
    calibration = ctx.cli(restore_args(source, ctx.dir / "calibration"))
    ctx.judge_finished(trial, calibration, ctx.dir / "calibration", topic, ledger, "uninterrupted restore",
                       truth=new_truth)
    delay = ctx.rng.uniform(0.2, max(0.4, calibration.seconds * 1.1))
    _interrupt(ctx, trial, restore_args(source, data_dir), sig, delay, "restore")
    ctx.check_readers(trial, data_dir, topic, ledger, "export after the interrupted restore", acceptable=acceptable)
    rerun = _rerun_restore(ctx, trial, restore_args(source, data_dir))
    ctx.judge_finished(trial, rerun, data_dir, topic, ledger, "rerun of the restore", truth=new_truth,
                       followups=[ctx.run_args(topic, data_dir, ctx.rng.choice(_FETCH_PATHS))])


def _interrupt_restore_snapshot(ctx: Context) -> None:
    sig = ctx.rng.choice(_SIGNALS)
    trial = ctx.trial(f"restore --from-snapshot/{signal.Signals(sig).name}")
    ledger = Ledger()
    topic = _transactional_topic(ctx, 3, ledger)
    truth = ctx.truth(topic)
    snapshot = write_sst_snapshot(truth, topic, ctx.dir / "snapshot")
    data_dir = ctx.dir / "data"

    def restore_args(target: Path) -> list[str]:
        return ["restore", "--from-snapshot", str(snapshot), "--topic", topic, "--data-dir", str(target)]

    calibration = ctx.cli(restore_args(ctx.dir / "calibration"))
    ctx.judge_finished(trial, calibration, ctx.dir / "calibration", topic, ledger, "uninterrupted restore",
                       truth=truth)
    delay = ctx.rng.uniform(0.2, max(0.4, calibration.seconds * 1.1))
    _interrupt(ctx, trial, restore_args(data_dir), sig, delay, "restore --from-snapshot")
    ctx.check_readers(trial, data_dir, topic, ledger, "export after the interrupted restore", acceptable=[truth])
    rerun = _rerun_restore(ctx, trial, restore_args(data_dir))
    if rerun.clear_refusal and "already holds data of topic" in rerun.error_lines[0]:
        # The signal came after the restore's swap: a snapshot never restores over data (the
        # contract), so the refusal is the answer, and what the interrupted restore left must be exact.
        trial.note(f"rerun refused as it must after a restore that had swapped in: {rerun.error_lines[0][:200]}")
        ctx.expect_exact(trial, data_dir, topic, "the interrupted restore, swapped in before the signal", truth=truth)
        return
    ctx.judge_finished(trial, rerun, data_dir, topic, ledger, "rerun of the restore", truth=truth,
                       followups=[ctx.run_args(topic, data_dir, ctx.rng.choice(_FETCH_PATHS))])


def _interrupt_compact(ctx: Context) -> None:
    sig = ctx.rng.choice(_SIGNALS)
    fetch = ctx.rng.choice(_FETCH_PATHS)
    trial = ctx.trial(f"compact/{signal.Signals(sig).name}/{fetch}")
    ledger = Ledger()
    topic = ctx.topic()
    create_topic(ctx.admin, topic, 2, {"cleanup.policy": "compact"})
    produce(ctx.bootstrap, topic, ledger, count=4000, keys=80, tag="a", rng=ctx.rng, batch_bytes=1024)
    data_dir = ctx.dir / "data"
    run_until = ctx.run_args(topic, data_dir, fetch, extra=[
        "--cleaner-threads", "0", "--config", "segment.bytes=4096", "--config", "min.cleanable.dirty.ratio=0.01"])
    ctx.judge_finished(trial, ctx.cli(run_until, _RUN_TIMEOUT_S), data_dir, topic, ledger, "run")
    truth = ctx.truth(topic)
    calibration_dir = ctx.dir / "calibration"
    shutil.copytree(data_dir, calibration_dir)
    compact_args = ["compact", "--data-dir", str(data_dir), "--topic", topic, "--quiet", "--no-progress"]
    calibration = ctx.cli(["compact", "--data-dir", str(calibration_dir), "--topic", topic, "--quiet",
                           "--no-progress"])
    if calibration.rc != 0:
        trial.mark("refused" if calibration.clear_refusal else ("hang" if calibration.timed_out else "crash"),
                   f"uninterrupted compact: {calibration.brief()}")
    else:
        ctx.expect_exact(trial, calibration_dir, topic, "uninterrupted compact", calibration, truth=truth)
    delay = ctx.rng.uniform(0.2, max(0.4, calibration.seconds * 1.1))
    _interrupt(ctx, trial, compact_args, sig, delay, "compact")
    ctx.check_readers(trial, data_dir, topic, ledger, "export after the interrupted compact", acceptable=[truth])
    rerun = ctx.cli(compact_args)
    if rerun.rc != 0:
        trial.mark("refused" if rerun.clear_refusal else ("hang" if rerun.timed_out else "crash"),
                   f"rerun of compact: {rerun.brief()}")
    ctx.expect_exact(trial, data_dir, topic, "export after the rerun of compact", truth=truth)
    shutil.rmtree(data_dir / "state" / topic, ignore_errors=True)
    ctx.judge_finished(trial, ctx.cli(run_until, _RUN_TIMEOUT_S), data_dir, topic, ledger,
                       "rebuild of the store from the compacted local log", truth=truth, followups=[run_until])


def _interrupt_runs(ctx: Context) -> None:
    """Restarts of ``run`` interrupted at random, the fetch path switched at random, a transaction
    left open across a switch and committed or aborted later. The first two restarts are the
    issue's case: replica path while the transaction is open, commit, consumer path."""
    restarts = 4
    trial = ctx.trial(f"run x{restarts}, paths switched")
    ledger = Ledger()
    topic = ctx.topic()
    create_topic(ctx.admin, topic, 2, {"cleanup.policy": "compact"})
    produce(ctx.bootstrap, topic, ledger, count=2000, keys=300, tag="a", rng=ctx.rng, batch_bytes=1024)
    txn = Transaction(ctx.bootstrap, topic, f"{topic}-txn")
    data_dir = ctx.dir / "data"
    steps = []
    for step in range(restarts):
        if step == 0:
            txn.begin(count=40, keys=300, tag="t0", rng=ctx.rng)
            fetch = "replica"
        elif step == 1:
            txn.end(ledger, commit=True)
            fetch = "consumer"
        else:
            if txn.open and ctx.rng.random() < 0.6:
                txn.end(ledger, commit=ctx.rng.random() < 0.6)
            elif not txn.open and ctx.rng.random() < 0.7:
                txn.begin(count=ctx.rng.randint(5, 60), keys=300, tag=f"t{step}", rng=ctx.rng)
            fetch = ctx.rng.choice(_FETCH_PATHS)
        produce(ctx.bootstrap, topic, ledger, count=ctx.rng.randint(0, 400), keys=300, tag=f"s{step}", rng=ctx.rng,
                batch_bytes=1024)
        continuous = ctx.rng.random() < 0.5
        sig = ctx.rng.choice(_SIGNALS)
        delay = ctx.rng.uniform(0.2, 3.0 if continuous else 1.2)  # `--until-caught-up` is done in ~1 s
        steps.append(f"{fetch}{'' if continuous else '/until'}/{signal.Signals(sig).name}"
                     f"{'/txn open' if txn.open else ''}")
        args = ctx.run_args(topic, data_dir, fetch, until_caught_up=not continuous)
        _interrupt(ctx, trial, args, sig, delay, f"restart {step} ({steps[-1]})")
        ctx.check_readers(trial, data_dir, topic, ledger, f"export after restart {step}")
    if txn.open:
        txn.end(ledger, commit=ctx.rng.random() < 0.5)
    first = ctx.rng.choice(_FETCH_PATHS)
    for fetch in (first, "consumer" if first == "replica" else "replica"):
        args = ctx.run_args(topic, data_dir, fetch)
        ctx.judge_finished(trial, ctx.cli(args, _RUN_TIMEOUT_S), data_dir, topic, ledger,
                           f"final run --fetch {fetch}", followups=[args])
    shutil.rmtree(data_dir / "state" / topic, ignore_errors=True)
    args = ctx.run_args(topic, data_dir, ctx.rng.choice(_FETCH_PATHS))
    ctx.judge_finished(trial, ctx.cli(args, _RUN_TIMEOUT_S), data_dir, topic, ledger,
                       "rebuild of the store from the local log", followups=[args])
    trial.variant += ": " + ", ".join(steps)


def scenario_two_writers(ctx: Context) -> None:
    """A second writer on the data dir of a continuous run is refused at once and writes nothing;
    the run ends exact."""
    second = ctx.variant(["run", "restore --overwrite", "compact"])
    fetch = ctx.rng.choice(_FETCH_PATHS)
    trial = ctx.trial(f"run + {second}/{fetch}")
    ledger = Ledger()
    topic = ctx.topic()
    partitions = 2
    create_topic(ctx.admin, topic, partitions, {"cleanup.policy": "compact"})
    produce(ctx.bootstrap, topic, ledger, count=1500, keys=300, tag="a", rng=ctx.rng)
    data_dir = ctx.dir / "data"
    first = ctx.start(ctx.run_args(topic, data_dir, fetch, until_caught_up=False))
    if not ctx.await_exact(trial, first, data_dir, topic, ledger, "first writer's catch-up"):
        ctx.stop_continuous(trial, first, "first writer")
        return
    config_path = data_dir / "topic-configs" / f"{topic}.json"
    config_before = config_path.read_bytes() if config_path.exists() else None
    if second == "run":
        args = ctx.run_args(topic, data_dir, ctx.rng.choice(_FETCH_PATHS), extra=["--config", "segment.bytes=65536"])
    elif second == "restore --overwrite":
        source = copy_log_dir(ctx.broker, topic, partitions, ctx.dir / "broker-copy")
        args = ["restore", "--from-log-dir", str(source), "--topic", topic, "--data-dir", str(data_dir),
                "--overwrite", "--no-progress", "--config", "segment.bytes=65536"]
    else:
        args = ["compact", "--data-dir", str(data_dir), "--topic", topic, "--quiet", "--no-progress"]
    done = ctx.cli(args, _RUN_TIMEOUT_S)
    config_after = config_path.read_bytes() if config_path.exists() else None
    if done.timed_out:
        trial.mark("hang", f"second writer: {done.brief()}")
    elif done.rc == 0:
        trial.mark("silently-wrong", f"second writer accepted (exit 0) while `run` writes the data dir: "
                                     f"{done.stdout.strip()[-200:]}")
    elif not done.clear_refusal:
        trial.mark("crash", f"second writer: {done.brief()}")
    else:
        trial.note(f"second writer refused in {done.seconds:.1f} s: {done.error_lines[0][:200]}")
        if config_after != config_before:
            trial.mark("silently-wrong", f"the refused second writer rewrote {config_path.name} before it was refused")
    produce(ctx.bootstrap, topic, ledger, count=1000, keys=300, tag="b", rng=ctx.rng)
    if ctx.await_exact(trial, first, data_dir, topic, ledger, "first writer after the second"):
        ctx.stop_continuous(trial, first, "first writer")
        ctx.expect_exact(trial, data_dir, topic, "after the first writer's SIGTERM")
    else:
        ctx.stop_continuous(trial, first, "first writer")
    run_until = ctx.run_args(topic, data_dir, fetch)
    followup = ctx.cli(run_until, _RUN_TIMEOUT_S)
    if "rebuilt" in followup.stdout:
        trial.note(f"the next run rebuilt the store: {followup.stdout.strip()[-200:]}")
    ctx.judge_finished(trial, followup, data_dir, topic, ledger, "run --until-caught-up afterwards",
                       followups=[run_until])


def scenario_read_only_readers(ctx: Context) -> None:
    """``get`` and ``export`` on a read-only bind mount of a data dir and on the data dir itself:
    exact or a clear refusal, and nothing written."""
    fetch = ctx.rng.choice(_FETCH_PATHS)
    trial = ctx.trial(f"read-only mount/{fetch}")
    if os.geteuid() != 0:
        raise AssertionError("the read-only mount needs root (mount --bind)")
    ledger = Ledger()
    topic = ctx.topic()
    create_topic(ctx.admin, topic, 2, {"cleanup.policy": "compact"})
    produce(ctx.bootstrap, topic, ledger, count=1500, keys=300, tag="a", rng=ctx.rng)
    data_dir = ctx.dir / "data"
    ctx.judge_finished(trial, ctx.cli(ctx.run_args(topic, data_dir, fetch), _RUN_TIMEOUT_S), data_dir, topic,
                       ledger, "run")
    truth = ctx.truth(topic)
    mount = ctx.dir / "read-only"
    mount.mkdir()
    subprocess.run(["mount", "--bind", str(data_dir), str(mount)], check=True, capture_output=True)
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(mount)], check=True, capture_output=True)
        before = _tree(data_dir)
        for where, folder in (("read-only mount", mount), ("data dir", data_dir)):
            _judge_readers(ctx, trial, folder, topic, truth, where)
        changes = _tree_changes(before, _tree(data_dir))
        if changes:
            trial.mark("silently-wrong", f"readers wrote into the data dir: {changes[:6]}")
    finally:
        subprocess.run(["umount", str(mount)], capture_output=True)
        if os.path.ismount(mount):
            subprocess.run(["umount", "-l", str(mount)], capture_output=True)


def _judge_readers(ctx: Context, trial: Trial, folder: Path, topic: str, truth: BrokerTruth, where: str) -> None:
    ctx.expect_exact(trial, folder, topic, f"export on the {where}", truth=truth)
    live = sorted(truth.latest.items())
    picks = ctx.rng.sample(live, min(3, len(live)))
    for (partition, key), value in picks:
        done = ctx.cli(["get", "--data-dir", str(folder), "--topic", topic, key, "--partition", str(partition)])
        if done.rc == 0 and done.stdout.rstrip("\n") == value:
            continue
        if done.clear_refusal:
            trial.mark("refused", f"get on the {where}: {done.error_lines[0][:200]}")
        elif done.rc == 0:
            trial.mark("silently-wrong", f"get {key!r} on the {where} printed {done.stdout.strip()!r}, broker {value!r}")
        else:
            trial.mark("crash", f"get on the {where}: {done.brief()}")
    absent = ctx.cli(["get", "--data-dir", str(folder), "--topic", topic, "no-such-key"])
    if absent.rc != 1 and not absent.clear_refusal:
        trial.mark("silently-wrong" if absent.rc == 0 else "crash", f"get of an absent key on the {where}: "
                                                                     f"{absent.brief()}")


def scenario_broker_paused(ctx: Context) -> None:
    """A dedicated broker's JVM stopped (SIGSTOP) for a minute, continued, then restarted, while a
    continuous ``run`` with ``--metrics-port`` runs: it keeps going, reports
    ``materializer_caught_up 0`` while the broker is away and ends exact."""
    fetch = ctx.variant(_FETCH_PATHS)
    trial = ctx.trial(f"SIGSTOP {_PAUSE_S:.0f} s, restart/{fetch}")
    with dedicated_broker(ctx.dir / "broker") as broker, ctx.on_broker(broker):
        bootstrap = broker.bootstrap_servers
        topic = ctx.topic()
        create_topic(ctx.admin, topic, 2, {"cleanup.policy": "compact"})
        ledger = Ledger()
        produce(bootstrap, topic, ledger, count=1500, keys=300, tag="a", rng=ctx.rng)
        data_dir = ctx.dir / "data"
        port = _free_port()
        running = ctx.start(ctx.run_args(topic, data_dir, fetch, until_caught_up=False,
                                         extra=["--timeout", "5", "--metrics-port", str(port)]))
        if not ctx.await_exact(trial, running, data_dir, topic, ledger, "first catch-up", deadline_s=30):
            ctx.stop_continuous(trial, running, "continuous run")
            return
        assert broker.pid is not None
        os.kill(broker.pid, signal.SIGSTOP)
        paused = time.monotonic()
        samples: list[tuple[float, dict[str, float] | None]] = []
        try:
            while time.monotonic() - paused < _PAUSE_S and running.alive():
                samples.append((time.monotonic() - paused, _metrics(port)))
                time.sleep(2)
        finally:
            os.kill(broker.pid, signal.SIGCONT)
        if not running.alive():
            trial.mark("crash", f"the continuous run ended while the broker was paused: {running.wait(0).brief()}")
            return
        answered = [(t, s) for t, s in samples if s is not None]
        away = [t for t, s in answered if s.get("materializer_caught_up") == 0.0]
        trial.note(f"metrics while paused: {len(answered)} of {len(samples)} scrapes answered, caught_up 0 in "
                   f"{len(away)}" + (f" (first {away[0]:.0f} s after SIGSTOP)" if away else ""))
        if not answered:
            trial.mark("crash", "the metrics endpoint did not answer while the broker was paused")
        elif not away:
            trial.mark("silently-wrong", f"materializer_caught_up stayed 1 for the {_PAUSE_S:.0f} s the broker was "
                                         f"paused")
        produce(bootstrap, topic, ledger, count=800, keys=300, tag="b", rng=ctx.rng)
        if not ctx.await_exact(trial, running, data_dir, topic, ledger, "after SIGCONT", deadline_s=60):
            ctx.stop_continuous(trial, running, "continuous run")
            return
        broker.stop()
        time.sleep(3)
        broker.start()
        assert broker.bootstrap_servers == bootstrap, "the broker came back on other ports"
        wait_for_leaders(ctx.admin, topic, 2)
        produce(bootstrap, topic, ledger, count=800, keys=300, tag="c", rng=ctx.rng)
        if ctx.await_exact(trial, running, data_dir, topic, ledger, "after the broker restart", deadline_s=60):
            ctx.stop_continuous(trial, running, "continuous run")
            ctx.expect_exact(trial, data_dir, topic, "after SIGTERM")
        else:
            ctx.stop_continuous(trial, running, "continuous run")


def scenario_broker_restarts(ctx: Context) -> None:
    """A dedicated broker stopped for about 4 s and started again, three times, while a continuous
    ``run`` with ``--metrics-port`` runs and records are produced between restarts. Variants: with
    ``--group-id`` (a second member joins right before the second restart and is stopped right
    before the third, so the first member's rebalances meet the outage), and without a group. The
    first run must survive every restart (a member died with "a fetch is already in flight" in 6 of
    6), report ``materializer_caught_up 0`` while the broker is away (not after ``--timeout``: every
    connection is refused), and serve the topic exactly after each restart it holds it all."""
    group = ctx.variant((True, False))
    trial = ctx.trial("3 restarts, " + ("group, a member joining and leaving" if group else "no group"))
    with dedicated_broker(ctx.dir / "broker") as broker, ctx.on_broker(broker):
        bootstrap = broker.bootstrap_servers
        topic = ctx.topic()
        create_topic(ctx.admin, topic, 4, {"cleanup.policy": "compact"})
        ledger = Ledger()
        produce(bootstrap, topic, ledger, count=1200, keys=300, tag="a", rng=ctx.rng)
        member = ["--group-id", f"{topic}-group"] if group else []
        port = _free_port()
        first_dir = ctx.dir / "first"
        first = ctx.start(ctx.run_args(topic, first_dir, "replica", until_caught_up=False,
                                       extra=[*member, "--metrics-port", str(port)]))
        if not ctx.await_exact(trial, first, first_dir, topic, ledger, "first catch-up", deadline_s=60):
            ctx.stop_continuous(trial, first, "first run")
            return
        second: Running | None = None
        for restart in range(1, 4):
            if group and restart == 2:
                second = ctx.start(ctx.run_args(topic, ctx.dir / "second", "replica", until_caught_up=False,
                                                extra=member))
            if second is not None and restart == 3:
                ctx.stop_continuous(trial, second, "second member")
                second = None
            broker.stop()
            stopped, away_seen = time.monotonic(), False
            while time.monotonic() - stopped < _RESTART_DOWN_S:  # the outage's length, sampled meanwhile
                samples = _metrics(port)
                away_seen = away_seen or (samples is not None and samples.get("materializer_caught_up") == 0.0)
                time.sleep(0.5)
            broker.start()
            assert broker.bootstrap_servers == bootstrap, "the broker came back on other ports"
            if not first.alive():
                trial.mark("crash", f"restart {restart}: the continuous run ended: {first.wait(0).brief()}")
                first.reported = True
                return
            if not away_seen:
                trial.mark("silently-wrong", f"restart {restart}: materializer_caught_up stayed 1 for the "
                                             f"{_RESTART_DOWN_S:.0f} s every connection was refused")
            wait_for_leaders(ctx.admin, topic, 4)
            produce(bootstrap, topic, ledger, count=400, keys=300, tag=f"r{restart}", rng=ctx.rng)
            if second is not None:  # the two members split the topic: the first serves no dead value
                if not second.alive():
                    trial.mark("crash", f"restart {restart}: the second member ended: {second.wait(0).brief()}")
                    second.reported = True
                    second = None
                ctx.check_readers(trial, first_dir, topic, ledger, f"the first member's export after restart {restart}")
            elif not ctx.await_exact(trial, first, first_dir, topic, ledger, f"after restart {restart}", deadline_s=60):
                ctx.stop_continuous(trial, first, "first run")
                return
        ctx.stop_continuous(trial, first, "first run")
        if not group:  # a member that stops withdraws its partitions: its export is no longer the topic
            ctx.expect_exact(trial, first_dir, topic, "after SIGTERM")


# -- issue 37: the log start offset moved under a running member; a long-lived view across restarts

def _broker_log_starts(bootstrap: str, topic: str, partitions: int) -> dict[int, int]:
    """Partition -> the broker's log start offset now (ListOffsets EARLIEST)."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"ops-log-start-{time.time_ns()}"})
    try:
        return {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[0] for p in range(partitions)}
    finally:
        consumer.close()


def _set_topic_configs(admin: Any, topic: str, configs: Mapping[str, str]) -> None:
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource

    resource = ConfigResource("topic", topic, incremental_configs=[
        ConfigEntry(name, value, incremental_operation=AlterConfigOpType.SET) for name, value in configs.items()])
    for future in admin.incremental_alter_configs([resource]).values():
        future.result(30)


def scenario_log_start_moved_while_running(ctx: Context) -> None:
    """The broker's log start offset moves under a continuous ``run`` (``--metrics-port``, with or
    without ``--group-id``) while nothing new is produced: retention (the compacted topic switched to
    ``compact,delete`` with ``retention.ms=1000``: the broker deletes every segment) or
    ``delete_records`` (inside the records of each partition, after some keys were written again).
    Within the deadline the running member's export equals a read_committed consumer's (the keys
    whose latest record fell below the log start offset gone, the others kept), and
    ``materializer_store_entries_expired_total`` counts exactly the entries that went; it then
    follows new records, and SIGTERM leaves it exact (a group member's export after its stop serves
    nothing, so only while it runs)."""
    move, fetch, group = ctx.variant([("retention", "replica", False), ("delete-records", "consumer", True),
                                      ("delete-records", "replica", False), ("retention", "consumer", True),
                                      ("retention", "replica", True), ("delete-records", "consumer", False),
                                      ("delete-records", "replica", True), ("retention", "consumer", False)])
    trial = ctx.trial(f"{move}/{fetch}" + ("/group" if group else ""))
    topic = ctx.topic()
    partitions = 2
    create_topic(ctx.admin, topic, partitions, {"cleanup.policy": "compact"} if move == "retention"
                 else {"cleanup.policy": "compact,delete", "retention.ms": "-1"})
    ledger = Ledger()
    produce(ctx.bootstrap, topic, ledger, count=900, keys=300, tag="a", rng=ctx.rng)
    data_dir = ctx.dir / "data"
    port = _free_port()
    extra = ["--metrics-port", str(port)] + (["--group-id", f"{topic}-members"] if group else [])
    running = ctx.start(ctx.run_args(topic, data_dir, fetch, until_caught_up=False, extra=extra))
    if not ctx.await_exact(trial, running, data_dir, topic, ledger, "first catch-up", deadline_s=30):
        ctx.stop_continuous(trial, running, "continuous run")
        return
    if move == "delete-records":
        from confluent_kafka import TopicPartition

        produce(ctx.bootstrap, topic, ledger, count=300, keys=100, tag="b", rng=ctx.rng)
        if not ctx.await_exact(trial, running, data_dir, topic, ledger, "second catch-up", deadline_s=30):
            ctx.stop_continuous(trial, running, "continuous run")
            return
        before = ctx.truth(topic)
        cuts = {p: max(0, end - 150) for p, end in high_watermarks(ctx.bootstrap, topic, partitions).items()}
        for future in ctx.admin.delete_records([TopicPartition(topic, p, cut) for p, cut in cuts.items()]).values():
            future.result(30)
    else:
        before = ctx.truth(topic)
        cuts = dict(before.end_offsets)
        _set_topic_configs(ctx.admin, topic, {"cleanup.policy": "compact,delete", "retention.ms": "1000"})
    deadline = time.monotonic() + 60
    while _broker_log_starts(ctx.bootstrap, topic, partitions) != cuts:
        if time.monotonic() > deadline:
            raise AssertionError(f"the broker's log start offsets of {topic} did not reach {cuts} in 60 s")
        time.sleep(0.5)
    after = ctx.truth(topic)
    ledger.reset_from(after)  # values below the log start offset are dead now
    trial.note(f"log start offsets {cuts}: {len(before.latest)} entries before, {len(after.latest)} after")
    if not ctx.await_exact(trial, running, data_dir, topic, ledger, f"after the {move}", deadline_s=20):
        ctx.stop_continuous(trial, running, "continuous run")
        return
    samples = _metrics(port) or {}
    expired = samples.get("materializer_store_entries_expired_total")
    dropped = len(before.latest) - len(after.latest)  # nothing was produced in between
    if expired != dropped:
        trial.mark("silently-wrong", f"materializer_store_entries_expired_total is {expired}, {dropped} entries went")
    if move == "retention":
        _set_topic_configs(ctx.admin, topic, {"retention.ms": "-1"})  # what comes now stays
    produce(ctx.bootstrap, topic, ledger, count=200, keys=300, tag="c", rng=ctx.rng)
    if ctx.await_exact(trial, running, data_dir, topic, ledger, "records after the move", deadline_s=30):
        done = ctx.stop_continuous(trial, running, "continuous run")
        if done.rc == 0 and not group:
            ctx.expect_exact(trial, data_dir, topic, "after SIGTERM")
    else:
        ctx.stop_continuous(trial, running, "continuous run")



def scenario_partitions_added_while_running(ctx: Context) -> None:
    """Partitions added (CreatePartitions, 2 to 4) while a continuous ``run`` (``--metrics-port``,
    with or without ``--group-id``, both fetch paths) serves the topic, then records produced to
    all four: within the deadline its export equals a read_committed consumer's, new partitions
    included, and it reports itself caught up again (a run without a group used to notice them
    only at its next metadata refresh, 5 minutes later by default, while ready)."""
    from confluent_kafka.admin import NewPartitions

    fetch, group = ctx.variant([("replica", False), ("consumer", True), ("consumer", False), ("replica", True)])
    trial = ctx.trial(f"2 -> 4 partitions/{fetch}" + ("/group" if group else ""))
    topic = ctx.topic()
    create_topic(ctx.admin, topic, 2, {"cleanup.policy": "compact"})
    ledger = Ledger()
    produce(ctx.bootstrap, topic, ledger, count=600, keys=200, tag="a", rng=ctx.rng)
    data_dir = ctx.dir / "data"
    port = _free_port()
    extra = ["--metrics-port", str(port)] + (["--group-id", f"{topic}-members"] if group else [])
    running = ctx.start(ctx.run_args(topic, data_dir, fetch, until_caught_up=False, extra=extra))
    if not ctx.await_exact(trial, running, data_dir, topic, ledger, "first catch-up", deadline_s=30):
        ctx.stop_continuous(trial, running, "continuous run")
        return
    ctx.admin.create_partitions([NewPartitions(topic, 4)])[topic].result(30)
    wait_for_leaders(ctx.admin, topic, 4)
    produce(ctx.bootstrap, topic, ledger, count=600, keys=400, tag="b", rng=ctx.rng)
    truth = ctx.truth(topic)
    new_keys = {key for (partition, key) in truth.latest if partition >= 2}
    trial.note(f"{len(new_keys)} keys in the added partitions")
    if not new_keys:
        raise AssertionError(f"nothing was produced to the added partitions of {topic}")
    if ctx.await_exact(trial, running, data_dir, topic, ledger, "after partitions were added", deadline_s=30):
        deadline = time.monotonic() + 10
        while (_metrics(port) or {}).get("materializer_caught_up") != 1.0:
            if time.monotonic() > deadline:
                trial.mark("hang", "exact, but materializer_caught_up stayed 0 for 10 s")
                break
            time.sleep(0.5)
    ctx.stop_continuous(trial, running, "continuous run")


class _KeyWriter:
    """A producer thread for :func:`scenario_long_lived_view`: keys ``k00000``.. to their murmur2
    partition, unique values ``<seq>`` and a tombstone in seven, until stopped."""

    def __init__(self, bootstrap: str, topic: str, keys: Sequence[bytes], partitions: int, seed: str) -> None:
        import threading

        from confluent_kafka import Producer

        from materializer.group.routing import partition_for_key

        self._producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "acks": "all",
                                   "enable.idempotence": True, "log_level": 3})
        self._partition_of = {key: partition_for_key(key, partitions) for key in keys}
        self._topic, self._keys, self._rng = topic, list(keys), random.Random(seed)
        self._stop = threading.Event()
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._write, daemon=True)
        self._thread.start()

    def _write(self) -> None:
        try:
            seq = 0
            while not self._stop.is_set():
                key = self._rng.choice(self._keys)
                value = None if self._rng.random() < 1 / 7 else b"%d" % seq
                self._producer.produce(self._topic, key=key, value=value, partition=self._partition_of[key])
                seq += 1
                if seq % 40 == 0:
                    self._producer.flush(30)
                    self._stop.wait(0.02)
            self._producer.flush(30)
        except BaseException as exc:  # noqa: BLE001 - reported by stop()
            self.error = exc

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(60)


def scenario_long_lived_view(ctx: Context) -> None:
    """A :class:`~materializer.view.MaterializedView` held open in this process (read-only, caught up
    every 0.3 s) while a producer writes and a continuous ``run`` is stopped with SIGTERM, started
    again, killed with SIGKILL and started again (or the kill first). After every catch-up, every key
    the view answers (``get`` and ``items``) must be the latest record below the offsets it reports,
    as a read_committed consumer reads them afterwards (the broker compacts nothing meanwhile);
    otherwise the trial is silently wrong. A catch-up that refuses (the topic being rebuilt) is
    ``refused``; any other exception a crash."""
    from materializer.datadir.markers import topic_status
    from materializer.storage.errors import IncompleteDataDirError
    from materializer.testing.compaction_oracle import read_topic_records
    from materializer.view import MaterializedView

    fetch, order = ctx.variant([("replica", (signal.SIGTERM, signal.SIGKILL)),
                                ("consumer", (signal.SIGKILL, signal.SIGTERM)),
                                ("consumer", (signal.SIGTERM, signal.SIGKILL)),
                                ("replica", (signal.SIGKILL, signal.SIGTERM))])
    trial = ctx.trial(f"{fetch}/" + ",".join(signal.Signals(sig).name for sig in order))
    topic = ctx.topic()
    partitions = 2
    keys = [f"k{i:05d}".encode() for i in range(80)]
    create_topic(ctx.admin, topic, partitions, {"cleanup.policy": "compact", "min.compaction.lag.ms": "86400000"})
    data_dir = ctx.dir / "data"
    writer = _KeyWriter(ctx.bootstrap, topic, keys, partitions, f"{ctx.seed}-{ctx.index}")
    snapshots: list[tuple[str, dict[int, int], dict[bytes, bytes], dict[bytes, bytes]]] = []
    view = None
    try:
        running = ctx.start(ctx.run_args(topic, data_dir, fetch, until_caught_up=False))
        deadline = time.monotonic() + 60
        while not topic_status(data_dir, topic).complete:
            if time.monotonic() > deadline or not running.alive():
                trial.mark("hang" if running.alive() else "crash",
                           f"the first run did not complete the topic: {running.wait(0).brief()}")
                return
            time.sleep(0.2)
        view = MaterializedView.open(data_dir, topic)

        def follow(phase: str, seconds: float) -> None:
            until = time.monotonic() + seconds
            while time.monotonic() < until:
                try:
                    offsets = view.catch_up()
                    got = {key: value for key in keys if (value := view.get(key)) is not None}
                    scanned = {entry.key: entry.value for entry in view.items()}
                except IncompleteDataDirError as exc:
                    trial.mark("refused", f"{phase}: the view refused: {exc}")
                else:
                    snapshots.append((phase, offsets, got, scanned))
                time.sleep(0.3)

        follow("running", 3)
        for n, sig in enumerate(order):
            name = signal.Signals(sig).name
            if sig == signal.SIGTERM:
                done = ctx.stop_continuous(trial, running, f"run #{n + 1}")
            else:
                running.send(signal.SIGKILL)
                done = running.wait(_STOP_TIMEOUT_S)
            trial.note(f"run #{n + 1} stopped by {name}: rc={done.rc}")
            follow(f"stopped by {name}", 2)
            running = ctx.start(ctx.run_args(topic, data_dir, fetch, until_caught_up=False))
            follow(f"restarted after {name}", 4)
        ctx.stop_continuous(trial, running, "last run")
        follow("stopped at the end", 1.5)
    except Exception as exc:  # noqa: BLE001 - a reader's failure is the trial's outcome
        trial.mark("crash", f"the view failed: {type(exc).__name__}: {exc}")
    finally:
        writer.stop()
        if view is not None:
            view.close()
    if writer.error is not None:
        raise writer.error
    records = read_topic_records(ctx.bootstrap, topic, partitions)
    wrong = []
    for phase, offsets, got, scanned in snapshots:
        truth: dict[bytes, bytes] = {}
        for partition, rows in records.items():
            for record, _ in rows:
                if record.offset >= offsets.get(partition, 0):
                    break
                if record.value is None:
                    truth.pop(record.key, None)
                else:
                    truth[record.key] = record.value
        wrong += [(phase, key, got.get(key), scanned.get(key), truth.get(key)) for key in keys
                  if got.get(key) != truth.get(key) or scanned.get(key) != truth.get(key)]
    trial.note(f"{len(snapshots)} catch-ups checked, {len(keys)} keys each")
    if wrong:
        trial.mark("silently-wrong", f"{len(wrong)} answers differ from the records below the view's offsets, "
                                     f"e.g. (phase, key, get, items, truth) {wrong[:3]}")
    elif not snapshots:
        trial.mark("crash", "no catch-up of the view succeeded")


#: name -> scenario round (one or more trials).
SCENARIOS: dict[str, Callable[[Context], None]] = {
    "topic-recreated": scenario_topic_recreated,
    "leader-divergence": scenario_leader_divergence,
    "log-start-past-local-end": scenario_log_start_past_local_end,
    "interrupted-writers": scenario_interrupted_writers,
    "two-writers": scenario_two_writers,
    "read-only-readers": scenario_read_only_readers,
    "broker-paused": scenario_broker_paused,
    "broker-restarts": scenario_broker_restarts,
    "log-start-while-running": scenario_log_start_moved_while_running,
    "long-lived-view": scenario_long_lived_view,
    "partitions-added": scenario_partitions_added_while_running,
}


# ---------------------------------------------------------------------------------------------- running

def run_scenario(name: str, broker: SharedBroker, *, seed: int, rounds: int, workdir: Path | None = None,
                 raise_errors: bool = True, on_trial: Callable[[Trial], None] | None = None) -> list[Trial]:
    """Run ``rounds`` rounds of scenario ``name`` (a round is one trial, or one per fetch path for
    ``leader-divergence``) against ``broker``; returns the trials.

    A failure of the harness itself (the broker refusing a topic, a precondition such as the leader
    epoch going up) raises with ``raise_errors``, else it is printed and the round skipped.
    """
    scenario = SCENARIOS[name]
    trials: list[Trial] = []
    root = Path(tempfile.mkdtemp(prefix=f"ops-{name}-", dir=workdir))
    try:
        for index in range(rounds):
            ctx = Context(name, broker, root / f"round-{index}", seed, index)
            started = time.monotonic()
            try:
                scenario(ctx)
            except Exception as exc:
                if raise_errors:
                    raise
                print(f"  harness error in {name} round {index}: {type(exc).__name__}: {exc}", flush=True)
            finally:
                ctx.cleanup()
            elapsed = time.monotonic() - started
            for trial in ctx.trials:
                trial.seconds = elapsed / max(1, len(ctx.trials))
                trials.append(trial)
                if on_trial is not None:
                    on_trial(trial)
            shutil.rmtree(ctx.dir, ignore_errors=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return trials


def summary_table(trials: Sequence[Trial]) -> str:
    """One row per scenario: trials per outcome, mean and max seconds per trial."""
    header = f"{'scenario':<26}{'trials':>7}" + "".join(f"{o:>16}" for o in OUTCOMES) + f"{'s/trial':>9}{'max s':>8}"
    rows = [header, "-" * len(header)]
    for name in SCENARIOS:
        mine = [t for t in trials if t.scenario == name]
        if not mine:
            continue
        counts = [sum(t.outcome == o for t in mine) for o in OUTCOMES]
        seconds = [t.seconds for t in mine]
        rows.append(f"{name:<26}{len(mine):>7}" + "".join(f"{c:>16}" for c in counts)
                    + f"{sum(seconds) / len(seconds):>9.1f}{max(seconds):>8.1f}")
    return "\n".join(rows)


def failures(trials: Sequence[Trial]) -> str:
    """The trials outside their scenario's :func:`expected_outcomes`, each with its notes."""
    return "\n".join(f"{t.line()}\n    " + "\n    ".join(t.notes) for t in trials
                     if t.outcome not in expected_outcomes(t.scenario))


def main(argv: list[str] | None = None) -> int:
    """Command line: start a local broker, run the campaign, print the table and the wall time."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=4, help="rounds per scenario (one trial per round, two for "
                                                              "leader-divergence)")
    parser.add_argument("--seed", type=int, default=int(time.time()))
    parser.add_argument("--scenario", action="append", choices=sorted(SCENARIOS),
                        help="run only this scenario (repeatable) [default: all]")
    parser.add_argument("--workdir", type=Path, default=None, help="scratch folder [default: the system's temp]")
    parser.add_argument("-v", "--verbose", action="store_true", help="print every trial's notes")
    args = parser.parse_args(argv)
    from materializer.local.kafka_broker import TEST_BROKER_CONFIG, LocalKafkaBroker

    started = time.monotonic()
    root = Path(tempfile.mkdtemp(prefix="ops-campaign-", dir=args.workdir))
    trials: list[Trial] = []

    def on_trial(trial: Trial) -> None:
        print(trial.line(), flush=True)
        if args.verbose or trial.outcome not in expected_outcomes(trial.scenario):
            for note in trial.notes:
                print(f"    {note}", flush=True)

    try:
        with LocalKafkaBroker(root / "broker", extra_config=TEST_BROKER_CONFIG, fast_start=True) as broker:
            for name in args.scenario or list(SCENARIOS):
                trials += run_scenario(name, broker, seed=args.seed, rounds=args.trials, workdir=root,
                                       raise_errors=False, on_trial=on_trial)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print()
    print(summary_table(trials))
    print(f"seed {args.seed}, {len(trials)} trials, wall time {time.monotonic() - started:.0f} s")
    return 0 if all(t.outcome in expected_outcomes(t.scenario) for t in trials) else 1


if __name__ == "__main__":
    sys.exit(main())
