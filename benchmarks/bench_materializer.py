"""Materializer throughput on a real local broker: ingest, restore from the local log, resume.

A script, not a test. On a LocalKafkaBroker (Kafka jars, temp dir) it creates a compacted topic
(``--partitions`` partitions, ``compression.type = --compression``, the broker's own cleaner held
back by ``min.compaction.lag.ms`` so every phase reads the same uncompacted topic), produces
``--records`` records over ``--keys`` keys (``--value-bytes`` values, ``--tombstone-ratio``
tombstones) with confluent-kafka, then measures, each case ``--repeat`` times (best kept; the
machine may be busy, so compare ratios within one run), after one uncounted warm-up read:

1. **broker -> nothing**: a bare confluent-kafka consumer reading the whole topic (the ceiling
   of any ingest written in Python over this client);
2. **broker -> RocksDB**: the same consumer writing each record into a rocksdict ``Rdict``
   (put, or delete for a tombstone), one call per record ("naive restore from the broker", what
   a service does today) and one ``WriteBatch`` per fetch;
3. **ingest**: ``Materializer.run(until_caught_up=True)`` into an empty data directory; the run
   is split into fetch (``KafkaSource.fetch``: ``consume`` + record objects), batch build +
   append (``materializer.ingest``), fsync (``Log.flush``), store apply (``StateStore.apply``)
   and the rest, by timing those calls (a handful per 10,000 records, no profiler overhead);
   the Materializer's background cleaner is off in every run (``--background-cleaner``: on);
4. **rebuild, full log**: delete the state store and start a Materializer on the data
   directory: the session's start rebuilds the store with ``rebuild_store_from_logs`` (no
   broker fetch; the broker is asked only for metadata);
5. **compact**: ``compact_topic`` of every partition up to its log end offset (the whole log,
   one forced round; ``--compact-bound kafka`` stops at Kafka's own bound, the active segment);
6. **rebuild, compacted log**: as 4 on the compacted log; the speed-up is its time against
   the naive restore of case 2 (the whole topic re-consumed into RocksDB);
7. **resume**: produce ``--resume-percent`` % more records, rerun the Materializer on a copy of
   the data directory (store kept): catch-up time and records fetched (must be only the new
   ones); **cold restore**: the same with the state store deleted, so the store is rebuilt from
   the compacted local log and only the missing tail is fetched -- the project's headline;
   then ``--small-tail`` more records (fewer than one fetch batch) and a resume again;
8. unless ``--skip-broker-compaction``: release the broker's cleaner, wait for it to reach the
   active segments, and re-measure case 2 on the broker-compacted topic (what a service would
   read from a compacted production topic).

    /tmp/venv/bin/python benchmarks/bench_materializer.py                       # 1M records, 100k keys
    /tmp/venv/bin/python benchmarks/bench_materializer.py --records 200000 --keys 20000 --repeat 1 --profile

``--profile`` adds one cProfile'd ingest and one cProfile'd rebuild (extra runs, not in the table).

**Cold start** (its own table, after case 3; ``--cold-start-only`` produces the topic and runs
only this): from an empty data / state directory to ready (every partition at the high watermark
seen at start, every record in RocksDB), each case ``--repeat`` times:

a. ``Materializer.run(until_caught_up=True)`` with the consumer fetch path (close excluded;
   ``MaterializerOptions(fetch="consumer")`` when the option exists);
b. the same with ``MaterializerOptions(fetch="replica")`` (the Fetch-API path appending the
   broker's batches verbatim), when ``fetch`` is a field of MaterializerOptions, else "n/a";
   case 3 (the default path) is reused for a or b in a full run;
b0. b with the store apply switched off in this process (``store_apply_off``): the log side
   alone (fetch + append + fsync), timed end to end;
c. the bare consumer -> Rdict, put per record (case 2a);
d. Kafka Streams GlobalKTable restore, e. KTable restore (``topology.optimization=all``: the
   source topic is the changelog; the fresh application.id's group offsets are first set to the
   end offsets, because StoreChangelogReader restores a source-topic changelog only up to the
   committed offset), e2. the same KTable on a fresh group (nothing restored, every record
   processed): ``streams_restore/StreamsRestore.java`` in its own JVM, seconds from
   ``KafkaStreams.start()``, after one uncounted cold start of the same kind on a small topic in
   that JVM (class loading, RocksDB JNI, JIT), see ``kafka_streams_restore.py``;
f. ``shutil.copyfile`` + fsync of the topic's broker ``.log`` files: the ingest bytes/s of a and b
   (bytes appended to the local log / seconds to ready) and of b0 against this local copy (goal:
   within 2x);
k. Kafka's own follower: a second LocalKafkaBroker (node 2, joined to the benchmark broker's
   KRaft cluster once, Kafka's default ``replica.fetch.*`` settings, no replication quota) is
   given a replica of every partition (AlterPartitionReassignments to ``[1, 2]``), timed from the
   request until the follower's ``.log`` files of every partition hold as many bytes as the
   leader's (the bytes compared afterwards), then the replica is removed again (``[1]``) and the
   follower's copies deleted before the next round; after ``--follower-warmups`` (5) uncounted
   catch-ups (the follower JVM's JIT). Its MB/s, and
   b / k per round, are printed; see ``kafka_follower.py``.

The cases run round-robin (round 1: b, k, b0, a, c, d, e, e2, f; then round 2 ...), so a change
of the machine's load hits every case alike; the best round is kept and the range printed.
``--cases`` picks some (``--cases b,k`` for a 10M-record point without the slow Kafka Streams
cases).

Seconds, records/s, x faster than c and than d, and the live entries each case ends with (the
same in every case, or a MISMATCH line).
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import dataclasses
import importlib.metadata
import logging
import os
import platform
import pstats
import random
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.integration helpers

import confluent_kafka  # noqa: E402
import rocksdict  # noqa: E402
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition  # noqa: E402
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402

import materializer.session as session_module  # noqa: E402
from materializer.apply.applier import StoreApplier  # noqa: E402
from materializer.local.kafka_broker import KAFKA_VERSION, TEST_BROKER_CONFIG, LocalKafkaBroker  # noqa: E402
from materializer.offline.compact import compact_topic  # noqa: E402
from materializer.config import MaterializerOptions  # noqa: E402
from materializer.datadir.layout import partition_dir, state_dir  # noqa: E402
from materializer.materializer import Materializer  # noqa: E402
from materializer.stats import MaterializerStats  # noqa: E402
from materializer.storage.files import LOG_FILE_SUFFIX  # noqa: E402

MB = 1024.0 * 1024.0
TOPIC = "bench"
MATERIALIZER_PARTS = ("start", "fetch", "append", "flush", "apply", "other", "close")
#: The Kafka Streams cases' warm-up topic and its size (cold start table, d/e/e2).
WARMUP_TOPIC = "bench-streams-warmup"
WARMUP_RECORDS = 1000
FETCH_RECORDS = 10_000  # consume(num_messages=...) of every consumer, as MaterializerOptions.batch_size


# -- workload ----------------------------------------------------------------------------------

class Workload:
    """Deterministic update stream: key indices uniform over ``keys``, values cycled from a random
    pool, a ``tombstone_ratio`` of null values; record ``i`` goes to partition ``key index % partitions``.
    Records past ``records`` (the resume tail) continue the same stream."""

    def __init__(self, keys: int, value_bytes: int, partitions: int, tombstone_ratio: float, seed: int = 42) -> None:
        self.keys = keys
        self.partitions = partitions
        self.tombstone_ratio = tombstone_ratio
        self._rng = random.Random(seed)
        self.values = [self._rng.randbytes(value_bytes // 2 + 1).hex().encode()[:value_bytes]
                       for _ in range(4096)]

    def records(self, start: int, count: int):
        """``(partition, key, value | None)`` for records ``[start, start + count)`` of the stream."""
        rng = random.Random(f"{start}-{count}")
        for i in range(start, start + count):
            k = rng.randrange(self.keys)
            value = None if rng.random() < self.tombstone_ratio else self.values[i % len(self.values)]
            yield k % self.partitions, b"key-%09d" % k, value


def produce(bootstrap: str, workload: Workload, start: int, count: int, compression: str) -> float:
    """Produce records ``[start, start + count)``; returns seconds."""
    producer = Producer({"bootstrap.servers": bootstrap, "compression.type": compression, "linger.ms": 20,
                         "batch.num.messages": 10_000, "batch.size": 1024 * 1024,
                         "queue.buffering.max.messages": 1_000_000, "acks": "all"})
    errors: list[str] = []

    def on_delivery(err, _msg) -> None:
        if err is not None:
            errors.append(str(err))

    started = time.perf_counter()
    for n, (partition, key, value) in enumerate(workload.records(start, count)):
        while True:
            try:
                producer.produce(TOPIC, key=key, value=value, partition=partition, on_delivery=on_delivery)
                break
            except BufferError:
                producer.poll(0.05)
        if n % 10_000 == 0:
            producer.poll(0)
    if producer.flush(300):
        raise RuntimeError("producer could not deliver the workload within 300 s")
    if errors:
        raise RuntimeError(f"{len(errors)} deliveries failed, first: {errors[0]}")
    return time.perf_counter() - started


def watermarks(bootstrap: str, partitions: int) -> tuple[dict[int, int], dict[int, int]]:
    """``(low, high)`` watermarks by partition."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-hw"})
    try:
        marks = {p: consumer.get_watermark_offsets(TopicPartition(TOPIC, p), timeout=30, cached=False)
                 for p in range(partitions)}
    finally:
        consumer.close()
    return {p: m[0] for p, m in marks.items()}, {p: m[1] for p, m in marks.items()}


