"""pytest plugin ``kafka_materializer``: a real Apache Kafka broker for tests (entry point ``pytest11``).

Marker
    ``@pytest.mark.broker`` -- the test needs a real broker (registered here).

Fixtures
    ``kafka_broker`` (session) -> :class:`KafkaBrokerHandle` with

    * ``kind``: ``"external"`` | ``"testcontainers"`` | ``"local"``
    * ``bootstrap_servers``: ``"host:port[,host:port]"``
    * ``log_dirs``: ``Path`` of the broker's ``log.dirs`` when it is readable on this machine, else ``None``
    * ``partition_dir(topic, partition) -> Path``: the ``<topic>-<partition>`` folder (live folder for a
      local broker; a fresh copy taken with the Docker SDK ``get_archive`` for a Testcontainers broker;
      ``KAFKA_LOG_DIRS``-based for an external one)
    * ``run_tool(main_class, args, timeout_s=120, check=False) -> subprocess.CompletedProcess[str]``:
      runs a Kafka tool class (e.g. ``DUMP_LOG_SEGMENTS_CLASS``) from the locally resolved Kafka jars; it
      needs only Java + Maven, not the broker, so it works on files from ``partition_dir`` for every kind
    * ``cleaner_log``: ``Path`` of ``log-cleaner.log`` (local broker only, else ``None``)

    The broker is chosen in this order:

    1. ``KAFKA_BOOTSTRAP_SERVERS`` is set -> that cluster (``kind="external"``; optional ``KAFKA_LOG_DIRS``
       gives its ``log.dirs`` when it runs on this machine);
    2. a Docker engine answers ``ping()`` within ~3 s -> a Testcontainers ``KafkaContainer`` (KRaft; image
       ``$KAFKA_MATERIALIZER_TC_IMAGE`` or ``confluentinc/cp-kafka:7.9.0``) with ``TEST_BROKER_CONFIG``;
    3. otherwise :class:`~materializer.adapters.kafka_broker.LocalKafkaBroker` from the official jars in a
       session temp dir with ``TEST_BROKER_CONFIG`` (first run downloads ~55 MB with Maven).

    ``KAFKA_MATERIALIZER_BROKER=external|testcontainers|local`` forces one choice. When no broker can be
    had, every test using the fixture FAILS (errors) with the reason -- it is never skipped.

    ``kafka_admin`` (session) -> ``confluent_kafka.admin.AdminClient`` bound to ``kafka_broker``.

    ``create_topic`` (function) -> factory ``create_topic(name=None, partitions=1, config=None, *,
    timeout_s=30.0) -> str``: creates the topic (broker-default replication factor; ``config`` holds topic
    configs such as ``{"cleanup.policy": "compact"}``), waits until its metadata shows ``partitions``
    partitions each with a leader (and, when ``log_dirs`` is readable, each partition folder with its first
    ``00000000000000000000.log``), and returns its name (a unique ``test-<hex>`` when ``name`` is None).
    Topics are not deleted afterwards, so their folders stay inspectable; use unique names.

    ``schema_registry_url`` (session) -> ``str``: the base URL of a real Schema Registry for
    ``confluent_kafka.schema_registry.SchemaRegistryClient``: ``$KAFKA_MATERIALIZER_SCHEMA_REGISTRY_URL``
    or ``$SCHEMA_REGISTRY_URL`` when set, else a
    :class:`~materializer.adapters.schema_registry_server.LocalSchemaRegistry` (Apicurio Registry from
    Maven Central, in memory, ``.../apis/ccompat/v7``) started for the session and stopped after it.
    When none can be had the test fails with the reason (never skips). Marker ``schema_registry``.
"""

from __future__ import annotations

import io
import os
import subprocess
import tarfile
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

import pytest

from materializer.adapters.errors import BrokerProvisioningError
from materializer.adapters.kafka_broker import (
    KAFKA_VERSION,
    TEST_BROKER_CONFIG,
    LocalKafkaBroker,
    run_kafka_tool,
)

__all__ = ["KafkaBrokerHandle", "kafka_broker", "kafka_admin", "create_topic", "schema_registry_url"]

TESTCONTAINERS_DEFAULT_IMAGE = "confluentinc/cp-kafka:7.9.0"
_CONTAINER_LOG_DIR = "/var/lib/kafka/data"


