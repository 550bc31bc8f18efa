"""``materializer dump-log``: print a log segment the way Kafka's DumpLogSegments does.

Mirrors ``org.apache.kafka.tools.DumpLogSegments`` (``tools/src/main/java/org/apache/kafka/tools/
DumpLogSegments.java``, Kafka 4.3+; ``kafka.tools.DumpLogSegments`` in Scala before) run with
``--deep-iteration --print-data-log`` and the default ``StringDecoder``, so that the two outputs
can be compared line by line and field by field.

Text output, per ``.log`` file (``dumpLog``, ``printBatchLevel``, ``printRecordMetadata``,
``printRecordContents``, ``printControlRecord``, ``printTrailingBytes``)::

    Dumping <path>
    Log starting offset: <base offset from the file name>
    baseOffset: B lastOffset: L count: C baseSequence: S lastSequence: S producerId: P
        producerEpoch: E partitionLeaderEpoch: LE isTransactional: true|false isControl: true|false
        deleteHorizonMs: OptionalLong[<ms>]|OptionalLong.empty position: <bytes into the file>
        CreateTime|LogAppendTime: <max timestamp ms> size: <bytes> magic: 2
        compresscodec: none|gzip|snappy|lz4|zstd crc: <stored uint32> isvalid: true|false
    | offset: O CreateTime|LogAppendTime: <ms> keySize: <bytes|-1> valueSize: <bytes|-1>
        sequence: <int|-1> headerKeys: [k1,k2]
        [ endTxnMarker: COMMIT|ABORT coordinatorEpoch: N]      (control records)
        [ key: <utf-8 text>] [ payload: <utf-8 text>]          (data records with a key / value)
    Found N invalid bytes at the end of <file name>

(the batch and record lines are one line each; they are wrapped here). Keys and payloads
are decoded as UTF-8 with replacement characters, as Java's ``new String(bytes, UTF_8)``
does; output is written as UTF-8 bytes whatever the locale.

JSON output (``--json``): one object per line per data record (control records, i.e. the
commit/abort markers, are not data and are left out; records of aborted transactions are
printed since this is a raw dump of the log)::

    {"offset": int, "timestamp": int (ms), "key": str|null, "value": str|null,
     "headers": [[str, str|null], ...]}

A key or value that is not valid UTF-8 is given as standard base64 under ``"key_b64"`` /
``"value_b64"`` *instead of* ``"key"`` / ``"value"``. The same rule applies to headers as a
whole: when any header value is not valid UTF-8 the record carries ``"headers_b64"``
instead of ``"headers"``, with every non-null header value in base64 (header keys are always
text: Kafka decodes them as UTF-8 when it reads them).

Corruption (a batch that fails its CRC-32C, bytes that do not form a batch at the end of the
file, a batch whose records cannot be decoded, a header with size < 14 or magic != 2) is
reported like DumpLogSegments (``isvalid: false``, ``Found N invalid bytes ...``) and then as
one ``Error: <file> at byte position <n>: ...`` line on stderr (the first problem, with a count
of the others); the exit status is 1. As in Kafka's tool, batches after a CRC failure are still
printed; where Kafka exits with a stack trace (Length < 14, undecodable records) this prints the
one-line error instead. Kafka's stderr list of non-consecutive offsets is not reproduced.
"""

from __future__ import annotations

import base64
import json
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from materializer.adapters.serdes import text_or_base64
from materializer.storage.control_record import (
    ControlRecordType,
    decode_end_txn_marker,
    parse_control_record_type,
)
from materializer.storage.errors import CorruptRecordError
from materializer.storage.files import LOG_FILE_SUFFIX, offset_from_file_name
from materializer.storage.record_batch import (
    NO_SEQUENCE,
    Record,
    RecordBatch,
    TimestampType,
    increment_sequence,
    iter_batches,
)

