"""``kafkalog`` waits out a cleaner's segment swap, told by its type, and fails at once on damage.

A folder that ``materializer run``'s cleaner is swapping segments into holds ``.cleaned``/``.swap``
files for an instant; :class:`ReadOnlyPartition` then raises :class:`UnfinishedSegmentSwapError`,
and both the driver's plan (:func:`plan_splits`) and the executor's read (:func:`read_split`) look
again after 0.1 s, a few times. The pause is replaced here by a function that records it (and may
finish the swap), so nothing sleeps. A swap is recognised by the error's type, never by its
message: a swap error worded otherwise is waited out, a plain :class:`StorageError` that mentions
a swap is not.
"""

from __future__ import annotations

import types

import pytest

import materializer.spark.splits as splits_module
from materializer.spark.split_reader import read_split
from materializer.spark.splits import plan_splits
from materializer.storage.errors import LogNotFoundError, StorageError, UnfinishedSegmentSwapError
from materializer.storage.log import Log
from materializer.storage.log_config import LogConfig
from materializer.storage.read_committed import ReadOnlyPartition

from tests.unit.storage.test_read_committed import LogWriter

TOPIC = "topic"


@pytest.fixture
def log_dir(tmp_path):
    """``topic-0`` in three segments of three batches each; returns (log dir, the rows a reader sees)."""
    log = Log.open(tmp_path / f"{TOPIC}-0", LogConfig(), had_clean_shutdown=True)
    writer = LogWriter(log)
    for segment in range(3):
        if segment:
            log.roll()
        for _ in range(3):
            writer.plain(2, key=b"s%d-%d-" % (segment, writer.next_offset))
    log.close()
    return tmp_path, writer.expected()


@pytest.fixture
def pauses(monkeypatch):
    """The pauses between two looks, recorded instead of slept; ``pauses.then`` runs at each one."""

    class Pauses(list):
        then = staticmethod(lambda: None)

    recorded = Pauses()

    def pause(seconds: float) -> None:
        recorded.append(seconds)
        recorded.then()

    # splits.py's own name ``time`` only: patching ``time.sleep`` itself would turn every other
    # thread's sleep in this process (a client's poll loop) into a busy loop appending here
    monkeypatch.setattr(splits_module, "time", types.SimpleNamespace(sleep=pause))
    return recorded


def _rows(splits) -> list[tuple[int, bytes, bytes | None]]:
    return [row for split in splits for batch in read_split(split, include_headers=False)
            for row in zip(batch.column("offset").to_pylist(), batch.column("key").to_pylist(),
                           batch.column("value").to_pylist())]


def _failing_first(monkeypatch, *errors: Exception) -> list[str]:
    """``ReadOnlyPartition`` as the spark modules see it raises ``errors`` on its first looks, then
    reads the folder; returns the folders looked at."""
    looks: list[str] = []
    pending = list(errors)

    def partition(folder, **kwargs):
        looks.append(str(folder))
        if pending:
            raise pending.pop(0)
        return ReadOnlyPartition(folder, **kwargs)

    monkeypatch.setattr(splits_module, "ReadOnlyPartition", partition)
    return looks


def test_read_only_partition_names_a_swap_by_type(log_dir):
    directory, _ = log_dir
    folder = directory / f"{TOPIC}-0"
    (folder / "00000000000000000006.log.cleaned").write_bytes(b"")
    with pytest.raises(UnfinishedSegmentSwapError, match="interrupted segment swap") as info:
        ReadOnlyPartition(folder)
    assert info.value.path == str(folder) and isinstance(info.value, StorageError)


def test_plan_waits_out_a_swap_on_disk(log_dir, pauses):
    directory, expected = log_dir
    swap = directory / f"{TOPIC}-0" / "00000000000000000006.log.swap"
    swap.write_bytes(b"")
    pauses.then = lambda: swap.unlink()  # the cleaner finishes its swap during the first pause
    splits = plan_splits([directory], TOPIC)
    assert pauses == [0.1]
    assert len(splits) == 3 and _rows(splits) == expected


def test_a_swap_still_there_after_five_looks_fails_with_its_type(log_dir, pauses):
    directory, _ = log_dir
    (directory / f"{TOPIC}-0" / "00000000000000000006.log.cleaned").write_bytes(b"")
    with pytest.raises(UnfinishedSegmentSwapError):
        plan_splits([directory], TOPIC)
    assert pauses == [0.1] * 4  # five looks, a pause between two


def test_a_swap_error_worded_otherwise_is_waited_out(log_dir, pauses, monkeypatch):
    directory, expected = log_dir
    folder = str(directory / f"{TOPIC}-0")
    splits = plan_splits([directory], TOPIC)
    looks = _failing_first(monkeypatch, UnfinishedSegmentSwapError("a cleaner is renaming files", path=folder))
    assert plan_splits([directory], TOPIC) == splits
    assert pauses == [0.1] and looks == [folder, folder]
    # the executor's look at its segment, too
    pauses.clear()
    looks = _failing_first(monkeypatch, UnfinishedSegmentSwapError("a cleaner is renaming files", path=folder))
    assert _rows(splits[:1]) == expected[:6]
    assert pauses == [0.1] and looks == [folder, folder]


def test_a_storage_error_that_mentions_a_swap_is_not_waited_out(log_dir, pauses, monkeypatch):
    directory, _ = log_dir
    splits = plan_splits([directory], TOPIC)
    damage = f"{directory}: holds files of an interrupted segment swap (made up: any other StorageError)"
    _failing_first(monkeypatch, StorageError(damage))
    with pytest.raises(StorageError, match="made up") as info:
        plan_splits([directory], TOPIC)
    assert type(info.value) is StorageError and pauses == []
    _failing_first(monkeypatch, StorageError(damage))
    with pytest.raises(StorageError, match="made up"):
        _rows(splits[:1])
    assert pauses == []


def test_a_lost_segment_is_looked_at_again_then_fails_as_log_not_found(log_dir, pauses):
    directory, _ = log_dir
    lost = directory / f"{TOPIC}-0" / "00000000000000000006.log"
    lost.unlink()  # its .index and .timeindex stay
    with pytest.raises(LogNotFoundError, match="offsets from 6 up to 12 are lost") as info:
        plan_splits([directory], TOPIC)
    assert type(info.value) is LogNotFoundError  # the storage error, as Spark prints it to the CLI
    assert pauses == [0.1] * 4
