"""Group mode without a broker: the options, the assignment hand-over from the membership's thread
(AssignmentChanges), a view that serves only the assigned partitions, and /health/ready's group
detail. The real-broker tests are tests/integration/test_group_materializer.py."""

from __future__ import annotations

import os
import socket
import threading
import time
from pathlib import Path

import pytest

from materializer.adapters.errors import PartitionNotAssignedError
from materializer.adapters.rocksdb_store import StateStore
from materializer.config import MaterializerOptions
from materializer.datadir.layout import state_dir
from materializer.group.assignment import AssignmentChanges
from materializer.health import readiness
from materializer.materializer import Materializer
from materializer.group.routing import partition_for_key
from materializer.stats import MaterializerHealth
from materializer.storage.record_batch import Record
from materializer.view import MaterializedView, ServedPartitions


def test_options_refuse_commit_group_equal_to_group_id_and_bad_values() -> None:
    assert MaterializerOptions(group_id="g", commit_group="lag").group_id == "g"
    with pytest.raises(ValueError, match="commit_group and group_id are both 'g'"):
        MaterializerOptions(group_id="g", commit_group="g")
    with pytest.raises(ValueError, match="group_id"):
        MaterializerOptions(group_id=" ")
    with pytest.raises(ValueError, match="group_protocol"):
        MaterializerOptions(group_id="g", group_protocol="eager")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="group_session_timeout_ms"):
        MaterializerOptions(group_session_timeout_ms=0)


def test_assignment_changes_net_out_and_wake_the_run_loop() -> None:
    woken = []
    changes = AssignmentChanges("t", wake=lambda: woken.append(1))
    first = changes.join()
    assert changes.target() == (first, frozenset())
    changes.assign(frozenset({("t", 0), ("t", 1), ("other", 5)}))
    changes.revoke(frozenset({("t", 1)}))
    changes.assign(frozenset({("t", 1), ("t", 2)}))  # revoked and assigned again: no change for 1
    version, target = changes.target()
    assert target == frozenset({0, 1, 2}) and version == first + 3 and len(woken) == 3
    changes.assign(frozenset({("other", 1)}))  # another topic's: nothing recorded, nobody woken
    assert changes.target()[0] == version and len(woken) == 3
    assert not changes.wait(version, 0.01)
    threading.Timer(0.05, changes.revoke, [frozenset({("t", 0)})]).start()
    assert changes.wait(version, 10)
    assert changes.partitions == frozenset({1, 2})
    changes.leave()  # closing the membership revokes everything: not recorded
    changes.revoke(frozenset({("t", 1), ("t", 2)}))
    assert changes.partitions == frozenset({1, 2})


@pytest.fixture
def store(tmp_path: Path):
    store = StateStore(state_dir(tmp_path, "t"))
    records: dict[int, list[Record]] = {}
    for key in (b"a", b"b", b"c", b"d", b"e", b"f"):
        mine = records.setdefault(partition_for_key(key, 4), [])
        mine.append(Record(len(mine), 1, key, key.upper()))
    store.apply(records, {p: len(rs) for p, rs in records.items()})
    yield store
    store.close()


def test_a_group_view_serves_only_assigned_partitions(store) -> None:
    keys = (b"a", b"b", b"c", b"d", b"e", b"f")
    by_partition = {key: partition_for_key(key, 4) for key in keys}
    assigned = {by_partition[b"a"]}
    view = MaterializedView(store, served=ServedPartitions("t", "g", lambda: frozenset(assigned), lambda: 4))
    mine = sorted(k for k in keys if by_partition[k] in assigned)
    others = [k for k in keys if by_partition[k] not in assigned]
    assert others, by_partition
    assert view.get(b"a") == b"A" and b"a" in view
    with pytest.raises(PartitionNotAssignedError) as raised:
        view.get(others[0])
    assert (raised.value.partition, raised.value.topic, raised.value.group_id) == (by_partition[others[0]], "t", "g")
    with pytest.raises(PartitionNotAssignedError):
        view.get_many([b"a", others[0]])
    with pytest.raises(PartitionNotAssignedError):
        view.get(b"a", partition=by_partition[others[0]])
    with pytest.raises(PartitionNotAssignedError):
        list(view.items(partition=by_partition[others[0]]))
    assert view.get_many(mine) == {k: k.upper() for k in mine}
    # get_entries: get_entry's answers in one multi-get, in the keys' order; refused as get_many
    absent = next(k for k in (b"absent-%d" % i for i in range(100)) if partition_for_key(k, 4) in assigned)
    assert view.get_entries([*mine, absent]) == [view.get_entry(k) for k in [*mine, absent]]
    assert view.get_entries([b"a"])[0].value == b"A" and view.get_entries([absent]) == [None]
    with pytest.raises(PartitionNotAssignedError):
        view.get_entries([b"a", others[0]])
    with pytest.raises(PartitionNotAssignedError):
        view.get_entries([b"a"], partition=by_partition[others[0]])
    assert [e.key for e in view.items()] == mine
    assert [e.key for e in view.scan()] == mine
    assert view.count() == len(view) == len(mine)
    assigned.update(by_partition.values())  # the live assignment is read on each call
    assert view.count() == len(keys) and view.get(others[0]) == others[0].upper()
    # without a group the view serves every partition, as before
    assert MaterializedView(store).count() == len(keys)


