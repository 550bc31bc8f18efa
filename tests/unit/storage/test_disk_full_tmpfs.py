"""A really full disk (a small tmpfs) while appending: LogStorageError, never SIGBUS (issue 7, item 4).

Index files are sparse while active, as Kafka's are (issue 21: a partition must not take 2 x
``segment.index.bytes`` of disk). A write through the memory map into a hole that a full disk
cannot back kills the process with SIGBUS (seen once while closing a segment on roll), so each
page of entries is reserved with ``posix_fallocate`` before it is written: a full disk fails
there, as a ``LogStorageError`` naming the index file and the byte position.

Needs root to mount a tmpfs (``tests/tmpfs.py``: outside CI a machine that cannot mount skips
with the reason; in CI the test fails instead).
"""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from materializer.storage.compression import CompressionType
from materializer.storage.log import Log
from materializer.storage.log_config import LogConfig
from materializer.storage.record_batch import Record, TimestampType
from tests.tmpfs import mounted_tmpfs


@pytest.fixture
def small_tmpfs(tmp_path):
    """A tmpfs of 3 MiB mounted at a fresh folder; unmounted at teardown."""
    with mounted_tmpfs(tmp_path, "3m") as mount_point:
        yield mount_point


_FILL = textwrap.dedent("""
    import sys
    from materializer.storage.compression import CompressionType
    from materializer.storage.errors import StorageError
    from materializer.storage.log import Log
    from materializer.storage.log_config import LogConfig
    from materializer.storage.record_batch import Record, TimestampType

    log = Log.open(sys.argv[1], LogConfig(segment_bytes=200_000, segment_index_bytes=1_000_000))
    offset = 0
    try:
        while True:
            records = [Record(offset + i, 1000 + offset + i, b"k%d" % (i % 50), b"v" * 200) for i in range(20)]
            log.append_records(records, compression=CompressionType.NONE, timestamp_type=TimestampType.CREATE_TIME)
            offset += 20
            if offset % 400 == 0:
                log.flush()
    except StorageError as exc:
        print(f"{type(exc).__name__}|{exc.path}|{exc.position}|{offset}")
        sys.exit(3)
""")


def test_filling_the_disk_while_rolling_segments_is_an_error_not_sigbus(small_tmpfs):
    result = subprocess.run([sys.executable, "-c", _FILL, str(small_tmpfs / "prices-0")],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode != -signal.SIGBUS, "killed by SIGBUS: a write through an index map hit a hole"
    assert result.returncode == 3, (result.returncode, result.stdout, result.stderr[-2000:])
    kind, path, position, offset = result.stdout.strip().split("|")
    assert kind == "LogStorageError" and Path(path).parent == small_tmpfs / "prices-0"
    assert 0 <= int(position) < 1_000_000, position  # inside the file: a segment (200,000 bytes) or an index (1 MB)

    # Nothing fully written is lost: the reopened log (recovery cuts the partial batch) holds every
    # offset below the failed append, in order.
    subprocess.run(["mount", "-o", "remount,size=20m", str(small_tmpfs)], check=True)
    config = LogConfig(segment_bytes=200_000, segment_index_bytes=1_000_000)
    with Log.open(small_tmpfs / "prices-0", config, had_clean_shutdown=False) as log:
        offsets = [record.offset for record in log.read_records()]
    assert offsets == list(range(len(offsets))) and len(offsets) >= int(offset) - 400


def test_a_partition_with_large_preallocated_indexes_fits_a_small_disk(small_tmpfs):
    config = LogConfig(segment_index_bytes=8 * 1024 * 1024, segment_bytes=64 * 1024)
    with Log.open(small_tmpfs / "prices-0", config) as log:
        for first in range(0, 4000, 20):
            records = [Record(first + i, 1000 + first + i, b"k%d" % i, b"v" * 100) for i in range(20)]
            log.append_records(records, compression=CompressionType.NONE, timestamp_type=TimestampType.CREATE_TIME)
        active = log.active_segment
        assert os.path.getsize(active.offset_index_path) == 8 * 1024 * 1024  # preallocated length, as Kafka's
        used = sum(os.stat(p).st_blocks * 512 for p in (small_tmpfs / "prices-0").iterdir())
        assert used < 1024 * 1024, used  # 2 x 8 MiB would not even fit this 3 MiB disk
        assert log.number_of_segments > 5
    with Log.open(small_tmpfs / "prices-0", config, had_clean_shutdown=True) as log:
        assert [r.offset for r in log.read_records()] == list(range(4000))


_INDEX_PAGE_ON_A_FULL_DISK = textwrap.dedent("""
    import sys
    sys.path.append(sys.argv[3])  # the checkout, for tests.tmpfs: after site-packages, whose materializer wins
    from materializer.storage.errors import LogStorageError
    from materializer.storage.offset_index import OffsetIndex
    from tests.tmpfs import fill

    disk, path = sys.argv[1], sys.argv[2]
    index = OffsetIndex(path, 0, 8 * 1024 * 1024)
    index.append(0, 0)  # the first page gets its blocks
    fill(__import__("pathlib").Path(disk), 0)
    for slot in range(1, 513):
        try:
            index.append(slot, slot * 100)
        except LogStorageError as exc:
            print(f"{slot}|{exc.path}|{exc.position}|{exc.errno}|{index.entries}|{exc}")
            sys.exit(3)
    print("no error")
""")


def test_an_index_page_that_cannot_be_reserved_names_the_index_file_and_position(small_tmpfs):
    path = small_tmpfs / "00000000000000000000.index"
    result = subprocess.run([sys.executable, "-c", _INDEX_PAGE_ON_A_FULL_DISK, str(small_tmpfs), str(path),
                             str(Path(__file__).parents[3])], capture_output=True, text=True, timeout=60)
    assert result.returncode != -signal.SIGBUS, "killed by SIGBUS: an entry was written into an unreserved page"
    assert result.returncode == 3, (result.returncode, result.stdout, result.stderr[-2000:])
    slot, error_path, position, errno_value, entries, message = result.stdout.strip().split("|", 5)
    # entries 0-511 fill the first 4 KiB page; entry 512 needs the second page, which a full disk cannot give
    assert (int(slot), error_path, int(position)) == (512, str(path), 4096)
    assert int(errno_value) == errno.ENOSPC and int(entries) == 512  # nothing written for the refused entry
    assert "No space left on device" in message and str(path) in message
