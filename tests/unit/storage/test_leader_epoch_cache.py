"""``leader-epoch-checkpoint`` and ``LeaderEpochFileCache`` (KIP-101, KIP-279).

Cases re-expressed from Kafka's ``LeaderEpochFileCacheTest`` and
``LeaderEpochCheckpointFileWithFailureHandlerTest`` (storage module, 4.x), plus the file-format
edges of ``CheckpointFile.CheckpointReadBuffer``.
"""

from __future__ import annotations

import errno

import pytest

from materializer.storage.errors import CorruptCheckpointError, LogStorageError
from materializer.storage.leader_epoch_cache import (
    LEADER_EPOCH_CHECKPOINT_FILE,
    UNDEFINED_EPOCH,
    UNDEFINED_EPOCH_OFFSET,
    EpochEntry,
    LeaderEpochCheckpointFile,
    LeaderEpochFileCache,
    entries_from_batch_epochs,
)

UNDEFINED = (UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET)


@pytest.fixture
def path(tmp_path):
    return tmp_path / LEADER_EPOCH_CHECKPOINT_FILE


@pytest.fixture
def cache(path):
    return LeaderEpochFileCache(path)


def _entries(*pairs):
    return [EpochEntry(e, s) for e, s in pairs]


# -- the file ---------------------------------------------------------------------------------------


def test_file_persists_overwrites_and_reloads(path):
    checkpoint = LeaderEpochCheckpointFile(path)
    epochs = _entries((0, 1), (1, 2), (2, 3))
    checkpoint.write(epochs)
    assert path.read_bytes() == b"0\n3\n0 1\n1 2\n2 3\n"
    assert checkpoint.read() == epochs
    epochs2 = _entries((3, 4), (4, 5))
    checkpoint.write(epochs2)
    assert checkpoint.read() == epochs2
    assert LeaderEpochCheckpointFile(path).read() == epochs2  # a new instance reads the same
    assert not path.with_name(path.name + ".tmp").exists()


def test_empty_missing_and_version_only_files_have_no_entries(path):
    checkpoint = LeaderEpochCheckpointFile(path)
    assert checkpoint.read() == []
    checkpoint.create_if_missing()
    assert path.read_bytes() == b""  # Kafka's CheckpointFile creates it empty
    assert checkpoint.read() == []
    path.write_text("0\n")  # CheckpointReadBuffer: no count line = no entries
    assert checkpoint.read() == []
    checkpoint.write([])
    assert path.read_bytes() == b"0\n0\n"
    path.write_text("0\n1\n7 \t 100\r\n")  # split on \s+, trailing blanks dropped, \r\n ends a line
    assert checkpoint.read() == _entries((7, 100))


@pytest.mark.parametrize("text, line", [
    ("1\n0\n", "line 1"),             # another version
    ("x\n0\n", "line 1"),
    (" 0\n0\n", "line 1"),            # Integer.parseInt does not trim
    ("0\nx\n", "line 2"),
    ("0\n2\n0 0\n", "line 2"),        # count mismatch
    ("0\n0\n0 0\n", "line 2"),
    ("0\n1\n0\n", "line 3"),          # one token
    ("0\n1\n0 0 0\n", "line 3"),      # three tokens
    ("0\n1\n 0 0\n", "line 3"),       # a leading blank makes an empty first token
    ("0\n1\n\n", "line 3"),           # an empty line
    ("0\n1\n0 x\n", "line 3"),
    ("0\n1\n2147483648 0\n", "line 3"),  # the epoch is an int32
    ("0\n1\n-1 0\n", "line 3"),       # negative epoch (assign refuses it)
    ("0\n1\n0 -5\n", "line 3"),
    ("0\n2\n3 10\n2 20\n", "line 4"),  # epochs go down
    ("0\n2\n2 10\n3 10\n", "line 4"),  # start offsets do not increase
])
def test_malformed_files_name_the_file_and_the_line(path, text, line):
    path.write_text(text, newline="")
    with pytest.raises(CorruptCheckpointError) as info:
        LeaderEpochCheckpointFile(path).read()
    assert str(path) in str(info.value) and line in str(info.value)
    with pytest.raises(CorruptCheckpointError):
        LeaderEpochFileCache(path)


