"""OffsetIndex: re-expresses the scenarios of Kafka's OffsetIndexTest."""

import random

import pytest

from materializer.storage.errors import CorruptIndexError, IndexOffsetOverflowError, InvalidOffsetError
from materializer.storage.offset_index import OffsetIndex, OffsetPosition


@pytest.fixture
def index(tmp_path):
    idx = OffsetIndex(tmp_path / "00000000000000000045.index", 45, max_index_size=30 * 8)
    yield idx
    idx.close_handler()


def test_new_index_is_preallocated_and_empty(index):
    assert index.entries == 0
    assert index.max_entries == 30
    assert index.path.stat().st_size == 240
    assert index.lookup(100) == OffsetPosition(45, 0)


def test_random_lookup(index):
    vals = sorted(random.Random(1).sample(range(46, 1000), 29))
    positions = sorted(random.Random(2).sample(range(0, 100000), 29))
    for offset, position in zip(vals, positions):
        index.append(offset, position)
    entries = list(zip(vals, positions))
    for target in range(40, 1010):
        expected = OffsetPosition(45, 0)
        for offset, position in entries:
            if offset <= target:
                expected = OffsetPosition(offset, position)
        assert index.lookup(target) == expected


def test_lookup_extreme_cases(index):
    assert index.lookup(index.base_offset) == OffsetPosition(45, 0)
    for i in range(index.max_entries):
        index.append(index.base_offset + i + 1, i)
    assert index.lookup(index.base_offset) == OffsetPosition(45, 0)
    assert index.lookup(index.base_offset + 1) == OffsetPosition(46, 0)
    assert index.lookup(10**9) == OffsetPosition(45 + index.max_entries, index.max_entries - 1)


def test_entry_and_overflow(index):
    index.append(50, 100)
    assert index.entry(0) == OffsetPosition(50, 100)
    with pytest.raises(IndexError):
        index.entry(1)
    with pytest.raises(IndexOffsetOverflowError):
        index.append(45 + 2**31, 200)


def test_append_too_many(index):
    for i in range(index.max_entries):
        index.append(index.base_offset + i + 1, i)
    assert index.is_full()
    with pytest.raises(ValueError):
        index.append(1000, 1000)


def test_append_out_of_order(index):
    index.append(51, 0)
    with pytest.raises(InvalidOffsetError):
        index.append(51, 1)
    with pytest.raises(InvalidOffsetError):
        index.append(50, 1)


def test_fetch_upper_bound_offset(index):
    index.append(50, 0)
    index.append(60, 100)
    index.append(70, 200)
    assert index.fetch_upper_bound_offset(OffsetPosition(50, 0), 100) == OffsetPosition(60, 100)
    assert index.fetch_upper_bound_offset(OffsetPosition(50, 0), 150) == OffsetPosition(70, 200)
    assert index.fetch_upper_bound_offset(OffsetPosition(60, 100), 200) is None


def test_reopen_sees_file_length_entries(tmp_path):
    path = tmp_path / "00000000000000000045.index"
    idx = OffsetIndex(path, 45, max_index_size=30 * 8)
    for i in range(5):
        idx.append(46 + i, i * 10)
    idx.close()  # trims
    assert path.stat().st_size == 40
    again = OffsetIndex(path, 45, max_index_size=30 * 8, writable=False)
    assert again.entries == 5
    assert again.last_offset == 50
    assert again.lookup(48) == OffsetPosition(48, 20)
    again.close_handler()


def test_untrimmed_reopen_counts_every_slot(tmp_path):
    path = tmp_path / "00000000000000000000.index"
    idx = OffsetIndex(path, 0, max_index_size=80)
    idx.append(5, 10)
    idx.close_handler()  # no trim: crash
    assert OffsetIndex(path, 0).entries == 10


def test_truncate(tmp_path):
    idx = OffsetIndex(tmp_path / "00000000000000000000.index", 0, max_index_size=80)
    for i in range(1, 10):
        idx.append(i, i)
    idx.truncate_to(10)
    assert idx.entries == 9
    idx.truncate_to(9)
    assert idx.lookup(10) == OffsetPosition(8, 8)
    assert idx.last_offset == 8
    idx.truncate_to(5)
    assert idx.lookup(10) == OffsetPosition(4, 4)
    idx.truncate_to(0)
    assert idx.entries == 0 and idx.lookup(10) == OffsetPosition(0, 0)
    idx.append(3, 3)
    assert idx.lookup(3) == OffsetPosition(3, 3)
    idx.close()


def test_truncate_to_offset_between_entries(tmp_path):
    idx = OffsetIndex(tmp_path / "00000000000000000000.index", 0, max_index_size=80)
    for offset in (10, 20, 30):
        idx.append(offset, offset)
    idx.truncate_to(25)
    assert idx.all_entries() == [OffsetPosition(10, 10), OffsetPosition(20, 20)]
    idx.close()


def test_sanity_last_offset_equal_to_base_offset(tmp_path):
    idx = OffsetIndex(tmp_path / "00000000000000000020.index", 20, max_index_size=80)
    idx.append(20, 5)
    idx.sanity_check()
    idx.close()


def test_sanity_check_length_not_multiple(tmp_path):
    path = tmp_path / "00000000000000000000.index"
    path.write_bytes(b"\x00" * 12)
    idx = OffsetIndex(path, 0)
    with pytest.raises(CorruptIndexError, match="multiple of 8"):
        idx.sanity_check()
    idx.close_handler()


