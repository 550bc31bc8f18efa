"""Differential tests: our cleaner (``materializer compact``) against the broker's own LogCleaner.

Method (same for every test), through the public oracle
(:meth:`materializer.testing.compaction_oracle.BrokerCompaction.assert_compacted_like_broker`, fixture
``kafka_materializer_compaction``):

1. create a compacted topic with small segments (``internal.segment.bytes``, accepted as a topic
   config by Kafka 4.3.1), ``min.cleanable.dirty.ratio=0.01`` and ``min.compaction.lag.ms`` of a
   day, so that the broker cannot clean while we produce and mirror;
2. produce a workload, mirror the whole topic into a local data dir with the Materializer
   (broker offsets, ``read_committed``);
3. lower ``min.compaction.lag.ms`` to 0 (IncrementalAlterConfigs); the oracle waits until the
   broker's ``cleaner-offset-checkpoint`` reaches each partition's active segment base offset ``N``,
   runs ``compact --partition P --upto-offset N`` on the local copy and asserts that the local
   records below ``N`` (offset, timestamp, key, value, headers) equal what a ``read_committed``
   consumer reads from the broker below ``N``;
4. the tests add what the oracle does not know: our rounds cover the same dirty sections the
   broker logged, tombstones present or gone, aborted data removed.

The local log's batch boundaries differ from the broker's (the Materializer rebuilds batches),
which is fine: the cleaner's record-level result does not depend on them for these workloads
(keyed records, consecutive offsets). These tests run against the local broker and, in CI, once
more through Testcontainers (``--kafka-broker=testcontainers``): the container's log dir is read
through the Docker API.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from materializer.local.kafka_broker import TEST_BROKER_CONFIG, LocalKafkaBroker
from materializer.testing.compaction_oracle import BrokerCompaction, BrokerFilesOnDisk, diff_records
from materializer.storage.checkpoint import CLEANER_OFFSET_CHECKPOINT, read_offset_checkpoint
from materializer.storage.log import Log

from .compaction_workloads import (
    CODECS,
    HOLD_CLEANING_MS,
    Workload,
    alter_topic_configs,
    broker_cleaned_sections,
    consume_records,
    ingest,
    produce,
    produce_transactions,
)

pytestmark = pytest.mark.broker


def _topic_config(segment_bytes: int, **extra: str) -> dict[str, str]:
    return {
        "cleanup.policy": "compact",
        "internal.segment.bytes": str(segment_bytes),
        "min.cleanable.dirty.ratio": "0.01",
        "min.compaction.lag.ms": str(HOLD_CLEANING_MS),
        **extra,
    }


def test_updates_tombstones_headers_every_codec(kafka_broker, kafka_admin, create_topic,
                                                kafka_materializer_compaction, tmp_path: Path) -> None:
    bootstrap = kafka_broker.bootstrap_servers
    workload = Workload(records_per_partition=600, keys=60, value_bytes=60, tombstone_ratio=0.1, header_ratio=0.4)
    topics = {}
    for codec in CODECS:
        topic = create_topic(f"cmp-{codec}-{time.time_ns() % 10**9}", 2, _topic_config(8192))
        produce(bootstrap, topic, [0, 1], workload, codec=codec)
        topics[codec] = topic
    for codec, topic in topics.items():
        ingest(bootstrap, topic, tmp_path / "data", compression=codec, max_batch_bytes=2048)
    for topic in topics.values():
        alter_topic_configs(kafka_admin, topic, {"min.compaction.lag.ms": "0"}, settle_s=0)
    for topic in topics.values():
        compared = kafka_materializer_compaction.assert_compacted_like_broker(topic, tmp_path / "data")
        for partition, result in compared.items():
            upto, records = result.upto_offset, result.records
            assert upto > 0, f"{topic}-{partition}: the broker rolled no segment"
            assert len(records) < upto, f"{topic}-{partition}: the broker removed nothing below {upto}"
            assert any(r.value is None for r in records), "latest tombstones survive their first round"
            assert any(r.headers for r in records)
            assert result.local_rounds == [(0, upto)]
            if kafka_broker.cleaner_log is not None:  # a local broker's or a container's (not an external one's)
                assert _broker_sections_up_to(kafka_broker, topic, partition, upto) == [(0, upto)]
    checkpoint = read_offset_checkpoint(tmp_path / "data" / CLEANER_OFFSET_CHECKPOINT)
    assert len(checkpoint) == 2 * len(CODECS)


def _broker_sections_up_to(broker, topic: str, partition: int, upto: int,
                           timeout_s: float = 30.0) -> list[tuple[int, int]]:
    """The dirty sections the broker's LogCleaner logged for ``topic``-``partition`` ("cleaned log
    ... (dirty section = [a, b])"), once one ends at ``upto`` or more (the line may land after the
    cleaner-offset-checkpoint the oracle waited for), or what was logged after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        sections = broker_cleaned_sections(broker.cleaner_log, topic, partition)
        if any(end >= upto for _, end in sections) or time.monotonic() >= deadline:
            return sections
        time.sleep(0.2)


