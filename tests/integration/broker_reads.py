"""What a plain confluent-kafka consumer reads from the broker: the reference the broker tests compare with."""

from __future__ import annotations

import time
from typing import Iterable, Mapping

from confluent_kafka import Consumer, KafkaError, TopicPartition

from materializer.storage.record_batch import Record

__all__ = ["latest_per_key", "read_topic"]


def read_topic(bootstrap: str, topic: str, partitions: int | Iterable[int], *,
               isolation_level: str = "read_committed", end_offsets: Mapping[int, int] | None = None,
               timeout_s: float = 60.0) -> dict[int, list[tuple[Record, int]]]:
    """Read ``partitions`` (a count or the partition numbers) from offset 0 to their end, or to
    ``end_offsets[p]`` (exclusive), with a consumer in no group.

    Returns partition -> [(Record, confluent-kafka timestamp type)] in offset order.

    Raises:
        AssertionError: a fetch error, or a partition not read to its end within ``timeout_s``.
    """
    wanted = list(range(partitions)) if isinstance(partitions, int) else list(partitions)
    end_offsets = dict(end_offsets or {})
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"{topic}-reference-reader",
                         "enable.auto.commit": False, "enable.partition.eof": True,
                         "isolation.level": isolation_level})
    consumer.assign([TopicPartition(topic, p, 0) for p in wanted])
    out: dict[int, list[tuple[Record, int]]] = {p: [] for p in wanted}
    done: set[int] = set()
    deadline = time.monotonic() + timeout_s
    try:
        while len(done) < len(wanted) and time.monotonic() < deadline:
            for msg in consumer.consume(1000, timeout=0.5):
                partition = msg.partition()
                if msg.error():
                    assert msg.error().code() == KafkaError._PARTITION_EOF, msg.error()
                    done.add(partition)
                    continue
                if partition in done or msg.offset() >= end_offsets.get(partition, msg.offset() + 1):
                    done.add(partition)
                    continue
                ts_type, ts = msg.timestamp()
                out[partition].append((Record(msg.offset(), ts, msg.key(), msg.value(),
                                              tuple(msg.headers() or ())), ts_type))
    finally:
        consumer.close()
    assert len(done) == len(wanted), f"the consumer did not read {topic} {sorted(set(wanted) - done)} to the end"
    return out


def latest_per_key(records: Mapping[int, list[tuple[Record, int]]]) -> dict[bytes, tuple[int, int, bytes]]:
    """key -> (partition, offset, value) of its latest record; a tombstone removes the key."""
    latest: dict[bytes, tuple[int, int, bytes]] = {}
    for partition, rows in records.items():
        for record, _ in rows:
            if record.value is None:
                latest.pop(record.key, None)
            else:
                latest[record.key] = (partition, record.offset, record.value)
    return latest


def latest_per_partition_key(records: Mapping[int, list[tuple[Record, int]]]) -> dict[tuple[int, bytes], bytes]:
    """(partition, key) -> value of its latest record, partitions kept apart as Kafka compacts them;
    a tombstone removes the entry of its own partition only."""
    latest: dict[tuple[int, bytes], bytes] = {}
    for partition, rows in records.items():
        for record, _ in rows:
            if record.value is None:
                latest.pop((partition, record.key), None)
            else:
                latest[(partition, record.key)] = record.value
    return latest
