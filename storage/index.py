"""The format-agnostic part of Kafka's offset and time indexes: a memory-mapped file of fixed-size slots.

An index file is an array of ``entry_size``-byte big-endian entries sorted by key. While its
segment is active the file is *preallocated* to ``round_down(max_index_size, entry_size)``
bytes as a sparse file, as Kafka's ``RandomAccessFile.setLength`` leaves it (no disk block is
used until written), and only the first ``entries`` slots are meaningful; on roll and close it is
trimmed to ``entries * entry_size`` bytes.

Entries are read through the map and written with ``pwrite`` on a descriptor kept while the
index is open (the same page cache, so the map sees them at once), and flushed with
``fdatasync`` on it (what ``msync(MS_SYNC)`` does on Linux): a store into the map, and Python's
``mmap.flush``, would wait for the disk (a page under writeback, a journal commit) holding the
interpreter lock, stalling every other thread of the process; ``pwrite`` and ``fdatasync`` wait
without it.

A write into a hole that a full disk cannot back fails (through the map it would kill the
process with SIGBUS). So before an entry is written, the page(s) it falls in are reserved with ``posix_fallocate``
(one call per 4 KiB page of entries: 512 offset entries, about 2 MiB of log at the default
``index.interval.bytes``); a failed reservation is a ``LogStorageError`` naming the index file
and the byte position, and nothing is written. Reopening an existing file sets ``entries = file length //
entry_size`` (Kafka reads nothing to find the end), so an untrimmed index left by a crash looks
full of zero entries: LogLoader recovers such segments and rebuilds their indexes.

Lookups binary-search the last ``8192 // entry_size`` entries first (the "warm" tail that
readers of the log end hit), then the rest.

Mirrors ``org.apache.kafka.storage.internals.log.AbstractIndex``.
"""

from __future__ import annotations

import enum
import errno
import mmap
import os
from pathlib import Path
from typing import ClassVar

from .errors import IndexOffsetOverflowError, LogStorageError
from .files import rename_if_exists
from .varint import INT32_MAX

__all__ = ["AbstractIndex", "IndexSearchType", "INT32_MAX"]

_WARM_SECTION_BYTES = 8192


_PAGE_BYTES = mmap.PAGESIZE


def _set_length(f, path: Path, length: int) -> None:
    """Set the file length to ``length`` bytes; a longer file stays sparse (Kafka
    ``RandomAccessFile.setLength``).

    Raises:
        LogStorageError: the length cannot be set (a read-only file system, an I/O error).
    """
    try:
        f.truncate(length)
    except OSError as exc:
        raise LogStorageError(f"setting the length of index {path} to {length} bytes failed: {exc.strerror or exc}",
                              path=str(path), position=length, errno=exc.errno) from exc


def _reserve_blocks(fd: int, path: Path, start: int, length: int) -> None:
    """Reserve disk blocks for ``[start, start + length)`` bytes of the index file ``path`` open
    as ``fd`` (``posix_fallocate``; the file length is not changed when the range lies inside it).

    Raises:
        LogStorageError: the blocks cannot be reserved (a full disk, a quota, a read-only file
            system), naming the index file and the byte position of the range.
    """
    try:
        os.posix_fallocate(fd, start, length)
    except OSError as exc:
        full = exc.errno in (errno.ENOSPC, errno.EDQUOT)
        raise LogStorageError(
            f"reserving {length} bytes of index {path} at byte position {start} failed: {exc.strerror or exc}"
            + ("; free disk space" if full else ""), path=str(path), position=start, errno=exc.errno) from exc


class IndexSearchType(enum.Enum):
    """Which half of an entry a search compares (Kafka ``IndexSearchType``)."""

    KEY = 0
    VALUE = 1


