"""One local JVM service: launched, awaited, stopped and found again by pid. The lifecycle
:class:`~materializer.local.kafka_broker.LocalKafkaBroker` and
:class:`~materializer.local.schema_registry.LocalSchemaRegistry` share, written once.

States of a :class:`JvmService` handle (``pid`` is None exactly in the first and the last)::

    new ──start()──> launching ──probe answers──> running ──stop()──> stopped
                        │                                               ^
                        └── JVM exits, or no answer in time: stop() ────┘ (error raised)
    attach(state_dir) ──> running   (the JVM another process started, found by its state file)

``stop()`` is idempotent and also works on a handle that only knows ``state_dir``.

Files in ``state_dir``::

    <state_file>          JSON {pid, <the service's fields>, detached}: written after launch,
                          removed by stop(); what attach() and the CLI's status read
    <output_files[0]>     the JVM's stdout and stderr (appended); the other output files are
                          logs the JVM writes itself; all are quoted (their tails since the last
                          launch) in the error when a start fails

Process: the JVM leads its own session and process group (``start_new_session``), so stop()
signals the whole group: SIGTERM, then SIGKILL after the timeout. Unless started ``detach``-ed,
the JVM also gets SIGTERM when the Python process that launched it dies (Linux
``prctl(PR_SET_PDEATHSIG)``), so a killed test run leaves no JVM behind. A pid is taken as this
service's only when its ``/proc/<pid>/cmdline`` holds the service's identity arguments (pids are
reused); without ``/proc`` (not Linux) the state file is trusted.

Not thread-safe: one handle belongs to one thread.
"""

from __future__ import annotations

import abc
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, ClassVar, Mapping, Self, Sequence

__all__ = ["JvmService", "KILL_WAIT_S", "pid_alive", "find_java", "tail_text", "tail_file"]

#: Seconds a process may take to go away after SIGKILL before stop() gives up.
KILL_WAIT_S = 10.0
#: Seconds between two readiness probes while a JVM starts.
_PROBE_INTERVAL_S = 0.2


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie (an exited child not yet reaped).

    A process of another user (``EPERM``) counts as alive.
    """
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def find_java(*, what: str, error: type[Exception]) -> str:
    """Path of the ``java`` launcher: ``$JAVA_HOME/bin/java`` if present, else ``java`` on PATH.

    Raises:
        ``error``: no Java runtime found (the message says ``what`` needs Java 17 or newer).
    """
    java_home = os.environ.get("JAVA_HOME")
    if java_home and (Path(java_home) / "bin" / "java").is_file():
        return str(Path(java_home) / "bin" / "java")
    java = shutil.which("java")
    if java is None:
        raise error(f"No Java runtime: set JAVA_HOME or put 'java' (17 or newer) on PATH to run {what}.")
    return java


def tail_text(text: str, lines: int = 40) -> str:
    """The last ``lines`` lines of ``text``, stripped: what an error message quotes of a command's output."""
    return "\n".join(text.strip().splitlines()[-lines:])


def tail_file(path: Path, lines: int = 40, start_position: int = 0) -> str:
    """The last ``lines`` lines of ``path`` written at or after byte ``start_position`` (at most its
    last 64 KiB are read); ``"(missing)"`` when it cannot be read."""
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            handle.seek(max(start_position, handle.tell() - 64 * 1024))
            return tail_text(handle.read().decode("utf-8", "replace"), lines)
    except OSError:
        return "(missing)"


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _set_parent_death_signal() -> None:  # runs in the child between fork and exec (Linux only)
    try:
        import ctypes
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG
    except Exception:  # noqa: BLE001 - best effort; stop() and the fixtures' finalizers still clean up
        pass


