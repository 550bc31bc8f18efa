"""The store's lease without a broker (:mod:`materializer.datadir.lease`): what the file says, what readers
make of it (an age, a refusal past a bound, a group member's partitions past the session timeout),
a writer that cannot write, and a run that renews it only while current. The real-broker tests are
tests/integration/test_store_staleness.py."""

from __future__ import annotations

import logging
import os
import socket
from pathlib import Path

import pytest
from click.testing import CliRunner

from materializer.adapters.errors import PartitionNotAssignedError
from materializer.adapters.rocksdb_store import StateStore
from materializer.cli import main
from materializer.datadir.holder import DataDirHolder
from materializer.datadir.layout import lease_path, state_dir
from materializer.datadir.lease import LeaseWriter, StaleStoreError, read_lease, staleness_of, wall_ms
from materializer.datadir.lock import DataDirLock
from materializer.datadir.markers import mark_complete, mark_incomplete, new_generation
from materializer.group.served import serve
from materializer.session import StoreMarker
from materializer.storage.record_batch import Record
from materializer.view import MaterializedView, served_by_marker

from ..test_materializer import _produce, fake_source  # noqa: F401 - fixture

TOPIC = "t"


def _store(data_dir: Path) -> None:
    with StateStore(state_dir(data_dir, TOPIC)) as store:
        store.apply({0: [Record(0, 0, b"a", b"A")], 1: [Record(0, 0, b"b", b"B")]}, {0: 1, 1: 1})
    mark_complete(data_dir, TOPIC, written_by="run")


def _holder(pid: int | None = None) -> DataDirHolder:
    return DataDirHolder("run", os.getpid() if pid is None else pid, "2026-11-29T00:00:00Z", socket.gethostname())


def _lease(data_dir: Path, as_of: dict[int, int | None], *, holder: DataDirHolder | None = None,
           session_timeout_ms: int | None = None, continuous: bool = True) -> LeaseWriter:
    writer = LeaseWriter.start(data_dir, TOPIC, holder or _holder(), interval_ms=1000,
                               group_id="g" if session_timeout_ms else None, session_timeout_ms=session_timeout_ms)
    writer.held, writer.continuous = frozenset(as_of), continuous
    writer.as_of_ms.update(as_of)
    assert writer.write()
    return writer


def test_a_lease_says_as_of_when_and_readers_report_and_bound_the_age(tmp_path: Path) -> None:
    _store(tmp_path)
    now = wall_ms()
    _lease(tmp_path, {0: now - 50_000, 1: now - 2_000})
    lease = read_lease(tmp_path, TOPIC)
    assert lease is not None and lease.as_of_ms == {0: now - 50_000, 1: now - 2_000} and lease.continuous
    age = staleness_of(lease, [0, 1], generation=None, now_ms=now)
    assert (age.as_of_ms, age.age_ms, age.unknown) == (now - 50_000, 50_000, None)  # the oldest partition read
    assert staleness_of(lease, [1], generation=None, now_ms=now).age_ms == 2_000
    age.check(50_000, "it", "--max-staleness-ms")  # at the bound: served
    with pytest.raises(StaleStoreError, match=r"^it is 50000 ms old, more than --max-staleness-ms 49999: as of "):
        age.check(49_999, "it", "--max-staleness-ms")
    # readers: export says it on stderr and refuses past the bound; get --metadata says it
    export = CliRunner().invoke(main, ["export", "--data-dir", str(tmp_path), "--topic", TOPIC])
    assert export.exit_code == 0 and export.stdout.count("\n") == 2
    assert export.stderr.startswith(f"topic {TOPIC!r} in {tmp_path}: as of ") and " ms ago, per the lease of " \
        "`materializer run`" in export.stderr
    refused = CliRunner().invoke(main, ["export", "--data-dir", str(tmp_path), "--topic", TOPIC,
                                        "--max-staleness-ms", "30000"])
    assert refused.exit_code == 2 and refused.stdout == "" and refused.stderr.startswith(
        f"error: topic {TOPIC!r} in {tmp_path} is ") and "more than --max-staleness-ms 30000" in refused.stderr
    get = CliRunner().invoke(main, ["get", "--data-dir", str(tmp_path), "--topic", TOPIC, "--partition", "1",
                                    "--metadata", "--max-staleness-ms", "30000", "b"])
    assert get.exit_code == 0 and get.stdout == "B\n" and "as of " in get.stderr  # partition 1 alone: 2 s old
    get = CliRunner().invoke(main, ["get", "--data-dir", str(tmp_path), "--topic", TOPIC, "b"])
    assert get.exit_code == 0 and get.stderr == ""  # the age only with --metadata
    # a view: the age at open, growing until a catch-up; a bound refuses reads
    with MaterializedView.open(tmp_path, TOPIC) as view:
        assert view.staleness.as_of_ms == now - 50_000 and view.staleness.age_ms >= 50_000
    with MaterializedView.open(tmp_path, TOPIC, max_staleness_ms=30_000) as view:
        with pytest.raises(StaleStoreError, match="more than max_staleness_ms 30000"):
            view.get(b"a")


