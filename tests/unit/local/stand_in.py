"""A stand-in for a JVM service: a Python process with the same lifecycle knobs (slow start, an exit
during start-up, SIGTERM ignored, a child in its process group), driven through
:class:`~materializer.local.jvm_service.JvmService` exactly as the broker and the registry are.

Run as a script it is the service process::

    python stand_in.py --state-dir=DIR --port=P [--delay=S] [--exit=CODE] [--ignore-term] [--child-pid-file=F]

It prints ``stand-in pid N``, sleeps ``--delay`` seconds, then exits with ``--exit`` (after printing
``fatal: boom``) or listens on 127.0.0.1:P until a signal ends it.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Mapping, Self

from materializer.local.jvm_service import JvmService
from materializer.local.ports import free_port, port_answers


class StandInError(Exception):
    """The stand-in's provisioning error."""


class StandInService(JvmService):
    """A :class:`JvmService` whose process is this file run as a script; ``options`` are its flags."""

    service_name = "stand-in"
    state_file = "stand-in.json"
    address_key = "address"
    output_files = (("stand-in.out", 10),)
    provisioning_error = StandInError
    status_probe_s = 1.0

    def __init__(self, state_dir: Path | str, *, options: tuple[str, ...] = (), port: int | None = None) -> None:
        super().__init__(state_dir)
        self.options = options
        self.port = port

    def _address(self) -> str | None:
        return None if self.port is None else f"{self.host}:{self.port}"

    def start(self, timeout_s: float = 10.0, *, detach: bool = False) -> Self:
        self._refuse_second_start()
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.port = free_port(self.host)
        cmd = [sys.executable, __file__, *self._identity_args(), f"--port={self.port}", *self.options]
        self._start_jvm(cmd, cwd=self.state_dir, detach=detach, timeout_s=timeout_s)
        return self

    def _identity_args(self) -> tuple[str, ...]:
        return (f"--state-dir={self.state_dir}",)

    def _probe(self, timeout_s: float) -> bool:
        return self.port is not None and port_answers(self.host, self.port, timeout_s)

    def _state(self) -> dict[str, Any]:
        return {"address": self.address, "port": self.port}

    @classmethod
    def _from_state(cls, state_dir: Path, state: Mapping[str, Any]) -> Self:
        return cls(state_dir, port=int(state["port"]))


def kill_stand_ins_under(folder: Path) -> None:
    """SIGKILL every stand-in whose state dir lies under ``folder``, with its process group: what a
    failing test (one that breaks the lifecycle on purpose, or by a bug) would leave running."""
    marker = f"--state-dir={folder}".encode()
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(arg.startswith(marker) for arg in argv):
            for kill in (os.killpg, os.kill):
                try:
                    kill(int(proc.name), signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass


def _serve(argv: list[str]) -> None:
    flags = dict(arg.partition("=")[::2] for arg in argv)
    print(f"stand-in pid {os.getpid()}", flush=True)
    if "--ignore-term" in flags:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if "--child-pid-file" in flags:  # a child in the same process group (as a JVM's own helpers)
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        Path(flags["--child-pid-file"]).write_text(str(child.pid))
    time.sleep(float(flags.get("--delay") or 0))
    if "--exit" in flags:
        print("fatal: boom", flush=True)
        sys.exit(int(flags["--exit"]))
    with socket.socket() as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", int(flags["--port"])))
        listener.listen()
        print("listening", flush=True)
        while True:
            connection, _ = listener.accept()
            connection.close()


if __name__ == "__main__":
    _serve(sys.argv[1:])
