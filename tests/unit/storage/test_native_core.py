"""The native core against the readable reference decoder, on the same vectors.

Every codec, control batches, delete horizons, LogAppendTime, empty batches, headers with odd
bytes, torn records sections and random byte mutations: the native walk
(``RecordBatch.records``, ``scan_keys``, ``ArrowColumns``, ``StoreEntries``) must give exactly what
:mod:`materializer.storage.record_reference` gives, or fail where it fails.
"""

from __future__ import annotations

import random
import struct

import pyarrow as pa
import pytest

from materializer.storage import _native
from materializer.storage.compression import CompressionType
from materializer.storage.record_batch import BatchHeaderFields, RecordBatch, TimestampType
from materializer.storage.record_batch_builder import RecordBatchBuilder, build_empty_batch
from materializer.storage.record_reference import decode_records_reference, scan_keys_reference
from materializer.storage.record_scan import records_section, scan_keys
from materializer.storage.varint import encode_varint

NOW = 1_700_000_000_000


def _batch(rng: random.Random, codec: CompressionType, **kwargs) -> bytes:
    builder = RecordBatchBuilder(rng.randrange(0, 2**40), compression=codec, **kwargs)
    offset = builder.base_offset
    for _ in range(rng.randint(1, 40)):
        key = None if rng.random() < 0.1 else rng.randbytes(rng.choice([0, 3, 200]))
        value = None if rng.random() < 0.2 else rng.randbytes(rng.choice([0, 10, 300, 20_000]))
        headers = tuple((rng.choice(["h", "é", ""]) , None if rng.random() < 0.3 else rng.randbytes(4))
                        for _ in range(rng.choice([0, 0, 1, 3])))
        builder.append(offset, NOW + rng.randrange(-10**6, 10**6), key, value, headers)
        offset += rng.choice([1, 1, 1, 2, 1000])
    return builder.build()


def _vectors() -> list[bytes]:
    rng = random.Random(20261123)
    vectors = []
    for codec in CompressionType:
        vectors.append(_batch(rng, codec))
        vectors.append(_batch(rng, codec, delete_horizon_ms=NOW + 5))
        vectors.append(_batch(rng, codec, timestamp_type=TimestampType.LOG_APPEND_TIME, log_append_time_ms=NOW))
        vectors.append(_batch(rng, codec, producer_id=9, producer_epoch=1, base_sequence=0, is_transactional=True))
    control = RecordBatchBuilder(500, producer_id=9, producer_epoch=1, is_transactional=True, is_control_batch=True)
    control.append(500, NOW, b"\x00\x00\x00\x00", b"\x00\x00\x00\x00\x00\x05")  # ABORT marker
    vectors.append(control.build())
    vectors.append(build_empty_batch(BatchHeaderFields(10, last_offset_delta=9, max_timestamp=NOW)))
    return vectors


def _section(batch: RecordBatch) -> tuple[bytes, int, int, int, int | None]:
    header = batch.header
    lat = header.max_timestamp if batch.timestamp_type == TimestampType.LOG_APPEND_TIME else None
    return records_section(batch), header.records_count, header.base_offset, header.base_timestamp, lat


def _outcome(function, *args):
    try:
        return ("ok", function(*args))
    except ValueError as exc:
        return ("error", str(exc))


def _check_same(data: bytes, count: int, base: int, base_ts: int, lat: int | None) -> str:
    reference = _outcome(decode_records_reference, data, count, base, base_ts, lat)
    native = _outcome(lambda *a: list(map(_record_tuple, _native_records(*a))), data, count, base, base_ts, lat)
    expected = reference if reference[0] == "error" else ("ok", list(map(_record_tuple, reference[1])))
    assert native == expected
    assert _outcome(lambda *a: tuple(_native.scan_keys(*a)), data, count, base) == \
        _outcome(lambda *a: tuple(scan_keys_reference(*a)), data, count, base)
    return reference[0]


def _native_records(data, count, base, base_ts, lat):
    from materializer.storage.record_batch import _decode_records
    return _decode_records(data, count, base, base_ts, lat)


