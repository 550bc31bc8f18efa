"""Index files are sparse while active (as Kafka's ``RandomAccessFile.setLength`` leaves them), and
each page of entries gets its disk blocks (``posix_fallocate``) before an entry is written into it
(issue 21, point 3; the real full-disk cases are in test_disk_full_tmpfs.py). Entries are written
with ``pwrite`` and synced with ``fdatasync``, both waiting for the disk without the interpreter
lock, and read through the memory map.
"""

from __future__ import annotations

import errno
import os

import pytest

from materializer.storage import index as index_module
from materializer.storage.errors import LogStorageError
from materializer.storage.log import Log
from materializer.storage.log_config import LogConfig
from materializer.storage.offset_index import OffsetIndex
from materializer.storage.time_index import TimeIndex

TEN_MIB = 10 * 1024 * 1024
PAGE = 4096


def _disk_bytes(path) -> int:
    return os.stat(path).st_blocks * 512


@pytest.fixture
def reservations(monkeypatch):
    """Every ``posix_fallocate(fd, offset, length)`` made by the index module, as (offset, length)."""
    calls: list[tuple[int, int]] = []
    real = os.posix_fallocate

    def recording(fd, offset, length):
        calls.append((offset, length))
        real(fd, offset, length)

    monkeypatch.setattr(index_module.os, "posix_fallocate", recording)
    return calls


@pytest.fixture
def syncs(monkeypatch):
    """Every ``fdatasync(fd)`` made by the index module, as the descriptors synced."""
    calls: list[int] = []
    real = os.fdatasync

    def recording(fd):
        calls.append(fd)
        real(fd)

    monkeypatch.setattr(index_module.os, "fdatasync", recording)
    return calls


def test_a_fresh_partition_uses_almost_no_disk(tmp_path):
    with Log.open(tmp_path / "t-0", LogConfig()) as log:  # segment.index.bytes = 10 MiB
        segment = log.active_segment
        assert os.path.getsize(segment.offset_index_path) == TEN_MIB
        assert os.path.getsize(segment.time_index_path) == TEN_MIB - TEN_MIB % 12
        used = sum(_disk_bytes(p) for p in log.dir.iterdir())
        assert used <= 64 * 1024, used  # was 20 MiB with every block reserved


def test_each_page_is_reserved_once_before_its_first_entry(tmp_path, reservations):
    index = OffsetIndex(tmp_path / "0.index", 0, TEN_MIB)
    assert reservations == [] and _disk_bytes(index.path) == 0
    for i in range(1000):  # 8,000 bytes: two pages
        index.append(i, i * 10)
    assert reservations == [(0, PAGE), (PAGE, PAGE)]
    assert 2 * PAGE <= _disk_bytes(index.path) <= 4 * PAGE
    index.close()
    assert os.path.getsize(index.path) == 8000


def test_time_index_entries_straddling_pages_reserve_both(tmp_path, reservations):
    index = TimeIndex(tmp_path / "0.timeindex", 0, TEN_MIB)
    for i in range(342):  # entry 341 covers bytes [4092, 4104): the end of page 0 and the start of page 1
        index.maybe_append(1000 + i, i)
    assert reservations == [(0, PAGE), (0, 2 * PAGE)]


def test_entries_after_a_truncation_or_a_reopen_are_reserved_again(tmp_path, reservations):
    path = tmp_path / "0.index"
    index = OffsetIndex(path, 0, TEN_MIB)
    for i in range(600):
        index.append(i, i)
    index.truncate_to(100)
    reservations.clear()
    index.append(100, 100)
    assert reservations == [(0, PAGE)]  # the page may be a hole after a crash: reserved again (a no-op here)
    index.close()
    reservations.clear()
    reopened = OffsetIndex(path, 0, TEN_MIB)
    reopened.resize(TEN_MIB)
    reopened.append(101, 101)
    assert reservations == [(0, PAGE)]
    reopened.reset()
    reservations.clear()
    reopened.append(0, 0)
    assert reservations == [(0, PAGE)]


def test_a_failed_reservation_names_the_file_and_writes_nothing(tmp_path, monkeypatch):
    index = OffsetIndex(tmp_path / "0.index", 0, TEN_MIB)
    for i in range(512):
        index.append(i, i)

    def full(fd, offset, length):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(index_module.os, "posix_fallocate", full)
    with pytest.raises(LogStorageError) as info:
        index.append(512, 512)
    assert (info.value.path, info.value.position, info.value.errno) == (str(index.path), PAGE, errno.ENOSPC)
    assert str(index.path) in str(info.value) and "byte position 4096" in str(info.value)
    assert index.entries == 512 and index.last_offset == 511


def test_entries_are_written_with_pwrite_and_read_through_the_map(tmp_path, monkeypatch):
    writes: list[tuple[int, bytes]] = []
    real = os.pwrite

    def recording(fd, data, position):
        writes.append((position, bytes(data)))
        return real(fd, data, position)

    monkeypatch.setattr(index_module.os, "pwrite", recording)
    offsets = OffsetIndex(tmp_path / "100.index", 100, TEN_MIB)
    times = TimeIndex(tmp_path / "100.timeindex", 100, TEN_MIB)
    for n in range(3):
        offsets.append(100 + 10 * n, 4096 * n)
        times.maybe_append(1_000 + n, 100 + 10 * n)
    assert writes[:2] == [(0, bytes(8)), (0, (1000).to_bytes(8, "big") + bytes(4))]
    assert [position for position, _ in writes] == [0, 0, 8, 12, 16, 24]
    assert offsets.lookup(125) == (120, 8192)  # the map sees what pwrite wrote
    assert times.lookup(1_001).offset == 110
    for index in (offsets, times):
        index.close()
    assert OffsetIndex(tmp_path / "100.index", 100).lookup(125) == (120, 8192)


def test_flush_syncs_what_changed_and_close_releases_the_descriptor(tmp_path, syncs):
    synced = syncs
    fds_before = len(os.listdir("/proc/self/fd"))
    index = OffsetIndex(tmp_path / "0.index", 0, TEN_MIB)
    index.append(5, 50)
    index.flush()
    index.flush()  # nothing written since: no second sync
    assert len(synced) == 1
    index.append(6, 60)
    index.trim_to_valid_size()  # a roll: the write descriptor is closed
    assert len(os.listdir("/proc/self/fd")) == fds_before + 1  # the map's own descriptor
    index.flush()  # the entry and the new length, synced through a descriptor opened for the call
    assert len(synced) == 2 and len(os.listdir("/proc/self/fd")) == fds_before + 1
    index.close()  # nothing changed since: closed without a sync
    assert len(synced) == 2 and len(os.listdir("/proc/self/fd")) == fds_before
    index.flush()  # closed: nothing to sync
    assert len(synced) == 2
    assert OffsetIndex(tmp_path / "0.index", 0).lookup(6) == (6, 60)
    unmapped = OffsetIndex(tmp_path / "1.index", 1, TEN_MIB)
    unmapped.close_handler()  # unmapped, still preallocated
    with pytest.raises(ValueError, match="not mapped"):
        unmapped.append(7, 70)  # not written through a descriptor opened again
    assert len(os.listdir("/proc/self/fd")) == fds_before


def test_close_syncs_entries_written_since_the_last_flush(tmp_path, syncs):
    synced = syncs
    index = TimeIndex(tmp_path / "0.timeindex", 0, TEN_MIB)
    index.maybe_append(1_000, 3)
    index.close()
    assert len(synced) == 1


def test_a_failed_entry_write_names_the_file_and_position(tmp_path, monkeypatch):
    index = OffsetIndex(tmp_path / "0.index", 0, TEN_MIB)
    index.append(1, 10)

    def failing(fd, data, position):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(index_module.os, "pwrite", failing)
    with pytest.raises(LogStorageError) as info:
        index.append(2, 20)
    assert (info.value.path, info.value.position, info.value.errno) == (str(index.path), 8, errno.EIO)
    assert "byte position 8" in str(info.value)
    assert index.entries == 1 and index.last_offset == 1
