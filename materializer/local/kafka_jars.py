"""Apache Kafka's broker and tool jars, resolved from Maven Central into the jar cache
(:mod:`materializer.local.maven_jars`), and the ``java`` that runs them.

Layout in the cache (root = ``$KAFKA_MATERIALIZER_CACHE`` or ``~/.cache/kafka-materializer``)::

    <root>/kafka-<version>/pom.xml       generated, depends on the artifacts below
    <root>/kafka-<version>/lib/*.jar     ``mvn dependency:copy-dependencies`` output (~55 MB, ~90 jars)
    <root>/kafka-<version>/lib/.complete marker written after a successful copy (idempotence)
    <root>/kafka-<version>/.lock         flock held while resolving (parallel pytest sessions)

Artifacts (Scala 2.13): ``org.apache.kafka:kafka_2.13`` (broker main class ``kafka.Kafka`` and
``kafka.tools.StorageTool``), ``org.apache.kafka:kafka-tools`` (``org.apache.kafka.tools.DumpLogSegments``
on Kafka 4.3+), and a log4j2 backend: Kafka 4.x logs through slf4j 1.7.36, so the binding is
``log4j-slf4j-impl`` (not ``log4j-slf4j2-impl``) plus ``log4j-core``. Kafka declares its logging
backend ``compileOnly`` (build.gradle ``project(':core')``), so it must be added here.

Instead of the Maven download, ``KAFKA_HOME`` may name an unpacked Apache Kafka distribution
(``kafka_2.13-X.Y.Z.tgz`` from kafka.apache.org: ``libs/*.jar``, ``bin/``): its ``libs/`` is the
class path and its broker jar ``libs/kafka_<scala>-<version>.jar`` gives the version
(:func:`kafka_distribution`, :func:`kafka_lib`). What the launcher caches for it (the CDS archive,
the formatted KRaft template, the tools' log config) lives in
``<root>/kafka-home-<hash of its path>/`` (:func:`cache_dir`).

Raises :class:`~materializer.adapters.errors.BrokerProvisioningError` naming the ``mvn`` command
and its last output lines when resolution fails, and naming ``KAFKA_HOME`` and what it lacks when
it does not look like a Kafka distribution.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass
from pathlib import Path

from materializer.adapters.errors import BrokerProvisioningError
from materializer.local import jvm_service
from materializer.local.maven_jars import copy_maven_dependencies, default_cache_root

__all__ = [
    "KAFKA_HOME_ENV_VAR",
    "KAFKA_VERSION",
    "KafkaDistribution",
    "cache_dir",
    "kafka_distribution",
    "kafka_lib",
    "SCALA_BINARY_VERSION",
    "LOG4J_VERSION",
    "default_version",
    "kafka_home",
    "render_pom",
    "ensure_kafka_jars",
    "classpath",
    "find_java",
]

# The one place the Kafka version is pinned.
# 4.4.0 is the newest 4.x *announced* on Maven Central, but only part of it is published there:
# kafka_2.13/kafka-clients/kafka-server/kafka-storage 4.4.0 exist, while kafka-tools-api 4.4.0 (a
# runtime dependency of kafka_2.13 4.4.0) and kafka-tools 4.4.0 return 404 (their maven-metadata.xml
# stops at 4.3.1). 4.3.1 is the newest release that resolves completely. Try a newer one with
# KAFKA_MATERIALIZER_KAFKA_VERSION=4.4.0 once Central has it.
KAFKA_VERSION = os.environ.get("KAFKA_MATERIALIZER_KAFKA_VERSION") or "4.3.1"
SCALA_BINARY_VERSION = "2.13"
LOG4J_VERSION = "2.25.4"
MAVEN_DEPENDENCY_PLUGIN_VERSION = "3.8.1"


KAFKA_HOME_ENV_VAR = "KAFKA_HOME"

# libs/kafka_2.13-4.3.1.jar: the broker (kafka.Kafka, StorageTool), as the distribution names it
# (kafka_2.13-4.3.1-test.jar and -sources/-javadoc jars do not match)
_BROKER_JAR = re.compile(r"kafka_(?P<scala>\d+\.\d+)-(?P<version>\d+\.\d+\.\d+)\.jar")


@dataclass(frozen=True)
class KafkaDistribution:
    """An unpacked Apache Kafka distribution: ``home`` (``$KAFKA_HOME``), its ``lib`` folder
    (``home/libs``, the class path) and the Kafka ``version`` of its broker jar."""

    home: Path
    lib: Path
    version: str


def kafka_distribution(home: Path) -> KafkaDistribution:
    """``home`` as a Kafka distribution: ``libs/`` with exactly one broker jar
    ``kafka_<scala>-<version>.jar`` (``-test``/``-sources``/``-javadoc`` jars aside) and
    ``kafka-clients-<version>.jar`` of the same version.

    Raises:
        BrokerProvisioningError: ``home`` is not a folder, or lacks ``libs/``, the broker jar or the
            clients jar, or holds two broker versions (the message names ``KAFKA_HOME`` and what is missing).
    """
    what = f"{KAFKA_HOME_ENV_VAR}={home} does not look like an unpacked Apache Kafka distribution (kafka_2.13-X.Y.Z.tgz"
    if not home.is_dir():
        raise BrokerProvisioningError(f"{what}): no such folder")
    lib = home / "libs"
    if not lib.is_dir():
        raise BrokerProvisioningError(f"{what}): it has no libs/ folder")
    versions = sorted({m["version"] for path in lib.glob("kafka_*.jar") if (m := _BROKER_JAR.fullmatch(path.name))})
    if not versions:
        raise BrokerProvisioningError(f"{what}): no broker jar libs/kafka_<scala>-<version>.jar in {lib}")
    if len(versions) > 1:
        raise BrokerProvisioningError(f"{what}): broker jars of several versions in {lib}: {', '.join(versions)}")
    version = versions[0]
    if not (lib / f"kafka-clients-{version}.jar").is_file():
        raise BrokerProvisioningError(f"{what}): no libs/kafka-clients-{version}.jar beside the broker jar")
    return KafkaDistribution(home, lib, version)


def _distribution_from_env() -> KafkaDistribution | None:
    home = os.environ.get(KAFKA_HOME_ENV_VAR, "").strip()
    return kafka_distribution(Path(home).expanduser()) if home else None


def default_version() -> str:
    """The Kafka version used when none is asked for: ``$KAFKA_HOME``'s when it is set and looks like
    a distribution, else :data:`KAFKA_VERSION` (a bad ``KAFKA_HOME`` fails later, in :func:`kafka_lib`)."""
    try:
        distribution = _distribution_from_env()
    except BrokerProvisioningError:
        return KAFKA_VERSION
    return distribution.version if distribution is not None else KAFKA_VERSION


def kafka_lib(version: str | None = None, *, cache_root: Path | None = None) -> Path:
    """The folder of jars that runs Kafka ``version`` (None: :func:`default_version`): ``$KAFKA_HOME/libs``
    when ``KAFKA_HOME`` is set, else the Maven download (:func:`ensure_kafka_jars`).

    Raises:
        BrokerProvisioningError: ``KAFKA_HOME`` does not look like a distribution
            (:func:`kafka_distribution`) or holds another version than ``version``; or the download failed.
    """
    distribution = _distribution_from_env()
    if distribution is None:
        return ensure_kafka_jars(version or KAFKA_VERSION, cache_root=cache_root)
    if version is not None and version != distribution.version:
        raise BrokerProvisioningError(
            f"{KAFKA_HOME_ENV_VAR}={distribution.home} holds Apache Kafka {distribution.version}, not the {version} "
            f"asked for: ask for {distribution.version}, or unset {KAFKA_HOME_ENV_VAR} to download {version}")
    return distribution.lib


def cache_dir(version: str, cache_root: Path | None = None) -> Path:
    """Where the launcher caches what it derives from the jars of ``version`` (CDS archive, KRaft
    template, tools' log config): :func:`kafka_home` for the Maven download, or
    ``<root>/kafka-home-<sha1 of the resolved $KAFKA_HOME>[:12]`` for a distribution (another
    class path, so another CDS archive)."""
    home = os.environ.get(KAFKA_HOME_ENV_VAR, "").strip()
    if not home:
        return kafka_home(version, cache_root)
    digest = hashlib.sha1(str(Path(home).expanduser().resolve()).encode()).hexdigest()[:12]
    return (cache_root or default_cache_root()) / f"kafka-home-{digest}"


def kafka_home(version: str = KAFKA_VERSION, cache_root: Path | None = None) -> Path:
    """Directory holding ``pom.xml`` and ``lib/`` for one Kafka version."""
    return (cache_root or default_cache_root()) / f"kafka-{version}"


def render_pom(version: str = KAFKA_VERSION) -> str:
    """The throw-away ``pom.xml`` whose dependencies are the broker + tools + log4j2 backend."""
    deps = [
        ("org.apache.kafka", f"kafka_{SCALA_BINARY_VERSION}", version),
        ("org.apache.kafka", "kafka-tools", version),
        ("org.apache.logging.log4j", "log4j-slf4j-impl", LOG4J_VERSION),
        ("org.apache.logging.log4j", "log4j-core", LOG4J_VERSION),
    ]
    dep_xml = "\n".join(
        f"    <dependency><groupId>{g}</groupId><artifactId>{a}</artifactId><version>{v}</version></dependency>"
        for g, a, v in deps
    )
    return f"""<?xml version="1.0" encoding="UTF-8"?>
<!-- Generated by materializer.local.kafka_jars; safe to delete. -->
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>local.kafka-materializer</groupId>
  <artifactId>kafka-broker-classpath</artifactId>
  <version>{version}</version>
  <packaging>pom</packaging>
  <dependencies>
{dep_xml}
  </dependencies>
  <build>
    <pluginManagement>
      <plugins>
        <plugin>
          <groupId>org.apache.maven.plugins</groupId>
          <artifactId>maven-dependency-plugin</artifactId>
          <version>{MAVEN_DEPENDENCY_PLUGIN_VERSION}</version>
        </plugin>
      </plugins>
    </pluginManagement>
  </build>
</project>
"""


def ensure_kafka_jars(version: str = KAFKA_VERSION, *, cache_root: Path | None = None,
                      timeout_s: float = 900.0) -> Path:
    """Return the ``lib/`` directory with every jar needed to run Kafka ``version``.

    Runs ``mvn -q -B dependency:copy-dependencies`` once
    (:func:`~materializer.local.maven_jars.copy_maven_dependencies`); later calls return
    immediately when the ``lib/.complete`` marker exists. Safe to call from parallel processes (file lock).

    Raises:
        BrokerProvisioningError: ``mvn`` is not installed, fails (message names the artifacts Maven
            Central lacks, e.g. ``org.apache.kafka:kafka-tools:jar:4.4.0``, and has its last output
            lines) or takes longer than ``timeout_s`` seconds.
    """
    return copy_maven_dependencies(kafka_home(version, cache_root), render_pom(version), f"Apache Kafka {version}",
                                   error=BrokerProvisioningError, timeout_s=timeout_s)


def classpath(lib: Path) -> str:
    """Java class path for every jar in ``lib`` (the JVM expands ``dir/*`` itself)."""
    return str(lib / "*")


def find_java() -> str:
    """Path of the ``java`` launcher that runs Kafka: ``$JAVA_HOME/bin/java`` if present, else ``java`` on PATH.

    Raises:
        BrokerProvisioningError: no Java runtime found (Kafka's broker needs Java 17+).
    """
    return jvm_service.find_java(what="Kafka", error=BrokerProvisioningError)