def test_sanity_check_last_offset_below_base(tmp_path):
    path = tmp_path / "00000000000000000100.index"
    path.write_bytes((-5).to_bytes(4, "big", signed=True) + (0).to_bytes(4, "big"))
    idx = OffsetIndex(path, 100)
    with pytest.raises(CorruptIndexError):
        idx.sanity_check()
    idx.close_handler()


def test_resize_and_trim(index):
    index.append(46, 1)
    index.trim_to_valid_size()
    assert index.path.stat().st_size == 8 and index.is_full()
    index.resize(800)
    assert index.max_entries == 100 and index.entries == 1
    assert index.lookup(46) == OffsetPosition(46, 1)


# -- every lookup against a model: at, just below and just above each entry, and past the end -------
# Kafka's AbstractIndex.indexSlotRangeFor searches the last 8 KiB of entries (the warm section,
# 1,024 offset entries) apart from the rest: 1,500 entries put targets in both halves.


def _model_lookup(entries: list[OffsetPosition], base: int, target: int) -> OffsetPosition:
    """OffsetIndex.lookup by a linear scan: the last entry with offset <= target, else (base, 0)."""
    found = OffsetPosition(base, 0)
    for entry in entries:
        if entry.offset <= target:
            found = entry
    return found


def _model_upper_bound(entries: list[OffsetPosition], target_position: int) -> OffsetPosition | None:
    """OffsetIndex.fetchUpperBoundOffset by a linear scan: the first entry with position >= target,
    except that a target equal to the first entry's position gives the second entry (None when there
    is one entry): Kafka's ``AbstractIndex.binarySearch`` never compares slot 0, so it answers
    ``lo + 1`` there. Still an upper bound, which is all Kafka promises ("not generally the smallest")."""
    if entries and target_position == entries[0].position:
        return entries[1] if len(entries) > 1 else None
    return next((entry for entry in entries if entry.position >= target_position), None)


def _random_entries(count: int, base: int, seed: int) -> list[OffsetPosition]:
    rng = random.Random(seed)
    offsets = sorted(rng.sample(range(base, base + 5 * count), count))  # may start at the base offset
    positions = sorted(rng.sample(range(0, 300 * count), count))  # may start at byte 0
    return [OffsetPosition(o, p) for o, p in zip(offsets, positions)]


def _around(values) -> list[int]:
    return sorted({v + d for v in values for d in (-1, 0, 1)})


@pytest.mark.parametrize("count", [1, 2, 29, 1500])
def test_every_lookup_near_each_entry_equals_a_linear_scan(tmp_path, count):
    base = 1_000
    entries = _random_entries(count, base, seed=count)
    path = tmp_path / f"{base:020d}.index"
    idx = OffsetIndex(path, base, max_index_size=(count + 5) * 8)
    for offset, position in entries:
        idx.append(offset, position)
    idx.close()  # trimmed; reopened read-only, the entries come from the file length
    reopened = OffsetIndex(path, base, writable=False)
    try:
        assert reopened.entries == count
        last = entries[-1].offset
        targets = _around([base, *(e.offset for e in entries), last + 1]) + [last + 10**6, base + 2**31 - 1]
        for target in targets:
            assert reopened.lookup(target) == _model_lookup(entries, base, target), target
    finally:
        reopened.close_handler()


@pytest.mark.parametrize("count", [1, 2, 29, 1500])
def test_every_upper_bound_near_each_entry_position_equals_a_linear_scan(tmp_path, count):
    """fetch_upper_bound_offset (Kafka ``OffsetIndex.fetchUpperBoundOffset``): fetches from the
    segment start and from entries spread over the index, of sizes that end at, one byte below and
    one byte above each entry's position, and past the last one."""
    base = 1_000
    entries = _random_entries(count, base, seed=count + 7)
    idx = OffsetIndex(tmp_path / f"{base:020d}.index", base, max_index_size=(count + 5) * 8)
    try:
        for offset, position in entries:
            idx.append(offset, position)
        last_position = entries[-1].position
        ends = _around([0, *(e.position for e in entries), last_position + 1]) + [last_position + 10**6]
        starts = [OffsetPosition(base, 0), *entries[::max(1, count // 5)], entries[-1]]
        for start in starts:
            for end in ends:
                if end < start.position:
                    continue
                size = end - start.position
                found = idx.fetch_upper_bound_offset(start, size)
                assert found == _model_upper_bound(entries, end), (start, size)
                assert found is None or found.position >= end  # outside the fetched range
    finally:
        idx.close_handler()


@pytest.mark.parametrize("count", [2, 29, 1500])
def test_truncate_near_each_entry_keeps_exactly_the_entries_below(tmp_path, count):
    base = 1_000
    entries = _random_entries(count, base, seed=count + 11)
    path = tmp_path / "template.index"
    idx = OffsetIndex(path, base, max_index_size=(count + 5) * 8)
    for offset, position in entries:
        idx.append(offset, position)
    idx.close()
    picked = {0, 1, count // 2, count - 2, count - 1, max(0, count - 1 - 1024), max(0, count - 1024)}
    for n, target in enumerate(_around([entries[i].offset for i in sorted(picked) if 0 <= i < count])):
        copy = tmp_path / f"{base:020d}-{n}.index"
        copy.write_bytes(path.read_bytes())
        truncated = OffsetIndex(copy, base, max_index_size=(count + 5) * 8)
        try:
            truncated.truncate_to(target)
            assert truncated.all_entries() == [e for e in entries if e.offset < target], target
            assert truncated.last_offset == max((e.offset for e in entries if e.offset < target), default=base)
        finally:
            truncated.close_handler()
