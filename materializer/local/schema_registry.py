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
in memory: a registry's schemas live as long as its JVM, whose lifecycle (launch, readiness, stop,
``registry.json``) is :class:`~materializer.local.jvm_service.JvmService`'s.

Measured on the 2-vCPU CI machine: about 5 s from launch to the first answer, 270 MB RSS.

Raises :class:`~materializer.adapters.errors.SchemaRegistryProvisioningError` naming what failed
(no Java, the ``mvn`` command and its last output, the port, the tail of the registry's log).
"""

from __future__ import annotations

import os
import tarfile
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Mapping, Self, Sequence

from materializer.adapters.errors import SchemaRegistryProvisioningError
from materializer.local.jvm_service import JvmService, find_java
from materializer.local.maven_jars import default_cache_root, download_maven_artifact, resolve_once
from materializer.local.ports import free_port

__all__ = ["APICURIO_VERSION", "LocalSchemaRegistry", "ensure_apicurio", "CCOMPAT_PATH"]

APICURIO_VERSION = os.environ.get("KAFKA_MATERIALIZER_APICURIO_VERSION") or "3.0.9"
#: The Confluent-compatible API of Apicurio Registry 3.
CCOMPAT_PATH = "/apis/ccompat/v7"
#: Quick start over peak speed: a registry in tests serves a few hundred requests.
DEFAULT_JVM_OPTIONS: tuple[str, ...] = ("-Xms64m", "-Xmx512m", "-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC")
#: The system property whose value (the state dir) tells this registry's JVM from any other.
_STATE_DIR_PROPERTY = "-Dapicurio.materializer.state-dir"


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


class LocalSchemaRegistry(JvmService):
    """One Apicurio Registry JVM on ``host`` (loopback), owned by this process or attached by pid.

    Args:
        state_dir: folder for ``registry.out`` (its log) and ``registry.json``; created if missing.
        version: Apicurio Registry release (default :data:`APICURIO_VERSION`).
        port: HTTP port; 0 picks a free one.
        jvm_options: JVM flags (default: small heap, C1 only, serial GC: fast start).

    :attr:`url` is the Confluent-compatible base URL to give a ``SchemaRegistryClient``.
    ``registry.json`` holds ``{pid, url, host, port, version, detached}``; the lifecycle
    (:meth:`stop`, :meth:`attach`, :meth:`is_running`, :meth:`read_state`, the context manager) is
    :class:`~materializer.local.jvm_service.JvmService`'s.
    """

    service_name = "schema registry"
    state_file = "registry.json"
    address_key = "url"
    output_files = (("registry.out", 30),)
    provisioning_error = SchemaRegistryProvisioningError
    status_probe_s = 2.0

    def __init__(self, state_dir: Path | str, *, version: str = APICURIO_VERSION, host: str = "127.0.0.1",
                 port: int = 0, jvm_options: Sequence[str] = DEFAULT_JVM_OPTIONS) -> None:
        super().__init__(state_dir, host=host)
        self.version = version
        self.port = port or None
        self.jvm_options = tuple(jvm_options)

    @property
    def url(self) -> str:
        """``http://host:port/apis/ccompat/v7`` (:attr:`address`).

        Raises:
            SchemaRegistryProvisioningError: not started or attached.
        """
        return self.address

    def start(self, timeout_s: float = 120.0, *, detach: bool = False) -> Self:
        """Download if needed, launch the JVM and wait until ``GET <url>/subjects`` answers 200.

        Args:
            timeout_s: seconds to wait for the first answer.
            detach: keep running after this process exits (CLI); otherwise the JVM gets SIGTERM
                when this process dies (Linux ``PR_SET_PDEATHSIG``).

        Raises:
            SchemaRegistryProvisioningError: already running in ``state_dir``, no Java, download
                failed, the JVM exited or did not answer in time (the log's tail is quoted).
        """
        self._refuse_second_start()
        runner = ensure_apicurio(self.version)
        java = find_java(what="Apicurio Registry", error=SchemaRegistryProvisioningError)
        self.state_dir.mkdir(parents=True, exist_ok=True)
        if self.port is None:
            self.port = free_port(self.host)
        cmd = [java, *self.jvm_options, f"-Dquarkus.http.host={self.host}", f"-Dquarkus.http.port={self.port}",
               *self._identity_args(), "-jar", str(runner)]
        self._start_jvm(cmd, cwd=runner.parent, detach=detach, timeout_s=timeout_s)
        return self

    # -- JvmService ----------------------------------------------------------------------------

    def _address(self) -> str | None:
        return None if self.port is None else f"http://{self.host}:{self.port}{CCOMPAT_PATH}"

    def _identity_args(self) -> tuple[str, ...]:
        return (f"{_STATE_DIR_PROPERTY}={self.state_dir}",)

    def _probe(self, timeout_s: float) -> bool:
        """``GET <url>/subjects`` answers 200 within ``timeout_s`` seconds."""
        try:
            with urllib.request.urlopen(f"{self.url}/subjects", timeout=timeout_s) as response:
                return response.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def _state(self) -> dict[str, Any]:
        return {"url": self.url, "host": self.host, "port": self.port, "version": self.version}

    @classmethod
    def _from_state(cls, state_dir: Path, state: Mapping[str, Any]) -> Self:
        return cls(state_dir, version=state.get("version", APICURIO_VERSION), host=state.get("host", "127.0.0.1"),
                   port=int(state["port"]))
