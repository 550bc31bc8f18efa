"""A really full disk (a small tmpfs) while appending: LogStorageError, never SIGBUS (issue 7, item 4).

Index files used to be sparse: created at ``segment.index.bytes`` with ``truncate`` and written
through a memory map. When the disk filled up, a write through the map into a hole killed the
process with SIGBUS (seen while closing a segment on roll). Index space is now reserved with
``posix_fallocate`` when an index is created or grown, so a full disk fails there, as an error.

Needs root to mount a tmpfs (``tests/tmpfs.py``: outside CI a machine that cannot mount skips
with the reason; in CI the test fails instead).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from materializer.storage.errors import LogStorageError
from tests.tmpfs import mounted_tmpfs
from materializer.storage.log import Log
from materializer.storage.log_config import LogConfig


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
    assert kind == "LogStorageError" and Path(path).parent == small_tmpfs / "prices-0" and int(position) >= 0

    # Nothing fully written is lost: the reopened log (recovery cuts the partial batch) holds every
    # offset below the failed append, in order.
    subprocess.run(["mount", "-o", "remount,size=20m", str(small_tmpfs)], check=True)
    config = LogConfig(segment_bytes=200_000, segment_index_bytes=1_000_000)
    with Log.open(small_tmpfs / "prices-0", config, had_clean_shutdown=False) as log:
        offsets = [record.offset for record in log.read_records()]
    assert offsets == list(range(len(offsets))) and len(offsets) >= int(offset) - 400


def test_an_index_that_cannot_be_reserved_names_the_index_file(small_tmpfs):
    with pytest.raises(LogStorageError) as info:
        Log.open(small_tmpfs / "prices-0", LogConfig(segment_index_bytes=8 * 1024 * 1024))
    assert info.value.path.endswith(".index") and "No space left on device" in str(info.value)
    assert info.value.position == 0
    assert os.path.getsize(info.value.path) == 0  # no sparse file left behind
