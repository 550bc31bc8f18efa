"""One writer per data dir, atomic restores and readers that write nothing (materializer/datadir/:
lock, markers, staging, swap).

No broker: the topic comes from ``tests.fuzz_harness.build_corpus`` (five partitions, every codec,
transactions). The broker-backed cases (SIGINT/SIGTERM/SIGKILL of a restore, two writers at once)
are in ``tests/integration/test_data_dir_atomic.py``.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from materializer.adapters.rocksdb_store import StateStore
from materializer.cli import main
from materializer.datadir import staging as staging_module
from materializer.datadir import swap as swap_module
from materializer.datadir.layout import state_dir, topic_status_path
from materializer.datadir.lock import DataDirLock
from materializer.datadir.markers import mark_complete, mark_incomplete, require_complete, topic_status
from materializer.datadir.staging import TopicStaging
from materializer.interrupts import Terminated
from materializer.offline.restore import RestoreOptions, restore_from_log_dir
from materializer.storage.errors import DataDirLockedError, IncompleteDataDirError
from materializer.storage.record_batch import Record
from tests.fuzz_harness import build_corpus
from tests.kill_campaign import _latest_per_partition

TOPIC = "fuzz"
_OPTIONS = RestoreOptions(config_overrides={"segment.index.bytes": "65536"}, progress=False)
_SINCE = r"since \d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ"

# A process holding a data dir's lock as `materializer run` would, until its stdin closes.
_HOLDER = textwrap.dedent("""
    import sys
    from materializer.datadir.lock import DataDirLock
    lock = DataDirLock.acquire(sys.argv[1], sys.argv[2])
    print("locked", flush=True)
    sys.stdin.read()
""")


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    """Two broker-like log dirs of topic ``fuzz`` with different data, and their read_committed states."""
    root = tmp_path_factory.mktemp("sources")
    found = {}
    for seed in (1, 2):
        build_corpus(root / f"seed{seed}", seed=seed)
        found[seed] = (root / f"seed{seed}", _latest_per_partition(root / f"seed{seed}", TOPIC))
    return found


@pytest.fixture
def holder_process():
    """Start a process that holds ``DIR``'s lock for ``command``; it is killed at teardown."""
    started = []

    def start(directory: Path, command: str = "run") -> subprocess.Popen:
        process = subprocess.Popen([sys.executable, "-c", _HOLDER, str(directory), command], stdin=subprocess.PIPE,
                                   stdout=subprocess.PIPE, text=True)
        started.append(process)
        assert process.stdout.readline().strip() == "locked"
        return process

    yield start
    for process in started:
        process.kill()
        process.wait()


#: export's age line for a store without a lease (restore and direct writes keep none), after the rest
_NO_LEASE = (": age unknown: no lease (written by a command that keeps none, such as `materializer restore`, or "
             "before leases existed)\n")


def _export(directory: Path) -> tuple[int, str, dict]:
    """``export`` of the topic: (exit status, stderr without its age line, {(partition, key bytes):
    value bytes}); an export that succeeds must end its stderr with the age line of a store without a lease."""
    result = CliRunner().invoke(main, ["export", "--data-dir", str(directory), "--topic", TOPIC, "--key-format",
                                       "bytes", "--value-format", "bytes"])
    state = {}
    if result.exit_code == 0:
        import base64

        for line in result.stdout.splitlines():
            row = json.loads(line)
            state[(row["partition"], base64.b64decode(row["key_b64"]))] = base64.b64decode(row["value_b64"])
        age_line = f"topic {TOPIC!r} in {directory}{_NO_LEASE}"
        assert result.stderr.endswith(age_line), result.stderr
        return result.exit_code, result.stderr[:-len(age_line)], state
    return result.exit_code, result.stderr, state


def _files(directory: Path) -> dict[str, tuple[str, int]]:
    """Every file under ``directory``: its sha256 and mtime (ns)."""
    return {str(p.relative_to(directory)): (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns)
            for p in sorted(directory.rglob("*")) if p.is_file() and not p.is_symlink()}


# -- the lock ----------------------------------------------------------------------------------------

