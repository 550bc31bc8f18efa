"""StateStore: atomic values + next offsets, no backwards offsets, tombstones, error mapping."""

from __future__ import annotations

import glob
import os
import pickle
import struct
import subprocess
import sys
import time

import pytest

from materializer.adapters.errors import StoreCorruptedError, StoreError, StoreLockedError
from materializer.adapters.rocksdb_store import (
    StateStore,
    StateStoreOptions,
    StoreMemory,
    StoredValue,
    encode_store_key,
    encode_stored_value,
    map_rocksdb_error,
)
from materializer.adapters.rocksdb_store import bulk
from materializer.storage import _native
from materializer.storage.record_batch import Record, RecordBatch
from materializer.storage.record_batch_builder import RecordBatchBuilder
from materializer.storage.record_scan import records_section


@pytest.fixture
def store_factory(tmp_path):
    opened: list[StateStore] = []

    def factory(name: str = "store", options: StateStoreOptions | None = None) -> StateStore:
        store = StateStore(tmp_path / name, options)
        opened.append(store)
        return store

    yield factory
    for store in opened:
        store.close()


class TestStateStore:
    def test_apply_puts_and_offsets(self, store_factory):
        store = store_factory()
        applied = store.apply({0: [Record(0, 10, b"a", b"1"), Record(1, 11, b"b", b"2")],
                               2: [Record(5, 12, b"c", b"")]}, {0: 2, 2: 6})
        assert applied == 3
        assert store.get(b"a") == StoredValue(0, 0, 10, b"1")
        assert store.get(b"c") == StoredValue(2, 5, 12, b"")  # empty value is a value, not a tombstone
        assert store.offsets() == {0: 2, 2: 6}
        assert [k for k, _ in store.items()] == [b"a", b"b", b"c"]
        assert store.count() == 3

    def test_tombstone_deletes_and_last_write_wins(self, store_factory):
        store = store_factory()
        store.apply({0: [Record(0, 0, b"a", b"1"), Record(1, 0, b"a", b"2"), Record(2, 0, b"b", b"x"),
                         Record(3, 0, b"b", None)]}, {0: 4})
        assert store.get(b"a") == StoredValue(0, 1, 0, b"2")
        assert store.get(b"b") is None
        store.apply({0: [Record(4, 0, b"a", None), Record(5, 0, b"a", b"3")]}, {0: 6})
        assert store.get(b"a") == StoredValue(0, 5, 0, b"3")

    def test_refuses_backwards_offset_and_writes_nothing(self, store_factory):
        store = store_factory()
        store.apply({0: [Record(9, 0, b"a", b"1")]}, {0: 10})
        with pytest.raises(StoreError, match="backwards from 10 to 5"):
            store.apply({0: [Record(4, 0, b"a", b"old")], 1: [Record(0, 0, b"z", b"z")]}, {0: 5, 1: 1})
        assert store.get(b"a") == StoredValue(0, 9, 0, b"1")
        assert store.get(b"z") is None
        assert store.offsets() == {0: 10}
        store.apply({}, {0: 10})  # same offset is allowed

    def test_offsets_and_values_persist_together(self, store_factory, tmp_path):
        store = store_factory("s")
        store.apply({1: [Record(0, 0, b"k", b"v")]}, {1: 7})
        store.close()
        reopened = store_factory("s")
        assert reopened.offsets() == {1: 7}
        assert reopened.get(b"k") == StoredValue(1, 0, 0, b"v")

    def test_argument_errors(self, store_factory):
        store = store_factory()
        with pytest.raises(ValueError, match="null key"):
            store.apply({0: [Record(0, 0, None, b"v")]}, {0: 1})
        with pytest.raises(ValueError, match="without a next offset"):
            store.apply({0: [Record(0, 0, b"k", b"v")]}, {})
        with pytest.raises(ValueError, match="not above"):
            store.apply({0: [Record(3, 0, b"k", b"v")]}, {0: 3})
        assert store.offsets() == {}

    def test_value_encoding_is_big_endian_prefix(self, store_factory):
        store = store_factory()
        store.apply({3: [Record(2**40, 1_700_000_000_123, b"k", b"payload")]}, {3: 2**40 + 1})
        # Written out by hand from the layout in the module docstring, not by the code under test.
        raw = store._data.get(b"\x00\x00\x00\x03k")
        assert raw == struct.pack(">qq", 2**40, 1_700_000_000_123) + b"payload"
        assert store._data.get(b"k") is None

    def test_same_key_in_two_partitions_is_two_entries(self, store_factory):
        # The bug of issue 7: dup=B -> p0, dup=A -> p1, dup=C -> p0 kept only p1's older A.
        store = store_factory()
        store.apply({0: [Record(0, 100, b"dup", b"B")]}, {0: 1})
        store.apply({1: [Record(0, 200, b"dup", b"A")]}, {1: 1})
        store.apply({0: [Record(1, 300, b"dup", b"C")]}, {0: 2})
        assert store.get(b"dup", partition=0) == StoredValue(0, 1, 300, b"C")
        assert store.get(b"dup", partition=1) == StoredValue(1, 0, 200, b"A")
        assert store.get_all(b"dup") == {0: StoredValue(0, 1, 300, b"C"), 1: StoredValue(1, 0, 200, b"A")}
        assert store.get(b"dup") == StoredValue(0, 1, 300, b"C")  # latest timestamp wins
        assert [(v.partition, k) for k, v in store.items()] == [(0, b"dup"), (1, b"dup")]
        assert store.count() == 2 and store.count(partition=1) == 1
        # A tombstone in partition 1 deletes partition 1's entry only.
        store.apply({1: [Record(1, 400, b"dup", None)]}, {1: 2})
        assert store.get(b"dup", partition=1) is None
        assert store.get(b"dup") == StoredValue(0, 1, 300, b"C")
        assert store.get_all(b"dup") == {0: StoredValue(0, 1, 300, b"C")}

    def test_equal_timestamps_lower_partition_wins(self, store_factory):
        store = store_factory()
        store.apply({2: [Record(7, 50, b"k", b"two")], 1: [Record(3, 50, b"k", b"one")]}, {1: 4, 2: 8})
        assert store.get(b"k") == StoredValue(1, 3, 50, b"one")
        assert store.get(b"k", partition=5) is None

    def test_items_of_one_partition_stop_at_its_last_key(self, store_factory):
        store = store_factory()
        store.apply({0: [Record(0, 0, b"\xff\xff", b"x")], 1: [Record(0, 0, b"", b"empty key"), Record(1, 0, b"a", b"y")],
                     256: [Record(0, 0, b"b", b"z")]}, {0: 1, 1: 2, 256: 1})
        assert [(k, v.value) for k, v in store.items(partition=1)] == [(b"", b"empty key"), (b"a", b"y")]
        assert [k for k, _ in store.items(partition=256)] == [b"b"]
        assert list(store.items(partition=3)) == []
        assert store.partitions() == [0, 1, 256]

    def test_version_1_store_is_refused_as_damaged(self, store_factory, tmp_path):
        from materializer.adapters.rocksdb_store import FORMAT_VERSION_KEY

        store = store_factory("v1")
        store._metadata[FORMAT_VERSION_KEY] = struct.pack(">i", 1)
        store.close()
        with pytest.raises(StoreCorruptedError, match="format version 1; this materializer reads version 2"):
            StateStore(tmp_path / "v1")

    def test_second_open_is_locked(self, store_factory):
        store_factory("s")
        with pytest.raises(StoreLockedError, match="locked"):
            store_factory("s")

    def test_closed_store_raises(self, store_factory):
        store = store_factory()
        store.close()
        store.close()
        with pytest.raises(StoreError, match="closed"):
            store.get(b"k")

    def test_corrupted_manifest(self, store_factory, tmp_path):
        store = store_factory("s")
        store.apply({0: [Record(0, 0, b"k", b"v")]}, {0: 1})
        store.close()
        for manifest in glob.glob(str(tmp_path / "s" / "MANIFEST*")):
            with open(manifest, "r+b") as f:
                f.truncate(10)
        with pytest.raises(StoreCorruptedError, match="damaged"):
            store_factory("s")

    def test_missing_sst_is_corruption(self, store_factory, tmp_path):
        store = store_factory("s")
        store.apply({0: [Record(i, 0, b"k%d" % i, b"v" * 100) for i in range(100)]}, {0: 100})
        store._db.flush()
        store.close()
        ssts = glob.glob(str(tmp_path / "s" / "*.sst"))
        assert ssts
        for sst in ssts:
            os.remove(sst)
        with pytest.raises(StoreCorruptedError):
            store_factory("s")

    def test_foreign_rocksdb_is_rejected(self, tmp_path):
        from rocksdict import Options, Rdict

        options = Options(raw_mode=True)
        db = Rdict(str(tmp_path / "foreign"), options)
        db[b"x"] = b"y"
        db.close()
        del db
        with pytest.raises(StoreCorruptedError):
            StateStore(tmp_path / "foreign")

    def test_options_convert_once(self):
        assert StateStoreOptions(compression="zstd").to_options() is not None
        with pytest.raises(ValueError, match="unknown RocksDB compression"):
            StateStoreOptions(compression="brotli").to_options()  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("message", "error_type"),
    [
        ("IO error: While lock file: /d/LOCK: Resource temporarily unavailable", StoreLockedError),
        ("IO error: lock hold by current process, acquire time 1 acquiring thread 2: /d/LOCK: No locks available",
         StoreLockedError),
        ("Corruption: no log_file_number entry in MANIFEST", StoreCorruptedError),
        ("Corruption: IO error: No such file or directory: While open a file for random read: /d/000017.sst",
         StoreCorruptedError),
        ("Invalid argument: Column families not opened: extra", StoreCorruptedError),
        ("IO error: No space left on device", StoreError),
    ],
)
def test_map_rocksdb_error(message, error_type):
    error = map_rocksdb_error(Exception(message), "/d")
    assert type(error) is error_type
    assert "/d" in str(error) and message in str(error)


