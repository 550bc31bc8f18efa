"""A reader beside the writer: a store opened ``read_only`` is a RocksDB secondary instance that
follows the writer in another process (:class:`SecondaryReader`: open, :meth:`~SecondaryReader.catch_up`).

No lock is taken and nothing is written in the store's folder, which may be on a read-only mount:
RocksDB is opened at a scratch directory of links to the store's files (rocksdict writes its config
file into the folder it opens, on every open), which also holds the instance's info log and is
removed on close. Such a reader sees the store as of its opening or its last catch-up: values and
the offsets they reflect come from the same atomic write (never half of one). A reader that opens
or catches up while the writer replaces or adds files (a flush, a new MANIFEST, a restart replaying
its write-ahead log) links the files again and retries, up to :data:`READER_ATTEMPTS` times.

When a secondary instance may not be caught up in place, because it would serve stale values
(:func:`catch_up_may_go_stale`): ``TryCatchUpWithPrimary`` replays the writer's new MANIFEST records (SST files added and removed) and tails its write-ahead logs into the
secondary's own memtables. A point lookup reads the memtables first and stops at the first entry
of the key it finds. When the writer flushes a memtable (a full write buffer, an
``IngestExternalFile`` over keys in its memtable, every close, the replay of its log at a restart)
after this reader replayed only the beginning of the log behind it, the catch-up adds the flushed
SST file but keeps the memtable entries replayed before and skips the rest of that log: the older
value a memtable holds hides the newer one in the SST file, for ``Get`` at once and for iterators
once a bottommost compaction zeroed the file's sequence numbers, until that memtable is sealed by
a later write of the same column family and dropped by a later catch-up (RocksDB issues 14444 and
15051, open upstream; ``DBImplSecondary::RecoverLogFiles`` seals the active memtable only when a
batch of another log arrives). The offsets, in the small metadata column family, are read by an
iterator and reported current meanwhile.

Every such flush starts a new write-ahead log first (``DBImpl::SwitchMemtable``: the log being
written is sealed and a file with a higher number started; it is not reused while empty, but then
the memtable being flushed holds only logs sealed before). A log sealed before this instance read
it is read whole, never a beginning of it. So the instance is at risk exactly when its memtables
hold entries and the store folder holds a log numbered above the newest one the instance read:
then a new secondary instance is opened instead of catching this one up (its memtables hold the
live logs whole, up to the one being written). Compactions start no log: they never cost a reopen.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TypeVar

from rocksdict import AccessType, Options, Rdict

from ..errors import StoreError, StoreReplacedError
from .instance import StoreInstance

__all__ = ["READER_ATTEMPTS", "SecondaryReader", "catch_up_may_go_stale", "memtable_entries", "newest_log"]

T = TypeVar("T")

#: How often a reader links the store's files again when opening or catching up failed while the
#: writer replaced files (:meth:`SecondaryReader._as_reader`).
READER_ATTEMPTS = 5
_ROCKSDICT_CONFIG = "rocksdict-config.json"  # rocksdict's own file, rewritten on every open
_NOT_LINKED = frozenset({"LOCK", "LOG", _ROCKSDICT_CONFIG})  # what a reader's folder of links leaves out
_MEMTABLE_PROPERTIES = ("rocksdb.num-entries-active-mem-table", "rocksdb.num-entries-imm-mem-tables")


def memtable_entries(column_families: Iterable[Rdict]) -> int:
    """Entries (puts, deletes, range deletes) in the memtables of ``column_families``, active and
    immutable ones (RocksDB properties, no I/O)."""
    return sum(cf.property_int_value(name) or 0 for cf in column_families for name in _MEMTABLE_PROPERTIES)


def newest_log(names: Iterable[str]) -> int:
    """The highest number of a write-ahead log among the store folder's ``names`` (``000123.log``),
    or -1 when there is none."""
    numbers = [int(name[:-4]) for name in names if name.endswith(".log") and name[:-4].isdigit()]
    return max(numbers, default=-1)


def catch_up_may_go_stale(column_families: Iterable[Rdict], newest_read: int, linked: Iterable[str]) -> bool:
    """Whether catching a secondary instance up in place may leave memtable entries older than an
    SST file it adds (module docstring): the store folder (``linked``: the names linked for this
    catch-up) holds a write-ahead log above ``newest_read`` (the newest one the instance read: the
    writer sealed it since) while the instance's memtables (of ``column_families``) hold entries.

    Raises:
        Exception: rocksdict's, when RocksDB cannot answer (callers map it).
    """
    return newest_log(linked) > newest_read and memtable_entries(column_families) > 0


class SecondaryReader(StoreInstance):
    """A store's reader side (module docstring): opening as a RocksDB secondary instance on a folder
    of links, catching up with the writer, and refusing to serve once it cannot be sure what it holds."""

    _scratch: str | None = None  # the reader's scratch directory: the folder of links and the secondary folders
    _secondary_dir: Path | None = None  # the instance's secondary folder (its info log)
    _identity: str | None = None  # the RocksDB identity of the store it opened (a store created in its place has another one)
    _newest_log_read = -1  # the newest write-ahead log its instance read (catch_up_may_go_stale)
    #: How often a catch-up opened a new RocksDB secondary instance instead of catching the one it
    #: had up in place (module docstring).
    secondary_reopens = 0
    _reader_options: tuple[Options, dict[str, Options]]  # a reader opens new secondary instances with them
    # instances replaced by a reopen, with their secondary folders: closed at the next catch-up
    _retired: list[tuple[Rdict, Path]]

    def _drop_db(self) -> None:
        """Close the instance and the ones a catch-up replaced (and remove their secondary folders);
        keep the scratch folder (an open that missed files opens again on it)."""
        try:
            self._close_retired()
        finally:
            super()._drop_db()

    def _open_reader(self, rocks_options: Options, cf_options: dict[str, Options]) -> None:
        """Open the store as a secondary instance on a scratch folder of links to its files.

        A secondary instance (not RocksDB's read-only one) can follow the writer with
        ``TryCatchUpWithPrimary``; it keeps every file open (``max_open_files=-1``) so the writer's
        compactions cannot delete a file under it.

        Raises:
            StoreReplacedError: the store was replaced while it was opened, on every attempt.
            StoreError: as :meth:`_as_reader`; the store's own errors (``_open``).
        """
        self._retired = []
        self._scratch = tempfile.mkdtemp(prefix="materializer-reader-")
        self._reader_path = open_path = Path(self._scratch) / "db"
        open_path.mkdir()
        rocks_options.set_max_open_files(-1)
        self._secondary_dir = Path(self._scratch) / "secondary"
        access = {"access_type": AccessType.secondary(str(self._secondary_dir))}
        self._reader_options = (rocks_options, cf_options)

        def open_reader(linked: set[str], _attempt: int) -> None:
            try:
                if self._db is not None:  # an open that missed files: opened again
                    self._drop_db()
                identity = self._read_identity()
                self._open(open_path, rocks_options, cf_options, access, existed=True)
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

    def catch_up(self) -> dict[int, int]:
        """A read-only store: move to the writer's latest applied batch; return the new ``offsets()``.

        Cost: reads the writer's new MANIFEST and WAL entries (milliseconds); values read after it
        reflect exactly the returned next offsets (partition -> next offset to apply). Where RocksDB's
        catch-up in place could leave memtable entries older than an SST file it adds (the writer
        started a new write-ahead log to flush since, while this reader's memtables hold entries:
        module docstring), or the writer added SST files while it ran,
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
                families = (db, self._data, self._metadata) + (() if self._tombstones is None else (self._tombstones,))
                if attempt > 1 or catch_up_may_go_stale(families, self._newest_log_read, linked):
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
        old = (self._db, self._data, self._metadata, self._data_handle, self._metadata_handle, self._offsets,
               self._tombstones, self._tombstones_handle)
        try:
            self._open(self._reader_path, rocks_options, cf_options, access, existed=True)
        except BaseException:
            opened = self._db
            (self._db, self._data, self._metadata, self._data_handle, self._metadata_handle, self._offsets,
             self._tombstones, self._tombstones_handle) = old
            if opened is not None and opened is not old[0]:
                with contextlib.suppress(Exception):
                    opened.close()
            shutil.rmtree(folder, ignore_errors=True)
            raise
        if old[0] is not None and self._secondary_dir is not None:
            self._retired.append((old[0], self._secondary_dir))
        self._secondary_dir = folder
        self._newest_log_read = newest_log(linked)

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

    def _remove_scratch(self) -> None:
        """Remove a reader's scratch directory (links, secondary folders); once the instances are closed."""
        if self._scratch is not None:
            shutil.rmtree(self._scratch, ignore_errors=True)
            self._scratch = None

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
        longer be served (a mix of two states). ``close`` still works."""
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