# -- measurements ------------------------------------------------------------------------------

@dataclass
class Run:
    """One measured case: wall seconds, records and key+value bytes handled, plus details."""

    seconds: float
    records: int
    bytes: int = 0
    parts: dict[str, float] = field(default_factory=dict)
    notes: dict[str, object] = field(default_factory=dict)

    @property
    def records_per_s(self) -> float:
        return self.records / self.seconds if self.seconds else float("inf")

    @property
    def mb_per_s(self) -> float:
        return self.bytes / MB / self.seconds if self.seconds else float("inf")


def best(runs: list[Run]) -> Run:
    return min(runs, key=lambda run: run.seconds)


def repeat(name: str, times: int, measure: Callable[[int], Run]) -> Run:
    runs = []
    for i in range(times):
        run = measure(i)
        runs.append(run)
        print(f"  {name} #{i + 1}: {run_text(run)}", flush=True)
    return best(runs)


def bare_consume(bootstrap: str, partitions: int, sink: str, store_path: Path | None = None) -> Run:
    """Read the whole topic with a plain consumer (same client settings as KafkaSource).

    sink: "none" (count only), "put" (Rdict put/delete per record) or "batch" (one WriteBatch per fetch).
    """
    low, hw = watermarks(bootstrap, partitions)
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-bare", "enable.auto.commit": False,
                         "enable.partition.eof": True, "isolation.level": "read_committed",
                         "auto.offset.reset": "earliest"})
    db = None
    if sink != "none":
        options = rocksdict.Options(raw_mode=True)
        options.create_if_missing(True)
        db = rocksdict.Rdict(str(store_path), options)
    records = size = 0
    try:
        started = time.perf_counter()
        # Explicit offsets, as KafkaSource.assign (OFFSET_BEGINNING would add a ListOffsets round trip).
        consumer.assign([TopicPartition(TOPIC, p, low[p]) for p in range(partitions)])
        first_record_s = None
        done = {p for p, h in hw.items() if h == 0}
        while len(done) < partitions:
            messages = consumer.consume(num_messages=FETCH_RECORDS, timeout=0.5)
            batch = rocksdict.WriteBatch(raw_mode=True) if sink == "batch" else None
            for message in messages:
                error = message.error()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        if message.offset() >= hw[message.partition()]:
                            done.add(message.partition())
                        continue
                    raise RuntimeError(f"consume: {error.str()}")
                key, value = message.key(), message.value()
                if first_record_s is None:
                    first_record_s = time.perf_counter() - started
                records += 1
                size += len(key) + (len(value) if value is not None else 0)
                if sink == "put":
                    if value is None:
                        db.delete(key)
                    else:
                        db.put(key, value)
                elif batch is not None:
                    if value is None:
                        batch.delete(key)
                    else:
                        batch.put(key, value)
            if batch is not None and len(batch):
                db.write(batch)
        if db is not None:
            db.flush()
        seconds = time.perf_counter() - started
        notes: dict[str, object] = {"first_record_s": first_record_s}
        if db is not None:
            notes["live_keys"] = sum(1 for _ in db.keys())
        return Run(seconds, records, size, notes=notes)
    finally:
        consumer.close()
        if db is not None:
            db.close()


class CallTimer:
    """Accumulated wall time of wrapped callables, by name."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)

    def wrap(self, name: str, fn: Callable) -> Callable:
        def timed(*args, **kwargs):
            started = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds[name] += time.perf_counter() - started
        return timed


@contextlib.contextmanager
def timed_rebuild(timer: CallTimer):
    """Time ``rebuild_store_from_logs`` as the session's start calls it (module attribute lookup)."""
    original = session_module.rebuild_store_from_logs
    session_module.rebuild_store_from_logs = timer.wrap("rebuild", original)  # type: ignore[assignment]
    try:
        yield
    finally:
        session_module.rebuild_store_from_logs = original  # type: ignore[assignment]


#: MaterializerOptions.cleaner_threads of every run: 0 = no background cleaner, so ingest and
#: rebuild are measured alone and compaction only by case 5 (--background-cleaner sets 1).
CLEANER_THREADS = [0]


