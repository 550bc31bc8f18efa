"""pytest plugin ``kafka_materializer``: a real Apache Kafka broker and the tools to prove compaction against it.

Installed with the package (entry point ``pytest11``), so a project that ``pip install``\\ s
kafka-materializer gets these fixtures without a ``conftest.py``.

Options (command line > environment > ini file > default)

=================================  ==================================  ===========================================
command line                       environment / ini                   meaning
=================================  ==================================  ===========================================
``--kafka-broker=MODE``            ``KAFKA_MATERIALIZER_BROKER`` /     ``auto`` (default: ``external`` when
                                   ``kafka_materializer_broker``       bootstrap servers are given, else
                                                                       ``testcontainers`` when a Docker engine
                                                                       answers, else ``local``), ``local``
                                                                       (official jars, no Docker),
                                                                       ``testcontainers``, ``external``
``--kafka-bootstrap-servers=HP``   ``KAFKA_BOOTSTRAP_SERVERS`` /       an existing cluster (``host:port,...``);
                                   ``kafka_materializer_bootstrap_``   ``KAFKA_LOG_DIRS`` gives its ``log.dirs``
                                   ``servers``                         when it runs on this machine
``--kafka-version=X.Y.Z``          ``KAFKA_MATERIALIZER_KAFKA_``       Apache Kafka release for the local broker,
                                   ``VERSION`` /                       the container image and the tools
                                   ``kafka_materializer_version``      (default ``$KAFKA_HOME``'s when set: the
                                                                       local broker then runs that unpacked
                                                                       Kafka distribution; else the pinned
                                                                       ``KAFKA_VERSION``)
``--kafka-keep-topics``            ``kafka_materializer_keep_topics``  do not delete the topics the factory made
``--kafka-start-early``            ``kafka_materializer_start_early``  start the broker in a background thread
                                                                       as soon as the session starts (else:
                                                                       right after collection, when a selected
                                                                       test needs it), so that collection and the
                                                                       first tests overlap the JVM start
=================================  ==================================  ===========================================

Fixtures (canonical names ``kafka_materializer_*``; the short names in brackets are aliases kept for
existing suites)

``kafka_materializer_broker`` [``kafka_broker``] (session) -> :class:`KafkaBrokerHandle`:
    ``kind`` (``"local"`` | ``"testcontainers"`` | ``"external"``), ``bootstrap_servers``,
    ``version`` (Kafka release), ``image`` (container image or None), ``log_dirs`` (``Path`` when
    readable here), ``partition_dir(topic, p)`` (live folder, or a fresh copy out of the container),
    ``cleaner_checkpoints()``, ``active_segment_base(topic, p)``, ``run_tool(main_class, args)``
    (Kafka tool classes from the local jars), ``cleaner_log``, ``startup_s`` (seconds the session
    waited for the broker). One local broker is shared by every pytest process of one run
    (pytest-xdist workers) through a lock file; the last process to leave stops it.
``kafka_materializer_admin`` [``kafka_admin``] (session) -> ``confluent_kafka.admin.AdminClient``.
``kafka_materializer_topic_factory`` [``create_topic``] (function) -> ``create(name=None,
    partitions=1, config=None, *, timeout_s=30.0) -> str``: creates the topic, waits until every
    partition has a leader (and its first segment file when the log dir is readable), returns the
    name (``test-<hex>`` when None). Topics are deleted at teardown unless ``--kafka-keep-topics``;
    the old name ``create_topic`` keeps them, as it always did.
``kafka_materializer_producer`` (function) -> ``confluent_kafka.Producer`` (idempotent,
    ``acks=all``), flushed at teardown; the test fails if records were left undelivered.
``kafka_materializer_consumer`` (function) -> factory ``consumer(*topics, **config)`` ->
    ``confluent_kafka.Consumer`` with ``isolation.level=read_committed``, a fresh group,
    ``auto.offset.reset=earliest``, subscribed to ``topics``; all closed at teardown.
``kafka_materializer_view`` (function) -> factory ``materialize(topic, *, data_dir=None,
    options=None, until_caught_up=True) -> Materializer``: a
    :class:`~materializer.materializer.Materializer` of ``topic`` into ``data_dir`` (a temp dir
    when None), started, run until caught up, and closed at teardown (``.view()`` reads its store,
    ``.run(until_caught_up=True)`` catches up again). Calling it again with the same ``data_dir``
    closes the previous one first: a restart.
``kafka_materializer_compaction`` (function) ->
    :class:`~materializer.testing.compaction_oracle.BrokerCompaction` bound to the broker:
    ``wait_for_broker_compaction(topic, timeout_s)`` and ``assert_compacted_like_broker(topic,
    data_dir=None)`` (the data dir of the view fixture's last materializer of ``topic`` when None;
    that materializer is closed first, as compaction needs its store lock).
``kafka_materializer_schema_registry_url`` [``schema_registry_url``] (session) -> ``str``:
    ``$KAFKA_MATERIALIZER_SCHEMA_REGISTRY_URL`` / ``$SCHEMA_REGISTRY_URL``, else a
    :class:`~materializer.local.schema_registry.LocalSchemaRegistry` (Apicurio from Maven
    Central, ``.../apis/ccompat/v7``) for the session.

Markers: ``broker`` (needs a real broker) and ``schema_registry``.

Testcontainers: the image is the local ``apache-kafka:<version>`` when the engine has it (built
from Debian + the official jars by ``.ci/kafka_image.sh``; no registry needed), else the official
``apache/kafka:<version>``; ``$KAFKA_MATERIALIZER_TC_IMAGE`` overrides. The container uses host
networking with listeners on ``127.0.0.1`` (free ports picked here). The Ryuk reaper is disabled
(the container is stopped at session end).

When no broker can be had every test using it FAILS with the reason (no Java, Maven cannot resolve
the version and what it lacks, a port in use, a container that exited...); nothing is skipped.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import os
import subprocess
import tarfile
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

import pytest

from materializer.adapters.errors import BrokerProvisioningError
from materializer.local.kafka_broker import (
    KAFKA_VERSION,
    TEST_BROKER_CONFIG,
    BROKER_BASE_CONFIG,
    DEFAULT_JVM_OPTIONS,
    FAST_START_JVM_OPTIONS,
    LocalKafkaBroker,
    run_kafka_tool,
)
from materializer.local.jvm_service import pid_alive
from materializer.local.kafka_jars import default_version
from materializer.local.ports import free_port
from materializer.testing.compaction_oracle import BrokerCompaction, BrokerFilesOnDisk, active_segment_base
from materializer.storage.file_lock import lock_file, unlock_file
from materializer.storage.checkpoint import CLEANER_OFFSET_CHECKPOINT, read_offset_checkpoint

__all__ = [
    "KafkaBrokerHandle",
    "BrokerSettings",
    "container_broker_config",
    "container_env",
    "container_image",
    "kafka_materializer_broker",
    "kafka_materializer_admin",
    "kafka_materializer_topic_factory",
    "kafka_materializer_producer",
    "kafka_materializer_consumer",
    "kafka_materializer_view",
    "kafka_materializer_compaction",
    "kafka_materializer_schema_registry_url",
    "kafka_broker",
    "kafka_admin",
    "create_topic",
    "schema_registry_url",
]

OFFICIAL_IMAGE = "apache/kafka"
LOCAL_IMAGE = "apache-kafka"
_CONTAINER_LOG_DIR = "/var/lib/kafka/data"
_MODES = ("auto", "local", "testcontainers", "external")


# ---------------------------------------------------------------------------------------------- handle

class KafkaBrokerHandle:
    """What ``kafka_materializer_broker`` yields; see the module docstring for the attributes."""

    def __init__(self, kind: str, bootstrap_servers: str, log_dirs: Path | None, *, version: str = KAFKA_VERSION,
                 local: LocalKafkaBroker | None = None, container: Any = None, image: str | None = None,
                 scratch_dir: Path | None = None, startup_s: float | None = None) -> None:
        self.kind = kind
        self.bootstrap_servers = bootstrap_servers
        self.log_dirs = log_dirs
        self.version = version
        self.local = local
        self.image = image
        self.startup_s = startup_s
        self._container = container
        self._scratch_dir = scratch_dir

    @property
    def cleaner_log(self) -> Path | None:
        """A file with the broker's LogCleaner lines ("cleaned log T-P (dirty section = [a, b])", "MB/sec"
        statistics): a local broker's ``log-cleaner.log``; for a container, a fresh copy of its output
        (both images log to stdout) named ``log-cleaner.log``; ``None`` for an external broker."""
        if self.local is not None:
            return self.local.cleaner_log
        if self._container is None:
            return None
        target = Path(tempfile.mkdtemp(prefix="container-logs-", dir=self._scratch_dir)) / "log-cleaner.log"
        target.write_bytes(self._container.get_wrapped_container().logs())
        return target

    def run_tool(self, main_class: str, args: Sequence[str], timeout_s: float = 120.0, *,
                 check: bool = False) -> subprocess.CompletedProcess[str]:
        """Run a Kafka tool class with the local jars of this broker's version (no broker needed).

        Raises:
            BrokerProvisioningError: Java/Maven/jars unavailable, timeout, or ``check`` and non-zero exit.
        """
        return run_kafka_tool(main_class, args, timeout_s=timeout_s, version=self.version, check=check)

    def partition_dir(self, topic: str, partition: int) -> Path:
        """Folder ``<topic>-<partition>`` of the broker's log dir, readable on this machine (a fresh copy
        for a container broker).

        Raises:
            FileNotFoundError: the log dirs are not reachable (external broker without
                ``KAFKA_LOG_DIRS``) or the container has no such folder.
        """
        name = f"{topic}-{partition}"
        if self._container is not None:
            return self._copy_from_container(name)
        return self._log_dirs_here() / name

    def cleaner_checkpoints(self) -> dict[tuple[str, int], int]:
        """The broker's ``cleaner-offset-checkpoint``: ``(topic, partition) -> first dirty offset`` of the
        next cleaning (empty before the cleaner's first round).

        Raises:
            FileNotFoundError: the log dirs are not reachable here.
        """
        if self._container is None:
            return BrokerFilesOnDisk(self.bootstrap_servers, self._log_dirs_here()).cleaner_checkpoints()
        try:
            path = self._copy_from_container(CLEANER_OFFSET_CHECKPOINT)
            return read_offset_checkpoint(path)
        except FileNotFoundError:
            return {}
        except Exception:  # noqa: BLE001 - caught mid-rename; the caller polls again
            return {}

    def active_segment_base(self, topic: str, partition: int) -> int:
        """Base offset of the newest segment of ``topic``-``partition`` on the broker.

        Raises:
            FileNotFoundError: the partition folder is not reachable or holds no segment.
        """
        if self._container is not None:
            done = self._container.get_wrapped_container().exec_run(
                ["ls", f"{_CONTAINER_LOG_DIR}/{topic}-{partition}"])
            names = done.output.decode().split() if done.exit_code == 0 else []
            bases = [int(n[:-4]) for n in names if n.endswith(".log") and n[:-4].isdigit()]
            if not bases:
                raise FileNotFoundError(f"no segment of {topic}-{partition} in the container: {done.output!r}")
            return max(bases)
        return active_segment_base(self.partition_dir(topic, partition))

    def _log_dirs_here(self) -> Path:
        if self.log_dirs is None:
            raise FileNotFoundError(
                f"log dirs of the {self.kind} broker {self.bootstrap_servers} are not reachable here; "
                "set KAFKA_LOG_DIRS to its log.dirs")
        return self.log_dirs

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
        where = f", image={self.image!r}" if self.image else ""
        return (f"KafkaBrokerHandle(kind={self.kind!r}, version={self.version!r}, "
                f"bootstrap_servers={self.bootstrap_servers!r}{where})")


# ---------------------------------------------------------------------------------------------- options

def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("kafka_materializer", "Kafka broker for tests (kafka-materializer)")
    group.addoption("--kafka-broker", choices=_MODES, default=None,
                    help="where the test broker comes from: auto (default), local (official jars), "
                         "testcontainers, external (--kafka-bootstrap-servers)")
    group.addoption("--kafka-bootstrap-servers", default=None, metavar="HOST:PORT[,...]",
                    help="use this existing Kafka cluster instead of starting one")
    group.addoption("--kafka-version", default=None, metavar="X.Y.Z",
                    help=f"Apache Kafka release from Maven Central / image tag (default {KAFKA_VERSION})")
    group.addoption("--kafka-keep-topics", action="store_true", default=None,
                    help="keep the topics the topic factory created (for inspection)")
    group.addoption("--kafka-start-early", action="store_true", default=None,
                    help="start the broker in the background when the session starts")
    parser.addini("kafka_materializer_broker", "auto|local|testcontainers|external", default="auto")
    parser.addini("kafka_materializer_bootstrap_servers", "existing cluster's bootstrap servers", default="")
    parser.addini("kafka_materializer_version", "Apache Kafka release", default="")
    parser.addini("kafka_materializer_keep_topics", "keep created topics", type="bool", default=False)
    parser.addini("kafka_materializer_start_early", "start the broker when the session starts", type="bool",
                  default=False)


@dataclass(frozen=True)
class BrokerSettings:
    """The resolved options: ``mode`` (one of auto/local/testcontainers/external), ``bootstrap_servers``
    ('' when none), ``version``, ``keep_topics``, ``start_early``, ``timeout_s`` (broker start, s)."""

    mode: str
    bootstrap_servers: str
    version: str
    keep_topics: bool
    start_early: bool
    timeout_s: float

    @classmethod
    def from_config(cls, config: pytest.Config) -> "BrokerSettings":
        """Command line > environment > ini > default.

        Raises:
            pytest.UsageError: an unknown mode.
        """
        def pick(option: str, env: str | None, ini: str) -> Any:
            value = config.getoption(option, default=None)
            if value is None and env:
                value = os.environ.get(env) or None
            if value is None:
                value = config.getini(ini) or None
            return value

        mode = (pick("--kafka-broker", "KAFKA_MATERIALIZER_BROKER", "kafka_materializer_broker") or "auto").lower()
        if mode not in _MODES:
            raise pytest.UsageError(f"--kafka-broker / KAFKA_MATERIALIZER_BROKER={mode!r}: expected one of {_MODES}")
        return cls(
            mode=mode,
            bootstrap_servers=(pick("--kafka-bootstrap-servers", "KAFKA_BOOTSTRAP_SERVERS",
                                    "kafka_materializer_bootstrap_servers") or "").strip(),
            version=(pick("--kafka-version", "KAFKA_MATERIALIZER_KAFKA_VERSION", "kafka_materializer_version")
                     or default_version()).strip(),
            keep_topics=bool(pick("--kafka-keep-topics", None, "kafka_materializer_keep_topics")),
            start_early=bool(pick("--kafka-start-early", None, "kafka_materializer_start_early")),
            timeout_s=float(os.environ.get("KAFKA_MATERIALIZER_BROKER_TIMEOUT_S", "90")),
        )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "broker: needs a real Apache Kafka broker (fixture kafka_materializer_broker)")
    config.addinivalue_line(
        "markers", "schema_registry: needs a real Schema Registry (fixture kafka_materializer_schema_registry_url)")
    # kafka-python 3.0.12 loads its protocol schemas with importlib.resources' legacy read_text: ~200
    # DeprecationWarnings in a user's run that say nothing about the user's code.
    config.addinivalue_line("filterwarnings", r"ignore:.*is deprecated. Use files\(\) instead:DeprecationWarning")
    config.stash[_PROVIDER_KEY] = _BrokerProvider(config)


def pytest_sessionstart(session: pytest.Session) -> None:
    provider = session.config.stash.get(_PROVIDER_KEY, None)
    if provider is not None and provider.settings.start_early:
        provider.start_in_background()


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    provider = config.stash.get(_PROVIDER_KEY, None)
    if provider is None or config.getoption("collectonly", default=False):
        return
    # Under pytest-xdist every worker collects every test but runs only some: a worker starts its
    # broker when one of its tests asks for it, so workers given no broker test start none.
    if hasattr(config, "workerinput"):
        return
    if any(_BROKER_FIXTURES.intersection(getattr(item, "fixturenames", ())) for item in items):
        provider.start_in_background()


def pytest_report_header(config: pytest.Config) -> str:
    settings = BrokerSettings.from_config(config)
    return (f"kafka-materializer: --kafka-broker={settings.mode}, Apache Kafka {settings.version}"
            + (f", bootstrap {settings.bootstrap_servers}" if settings.bootstrap_servers else ""))


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    """One line naming the broker the session used (kind, Kafka version, image) and its start time."""
    provider = config.stash.get(_PROVIDER_KEY, None)
    handle = provider._handle if provider is not None else None
    if handle is not None:
        started = f", ready after {handle.startup_s:.1f} s" if handle.startup_s is not None else ""
        image = f", image {handle.image}" if handle.image else ""
        terminalreporter.write_line(f"kafka-materializer broker: {handle.kind} Apache Kafka {handle.version} "
                                    f"at {handle.bootstrap_servers}{image}{started}")


def pytest_unconfigure(config: pytest.Config) -> None:
    provider = config.stash.get(_PROVIDER_KEY, None)
    if provider is not None:
        provider.close()


_BROKER_FIXTURES = frozenset({
    "kafka_materializer_broker", "kafka_broker", "kafka_materializer_admin", "kafka_admin",
    "kafka_materializer_topic_factory", "create_topic", "kafka_materializer_producer",
    "kafka_materializer_consumer", "kafka_materializer_view", "kafka_materializer_compaction",
})


# ---------------------------------------------------------------------------------------------- provisioning

class _BrokerProvider:
    """Starts the session's broker once (possibly in a background thread) and stops it at the end."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self._settings: BrokerSettings | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._handle: KafkaBrokerHandle | None = None
        self._error: str | None = None
        self._stack = contextlib.ExitStack()
        self._ready = threading.Event()
        self._closing = threading.Event()

    @property
    def settings(self) -> BrokerSettings:
        if self._settings is None:
            self._settings = BrokerSettings.from_config(self.config)
        return self._settings

    def start_in_background(self) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._start, name="kafka-broker-start", daemon=True)
                self._thread.start()

    def get(self) -> KafkaBrokerHandle:
        """The broker handle, waiting for a start in progress. Raises pytest's Failed with the reason."""
        self.start_in_background()
        waited = time.monotonic()
        self._ready.wait()
        if self._error is not None:
            pytest.fail(self._error, pytrace=False)
        assert self._handle is not None
        if self._handle.startup_s is None:
            self._handle.startup_s = time.monotonic() - waited
        return self._handle

    def _start(self) -> None:
        # This thread lives until close(): a local broker's JVM gets SIGTERM when the thread that
        # started it ends (Linux PR_SET_PDEATHSIG is per thread), i.e. when this process dies.
        try:
            self._handle = _provide_broker(self.settings, self._stack, self._scratch())
        except _NoBroker as exc:
            self._error = str(exc)
        except BaseException as exc:  # noqa: BLE001 - reported to every test that needs the broker
            self._error = f"No Kafka broker available for this test: {type(exc).__name__}: {exc}"
        finally:
            self._ready.set()
        self._closing.wait()
        self._stack.close()

    def _scratch(self) -> Path:
        factory = getattr(self.config, "_tmp_path_factory", None)
        if factory is not None:
            return factory.mktemp("kafka-broker", numbered=True)
        return Path(tempfile.mkdtemp(prefix="kafka-broker-"))

    def close(self) -> None:
        self._closing.set()
        if self._thread is not None:
            self._thread.join()


