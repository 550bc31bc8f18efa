"""The RocksDB state store: per partition, key -> latest value of one topic, with each partition's next offset.

One RocksDB per topic at ``<data dir>/state/<topic>/``, opened through rocksdict in raw mode
(keys and values are bytes, nothing is pickled). Column families::

    data       StoreKey -> StoredValue
                 StoreKey    => Partition Int32 (big-endian) + key bytes
                 StoredValue => Offset    Int64 (big-endian; offset of the record that wrote the value)
                                Timestamp Int64 (big-endian; that record's timestamp, ms)
                                Value     Bytes (the record value, unchanged; may be empty)
    metadata   b"format_version"          -> Int32 (FORMAT_VERSION)
               b"next_offset:" + Int32 p  -> Int64  next offset to apply from partition p
               b"start_offset:" + Int32 p -> Int64  log start offset the partition's entries follow
                                                    (entries of records below it were dropped)
    default    unused

Partitions are independent, as Kafka compacts each partition on its own (Kafka's LogCleaner
cleans one TopicPartition at a time; a Kafka Streams store is one per task): the same key in two
partitions is two entries, and a record or tombstone of one partition never touches another
partition's entry. Keys are partition-major, so one partition's keys are contiguous (it can be
scanned or dropped alone, and a per-partition SST file never overlaps another's).

When a key lives in more than one partition (after a partition-count increase, or producers with
different partitioners), :meth:`StateStore.get` without a partition returns the value whose record
has the latest timestamp ("last write wins across partitions"; on equal timestamps the lower
partition number wins); :meth:`StateStore.get_all` returns every partition's value.

Invariant: every ``apply`` writes the puts, the deletes (a tombstone -- null value -- deletes
the key in its partition) AND the new next offsets in ONE ``WriteBatch``, so the values and the
offsets they reflect are always consistent, and a next offset never moves backwards (:class:`StoreError`).

RocksDB failures are translated once, in :func:`map_rocksdb_error`: a held ``LOCK`` file ->
:class:`StoreLockedError`, ``Corruption`` / missing files / unknown column families ->
:class:`StoreCorruptedError`, anything else -> :class:`StoreError`. A store written by another
format version (version 1 keyed the data by key alone) is a :class:`StoreCorruptedError`, which
the Materializer answers by rebuilding the store from the local log.

Modelled on Quix Streams' ``RocksDBStorePartition`` (one batch for data and changelog offset).
Not thread-safe: one writer per store.
"""

from __future__ import annotations

import contextlib
import heapq
import os
from collections import deque
import shutil
import struct
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Generator, Iterable, Iterator, Literal, Mapping, NamedTuple, Sequence, TypeVar, cast

from rocksdict import (
    AccessType,
    DBCompressionType,
    IngestExternalFileOptions,
    Options,
    Rdict,
    SstFileWriter,
    WriteBatch,
    WriteOptions,
)

from ..storage import _native
from ..storage.record_batch import Record
from .errors import StoreCorruptedError, StoreError, StoreLockedError, StoreReplacedError
from .rocksdb_secondary import catch_up_may_go_stale, newest_log
from .store_memory import StoreMemory

__all__ = [
    "BULK_LOAD_MAX_L0_FILES",
    "DATA_CF_NAME",
    "decode_store_key",
    "decode_stored_value",
    "encode_store_key",
    "encode_stored_value",
    "latest_across_partitions",
    "FORMAT_VERSION",
    "METADATA_CF_NAME",
    "StateStore",
    "StateStoreOptions",
    "StoredValue",
    "StoreSstWriter",
    "map_rocksdb_error",
    "map_rocksdb_errors",
]

DATA_CF_NAME = "data"
METADATA_CF_NAME = "metadata"
FORMAT_VERSION = 2
FORMAT_VERSION_KEY = b"format_version"
NEXT_OFFSET_KEY_PREFIX = b"next_offset:"
START_OFFSET_KEY_PREFIX = b"start_offset:"

_VALUE_PREFIX = struct.Struct(
    ">"
    "q"  # Offset => Int64
    "q"  # Timestamp => Int64
)
_INT32 = struct.Struct(">i")
_INT64 = struct.Struct(">q")

SST_BLOCK_SIZE = 4096
"""Bytes of a data block (uncompressed) in the SST files the store writes: RocksDB's
``BlockBasedTableOptions::block_size`` default, which the store keeps (it configures no other)."""

SST_FILE_MIN_ENTRIES = 40_000
"""Puts per SST file in a bulk write: ``puts // SST_FILE_MIN_ENTRIES`` files (at least one, at most
one per core), written by parallel threads."""

_ROCKSDICT_CONFIG = "rocksdict-config.json"  # rocksdict's own file, rewritten on every open
_NOT_LINKED = frozenset({"LOCK", "LOG", _ROCKSDICT_CONFIG})  # what a reader's folder of links leaves out
#: How often a reader links the store's files again when opening or catching up failed while the
#: writer replaced files (StateStore._as_reader).
READER_ATTEMPTS = 5

T = TypeVar("T")

#: Data column family options while a store is bulk loaded (:meth:`StateStore.set_bulk_loading`):
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

_COMPRESSION_TYPES = {
    "none": DBCompressionType.none,
    "snappy": DBCompressionType.snappy,
    "lz4": DBCompressionType.lz4,
    "zstd": DBCompressionType.zstd,
}


