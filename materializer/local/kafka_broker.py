"""A real single-node Apache Kafka broker (KRaft, combined broker+controller) run from the official jars,
and broker-only nodes that join it (``join=``) for multi-broker tests.

No Docker and no fake broker: the jars come from Maven Central (see
:mod:`materializer.local.kafka_jars`) and the broker is ``java -cp lib/* kafka.Kafka server.properties``,
exactly what ``bin/kafka-server-start.sh`` runs.

State directory layout (everything the broker writes stays here)::

    <state_dir>/server.properties     rendered broker config (render_server_properties)
    <state_dir>/log4j2.xml            logging config (render_log4j2_config)
    <state_dir>/data/                 log.dirs: <topic>-<partition>/00000000000000000000.log, meta.properties, ...
    <state_dir>/logs/server.log       broker log; log-cleaner.log holds kafka.log.LogCleaner /
                                      org.apache.kafka.storage.internals.log.LogCleaner INFO lines
                                      (the "... MB/sec ..." cleaning statistics), like Kafka's own log4j2.yaml
    <state_dir>/broker.out            JVM stdout+stderr
    <state_dir>/ports.json            last {broker_port, controller_port}, reused on restart when free
    <state_dir>/broker.json           {pid, bootstrap_servers, log_dirs, version, broker_port, controller_port, detached}

Quorum: static voters (``controller.quorum.voters=1@127.0.0.1:<port>``) and ``StorageTool format`` *without*
``--standalone`` (kafka.tools.StorageTool rejects ``--standalone`` when static voters are set; the KIP-853
dynamic quorum would pin the controller endpoint into the metadata log, which breaks a restart on new
ports). Ports are picked free on the host each start, reusing the previous ones when still free.

Usage::

    with LocalKafkaBroker(tmp / "broker", extra_config=TEST_BROKER_CONFIG) as broker:
        broker.bootstrap_servers          # "127.0.0.1:41234"
        broker.log_dirs / "t-0"           # live partition folder
        broker.run_tool(DUMP_LOG_SEGMENTS_CLASS, ["--files", str(path)])

Run ``python -m materializer.local.kafka_broker fetch`` to pre-download the jars.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Mapping, Self, Sequence

from materializer.adapters.errors import BrokerProvisioningError
from materializer.local.jvm_service import JvmService, pid_alive, tail_text
from materializer.local.kafka_jars import (
    KAFKA_VERSION,
    cache_dir,
    classpath,
    default_version,
    ensure_kafka_jars,
    find_java,
    kafka_lib,
)
from materializer.local.ports import free_port, port_answers, port_is_free
from materializer.storage.file_lock import lock_file

__all__ = [
    "KAFKA_VERSION",
    "KAFKA_MAIN_CLASS",
    "STORAGE_TOOL_CLASS",
    "DUMP_LOG_SEGMENTS_CLASS",
    "BROKER_BASE_CONFIG",
    "TEST_BROKER_CONFIG",
    "FAST_START_JVM_OPTIONS",
    "MANAGED_KEYS",
    "BrokerProvisioningError",
    "LocalKafkaBroker",
    "render_server_properties",
    "render_log4j2_config",
    "generate_cluster_id",
    "run_kafka_tool",
]

KAFKA_MAIN_CLASS = "kafka.Kafka"
STORAGE_TOOL_CLASS = "kafka.tools.StorageTool"
DUMP_LOG_SEGMENTS_CLASS = "org.apache.kafka.tools.DumpLogSegments"  # kafka-tools, Kafka 4.3+

NODE_ID = 1
DEFAULT_JVM_OPTIONS: tuple[str, ...] = (
    "-Xms256m", "-Xmx1g", "-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20",
    "-XX:+ExitOnOutOfMemoryError", "-Djava.awt.headless=true",
)
TOOL_JVM_OPTIONS: tuple[str, ...] = ("-Xmx512m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1")
#: Added by ``fast_start=True``: C1 only (no C2 warm-up; start-up dominated by class loading and
#: interpretation). Measured on 2 shared cores: JVM launch to first metadata answer 5.0 s -> 3.4 s;
#: with the class-data-sharing archive below 1.7 s.
FAST_START_JVM_OPTIONS: tuple[str, ...] = ("-XX:TieredStopAtLevel=1",)

#: Single-node settings always applied (replication factors 1 for every internal topic).
BROKER_BASE_CONFIG: dict[str, str] = {
    "num.partitions": "1",
    "default.replication.factor": "1",
    "min.insync.replicas": "1",
    "offsets.topic.replication.factor": "1",
    "offsets.topic.num.partitions": "1",
    "transaction.state.log.replication.factor": "1",
    "transaction.state.log.min.isr": "1",
    "transaction.state.log.num.partitions": "1",
    "share.coordinator.state.topic.replication.factor": "1",
    "share.coordinator.state.topic.min.isr": "1",
    "group.initial.rebalance.delay.ms": "0",
}

#: Fast compaction/retention experiments (cleaner wakes every 100 ms, no delayed deletes), and
#: consumer groups whose session timeout may be lowered to seconds.
TEST_BROKER_CONFIG: dict[str, str] = {
    "log.cleaner.backoff.ms": "100",
    "log.retention.check.interval.ms": "1000",
    "log.segment.delete.delay.ms": "0",
    "log.initial.task.delay.ms": "0",  # ServerLogConfigs, present in 4.3 (default 30000 ms)
    "log.cleaner.dedupe.buffer.size": str(32 * 1024 * 1024),  # bytes, shared by cleaner threads
    "log.cleaner.threads": "1",
    # KIP-848 groups: only the lower bounds a group's own consumer.session.timeout.ms and
    # consumer.heartbeat.interval.ms (IncrementalAlterConfigs on the GROUP resource) may go down to,
    # so a test can detect a dead member in seconds; the broker's defaults (45 s, 5 s) are unchanged.
    "group.consumer.min.session.timeout.ms": "2000",
    "group.consumer.min.heartbeat.interval.ms": "500",
}

#: Keys rendered by this module; ``extra_config`` may not set them.
MANAGED_KEYS = frozenset({
    "process.roles", "node.id", "controller.quorum.voters", "controller.quorum.bootstrap.servers",
    "listeners", "advertised.listeners", "controller.listener.names", "inter.broker.listener.name",
    "listener.security.protocol.map", "log.dirs", "log.dir",
})

_BIND_ATTEMPTS = 3  # start attempts when a chosen port is taken before the broker binds it
_SSL_TEST_PASSWORD = "materializer-test"  # the SSL listener's throwaway keystore (a test broker on loopback)


def generate_cluster_id() -> str:
    """A Kafka ``Uuid`` string (22 chars, URL-safe base64 of 16 random bytes), as ``StorageTool random-uuid``."""
    while True:
        text = base64.urlsafe_b64encode(os.urandom(16)).decode().rstrip("=")
        if not text.startswith("-"):  # Uuid.randomUuid() avoids ids that look like CLI flags
            return text


def render_server_properties(*, log_dir: Path, broker_port: int, controller_port: int,
                             host: str = "127.0.0.1",
                             extra_config: Mapping[str, str] | None = None,
                             sasl_port: int | None = None,
                             sasl_plain_users: Mapping[str, str] | None = None,
                             node_id: int = NODE_ID, join_controller_port: int | None = None,
                             ssl_port: int | None = None, ssl_keystore: Path | None = None,
                             ssl_password: str = "") -> str:
    """``server.properties`` for a combined broker+controller with static voter ``NODE_ID``, or,
    with ``join_controller_port``, for a broker-only node ``node_id`` joining the cluster whose
    controller (voter ``NODE_ID``) listens there (``controller_port`` is then unused).

    Order: managed keys, :data:`BROKER_BASE_CONFIG`, then ``extra_config`` (which wins). With
    ``sasl_port`` a second client listener ``SASL_PLAINTEXT`` is opened there, taking SASL/PLAIN
    logins of ``sasl_plain_users`` (user -> password; Kafka ``PlainLoginModule`` ``user_<name>``).
    With ``ssl_port`` a client listener ``SSL`` is opened there with the PKCS12 ``ssl_keystore``
    (its store and key password ``ssl_password``); clients are not authenticated.

    Raises:
        ValueError: ``extra_config`` sets a key in :data:`MANAGED_KEYS`.
    """
    extra = dict(extra_config or {})
    clash = sorted(MANAGED_KEYS.intersection(extra))
    if clash:
        raise ValueError(f"extra_config may not set broker-managed keys: {', '.join(clash)}")
    joining = join_controller_port is not None
    props: dict[str, str] = {
        "process.roles": "broker" if joining else "broker,controller",
        "node.id": str(node_id),
        "controller.quorum.voters": f"{NODE_ID}@{host}:{join_controller_port if joining else controller_port}",
        "listeners": f"PLAINTEXT://{host}:{broker_port}" + ("" if joining else f",CONTROLLER://{host}:{controller_port}"),
        "advertised.listeners": f"PLAINTEXT://{host}:{broker_port}",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
        "log.dirs": str(log_dir),
    }
    if sasl_port is not None:
        props["listeners"] += f",SASL_PLAINTEXT://{host}:{sasl_port}"
        props["advertised.listeners"] += f",SASL_PLAINTEXT://{host}:{sasl_port}"
        props["listener.security.protocol.map"] += ",SASL_PLAINTEXT:SASL_PLAINTEXT"
        props["sasl.enabled.mechanisms"] = "PLAIN"
        users = " ".join(f'user_{name}="{password}"' for name, password in (sasl_plain_users or {}).items())
        props["listener.name.sasl_plaintext.plain.sasl.jaas.config"] = (
            f"org.apache.kafka.common.security.plain.PlainLoginModule required {users};")
    if ssl_port is not None:
        props["listeners"] += f",SSL://{host}:{ssl_port}"
        props["advertised.listeners"] += f",SSL://{host}:{ssl_port}"
        props["listener.security.protocol.map"] += ",SSL:SSL"
        props.update({"listener.name.ssl.ssl.keystore.type": "PKCS12",
                      "listener.name.ssl.ssl.keystore.location": str(ssl_keystore),
                      "listener.name.ssl.ssl.keystore.password": ssl_password,
                      "listener.name.ssl.ssl.key.password": ssl_password})
    props.update(BROKER_BASE_CONFIG)
    props.update({str(k): str(v) for k, v in extra.items()})
    lines = ["# Generated by materializer.local.kafka_broker"]
    lines += [f"{key}={_escape_property(value)}" for key, value in props.items()]
    return "\n".join(lines) + "\n"


def _escape_property(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n")


def render_log4j2_config(logs_dir: Path) -> str:
    """log4j2 XML: root INFO to ``server.log``; cleaner loggers to ``log-cleaner.log`` (no additivity),
    controller / state-change loggers to their own files, as Kafka's ``config/log4j2.yaml`` does."""
    def appender(name: str, file_name: str) -> str:
        return (f'    <File name="{name}" fileName="{logs_dir / file_name}" append="true">\n'
                f'      <PatternLayout pattern="[%d] %p %m (%c)%n"/>\n    </File>')

    def logger(name: str, ref: str, level: str = "INFO") -> str:
        return (f'    <Logger name="{name}" level="{level}" additivity="false">'
                f'<AppenderRef ref="{ref}"/></Logger>')

    cleaner = ["kafka.log.LogCleaner", "org.apache.kafka.storage.internals.log.LogCleaner",
               "org.apache.kafka.storage.internals.log.Cleaner",
               "org.apache.kafka.storage.internals.log.LogCleanerManager",
               # The per-round "MB of log processed" lines come from the nested CleanerThread class;
               # '$' is not a hierarchy separator for log4j2, so it needs its own entry.
               "org.apache.kafka.storage.internals.log.LogCleaner$CleanerThread"]
    loggers = [logger(name, "cleaner") for name in cleaner]
    loggers += [logger("kafka.controller", "controller"),
                logger("org.apache.kafka.controller", "controller"),
                logger("state.change.logger", "stateChange"),
                logger("kafka.request.logger", "server", "WARN"),
                logger("org.apache.kafka.raft", "server", "WARN")]
    return "\n".join([
        '<?xml version="1.0" encoding="UTF-8"?>',
        "<!-- Generated by materializer.local.kafka_broker -->",
        '<Configuration status="WARN">',
        "  <Appenders>",
        appender("server", "server.log"),
        appender("cleaner", "log-cleaner.log"),
        appender("controller", "controller.log"),
        appender("stateChange", "state-change.log"),
        "  </Appenders>",
        "  <Loggers>",
        *loggers,
        '    <Root level="INFO"><AppenderRef ref="server"/></Root>',
        "  </Loggers>",
        "</Configuration>",
        "",
    ])


