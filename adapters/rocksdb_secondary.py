"""When a RocksDB secondary instance may not be caught up in place: it would serve stale values.

A reader beside the writer (:class:`~materializer.adapters.rocksdb_store.StateStore` with
``read_only=True``) is a RocksDB secondary instance: ``TryCatchUpWithPrimary`` replays the
writer's new MANIFEST records (SST files added and removed) and tails its write-ahead logs into the
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

from collections.abc import Iterable

from rocksdict import Rdict

__all__ = ["catch_up_may_go_stale", "memtable_entries", "newest_log"]

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
