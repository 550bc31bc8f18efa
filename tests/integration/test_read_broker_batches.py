"""Our v2 codec reads the bytes a real Apache Kafka broker keeps in its ``.log`` files.

Records are produced with confluent_kafka (librdkafka) and read back from the broker's own
partition folder with :func:`iter_batches` / :meth:`RecordBatch.records`, for every codec,
both as the producer compressed them (``compression.type=producer``) and as the broker's Java
codecs recompressed them (topic ``compression.type=<codec>``: xerial snappy,
KafkaLZ4BlockOutputStream frames, ...). DumpLogSegments then cross-checks offsets, sizes and
CRCs batch by batch.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
from confluent_kafka import Producer

from materializer.local.kafka_broker import DUMP_LOG_SEGMENTS_CLASS
from materializer.storage.compression import LZ4_MAGIC, XERIAL_SNAPPY_MAGIC, CompressionType
from materializer.storage.control_record import (
    ControlRecordType,
    decode_end_txn_marker,
    parse_control_record_type,
)
from materializer.storage.record_batch import RECORDS_OFFSET, RecordBatch, TimestampType, iter_batches

pytestmark = pytest.mark.broker

CODECS = ["none", "gzip", "snappy", "lz4", "zstd"]
# Recent timestamps: the test broker checks retention every second, and record timestamps
# older than retention.ms would get the segments deleted under our feet.
BASE_TIMESTAMP_MS = int(time.time() * 1000) - 60_000
KEEP = {"retention.ms": "-1"}

Produced = tuple[bytes | None, bytes | None, tuple[tuple[str, bytes | None], ...], int]


def sample_records(count: int) -> list[Produced]:
    records: list[Produced] = []
    for i in range(count):
        key = None if i % 17 == 5 else b"key-%d" % (i % 40)
        value = None if i % 13 == 7 else (b"value-%06d-" % i) + b"abcdefgh" * (i % 30)
        headers: tuple[tuple[str, bytes | None], ...] = ()
        if i % 5 == 0:
            headers = (("trace", b"t-%d" % i), ("empty", b""), ("null", None))
        records.append((key, value, headers, BASE_TIMESTAMP_MS + i * 7))
    return records


def produce(bootstrap: str, topic: str, records: list[Produced], **config: object) -> list[int]:
    """Produce in order, return each record's offset (delivery reports)."""
    offsets: list[int | None] = [None] * len(records)
    errors: list[object] = []

    def on_delivery(index: int):
        def callback(err: object, msg: object) -> None:
            if err is not None:
                errors.append(err)
            else:
                offsets[index] = msg.offset()  # type: ignore[attr-defined]

        return callback

    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 50,
                         "enable.idempotence": True, **config})
    for index, (key, value, headers, timestamp) in enumerate(records):
        producer.produce(topic, key=key, value=value, headers=list(headers) or None,
                         timestamp=timestamp, on_delivery=on_delivery(index))
    remaining = producer.flush(30)
    assert remaining == 0 and not errors, f"undelivered={remaining} errors={errors}"
    return offsets  # type: ignore[return-value]


def read_partition(partition_dir: Path) -> list[tuple[Path, int, RecordBatch]]:
    """Every batch of every segment, CRC-checked, in offset order."""
    found = []
    for log_path in sorted(partition_dir.glob("*.log")):
        data = log_path.read_bytes()
        consumed = 0
        for position, batch in iter_batches(data, path=str(log_path)):
            batch.ensure_valid()
            found.append((log_path, position, batch))
            consumed = position + batch.size_in_bytes
        assert consumed == len(data), f"{log_path}: {len(data) - consumed} bytes after the last batch"
    return found


def assert_records_match(batches: list[tuple[Path, int, RecordBatch]], records: list[Produced],
                         offsets: list[int], *, log_append_time: bool = False) -> None:
    read = [r for _, _, batch in batches if not batch.is_control_batch for r in batch.records()]
    assert [r.offset for r in read] == offsets
    for record, (key, value, headers, timestamp) in zip(read, records):
        assert (record.key, record.value, record.headers) == (key, value, headers)
        if not log_append_time:
            assert record.timestamp == timestamp


@pytest.mark.parametrize("codec", CODECS)
def test_read_producer_compressed_batches(kafka_broker, create_topic, codec: str) -> None:
    """librdkafka compresses, the broker stores the producer's bytes as they came."""
    topic = create_topic(f"read-producer-{codec}-{time.time_ns()}", config={"compression.type": "producer", **KEEP})
    records = sample_records(400)
    offsets = produce(kafka_broker.bootstrap_servers, topic, records, **{"compression.type": codec})
    batches = read_partition(kafka_broker.partition_dir(topic, 0))
    assert {b.compression_type for _, _, b in batches} == {CompressionType.from_name(codec)}
    assert all(b.producer_id >= 0 and b.base_sequence >= 0 for _, _, b in batches)  # idempotent
    assert_records_match(batches, records, offsets)