__all__ = [
    "RECORD_INDENT",
    "DumpProblem",
    "dump_log_file",
    "format_batch_line",
    "format_record_line",
    "list_log_files",
    "parse_dump_output",
    "record_to_json",
]

RECORD_INDENT = "|"
"""Prefix of every record line (``DumpLogSegments.RECORD_INDENT``)."""


_TIMESTAMP_TYPE_NAMES = {
    TimestampType.CREATE_TIME: "CreateTime",
    TimestampType.LOG_APPEND_TIME: "LogAppendTime",
}


@dataclass(frozen=True)
class DumpProblem:
    """One piece of corruption found while dumping: ``path`` and byte ``position`` in it."""

    path: str
    position: int
    message: str

    def __str__(self) -> str:
        return f"{self.path} at byte position {self.position}: {self.message}"


# ---------------------------------------------------------------------------------------------
# formatting


def _java_bool(value: bool) -> str:
    return "true" if value else "false"


def _timestamp_type_name(batch: RecordBatch) -> str:
    """``TimestampType.toString()``: ``CreateTime`` or ``LogAppendTime``."""
    return _TIMESTAMP_TYPE_NAMES[TimestampType(batch.timestamp_type)]


def _optional_long(value: int | None) -> str:
    """Java ``OptionalLong.toString()``: ``OptionalLong[5]`` or ``OptionalLong.empty``."""
    return "OptionalLong.empty" if value is None else f"OptionalLong[{value}]"


def _record_sequence(batch: RecordBatch, record: Record) -> int:
    """A record's producer sequence (``DefaultRecord.sequence()``), ``-1`` when the batch has none."""
    if batch.base_sequence < 0:
        return NO_SEQUENCE
    return increment_sequence(batch.base_sequence, record.offset - batch.base_offset)


def _java_string(data: bytes) -> str:
    """``new String(data, UTF_8)``: malformed input becomes U+FFFD."""
    return data.decode("utf-8", errors="replace")


def format_batch_line(batch: RecordBatch, position: int) -> str:
    """Return the batch-level line of ``DumpLogSegments.printBatchLevel`` for a v2 batch.

    Args:
        batch: the batch (magic 2).
        position: bytes from the start of the file to the batch (``accumulativeBytes``).

    Returns:
        One line without the newline; ``isvalid`` is the CRC-32C check
        (``DefaultRecordBatch.isValid``), ``crc`` the stored checksum as an unsigned int.
    """
    return (
        f"baseOffset: {batch.base_offset} lastOffset: {batch.last_offset}"
        f" count: {batch.records_count}"
        f" baseSequence: {batch.base_sequence} lastSequence: {batch.last_sequence}"
        f" producerId: {batch.producer_id} producerEpoch: {batch.producer_epoch}"
        f" partitionLeaderEpoch: {batch.partition_leader_epoch}"
        f" isTransactional: {_java_bool(batch.is_transactional)}"
        f" isControl: {_java_bool(batch.is_control_batch)}"
        f" deleteHorizonMs: {_optional_long(batch.delete_horizon_ms)}"
        f" position: {position}"
        f" {_timestamp_type_name(batch)}: {batch.max_timestamp}"
        f" size: {batch.size_in_bytes} magic: {batch.magic}"
        f" compresscodec: {batch.compression_type.name_kafka}"
        f" crc: {batch.crc} isvalid: {_java_bool(batch.is_valid())}"
    )


def _control_record_suffix(record: Record) -> str:
    """``DumpLogSegments.printControlRecord`` for the control types a data topic carries.

    COMMIT/ABORT print the end-transaction marker; the KRaft-only types (leader change,
    snapshot header/footer, KRaft version/voters), which Kafka prints as JSON, are printed as
    ``controlType: NAME(id)`` here.

    Raises:
        CorruptRecordError: the key or the marker value is too short or has a negative version
            (Kafka's ``InvalidRecordException``).
    """
    try:
        control_type = parse_control_record_type(record.key)
        if control_type in (ControlRecordType.ABORT, ControlRecordType.COMMIT):
            marker = decode_end_txn_marker(record.key, record.value)
            return f" endTxnMarker: {marker.control_type.name} coordinatorEpoch: {marker.coordinator_epoch}"
    except ValueError as exc:
        raise CorruptRecordError(f"invalid control record at offset {record.offset}: {exc}") from exc
    type_id = struct.unpack_from(">h", record.key or b"", 2)[0]
    return f" controlType: {control_type.name}({type_id})"


