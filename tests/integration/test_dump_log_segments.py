"""We read Kafka's segments: ``materializer dump-log`` against Kafka's own DumpLogSegments.

A real broker (fixture ``kafka_broker``) writes the segments: producers with every
``compression.type`` (none, gzip, snappy, lz4, zstd), idempotent and plain, a transactional
producer with one committed and one aborted transaction (control batches), headers, null
keys and null values, on a CreateTime and on a LogAppendTime topic. Then
``org.apache.kafka.tools.DumpLogSegments --deep-iteration --print-data-log --files <log>``
(the broker's Kafka version) and our ``dump-log`` run on the same ``.log`` files, and both
outputs are parsed and compared field by field, then line by line.

Keys and values are ASCII so the comparison does not depend on the JVM's stdout charset.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any, Callable

import pytest
from click.testing import CliRunner

from materializer.local.kafka_broker import DUMP_LOG_SEGMENTS_CLASS
from materializer.cli.dump_log import dump_log
from materializer.offline.dump_log import parse_dump_output

pytestmark = pytest.mark.broker

CODECS = ("none", "gzip", "snappy", "lz4", "zstd")
RECORDS_PER_PRODUCER = 12
TIMEOUT_S = 60.0


def _produce_plain_and_idempotent(bootstrap: str, topic: str) -> None:
    from confluent_kafka import Producer

    for codec in CODECS:
        for idempotent in (True, False):
            producer = Producer({
                "bootstrap.servers": bootstrap,
                "compression.type": codec,
                "enable.idempotence": idempotent,
                "acks": "all",
                "linger.ms": 20,
            })
            for i in range(RECORDS_PER_PRODUCER):
                key = None if i % 5 == 3 else f"{codec}-key-{i}".encode()
                value = None if i % 4 == 2 else f"{codec} value {i} idempotent={idempotent}".encode()
                headers = [("h-codec", codec.encode()), ("h-null", None)] if i % 3 == 0 else None
                producer.produce(topic, key=key, value=value, headers=headers, partition=0)
            if producer.flush(TIMEOUT_S) != 0:
                raise AssertionError(f"{codec} producer did not deliver within {TIMEOUT_S} s")


def _produce_transactions(bootstrap: str, topic: str) -> None:
    from confluent_kafka import Producer

    producer = Producer({
        "bootstrap.servers": bootstrap,
        "transactional.id": f"dump-log-{uuid.uuid4().hex}",
        "compression.type": "lz4",
        "linger.ms": 20,
    })
    producer.init_transactions(TIMEOUT_S)
    for commit in (True, False):
        producer.begin_transaction()
        for i in range(4):
            producer.produce(topic, key=f"txn-{commit}-{i}".encode(), value=f"txn value {i}".encode(),
                             headers=[("txn", b"1")], partition=0)
        producer.flush(TIMEOUT_S)
        if commit:
            producer.commit_transaction(TIMEOUT_S)
        else:
            producer.abort_transaction(TIMEOUT_S)


def _log_files(partition_dir: Path) -> list[Path]:
    return sorted(partition_dir.glob("*.log"))


def _ours(path: Path) -> str:
    result = CliRunner().invoke(dump_log, [str(path)])
    assert result.exit_code == 0, result.output
    return result.stdout


def _wait_for_markers(partition_dir: Path, expected: set[str]) -> None:
    """End-transaction markers are written by the coordinator after EndTxn returns: wait for them."""
    deadline = time.monotonic() + TIMEOUT_S
    seen: set[str] = set()
    while time.monotonic() < deadline:
        seen = {
            record["endTxnMarker"]
            for log in _log_files(partition_dir)
            for dumped in parse_dump_output(_ours(log))
            for batch in dumped["batches"]
            for record in batch["records"]
            if record["endTxnMarker"]
        }
        if expected <= seen:
            return
        time.sleep(0.2)
    raise AssertionError(f"markers {expected - seen} not in {partition_dir} within {TIMEOUT_S} s")


def _dump_section(text: str) -> list[str]:
    """The DumpLogSegments lines of a tool's stdout (drops anything before the first "Dumping")."""
    lines = text.splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith("Dumping ")]
    return lines[starts[0]:] if starts else []


