"""The cleaner's native map passes (SkimpyOffsetMap) against the Python maps' passes over a
keys-only scan (DigestDictOffsetMap), bulk map operations, verbatim copies: same bytes on disk,
same statistics."""

from __future__ import annotations

import random
import shutil
from pathlib import Path

import pytest

from materializer.storage.cleaner import Cleaner
from materializer.storage.compression import CompressionType
from materializer.storage.errors import CorruptRecordError
from materializer.storage.log import Log
from materializer.storage.offset_map import DigestDictOffsetMap, SkimpyOffsetMap
from materializer.storage.record_batch import RecordBatch
from materializer.storage.record_batch_builder import RecordBatchBuilder
from materializer.storage.cleaner_filter import rebuild_batch
from materializer.storage.record_scan import encode_retained_batch, records_section, scan_keys

from .cleaner_fixtures import abort, commit, make_log

NOW = 1_700_000_000_000


def _random_batch(rng: random.Random, base: int, *, keys: int, gap: bool) -> tuple[bytes, int]:
    codec = rng.choice([CompressionType.NONE, CompressionType.NONE, CompressionType.ZSTD, CompressionType.GZIP])
    builder = RecordBatchBuilder(base, compression=codec)
    offset = base
    for _ in range(rng.randint(1, 12)):
        k = None if rng.random() < 0.03 else b"k%d" % rng.randrange(keys)
        v = None if rng.random() < 0.1 else rng.randbytes(rng.choice([0, 5, 70, 300]))
        headers = (("h", b"x"), ("n", None)) if rng.random() < 0.1 else ()
        builder.append(offset, NOW - 10_000 + rng.randrange(5_000), k, v, headers)
        offset += 2 if gap and rng.random() < 0.3 else 1
    return builder.build(), offset


def _fill(log: Log, rng: random.Random, batches: int, keys: int) -> None:
    sequence = 0
    for i in range(batches):
        if i % 17 == 5:  # a transaction of one batch, committed or aborted
            base = log.log_end_offset
            builder = RecordBatchBuilder(base, producer_id=7, producer_epoch=0, base_sequence=sequence,
                                         is_transactional=True)
            for j in range(3):
                builder.append(base + j, NOW - 6_000, b"k%d" % rng.randrange(keys), b"txn")
            log.append_batch(builder.build())
            sequence += 3
            (abort if i % 2 else commit)(log, 7, timestamp=NOW - 5_000)
            continue
        data, _ = _random_batch(rng, log.log_end_offset, keys=keys, gap=i % 3 == 0)
        log.append_batch(data)


def _dump(log: Log) -> list[bytes]:
    return [bytes(b.buffer) for s in log.log_segments() for _, b in s.log.batches_from(0)]


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_fast_paths_match_the_record_by_record_path(tmp_path: Path, seed: int) -> None:
    """DigestDictOffsetMap decides through OffsetMap's Python passes, SkimpyOffsetMap through its native ones."""
    rng = random.Random(seed)
    source = make_log(tmp_path / "src", segment_bytes=4096)
    _fill(source, rng, 120, keys=40)
    source.roll()
    source.close()
    results = {}
    for name, offset_map in (("dict", DigestDictOffsetMap(24 * 1000)), ("skimpy", SkimpyOffsetMap(24 * 1000))):
        shutil.copytree(tmp_path / "src", tmp_path / name)
        log = make_log(tmp_path, name=f"{name}/topic-0", segment_bytes=4096)
        cleaner = Cleaner(offset_map=offset_map, clock_ms=lambda: NOW)
        rounds = []
        end, stats = cleaner.do_clean(log, 0, log.active_segment.base_offset, NOW)
        rounds.append((end, stats.messages_read, stats.messages_written, stats.invalid_messages_read,
                       stats.bytes_read, stats.bytes_written, stats.map_messages_read))
        _fill(log, random.Random(seed + 100), 60, keys=40)  # second round: a clean section below the dirty one
        log.roll()
        end, stats = cleaner.do_clean(log, end, log.active_segment.base_offset, NOW + 86_400_001)
        rounds.append((end, stats.messages_read, stats.messages_written, stats.invalid_messages_read,
                       stats.bytes_read, stats.bytes_written, stats.map_messages_read))
        results[name] = (rounds, _dump(log))
        log.close()
    assert results["dict"] == results["skimpy"]
    assert results["dict"][0][0][3] > 0  # null keys were counted invalid


def test_scan_keys_matches_records(tmp_path: Path) -> None:
    rng = random.Random(5)
    for i in range(200):
        data, _ = _random_batch(rng, 1000 + i * 50, keys=10, gap=i % 2 == 0)
        batch = RecordBatch(data)
        records = batch.records()
        scan = scan_keys(batch)
        assert scan.offsets == [r.offset for r in records]
        assert scan.keys == [r.key for r in records]
        assert scan.tombstones == [i for i, r in enumerate(records) if r.value is None]
        assert scan.data == records_section(batch)
        chosen = [i for i in range(len(records)) if i % 2]
        if chosen:
            # the kept records' bytes re-based natively == the Python builder fed Record objects
            for horizon in (None, 1_900_000_000_000):
                kept = [records[i] for i in chosen]
                encoded = encode_retained_batch(batch, scan.data, chosen, horizon)
                assert encoded == rebuild_batch(batch, kept, horizon)
                assert RecordBatch(encoded).records() == kept


@pytest.mark.parametrize("cut", [1, 7, 20])
def test_scan_keys_rejects_what_records_rejects(cut: int) -> None:
    builder = RecordBatchBuilder(0)
    for i in range(3):
        builder.append(i, NOW, b"key%d" % i, b"value" * 4)
    good = bytearray(builder.build())
    # shorten the records section without fixing the framing: a record runs past the batch
    bad = bytearray(good[:-cut])
    bad[8:12] = (len(bad) - 12).to_bytes(4, "big")
    batch = RecordBatch(bytes(bad))
    with pytest.raises(CorruptRecordError) as from_records:
        batch.records()
    with pytest.raises(CorruptRecordError) as from_scan:
        scan_keys(batch)
    assert str(from_scan.value) == str(from_records.value)


@pytest.mark.parametrize("impl", [DigestDictOffsetMap, SkimpyOffsetMap])
def test_bulk_map_operations_equal_single_ones(impl) -> None:
    keys = [b"k%d" % (i % 7) for i in range(20)]
    offsets = list(range(100, 120))
    bulk, single = impl(24 * 100), impl(24 * 100)
    bulk.put_many(keys, offsets)
    for k, o in zip(keys, offsets):
        single.put(k, o)
    probe = keys + [b"absent"]
    assert bulk.get_many(probe) == [single.get(k) for k in probe] == [bulk.get(k) for k in probe]
    assert (bulk.size, bulk.latest_offset) == (single.size, single.latest_offset) == (7, 119)


def test_put_many_fills_up_at_the_same_entry_as_put() -> None:
    offset_map = DigestDictOffsetMap(24 * 5)
    with pytest.raises(ValueError, match="full offset map"):
        offset_map.put_many([b"a", b"b", b"c", b"d", b"e", b"f"], [0, 1, 2, 3, 4, 5])
    assert offset_map.size == 5 and offset_map.latest_offset == 4