def test_a_second_writer_fails_at_once_naming_the_holder_and_sigkill_releases_it(tmp_path, holder_process):
    directory = tmp_path / "data"
    holder = holder_process(directory, "run")
    started = time.monotonic()
    with pytest.raises(DataDirLockedError) as refused:
        DataDirLock.acquire(directory, "restore --from-log-dir")
    assert time.monotonic() - started < 1.0  # no waiting
    assert re.fullmatch(rf"{re.escape(str(directory))} is being written by `materializer run` \(pid {holder.pid}, "
                        rf"{_SINCE}\); stop it first or use another --data-dir", str(refused.value)), str(refused.value)
    holder.kill()  # SIGKILL: no cleanup of its own; the kernel releases the flock
    holder.wait()
    with DataDirLock.acquire(directory, "compact") as lock:
        assert lock.holder.command == "compact"
        assert json.loads((directory / ".lock").read_text())["pid"] == os.getpid()
        with pytest.raises(DataDirLockedError, match=rf"`materializer compact` \(pid {os.getpid()}, {_SINCE}\)"):
            DataDirLock.acquire(directory, "run")  # a second lock in the same process is refused too


def test_a_lock_that_created_the_data_dir_removes_it_when_nothing_else_was_written(tmp_path):
    fresh = tmp_path / "fresh"
    DataDirLock.acquire(fresh, "run").release()
    assert not fresh.exists()
    kept = tmp_path / "kept"
    with DataDirLock.acquire(kept, "run"):
        (kept / "topic-configs").mkdir()
    assert (kept / ".lock").exists() and (kept / "topic-configs").is_dir()


def test_run_is_refused_before_it_writes_anything_or_contacts_the_broker(tmp_path, holder_process):
    directory = tmp_path / "data"
    directory.mkdir()
    holder = holder_process(directory, "restore --from-log-dir")
    before = sorted(p.name for p in directory.iterdir())
    started = time.monotonic()
    result = subprocess.run([sys.executable, "-m", "materializer", "run", "--bootstrap-servers", "127.0.0.1:1",
                             "--topic", TOPIC, "--data-dir", str(directory), "--until-caught-up", "--timeout", "30"],
                            capture_output=True, text=True, timeout=60)
    assert time.monotonic() - started < 15  # not the 30 s broker timeout: the lock comes first
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith(f"error: {directory} is being written by `materializer restore --from-log-dir` "
                                    f"(pid {holder.pid}, since ")
    assert sorted(p.name for p in directory.iterdir()) == before  # no topic-configs/, no state/


def test_restore_into_a_data_dir_another_writer_holds_writes_nothing(tmp_path, sources, holder_process):
    source, _ = sources[1]
    directory = tmp_path / "data"
    restore_from_log_dir(source, TOPIC, directory, options=_OPTIONS)
    before = _files(directory)
    holder = holder_process(directory, "run")
    result = CliRunner().invoke(main, ["restore", "--from-log-dir", str(source), "--topic", TOPIC, "--data-dir",
                                       str(directory), "--overwrite"])
    assert result.exit_code == 2 and result.stderr.count("\n") == 1, result.output
    assert f"is being written by `materializer run` (pid {holder.pid}" in result.stderr
    assert {k: v for k, v in _files(directory).items() if k != ".lock"} == \
        {k: v for k, v in before.items() if k != ".lock"}
    assert not list(directory.glob(".staging-*"))


def test_readers_never_wait_for_a_writer(tmp_path, sources, holder_process):
    source, expected = sources[1]
    directory = tmp_path / "data"
    restore_from_log_dir(source, TOPIC, directory, options=_OPTIONS)
    holder_process(directory, "run")
    started = time.monotonic()
    status, stderr, state = _export(directory)
    key = next(iter(sorted(expected)))
    got = CliRunner().invoke(main, ["get", "--data-dir", str(directory), "--topic", TOPIC, "--partition",
                                    str(key[0]), "--value-format", "bytes", key[1].decode()])
    from materializer.view import MaterializedView

    with MaterializedView.open(directory, TOPIC) as view:
        assert view.count() == len(expected)
    assert time.monotonic() - started < 10
    assert status == 0 and state == expected, stderr
    assert got.exit_code == 0 and got.stdout_bytes == expected[key]


# -- completeness ------------------------------------------------------------------------------------

def _store(directory: Path, records: dict[int, list[Record]], next_offsets: dict[int, int]) -> None:
    with StateStore(state_dir(directory, TOPIC)) as store:
        store.apply(records, next_offsets)


