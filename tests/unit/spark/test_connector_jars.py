"""Resolving Spark's Kafka connector with Maven (no network: a stand-in ``mvn`` answers as Central does)."""

from __future__ import annotations

import os
import stat
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from materializer.adapters.errors import SparkConnectorProvisioningError
from materializer.spark.connector_jars import (
    TOKEN_PROVIDER,
    ensure_spark_kafka_jars,
    render_spark_kafka_pom,
    spark_kafka_home,
)

# Answers like Maven Central for a release whose token provider is not served: the build fails naming
# the token provider of the exact version unless the POM pins another one (dependencyManagement).
_FAKE_MVN = f"""#!/bin/sh
for arg in "$@"; do
  case "$arg" in -f) next=pom;; -DoutputDirectory=*) out="${{arg#-DoutputDirectory=}}";; *) [ "$next" = pom ] && pom="$arg"; next=;; esac
done
echo "$@" >> "$(dirname "$pom")/mvn-calls"
if grep -q dependencyManagement "$pom"; then
  mkdir -p "$out/org/apache/kafka/kafka-clients/3.9.1" && touch "$out/org/apache/kafka/kafka-clients/3.9.1/kafka-clients-3.9.1.jar"
  exit 0
fi
echo "[ERROR] Failed to execute goal: The following artifacts could not be resolved: org.apache.spark:{TOKEN_PROVIDER}:jar:$(sed -n 's:.*<version>\\(.*\\)</version>.*:\\1:p' "$pom" | head -1) (absent): Could not find artifact"
exit 1
"""


@pytest.fixture
def fake_mvn(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    mvn = bin_dir / "mvn"
    mvn.write_text(_FAKE_MVN)
    mvn.chmod(mvn.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return tmp_path / "cache"


def test_pom_depends_on_the_connector_without_hadoop_and_pins_the_token_provider_on_request() -> None:
    ns = {"m": "http://maven.apache.org/POM/4.0.0"}
    plain = ET.fromstring(render_spark_kafka_pom("4.0.1"))
    (dep,) = plain.findall("m:dependencies/m:dependency", ns)
    assert [dep.findtext(f"m:{t}", namespaces=ns) for t in ("groupId", "artifactId", "version")] == [
        "org.apache.spark", "spark-sql-kafka-0-10_2.13", "4.0.1"]
    assert dep.findtext("m:exclusions/m:exclusion/m:groupId", namespaces=ns) == "org.apache.hadoop"
    assert plain.find("m:dependencyManagement", ns) is None
    pinned = ET.fromstring(render_spark_kafka_pom("4.0.1", "4.0.0"))
    managed = pinned.find("m:dependencyManagement/m:dependencies/m:dependency", ns)
    assert managed.findtext("m:artifactId", namespaces=ns) == TOKEN_PROVIDER
    assert managed.findtext("m:version", namespaces=ns) == "4.0.0"


def test_missing_token_provider_falls_back_to_the_first_release_of_the_minor_line(fake_mvn: Path) -> None:
    lib = ensure_spark_kafka_jars("9.9.1", cache_root=fake_mvn)
    assert [p.name for p in lib.rglob("*.jar")] == ["kafka-clients-3.9.1.jar"]
    assert f"{TOKEN_PROVIDER} 9.9.0" in (lib / ".complete").read_text()
    calls = (spark_kafka_home("9.9.1", fake_mvn) / "mvn-calls").read_text().splitlines()
    assert len(calls) == 2 and all("-Dmdep.useRepositoryLayout=true" in c for c in calls)
    assert ensure_spark_kafka_jars("9.9.1", cache_root=fake_mvn) == lib  # cached: mvn not called again
    assert len((spark_kafka_home("9.9.1", fake_mvn) / "mvn-calls").read_text().splitlines()) == 2


def test_no_fallback_for_a_first_release_names_the_missing_artifact(fake_mvn: Path) -> None:
    with pytest.raises(SparkConnectorProvisioningError) as info:
        ensure_spark_kafka_jars("9.9.0", cache_root=fake_mvn)
    message = str(info.value)
    assert f"org.apache.spark:{TOKEN_PROVIDER}:jar:9.9.0 (absent)" in message and "mvn" in message