_TOOL_LOG4J2 = """<?xml version="1.0" encoding="UTF-8"?>
<Configuration status="WARN">
  <Appenders><Console name="stderr" target="SYSTEM_ERR"><PatternLayout pattern="%p %m (%c)%n"/></Console></Appenders>
  <Loggers><Root level="WARN"><AppenderRef ref="stderr"/></Root></Loggers>
</Configuration>
"""


def run_kafka_tool(main_class: str, args: Sequence[str], *, timeout_s: float = 120.0,
                   version: str | None = None, cache_root: Path | None = None,
                   check: bool = False) -> subprocess.CompletedProcess[str]:
    """Run a Kafka command-line class (e.g. :data:`DUMP_LOG_SEGMENTS_CLASS`) on the broker's class path.

    No broker is needed. stdout/stderr are captured as text; tool logging goes to stderr at WARN.
    The jars are ``$KAFKA_HOME/libs`` when ``KAFKA_HOME`` is set, else Kafka ``version``'s (None:
    :data:`KAFKA_VERSION`) from Maven (:func:`~materializer.local.kafka_jars.kafka_lib`).

    Raises:
        BrokerProvisioningError: jars or Java unavailable, the tool timed out (``timeout_s`` seconds),
            or ``check`` is true and it exited non-zero.
    """
    lib = kafka_lib(version, cache_root=cache_root)
    log_config = cache_dir(version or default_version(), cache_root) / "tools-log4j2.xml"
    if not log_config.is_file():
        log_config.parent.mkdir(parents=True, exist_ok=True)
        log_config.write_text(_TOOL_LOG4J2)
    cmd = [find_java(), *TOOL_JVM_OPTIONS, f"-Dlog4j2.configurationFile={log_config}",
           "-cp", classpath(lib), main_class, *map(str, args)]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s,
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as exc:
        raise BrokerProvisioningError(f"{main_class} did not finish within {timeout_s:.0f} s") from exc
    if check and done.returncode != 0:
        raise BrokerProvisioningError(
            f"{main_class} {' '.join(map(str, args))} exited {done.returncode}:\n"
            f"{tail_text(done.stderr + done.stdout)}")
    return done