def test_a_failed_write_is_a_storage_error_and_changes_nothing(path, cache, monkeypatch):
    cache.assign(2, 6)

    def full(*_args, **_kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr("materializer.storage.checkpoint_file.write_file_atomically", full)
    with pytest.raises(LogStorageError) as info:
        cache.assign(3, 8)
    assert info.value.path == str(path) and info.value.errno == errno.ENOSPC
    assert cache.entries() == _entries((2, 6))  # memory follows the file, not ahead of it
    with pytest.raises(LogStorageError):
        cache.truncate_from_end(0)
    assert cache.entries() == _entries((2, 6))


# -- assign ---------------------------------------------------------------------------------------


def test_assign_adds_epoch_and_writes_the_file(path, cache):
    assert cache.assign(2, 10) is True
    assert cache.latest_epoch == 2 and cache.latest_entry == EpochEntry(2, 10)
    assert cache.entries() == [EpochEntry(2, 10)]
    assert cache.end_offset_for(2, 11) == (2, 11)
    assert path.read_bytes() == b"0\n1\n2 10\n"  # synchronously
    assert LeaderEpochFileCache(path).entries() == [EpochEntry(2, 10)]


def test_assign_never_moves_an_assigned_epoch_forward(cache):
    cache.assign(2, 9)
    assert cache.assign(2, 10) is False
    assert cache.entries() == _entries((2, 9))
    cache.assign(2, 6)  # an earlier start offset for the same epoch replaces it
    assert cache.entries() == _entries((2, 6))


def test_assign_enforces_increasing_start_offsets(cache):
    cache.assign(2, 9)
    cache.assign(3, 9)
    assert cache.entries() == _entries((3, 9))
    cache.assign(4, 5)
    assert cache.entries() == _entries((4, 5))


def test_assign_enforces_increasing_epochs(cache):
    cache.assign(1, 5)
    cache.assign(2, 6)
    cache.assign(1, 7)
    assert cache.latest_epoch == 1
    assert cache.entries() == _entries((1, 7))
    assert cache.end_offset_for(1, 8) == (1, 8)
    assert cache.end_offset_for(2, 8) == UNDEFINED


def test_assign_truncates_a_matching_epoch_with_an_earlier_start(cache):
    for epoch, start in ((5, 11), (6, 12), (7, 13)):
        cache.assign(epoch, start)
    cache.assign(7, 12)  # removes (6, 12) and (7, 13)
    assert cache.entries() == _entries((5, 11), (7, 12))
    assert cache.end_offset_for(5, 0) == (5, 12)
    assert cache.end_offset_for(6, 0) == (5, 12)


@pytest.mark.parametrize("epoch, start", [(-1, 0), (0, -1)])
def test_assign_refuses_negative_values(cache, epoch, start):
    with pytest.raises(ValueError):
        cache.assign(epoch, start)


def test_epochs_tracked_as_a_follower_receives_many_messages(cache):
    for epoch, starts in ((0, (0, 1, 2)), (1, (3, 4, 5)), (2, (6, 7, 8))):
        for start in starts:
            cache.assign(epoch, start)
        assert cache.latest_epoch == epoch
        assert cache.end_offset_for(epoch, starts[-1] + 1) == (epoch, starts[-1] + 1)
    assert cache.entries() == _entries((0, 0), (1, 3), (2, 6))
    assert cache.end_offset_for(0, 9) == (0, 3)
    assert cache.end_offset_for(1, 9) == (1, 6)


def test_epochs_tracked_as_leaders_change_many_times(cache):
    cache.assign(0, 0)
    cache.assign(1, 0)  # no batch of epoch 0 was written: replaced
    assert cache.entries() == _entries((1, 0))
    assert cache.end_offset_for(1, 0) == (1, 0)
    assert cache.end_offset_for(0, 0) == (0, 0)
    assert cache.end_offset_for(1, 5) == (1, 5)
    cache.assign(2, 5)
    assert cache.end_offset_for(2, 10) == (2, 10)
    assert cache.end_offset_for(1, 10) == (1, 5)
    assert cache.end_offset_for(0, 10) == (0, 0)


# -- end_offset_for: the five cases ----------------------------------------------------------------


def test_end_offset_for_undefined_epoch(cache):
    assert cache.end_offset_for(UNDEFINED_EPOCH, 73) == UNDEFINED  # empty cache
    cache.assign(2, 11)
    cache.assign(3, 12)
    assert cache.end_offset_for(UNDEFINED_EPOCH, 0) == UNDEFINED


def test_end_offset_for_the_latest_epoch_is_the_log_end_offset(cache):
    cache.assign(2, 11)
    cache.assign(2, 12)
    assert cache.end_offset_for(2, 14) == (2, 14)
    cache.assign(5, 20)
    assert cache.end_offset_for(5, 20) == (5, 20)  # an epoch without a batch yet


def test_end_offset_for_an_epoch_above_every_epoch_is_undefined(cache):
    assert cache.end_offset_for(0, 0) == UNDEFINED  # nothing recorded
    assert cache.end_offset_for(7, 0) == UNDEFINED
    cache.assign(2, 100)
    assert cache.end_offset_for(3, 100) == UNDEFINED


def test_end_offset_for_an_epoch_below_every_epoch_is_the_first_start(cache):
    for epoch, start in ((5, 11), (6, 12), (7, 13)):
        cache.assign(epoch, start)
    assert cache.end_offset_for(4, 0) == (4, 11)


def test_end_offset_for_an_epoch_between_entries(cache):
    cache.assign(0, 10)
    cache.assign(2, 13)
    cache.assign(4, 17)
    assert cache.end_offset_for(1, 0) == (0, 13)
    assert cache.end_offset_for(2, 0) == (2, 17)
    assert cache.end_offset_for(3, 0) == (2, 17)
    other = LeaderEpochFileCache(cache.path.with_name("other"), entries=())
    for epoch, start in ((1, 11), (1, 12), (2, 13), (2, 14), (3, 15), (3, 16)):
        other.assign(epoch, start)
    assert other.end_offset_for(2, 17) == (2, 15)


# -- truncation -----------------------------------------------------------------------------------


@pytest.fixture
def three(cache):
    for epoch, start in ((2, 6), (3, 8), (4, 11)):
        cache.assign(epoch, start)
    return cache


def test_truncate_from_end_drops_entries_on_the_boundary(three):
    assert three.truncate_from_end(8) == _entries((3, 8), (4, 11))
    assert three.entries() == _entries((2, 6))


def test_truncate_from_end_between_boundaries(three):
    three.truncate_from_end(9)
    assert three.latest_epoch == 3
    assert three.entries() == _entries((2, 6), (3, 8))


@pytest.mark.parametrize("offset", [UNDEFINED_EPOCH_OFFSET, 12, 100])
def test_truncate_from_end_keeps_everything_for_undefined_or_later_offsets(three, offset):
    assert three.truncate_from_end(offset) == []
    assert len(three.entries()) == 3


def test_truncate_from_start_keeps_a_reset_entry(three):
    three.truncate_from_start(8)
    assert three.entries() == _entries((3, 8), (4, 11))


@pytest.mark.parametrize("offset, expected", [
    (1, [(2, 6), (3, 8), (4, 11)]),     # too early
    (6, [(2, 6), (3, 8), (4, 11)]),     # the first offset
    (UNDEFINED_EPOCH_OFFSET, [(2, 6), (3, 8), (4, 11)]),
    (9, [(3, 9), (4, 11)]),             # between boundaries: the epoch now starts at 9
    (11, [(4, 11)]),
    (15, [(4, 15)]),                    # past every entry: the latest epoch is kept
])
def test_truncate_from_start(three, offset, expected):
    three.truncate_from_start(offset)
    assert three.entries() == _entries(*expected)


def test_truncate_from_start_between_the_first_two_boundaries(cache):
    for epoch, start in ((0, 0), (1, 7), (2, 10)):
        cache.assign(epoch, start)
    cache.truncate_from_start(5)
    assert cache.entries() == _entries((0, 5), (1, 7), (2, 10))


def test_truncations_write_the_checkpoint(three, path):
    three.truncate_from_end(11)
    three.truncate_from_start(8)
    assert LeaderEpochCheckpointFile(path).read() == _entries((3, 8))  # written synchronously
    assert path.read_bytes() == b"0\n1\n3 8\n"


def test_truncations_of_an_empty_cache(cache):
    assert cache.truncate_from_start(7) == [] and cache.truncate_from_end(7) == []
    assert cache.entries() == []


def test_clear_and_flush(three, path):
    three.clear_and_flush()
    assert three.entries() == [] and three.latest_epoch is None
    assert path.read_bytes() == b"0\n0\n"


# -- lookups --------------------------------------------------------------------------------------


def test_previous_epoch(cache):
    assert cache.previous_epoch() is None
    cache.assign(2, 10)
    assert cache.previous_epoch() is None
    cache.assign(4, 15)
    assert cache.previous_epoch() == 2
    cache.assign(10, 20)
    assert cache.previous_epoch() == 4
    cache.truncate_from_end(18)
    assert cache.previous_epoch() == 2


def test_previous_epoch_and_entry_of_a_given_epoch(cache):
    assert cache.previous_epoch(2) is None and cache.previous_entry(2) is None
    cache.assign(2, 10)
    assert cache.previous_epoch(2) is None
    cache.assign(4, 15)
    assert cache.previous_epoch(4) == 2 and cache.previous_entry(4) == EpochEntry(2, 10)
    cache.assign(10, 20)
    assert cache.previous_epoch(10) == 4 and cache.previous_entry(10) == EpochEntry(4, 15)
    assert cache.previous_epoch(7) == 4  # an epoch the cache does not hold


def test_next_epoch(cache):
    for epoch, start in ((0, 0), (1, 100), (2, 200)):
        cache.assign(epoch, start)
    assert [cache.next_epoch(e) for e in (-1, 0, 1, 2, 100)] == [0, 1, 2, None, None]


def test_epoch_entry_earliest_and_epoch_for_offset(cache):
    assert cache.earliest_entry is None and cache.epoch_for_offset(0) is None
    for epoch, start in ((0, 10), (1, 20), (5, 30)):
        cache.assign(epoch, start)
    assert cache.epoch_entry(1) == EpochEntry(1, 20) and cache.epoch_entry(3) is None
    assert cache.earliest_entry == EpochEntry(0, 10)
    assert [cache.epoch_for_offset(o) for o in (25, 20, 30, 50, 5)] == [1, 1, 5, 5, None]


def test_entries_given_are_held_without_reading_or_writing(path):
    path.write_text("garbage")
    cache = LeaderEpochFileCache(path, entries=_entries((1, 0), (3, 5)))
    assert cache.entries() == _entries((1, 0), (3, 5))
    assert path.read_text() == "garbage"
    cache.flush()
    assert path.read_bytes() == b"0\n2\n1 0\n3 5\n"
    with pytest.raises(ValueError):
        LeaderEpochFileCache(path, entries=_entries((3, 0), (1, 5)))
    cache.replace_all(_entries((7, 9)))
    assert cache.entries() == _entries((7, 9)) and path.read_bytes() == b"0\n1\n7 9\n"


def test_entries_from_batch_epochs_follow_the_recovery_rule():
    # (epoch, base offset) of batches: -1 (unknown) and non-increasing epochs start nothing
    batches = [(-1, 0), (0, 3), (0, 5), (2, 9), (-1, 12), (1, 14), (2, 15), (5, 20)]
    assert entries_from_batch_epochs(batches) == _entries((0, 3), (2, 9), (5, 20))
    assert entries_from_batch_epochs([(4, 30), (6, 40)], initial=_entries((1, 0), (4, 20))) == \
        _entries((1, 0), (4, 20), (6, 40))