class _NoBroker(Exception):
    """No broker could be had; the message is the reason shown in each failing test."""


def _importable(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ValueError:  # sys.modules[name] is None: imports of it are blocked
        return False


def _provide_broker(settings: BrokerSettings, stack: contextlib.ExitStack, scratch: Path) -> KafkaBrokerHandle:
    mode = settings.mode
    if mode == "external" or (mode == "auto" and settings.bootstrap_servers):
        if not settings.bootstrap_servers:
            raise _NoBroker("--kafka-broker=external but no --kafka-bootstrap-servers / KAFKA_BOOTSTRAP_SERVERS")
        log_dirs = os.environ.get("KAFKA_LOG_DIRS")
        return KafkaBrokerHandle("external", settings.bootstrap_servers, Path(log_dirs) if log_dirs else None,
                                 version=settings.version)
    problems: list[str] = []
    if mode in ("auto", "testcontainers"):
        missing = [name for name in ("docker", "testcontainers") if not _importable(name)]
        engine = None if missing else _docker_engine()
        if missing:
            problems.append(f"the Testcontainers mode needs {' and '.join(missing)}: "
                            "pip install 'kafka-materializer[testcontainers]'")
        elif engine is None:
            problems.append("no Docker engine answered (DOCKER_HOST or /var/run/docker.sock)")
        else:
            try:
                return _start_container(settings, stack, scratch, engine)
            except Exception as exc:  # noqa: BLE001 - fall back to the local broker in auto mode
                problems.append(f"Testcontainers Kafka failed: {exc}")
        if mode == "testcontainers":
            raise _NoBroker("--kafka-broker=testcontainers: " + "; ".join(problems))
    try:
        return _start_local(settings, stack)
    except BrokerProvisioningError as exc:
        problems.append(f"local Apache Kafka {settings.version} broker failed: {exc}")
        raise _NoBroker("No Kafka broker available for this test:\n" + "\n".join(problems)) from exc


# -- local broker shared by the processes of one run ------------------------------------------------

def _run_id() -> str:
    """Same for every pytest-xdist worker of one run (their controller's ``PYTEST_XDIST_TESTRUNUID``),
    unique per process otherwise."""
    return os.environ.get("PYTEST_XDIST_TESTRUNUID") or f"pid{os.getpid()}"


def _start_local(settings: BrokerSettings, stack: contextlib.ExitStack) -> KafkaBrokerHandle:
    """Start (or join) the local broker of this run: ``<cache>/runs/<run id>/`` holds its state dir,
    a lock file serialising start/stop and ``users/<pid>`` files; the last user stops it."""
    run_dir = Path(tempfile.gettempdir()) / "kafka-materializer-runs" / f"{_run_id()}-{settings.version}"
    run_dir.mkdir(parents=True, exist_ok=True)
    users = run_dir / "users"
    users.mkdir(exist_ok=True)
    started = time.monotonic()
    with _flock(run_dir / ".lock"):
        broker = None
        with contextlib.suppress(BrokerProvisioningError):
            attached = LocalKafkaBroker.attach(run_dir / "broker")
            if attached.is_running():
                broker = attached
        if broker is None:
            broker = LocalKafkaBroker(run_dir / "broker", version=settings.version, extra_config=TEST_BROKER_CONFIG,
                                      fast_start=True)
            try:
                broker.start(timeout_s=settings.timeout_s, detach=bool(os.environ.get("PYTEST_XDIST_TESTRUNUID")))
            except BaseException:
                if not any(users.iterdir()):
                    import shutil
                    shutil.rmtree(run_dir, ignore_errors=True)
                raise
        (users / str(os.getpid())).write_text("")
    stack.callback(_leave_local, run_dir, broker)
    return KafkaBrokerHandle("local", broker.bootstrap_servers, broker.log_dirs, version=settings.version,
                             local=broker, startup_s=time.monotonic() - started)


def _leave_local(run_dir: Path, broker: LocalKafkaBroker) -> None:
    import shutil

    with _flock(run_dir / ".lock"):
        (run_dir / "users" / str(os.getpid())).unlink(missing_ok=True)
        others = [p for p in (run_dir / "users").iterdir() if p.name.isdigit() and pid_alive(int(p.name))]
        if others:
            return
        broker.stop()
    shutil.rmtree(run_dir, ignore_errors=True)


@contextlib.contextmanager
def _flock(path: Path) -> Iterator[None]:
    with open(path, "w") as handle:
        lock_file(handle, purpose="the plugin's shared-broker lock")
        try:
            yield
        finally:
            unlock_file(handle)


# -- Testcontainers ---------------------------------------------------------------------------------

def _docker_engine(timeout_s: float = 3.0) -> Any:
    """A ``docker.DockerClient`` when an engine answers ``ping()`` within ``timeout_s``, else None
    (fast None when there is no socket at all)."""
    if not os.environ.get("DOCKER_HOST") and not Path("/var/run/docker.sock").exists():
        return None
    try:
        import docker
        client = docker.from_env(timeout=timeout_s)
        if client.ping():
            return client
        client.close()
    except Exception:  # noqa: BLE001 - any failure means "no usable engine"
        return None
    return None


def container_image(version: str, engine: Any = None) -> str:
    """The image for Kafka ``version``: ``$KAFKA_MATERIALIZER_TC_IMAGE``, else the local
    ``apache-kafka:<version>`` when ``engine`` has it, else the official ``apache/kafka:<version>``."""
    override = os.environ.get("KAFKA_MATERIALIZER_TC_IMAGE")
    if override:
        return override
    local = f"{LOCAL_IMAGE}:{version}"
    if engine is not None:
        with contextlib.suppress(Exception):
            engine.images.get(local)
            return local
    return f"{OFFICIAL_IMAGE}:{version}"


def container_broker_config(broker_port: int, controller_port: int) -> dict[str, str]:
    """``server.properties`` of the container broker: KRaft combined node 1, host networking,
    listeners on 127.0.0.1 only, :data:`BROKER_BASE_CONFIG` and :data:`TEST_BROKER_CONFIG`."""
    return {
        "process.roles": "broker,controller", "node.id": "1",
        "controller.quorum.voters": f"1@127.0.0.1:{controller_port}",
        "listeners": f"PLAINTEXT://127.0.0.1:{broker_port},CONTROLLER://127.0.0.1:{controller_port}",
        "advertised.listeners": f"PLAINTEXT://127.0.0.1:{broker_port}",
        "controller.listener.names": "CONTROLLER", "inter.broker.listener.name": "PLAINTEXT",
        "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
        "log.dirs": _CONTAINER_LOG_DIR,
        **BROKER_BASE_CONFIG, **TEST_BROKER_CONFIG,
    }


def container_env(image: str, properties: Mapping[str, str]) -> dict[str, str]:
    """Environment (name -> value) that makes ``image`` run with ``properties`` as its ``server.properties``:
    ``KAFKA_PROP_<key, '.' as '__'>`` (and ``KAFKA_JVM_OPTS``: C1 only) for the local ``apache-kafka``
    image (its entrypoint writes them to ``server.properties``); the official ``apache/kafka``
    convention (``KAFKA_<KEY>``, '.' as '_', '_' as '__', '-' as '___') otherwise."""
    if image.startswith(LOCAL_IMAGE + ":"):
        env = {"KAFKA_PROP_" + k.replace(".", "__"): v for k, v in properties.items()}
        env["KAFKA_JVM_OPTS"] = " ".join((*DEFAULT_JVM_OPTIONS, *FAST_START_JVM_OPTIONS))  # C1 only, as locally
        return env
    env = {"KAFKA_" + k.replace("_", "__").replace("-", "___").replace(".", "_").upper(): v
           for k, v in properties.items()}  # inverse of ConvertKey in apache/kafka docker/resources/utility
    env["CLUSTER_ID"] = "5L6g3nShT-eMCtK--X86sw"
    return env


def _start_container(settings: BrokerSettings, stack: contextlib.ExitStack, scratch: Path, engine: Any) -> KafkaBrokerHandle:
    os.environ.setdefault("TESTCONTAINERS_RYUK_DISABLED", "true")  # no reaper image offline; we stop it ourselves
    from testcontainers.core.config import testcontainers_config
    from testcontainers.core.container import DockerContainer

    testcontainers_config.ryuk_disabled = os.environ["TESTCONTAINERS_RYUK_DISABLED"].lower() == "true"
    image = container_image(settings.version, engine)
    broker_port = free_port()
    controller_port = free_port(exclude={broker_port})
    container = DockerContainer(image)
    container.with_kwargs(network_mode="host")
    for key, value in container_env(image, container_broker_config(broker_port, controller_port)).items():
        container.with_env(key, value)
    started = time.monotonic()
    container.start()
    stack.callback(container.stop)
    bootstrap = f"127.0.0.1:{broker_port}"
    _wait_for_container_broker(container, bootstrap, settings.timeout_s)
    return KafkaBrokerHandle("testcontainers", bootstrap, None, version=settings.version, container=container,
                             image=image, scratch_dir=scratch, startup_s=time.monotonic() - started)


def _wait_for_container_broker(container: Any, bootstrap: str, timeout_s: float) -> None:
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0, "socket.connection.setup.timeout.ms": 1000})
    deadline = time.monotonic() + timeout_s
    wrapped = container.get_wrapped_container()
    while True:
        wrapped.reload()
        if wrapped.status in ("exited", "dead"):
            logs = wrapped.logs(tail=30).decode("utf-8", "replace")
            raise BrokerProvisioningError(f"container {wrapped.short_id} exited during startup:\n{logs}")
        with contextlib.suppress(KafkaException):
            if admin.list_topics(timeout=2).brokers:
                return
        if time.monotonic() > deadline:
            logs = wrapped.logs(tail=30).decode("utf-8", "replace")
            raise BrokerProvisioningError(f"container broker did not answer on {bootstrap} within {timeout_s:.0f} s:\n{logs}")
        time.sleep(0.2)


