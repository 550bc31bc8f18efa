"""Crash harness: run the materializer in a child process and SIGKILL it at a chosen moment.

A *zygote* process (this file run as a script) imports the materializer, confluent-kafka and
rocksdict once and then, per command read from stdin, forks a child that runs
``Materializer(...).run(until_caught_up=True)``; the zygote SIGKILLs the child after the
requested delay (unless it finished first) and answers with the outcome. Forking a pre-imported,
thread-free process makes a kill cost milliseconds instead of a Python start-up, so a hundred
kills fit in a short test. The zygote starts no thread before forking (no Kafka client, no
RocksDB handle), so the fork is safe.

Protocol (one JSON object per line): request ``{"bootstrap_servers", "topic", "data_dir",
"kill_after_s", "options": {MaterializerOptions fields}}``; reply ``{"killed": bool,
"exit_code": int, "elapsed_s": float, "error": str}``.

:func:`check_after_crash` inspects a data directory the way the next run would see it, on a
copy (so the materializer's own recovery still gets exercised on the original).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

__all__ = ["CrashHarness", "RunOutcome", "PartitionCheck", "check_after_crash"]


class RunOutcome(NamedTuple):
    """One child run: killed or not, its exit code (-9 when killed), seconds it ran."""

    killed: bool
    exit_code: int
    elapsed_s: float
    error: str


class PartitionCheck(NamedTuple):
    """A partition after reopening: local log end offset, the store's next offset (None if
    absent), bytes recovery cut."""

    log_end_offset: int
    store_next_offset: int | None
    bytes_truncated: int


class CrashHarness:
    """Owns one zygote process; use as a context manager."""

    def __init__(self) -> None:
        self._process = subprocess.Popen([sys.executable, str(Path(__file__).resolve())], stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, text=True, bufsize=1)
        ready = self._process.stdout.readline()
        if ready.strip() != "ready":
            raise RuntimeError(f"crash harness zygote did not start: {ready!r}")

    def run(self, bootstrap_servers: str, topic: str, data_dir: Path, kill_after_s: float,
            options: dict | None = None) -> RunOutcome:
        """Run the materializer once in a forked child; SIGKILL it after ``kill_after_s`` seconds."""
        request = {"bootstrap_servers": bootstrap_servers, "topic": topic, "data_dir": str(data_dir),
                   "kill_after_s": kill_after_s, "options": options or {}}
        self._process.stdin.write(json.dumps(request) + "\n")
        self._process.stdin.flush()
        line = self._process.stdout.readline()
        if not line:
            raise RuntimeError("crash harness zygote exited")
        return RunOutcome(**json.loads(line))

    def close(self) -> None:
        """Stop the zygote (it exits at end of input)."""
        if self._process.poll() is None:
            self._process.stdin.close()
            try:
                self._process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()

    def __enter__(self) -> "CrashHarness":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def check_after_crash(data_dir: Path, topic: str, partitions: list[int], config) -> dict[int, PartitionCheck]:
    """Reopen a copy of ``data_dir`` as the next run would (log recovery, store) and report offsets.

    ``config`` is the topic's :class:`LogConfig` (the run re-reads it from the broker, so the
    ``topic-configs`` file is not trusted here).

    Raises:
        AssertionError: the state store is ahead of a recovered log.
    """
    from materializer.adapters.rocksdb_store import StateStore
    from materializer.datadir.layout import partition_dir, state_dir
    from materializer.storage.log import Log
    from materializer.storage.log_loader import has_clean_shutdown_file

    with tempfile.TemporaryDirectory(prefix="crash-check-") as scratch:
        copy = Path(scratch) / "data"
        shutil.copytree(data_dir, copy, ignore=shutil.ignore_patterns("LOCK"))
        clean = has_clean_shutdown_file(copy)
        offsets: dict[int, int] = {}
        if StateStore.exists(state_dir(copy, topic)):
            with StateStore(state_dir(copy, topic)) as store:
                offsets = store.offsets()
        result: dict[int, PartitionCheck] = {}
        for partition in partitions:
            folder = partition_dir(copy, topic, partition)
            if not folder.exists():
                result[partition] = PartitionCheck(0, offsets.get(partition), 0)
                continue
            log = Log.open(folder, config, had_clean_shutdown=clean)
            try:
                cut = sum(t.bytes_truncated for t in log.recovery_truncations)
                result[partition] = PartitionCheck(log.log_end_offset, offsets.get(partition), cut)
            finally:
                log.close()
        for partition, check in result.items():
            if check.store_next_offset is not None and check.store_next_offset > check.log_end_offset:
                raise AssertionError(f"state store of partition {partition} is at {check.store_next_offset}, "
                                     f"ahead of the recovered log end offset {check.log_end_offset} ({data_dir})")
        return result


# -- zygote -------------------------------------------------------------------------------------

def _child(request: dict) -> int:
    import logging

    from materializer.config import MaterializerOptions
    from materializer.materializer import Materializer

    logging.basicConfig(level=logging.ERROR, stream=sys.stderr)
    options = MaterializerOptions(progress=False, **request["options"])
    materializer = Materializer(request["bootstrap_servers"], request["topic"], Path(request["data_dir"]),
                                options=options)
    with materializer:
        materializer.run(until_caught_up=True)
    return 0


def _zygote() -> None:
    # Pre-import everything the child needs; start no thread.
    import confluent_kafka  # noqa: F401
    import rocksdict  # noqa: F401

    import materializer.materializer  # noqa: F401

    sys.stdout.write("ready\n")
    sys.stdout.flush()
    for line in sys.stdin:
        request = json.loads(line)
        error_read, error_write = os.pipe()
        started = time.monotonic()
        pid = os.fork()
        if pid == 0:  # child
            os.close(error_read)
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, 1)  # stdout is the protocol pipe
            code = 0
            try:
                code = _child(request)
            except BaseException as exc:  # report, never return into the zygote loop
                os.write(error_write, f"{type(exc).__name__}: {exc}".encode()[:4000])
                code = 3
            finally:
                os._exit(code)
        os.close(error_write)
        deadline = started + float(request["kill_after_s"])
        killed = False
        status = None
        while status is None:
            done, wait_status = os.waitpid(pid, os.WNOHANG)
            if done:
                status = wait_status
                break
            if time.monotonic() >= deadline:
                os.kill(pid, signal.SIGKILL)
                killed = True
                _, status = os.waitpid(pid, 0)
                break
            time.sleep(0.002)
        error = os.read(error_read, 4000).decode(errors="replace")
        os.close(error_read)
        exit_code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
        sys.stdout.write(json.dumps({"killed": killed and exit_code == -signal.SIGKILL, "exit_code": exit_code,
                                     "elapsed_s": time.monotonic() - started, "error": error}) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    _zygote()