class AbstractIndex:
    """A memory-mapped file of fixed-size index entries for the segment at ``base_offset``.

    Subclasses define ``ENTRY_SIZE`` and ``_key_value_at(slot)``. Not thread-safe: the owning
    ``Log`` serializes writers with ``Log.lock``; concurrent readers of a closed or trimmed
    index are not supported.
    """

    ENTRY_SIZE: ClassVar[int] = 0

    def __init__(self, path: Path, base_offset: int, max_index_size: int = -1, writable: bool = True):
        """Open or create the index file.

        Args:
            path: the index file.
            base_offset: the segment's base offset (relative offsets are stored against it).
            max_index_size: bytes to preallocate a new file to (rounded down to whole
                entries); ``-1`` means "use the existing file length".
            writable: open read-write (a new file can only be created when writable).

        Raises:
            LogNotFoundError-like ``FileNotFoundError``: read-only and the file is missing.
        """
        self.path = Path(path)
        self.base_offset = base_offset
        self.max_index_size = max_index_size
        self.writable = writable
        newly_created = not self.path.exists()
        if newly_created:
            if not writable:
                raise FileNotFoundError(f"index file {self.path} does not exist")
            length = self._round_down(max(max_index_size, 0))
            with open(self.path, "wb") as f:
                _set_length(f, self.path, length)
        self._mmap: mmap.mmap | None = None
        self._fd: int | None = None  # read-write, for entry writes: opened on the first, closed on a trim
        self._dirty = False  # entries written or the length changed since the last sync
        self._length = 0
        # Bytes [page of the first entry written since the last truncation, _reserved_end) have
        # disk blocks: entries are written in order, each after its page(s) are reserved.
        self._reserved_end = 0
        self._map_file(self.path.stat().st_size)
        self._entries = 0 if newly_created else self._length // self.ENTRY_SIZE

    # -- mapping ----------------------------------------------------------------------------

    def _round_down(self, number: int) -> int:
        return number - number % self.ENTRY_SIZE

    def _map_file(self, length: int) -> None:
        """(Re)map the file; a zero-length file has no map (mmap refuses empty files)."""
        if self._mmap is not None:
            self._mmap.close()
            self._mmap = None
        self._length = length
        if length > 0:
            mode = "r+b" if self.writable else "rb"
            with open(self.path, mode) as f:
                access = mmap.ACCESS_WRITE if self.writable else mmap.ACCESS_READ
                self._mmap = mmap.mmap(f.fileno(), length, access=access)

    @property
    def _mapped(self) -> mmap.mmap:
        """The file's map, to read or write entries through. Callers only touch slots below
        ``entries`` or ``max_entries``, so the file has a non-zero length and is mapped.

        Raises:
            ValueError: the index was closed (``close``/``close_handler``), or its file has no slot.
        """
        mapped = self._mmap
        if mapped is None:
            raise ValueError(f"index file {self.path} is not mapped (closed, or no slot)")
        return mapped

    @property
    def entries(self) -> int:
        """Number of valid entries."""
        return self._entries

    @property
    def max_entries(self) -> int:
        """Number of slots in the (possibly preallocated) file."""
        return self._length // self.ENTRY_SIZE

    @property
    def length(self) -> int:
        """File length in bytes (preallocated length while active)."""
        return self._length

    @property
    def size_in_bytes(self) -> int:
        """Bytes of valid entries: ``entries * ENTRY_SIZE``."""
        return self._entries * self.ENTRY_SIZE

    def is_full(self) -> bool:
        """True when no slot is left for a normal append."""
        return self._entries >= self.max_entries

    def resize(self, new_size: int) -> bool:
        """Set the file length to ``round_down(new_size, ENTRY_SIZE)`` bytes (a longer file stays
        sparse) and remap.

        Entries beyond the new length are dropped. Returns True if the length changed. Nothing is
        synced (Kafka's ``resize`` does not force the map either): the entries kept stay in the
        page cache and become durable at the next :meth:`flush` or :meth:`close`, as the log's
        recovery point assumes.

        Raises:
            LogStorageError: the length cannot be set.
        """
        rounded = self._round_down(max(new_size, 0))
        if rounded == self._length:
            return False
        if self._mmap is not None:
            self._mmap.close()
            self._mmap = None
        with open(self.path, "r+b") as f:
            _set_length(f, self.path, rounded)
        self._dirty = True
        self._map_file(rounded)
        self._entries = min(self._entries, rounded // self.ENTRY_SIZE)
        self._reserved_end = min(self._reserved_end, rounded - rounded % _PAGE_BYTES)
        return True

    def _reserve_slot(self, slot: int) -> None:
        """Make sure the bytes of ``slot`` have disk blocks before they are written through the map.

        Raises:
            LogStorageError: the page(s) cannot be reserved (nothing was written).
        """
        end = (slot + 1) * self.ENTRY_SIZE
        if end <= self._reserved_end:
            return
        first_page = slot * self.ENTRY_SIZE - (slot * self.ENTRY_SIZE) % _PAGE_BYTES
        last_page_end = min(-(-end // _PAGE_BYTES) * _PAGE_BYTES, self._length)
        _reserve_blocks(self._writer(), self.path, first_page, last_page_end - first_page)
        self._reserved_end = last_page_end

    def _writer(self) -> int:
        """The read-write descriptor of the file (opened on first use, closed by a trim or with the map).

        Raises:
            LogStorageError: the file cannot be opened.
        """
        if self._fd is None:
            try:
                self._fd = os.open(self.path, os.O_RDWR | os.O_CLOEXEC)
            except OSError as exc:
                raise LogStorageError(f"opening index {self.path} for writing failed: {exc.strerror or exc}",
                                      path=str(self.path), position=0, errno=exc.errno) from exc
        return self._fd

    def _write_slot(self, slot: int, entry: bytes) -> None:
        """Write ``entry`` (``ENTRY_SIZE`` bytes) into ``slot``, its page reserved first.

        Raises:
            ValueError: the index was closed (as a write through its map would).
            LogStorageError: the page cannot be reserved or the write fails (nothing is written
                on a failed reservation).
        """
        if self._mmap is None:
            raise ValueError(f"index file {self.path} is not mapped (closed, or no slot)")
        self._reserve_slot(slot)
        position = slot * self.ENTRY_SIZE
        try:
            written = os.pwrite(self._writer(), entry, position)
        except OSError as exc:
            raise LogStorageError(f"writing index {self.path} at byte position {position} failed: "
                                  f"{exc.strerror or exc}", path=str(self.path), position=position,
                                  errno=exc.errno) from exc
        self._dirty = True
        if written != len(entry):
            raise LogStorageError(f"writing index {self.path} at byte position {position} wrote {written} of "
                                  f"{len(entry)} bytes", path=str(self.path), position=position, errno=None)

    def _sync(self) -> None:
        """``fdatasync`` the file if anything was written or its length changed since the last
        sync (the interpreter lock released meanwhile), through the write descriptor or, for an
        index with none open, a descriptor opened for the call.

        Raises:
            LogStorageError: the file cannot be synced.
        """
        if not self._dirty:
            return
        try:
            if self._fd is not None:
                os.fdatasync(self._fd)
            else:
                fd = os.open(self.path, os.O_RDWR | os.O_CLOEXEC)
                try:
                    os.fdatasync(fd)
                finally:
                    os.close(fd)
            self._dirty = False
        except OSError as exc:
            raise LogStorageError(f"syncing index {self.path} failed: {exc.strerror or exc}",
                                  path=str(self.path), position=0, errno=exc.errno) from exc

    def trim_to_valid_size(self) -> None:
        """Shrink the file to the valid entries (on roll, close and after recovery) and close the
        write descriptor: a trimmed index is not written again until reset, so a rolled segment
        keeps no descriptor open for it (a later flush opens one for its call)."""
        self.resize(self._entries * self.ENTRY_SIZE)
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)

    def _truncate_to_entries(self, entries: int) -> None:
        self._entries = entries
        # The next entry's page is reserved again (cheap when it has blocks already): a page
        # below the old end may be a hole (an untrimmed file left by a crash, reset by recovery).
        position = entries * self.ENTRY_SIZE
        self._reserved_end = min(self._reserved_end, position - position % _PAGE_BYTES)
        self._on_truncated()

    def _on_truncated(self) -> None:
        """Hook for subclasses to refresh cached last entries."""

    def truncate(self) -> None:
        """Remove all entries (keeps the file length)."""
        self._truncate_to_entries(0)

    def reset(self) -> None:
        """Remove all entries and grow the file back to ``max_index_size`` (Kafka ``reset``)."""
        self.truncate()
        if self.max_index_size > 0:
            self.resize(self.max_index_size)

    def flush(self) -> None:
        """Make the entries written durable (``fdatasync``; nothing for a closed or empty index).

        Raises:
            LogStorageError: the file cannot be synced.
        """
        if self._mmap is not None and self.writable:
            self._sync()

    def close(self) -> None:
        """Sync, trim to the valid entries and unmap (a closed index is not flushed any more).

        Raises:
            LogStorageError: the file cannot be synced or trimmed.
        """
        try:
            if self.writable and self.path.exists():
                self.flush()
                self.trim_to_valid_size()
        finally:
            self.close_handler()

    def close_handler(self) -> None:
        """Unmap without trimming, and close the write descriptor."""
        if self._mmap is not None:
            self._mmap.close()
            self._mmap = None
        if self._fd is not None:
            fd, self._fd = self._fd, None  # forgotten first: a failed close has released the number too
            os.close(fd)

    def delete_if_exists(self) -> bool:
        """Unmap and delete the file. Returns True if a file was deleted."""
        self.close_handler()
        try:
            os.remove(self.path)
        except FileNotFoundError:
            return False
        return True

    def rename_to(self, path: Path) -> None:
        """Rename the file (the map stays valid) (:func:`~materializer.storage.files.rename_if_exists`)."""
        self.path = rename_if_exists(self.path, path)

    # -- offsets ----------------------------------------------------------------------------

    def can_append_offset(self, offset: int) -> bool:
        """True if ``offset - base_offset`` fits in ``[0, 2**31 - 1]``."""
        relative = offset - self.base_offset
        return 0 <= relative <= INT32_MAX

    def relative_offset(self, offset: int) -> int:
        """Return ``offset - base_offset``.

        Raises:
            IndexOffsetOverflowError: the difference is outside ``[0, 2**31 - 1]``.
        """
        relative = offset - self.base_offset
        if relative < 0 or relative > INT32_MAX:
            raise IndexOffsetOverflowError(
                f"integer overflow for offset {offset} (index base offset {self.base_offset}) in {self.path}"
            )
        return relative

    # -- search -----------------------------------------------------------------------------

    def _compare_key(self, slot: int, search_type: IndexSearchType) -> int:
        """Return the KEY (relative offset or timestamp) or VALUE of ``slot`` as an int."""
        raise NotImplementedError

    def _slot_range_for(self, target: int, search_type: IndexSearchType) -> tuple[int, int]:
        """Return ``(largest slot <= target, smallest slot >= target)``; -1 where none (Kafka ``indexSlotRangeFor``)."""
        entries = self._entries
        if entries == 0:
            return -1, -1
        warm_entries = _WARM_SECTION_BYTES // self.ENTRY_SIZE
        first_hot = max(0, entries - 1 - warm_entries)
        if self._compare_key(first_hot, search_type) < target:
            return self._binary_search(target, search_type, first_hot, entries - 1)
        if self._compare_key(0, search_type) > target:
            return -1, 0
        return self._binary_search(target, search_type, 0, first_hot)

    def _binary_search(self, target: int, search_type: IndexSearchType, begin: int, end: int) -> tuple[int, int]:
        lo, hi = begin, end
        key_at = self._compare_key
        while lo < hi:
            mid = (lo + hi + 1) >> 1
            found = key_at(mid, search_type)
            if found > target:
                hi = mid - 1
            elif found < target:
                lo = mid
            else:
                return mid, mid
        return lo, (-1 if lo == self._entries - 1 else lo + 1)

    def _largest_lower_bound_slot_for(self, target: int, search_type: IndexSearchType) -> int:
        return self._slot_range_for(target, search_type)[0]

    def _smallest_upper_bound_slot_for(self, target: int, search_type: IndexSearchType) -> int:
        return self._slot_range_for(target, search_type)[1]

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(path={str(self.path)!r}, base_offset={self.base_offset}, "
            f"entries={self._entries}, max_entries={self.max_entries})"
        )