def test_readiness_names_the_group_and_its_partitions() -> None:
    health = MaterializerHealth(True, True, None, group_id="g", member_id="m-1", generation=3,
                                assigned_partitions=(1, 4))
    result = readiness(health, {1: 0, 4: 0})
    assert result.ok
    assert result.detail["group"] == {"group_id": "g", "member_id": "m-1", "generation": 3,
                                      "assigned_partitions": [1, 4], "error": None}
    failing = MaterializerHealth(True, False, None, group_id="g", group_error="group 'g': fenced")
    result = readiness(failing, {})
    assert not result.ok and result.reasons == ("the consumer group membership reports: group 'g': fenced",)
    assert "group" not in readiness(MaterializerHealth(True, True, None)).detail


def test_a_continuous_group_run_waits_for_a_broker_that_is_away(tmp_path: Path) -> None:
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    options = MaterializerOptions(group_id="g", request_timeout_ms=1_000, broker_timeout_ms=1_000, progress=False)
    materializer = Materializer(f"127.0.0.1:{port}", "t", tmp_path / "data", options=options)
    runner = threading.Thread(target=materializer.run, daemon=True)
    runner.start()
    try:
        deadline = time.monotonic() + 60
        while materializer.health.broker_reachable and time.monotonic() < deadline:
            time.sleep(0.05)
        health = materializer.health
        assert not health.broker_reachable and health.running and health.failed is None
        assert health.group_id == "g" and health.assigned_partitions == ()
    finally:
        materializer.stop()
        runner.join(30)
        materializer.close()
    assert not runner.is_alive()


def test_the_marker_tells_readers_in_other_processes_which_partitions_are_served(tmp_path: Path) -> None:
    from materializer.datadir.markers import topic_status
    from materializer.group.served import serve
    from materializer.session import StoreMarker
    from materializer.view import served_by_marker

    member = StoreMarker(tmp_path, "t", "run")
    serve(member, "g", [3, 1], 4)  # not complete yet: remembered, written when it is
    assert topic_status(tmp_path, "t").state == "absent"
    member.mark_complete()
    served = served_by_marker(tmp_path, "t")
    assert served is not None and served.partitions() == frozenset({1, 3}) and served.partition_count() == 4
    marker_file = tmp_path / "topic-status" / "t.json"
    written = marker_file.stat().st_ino  # a rewrite renames a new file into place
    serve(member, "g", [1, 3], 4)  # unchanged (a metadata refresh): the marker is not rewritten
    assert marker_file.stat().st_ino == written
    serve(member, "g", [1], 4)  # a rebalance while complete: written at once
    assert served_by_marker(tmp_path, "t").partitions() == frozenset({1})
    assert served_by_marker(tmp_path, "t").partitioner == "murmur2"
    serve(member, "g", [1], 4, "consistent_random")  # readers route keys as the producers did
    assert served_by_marker(tmp_path, "t").partitioner == "consistent_random"
    with pytest.raises(PartitionNotAssignedError, match="partition 3 of topic 't' is not assigned"):
        served_by_marker(tmp_path, "t").check(3)
    StoreMarker(tmp_path, "t", "run").mark_complete()  # a run without --group-id serves every partition again
    assert served_by_marker(tmp_path, "t") is None