def _compare(kafka_broker: Any, partition_dir: Path) -> list[dict[str, Any]]:
    batches: list[dict[str, Any]] = []
    for log in _log_files(partition_dir):
        done = kafka_broker.run_tool(
            DUMP_LOG_SEGMENTS_CLASS, ["--deep-iteration", "--print-data-log", "--files", str(log)])
        assert done.returncode == 0, done.stderr
        ours = _ours(log)
        (theirs_parsed,) = parse_dump_output(done.stdout)
        (ours_parsed,) = parse_dump_output(ours)
        assert ours_parsed["file"] == theirs_parsed["file"] == str(log)
        assert ours_parsed["startOffset"] == theirs_parsed["startOffset"]
        assert ours_parsed["invalidBytes"] == theirs_parsed["invalidBytes"] == 0
        assert len(ours_parsed["batches"]) == len(theirs_parsed["batches"]) > 0
        for ours_batch, theirs_batch in zip(ours_parsed["batches"], theirs_parsed["batches"]):
            ours_records, theirs_records = ours_batch.pop("records"), theirs_batch.pop("records")
            assert ours_batch == theirs_batch, f"batch at position {theirs_batch['position']}"
            assert ours_records == theirs_records, f"records of batch at position {theirs_batch['position']}"
            ours_batch["records"] = ours_records
            batches.append(ours_batch)
        assert _dump_section(ours) == _dump_section(done.stdout)
    return batches


def _check_coverage(batches: list[dict[str, Any]], *, timestamp_type: str) -> None:
    assert {b["compresscodec"] for b in batches} == set(CODECS)
    assert all(b["isvalid"] for b in batches)
    assert all(b["timestampType"] == timestamp_type for b in batches)
    assert any(b["producerId"] >= 0 and b["baseSequence"] >= 0 for b in batches)  # idempotent
    assert any(b["producerId"] == -1 for b in batches)  # plain producer
    markers = [r["endTxnMarker"] for b in batches if b["isControl"] for r in b["records"]]
    assert sorted(markers) == ["ABORT", "COMMIT"]
    assert any(b["isTransactional"] and not b["isControl"] for b in batches)
    records = [r for b in batches if not b["isControl"] for r in b["records"]]
    assert len(records) == len(CODECS) * 2 * RECORDS_PER_PRODUCER + 8
    assert any(r["keySize"] == -1 and r["key"] is None for r in records)
    assert any(r["valueSize"] == -1 and r["payload"] is None for r in records)
    assert any(r["headerKeys"] == ["h-codec", "h-null"] for r in records)


@pytest.mark.parametrize("timestamp_type", ["CreateTime", "LogAppendTime"])
def test_dump_log_matches_kafka_dump_log_segments(
    kafka_broker: Any, create_topic: Callable[..., str], timestamp_type: str
) -> None:
    topic = create_topic(config={"message.timestamp.type": timestamp_type})
    _produce_plain_and_idempotent(kafka_broker.bootstrap_servers, topic)
    _produce_transactions(kafka_broker.bootstrap_servers, topic)
    partition_dir = kafka_broker.partition_dir(topic, 0)
    _wait_for_markers(partition_dir, {"COMMIT", "ABORT"})

    batches = _compare(kafka_broker, partition_dir)

    _check_coverage(batches, timestamp_type=timestamp_type)


def test_dump_log_matches_kafka_on_a_cleaned_log_with_delete_horizon(
    kafka_broker: Any, create_topic: Callable[..., str]
) -> None:
    """Kafka's cleaner writes the delete horizon (KIP-534) on batches that keep tombstones."""
    from confluent_kafka import Producer

    topic = create_topic(config={
        "cleanup.policy": "compact",
        "segment.ms": "100",
        "min.cleanable.dirty.ratio": "0.01",
        "min.compaction.lag.ms": "0",
        "delete.retention.ms": "3600000",
        "compression.type": "zstd",
    })
    producer = Producer({"bootstrap.servers": kafka_broker.bootstrap_servers, "linger.ms": 5})
    for round_number in range(3):
        for i in range(20):
            value = None if (i % 4 == 0 and round_number == 2) else f"round {round_number} value {i}".encode()
            producer.produce(topic, key=f"key-{i}".encode(), value=value, partition=0)
        producer.flush(TIMEOUT_S)
        time.sleep(0.3)  # > segment.ms: the next append rolls the segment
    producer.produce(topic, key=b"roll", value=b"roll", partition=0)
    producer.flush(TIMEOUT_S)

    partition_dir = kafka_broker.partition_dir(topic, 0)
    deadline = time.monotonic() + TIMEOUT_S
    horizons: list[int] = []
    while time.monotonic() < deadline and not horizons:
        time.sleep(0.5)
        try:
            horizons = [
                batch["deleteHorizonMs"]
                for log in _log_files(partition_dir)
                for dumped in parse_dump_output(_ours(log))
                for batch in dumped["batches"]
                if batch["deleteHorizonMs"] is not None
            ]
        except (AssertionError, FileNotFoundError):  # a segment swapped in while we read
            horizons = []
    assert horizons, f"the cleaner wrote no delete horizon in {partition_dir} within {TIMEOUT_S} s"
    time.sleep(1.0)  # let the swap/delete of the replaced segments finish

    batches = _compare(kafka_broker, partition_dir)

    assert any(b["deleteHorizonMs"] is not None for b in batches)