def test_read_broker_recompressed_batches(kafka_broker, create_topic) -> None:
    """The broker's own Java codecs (xerial snappy, KafkaLZ4 frames, ...) write the batches;
    DumpLogSegments agrees with us on every batch's offsets, position, size and CRC."""
    records = sample_records(300)
    log_files: list[Path] = []
    ours: dict[tuple[str, int], RecordBatch] = {}
    for codec in CODECS:
        topic_codec = "uncompressed" if codec == "none" else codec  # the topic config's spelling
        topic = create_topic(f"read-broker-{codec}-{time.time_ns()}", config={"compression.type": topic_codec, **KEEP})
        offsets = produce(kafka_broker.bootstrap_servers, topic, records, **{"compression.type": "none"})
        batches = read_partition(kafka_broker.partition_dir(topic, 0))
        ctype = CompressionType.from_name(codec)
        assert {b.compression_type for _, _, b in batches} == {ctype}
        section = {bytes(b.buffer[RECORDS_OFFSET : RECORDS_OFFSET + 8]) for _, _, b in batches}
        if ctype == CompressionType.SNAPPY:  # Java's xerial SnappyOutputStream framing
            assert section == {XERIAL_SNAPPY_MAGIC}
        if ctype == CompressionType.LZ4:  # KafkaLZ4BlockOutputStream frame header
            assert {s[:6] for s in section} == {LZ4_MAGIC.to_bytes(4, "little") + b"\x60\x40"}
        assert_records_match(batches, records, offsets)
        for log_path, position, batch in batches:
            ours[(str(log_path), position)] = batch
        log_files.extend(sorted({p for p, _, _ in batches}))

    result = kafka_broker.run_tool(DUMP_LOG_SEGMENTS_CLASS, ["--files", ",".join(map(str, log_files))])
    assert result.returncode == 0, result.stderr
    current_file = None
    dumped = 0
    for line in result.stdout.splitlines():
        if line.startswith("Dumping "):
            current_file = line[len("Dumping "):].strip()
            continue
        if not line.startswith("baseOffset:"):
            continue
        fields = dict(re.findall(r"(\w+): (\S+)", line))
        batch = ours[(current_file, int(fields["position"]))]
        assert int(fields["baseOffset"]) == batch.base_offset
        assert int(fields["lastOffset"]) == batch.last_offset
        assert int(fields["count"]) == batch.records_count
        assert int(fields["size"]) == batch.size_in_bytes
        assert int(fields["crc"]) == batch.crc
        assert fields["compresscodec"].lower() == batch.compression_type.name_kafka
        assert fields["isvalid"] == "true"
        dumped += 1
    assert dumped == len(ours)


@pytest.mark.parametrize("codec", ["none", "zstd"])
def test_read_log_append_time_batches(kafka_broker, create_topic, codec: str) -> None:
    topic = create_topic(f"read-lat-{codec}-{time.time_ns()}",
                         config={"message.timestamp.type": "LogAppendTime", "compression.type": "producer", **KEEP})
    records = sample_records(120)
    before_ms = int(time.time() * 1000)
    offsets = produce(kafka_broker.bootstrap_servers, topic, records, **{"compression.type": codec})
    after_ms = int(time.time() * 1000)
    batches = read_partition(kafka_broker.partition_dir(topic, 0))
    assert_records_match(batches, records, offsets, log_append_time=True)
    for _, _, batch in batches:
        assert batch.timestamp_type is TimestampType.LOG_APPEND_TIME
        assert before_ms - 1000 <= batch.max_timestamp <= after_ms + 1000
        assert {r.timestamp for r in batch.records()} == {batch.max_timestamp}