def test_marker_states_and_what_readers_say(tmp_path):
    directory = tmp_path / "data"
    directory.mkdir()
    assert topic_status(directory, TOPIC).state == "absent"
    with pytest.raises(IncompleteDataDirError, match=re.escape(
            f"no state store for topic {TOPIC!r} in {directory} (run `materializer run` or `materializer restore` "
            f"first)")):
        require_complete(directory, TOPIC)
    assert require_complete(directory, TOPIC, needs_store=False).state == "absent"  # kafkalog on a broker log dir

    _store(directory, {0: [Record(0, 1, b"k", b"v")]}, {0: 1})
    assert topic_status(directory, TOPIC).state == "legacy"  # a data dir from before markers: complete
    assert require_complete(directory, TOPIC).complete

    mark_incomplete(directory, TOPIC, "`materializer restore --from-log-dir` swapping the new data in",
                    "run `materializer restore --overwrite` again", generation="g1")
    status = topic_status(directory, TOPIC)
    assert (status.state, status.generation, status.pid) == ("incomplete", "g1", os.getpid())
    with pytest.raises(IncompleteDataDirError) as refused:
        require_complete(directory, TOPIC)
    assert str(refused.value) == (
        f"topic {TOPIC!r} in {directory} is incomplete: `materializer restore --from-log-dir` swapping the new data in "
        f"(since {status.since}); it did not finish; run `materializer restore --overwrite` again")
    with pytest.raises(IncompleteDataDirError):
        require_complete(directory, TOPIC, needs_store=False)  # the logs are not usable either

    mark_incomplete(directory, TOPIC, "`materializer run` loading a new state store", "wait", logs_usable=True)
    assert topic_status(directory, TOPIC).generation == "g1"  # kept: the data was not replaced
    with pytest.raises(IncompleteDataDirError, match="loading a new state store"):
        require_complete(directory, TOPIC)
    require_complete(directory, TOPIC, needs_store=False)  # kafkalog may read the logs meanwhile

    mark_complete(directory, TOPIC, written_by="run", live_keys=1)
    status = require_complete(directory, TOPIC)
    assert status.state == "complete" and status.facts == {"written_by": "run", "live_keys": 1}
    assert status.generation == "g1"

    topic_status_path(directory, TOPIC).write_text("{not json")
    with pytest.raises(IncompleteDataDirError, match="marker .* is unreadable"):
        require_complete(directory, TOPIC)


