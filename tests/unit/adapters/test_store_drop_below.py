"""StateStore.drop_below: the store follows a log start offset (retention, DeleteRecords) as a
consumer reading the topic now would, and a snapshot's entries are the state at its start."""

from __future__ import annotations

from materializer.adapters.rocksdb_store import StateStore, StoreSstWriter
from materializer.storage.record_batch import Record


def test_entries_whose_record_is_below_the_start_offset_are_dropped_once(tmp_path):
    with StateStore(tmp_path / "s") as store:
        store.apply({0: [Record(0, 1, b"a", b"1"), Record(5, 1, b"b", b"2"), Record(9, 1, b"a", b"3")],
                     1: [Record(0, 1, b"a", b"x")]}, {0: 10, 1: 1})
        assert store.drop_below(0, 6) == 1  # b (offset 5) goes; a's latest record is at 9
        assert {k: v.value for k, v in store.items(0)} == {b"a": b"3"}
        assert store.get(b"a", 1).value == b"x"  # partitions are independent
        assert store.start_offset(0) == 6 and store.drop_below(0, 6) == 0 and store.drop_below(0, 3) == 0
        store.drop_partition(0)
        assert store.start_offset(0) == 0  # a partition dropped whole starts over


def test_a_snapshot_s_entries_are_its_state_at_the_next_offsets(tmp_path):
    writer = StoreSstWriter(tmp_path / "snap.sst")
    writer.put(0, b"k", 3, 1, b"v")
    writer.finish()
    with StateStore(tmp_path / "s") as store:
        store.ingest_snapshot([tmp_path / "snap.sst"], {0: 50})
        # The restored log starts empty at 50: the entry below it is the snapshot's state, kept.
        assert store.start_offset(0) == 50 and store.drop_below(0, 50) == 0
        assert store.get(b"k", 0).value == b"v"
        assert store.drop_below(0, 60) == 1  # the broker's log start passed it later: gone


def test_a_start_offset_past_every_applied_record_drops_the_partition_and_raises_its_next_offset(tmp_path):
    """Records below the start offset that were never applied are gone too: the partition's next
    offset moves up to it with the drop, in the same write (what a consumer reading from it sees:
    nothing of this partition so far)."""
    with StateStore(tmp_path / "s") as store:
        store.apply({0: [Record(0, 1, b"a", b"1"), Record(3, 1, b"b", b"2")], 1: [Record(0, 1, b"a", b"x")]},
                    {0: 4, 1: 1})
        assert store.drop_below(0, 10) == 2
        assert list(store.items(0)) == [] and store.get(b"a", 1).value == b"x"
        assert store.offsets() == {0: 10, 1: 1} and store.start_offset(0) == 10
    with StateStore(tmp_path / "s") as store:  # both were written
        assert store.offsets() == {0: 10, 1: 1} and store.start_offset(0) == 10
        assert store.drop_below(1, 1) == 1 and store.offsets() == {0: 10, 1: 1}  # at the next offset: not raised


def test_a_start_offset_below_the_next_offset_keeps_the_next_offset(tmp_path):
    with StateStore(tmp_path / "s") as store:
        store.apply({0: [Record(0, 1, b"a", b"1"), Record(7, 1, b"b", b"2")]}, {0: 8})
        assert store.drop_below(0, 5) == 1 and store.offsets() == {0: 8}
        assert [key for key, _ in store.items(0)] == [b"b"]
