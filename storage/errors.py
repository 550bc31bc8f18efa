"""Errors raised by the Kafka log engine.

The tree, one root (every name ends in ``Error``)::

    StorageError
    ├── CorruptRecordError          a batch fails its CRC-32C, size or magic check
    ├── CorruptIndexError           an .index/.timeindex/.txnindex fails its sanity check
    ├── CorruptCheckpointError      a checkpoint file has a wrong version, count or line
    ├── CorruptPartitionMetadataError  partition.metadata is malformed (file and line named)
    ├── InconsistentTopicIdError    a partition folder belongs to another topic id than expected
    ├── InvalidOffsetError          an append or index entry goes backwards
    ├── IndexOffsetOverflowError    an offset does not fit an index's 4-byte relative offset
    ├── SegmentOffsetOverflowError  a batch does not fit a segment's relative offset range
    ├── LogCleaningAbortedError     a cleaning round was aborted (internal, never leaves the cleaner)
    ├── LogNotFoundError            a partition folder or segment is missing
    ├── UnfinishedSegmentSwapError  a folder read in place holds a segment swap's .cleaned/.swap files
    ├── LogStorageError             an I/O error (disk full, read-only file system) on a log file
    ├── DataDirLockedError          another process writes the data dir (its ``.lock`` is held)
    └── IncompleteDataDirError      a topic of the data dir is being built/replaced, or was interrupted

Messages name the file, the byte position and what was expected, so the CLI can print
them as one line. Caller mistakes raise ``ValueError``/``TypeError`` instead.
Mirrors Kafka's ``CorruptRecordException``, ``CorruptIndexException``,
``InvalidOffsetException``, ``IndexOffsetOverflowException``,
``LogSegmentOffsetOverflowException``, ``LogCleaningAbortedException``,
``InconsistentTopicIdException`` and ``KafkaStorageException``; ``DataDirLockedError`` is what
Kafka's ``LogManager.lockLogDirs`` throws when another process holds a log dir's ``.lock``. The
data dir's lock and completeness markers are kept by :mod:`materializer.datadir`.
"""

from __future__ import annotations

import uuid

__all__ = [
    "StorageError",
    "CorruptRecordError",
    "CorruptIndexError",
    "CorruptCheckpointError",
    "CorruptPartitionMetadataError",
    "InconsistentTopicIdError",
    "InvalidOffsetError",
    "IndexOffsetOverflowError",
    "SegmentOffsetOverflowError",
    "LogCleaningAbortedError",
    "LogNotFoundError",
    "UnfinishedSegmentSwapError",
    "ClosedSegmentError",
    "LogStorageError",
    "DataDirLockedError",
    "IncompleteDataDirError",
]


class StorageError(Exception):
    """Root of every error raised by ``materializer.storage``."""


class CorruptRecordError(StorageError):
    """A record batch is corrupt: bad CRC-32C, impossible length, wrong magic or truncated.

    ``path`` is the file (or ``None`` for an in-memory buffer), ``position`` the byte
    position of the batch in it, ``offset`` (when known) the first offset that could not be read
    intact: everything below it in the partition was read and checked.
    """

    def __init__(self, message: str, *, path: str | None = None, position: int | None = None,
                 offset: int | None = None):
        where = ""
        if path is not None or position is not None:
            where = f"{path or '<buffer>'} at byte position {position if position is not None else '?'}: "
        super().__init__(where + message)
        self.path = path
        self.position = position
        self.offset = offset


class CorruptIndexError(StorageError):
    """An index file fails its sanity check (Kafka ``CorruptIndexException``)."""


class CorruptCheckpointError(StorageError):
    """A checkpoint file is malformed: wrong version, count mismatch or a bad line."""


class CorruptPartitionMetadataError(StorageError):
    """``partition.metadata`` is malformed (Kafka: an ``IOException`` from ``PartitionMetadataReadBuffer``
    that takes the log dir offline). ``path`` is the file, ``line`` the 1-based line at fault."""

    def __init__(self, message: str, *, path: str, line: int):
        super().__init__(message)
        self.path = path
        self.line = line