_PROVIDER_KEY = pytest.StashKey[_BrokerProvider]()


# ---------------------------------------------------------------------------------------------- fixtures

@pytest.fixture(scope="session")
def kafka_materializer_broker(pytestconfig: pytest.Config) -> KafkaBrokerHandle:
    """A real Kafka broker for the whole session; see the module docstring for the choice and options."""
    provider = pytestconfig.stash.get(_PROVIDER_KEY, None)
    if provider is None:  # plugin configured without pytest_configure (should not happen)
        provider = pytestconfig.stash[_PROVIDER_KEY] = _BrokerProvider(pytestconfig)
    return provider.get()


@pytest.fixture(scope="session")
def kafka_materializer_admin(kafka_materializer_broker: KafkaBrokerHandle) -> Any:
    """``confluent_kafka.admin.AdminClient`` bound to the session's broker."""
    from confluent_kafka.admin import AdminClient
    return AdminClient({"bootstrap.servers": kafka_materializer_broker.bootstrap_servers})


def _wait_for_topic(admin: Any, name: str, partitions: int, timeout_s: float, log_dirs: Path | None) -> None:
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


def _delete_topics(admin: Any, names: list[str], timeout_s: float = 10.0) -> None:
    """DeleteTopics and wait until the metadata no longer lists them (so a later test can reuse a name)."""
    if not names:
        return
    for future in admin.delete_topics(names, operation_timeout=timeout_s).values():
        with contextlib.suppress(Exception):  # already gone
            future.result(timeout=timeout_s)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        listed = admin.list_topics(timeout=5).topics
        if not any(name in listed for name in names):
            return
        time.sleep(0.1)


