"""The bulk store loader against the record-by-record path it replaces (StateStore.apply)."""

from __future__ import annotations

import random
import threading
from pathlib import Path

import pytest

from materializer.adapters.rocksdb_store import SST_BLOCK_SIZE, StateStore
from materializer.storage import _native
from materializer.storage.log import Log
from materializer.storage.log_config import LogConfig
from materializer.storage.read_committed import CommittedReader
from materializer.storage.compression import CompressionType, compress
from materializer.storage.errors import CorruptRecordError
from materializer.storage.record_batch import BatchHeaderFields, RecordBatch, TimestampType
from materializer.storage.record_batch_builder import RecordBatchBuilder, _pack_batch
from materializer.storage.record_scan import records_section
from materializer.apply import store_loader
from materializer.apply.store_loader import HeldEntries, load_committed, load_committed_partitions

NOW = 1_700_000_000_000


def _log(tmp_path: Path, records: int, keys: int, seed: int) -> Log:
    log = Log.open(tmp_path / "t-0", LogConfig(segment_bytes=1 << 20), had_clean_shutdown=True)
    rng = random.Random(seed)
    offset = 0
    while offset < records:
        builder = RecordBatchBuilder(offset)
        for _ in range(rng.randint(1, 200)):
            key = None if rng.random() < 0.01 else b"key-%d" % rng.randrange(keys)
            value = None if rng.random() < 0.1 else rng.randbytes(rng.choice([0, 20, 100]))
            builder.append(offset, NOW + offset, key, value)
            offset += 1
        log.append_batch(builder.build())
    # an aborted transaction and its marker: never applied
    txn = RecordBatchBuilder(offset, producer_id=5, producer_epoch=0, base_sequence=0, is_transactional=True)
    txn.append(offset, NOW, b"key-1", b"aborted")
    log.append_batch(txn.build())
    marker = RecordBatchBuilder(offset + 1, producer_id=5, producer_epoch=0, is_transactional=True,
                                is_control_batch=True)
    marker.append(offset + 1, NOW, b"\x00\x00\x00\x00", b"\x00\x00\x00\x00\x00\x00")
    log.append_batch(marker.build())
    return log


def _by_record(tmp_path: Path, log: Log, start: int) -> dict:
    with StateStore(tmp_path / "expected") as store:
        reader = CommittedReader(log, start_offset=start)
        records = [r for r in reader.records() if r.key is not None]
        store.apply({0: records}, {0: max(reader.next_offset, start)})
        return {"items": list(store.items()), "offsets": store.offsets()}


@pytest.mark.parametrize("records, keys, chunk_bytes", [(3_000, 500, 1 << 30), (3_000, 500, 2_000),
                                                         (120_000, 60_000, 1 << 30)])
