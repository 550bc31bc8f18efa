"""The open RocksDB behind a state store: opening it at a folder (the format version checked, or
written into a new store), its column families, the next offsets it holds, and the gate every read
and write passes (:meth:`StoreInstance._require_open`).

:class:`StoreInstance` is the base the store's parts build on (reads, writes, bulk load, a reader's
following of the writer); :class:`~materializer.adapters.rocksdb_store.StateStore` is all of them.
It owns the RocksDB handles and the in-memory copy of the next offsets: loaded here on every open
(and a reader's catch-up), changed afterwards only by the write path
(:meth:`~materializer.adapters.rocksdb_store.writes.StoreWrites._writing`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import Any

from rocksdict import Options, Rdict, WriteOptions

from ..errors import StoreCorruptedError, StoreError
from .errors import map_rocksdb_errors
from .layout import (
    DATA_CF_NAME,
    FORMAT_VERSION,
    FORMAT_VERSION_KEY,
    INT32,
    INT64,
    METADATA_CF_NAME,
    NEXT_OFFSET_KEY_PREFIX,
    TOMBSTONES_CF_NAME,
)
from .options import StateStoreOptions

__all__ = ["StoreInstance"]


class StoreInstance:
    """A store's RocksDB instance and its next offsets (module docstring). Not used alone.

    Attributes:
        path: the store's folder.
        options: its RocksDB settings.
        read_only: opened beside a writer (a RocksDB secondary instance), never written.
    """

    path: Path
    options: StateStoreOptions
    read_only: bool
    _db: Rdict | None = None
    # The column families and their handles (None once closed: every use is refused by _require_open).
    _data: Rdict
    _metadata: Rdict
    _data_handle: Any
    _metadata_handle: Any
    #: The tombstones column family (key -> where its latest tombstone was); None: a reader of a
    #: store written before it existed, or several stores in one RocksDB (``_attach``).
    _tombstones: Rdict | None = None
    _tombstones_handle: Any = None
    #: partition -> next offset to apply, as the metadata column family holds it.
    _offsets: dict[int, int]
    _write_options: WriteOptions
    #: A reader: the scratch folder RocksDB was opened at (its errors name it; they are made to name ``path``).
    _reader_path: Path | None = None
    #: A reader that can no longer serve: the error every read raises (``refuse_reads``).
    _refusal: Exception | None = None

    def _open(self, open_path: Path, rocks_options: Options, cf_options: dict[str, Options],
              access: dict[str, Any], *, existed: bool) -> None:
        """Open RocksDB at ``open_path`` and take its ``data``, ``metadata`` and ``tombstones``
        column families (:meth:`_attach`). A reader (``access`` given) opens only the column
        families the store has: one written before the tombstones column family existed lacks it
        (a secondary instance cannot create it). On an error the DB is left for ``close``.

        Raises:
            StoreCorruptedError, StoreError: as :meth:`_attach`; any mapped RocksDB failure.
        """
        with self._mapped_errors():
            if access:
                present = set(Rdict.list_cf(str(open_path), rocks_options))
                cf_options = {name: options for name, options in cf_options.items()
                              if name in present or name != TOMBSTONES_CF_NAME}
            self._db = Rdict(str(open_path), rocks_options, column_families=cf_options, **access)
        tombstones = TOMBSTONES_CF_NAME if TOMBSTONES_CF_NAME in cf_options else None
        self._attach(self._db, DATA_CF_NAME, METADATA_CF_NAME, existed=existed, tombstones_cf=tombstones)

    def _attach(self, db: Rdict, data_cf: str, metadata_cf: str, *, existed: bool,
                tombstones_cf: str | None = None) -> None:
        """Make the column families ``data_cf``, ``metadata_cf`` and ``tombstones_cf`` of the open
        ``db`` this store's: check the format version (writing it into a new store) and load the
        next offsets.

        A store's own RocksDB names them :data:`DATA_CF_NAME`, :data:`METADATA_CF_NAME` and
        :data:`TOMBSTONES_CF_NAME`; other names put several stores in one RocksDB
        (``benchmarks/bench_store_layout.py`` measures that layout with this code).
        ``tombstones_cf`` None: no tombstone is recorded or read. ``existed``: the RocksDB was
        there before this open.

        Raises:
            StoreCorruptedError: a RocksDB holding data without the format version entry, or another version.
            StoreError: a reader opening a store still being created; any mapped RocksDB failure.
        """
        self._db = db
        with self._mapped_errors():
            self._data = db.get_column_family(data_cf)
            self._metadata = db.get_column_family(metadata_cf)
            self._data_handle = db.get_column_family_handle(data_cf)
            self._metadata_handle = db.get_column_family_handle(metadata_cf)
            self._tombstones = self._tombstones_handle = None
            if tombstones_cf is not None:
                self._tombstones = db.get_column_family(tombstones_cf)
                self._tombstones_handle = db.get_column_family_handle(tombstones_cf)
            version = self._metadata.get(FORMAT_VERSION_KEY)
            if version is None:
                # An empty RocksDB without the version is a store whose creation was cut short
                # (a crash between creating the DB and writing the version): finish creating it.
                if existed and not all(map(self._is_empty, (db, self._data, self._metadata))):
                    raise StoreCorruptedError(f"{self.path} is a RocksDB without a {FORMAT_VERSION_KEY!r} "
                                              f"entry: not a materializer state store")
                if self.read_only:
                    raise StoreError(f"state store {self.path} is still being created; try again")
                # The store's birth certificate, the one write that is not the write path's.
                self._metadata.put(FORMAT_VERSION_KEY, INT32.pack(FORMAT_VERSION))
            elif len(version) != 4 or INT32.unpack(version)[0] != FORMAT_VERSION:
                found = INT32.unpack(version)[0] if len(version) == 4 else f"0x{version.hex()}"
                raise StoreCorruptedError(f"state store {self.path} has format version {found}; "
                                          f"this materializer reads version {FORMAT_VERSION} "
                                          f"(version 2 keeps each partition's keys apart)")
            self._offsets = self._load_offsets()

    def _load_offsets(self) -> dict[int, int]:
        """partition -> next offset, read from the metadata column family.

        Raises:
            StoreCorruptedError: a malformed next offset entry.
        """
        offsets: dict[int, int] = {}
        for key, value in self._checked(self._metadata, NEXT_OFFSET_KEY_PREFIX):
            if not key.startswith(NEXT_OFFSET_KEY_PREFIX):
                break
            suffix = key[len(NEXT_OFFSET_KEY_PREFIX):]
            if len(suffix) != 4 or len(value) != 8:
                raise StoreCorruptedError(f"state store {self.path}: malformed next offset entry {key!r}")
            offsets[INT32.unpack(suffix)[0]] = INT64.unpack(value)[0]
        return offsets

    def _drop_db(self) -> None:
        """Close RocksDB (flushing memtables, releasing the lock). Idempotent."""
        db = self._db
        # Column-family objects keep the DB (and its LOCK) alive: drop them first (every use
        # after close is refused by _require_open).
        self._data = self._metadata = self._data_handle = self._metadata_handle = None  # type: ignore[assignment]
        self._tombstones = self._tombstones_handle = None
        self._db = None
        if db is not None:
            with self._mapped_errors():
                db.close()

    def _require_open(self) -> Rdict:
        """The open RocksDB; the gate of every read and write.

        Raises:
            StoreError: the store is closed; or the error :meth:`refuse_reads` set.
        """
        if self._db is None:
            raise StoreError(f"state store {self.path} is closed")
        if self._refusal is not None:
            raise self._refusal.with_traceback(None)  # else every raise would lengthen its traceback
        return self._db

    def _mapped_errors(self) -> contextlib.AbstractContextManager[None]:
        """:func:`map_rocksdb_errors` naming the store folder (a reader's RocksDB names its scratch folder)."""
        return map_rocksdb_errors(self.path, opened_as=self._reader_path)

    @staticmethod
    def _is_empty(column_family: Rdict) -> bool:
        return next(iter(column_family.keys()), None) is None

    @staticmethod
    def _checked(column_family: Rdict, from_key: bytes = b"", *,
                 keys_only: bool = False) -> Generator[Any, None, None]:
        """rocksdict's ``items``/``keys`` from ``from_key``, made loud about read errors.

        rocksdict ends an iteration silently when RocksDB's iterator fails (a block checksum
        mismatch, say), which would read as the end of the data. Once it has ended, a RocksDB
        iterator placed after the last key seen reads the same place again and its ``status``
        raises the error (``Corruption: ...``; callers map it with :func:`map_rocksdb_errors`).
        """
        last: bytes | None = None
        # raw mode: keys and values are bytes (rocksdict types them as any storable value)
        source: Iterator[Any] = (column_family.keys(from_key=from_key) if keys_only
                                 else column_family.items(from_key=from_key))
        for item in source:
            last = item if keys_only else item[0]
            yield item
        check = column_family.iter()
        check.seek(from_key if last is None else last)
        if last is not None and check.valid():
            check.next()
        check.status()
