"""The same key in two partitions of a compacted topic stays two entries (issue 7, item 1).

Kafka compacts each partition on its own, so after a partition-count increase or with producers
that use different partitioners, one key can have a live value in two partitions. Produce
``dup=B`` to partition 0, ``dup=A`` to partition 1, ``dup=C`` to partition 0 (explicit partitions,
increasing timestamps): the store must keep C for partition 0 and A for partition 1, a tombstone in
partition 1 must leave partition 0's C, and a store rebuilt from the local log must agree.
"""

from __future__ import annotations

import json
import shutil

import pytest
from click.testing import CliRunner
from confluent_kafka import Producer

from materializer.cli import main
from materializer.datadir.layout import state_dir

from .broker_reads import read_topic

pytestmark = pytest.mark.broker


def _produce(bootstrap: str, topic: str, rows: list[tuple[int, bytes, bytes | None, int]]) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True})
    for partition, key, value, timestamp_ms in rows:
        producer.produce(topic, key=key, value=value, partition=partition, timestamp=timestamp_ms)
        producer.flush(30)  # one at a time: the order of writes is the order of the rows
    assert producer.flush(30) == 0


def _run(bootstrap: str, topic: str, data_dir) -> None:
    result = CliRunner().invoke(main, ["run", "--bootstrap-servers", bootstrap, "--topic", topic,
                                       "--data-dir", str(data_dir), "--until-caught-up"])
    assert result.exit_code == 0, result.output


def _export(topic: str, data_dir) -> list[tuple[int, str, str]]:
    result = CliRunner().invoke(main, ["export", "--data-dir", str(data_dir), "--topic", topic])
    assert result.exit_code == 0, result.output
    return [(line["partition"], line["key"], line["value"]) for line in map(json.loads, result.stdout.splitlines())]


def _get(topic: str, data_dir, *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, ["get", "--data-dir", str(data_dir), "--topic", topic, *args])
    return result.exit_code, result.stdout


def test_same_key_in_two_partitions(kafka_broker, create_topic, tmp_path):
    topic = create_topic(partitions=2, config={"cleanup.policy": "compact"})
    bootstrap = kafka_broker.bootstrap_servers
    _produce(bootstrap, topic, [(0, b"dup", b"B", 1_000), (1, b"dup", b"A", 2_000), (0, b"dup", b"C", 3_000),
                                (1, b"only-1", b"x", 2_500)])
    # What a read_committed consumer of each partition sees last for each key.
    consumed = read_topic(bootstrap, topic, 2)
    assert [(r.key, r.value) for r, _ in consumed[0]] == [(b"dup", b"B"), (b"dup", b"C")]
    assert [(r.key, r.value) for r, _ in consumed[1]] == [(b"dup", b"A"), (b"only-1", b"x")]

    _run(bootstrap, topic, tmp_path)
    assert _export(topic, tmp_path) == [(0, "dup", "C"), (1, "dup", "A"), (1, "only-1", "x")]
    assert _get(topic, tmp_path, "dup") == (0, "C\n")  # latest timestamp across partitions
    assert _get(topic, tmp_path, "--partition", "1", "dup") == (0, "A\n")
    assert _get(topic, tmp_path, "--partition", "0", "only-1")[0] == 1

    # A tombstone in partition 1 deletes partition 1's entry only.
    _produce(bootstrap, topic, [(1, b"dup", None, 4_000)])
    _run(bootstrap, topic, tmp_path)
    assert _export(topic, tmp_path) == [(0, "dup", "C"), (1, "only-1", "x")]
    assert _get(topic, tmp_path, "dup") == (0, "C\n")
    assert _get(topic, tmp_path, "--partition", "1", "dup")[0] == 1

    # A store rebuilt from the local log agrees.
    shutil.rmtree(state_dir(tmp_path, topic))
    _run(bootstrap, topic, tmp_path)
    assert _export(topic, tmp_path) == [(0, "dup", "C"), (1, "only-1", "x")]
