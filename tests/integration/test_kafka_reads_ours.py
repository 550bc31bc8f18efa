"""Kafka reads ours: segments written by our log engine pass Kafka's own DumpLogSegments.

Our ``Log`` writes a partition folder (small ``segment.bytes`` so it rolls; small
``index.interval.bytes`` so the indexes have entries): every codec, CreateTime and
LogAppendTime, offset gaps, an idempotent batch, a committed transaction with its COMMIT
marker, an empty batch from ``build_empty_batch`` and a batch carrying a delete horizon. Then
``org.apache.kafka.tools.DumpLogSegments`` (the broker helper's pinned Kafka) runs on the files:

* ``--deep-iteration --print-data-log`` on every ``.log``: exit 0, every batch
  ``isvalid: true``, no ``Found N invalid bytes``, the records we wrote, and output identical
  to our ``dump-log``;
* ``--verify-index-only`` on every ``.index``/``.timeindex``: none of the lines Kafka prints for
  a mismatch (``Mismatches in :``, ``Found timestamp mismatch in :``, ``Found out of order
  timestamp in :``, ``The following indexed offsets are not found in the log.``);
* ``--index-sanity-check`` on every index: ``<file> passed sanity check.`` (or, for an offset
  index with no entries, ``<file> is empty.``), exit 0 — the check a broker runs on startup.

No broker process is needed, only the Kafka jars (``kafka_broker.run_tool``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from materializer.local.kafka_broker import DUMP_LOG_SEGMENTS_CLASS
from materializer.cli.dump_log import dump_log
from materializer.offline.dump_log import parse_dump_output
from materializer.storage.compression import CompressionType
from materializer.storage.control_record import ControlRecordType, encode_end_txn_marker
from materializer.storage.log import Log
from materializer.storage.log_config import LogConfig
from materializer.storage.record_batch import BatchHeaderFields, Record, TimestampType
from materializer.storage.record_batch_builder import RecordBatchBuilder, build_empty_batch

pytestmark = pytest.mark.broker

T0 = 1_700_000_000_000
DELETE_HORIZON_MS = T0 + 86_400_000
RECORDS_PER_CODEC = 60
INDEX_MISMATCH_SIGNALS = (
    "Mismatches in :",
    "Found timestamp mismatch in :",
    "Found out of order timestamp in :",
    "The following indexed offsets are not found in the log.",
)


def _value(offset: int) -> bytes | None:
    return None if offset % 7 == 0 else f"value of offset {offset} ".encode() * 4


def _key(offset: int) -> bytes | None:
    return None if offset % 11 == 5 else f"key-{offset % 23}".encode()


def _write_log(dir_path: Path) -> dict[int, tuple[bytes | None, bytes | None]]:
    """Write the test log; returns offset -> (key, value) of every data record written."""
    written: dict[int, tuple[bytes | None, bytes | None]] = {}
    config = LogConfig(segment_bytes=4096, index_interval_bytes=256)
    log = Log.open(dir_path, config)
    try:
        offset = 0
        for timestamp_type in (TimestampType.CREATE_TIME, TimestampType.LOG_APPEND_TIME):
            for codec in CompressionType:
                records = []
                for _ in range(RECORDS_PER_CODEC):
                    headers = (("h", b"x"), ("n", None)) if offset % 5 == 0 else ()
                    records.append(Record(offset, T0 + offset, _key(offset), _value(offset), headers))
                    written[offset] = (_key(offset), _value(offset))
                    offset += 1 if offset % 9 else 3  # offset gaps, as after compaction
                log.append_records(records, compression=codec, timestamp_type=timestamp_type, max_batch_bytes=1500)
                offset += 10  # gap between codecs

        # idempotent and transactional batches, then the COMMIT marker
        builder = RecordBatchBuilder(offset, compression=CompressionType.ZSTD, producer_id=42, producer_epoch=3,
                                     base_sequence=0, is_transactional=True)
        for i in range(5):
            builder.append(offset + i, T0 + offset, _key(offset + i), _value(offset + i))
            written[offset + i] = (_key(offset + i), _value(offset + i))
        log.append_batch(builder.build())
        offset += 5
        marker = RecordBatchBuilder(offset, producer_id=42, producer_epoch=3, is_transactional=True,
                                    is_control_batch=True)
        marker.append(offset, T0 + offset, *encode_end_txn_marker(ControlRecordType.COMMIT, 7))
        log.append_batch(marker.build())
        offset += 1

        # an emptied batch kept for its producer state (as the cleaner writes it)
        log.append_batch(build_empty_batch(BatchHeaderFields(offset, last_offset_delta=4, max_timestamp=T0,
                                                             producer_id=43, producer_epoch=0, base_sequence=10)))
        offset += 5

        # a batch of tombstones whose delete horizon is set (KIP-534)
        builder = RecordBatchBuilder(offset, compression=CompressionType.LZ4, delete_horizon_ms=DELETE_HORIZON_MS)
        for i in (0, 2, 3):
            builder.append(offset + i, T0 + offset + i, f"gone-{i}".encode(), None)
            written[offset + i] = (f"gone-{i}".encode(), None)
        log.append_batch(builder.build())
    finally:
        log.close()
    return written


def _files(dir_path: Path, *suffixes: str) -> list[Path]:
    return sorted(p for p in dir_path.iterdir() if p.suffix in suffixes)


def _text(data: bytes | None) -> str | None:
    return None if data is None else data.decode("utf-8")


@pytest.fixture(scope="module")
def our_log(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[int, tuple[bytes | None, bytes | None]]]:
    dir_path = tmp_path_factory.mktemp("ours") / "ours-0"
    written = _write_log(dir_path)
    return dir_path, written


def test_dump_log_segments_reads_every_batch(kafka_broker: Any, our_log: tuple[Path, dict]) -> None:
    dir_path, written = our_log
    logs = _files(dir_path, ".log")
    assert len(logs) >= 3, "segment.bytes should have rolled the log"
    done = kafka_broker.run_tool(
        DUMP_LOG_SEGMENTS_CLASS, ["--deep-iteration", "--print-data-log", "--files", ",".join(map(str, logs))])
    assert done.returncode == 0, done.stderr
    assert "invalid bytes" not in done.stdout
    theirs = parse_dump_output(done.stdout)
    assert [f["file"] for f in theirs] == [str(p) for p in logs]

    batches = [b for f in theirs for b in f["batches"]]
    assert batches and all(b["isvalid"] for b in batches)
    assert all(f["invalidBytes"] == 0 for f in theirs)
    assert {b["compresscodec"] for b in batches} == {c.name_kafka for c in CompressionType}
    assert {b["timestampType"] for b in batches} == {"CreateTime", "LogAppendTime"}
    assert [b["deleteHorizonMs"] for b in batches if b["deleteHorizonMs"] is not None] == [DELETE_HORIZON_MS]
    assert any(b["count"] == 0 and b["lastOffset"] - b["baseOffset"] == 4 for b in batches)
    markers = [r["endTxnMarker"] for b in batches if b["isControl"] for r in b["records"]]
    assert markers == ["COMMIT"]

    records = {r["offset"]: (r["key"], r["payload"]) for b in batches if not b["isControl"] for r in b["records"]}
    assert records == {o: (_text(k), _text(v)) for o, (k, v) in written.items()}

    ours = CliRunner().invoke(dump_log, [str(dir_path)])
    assert ours.exit_code == 0, ours.output
    assert ours.stdout.splitlines() == done.stdout[done.stdout.index("Dumping "):].splitlines()


def test_verify_index_only_finds_no_mismatch(kafka_broker: Any, our_log: tuple[Path, dict]) -> None:
    dir_path, _ = our_log
    indexes = _files(dir_path, ".index", ".timeindex")
    assert indexes
    done = kafka_broker.run_tool(
        DUMP_LOG_SEGMENTS_CLASS, ["--verify-index-only", "--files", ",".join(map(str, indexes))])
    assert done.returncode == 0, done.stderr
    for signal in INDEX_MISMATCH_SIGNALS:
        assert signal not in done.stderr, done.stderr
    assert [line for line in done.stdout.splitlines() if line.startswith("Dumping ")] == [
        f"Dumping {p}" for p in indexes
    ]


def test_index_sanity_check_passes(kafka_broker: Any, our_log: tuple[Path, dict]) -> None:
    dir_path, _ = our_log
    indexes = _files(dir_path, ".index", ".timeindex", ".txnindex")
    done = kafka_broker.run_tool(
        DUMP_LOG_SEGMENTS_CLASS, ["--index-sanity-check", "--files", ",".join(map(str, indexes))])
    assert done.returncode == 0, done.stderr
    lines = set(done.stdout.splitlines())
    for path in indexes:
        if path.suffix == ".txnindex":
            continue  # DumpLogSegments lists aborted transactions; there is no sanity check to pass
        accepted = {f"{path} passed sanity check."}
        if path.suffix == ".index":
            accepted.add(f"{path} is empty.")
        assert lines & accepted, f"{path}: {done.stdout}\n{done.stderr}"
    non_empty = [p for p in indexes if p.suffix == ".index" and f"{p} passed sanity check." in lines]
    assert non_empty, "index.interval.bytes should have produced offset index entries"


# -- after our cleaner has rewritten the log -------------------------------------------------------

@pytest.fixture(scope="module")
def our_compacted_log(tmp_path_factory: pytest.TempPathFactory, our_log: tuple[Path, dict]) -> Path:
    """A copy of ``our_log`` cleaned twice by our LogCleaner port: the first round rewrites every
    inactive segment (dropping superseded and null-key records, stamping delete horizons on kept
    tombstones), the second runs past those horizons and drops the tombstones."""
    import shutil

    from materializer.storage.log_cleaner import clean_log

    source, _ = our_log
    dir_path = tmp_path_factory.mktemp("ours-compacted") / "ours-0"
    shutil.copytree(source, dir_path)
    config = LogConfig(segment_bytes=4096, index_interval_bytes=256, cleanup_policy=("compact",),
                       delete_retention_ms=1000)
    log = Log.open(dir_path, config)
    try:
        log.roll()  # everything written so far becomes cleanable
        first = clean_log(log, now_ms=T0)
        # A later round needs new dirty data (as on a broker); it recopies the clean section too.
        next_offset = log.log_end_offset + 2
        log.append_records([Record(next_offset + i, T0 + i, f"late-{i}".encode(), b"v") for i in range(3)],
                           compression=CompressionType.NONE, timestamp_type=TimestampType.CREATE_TIME)
        log.roll()
        second = clean_log(log, now_ms=T0 + 10_000)
        assert first.bytes_written < first.bytes_read and second.rounds
    finally:
        log.close()
    return dir_path


def test_dump_log_segments_reads_our_compacted_log(kafka_broker: Any, our_compacted_log: Path) -> None:
    logs = _files(our_compacted_log, ".log")
    done = kafka_broker.run_tool(
        DUMP_LOG_SEGMENTS_CLASS, ["--deep-iteration", "--print-data-log", "--files", ",".join(map(str, logs))])
    assert done.returncode == 0, done.stderr
    theirs = parse_dump_output(done.stdout)
    batches = [b for f in theirs for b in f["batches"]]
    assert batches and all(b["isvalid"] for b in batches)
    assert all(f["invalidBytes"] == 0 for f in theirs)

    # Two independent readers of the same bytes agree: Kafka's DumpLogSegments and our Log.
    with Log.open(our_compacted_log, LogConfig(segment_bytes=4096)) as log:
        ours = {r.offset: (_text(r.key), _text(r.value)) for r in log.read_records()}
    kafkas = {r["offset"]: (r["key"], r["payload"]) for b in batches if not b["isControl"] for r in b["records"]}
    assert kafkas == ours
    keys = [key for key, _ in kafkas.values()]
    assert None not in keys and len(keys) == len(set(keys)), "one record per key, none without a key"
    # Tombstones stamped in round 1 (horizon T0 + 1 s) are gone in round 2; the ones written with
    # a horizon a day ahead stay, in a batch that still carries it.
    assert {key for key, value in kafkas.values() if value is None} == {"gone-0", "gone-2", "gone-3"}
    assert DELETE_HORIZON_MS in {b["deleteHorizonMs"] for b in batches}


def test_our_compacted_indexes_pass_kafkas_checks(kafka_broker: Any, our_compacted_log: Path) -> None:
    indexes = _files(our_compacted_log, ".index", ".timeindex")
    done = kafka_broker.run_tool(DUMP_LOG_SEGMENTS_CLASS, ["--verify-index-only", "--files", ",".join(map(str, indexes))])
    assert done.returncode == 0, done.stderr
    for signal in INDEX_MISMATCH_SIGNALS:
        assert signal not in done.stderr, done.stderr
    done = kafka_broker.run_tool(DUMP_LOG_SEGMENTS_CLASS, ["--index-sanity-check", "--files", ",".join(map(str, indexes))])
    assert done.returncode == 0, done.stderr
    for path in indexes:
        assert {f"{path} passed sanity check.", f"{path} is empty."} & set(done.stdout.splitlines()), done.stdout