def _drop_format_version(store: StateStore) -> None:
    from materializer.adapters.rocksdb_store import FORMAT_VERSION_KEY

    del store._metadata[FORMAT_VERSION_KEY]


def test_store_whose_creation_was_cut_short_is_finished_on_open(tmp_path):
    # A crash between creating the RocksDB and writing its format version leaves an empty DB.
    path = tmp_path / "store"
    store = StateStore(path)
    _drop_format_version(store)
    store.close()
    with StateStore(path) as reopened:
        assert reopened.offsets() == {} and reopened.count() == 0
    with StateStore(path) as again:  # the version is written now
        assert again.count() == 0


def test_rocksdb_with_data_but_no_format_version_is_not_ours(tmp_path):
    path = tmp_path / "store"
    store = StateStore(path)
    store.apply({0: [Record(0, 1, b"k", b"v")]}, {0: 1})
    _drop_format_version(store)
    store.close()
    with pytest.raises(StoreCorruptedError, match="without a b'format_version' entry"):
        StateStore(path)


def test_get_many_and_scans_in_key_order(tmp_path):
    with StateStore(tmp_path / "s") as store:
        store.apply({0: [Record(0, 10, b"user:2", b"a"), Record(1, 10, b"user:1", b"b"), Record(2, 10, b"zeta", b"z"),
                         Record(3, 10, b"user:\xff", b"ff")],
                     1: [Record(0, 20, b"user:1", b"c"), Record(1, 10, b"user:3", b"d"), Record(2, 10, b"user", b"e")]},
                    {0: 4, 1: 3})
        many = store.get_many([b"user:1", b"user:3", b"nope"])
        assert {k: v.value for k, v in many.items()} == {b"user:1": b"c", b"user:3": b"d"}  # user:1: latest timestamp
        assert {k: v.value for k, v in store.get_many([b"user:1"], partition=0).items()} == {b"user:1": b"b"}
        assert [(k, v.partition) for k, v in store.scan(prefix=b"user:")] == [
            (b"user:1", 0), (b"user:1", 1), (b"user:2", 0), (b"user:3", 1), (b"user:\xff", 0)]
        assert [k for k, _ in store.scan(b"user:2", b"zeta")] == [b"user:2", b"user:3", b"user:\xff"]
        assert [k for k, _ in store.scan(partition=1)] == [b"user", b"user:1", b"user:3"]
        assert [k for k, _ in store.scan(prefix=b"\xff")] == []


