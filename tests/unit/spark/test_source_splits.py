"""``kafkalog``'s ``minPartitions``: a segment cut into several splits reads exactly the rows of one split.

The executor part (:func:`read_split`) runs here without Spark, over a partition folder written
with the project's log: plain batches, a transaction that is aborted and one that is committed,
interleaved, each spanning several batches, so that cuts fall inside both.
"""

from __future__ import annotations

import pytest

from materializer.spark.split_reader import read_split
from materializer.spark.splits import plan_splits
from materializer.storage.log import Log
from materializer.storage.log_config import LogConfig
from materializer.storage.read_committed import checked_segment_batches

from tests.unit.storage.test_read_committed import LogWriter


def _rows(splits) -> list[tuple[int, bytes, bytes | None]]:
    rows = []
    for split in splits:
        for batch in read_split(split, include_headers=False):
            rows.extend(zip(batch.column("offset").to_pylist(), batch.column("key").to_pylist(),
                            batch.column("value").to_pylist()))
    return rows


@pytest.fixture
def folder(tmp_path):
    """``topic-0`` in one segment; returns (log dir, writer, {producer id: (first, last offset)})."""
    log = Log.open(tmp_path / "topic-0", LogConfig(), had_clean_shutdown=True)
    writer = LogWriter(log)
    spans: dict[int, list[int]] = {}

    def txn(producer_id: int, n: int, key: bytes) -> None:
        spans.setdefault(producer_id, [writer.next_offset, 0])[1] = writer.next_offset + n - 1
        writer.txn(producer_id, n, key=key)

    writer.plain(3)
    txn(7, 2, b"a")
    txn(8, 2, b"b")
    writer.plain(2, key=b"p")
    txn(7, 2, b"c")
    txn(8, 1, b"d")
    writer.end(7, commit=False)  # aborts 3-4 and 9-10, across several batches
    writer.plain(1, key=b"q", value=None)
    txn(8, 2, b"e")
    writer.end(8, commit=True)   # commits 5-6, 11, 14-15
    writer.plain(2, key=b"r")
    log.close()
    return tmp_path, writer, {p: tuple(span) for p, span in spans.items()}


def test_cut_segment_reads_the_rows_of_one_split(folder):
    log_dir, writer, spans = folder
    one = plan_splits([log_dir], "topic")
    many = plan_splits([log_dir], "topic", min_partitions=100)
    assert len(one) == 1
    bases = [batch.base_offset for _, batch in checked_segment_batches(one[0].log_path, None, is_last=True)]
    assert len(bases) == 11 and 8 <= len(many) <= 11  # at most one split per batch
    # contiguous offset ranges covering the same range as the single split
    assert [s.start_offset for s in many[1:]] == [s.end_offset for s in many[:-1]]
    assert (many[0].start_offset, many[-1].end_offset) == (one[0].start_offset, one[0].end_offset)
    cuts = {s.start_offset for s in many[1:]}
    assert cuts <= set(bases)  # cut at batch boundaries only
    for first, last in spans.values():  # both the aborted and the committed transaction are cut
        assert any(first < cut <= last for cut in cuts)
    assert _rows(one) == writer.expected()
    assert _rows(many) == writer.expected()
    # each split carries only the aborted transactions that overlap it
    assert [bool(s.aborted) for s in many] == [s.start_offset <= 12 and s.end_offset > 3 for s in many]


def test_cut_by_bytes_and_read_uncommitted(folder):
    log_dir, writer, _ = folder
    three = plan_splits([log_dir], "topic", min_partitions=3)
    assert len(three) == 3
    assert _rows(three) == writer.expected()
    everything = plan_splits([log_dir], "topic", read_committed=False)
    assert _rows(plan_splits([log_dir], "topic", read_committed=False, min_partitions=7)) == _rows(everything)
    assert len(_rows(everything)) == len(writer.expected()) + 4  # the aborted records come back