def _record_metadata(batch: RecordBatch, record: Record) -> str:
    """The part of the record line every record has, up to and including ``headerKeys``."""
    key_size = -1 if record.key is None else len(record.key)
    value_size = -1 if record.value is None else len(record.value)
    header_keys = ",".join(key for key, _ in record.headers)
    return (
        f"{RECORD_INDENT} offset: {record.offset} {_timestamp_type_name(batch)}: {record.timestamp}"
        f" keySize: {key_size} valueSize: {value_size}"
        f" sequence: {_record_sequence(batch, record)} headerKeys: [{header_keys}]"
    )


def format_record_line(batch: RecordBatch, record: Record, *, print_data: bool = True) -> str:
    """Return the record line of ``printRecordMetadata`` (+ ``printRecordContents``).

    Args:
        batch: the batch holding ``record`` (gives the timestamp type, the base sequence and
            whether it is a control batch).
        record: the record, offset and timestamp absolute.
        print_data: add `` key: ...`` / `` payload: ...`` as ``--print-data-log`` does
            (never for control records; each part only when present, i.e. not null).

    Raises:
        CorruptRecordError: a control record whose key or value cannot be parsed.
    """
    parts = [_record_metadata(batch, record)]
    if batch.is_control_batch:
        parts.append(_control_record_suffix(record))
    elif print_data:
        if record.key is not None:
            parts.append(f" key: {_java_string(record.key)}")
        if record.value is not None:
            parts.append(f" payload: {_java_string(record.value)}")
    return "".join(parts)


def record_to_json(record: Record) -> dict[str, object]:
    """Return the ``--json`` object for one record (see the module docstring for the shape).

    Keys: ``offset`` (int), ``timestamp`` (int, ms), ``key`` or ``key_b64``, ``value`` or
    ``value_b64`` (str or None for null), ``headers`` or ``headers_b64`` (list of
    ``[key, value-or-None]``).
    """
    out: dict[str, object] = {"offset": record.offset, "timestamp": record.timestamp}
    for name, data in (("key", record.key), ("value", record.value)):
        out.update({name: None} if data is None else text_or_base64(name, data))
    try:
        out["headers"] = [[k, None if v is None else bytes(v).decode("utf-8")] for k, v in record.headers]
    except UnicodeDecodeError:
        out["headers_b64"] = [
            [k, None if v is None else base64.b64encode(v).decode("ascii")] for k, v in record.headers
        ]
    return out


# ---------------------------------------------------------------------------------------------
# dumping


def list_log_files(path: Path) -> list[Path]:
    """Return the ``.log`` files to dump for ``path``: itself, or a folder's in base-offset order.

    Only ``<20 digits>.log`` names count in a folder (``.log.cleaned``/``.swap``/``.deleted``
    and other files are skipped).

    Raises:
        ValueError: ``path`` is not a ``.log`` file, the name does not start with a base
            offset, or the folder holds no ``.log`` file.
    """
    if path.is_dir():
        files = [p for p in path.iterdir() if p.suffix == LOG_FILE_SUFFIX and p.stem.isdigit() and p.is_file()]
        if not files:
            raise ValueError(f"no {LOG_FILE_SUFFIX} files in {path}")
        return sorted(files, key=lambda p: offset_from_file_name(p.name))
    if path.suffix != LOG_FILE_SUFFIX:
        raise ValueError(f"not a {LOG_FILE_SUFFIX} file or a partition folder: {path}")
    offset_from_file_name(path.name)  # ValueError naming the file when it has no base offset
    return [path]