def test_without_a_usable_lease_the_age_is_unknown_and_a_bound_refuses(tmp_path: Path) -> None:
    _store(tmp_path)
    assert staleness_of(None, [0], generation=None).unknown.startswith("no lease")
    lease_path(tmp_path, TOPIC).parent.mkdir()
    lease_path(tmp_path, TOPIC).write_bytes(b"")  # a power loss after the rename, before the data
    assert read_lease(tmp_path, TOPIC) is None
    refused = CliRunner().invoke(main, ["export", "--data-dir", str(tmp_path), "--topic", TOPIC,
                                        "--max-staleness-ms", "60000"])
    assert refused.exit_code == 2 and refused.stderr == (
        f"error: topic {TOPIC!r} in {tmp_path}: age unknown: no lease (written by a command that keeps none, such "
        "as `materializer restore`, or before leases existed); refused under --max-staleness-ms 60000\n")
    # a partition the writer holds but never had current; a lease of other data (a restore since)
    _lease(tmp_path, {0: wall_ms(), 1: None})
    lease = read_lease(tmp_path, TOPIC)
    assert staleness_of(lease, [0, 1], generation=None).unknown.startswith("partition(s) 1 not current since")
    mark_incomplete(tmp_path, TOPIC, "a restore", "run it again", generation=new_generation())
    mark_complete(tmp_path, TOPIC, written_by="restore --from-log-dir")
    export = CliRunner().invoke(main, ["export", "--data-dir", str(tmp_path), "--topic", TOPIC])
    assert export.exit_code == 0 and "is of earlier data (the topic was restored since)" in export.stderr


def test_a_writer_carries_the_as_of_it_finds_and_writes_only_changes(tmp_path: Path) -> None:
    _store(tmp_path)
    old = wall_ms() - 60_000
    _lease(tmp_path, {0: old, 1: old})
    writer = LeaseWriter.start(tmp_path, TOPIC, _holder(), interval_ms=1000)
    assert writer.as_of_ms == {0: old, 1: old}  # the store still holds them as of then: not younger
    writer.held = frozenset({0, 1})
    assert writer.write()
    written = lease_path(tmp_path, TOPIC).stat().st_mtime_ns
    assert writer.write() and lease_path(tmp_path, TOPIC).stat().st_mtime_ns == written  # nothing changed
    writer.topic_deleted(old + 1)
    assert read_lease(tmp_path, TOPIC).topic_deleted_ms == old + 1
    export = CliRunner().invoke(main, ["export", "--data-dir", str(tmp_path), "--topic", TOPIC])
    assert export.exit_code == 0 and "the topic was deleted in the cluster (found at " in export.stderr
    get = CliRunner().invoke(main, ["get", "--data-dir", str(tmp_path), "--topic", TOPIC, "a"])
    assert get.exit_code == 0 and get.stdout == "A\n" and "this is its last state" in get.stderr


def test_a_lease_that_cannot_be_written_is_logged_once_and_never_raises(tmp_path: Path, caplog) -> None:
    _store(tmp_path)
    (tmp_path / "topic-lease").write_bytes(b"not a folder")  # every write fails
    writer = LeaseWriter.start(tmp_path, TOPIC, _holder(), interval_ms=1000)
    writer.held = frozenset({0})
    with caplog.at_level(logging.WARNING, logger="materializer.datadir.lease"):
        writer.as_of_ms[0] = wall_ms()
        assert not writer.write()
        writer.as_of_ms[0] += 1
        assert not writer.write()
    assert [r.getMessage() for r in caplog.records if r.name == "materializer.datadir.lease"] == [
        f"cannot renew the lease {lease_path(tmp_path, TOPIC)} (File exists): readers see the age of topic "
        f"{TOPIC}'s store grow until it can"]
    assert writer.staleness().age_ms is not None  # the in-process view knows all the same