class _TopicFactory:
    """Creates topics on the session's broker and remembers them for teardown."""

    def __init__(self, broker: KafkaBrokerHandle, admin: Any) -> None:
        self.broker, self.admin = broker, admin
        self.created: list[str] = []

    def __call__(self, name: str | None = None, partitions: int = 1, config: Mapping[str, str] | None = None, *,
                 timeout_s: float = 30.0) -> str:
        """Create topic ``name`` (``test-<hex>`` when None) with ``partitions`` partitions and topic
        ``config``; wait for every leader. Raises ``KafkaException`` (e.g. TOPIC_ALREADY_EXISTS) or
        ``TimeoutError``."""
        from confluent_kafka.admin import NewTopic

        name = name or f"test-{uuid.uuid4().hex[:12]}"
        new_topic = NewTopic(name, num_partitions=partitions, replication_factor=-1,
                             config={str(k): str(v) for k, v in (config or {}).items()})
        self.admin.create_topics([new_topic], operation_timeout=timeout_s)[name].result(timeout=timeout_s)
        self.created.append(name)
        _wait_for_topic(self.admin, name, partitions, timeout_s, self.broker.log_dirs)
        return name


@pytest.fixture
def kafka_materializer_topic_factory(pytestconfig: pytest.Config, kafka_materializer_broker: KafkaBrokerHandle,
                                     kafka_materializer_admin: Any) -> Iterator[Callable[..., str]]:
    """Factory creating topics that are deleted at teardown; see the module docstring."""
    factory = _TopicFactory(kafka_materializer_broker, kafka_materializer_admin)
    yield factory
    if not BrokerSettings.from_config(pytestconfig).keep_topics:
        _delete_topics(kafka_materializer_admin, factory.created)