@contextlib.contextmanager
def store_apply_off():
    """Switch the Materializer's store apply off (this process only): what remains of a replica
    cold start is its log side, fetch + append + fsync, timed end to end."""
    apply = StoreApplier._apply_stable
    StoreApplier._apply_stable = lambda self, bounds: None  # type: ignore[method-assign]
    try:
        yield
    finally:
        StoreApplier._apply_stable = apply  # type: ignore[method-assign]


def run_materializer(bootstrap: str, data_dir: Path, *, profile: cProfile.Profile | None = None,
                     fetch: str | None = None) -> Run:
    """``start`` + ``run(until_caught_up=True)`` + ``close``; parts (``MaterializerStats``): start (incl.
    any rebuild), fetch, append (consumer path: batch build too; Log.append_batch), flush (fsync), apply
    (the store writes), other, close.
    ``fetch`` sets ``MaterializerOptions.fetch`` (None: the option's default; needs the field)."""
    timer = CallTimer()
    # The broker's cleaner is held back by min.compaction.lag.ms; the local log must not inherit that.
    options = MaterializerOptions(progress=False, config_overrides={"min.compaction.lag.ms": "0"},
                                  cleaner_threads=CLEANER_THREADS[0], **({"fetch": fetch} if fetch else {}))
    with timed_rebuild(timer):
        started = time.perf_counter()
        m = Materializer(bootstrap, TOPIC, data_dir, options=options)
        try:
            if profile is not None:
                profile.enable()
            m.start()
            start_s = time.perf_counter() - started
            stats: MaterializerStats = m.run(until_caught_up=True)
            closing = time.perf_counter()
        finally:
            m.close()
            if profile is not None:
                profile.disable()
        close_s = time.perf_counter() - closing
        seconds = time.perf_counter() - started
    parts = {"start": start_s}
    # The Materializer's own split, kept by both fetch paths (on the replica path "fetch" is the wait
    # for a response whose request was sent before the previous one was appended).
    parts.update({"fetch": stats.fetch_s, "append": stats.append_s, "flush": stats.fsync_s, "apply": stats.apply_s})
    parts["other"] = max(0.0, stats.elapsed_s - sum(parts[n] for n in ("fetch", "append", "flush", "apply")))
    parts["close"] = close_s
    parts["rebuild"] = timer.seconds.get("rebuild", 0.0)
    notes = {"records_fetched": stats.records_fetched, "records_replayed": stats.records_replayed,
             "records_applied": stats.records_applied, "store_rebuilt": stats.store_rebuilt,
             "bytes_appended": stats.bytes_appended, "batches_appended": stats.batches_appended,
             "start_offsets": dict(stats.start_offsets), "high_watermarks": dict(stats.high_watermarks)}
    return Run(seconds, stats.records_fetched, stats.bytes_fetched, parts=parts, notes=notes)


def log_bytes(data_dir: Path, partitions: int) -> int:
    return sum(f.stat().st_size for p in range(partitions)
               for f in partition_dir(data_dir, TOPIC, p).glob(f"*{LOG_FILE_SUFFIX}"))


def rebuild(bootstrap: str, data_dir: Path, partitions: int, *, profile: cProfile.Profile | None = None) -> Run:
    """Delete the state store, then start a Materializer: it rebuilds the store from the local log."""
    shutil.rmtree(state_dir(data_dir, TOPIC))
    size = log_bytes(data_dir, partitions)
    run = run_materializer(bootstrap, data_dir, profile=profile)
    if run.notes["records_fetched"]:
        raise RuntimeError(f"rebuild fetched {run.notes['records_fetched']} records from the broker")
    if not run.notes["store_rebuilt"]:
        raise RuntimeError("the Materializer did not rebuild the deleted store")
    run = Run(run.parts["rebuild"], run.notes["records_replayed"], size,
              parts=run.parts, notes={**run.notes, "wall_s": run.seconds})
    return run


def store_key_count(data_dir: Path) -> int:
    from materializer.adapters.rocksdb_store import StateStore

    with StateStore(state_dir(data_dir, TOPIC)) as store:
        return store.count()


# -- cold start --------------------------------------------------------------------------------

def has_fetch_option() -> bool:
    """Whether this MaterializerOptions has the ``fetch`` field (``fetch="replica"``: the Fetch-API path)."""
    return "fetch" in {f.name for f in dataclasses.fields(MaterializerOptions)}


def ready_run(run: Run, data_dir: Path | None = None) -> Run:
    """A run_materializer Run cut at ready: ``run()`` returned (close excluded); records = fetched;
    bytes = bytes appended to the local log; notes["entries"] = live store entries if ``data_dir``."""
    notes = {**run.notes, "wall_s": run.seconds}
    if data_dir is not None:
        notes["entries"] = store_key_count(data_dir)
    return Run(run.seconds - run.parts["close"], run.notes["records_fetched"], run.notes["bytes_appended"],
               parts=run.parts, notes=notes)


