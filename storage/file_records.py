"""A segment's ``.log`` file: concatenated v2 record batches, appended through a buffered handle.

File framing (``FileLogInputStream``): every batch starts with ``BaseOffset => Int64`` and
``Length => Int32`` (bytes after these 12), then ``PartitionLeaderEpoch => Int32`` and
``Magic => Int8``. Reading stops silently at an incomplete trailing batch (fewer than 17 header
bytes or fewer than ``Length`` bytes left); ``Length < 14`` or a magic other than 2 raises
``CorruptRecordError`` naming the file and byte position. CRCs are not checked here.

Writes go through a buffered handle; reads use ``os.pread`` after pushing buffered bytes to the
OS, so a reader sees every appended byte. ``size_in_bytes`` is the logical size, which is less
than the file length for a preallocated, not yet trimmed file.

Mirrors ``org.apache.kafka.common.record.FileRecords`` / ``FileLogInputStream``.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path
from typing import Iterator, NamedTuple

from .errors import ClosedSegmentError, CorruptRecordError, LogStorageError
from .files import rename_if_exists
from .record_batch import LOG_OVERHEAD, RecordBatch

__all__ = ["FileBatchHeader", "FileRecords", "LogOffsetPosition", "TimestampAndOffset", "READ_CHUNK_BYTES"]

READ_CHUNK_BYTES = 1 << 20
_FIRST_CHUNK_BYTES = 1 << 14
_HEADER_CHUNK_BYTES = 1 << 13  # header-only walks read this much at each batch they cannot see yet
_HEADER_SIZE_UP_TO_MAGIC = 17
_MIN_LENGTH = 14  # LegacyRecord.RECORD_OVERHEAD_V0
_MAX_FILE_BYTES = 2**31 - 1
_LENGTH_AND_MAGIC = struct.Struct(
    ">"
    "q"  # BaseOffset
    "i"  # Length
    "i"  # PartitionLeaderEpoch
    "b"  # Magic
)


class LogOffsetPosition(NamedTuple):
    """The batch found by an offset search: its last offset, byte position and size in bytes."""

    offset: int
    position: int
    size: int


class FileBatchHeader(NamedTuple):
    """A batch located by a header-only walk: its byte position, and the header fields up to its magic
    (what Kafka's ``FileLogInputStream`` reads before ``loadBatchHeader``)."""

    position: int
    base_offset: int
    size_in_bytes: int
    partition_leader_epoch: int
    magic: int


class TimestampAndOffset(NamedTuple):
    """A record's timestamp (ms) and offset, and its batch's partition leader epoch (-1 if none)."""

    timestamp: int
    offset: int
    leader_epoch: int


class FileRecords:
    """The batches of one ``.log`` file. Not thread-safe for writers; ``Log.lock`` serializes them."""

    def __init__(self, path: Path, handle, size_in_bytes: int):
        self.path = Path(path)
        self._file = handle
        self._size = size_in_bytes
        self._dirty = False
        # Bytes known to be in the file (not only in the write buffer); where a failed write began.
        self._pushed_size = size_in_bytes
        self._failure: LogStorageError | None = None

    @classmethod
    def open(cls, path: Path, *, init_file_size: int = 0, preallocate: bool = False) -> "FileRecords":
        """Open ``path`` for appending, creating it if missing.

        A new file with ``preallocate`` is extended to ``init_file_size`` bytes with a logical
        size of 0; an existing file's logical size is its length.
        """
        path = Path(path)
        exists = path.exists()
        handle = open(path, "r+b" if exists else "w+b")
        if exists:
            size = os.fstat(handle.fileno()).st_size
        else:
            size = 0
            if preallocate and init_file_size > 0:
                handle.truncate(init_file_size)
        handle.seek(size)
        return cls(path, handle, size)

    @property
    def size_in_bytes(self) -> int:
        """Logical size in bytes (end of the last appended byte)."""
        return self._size

    def append(self, data: bytes | memoryview) -> int:
        """Append already framed batches; returns the number of bytes written.

        Raises:
            ValueError: the file would exceed 2**31 - 1 bytes.
        """
        length = len(data)
        if self._size + length > _MAX_FILE_BYTES:
            raise ValueError(
                f"append of {length} bytes is too large for segment {self.path} with current size {self._size}"
            )
        self._check_not_failed()
        try:
            self._file.write(data)
        except OSError as exc:
            raise self._failed("appending", exc) from exc
        self._size += length
        self._dirty = True
        return length

    def _push(self) -> None:
        if self._dirty:
            self._check_not_failed()
            try:
                self._file.flush()
            except OSError as exc:
                raise self._failed("writing", exc) from exc
            self._dirty = False
            self._pushed_size = self._size

    def _failed(self, action: str, exc: OSError) -> LogStorageError:
        """Remember an I/O failure: this file takes no more appends until it is reopened."""
        self._failure = LogStorageError(
            f"{action} {self.path} failed at byte position {self._pushed_size}: {exc.strerror or exc}; the log "
            f"takes no more appends until it is reopened, and reopening cuts what was written only in part",
            path=str(self.path), position=self._pushed_size, errno=exc.errno)
        return self._failure

    def _check_not_failed(self) -> None:
        if self._failure is not None:
            raise self._failure

    def read(self, position: int, size: int) -> bytes:
        """Return up to ``size`` bytes from ``position`` (clamped to the logical size).

        Raises:
            ClosedSegmentError: the file was closed (deleted, or its log closed).
        """
        if self._file.closed:
            raise ClosedSegmentError("the segment file was closed (deleted, or its log closed) while it was read",
                                     path=str(self.path), position=position)
        self._push()
        size = min(size, self._size - position)
        if size <= 0:
            return b""
        return os.pread(self._file.fileno(), size, position)

    def batches_from(
        self, start_position: int = 0, end_position: int | None = None, *, chunk_bytes: int = READ_CHUNK_BYTES
    ) -> Iterator[tuple[int, RecordBatch]]:
        """Yield ``(position, batch)`` for each complete batch in ``[start_position, end_position)`` bytes.

        Reads 16 KiB first, then growing chunks up to ``chunk_bytes`` (more for a batch larger
        than a chunk).

        Raises:
            CorruptRecordError: a ``Length`` below 14 or a magic other than 2.
        """
        end = self._size if end_position is None else min(end_position, self._size)
        label = str(self.path)
        position = start_position
        chunk = min(chunk_bytes, _FIRST_CHUNK_BYTES)  # small first read: most seeks read few batches
        while position < end:
            buffer = self.read(position, min(chunk, end - position))
            chunk = min(chunk * 4, chunk_bytes)
            view = memoryview(buffer)
            consumed = 0
            available = len(buffer)
            while available - consumed >= _HEADER_SIZE_UP_TO_MAGIC:
                _, length, _, magic = _LENGTH_AND_MAGIC.unpack_from(view, consumed)
                if length < _MIN_LENGTH:
                    raise CorruptRecordError(
                        f"record size {length} is less than the minimum record overhead ({_MIN_LENGTH})",
                        path=str(self.path), position=position + consumed,
                    )
                batch_size = length + LOG_OVERHEAD
                if batch_size > available - consumed:
                    break
                if magic != 2:
                    raise CorruptRecordError(
                        f"unsupported record batch magic {magic} (only magic 2 is supported)",
                        path=str(self.path), position=position + consumed,
                    )
                yield position + consumed, RecordBatch(view[consumed:consumed + batch_size], path=label,
                                                       position=position + consumed)
                consumed += batch_size
            if consumed == 0:
                # The next batch does not fit in the chunk: read exactly that batch, or stop at
                # an incomplete trailing batch.
                header = self.read(position, _HEADER_SIZE_UP_TO_MAGIC)
                if len(header) < _HEADER_SIZE_UP_TO_MAGIC:
                    return
                _, length, _, magic = _LENGTH_AND_MAGIC.unpack_from(header, 0)
                if length < _MIN_LENGTH:
                    raise CorruptRecordError(
                        f"record size {length} is less than the minimum record overhead ({_MIN_LENGTH})",
                        path=str(self.path), position=position,
                    )
                batch_size = length + LOG_OVERHEAD
                if position + batch_size > end:
                    return
                if magic != 2:
                    raise CorruptRecordError(
                        f"unsupported record batch magic {magic} (only magic 2 is supported)",
                        path=str(self.path), position=position,
                    )
                yield position, RecordBatch(self.read(position, batch_size), path=label, position=position)
                consumed = batch_size
            position += consumed

    def batch_headers(self, start_position: int = 0, end_position: int | None = None) -> Iterator[FileBatchHeader]:
        """Yield the first 17 header bytes of each complete batch in ``[start_position, end_position)``
        bytes, without reading the batches' records (Kafka ``FileLogInputStream.nextBatch``).

        Each read takes 8 KiB at the first batch not yet seen, so small batches cost one read per
        many batches and large ones one small read each. Stops silently at an incomplete trailing
        batch; CRCs are not checked.

        Raises:
            CorruptRecordError: a ``Length`` below 14 or a magic other than 2.
        """
        end = self._size if end_position is None else min(end_position, self._size)
        position = start_position
        while end - position >= _HEADER_SIZE_UP_TO_MAGIC:
            chunk = self.read(position, min(_HEADER_CHUNK_BYTES, end - position))
            view = memoryview(chunk)
            consumed = 0
            while len(chunk) - consumed >= _HEADER_SIZE_UP_TO_MAGIC:
                base_offset, length, epoch, magic = _LENGTH_AND_MAGIC.unpack_from(view, consumed)
                if length < _MIN_LENGTH:
                    raise CorruptRecordError(
                        f"record size {length} is less than the minimum record overhead ({_MIN_LENGTH})",
                        path=str(self.path), position=position + consumed)
                batch_size = length + LOG_OVERHEAD
                if position + consumed + batch_size > end:
                    return
                if magic != 2:
                    raise CorruptRecordError(f"unsupported record batch magic {magic} (only magic 2 is supported)",
                                             path=str(self.path), position=position + consumed)
                yield FileBatchHeader(position + consumed, base_offset, batch_size, epoch, magic)
                consumed += batch_size
            position += consumed

    def search_for_offset_from_position(self, target_offset: int, start_position: int) -> LogOffsetPosition | None:
        """Find the batch containing ``target_offset``, or the first batch after it (offset gap).

        Scans from ``start_position`` bytes for the first batch with ``last_offset >= target_offset``.
        Returns None when every batch ends before ``target_offset``.
        """
        for position, batch in self.batches_from(start_position):
            if batch.last_offset >= target_offset:
                return LogOffsetPosition(batch.last_offset, position, batch.size_in_bytes)
        return None

    def search_for_timestamp(
        self, target_timestamp: int, start_position: int, starting_offset: int
    ) -> TimestampAndOffset | None:
        """The first record at or after ``start_position`` with timestamp ``>= target_timestamp`` ms
        and offset ``>= starting_offset``, or None."""
        for _, batch in self.batches_from(start_position):
            if batch.max_timestamp >= target_timestamp:
                for record in batch.records():
                    if record.timestamp >= target_timestamp and record.offset >= starting_offset:
                        return TimestampAndOffset(record.timestamp, record.offset, batch.partition_leader_epoch)
        return None

    def largest_timestamp_after(self, start_position: int) -> TimestampAndOffset:
        """The largest batch ``max_timestamp`` after ``start_position`` and that batch's last offset;
        ``(-1, -1, -1)`` when there is none."""
        max_timestamp, offset, epoch = -1, -1, -1
        for _, batch in self.batches_from(start_position):
            if batch.max_timestamp > max_timestamp:
                max_timestamp, offset, epoch = batch.max_timestamp, batch.last_offset, batch.partition_leader_epoch
        return TimestampAndOffset(max_timestamp, offset, epoch)

    def truncate_to(self, target_size: int) -> int:
        """Cut the file to ``target_size`` bytes; returns the bytes removed.

        Raises:
            ValueError: ``target_size`` is negative or beyond the logical size.
        """
        if target_size < 0 or target_size > self._size:
            raise ValueError(
                f"attempt to truncate log segment {self.path} to {target_size} bytes failed, size of this log segment is {self._size} bytes"
            )
        self._push()
        removed = self._size - target_size
        if removed > 0 or os.fstat(self._file.fileno()).st_size != target_size:
            self._file.truncate(target_size)
        self._file.seek(target_size)
        self._size = target_size
        return removed

    def trim(self) -> None:
        """Shrink a preallocated file to its logical size."""
        self.truncate_to(self._size)

    def flush(self) -> None:
        """Write buffered bytes and fsync the file.

        Raises:
            LogStorageError: the write or the fsync failed (e.g. no space left on device).
        """
        self._check_not_failed()
        try:
            self._file.flush()
            self._dirty = False
            self._pushed_size = self._size
            os.fsync(self._file.fileno())
        except OSError as exc:
            raise self._failed("writing", exc) from exc

    def close(self) -> None:
        """Flush, trim and close the handle.

        Raises:
            LogStorageError: the final flush failed; the handle is closed anyway.
        """
        if self._file.closed:
            return
        if self._failure is not None:
            self.close_handlers()
            raise self._failure
        try:
            self.flush()
            self.trim()
        finally:
            self.close_handlers()

    def close_handlers(self) -> None:
        """Close without trimming; buffered bytes are written if the file still takes them.

        Raises:
            LogStorageError: writing the buffered bytes failed; the handle is closed anyway.
        """
        if self._file.closed:
            return
        error = None
        try:
            if self._failure is None:
                self._file.flush()
        except OSError as exc:
            error = self._failed("writing", exc)
        finally:
            try:
                self._file.close()
            except OSError:
                pass  # a buffered writer retries its failed flush on close; the failure is known
        if error is not None:
            raise error

    @property
    def closed(self) -> bool:
        """True once closed."""
        return self._file.closed

    def rename_to(self, path: Path) -> None:
        """Rename the file; the open handle stays valid (:func:`~materializer.storage.files.rename_if_exists`)."""
        self.path = rename_if_exists(self.path, path)

    def delete_if_exists(self) -> bool:
        """Close and delete the file. Returns True if it existed."""
        self.close_handlers()
        try:
            os.remove(self.path)
        except FileNotFoundError:
            return False
        return True

    def last_modified_ms(self) -> int:
        """File mtime in ms since the epoch."""
        self._push()
        return os.stat(self.path).st_mtime_ns // 1_000_000

    def set_last_modified_ms(self, ms: int) -> None:
        """Set the file mtime (ms since the epoch)."""
        self._push()
        os.utime(self.path, ns=(ms * 1_000_000, ms * 1_000_000))

    def __repr__(self) -> str:
        return f"FileRecords(path={str(self.path)!r}, size={self._size})"