@pytest.fixture
def kafka_materializer_producer(kafka_materializer_broker: KafkaBrokerHandle) -> Iterator[Any]:
    """An idempotent ``confluent_kafka.Producer`` (``acks=all``) bound to the broker; flushed at teardown,
    failing the test when records stay undelivered."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": kafka_materializer_broker.bootstrap_servers,
                         "enable.idempotence": True, "acks": "all", "linger.ms": 5})
    yield producer
    left = producer.flush(30)
    assert left == 0, f"{left} produced records were not delivered within 30 s"


@pytest.fixture
def kafka_materializer_consumer(kafka_materializer_broker: KafkaBrokerHandle) -> Iterator[Callable[..., Any]]:
    """Factory ``consumer(*topics, **config)`` -> a ``read_committed`` ``confluent_kafka.Consumer``
    (fresh group, from the earliest offset, subscribed to ``topics``); closed at teardown."""
    from confluent_kafka import Consumer

    consumers: list[Any] = []

    def make(*topics: str, **config: Any) -> Any:
        settings = {"bootstrap.servers": kafka_materializer_broker.bootstrap_servers,
                    "group.id": f"test-{uuid.uuid4().hex[:12]}", "isolation.level": "read_committed",
                    "auto.offset.reset": "earliest", "enable.auto.commit": False,
                    **{k.replace("_", "."): v for k, v in config.items()}}
        consumer = Consumer(settings)
        consumers.append(consumer)
        if topics:
            consumer.subscribe(list(topics))
        return consumer

    yield make
    for consumer in consumers:
        with contextlib.suppress(Exception):
            consumer.close()


@pytest.fixture
def _kafka_materializer_data_dirs() -> dict[str, Path]:
    """topic -> data dir of the view fixture's last materializer of it (shared with the compaction fixture)."""
    return {}