@pytest.mark.parametrize("fetch", ["replica", "consumer"])
def test_committed_and_aborted_transactions(kafka_broker, kafka_admin, create_topic, kafka_materializer_compaction,
                                            tmp_path: Path, fetch: str) -> None:
    """On the replica path the local log holds the broker's aborted data and markers, so the local
    cleaner's transaction rules (aborted batches removed, markers kept until their delete horizon)
    run on real markers; on the consumer path read_committed removed them before the log."""
    bootstrap = kafka_broker.bootstrap_servers
    topic = create_topic(f"cmp-txn-{time.time_ns() % 10**9}", 2, _topic_config(4096))
    counts = produce_transactions(bootstrap, topic, [0, 1], transactions=12, records_per_transaction=16, keys=40,
                                  codec="lz4")
    assert counts["aborted"] > 0 and counts["committed"] > 0
    data_dir = tmp_path / "data"
    if fetch == "replica":
        ingest(bootstrap, topic, data_dir, fetch="replica")
        for partition in (0, 1):
            with Log.open(data_dir / f"{topic}-{partition}") as log:
                aborted = len(log.collect_aborted_transactions(0, log.log_end_offset))
                assert aborted > 0, "the broker's aborted transactions reach the local log before cleaning"
    else:
        ingest(bootstrap, topic, data_dir, compression="gzip", max_batch_bytes=1024)
    alter_topic_configs(kafka_admin, topic, {"min.compaction.lag.ms": "0"}, settle_s=0)
    compared = kafka_materializer_compaction.assert_compacted_like_broker(topic, data_dir)
    for partition, result in compared.items():
        # the broker's cleaner removed the aborted records below the checkpoint
        uncommitted = consume_records(bootstrap, topic, partition, result.upto_offset,
                                      isolation_level="read_uncommitted")
        problem = diff_records(result.records, uncommitted, left="read_committed", right="read_uncommitted")
        assert problem is None, f"aborted data left below {result.upto_offset}:\n{problem}"
        # ... and so did ours: every data record left in the local log below it is the broker's
        with Log.open(data_dir / f"{topic}-{partition}") as log:
            local = [r for r in log.read_records(0, result.upto_offset)]
        problem = diff_records(local, uncommitted, left="local log (aborted data included)", right="broker")
        assert problem is None, f"local cleaner left aborted data below {result.upto_offset}:\n{problem}"


