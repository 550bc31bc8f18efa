"""Crash recovery: SIGKILL the ingesting materializer at random moments, reopen, check invariants.

Each kill is followed by a check on a copy of the data directory, reopened as the next run
would: the logs recover (torn batches cut, indexes rebuilt) and the state store never runs
ahead of its log. Data keeps arriving between ingest rounds (plain records, tombstones,
committed and aborted transactions), and some rounds start from an empty data directory, so
kills land during first ingest, catch-up, startup recovery and store replay. At the end one
uninterrupted run must leave exactly what a read_committed consumer reads from the broker:
the same records (offset, key, value) in each local log and the same latest value per key.

``CRASH_TEST_KILLS`` (default 100) sets the number of kills; ``CRASH_TEST_SEED`` the random seed.
"""

from __future__ import annotations

import os
import random
import sys
import time
from pathlib import Path

import pytest
from confluent_kafka import Producer

from materializer.adapters.rocksdb_store import StateStore
from materializer.datadir.layout import partition_dir, state_dir, topic_config_path
from materializer.storage.log import Log
from materializer.storage.log_config import LogConfig
from materializer.storage.read_committed import read_committed

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from crash_harness import CrashHarness, check_after_crash  # noqa: E402

from .broker_reads import latest_per_key, read_topic  # noqa: E402

pytestmark = pytest.mark.broker

PARTITIONS = 3
KILLS = int(os.environ.get("CRASH_TEST_KILLS", "100"))
SEED = int(os.environ.get("CRASH_TEST_SEED", str(int(time.time()))))
RECORDS_PER_ROUND = 4000
# Small local batches and fetches: many appends and store writes per run, so kills hit them.
RUN_OPTIONS = {"batch_size": 500, "max_batch_bytes": 16384, "poll_timeout_ms": 100,
               "config_overrides": {"segment.bytes": "65536", "index.interval.bytes": "1024"}}


def _produce_round(bootstrap: str, topic: str, round_number: int, rng: random.Random) -> None:
    plain = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "enable.idempotence": True})
    txn = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"{topic}-txn", "linger.ms": 5})
    txn.init_transactions(30)
    for i in range(RECORDS_PER_ROUND):
        partition = i % PARTITIONS
        key = b"key-%d-%04d" % (partition, rng.randrange(500))
        value = None if rng.random() < 0.05 else b"r%d-%d-" % (round_number, i) + b"x" * rng.randrange(200)
        plain.produce(topic, key=key, value=value, partition=partition)
        if i % 500 == 0:
            plain.poll(0)
    plain.flush(30)
    for commit in (True, False):
        txn.begin_transaction()
        for i in range(300):
            txn.produce(topic, key=b"key-%d-%04d" % (i % PARTITIONS, rng.randrange(500)),
                        value=b"txn-%d-%s-%d" % (round_number, b"c" if commit else b"a", i), partition=i % PARTITIONS)
        txn.flush(30)
        if commit:
            txn.commit_transaction(30)
        else:
            txn.abort_transaction(30)


def test_sigkill_at_random_points_never_corrupts(kafka_broker, create_topic, tmp_path):
    topic = create_topic("crash-src", PARTITIONS, {"retention.ms": "-1"})
    bootstrap = kafka_broker.bootstrap_servers
    rng = random.Random(SEED)
    print(f"crash test: seed {SEED}, {KILLS} kills")
    data_dir = tmp_path / "data"
    kills = completed = rounds = truncations = torn_configs = 0
    config = LogConfig.from_kafka_configs(RUN_OPTIONS["config_overrides"])
    max_delay_s = 1.0
    started = time.monotonic()
    with CrashHarness() as harness:
        while kills < KILLS:
            _produce_round(bootstrap, topic, rounds, rng)
            rounds += 1
            if rounds % 4 == 0:  # start over now and then: kills during the first, biggest ingest
                data_dir = tmp_path / f"data-{rounds}"
            finished = False
            while not finished and kills < KILLS:
                outcome = harness.run(bootstrap, topic, data_dir, rng.uniform(0.0, max_delay_s), RUN_OPTIONS)
                assert outcome.killed or outcome.exit_code == 0, outcome
                if outcome.killed:
                    kills += 1
                else:
                    completed += 1
                    finished = True
                    max_delay_s = max(0.3, min(3.0, outcome.elapsed_s * 1.2))
                if data_dir.exists():
                    checks = check_after_crash(data_dir, topic, list(range(PARTITIONS)), config)
                    truncations += sum(1 for c in checks.values() if c.bytes_truncated)
                    config_path = topic_config_path(data_dir, topic)
                    try:
                        if config_path.exists():
                            LogConfig.load(config_path)
                    except ValueError:
                        torn_configs += 1  # LogConfig.save is not atomic (reported); the next run rewrites it
        final = harness.run(bootstrap, topic, data_dir, 300.0, RUN_OPTIONS)
        assert final.exit_code == 0 and not final.killed, final
    elapsed = time.monotonic() - started
    print(f"crash test: {kills} kills, {completed} completed runs, {rounds} rounds, "
          f"{truncations} reopenings cut a torn batch, {torn_configs} torn topic-config files, {elapsed:.1f} s")

    reference = read_topic(bootstrap, topic, PARTITIONS)
    expected = {p: [(r.offset, r.key, r.value) for r, _ in rows] for p, rows in reference.items()}
    with StateStore(state_dir(data_dir, topic)) as store:
        offsets = store.offsets()
        stored = {key: (v.partition, v.offset, v.value) for key, v in store.items()}
    for partition in range(PARTITIONS):
        log = Log.open(partition_dir(data_dir, topic, partition), config)
        try:
            local = [(r.offset, r.key, r.value) for r in read_committed(log)]
            assert local == expected[partition], f"partition {partition}: local log differs from the broker"
            assert offsets[partition] <= log.log_end_offset
        finally:
            log.close()
    assert stored == latest_per_key(reference)
    assert kills >= KILLS
