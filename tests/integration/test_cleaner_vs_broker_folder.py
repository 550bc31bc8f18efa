"""Differential test on the broker's own files: our cleaner on a copy of a broker partition folder.

1. A compacted topic with 4 KiB segments (``internal.segment.bytes``), a low dirty ratio and a
   one-hour ``min.compaction.lag.ms`` (so the broker does not clean yet) receives updates,
   tombstones and headers from idempotent producers (uncompressed and lz4).
2. The broker's partition folder is copied as it is into a
   :class:`~materializer.testing.compaction_oracle.CompactionOracle`: this is our local log.
3. ``min.compaction.lag.ms`` is lowered to 0 (IncrementalAlterConfigs); the oracle waits until the
   broker's ``cleaner-offset-checkpoint`` reaches the active segment.
4. Our copy is cleaned with ``first_uncleanable_offset`` = the broker's checkpoint. Below it:
   every record (offset, timestamp, key, value, headers) equals what a consumer reads from the
   broker; the batch layout (offset ranges, counts, producer fields, control and delete-horizon
   flags, codec) and the segment file names equal the broker's; uncompressed batches without a
   delete horizon are byte-identical (horizons embed each cleaner's wall clock).

Same input layout as the broker, so this checks the cleaner itself; the materializer's
end-to-end comparison (rebuilt batches) is ``test_compaction_vs_broker.py``. The broker is
Kafka 4.3.x, so the 4.0-4.3 empty-batch rule is used (``empty_batch_upper_bound="round"``).
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource

from materializer.testing.compaction_oracle import CompactionOracle, diff_records
from materializer.storage.log_config import LogConfig
from materializer.storage.record_batch import Record, iter_batches

pytestmark = pytest.mark.broker

SEGMENT_BYTES = 4096
KEYS = 60


def _produce(bootstrap: str, topic: str, start: int, count: int, **config: object) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5,
                         "enable.idempotence": True, "batch.num.messages": 7, **config})
    now = int(time.time() * 1000)
    errors: list[object] = []

    def on_delivery(err, _msg):
        if err is not None:
            errors.append(err)

    for i in range(start, start + count):
        key = b"key-%03d" % (i * 7 % KEYS)
        value = None if i % 11 == 3 else b"value-%05d-" % i + b"x" * (i % 50)
        headers = [("h", b"%d" % i), ("null", None)] if i % 4 == 0 else None
        producer.produce(topic, key=key, value=value, headers=headers, timestamp=now - 5000 + i,
                         on_delivery=on_delivery)
        if i % 50 == 0:
            producer.flush(30)
    assert producer.flush(30) == 0 and not errors, errors


def _consume(bootstrap: str, topic: str, end_offset: int) -> list[tuple]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"diff-{topic}", "enable.auto.commit": False,
                         "auto.offset.reset": "earliest", "isolation.level": "read_uncommitted"})
    try:
        _, high = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
        consumer.assign([TopicPartition(topic, 0, 0)])
        out: list[tuple] = []
        deadline = time.monotonic() + 60
        last = -1
        while last < high - 1 and time.monotonic() < deadline:
            msg = consumer.poll(1.0)
            if msg is None or msg.error():
                continue
            last = msg.offset()
            if last < end_offset:
                headers = tuple((k, v) for k, v in (msg.headers() or []))
                out.append((last, msg.timestamp()[1], msg.key(), msg.value(), headers))
        assert last >= high - 1, f"consumed up to {last}, high watermark {high}"
        return out
    finally:
        consumer.close()


def _batch_layout(paths: list[Path], end_offset: int) -> list[tuple]:
    return [(b.base_offset, b.last_offset, b.records_count, b.producer_id, b.producer_epoch, b.base_sequence,
             b.is_control_batch, b.has_delete_horizon, int(b.compression_type))
            for path in paths for _, b in iter_batches(path.read_bytes(), path=str(path)) if b.last_offset < end_offset]


def _plain_batches(paths: list[Path], end_offset: int) -> list[bytes]:
    return [bytes(b.buffer) for path in paths for _, b in iter_batches(path.read_bytes())
            if b.last_offset < end_offset and not b.has_delete_horizon and int(b.compression_type) == 0]


def test_cleaner_on_copied_broker_folder_matches_broker(kafka_broker, kafka_admin, create_topic,
                                                        kafka_materializer_compaction, tmp_path):
    topic = create_topic(config={
        "cleanup.policy": "compact",
        "internal.segment.bytes": str(SEGMENT_BYTES),
        "min.cleanable.dirty.ratio": "0.01",
        "min.compaction.lag.ms": "3600000",
        "delete.retention.ms": "86400000",
    })
    bootstrap = kafka_broker.bootstrap_servers
    _produce(bootstrap, topic, 0, 400)
    _produce(bootstrap, topic, 400, 400, **{"compression.type": "lz4"})
    _produce(bootstrap, topic, 800, 200)

    broker_dir = kafka_broker.partition_dir(topic, 0)
    assert len(list(broker_dir.glob("*.log"))) > 5
    config = LogConfig(cleanup_policy=("compact",), segment_bytes=SEGMENT_BYTES, min_cleanable_dirty_ratio=0.01,
                       delete_retention_ms=86400000, file_delete_delay_ms=0)
    oracle = CompactionOracle.from_partition_dir(broker_dir, config, directory=tmp_path / "data")

    resource = ConfigResource("topic", topic, incremental_configs=[
        ConfigEntry("min.compaction.lag.ms", "0", incremental_operation=AlterConfigOpType.SET)])
    for future in kafka_admin.incremental_alter_configs([resource]).values():
        future.result(timeout=30)

    (broker_checkpoint,) = kafka_materializer_compaction.wait_for_broker_compaction(
        topic, 90, partitions=[0]).values()
    assert broker_checkpoint > 0, "the broker's cleaner did not clean the partition"
    time.sleep(1.0)  # let the broker finish deleting the replaced segments
    broker_dir = kafka_broker.partition_dir(topic, 0)  # a fresh copy for a container broker

    result = oracle.clean(broker_checkpoint)
    assert result.end_offset == broker_checkpoint
    log = oracle.log

    ours = [(r.offset, r.timestamp, r.key, r.value, r.headers)
            for b in log.read_batches() if not b.is_control_batch for r in b.records() if r.offset < broker_checkpoint]
    theirs = _consume(bootstrap, topic, broker_checkpoint)
    assert KEYS <= len(ours) < broker_checkpoint // 2  # compaction removed most updates
    assert ours == theirs, diff_records([Record(*t) for t in theirs], [Record(*o) for o in ours])

    our_segments = [s.log_path for s in log.log_segments()]
    broker_segments = sorted(broker_dir.glob("*.log"))
    assert _batch_layout(our_segments, broker_checkpoint) == _batch_layout(broker_segments, broker_checkpoint)
    assert [p.name for p in broker_segments if int(p.stem) < broker_checkpoint] == \
        [p.name for p in our_segments if int(p.stem) < broker_checkpoint]
    ours_plain = _plain_batches(our_segments, broker_checkpoint)
    assert ours_plain == _plain_batches(broker_segments, broker_checkpoint) and len(ours_plain) >= 3
    oracle.close()