@dataclass(frozen=True)
class StateStoreOptions:
    """RocksDB settings of a state store, converted in one place by :meth:`to_options`.

    Attributes:
        write_buffer_size_bytes: memtable size before a flush to an SST file (64 MiB).
        max_write_buffer_number: memtables kept in memory (3).
        compression: SST block compression: "none", "snappy", "lz4" (default) or "zstd".
        sync_writes: fsync the WAL on every ``apply`` (False: the WAL is written but not fsynced;
            a process crash loses nothing, a power loss may lose the last batches, which are
            then replayed from the local log).
        memory: one budget for the memtables and block cache of every store opened with these
            options in this process (:class:`~materializer.adapters.store_memory.StoreMemory`,
            Kafka Streams' bounded-memory setup); None (default): RocksDB sizes each store on
            its own (up to ``write_buffer_size_bytes * max_write_buffer_number`` of memtables
            per column family, a block cache per store).
    """

    write_buffer_size_bytes: int = 64 * 1024 * 1024
    max_write_buffer_number: int = 3
    compression: Literal["none", "snappy", "lz4", "zstd"] = "lz4"
    sync_writes: bool = False
    memory: StoreMemory | None = None

    def to_options(self) -> Options:
        """The ``rocksdict.Options`` (raw mode, create if missing) for these settings.

        Raises:
            ValueError: unknown ``compression``.
        """
        if self.compression not in _COMPRESSION_TYPES:
            raise ValueError(f"unknown RocksDB compression {self.compression!r}; expected one of "
                             f"{', '.join(_COMPRESSION_TYPES)}")
        options = Options(raw_mode=True)
        options.create_if_missing(True)
        options.create_missing_column_families(True)
        options.set_write_buffer_size(self.write_buffer_size_bytes)
        options.set_max_write_buffer_number(self.max_write_buffer_number)
        options.set_compression_type(_COMPRESSION_TYPES[self.compression]())
        options.set_atomic_flush(True)
        if self.memory is not None:
            self.memory.configure(options)
        return options

    def to_write_options(self) -> WriteOptions:
        """The ``rocksdict.WriteOptions`` used by ``apply``."""
        write_options = WriteOptions()
        write_options.sync = self.sync_writes
        return write_options


class StoredValue(NamedTuple):
    """A live key's value and the record it came from.

    Attributes:
        partition: the Kafka partition the record was read from.
        offset: the record's offset in that partition.
        timestamp: the record's timestamp, ms since the epoch (CreateTime or LogAppendTime).
        value: the record value, unchanged (may be empty; a tombstone is never stored).
    """

    partition: int
    offset: int
    timestamp: int
    value: bytes


def map_rocksdb_error(exc: BaseException, path: Path | str, *, opened_as: Path | str | None = None) -> StoreError:
    """Translate a rocksdict/RocksDB exception into the most specific :class:`StoreError`.

    rocksdict raises plain ``Exception`` whose text starts with RocksDB's status
    (``"IO error: ..."``, ``"Corruption: ..."``, ``"Invalid argument: ..."``); this is the only
    place that reads that text. ``opened_as``: the folder RocksDB was opened at, if not ``path``
    (a reader's folder of links); the message names ``path`` instead.
    """
    message = str(exc) or type(exc).__name__
    if opened_as is not None:
        message = message.replace(str(opened_as), str(path))
    lowered = message.lower()
    if "/lock:" in lowered or "lock hold by current process" in lowered or "while lock file" in lowered:
        return StoreLockedError(
            f"state store {path} is locked by another materializer (RocksDB: {message}); "
            f"stop the other process or use another --data-dir")
    if ("corruption" in lowered or "may be corrupted" in lowered or "no such file or directory" in lowered
            or "column famil" in lowered):
        return StoreCorruptedError(
            f"state store {path} is damaged (RocksDB: {message}); delete it to rebuild it from the local log")
    return StoreError(f"state store {path} failed (RocksDB: {message})")


@contextlib.contextmanager
def map_rocksdb_errors(path: Path | str, *, opened_as: Path | str | None = None) -> Iterator[None]:
    """Context manager: re-raise any non-:class:`StoreError` exception via :func:`map_rocksdb_error`."""
    try:
        yield
    except StoreError:
        raise
    except Exception as exc:  # rocksdict raises bare Exception
        raise map_rocksdb_error(exc, path, opened_as=opened_as) from exc


def encode_store_key(partition: int, key: bytes) -> bytes:
    """The data column family key of ``key`` in ``partition``: Int32 partition (big-endian) + key bytes."""
    return _INT32.pack(partition) + key


def decode_store_key(store_key: bytes) -> tuple[int, bytes]:
    """``(partition, key)`` of a data column family key (the inverse of :func:`encode_store_key`).

    Raises:
        ValueError: shorter than the 4-byte partition prefix.
    """
    if len(store_key) < _INT32.size:
        raise ValueError(f"store key of {len(store_key)} bytes is shorter than its 4-byte partition prefix")
    return _INT32.unpack_from(store_key, 0)[0], bytes(store_key[_INT32.size:])


def encode_stored_value(offset: int, timestamp: int, value: bytes) -> bytes:
    """The data column family value: Int64 offset + Int64 timestamp (ms) + the value bytes."""
    return _VALUE_PREFIX.pack(offset, timestamp) + value


def decode_stored_value(partition: int, data: bytes, path: Path | str = "<store>") -> StoredValue:
    """The :class:`StoredValue` of ``partition`` held in ``data`` (from :func:`encode_stored_value`).

    Raises:
        StoreCorruptedError: ``data`` is shorter than its 16-byte offset/timestamp prefix.
    """
    if len(data) < _VALUE_PREFIX.size:
        raise StoreCorruptedError(
            f"state store {path}: stored value of {len(data)} bytes in partition {partition} is shorter "
            f"than its {_VALUE_PREFIX.size}-byte offset/timestamp prefix")
    offset, timestamp = _VALUE_PREFIX.unpack_from(data, 0)
    return StoredValue(partition, offset, timestamp, bytes(data[_VALUE_PREFIX.size:]))


def _prefix_end(prefix: bytes) -> bytes | None:
    """The smallest key above every key starting with ``prefix`` (None: no upper bound)."""
    stripped = prefix.rstrip(b"\xff")
    return None if not stripped else stripped[:-1] + bytes([stripped[-1] + 1])


def latest_across_partitions(values: Iterable[StoredValue]) -> StoredValue | None:
    """The value a key has when it lives in several partitions: "last write wins across partitions".

    The value whose record has the latest timestamp (ms); on equal timestamps the lower partition
    number. None for no values. Kafka orders records only within a partition, so this is the
    closest to "the latest write" a reader of several partitions can tell.
    """
    return min(values, key=lambda v: (-v.timestamp, v.partition), default=None)