def test_a_group_members_partitions_are_served_only_while_its_lease_is_younger_than_the_session_timeout(
        tmp_path: Path, monkeypatch) -> None:
    _store(tmp_path)
    lock = DataDirLock.acquire(tmp_path, "run")  # the member holds the data dir: alive by the lock probe
    try:
        now = wall_ms()
        marker = StoreMarker(tmp_path, TOPIC, "run")
        serve(marker, "g", [0, 1], 2, held_by=lock.holder)
        marker.mark_complete()
        # no lease of this process: refused
        served = served_by_marker(tmp_path, TOPIC)
        assert served.partitions() == frozenset() and "has written no lease for them" in served.stopped
        _lease(tmp_path, {0: now, 1: now}, holder=_holder(pid=os.getpid() + 1), session_timeout_ms=6_000)
        assert "has written no lease" in served_by_marker(tmp_path, TOPIC).stopped  # another process's lease
        # its own lease, renewed 1 s ago: served until 5 s from now
        _lease(tmp_path, {0: now - 1_000, 1: now}, holder=lock.holder, session_timeout_ms=6_000)
        served = served_by_marker(tmp_path, TOPIC)
        assert served.partitions() == frozenset({0, 1}) and served.stopped is None
        assert served.expires_ms == now + 5_000
        view = MaterializedView.open(tmp_path, TOPIC)
        assert view.get(b"a", partition=0) == b"A"
        monkeypatch.setattr("materializer.view.wall_ms", lambda: now + 5_000)  # the member froze since
        assert served.partitions() == frozenset()
        lapsed = ("has not renewed its lease since .*, longer than the group's session timeout \\(6000 ms\\): frozen "
                  "\\(SIGSTOP, a paused VM\\) or stuck")
        with pytest.raises(PartitionNotAssignedError, match=lapsed):
            served.check(0)
        with pytest.raises(PartitionNotAssignedError, match=lapsed):
            view.get(b"a", partition=0)  # the view's lease is as old: refused without a catch-up
        view.close()
        monkeypatch.undo()
        # the lease older than the session timeout already when read: refused at once
        _lease(tmp_path, {0: now - 7_000, 1: now}, holder=lock.holder, session_timeout_ms=6_000)
        served = served_by_marker(tmp_path, TOPIC)
        assert served.partitions() == frozenset() and served.expires_ms is None
        assert "longer than the group's session timeout (6000 ms)" in served.stopped
        get = CliRunner().invoke(main, ["get", "--data-dir", str(tmp_path), "--topic", TOPIC, "--partition", "1", "b"])
        assert get.exit_code == 2 and "longer than the group's session timeout (6000 ms)" in get.stderr
        # renewed: served again
        _lease(tmp_path, {0: wall_ms(), 1: wall_ms()}, holder=lock.holder, session_timeout_ms=6_000)
        get = CliRunner().invoke(main, ["get", "--data-dir", str(tmp_path), "--topic", TOPIC, "--partition", "1", "b"])
        assert get.exit_code == 0 and get.stdout == "B\n", get.output
    finally:
        lock.release()


def test_a_run_renews_its_lease_only_while_it_is_current(tmp_path: Path, fake_source) -> None:  # noqa: F811
    """The writer's side with a stand-in source (the consumer path): a bounded run leaves a lease saying
    when it was caught up; a continuous one renews it while the client reports the cluster reachable
    and leaves it where it was (the age grows) while it does not, fetch rounds going on all the same."""
    from materializer.config import MaterializerOptions
    from materializer.materializer import Materializer

    _produce(fake_source.topic_data, 0, 0, [b"a", b"b"])
    _produce(fake_source.topic_data, 1, 0, [b"c"])
    before = wall_ms()
    options = MaterializerOptions(fetch="consumer", lease_interval_ms=20, poll_timeout_ms=10,
                                  client_config={"fetch.wait.max.ms": "10"})
    with Materializer("fake:9092", TOPIC, tmp_path, options=options) as m:
        m.run(until_caught_up=True)
        lease = read_lease(tmp_path, TOPIC)
        assert lease is not None and not lease.continuous and set(lease.as_of_ms) == {0, 1}
        # the consumer path dates librdkafka's cached high watermarks 2 x fetch.wait.max.ms before the check
        assert all(before - 20 <= t <= wall_ms() for t in lease.as_of_ms.values() if t is not None)
        assert m.view().staleness.as_of_ms == min(lease.as_of_ms.values())  # the in-process view: the same record
    with Materializer("fake:9092", TOPIC, tmp_path, options=options) as m:
        m.run_in_background()

        def renewed_after(ms: int) -> bool:
            lease = read_lease(tmp_path, TOPIC)
            return lease is not None and lease.continuous and all((t or 0) > ms for t in lease.as_of_ms.values())

        started = wall_ms()
        _wait(lambda: renewed_after(started), "the continuous run to renew its lease")
        for source in fake_source.instances:
            source.reachable = False  # librdkafka reported every broker down
        cut = wall_ms()
        fetches = m.stats.fetches
        # rounds go on for longer than the lease interval (and its 20 ms back-dating) many times over
        _wait(lambda: m.stats.fetches >= fetches + 20 and wall_ms() > cut + 300, "300 ms of fetch rounds")
        assert max(read_lease(tmp_path, TOPIC).as_of_ms.values()) <= cut  # not renewed meanwhile
        assert m.view().staleness.as_of_ms <= cut and m.view().staleness.age_ms >= wall_ms() - cut - 1
        for source in fake_source.instances:
            source.reachable = True
        back = wall_ms()
        _wait(lambda: renewed_after(back), "the lease renewed again")
        m.stop()


def _wait(condition, what: str, timeout_s: float = 60.0) -> None:
    import time

    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)