def test_start_inside_the_aborted_transaction(folder):
    log_dir, writer, _ = folder
    splits = plan_splits([log_dir], "topic", starting={0: 4}, ending={0: 16}, min_partitions=4)
    assert splits[0].start_offset == 4 and splits[-1].end_offset == 16
    assert _rows(splits) == writer.expected(4, 16)


def test_min_partitions_must_be_positive(folder):
    log_dir, _, _ = folder
    with pytest.raises(ValueError, match="minPartitions must be at least 1"):
        plan_splits([log_dir], "topic", min_partitions=0)


def _member_dir(root, partitions: dict[int, int], served: list[int]):
    """A group member's data dir: ``partition -> records`` folders, its marker serving ``served``."""
    from materializer.group.served import serve
    from materializer.session import StoreMarker

    for partition, records in partitions.items():
        log = Log.open(root / f"topic-{partition}", LogConfig(), had_clean_shutdown=True)
        LogWriter(log).plain(records, key=f"p{partition}".encode())
        log.close()
    marker = StoreMarker(root, "topic", "run")
    serve(marker, "g", served, 2)
    marker.mark_complete()
    return root


def test_a_group_members_kept_partitions_are_left_out_and_members_read_together(tmp_path, caplog):
    """A member's data dir keeps partitions the group moved elsewhere (their logs stop where it let
    them go): kafkalog reads only what it serves, and the members' data dirs read together give
    each partition from the member serving it."""
    a = _member_dir(tmp_path / "a", {0: 5, 1: 2}, served=[0])  # partition 1 kept: 2 of its records
    b = _member_dir(tmp_path / "b", {0: 3, 1: 4}, served=[1])  # partition 0 kept: 3 of its records
    alone = plan_splits([a], "topic")
    assert {s.partition for s in alone} == {0}
    assert any("does not serve partitions [1]" in r.getMessage() for r in caplog.records)
    together = plan_splits([a, b], "topic")
    assert {(s.partition, s.end_offset) for s in together} == {(0, 5), (1, 4)}
    assert {s.log_path.split("/")[-3] for s in together} == {"a", "b"}
    assert len(_rows(together)) == 9


def test_a_member_killed_while_serving_has_none_of_its_partitions_read(tmp_path, caplog):
    """A continuous member's marker names the process serving its partitions: once that process is
    gone without withdrawing them (SIGKILL) and no one holds its data dir, kafkalog reads none of
    them; while it holds the data dir and renews its lease, they are read; once its lease is older
    than the group's session timeout (frozen, stuck), none are."""
    from materializer.datadir.lease import LeaseWriter, wall_ms
    from materializer.datadir.lock import DataDirLock
    from materializer.group.served import serve
    from materializer.session import StoreMarker

    a = _member_dir(tmp_path / "a", {0: 5}, served=[0])
    b = _member_dir(tmp_path / "b", {1: 4}, served=[1])
    with DataDirLock.acquire(a, "run") as lock:  # `a` served by this process, continuously
        lease = LeaseWriter.start(a, "topic", lock.holder, interval_ms=1000, group_id="g", session_timeout_ms=6_000)
        lease.held = frozenset({0})
        lease.as_of_ms[0] = wall_ms()
        assert lease.write()  # renewed before the marker names the partition, as a run does
        marker = StoreMarker(a, "topic", "run")
        serve(marker, "g", [0], 2, held_by=lock.holder)
        assert {s.partition for s in plan_splits([a, b], "topic")} == {0, 1}
        lease.as_of_ms[0] = wall_ms() - 7_000  # frozen 7 s ago, with its lock held
        assert lease.write()
        assert {s.partition for s in plan_splits([a, b], "topic")} == {1}
        assert any("longer than the group's session timeout (6000 ms)" in r.getMessage() for r in caplog.records)
    # the lock is gone with "the process" (a SIGKILL lets it go the same way), the marker stays
    assert {s.partition for s in plan_splits([a, b], "topic")} == {1}
    assert any("has stopped without letting them go: none of its partitions is read" in r.getMessage()
               for r in caplog.records)