def test_withdraw_serves_nothing_of_a_group_marker_and_leaves_other_markers_alone(tmp_path: Path) -> None:
    from materializer.datadir.markers import topic_status
    from materializer.group.served import serve, withdraw
    from materializer.session import StoreMarker
    from materializer.view import served_by_marker

    withdraw(StoreMarker(tmp_path, "absent", "run"), "g")  # nothing written yet: nothing to withdraw
    assert topic_status(tmp_path, "absent").state == "absent"
    member = StoreMarker(tmp_path, "t", "run")
    serve(member, "g", [1, 3], 4)
    member.mark_complete()
    withdraw(StoreMarker(tmp_path, "t", "run"), "g")  # a restart, before joining
    served = served_by_marker(tmp_path, "t")
    assert served is not None and served.partitions() == frozenset() and served.partition_count() == 4
    with pytest.raises(PartitionNotAssignedError):
        served.check(1)
    # a data dir a run without --group-id wrote (every partition served) joins a group: nothing
    # is served until this run has caught up on what it is assigned
    for partition in range(3):
        (tmp_path / f"whole-{partition}").mkdir()
    StoreMarker(tmp_path, "whole", "run").mark_complete()
    assert served_by_marker(tmp_path, "whole") is None
    withdraw(StoreMarker(tmp_path, "whole", "run"), "g")
    served = served_by_marker(tmp_path, "whole")
    assert served is not None and served.partitions() == frozenset() and served.partition_count() == 3
    with pytest.raises(PartitionNotAssignedError):
        served.check(served.partition_of(b"any key"))


def test_the_partitioner_option_names_one_of_the_producers_partitioners() -> None:
    from typing import get_args

    from materializer.config import MaterializerOptions, Partitioner
    from materializer.group.routing import PARTITIONERS

    assert get_args(Partitioner) == ("auto", *PARTITIONERS)  # the option's names are the ones routing hashes
    assert MaterializerOptions().partitioner == "auto"  # found from the data
    assert MaterializerOptions(partitioner="consistent_random").partitioner == "consistent_random"
    with pytest.raises(ValueError, match="partitioner must be auto or one of murmur2, .*consistent_random"):
        MaterializerOptions(partitioner="crc32")


# A group member as `materializer run` holds its data dir: the lock, then its partitions served
# (while it runs, or for good as a bounded run's share), until its stdin closes.
_MEMBER = """
import sys
from pathlib import Path
from materializer.datadir.lock import DataDirLock
from materializer.datadir.lease import LeaseWriter, wall_ms
from materializer.group.served import serve
from materializer.session import StoreMarker
lock = DataDirLock.acquire(sys.argv[1], "run")
continuous = sys.argv[2] == "continuous"
lease = LeaseWriter.start(sys.argv[1], "t", lock.holder, interval_ms=1000, group_id="g", session_timeout_ms=600_000)
lease.held, lease.continuous = frozenset(range(4)), continuous
lease.as_of_ms.update(dict.fromkeys(range(4), wall_ms()))  # current now: renewed before the marker names them
lease.write()
marker = StoreMarker(Path(sys.argv[1]), "t", "run")
serve(marker, "g", [0, 1, 2, 3], 4, held_by=lock.holder if continuous else None)
marker.mark_complete()
print("serving", flush=True)
sys.stdin.read()
"""


