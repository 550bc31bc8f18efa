"""A running member follows the broker's log start offset (issue 37, item 3).

Retention (a compacted topic switched to ``compact,delete`` with a short ``retention.ms``) or
``AdminClient.delete_records`` (KIP-107) moves the leader's log start offset while nothing new is
produced. A follower follows it from every fetch response (``ReplicaFetcherThread.processPartitionData``
-> ``UnifiedLog.maybeIncrementLogStartOffset``), and a consumer started now reads from it: a key whose
latest record is below it is gone, a key with a later record above it stays. The running member's
store must say the same within seconds, not only at its end, and count what it dropped
(``materializer_store_entries_expired_total``); its export equals a fresh run's and a
read_committed consumer's.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource

from materializer import Materializer, MaterializerOptions
from materializer.cli import main
from materializer.metrics import MaterializerMetrics
from materializer.group.routing import partition_for_key

from .background_run import BackgroundRun, wait_until
from .broker_reads import latest_per_partition_key, read_topic
from .leader_changes import create_topic

pytestmark = pytest.mark.broker

PARTITIONS = 2
#: Keys where Kafka's default partitioner (murmur2) puts them, as group members route reads:
#: 100 in partition 0, 60 in partition 1.
KEYS = {p: [k for k in (b"key-%d" % i for i in range(400)) if partition_for_key(k, PARTITIONS) == p][:n]
        for p, n in ((0, 100), (1, 60))}
#: Kafka refuses DeleteRecords on a topic that is only compacted (POLICY_VIOLATION).
DELETABLE = {"cleanup.policy": "compact,delete", "retention.ms": "-1"}


def _produce(bootstrap: str, topic: str, rows: list[tuple[int, bytes, bytes]]) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "acks": "all", "enable.idempotence": True})
    for partition, key, value in rows:
        producer.produce(topic, key=key, value=value, partition=partition)
    assert producer.flush(30) == 0


def _exported(data_dir: Path, topic: str) -> dict[tuple[int, bytes], bytes]:
    result = CliRunner().invoke(main, ["export", "--data-dir", str(data_dir), "--topic", topic])
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    return {(row["partition"], row["key"].encode()): row["value"].encode() for row in rows}


def _truth(bootstrap: str, topic: str) -> dict[tuple[int, bytes], bytes]:
    """What a read_committed consumer reads from the log start offsets now, latest per (partition, key)."""
    return latest_per_partition_key(read_topic(bootstrap, topic, PARTITIONS))


def _log_starts(bootstrap: str, topic: str) -> dict[int, int]:
    """Partition -> the broker's log start offset now (ListOffsets EARLIEST)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"watermarks-{time.time_ns()}"})
    try:
        return {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[0] for p in range(PARTITIONS)}
    finally:
        consumer.close()


def _expired_metric(materializer: Materializer) -> float:
    with MaterializerMetrics(materializer, statistics_interval_ms=0) as metrics:
        exposed = metrics.render().decode()
    line = next(line for line in exposed.splitlines()
                if line.startswith("materializer_store_entries_expired_total{"))
    return float(line.rsplit(" ", 1)[1])


def _fresh_run(bootstrap: str, topic: str, data_dir: Path, fetch: str) -> dict[tuple[int, bytes], bytes]:
    result = CliRunner().invoke(main, ["run", "--bootstrap-servers", bootstrap, "--topic", topic, "--data-dir",
                                       str(data_dir), "--until-caught-up", "--no-progress", "--fetch", fetch,
                                       "--timeout", "20"])
    assert result.exit_code == 0, result.output
    return _exported(data_dir, topic)


def _set_configs(bootstrap: str, topic: str, configs: dict[str, str]) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    resource = ConfigResource("topic", topic, incremental_configs=[
        ConfigEntry(name, value, incremental_operation=AlterConfigOpType.SET) for name, value in configs.items()])
    for future in admin.incremental_alter_configs([resource]).values():
        future.result(30)


@pytest.mark.parametrize("group", [False, True], ids=["no-group", "group"])
@pytest.mark.parametrize("fetch", ["replica", "consumer"])
@pytest.mark.parametrize("move", ["retention", "delete_records"])
def test_a_running_member_follows_the_log_start_offset(kafka_broker, tmp_path, fetch, group, move):
    bootstrap = kafka_broker.bootstrap_servers
    topic = f"log-start-live-{move}-{fetch}-{'group' if group else 'plain'}-{time.time_ns()}"
    create_topic(bootstrap, topic, PARTITIONS, {"cleanup.policy": "compact"} if move == "retention" else DELETABLE)
    # partition 0: 100 keys at offsets 0..99; partition 1: 60 keys at offsets 0..59
    _produce(bootstrap, topic, [(p, key, b"first") for p in (0, 1) for key in KEYS[p]])
    options = MaterializerOptions(fetch=fetch, group_id=f"{topic}-members" if group else None,
                                  request_timeout_ms=10_000, broker_timeout_ms=10_000)
    data_dir = tmp_path / "member"
    with Materializer(bootstrap, topic, data_dir, options=options) as materializer:
        background = BackgroundRun(materializer)
        try:
            assert materializer.wait_until_caught_up(60)
            if move == "delete_records":
                # 30 keys written again above the offset the records are deleted below: they stay
                _produce(bootstrap, topic, [(0, key, b"second") for key in KEYS[0][:30]])
                wait_until(lambda: materializer.store.offsets().get(0) == 130, 30, "the second values applied")
                admin = AdminClient({"bootstrap.servers": bootstrap})
                for future in admin.delete_records([TopicPartition(topic, 0, 100),
                                                    TopicPartition(topic, 1, 60)]).values():
                    future.result(30)
                expected = {(0, key): b"second" for key in KEYS[0][:30]}
                expected_starts = {0: 100, 1: 60}
            else:
                # The broker (retention checked every second) rolls the active segment and deletes
                # every segment: its log start offsets become its log end offsets.
                _set_configs(bootstrap, topic, {"cleanup.policy": "compact,delete", "retention.ms": "1000"})
                expected = {}
                expected_starts = {0: 100, 1: 60}
            wait_until(lambda: _log_starts(bootstrap, topic) == expected_starts, 60,
                       "the broker's log start offsets moved")
            assert _truth(bootstrap, topic) == expected  # a read_committed consumer reads this now
            # The running member's local log start follows, and its store with it, within seconds.
            moved_at = time.monotonic()
            wait_until(lambda: {p: log.log_start_offset for p, log in materializer.logs.items()}
                       == expected_starts, 30, "the local log start offsets followed")
            wait_until(lambda: _exported(data_dir, topic) == expected, 15, "the store dropped the expired keys")
            assert time.monotonic() - moved_at < 20
            assert materializer.health.running and materializer.health.failed is None
            dropped = 100 + 60 - len(expected)
            assert materializer.stats.store_entries_expired == dropped
            assert _expired_metric(materializer) == dropped
            # It keeps following what comes after.
            if move == "retention":
                _set_configs(bootstrap, topic, {"retention.ms": "-1"})  # what comes now stays
            _produce(bootstrap, topic, [(1, KEYS[1][7], b"third")])
            expected[(1, KEYS[1][7])] = b"third"
            wait_until(lambda: _exported(data_dir, topic) == expected, 30, "a record after the drop applied")
        finally:
            background.stop()
    assert expected == _truth(bootstrap, topic)
    if not group:  # a group member that stopped serves nothing any more
        assert _exported(data_dir, topic) == expected
    assert _fresh_run(bootstrap, topic, tmp_path / "fresh", fetch) == expected
