""":class:`StateStore`: one topic's RocksDB state store, opened as its writer or as a reader beside it,
made of the package's parts (reads, the write path, bulk load, a reader's following of the writer)."""

from __future__ import annotations

import shutil
from pathlib import Path

from ..errors import StoreError
from .bulk import StoreBulkLoad, remove_cut_short_ingests
from .layout import COLUMN_FAMILIES
from .options import StateStoreOptions
from .secondary import SecondaryReader

__all__ = ["StateStore"]


class StateStore(StoreBulkLoad, SecondaryReader):
    """Key -> latest value of one topic in RocksDB, with per-partition next offsets.

    Open with ``StateStore(path)``; use as a context manager or call :meth:`close`.

    * reads: ``get``, ``get_all``, ``get_many``, ``items``, ``scan``, ``count``, ``offsets``,
      ``partitions``, ``start_offset`` (:mod:`~materializer.adapters.rocksdb_store.reads`);
    * writes, all through one write path that puts the data and the next offsets in one
      ``WriteBatch`` and refuses a next offset moving backwards: ``apply``, ``drop_partition``,
      ``drop_below`` (:mod:`~materializer.adapters.rocksdb_store.writes`); ``apply_entries``,
      ``apply_store_entries``, ``ingest_snapshot``, ``set_bulk_loading``
      (:mod:`~materializer.adapters.rocksdb_store.bulk`: SST files ingested, then that batch);
    * ``read_only=True`` opens it beside a writer in another process (RocksDB's secondary
      instance, on a scratch folder of links; nothing written in the store's folder): it sees the
      store as of its opening or its last ``catch_up``, values and offsets from the same atomic
      write; ``replaced``, ``refuse_reads``, ``refused``, ``secondary_reopens``
      (:mod:`~materializer.adapters.rocksdb_store.secondary`).

    Not thread-safe: one writer per store.

    Raises (constructor):
        StoreLockedError: another process (or another open store in this process) holds it.
        StoreCorruptedError: unreadable files, unknown layout or an unknown format version.
        StoreError: no store at ``path`` to read (``read_only``); any other RocksDB failure.
    """

    def __init__(self, path: Path | str, options: StateStoreOptions | None = None, *,
                 read_only: bool = False) -> None:
        self.path = Path(path)
        self.options = options or StateStoreOptions()
        self.read_only = read_only
        existed = self.exists(self.path)
        if read_only and not existed:
            raise StoreError(f"no state store at {self.path}")
        if not read_only:
            self.path.mkdir(parents=True, exist_ok=True)
            remove_cut_short_ingests(self.path)
        rocks_options = self.options.to_options()
        cf_options = {name: self.options.to_options() for name in COLUMN_FAMILIES}
        try:
            if read_only:
                self._open_reader(rocks_options, cf_options)
            else:
                self._open(self.path, rocks_options, cf_options, {}, existed=existed)
        except BaseException:
            self.close()
            raise
        self._write_options = self.options.to_write_options()

    @staticmethod
    def exists(path: Path | str) -> bool:
        """True when ``path`` holds a RocksDB (its ``CURRENT`` file exists)."""
        return (Path(path) / "CURRENT").exists()

    @staticmethod
    def destroy(path: Path | str) -> None:
        """Delete the store's folder (the store must be closed). Missing folder: no-op."""
        shutil.rmtree(Path(path), ignore_errors=True)

    def close(self) -> None:
        """Flush memtables and release the lock (a reader: remove its scratch directory). Idempotent."""
        try:
            self._drop_db()
        finally:
            self._remove_scratch()

    def __enter__(self) -> "StateStore":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._db is None else f"offsets={self._offsets}"
        return f"StateStore({str(self.path)!r}, {state})"