class KafkaBrokerHandle:
    """What the ``kafka_broker`` fixture yields; see the module docstring."""

    def __init__(self, kind: str, bootstrap_servers: str, log_dirs: Path | None, *,
                 local: LocalKafkaBroker | None = None, container: Any = None,
                 scratch_dir: Path | None = None) -> None:
        self.kind = kind
        self.bootstrap_servers = bootstrap_servers
        self.log_dirs = log_dirs
        self.local = local
        self._container = container
        self._scratch_dir = scratch_dir

    @property
    def cleaner_log(self) -> Path | None:
        """``log-cleaner.log`` of a local broker (LogCleaner "MB/sec" statistics), else ``None``."""
        return self.local.cleaner_log if self.local is not None else None

    def run_tool(self, main_class: str, args: Sequence[str], timeout_s: float = 120.0, *,
                 check: bool = False) -> subprocess.CompletedProcess[str]:
        """Run a Kafka tool class with the local Kafka jars (no broker needed).

        Raises:
            BrokerProvisioningError: Java/Maven/jars unavailable, timeout, or ``check`` and non-zero exit.
        """
        version = self.local.version if self.local is not None else KAFKA_VERSION
        return run_kafka_tool(main_class, args, timeout_s=timeout_s, version=version, check=check)

    def partition_dir(self, topic: str, partition: int) -> Path:
        """Folder ``<topic>-<partition>`` of the broker's log dir, readable on this machine.

        Raises:
            FileNotFoundError: the broker's log dirs are not reachable (external broker without
                ``KAFKA_LOG_DIRS``) or the container has no such folder.
        """
        name = f"{topic}-{partition}"
        if self._container is not None:
            return self._copy_from_container(name)
        if self.log_dirs is None:
            raise FileNotFoundError(
                f"log dirs of the {self.kind} broker {self.bootstrap_servers} are not reachable here; "
                "set KAFKA_LOG_DIRS to its log.dirs")
        return self.log_dirs / name

    def _copy_from_container(self, name: str) -> Path:
        wrapped = self._container.get_wrapped_container()
        try:
            stream, _stat = wrapped.get_archive(f"{_CONTAINER_LOG_DIR}/{name}")
        except Exception as exc:  # docker.errors.NotFound and friends
            raise FileNotFoundError(f"{_CONTAINER_LOG_DIR}/{name} in container: {exc}") from exc
        target = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=self._scratch_dir))
        with tarfile.open(fileobj=io.BytesIO(b"".join(stream))) as archive:
            try:
                archive.extractall(target, filter="data")
            except TypeError:  # Python without PEP 706 extraction filters
                archive.extractall(target)
        return target / name

    def __repr__(self) -> str:
        return f"KafkaBrokerHandle(kind={self.kind!r}, bootstrap_servers={self.bootstrap_servers!r})"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "broker: needs a real Apache Kafka broker (fixture kafka_broker; local jars when none is configured)")
    config.addinivalue_line(
        "markers", "schema_registry: needs a real Schema Registry (fixture schema_registry_url; local Apicurio "
                   "when none is configured)")


def _docker_answers(timeout_s: float = 3.0) -> bool:
    """True when a Docker engine answers ping() -- fast False when there is no socket at all."""
    if not os.environ.get("DOCKER_HOST") and not Path("/var/run/docker.sock").exists():
        return False
    try:
        import docker
        client = docker.from_env(timeout=timeout_s)
        try:
            return bool(client.ping())
        finally:
            client.close()
    except Exception:  # noqa: BLE001 - any failure means "no usable engine"
        return False


def _start_container() -> Any:
    try:  # testcontainers >= 4.x moved modules under testcontainers.community
        from testcontainers.community.kafka import KafkaContainer
    except ImportError:
        from testcontainers.kafka import KafkaContainer

    container = KafkaContainer(os.environ.get("KAFKA_MATERIALIZER_TC_IMAGE", TESTCONTAINERS_DEFAULT_IMAGE)).with_kraft()
    container.with_env("KAFKA_LOG_DIRS", _CONTAINER_LOG_DIR)
    for key, value in TEST_BROKER_CONFIG.items():
        container.with_env("KAFKA_" + key.upper().replace(".", "_"), value)
    return container.start()


