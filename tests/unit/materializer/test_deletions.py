"""Why a key is absent (materializer.deletions): the store's tombstone records, written with the
delete on every write path, and their confirmation against a real local log (a ``Log`` in a temp
folder), including logs that no longer show the tombstone or show something else at its offset.
The broker-backed tests are tests/integration/test_deleted_keys.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from rocksdict import Options, Rdict

from materializer.adapters.rocksdb_store import FORMAT_VERSION, FORMAT_VERSION_KEY, StateStore, StateStoreOptions
from materializer.adapters.rocksdb_store.layout import INT32, Tombstone
from materializer.deletions import DataDirLogs, Deletion, LiveLogs, confirmed, deletion_of, expire_tombstones
from materializer.storage import _native
from materializer.storage.log import Log
from materializer.storage.record_batch import Record
from materializer.storage.record_scan import records_section
from materializer.storage.record_batch import RecordBatch
from materializer.storage.record_batch_builder import RecordBatchBuilder
from materializer.view import MaterializedView

TOPIC = "t"
#: offset 0 k=v, 1 other=x, 2 k tombstone, 3 never-again=y, 4 gone=z, 5 gone tombstone
RECORDS = [Record(0, 1_000, b"k", b"v"), Record(1, 1_001, b"other", b"x"), Record(2, 1_002, b"k", None),
           Record(3, 1_003, b"never-again", b"y"), Record(4, 1_004, b"gone", b"z"), Record(5, 1_005, b"gone", None)]


def _log(data_dir: Path, records: list[Record], partition: int = 0) -> Log:
    log = Log.open(data_dir / f"{TOPIC}-{partition}")
    log.append_records(records)
    return log


@pytest.fixture
def materialized(tmp_path: Path):
    """A partition's local log holding RECORDS and a store that applied them (``apply``)."""
    log = _log(tmp_path, RECORDS)
    with StateStore(tmp_path / "state" / TOPIC) as store:
        store.apply({0: RECORDS}, {0: len(RECORDS)})
        yield tmp_path, log, store
    log.close()


def test_a_tombstone_is_recorded_with_its_delete_and_confirmed_by_the_log(materialized) -> None:
    data_dir, log, store = materialized
    assert store.get(b"k") is None and store.tombstone(b"k", 0) == Tombstone(0, 2, 1_002)
    for source in (LiveLogs(lambda: {0: log}), DataDirLogs(data_dir, TOPIC)):
        assert deletion_of(store, b"k", [0], source) == Deletion(0, 2, 1_002)
        assert deletion_of(store, b"nope", [0], source) is None  # never written: plain not found
    # a put leaves the record, but a live key is never "deleted"
    store.apply({0: [Record(6, 1_006, b"k", b"again")]}, {0: 7})
    assert store.tombstone(b"k", 0) == Tombstone(0, 2, 1_002)
    view = MaterializedView(store, tombstone_log=LiveLogs(lambda: {0: log}))
    assert view.get(b"k") == b"again" and view.deletion(b"k") is None
    assert view.deletion(b"gone") == Deletion(0, 5, 1_005)
    assert MaterializedView(store).deletion(b"gone") is None  # no local log: plain not found


def test_not_confirmed_when_the_log_shows_something_else_or_nothing(materialized, tmp_path: Path) -> None:
    data_dir, log, store = materialized
    tombstone = store.tombstone(b"k", 0)
    assert tombstone is not None and confirmed(LiveLogs(lambda: {0: log}), store, b"k", tombstone)
    # a log whose offset 2 is a put of k, or a tombstone of another key
    for at_two in (Record(2, 1_002, b"k", b"live"), Record(2, 1_002, b"other", None)):
        other = _log(tmp_path / f"other-{at_two.key!r}-{at_two.value!r}", [*RECORDS[:2], at_two, *RECORDS[3:]])
        assert not confirmed(LiveLogs(lambda other=other: {0: other}), store, b"k", tombstone)
        other.close()
    # the cleaner removed the record at offset 2 (its batch keeps the offsets around it)
    cleaned = _log(tmp_path / "cleaned", [r for r in RECORDS if r.offset != 2])
    assert not confirmed(LiveLogs(lambda: {0: cleaned}), store, b"k", tombstone)
    cleaned.close()
    # no log of the partition, or an empty folder
    assert not confirmed(LiveLogs(dict), store, b"k", tombstone)
    assert not confirmed(DataDirLogs(tmp_path / "nowhere", TOPIC), store, b"k", tombstone)
    # the log start offset moved past it (retention, DeleteRecords)
    log.maybe_increment_log_start_offset(3)
    assert not confirmed(LiveLogs(lambda: {0: log}), store, b"k", tombstone)
    # a record at or past the store's next offset is not the store's to confirm
    assert not confirmed(LiveLogs(lambda: {0: log}), store, b"gone", Tombstone(0, 6, 0))