def _batch_records(batch: RecordBatch, path: str, position: int) -> tuple[list[Record], DumpProblem | None]:
    """Decode a batch's records; a failure becomes a problem rather than an exception.

    Decompression errors, bad varints and count mismatches may surface as several exception
    types from the codec layer, so every ``Exception`` is turned into a one-line problem here.
    """
    try:
        return batch.records(), None
    except Exception as exc:  # noqa: BLE001 - boundary: any decode failure is a corrupt batch
        message = f"cannot decode the records of batch at offset {batch.base_offset}: {exc}"
        return [], DumpProblem(path, position, message)


def dump_log_file(path: Path, out: BinaryIO, *, as_json: bool = False) -> list[DumpProblem]:
    """Dump one ``.log`` file to ``out`` (UTF-8 bytes), as ``DumpLogSegments.dumpLog`` does.

    Args:
        path: a segment file named ``<base offset>.log``.
        out: binary stream written line by line.
        as_json: one JSON object per data record instead of the DumpLogSegments text.

    Returns:
        The corruption found, in file order (empty for a clean file): CRC failures, batches
        whose records cannot be decoded, a bad batch header (stops the file), trailing bytes.

    Raises:
        OSError: the file cannot be read. The whole file is read into memory.
    """
    name = str(path)
    data = path.read_bytes()
    problems: list[DumpProblem] = []

    def emit(line: str) -> None:
        out.write(line.encode("utf-8") + b"\n")

    if not as_json:
        emit(f"Dumping {name}")
        emit(f"Log starting offset: {offset_from_file_name(path.name)}")
    valid_bytes = 0
    try:
        for position, batch in iter_batches(data, path=name):
            if not as_json:
                emit(format_batch_line(batch, position))
            if not batch.is_valid():
                problems.append(
                    DumpProblem(
                        name,
                        position,
                        f"record batch at offset {batch.base_offset} fails its CRC-32C check "
                        f"(stored {batch.crc}, computed {batch.compute_crc()})",
                    )
                )
            records, problem = _batch_records(batch, name, position)
            if problem is not None:
                problems.append(problem)
            for record in records:
                if as_json:
                    if not batch.is_control_batch:
                        emit(json.dumps(record_to_json(record), ensure_ascii=False))
                    continue
                try:
                    emit(format_record_line(batch, record))
                except CorruptRecordError as exc:
                    problems.append(DumpProblem(name, position, str(exc)))
                    emit(_record_metadata(batch, record))
            valid_bytes = position + batch.size_in_bytes
    except CorruptRecordError as exc:
        position = exc.position if exc.position is not None else valid_bytes
        message = str(exc)
        prefix = f"{exc.path or name} at byte position {position}: "
        problems.append(DumpProblem(name, position, message.removeprefix(prefix)))
        return problems
    trailing_bytes = len(data) - valid_bytes
    if trailing_bytes > 0:
        if not as_json:
            emit(f"Found {trailing_bytes} invalid bytes at the end of {path.name}")
        message = f"{trailing_bytes} bytes at the end of the file do not form a complete record batch"
        problems.append(DumpProblem(name, valid_bytes, message))
    return problems


# ---------------------------------------------------------------------------------------------
# parsing (for comparing Kafka's output with ours)

_BATCH_INT_FIELDS = (
    "baseOffset", "lastOffset", "count", "baseSequence", "lastSequence", "producerId",
    "producerEpoch", "partitionLeaderEpoch", "position", "size", "magic", "crc",
)


def _parse_batch_line(line: str) -> dict[str, object]:
    tokens = line.split(" ")
    fields: dict[str, object] = {}
    for name, value in zip(tokens[0::2], tokens[1::2], strict=True):
        key = name.removesuffix(":")
        if key in ("CreateTime", "LogAppendTime"):
            fields["timestampType"] = key
            fields["maxTimestamp"] = int(value)
        elif key in _BATCH_INT_FIELDS:
            fields[key] = int(value)
        elif value in ("true", "false"):
            fields[key] = value == "true"
        elif key == "deleteHorizonMs":
            fields[key] = None if value == "OptionalLong.empty" else int(value.removeprefix("OptionalLong[")[:-1])
        else:
            fields[key] = value
    fields["records"] = []
    return fields