def file_copy(broker: LocalKafkaBroker, partitions: int, dest: Path) -> Run:
    """Copy the topic's broker ``.log`` segment files to ``dest`` (``shutil.copyfile``, then one
    fsync per file): the local byte-rate ceiling of any ingest. notes: copy_s (without fsync)."""
    sources = [f for p in range(partitions) for f in sorted(broker.partition_dir(TOPIC, p).glob(f"*{LOG_FILE_SUFFIX}"))]
    dest.mkdir(parents=True)
    started = time.perf_counter()
    targets = []
    for n, source in enumerate(sources):
        target = dest / f"{n:04d}-{source.name}"
        shutil.copyfile(source, target)
        targets.append(target)
    copied = time.perf_counter()
    for target in targets:
        fd = os.open(target, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    seconds = time.perf_counter() - started
    size = sum(t.stat().st_size for t in targets)
    shutil.rmtree(dest)
    return Run(seconds, 0, size, notes={"copy_s": copied - started, "files": len(targets)})


#: The cold-start cases by ``--cases`` name -> key in measure_cold_start's dict, in the order each
#: round runs them (b and k side by side).
COLD_START_CASES = {"b": "b", "k": "k", "b0": "b0", "a": "a", "c": "c", "d": "d", "e": "e", "e2": "e_fresh",
                    "f": "f"}


def run_text(run: Run) -> str:
    """One measured run as the progress lines print it: seconds, records or MB, rate, split."""
    split = f" [{parts_text(run, MATERIALIZER_PARTS)}]" if run.parts else ""
    rate = (f"{run.records:,d} records, {run.records_per_s:,.0f} records/s" if run.records or not run.bytes
            else f"{run.bytes / MB:,.1f} MB, {run.mb_per_s:,.1f} MB/s")
    return f"{run.seconds:.2f} s, {rate}{split}"


def measure_cold_start(args, work: Path, bootstrap: str, broker: LocalKafkaBroker, r: dict) -> dict:
    """The cold-start table: empty data dir / state dir -> ready, the ``--cases`` cases
    ``args.repeat`` rounds each, round-robin (round 1 runs every case once, in
    :data:`COLD_START_CASES` order, then round 2 ...), so a change of the machine's load hits
    every case alike.

    Reuses case 3 (as a or b: the default ``MaterializerOptions.fetch``) and case 2a (as c) when
    ``r`` has them. Returns a dict of best Runs (a, b, b0, c, d, e, e_fresh, f, k; a case not
    selected is absent; b is None without ``MaterializerOptions.fetch``), "rounds" (key -> the
    Runs of each round), "records" (offsets below the high watermarks) and, with k,
    "follower_settings".
    Raises StreamsRestoreError if Kafka Streams cannot be provisioned or fails, FollowerError if
    the follower does not catch up.
    """
    from kafka_follower import FOLLOWER_NODE_ID, Follower

    selected = {COLD_START_CASES[name] for name in args.cases}
    low, hw = watermarks(bootstrap, args.partitions)
    c: dict = {"records": sum(hw[p] - low[p] for p in hw), "rounds": {}}
    plan: list[tuple[str, str, Callable[[int], Run]]] = []  # (key, label, measure round i)

    def materialize(fetch: str | None) -> Callable[[int], Run]:
        def measure(i: int) -> Run:
            data_dir = work / f"cold-{fetch or 'consumer'}-{i}"
            run = ready_run(run_materializer(bootstrap, data_dir, fetch=fetch), data_dir)
            shutil.rmtree(data_dir, ignore_errors=True)
            return run
        return measure

    # Case 3 ran with the default fetch path: reuse it for the case that path is.
    fetch_option = has_fetch_option()
    default_path = MaterializerOptions().fetch if fetch_option else "consumer"
    for key, path in (("a", "consumer"), ("b", "replica")):
        if key not in selected:
            continue
        if path == "replica" and not fetch_option:
            c[key] = None
        elif "ingest" in r and path == default_path:
            c[key] = ready_run(r["ingest"], work / f"ingest-{args.repeat - 1}")
        else:
            plan.append((key, f'cold {key}: Materializer.run (fetch="{path}")',
                         materialize(path if fetch_option else None)))
    if "b0" in selected and fetch_option:
        def log_only(i: int) -> Run:
            with store_apply_off():
                return materialize("replica")(100 + i)
        plan.append(("b0", 'cold b0: Materializer.run (fetch="replica"), store apply switched off', log_only))
    if "c" in selected:
        if "bare_put" in r:
            c["c"] = r["bare_put"]
        else:
            def bare(i: int) -> Run:
                run = bare_consume(bootstrap, args.partitions, "put", work / f"cold-rdict-{i}")
                shutil.rmtree(work / f"cold-rdict-{i}", ignore_errors=True)
                return run
            plan.append(("c", "cold c: consumer -> Rdict put/record", bare))
    if selected & {"d", "e", "e_fresh"}:
        plan += streams_cases(args, work, bootstrap, c, selected)
    if "f" in selected:
        plan.append(("f", "cold f: copy broker .log files",
                     lambda i: file_copy(broker, args.partitions, work / f"file-copy-{i}")))

    with contextlib.ExitStack() as stack:
        if "k" in selected:
            follower = stack.enter_context(Follower(broker, work / "follower", TOPIC, args.partitions))
            c["follower_settings"] = follower.settings()
            print(f"  follower: broker node {FOLLOWER_NODE_ID} joined in {follower.broker.startup_s:.1f} s; "
                  + ", ".join(f"{k}={v}" for k, v in c["follower_settings"].items()), flush=True)

            def follow(i: int) -> Run:
                result = follower.catch_up()
                return Run(result.seconds, c["records"], result.bytes, notes=dataclasses.asdict(result))
            for n in range(args.follower_warmups):  # uncounted: the JIT of both brokers' replication paths
                warm = follow(-1 - n)
                print(f"  k warm-up {n + 1}/{args.follower_warmups} (uncounted): {warm.seconds:.2f} s, "
                      f"{warm.bytes / MB:,.1f} MB, {warm.mb_per_s:,.1f} MB/s", flush=True)
            plan.append(("k", "cold k: Kafka's own follower catching up", follow))
        plan.sort(key=lambda case: list(COLD_START_CASES.values()).index(case[0]))
        for i in range(args.repeat):
            load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
            print(f"  round {i + 1}/{args.repeat} (load average {load})", flush=True)
            for key, label, measure in plan:
                run = measure(i)
                c["rounds"].setdefault(key, []).append(run)
                extra = ""
                if key == "k":
                    extra = (f"; {run.bytes / MB:,.1f} MB .log, {run.mb_per_s:,.1f} MB/s; first bytes "
                             f"{run.notes['first_bytes_s']:.2f} s; reassignment done {run.notes['reassignment_s']:.2f} s")
                print(f"  {label} #{i + 1}: {run_text(run)}{extra}", flush=True)
    for key, runs in c["rounds"].items():
        c[key] = best(runs)
    return c


def streams_cases(args, work: Path, bootstrap: str, c: dict, selected: set[str]) -> list:
    """Cases d, e, e2 (those ``selected``): compile StreamsRestore once, produce the warm-up topic;
    returns their ``(key, label, measure)`` entries."""
    from kafka_streams_restore import ensure_streams_restore, run_streams_restore

    classpath = ensure_streams_restore()
    # A small topic for each JVM's uncounted warm-up cold start (class loading, RocksDB JNI, JIT).
    admin = AdminClient({"bootstrap.servers": bootstrap})  # referenced until result(): its futures need it
    admin.create_topics([NewTopic(WARMUP_TOPIC, args.partitions, 1, config={"cleanup.policy": "compact"})])[
        WARMUP_TOPIC].result(30)
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5})
    for n in range(WARMUP_RECORDS):
        producer.produce(WARMUP_TOPIC, key=b"warm-%06d" % n, value=b"v" * args.value_bytes, partition=n % args.partitions)
    if producer.flush(60):
        raise RuntimeError(f"could not produce the {WARMUP_RECORDS} records of {WARMUP_TOPIC} within 60 s")

    def streams(mode: str) -> Callable[[int], Run]:
        def measure(i: int) -> Run:
            state = work / f"streams-{mode}-{i}"
            result = run_streams_restore(classpath, bootstrap, TOPIC, mode, state, f"cold-{mode}-{i}-{os.getpid()}",
                                         expected_records=c["records"], warmup_topic=WARMUP_TOPIC,
                                         warmup_records=WARMUP_RECORDS)
            shutil.rmtree(state, ignore_errors=True)
            shutil.rmtree(f"{state}-warmup", ignore_errors=True)
            records = result.records_processed if mode == "ktable-fresh" else result.records_restored
            return Run(result.seconds_to_ready, records,
                       notes={"entries": result.entries, "entries_approx": result.entries_approx,
                              "to_running_s": result.seconds_to_running, "in_start_s": result.seconds_in_start,
                              "warmup_s": result.warmup_seconds_to_ready, "jvm_s": result.jvm_s,
                              "process_wall_s": result.process_wall_s})
        return measure

    cases = (("d", "cold d: Kafka Streams GlobalKTable", "global"),
             ("e", "cold e: Kafka Streams KTable restore", "ktable"),
             ("e_fresh", "cold e2: Kafka Streams KTable, fresh group", "ktable-fresh"))
    return [(key, label, streams(mode)) for key, label, mode in cases if key in selected]


