"""Tests for the cleaner's offset map (re-expresses Kafka's ``OffsetMapTest`` scenarios)."""

from __future__ import annotations

import hashlib
import random
import struct

import pytest

from materializer.storage.offset_map import (
    BYTES_PER_ENTRY,
    DigestDictOffsetMap,
    OffsetMap,
    ReferenceSkimpyOffsetMap,
    SkimpyOffsetMap,
    new_offset_map,
)

MEMORY_SIZE = 4096
IMPLEMENTATIONS = [SkimpyOffsetMap, ReferenceSkimpyOffsetMap, DigestDictOffsetMap]


def key(i: int) -> bytes:
    return str(i).encode()


def fill(offset_map: OffsetMap, start: int = 37) -> int:
    i = start
    while offset_map.size < offset_map.slots:
        offset_map.put(key(i), i)
        i += 1
    return i


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
@pytest.mark.parametrize("items", [10, 100, 1000, 5000])
def test_basic_validation(impl, items):
    offset_map = impl(items * 48)
    for i in range(items):
        offset_map.put(key(i), i)
    for i in range(items):
        assert offset_map.get(key(i)) == i


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_clear(impl):
    offset_map = impl(MEMORY_SIZE)
    for i in range(10):
        offset_map.put(key(i), i)
    assert [offset_map.get(key(i)) for i in range(10)] == list(range(10))
    offset_map.clear()
    assert [offset_map.get(key(i)) for i in range(10)] == [-1] * 10
    assert offset_map.size == 0 and offset_map.latest_offset == -1


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_get_when_full(impl):
    offset_map = impl(MEMORY_SIZE)
    i = fill(offset_map)
    assert offset_map.get(key(i)) == -1
    assert offset_map.get(key(i - 1)) == i - 1


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_put_when_full_raises_even_for_existing_key(impl):
    offset_map = impl(MEMORY_SIZE)
    i = fill(offset_map)
    with pytest.raises(ValueError, match="full offset map"):
        offset_map.put(key(i), i)
    with pytest.raises(ValueError, match="full offset map"):
        offset_map.put(key(i - 1), i)


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_update_latest_offset(impl):
    offset_map = impl(MEMORY_SIZE)
    i = fill(offset_map)
    assert offset_map.get(key(i - 1)) == i - 1
    offset_map.update_latest_offset(40)
    assert offset_map.latest_offset == 40
    assert offset_map.get(key(40)) == 40


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_latest_offset(impl):
    offset_map = impl(MEMORY_SIZE)
    i = fill(offset_map)
    assert offset_map.latest_offset == i - 1


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_utilization(impl):
    offset_map = impl(MEMORY_SIZE)
    assert offset_map.utilization == 0.0
    i = 37
    while offset_map.size < offset_map.slots:
        offset_map.put(key(i), i)
        assert offset_map.utilization == offset_map.size / offset_map.slots
        i += 1


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_slots_and_capacity(impl):
    offset_map = impl(134217728)
    assert offset_map.slots == 5592405
    assert int(offset_map.slots * 0.9) == 5033164
    with pytest.raises(ValueError):
        impl(BYTES_PER_ENTRY - 1)


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_overwrite_keeps_size(impl):
    offset_map = impl(MEMORY_SIZE)
    offset_map.put(b"k", 5)
    offset_map.put(b"k", 3)
    assert offset_map.size == 1
    assert offset_map.get(b"k") == 3
    assert offset_map.latest_offset == 3
    offset_map.put(b"", 9)  # the empty key is a key (only a null key is not)
    assert offset_map.get(b"") == 9 and offset_map.size == 2


def test_kafka_layout_and_first_probe():
    """The entry lands at slot abs(int32 BE of digest[0:4]) % slots with digest then int64 offset."""
    offset_map = ReferenceSkimpyOffsetMap(MEMORY_SIZE)
    digest = hashlib.md5(b"hello").digest()
    probe = struct.unpack(">i", digest[:4])[0]
    position = (abs(probe) % offset_map.slots) * BYTES_PER_ENTRY
    offset_map.put(b"hello", 1234)
    entry = bytes(offset_map._buffer[position : position + BYTES_PER_ENTRY])
    assert entry == digest + struct.pack(">q", 1234)


def test_implementations_agree():
    rng = random.Random(7)
    exact, fast = SkimpyOffsetMap(24 * 500), DigestDictOffsetMap(24 * 500)
    for step in range(3000):
        k = key(rng.randrange(700))
        if rng.random() < 0.6 and exact.size < int(exact.slots * 0.9):
            exact.put(k, step)
            fast.put(k, step)
        assert exact.get(k) == fast.get(k)
        assert (exact.size, exact.latest_offset) == (fast.size, fast.latest_offset)


def test_new_offset_map():
    offset_map = new_offset_map(4096)
    assert isinstance(offset_map, SkimpyOffsetMap)
    assert offset_map.memory_bytes == 4096 // 24 * 24  # exactly Kafka's 24 bytes per slot


@pytest.mark.parametrize("slots", [1, 7, 64, 1000])
def test_native_table_holds_what_kafkas_table_holds(slots):
    """Same outcome of every put and get, same full point, the same entries (digest and offset):
    only where they sit differs, which nothing observes."""
    rng = random.Random(slots)
    native, reference = SkimpyOffsetMap(24 * slots), ReferenceSkimpyOffsetMap(24 * slots)
    keys = [key(rng.randrange(slots * 3)) for _ in range(slots * 4)]
    for offset, k in enumerate(keys):
        outcomes = []
        for offset_map in (native, reference):
            try:
                offset_map.put(k, offset)
                outcomes.append("ok")
            except ValueError as exc:
                outcomes.append(str(exc))
        assert outcomes[0] == outcomes[1]
        assert native.get(k) == reference.get(k)
        assert (native.size, native.latest_offset) == (reference.size, reference.latest_offset)
    assert native.sorted_entries() == reference.sorted_entries()
    assert len(native.sorted_entries()) == 24 * native.size
    assert native.get_many(keys) == [reference.get(k) for k in keys]


