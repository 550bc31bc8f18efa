"""The native SST writer (``storage/native/src/adapters/sst.rs`` via ``StoreEntries.take_sst``): the files
it writes are ingested by the RocksDB inside rocksdict and read back exactly as the files of
rocksdict's own ``SstFileWriter``; a damaged file fails loudly, never reads back wrong values.

What RocksDB checks on ingestion (``ExternalSstFileIngestionJob::GetIngestedFileInfo``) and these
tests exercise: the footer (magic number, format version, checksum type), the properties block
(checksum, names sorted, ``rocksdb.external_sst_file.version`` 2 with its global seqno 0, the
comparator name, ``rocksdb.key.largest.seqno`` 0), the index block and the first and last data
blocks (their checksums and decompression; their internal keys parsed, sequence number 0).
Every other data block is checked (checksum, LZ4 frame) when first read.
"""

from __future__ import annotations

import os
import random
import struct
from pathlib import Path

import pytest
from rocksdict import Options, Rdict

from materializer.adapters.errors import StoreCorruptedError
from materializer.adapters.rocksdb_store import SST_BLOCK_SIZE, SST_FILE_MIN_ENTRIES, StateStore, StateStoreOptions
from materializer.storage import _native
from materializer.storage.record_batch import Record, RecordBatch
from materializer.storage.record_batch_builder import RecordBatchBuilder
from materializer.storage.record_scan import records_section

NOW = 1_700_000_000_000
FOOTER_BYTES = 53  # Footer of format_version 1..5
BLOCK_BASED_MAGIC = struct.pack("<Q", 0x88E241B785F4CFF7)


def _entries(records: list[tuple[int, bytes, bytes | None]]) -> _native.StoreEntries:
    """StoreEntries holding ``(partition, key, value or None)`` records, offsets 0.. in order."""
    entries = _native.StoreEntries()
    by_partition: dict[int, list[tuple[int, bytes, bytes | None]]] = {}
    for offset, (partition, key, value) in enumerate(records):
        by_partition.setdefault(partition, []).append((offset, key, value))
    for partition, items in by_partition.items():
        for first in range(0, len(items), 2_000):
            chunk = items[first:first + 2_000]
            builder = RecordBatchBuilder(chunk[0][0])
            for offset, key, value in chunk:
                builder.append(offset, NOW + offset, key, value)
            batch = RecordBatch(builder.build())
            header = batch.header
            entries.add_records(records_section(batch), header.records_count, header.base_offset,
                                header.base_timestamp, None, partition, 0, len(records))
    return entries


def _random_records(count: int, seed: int) -> list[tuple[int, bytes, bytes | None]]:
    """Binary keys sharing a few prefixes (some keys repeated), empty, small and larger-than-a-block values."""
    rng = random.Random(seed)
    prefixes = [rng.randbytes(rng.randrange(0, 12)) for _ in range(8)] + [b"\x00" * 5, b"\xff" * 5]
    records = []
    for _ in range(count):
        key = rng.choice(prefixes) + rng.randbytes(rng.randrange(0, 6))
        size = rng.choice([0, 0, 1, 20, 100, 100, 300, SST_BLOCK_SIZE + 1_000])
        value = rng.randbytes(size) if rng.random() < 0.5 else bytes([rng.randrange(4)]) * size
        records.append((rng.randrange(3), key, value))
    return records


def _sst_footers(path: Path) -> list[bytes]:
    return [sst.read_bytes()[-12:] for sst in sorted(path.glob("*.sst"))]


def _native_footer() -> bytes:
    return struct.pack("<I", 5) + BLOCK_BASED_MAGIC  # format_version 5: the native writer's