@pytest.fixture
def _kafka_materializer_writers() -> dict[str, Callable[[], None]]:
    """topic -> close() of the view fixture's open materializer of it (the compaction fixture needs its lock)."""
    return {}


@pytest.fixture
def kafka_materializer_view(kafka_materializer_broker: KafkaBrokerHandle, tmp_path_factory: pytest.TempPathFactory,
                            _kafka_materializer_data_dirs: dict[str, Path],
                            _kafka_materializer_writers: dict[str, Callable[[], None]]) -> Iterator[Callable[..., Any]]:
    """Factory ``materialize(topic, *, data_dir=None, options=None, until_caught_up=True) -> Materializer``;
    see the module docstring. Every materializer is closed at teardown."""
    from materializer.config import MaterializerOptions
    from materializer.materializer import Materializer

    open_ones: dict[Path, Any] = {}

    def materialize(topic: str, *, data_dir: Path | None = None, options: Any = None,
                    until_caught_up: bool = True) -> Any:
        """Start a Materializer of ``topic`` (closing a previous one on the same ``data_dir``: a restart)
        and run it until caught up. Raises whatever :class:`Materializer` raises (KafkaSourceError...)."""
        directory = Path(data_dir) if data_dir is not None else tmp_path_factory.mktemp(f"view-{topic}")
        previous = open_ones.pop(directory.resolve(), None)
        if previous is not None:
            previous.close()
        opts = options or MaterializerOptions(progress=False, poll_timeout_ms=200)
        materializer = Materializer(kafka_materializer_broker.bootstrap_servers, topic, directory, options=opts)
        materializer.start()
        open_ones[directory.resolve()] = materializer
        _kafka_materializer_data_dirs[topic] = directory
        _kafka_materializer_writers[topic] = materializer.close
        if until_caught_up:
            materializer.run(until_caught_up=True)
        return materializer

    yield materialize
    for materializer in open_ones.values():
        materializer.close()


