"""Unit tests for ``materializer dump-log`` on batches built in memory.

Expected lines follow ``org.apache.kafka.tools.DumpLogSegments.printBatchLevel`` /
``printRecordMetadata`` / ``printRecordContents`` field for field.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from materializer.cli.dump_log import dump_log
from materializer.offline.dump_log import (
    format_batch_line,
    format_record_line,
    list_log_files,
    parse_dump_output,
    record_to_json,
)
from materializer.storage.compression import CompressionType
from materializer.storage.control_record import ControlRecordType, encode_end_txn_marker
from materializer.storage.record_batch import (
    CRC_OFFSET,
    RECORD_BATCH_OVERHEAD,
    BatchHeaderFields,
    Record,
    RecordBatch,
    TimestampType,
)
from materializer.storage.record_batch_builder import RecordBatchBuilder, build_empty_batch

T0 = 1_700_000_000_000


def _data_batch(base_offset: int = 0, **kwargs: object) -> bytes:
    builder = RecordBatchBuilder(base_offset, **kwargs)  # type: ignore[arg-type]
    builder.append(base_offset, T0, b"k1", b"v1", (("h1", b"x"), ("h2", None)))
    builder.append(base_offset + 1, T0 + 1, None, b"only value")
    builder.append(base_offset + 2, T0 + 2, b"tomb", None)
    return builder.build()


def _commit_batch(offset: int, producer_id: int = 7, producer_epoch: int = 1) -> bytes:
    builder = RecordBatchBuilder(
        offset, is_control_batch=True, is_transactional=True, producer_id=producer_id, producer_epoch=producer_epoch
    )
    key, value = encode_end_txn_marker(ControlRecordType.COMMIT, 5)
    builder.append(offset, T0 + 10, key, value)
    return builder.build()


def _write(tmp_path: Path, base_offset: int, data: bytes) -> Path:
    path = tmp_path / f"{base_offset:020d}.log"
    path.write_bytes(data)
    return path


def _run(*args: str) -> object:
    return CliRunner().invoke(dump_log, [str(a) for a in args])


class TestFormatBatchLine:
    def test_every_field_in_kafka_order(self) -> None:
        data = _data_batch(
            10, compression=CompressionType.GZIP, producer_id=7, producer_epoch=1, base_sequence=4,
            partition_leader_epoch=3,
        )
        batch = RecordBatch(data)
        assert format_batch_line(batch, 123) == (
            f"baseOffset: 10 lastOffset: 12 count: 3 baseSequence: 4 lastSequence: 6 producerId: 7 "
            f"producerEpoch: 1 partitionLeaderEpoch: 3 isTransactional: false isControl: false "
            f"deleteHorizonMs: OptionalLong.empty position: 123 CreateTime: {T0 + 2} size: {len(data)} "
            f"magic: 2 compresscodec: gzip crc: {batch.crc} isvalid: true"
        )

    @pytest.mark.parametrize("codec", list(CompressionType))
    def test_codec_names(self, codec: CompressionType) -> None:
        line = format_batch_line(RecordBatch(_data_batch(compression=codec)), 0)
        assert f" compresscodec: {codec.name_kafka} " in line

    def test_delete_horizon_is_an_optional_long(self) -> None:
        builder = RecordBatchBuilder(0, delete_horizon_ms=T0 + 86_400_000)
        builder.append(0, T0, b"k", None)
        line = format_batch_line(RecordBatch(builder.build()), 0)
        assert f" deleteHorizonMs: OptionalLong[{T0 + 86_400_000}] " in line

    def test_log_append_time(self) -> None:
        batch = RecordBatch(_data_batch(timestamp_type=TimestampType.LOG_APPEND_TIME))
        line = format_batch_line(batch, 0)
        assert f" LogAppendTime: {batch.max_timestamp} " in line
        assert all(" LogAppendTime: " in format_record_line(batch, r) for r in batch.records())

    def test_empty_batch(self) -> None:
        data = build_empty_batch(BatchHeaderFields(4, last_offset_delta=2, max_timestamp=T0, producer_id=9,
                                                    producer_epoch=2, base_sequence=11))
        line = format_batch_line(RecordBatch(data), 61)
        assert line.startswith(
            "baseOffset: 4 lastOffset: 6 count: 0 baseSequence: 11 lastSequence: 13 producerId: 9 producerEpoch: 2 "
        )
        assert f" position: 61 CreateTime: {T0} size: {RECORD_BATCH_OVERHEAD} " in line

    def test_crc_mismatch_is_invalid(self) -> None:
        data = bytearray(_data_batch())
        data[-1] ^= 0xFF
        batch = RecordBatch(bytes(data))
        assert format_batch_line(batch, 0).endswith(f"crc: {batch.crc} isvalid: false")


class TestFormatRecordLine:
    def test_data_records(self) -> None:
        batch = RecordBatch(_data_batch(producer_id=7, producer_epoch=1, base_sequence=0))
        lines = [format_record_line(batch, r) for r in batch.records()]
        assert lines == [
            f"| offset: 0 CreateTime: {T0} keySize: 2 valueSize: 2 sequence: 0 headerKeys: [h1,h2] key: k1 payload: v1",
            f"| offset: 1 CreateTime: {T0 + 1} keySize: -1 valueSize: 10 sequence: 1 headerKeys: [] payload: only value",
            f"| offset: 2 CreateTime: {T0 + 2} keySize: 4 valueSize: -1 sequence: 2 headerKeys: [] key: tomb",
        ]

    def test_without_data(self) -> None:
        batch = RecordBatch(_data_batch())
        line = format_record_line(batch, batch.records()[0], print_data=False)
        assert line.endswith("sequence: -1 headerKeys: [h1,h2]")

    def test_sequence_wraps_past_int32_max(self) -> None:
        # DefaultRecordBatch.incrementSequence: the sequence after 2**31 - 1 is 0.
        batch = RecordBatch(_data_batch(producer_id=7, producer_epoch=1, base_sequence=2**31 - 2))
        assert [format_record_line(batch, r).split(" sequence: ")[1].split(" ")[0] for r in batch.records()] == [
            str(2**31 - 2), str(2**31 - 1), "0",
        ]
        assert " lastSequence: 0 " in format_batch_line(batch, 0)

    def test_end_txn_marker(self) -> None:
        batch = RecordBatch(_commit_batch(3))
        (record,) = batch.records()
        assert format_record_line(batch, record) == (
            f"| offset: 3 CreateTime: {T0 + 10} keySize: 4 valueSize: 6 sequence: -1 headerKeys: [] "
            "endTxnMarker: COMMIT coordinatorEpoch: 5"
        )

    def test_invalid_utf8_is_replaced_like_java(self) -> None:
        builder = RecordBatchBuilder(0)
        builder.append(0, T0, b"\xff", b"a\xc3(")
        batch = RecordBatch(builder.build())
        assert format_record_line(batch, batch.records()[0]).endswith(" key: \ufffd payload: a\ufffd(")


class TestRecordToJson:
    def test_text(self) -> None:
        record = Record(5, T0, b"k", "v\u00e9".encode(), (("a", b"1"), ("b", None)))
        assert record_to_json(record) == {
            "offset": 5, "timestamp": T0, "key": "k", "value": "v\u00e9", "headers": [["a", "1"], ["b", None]],
        }

    def test_nulls(self) -> None:
        assert record_to_json(Record(0, T0, None, None)) == {
            "offset": 0, "timestamp": T0, "key": None, "value": None, "headers": [],
        }

    def test_binary_goes_to_b64_fields(self) -> None:
        record = Record(1, T0, b"\xff\x00", b"ok", (("a", b"\xfe"), ("b", b"text"), ("c", None)))
        out = record_to_json(record)
        assert out == {
            "offset": 1,
            "timestamp": T0,
            "key_b64": base64.b64encode(b"\xff\x00").decode(),
            "value": "ok",
            "headers_b64": [["a", "/g=="], ["b", base64.b64encode(b"text").decode()], ["c", None]],
        }


class TestCommand:
    def test_text_output_of_a_file(self, tmp_path: Path) -> None:
        data = _data_batch(0) + _commit_batch(3) + build_empty_batch(BatchHeaderFields(4, last_offset_delta=2, max_timestamp=T0))
        path = _write(tmp_path, 0, data)
        result = _run(path)
        assert result.exit_code == 0, result.output
        lines = result.stdout.splitlines()
        assert lines[0] == f"Dumping {path}"
        assert lines[1] == "Log starting offset: 0"
        assert [line.removeprefix("| ").split(" ")[1] for line in lines[2:]] == ["0", "0", "1", "2", "3", "3", "4"]
        assert "endTxnMarker: COMMIT" in lines[7]
        assert result.stderr == ""

    def test_folder_in_base_offset_order(self, tmp_path: Path) -> None:
        _write(tmp_path, 100, _data_batch(100))
        _write(tmp_path, 3, _data_batch(3))
        (tmp_path / f"{0:020d}.log.cleaned").write_bytes(_data_batch(0))
        (tmp_path / f"{3:020d}.index").write_bytes(b"")
        assert [p.name for p in list_log_files(tmp_path)] == [f"{3:020d}.log", f"{100:020d}.log"]
        result = _run(tmp_path)
        assert result.exit_code == 0, result.output
        files = parse_dump_output(result.stdout)
        assert [f["startOffset"] for f in files] == [3, 100]

    def test_json(self, tmp_path: Path) -> None:
        path = _write(tmp_path, 0, _data_batch(0) + _commit_batch(3))
        result = _run(path, "--json")
        assert result.exit_code == 0, result.output
        objects = [json.loads(line) for line in result.stdout.splitlines()]
        assert [o["offset"] for o in objects] == [0, 1, 2]  # the COMMIT marker is not a data record
        assert objects[0] == {
            "offset": 0, "timestamp": T0, "key": "k1", "value": "v1", "headers": [["h1", "x"], ["h2", None]],
        }

    def test_not_a_log_file(self, tmp_path: Path) -> None:
        path = tmp_path / f"{0:020d}.index"
        path.write_bytes(b"")
        result = _run(path)
        assert result.exit_code == 2
        assert "not a .log file" in result.stderr

    def test_empty_folder(self, tmp_path: Path) -> None:
        result = _run(tmp_path)
        assert result.exit_code == 2
        assert "no .log files" in result.stderr


class TestCorruption:
    def _assert_one_error_line(self, result: object, path: Path, position: int) -> str:
        assert result.exit_code == 2  # type: ignore[attr-defined]
        stderr = result.stderr  # type: ignore[attr-defined]
        assert "Traceback" not in stderr
        assert stderr.count("\n") == 1
        assert stderr.startswith(f"error: {path} at byte position {position}: ")
        return stderr

    def test_crc_mismatch(self, tmp_path: Path) -> None:
        first = _data_batch(0)
        second = bytearray(_data_batch(3))
        second[-1] ^= 0x01
        path = _write(tmp_path, 0, first + bytes(second) + _data_batch(6))
        result = _run(path)
        stderr = self._assert_one_error_line(result, path, len(first))
        assert "CRC-32C" in stderr
        batches = parse_dump_output(result.stdout)[0]["batches"]
        assert [b["isvalid"] for b in batches] == [True, False, True]  # later batches still dumped

    def test_trailing_bytes(self, tmp_path: Path) -> None:
        first = _data_batch(0)
        partial = _data_batch(3)[:40]
        path = _write(tmp_path, 0, first + partial)
        result = _run(path)
        self._assert_one_error_line(result, path, len(first))
        assert f"Found 40 invalid bytes at the end of {path.name}" in result.stdout.splitlines()
        assert parse_dump_output(result.stdout)[0]["invalidBytes"] == 40

    def test_size_below_minimum(self, tmp_path: Path) -> None:
        first = _data_batch(0)
        path = _write(tmp_path, 0, first + bytes(30))
        result = _run(path)
        self._assert_one_error_line(result, path, len(first))

    def test_undecodable_records_with_valid_crc(self, tmp_path: Path) -> None:
        import crc32c

        data = bytearray(_data_batch(0, compression=CompressionType.ZSTD))
        data[RECORD_BATCH_OVERHEAD:] = bytes(len(data) - RECORD_BATCH_OVERHEAD)  # not a zstd frame
        data[CRC_OFFSET : CRC_OFFSET + 4] = crc32c.crc32c(bytes(data[21:])).to_bytes(4, "big")
        path = _write(tmp_path, 0, bytes(data))
        result = _run(path)
        stderr = self._assert_one_error_line(result, path, 0)
        assert "decode" in stderr
        assert "isvalid: true" in result.stdout

    def test_json_mode_reports_too(self, tmp_path: Path) -> None:
        data = bytearray(_data_batch(0))
        data[-1] ^= 0x01
        path = _write(tmp_path, 0, bytes(data))
        result = _run(path, "--json")
        self._assert_one_error_line(result, path, 0)


class TestParseDumpOutput:
    def test_round_trip_of_our_output(self, tmp_path: Path) -> None:
        path = _write(tmp_path, 0, _data_batch(0, producer_id=7, producer_epoch=1, base_sequence=0) + _commit_batch(3))
        result = _run(path)
        (dumped,) = parse_dump_output(result.stdout)
        assert dumped["file"] == str(path)
        first, control = dumped["batches"]
        assert first["baseOffset"] == 0 and first["lastOffset"] == 2 and first["count"] == 3
        assert first["deleteHorizonMs"] is None and first["timestampType"] == "CreateTime"
        assert first["isvalid"] is True and first["compresscodec"] == "none"
        assert [r["key"] for r in first["records"]] == ["k1", None, "tomb"]
        assert [r["payload"] for r in first["records"]] == ["v1", "only value", None]
        assert first["records"][0]["headerKeys"] == ["h1", "h2"]
        assert control["isControl"] is True
        assert control["records"][0]["endTxnMarker"] == "COMMIT"
        assert control["records"][0]["coordinatorEpoch"] == 5

    def test_key_containing_payload_marker_is_split_by_key_size(self) -> None:
        line = "| offset: 0 CreateTime: 1 keySize: 12 valueSize: 1 sequence: -1 headerKeys: [] key: a payload: b payload: c"
        text = "Dumping x.log\nLog starting offset: 0\n" + (
            "baseOffset: 0 lastOffset: 0 count: 1 baseSequence: -1 lastSequence: -1 producerId: -1 producerEpoch: -1 "
            "partitionLeaderEpoch: 0 isTransactional: false isControl: false deleteHorizonMs: OptionalLong[5] "
            "position: 0 CreateTime: 1 size: 80 magic: 2 compresscodec: none crc: 1 isvalid: true\n"
        ) + line
        (record,) = parse_dump_output(text)[0]["batches"][0]["records"]
        assert record["key"] == "a payload: b"
        assert record["payload"] == "c"
        assert parse_dump_output(text)[0]["batches"][0]["deleteHorizonMs"] == 5