class JvmService(abc.ABC):
    """A JVM this process launched (:meth:`_start_jvm`) or attached to by pid (:meth:`attach`).

    A service class sets the class attributes below and defines :meth:`start` (which prepares
    files and calls :meth:`_start_jvm`), :meth:`_address`, :meth:`_identity_args`, :meth:`_probe`,
    :meth:`_state` and :meth:`_from_state`; it may extend :meth:`_after_stop`.

    Attributes:
        state_dir: the service's folder (absolute).
        host: the address it listens on (loopback by default).
        pid: the JVM's pid while launching or running, else None.
        startup_s: seconds from launch to the first answer of the last :meth:`start`, else None.
    """

    #: The service in messages: ``"broker"``, ``"schema registry"``.
    service_name: ClassVar[str]
    #: The state file in ``state_dir``: ``"broker.json"``.
    state_file: ClassVar[str]
    #: The state file's field holding :attr:`address` (quoted when a second start is refused).
    address_key: ClassVar[str]
    #: Files (relative to ``state_dir``) quoted when a start fails, with how many last lines each;
    #: the JVM's stdout and stderr are appended to the first.
    output_files: ClassVar[tuple[tuple[str, int], ...]]
    #: The error every failure raises (the service's provisioning error).
    provisioning_error: ClassVar[type[Exception]]
    #: Seconds :meth:`is_running` lets the probe take by default.
    status_probe_s: ClassVar[float] = 5.0

    def __init__(self, state_dir: Path | str, *, host: str = "127.0.0.1") -> None:
        self.state_dir = Path(state_dir).resolve()
        self.host = host
        self.pid: int | None = None
        self.startup_s: float | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._log_positions: dict[str, int] = {}  # output file -> its size in bytes at the last launch
        self._launched_at = 0.0  # time.monotonic() of the last launch

    @property
    def address(self) -> str:
        """Where clients reach the service (``host:port``, a URL).

        Raises:
            ``provisioning_error``: not started or attached.
        """
        address = self._address()
        if address is None:
            raise self.provisioning_error(f"{self.service_name} in {self.state_dir} is not started")
        return address

    # -- what a service defines ---------------------------------------------------------------

    @abc.abstractmethod
    def start(self, timeout_s: float = 60.0, *, detach: bool = False) -> Self:
        """Prepare, launch the JVM and wait until it answers (see :meth:`_start_jvm`)."""

    @abc.abstractmethod
    def _address(self) -> str | None:
        """:attr:`address`, or None while the service has no port yet."""

    @abc.abstractmethod
    def _identity_args(self) -> tuple[str, ...]:
        """Arguments only this service's JVM for this ``state_dir`` has on its command line."""

    @abc.abstractmethod
    def _probe(self, timeout_s: float) -> bool:
        """Whether the service answers a client's request within ``timeout_s`` seconds."""

    @abc.abstractmethod
    def _state(self) -> dict[str, Any]:
        """The state file's fields besides ``pid`` and ``detached`` (JSON values)."""

    @classmethod
    @abc.abstractmethod
    def _from_state(cls, state_dir: Path, state: Mapping[str, Any]) -> Self:
        """A handle configured from a state file's fields (:meth:`attach` sets its pid)."""

    def _after_stop(self) -> None:  # noqa: B027 - an optional hook: most services have nothing to do
        """Called by :meth:`stop` once the JVM is gone, before the state file is removed."""

    # -- public lifecycle ---------------------------------------------------------------------

    @classmethod
    def read_state(cls, state_dir: Path | str) -> dict[str, Any] | None:
        """The state file in ``state_dir`` as a dict, or None when it is absent or not JSON."""
        try:
            state = json.loads((Path(state_dir) / cls.state_file).read_text())
        except (OSError, ValueError):
            return None
        return state if isinstance(state, dict) else None

    @classmethod
    def attach(cls, state_dir: Path | str) -> Self:
        """A handle on the service recorded in ``state_dir``'s state file, started by any process.

        Raises:
            ``provisioning_error``: no state file, or its pid is not a live JVM of this service
                for this ``state_dir``.
        """
        path = Path(state_dir) / cls.state_file
        state = cls.read_state(state_dir)
        if state is None:
            raise cls.provisioning_error(f"no {cls.service_name} recorded in {path}")
        service = cls._from_state(Path(state_dir), state)
        pid = service.pid = int(state["pid"])
        if not (pid_alive(pid) and service._is_ours(pid)):
            raise cls.provisioning_error(f"{cls.service_name} pid {pid} from {path} is not running")
        return service

    def is_running(self, timeout_s: float | None = None) -> bool:
        """True when the pid is a live JVM of this service for ``state_dir`` and it answers a
        probe within ``timeout_s`` seconds (default :attr:`status_probe_s`)."""
        if self.pid is None or not (pid_alive(self.pid) and self._is_ours(self.pid)):
            return False
        return self._probe(self.status_probe_s if timeout_s is None else timeout_s)

    def stop(self, timeout_s: float = 30.0) -> None:
        """SIGTERM the JVM's process group, wait up to ``timeout_s`` seconds, then SIGKILL. Idempotent.

        Works on a handle that did not start the JVM: the pid comes from the state file then, and
        is signalled only when it is this service's (:meth:`_identity_args`). Removes the state file.

        Raises:
            ``provisioning_error``: the process survived SIGKILL for :data:`KILL_WAIT_S` seconds.
        """
        pid = self.pid
        if pid is None:
            state = self.read_state(self.state_dir)
            pid = int(state["pid"]) if state else None
        if pid is not None and pid_alive(pid) and (self._process is not None or self._is_ours(pid)):
            _signal_group(pid, signal.SIGTERM)
            if not self._wait_exit(pid, timeout_s):
                _signal_group(pid, signal.SIGKILL)
                if not self._wait_exit(pid, KILL_WAIT_S):
                    raise self.provisioning_error(f"{self.service_name} pid {pid} survived SIGKILL")
        if self._process is not None:
            self._process.wait(timeout=KILL_WAIT_S)  # reap it
            self._process = None
        self._after_stop()
        self.pid = None
        (self.state_dir / self.state_file).unlink(missing_ok=True)

    def __enter__(self) -> Self:
        if self.pid is None:
            self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # -- for a service's start() --------------------------------------------------------------

    def _refuse_second_start(self) -> None:
        """Raises ``provisioning_error`` when the state file names a live JVM of this service."""
        existing = self.read_state(self.state_dir)
        if existing and pid_alive(int(existing["pid"])) and self._is_ours(int(existing["pid"])):
            raise self.provisioning_error(
                f"a {self.service_name} (pid {existing['pid']}, {existing.get(self.address_key)}) is already "
                f"running in {self.state_dir}; stop it first")

    def _start_jvm(self, cmd: Sequence[str], *, cwd: Path, detach: bool, timeout_s: float,
                   env: Mapping[str, str] | None = None) -> None:
        """Launch ``cmd`` (the whole ``java ...`` command line), write the state file, and wait up to
        ``timeout_s`` seconds for :meth:`_probe` to answer. On failure the JVM is stopped.

        Args:
            cmd: the command line; must contain :meth:`_identity_args`.
            cwd: the JVM's working directory.
            detach: leave the JVM running when this process exits (no parent-death signal).
            timeout_s: seconds from launch to the first answer.
            env: the JVM's environment (default: this process's).

        Raises:
            ``provisioning_error``: the JVM exited during start-up or did not answer in time; the
                message ends with the tails of :attr:`output_files` written since this launch.
        """
        self._launch_jvm(cmd, cwd=cwd, detach=detach, env=env)
        self._await_jvm(timeout_s)

    def _launch_jvm(self, cmd: Sequence[str], *, cwd: Path, detach: bool,
                    env: Mapping[str, str] | None = None) -> None:
        """The first half of :meth:`_start_jvm`: launch ``cmd`` and write the state file, without waiting.

        Call it from the thread that stays alive as long as the JVM should: Linux sends the
        parent-death signal when the launching *thread* exits, not only the process.
        """
        self._log_positions = {name: _size(self.state_dir / name) for name, _ in self.output_files}
        self._launched_at = time.monotonic()
        with open(self.state_dir / self.output_files[0][0], "ab") as out:
            self._process = subprocess.Popen(
                list(cmd), cwd=cwd, env=None if env is None else dict(env), stdin=subprocess.DEVNULL, stdout=out,
                stderr=subprocess.STDOUT, start_new_session=True,
                preexec_fn=None if detach or sys.platform != "linux" else _set_parent_death_signal)
        self.pid = self._process.pid
        self._write_state(detach)

    def _await_jvm(self, timeout_s: float) -> None:
        """The second half of :meth:`_start_jvm`: wait up to ``timeout_s`` seconds (from the launch)
        for :meth:`_probe`; on failure the JVM is stopped and ``provisioning_error`` raised. Any thread."""
        try:
            self._wait_ready(max(0.0, timeout_s - (time.monotonic() - self._launched_at)))
        except BaseException:
            self.stop()
            raise
        self.startup_s = time.monotonic() - self._launched_at

    def _output_since_launch(self) -> str:
        """What the JVM wrote to :attr:`output_files` since the last launch, concatenated."""
        text = []
        for name, _ in self.output_files:
            try:
                with open(self.state_dir / name, "rb") as file:
                    file.seek(self._log_positions.get(name, 0))
                    text.append(file.read().decode("utf-8", "replace"))
            except OSError:
                continue
        return "\n".join(text)

    # -- internals ------------------------------------------------------------------------------

    def _wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            code = self._process.poll() if self._process is not None else None
            if code is not None:
                raise self.provisioning_error(self._failure(
                    f"the {self.service_name} JVM exited with code {code} during startup"))
            if self._probe(min(3.0, max(0.5, deadline - time.monotonic()))):
                return
            if time.monotonic() >= deadline:
                raise self.provisioning_error(self._failure(
                    f"the {self.service_name} did not answer on {self.address} within {timeout_s:.0f} s"))
            time.sleep(_PROBE_INTERVAL_S)

    def _failure(self, headline: str) -> str:
        parts = [f"{headline} (state dir {self.state_dir})"]
        for name, lines in self.output_files:
            parts += [f"--- {name} (tail) ---", tail_file(self.state_dir / name, lines, self._log_positions.get(name, 0))]
        return "\n".join(parts)

    def _write_state(self, detached: bool) -> None:
        state = {"pid": self.pid, **self._state(), "detached": detached}
        tmp = self.state_dir / (self.state_file + ".tmp")
        tmp.write_text(json.dumps(state, indent=2) + "\n")
        tmp.replace(self.state_dir / self.state_file)  # readers never see half a file

    def _is_ours(self, pid: int) -> bool:
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            return sys.platform != "linux"  # no /proc: trust the state file
        return all(arg.encode() in cmdline for arg in self._identity_args())

    def _wait_exit(self, pid: int, timeout_s: float) -> bool:
        """Whether ``pid`` is gone within ``timeout_s`` seconds (a child of ours is reaped)."""
        if self._process is not None and self._process.pid == pid:
            try:
                self._process.wait(timeout=timeout_s)
                return True
            except subprocess.TimeoutExpired:
                return False
        deadline = time.monotonic() + timeout_s
        while pid_alive(pid):
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.1)
        return True


def _signal_group(pid: int, sig: signal.Signals) -> None:
    """``sig`` to the process group ``pid`` leads, or to ``pid`` alone when it leads none."""
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass
