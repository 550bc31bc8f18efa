"""`materializer restore --from-log-dir`: a real broker's partition folders -> DIR, compared with a
read_committed consumer of the same broker.

The topic has 3 partitions holding plain records, tombstones, committed transactions, aborted
transactions (their keys overlap live keys, so a leak would change values) and plain records
written while a transaction was open.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from confluent_kafka import Producer

from materializer.cli import main
from materializer.offline.restore import RestoreOptions, restore_from_log_dir
from materializer.storage.read_committed import ReadOnlyPartition, scan_transactions

from .broker_reads import latest_per_key, read_topic

pytestmark = pytest.mark.broker

PARTITIONS = 3
KEYS_PER_PARTITION = 40


def _key(partition: int, i: int) -> bytes:
    return b"p%d-key-%03d" % (partition, i % KEYS_PER_PARTITION)


def _produce_history(bootstrap: str, topic: str) -> None:
    plain = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5})
    txn = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"{topic}-txn", "linger.ms": 5})
    txn.init_transactions(30)
    for round_number in range(6):
        for p in range(PARTITIONS):
            for i in range(30):
                n = round_number * 30 + i
                value = None if n % 11 == 3 else b"plain-%d-%d" % (round_number, n)
                plain.produce(topic, key=_key(p, n), value=value, partition=p)
        plain.flush(30)
        txn.begin_transaction()
        for p in range(PARTITIONS):
            for i in range(15):
                txn.produce(topic, key=_key(p, i * 3 + round_number), value=b"txn-%d-%d" % (round_number, i),
                            partition=p)
        txn.flush(30)
        for p in range(PARTITIONS):  # plain records inside the open transaction's offset range
            plain.produce(topic, key=_key(p, 1000 + round_number), value=b"during-%d" % round_number, partition=p)
        plain.flush(30)
        if round_number % 2:
            txn.abort_transaction(30)
        else:
            txn.commit_transaction(30)
    txn.flush(30)
    plain.flush(30)


def _wait_for_markers(broker, topic: str, timeout_s: float = 30.0) -> None:
    """Transaction markers are written asynchronously: wait until every partition folder shows
    no open transaction (read in place, read-only)."""
    deadline = time.monotonic() + timeout_s
    while True:
        open_txns = {p: scan_transactions(ReadOnlyPartition(broker.partition_dir(topic, p))).open_transactions
                     for p in range(PARTITIONS)}
        if not any(open_txns.values()):
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"transactions still open in the broker's log: {open_txns}")
        time.sleep(0.2)


def _export(data_dir: Path, topic: str) -> dict[bytes, tuple[int, int, bytes]]:
    result = CliRunner().invoke(main, ["export", "--data-dir", str(data_dir), "--topic", topic])
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in result.stdout.splitlines() if line.strip()]
    return {row["key"].encode(): (row["partition"], row["offset"], row["value"].encode()) for row in rows}


def _fingerprint(folder: Path) -> dict[str, tuple[str, int, int]]:
    return {str(p.relative_to(folder)): (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_size,
                                         p.stat().st_mtime_ns)
            for p in sorted(folder.rglob("*")) if p.is_file()}


_PRODUCED: dict[str, tuple[str, dict]] = {}


@pytest.fixture
def restored_topic(kafka_broker, create_topic):
    """The produced topic and a read_committed consumer's view of it (built once per session)."""
    if "topic" not in _PRODUCED:
        topic = create_topic("restore-src", PARTITIONS, {"retention.ms": "-1"})
        _produce_history(kafka_broker.bootstrap_servers, topic)
        _wait_for_markers(kafka_broker, topic)
        _PRODUCED["topic"] = (topic, latest_per_key(read_topic(kafka_broker.bootstrap_servers, topic, PARTITIONS)))
    return _PRODUCED["topic"]


def test_restore_from_live_log_dir_matches_read_committed_consumer(kafka_broker, restored_topic, tmp_path):
    topic, expected = restored_topic
    data_dir = tmp_path / "data"
    result = CliRunner().invoke(main, ["restore", "--from-log-dir", str(kafka_broker.log_dirs), "--topic", topic,
                                       "--data-dir", str(data_dir)])
    assert result.exit_code == 0, result.output
    assert f"restored {PARTITIONS} partitions" in result.output
    exported = _export(data_dir, topic)
    assert exported == expected
    assert len(expected) > PARTITIONS * KEYS_PER_PARTITION // 2
    assert any(v[2].startswith(b"txn-") for v in expected.values())  # committed transactions are visible
    for p in range(PARTITIONS):
        assert (data_dir / f"{topic}-{p}" / "00000000000000000000.log").is_file()


def test_restore_never_modifies_the_broker_folder(kafka_broker, restored_topic, tmp_path):
    topic, expected = restored_topic
    snapshot = tmp_path / "broker-snapshot"
    for p in range(PARTITIONS):
        shutil.copytree(kafka_broker.partition_dir(topic, p), snapshot / f"{topic}-{p}")
    for name in ("recovery-point-offset-checkpoint", "log-start-offset-checkpoint"):
        if (kafka_broker.log_dirs / name).exists():
            shutil.copy2(kafka_broker.log_dirs / name, snapshot / name)
    before = _fingerprint(snapshot)
    for path in sorted(snapshot.rglob("*"), reverse=True):  # read-only: any write attempt fails loudly
        os.chmod(path, stat.S_IRUSR | (stat.S_IXUSR if path.is_dir() else 0))
    os.chmod(snapshot, stat.S_IRUSR | stat.S_IXUSR)
    try:
        result = restore_from_log_dir(snapshot, topic, tmp_path / "data", options=RestoreOptions())
    finally:
        for path in [snapshot, *snapshot.rglob("*")]:
            os.chmod(path, stat.S_IRWXU)
    assert _fingerprint(snapshot) == before
    assert sorted(result.partitions) == list(range(PARTITIONS))
    assert sum(r.aborted_transactions for r in result.partitions.values()) == 3 * PARTITIONS
    assert all(r.last_stable_offset == r.log_end_offset for r in result.partitions.values())
    assert _export(tmp_path / "data", topic) == expected


def test_run_continues_after_restore(kafka_broker, restored_topic, tmp_path):
    topic, expected = restored_topic
    data_dir = tmp_path / "data"
    restore_from_log_dir(kafka_broker.log_dirs, topic, data_dir)
    result = CliRunner().invoke(main, ["run", "--bootstrap-servers", kafka_broker.bootstrap_servers, "--topic", topic,
                                       "--data-dir", str(data_dir), "--until-caught-up", "--no-progress"])
    assert result.exit_code == 0, result.output
    assert "fetched 0 records" in result.output
    assert _export(data_dir, topic) == expected


def test_store_rebuilt_from_a_restored_log_skips_aborted_records(kafka_broker, restored_topic, tmp_path):
    topic, expected = restored_topic
    data_dir = tmp_path / "data"
    restore_from_log_dir(kafka_broker.log_dirs, topic, data_dir)
    shutil.rmtree(data_dir / "state" / topic)  # lost store: the next run rebuilds it from the local log
    result = CliRunner().invoke(main, ["run", "--bootstrap-servers", kafka_broker.bootstrap_servers, "--topic", topic,
                                       "--data-dir", str(data_dir), "--until-caught-up", "--no-progress"])
    assert result.exit_code == 0, result.output
    assert _export(data_dir, topic) == expected