def _next_offset_key(partition: int) -> bytes:
    return NEXT_OFFSET_KEY_PREFIX + _INT32.pack(partition)


def _start_offset_key(partition: int) -> bytes:
    return START_OFFSET_KEY_PREFIX + _INT32.pack(partition)


class StateStore:
    """Key -> latest value of one topic in RocksDB, with per-partition next offsets.

    Open with ``StateStore(path)``; use as a context manager or call :meth:`close`.

    ``read_only=True`` opens it beside a writer in another process (RocksDB's secondary instance:
    no lock taken, nothing written in the store's folder, which may be on a read-only mount; the
    write-ahead log replayed into memory; RocksDB is opened at a scratch directory of links to the
    store's files, which also holds its info log and is removed on close). Such a reader sees the store as of its opening or its last
    :meth:`catch_up`: values and the :meth:`offsets` they reflect come from the same atomic
    ``apply`` (never half of one), and each call of :meth:`catch_up` moves it to the writer's
    latest applied batch; every value it answers is the one of the offsets it reports, also after
    the writer flushed (a catch-up then opens a new secondary instance:
    :mod:`materializer.adapters.rocksdb_secondary`). A reader that opens or catches up while the
    writer replaces or adds files (a flush, a new MANIFEST, a restart replaying its write-ahead
    log) links the files again and retries, up to :data:`READER_ATTEMPTS` times.

    Raises (constructor):
        StoreLockedError: another process (or another open store in this process) holds it.
        StoreCorruptedError: unreadable files, unknown layout or an unknown format version.
        StoreError: any other RocksDB failure.
    """

    def __init__(self, path: Path | str, options: StateStoreOptions | None = None, *,
                 read_only: bool = False) -> None:
        self.path = Path(path)
        self.options = options or StateStoreOptions()
        self.read_only = read_only
        self._bulk_loading = False  # asked for by set_bulk_loading
        self._bulk_options_set = False  # _BULK_LOAD_OPTIONS are RocksDB's now
        self._ingests_in_bulk = 0
        existed = (self.path / "CURRENT").exists()
        if read_only and not existed:
            raise StoreError(f"no state store at {self.path}")
        if not read_only:
            self.path.mkdir(parents=True, exist_ok=True)
            for stale in self.path.glob(".ingest-*"):  # an SST file of a bulk write cut short
                shutil.rmtree(stale, ignore_errors=True)
        rocks_options = self.options.to_options()
        cf_options = {name: self.options.to_options() for name in (DATA_CF_NAME, METADATA_CF_NAME)}
        access = {}
        self._scratch: str | None = None
        self._reader_path: Path | None = None
        self._secondary_dir: Path | None = None  # a reader: its instance's secondary folder (info log)
        open_path = self.path
        if read_only:
            # A secondary instance (not RocksDB's read-only one) can follow the writer with
            # TryCatchUpWithPrimary; it keeps every file open (max_open_files=-1) so the writer's
            # compactions cannot delete a file under it. rocksdict writes rocksdict-config.json into
            # the folder it opens, on every open whatever the options: a reader opens a scratch
            # folder of links to the store's files instead, so it writes nothing in the data dir
            # (which may be a read-only mount).
            self._scratch = tempfile.mkdtemp(prefix="materializer-reader-")
            self._reader_path = open_path = Path(self._scratch) / "db"
            self._reader_path.mkdir()
            rocks_options.set_max_open_files(-1)
            self._secondary_dir = Path(self._scratch) / "secondary"
            access = {"access_type": AccessType.secondary(str(self._secondary_dir))}
        self._reader_options = (rocks_options, cf_options)  # a reader opens new secondary instances with them
        #: A reader: how often a catch-up opened a new RocksDB secondary instance instead of catching
        #: the one it had up in place (:mod:`materializer.adapters.rocksdb_secondary`).
        self.secondary_reopens = 0
        # a reader's instances replaced by a reopen, with their secondary folders: closed at the next catch-up
        self._retired: list[tuple[Rdict, Path]] = []
        self._newest_log_read = -1  # a reader: the newest write-ahead log its instance read (rocksdb_secondary)
        self._db: Rdict | None = None
        # A reader: the RocksDB identity of the store it opened (a store created in its place has
        # another one), and the error its reads raise once it can no longer serve (refuse_reads).
        self._identity: str | None = None
        self._refusal: Exception | None = None
        try:
            if self._reader_path is None:
                self._open(open_path, rocks_options, cf_options, access, existed=existed)
            else:
                def open_reader(linked: set[str], _attempt: int) -> None:
                    try:
                        if self._db is not None:  # an open that missed files: opened again
                            self._drop_db()
                        identity = self._read_identity()
                        self._open(open_path, rocks_options, cf_options, access, existed=existed)
                        if self._read_identity() != identity:  # replaced while it opened: a mix
                            raise StoreReplacedError(f"state store {self.path} was replaced while it was opened")
                        self._identity = identity
                        self._newest_log_read = newest_log(linked)
                    except BaseException:
                        # half opened: the next attempt opens on fresh links; the open's error is
                        # the one to report, not a failure to close what it half opened
                        with contextlib.suppress(Exception):
                            self._drop_db()
                        raise
                self._as_reader(open_reader)
        except BaseException:
            self.close()
            raise
        self._write_options = self.options.to_write_options()

    def _open(self, open_path: Path, rocks_options: Options, cf_options: dict[str, Options],
              access: dict[str, Any], *, existed: bool) -> None:
        """Open RocksDB at ``open_path``, check the format version (writing it into a new store) and
        load the next offsets. On an error the DB is left for :meth:`close`."""
        with self._mapped_errors():
            self._db = Rdict(str(open_path), rocks_options, column_families=cf_options, **access)
        with self._mapped_errors():
            self._data = self._db.get_column_family(DATA_CF_NAME)
            self._metadata = self._db.get_column_family(METADATA_CF_NAME)
            self._data_handle = self._db.get_column_family_handle(DATA_CF_NAME)
            self._metadata_handle = self._db.get_column_family_handle(METADATA_CF_NAME)
            version = self._metadata.get(FORMAT_VERSION_KEY)
            if version is None:
                # An empty RocksDB without the version is a store whose creation was cut short
                # (a crash between creating the DB and writing the version): finish creating it.
                if existed and not all(map(self._is_empty, (self._db, self._data, self._metadata))):
                    raise StoreCorruptedError(f"{self.path} is a RocksDB without a {FORMAT_VERSION_KEY!r} "
                                              f"entry: not a materializer state store")
                if self.read_only:
                    raise StoreError(f"state store {self.path} is still being created; try again")
                self._metadata.put(FORMAT_VERSION_KEY, _INT32.pack(FORMAT_VERSION))
            elif len(version) != 4 or _INT32.unpack(version)[0] != FORMAT_VERSION:
                found = _INT32.unpack(version)[0] if len(version) == 4 else f"0x{version.hex()}"
                raise StoreCorruptedError(f"state store {self.path} has format version {found}; "
                                          f"this materializer reads version {FORMAT_VERSION} "
                                          f"(version 2 keeps each partition's keys apart)")
            self._offsets = self._load_offsets()

    def _as_reader(self, step: Callable[[set[str], int], T]) -> T:
        """A reader: link the store's files, then ``step(names linked, attempt)`` (open or catch up)
        on them, and retry on fresh links, up to :data:`READER_ATTEMPTS` times, when

        * it failed and the store folder no longer holds the files linked (the writer flushed,
          switched to a new MANIFEST or replayed its write-ahead log on a restart in between, so the
          links were a mix of two states);
        * or it succeeded but the folder now holds an SST file that was not linked (the writer
          flushed, ingested or compacted meanwhile). RocksDB may then have read a MANIFEST naming a
          file it could not see: it keeps the last version whose files it has, while the logs that
          file holds count as flushed and are not replayed, so the instance would serve older values
          than its offsets (a new instance is opened on the next attempt).

        Raises:
            StoreError: ``step``'s error when the folder did not change meanwhile, or on the last
                attempt; or SST files appeared during every attempt.
        """
        for attempt in range(1, READER_ATTEMPTS + 1):
            linked = self._link_store_files()
            try:
                result = step(linked, attempt)
            except StoreError:
                if attempt == READER_ATTEMPTS or self._store_file_names() == linked:
                    raise
            else:
                if not any(name.endswith(".sst") for name in self._store_file_names() - linked):
                    return result
            time.sleep(0.005 * attempt)  # the writer's switch is a few file operations
        raise StoreError(f"state store {self.path}: the writer added files during each of {READER_ATTEMPTS} "
                         f"attempts to read it; try again")

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

    # -- lifecycle ---------------------------------------------------------------------------

    @staticmethod
    def exists(path: Path | str) -> bool:
        """True when ``path`` holds a RocksDB (its ``CURRENT`` file exists)."""
        return (Path(path) / "CURRENT").exists()

    @staticmethod
    def destroy(path: Path | str) -> None:
        """Delete the store's folder (the store must be closed). Missing folder: no-op."""
        shutil.rmtree(Path(path), ignore_errors=True)

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

    def close(self) -> None:
        """Flush memtables and release the lock (a reader: remove its scratch directory). Idempotent."""
        try:
            self._drop_db()
        finally:
            scratch = getattr(self, "_scratch", None)  # absent when __init__ failed early
            if scratch is not None:
                shutil.rmtree(scratch, ignore_errors=True)
                self._scratch = None

    def _drop_db(self) -> None:
        """Close RocksDB (flushing memtables, releasing the lock); keep a reader's scratch folder."""
        db = getattr(self, "_db", None)
        # Column-family objects keep the DB (and its LOCK) alive: drop them first (every use
        # after close is refused by _require_open).
        self._data = self._metadata = self._data_handle = self._metadata_handle = None  # type: ignore[assignment]
        self._db = None
        try:
            self._close_retired()
        finally:
            if db is not None:
                with self._mapped_errors():
                    db.close()

    def _close_retired(self) -> None:
        """Close the secondary instances a reader replaced (:meth:`_open_secondary_again`) and remove
        their secondary folders."""
        retired, self._retired = getattr(self, "_retired", []), []
        for db, folder in retired:
            try:
                with self._mapped_errors():
                    db.close()
            finally:
                shutil.rmtree(folder, ignore_errors=True)

    def catch_up(self) -> dict[int, int]:
        """A read-only store: move to the writer's latest applied batch; return the new :meth:`offsets`.

        Cost: reads the writer's new MANIFEST and WAL entries (milliseconds); values read after it
        reflect exactly the returned next offsets (partition -> next offset to apply). Where RocksDB's
        catch-up in place could leave memtable entries older than an SST file it adds (the writer
        started a new write-ahead log to flush since, while this reader's memtables hold entries:
        :mod:`materializer.adapters.rocksdb_secondary`), or the writer added SST files while it ran,
        a new secondary instance is opened on the store instead (the cost of an open: the live
        write-ahead log replayed, every SST file opened; counted in :attr:`secondary_reopens`); the
        one it replaces is closed at the next catch-up (a read in another thread may still use it
        meanwhile; none should span two catch-ups).

        Raises:
            StoreReplacedError: the folder holds another store than the one this reader opened (a
                re-created topic, a restore, a rebuild): nothing was caught up and what was read
                before is still served; or it was replaced during the catch-up: then every read
                raises it from now on (:meth:`refuse_reads`). Open the store again either way.
            StoreError: not opened ``read_only``; or RocksDB failed, or the writer added files during
                every attempt: then every read raises it from now on (what the instance holds may
                be caught up halfway). Open the store again.
        """
        self._require_open()
        if not self.read_only:
            raise StoreError(f"catch_up() is for read-only stores; {self.path} is the writer's")
        self._close_retired()

        if self._read_identity() != self._identity:
            # Another store in the folder (the topic re-created, restored over, rebuilt): catching up
            # would follow its MANIFEST into its state, partial while it is built. This reader keeps
            # what it read so far; its owner opens the folder again.
            raise StoreReplacedError(f"state store {self.path} was replaced by another store since this reader "
                                     f"opened it (a re-created topic, a restore or a rebuild): open it again")

        def catch_up_once(linked: set[str], attempt: int) -> None:
            with self._mapped_errors():
                db = self._require_open()
                if attempt > 1 or catch_up_may_go_stale((db, self._data, self._metadata), self._newest_log_read,
                                                        linked):
                    self._open_secondary_again(linked)  # an attempt that missed files: a new instance too
                    return
                db.try_catch_up_with_primary()
                self._newest_log_read = newest_log(linked)  # it lists the linked logs only
                self._offsets = self._load_offsets()
        try:
            self._as_reader(catch_up_once)
        except StoreError as exc:
            self.refuse_reads(exc)  # it may have caught up halfway, or past files it could not see
            raise
        if self._read_identity() != self._identity:
            mixed = StoreReplacedError(f"state store {self.path} was replaced while this reader caught up: what it "
                                       f"read may mix both stores, so it serves nothing more; open it again")
            self.refuse_reads(mixed)
            raise mixed
        return dict(self._offsets)

    def _open_secondary_again(self, linked: set[str]) -> None:
        """A reader: replace its RocksDB secondary instance by a new one opened on the same links
        (``linked``; a new secondary folder for its info log), so its memtables hold the live
        write-ahead logs whole, up to the one being written; the old one is retired (closed at the
        next catch-up). On failure the old one stays.

        Raises:
            StoreError: the new instance cannot be opened (mapped RocksDB errors).
        """
        assert self._scratch is not None and self._reader_path is not None, "only a reader opens secondaries"
        rocks_options, cf_options = self._reader_options
        self.secondary_reopens += 1
        folder = Path(self._scratch) / f"secondary-{self.secondary_reopens}"
        access = {"access_type": AccessType.secondary(str(folder))}
        old = (self._db, self._data, self._metadata, self._data_handle, self._metadata_handle, self._offsets)
        try:
            self._open(self._reader_path, rocks_options, cf_options, access, existed=True)
        except BaseException:
            opened = self._db
            self._db, self._data, self._metadata, self._data_handle, self._metadata_handle, self._offsets = old
            if opened is not None and opened is not old[0]:
                with contextlib.suppress(Exception):
                    opened.close()
            shutil.rmtree(folder, ignore_errors=True)
            raise
        if old[0] is not None and self._secondary_dir is not None:
            self._retired.append((old[0], self._secondary_dir))
        self._secondary_dir = folder
        self._newest_log_read = newest_log(linked)

    def _read_identity(self) -> str | None:
        """The RocksDB identity in the store folder (its ``IDENTITY`` file, written once when the DB
        is created), or None when there is none (no store, or one being created)."""
        try:
            return (self.path / "IDENTITY").read_text(encoding="ascii").strip() or None
        except FileNotFoundError:
            return None
        except (OSError, UnicodeDecodeError) as exc:  # not "another store": a failure to say
            raise StoreError(f"state store {self.path}: its IDENTITY cannot be read: {exc}") from exc

    def replaced(self) -> bool:
        """A reader: whether the folder now holds another store than the one it opened (another
        RocksDB identity, or none: destroyed).

        Raises:
            StoreError: the identity cannot be read (an I/O error).
        """
        return self._read_identity() != self._identity

    def refuse_reads(self, error: Exception) -> None:
        """From now on every read (and write) raises ``error``: what this reader holds can no
        longer be served (a mix of two states). :meth:`close` still works."""
        self._refusal = error

    @property
    def refused(self) -> bool:
        """Whether :meth:`refuse_reads` was called: only a new open serves this folder again."""
        return self._refusal is not None

    def _store_file_names(self) -> set[str]:
        """The names in the store folder a reader links: not the ``LOCK`` (a secondary instance takes
        none), the writer's info ``LOG`` files, rocksdict's config or hidden files."""
        try:
            return {name for name in os.listdir(self.path)
                    if name not in _NOT_LINKED and not name.startswith("LOG.old") and not name.startswith(".")}
        except OSError as exc:
            raise StoreError(f"state store {self.path} cannot be listed: {exc.strerror or exc}") from exc

    def _link_store_files(self) -> set[str]:
        """A reader: make its scratch folder hold a link to every file of the store folder now (the
        writer adds and deletes files; a link whose file is gone is removed); return the names linked."""
        shadow = self._reader_path
        assert shadow is not None, "only a reader links the store's files"
        names = self._store_file_names()
        linked = set(os.listdir(shadow)) - {_ROCKSDICT_CONFIG}
        for name in linked - names:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(shadow / name)
        for name in names - linked:
            os.symlink(self.path.absolute() / name, shadow / name)
        return names

    def _mapped_errors(self) -> contextlib.AbstractContextManager[None]:
        """:func:`map_rocksdb_errors` naming the store folder (a reader's RocksDB names its scratch folder)."""
        return map_rocksdb_errors(self.path, opened_as=self._reader_path)

    def __enter__(self) -> "StateStore":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _require_open(self) -> Rdict:
        if self._db is None:
            raise StoreError(f"state store {self.path} is closed")
        if self._refusal is not None:
            raise self._refusal.with_traceback(None)  # else every raise would lengthen its traceback
        return self._db

    # -- reads -------------------------------------------------------------------------------

    def _load_offsets(self) -> dict[int, int]:
        offsets: dict[int, int] = {}
        for key, value in self._checked(self._metadata, NEXT_OFFSET_KEY_PREFIX):
            if not key.startswith(NEXT_OFFSET_KEY_PREFIX):
                break
            suffix = key[len(NEXT_OFFSET_KEY_PREFIX):]
            if len(suffix) != 4 or len(value) != 8:
                raise StoreCorruptedError(f"state store {self.path}: malformed next offset entry {key!r}")
            offsets[_INT32.unpack(suffix)[0]] = _INT64.unpack(value)[0]
        return offsets

    def offsets(self) -> dict[int, int]:
        """Next offset to apply per partition (partitions never applied are absent)."""
        self._require_open()
        return dict(self._offsets)

    def partitions(self) -> list[int]:
        """Partitions applied so far (those with a next offset), ascending."""
        self._require_open()
        return sorted(self._offsets)

    def get(self, key: bytes, partition: int | None = None) -> StoredValue | None:
        """The live value of ``key``, or None when absent or deleted.

        Args:
            key: the record key bytes.
            partition: look only in this partition. None: every partition; when the key lives in
                several, the value whose record has the latest timestamp (equal timestamps: the
                lower partition number) -- "last write wins across partitions".

        Raises:
            StoreCorruptedError: the stored value is malformed.
        """
        self._require_open()
        key = bytes(key)
        if partition is not None:
            with self._mapped_errors():
                data = self._data.get(encode_store_key(partition, key))
            return None if data is None else decode_stored_value(partition, data, self.path)
        return latest_across_partitions(self.get_all(key).values())

    def get_all(self, key: bytes) -> dict[int, StoredValue]:
        """``partition -> StoredValue`` for every partition in which ``key`` is live (one multi-get).

        Raises:
            StoreCorruptedError: a stored value is malformed.
        """
        self._require_open()
        key = bytes(key)
        partitions = sorted(self._offsets)
        if not partitions:
            return {}
        with self._mapped_errors():
            found = self._multi_get([encode_store_key(p, key) for p in partitions])
        return {p: decode_stored_value(p, data, self.path)
                for p, data in zip(partitions, found) if data is not None}

    def _multi_get(self, store_keys: list[bytes]) -> list[bytes | None]:
        """One RocksDB multi-get of the data column family: each key's value, or None."""
        found = self._data.get(cast("list[str | int | float | bytes | bool]", store_keys))  # list: one multi-get
        return cast("list[bytes | None]", found)

    def items(self, partition: int | None = None) -> Iterator[tuple[bytes, StoredValue]]:
        """Every live ``(key, StoredValue)`` in (partition, key byte) order, or of one ``partition``.

        A key live in two partitions is yielded once for each.
        """
        self._require_open()
        prefix = b"" if partition is None else _INT32.pack(partition)
        with self._mapped_errors():
            for store_key, data in self._checked(self._data, prefix):
                if not store_key.startswith(prefix):
                    break
                stored_partition, key = decode_store_key(store_key)
                yield key, decode_stored_value(stored_partition, data, self.path)

    def get_many(self, keys: Iterable[bytes], partition: int | None = None) -> dict[bytes, StoredValue]:
        """``key -> StoredValue`` for the live ``keys`` (absent ones left out), one multi-get.

        Without ``partition``, a key in several partitions gets the :meth:`get` rule (latest
        timestamp, then the lower partition).
        """
        self._require_open()
        keys = [bytes(k) for k in keys]
        partitions = sorted(self._offsets) if partition is None else [partition]
        if not keys or not partitions:
            return {}
        with self._mapped_errors():
            found = self._multi_get([encode_store_key(p, k) for k in keys for p in partitions])
        result: dict[bytes, StoredValue] = {}
        for i, key in enumerate(keys):
            values = [decode_stored_value(p, data, self.path)
                      for p, data in zip(partitions, found[i * len(partitions):(i + 1) * len(partitions)])
                      if data is not None]
            latest = latest_across_partitions(values)
            if latest is not None:
                result[key] = latest
        return result

    def scan(self, start: bytes = b"", end: bytes | None = None, *, prefix: bytes | None = None,
             partition: int | None = None) -> Iterator[tuple[bytes, StoredValue]]:
        """Live ``(key, StoredValue)`` in key byte order, keys in ``[start, end)`` or starting with ``prefix``.

        Every partition's range is read and merged by key (a key live in two partitions is
        yielded once for each, lower partition first), or one ``partition``'s alone.
        """
        self._require_open()
        if prefix is not None:
            start, end = prefix, _prefix_end(prefix)
        partitions = sorted(self._offsets) if partition is None else [partition]
        return heapq.merge(*(self._scan_partition(p, start, end) for p in partitions), key=lambda kv: kv[0])

    def _scan_partition(self, partition: int, start: bytes, end: bytes | None) -> Iterator[tuple[bytes, StoredValue]]:
        head = _INT32.pack(partition)
        with self._mapped_errors():
            for store_key, data in self._checked(self._data, head + start):
                if not store_key.startswith(head):
                    return
                key = bytes(store_key[len(head):])
                if end is not None and key >= end:
                    return
                yield key, decode_stored_value(partition, data, self.path)

    def count(self, partition: int | None = None) -> int:
        """Number of live (partition, key) entries, or of one ``partition`` (exact; iterates keys)."""
        self._require_open()
        if partition is None:
            with self._mapped_errors():
                return sum(1 for _ in self._checked(self._data, keys_only=True))
        prefix = _INT32.pack(partition)
        count = 0
        with self._mapped_errors():
            for store_key in self._checked(self._data, prefix, keys_only=True):
                if not store_key.startswith(prefix):
                    break
                count += 1
        return count

    # -- writes ------------------------------------------------------------------------------

    def apply(self, records_by_partition: Mapping[int, Sequence[Record]], next_offsets: Mapping[int, int]) -> int:
        """Apply records in order and set next offsets, all in ONE atomic ``WriteBatch``.

        A record with a value puts ``(partition, key) -> (offset, timestamp, value)``; a record
        with a null value (tombstone) deletes ``(partition, key)`` and nothing in another
        partition. Records of one partition must be in offset order.

        Args:
            records_by_partition: partition -> records to apply (keys must not be None).
            next_offsets: partition -> next offset to store (normally last applied offset + 1);
                every partition in ``records_by_partition`` must have one, above its last record.

        Returns:
            The number of records applied (puts + deletes).

        Raises:
            StoreError: a next offset would move backwards.
            ValueError: a record without key, or a next offset missing or not above a record.
        """
        db = self._require_open()
        if self.read_only:
            raise StoreError(f"state store {self.path} is open read-only")
        self._check_forward(next_offsets)
        batch = WriteBatch(raw_mode=True)
        applied = 0
        for partition, records in records_by_partition.items():
            if not records:
                continue
            if partition not in next_offsets:
                raise ValueError(f"records for partition {partition} come without a next offset")
            if records[-1].offset >= next_offsets[partition]:
                raise ValueError(f"next offset {next_offsets[partition]} of partition {partition} is not above "
                                 f"its last record offset {records[-1].offset}")
            for record in records:
                if record.key is None:
                    raise ValueError(f"record at offset {record.offset} of partition {partition} has a null key")
                store_key = encode_store_key(partition, record.key)
                if record.value is None:
                    batch.delete(store_key, self._data_handle)
                else:
                    batch.put(store_key, encode_stored_value(record.offset, record.timestamp, record.value),
                              self._data_handle)
                applied += 1
        for partition, next_offset in next_offsets.items():
            batch.put(_next_offset_key(partition), _INT64.pack(next_offset), self._metadata_handle)
        with self._mapped_errors():
            db.write(batch, self._write_options)
        self._offsets.update(next_offsets)
        return applied

    def apply_entries(self, keys: Sequence[bytes], values: Sequence[bytes], deletes: Sequence[bytes],
                      next_offsets: Mapping[int, int], *, bulk_min_entries: int = 20_000) -> int:
        """Write the latest entry of each key, then the next offsets (a rebuild).

        ``keys`` are data keys (:func:`encode_store_key`) sorted ascending without duplicates,
        ``values[i]`` the :func:`encode_stored_value` of ``keys[i]``; ``deletes`` the data keys
        whose latest record is a tombstone (none of them in ``keys``). From ``bulk_min_entries``
        puts on, the puts go into one SST file ingested with RocksDB ``IngestExternalFile`` (no
        memtable, no WAL), and the deletes and next offsets follow in one ``WriteBatch``; fewer go
        into a single ``WriteBatch`` as :meth:`apply` does.
        A crash between the ingestion and the batch leaves values newer than the stored next
        offsets: the next start replays those records again, which writes the same values.

        Returns:
            ``len(keys) + len(deletes)``.

        Raises:
            StoreError: read-only store, a next offset moving backwards, or RocksDB refusing the
                file (named) or the write.
        """
        self._require_writable(next_offsets)
        batch = WriteBatch(raw_mode=True)
        if len(keys) >= bulk_min_entries:
            self._ingest_puts(keys, values)
        else:
            for key, value in zip(keys, values):
                batch.put(key, value, self._data_handle)
        self._write_deletes_and_offsets(batch, deletes, next_offsets)
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
        follow in one ``WriteBatch``. Other stores ("snappy", "zstd") and smaller writes take
        :meth:`apply_entries`'s path. ``entries`` is empty afterwards. The crash rule of
        :meth:`apply_entries` holds.

        Returns:
            Puts + deletes written (after de-duplication).

        Raises:
            StoreError: read-only store, a next offset moving backwards, or RocksDB refusing the
                file (named) or the write; the SST file cannot be written (named).
        """
        self._require_writable(next_offsets)
        puts, deletes = entries.sort_latest()
        if puts < bulk_min_entries or self.options.compression not in _NATIVE_SST_COMPRESSIONS:
            return self.apply_entries(*entries.take_sorted(), next_offsets, bulk_min_entries=bulk_min_entries)
        # One file per core from SST_FILE_MIN_ENTRIES entries on: the native core writes them in
        # parallel. The deletes go into the files too: in a WriteBatch they would fill the
        # memtable, and RocksDB flushes a memtable that overlaps a file before ingesting it.
        files = max(1, min(max_files or os.cpu_count() or 1, (puts + deletes) // SST_FILE_MIN_ENTRIES))
        with self._ingest_dir() as sst_dir:
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
        self._write_deletes_and_offsets(WriteBatch(raw_mode=True), (), next_offsets)
        return written

    def _holds_nothing_of(self, partition: int) -> bool:
        """Whether no live entry of ``partition`` is in the store (one iterator seek)."""
        prefix = _INT32.pack(partition)
        with self._mapped_errors(), contextlib.closing(self._checked(self._data, prefix, keys_only=True)) as keys:
            first = next(keys, None)
        return first is None or not first.startswith(prefix)

    def _require_writable(self, next_offsets: Mapping[int, int]) -> None:
        self._require_open()
        if self.read_only:
            raise StoreError(f"state store {self.path} is open read-only")
        self._check_forward(next_offsets)

    def _write_deletes_and_offsets(self, batch: WriteBatch, deletes: Iterable[bytes],
                                   next_offsets: Mapping[int, int]) -> None:
        for key in deletes:
            batch.delete(key, self._data_handle)
        for partition, next_offset in next_offsets.items():
            batch.put(_next_offset_key(partition), _INT64.pack(next_offset), self._metadata_handle)
        with self._mapped_errors():
            self._require_open().write(batch, self._write_options)
        self._offsets.update(next_offsets)

    @contextlib.contextmanager
    def _ingest_dir(self) -> Iterator[Path]:
        """A scratch folder for SST files inside the store (``.ingest-*``, removed afterwards or at the next open)."""
        sst_dir = Path(tempfile.mkdtemp(prefix=".ingest-", dir=self.path))
        try:
            yield sst_dir
        finally:
            shutil.rmtree(sst_dir, ignore_errors=True)

    def _ingest(self, sst_paths: Sequence[Path]) -> None:
        """Ingest ``sst_paths`` (one or more, non-overlapping key ranges) in one atomic ``IngestExternalFile``."""
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

    def _check_forward(self, next_offsets: Mapping[int, int]) -> None:
        for partition, next_offset in next_offsets.items():
            current = self._offsets.get(partition)
            if current is not None and next_offset < current:
                raise StoreError(
                    f"state store {self.path}: refusing to move the next offset of partition {partition} "
                    f"backwards from {current} to {next_offset}")

    def drop_partition(self, partition: int) -> int:
        """Delete every entry of ``partition`` and its next offset, in ONE atomic ``WriteBatch``.

        For a partition whose local log restarts elsewhere (it is then re-materialized from what is
        fetched again); other partitions are untouched. One range delete over the partition's
        contiguous keys, as Kafka Streams drops a task's store.

        Returns:
            The number of entries deleted.

        Raises:
            ValueError: ``partition`` outside [0, 2**31 - 2].
            StoreError: the store is closed or read-only, or RocksDB failed.
        """
        db = self._require_open()
        if self.read_only:
            raise StoreError(f"state store {self.path} is open read-only")
        if not 0 <= partition < 2**31 - 1:
            raise ValueError(f"partition {partition} is outside [0, {2**31 - 2}]")
        dropped = self.count(partition)
        batch = WriteBatch(raw_mode=True)
        batch.delete_range(_INT32.pack(partition), _INT32.pack(partition + 1), self._data_handle)
        batch.delete(_next_offset_key(partition), self._metadata_handle)
        batch.delete(_start_offset_key(partition), self._metadata_handle)
        with self._mapped_errors():
            db.write(batch, self._write_options)
        self._offsets.pop(partition, None)
        return dropped

    def start_offset(self, partition: int) -> int:
        """The log start offset ``partition``'s entries follow (:meth:`drop_below`); 0 when never set."""
        self._require_open()
        with map_rocksdb_errors(self.path):
            data = self._metadata.get(_start_offset_key(partition))
        return 0 if data is None else _INT64.unpack(data)[0]

    def drop_below(self, partition: int, start_offset: int) -> int:
        """Delete every entry of ``partition`` whose record offset is below ``start_offset``, record
        ``start_offset``, and raise the partition's next offset to it when below, in ONE atomic
        ``WriteBatch``.

        For a partition whose log start offset rose (retention, DeleteRecords on the broker, a
        log restarted at the broker's log start offset): a key whose latest record is below it has
        no record left in the log, so a consumer reading the topic now would not see it, nor would
        a store rebuilt from the log; a key with a later record keeps it. The records below it that
        were never applied are gone too, so the next offset is at least ``start_offset``. Reads
        every entry of the partition once (O(its keys), about 1-2 µs each); when every applied
        record is below ``start_offset``, one range delete after counting the keys. A no-op when
        ``start_offset`` is not above the recorded one.

        Returns:
            The number of entries deleted.

        Raises:
            StoreError: the store is closed or read-only, or RocksDB failed.
        """
        db = self._require_open()
        if self.read_only:
            raise StoreError(f"state store {self.path} is open read-only")
        if start_offset <= self.start_offset(partition):
            return 0
        batch = WriteBatch(raw_mode=True)
        head = _INT32.pack(partition)
        next_offset = self._offsets.get(partition)
        with self._mapped_errors():
            if next_offset is not None and next_offset <= start_offset:
                # every entry's record is below the next offset: the whole partition goes
                doomed = self.count(partition)
                batch.delete_range(head, _INT32.pack(partition + 1), self._data_handle)
            else:
                doomed = 0
                offset_of = _INT64.unpack_from
                for store_key, data in self._checked(self._data, head):
                    if not store_key.startswith(head):
                        break
                    if len(data) >= _VALUE_PREFIX.size and offset_of(data, 0)[0] < start_offset:
                        batch.delete(store_key, self._data_handle)
                        doomed += 1
            batch.put(_start_offset_key(partition), _INT64.pack(start_offset), self._metadata_handle)
            raised = next_offset is not None and next_offset < start_offset
            if raised:
                batch.put(_next_offset_key(partition), _INT64.pack(start_offset), self._metadata_handle)
            db.write(batch, self._write_options)
        if raised:
            self._offsets[partition] = start_offset
        return doomed

    def ingest_snapshot(self, sst_files: Sequence[Path | str], next_offsets: Mapping[int, int]) -> int:
        """Fill an empty store from SST files (:class:`StoreSstWriter`) and set the next offsets they reflect.

        RocksDB ``IngestExternalFile`` copies the files into the data column family (no
        per-key writes); then the next offsets are written in one batch, each also as the
        partition's start offset (:meth:`drop_below`: the entries stand for the records below it). A crash between the two
        leaves data without offsets: the next ``run`` finds the store ahead of an empty local log
        and rebuilds it, so nothing half-ingested is ever served as complete.

        Args:
            sst_files: files whose keys are :func:`encode_store_key` and values
                :func:`encode_stored_value`, keys sorted, files not overlapping.
            next_offsets: partition -> next offset the snapshot reflects (every partition of the
                snapshot, those without live keys included).

        Returns:
            the live entries now in the store.

        Raises:
            StoreError: the store is read-only or not empty, or RocksDB refused a file (named).
        """
        db = self._require_open()
        if self.read_only:
            raise StoreError(f"state store {self.path} is open read-only")
        if self._offsets or not self._is_empty(self._data):
            raise StoreError(f"state store {self.path} is not empty; a snapshot is ingested into a new store")
        files = [str(f) for f in sst_files]
        if files:
            with self._mapped_errors():
                self._data.ingest_external_file(files)
        batch = WriteBatch(raw_mode=True)
        for partition, offset in next_offsets.items():
            batch.put(_next_offset_key(partition), _INT64.pack(offset), self._metadata_handle)
            # The snapshot's entries stand for records below its next offsets, where the restored
            # local logs start: they are the state there, not records the log start passed (drop_below).
            batch.put(_start_offset_key(partition), _INT64.pack(offset), self._metadata_handle)
        with self._mapped_errors():
            db.write(batch, self._write_options)
        self._offsets.update(next_offsets)
        return self.count()

    def __repr__(self) -> str:
        state = "closed" if self._db is None else f"offsets={self._offsets}"
        return f"StateStore({str(self.path)!r}, {state})"


class StoreSstWriter:
    """Writes one sorted RocksDB SST file of store entries, for :meth:`StateStore.ingest_snapshot`.

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