def _take_utf8(text: str, size_bytes: int) -> tuple[str, str]:
    """Split ``text`` after the prefix whose UTF-8 encoding is ``size_bytes`` long."""
    taken = 0
    for index, char in enumerate(text):
        if taken >= size_bytes:
            return text[:index], text[index:]
        taken += len(char.encode("utf-8", errors="surrogatepass"))
    return text, ""


def _parse_record_line(line: str) -> dict[str, object]:
    head, _, rest = line.partition(" headerKeys: [")
    tokens = head.removeprefix(f"{RECORD_INDENT} ").split(" ")
    record: dict[str, object] = {}
    for name, value in zip(tokens[0::2], tokens[1::2], strict=True):
        key = name.removesuffix(":")
        if key in ("CreateTime", "LogAppendTime"):
            record["timestamp"] = int(value)
        else:
            record[key] = int(value)
    header_keys, _, rest = rest.partition("]")
    record["headerKeys"] = header_keys.split(",") if header_keys else []
    record["key"] = record["payload"] = None
    record["endTxnMarker"] = record["coordinatorEpoch"] = None
    if rest.startswith(" endTxnMarker: "):
        marker, epoch = rest.removeprefix(" endTxnMarker: ").split(" coordinatorEpoch: ")
        record["endTxnMarker"], record["coordinatorEpoch"] = marker, int(epoch)
        return record
    if rest.startswith(" key: "):
        key_size = record["keySize"]
        text, rest = _take_utf8(rest.removeprefix(" key: "), key_size if isinstance(key_size, int) else 0)
        record["key"] = text
    if rest.startswith(" payload: "):
        record["payload"] = rest.removeprefix(" payload: ")
    return record


def parse_dump_output(text: str | Iterable[str]) -> list[dict[str, object]]:
    """Parse DumpLogSegments-format text (Kafka's or ``dump-log``'s) into one dict per file.

    Each file dict: ``file`` (path as printed), ``startOffset``, ``batches`` (dicts keyed by
    Kafka's field names, ints/bools decoded, ``deleteHorizonMs`` int or None,
    ``timestampType`` + ``maxTimestamp``, and ``records``: dicts with offset, timestamp,
    keySize, valueSize, sequence, headerKeys, key, payload, endTxnMarker, coordinatorEpoch)
    and ``invalidBytes`` (int, 0 when absent). Keys are split from payloads by ``keySize``;
    payloads containing a newline are not supported. Lines of other shapes (e.g. Kafka's log
    output) are ignored.
    """
    lines: Sequence[str] = text.splitlines() if isinstance(text, str) else list(text)
    files: list[dict[str, object]] = []
    current: dict[str, object] | None = None
    batch: dict[str, object] | None = None
    for line in lines:
        line = line.rstrip("\n")
        if line.startswith("Dumping "):
            current = {"file": line.removeprefix("Dumping "), "startOffset": None, "batches": [], "invalidBytes": 0}
            files.append(current)
            batch = None
        elif current is None:
            continue
        elif line.startswith("Log starting offset: "):
            current["startOffset"] = int(line.removeprefix("Log starting offset: "))
        elif line.startswith("baseOffset: "):
            batch = _parse_batch_line(line)
            current["batches"].append(batch)  # type: ignore[attr-defined]
        elif line.startswith(f"{RECORD_INDENT} offset: ") and batch is not None:
            batch["records"].append(_parse_record_line(line))  # type: ignore[attr-defined]
        elif line.startswith("Found ") and " invalid bytes at the end of " in line:
            current["invalidBytes"] = int(line.split(" ")[1])
    return files
