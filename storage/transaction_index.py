"""Kafka's transaction index: the aborted transactions whose markers lie in one segment.

Layout (``<base_offset>.txnindex``), big-endian, 34-byte entries, appended in order of
``LastOffset``; the file is not preallocated and is only created when the first aborted
transaction is appended::

    AbortedTxn =>
      Version          => Int16   0
      ProducerId       => Int64
      FirstOffset      => Int64   first offset of the transaction
      LastOffset       => Int64   offset of the ABORT marker
      LastStableOffset => Int64   the partition's last stable offset when the marker was written

Mirrors ``org.apache.kafka.storage.internals.log.TransactionIndex``, ``AbortedTxn`` and
``TxnIndexSearchResult``.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path
from typing import Iterator, NamedTuple

from .errors import CorruptIndexError, InvalidOffsetError
from .files import rename_if_exists

__all__ = ["AbortedTxn", "TransactionIndex", "TxnIndexSearchResult", "ABORTED_TXN_SIZE"]

_ENTRY = struct.Struct(
    ">"
    "h"  # Version
    "q"  # ProducerId
    "q"  # FirstOffset
    "q"  # LastOffset
    "q"  # LastStableOffset
)
ABORTED_TXN_SIZE = _ENTRY.size  # 34
_CURRENT_VERSION = 0


class AbortedTxn(NamedTuple):
    """One aborted transaction: producer, its offset range and the LSO at abort time."""

    producer_id: int
    first_offset: int
    last_offset: int
    last_stable_offset: int

    def to_bytes(self) -> bytes:
        """The 34-byte on-disk entry (version 0)."""
        return _ENTRY.pack(_CURRENT_VERSION, self.producer_id, self.first_offset, self.last_offset, self.last_stable_offset)

    @classmethod
    def from_bytes(cls, buffer: bytes | memoryview, position: int = 0, *, path: Path | None = None) -> "AbortedTxn":
        """Parse one entry at ``position``.

        Raises:
            CorruptIndexError: an unknown version.
        """
        version, producer_id, first, last, lso = _ENTRY.unpack_from(buffer, position)
        if version != _CURRENT_VERSION:
            raise CorruptIndexError(f"unexpected aborted transaction version {version} in {path} at byte position {position}")
        return cls(producer_id, first, last, lso)


class TxnIndexSearchResult(NamedTuple):
    """Aborted transactions overlapping a fetch range; ``is_complete`` when no later segment can add more."""

    aborted_transactions: list[AbortedTxn]
    is_complete: bool


class TransactionIndex:
    """The aborted-transaction index of the segment at ``start_offset``.

    Appends are kept in memory only as far as ``last_offset``; reads read the (small) file.
    Not thread-safe; ``Log.lock`` serializes writers.
    """

    def __init__(self, start_offset: int, path: Path):
        self.start_offset = start_offset
        self.path = Path(path)
        self._last_offset: int | None = None
        if self.path.exists():
            size = self.path.stat().st_size
            if size >= ABORTED_TXN_SIZE:
                with open(self.path, "rb") as f:
                    f.seek((size // ABORTED_TXN_SIZE - 1) * ABORTED_TXN_SIZE)
                    data = f.read(ABORTED_TXN_SIZE)
                self._last_offset = AbortedTxn.from_bytes(data, path=self.path).last_offset

    @property
    def last_offset(self) -> int | None:
        """``last_offset`` of the last appended transaction, or None."""
        return self._last_offset

    def append(self, aborted_txn: AbortedTxn) -> None:
        """Append one aborted transaction, creating the file if needed.

        Raises:
            InvalidOffsetError: ``aborted_txn.last_offset`` is not greater than the last one.
        """
        if self._last_offset is not None and self._last_offset >= aborted_txn.last_offset:
            raise InvalidOffsetError(
                f"the last offset of appended transactions must increase sequentially, but "
                f"{aborted_txn.last_offset} is not greater than current last offset {self._last_offset} "
                f"of index {self.path}"
            )
        with open(self.path, "ab") as f:
            f.write(aborted_txn.to_bytes())
        self._last_offset = aborted_txn.last_offset

    def _read(self) -> bytes:
        try:
            with open(self.path, "rb") as f:
                return f.read()
        except FileNotFoundError:
            return b""

    def _iterate(self, data: bytes) -> Iterator[tuple[int, AbortedTxn]]:
        usable = len(data) - len(data) % ABORTED_TXN_SIZE
        for position in range(0, usable, ABORTED_TXN_SIZE):
            yield position, AbortedTxn.from_bytes(data, position, path=self.path)

    def all_aborted_txns(self) -> list[AbortedTxn]:
        """Every entry in file order."""
        return [txn for _, txn in self._iterate(self._read())]

    def __iter__(self) -> Iterator[AbortedTxn]:
        return iter(self.all_aborted_txns())

    def is_empty(self) -> bool:
        """True when the file holds no entry (or does not exist)."""
        try:
            return self.path.stat().st_size < ABORTED_TXN_SIZE
        except FileNotFoundError:
            return True

    def collect_aborted_txns(self, fetch_offset: int, upper_bound_offset: int) -> TxnIndexSearchResult:
        """Aborted transactions with ``last_offset >= fetch_offset`` and ``first_offset < upper_bound_offset``.

        The search is complete once an entry's ``last_stable_offset >= upper_bound_offset``.
        """
        found: list[AbortedTxn] = []
        for _, txn in self._iterate(self._read()):
            if txn.last_offset >= fetch_offset and txn.first_offset < upper_bound_offset:
                found.append(txn)
            if txn.last_stable_offset >= upper_bound_offset:
                return TxnIndexSearchResult(found, True)
        return TxnIndexSearchResult(found, False)

    def truncate_to(self, offset: int) -> None:
        """Remove every entry whose ``last_offset >= offset``."""
        data = self._read()
        new_last: int | None = None
        for position, txn in self._iterate(data):
            if txn.last_offset >= offset:
                with open(self.path, "r+b") as f:
                    f.truncate(position)
                self._last_offset = new_last
                return
            new_last = txn.last_offset
        self._last_offset = new_last

    def reset(self) -> None:
        """Remove every entry (the file stays, empty, if it exists)."""
        if self.path.exists():
            with open(self.path, "r+b") as f:
                f.truncate(0)
        self._last_offset = None

    def sanity_check(self) -> None:
        """Raises CorruptIndexError if an entry ends before ``start_offset`` or the length is not whole entries."""
        data = self._read()
        if len(data) % ABORTED_TXN_SIZE != 0:
            raise CorruptIndexError(
                f"transaction index {self.path} has {len(data)} bytes, not a multiple of {ABORTED_TXN_SIZE}"
            )
        for _, txn in self._iterate(data):
            if txn.last_offset < self.start_offset:
                raise CorruptIndexError(
                    f"last offset of aborted transaction {txn} in index {self.path} is less than start "
                    f"offset {self.start_offset}"
                )

    def flush(self) -> None:
        """fsync the file if it exists."""
        if self.path.exists():
            fd = os.open(self.path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)

    def close(self) -> None:
        """Nothing is held open between calls; kept for symmetry with the other indexes."""

    def rename_to(self, path: Path) -> None:
        """Rename the file if it exists and remember the new path (:func:`~materializer.storage.files.rename_if_exists`)."""
        self.path = rename_if_exists(self.path, path)

    def delete_if_exists(self) -> bool:
        """Delete the file. Returns True if one was deleted."""
        try:
            os.remove(self.path)
        except FileNotFoundError:
            return False
        return True

    def __repr__(self) -> str:
        return f"TransactionIndex(path={str(self.path)!r}, start_offset={self.start_offset})"