@pytest.mark.parametrize("run", ["continuous", "bounded"])
def test_a_member_killed_while_serving_is_refused_by_readers_but_a_bounded_runs_share_stays(tmp_path: Path, store,
                                                                                           run: str) -> None:
    import signal
    import subprocess
    import sys

    from click.testing import CliRunner

    from materializer.cli import main
    from materializer.datadir.holder import read_holder
    from materializer.datadir.lock import DataDirLock
    from materializer.view import served_by_marker

    store.close()  # readers open it in their own processes
    member = subprocess.Popen([sys.executable, "-c", _MEMBER, str(tmp_path), run], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert member.stdout.readline().strip() == "serving"
        served = served_by_marker(tmp_path, "t")
        assert served.partitions() == frozenset(range(4)) and served.stopped is None
        get = CliRunner().invoke(main, ["get", "--data-dir", str(tmp_path), "--topic", "t", "a"])
        assert (get.exit_code, get.output) == (0, "A\n"), get.output
        view = MaterializedView.open(tmp_path, "t", read_only=True)  # a service's view, caught up now and then
        assert view.get(b"a") == b"A"
    finally:
        member.send_signal(signal.SIGKILL)  # no withdraw: the marker still names the partitions
        member.wait()
    view.catch_up()
    served = served_by_marker(tmp_path, "t")
    get = CliRunner().invoke(main, ["get", "--data-dir", str(tmp_path), "--topic", "t", "a"])
    export = CliRunner().invoke(main, ["export", "--data-dir", str(tmp_path), "--topic", "t"])
    if run == "bounded":  # a job's output: readable as of its end
        assert view.get(b"a") == b"A"
        view.close()
        assert served.partitions() == frozenset(range(4)) and served.stopped is None
        assert (get.exit_code, get.output) == (0, "A\n"), get.output
        assert export.exit_code == 0 and export.stdout.count("\n") == 6, export.output  # 6 keys
        assert export.stderr.splitlines()[-1].startswith(f"topic 't' in {tmp_path}: as of "), export.stderr
        return
    stopped = (f"the member process that served this data dir's partitions (pid {member.pid}) has stopped "
               "without letting them go")
    with pytest.raises(PartitionNotAssignedError, match="is not served from this data dir"):
        view.get(b"a")
    view.close()
    assert served.partitions() == frozenset() and served.stopped == stopped
    with pytest.raises(PartitionNotAssignedError, match="has stopped without letting them go; consumer group 'g' moves"):
        served.check(0)
    assert get.exit_code == 2 and "is not served from this data dir: " + stopped in get.output, get.output
    assert export.exit_code == 2 and "moves them to other members: export from their data dirs" in export.output
    with DataDirLock.acquire(tmp_path, "compact"):  # another writer since: the member is gone all the same
        assert served_by_marker(tmp_path, "t").stopped == f"{stopped}: `materializer compact` (pid {os.getpid()}, " \
            f"since {read_holder(tmp_path).since}) holds the data dir now"


def test_a_writer_starting_while_a_reader_checks_the_data_dir_lock_is_not_refused(tmp_path: Path) -> None:
    from materializer.datadir.layout import LOCK_FILE
    from materializer.datadir.lock import DataDirLock
    from materializer.storage.errors import DataDirLockedError
    from materializer.storage.file_lock import lock_file

    DataDirLock.acquire(tmp_path, "run").release()
    # a reader's liveness probe (a shared lock) that a loaded machine keeps for 30 ms
    probe = os.open(tmp_path / LOCK_FILE, os.O_RDONLY)
    lock_file(probe, purpose="a probe", shared=True)
    threading.Timer(0.03, os.close, [probe]).start()
    DataDirLock.acquire(tmp_path, "run").release()  # retried through it: not a holder
    # a real holder is still refused, after the grace
    with DataDirLock.acquire(tmp_path, "run"):
        started = time.monotonic()
        with pytest.raises(DataDirLockedError, match="is being written by `materializer run`"):
            DataDirLock.acquire(tmp_path, "compact")
        assert time.monotonic() - started < 5


def test_a_member_on_another_host_is_judged_only_by_who_holds_the_data_dir(tmp_path: Path) -> None:
    from materializer.datadir.holder import read_holder
    from materializer.datadir.lock import DataDirLock, stopped_without_release

    elsewhere = {"pid": 4242, "host": "node-b", "since": "2026-11-27T00:00:00Z"}
    DataDirLock.acquire(tmp_path, "run").release()  # a lock file that nobody here holds
    assert stopped_without_release(tmp_path, elsewhere) is None  # node-b's locks may not show here
    with DataDirLock.acquire(tmp_path, "compact"):  # but another writer holding it is plain to see
        assert stopped_without_release(tmp_path, elsewhere).endswith(
            f"(pid 4242 on node-b) has stopped without letting them go: `materializer compact` (pid {os.getpid()}, "
            f"since {read_holder(tmp_path).since}) holds the data dir now")


def test_get_and_export_judge_the_store_by_the_marker_it_was_opened_under(tmp_path: Path, store, monkeypatch) -> None:
    # The member was killed; `get` opens its store (the values at the kill). If the member starts
    # again and catches up before `get` reads the marker, that newer marker names a live member and
    # its partitions, but speaks for data this store handle does not hold: it must not be used.
    import signal
    import subprocess
    import sys

    from click.testing import CliRunner

    import materializer.datadir.markers as markers_module  # get/export import it as they open the store
    from materializer.cli import main
    from materializer.datadir.lock import DataDirLock
    from materializer.group.served import serve
    from materializer.session import StoreMarker

    store.close()
    opened = markers_module.open_when_complete
    restarted: list[DataDirLock] = []

    def open_then_member_restarts(*args, **kwargs):
        result = opened(*args, **kwargs)
        lock = DataDirLock.acquire(tmp_path, "run")  # the member again, caught up, serving
        restarted.append(lock)
        serve(StoreMarker(tmp_path, "t", "run"), "g", [0, 1, 2, 3], 4, held_by=lock.holder)
        return result

    monkeypatch.setattr(markers_module, "open_when_complete", open_then_member_restarts)
    try:
        for command in (["get", "a"], ["export"]):
            member = subprocess.Popen([sys.executable, "-c", _MEMBER, str(tmp_path), "continuous"],
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            assert member.stdout.readline().strip() == "serving"
            member.send_signal(signal.SIGKILL)
            member.wait()
            result = CliRunner().invoke(main, [command[0], "--data-dir", str(tmp_path), "--topic", "t", *command[1:]])
            assert result.exit_code == 2 and f"(pid {member.pid}) has stopped without letting them go" in result.output, \
                result.output
            restarted.pop().release()
    finally:
        for lock in restarted:
            lock.release()