def test_drop_partition_leaves_other_partitions(tmp_path):
    with StateStore(tmp_path / "store") as store:
        store.apply({0: [Record(0, 1, b"k", b"p0"), Record(1, 1, b"only-0", b"x")],
                     1: [Record(0, 2, b"k", b"p1"), Record(1, 2, b"\xff\xff", b"y")],
                     2: [Record(0, 3, b"k", b"p2")]}, {0: 2, 1: 2, 2: 1})
        assert store.drop_partition(1) == 2
        assert store.offsets() == {0: 2, 2: 1}
        assert [(k, v.partition, v.value) for k, v in store.items()] == [
            (b"k", 0, b"p0"), (b"only-0", 0, b"x"), (b"k", 2, b"p2")]
        with pytest.raises(ValueError, match="outside"):
            store.drop_partition(-1)
    with StateStore(tmp_path / "store") as store:  # durable: the offset entry is gone too
        assert store.offsets() == {0: 2, 2: 1} and store.count(1) == 0
        store.apply({1: [Record(0, 5, b"k", b"again")]}, {1: 1})  # a dropped partition starts over
        assert store.get(b"k", 1).value == b"again"



def _entries_of(puts: int) -> _native.StoreEntries:
    """StoreEntries of ``puts`` records of partition 0 (offsets 0.., keys k000000..) from one batch."""
    builder = RecordBatchBuilder(0)
    for offset in range(puts):
        builder.append(offset, 0, b"k%06d" % offset, b"v")
    batch = RecordBatch(builder.build())
    entries = _native.StoreEntries()
    entries.add_records(records_section(batch), puts, 0, 0, None, 0, 0, puts)
    return entries