def test_tombstones_gone_after_delete_retention_and_a_later_round(kafka_broker, kafka_admin, create_topic,
                                                                   kafka_materializer_compaction, tmp_path: Path) -> None:
    bootstrap = kafka_broker.bootstrap_servers
    delete_retention_ms = 1500
    topic = create_topic(f"cmp-tomb-{time.time_ns() % 10**9}", 2,
                         _topic_config(4096, **{"delete.retention.ms": str(delete_retention_ms)}))
    data_dir = tmp_path / "data"
    produce(bootstrap, topic, [0, 1], Workload(records_per_partition=400, keys=50, tombstone_ratio=0.25, seed=3))
    ingest(bootstrap, topic, data_dir, compression="snappy", max_batch_bytes=1024)
    alter_topic_configs(kafka_admin, topic, {"min.compaction.lag.ms": "0"}, settle_s=0)
    first = {p: r.upto_offset for p, r in kafka_materializer_compaction.assert_compacted_like_broker(
        topic, data_dir).items()}
    for partition, upto in first.items():
        records = consume_records(bootstrap, topic, partition, upto)
        assert any(r.value is None for r in records)
    first_round_done = time.monotonic()

    # second phase: hold the broker's cleaner again, produce more, mirror it, let the horizon pass
    alter_topic_configs(kafka_admin, topic, {"min.compaction.lag.ms": str(HOLD_CLEANING_MS)})
    # updates only keys 0..19: the first phase's tombstones of keys 20..49 stay the latest records
    produce(bootstrap, topic, [0, 1], Workload(records_per_partition=200, keys=20, tombstone_ratio=0.1, seed=4))
    ingest(bootstrap, topic, data_dir, compression="snappy", max_batch_bytes=1024)
    time.sleep(max(0.0, delete_retention_ms / 1000 + 0.5 - (time.monotonic() - first_round_done)))
    alter_topic_configs(kafka_admin, topic, {"min.compaction.lag.ms": "0"}, settle_s=0)
    second = kafka_materializer_compaction.assert_compacted_like_broker(topic, data_dir)
    for partition, result in second.items():
        upto, records = result.upto_offset, result.records
        assert upto > first[partition]
        assert result.local_rounds == [(first[partition], upto)]
        old = [r for r in records if r.offset < first[partition]]
        assert len(old) >= 10, f"{topic}-{partition}: too few first-phase records left to check"
        assert all(r.value is not None for r in old), "tombstones of the first round must be gone"
        assert any(r.value is None for r in records if r.offset >= first[partition])


def test_more_keys_than_the_offset_map_holds(tmp_path: Path) -> None:
    """A dedicated broker with about the smallest dedupe buffer Kafka accepts (``KafkaConfig.validateValues``
    requires ``dedupe.buffer.size / threads > 1 MiB``): 1,048,600 bytes = 43,691 slots, 39,321 keys per round.

    With ~95,000 distinct keys in the dirty section the broker needs three rounds to reach its
    active segment, each ending where the map filled (mid-segment); ``materializer compact
    --dedupe-buffer-size 1048600`` must run the same rounds (same dirty sections) and keep the
    same records.
    """
    dedupe_bytes = 1024 * 1024 + 24
    config = {**TEST_BROKER_CONFIG, "log.cleaner.dedupe.buffer.size": str(dedupe_bytes)}
    with LocalKafkaBroker(tmp_path / "broker", extra_config=config) as broker:
        bootstrap = broker.bootstrap_servers
        admin = AdminClient({"bootstrap.servers": bootstrap})
        topic = "cmp-bigmap"
        admin.create_topics([NewTopic(topic, 1, 1, config=_topic_config(256 * 1024))])[topic].result(30)
        while not (broker.partition_dir(topic, 0) / "00000000000000000000.log").exists():
            time.sleep(0.05)
        produce(bootstrap, topic, [0], Workload(records_per_partition=100_000, keys=1_000_000, value_bytes=8,
                                                tombstone_ratio=0.02, header_ratio=0.05, batch_records=500, seed=5),
                codec="zstd")
        data_dir = tmp_path / "data"
        ingest(bootstrap, topic, data_dir, compression="zstd", max_batch_bytes=16384)
        alter_topic_configs(admin, topic, {"min.compaction.lag.ms": "0"}, settle_s=0)
        oracle = BrokerCompaction(BrokerFilesOnDisk(bootstrap, broker.log_dirs))
        (result,) = oracle.assert_compacted_like_broker(topic, data_dir, partitions=[0], timeout_s=90,
                                                        dedupe_buffer_size_bytes=dedupe_bytes).values()
        local_sections = result.local_rounds
        assert len(local_sections) >= 3, local_sections
        broker_sections = broker_cleaned_sections(broker.cleaner_log, topic, 0)
        print(f"dirty sections: broker {broker_sections}, local {local_sections}")
        assert broker_sections == local_sections
