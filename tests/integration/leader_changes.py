"""Test helpers that change what a real broker holds behind a materializer's back, as an operator
or a failure would: a leader that lost the tail of its log, a topic deleted and re-created."""

from __future__ import annotations

import time
from pathlib import Path

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from materializer.local.kafka_broker import LocalKafkaBroker
from materializer.storage.leader_epoch_cache import LEADER_EPOCH_CHECKPOINT_FILE, LeaderEpochCheckpointFile
from materializer.storage.record_batch import iter_batches

__all__ = ["create_topic", "cut_leader_tail", "delete_topic", "leader_epochs", "produce_keys"]


def _admin(bootstrap: str) -> AdminClient:
    # An admin client is a producer-type handle, whose metadata requests for one named topic would
    # auto-create it on a broker with auto.create.topics.enable (the default): list all topics instead.
    return AdminClient({"bootstrap.servers": bootstrap, "allow.auto.create.topics": False})


def create_topic(bootstrap: str, topic: str, partitions: int, config: dict[str, str] | None = None,
                 timeout_s: float = 30.0) -> None:
    """Create ``topic`` and wait until every partition has a leader."""
    admin = _admin(bootstrap)
    deadline = time.monotonic() + timeout_s
    while True:  # a topic just deleted may still be marked for deletion for a moment
        try:
            admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1,
                                          config=config or {"cleanup.policy": "compact"})])[topic].result(timeout_s)
            break
        except Exception as exc:  # noqa: BLE001 - TOPIC_ALREADY_EXISTS while the deletion completes
            if "already exists" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    while time.monotonic() < deadline:
        metadata = admin.list_topics(timeout=5).topics.get(topic)
        if metadata is not None and metadata.error is None and len(metadata.partitions) == partitions \
                and all(p.leader >= 0 for p in metadata.partitions.values()):
            return
        time.sleep(0.1)
    raise AssertionError(f"topic {topic} has no leaders after {timeout_s} s")


def delete_topic(bootstrap: str, topic: str, timeout_s: float = 30.0) -> None:
    """Delete ``topic`` and wait until the metadata no longer has it."""
    admin = _admin(bootstrap)
    admin.delete_topics([topic])[topic].result(timeout_s)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if topic not in admin.list_topics(timeout=5).topics:
            return
        time.sleep(0.1)
    raise AssertionError(f"topic {topic} still in the metadata {timeout_s} s after its deletion")


def produce_keys(bootstrap: str, topic: str, prefix: str, count: int, *, partitions: int = 1,
                 tombstone_every: int = 0, batch: int = 1) -> None:
    """Produce ``count`` records with unique keys ``<prefix><i>`` (partition ``i % partitions``),
    ``batch`` records per producer batch (each flushed), every ``tombstone_every``-th a tombstone
    of an earlier key; acks=all, idempotent."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0 if batch == 1 else 50, "acks": "all",
                         "enable.idempotence": True})
    for i in range(count):
        key = f"{prefix}{i}".encode()
        value = f"{prefix}-value-{i}".encode()
        if tombstone_every and i and i % tombstone_every == 0:
            key, value = f"{prefix}{i - 1}".encode(), None
        producer.produce(topic, key=key, value=value, partition=i % partitions)
        if (i + 1) % batch == 0:
            producer.flush(30)
    assert producer.flush(30) == 0


def leader_epochs(broker: LocalKafkaBroker, topic: str, partition: int) -> list[tuple[int, int]]:
    """The broker's ``leader-epoch-checkpoint`` of one partition: ``[(epoch, start offset)]``."""
    path = broker.partition_dir(topic, partition) / LEADER_EPOCH_CHECKPOINT_FILE
    return [tuple(entry) for entry in LeaderEpochCheckpointFile(path).read()]


def cut_leader_tail(broker: LocalKafkaBroker, topic: str, partition: int, keep_batches: int) -> int:
    """With the broker STOPPED: cut the partition's last segment after its first ``keep_batches``
    batches (a batch boundary, as an unclean leader election or a lost unflushed tail leaves the
    log), delete its offset and time indexes (the broker rebuilds them). Returns the new log end
    offset (the base offset of the first batch cut)."""
    folder = broker.partition_dir(topic, partition)
    segment = sorted(folder.glob("*.log"))[-1]
    batches = list(iter_batches(segment.read_bytes()))
    if keep_batches >= len(batches):
        raise ValueError(f"{segment} has {len(batches)} batches; nothing to cut after {keep_batches}")
    position, first_cut = batches[keep_batches]
    with open(segment, "r+b") as f:
        f.truncate(position)
    for suffix in (".index", ".timeindex"):
        Path(str(segment)[:-len(".log")] + suffix).unlink(missing_ok=True)
    return first_cut.base_offset