#: Every public writer of the store, as (name, call on a store holding partition 0 at next offset 100
#: with the next offsets it asks for). apply_store_entries twice: its small path (apply_entries) and
#: its native SST path.
WRITERS = {
    "apply": lambda s, o: s.apply({0: [Record(o - 1, 0, b"k", b"v")]} if o else {}, {0: o} if o else {}),
    "apply_entries": lambda s, o: s.apply_entries([encode_store_key(0, b"k")], [encode_stored_value(0, 0, b"v")],
                                                  [], {0: o} if o else {}),
    "apply_entries_sst": lambda s, o: s.apply_entries([encode_store_key(0, b"k")], [encode_stored_value(0, 0, b"v")],
                                                      [], {0: o} if o else {}, bulk_min_entries=1),
    "apply_store_entries": lambda s, o: s.apply_store_entries(_entries_of(3), {0: o} if o else {}),
    "apply_store_entries_sst": lambda s, o: s.apply_store_entries(_entries_of(3), {0: o} if o else {},
                                                                  bulk_min_entries=1),
    "drop_partition": lambda s, o: s.drop_partition(0),
    "drop_below": lambda s, o: s.drop_below(0, 200),
}


@pytest.mark.parametrize("writer", sorted(WRITERS))
def test_every_writer_goes_through_the_one_write_path(tmp_path, monkeypatch, writer):
    """One place builds the WriteBatch with the next offsets and checks the store is writable and
    that no offset moves backwards (StoreWrites._writing): each writer passes through it once, and
    a read-only store or a backwards offset is refused by every writer before anything is written."""
    from materializer.adapters.rocksdb_store.writes import StoreWrites

    write = WRITERS[writer]
    path = tmp_path / "store"
    with StateStore(path) as store:
        store.apply({0: [Record(99, 0, b"k", b"before")]}, {0: 100})
    passes: list[str] = []
    through = StoreWrites._writing

    def counted(self, *args, **kwargs):
        passes.append(writer)
        return through(self, *args, **kwargs)

    monkeypatch.setattr(StoreWrites, "_writing", counted)
    with StateStore(path, read_only=True) as reader, pytest.raises(StoreError, match="read-only"):
        write(reader, 101)
    with StateStore(path) as store:
        if writer not in ("drop_partition", "drop_below"):  # they take no next offset from the caller
            with pytest.raises(StoreError, match="backwards from 100 to 50"):
                write(store, 50)
            assert store.get(b"k", 0).value == b"before" and store.offsets() == {0: 100}
            assert list(path.glob(".ingest-*")) == []
        passes.clear()
        write(store, 101 if writer.startswith("apply") else 0)
        assert passes == [writer]
    store.close()
    with pytest.raises(StoreError, match="closed"):
        write(store, 101)