class InconsistentTopicIdError(StorageError):
    """A partition folder's ``partition.metadata`` holds another topic id than the one expected
    (Kafka ``InconsistentTopicIdException``): the folder belongs to another incarnation of the topic.

    ``path`` is the ``partition.metadata`` file, ``expected`` the id the caller gave and ``found``
    the id in the file (both ``uuid.UUID``).
    """

    def __init__(self, message: str, *, path: str, expected: uuid.UUID, found: uuid.UUID):
        super().__init__(message)
        self.path = path
        self.expected = expected
        self.found = found


class InvalidOffsetError(StorageError):
    """An offset goes backwards where Kafka requires it to increase (``InvalidOffsetException``)."""


class IndexOffsetOverflowError(StorageError):
    """An offset is outside ``[base_offset, base_offset + 2**31 - 1]`` of an index."""


class SegmentOffsetOverflowError(StorageError):
    """A batch's offsets do not fit the segment's int32 relative offsets.

    Carries ``segment`` (the segment's base offset) and ``offset`` (the offending offset),
    as Kafka's ``LogSegmentOffsetOverflowException`` does.
    """

    def __init__(self, message: str, *, segment: int, offset: int):
        super().__init__(message)
        self.segment = segment
        self.offset = offset


class LogCleaningAbortedError(StorageError):
    """A cleaning round was aborted; the half-built ``.cleaned`` files have been removed."""


class LogNotFoundError(StorageError):
    """A partition folder, segment or file that should exist does not."""


class ClosedSegmentError(StorageError):
    """A segment file was closed while a reader held it: deleted at once (a cleaner swap,
    retention or truncation under ``file.delete.delay.ms`` = 0) or its log closed.

    Kafka's answer to the same race is the delay itself (``UnifiedLog.deleteSegmentFiles``
    renames to ``.deleted`` and removes the file later); with no delay a reader of a live log
    reads on from its next offset in what the log holds now (:meth:`.log.Log.read_batches`).
    ``path`` is the file, ``position`` the byte position being read.
    """

    def __init__(self, message: str, *, path: str, position: int):
        super().__init__(f"{path} at byte position {position}: {message}")
        self.path = path
        self.position = position


class UnfinishedSegmentSwapError(StorageError):
    """A partition folder read in place holds ``.cleaned``/``.swap`` files: a cleaner's segment swap
    is in progress there, or was interrupted (Kafka's ``LogLoader`` completes or drops such files
    when it opens the log). A reader may look again once the swap is done. ``path`` is the folder."""

    def __init__(self, message: str, *, path: str):
        super().__init__(message)
        self.path = path


class LogStorageError(StorageError):
    """Writing or syncing a log file failed (disk full, read-only file system, I/O error).

    Like Kafka's ``KafkaStorageException`` (the broker then takes the log dir offline), the file
    refuses further appends until the log is reopened; reopening runs recovery, which cuts
    whatever was written only in part. ``path`` is the file, ``position`` the byte position the
    failed write started at, ``errno`` the operating system's error number.
    """

    def __init__(self, message: str, *, path: str, position: int, errno: int | None):
        super().__init__(message)
        self.path = path
        self.position = position
        self.errno = errno


class DataDirLockedError(StorageError):
    """Another process holds the data dir's ``.lock``: it is writing the data dir (Kafka
    ``LogManager.lockLogDirs``: "Failed to acquire lock on file .lock ... A Kafka instance in another
    process or thread is using this directory").

    The message names the data dir and the holder (command, pid, since when). ``data_dir`` is the
    folder, ``holder`` what the lock file says of its holder (a
    :class:`materializer.datadir.holder.DataDirHolder`, or None when it has not written it yet).
    """

    def __init__(self, message: str, *, data_dir: str, holder: object = None):
        super().__init__(message)
        self.data_dir = data_dir
        self.holder = holder


class IncompleteDataDirError(StorageError):
    """A topic of the data dir cannot be read as a whole: a command building or replacing it is in
    progress or was interrupted (its completeness marker says which and what to run), or the data
    dir holds no state store of the topic. Readers refuse it rather than serve part of it."""
