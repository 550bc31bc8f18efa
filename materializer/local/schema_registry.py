"""A real Schema Registry on 127.0.0.1 for development and tests: Apicurio Registry from Maven Central.

Apicurio Registry (Apache-2.0) runs on Java 17 and serves the Confluent Schema Registry REST API
under ``/apis/ccompat/v7``, which confluent-kafka's ``SchemaRegistryClient`` (and Kafka's
``KafkaAvroSerializer``) talk to unchanged. It is resolved into the jar cache
(:mod:`materializer.local.maven_jars`) as the broker jars are: once, with Maven::

    <cache root>/apicurio-registry-<version>/apicurio-registry-app-<version>-all.tar.gz
    <cache root>/apicurio-registry-<version>/app/apicurio-registry-app-<version>-runner.jar, lib/
    <cache root>/apicurio-registry-<version>/app/.complete     marker after a successful unpack
    <cache root>/apicurio-registry-<version>/.lock             flock while resolving

(artifact ``io.apicurio:apicurio-registry-app:<version>:tar.gz:all``, 109 MB, 360 jars). Storage is
in memory: a registry's schemas live as long as its JVM.

Measured on the 2-vCPU CI machine: about 5 s from launch to the first answer, 270 MB RSS.

Raises :class:`~materializer.adapters.errors.SchemaRegistryProvisioningError` naming what failed
(no Java, the ``mvn`` command and its last output, the port, the tail of the registry's log).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Sequence

from materializer.adapters.errors import SchemaRegistryProvisioningError
from materializer.local.kafka_broker import pid_alive, _set_parent_death_signal, _tail_file
from materializer.local.maven_jars import default_cache_root, download_maven_artifact, resolve_once
from materializer.local.ports import free_port

__all__ = ["APICURIO_VERSION", "LocalSchemaRegistry", "ensure_apicurio", "CCOMPAT_PATH"]

APICURIO_VERSION = os.environ.get("KAFKA_MATERIALIZER_APICURIO_VERSION") or "3.0.9"
#: The Confluent-compatible API of Apicurio Registry 3.
CCOMPAT_PATH = "/apis/ccompat/v7"
#: Quick start over peak speed: a registry in tests serves a few hundred requests.
DEFAULT_JVM_OPTIONS: tuple[str, ...] = ("-Xms64m", "-Xmx512m", "-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC")
_STATE_FILE = "registry.json"


def ensure_apicurio(version: str = APICURIO_VERSION, *, cache_root: Path | None = None,
                    timeout_s: float = 900.0) -> Path:
    """The runner jar of Apicurio Registry ``version``, downloaded and unpacked once.

    Runs ``mvn dependency:copy`` (so Maven's settings and mirrors apply) on first use, keeps the
    archive and unpacks it into ``app/``
    (:func:`~materializer.local.maven_jars.download_maven_artifact` inside
    :func:`~materializer.local.maven_jars.resolve_once`); later calls return at once. Safe from
    parallel processes (file lock).

    Raises:
        SchemaRegistryProvisioningError: no ``mvn``, Maven failed (its last lines quoted) or timed
            out, or the archive holds no runner jar.
    """
    home = (cache_root or default_cache_root()) / f"apicurio-registry-{version}"
    runner_name = f"apicurio-registry-app-{version}-runner.jar"
    what = f"Apicurio Registry {version}"

    def unpack(staging: Path) -> str:
        archive = download_maven_artifact(home, f"io.apicurio:apicurio-registry-app:{version}:tar.gz:all", what,
                                          error=SchemaRegistryProvisioningError, timeout_s=timeout_s)
        with tarfile.open(archive) as tar:
            tar.extractall(staging, filter="data")
        if not (staging / runner_name).is_file():
            raise SchemaRegistryProvisioningError(f"{archive} holds no {runner_name}")
        return f"unpacked from {archive.name}"

    return resolve_once(home, home / "app", what, unpack) / runner_name


class LocalSchemaRegistry:
    """One Apicurio Registry JVM on ``host`` (loopback), owned by this process or attached by pid.

    Args:
        state_dir: folder for ``registry.out`` (its log) and ``registry.json``; created if missing.
        version: Apicurio Registry release (default :data:`APICURIO_VERSION`).
        port: HTTP port; 0 picks a free one.
        jvm_options: JVM flags (default: small heap, C1 only, serial GC: fast start).

    :attr:`url` is the Confluent-compatible base URL to give a ``SchemaRegistryClient``.
    """

    def __init__(self, state_dir: Path | str, *, version: str = APICURIO_VERSION, host: str = "127.0.0.1",
                 port: int = 0, jvm_options: Sequence[str] = DEFAULT_JVM_OPTIONS) -> None:
        self.state_dir = Path(state_dir).resolve()
        self.version = version
        self.host = host
        self.port = port or None
        self.jvm_options = tuple(jvm_options)
        self.pid: int | None = None
        self.startup_s: float | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._log_position = 0

    @property
    def url(self) -> str:
        """``http://host:port/apis/ccompat/v7``.

        Raises:
            SchemaRegistryProvisioningError: not started or attached.
        """
        if self.port is None:
            raise SchemaRegistryProvisioningError(f"schema registry in {self.state_dir} is not started")
        return f"http://{self.host}:{self.port}{CCOMPAT_PATH}"

    def start(self, timeout_s: float = 120.0, *, detach: bool = False) -> "LocalSchemaRegistry":
        """Download if needed, launch the JVM and wait until ``GET <url>/subjects`` answers 200.

        Args:
            timeout_s: seconds to wait for the first answer.
            detach: keep running after this process exits (CLI); otherwise the JVM gets SIGTERM
                when this process dies (Linux ``PR_SET_PDEATHSIG``).

        Raises:
            SchemaRegistryProvisioningError: already running in ``state_dir``, no Java, download
                failed, the JVM exited or did not answer in time (the log's tail is quoted).
        """
        existing = self.read_state(self.state_dir)
        if existing and pid_alive(int(existing["pid"])) and self._is_ours(int(existing["pid"])):
            raise SchemaRegistryProvisioningError(
                f"a schema registry (pid {existing['pid']}, {existing.get('url')}) is already running in "
                f"{self.state_dir}; stop it first")
        runner = ensure_apicurio(self.version)
        java = _find_java()
        self.state_dir.mkdir(parents=True, exist_ok=True)
        if self.port is None:
            self.port = free_port(self.host)
        log = self.state_dir / "registry.out"
        self._log_position = log.stat().st_size if log.exists() else 0
        cmd = [java, *self.jvm_options, f"-Dquarkus.http.host={self.host}", f"-Dquarkus.http.port={self.port}",
               f"-Dapicurio.materializer.state-dir={self.state_dir}", "-jar", str(runner)]
        started = time.monotonic()
        with open(log, "ab") as out:
            self._process = subprocess.Popen(
                cmd, cwd=runner.parent, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=None if detach else (_set_parent_death_signal if sys.platform == "linux" else None))
        self.pid = self._process.pid
        self._write_state(detach)
        try:
            self._wait_ready(timeout_s)
        except BaseException:
            self.stop()
            raise
        self.startup_s = time.monotonic() - started
        return self

    def stop(self, timeout_s: float = 30.0) -> None:
        """SIGTERM the JVM's process group, SIGKILL after ``timeout_s`` s. Idempotent; works when attached.

        Raises:
            SchemaRegistryProvisioningError: the process survived SIGKILL.
        """
        pid = self.pid
        if pid is None:
            state = self.read_state(self.state_dir)
            pid = int(state["pid"]) if state else None
        if pid is not None and pid_alive(pid) and (self._process is not None or self._is_ours(pid)):
            for sig, wait_s in ((signal.SIGTERM, timeout_s), (signal.SIGKILL, 10.0)):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pid, sig)  # the JVM leads its own process group
                if self._wait_exit(pid, wait_s):
                    break
            else:
                raise SchemaRegistryProvisioningError(f"schema registry pid {pid} survived SIGKILL")
        if self._process is not None:
            self._process.wait(timeout=10)
            self._process = None
        self.pid = None
        (self.state_dir / _STATE_FILE).unlink(missing_ok=True)

    def __enter__(self) -> "LocalSchemaRegistry":
        if self.pid is None:
            self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    @staticmethod
    def read_state(state_dir: Path | str) -> dict | None:
        """``<state_dir>/registry.json`` (``{pid, url, port, version}``) or None."""
        try:
            return json.loads((Path(state_dir) / _STATE_FILE).read_text())
        except (OSError, ValueError):
            return None

    @classmethod
    def attach(cls, state_dir: Path | str) -> "LocalSchemaRegistry":
        """A handle on the registry recorded in ``<state_dir>/registry.json``.

        Raises:
            SchemaRegistryProvisioningError: none recorded, or its pid is not running.
        """
        state = cls.read_state(state_dir)
        if state is None:
            raise SchemaRegistryProvisioningError(f"no schema registry recorded in {Path(state_dir) / _STATE_FILE}")
        registry = cls(state_dir, version=state.get("version", APICURIO_VERSION), host=state.get("host", "127.0.0.1"),
                       port=int(state["port"]))
        registry.pid = int(state["pid"])
        if not (pid_alive(registry.pid) and registry._is_ours(registry.pid)):
            raise SchemaRegistryProvisioningError(f"schema registry pid {registry.pid} from "
                                                  f"{Path(state_dir) / _STATE_FILE} is not running")
        return registry

    def is_running(self) -> bool:
        """True when the recorded JVM is alive and ``GET <url>/subjects`` answers 200."""
        return self.pid is not None and pid_alive(self.pid) and self._is_ours(self.pid) and self._answers(2.0)

    # -- internals -----------------------------------------------------------------------------

    def _answers(self, timeout_s: float) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/subjects", timeout=timeout_s) as response:
                return response.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def _wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while not self._answers(1.0):
            code = self._process.poll() if self._process is not None else None
            if code is not None:
                raise SchemaRegistryProvisioningError(self._failure(f"the registry JVM exited with code {code}"))
            if time.monotonic() >= deadline:
                raise SchemaRegistryProvisioningError(self._failure(
                    f"the registry did not answer on {self.url} within {timeout_s:.0f} s"))
            time.sleep(0.2)

    def _failure(self, headline: str) -> str:
        log = self.state_dir / "registry.out"
        return f"{headline} (state dir {self.state_dir})\n--- registry.out (tail) ---\n" \
               f"{_tail_file(log, 30, self._log_position)}"

    def _write_state(self, detached: bool) -> None:
        state = {"pid": self.pid, "url": self.url, "host": self.host, "port": self.port, "version": self.version,
                 "detached": detached}
        tmp = self.state_dir / (_STATE_FILE + ".tmp")
        tmp.write_text(json.dumps(state, indent=2) + "\n")
        tmp.replace(self.state_dir / _STATE_FILE)

    def _is_ours(self, pid: int) -> bool:
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            return sys.platform != "linux"
        return f"-Dapicurio.materializer.state-dir={self.state_dir}".encode() in cmdline

    def _wait_exit(self, pid: int, timeout_s: float) -> bool:
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


def _find_java() -> str:
    java_home = os.environ.get("JAVA_HOME")
    if java_home and (Path(java_home) / "bin" / "java").is_file():
        return str(Path(java_home) / "bin" / "java")
    java = shutil.which("java")
    if java is None:
        raise SchemaRegistryProvisioningError("no Java runtime: set JAVA_HOME or put 'java' (17+) on PATH "
                                              "to run Apicurio Registry")
    return java