@pytest.fixture
def kafka_materializer_compaction(kafka_materializer_broker: KafkaBrokerHandle,
                                  _kafka_materializer_data_dirs: dict[str, Path],
                                  _kafka_materializer_writers: dict[str, Callable[[], None]]) -> BrokerCompaction:
    """:class:`~materializer.testing.compaction_oracle.BrokerCompaction` bound to the broker (and to the data dirs
    of ``kafka_materializer_view``, whose materializer it closes before compacting)."""
    return BrokerCompaction(kafka_materializer_broker, _kafka_materializer_data_dirs, _kafka_materializer_writers)


@pytest.fixture(scope="session")
def kafka_materializer_schema_registry_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real Schema Registry's base URL for the session; see the module docstring."""
    configured = (os.environ.get("KAFKA_MATERIALIZER_SCHEMA_REGISTRY_URL") or os.environ.get("SCHEMA_REGISTRY_URL")
                  or "").strip()
    if configured:
        yield configured
        return
    from materializer.adapters.errors import SchemaRegistryProvisioningError
    from materializer.local.schema_registry import LocalSchemaRegistry

    registry = LocalSchemaRegistry(tmp_path_factory.mktemp("schema-registry"))
    try:
        registry.start()
    except SchemaRegistryProvisioningError as exc:
        pytest.fail(f"No Schema Registry available for this test: {exc}", pytrace=False)
    try:
        yield registry.url
    finally:
        registry.stop()


# -- the short names existing suites use -----------------------------------------------------------

@pytest.fixture(scope="session")
def kafka_broker(kafka_materializer_broker: KafkaBrokerHandle) -> KafkaBrokerHandle:
    """Alias of ``kafka_materializer_broker``."""
    return kafka_materializer_broker


@pytest.fixture(scope="session")
def kafka_admin(kafka_materializer_admin: Any) -> Any:
    """Alias of ``kafka_materializer_admin``."""
    return kafka_materializer_admin


@pytest.fixture
def create_topic(kafka_materializer_broker: KafkaBrokerHandle, kafka_materializer_admin: Any) -> Callable[..., str]:
    """The factory of ``kafka_materializer_topic_factory`` as it always behaved under this name: its
    topics are *kept* for the session (suites that reuse a topic across tests, or inspect its folder
    afterwards, rely on it)."""
    return _TopicFactory(kafka_materializer_broker, kafka_materializer_admin)


@pytest.fixture(scope="session")
def schema_registry_url(kafka_materializer_schema_registry_url: str) -> str:
    """Alias of ``kafka_materializer_schema_registry_url``."""
    return kafka_materializer_schema_registry_url