class TestBulkLoading:
    """``set_bulk_loading``: no background compaction while a load ingests SST files, and again after."""

    @staticmethod
    def _ingest_overlapping(store: StateStore, files: int, first_offset: int = 0) -> None:
        """``files`` ingests of the same 100 keys: each an SST file overlapping the others, so all but
        the first of a new store (ingested at the bottom level, where nothing overlaps it) go to L0."""
        for n in range(files):
            offset = first_offset + n * 100
            keys = [encode_store_key(0, b"k%03d" % i) for i in range(100)]
            values = [encode_stored_value(offset + i, 0, b"v%d" % n) for i in range(100)]
            store.apply_entries(keys, values, [], {0: offset + 100}, bulk_min_entries=1)

    @staticmethod
    def _level0_files(store: StateStore) -> int:
        return store._data.property_int_value("rocksdb.num-files-at-level0")

    def test_files_stay_in_level0_while_loading_and_are_compacted_after(self, store_factory):
        store = store_factory()
        store.set_bulk_loading(True)
        self._ingest_overlapping(store, 8)  # past RocksDB's compaction trigger of 4 L0 files
        time.sleep(0.5)  # a background compaction, were one allowed, would have started
        assert self._level0_files(store) == 7 and store.bulk_loading
        assert store.get(b"k007", 0).value == b"v7" and store.offsets() == {0: 800}
        store.set_bulk_loading(False)
        deadline = time.monotonic() + 30
        while self._level0_files(store) >= 4 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert self._level0_files(store) < 4  # RocksDB's own background compaction ran
        assert store.get(b"k007", 0).value == b"v7" and store.count() == 100

    def test_a_load_piling_up_level0_files_folds_them(self, store_factory, monkeypatch):
        monkeypatch.setattr(bulk, "BULK_LOAD_MAX_L0_FILES", 5)
        store = store_factory()
        store.set_bulk_loading(True)
        self._ingest_overlapping(store, 5)
        assert self._level0_files(store) == 4
        self._ingest_overlapping(store, 1, first_offset=500)  # the 5th L0 file: one manual compaction
        assert self._level0_files(store) == 0
        assert store.get(b"k042", 0).value == b"v0" and store.offsets() == {0: 600}

    def test_a_new_store_compacts_in_the_background(self, store_factory, tmp_path):
        store = store_factory("a")
        store.set_bulk_loading(True)
        store.close()
        reopened = store_factory("a")  # the switch is not stored
        assert not reopened.bulk_loading
        self._ingest_overlapping(reopened, 8)
        deadline = time.monotonic() + 30
        while self._level0_files(reopened) >= 4 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert self._level0_files(reopened) < 4

    def test_a_load_of_two_files_leaves_rocksdbs_options_alone(self, store_factory):
        """Changing RocksDB's options writes an OPTIONS file (a few ms, a tenth of a 1M-record
        restore): a load that ingests at most two files never changes them."""
        store = store_factory()
        calls: list[dict] = []

        class Recording:
            def __init__(self, data):
                self._inner = data

            def set_options(self, options):
                calls.append(options)
                self._inner.set_options(options)

            def __getattr__(self, name):
                return getattr(self._inner, name)

        store._data = Recording(store._data)
        store.set_bulk_loading(True)
        self._ingest_overlapping(store, 2)
        store.set_bulk_loading(False)
        assert calls == []
        store.set_bulk_loading(True)
        self._ingest_overlapping(store, 3, first_offset=200)
        store.set_bulk_loading(False)
        assert [c["disable_auto_compactions"] for c in calls] == ["true", "false"]