def print_cold_start(args, c: dict) -> None:
    """The cold-start table: best seconds to ready and the range over the rounds, records/s, x faster
    than c and d, live entries; the ratio b / k per round; then the ingest byte rate of a and b
    against the local file copy f. A case whose live entries or records differ from the others'
    is named on a MISMATCH line. Cases not measured are left out."""
    consumer: Run | None = c.get("c")
    global_table: Run | None = c.get("d")
    rounds: dict[str, list[Run]] = c.get("rounds", {})
    print(f"\ncold start ({c['records']:,} records below the high watermarks, {args.keys:,} keys, "
          f"{args.partitions} partitions, {args.compression}; empty data/state dir -> every partition at the "
          f"high watermark seen at start, all in RocksDB; best of {args.repeat} rounds, the cases round-robin):")
    print(f"  {'case':<52} {'seconds':>8} {'rounds':>11} {'records':>11} {'records/s':>11} {'vs c':>7} {'vs d':>7} "
          f"{'entries':>9}")

    def line(key: str, name: str, entries: object, extra: str = "") -> None:
        if key not in c:
            return
        run: Run | None = c[key]
        if run is None:
            print(f"  {name:<52} {'n/a (no fetch option)':>8}")
            return
        times = [x.seconds for x in rounds.get(key, [])]
        spread = f"{min(times):.2f}-{max(times):.2f}" if len(times) > 1 else ("reused" if not times else "")
        vs_c = f"{consumer.seconds / run.seconds:6.2f}x" if consumer else f"{'-':>7}"
        vs_d = f"{global_table.seconds / run.seconds:6.2f}x" if global_table else f"{'-':>7}"
        entries_text = f"{entries:>9,d}" if isinstance(entries, int) else f"{entries:>9}"
        print(f"  {name:<52} {run.seconds:8.2f} {spread:>11} {run.records:>11,d} {run.records_per_s:>11,.0f} "
              f"{vs_c} {vs_d} {entries_text}  {extra}")

    a, b = c.get("a"), c.get("b")
    line("a", 'a  Materializer.run, fetch="consumer"', a.notes["entries"] if a else 0)
    line("b", 'b  Materializer.run, fetch="replica"', b.notes["entries"] if b else 0)
    k: Run | None = c.get("k")
    if k is not None:
        line("k", "k  Kafka's own follower: reassigned, catches up", "-",
             f"{k.bytes / MB:,.1f} MB .log, {k.mb_per_s:,.1f} MB/s; first bytes {k.notes['first_bytes_s']:.2f} s; "
             f"reassignment done {k.notes['reassignment_s']:.2f} s; "
             f"segment files {'identical' if k.notes['segments_match'] else 'cut differently, same bytes'}")
    line("c", "c  confluent-kafka consumer -> Rdict put/record", consumer.notes["live_keys"] if consumer else 0)
    for key, name in (("d", "d  Kafka Streams GlobalKTable restore"),
                      ("e", "e  Kafka Streams KTable restore (source changelog)"),
                      ("e_fresh", "e2 Kafka Streams KTable, fresh group (processed)")):
        if key in c:
            run = c[key]
            extra = (f"RUNNING {run.notes['to_running_s']:.2f} s (in start() {run.notes['in_start_s']:.2f} s); "
                     f"first (warm-up) cold start of the JVM, {WARMUP_RECORDS:,d} records: "
                     f"{run.notes['warmup_s']:.2f} s")
            line(key, name, run.notes["entries"], extra)
    entries = {c[key].notes["entries"] for key in ("a", "b", "d", "e", "e_fresh") if c.get(key) is not None}
    if consumer is not None:
        entries.add(consumer.notes["live_keys"])
    if len(entries) > 1:
        print(f"  MISMATCH: the cases end with different live entry counts {sorted(entries)}")
    short = {key: c[key].records for key in ("a", "b", "c", "d", "e", "e_fresh", "k")
             if c.get(key) is not None and c[key].records != c["records"]}
    if short:
        print(f"  MISMATCH: records fetched / restored / processed differ from the {c['records']:,d} "
              f"below the high watermarks: {short}")
    if b is not None and k is not None:
        per_round = [x.seconds / y.seconds for x, y in zip(rounds.get("b", []), rounds.get("k", []))]
        print(f"  b / k (replica cold start over the follower's catch-up): best-of {b.seconds / k.seconds:.2f}"
              + (f"; per round {', '.join(f'{x:.2f}' for x in per_round)}" if per_round else ""))
    if k is not None:
        settings = c.get("follower_settings", {})
        print("  k  follower settings (DescribeConfigs of the follower; Kafka's defaults, no replication quota): "
              + ", ".join(f"{name}={value}" for name, value in settings.items()))
        print("  k  timed from the AlterPartitionReassignments request to equal .log sizes on every partition "
              "(bytes compared after the clock stopped); the follower does not fsync its appends")
    f: Run | None = c.get("f")
    copy_rate = f.bytes / f.seconds if f is not None else 0.0
    if f is not None:
        print(f"  f  copy of the broker's .log files: {f.bytes / MB:,.1f} MB in {f.seconds:.2f} s "
              f"({copy_rate / MB:,.1f} MB/s; copyfile {f.notes['copy_s']:.2f} s + fsync)")
    for name in ("a", "b"):
        if name not in c:
            continue
        run = c[name]
        if run is None:
            print(f"  {name}  ingest bytes/s: n/a (no fetch option)")
            continue
        if not run.bytes:
            print(f"  {name}  ingest bytes/s: n/a (MaterializerStats.bytes_appended is 0)")
            continue
        rate = run.bytes / run.seconds
        against = (f" = {rate / copy_rate:.2f} x the file copy's bytes/s ({copy_rate / rate:.1f} x slower; "
                   f"goal: within 2x)") if copy_rate else ""
        print(f"  {name}  ingest: {run.bytes / MB:,.1f} MB appended to the local log in {run.seconds:.2f} s "
              f"({rate / MB:,.1f} MB/s){against}")
    log_only: Run | None = c.get("b0")
    if log_only is not None and log_only.bytes:  # the log side alone: fetch + append + fsync, timed end to end
        rate = log_only.bytes / log_only.seconds
        against = f" = {copy_rate / rate:.1f} x slower than the copy" if copy_rate else ""
        print(f"  b0 log side alone (b with the store apply switched off): {log_only.bytes / MB:,.1f} MB in "
              f"{log_only.seconds:.2f} s ({rate / MB:,.1f} MB/s){against} "
              f"(start {log_only.parts['start']:.2f} s, fetch wait {log_only.parts['fetch']:.2f} s, "
              f"append {log_only.parts['append']:.2f} s, fsync {log_only.parts['flush']:.2f} s)")
    print("  (rounds: fastest-slowest round; vs c / vs d: how many times faster than c / d; d, e, e2: seconds from "
          "KafkaStreams.start() in a JVM that did one uncounted cold start of the same kind on a small topic first; "
          "e: group offsets set at the end first, e2: none, so every record is processed; k: after "
          f"{args.follower_warmups} uncounted catch-ups of the same topic)")


