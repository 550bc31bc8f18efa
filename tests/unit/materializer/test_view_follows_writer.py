"""A long-lived read-only view (MaterializedView.open + catch_up) while the writer rebuilds, rewinds
or replaces the topic's store: it serves the earlier data, the new data or a refusal, never a mix.
(Found by an operator campaign: a view that caught up across a re-created topic served the
deleted topic's values, then empty and partial stores, with no error.)"""

from __future__ import annotations

import traceback
from pathlib import Path

import pytest

from materializer.adapters.errors import StoreError, StoreReplacedError
from materializer.adapters.rocksdb_store import StateStore
from materializer.datadir.layout import state_dir
from materializer.datadir.markers import mark_complete, mark_incomplete
from materializer.storage.errors import IncompleteDataDirError
from materializer.storage.record_batch import Record
from materializer.view import MaterializedView

TOPIC = "prices"


def _write(data_dir: Path, records: dict[bytes, bytes], next_offset: int) -> None:
    """The writer: put ``records`` into the topic's store (created when absent) at one offset each."""
    with StateStore(state_dir(data_dir, TOPIC)) as store:
        batch = [Record(next_offset - len(records) + i, 0, key, value) for i, (key, value) in enumerate(records.items())]
        store.apply({0: batch}, {0: next_offset})


def _replace_store(data_dir: Path, records: dict[bytes, bytes], *, marked: bool = True) -> None:
    """What ``run`` does when the topic was re-created (and a restore, a rebuild alike): the marker
    incomplete, the store destroyed, a new one written (``marked``: the marker complete again)."""
    mark_incomplete(data_dir, TOPIC, "the topic was re-created", "wait")
    StateStore.destroy(state_dir(data_dir, TOPIC))
    _write(data_dir, records, len(records))
    if marked:
        mark_complete(data_dir, TOPIC)


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    _write(tmp_path, {b"old-1": b"a", b"old-2": b"b"}, 2)
    mark_complete(tmp_path, TOPIC)
    return tmp_path


def test_a_view_follows_the_writer_and_opens_a_replaced_store_once_it_is_complete(data_dir: Path) -> None:
    with MaterializedView.open(data_dir, TOPIC) as view:
        _write(data_dir, {b"old-3": b"c"}, 3)
        assert view.catch_up() == {0: 3} and view.get(b"old-3") == b"c"

        _replace_store(data_dir, {b"new-1": b"x"}, marked=False)  # the new store is being built
        with pytest.raises(IncompleteDataDirError, match="re-created"):
            view.catch_up()
        with pytest.raises(IncompleteDataDirError, match="re-created"):  # the old topic's data is gone
            view.get(b"old-1")

        mark_complete(data_dir, TOPIC)
        assert view.catch_up() == {0: 1}  # the new store, opened
        assert view.get(b"old-1") is None and view.get(b"new-1") == b"x" and view.count() == 1
        replaced = view._retired[0]
        _write(data_dir, {b"new-2": b"y"}, 2)
        assert view.catch_up() == {0: 2} and view.get(b"new-2") == b"y"
        assert view._retired == []  # the replaced store is closed at the next catch-up
        with pytest.raises(StoreError, match="closed"):
            replaced.get(b"old-1")


def test_a_rewind_in_place_keeps_the_earlier_data_served(data_dir: Path) -> None:
    """The same store being rewound (the marker incomplete, no other store): nothing is caught up
    and the view serves what it read, whole, until the topic is complete again."""
    with MaterializedView.open(data_dir, TOPIC) as view:
        mark_incomplete(data_dir, TOPIC, "`materializer run` rewinding partition 0", "wait")
        _write(data_dir, {b"old-1": b"rewound"}, 5)
        with pytest.raises(IncompleteDataDirError, match="rewinding"):
            view.catch_up()
        assert view.get(b"old-1") == b"a" and view.offsets() == {0: 2}
        mark_complete(data_dir, TOPIC)
        assert view.catch_up() == {0: 5} and view.get(b"old-1") == b"rewound"


def test_refused_reads_do_not_pile_up_tracebacks(data_dir: Path) -> None:
    """A service keeps reading a refused view: each read raises the refusal afresh, so its
    traceback does not grow with the reads (it held every frame of every raise, and their locals)."""
    with MaterializedView.open(data_dir, TOPIC) as view:
        _replace_store(data_dir, {b"new-1": b"x"}, marked=False)
        with pytest.raises(IncompleteDataDirError):
            view.catch_up()
        for _ in range(200):
            with pytest.raises(IncompleteDataDirError) as raised:
                view.get(b"old-1")
        assert len(traceback.extract_tb(raised.value.__traceback__)) < 20


def test_a_store_replaced_behind_a_complete_marker_is_opened_not_caught_up_into(data_dir: Path) -> None:
    """Only the store folder changed (another RocksDB identity): the reader refuses to catch up into
    it (StoreReplacedError) and the view opens it instead."""
    with MaterializedView.open(data_dir, TOPIC) as view:
        StateStore.destroy(state_dir(data_dir, TOPIC))
        _write(data_dir, {b"new-1": b"x"}, 1)
        with pytest.raises(StoreReplacedError):
            view.store.catch_up()
        assert view.store.get(b"old-1") is not None  # nothing caught up: what it read is still served
        assert view.catch_up() == {0: 1} and view.get(b"new-1") == b"x" and view.get(b"old-1") is None


def test_a_catch_up_while_the_marker_changes_refuses_reads_until_the_topic_is_complete_again(
        data_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A rebuild that begins while the view catches up: what the catch-up read may mix two states,
    so the view raises on every read until a catch-up finds the topic complete (then it reopens)."""
    with MaterializedView.open(data_dir, TOPIC) as view:
        store = view.store
        catch_up = store.catch_up

        def rebuild_begins_meanwhile() -> dict[int, int]:
            offsets = catch_up()
            mark_incomplete(data_dir, TOPIC, "`materializer run` rewinding partition 0", "wait")
            return offsets

        monkeypatch.setattr(store, "catch_up", rebuild_begins_meanwhile)
        with pytest.raises(IncompleteDataDirError, match="rewinding"):
            view.catch_up()
        with pytest.raises(IncompleteDataDirError, match="rewinding"):
            view.get(b"old-1")
        _write(data_dir, {b"old-1": b"rebuilt"}, 4)
        mark_complete(data_dir, TOPIC)
        assert view.catch_up() == {0: 4} and view.get(b"old-1") == b"rebuilt"


def test_a_marker_that_changes_during_every_catch_up_ends_in_a_refusal(
        data_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with MaterializedView.open(data_dir, TOPIC) as view:
        store = view.store
        catch_up = store.catch_up
        rewrites = iter(range(1_000))

        def marker_rewritten_meanwhile() -> dict[int, int]:
            offsets = catch_up()
            mark_complete(data_dir, TOPIC, written_by=f"a writer that never holds still ({next(rewrites)})")
            return offsets

        monkeypatch.setattr(store, "catch_up", marker_rewritten_meanwhile)
        with pytest.raises(IncompleteDataDirError, match="changed during each of 3 catch-ups"):
            view.catch_up()
        with pytest.raises(IncompleteDataDirError, match="changed during each"):
            view.count()