@pytest.mark.parametrize("compression", ["none", "lz4"])
@pytest.mark.parametrize("count", [1, 300_000])
def test_native_sst_reads_back_as_the_rocksdict_sst(tmp_path: Path, compression: str, count: int) -> None:
    records = _random_records(count, seed=count)
    options = StateStoreOptions(compression=compression)
    with StateStore(tmp_path / "native", options) as native, StateStore(tmp_path / "rocksdict", options) as rocks:
        written = native.apply_store_entries(_entries(records), {0: count, 1: count, 2: count}, bulk_min_entries=1)
        rocks.apply_entries(*_entries(records).take_sorted(), {0: count, 1: count, 2: count}, bulk_min_entries=1)
        assert _sst_footers(tmp_path / "rocksdict") != [_native_footer()]
        expected = list(rocks._data.items())  # the puts: the deletes found nothing to delete
        footers = _sst_footers(tmp_path / "native")
        assert set(footers) == {_native_footer()}  # written natively: one file per core from 40k puts on
        assert len(footers) == max(1, min(os.cpu_count() or 1, len(expected) // SST_FILE_MIN_ENTRIES))
        assert written == len(expected) and list(native._data.items()) == expected
        assert list(native.items()) == list(rocks.items())
        for partition, key, _ in records[:: max(1, count // 500)]:
            assert native.get(key, partition) == rocks.get(key, partition)
            assert native.get(key + b"\x00", partition) == rocks.get(key + b"\x00", partition)
    with StateStore(tmp_path / "native", options) as reopened:
        assert list(reopened._data.items()) == expected and reopened.offsets() == {0: count, 1: count, 2: count}


def test_lz4_blocks_are_compressed_and_incompressible_ones_stored_plain(tmp_path: Path) -> None:
    compressible = [(0, b"key-%06d" % i, b"v" * 200) for i in range(30_000)]
    sizes = {}
    for compression in ("none", "lz4"):
        entries = _entries(compressible)
        assert entries.take_sst(tmp_path / f"{compression}.sst", compression, SST_BLOCK_SIZE)[0] == 30_000
        sizes[compression] = (tmp_path / f"{compression}.sst").stat().st_size
    assert sizes["lz4"] < sizes["none"] / 4
    rng = random.Random(5)
    random_values = [(0, b"key-%06d" % i, rng.randbytes(200)) for i in range(5_000)]
    for compression in ("none", "lz4"):  # LZ4 saves < 1/8 on random bytes: blocks stored as they are
        _entries(random_values).take_sst(tmp_path / f"random-{compression}.sst", compression, SST_BLOCK_SIZE)
    property_difference = len(b"NoCompression") - len(b"LZ4")  # the rocksdb.compression property
    assert (tmp_path / "random-lz4.sst").stat().st_size == (tmp_path / "random-none.sst").stat().st_size - property_difference


def test_ingest_over_existing_data_newer_values_win_and_deletes_delete(tmp_path: Path) -> None:
    """Older values in an SST file and in the memtable (a WriteBatch): the ingested file gets a
    sequence number above both (RocksDB flushes the overlapping memtable first), so its puts
    replace them and its deletes hide them."""
    rng = random.Random(9)
    old = [(p, b"k%05d" % i, b"old-%d" % i) for i in range(40_000) for p in (0, 1)]
    in_memtable = [(p, b"k%05d" % i, b"mem-%d" % i) for i in range(0, 60_000, 7) for p in (0, 1)]
    new = [(p, b"k%05d" % rng.randrange(60_000), None if rng.random() < 0.2 else rng.randbytes(rng.randrange(30)))
           for _ in range(60_000) for p in (rng.randrange(2),)]
    expected: dict[tuple[int, bytes], bytes] = {}
    for partition, key, value in old + in_memtable + new:
        if value is None:
            expected.pop((partition, key), None)
        else:
            expected[(partition, key)] = value
    with StateStore(tmp_path / "store", StateStoreOptions(compression="lz4")) as store:
        store.apply_store_entries(_entries(old), {0: len(old), 1: len(old)})
        store.apply({p: [Record(len(old) + i, NOW, key, value) for i, (q, key, value) in enumerate(in_memtable) if q == p]
                     for p in (0, 1)}, {0: len(old) + len(in_memtable), 1: len(old) + len(in_memtable)})
        entries = _entries(new)
        puts, deletes = entries.sort_latest()
        assert puts >= 20_000 and deletes > 0  # the native SST path, deletes in the files too
        store.apply_store_entries(entries, {0: 2 * len(old), 1: 2 * len(old)})
        assert len(entries) == 0
        # the deletes went into the ingested files, not into the memtable (flushed for the ingest)
        assert store._data.property_int_value("rocksdb.num-entries-active-mem-table") == 0
        # native files of both writes, and the flushed memtables' (the data's and, flushed with it
        # (atomic_flush), the offsets')
        footers = _sst_footers(tmp_path / "store")
        assert footers.count(_native_footer()) >= 2 and len(footers) == footers.count(_native_footer()) + 2
        got = {(p, key): v.value for p in (0, 1) for key, v in store.items(p)}
        assert got == expected
    with StateStore(tmp_path / "store", StateStoreOptions(compression="lz4")) as store:
        assert {(p, key): v.value for p in (0, 1) for key, v in store.items(p)} == expected
        assert store.offsets() == {0: 2 * len(old), 1: 2 * len(old)}


@pytest.mark.parametrize("files", [2, 3, 7])
def test_puts_cut_into_several_files_cover_the_one_file_exactly(tmp_path: Path, files: int) -> None:
    """A list of paths gets consecutive, non-overlapping key ranges of near-equal counts (written
    by parallel threads); read back in file order they are the one-file write, entry for entry, and
    RocksDB ingests them together. Paths beyond the puts' count are not written."""
    records = _random_records(5_000, seed=files)
    one = tmp_path / "one.sst"
    _, one_deletes = _entries(records).take_sst(one, "lz4", 256)
    paths = [tmp_path / f"part-{n}.sst" for n in range(files)]
    written, deletes = _entries(records).take_sst(paths, "lz4", 256)
    assert deletes == one_deletes and all(path.exists() for path in paths)

    def items(path: Path) -> list[tuple[bytes, bytes]]:  # the file's entries, read by RocksDB (a copy is ingested)
        db = Rdict(str(tmp_path / f"read-{path.stem}"), Options(raw_mode=True))
        try:
            db.ingest_external_file([str(path)])
            return list(db.items())
        finally:
            db.close()

    parts = [items(path) for path in paths]
    assert [entry for part in parts for entry in part] == items(one) and written == len(items(one))
    assert max(map(len, parts)) - min(map(len, parts)) <= len(parts[0]) // 50 + 1  # near-equal counts
    with StateStore(tmp_path / "store") as store:
        store._ingest(paths)
        assert list(store._data.items()) == items(one)

    two = [tmp_path / "few-0.sst", tmp_path / "few-1.sst", tmp_path / "few-2.sst"]
    assert _entries([(0, b"a", b"1"), (0, b"b", b"2")]).take_sst(two, "none", 256) == (2, [])
    assert [path.exists() for path in two] == [True, True, False]


def test_take_sst_refuses_what_it_cannot_write(tmp_path: Path) -> None:
    entries = _entries([(0, b"a", b"1"), (0, b"b", None)])
    with pytest.raises(ValueError, match="snappy"):
        entries.take_sst(tmp_path / "x.sst", "snappy", SST_BLOCK_SIZE)
    with pytest.raises(ValueError, match="block size"):
        entries.take_sst(tmp_path / "x.sst", "lz4", 0)
    assert len(entries) == 2  # nothing taken
    with pytest.raises(OSError, match="missing"):
        entries.take_sst(tmp_path / "missing" / "x.sst", "lz4", SST_BLOCK_SIZE)
    deletes_only = _entries([(0, b"a", b"1"), (0, b"a", None)])
    assert deletes_only.take_sst(tmp_path / "y.sst", "lz4", SST_BLOCK_SIZE) == (0, [b"\x00\x00\x00\x00a"])
    assert not (tmp_path / "y.sst").exists()  # RocksDB ingests no empty file: none is written
    with_deletes = _entries([(0, b"a", b"1"), (0, b"a", None), (0, b"b", b"2")])
    assert with_deletes.take_sst(tmp_path / "z.sst", "lz4", SST_BLOCK_SIZE, write_deletes=True) == (2, [])
    db = Rdict(str(tmp_path / "z-read"), Options(raw_mode=True))
    try:
        db[b"\x00\x00\x00\x00a"] = b"older"
        db.ingest_external_file([str(tmp_path / "z.sst")])
        assert list(db.keys()) == [b"\x00\x00\x00\x00b"]  # the file's delete hides the older value
    finally:
        db.close()


def test_snappy_and_zstd_stores_keep_the_rocksdict_writer(tmp_path: Path) -> None:
    records = [(0, b"key-%06d" % i, b"v%d" % i) for i in range(25_000)]
    for compression in ("snappy", "zstd"):
        with StateStore(tmp_path / compression, StateStoreOptions(compression=compression)) as store:
            store.apply_store_entries(_entries(records), {0: len(records)})
            assert store.count() == len(records)
            footers = _sst_footers(tmp_path / compression)
            assert len(footers) == 1 and footers != [_native_footer()]


def _ingest_and_read(db: Rdict, name: str, sst: Path) -> list[tuple[bytes, bytes]] | str:
    """Every entry after ingesting ``sst`` into a new column family ``name`` of ``db`` (dropped
    afterwards), or RocksDB's error: ingestion, then a full scan whose iterator status is checked."""
    column_family = db.create_column_family(name, Options(raw_mode=True))
    try:
        column_family.ingest_external_file([str(sst)])
        scan = column_family.iter()
        scan.seek_to_first()
        entries = []
        while scan.valid():
            entries.append((scan.key(), scan.value()))
            scan.next()
        scan.status()
        return entries
    except Exception as exc:  # rocksdict raises bare Exception with RocksDB's status
        return str(exc)
    finally:
        db.drop_column_family(name)


def test_a_flipped_byte_fails_loudly_never_a_wrong_value(tmp_path: Path) -> None:
    """Each byte of a small LZ4 file with several data blocks flipped in turn: ingestion or the
    scan fails (RocksDB: block checksum, magic number, properties, internal key checks), or every
    entry reads back unchanged. The flips RocksDB cannot notice are all in the footer before its
    magic number, and harmless: the zero padding after the two block handles (a format_version
    < 6 footer has no checksum and the reader skips its padding) and format_version 5 turned
    into 4, which reads this file the same way."""
    records = [(0, b"key-%03d" % i, bytes([i % 7]) * (i % 50)) for i in range(24)]
    sst = tmp_path / "good.sst"
    assert _entries(records).take_sst(sst, "lz4", 128)[0] == 24
    good = sst.read_bytes()
    db_options = Options(raw_mode=True)
    db_options.create_if_missing(True)
    db = Rdict(str(tmp_path / "db"), db_options)
    try:
        expected = _ingest_and_read(db, "good", sst)
        assert isinstance(expected, list) and len(expected) == 24
        undetected = []
        for position in range(len(good)):
            flipped = bytearray(good)
            flipped[position] ^= 0x01
            damaged = tmp_path / "damaged.sst"
            damaged.write_bytes(flipped)
            outcome = _ingest_and_read(db, f"flip{position}", damaged)
            if isinstance(outcome, list):
                assert outcome == expected, f"flip at byte {position} of {len(good)} read back wrong values"
                undetected.append(position - len(good))  # negative: from the end of the file
    finally:
        db.close()
    assert all(-FOOTER_BYTES < p <= -12 for p in undetected), undetected  # the footer before its magic
    assert undetected, "the footer padding is expected to go unnoticed"


def test_store_reads_fail_loudly_on_a_damaged_block(tmp_path: Path) -> None:
    """rocksdict ends ``items``/``keys`` silently at a block it cannot read; the store's reads raise."""
    records = [(0, b"key-%05d" % i, b"v%d" % i * 20) for i in range(20_000)]
    sst = tmp_path / "entries.sst"
    _entries(records).take_sst(sst, "none", SST_BLOCK_SIZE)
    damaged = bytearray(sst.read_bytes())
    damaged[len(damaged) // 2] ^= 0x01  # inside a data block in the middle of the file
    sst.write_bytes(damaged)
    with StateStore(tmp_path / "store") as store:
        store._ingest([sst])  # the first and last blocks are intact: ingestion accepts the file
        store.apply({}, {0: len(records)})
        for read in (lambda: list(store.items()), lambda: list(store.items(0)), store.count, lambda: store.count(0),
                     lambda: list(store.scan(b"key-"))):
            with pytest.raises(StoreCorruptedError, match="checksum mismatch"):
                read()


def test_a_bulk_write_with_nothing_left_after_dedupe_writes_only_the_offsets(tmp_path: Path) -> None:
    with StateStore(tmp_path / "store") as store:
        assert store.apply_store_entries(_native.StoreEntries(), {0: 7}, bulk_min_entries=0) == 0
        assert store.offsets() == {0: 7} and store.count() == 0


def test_deletes_of_a_partition_the_store_holds_nothing_of_are_left_out(tmp_path: Path) -> None:
    """A file that overlaps nothing lands in RocksDB's bottom level, whose deletes are kept for
    good: a bulk write leaves out the deletes of partitions the store holds nothing of (they
    hide nothing) and writes those of the others, which hide the older values."""
    with StateStore(tmp_path / "store", StateStoreOptions(compression="lz4")) as store:
        older = [(1, b"k%05d" % i, b"old") for i in range(30_000)]
        store.apply_store_entries(_entries(older), {1: len(older)})
        new = [(p, b"k%05d" % i, b"new") for i in range(30_000, 60_000) for p in (0, 1)]
        tombstones = [(p, b"k%05d" % i, None) for i in range(0, 500) for p in (0, 1)]
        written = store.apply_store_entries(_entries(new + tombstones), {0: 100_000, 1: 100_000})
        assert written == len(new) + 500  # the puts, and partition 1's deletes only
        assert store.get(b"k00001", 1) is None and store.get(b"k00600", 1) is not None
        assert store.count(0) == 30_000 and store.count(1) == 30_000 + 30_000 - 500
    entries = _entries([(0, b"a", None), (1, b"b", None), (1, b"c", b"1")])
    assert entries.take_sst(tmp_path / "x.sst", "lz4", SST_BLOCK_SIZE, write_deletes=True, skip_deletes_of=[0]) == (2, [])


def test_max_files_caps_the_files_of_one_write(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A write of 100,000 puts is cut into one file per core (here 4, 40,000 entries each at
    least: 2 files) unless ``max_files`` says fewer: the store loader's partition groups write
    from their own threads and ask for one file each, so a cold start's L0 does not fill twice
    as fast."""
    monkeypatch.setattr(os, "cpu_count", lambda: 4)
    ingested: list[int] = []
    ingest = StateStore._ingest

    def counting(store: StateStore, paths: list[Path]) -> None:
        ingested.append(len(paths))
        ingest(store, paths)

    monkeypatch.setattr(StateStore, "_ingest", counting)
    records = [(0, b"k%06d" % i, b"v%d" % i) for i in range(100_000)]
    with StateStore(tmp_path / "store") as store:
        store.apply_store_entries(_entries(records), {0: 100_000})
        store.apply_store_entries(_entries(records), {0: 100_000}, max_files=1)
        assert ingested == [2, 1]
        assert store.count() == 100_000 and store.get(b"k000007").value == b"v7"