# -- output ------------------------------------------------------------------------------------

def machine() -> str:
    cpu = "unknown CPU"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    java = shutil.which("java")
    java_version = ""
    if java:
        done = subprocess.run([java, "-version"], capture_output=True, text=True)
        java_version = (done.stderr.splitlines() or [""])[0]
    nproc = subprocess.run(["nproc"], capture_output=True, text=True).stdout.strip() or str(os.cpu_count())
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    return (f"{nproc} CPUs (nproc), {cpu}; load average {load}\n"
            f"versions: Python {platform.python_version()} ({platform.machine()}), Kafka {KAFKA_VERSION} "
            f"(LocalKafkaBroker), {java_version}, confluent-kafka {confluent_kafka.version()} "
            f"(librdkafka {confluent_kafka.libversion()[0]}), rocksdict {importlib.metadata.version('rocksdict')}")


def row(name: str, run: Run, *, mb: bool = True, extra: str = "") -> str:
    mb_text = f"{run.mb_per_s:8.1f}" if mb and run.bytes else f"{'':8}"
    return f"  {name:<44} {run.seconds:8.2f} {run.records:>11,d} {run.records_per_s:>11,.0f} {mb_text}  {extra}"


def parts_text(run: Run, names: tuple[str, ...]) -> str:
    total = sum(run.parts[n] for n in names)
    return ", ".join(f"{n} {run.parts[n]:.2f} s ({100 * run.parts[n] / total:.0f}%)" for n in names)


def print_profile(title: str, profile: cProfile.Profile, limit: int = 14) -> None:
    print(f"\ncProfile, {title} (top {limit} by own time):")
    stats = pstats.Stats(profile)
    stats.sort_stats("tottime")
    rows = sorted(stats.stats.items(), key=lambda item: item[1][2], reverse=True)[:limit]
    for (filename, line, name), (_cc, calls, tottime, cumtime, _callers) in rows:
        where = f"{Path(filename).parent.name}/{Path(filename).name}:{line}" if line else filename
        print(f"  {tottime:7.2f} s own {cumtime:7.2f} s cum {calls:>10,d} calls  {name}  ({where})")


# -- main --------------------------------------------------------------------------------------

def main() -> None:
    # Every rebuild below is deliberate: keep the Materializer's warning about it out of the output.
    logging.getLogger("materializer.materializer").addFilter(
        lambda record: not record.getMessage().startswith("rebuilding the state store"))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1_000_000, help="records produced (default 1,000,000)")
    parser.add_argument("--keys", type=int, default=100_000, help="distinct keys (default 100,000)")
    parser.add_argument("--value-bytes", type=int, default=100, help="value size, bytes (default 100)")
    parser.add_argument("--partitions", type=int, default=4, help="topic partitions (default 4)")
    parser.add_argument("--tombstone-ratio", type=float, default=0.01, help="fraction of tombstones (default 0.01)")
    parser.add_argument("--compression", default="lz4", choices=["none", "gzip", "snappy", "lz4", "zstd"],
                        help="producer codec and the topic's compression.type (local batches use it too)")
    parser.add_argument("--segment-bytes", type=int, default=16 * 1024 * 1024,
                        help="topic segment.bytes (default 16 MiB)")
    parser.add_argument("--compact-bound", choices=["leo", "kafka"], default="leo",
                        help="compact up to each log end offset (default) or Kafka's bound (active segment)")
    parser.add_argument("--resume-percent", type=float, default=1.0, help="tail produced for the resume (default 1%%)")
    parser.add_argument("--small-tail", type=int, default=100,
                        help="records of the second, small resume (7c; default 100)")
    parser.add_argument("--background-cleaner", action="store_true",
                        help="run the Materializer's background LogCleaner (1 thread) in every run (default: off)")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each measurement, best kept (default 3)")
    parser.add_argument("--skip-broker-compaction", action="store_true",
                        help="skip case 8 (naive restore from the broker-compacted topic)")
    parser.add_argument("--profile", action="store_true",
                        help="also print cProfile top functions of one ingest and one rebuild (extra runs)")
    parser.add_argument("--cold-start-only", action="store_true",
                        help="produce the topic, then only the cold-start table (Materializer, consumer, "
                             "Kafka Streams GlobalKTable / KTable, file copy)")
    parser.add_argument("--cases", default=",".join(COLD_START_CASES),
                        help="comma-separated cold-start cases to run, of " + ",".join(COLD_START_CASES)
                             + " (default: all; e.g. b,k skips the slow Kafka Streams cases)")
    parser.add_argument("--follower-warmups", type=int, default=5,
                        help="uncounted catch-ups of case k before round 1 (default 5: a fresh follower JVM "
                             "took 1.2, 0.9, 1.3, 0.55 s for 1M records, then stayed at ~0.5 s)")
    parser.add_argument("--work-dir", type=Path, default=None, help="keep files here instead of a temp dir")
    args = parser.parse_args()
    args.cases = [name.strip() for name in args.cases.split(",") if name.strip()]
    unknown = sorted(set(args.cases) - set(COLD_START_CASES))
    if unknown or not args.cases:
        parser.error(f"--cases: unknown {unknown or 'empty list'}; choose from {','.join(COLD_START_CASES)}")
    CLEANER_THREADS[0] = 1 if args.background_cleaner else 0

    print(f"command: {shlex.join([sys.executable, *sys.argv])}")
    print(f"machine: {machine()}")
    print(f"workload: {args.records:,} records, {args.keys:,} keys, {args.value_bytes}-byte values, "
          f"{args.tombstone_ratio:.0%} tombstones, {args.partitions} partitions, codec {args.compression}, "
          f"segment.bytes {args.segment_bytes:,}; Materializer cleaner_threads {CLEANER_THREADS[0]}; "
          f"best of {args.repeat}; cold-start cases {','.join(args.cases)}", flush=True)
    total_started = time.perf_counter()
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="bench-materializer-"))
    workload = Workload(args.keys, args.value_bytes, args.partitions, args.tombstone_ratio)
    try:
        broker_config = {**TEST_BROKER_CONFIG, "log.cleaner.dedupe.buffer.size": str(128 * 1024 * 1024)}
        with LocalKafkaBroker(work / "broker", extra_config=broker_config) as broker:
            bootstrap = broker.bootstrap_servers
            print(f"broker: Kafka {KAFKA_VERSION} at {bootstrap}, started in {broker.startup_s:.1f} s", flush=True)
            results = measure(args, work, bootstrap, broker, workload)
        print(f"\ntotal wall time {time.perf_counter() - total_started:.0f} s")
        if args.cold_start_only:
            print_cold_start(args, results["cold_start"])
        else:
            print_results(args, results)
    finally:
        if args.work_dir is None:
            shutil.rmtree(work, ignore_errors=True)


