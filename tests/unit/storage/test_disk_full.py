"""A full disk while appending: a clear error, no more appends, and nothing fully written is lost.

Kafka answers an I/O error on a log with ``KafkaStorageException`` and takes the log dir
offline; here ``LogStorageError`` names the file and the byte position the failed write started
at, the log refuses further appends, and reopening (LogLoader recovery) cuts the partial batch.
"""

from __future__ import annotations

import errno

import pytest

from materializer.storage.compression import CompressionType
from materializer.storage.errors import LogStorageError
from materializer.storage.log import Log
from materializer.storage.log_config import LogConfig
from materializer.storage.record_batch import Record, TimestampType


class _DiskFullAfter:
    """Wraps a segment's file handle: ``budget`` more bytes reach the file, then ENOSPC."""

    def __init__(self, handle, budget: int):
        self._handle = handle
        self._budget = budget

    def write(self, data) -> int:
        data = bytes(data)
        if len(data) > self._budget:
            self._handle.write(data[: self._budget])  # a partial write reaches the disk
            self._handle.flush()
            self._budget = 0
            raise OSError(errno.ENOSPC, "No space left on device")
        self._budget -= len(data)
        return self._handle.write(data)

    def __getattr__(self, name):
        return getattr(self._handle, name)


def _append(log: Log, first_offset: int, count: int) -> None:
    records = [Record(first_offset + i, 1_000 + i, b"key-%d" % (i % 7), b"value-%d" % i) for i in range(count)]
    log.append_records(records, compression=CompressionType.NONE, timestamp_type=TimestampType.CREATE_TIME)


def test_disk_full_names_the_file_refuses_appends_and_loses_nothing_written(tmp_path):
    dir_path = tmp_path / "prices-0"
    log = Log.open(dir_path, LogConfig())
    for first in (0, 10, 20):
        _append(log, first, 10)
    log.flush()
    segment_file = log.active_segment.log
    size_before = segment_file.size_in_bytes
    segment_file._file = _DiskFullAfter(segment_file._file, budget=50)

    with pytest.raises(LogStorageError) as info:
        _append(log, 30, 10)
    message = str(info.value)
    assert str(segment_file.path) in message and f"byte position {size_before}" in message
    assert "No space left on device" in message
    assert (info.value.position, info.value.errno) == (size_before, errno.ENOSPC)
    assert log.log_end_offset == 30, "a failed append must not advance the log end offset"
    with pytest.raises(LogStorageError):
        _append(log, 30, 10)  # the log is offline until reopened

    # The process dies here (no clean close); the next open recovers.
    reopened = Log.open(dir_path, LogConfig(), had_clean_shutdown=False)
    try:
        assert reopened.log_end_offset == 30
        assert [r.offset for r in reopened.read_records()] == list(range(30))
        assert sum(t.bytes_truncated for t in reopened.recovery_truncations) == 50
    finally:
        reopened.close()
        with pytest.raises(LogStorageError):
            log.close()
