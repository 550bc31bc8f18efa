"""A reader (RocksDB secondary instance) never serves a value its memtables hold from before the
writer flushed a newer one to an SST file (RocksDB issues 14444 and 15051): it catches up by
opening a new secondary instance then, and in place otherwise."""

from __future__ import annotations

import glob
import random
from pathlib import Path

import pytest

from materializer.adapters.rocksdb_store import (
    StateStore,
    StateStoreOptions,
    StoredValue,
    encode_store_key,
    encode_stored_value,
)
from materializer.storage.record_batch import Record


def _put(store: StateStore, offset: int, key: bytes, value: bytes | None) -> None:
    store.apply({0: [Record(offset, 0, key, value)]}, {0: offset + 1})


@pytest.mark.parametrize("flush", ["close", "flush", "ingest"])
def test_a_reader_serves_what_the_writer_flushed_after_its_last_catch_up(tmp_path, flush):
    path = tmp_path / "store"
    writer = StateStore(path)
    _put(writer, 0, b"a", b"a0")
    _put(writer, 1, b"b", b"b1")
    reader = StateStore(path, read_only=True)
    try:
        assert reader.get(b"a").value == b"a0"  # from the replayed write-ahead log: in its memtable
        _put(writer, 2, b"a", b"a2")
        _put(writer, 3, b"b", None)
        if flush == "close":  # a clean stop: rocksdict's close flushes the memtables
            writer.close()
        elif flush == "flush":  # a full write buffer (the data's; the offsets stay in memory)
            writer._data.flush()
        else:  # the bulk path: RocksDB flushes the memtable the ingested file overlaps first
            writer.apply_entries([encode_store_key(0, b"b")], [encode_stored_value(4, 0, b"b4")], [], {0: 5},
                                 bulk_min_entries=1)
        offsets = reader.catch_up()
        assert offsets[0] >= 4
        assert reader.get(b"a") == StoredValue(0, 2, 0, b"a2")
        b = StoredValue(0, 4, 0, b"b4") if flush == "ingest" else None
        assert reader.get(b"b") == b
        assert dict(reader.items()) == {b"a": StoredValue(0, 2, 0, b"a2"), **({b"b": b} if b else {})}
        assert reader.secondary_reopens == 1
        if flush != "close":  # it goes on following the writer, in place while no file is added
            _put(writer, 10, b"a", b"a10")
            assert reader.catch_up()[0] == 11 and reader.get(b"a").value == b"a10"
            assert reader.secondary_reopens == 1
            # the replaced instance was closed by that catch-up, its secondary folder (info log) removed
            assert sorted(p.name for p in Path(reader._scratch).iterdir() if p.name.startswith("secondary")) \
                == ["secondary-1"]
    finally:
        reader.close()
        writer.close()


def test_a_reader_with_nothing_in_memory_catches_up_in_place(tmp_path):
    path = tmp_path / "store"
    with StateStore(path) as writer:
        _put(writer, 0, b"a", b"a0")
    reader = StateStore(path, read_only=True)  # everything is in SST files: nothing replayed
    try:
        with StateStore(path) as writer:
            _put(writer, 1, b"a", b"a1")
            writer._data.flush()
            assert reader.catch_up() == {0: 2} and reader.get(b"a").value == b"a1"
        assert reader.secondary_reopens == 0
    finally:
        reader.close()


def test_a_reader_following_a_writer_that_flushes_as_it_writes_answers_as_of_its_offsets(tmp_path):
    """Small write buffers: the writer's memtables flush (and its files compact) in the background
    while a reader catches up after every few batches; each key it answers is the latest record
    below the offsets it reports (it opens new instances for that)."""
    rng = random.Random(15051)
    keys = [b"k%d" % i for i in range(50)]
    path = tmp_path / "store"
    writer = StateStore(path, StateStoreOptions(write_buffer_size_bytes=64 * 1024, max_write_buffer_number=2))
    _put(writer, 0, b"k0", b"v0")
    history: list[tuple[int, bytes, bytes | None]] = [(0, b"k0", b"v0")]
    reader = StateStore(path, read_only=True)
    try:
        offset = 1
        for round_ in range(150):
            records = []
            for _ in range(40):
                key = rng.choice(keys)
                value = None if rng.random() < 0.15 else b"v%d-" % offset + b"x" * 200
                records.append(Record(offset, 0, key, value))
                history.append((offset, key, value))
                offset += 1
            writer.apply({0: records}, {0: offset})
            if round_ % 3 == 0:
                end = reader.catch_up()[0]
                truth: dict[bytes, bytes] = {}
                for record_offset, key, value in history:
                    if record_offset >= end:
                        break
                    if value is None:
                        truth.pop(key, None)
                    else:
                        truth[key] = value
                assert {key: stored.value for key in keys if (stored := reader.get(key)) is not None} == truth
                assert {key: stored.value for key, stored in reader.items()} == truth
        assert len(glob.glob(str(path / "*.sst"))) > 1  # it flushed as it wrote
        assert reader.secondary_reopens > 0
    finally:
        reader.close()
        writer.close()