def _record_tuple(record) -> tuple:
    return (record.offset, record.timestamp, record.key, record.value, record.headers)


def test_every_vector_decodes_the_same() -> None:
    for raw in _vectors():
        batch = RecordBatch(raw)
        batch.ensure_valid()
        assert _check_same(*_section(batch)) == "ok"
        data, count, base, base_ts, lat = _section(batch)
        assert list(map(_record_tuple, batch.records())) == \
            list(map(_record_tuple, decode_records_reference(data, count, base, base_ts, lat)))
        assert scan_keys(batch).offsets == scan_keys_reference(data, count, base)[0]


def test_torn_sections_fail_in_both_or_in_neither() -> None:
    errors = 0
    for raw in _vectors():
        data, count, base, base_ts, lat = _section(RecordBatch(raw))
        for cut in sorted({1, 2, 7, len(data) // 2, len(data) - 1} & set(range(1, len(data)))):
            errors += _check_same(data[:-cut], count, base, base_ts, lat) == "error"
        errors += _check_same(data + b"\x00", count, base, base_ts, lat) == "error"
        errors += _check_same(data, count + 1, base, base_ts, lat) == "error"
    assert errors > 50


def test_mutated_bytes_give_the_same_records_or_the_same_error() -> None:
    rng = random.Random(7)
    outcomes = {"ok": 0, "error": 0}
    vectors = [_section(RecordBatch(raw)) for raw in _vectors()]
    for _ in range(3000):
        data, count, base, base_ts, lat = rng.choice(vectors)
        if not data:
            continue
        mutated = bytearray(data)
        for _ in range(rng.randint(1, 3)):
            mutated[rng.randrange(len(mutated))] = rng.randrange(256)
        outcomes[_check_same(bytes(mutated), count, base, base_ts, lat)] += 1
    assert outcomes["ok"] > 100 and outcomes["error"] > 100


def test_varints_at_their_limits() -> None:
    # one record: Length, Attributes, TimestampDelta (10-byte varlong), OffsetDelta, KeyLength -1,
    # ValueLength -1, HeadersCount 0
    varint = encode_varint
    for delta in (-(2**63), 2**63 - 1, -1, 0, 2**31):
        body = b"\x00" + varint(delta) + varint(3) + varint(-1) + varint(-1) + varint(0)
        data = varint(len(body)) + body
        assert _check_same(data, 1, 100, 0, None) == "ok"
    overlong = b"\x00" + b"\xff" * 10 + b"\x01"
    assert _check_same(varint(len(overlong)) + overlong, 1, 0, 0, None) == "error"


def _arrow_rows(raw_batches, include_headers: bool, start: int, end: int) -> list[dict]:
    columns = _native.ArrowColumns(include_headers)
    for raw in raw_batches:
        batch = RecordBatch(raw)
        data, count, base, base_ts, lat = _section(batch)
        columns.add_records(data, count, base, base_ts, lat, int(batch.timestamp_type), 3, start, end)
    buffers = columns.take()
    n = buffers["rows"]

    def binary(name, arrow_type=None, length=n):
        validity, offsets, data, nulls = buffers[name]
        return pa.Array.from_buffers(arrow_type or pa.binary(), length, [None if validity is None else pa.py_buffer(validity),
                                                          pa.py_buffer(offsets), pa.py_buffer(data)], null_count=nulls)
    table = {"key": binary("key").to_pylist(), "value": binary("value").to_pylist(),
             "offset": list(struct.unpack(f"<{n}q", buffers["offset"])),
             "timestamp": list(struct.unpack(f"<{n}q", buffers["timestamp"])),
             "partition": list(struct.unpack(f"<{n}i", buffers["partition"]))}
    if include_headers:
        keys = binary("header_key", pa.string(), buffers["header_rows"]).to_pylist()
        values = binary("header_value", pa.binary(), buffers["header_rows"]).to_pylist()
        bounds = struct.unpack(f"<{n + 1}i", buffers["header_list"])
        table["headers"] = [tuple(zip(keys[a:b], values[a:b])) for a, b in zip(bounds, bounds[1:])]
    return [dict(zip(table, row)) for row in zip(*table.values())]


@pytest.mark.parametrize("include_headers", [False, True])
def test_arrow_columns_equal_the_reference(include_headers: bool) -> None:
    raws = [raw for raw in _vectors() if not RecordBatch(raw).is_control_batch]
    records = []
    for raw in raws:
        records += decode_records_reference(*_section(RecordBatch(raw)))
    start, end = sorted(r.offset for r in records)[len(records) // 4], 2**41
    expected = [{"key": r.key, "value": r.value, "offset": r.offset, "timestamp": r.timestamp * 1000, "partition": 3,
                 **({"headers": r.headers} if include_headers else {})}
                for r in records if start <= r.offset < end]
    assert _arrow_rows(raws, include_headers, start, end) == expected


def test_store_entries_keep_the_latest_per_key_in_key_order() -> None:
    builder = RecordBatchBuilder(0)
    for offset, (key, value) in enumerate([(b"b", b"1"), (b"a", b"2"), (b"b", None), (None, b"x"), (b"c", b"3"),
                                           (b"a", b"4")]):
        builder.append(offset, NOW + offset, key, value)
    data, count, base, base_ts, lat = _section(RecordBatch(builder.build()))
    entries = _native.StoreEntries()
    assert entries.add_records(data, count, base, base_ts, lat, 2, 1, 6) == (4, 1, 5)  # offset 0 is before start
    keys, values, deletes = entries.take_sorted()
    prefix = struct.pack(">i", 2)
    assert keys == [prefix + b"a", prefix + b"c"] and deletes == [prefix + b"b"]
    assert values == [struct.pack(">qq", 5, NOW + 5) + b"4", struct.pack(">qq", 4, NOW + 4) + b"3"]
    assert len(entries) == 0


@pytest.mark.parametrize("shape", ["shared prefix", "binary", "prefixes of each other"])
def test_store_entries_order_and_latest_equal_a_plain_sort(shape: str) -> None:
    """The native sort compares a cached 8-byte window after the keys' common prefix before the
    whole key: its order and its latest-per-key must be exactly those of sorting the bytes."""
    rng = random.Random(shape)
    if shape == "shared prefix":  # a common prefix longer than the window, then digits
        pool = [b"tenant-0042/user-" + b"%d" % rng.randrange(10**6) for _ in range(3_000)]
    elif shape == "binary":
        pool = [rng.randbytes(rng.randrange(0, 20)) for _ in range(3_000)]
    else:  # keys that are prefixes of others, zero bytes at the end of the window
        pool = [b"k" + b"\x00" * rng.randrange(0, 12) + b"\x01" * rng.randrange(0, 3) for _ in range(300)]
    latest: dict[bytes, tuple[int, bytes | None]] = {}
    entries = _native.StoreEntries()
    offset = 0
    for partition in (1, 0, 3):
        builder = RecordBatchBuilder(offset)
        for _ in range(2_000):
            key = rng.choice(pool)
            value = None if rng.random() < 0.1 else b"v%d" % offset
            builder.append(offset, NOW, key, value)
            latest[struct.pack(">i", partition) + key] = (offset, value)
            offset += 1
        data, count, base, base_ts, lat = _section(RecordBatch(builder.build()))
        entries.add_records(data, count, base, base_ts, lat, partition, 0, offset)
    keys, values, deletes = entries.take_sorted()
    expected_puts = sorted(k for k, (_, v) in latest.items() if v is not None)
    assert keys == expected_puts
    assert deletes == sorted(k for k, (_, v) in latest.items() if v is None)
    assert [v[16:] for v in values] == [latest[k][1] for k in expected_puts]


@pytest.mark.parametrize("sort_first", [False, True])
def test_store_entries_compacted_between_batches_keep_the_latest_per_key(sort_first: bool) -> None:
    """``compact()`` between batches (after a ``sort_latest`` or not) drops replaced entries and copies
    the rest, in key order, into a new arena; records taken afterwards still replace them, values of every length."""
    rng = random.Random(7)
    pool = [b"key-%d" % n for n in range(40)]
    latest: dict[bytes, bytes | None] = {}
    entries = _native.StoreEntries()
    offset = 0
    for round_ in range(12):
        builder = RecordBatchBuilder(offset)
        for _ in range(300):
            key = rng.choice(pool)
            value = None if rng.random() < 0.15 else rng.randbytes(rng.choice([0, 3, 50, 400]))
            builder.append(offset, NOW, key, value)
            latest[struct.pack(">i", 0) + key] = value
            offset += 1
        data, count, base, base_ts, lat = _section(RecordBatch(builder.build()))
        entries.add_records(data, count, base, base_ts, lat, 0, 0, offset)
        held = entries.held_bytes
        if sort_first and round_ % 3 == 0:
            entries.sort_latest()
        assert entries.compact() == entries.held_bytes < held and len(entries) <= len(pool)
    keys, values, deletes = entries.take_sorted()
    assert keys == sorted(k for k, v in latest.items() if v is not None)
    assert deletes == sorted(k for k, v in latest.items() if v is None)
    assert [v[16:] for v in values] == [latest[k] for k in keys]


def test_store_entries_sorted_per_partition_in_parallel_keep_the_latest_per_key() -> None:
    """From 65,536 entries on, each partition is sorted and gathered on its own thread: batches of
    partitions arriving interleaved, the same key in several partitions, tombstones and a compaction
    in between must still give exactly the latest entry per (partition, key), in key order."""
    rng = random.Random(11)
    pool = [b"user-%d" % rng.randrange(10**7) for _ in range(20_000)]
    latest: dict[bytes, bytes | None] = {}
    entries = _native.StoreEntries()
    offsets = {partition: 0 for partition in (5, 0, 2, 9, 1)}
    for round_ in range(2):
        for _ in range(30):
            partition = rng.choice(list(offsets))
            builder = RecordBatchBuilder(offsets[partition])
            for _ in range(1_500):
                key = rng.choice(pool)
                value = None if rng.random() < 0.05 else rng.randbytes(rng.choice([0, 7, 120]))
                builder.append(offsets[partition], NOW, key, value)
                latest[struct.pack(">i", partition) + key] = value
                offsets[partition] += 1
            data, count, base, base_ts, lat = _section(RecordBatch(builder.build()))
            entries.add_records(data, count, base, base_ts, lat, partition, 0, offsets[partition])
        if round_ == 0:
            assert len(entries) == 45_000 and entries.compact() == entries.held_bytes
    assert len(entries) >= 65_536  # the parallel path
    keys, values, deletes = entries.take_sorted()
    assert keys == sorted(k for k, v in latest.items() if v is not None)
    assert deletes == sorted(k for k, v in latest.items() if v is None)
    assert [v[16:] for v in values] == [latest[k] for k in keys]


def test_store_entries_reused_after_a_take_keep_only_the_new_records() -> None:
    """A sort gathers into the arena the previous sort replaced (kept to avoid page faults): chunks
    taken one after another from one ``StoreEntries``, each larger or smaller than the last, hold
    exactly their own records, never bytes left from an earlier chunk."""
    rng = random.Random(3)
    entries = _native.StoreEntries()
    offset = 0
    for round_, (records, value_size) in enumerate([(2_000, 300), (50, 5), (3_000, 900), (10, 0), (400, 64)]):
        latest: dict[bytes, bytes | None] = {}
        builder = RecordBatchBuilder(offset)
        for _ in range(records):
            key = b"k%d-%d" % (round_, rng.randrange(records // 2 + 1))
            value = None if rng.random() < 0.1 else rng.randbytes(value_size)
            builder.append(offset, NOW, key, value)
            latest[struct.pack(">i", 0) + key] = value
            offset += 1
        data, count, base, base_ts, lat = _section(RecordBatch(builder.build()))
        entries.add_records(data, count, base, base_ts, lat, 0, 0, offset)
        entries.compact()
        keys, values, deletes = entries.take_sorted()
        assert keys == sorted(k for k, v in latest.items() if v is not None)
        assert deletes == sorted(k for k, v in latest.items() if v is None)
        assert [v[16:] for v in values] == [latest[k] for k in keys]
        assert len(entries) == 0
