"""The JVM service lifecycle the local broker and registry share (:mod:`materializer.local.jvm_service`),
driven with a Python stand-in process (:mod:`.stand_in`): readiness, failures with the output's
tail, SIGTERM then SIGKILL, the whole process group, attach by pid, pid reuse, the parent-death signal."""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import pytest

from materializer.local.jvm_service import pid_alive, tail_file
from materializer.local.ports import free_port
from tests.unit.local.stand_in import StandInError, StandInService, kill_stand_ins_under

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(autouse=True)
def _no_stand_in_left(tmp_path: Path) -> Iterator[None]:
    yield
    kill_stand_ins_under(tmp_path)


def _wait_dead(pid: int, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while pid_alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _pid_in(message: str) -> int:
    found = re.search(r"stand-in pid (\d+)", message)
    assert found, message
    return int(found.group(1))


def test_start_waits_for_the_first_answer_and_records_the_service(tmp_path: Path) -> None:
    service = StandInService(tmp_path / "svc", options=("--delay=1.0",)).start()
    try:
        assert service.startup_s is not None and service.startup_s >= 1.0  # it waited for the listener
        assert service.pid is not None and pid_alive(service.pid) and service.is_running()
        state = json.loads((tmp_path / "svc" / "stand-in.json").read_text())
        assert state == {"pid": service.pid, "address": service.address, "port": service.port, "detached": False}
        attached = StandInService.attach(tmp_path / "svc")
        assert (attached.pid, attached.address) == (service.pid, service.address) and attached.is_running()
        attached.port = free_port()  # its process lives, but nothing answers there
        assert not attached.is_running()
    finally:
        service.stop()
    assert service.pid is None and not (tmp_path / "svc" / "stand-in.json").exists()
    with pytest.raises(StandInError, match="no stand-in recorded in .*stand-in.json"):
        StandInService.attach(tmp_path / "svc")


def test_an_exit_during_startup_is_an_error_quoting_the_output_of_this_launch(tmp_path: Path) -> None:
    (tmp_path / "svc").mkdir()
    (tmp_path / "svc" / "stand-in.out").write_text("fatal: from an earlier run\n")
    service = StandInService(tmp_path / "svc", options=("--exit=3",))
    with pytest.raises(StandInError, match="stand-in JVM exited with code 3 during startup") as info:
        service.start()
    message = str(info.value)
    assert "--- stand-in.out (tail) ---" in message and "fatal: boom" in message
    assert "earlier run" not in message  # only what this launch wrote
    assert service.pid is None and not (tmp_path / "svc" / "stand-in.json").exists()
    assert "earlier run" in (tmp_path / "svc" / "stand-in.out").read_text()  # the output is appended to


def test_no_answer_in_time_stops_the_process(tmp_path: Path) -> None:
    service = StandInService(tmp_path / "svc", options=("--delay=60",))
    started = time.monotonic()
    with pytest.raises(StandInError, match=r"stand-in did not answer on 127\.0\.0\.1:\d+ within 1 s") as info:
        service.start(timeout_s=1.0)
    assert time.monotonic() - started < 10
    assert _wait_dead(_pid_in(str(info.value)), 0.0)  # stopped before the error was raised
    assert service.pid is None and not (tmp_path / "svc" / "stand-in.json").exists()


def test_stop_sends_sigkill_when_sigterm_is_ignored(tmp_path: Path) -> None:
    service = StandInService(tmp_path / "svc", options=("--ignore-term",)).start()
    process = service._process
    assert process is not None
    started = time.monotonic()
    service.stop(timeout_s=0.5)
    assert process.returncode == -signal.SIGKILL
    assert 0.5 <= time.monotonic() - started < 10


def test_stop_sends_sigterm_first(tmp_path: Path) -> None:
    service = StandInService(tmp_path / "svc").start()
    process = service._process
    assert process is not None
    service.stop(timeout_s=30)
    assert process.returncode == -signal.SIGTERM


def test_stop_ends_the_whole_process_group(tmp_path: Path) -> None:
    child_pid_file = tmp_path / "child.pid"
    service = StandInService(tmp_path / "svc", options=(f"--child-pid-file={child_pid_file}",)).start()
    child = int(child_pid_file.read_text())
    assert pid_alive(child)
    service.stop()
    assert _wait_dead(child)


def test_a_handle_on_the_state_dir_alone_stops_a_detached_service(tmp_path: Path) -> None:
    service = StandInService(tmp_path / "svc").start(detach=True)
    pid = service.pid
    assert pid is not None and json.loads((tmp_path / "svc" / "stand-in.json").read_text())["detached"] is True
    with pytest.raises(StandInError, match=rf"a stand-in \(pid {pid}, 127\.0\.0\.1:\d+\) is already running"):
        StandInService(tmp_path / "svc").start()
    StandInService(tmp_path / "svc").stop()  # as `materializer broker stop` does, from another process
    assert _wait_dead(pid) and not (tmp_path / "svc" / "stand-in.json").exists()


def test_a_recorded_pid_that_is_another_process_is_never_signalled(tmp_path: Path) -> None:
    """Pids are reused: a state file left by a killed service may name an unrelated process."""
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        with socket.socket() as listener:  # something answers on the recorded port, too
            listener.bind(("127.0.0.1", 0))
            listener.listen()
            port = listener.getsockname()[1]
            (tmp_path / "stand-in.json").write_text(json.dumps({"pid": other.pid, "port": port, "address": "x"}))
            with pytest.raises(StandInError, match=rf"stand-in pid {other.pid} from .*stand-in.json is not running"):
                StandInService.attach(tmp_path)
            handle = StandInService(tmp_path, port=port)
            handle.pid = other.pid
            assert handle._probe(1.0) and not handle.is_running()
        StandInService(tmp_path).stop()
        assert other.poll() is None  # still running
        assert not (tmp_path / "stand-in.json").exists()  # the stale record is gone
    finally:
        other.kill()
        other.wait()


def test_context_manager_starts_and_stops(tmp_path: Path) -> None:
    with StandInService(tmp_path / "svc") as service:
        pid = service.pid
        assert pid is not None and service.is_running()
    assert _wait_dead(pid, 0.0)


_LAUNCHER = """
import sys, time
sys.path.append(sys.argv[3])  # the checkout, for tests.*: after site-packages, whose materializer wins
from tests.unit.local.stand_in import StandInService
service = StandInService(sys.argv[1]).start(detach=sys.argv[2] == "detach")
print(service.pid, flush=True)
time.sleep(600)
"""


@pytest.mark.parametrize("detach", [False, True])
def test_the_service_dies_with_its_launcher_unless_detached(tmp_path: Path, detach: bool) -> None:
    launcher = subprocess.Popen([sys.executable, "-c", _LAUNCHER, str(tmp_path / "svc"), "detach" if detach else "",
                                 str(REPO)], cwd=tmp_path, stdout=subprocess.PIPE, text=True)
    try:
        assert launcher.stdout is not None
        pid = int(launcher.stdout.readline())
        assert pid_alive(pid)
    finally:
        launcher.kill()
        launcher.wait()
    try:
        if detach:
            time.sleep(1.0)
            assert pid_alive(pid) and StandInService.attach(tmp_path / "svc").is_running()
        else:
            assert _wait_dead(pid)
    finally:
        StandInService(tmp_path / "svc").stop()
    assert _wait_dead(pid, 0.0)


def test_tail_file_reads_from_a_position(tmp_path: Path) -> None:
    log = tmp_path / "out"
    log.write_text("old 1\nold 2\n")
    start = log.stat().st_size
    with log.open("a") as file:
        file.write("".join(f"new {i}\n" for i in range(50)))
    assert tail_file(log, 3, start) == "new 47\nnew 48\nnew 49"
    assert "old" not in tail_file(log, 100, start) and tail_file(log, 100, start).startswith("new 0")
    assert tail_file(tmp_path / "absent") == "(missing)"
