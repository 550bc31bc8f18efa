"""StoreApplier: the store's one writer keeps the store equal to its logs when a log start offset
moves while the apply worker is busy (the cleaner threads' retention runs concurrently with it)."""

from __future__ import annotations

import threading

import pytest

import materializer.apply.applier as applier_module
from materializer.adapters.rocksdb_store import StateStore
from materializer.apply.applier import StoreApplier
from materializer.stats import MaterializerStats
from materializer.storage.log import Log
from materializer.storage.log_config import LogConfig
from materializer.storage.record_batch import Record
from materializer.storage.retention import delete_old_segments


def _raise_log_start(log: Log) -> None:
    assert log.maybe_increment_log_start_offset(20)  # DeleteRecords on the leader, followed


def _retention(log: Log) -> None:
    # The cleaner threads' retention: every segment expired; the active one is rolled first, so the
    # log start offset becomes 20 and the segment files the worker reads are renamed .deleted.
    assert delete_old_segments(log) > 1 and log.log_start_offset == 20


@pytest.mark.parametrize("move_log_start", [_raise_log_start, _retention])
def test_a_log_start_raised_during_an_apply_drops_what_that_apply_wrote_below_it(tmp_path, monkeypatch,
                                                                                 move_log_start):
    log = Log.open(tmp_path / "t-0", LogConfig(cleanup_policy=("delete",), retention_ms=1, segment_bytes=300))
    for offset in range(20):
        log.append_records([Record(offset, 1_700_000_000_000, b"k%d" % (offset % 5), b"v%d" % offset)])
    started, release = threading.Event(), threading.Event()
    real_load = applier_module.load_committed_partitions

    def slow_load(store, readers):  # the worker has read its stretch and not yet written it
        started.set()
        assert release.wait(10)
        return real_load(store, readers)

    monkeypatch.setattr(applier_module, "load_committed_partitions", slow_load)
    store = StateStore(tmp_path / "store")
    applier = StoreApplier(store, {0: log}, MaterializerStats(), topic="t", check=None, callbacks=[],
                           on_loading=lambda _: None, threaded=True)
    try:
        applier.begin(store)
        applier.submit({0: 20})
        assert started.wait(10)
        # Everything below 20 goes while the worker is about to read and write records 0..19.
        move_log_start(log)
        dropper = threading.Thread(target=applier.drop_below_log_start)  # the ingest thread's call
        dropper.start()
        dropper.join(0.3)
        release.set()
        dropper.join(10)
        assert not dropper.is_alive()
        applier.drain()
        applier.drop_below_log_start()  # what a run does at its end: a no-op now
        # Every record is below the log start offset: a store rebuilt from the log holds nothing.
        assert dict(store.items()) == {}
        assert store.start_offset(0) == 20 and store.offsets()[0] == 20
    finally:
        release.set()
        applier.close()
        store.close()
        log.close()


def test_bulk_loading_stretches_share_held_entries_written_by_drain(tmp_path):
    """While the store is bulk loaded, the worker's stretches leave their entries held (the store's
    offsets stay where the store is); drain() writes them in one go, equal to applying each stretch."""
    log = Log.open(tmp_path / "t-0", LogConfig())
    store = StateStore(tmp_path / "store")
    stats = MaterializerStats()
    applier = StoreApplier(store, {0: log}, stats, topic="t", check=None, callbacks=[],
                           on_loading=lambda _: None, threaded=True)
    try:
        applier.begin(store)
        store.set_bulk_loading(True)
        for stretch in range(3):
            for offset in range(stretch * 10, stretch * 10 + 10):
                value = None if offset == 25 else b"v%d" % offset
                log.append_records([Record(offset, 1_700_000_000_000, b"k%d" % (offset % 4), value)])
            log.flush()
            applier.submit({0: log.last_stable_offset})
            applier._worker.drain()  # each stretch applied on its own: read, not written
        assert store.offsets() == {} and dict(store.items()) == {} and applier.applied_offsets() == {0: 0}
        applier.drain()  # writes what is held
        assert store.offsets() == {0: 30} and applier.applied_offsets() == {0: 30}
        assert {key: stored.value for key, stored in store.items()} == {b"k0": b"v28", b"k1": b"v29",
                                                                        b"k2": b"v26", b"k3": b"v27"}
        assert stats.records_applied == 30
        # after the drain a new stretch starts where the store is
        log.append_records([Record(30, 1_700_000_000_000, b"k1", b"v30")])
        log.flush()
        applier.submit({0: 31})
        applier.drain()
        assert store.get(b"k1", 0).value == b"v30" and store.offsets() == {0: 31}
    finally:
        applier.close()
        store.close()
        log.close()


def test_held_entries_are_dropped_with_the_worker_and_applied_again(tmp_path):
    """A worker replaced (a heal) or closed forgets what it held: the store's offsets replay it."""
    log = Log.open(tmp_path / "t-0", LogConfig())
    for offset in range(10):
        log.append_records([Record(offset, 1_700_000_000_000, b"k%d" % offset, b"v")])
    log.flush()
    store = StateStore(tmp_path / "store")
    applier = StoreApplier(store, {0: log}, MaterializerStats(), topic="t", check=None, callbacks=[],
                           on_loading=lambda _: None, threaded=True)
    try:
        applier.begin(store)
        store.set_bulk_loading(True)
        applier.submit({0: 10})
        applier._worker.drain()
        applier.restart_worker()
        applier.drain()
        assert store.offsets() == {} and store.count() == 0
        applier.submit({0: 10})  # the next bounds cover it again, from the store's offset
        applier.drain()
        assert store.offsets() == {0: 10} and store.count() == 10
    finally:
        applier.close()
        store.close()
        log.close()


def test_a_drop_from_the_ingest_thread_comes_after_the_entries_a_bulk_load_held(tmp_path):
    """While bulk loading, stretches the worker read are held unwritten; a log start offset that moves
    then (the leader's, followed by the ingest thread) drops what they hold below it too: the held
    entries are written first, so none of them comes back after the drop."""
    log = Log.open(tmp_path / "t-0", LogConfig())
    for offset in range(20):
        log.append_records([Record(offset, 1_700_000_000_000, b"k%d" % offset, b"v%d" % offset)])
    log.flush()
    store = StateStore(tmp_path / "store")
    stats = MaterializerStats()
    applier = StoreApplier(store, {0: log}, stats, topic="t", check=None, callbacks=[],
                           on_loading=lambda _: None, threaded=True)
    try:
        applier.begin(store)
        store.set_bulk_loading(True)
        applier.submit({0: 20})
        applier._worker.drain()  # read and held, not written
        assert store.count() == 0
        assert log.maybe_increment_log_start_offset(15)  # DeleteRecords on the leader, followed
        applier.drop_below_log_start()
        assert {key for key, _ in store.items()} == {b"k%d" % o for o in range(15, 20)}
        assert store.offsets() == {0: 20} and store.start_offset(0) == 15
        assert stats.store_entries_expired == 15
        applier.drain()
        assert store.count() == 5  # nothing held came back
    finally:
        applier.close()
        store.close()
        log.close()
