"""Group members that serve queries, as the serving tests start them: ``materializer run --group-id
G --serve ...`` subprocesses (:class:`ServingMember`), a group whose members time out fast
(:func:`fast_group`), and stopping a run as an operator does (:func:`stop_process`)."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType

from .background_run import wait_until

__all__ = ["DEADLINE_S", "ServingMember", "fast_group", "stop_process"]

DEADLINE_S = 120.0  # generous on a loaded 2-core machine; never a timing assertion


def stop_process(process: subprocess.Popen, grace_s: float = 60) -> None:
    """SIGTERM (a calm stop, as systemd or Kubernetes ask), SIGKILL after ``grace_s`` seconds."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(grace_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(30)


def fast_group(bootstrap: str, group: str) -> None:
    """KIP-848 group configs for tests: a 6 s ``consumer.session.timeout.ms`` and a 1 s heartbeat
    (the broker's defaults, 45 s and 5 s, would make a test wait for a dead member that long)."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    resource = ConfigResource(ResourceType.GROUP, group, incremental_configs=[
        ConfigEntry("consumer.session.timeout.ms", "6000", incremental_operation=AlterConfigOpType.SET),
        ConfigEntry("consumer.heartbeat.interval.ms", "1000", incremental_operation=AlterConfigOpType.SET)])
    admin.incremental_alter_configs([resource])[resource].result(timeout=30)


class ServingMember:
    """One ``materializer run --group-id GROUP --serve ...`` process (str values, murmur2, no cleaner
    threads, the token in ``token_file``) and the URL it printed (``serving queries on URL``).

    Args:
        serve: the serving options (default ``--serve 127.0.0.1:0``; TLS and advertise options here).
        scheme: ``http`` or ``https``, the URL awaited on stderr.

    Raises:
        AssertionError: the process exited, or printed no URL within :data:`DEADLINE_S`.
    """

    def __init__(self, bootstrap: str, topic: str, group: str, data_dir: Path, token_file: Path, *,
                 serve: tuple[str, ...] | list[str] = ("--serve", "127.0.0.1:0"), scheme: str = "http") -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "materializer", "run", "--bootstrap-servers", bootstrap, "--topic", topic,
             "--data-dir", str(data_dir), "--no-progress", "--value-format", "str", "--cleaner-threads", "0",
             "--group-id", group, "--partitioner", "murmur2", "--serve-token-file", str(token_file), *serve],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.stderr: list[str] = []
        threading.Thread(target=lambda: self.stderr.extend(iter(self.process.stderr.readline, "")),
                         daemon=True).start()
        printed = re.compile(rf"serving queries on ({scheme}://\S+)")
        found = wait_until(lambda: next((m for m in map(printed.search, list(self.stderr)) if m), None)
                           or (self.process.poll() is not None and "exited"), DEADLINE_S, "'serving queries on'")
        assert found != "exited", "".join(self.stderr)
        self.url: str = found.group(1)  # as bound (an advertised address may differ)
        self.port = int(self.url.rsplit(":", 1)[1])

    def stop(self) -> None:
        """:func:`stop_process`; a calm stop prints no traceback.

        Raises:
            AssertionError: the run printed a traceback.
        """
        stop_process(self.process)
        assert "Traceback" not in "".join(self.stderr), "".join(self.stderr)