def _writer_killed_after_one_apply(path, offset: int = 0, value: bytes = b"v") -> None:
    """A writer process that applies record ``offset`` of key ``k`` to partition 0 and dies without
    closing: the record is only in its write-ahead log, which the next writer's open replays,
    flushes and deletes."""
    script = ("import os, sys\n"
              "from materializer.adapters.rocksdb_store import StateStore\n"
              "from materializer.storage.record_batch import Record\n"
              "store = StateStore(sys.argv[1])\n"
              f"store.apply({{0: [Record({offset}, 0, b'k', {value!r})]}}, {{0: {offset + 1}}})\n"
              "os._exit(0)\n")
    subprocess.run([sys.executable, "-c", script, str(path)], check=True, timeout=60)


def _restart_writer_after_first_link(monkeypatch, path) -> list[set[str]]:
    """From now on, a reader's first linking of the store's files is followed by a writer's restart
    (open and close) before the reader uses the links; returns the list the names linked then go to."""
    link = StateStore._link_store_files
    restarts: list[set[str]] = []

    def link_then_writer_restarts(self):
        names = link(self)
        if not restarts:
            restarts.append(names)
            StateStore(path).close()
        return names

    monkeypatch.setattr(StateStore, "_link_store_files", link_then_writer_restarts)
    return restarts


def test_reader_opening_while_the_writer_restarts_links_again(tmp_path, monkeypatch):
    # The reader links the store's files, then a restarting writer replays its write-ahead log into
    # a new SST file, switches to a new MANIFEST and deletes the old log before the reader opens:
    # its links are a mix of two states (RocksDB: "the primary may have switched to a new
    # MANIFEST"). It must link again and open the store the writer left, not fail.
    path = tmp_path / "store"
    _writer_killed_after_one_apply(path)
    restarts = _restart_writer_after_first_link(monkeypatch, path)
    with StateStore(path, read_only=True) as reader:
        assert reader.offsets() == {0: 1} and reader.get(b"k") == StoredValue(0, 0, 0, b"v")
    assert restarts and restarts[0] != set(os.listdir(path)) - {"LOCK", "LOG", "rocksdict-config.json"}


def test_reader_catching_up_while_the_writer_restarts_links_again(tmp_path, monkeypatch):
    path = tmp_path / "store"
    with StateStore(path) as writer:
        writer.apply({0: [Record(0, 0, b"k", b"v1")]}, {0: 1})
    reader = StateStore(path, read_only=True)
    try:
        _writer_killed_after_one_apply(path, offset=1, value=b"v2")
        restarts = _restart_writer_after_first_link(monkeypatch, path)
        assert reader.catch_up() == {0: 2}
        assert reader.get(b"k") == StoredValue(0, 1, 0, b"v2")
        assert restarts
    finally:
        reader.close()