def measure(args, work: Path, bootstrap: str, broker: LocalKafkaBroker, workload: Workload) -> dict:
    """Produce the workload, then the cold-start table alone (``--cold-start-only``) or every case."""
    r: dict = {}
    admin = prepare_topic(args, bootstrap, broker, workload, r)
    if args.cold_start_only:
        r["cold_start"] = measure_cold_start(args, work, bootstrap, broker, r)
        return r
    return measure_rest(args, work, bootstrap, broker, workload, admin, r)


def prepare_topic(args, bootstrap: str, broker: LocalKafkaBroker, workload: Workload, r: dict) -> AdminClient:
    """Create the compacted topic (broker cleaner held back), produce ``args.records`` records,
    one uncounted warm-up read; returns the AdminClient. Sets r["produce_s"], r["broker_log_bytes"]."""
    from tests.integration.compaction_workloads import HOLD_CLEANING_MS

    admin = AdminClient({"bootstrap.servers": bootstrap})
    topic_config = {"cleanup.policy": "compact", "compression.type": args.compression,
                    "segment.bytes": str(args.segment_bytes), "min.cleanable.dirty.ratio": "0.01",
                    "min.compaction.lag.ms": str(HOLD_CLEANING_MS)}
    admin.create_topics([NewTopic(TOPIC, args.partitions, 1, config=topic_config)])[TOPIC].result(30)
    seconds = produce(bootstrap, workload, 0, args.records, args.compression)
    broker_bytes = sum(f.stat().st_size for p in range(args.partitions)
                       for f in broker.partition_dir(TOPIC, p).glob(f"*{LOG_FILE_SUFFIX}"))
    r["produce_s"] = seconds
    r["broker_log_bytes"] = broker_bytes
    print(f"  produced {args.records:,} records in {seconds:.1f} s ({args.records / seconds:,.0f} records/s); "
          f"broker .log files {broker_bytes / MB:,.1f} MB", flush=True)

    # warm-up (not counted): the broker's JIT and page cache, the client's first connection
    warm = bare_consume(bootstrap, args.partitions, "none")
    print(f"  warm-up read: {warm.seconds:.2f} s, {warm.records:,d} records", flush=True)
    return admin


def measure_rest(args, work: Path, bootstrap: str, broker: LocalKafkaBroker, workload: Workload,
                 admin: AdminClient, r: dict) -> dict:
    """Cases 1-8 and the cold-start table on the produced topic; returns ``r``."""
    from tests.integration.compaction_workloads import active_segment_base, alter_topic_configs, wait_for_broker_cleaning

    # 1-2: bare consumers
    r["bare_none"] = repeat("broker -> nothing", args.repeat,
                            lambda i: bare_consume(bootstrap, args.partitions, "none"))
    r["bare_put"] = repeat("broker -> Rdict put/record", args.repeat, lambda i: bare_consume(
        bootstrap, args.partitions, "put", work / f"rdict-put-{i}"))
    r["bare_batch"] = repeat("broker -> Rdict WriteBatch/fetch", args.repeat, lambda i: bare_consume(
        bootstrap, args.partitions, "batch", work / f"rdict-batch-{i}"))
    for name in ("rdict-put", "rdict-batch"):
        for i in range(args.repeat):
            shutil.rmtree(work / f"{name}-{i}", ignore_errors=True)

    # 3: ingest from empty
    def ingest(i: int) -> Run:
        data_dir = work / f"ingest-{i}"
        run = run_materializer(bootstrap, data_dir)
        if i:
            shutil.rmtree(work / f"ingest-{i - 1}", ignore_errors=True)
        return run

    r["ingest"] = repeat("ingest (Materializer.run)", args.repeat, ingest)
    data_dir = work / f"ingest-{args.repeat - 1}"
    r["local_log_bytes"] = log_bytes(data_dir, args.partitions)
    r["ingest_keys"] = store_key_count(data_dir)
    if args.profile:
        profile = cProfile.Profile()
        run_materializer(bootstrap, work / "ingest-profiled", profile=profile)
        shutil.rmtree(work / "ingest-profiled", ignore_errors=True)
        r["ingest_profile"] = profile

    # the cold-start table (reuses 3 and 2a), before 4 deletes the store of 3 and 7 produces more
    r["cold_start"] = measure_cold_start(args, work, bootstrap, broker, r)

    # 4: rebuild from the whole local log
    r["rebuild_full"] = repeat("rebuild from full local log", args.repeat,
                               lambda i: rebuild(bootstrap, data_dir, args.partitions))
    if args.profile:
        profile = cProfile.Profile()
        rebuild(bootstrap, data_dir, args.partitions, profile=profile)
        r["rebuild_profile"] = profile

    # 5: compact
    leo = r["rebuild_full"].notes["start_offsets"]
    started = time.perf_counter()
    compactions = []
    for p in range(args.partitions):
        upto = leo[p] if args.compact_bound == "leo" else None
        compactions += compact_topic(data_dir, TOPIC, partition=p, upto_offset=upto)
    r["compact_s"] = time.perf_counter() - started
    r["compact_records_read"] = sum(c.records_read for c in compactions)
    r["compact_records_written"] = sum(c.records_written for c in compactions)
    r["compact_before"] = sum(c.size_before_bytes for c in compactions)
    r["compact_after"] = sum(c.size_after_bytes for c in compactions)
    print(f"  compact: {r['compact_s']:.2f} s, {r['compact_records_read']:,d} -> {r['compact_records_written']:,d} "
          f"records, {r['compact_before'] / MB:,.1f} -> {r['compact_after'] / MB:,.1f} MB", flush=True)

    # 6: rebuild from the compacted log
    r["rebuild_compacted"] = repeat("rebuild from compacted local log", args.repeat,
                                    lambda i: rebuild(bootstrap, data_dir, args.partitions))
    r["compacted_keys"] = store_key_count(data_dir)

    # 7: resume and cold restore on copies of the compacted data directory
    snapshot = work / "snapshot"
    shutil.copytree(data_dir, snapshot)
    tail = max(1, round(args.records * args.resume_percent / 100.0))
    seconds = produce(bootstrap, workload, args.records, tail, args.compression)
    r["tail"] = tail
    print(f"  produced {tail:,} more records in {seconds:.1f} s", flush=True)

    def resume(i: int, base: Path, expected: int, name: str, cold: bool = False, keep: Path | None = None) -> Run:
        run_dir = work / f"resume-{i}"
        shutil.rmtree(run_dir, ignore_errors=True)
        shutil.copytree(base, run_dir)
        if cold:
            shutil.rmtree(state_dir(run_dir, TOPIC))
        run = run_materializer(bootstrap, run_dir)
        if run.notes["records_fetched"] != expected:
            raise RuntimeError(f"resume fetched {run.notes['records_fetched']:,d} records, expected {expected:,d}")
        if i == args.repeat - 1:
            r[f"{name}_keys"] = store_key_count(run_dir)
            if keep is not None:
                shutil.copytree(run_dir, keep)
        shutil.rmtree(run_dir, ignore_errors=True)
        return run

    caught_up = work / "snapshot-caught-up"
    r["resume"] = repeat("resume (store kept)", args.repeat,
                         lambda i: resume(i, snapshot, tail, "resume", keep=caught_up))
    r["cold"] = repeat("cold restore (store deleted)", args.repeat,
                       lambda i: resume(i, snapshot, tail, "cold", cold=True))
    # A tail smaller than MaterializerOptions.batch_size: consume() waits for a full batch or poll_timeout_ms.
    small = args.small_tail
    seconds = produce(bootstrap, workload, args.records + tail, small, args.compression)
    r["small_tail"] = small
    print(f"  produced {small:,} more records in {seconds:.1f} s", flush=True)
    r["resume_small"] = repeat(f"resume +{small:,d} (store kept)", args.repeat,
                               lambda i: resume(i, caught_up, small, "resume_small"))

    # 8: naive restore from the broker after the broker's own cleaner ran
    if not args.skip_broker_compaction:
        alter_topic_configs(admin, TOPIC, {"min.compaction.lag.ms": "0"}, settle_s=0)
        started = time.perf_counter()
        # A partition that is one active segment has nothing the broker's cleaner may clean.
        cleanable = [p for p in range(args.partitions) if active_segment_base(broker.partition_dir(TOPIC, p)) > 0]
        if cleanable:
            wait_for_broker_cleaning(broker.log_dirs, TOPIC, cleanable, timeout_s=600)
        r["broker_clean_s"] = time.perf_counter() - started
        r["broker_cleaned_partitions"] = len(cleanable)
        print(f"  broker cleaner reached the active segments of {len(cleanable)} partition(s) in "
              f"{r['broker_clean_s']:.1f} s", flush=True)
        r["bare_put_compacted"] = repeat("broker(compacted) -> Rdict put/record", args.repeat, lambda i: bare_consume(
            bootstrap, args.partitions, "put", work / f"rdict-c-{i}"))
    return r