def test_a_reader_in_another_process_reads_the_batch_through_the_offset_index(tmp_path: Path) -> None:
    """Many batches: the segment's .index points near the offset; an index of preallocated zeros
    (an active segment) or one that points into the middle of a batch never confirms wrongly."""
    records = [Record(i, 2_000 + i, b"key-%04d" % (i % 300), b"v" * 100 if i % 7 else None) for i in range(3_000)]
    log = Log.open(tmp_path / f"{TOPIC}-0")
    for record in records:  # one batch per record: many index entries
        log.append_records([record])
    log.roll()
    log.flush()
    latest = {r.key: r for r in records}
    deleted = [r for r in latest.values() if r.value is None]
    with StateStore(tmp_path / "state" / TOPIC) as store:
        store.apply({0: records}, {0: len(records)})
        source = DataDirLogs(tmp_path, TOPIC)
        for record in deleted:
            assert deletion_of(store, record.key, [0], source) == Deletion(0, record.offset, record.timestamp)
        index = next((tmp_path / f"{TOPIC}-0").glob("00000000000000000000.index"))
        assert index.stat().st_size > 64
        raw = bytearray(index.read_bytes())
        raw[8:16] = INT32.pack(5) + INT32.pack(7)  # a second entry pointing mid-batch
        index.write_bytes(bytes(raw))
        assert all(deletion_of(store, r.key, [0], source) in (None, Deletion(0, r.offset, r.timestamp))
                   for r in deleted)
    log.close()


def test_expiry_forgets_only_what_the_log_no_longer_shows(materialized) -> None:
    data_dir, log, store = materialized
    assert {k for k, _ in store.tombstone_records(0)} == {b"k", b"gone"}
    assert expire_tombstones(store, 0, LiveLogs(lambda: {0: log}), below=6) == 0  # both still in the log
    log.maybe_increment_log_start_offset(3)  # k's tombstone (offset 2) below it
    assert expire_tombstones(store, 0, LiveLogs(lambda: {0: log}), below=6) == 1
    assert store.tombstone(b"k", 0) is None and store.tombstone(b"gone", 0) is not None
    # drop_below forgets records below the new log start offset with the entries; drop_partition all
    store.drop_below(0, 6)
    assert store.tombstone_count() == 0
    store.apply({0: [Record(6, 1, b"x", None)]}, {0: 7})
    assert store.tombstone_count() == 1
    store.drop_partition(0)
    assert store.tombstone_count() == 0


def _entries(records: list[tuple[int, int, bytes, bytes | None]]) -> _native.StoreEntries:
    """StoreEntries of ``(partition, offset, key, value or None)``, timestamps 10 * offset."""
    entries = _native.StoreEntries()
    for partition, offset, key, value in records:
        builder = RecordBatchBuilder(offset)
        builder.append(offset, 10 * offset, key, value)
        batch = RecordBatch(builder.build())
        header = batch.header
        entries.add_records(records_section(batch), header.records_count, header.base_offset,
                            header.base_timestamp, None, partition, 0, 1 << 40)
    return entries


@pytest.mark.parametrize("bulk_min_entries", [1, 1_000_000], ids=["sst-files", "write-batch"])
def test_the_bulk_load_records_the_latest_tombstone_of_each_key(tmp_path: Path, bulk_min_entries: int) -> None:
    """A cold start's path (``apply_store_entries``): native SST files or one WriteBatch."""
    records = [(0, 0, b"a", b"1"), (0, 1, b"a", None), (0, 2, b"b", None), (1, 3, b"a", None), (0, 4, b"b", b"2"),
               (0, 5, b"c", b"3"), (0, 6, b"a", None)]
    with StateStore(tmp_path / "s", StateStoreOptions(compression="lz4")) as store:
        store.apply_store_entries(_entries(records), {0: 7, 1: 7}, bulk_min_entries=bulk_min_entries)
        assert store.get(b"b", 0) is not None and store.get(b"a", 0) is None
        # b's tombstone was replaced by a later put in the same load: nothing to record
        assert dict(store.tombstone_records(0)) == {b"a": Tombstone(0, 6, 60)}
        assert dict(store.tombstone_records(1)) == {b"a": Tombstone(1, 3, 30)}
        keys, at = _entries(records).tombstones()
        assert keys == [INT32.pack(0) + b"a", INT32.pack(1) + b"a"] and len(at) == 2


def test_a_store_written_before_tombstone_records_existed(tmp_path: Path) -> None:
    """No format bump: a reader of an old store (no tombstones column family) says plain "not
    found"; its writer adds the column family on open."""
    path = tmp_path / "old"
    options = Options(raw_mode=True)
    options.create_if_missing(True)
    options.create_missing_column_families(True)
    old = Rdict(str(path), options, column_families={"data": Options(raw_mode=True),
                                                     "metadata": Options(raw_mode=True)})
    old.get_column_family("metadata").put(FORMAT_VERSION_KEY, INT32.pack(FORMAT_VERSION))
    old.close()
    with StateStore(path, read_only=True) as reader:
        assert reader.tombstone(b"k", 0) is None and reader.tombstone_count() == 0
    with StateStore(path) as writer:
        writer.apply({0: [Record(0, 5, b"k", None)]}, {0: 1})
        assert writer.tombstone(b"k", 0) == Tombstone(0, 0, 5)
    with StateStore(path, read_only=True) as reader:
        assert reader.tombstone(b"k", 0) == Tombstone(0, 0, 5)