def test_native_table_grows_to_kafkas_slots_and_fills_them():
    """Past its first 65,536 buckets the table grows (to 131,072, within an eighth of the slots,
    then to all 1,100,003 slots) and still holds every entry; filled to ``slots`` (no empty bucket
    left) it refuses a new key, finds every stored one and answers -1 for any other; after a clear
    it starts over."""
    slots = 1_100_003
    offset_map = SkimpyOffsetMap(24 * slots)
    keys = [key(i) for i in range(slots)]
    offset_map.put_many(keys, list(range(slots)))
    assert offset_map.size == slots
    with pytest.raises(ValueError, match="full offset map"):
        offset_map.put(b"one more", 1)
    assert offset_map.get_many(keys) == list(range(slots))
    assert offset_map.get_many([b"absent", b"also absent"]) == [-1, -1]
    expected = sorted(hashlib.md5(k).digest() + struct.pack(">q", i) for i, k in enumerate(keys))
    assert offset_map.sorted_entries() == b"".join(expected)
    offset_map.clear()
    assert (offset_map.size, offset_map.get(keys[0]), offset_map.sorted_entries()) == (0, -1, b"")
    offset_map.put(keys[7], 70)
    assert (offset_map.size, offset_map.get(keys[7])) == (1, 70)


def test_native_batch_passes_digest_keys_of_every_length_as_md5():
    """The map and recopy passes digest a batch's keys eight at a time (one 64-byte MD5 block per
    key up to 55 bytes, longer keys on their own): every length from 0 to 130 bytes, in one
    batch, must land under its MD5 and be found again."""
    from materializer.storage.record_batch import RecordBatch
    from materializer.storage.record_batch_builder import RecordBatchBuilder
    from materializer.storage.record_scan import records_section

    keys = [bytes((i * 7 + j) % 256 for j in range(i)) for i in range(131)]
    builder = RecordBatchBuilder(0)
    for offset, k in enumerate(keys):
        builder.append(offset, 1000, k, b"v")
    batch = RecordBatch(builder.build())
    data = records_section(batch)
    offset_map = SkimpyOffsetMap(24 * 1000)
    assert offset_map.map_records_section(data, len(keys), 0, 0, len(keys), 1000) == (len(keys), False)
    expected = sorted(hashlib.md5(k).digest() + struct.pack(">q", i) for i, k in enumerate(keys))
    assert offset_map.sorted_entries() == b"".join(expected)
    assert offset_map.kept_in_section(data, len(keys), 0, True) == (list(range(len(keys))), False, 0)
    offset_map.put_many(keys[::2], [1000] * len(keys[::2]))  # later offsets for every other key
    assert offset_map.kept_in_section(data, len(keys), 0, True) == (list(range(1, len(keys), 2)), False, 0)


def test_native_put_many_fills_up_at_the_same_entry_as_put():
    keys = [key(i % 9) for i in range(30)]
    bulk, single = SkimpyOffsetMap(24 * 6), ReferenceSkimpyOffsetMap(24 * 6)
    with pytest.raises(ValueError, match="full offset map"):
        bulk.put_many(keys, list(range(30)))
    with pytest.raises(ValueError, match="full offset map"):
        for i, k in enumerate(keys):
            single.put(k, i)
    assert (bulk.size, bulk.latest_offset) == (single.size, single.latest_offset)
    assert bulk.sorted_entries() == single.sorted_entries()


def _section(rng: random.Random, base: int) -> tuple[bytes, int]:
    """An uncompressed records section with null keys, tombstones and offset gaps."""
    from materializer.storage.record_batch import RecordBatch
    from materializer.storage.record_batch_builder import RecordBatchBuilder
    from materializer.storage.record_scan import records_section

    builder = RecordBatchBuilder(base)
    offset = base
    for _ in range(rng.randint(1, 15)):
        k = None if rng.random() < 0.1 else b"k%d" % rng.randrange(12)
        builder.append(offset, 1000, k, None if rng.random() < 0.2 else b"v")
        offset += rng.choice([1, 1, 2])
    batch = RecordBatch(builder.build())
    return records_section(batch), batch.header.records_count


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_section_passes_equal_across_implementations(seed):
    """The cleaner's one interface per batch: Python passes (OffsetMap) == native passes (Skimpy)."""
    rng = random.Random(seed)
    maps = [impl(24 * 16) for impl in IMPLEMENTATIONS]
    base = 0
    horizon_dropped_a_tombstone = False
    for _ in range(12):
        data, count = _section(rng, base)
        start, end, max_entries = base + rng.randrange(3), base + rng.randrange(4, 30), rng.randrange(5, 15)
        mapped = [m.map_records_section(data, count, base, start, end, max_entries) for m in maps]
        assert mapped[1:] == mapped[:-1]
        assert len({(m.size, m.latest_offset) for m in maps}) == 1
        retained = [m.retained_in_section(data, count, base) for m in maps]
        assert retained[1:] == retained[:-1]
        by_rule = []
        for retain_deletes in (True, False):
            kept = [m.kept_in_section(data, count, base, retain_deletes) for m in maps]
            assert kept[1:] == kept[:-1]
            by_rule.append(kept[0])
        horizon_dropped_a_tombstone |= by_rule[0] != by_rule[1]
        base += 30
        if mapped[0][1]:
            for m in maps:
                m.clear()
    assert horizon_dropped_a_tombstone  # the delete-horizon rule was exercised
