"""What a plain confluent-kafka consumer reads from the broker: the reference the broker tests compare with."""

from __future__ import annotations

from typing import Mapping

from materializer.testing.compaction_oracle import read_topic_records
from materializer.storage.record_batch import Record

__all__ = ["latest_per_key", "read_topic"]


#: Moved to the public oracle module; kept under its old name for the tests importing it.
read_topic = read_topic_records


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