def test_read_transactional_batches_and_markers(kafka_broker, create_topic) -> None:
    topic = create_topic(f"read-txn-{time.time_ns()}", config=KEEP)
    producer = Producer({"bootstrap.servers": kafka_broker.bootstrap_servers,
                         "transactional.id": f"txn-{topic}", "linger.ms": 5, "compression.type": "lz4"})
    producer.init_transactions(30)
    producer.begin_transaction()
    for i in range(3):
        producer.produce(topic, key=b"c%d" % i, value=b"committed", timestamp=BASE_TIMESTAMP_MS + i)
    producer.commit_transaction(30)
    producer.begin_transaction()
    for i in range(2):
        producer.produce(topic, key=b"a%d" % i, value=b"aborted", timestamp=BASE_TIMESTAMP_MS + i)
    producer.flush(30)
    producer.abort_transaction(30)

    # markers are written asynchronously by the transaction coordinator
    deadline = time.monotonic() + 30
    while True:
        batches = read_partition(kafka_broker.partition_dir(topic, 0))
        markers = [b for _, _, b in batches if b.is_control_batch]
        if len(markers) == 2 or time.monotonic() > deadline:
            break
        time.sleep(0.2)

    data = [b for _, _, b in batches if not b.is_control_batch]
    assert all(b.is_transactional for _, _, b in batches)
    assert [(r.key, r.value) for b in data for r in b.records()] == (
        [(b"c%d" % i, b"committed") for i in range(3)] + [(b"a%d" % i, b"aborted") for i in range(2)]
    )
    kinds = []
    for marker_batch in markers:
        assert marker_batch.producer_id == data[0].producer_id
        (record,) = marker_batch.records()
        kinds.append(parse_control_record_type(record.key))
        assert decode_end_txn_marker(record.key, record.value).coordinator_epoch >= 0
    assert kinds == [ControlRecordType.COMMIT, ControlRecordType.ABORT]


def test_kafka_reads_batches_we_build(kafka_broker, tmp_path: Path) -> None:
    """The other direction: Java Kafka's readers (DumpLogSegments --deep-iteration, i.e.
    KafkaLZ4BlockInputStream, xerial SnappyInputStream, ...) decode what our builder writes.
    Each batch holds > 64 KiB of records, so lz4 and snappy write several blocks."""
    from materializer.storage.control_record import encode_end_txn_marker
    from materializer.storage.record_batch import BatchHeaderFields
    from materializer.storage.record_batch_builder import RecordBatchBuilder, build_empty_batch

    expected: dict[int, tuple[str, int, bytes, bytes | None]] = {}
    parts: list[bytes] = []
    base = 0
    variants = [dict(compression=CompressionType.from_name(c)) for c in CODECS] + [
        dict(compression=CompressionType.LZ4, timestamp_type=TimestampType.LOG_APPEND_TIME,
             log_append_time_ms=BASE_TIMESTAMP_MS + 999),
        dict(compression=CompressionType.SNAPPY, delete_horizon_ms=BASE_TIMESTAMP_MS + 86_400_000),
    ]
    for options in variants:
        builder = RecordBatchBuilder(base, **options)
        for i in range(700):
            offset = base + i * 2  # offset gaps inside the batch
            key = b"k-%d" % offset
            value = None if i % 50 == 3 else b"v-%d-" % offset + b"0123456789abcdef" * 6
            timestamp = BASE_TIMESTAMP_MS + i
            builder.append(offset, timestamp, key, value, [("h", b"x"), ("n", None)])
            if options.get("timestamp_type") == TimestampType.LOG_APPEND_TIME:
                expected[offset] = ("LogAppendTime", BASE_TIMESTAMP_MS + 999, key, value)
            else:
                expected[offset] = ("CreateTime", timestamp, key, value)
        parts.append(builder.build())
        base += 2000
    key, value = encode_end_txn_marker(ControlRecordType.COMMIT, 3)
    marker = RecordBatchBuilder(base, producer_id=9, producer_epoch=1, is_transactional=True, is_control_batch=True)
    marker.append(base, BASE_TIMESTAMP_MS, key, value)
    parts.append(marker.build())
    parts.append(build_empty_batch(BatchHeaderFields(base + 1, last_offset_delta=4, max_timestamp=BASE_TIMESTAMP_MS,
                                                     producer_id=9, producer_epoch=1, base_sequence=10)))
    segment = tmp_path / "00000000000000000000.log"
    segment.write_bytes(b"".join(parts))

    result = kafka_broker.run_tool(DUMP_LOG_SEGMENTS_CLASS,
                                   ["--deep-iteration", "--print-data-log", "--files", str(segment)])
    assert result.returncode == 0, result.stderr
    batch_lines = [line for line in result.stdout.splitlines() if line.startswith("baseOffset:")]
    assert len(batch_lines) == len(parts)
    assert all("isvalid: true" in line for line in batch_lines)
    assert f"deleteHorizonMs: OptionalLong[{BASE_TIMESTAMP_MS + 86_400_000}]" in result.stdout
    assert "endTxnMarker: COMMIT coordinatorEpoch: 3" in result.stdout
    record_re = re.compile(r"\| offset: (\d+) (CreateTime|LogAppendTime): (-?\d+) keySize: -?\d+ valueSize: -?\d+ "
                           r"sequence: -?\d+ headerKeys: \[h,n\] key: (\S+)(?: payload: (\S+))?$")
    seen = {}
    for line in result.stdout.splitlines():
        match = record_re.match(line)
        if match:
            offset, ts_type, timestamp, key, payload = match.groups()
            seen[int(offset)] = (ts_type, int(timestamp), key.encode(), None if payload is None else payload.encode())
    assert seen == expected
