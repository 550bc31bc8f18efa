"""Loading a state store in bulk: SST files written outside RocksDB and ingested whole
(``IngestExternalFile``: no memtable, no write-ahead log), for a rebuild, a cold start or a restored
snapshot; the bulk-loading mode that holds compaction back meanwhile; and :class:`StoreSstWriter`,
which writes a snapshot's SST files elsewhere (the Spark job's executors).

Every writer here is a caller of the one write path (:meth:`StoreWrites._writing
<materializer.adapters.rocksdb_store.writes.StoreWrites._writing>`): its checks come before any
file is ingested, and its ``WriteBatch`` -- the deletes left, and the next offsets -- is written
after the files are in. A crash between the two leaves values newer than the stored next offsets:
the next start replays those records again, which writes the same values.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

from rocksdict import IngestExternalFileOptions, Options, SstFileWriter

from ...storage import _native
from ..errors import StoreError
from .errors import map_rocksdb_errors
from .layout import encode_store_key, encode_stored_value, partition_prefix
from .writes import StoreWrites

__all__ = ["BULK_LOAD_MAX_L0_FILES", "SST_BLOCK_SIZE", "SST_FILE_MIN_ENTRIES", "StoreBulkLoad", "StoreSstWriter",
           "remove_cut_short_ingests"]

SST_BLOCK_SIZE = 4096
"""Bytes of a data block (uncompressed) in the SST files the store writes: RocksDB's
``BlockBasedTableOptions::block_size`` default, which the store keeps (it configures no other)."""

SST_FILE_MIN_ENTRIES = 40_000
"""Puts per SST file in a bulk write: ``puts // SST_FILE_MIN_ENTRIES`` files (at least one, at most
one per core), written by parallel threads."""

#: Data column family options while a store is bulk loaded (:meth:`StoreBulkLoad.set_bulk_loading`):
#: no background compaction and no write stall from the L0 file count, so a load's SST files are
#: ingested at full speed; and the RocksDB defaults those options return to afterwards.
_BULK_LOAD_OPTIONS = {"disable_auto_compactions": "true", "level0_slowdown_writes_trigger": "1000000",
                      "level0_stop_writes_trigger": "1000000"}
_SERVING_OPTIONS = {"disable_auto_compactions": "false", "level0_slowdown_writes_trigger": "20",
                    "level0_stop_writes_trigger": "36"}
#: L0 files a bulk load lets pile up before it folds them into one sorted run (a manual compaction):
#: reads of a store check every L0 file, and one compaction of many files at the end costs more.
BULK_LOAD_MAX_L0_FILES = 96
_NATIVE_SST_COMPRESSIONS = ("none", "lz4")  # written by the native core; the others by rocksdict
_INGEST_DIR_PREFIX = ".ingest-"


def remove_cut_short_ingests(path: Path) -> None:
    """Remove the scratch folders of bulk writes cut short (``.ingest-*``) from the store folder ``path``."""
    for stale in path.glob(_INGEST_DIR_PREFIX + "*"):
        shutil.rmtree(stale, ignore_errors=True)


class StoreBulkLoad(StoreWrites):
    """The bulk writers of :class:`~materializer.adapters.rocksdb_store.StateStore` (module docstring)."""

    _bulk_loading = False  # asked for by set_bulk_loading
    _bulk_options_set = False  # _BULK_LOAD_OPTIONS are RocksDB's now
    _ingests_in_bulk = 0  # SST ingests since set_bulk_loading

    def set_bulk_loading(self, enabled: bool) -> None:
        """Switch RocksDB's background compaction of the data off while the store is loaded in bulk
        (a cold start or a rebuild: many SST files ingested in a row), and on again.

        While on, ingested files stay in L0 without the write stall RocksDB applies from 20 and 36
        L0 files; a load that piles up :data:`BULK_LOAD_MAX_L0_FILES` folds them with one manual
        compaction. Switching it off lets RocksDB compact them in the background. Loading then
        costs no compaction CPU until the store is caught up, which on a 2-core machine is the CPU
        the fetch and the broker need; the bulk-load mode of Kafka Streams 2.x's ``RocksDBStore``
        (``toggleDbForBulkLoading``, RocksDB's ``PrepareForBulkLoad``) did the same during a restore.
        RocksDB's options change only from the third ingest of a load on (each change writes an
        OPTIONS file, a few ms; RocksDB compacts from 4 L0 files), so a small load pays nothing.
        The switch is not stored: a store opens with background compaction on. No-op on a
        read-only store.

        Raises:
            StoreError: the store is closed, or RocksDB refuses the options.
        """
        if self.read_only:
            return
        self._bulk_loading = enabled
        self._ingests_in_bulk = 0
        if not enabled and self._bulk_options_set:
            with self._mapped_errors():
                self._require_open()
                self._data.set_options(_SERVING_OPTIONS)
            self._bulk_options_set = False

    @property
    def bulk_loading(self) -> bool:
        """Whether :meth:`set_bulk_loading` switched background compaction off."""
        return self._bulk_loading

    def apply_entries(self, keys: Sequence[bytes], values: Sequence[bytes], deletes: Sequence[bytes],
                      next_offsets: Mapping[int, int], *, bulk_min_entries: int = 20_000,
                      tombstones: Sequence[bytes] = ()) -> int:
        """Write the latest entry of each key, then the next offsets (a rebuild).

        ``keys`` are data keys (:func:`~materializer.adapters.rocksdb_store.encode_store_key`) sorted
        ascending without duplicates, ``values[i]`` the
        :func:`~materializer.adapters.rocksdb_store.encode_stored_value` of ``keys[i]``; ``deletes``
        the data keys whose latest record is a tombstone (none of them in ``keys``), and
        ``tombstones[i]``, when given, where the tombstone of ``deletes[i]`` was
        (:func:`~materializer.adapters.rocksdb_store.layout.encode_tombstone`: recorded in the
        tombstones column family in the same batch as the delete). From
        ``bulk_min_entries`` puts on, the puts go into one SST file ingested with RocksDB
        ``IngestExternalFile`` (no memtable, no WAL), and the deletes and next offsets follow in one
        ``WriteBatch``; fewer go into a single ``WriteBatch`` as ``apply`` does.
        A crash between the ingestion and the batch leaves values newer than the stored next
        offsets: the next start replays those records again, which writes the same values.

        Returns:
            ``len(keys) + len(deletes)``.

        Raises:
            StoreError: read-only store, a next offset moving backwards, or RocksDB refusing the
                file (named) or the write.
        """
        if tombstones and len(tombstones) != len(deletes):
            raise ValueError(f"{len(tombstones)} tombstone records for {len(deletes)} deletes")
        with self._writing(next_offsets) as batch:
            data = self._data_handle
            if len(keys) >= bulk_min_entries:
                self._ingest_puts(keys, values)
            else:
                for key, value in zip(keys, values):
                    batch.put(key, value, data)
            for key in deletes:
                batch.delete(key, data)
            if self._tombstones_handle is not None:
                for key, at in zip(deletes, tombstones):
                    batch.put(key, at, self._tombstones_handle)
        return len(keys) + len(deletes)

    def apply_store_entries(self, entries: _native.StoreEntries, next_offsets: Mapping[int, int], *,
                            bulk_min_entries: int = 20_000, max_files: int | None = None) -> int:
        """Write the latest entry of each key held in ``entries``, then the next offsets (a rebuild).

        :meth:`apply_entries` without a Python object per key: ``entries`` (the native core's
        latest entry per data key, tombstones as deletes) is de-duplicated in place; from
        ``bulk_min_entries`` puts on, in a store compressed with "none" or "lz4", the native
        core writes the puts and deletes straight into SST files (RocksDB BlockBasedTable
        format, data blocks of :data:`SST_BLOCK_SIZE` bytes, the store's compression; one file
        per core (at most ``max_files``: a caller writing from several threads at once leaves
        the cores to them, and each file is one more in L0) from :data:`SST_FILE_MIN_ENTRIES`
        entries each, written in parallel), which
        RocksDB ``IngestExternalFile`` moves into the store in one atomic call (a delete there
        hides the older values of its key as a ``WriteBatch`` delete would); the next offsets
        follow in one ``WriteBatch``. Each delete's tombstone record (where the tombstone was)
        goes into one more SST file, ingested into the tombstones column family before the
        data: a crash between the two leaves records of keys that may still be live, which a
        reader consults only for an absent key. Other stores ("snappy", "zstd") and smaller writes take
        :meth:`apply_entries`'s path. ``entries`` is empty afterwards. The crash rule of
        :meth:`apply_entries` holds.

        Returns:
            Puts + deletes written (after de-duplication).

        Raises:
            StoreError: read-only store, a next offset moving backwards, or RocksDB refusing the
                file (named) or the write; the SST file cannot be written (named).
        """
        self._require_writable(next_offsets)  # refused before the entries are sorted
        puts, deletes = entries.sort_latest()
        if puts < bulk_min_entries or self.options.compression not in _NATIVE_SST_COMPRESSIONS:
            recorded = entries.tombstones()[1] if deletes and self._tombstones is not None else ()
            return self.apply_entries(*entries.take_sorted(), next_offsets, bulk_min_entries=bulk_min_entries,
                                      tombstones=recorded)
        with self._writing(next_offsets):
            # One file per core from SST_FILE_MIN_ENTRIES entries on: the native core writes them in
            # parallel. The deletes go into the files too: in a WriteBatch they would fill the
            # memtable, and RocksDB flushes a memtable that overlaps a file before ingesting it.
            files = max(1, min(max_files or os.cpu_count() or 1, (puts + deletes) // SST_FILE_MIN_ENTRIES))
            with self._ingest_dir() as sst_dir:
                if deletes and self._tombstones is not None:
                    self._ingest_tombstones(entries, sst_dir / "tombstones.sst")
                paths = [sst_dir / f"entries-{n}.sst" for n in range(files)]
                # A file that overlaps nothing lands in the bottom level, whose deletes RocksDB keeps
                # for good: deletes of a partition the store holds nothing of hide nothing, so they
                # are left out (a cold start's first chunk).
                empty = [p for p in next_offsets if self._holds_nothing_of(p)]
                try:
                    written, _ = entries.take_sst(list[str | os.PathLike[str]](paths), self.options.compression,
                                                  SST_BLOCK_SIZE, write_deletes=True, skip_deletes_of=empty)
                except OSError as exc:
                    raise StoreError(f"state store {self.path}: {exc}") from exc
                written_paths = [path for path in paths if path.exists()]
                if written_paths:  # nothing to write, no file (RocksDB ingests no empty file)
                    self._ingest(written_paths)
        return written

    def ingest_snapshot(self, sst_files: Sequence[Path | str], next_offsets: Mapping[int, int]) -> int:
        """Fill an empty store from SST files (:class:`StoreSstWriter`) and set the next offsets they reflect.

        RocksDB ``IngestExternalFile`` copies the files into the data column family (no
        per-key writes); then the next offsets are written in one batch, each also as the
        partition's start offset (``drop_below``: the entries stand for the records below it). A
        crash between the two leaves data without offsets: the next ``run`` finds the store ahead
        of an empty local log and rebuilds it, so nothing half-ingested is ever served as complete.

        Args:
            sst_files: files whose keys are :func:`~materializer.adapters.rocksdb_store.encode_store_key`
                and values :func:`~materializer.adapters.rocksdb_store.encode_stored_value`, keys
                sorted, files not overlapping.
            next_offsets: partition -> next offset the snapshot reflects (every partition of the
                snapshot, those without live keys included).

        Returns:
            the live entries now in the store.

        Raises:
            StoreError: the store is read-only or not empty, or RocksDB refused a file (named).
        """
        self._require_writable()  # read-only before "not empty"
        if self._offsets or not self._is_empty(self._data):
            raise StoreError(f"state store {self.path} is not empty; a snapshot is ingested into a new store")
        files = [str(f) for f in sst_files]
        # The snapshot's entries stand for records below its next offsets, where the restored local
        # logs start: they are the state there, not records the log start passed (drop_below).
        with self._writing(next_offsets, start_offsets=next_offsets):
            if files:
                with self._mapped_errors():
                    self._data.ingest_external_file(files)
        return self.count()

    def _ingest_tombstones(self, entries: _native.StoreEntries, path: Path) -> None:
        """Write the tombstone records of ``entries`` (sorted) to the SST file ``path`` and ingest it
        into the tombstones column family. Only inside a :meth:`_writing` block."""
        assert self._tombstones is not None
        try:
            written = entries.write_tombstone_sst(path, self.options.compression, SST_BLOCK_SIZE)
        except OSError as exc:
            raise StoreError(f"state store {self.path}: {exc}") from exc
        if written:
            ingest = IngestExternalFileOptions()
            ingest.set_move_files(True)
            with map_rocksdb_errors(path):
                self._tombstones.ingest_external_file([str(path)], ingest)

    def _holds_nothing_of(self, partition: int) -> bool:
        """Whether no live entry of ``partition`` is in the store (one iterator seek)."""
        prefix = partition_prefix(partition)
        with self._mapped_errors(), contextlib.closing(self._checked(self._data, prefix, keys_only=True)) as keys:
            first = next(keys, None)
        return first is None or not first.startswith(prefix)

    @contextlib.contextmanager
    def _ingest_dir(self) -> Iterator[Path]:
        """A scratch folder for SST files inside the store (``.ingest-*``, removed afterwards or at the next open)."""
        sst_dir = Path(tempfile.mkdtemp(prefix=_INGEST_DIR_PREFIX, dir=self.path))
        try:
            yield sst_dir
        finally:
            shutil.rmtree(sst_dir, ignore_errors=True)

    def _ingest(self, sst_paths: Sequence[Path]) -> None:
        """Ingest ``sst_paths`` (one or more, non-overlapping key ranges) in one atomic ``IngestExternalFile``.

        Only inside a :meth:`_writing` block (whose checks have passed and whose batch follows).
        """
        ingest = IngestExternalFileOptions()
        ingest.set_move_files(True)  # a hard link into the store, not a copy
        with map_rocksdb_errors(sst_paths[0].parent):
            if self._bulk_loading and not self._bulk_options_set and self._ingests_in_bulk >= 2:
                self._data.set_options(_BULK_LOAD_OPTIONS)
                self._bulk_options_set = True
            self._data.ingest_external_file([str(path) for path in sst_paths], ingest)
            self._ingests_in_bulk += 1
            if self._bulk_options_set and (self._data.property_int_value("rocksdb.num-files-at-level0") or 0) \
                    >= BULK_LOAD_MAX_L0_FILES:
                self._data.compact_range(None, None)

    def _ingest_puts(self, keys: Sequence[bytes], values: Sequence[bytes]) -> None:
        with self._ingest_dir() as sst_dir:
            sst_path = sst_dir / "entries.sst"
            writer = SstFileWriter(self.options.to_options())  # the store's own block compression
            with map_rocksdb_errors(sst_path):
                writer.open(str(sst_path))
                deque(map(writer.__setitem__, keys, values), maxlen=0)  # the loop runs in C
                writer.finish()
            self._ingest([sst_path])


class StoreSstWriter:
    """Writes one sorted RocksDB SST file of store entries, for ``StateStore.ingest_snapshot``.

    Entries must come in store-key order: partition ascending, then key bytes ascending (what a
    sort by ``(partition, key)`` with unsigned byte comparison gives, e.g. Spark's binary order).

    Raises:
        StoreError: an entry out of order or a duplicate (RocksDB's SstFileWriter refuses it), or
            the file cannot be written; the file is named.
    """

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self.entries = 0
        self._writer = SstFileWriter(Options(raw_mode=True))
        with map_rocksdb_errors(self.path):
            self._writer.open(str(self.path))
        self._last: bytes | None = None

    def put(self, partition: int, key: bytes, offset: int, timestamp: int, value: bytes) -> None:
        """Add the live value of ``key`` in ``partition`` (record ``offset``, ``timestamp`` in ms)."""
        store_key = encode_store_key(partition, key)
        if self._last is not None and store_key <= self._last:
            raise StoreError(f"{self.path}: entry (partition {partition}, key {key!r}) is not after the previous "
                             f"one: SST entries must be sorted by partition then key bytes, without duplicates")
        self._last = store_key
        with map_rocksdb_errors(self.path):
            self._writer[store_key] = encode_stored_value(offset, timestamp, value)
        self.entries += 1

    def finish(self) -> int:
        """Close the file; returns its entries. An empty writer writes no file (RocksDB refuses one)."""
        if self.entries:
            with map_rocksdb_errors(self.path):
                self._writer.finish()
        return self.entries