class LocalKafkaBroker(JvmService):
    """One ``kafka.Kafka`` JVM (KRaft combined mode, node id 1) owned by this process or attached by pid.

    Args:
        state_dir: directory for config, data (``log.dirs``), logs and ``broker.json``; created if missing
            and reusable across restarts (storage is formatted only once).
        version: Kafka release whose jars are used (None: ``$KAFKA_HOME``'s, else :data:`KAFKA_VERSION`).
            With ``KAFKA_HOME`` set (an unpacked Apache Kafka distribution), its ``libs/`` run the
            broker instead of the Maven download, and a ``version`` other than its own is refused
            at :meth:`start` (:func:`~materializer.local.kafka_jars.kafka_lib`).
        extra_config: broker properties applied after :data:`BROKER_BASE_CONFIG`
            (e.g. :data:`TEST_BROKER_CONFIG`); must not contain :data:`MANAGED_KEYS`.
        host: listener address; loopback only by default.
        jvm_options: JVM flags (default heap 256 MiB..1 GiB, G1).
        fast_start: start quickly for tests: :data:`FAST_START_JVM_OPTIONS`, an AppCDS archive of
            the broker's classes (JDK 13+ dynamic archive ``-XX:ArchiveClassesAtExit`` written by the
            first broker that stops, then ``-XX:SharedArchiveFile``; kept in
            ``<cache>/kafka-<version>/cds/``) and a KRaft ``log.dirs`` copied from a template
            formatted once (``<cache>/kafka-<version>/kraft-template``) instead of running
            ``StorageTool format`` (one JVM, ~1 s) each time. Same cluster id and directory id in
            every copy, which a single-node test broker does not mind.
        sasl_plain_users: user -> password: also open a SASL_PLAINTEXT listener taking SASL/PLAIN
            logins (:attr:`sasl_bootstrap_servers`), for tests of secured clients.
        ssl_listener: also open an SSL listener (:attr:`ssl_bootstrap_servers`) with a self-signed
            certificate for 127.0.0.1 made by the JDK's ``keytool`` at start; clients trust it
            through :attr:`ssl_ca_location` (PEM), for tests of TLS clients.
        join: a started broker whose controller this one joins as a broker-only node
            ``node_id`` (same cluster id; no controller of its own): a multi-broker cluster for
            replication and leader-change tests. Stopping it with :meth:`stop` is a controlled
            shutdown, which moves its partition leaderships to other in-sync replicas.
        node_id: this node's id when joining (``NODE_ID`` is the controller's).

    ``broker.json`` holds ``{pid, bootstrap_servers, log_dirs, version, host, broker_port,
    controller_port, detached}``; the lifecycle (:meth:`stop`, :meth:`attach`, :meth:`is_running`,
    :meth:`read_state`, the context manager) is :class:`~materializer.local.jvm_service.JvmService`'s.

    Raises:
        ValueError: ``extra_config`` sets a managed key; ``join`` is not started or ``node_id``
            is the controller's.

    Not thread-safe.
    """

    service_name = "broker"
    state_file = "broker.json"
    address_key = "bootstrap_servers"
    output_files = (("broker.out", 20), ("logs/server.log", 30))
    provisioning_error = BrokerProvisioningError

    def __init__(self, state_dir: Path, *, version: str | None = None,
                 extra_config: Mapping[str, str] | None = None, host: str = "127.0.0.1",
                 jvm_options: Sequence[str] = DEFAULT_JVM_OPTIONS, fast_start: bool = False,
                 sasl_plain_users: Mapping[str, str] | None = None,
                 join: "LocalKafkaBroker | None" = None, node_id: int = NODE_ID,
                 ssl_listener: bool = False) -> None:
        if join is not None and (join.controller_port is None or node_id == NODE_ID):
            raise ValueError("join= needs a started broker and a node_id other than the controller's "
                             f"{NODE_ID}")
        super().__init__(state_dir, host=host)
        self.join = join
        self.node_id = node_id
        self.sasl_plain_users = dict(sasl_plain_users) if sasl_plain_users else None
        self.sasl_port: int | None = None
        self.ssl_listener = ssl_listener
        self.ssl_port: int | None = None
        self.fast_start = fast_start
        self._cds_dump: Path | None = None
        self._requested_version = version
        self.version = version or default_version()
        self.extra_config = dict(extra_config or {})
        self.jvm_options = tuple(jvm_options)
        self.broker_port: int | None = None
        self.controller_port: int | None = None
        # the joined cluster's controller port: ``join``'s, or (a handle from attach) the state file's
        self._join_controller_port: int | None = None if join is None else join.controller_port
        render_server_properties(log_dir=self.log_dirs, broker_port=0, controller_port=0,
                                 host=host, extra_config=self.extra_config)  # validate early

    # ------------------------------------------------------------------ properties
    @property
    def sasl_bootstrap_servers(self) -> str:
        """``"host:port"`` of the SASL_PLAINTEXT (PLAIN) listener opened for ``sasl_plain_users``.

        Raises:
            BrokerProvisioningError: not started, or started without ``sasl_plain_users``.
        """
        if self.sasl_port is None:
            raise BrokerProvisioningError(f"broker in {self.state_dir} has no SASL listener (sasl_plain_users)")
        return f"{self.host}:{self.sasl_port}"

    @property
    def ssl_bootstrap_servers(self) -> str:
        """``"host:port"`` of the SSL listener opened for ``ssl_listener=True``.

        Raises:
            BrokerProvisioningError: not started, or started without ``ssl_listener``.
        """
        if self.ssl_port is None:
            raise BrokerProvisioningError(f"broker in {self.state_dir} has no SSL listener (ssl_listener)")
        return f"{self.host}:{self.ssl_port}"

    @property
    def ssl_ca_location(self) -> Path:
        """PEM file of the SSL listener's self-signed certificate (a client's ``ssl.ca.location``)."""
        return self.state_dir / "ssl" / "broker-cert.pem"

    @property
    def bootstrap_servers(self) -> str:
        """``"host:port"`` of the PLAINTEXT listener (:attr:`address`).

        Raises:
            BrokerProvisioningError: the broker has not been started or attached.
        """
        return self.address

    @property
    def log_dirs(self) -> Path:
        """The broker's ``log.dirs`` (one directory): ``<state_dir>/data``."""
        return self.state_dir / "data"

    @property
    def logs_dir(self) -> Path:
        """Directory of the broker's own log files (``server.log``, ``log-cleaner.log``, ...)."""
        return self.state_dir / "logs"

    @property
    def cleaner_log(self) -> Path:
        """``log-cleaner.log``: LogCleaner INFO output incl. the "... MB/sec" statistics lines."""
        return self.logs_dir / "log-cleaner.log"

    def partition_dir(self, topic: str, partition: int) -> Path:
        """Live folder ``<log_dirs>/<topic>-<partition>`` (may not exist yet)."""
        return self.log_dirs / f"{topic}-{partition}"

    # ------------------------------------------------------------------ lifecycle
    def start(self, timeout_s: float = 60.0, *, detach: bool = False) -> Self:
        """Resolve jars, format storage if needed, launch ``kafka.Kafka`` and wait until it serves metadata.

        Args:
            timeout_s: seconds to wait for the broker to answer an AdminClient ``list_topics``.
            detach: leave the broker running after this process exits (CLI use); otherwise the JVM
                gets SIGTERM when this process dies (Linux ``PR_SET_PDEATHSIG``).

        Ports are picked free, then bound by the JVM; when another process takes one in between
        ("Address already in use"), the start is tried again on new ports (3 attempts).

        Raises:
            BrokerProvisioningError: already running in ``state_dir``, jars/Java unavailable,
                ``StorageTool format`` failed, the JVM exited, or it did not answer within ``timeout_s``;
                the message ends with the tail of the broker output and ``server.log``.
        """
        self._refuse_second_start()
        lib = kafka_lib(self._requested_version)
        java = find_java()
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.logs_dir.mkdir(exist_ok=True)
        self.log_dirs.mkdir(exist_ok=True)
        for attempt in range(1, _BIND_ATTEMPTS + 1):
            try:
                return self._launch(java, lib, timeout_s, detach)
            except BrokerProvisioningError:
                # a port picked free was taken by another process before the JVM bound it
                if attempt == _BIND_ATTEMPTS or "Address already in use" not in self._output_since_launch():
                    raise
                (self.state_dir / "ports.json").unlink(missing_ok=True)
        raise AssertionError("unreachable")

    def _launch(self, java: str, lib: Path, timeout_s: float, detach: bool) -> Self:
        """One start attempt on newly chosen ports (see :meth:`start`)."""
        broker_port, controller_port = self._choose_ports()
        if self.join is not None:
            self._join_controller_port = self.join.controller_port
        if self._join_controller_port is not None:
            self.controller_port = None  # a broker-only node: the cluster's controller is join's
        taken = {broker_port, controller_port}
        if self.sasl_plain_users is not None:
            self.sasl_port = free_port(self.host, exclude=taken)
            taken.add(self.sasl_port)
        if self.ssl_listener:
            self.ssl_port = free_port(self.host, exclude=taken)
            self._make_ssl_keystore(java)
        properties = self.state_dir / "server.properties"
        properties.write_text(render_server_properties(
            log_dir=self.log_dirs, broker_port=broker_port, controller_port=controller_port,
            host=self.host, extra_config=self.extra_config, sasl_port=self.sasl_port,
            sasl_plain_users=self.sasl_plain_users, node_id=self.node_id,
            join_controller_port=self._join_controller_port,
            ssl_port=self.ssl_port, ssl_keystore=self._ssl_keystore, ssl_password=_SSL_TEST_PASSWORD))
        log4j = self.state_dir / "log4j2.xml"
        log4j.write_text(render_log4j2_config(self.logs_dir))
        if not (self.log_dirs / "meta.properties").is_file():
            if self._join_controller_port is not None:
                if self.join is None:
                    raise BrokerProvisioningError(f"{self.log_dirs} is not formatted: a broker-only node is "
                                                  "formatted with the cluster id of the broker it joins (join=)")
                self._format_storage(java, lib, properties, cluster_id=self.join.cluster_id())
            elif self.fast_start:
                self._copy_formatted_template(java, lib)
            else:
                self._format_storage(java, lib, properties)
        cmd = [java, *self.jvm_options, *self._fast_start_options(java), f"-Dlog4j2.configurationFile={log4j}",
               f"-Dkafka.logs.dir={self.logs_dir}", "-cp", classpath(lib), KAFKA_MAIN_CLASS, str(properties)]
        self._start_jvm(cmd, cwd=self.state_dir, detach=detach, timeout_s=timeout_s)
        return self

    # ------------------------------------------------------------------ tools
    def run_tool(self, main_class: str, args: Sequence[str], timeout_s: float = 120.0, *,
                 check: bool = False) -> subprocess.CompletedProcess[str]:
        """Run a Kafka tool class with this broker's class path; see :func:`run_kafka_tool`."""
        return run_kafka_tool(main_class, args, timeout_s=timeout_s, version=self.version, check=check)

    # ------------------------------------------------------------------ internals
    def _choose_ports(self) -> tuple[int, int]:
        """(broker_port, controller_port): the previous run's (``ports.json``) when both are still free,
        else new free ones, so a restarted broker usually keeps its bootstrap address."""
        ports_file = self.state_dir / "ports.json"
        try:
            previous = json.loads(ports_file.read_text())
            old_broker, old_controller = int(previous["broker_port"]), int(previous["controller_port"])
        except (OSError, ValueError, KeyError, TypeError):
            old_broker = old_controller = 0
        if old_broker and old_controller and old_broker != old_controller and \
                port_is_free(self.host, old_broker) and port_is_free(self.host, old_controller):
            self.broker_port, self.controller_port = old_broker, old_controller
        else:
            self.broker_port = free_port(self.host)
            self.controller_port = free_port(self.host, exclude={self.broker_port})
        ports_file.write_text(json.dumps({"broker_port": self.broker_port,
                                          "controller_port": self.controller_port}) + "\n")
        return self.broker_port, self.controller_port

    def _fast_start_options(self, java: str) -> list[str]:
        """JVM flags of ``fast_start``: C1 only plus the class-data-sharing archive (use it, or dump it)."""
        if not self.fast_start:
            return []
        cds_dir = cache_dir(self.version) / "cds"
        cds_dir.mkdir(parents=True, exist_ok=True)
        try:  # one archive per JVM build: a different java silently ignores (Xshare:auto) a foreign one
            stamp = f"{Path(java).resolve()}:{Path(java).resolve().stat().st_mtime_ns}"
        except OSError:
            stamp = java
        archive = cds_dir / f"broker-{hashlib.sha1(stamp.encode()).hexdigest()[:12]}.jsa"
        for dump in cds_dir.glob(f"{archive.stem}.*.tmp"):  # dumped by a broker another process stopped
            owner = dump.name.split(".")[1]
            if owner.isdigit() and pid_alive(int(owner)):
                continue  # its broker's stop() publishes it
            if owner.isdigit() and not archive.exists():
                with contextlib.suppress(OSError):  # another process may publish or remove it meanwhile
                    if dump.stat().st_size > 0:
                        os.replace(dump, archive)
            dump.unlink(missing_ok=True)
        if archive.is_file():
            return [*FAST_START_JVM_OPTIONS, f"-XX:SharedArchiveFile={archive}"]
        # written by the JVM when it exits; published atomically by stop() (parallel brokers each dump their own)
        self._cds_dump = archive.with_name(f"{archive.stem}.{os.getpid()}.{id(self)}.tmp")
        return [*FAST_START_JVM_OPTIONS, f"-XX:ArchiveClassesAtExit={self._cds_dump}"]

    def _publish_cds_archive(self) -> None:
        dump, self._cds_dump = self._cds_dump, None
        if dump is None:
            return
        final = dump.with_name(dump.name.split(".", 1)[0] + ".jsa")
        try:
            if dump.is_file() and dump.stat().st_size > 0 and not final.exists():
                os.replace(dump, final)
        finally:
            dump.unlink(missing_ok=True)

    def _copy_formatted_template(self, java: str, lib: Path) -> None:
        """Copy ``<cache>/kafka-<version>/kraft-template/data`` (formatted once, under a file lock) into ``log.dirs``."""
        template = cache_dir(self.version) / "kraft-template"
        template.mkdir(parents=True, exist_ok=True)
        with open(template / ".lock", "w") as lock:
            lock_file(lock, purpose="formatting the KRaft template")
            if not (template / "data" / "meta.properties").is_file():
                shutil.rmtree(template / "data", ignore_errors=True)
                properties = template / "server.properties"
                properties.write_text(render_server_properties(
                    log_dir=template / "data", broker_port=free_port(self.host), controller_port=free_port(self.host),
                    host=self.host, extra_config=self.extra_config))
                (template / "log4j2.xml").write_text(_TOOL_LOG4J2)
                self._format_storage(java, lib, properties, log4j=template / "log4j2.xml")
        shutil.copytree(template / "data", self.log_dirs, dirs_exist_ok=True)

    @property
    def _ssl_keystore(self) -> Path:
        return self.state_dir / "ssl" / "broker.p12"

    def _make_ssl_keystore(self, java: str) -> None:
        """A PKCS12 keystore with a self-signed RSA certificate for 127.0.0.1/localhost (made once),
        and its certificate as PEM (:attr:`ssl_ca_location`), with the JDK's ``keytool``."""
        if self._ssl_keystore.is_file() and self.ssl_ca_location.is_file():
            return
        self._ssl_keystore.parent.mkdir(parents=True, exist_ok=True)
        self._ssl_keystore.unlink(missing_ok=True)
        keytool = str(Path(java).with_name("keytool"))
        common = ["-keystore", str(self._ssl_keystore), "-storepass", _SSL_TEST_PASSWORD, "-alias", "broker"]
        for args in (["-genkeypair", "-keyalg", "RSA", "-keysize", "2048", "-validity", "30", "-storetype", "PKCS12",
                      "-dname", "CN=localhost", "-ext", f"SAN=ip:{self.host},dns:localhost",
                      "-keypass", _SSL_TEST_PASSWORD, *common],
                     ["-exportcert", "-rfc", "-file", str(self.ssl_ca_location), *common]):
            done = subprocess.run([keytool, *args], capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
            if done.returncode != 0:
                raise BrokerProvisioningError(f"keytool {args[0]} failed (exit {done.returncode}):\n"
                                              f"{tail_text(done.stdout + done.stderr)}")

    def cluster_id(self) -> str:
        """The cluster id formatted into ``log.dirs`` (``meta.properties``).

        Raises:
            BrokerProvisioningError: the storage is not formatted yet.
        """
        try:
            lines = (self.log_dirs / "meta.properties").read_text().splitlines()
        except OSError as exc:
            raise BrokerProvisioningError(f"broker in {self.state_dir} has no formatted storage: {exc}") from exc
        for line in lines:
            key, _, value = line.partition("=")
            if key.strip() == "cluster.id":
                return value.strip()
        raise BrokerProvisioningError(f"no cluster.id in {self.log_dirs / 'meta.properties'}")

    def _format_storage(self, java: str, lib: Path, properties: Path, *, log4j: Path | None = None,
                        cluster_id: str | None = None) -> None:
        cmd = [java, *TOOL_JVM_OPTIONS, "-Dlog4j2.configurationFile=" + str(log4j or self.state_dir / "log4j2.xml"),
               "-cp", classpath(lib), STORAGE_TOOL_CLASS, "format", "--ignore-formatted",
               "-t", cluster_id or generate_cluster_id(), "-c", str(properties)]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
        if done.returncode != 0:
            raise BrokerProvisioningError(
                f"'{STORAGE_TOOL_CLASS} format -c {properties}' failed (exit {done.returncode}):\n"
                f"{tail_text(done.stdout + done.stderr)}")

    # ------------------------------------------------------------------ JvmService
    def _address(self) -> str | None:
        return None if self.broker_port is None else f"{self.host}:{self.broker_port}"

    def _identity_args(self) -> tuple[str, ...]:
        return (KAFKA_MAIN_CLASS, str(self.state_dir / "server.properties"))

    def _probe(self, timeout_s: float) -> bool:
        """The PLAINTEXT port accepts a connection and an AdminClient ``list_topics`` names a
        broker within ``timeout_s`` seconds."""
        if self.broker_port is None or not port_answers(self.host, self.broker_port):
            return False
        from confluent_kafka import KafkaException
        from confluent_kafka.admin import AdminClient
        admin = AdminClient({"bootstrap.servers": self.bootstrap_servers, "log_level": 0,
                             "socket.connection.setup.timeout.ms": 1000,
                             "reconnect.backoff.max.ms": 500})
        try:
            return bool(admin.list_topics(timeout=timeout_s).brokers)
        except KafkaException:
            return False

    def _state(self) -> dict[str, Any]:
        return {"bootstrap_servers": self.bootstrap_servers, "log_dirs": str(self.log_dirs),
                "version": self.version, "host": self.host, "broker_port": self.broker_port,
                "controller_port": self.controller_port, "node_id": self.node_id,
                "join_controller_port": self._join_controller_port}

    @classmethod
    def _from_state(cls, state_dir: Path, state: Mapping[str, Any]) -> Self:
        """A handle from ``broker.json``; a broker-only node that joined another's cluster has no
        controller port of its own (``controller_port: null``) and keeps its node id and the
        controller port it joined, so :meth:`stop` then :meth:`start` bring it back in that cluster."""
        broker = cls(state_dir, version=state.get("version", KAFKA_VERSION), host=state.get("host", "127.0.0.1"))
        broker.broker_port = int(state["broker_port"])
        broker.controller_port = _optional_port(state.get("controller_port"))
        broker.node_id = int(state.get("node_id", NODE_ID))
        broker._join_controller_port = _optional_port(state.get("join_controller_port"))
        return broker

    def _after_stop(self) -> None:
        self._publish_cds_archive()


def _optional_port(value: Any) -> int | None:
    """A port field of a state file: None (JSON null, absent) or an int."""
    return None if value is None else int(value)


def _main(argv: Sequence[str]) -> int:
    """``python -m materializer.local.kafka_broker fetch``: download the jars, print the lib dir."""
    if list(argv[:1]) != ["fetch"]:
        print("usage: python -m materializer.local.kafka_broker fetch", file=sys.stderr)
        return 2
    try:
        lib = ensure_kafka_jars(KAFKA_VERSION)
    except BrokerProvisioningError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"Apache Kafka {KAFKA_VERSION} jars: {lib}")
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
