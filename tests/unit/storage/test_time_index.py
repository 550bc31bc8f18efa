"""TimeIndex: re-expresses the scenarios of Kafka's TimeIndexTest."""

import random

import pytest

from materializer.storage.errors import CorruptIndexError, InvalidOffsetError
from materializer.storage.time_index import TimeIndex, TimestampOffset

BASE = 45


@pytest.fixture
def idx(tmp_path):
    index = TimeIndex(tmp_path / "00000000000000000045.timeindex", BASE, max_index_size=30 * 12)
    yield index
    index.close_handler()


def test_lookup(idx):
    assert idx.lookup(100) == TimestampOffset(-1, BASE)
    for i in range(1, 10):
        idx.maybe_append(i * 10, i * 10 + BASE)
    assert idx.lookup(9) == TimestampOffset(-1, BASE)
    assert idx.lookup(10) == TimestampOffset(10, 10 + BASE)
    assert idx.lookup(15) == TimestampOffset(10, 10 + BASE)
    assert idx.lookup(90) == TimestampOffset(90, 90 + BASE)
    assert idx.lookup(1000) == TimestampOffset(90, 90 + BASE)


def test_entry_and_overflow(idx):
    idx.maybe_append(10, BASE + 5)
    assert idx.entry(0) == TimestampOffset(10, BASE + 5)
    with pytest.raises(IndexError):
        idx.entry(1)


def test_truncate(idx):
    for i in range(1, 10):
        idx.maybe_append(i * 10, i * 10 + BASE)
    idx.truncate_to(60 + BASE)
    assert idx.entries == 5
    assert idx.last_entry == TimestampOffset(50, 50 + BASE)
    idx.truncate_to(55 + BASE)
    assert idx.entries == 5
    idx.truncate_to(BASE)
    assert idx.entries == 0 and idx.last_entry == TimestampOffset(-1, BASE)


def test_append_rules(idx):
    for i in range(idx.max_entries - 1):
        idx.maybe_append(i + 1, i + 1 + BASE)
    assert idx.is_full()
    with pytest.raises(ValueError):
        idx.maybe_append(10000, 10000 + BASE)
    with pytest.raises(InvalidOffsetError):
        idx.maybe_append(10000, BASE, skip_full_check=True)
    # the reserved last slot
    idx.maybe_append(10000, 10000 + BASE, skip_full_check=True)
    assert idx.entries == idx.max_entries
    assert idx.last_entry == TimestampOffset(10000, 10000 + BASE)


def test_only_larger_timestamps_are_appended(idx):
    idx.maybe_append(10, BASE + 1)
    idx.maybe_append(10, BASE + 2)
    assert idx.entries == 1
    with pytest.raises(ValueError):
        idx.maybe_append(5, BASE + 3)


def test_is_full_reserves_last_slot(tmp_path):
    index = TimeIndex(tmp_path / "00000000000000000000.timeindex", 0, max_index_size=3 * 12)
    index.maybe_append(1, 1)
    assert not index.is_full()
    index.maybe_append(2, 2)
    assert index.is_full()
    index.close()


def test_preallocated_length_rounds_down(tmp_path):
    index = TimeIndex(tmp_path / "00000000000000000000.timeindex", 0, max_index_size=10485760)
    assert index.length == 10485756 and index.max_entries == 873813
    index.close()
    assert (tmp_path / "00000000000000000000.timeindex").stat().st_size == 0


def test_resize(idx):
    idx.maybe_append(5, BASE + 1)
    idx.trim_to_valid_size()
    assert idx.length == 12
    idx.resize(120)
    assert idx.max_entries == 10 and idx.last_entry == TimestampOffset(5, BASE + 1)


def test_sanity_check(tmp_path):
    path = tmp_path / "00000000000000000045.timeindex"
    index = TimeIndex(path, BASE, max_index_size=30 * 12)
    index.maybe_append(100, BASE + 1)
    index.maybe_append(200, BASE + 2)
    index.sanity_check()
    index.close()
    raw = bytearray(path.read_bytes())
    raw[12:20] = (50).to_bytes(8, "big")  # last timestamp below the first
    path.write_bytes(bytes(raw))
    again = TimeIndex(path, BASE)
    with pytest.raises(CorruptIndexError):
        again.sanity_check()
    again.close_handler()
    path.write_bytes(b"\x00" * 13)
    odd = TimeIndex(path, BASE)
    with pytest.raises(CorruptIndexError):
        odd.sanity_check()
    odd.close_handler()


# -- every lookup against a model: at, just below and just above each entry, and past the end -------
# Kafka's AbstractIndex.indexSlotRangeFor searches the last 8 KiB of entries (the warm section,
# 682 time entries) apart from the rest: 1,000 entries put targets in both halves.


def _entries(count: int, seed: int) -> list[TimestampOffset]:
    rng = random.Random(seed)
    timestamps = sorted(rng.sample(range(1_700_000_000_000, 1_700_000_000_000 + 7 * count), count))
    offsets = sorted(rng.sample(range(BASE, BASE + 5 * count), count))
    return [TimestampOffset(t, o) for t, o in zip(timestamps, offsets)]


def _around(values) -> list[int]:
    return sorted({v + d for v in values for d in (-1, 0, 1)})


@pytest.mark.parametrize("count", [1, 2, 29, 1000])
def test_every_lookup_near_each_entry_equals_a_linear_scan(tmp_path, count):
    """TimeIndex.lookup: the entry with the greatest timestamp <= target, else (-1, base offset)."""
    entries = _entries(count, seed=count)
    path = tmp_path / f"{BASE:020d}.timeindex"
    index = TimeIndex(path, BASE, max_index_size=(count + 5) * 12)
    for timestamp, offset in entries:
        index.maybe_append(timestamp, offset)
    index.close()
    reopened = TimeIndex(path, BASE, writable=False)
    try:
        assert reopened.all_entries() == entries
        last = entries[-1].timestamp
        for target in _around([entries[0].timestamp - 1, *(e.timestamp for e in entries), last + 1]) + [2**63 - 1]:
            expected = TimestampOffset(-1, BASE)
            for entry in entries:
                if entry.timestamp <= target:
                    expected = entry
            assert reopened.lookup(target) == expected, target
    finally:
        reopened.close_handler()


@pytest.mark.parametrize("count", [2, 29, 1000])
def test_truncate_near_each_entry_keeps_exactly_the_entries_below(tmp_path, count):
    """TimeIndex.truncate_to(offset) removes every entry whose offset is >= offset."""
    entries = _entries(count, seed=count + 3)
    template = tmp_path / "template.timeindex"
    index = TimeIndex(template, BASE, max_index_size=(count + 5) * 12)
    for timestamp, offset in entries:
        index.maybe_append(timestamp, offset)
    index.close()
    picked = {0, 1, count // 2, count - 2, count - 1, max(0, count - 1 - 682), max(0, count - 682)}
    for n, target in enumerate(_around([entries[i].offset for i in sorted(picked) if 0 <= i < count])):
        copy = tmp_path / f"{BASE:020d}-{n}.timeindex"
        copy.write_bytes(template.read_bytes())
        truncated = TimeIndex(copy, BASE, max_index_size=(count + 5) * 12)
        try:
            truncated.truncate_to(target)
            kept = [e for e in entries if e.offset < target]
            assert truncated.all_entries() == kept, target
            assert truncated.last_entry == (kept[-1] if kept else TimestampOffset(-1, BASE))
        finally:
            truncated.close_handler()
