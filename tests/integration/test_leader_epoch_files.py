"""Our ``leader-epoch-checkpoint`` and ``partition.metadata`` equal a real broker's, byte for byte.

A dedicated broker (its restarts must not disturb the session's) leads one topic; records are
produced, the broker is stopped and started twice (each restart of a single broker raises the
partition's leader epoch, see kafka-follower-semantics.md section 5) and more records are produced
after each start. A local ``Log`` opened with the topic id the AdminClient reports is then fed the
broker's own batches, read from its partition folder: both files must be byte-equal to the
broker's. Our readers parse the broker's files, and ``Log.open`` on a copy of the broker's folder
keeps its topic id and epochs and refuses another topic id.
"""

from __future__ import annotations

import shutil
import time
import uuid

import pytest
from confluent_kafka import TopicCollection
from confluent_kafka.admin import AdminClient, NewTopic

from materializer.local.kafka_broker import LocalKafkaBroker
from materializer.storage.errors import InconsistentTopicIdError
from materializer.storage.leader_epoch_cache import LEADER_EPOCH_CHECKPOINT_FILE, EpochEntry, LeaderEpochFileCache
from materializer.storage.log import Log
from materializer.storage.partition_metadata import PARTITION_METADATA_FILE, PartitionMetadataFile

from .test_read_broker_batches import produce, read_partition, sample_records

pytestmark = pytest.mark.broker

TOPIC = "epochs"
PARTITIONS = 2
_MASK64 = (1 << 64) - 1


def _wait_for_leaders(admin: AdminClient) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        topic = admin.list_topics(topic=TOPIC, timeout=5).topics.get(TOPIC)
        if topic is not None and topic.error is None and len(topic.partitions) == PARTITIONS \
                and all(p.leader >= 0 for p in topic.partitions.values()):
            return
        time.sleep(0.2)
    raise AssertionError(f"topic {TOPIC} has no leader 60 s after the broker started")


def _topic_id(admin: AdminClient) -> uuid.UUID:
    """The topic id as Metadata reports it (built from the two longs: librdkafka prints it with the
    standard base64 alphabet, Kafka with the URL-safe one)."""
    description = admin.describe_topics(TopicCollection([TOPIC]))[TOPIC].result(30)
    bits = description.topic_id
    return uuid.UUID(int=((bits.get_most_significant_bits() & _MASK64) << 64)
                     | (bits.get_least_significant_bits() & _MASK64))


def test_our_files_equal_the_brokers(tmp_path):
    broker = LocalKafkaBroker(tmp_path / "broker").start()
    try:
        bootstrap = broker.bootstrap_servers
        admin = AdminClient({"bootstrap.servers": bootstrap})
        admin.create_topics([NewTopic(TOPIC, num_partitions=PARTITIONS, replication_factor=1,
                                      config={"retention.ms": "-1"})])[TOPIC].result(30)
        _wait_for_leaders(admin)
        topic_id = _topic_id(admin)
        records = sample_records(600)
        # Small producer batches: many batches per epoch.
        produce(bootstrap, TOPIC, records[:200], **{"batch.num.messages": 25, "linger.ms": 0})
        for start in (200, 400):
            broker.stop()
            broker.start()
            _wait_for_leaders(AdminClient({"bootstrap.servers": broker.bootstrap_servers}))
            produce(broker.bootstrap_servers, TOPIC, records[start:start + 200],
                    **{"batch.num.messages": 25, "linger.ms": 0})
        assert _topic_id(AdminClient({"bootstrap.servers": broker.bootstrap_servers})) == topic_id
    finally:
        broker.stop()

    copies = tmp_path / "copies"
    for partition in range(PARTITIONS):
        broker_dir = broker.partition_dir(TOPIC, partition)
        broker_batches = read_partition(broker_dir)
        assert broker_batches, f"no batch in {broker_dir}"

        # (b) our readers parse the broker's files
        assert PartitionMetadataFile(broker_dir).read() == topic_id
        broker_entries = LeaderEpochFileCache(broker_dir / LEADER_EPOCH_CHECKPOINT_FILE).entries()
        batch_epochs = [batch.partition_leader_epoch for _, _, batch in broker_batches]
        assert len(broker_entries) == 3, broker_entries  # epoch 0, then one epoch per restart
        assert [e.epoch for e in broker_entries] == sorted(set(batch_epochs))
        first_batch_of = {}
        for _, _, batch in broker_batches:
            first_batch_of.setdefault(batch.partition_leader_epoch, batch.base_offset)
        assert broker_entries == [EpochEntry(epoch, first_batch_of[epoch]) for epoch in sorted(first_batch_of)]

        # (a) a local log fed the broker's batches writes the broker's bytes
        local_dir = tmp_path / "local" / f"{TOPIC}-{partition}"
        with Log.open(local_dir, topic_id=topic_id) as log:
            for _, _, batch in broker_batches:
                log.append_batch(batch)
            assert log.leader_epoch_cache.entries() == broker_entries
        for name in (LEADER_EPOCH_CHECKPOINT_FILE, PARTITION_METADATA_FILE):
            assert (local_dir / name).read_bytes() == (broker_dir / name).read_bytes(), name

        # the broker's folder opened as a local log keeps its identity and epochs
        copy = copies / broker_dir.name
        shutil.copytree(broker_dir, copy)
        with Log.open(copy, topic_id=topic_id, had_clean_shutdown=False) as log:
            assert log.topic_id == topic_id and log.leader_epoch_cache.entries() == broker_entries
            assert log.log_end_offset == broker_batches[-1][2].next_offset
        with pytest.raises(InconsistentTopicIdError):
            Log.open(copy, topic_id=uuid.uuid4())
