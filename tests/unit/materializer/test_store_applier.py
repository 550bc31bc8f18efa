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