def test_an_incomplete_marker_of_a_live_writer_says_it_is_in_progress(tmp_path, holder_process):
    directory = tmp_path / "data"
    _store(directory, {0: [Record(0, 1, b"k", b"v")]}, {0: 1})
    script = textwrap.dedent("""
        import sys
        from materializer.datadir.lock import DataDirLock
        from materializer.datadir.markers import mark_incomplete
        lock = DataDirLock.acquire(sys.argv[1], "run")
        mark_incomplete(sys.argv[1], "fuzz", "`materializer run` loading a new state store", "wait for it")
        print("marked", flush=True)
        sys.stdin.read()
    """)
    process = subprocess.Popen([sys.executable, "-c", script, str(directory)], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout.readline().strip() == "marked"
        status, stderr, _ = _export(directory)
        assert status == 2 and stderr.count("\n") == 1
        assert f"it is still in progress: `materializer run` (pid {process.pid}, since " in stderr
    finally:
        process.kill()
        process.wait()
    status, stderr, _ = _export(directory)
    assert status == 2 and "it did not finish; wait for it" in stderr


def test_an_empty_complete_store_exports_nothing_with_exit_0_and_a_missing_one_is_refused(tmp_path):
    empty = tmp_path / "empty"
    _store(empty, {}, {0: 0})
    mark_complete(empty, TOPIC, written_by="run")
    assert _export(empty) == (0, "", {})
    status, stderr, _ = _export(tmp_path / "missing")
    assert status == 2 and stderr.startswith("error: no state store for topic") and stderr.count("\n") == 1
    assert not (tmp_path / "missing").exists()  # a reader creates nothing


def test_a_failed_strict_restore_leaves_no_store_and_export_refuses(tmp_path, sources):
    source, _ = sources[1]
    damaged = tmp_path / "damaged"
    shutil.copytree(source, damaged)
    segment = sorted((damaged / f"{TOPIC}-2").glob("*.log"))[1]
    data = bytearray(segment.read_bytes())
    data[100] ^= 0xFF  # a CRC mismatch in the second segment
    segment.write_bytes(bytes(data))
    directory = tmp_path / "data"
    result = CliRunner().invoke(main, ["restore", "--from-log-dir", str(damaged), "--topic", TOPIC,
                                       "--data-dir", str(directory)])
    assert result.exit_code == 2 and result.stderr.count("\n") == 1 and str(segment) in result.stderr, result.output
    assert not directory.exists() or sorted(p.name for p in directory.iterdir()) == []
    status, stderr, _ = _export(directory)
    assert status == 2 and "no state store" in stderr


# -- the swap ----------------------------------------------------------------------------------------

class _Crash(BaseException):
    """Stands for the process dying at this point (not an Exception: nothing may catch it)."""


_SWAP_STEPS = ("rename", "flush_dir", "update_offset_checkpoint", "mark_complete", "rmtree")


def _crash_at(monkeypatch, step: int | None) -> list[str]:
    """Make the swap's ``step``-th call of its file system steps raise :class:`_Crash` (None: count them)."""
    calls: list[str] = []
    real = {"rename": os.rename, "flush_dir": swap_module.flush_dir,
            "update_offset_checkpoint": swap_module.update_offset_checkpoint,
            "mark_complete": swap_module.mark_complete, "rmtree": shutil.rmtree}
    real_roll_forward = staging_module.roll_forward

    def counted(name):
        def call(*args, **kwargs):
            calls.append(name)
            if step is not None and len(calls) == step:
                raise _Crash(f"crash at {name} (step {step})")
            return real[name](*args, **kwargs)
        return call

    def roll_forward(*args):
        with monkeypatch.context() as patched:
            patched.setattr(os, "rename", counted("rename"))
            patched.setattr(swap_module.shutil, "rmtree", counted("rmtree"))
            for name in ("flush_dir", "update_offset_checkpoint", "mark_complete"):
                patched.setattr(swap_module, name, counted(name))
            real_roll_forward(*args)

    monkeypatch.setattr(staging_module, "roll_forward", roll_forward)  # the swap a restore's commit begins
    return calls


def test_a_swap_cut_at_any_step_is_refused_by_readers_and_finished_by_the_next_writer(tmp_path, sources, monkeypatch):
    (old_source, old_state), (new_source, new_state) = sources[1], sources[2]
    template = tmp_path / "template"
    restore_from_log_dir(old_source, TOPIC, template, options=_OPTIONS)
    assert _export(template)[2] == old_state and old_state != new_state
    counting = tmp_path / "counting"
    shutil.copytree(template, counting)
    with monkeypatch.context() as patched:
        steps = _crash_at(patched, None)
        restore_from_log_dir(new_source, TOPIC, counting, options=RestoreOptions(**{**_OPTIONS.__dict__,
                                                                                       "overwrite": True}))
    assert _export(counting)[2] == new_state
    assert set(steps) == set(_SWAP_STEPS) and len(steps) >= 12, steps
    for step in range(1, len(steps) + 1):
        directory = tmp_path / f"crash-{step}"
        shutil.copytree(template, directory)
        with monkeypatch.context() as patched:
            _crash_at(patched, step)
            with pytest.raises(_Crash):
                restore_from_log_dir(new_source, TOPIC, directory,
                                     options=RestoreOptions(**{**_OPTIONS.__dict__, "overwrite": True}))
        status, stderr, state = _export(directory)
        if status == 0:  # only once the marker says complete (the staging folder was being deleted)
            assert state == new_state and steps[step - 1] == "rmtree", (step, steps[step - 1])
        else:
            assert status == 2 and "is incomplete: `materializer restore --from-log-dir` swapping" in stderr, stderr
            assert "finishes the swap" in stderr
        DataDirLock.acquire(directory, "compact").release()  # the next writer start rolls the swap forward
        assert _export(directory) == (0, "", new_state), step
        assert _latest_per_partition(directory, TOPIC) == new_state
        assert not list(directory.glob(".staging-*")) and topic_status(directory, TOPIC).state == "complete"
        shutil.rmtree(directory)


def test_an_interruption_before_the_swap_leaves_the_data_dir_as_it_was(tmp_path, sources, monkeypatch):
    (old_source, old_state), (new_source, _) = sources[1], sources[2]
    directory = tmp_path / "data"
    restore_from_log_dir(old_source, TOPIC, directory, options=_OPTIONS)
    before = {k: v for k, v in _files(directory).items() if k != ".lock"}
    import materializer.offline.restore as restore_module

    real = restore_module._restore_partition
    for interruption, leave_staging in ((KeyboardInterrupt, False), (Terminated, False), (_Crash, True)):
        def cut(*args, calls=[], interruption=interruption, **kwargs):  # noqa: B006 - counts this round's calls
            calls.append(1)
            if len(calls) == 3:
                raise interruption()
            return real(*args, **kwargs)

        with monkeypatch.context() as patched:
            patched.setattr(restore_module, "_restore_partition", cut)
            if leave_staging:  # as SIGKILL would: no cleanup runs
                patched.setattr(TopicStaging, "discard", lambda self: None)
            with pytest.raises(interruption):
                restore_from_log_dir(new_source, TOPIC, directory,
                                     options=RestoreOptions(**{**_OPTIONS.__dict__, "overwrite": True}))
        assert bool(list(directory.glob(".staging-*"))) == leave_staging
        assert {k: v for k, v in _files(directory).items() if k != ".lock" and ".staging-" not in k} == before
        assert _export(directory) == (0, "", old_state)
    DataDirLock.acquire(directory, "run").release()
    assert not list(directory.glob(".staging-*"))  # the next writer deletes what a killed one left


def test_interrupted_commands_exit_130_or_143_with_one_line(tmp_path, sources, monkeypatch):
    import materializer.offline.restore as restore_module

    source, _ = sources[1]
    for interruption, status, name in ((KeyboardInterrupt, 130, "SIGINT"), (Terminated, 143, "SIGTERM")):
        def stop(*args, interruption=interruption, **kwargs):
            raise interruption()

        monkeypatch.setattr(restore_module, "_restore_partition", stop)
        result = CliRunner().invoke(main, ["restore", "--from-log-dir", str(source), "--topic", TOPIC,
                                           "--data-dir", str(tmp_path / name)])
        assert result.exit_code == status, result.output
        assert result.stderr == (f"error: interrupted ({name}); the restore was stopped before it changed "
                                 f"{tmp_path / name}\n")
        assert "Aborted" not in result.output


def test_sigterm_of_a_restore_subprocess_exits_143_with_one_line_and_leaves_nothing(tmp_path, sources):
    source, _ = sources[1]
    big = tmp_path / "big"  # enough partitions that the restore is still copying when the signal comes
    for n in range(40):
        for folder in sorted(source.glob(f"{TOPIC}-*")):
            shutil.copytree(folder, big / f"{TOPIC}-{n * 5 + int(folder.name.rsplit('-', 1)[1])}")
    directory = tmp_path / "data"
    for signum, status in ((signal.SIGTERM, 143), (signal.SIGINT, 130)):
        process = subprocess.Popen([sys.executable, "-m", "materializer", "restore", "--from-log-dir", str(big),
                                    "--topic", TOPIC, "--data-dir", str(directory), "--config",
                                    "segment.index.bytes=65536"], stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 30
        while not list(directory.glob(".staging-*/state")) and time.monotonic() < deadline:
            time.sleep(0.01)
        process.send_signal(signum)
        _, stderr = process.communicate(timeout=60)
        assert process.returncode == status, stderr
        assert stderr.count("\n") == 1 and stderr.startswith(f"error: interrupted ({signal.Signals(signum).name})")
        assert not directory.exists() or not list(directory.glob(".staging-*"))
        assert _export(directory)[0] == 2


# -- readers write nothing ---------------------------------------------------------------------------

_READERS = textwrap.dedent("""
    import json, sys
    from pathlib import Path
    from click.testing import CliRunner
    from materializer.cli import main
    from materializer.view import MaterializedView
    from materializer.spark.split_reader import read_split
    from materializer.spark.splits import plan_splits
    directory, key = sys.argv[1], sys.argv[2]
    export = CliRunner().invoke(main, ["export", "--data-dir", directory, "--topic", "fuzz"])
    get = CliRunner().invoke(main, ["get", "--data-dir", directory, "--topic", "fuzz", "--partition", "0", key])
    with MaterializedView.open(directory, "fuzz") as view:
        view_count = view.count()
        view.catch_up()
    rows = sum(batch.num_rows for split in plan_splits([directory], "fuzz") for batch in read_split(split, True))
    print(json.dumps({"export": [export.exit_code, export.stdout, export.stderr],
                      "get": [get.exit_code, get.stdout, get.stderr], "view": view_count, "kafkalog": rows}))
""")


def _read_everything(directory: Path, key: str, read_only_mount: bool) -> dict:
    """Run every reader on ``directory`` in a child process; with ``read_only_mount``, on a read-only
    bind mount of it made in a mount namespace of its own (``unshare -m``; ``-r`` too when not root:
    a user namespace maps us to root there)."""
    command = [sys.executable, "-c", _READERS]
    if not read_only_mount:
        result = subprocess.run([*command, str(directory), key], capture_output=True, text=True, timeout=120)
    else:
        target = directory.parent / "read-only"
        target.mkdir(exist_ok=True)
        script = ('mount --bind "$1" "$2" || exit 64; mount -o remount,bind,ro "$2" || exit 64; '
                  'if touch "$2/probe" 2>/dev/null; then echo "the bind mount is writable" >&2; exit 65; fi; '
                  'shift 2; exec "$@"')
        unshare = ["unshare", "-m"] if os.geteuid() == 0 else ["unshare", "-rm"]
        result = subprocess.run([*unshare, "sh", "-c", script, "sh", str(directory), str(target), *command,
                                 str(target), key], capture_output=True, text=True, timeout=120)
        if result.returncode in (64, 65):
            pytest.fail(f"cannot make a read-only bind mount with {' '.join(unshare)} (needed: root, or user "
                        f"namespaces): {result.stderr[-800:]}")
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout)


def test_readers_work_on_a_read_only_mount_and_write_nothing(tmp_path, sources):
    source, expected = sources[1]
    directory = tmp_path / "data"
    restore_from_log_dir(source, TOPIC, directory, options=_OPTIONS)
    key = next(k for (p, k) in sorted(expected) if p == 0).decode()
    for path in directory.rglob("*"):  # an old mtime: a rewrite shows however coarse the file system's clock
        if path.is_file() and not path.is_symlink():
            os.utime(path, ns=(10**18, 10**18))
    before = _files(directory)
    writable = _read_everything(directory, key, read_only_mount=False)
    assert _files(directory) == before  # rocksdict-config.json, MANIFEST, OPTIONS: nothing rewritten
    mounted = _read_everything(directory, key, read_only_mount=True)
    assert _files(directory) == before
    for read, where in ((writable, directory), (mounted, tmp_path / "read-only")):  # a restore keeps no lease
        assert read["export"][2] == f"topic {TOPIC!r} in {where}{_NO_LEASE}", read["export"][2]
        read["export"][2] = ""
    assert mounted == writable
    assert mounted["export"][0] == 0 and mounted["export"][2] == "" and len(mounted["export"][1].splitlines()) == \
        len(expected) == mounted["view"]
    assert mounted["get"][0] == 0
    assert mounted["kafkalog"] > 0


def test_kafkalog_refuses_a_topic_being_swapped_and_a_split_whose_data_was_replaced(tmp_path, sources):
    from materializer.spark.split_reader import read_split
    from materializer.spark.splits import plan_splits

    (old_source, _), (new_source, _) = sources[1], sources[2]
    directory = tmp_path / "data"
    restore_from_log_dir(old_source, TOPIC, directory, options=_OPTIONS)
    splits = plan_splits([directory], TOPIC)
    generation = topic_status(directory, TOPIC).generation
    assert generation and {s.generation for s in splits} == {generation}
    mark_incomplete(directory, TOPIC, "`materializer restore --from-log-dir` swapping the new data in", "wait",
                    generation="next")
    with pytest.raises(IncompleteDataDirError, match="swapping the new data in"):
        plan_splits([directory], TOPIC)
    with pytest.raises(IncompleteDataDirError, match="swapping the new data in"):
        list(read_split(splits[0], False))
    mark_complete(directory, TOPIC)
    restore_from_log_dir(new_source, TOPIC, directory, options=RestoreOptions(**{**_OPTIONS.__dict__,
                                                                                  "overwrite": True}))
    with pytest.raises(IncompleteDataDirError, match="was replaced .* run the query again"):
        list(read_split(splits[0], False))
    assert sum(b.num_rows for s in plan_splits([directory], TOPIC) for b in read_split(s, False)) > 0


# -- spark compact's output ----------------------------------------------------------------------------

class _InProcessSpark:
    """Just enough of a SparkSession for :func:`spark_compact`: its tasks run here, one after another
    (``stop_after``: raise KeyboardInterrupt, as Ctrl-C in the driver would, after that many tasks)."""

    def __init__(self, stop_after: int | None = None) -> None:
        self.sparkContext = self
        self.stop_after = stop_after
        self._work: list = []
        self._function = None

    def parallelize(self, work, slices):
        self._work = list(work)
        return self

    def map(self, function):
        self._function = function
        return self

    def collect(self):
        rows = []
        for n, item in enumerate(self._work):
            if self.stop_after is not None and n == self.stop_after:
                raise KeyboardInterrupt()
            rows.append(self._function(item))
        return rows


def test_spark_compact_locks_out_and_marks_it_complete_last(tmp_path, sources, holder_process):
    from materializer.spark.splits import plan_splits
    from materializer.spark.compact import spark_compact

    source, expected = sources[1]
    out = tmp_path / "out"
    holder = holder_process(out, "run")
    with pytest.raises(DataDirLockedError, match=rf"`materializer run` \(pid {holder.pid}, "):
        spark_compact(_InProcessSpark(), [source], TOPIC, out, overwrite=True, to_log_end=True)
    assert sorted(p.name for p in out.iterdir()) == [".lock"]
    holder.kill()
    holder.wait()

    with pytest.raises(KeyboardInterrupt):
        spark_compact(_InProcessSpark(stop_after=2), [source], TOPIC, out, overwrite=True, to_log_end=True)
    with pytest.raises(IncompleteDataDirError, match=rf"spark compact --topic {TOPIC} --out {re.escape(str(out))} "
                                                     r"--overwrite` again"):
        plan_splits([out], TOPIC)
    assert len(list(out.glob(f"{TOPIC}-*"))) == 2  # two of five partitions: refused, not served

    results = spark_compact(_InProcessSpark(), [source], TOPIC, out, overwrite=True, to_log_end=True)
    assert len(results) == 5 and topic_status(out, TOPIC).state == "complete"
    assert plan_splits([out], TOPIC) and _latest_per_partition(out, TOPIC) == expected


def test_compact_stopped_by_sigterm_or_sigint_exits_with_one_line_and_a_valid_log(tmp_path, sources):
    from materializer.storage.log_config import LogConfig

    source, _ = sources[1]
    template = tmp_path / "template"  # enough partitions that compact is still cleaning when the signal comes
    for n in range(30):
        for folder in sorted(source.glob(f"{TOPIC}-*")):
            shutil.copytree(folder, template / f"{TOPIC}-{n * 5 + int(folder.name.rsplit('-', 1)[1])}")
    (template / "topic-configs").mkdir()
    LogConfig(cleanup_policy=("compact",), segment_bytes=1500, segment_index_bytes=65536,
              min_cleanable_dirty_ratio=0.01).save(template / "topic-configs" / f"{TOPIC}.json")
    reference = _latest_per_partition(template, TOPIC)
    for signum, status in ((signal.SIGTERM, 143), (signal.SIGINT, 130)):
        for attempt in range(3):  # on a machine loaded enough for compact to finish first, again
            directory = tmp_path / f"{signal.Signals(signum).name}-{attempt}"
            shutil.copytree(template, directory)
            process = subprocess.Popen([sys.executable, "-m", "materializer", "compact", "--data-dir",
                                        str(directory), "--topic", TOPIC, "--quiet"], stdout=subprocess.DEVNULL,
                                       stderr=subprocess.PIPE, text=True)
            deadline = time.monotonic() + 60
            while not (directory / "cleaner-offset-checkpoint").exists() and time.monotonic() < deadline:
                time.sleep(0.005)  # the first partitions are cleaned: stop it among the others
            process.send_signal(signum)
            _, stderr = process.communicate(timeout=60)
            if process.returncode != 0:
                break
        assert process.returncode == status, stderr
        assert stderr.count("\n") == 1 and stderr.startswith(
            f"error: interrupted ({signal.Signals(signum).name}); the local logs are valid"), stderr
        assert _latest_per_partition(directory, TOPIC) == reference  # opened as the next command opens them
        assert not [p for p in directory.rglob("*") if p.suffix in (".cleaned", ".swap")]
        DataDirLock.acquire(directory, "run").release()  # the lock was released with the process


# Loaded (as sitecustomize) by the command only: the first import of HOLD_MODULE writes
# LOADING_MARKER and waits for LOADING_GO. click: the command line loading; rocksdict: RocksDB,
# which a command imports when it first needs it (export: as it opens the store; the command line
# itself loads no Kafka client nor RocksDB, issue 42).
_HOLD_LOADING = textwrap.dedent("""
    import os, sys, time

    class _HoldFirstHeavyImport:
        held = False

        def find_spec(self, name, path=None, target=None):
            if not self.held and name == os.environ["HOLD_MODULE"]:
                self.held = True
                open(os.environ["LOADING_MARKER"], "a").close()
                deadline = time.monotonic() + 60
                while not os.path.exists(os.environ["LOADING_GO"]) and time.monotonic() < deadline:
                    time.sleep(0.005)
            return None  # the usual finders import it

    sys.meta_path.insert(0, _HoldFirstHeavyImport())
""")


@pytest.mark.parametrize(("held", "said"), [("click", " while the command line loaded"), ("rocksdict", "")])
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_while_the_command_line_loads_exits_with_one_line(tmp_path, signum, held, said):
    hook, loading, go = tmp_path / "hook", tmp_path / "loading", tmp_path / "go"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(_HOLD_LOADING)
    env = {**os.environ, "LOADING_MARKER": str(loading), "LOADING_GO": str(go), "HOLD_MODULE": held,
           "PYTHONPATH": os.pathsep.join(filter(None, [str(hook), os.environ.get("PYTHONPATH")]))}
    process = subprocess.Popen([sys.executable, "-m", "materializer", "export", "--data-dir", str(tmp_path),
                                "--topic", TOPIC], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.monotonic() + 60
    while not loading.exists():  # Python is up, `held` is being imported
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, "the command line never reached its heavy imports"
        time.sleep(0.005)
    process.send_signal(signum)
    go.touch()  # the import goes on, or is cut by the signal: either way the command stops with one line
    out, err = process.communicate(timeout=60)
    name = signal.Signals(signum).name
    assert (process.returncode, out, err) == (128 + signum, "", f"error: interrupted ({name}){said}\n")


_CONTENDER = textwrap.dedent("""
    import os, sys, time
    from materializer.datadir import lock as lock_module
    from materializer.datadir.lock import DataDirLock
    from materializer.storage.errors import DataDirLockedError
    lock_module._PROBE_GRACE_S = 0.0  # refused at once, not after a reader's probe grace: contention shows as refusals
    directory, holds, go = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    open(f"{go}.ready-{os.getpid()}", "w").close()  # imported: the test starts them all together
    while not os.path.exists(go):  # every contender imported and waiting: they start together
        time.sleep(0.005)
    held = refused = 0
    deadline = time.monotonic() + 100
    while held < holds:  # a count of holds, not of attempts: the same contention on a loaded machine
        if time.monotonic() > deadline:
            sys.exit(f"held the lock {held} of {holds} times in 100 s ({refused} refusals)")
        try:
            lock = DataDirLock.acquire(directory, "run")
        except DataDirLockedError as exc:
            assert "is being written by" in str(exc), exc
            refused += 1
            continue
        # exclusive: a second holder's O_EXCL create fails; removed again, so release removes DIR
        fd = os.open(os.path.join(directory, "holder"), os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        os.close(fd)
        os.unlink(os.path.join(directory, "holder"))
        lock.release()
        held += 1
    print(held, refused)
""")


def test_writers_racing_on_a_data_dir_each_created_and_removed_again_hold_it_one_at_a_time(tmp_path):
    directory, go = tmp_path / "data", tmp_path / "go"
    processes = [subprocess.Popen([sys.executable, "-c", _CONTENDER, str(directory), "50", str(go)],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(6)]
    deadline = time.monotonic() + 60  # every contender imported (a loaded machine staggers the imports)
    while len(list(tmp_path.glob("go.ready-*"))) < len(processes):
        assert all(process.poll() is None for process in processes), [p.communicate() for p in processes]
        assert time.monotonic() < deadline, "the contenders did not all start in 60 s"
        time.sleep(0.01)
    go.touch()
    results = [process.communicate(timeout=120) for process in processes]
    for process, (_, err) in zip(processes, results):
        assert process.returncode == 0, err[-2000:]  # no FileNotFoundError, no second holder
    assert sum(int(out.split()[1]) for out, _ in results) > 0  # they did contend
    # the DIR a holder created is removed on release when nothing else is in it; a holder that found
    # it made by another leaves it (and its lock file): never anything else
    assert not directory.exists() or os.listdir(directory) == [".lock"]