def print_results(args, r: dict) -> None:
    ingest: Run = r["ingest"]
    naive: Run = r["bare_put"]
    naive_best = min((r["bare_put"], r["bare_batch"]), key=lambda run: run.seconds)
    print(f"\nresults ({args.records:,} records, {args.keys:,} keys, {args.value_bytes}-byte values, "
          f"{args.partitions} partitions, {args.compression}; best of {args.repeat}; MB = key+value MiB):")
    print(f"  {'case':<44} {'seconds':>8} {'records':>11} {'records/s':>11} {'MB/s':>8}")
    print(row("1  broker -> nothing (bare consumer)", r["bare_none"],
              extra=f"first record after {r['bare_none'].notes['first_record_s']:.2f} s"))
    print(row("2a broker -> Rdict, put per record", r["bare_put"], extra=f"{r['bare_put'].notes['live_keys']:,d} keys"))
    print(row("2b broker -> Rdict, WriteBatch per fetch", r["bare_batch"]))
    print(row("3  ingest: Materializer.run, empty dir", ingest,
              extra=f"{ingest.records_per_s / r['bare_none'].records_per_s:.2f} x bare consumer"))
    full: Run = r["rebuild_full"]
    print(row("4  rebuild store from full local log", full, mb=True,
              extra=f"{full.bytes / MB:,.1f} MB .log read (MB/s of .log)"))
    compacted: Run = r["rebuild_compacted"]
    print(row("6  rebuild store from compacted local log", compacted, mb=True,
              extra=f"{compacted.bytes / MB:,.1f} MB .log read (MB/s of .log); "
                    f"{naive.seconds / compacted.seconds:.1f} x faster "
                    f"than 2a, {naive_best.seconds / compacted.seconds:.1f} x than the best of 2a/2b"))
    resume: Run = r["resume"]
    cold: Run = r["cold"]
    print(row(f"7a resume +{r['tail']:,d} records (store kept)", resume,
              extra=f"fetched {resume.notes['records_fetched']:,d}"))
    print(row(f"7b cold restore: rebuild + fetch {r['tail']:,d}", cold,
              extra=f"replayed {cold.notes['records_replayed']:,d}, fetched {cold.notes['records_fetched']:,d}; "
                    f"{naive.seconds / cold.seconds:.1f} x faster than 2a"))
    small: Run = r["resume_small"]
    print(row(f"7c resume +{r['small_tail']:,d} records (store kept)", small,
              extra=f"fetched {small.notes['records_fetched']:,d}; fetch {small.parts['fetch']:.2f} s"))
    if "bare_put_compacted" in r:
        c: Run = r["bare_put_compacted"]
        print(row("8  broker(compacted) -> Rdict, put per record", c,
                  extra=f"{c.notes['live_keys']:,d} keys; {c.seconds / compacted.seconds:.1f} x case 6 time"))
    print("\ndetails:")
    print(f"  produce: {r['produce_s']:.1f} s; broker .log {r['broker_log_bytes'] / MB:,.1f} MB, "
          f"local .log after ingest {r['local_log_bytes'] / MB:,.1f} MB "
          f"({ingest.notes['batches_appended']:,d} batches)")
    print(f"  ingest split (best run, {ingest.seconds:.2f} s wall): "
          + parts_text(ingest, MATERIALIZER_PARTS))
    print(f"  rebuild: full log {full.seconds:.2f} s of {full.notes['wall_s']:.2f} s Materializer start+close, "
          f"compacted log {compacted.seconds:.2f} s of {compacted.notes['wall_s']:.2f} s")
    print(f"  compact ({args.compact_bound}): {r['compact_s']:.2f} s, {r['compact_records_read']:,d} -> "
          f"{r['compact_records_written']:,d} records, "
          f"{r['compact_before'] / MB:,.1f} -> {r['compact_after'] / MB:,.1f} MB")
    print("  resume split: " + parts_text(resume, MATERIALIZER_PARTS))
    print(f"  resume +{r['small_tail']:,d} split: " + parts_text(small, MATERIALIZER_PARTS))
    print("  cold restore split: " + parts_text(cold, MATERIALIZER_PARTS)
          + f"; of start, rebuild {cold.parts['rebuild']:.2f} s")
    print(f"  live keys: after ingest {r['ingest_keys']:,d}, after compacted rebuild {r['compacted_keys']:,d}, "
          f"naive 2a {naive.notes['live_keys']:,d}; after resume {r['resume_keys']:,d}, "
          f"after cold restore {r['cold_keys']:,d}, after resume +{r['small_tail']:,d} {r['resume_small_keys']:,d}")
    if "broker_clean_s" in r:
        print(f"  broker cleaner (released after 7): {r['broker_clean_s']:.1f} s to reach the active segments "
              f"of {r['broker_cleaned_partitions']} of {args.partitions} partitions")
    print_cold_start(args, r["cold_start"])
    for name, title in (("ingest_profile", "one ingest"), ("rebuild_profile", "one rebuild from the full log")):
        if name in r:
            print_profile(title, r[name])


if __name__ == "__main__":
    main()