@pytest.fixture(scope="session")
def kafka_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaBrokerHandle]:
    """A real Kafka broker for the whole session; see the module docstring for the selection order."""
    forced = os.environ.get("KAFKA_MATERIALIZER_BROKER", "").strip().lower()
    bootstrap = os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "").strip()
    if forced not in ("", "external", "testcontainers", "local"):
        pytest.fail(f"KAFKA_MATERIALIZER_BROKER={forced!r}: expected external, testcontainers or local", pytrace=False)
    if forced == "external" or (not forced and bootstrap):
        if not bootstrap:
            pytest.fail("KAFKA_MATERIALIZER_BROKER=external but KAFKA_BOOTSTRAP_SERVERS is not set", pytrace=False)
        log_dirs = os.environ.get("KAFKA_LOG_DIRS")
        yield KafkaBrokerHandle("external", bootstrap, Path(log_dirs) if log_dirs else None)
        return
    problems: list[str] = []
    if forced in ("", "testcontainers"):
        if _docker_answers():
            try:
                container = _start_container()
            except Exception as exc:  # noqa: BLE001 - fall back to the local broker
                problems.append(f"Testcontainers Kafka failed: {exc}")
            else:
                try:
                    yield KafkaBrokerHandle("testcontainers", container.get_bootstrap_server(), None,
                                            container=container, scratch_dir=tmp_path_factory.mktemp("kafka-copies"))
                finally:
                    container.stop()
                return
        else:
            problems.append("no Docker engine answered")
        if forced == "testcontainers":
            pytest.fail("KAFKA_MATERIALIZER_BROKER=testcontainers: " + "; ".join(problems), pytrace=False)
    broker = LocalKafkaBroker(tmp_path_factory.mktemp("kafka-broker"), extra_config=TEST_BROKER_CONFIG)
    try:
        broker.start(timeout_s=float(os.environ.get("KAFKA_MATERIALIZER_BROKER_TIMEOUT_S", "90")))
    except BrokerProvisioningError as exc:
        problems.append(f"local Apache Kafka broker failed: {exc}")
        pytest.fail("No Kafka broker available for this test:\n" + "\n".join(problems), pytrace=False)
    try:
        yield KafkaBrokerHandle("local", broker.bootstrap_servers, broker.log_dirs, local=broker)
    finally:
        broker.stop()


@pytest.fixture(scope="session")
def kafka_admin(kafka_broker: KafkaBrokerHandle) -> Any:
    """``confluent_kafka.admin.AdminClient`` for ``kafka_broker``."""
    from confluent_kafka.admin import AdminClient
    return AdminClient({"bootstrap.servers": kafka_broker.bootstrap_servers})


def _wait_for_topic(admin: Any, name: str, partitions: int, timeout_s: float,
                    log_dirs: Path | None) -> None:
    deadline = time.monotonic() + timeout_s
    last = "no metadata yet"
    while time.monotonic() < deadline:
        try:
            metadata = admin.list_topics(topic=name, timeout=min(5.0, timeout_s))
            topic = metadata.topics.get(name)
            if topic is not None and topic.error is None and len(topic.partitions) == partitions and all(
                    p.leader >= 0 and p.error is None for p in topic.partitions.values()):
                # metadata can show a leader before the replica manager has created the log folder
                if log_dirs is None or all((log_dirs / f"{name}-{p}" / "00000000000000000000.log").is_file()
                                           for p in range(partitions)):
                    return
                last = "partition folders not created yet"
                time.sleep(0.05)
                continue
            last = f"metadata: {topic.error if topic is not None else 'absent'}, " \
                   f"{len(topic.partitions) if topic is not None else 0}/{partitions} partitions"
        except Exception as exc:  # noqa: BLE001 - keep polling until the deadline
            last = str(exc)
        time.sleep(0.1)
    raise TimeoutError(f"topic {name!r} not ready within {timeout_s:.0f} s ({last})")


@pytest.fixture
def create_topic(kafka_broker: KafkaBrokerHandle, kafka_admin: Any) -> Callable[..., str]:
    """Factory creating a topic and waiting for all partition leaders; see the module docstring."""
    from confluent_kafka.admin import NewTopic

    def _create(name: str | None = None, partitions: int = 1, config: Mapping[str, str] | None = None, *,
                timeout_s: float = 30.0) -> str:
        name = name or f"test-{uuid.uuid4().hex[:12]}"
        new_topic = NewTopic(name, num_partitions=partitions, replication_factor=-1,
                             config={str(k): str(v) for k, v in (config or {}).items()})
        kafka_admin.create_topics([new_topic], operation_timeout=timeout_s)[name].result(timeout=timeout_s)
        _wait_for_topic(kafka_admin, name, partitions, timeout_s, kafka_broker.log_dirs)
        return name

    return _create


@pytest.fixture(scope="session")
def schema_registry_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real Schema Registry's base URL for the session; see the module docstring."""
    configured = (os.environ.get("KAFKA_MATERIALIZER_SCHEMA_REGISTRY_URL") or os.environ.get("SCHEMA_REGISTRY_URL")
                  or "").strip()
    if configured:
        yield configured
        return
    from materializer.adapters.errors import SchemaRegistryProvisioningError
    from materializer.adapters.schema_registry_server import LocalSchemaRegistry

    registry = LocalSchemaRegistry(tmp_path_factory.mktemp("schema-registry"))
    try:
        registry.start()
    except SchemaRegistryProvisioningError as exc:
        pytest.fail(f"No Schema Registry available for this test: {exc}", pytrace=False)
    try:
        yield registry.url
    finally:
        registry.stop()