def test_bulk_load_equals_applying_record_by_record(tmp_path: Path, records: int, keys: int, chunk_bytes: int) -> None:
    log = _log(tmp_path, records, keys, seed=records + chunk_bytes)
    for start in (0, records // 3):
        expected = _by_record(tmp_path / f"e{start}", log, start)
        with StateStore(tmp_path / f"bulk{start}") as store:
            progress: list[int] = []
            result = load_committed(store, 0, CommittedReader(log, start_offset=start), chunk_bytes=chunk_bytes,
                                    on_progress=progress.append)
            assert {"items": list(store.items()), "offsets": store.offsets()} == expected
            assert result.next_offset == expected["offsets"][0] == log.log_end_offset
            assert sum(progress) == log.log_end_offset - start
            if chunk_bytes < 10_000:
                assert len(progress) > 10  # bounded memory: many writes
    log.close()


def test_a_full_chunk_of_repeated_keys_drops_replaced_entries_instead_of_writing(tmp_path: Path) -> None:
    """30,000 records over 20 keys (values of 0-100 bytes, tombstones) fill an 8,000-byte chunk
    every few dozen records; the latest entries alone stay far below half of it, so the load
    writes once, at its end, and the store equals applying every record in order."""
    log = _log(tmp_path, 30_000, 20, seed=11)
    expected = _by_record(tmp_path / "expected-store", log, 0)
    with StateStore(tmp_path / "bulk") as store:
        progress: list[int] = []
        load_committed(store, 0, CommittedReader(log, start_offset=0), chunk_bytes=8_000, on_progress=progress.append)
        assert {"items": list(store.items()), "offsets": store.offsets()} == expected
    assert progress == [log.log_end_offset]
    log.close()


def test_a_tombstone_in_a_later_chunk_deletes_a_bulk_written_key(tmp_path: Path) -> None:
    log = Log.open(tmp_path / "t-0", LogConfig(), had_clean_shutdown=True)
    builder = RecordBatchBuilder(0)
    for i in range(60_000):
        builder.append(i, NOW, b"k%d" % i, b"v")
    log.append_batch(builder.build())
    tombstones = RecordBatchBuilder(60_000)
    tombstones.append(60_000, NOW, b"k7", None)
    log.append_batch(tombstones.build())
    with StateStore(tmp_path / "store") as store:
        load_committed(store, 0, CommittedReader(log, start_offset=0), chunk_bytes=1)
        assert store.get(b"k7") is None and store.get(b"k8").value == b"v"
        assert store.count() == 59_999 and store.offsets() == {0: 60_001}
    log.close()


def test_a_crash_after_the_sst_ingest_is_repaired_by_loading_again(tmp_path: Path) -> None:
    """The SST is ingested before the next offset is written: a crash in between leaves values
    without their offset, and loading from the stored offset again gives the exact state."""
    log = _log(tmp_path, 60_000, 40_000, seed=3)
    expected = _by_record(tmp_path / "expected", log, 0)
    path = tmp_path / "crashed"
    with StateStore(path) as store:
        entries_reader = CommittedReader(log, start_offset=0)
        entries = _native.StoreEntries()
        for batch in entries_reader.batches():
            header = batch.header
            entries.add_records(records_section(batch), header.records_count, header.base_offset,
                                header.base_timestamp, None, 0, 0, entries_reader.end_offset)
        with store._ingest_dir() as sst_dir:  # the native SST of apply_store_entries ...
            entries.take_sst(sst_dir / "entries.sst", store.options.compression, SST_BLOCK_SIZE)
            store._ingest([sst_dir / "entries.sst"])  # ... ingested, and the process dies before the WriteBatch
    with StateStore(path) as store:
        assert store.offsets() == {} and store.count() > 0
        load_committed(store, 0, CommittedReader(log, start_offset=store.offsets().get(0, 0)))
        assert {"items": list(store.items()), "offsets": store.offsets()} == expected
    log.close()


def _by_record_of(path: Path, logs: dict[int, Log]) -> dict:
    """Every partition's committed records applied record by record into a store at ``path``:
    its items and offsets."""
    with StateStore(path) as store:
        for p, log in logs.items():
            reader = CommittedReader(log, start_offset=0)
            store.apply({p: [r for r in reader.records() if r.key is not None]}, {p: reader.next_offset})
        return {"items": list(store.items()), "offsets": store.offsets()}


def test_partitions_sharing_chunks_commit_only_offsets_they_hold(tmp_path: Path) -> None:
    """Three partitions loaded in one call with chunks smaller than a partition: each write
    carries the next offsets of exactly the partitions it covers, so a crash after ANY write,
    followed by a load from the stored offsets, gives the state of applying record by record."""
    logs = {p: _log(tmp_path / f"log{p}", 3_000, 400, seed=p) for p in range(3)}  # same keys in each
    expected = _by_record_of(tmp_path / "expected", logs)

    def load(store: StateStore, **kwargs) -> dict:
        readers = {p: CommittedReader(log, start_offset=store.offsets().get(p, log.log_start_offset))
                   for p, log in logs.items()}
        return load_committed_partitions(store, readers, chunk_bytes=20_000, **kwargs)

    with StateStore(tmp_path / "bulk") as store:
        progress: list[int] = []
        results = load(store, on_progress=progress.append)
        assert {"items": list(store.items()), "offsets": store.offsets()} == expected
    assert {p: r.next_offset for p, r in results.items()} == {p: log.log_end_offset for p, log in logs.items()}
    assert sum(progress) == sum(log.log_end_offset for log in logs.values())
    writes = len(progress)
    assert writes > 6  # chunks smaller than one partition: several writes, some spanning two

    class Crash(Exception):
        pass

    for crash_after in range(1, writes):
        with StateStore(tmp_path / f"crash{crash_after}") as store:
            store.apply_entries = _crashing_after(crash_after, store.apply_entries, Crash)  # type: ignore[method-assign]
            with pytest.raises(Crash):
                load(store)
            del store.apply_entries
            load(store)  # the restart: from the offsets the crashed run stored
            assert {"items": list(store.items()), "offsets": store.offsets()} == expected, crash_after
    for log in logs.values():
        log.close()


def _crashing_after(writes: int, write, crash: type[Exception]):
    """``write`` that raises ``crash`` instead of doing its ``writes + 1``-th call and any later
    one (a crashed process writes nothing more). Calls are counted as they begin, under a lock:
    two slots' threads write at once, and counting finished calls let both pass the crash point."""
    lock = threading.Lock()
    calls = 0

    def write_then_crash(*args, **kwargs):
        nonlocal calls
        with lock:
            calls += 1
            call = calls
        if call > writes:
            raise crash
        return write(*args, **kwargs)
    return write_then_crash


def _recompressed(batch: bytes, codec: CompressionType, compress) -> bytes:
    """``batch`` (uncompressed) with its records section compressed by ``compress`` and the codec
    of its attributes set to ``codec``: a batch as another client could have written it."""
    view = RecordBatch(memoryview(batch))
    fields = BatchHeaderFields.of(view.header, attributes=(view.header.attributes & ~0x07) | codec)
    return _pack_batch(fields, view.header.records_count, compress(records_section(view)))


def test_batches_of_every_codec_and_timestamp_type_load_as_record_by_record(tmp_path: Path) -> None:
    """The native core takes uncompressed and lz4 batches itself (``StoreEntries.add_batches``)
    and hands back the others: gzip, zstd, and an lz4 frame with linked blocks (liblz4's
    default, which Kafka's own reader refuses but the Python decoder reads). Every batch ends
    in the store exactly as record-by-record application puts it, LogAppendTime timestamps
    included, whether the load starts at 0 or inside a batch."""
    import cramjam

    log = Log.open(tmp_path / "t-0", LogConfig(segment_bytes=1 << 20), had_clean_shutdown=True)
    rng = random.Random(4)
    offset = 0
    kinds = ["none", "lz4", "gzip", "zstd", "lz4-linked", "log-append-time", "empty"]
    for n in range(70):
        kind = kinds[n % len(kinds)]
        if kind == "empty":  # a batch whose records a cleaner removed: a header and no record
            kept = RecordBatchBuilder(offset, compression=CompressionType.LZ4)
            kept.append(offset, NOW, b"gone", b"x")
            view = RecordBatch(memoryview(kept.build()))
            log.append_batch(_pack_batch(BatchHeaderFields.of(view.header), 0, compress(CompressionType.LZ4, b"")))
            offset += 1
            continue
        builder = RecordBatchBuilder(offset, compression=CompressionType.LZ4 if kind == "lz4" else CompressionType.NONE,
                                     timestamp_type=TimestampType.LOG_APPEND_TIME if kind == "log-append-time"
                                     else TimestampType.CREATE_TIME,
                                     log_append_time_ms=NOW + 5 if kind == "log-append-time" else None)
        for _ in range(rng.randint(1, 300)):
            key = None if rng.random() < 0.02 else b"key-%d" % rng.randrange(500)
            builder.append(offset, NOW + offset, key, None if rng.random() < 0.1 else rng.randbytes(rng.choice([0, 50, 2000])))
            offset += 1
        batch = builder.build()
        if kind == "gzip":
            batch = _recompressed(batch, CompressionType.GZIP, lambda s: bytes(cramjam.gzip.compress(s)))
        elif kind == "zstd":
            batch = _recompressed(batch, CompressionType.ZSTD, lambda s: bytes(cramjam.zstd.compress(s)))
        elif kind == "lz4-linked":
            batch = _recompressed(batch, CompressionType.LZ4, lambda s: bytes(cramjam.lz4.compress(s)))
        log.append_batch(batch)
    for start in (0, offset // 2 + 1):
        expected = _by_record(tmp_path / f"expected{start}", log, start)
        with StateStore(tmp_path / f"bulk{start}") as store:
            result = load_committed(store, 0, CommittedReader(log, start_offset=start), chunk_bytes=64 << 10)
            assert {"items": list(store.items()), "offsets": store.offsets()} == expected
            assert result.next_offset == offset
    # the linked-block lz4 batches were declined by the native core and taken in Python
    entries = _native.StoreEntries()
    linked = [batch.buffer for batch in CommittedReader(log, start_offset=0).batches()
              if batch.compression_type == CompressionType.LZ4][1::2]
    taken, _, _, reason = entries.add_batches(linked, 0, 0, offset)
    assert taken == 0 and reason is not None and "dependent blocks" in reason
    log.close()


def test_a_batch_the_native_core_cannot_decode_raises_with_file_and_position(tmp_path: Path) -> None:
    """A records section whose framing is broken (its CRC recomputed, so only the decode can
    tell) fails the load with the Python decoder's error, naming the segment file and the
    batch's position; the batches before it are taken."""
    log = Log.open(tmp_path / "t-0", LogConfig(), had_clean_shutdown=True)
    good = RecordBatchBuilder(0, compression=CompressionType.LZ4)
    good.append(0, NOW, b"a", b"1")
    position = len(good.build())  # where the broken batch starts in the segment
    log.append_batch(good.build())
    bad = RecordBatchBuilder(1, compression=CompressionType.LZ4)
    bad.append(1, NOW, b"b", b"2")
    view = RecordBatch(memoryview(bad.build()))
    section = bytearray(records_section(view))
    section[0] = 0x7F  # the record's Length now runs past the section
    fields = BatchHeaderFields.of(view.header)
    log.append_batch(_pack_batch(fields, 1, compress(CompressionType.LZ4, bytes(section))))
    with StateStore(tmp_path / "store") as store:
        with pytest.raises(CorruptRecordError, match="base offset 1") as raised:
            load_committed(store, 0, CommittedReader(log, start_offset=0))
        assert raised.value.path.endswith("00000000000000000000.log") and raised.value.position == position
    log.close()


def test_a_chunk_is_bounded_by_its_entries_however_well_the_batches_compress(tmp_path: Path) -> None:
    """lz4 batches of very repetitive values decompress to many times their size: the native
    core stops at the chunk bound (not at a group of compressed bytes), so the load writes
    about once per chunk of entries."""
    log = Log.open(tmp_path / "t-0", LogConfig(), had_clean_shutdown=True)
    offset = 0
    for _ in range(20):
        builder = RecordBatchBuilder(offset, compression=CompressionType.LZ4)
        for _ in range(500):
            builder.append(offset, NOW, b"key-%06d" % offset, b"v" * 1000)
            offset += 1
        log.append_batch(builder.build())
    entries_bytes = offset * (4 + 10 + 16 + 1000)
    assert sum(f.stat().st_size for f in log.dir.glob("*.log")) < entries_bytes / 20  # compressed far below its entries
    with StateStore(tmp_path / "store") as store:
        progress: list[int] = []
        load_committed(store, 0, CommittedReader(log, start_offset=0), chunk_bytes=1 << 20, on_progress=progress.append)
        assert store.count() == offset and store.offsets() == {0: offset}
    assert len(progress) >= entries_bytes // (1 << 20) - 1
    log.close()


def test_held_entries_release_their_memory_only_once_written(tmp_path: Path) -> None:
    """A service keeps its ``HeldEntries`` after the cold start: once written, their arenas are
    freed (``release``); while entries are held, releasing them would lose records and is refused.
    Loads after a release go on where the written ones ended."""
    log = _log(tmp_path, 20_000, 3_000, seed=5)
    middle = next(batch.base_offset for batch in log.read_batches(10_000) if batch.base_offset >= 10_000)
    expected = _by_record(tmp_path / "expected-store", log, 0)
    hold = HeldEntries()
    with StateStore(tmp_path / "bulk") as store:
        first = load_committed_partitions(store, {0: CommittedReader.from_log(log, 0, middle)}, hold=hold)[0]
        assert hold and hold.held_bytes > 0 and first.next_offset == middle
        with pytest.raises(ValueError, match="still held"):
            hold.release()
        hold.write(store)
        hold.release()
        assert hold.held_bytes == 0 and hold.take_written() == {0: middle}
        load_committed_partitions(store, {0: CommittedReader.from_log(log, middle)}, hold=hold)
        hold.write(store)
        assert {"items": list(store.items()), "offsets": store.offsets()} == expected
    log.close()


def test_a_large_load_runs_its_partition_groups_on_threads_and_survives_a_crash_after_any_write(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """From ``PARALLEL_MIN_OFFSETS`` offsets on, partitions are loaded in groups (``p % 2`` here) on
    threads of their own, every write carrying only its group's partitions: the store equals
    applying record by record (the same keys in every partition), progress adds up once, and a
    crash after ANY write of either thread, followed by a load from the stored offsets, repairs it."""
    monkeypatch.setattr(store_loader, "apply_threads", lambda: 2)
    monkeypatch.setattr(store_loader, "PARALLEL_MIN_OFFSETS", 50_000)  # a test-sized load
    logs = {p: _log(tmp_path / f"log{p}", 16_000, 2_000, seed=20 + p) for p in range(4)}
    assert sum(log.log_end_offset for log in logs.values()) >= store_loader.PARALLEL_MIN_OFFSETS
    expected = _by_record_of(tmp_path / "expected", logs)

    def load(store: StateStore, **kwargs) -> dict:
        readers = {p: CommittedReader(log, start_offset=store.offsets().get(p, log.log_start_offset))
                   for p, log in logs.items()}
        return load_committed_partitions(store, readers, chunk_bytes=400_000, **kwargs)

    writers: list[str] = []
    with StateStore(tmp_path / "bulk") as store:
        progress: list[int] = []

        def on_progress(offsets: int) -> None:
            progress.append(offsets)
            writers.append(threading.current_thread().name)

        load(store, on_progress=on_progress)
        assert {"items": list(store.items()), "offsets": store.offsets()} == expected
    assert sum(progress) == sum(log.log_end_offset for log in logs.values())
    assert any(name.startswith("materializer-load") for name in writers) and threading.current_thread().name in writers
    writes = len(progress)
    assert writes >= 6

    class Crash(Exception):
        pass

    threads_before = threading.active_count()
    for crash_after in range(1, writes, 2):
        with StateStore(tmp_path / f"crash{crash_after}") as store:
            store.apply_entries = _crashing_after(crash_after, store.apply_entries, Crash)  # type: ignore[method-assign]
            with pytest.raises(Crash):
                load(store)
            assert threading.active_count() == threads_before  # no slot's thread outlives the load
            del store.apply_entries
            load(store)
            assert {"items": list(store.items()), "offsets": store.offsets()} == expected, crash_after
    for log in logs.values():
        log.close()


def test_held_entries_keep_each_partition_in_one_slot_across_loads(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A cold start's stretches: small loads (one thread) and large ones (a thread per slot) take
    turns on one ``HeldEntries`` of two slots; each partition's entries stay in its slot in offset
    order, so the final write equals applying record by record."""
    monkeypatch.setattr(store_loader, "apply_threads", lambda: 2)
    monkeypatch.setattr(store_loader, "PARALLEL_MIN_OFFSETS", 50_000)  # the 27,000-offset stretches of 3 partitions
    logs = {p: _log(tmp_path / f"log{p}", 30_000, 500, seed=40 + p) for p in range(3)}
    expected = _by_record_of(tmp_path / "expected", logs)
    hold = HeldEntries(2)
    with StateStore(tmp_path / "bulk") as store:
        positions = {p: 0 for p in logs}
        for bound in (1_000, 2_000, 29_000, 29_500):  # small, small, large, small stretches
            readers = {}
            for p, log in logs.items():
                end = next((b.base_offset for b in log.read_batches(bound) if b.base_offset >= bound),
                           log.log_end_offset)
                readers[p] = CommittedReader.from_log(log, positions[p], end)
            for p, result in load_committed_partitions(store, readers, chunk_bytes=300_000, hold=hold).items():
                positions[p] = result.next_offset
        readers = {p: CommittedReader.from_log(log, positions[p]) for p, log in logs.items()}
        load_committed_partitions(store, readers, hold=hold)
        hold.write(store)
        assert not hold and {"items": list(store.items()), "offsets": store.offsets()} == expected
    for log in logs.values():
        log.close()


def test_a_slot_that_fails_stops_the_others_before_they_write(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """A broken batch at the start of partition 0 fails its slot at once; the other slot (its
    own thread) stops at its next batch group instead of loading and writing its partitions, and
    the load raises the broken batch's error, not the stop."""
    monkeypatch.setattr(store_loader, "apply_threads", lambda: 2)
    monkeypatch.setattr(store_loader, "PARALLEL_MIN_OFFSETS", 10_000)
    monkeypatch.setattr(store_loader, "GROUP_BYTES", 4_096)  # a stop check every few batches
    logs = {p: _log(tmp_path / f"log{p}", 16_000, 2_000, seed=60 + p) for p in (1, 2, 3)}
    broken = Log.open(tmp_path / "log0" / "t-0", LogConfig(), had_clean_shutdown=True)
    bad = RecordBatchBuilder(0, compression=CompressionType.LZ4)
    bad.append(0, NOW, b"b", b"2")
    view = RecordBatch(memoryview(bad.build()))
    section = bytearray(records_section(view))
    section[0] = 0x7F  # the record's Length now runs past the section
    broken.append_batch(_pack_batch(BatchHeaderFields.of(view.header), 1,
                                    compress(CompressionType.LZ4, bytes(section))))
    logs[0] = broken
    readers = {p: CommittedReader(log, start_offset=0) for p, log in sorted(logs.items())}
    threads_before = threading.active_count()
    with StateStore(tmp_path / "store") as store:
        with pytest.raises(CorruptRecordError, match="base offset 0"):
            load_committed_partitions(store, readers)
        assert store.offsets() == {}  # partitions 1 and 3 were not written
    assert threading.active_count() == threads_before
    for log in logs.values():
        log.close()


def test_held_entries_write_their_slots_at_once_and_keep_what_was_written_when_one_fails(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The last write of a cold start: each slot's entries go to the store on a thread of its own;
    the store then equals applying record by record. When one slot's write fails, the other
    slot's write stays (its next offsets are in ``written`` and in the store), the failed slot's
    entries and offsets are dropped, and the failure is raised; loading the failed partition
    again from the store's offsets completes the store."""
    monkeypatch.setattr(store_loader, "apply_threads", lambda: 2)
    logs = {p: _log(tmp_path / f"log{p}", 4_000, 500, seed=80 + p) for p in range(2)}
    expected = _by_record_of(tmp_path / "expected", logs)

    class Full(Exception):
        pass

    for failing in (None, 0, 1):
        hold = HeldEntries(2)
        with StateStore(tmp_path / f"bulk-{failing}") as store:
            readers = {p: CommittedReader(log, start_offset=0) for p, log in logs.items()}
            load_committed_partitions(store, readers, hold=hold)
            assert hold.pending == {p: log.log_end_offset for p, log in logs.items()}
            writers: dict[int, str] = {}
            apply_store_entries = store.apply_store_entries

            def write_slot(entries, next_offsets, *, writers=writers, failing=failing,
                           apply_store_entries=apply_store_entries, **kwargs):
                (partition,) = next_offsets
                writers[partition] = threading.current_thread().name
                if partition == failing:
                    raise Full(partition)
                return apply_store_entries(entries, next_offsets, **kwargs)

            store.apply_store_entries = write_slot  # type: ignore[method-assign]
            if failing is None:
                assert hold.write(store) == hold.take_written() == {p: log.log_end_offset for p, log in logs.items()}
                assert {"items": list(store.items()), "offsets": store.offsets()} == expected
                assert len(set(writers.values())) == 2  # two threads
                continue
            with pytest.raises(Full):
                hold.write(store)
            other = 1 - failing
            assert hold.take_written() == {other: logs[other].log_end_offset} == store.offsets()
            del store.apply_store_entries
            # the failed slot's entries and offsets are dropped: no later write stores the offsets
            # without their data; a load from the store's offsets (a restart) writes them
            assert not hold and hold.write(store) == {} and failing not in store.offsets()
            load_committed_partitions(store, {failing: CommittedReader(logs[failing], start_offset=0)})
            assert {"items": list(store.items()), "offsets": store.offsets()} == expected
    for log in logs.values():
        log.close()


def test_store_entries_free_their_memory_and_take_records_again() -> None:
    """``StoreEntries.free_memory`` (what ``HeldEntries.release`` runs on its thread) drops the
    entries and the buffers kept for the next chunk; the object then takes records as a new one."""
    builder = RecordBatchBuilder(0)
    for offset in range(100):
        builder.append(offset, NOW, b"k%d" % (offset % 10), b"v" * 50)
    batch = builder.build()
    entries = _native.StoreEntries()
    assert entries.add_batches([batch], 0, 0, 100)[:2] == (1, 100)
    entries.compact()
    assert len(entries) == 10 and entries.held_bytes > 0
    entries.free_memory()
    assert len(entries) == 0 and entries.held_bytes == 0
    assert entries.add_batches([batch], 0, 0, 100)[:2] == (1, 100)
    assert entries.sort_latest() == (10, 0)