def test_reader_failure_on_a_store_that_did_not_change_is_raised_at_once(tmp_path, monkeypatch):
    # An empty RocksDB without the format version is a store still being created: the reader says
    # so after one attempt (nothing changed under it), it does not spin.
    path = tmp_path / "store"
    store = StateStore(path)
    _drop_format_version(store)
    store.close()
    link = StateStore._link_store_files
    attempts = []

    def counted(self):
        attempts.append(1)
        return link(self)

    monkeypatch.setattr(StateStore, "_link_store_files", counted)
    with pytest.raises(StoreError, match="still being created"):
        StateStore(path, read_only=True)
    assert len(attempts) == 1


def _write_updates(store: StateStore, partition: int, records: int, value_bytes: int) -> None:
    """``records`` puts of distinct keys with random (incompressible) values, 1,000 per apply."""
    for first in range(0, records, 1000):
        batch = [Record(offset, 0, b"key-%08d" % offset, os.urandom(value_bytes))
                 for offset in range(first, min(records, first + 1000))]
        store.apply({partition: batch}, {partition: batch[-1].offset + 1})


def test_stores_sharing_a_memory_budget_flush_their_memtables_within_it(store_factory, tmp_path):
    """Two stores written with 24 MB each. Under a budget too large to act (it only counts), their
    memtables hold it all and no SST file is written (RocksDB's 64 MiB write buffers); sharing one
    8 MiB StoreMemory (memtables up to 4 MiB), memtables are flushed to SST files as the writes go
    and hold well under what they held alone (a soft bound: flushes lag the writes on a busy
    machine), and every value reads back, also after a reopen."""
    counting, budget = StoreMemory(1 << 30), StoreMemory(8 << 20)
    alone_bytes = 0
    for name, memory in (("alone", counting), ("shared", budget)):
        stores = [store_factory(f"{name}-{n}", StateStoreOptions(memory=memory)) for n in range(2)]
        for n, store in enumerate(stores):
            _write_updates(store, n, 24_000, 1000)

        def sst_files(name: str = name) -> list[list[str]]:
            return [glob.glob(str(tmp_path / f"{name}-{n}" / "*.sst")) for n in range(2)]

        if name == "alone":
            assert sst_files() == [[], []]
            alone_bytes = counting.memtable_bytes
            assert alone_bytes > 40 << 20  # the 48 MB written
        else:
            def flushed(alone_bytes: int = alone_bytes) -> bool:
                return all(sst_files()) and 0 < budget.memtable_bytes < 0.8 * alone_bytes

            deadline = time.monotonic() + 30
            while not flushed() and time.monotonic() < deadline:
                time.sleep(0.05)  # flushes scheduled by the last writes may still run (a CI run saw 47 MB)
            assert all(sst_files())
            assert 0 < budget.memtable_bytes < 0.8 * alone_bytes
            assert budget.used_bytes >= budget.memtable_bytes
        for n, store in enumerate(stores):
            assert store.count() == 24_000 and store.offsets() == {n: 24_000}
            store.close()
    for n in range(2):
        with StateStore(tmp_path / f"shared-{n}", StateStoreOptions(memory=budget)) as reopened:
            assert reopened.count() == 24_000 and reopened.get(b"key-%08d" % 23_999, n) is not None


def test_store_memory_is_checked_and_pickles_as_its_numbers():
    with pytest.raises(ValueError, match="at least 1 MiB"):
        StoreMemory(1000)
    with pytest.raises(ValueError, match="memtable_share"):
        StoreMemory(16 << 20, memtable_share=0)
    budget = pickle.loads(pickle.dumps(StoreMemory(16 << 20, memtable_share=0.25)))
    assert (budget.limit_bytes, budget.memtable_share) == (16 << 20, 0.25)
    assert budget.used_bytes == 0
