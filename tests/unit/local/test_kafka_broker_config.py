"""Broker config / pom / log4j2 rendering and the broker CLI's no-broker paths (no JVM started)."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from click.testing import CliRunner

from materializer.adapters.errors import AdapterError, BrokerProvisioningError
from materializer.local.kafka_broker import (
    BROKER_BASE_CONFIG,
    TEST_BROKER_CONFIG,
    LocalKafkaBroker,
    generate_cluster_id,
    render_log4j2_config,
    render_server_properties,
)
from materializer.local.kafka_jars import KAFKA_VERSION, ensure_kafka_jars, kafka_home, render_pom
from materializer.cli.broker import broker


def _parse(text: str) -> dict[str, str]:
    props = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            props[key] = value
    return props


def test_server_properties_single_node_kraft(tmp_path: Path) -> None:
    props = _parse(render_server_properties(log_dir=tmp_path / "data", broker_port=9092, controller_port=9093))
    assert props["process.roles"] == "broker,controller"
    assert props["node.id"] == "1"
    assert props["controller.quorum.voters"] == "1@127.0.0.1:9093"
    assert props["listeners"] == "PLAINTEXT://127.0.0.1:9092,CONTROLLER://127.0.0.1:9093"
    assert props["advertised.listeners"] == "PLAINTEXT://127.0.0.1:9092"
    assert props["log.dirs"] == str(tmp_path / "data")
    for key in ("offsets.topic.replication.factor", "transaction.state.log.replication.factor",
                "share.coordinator.state.topic.replication.factor", "transaction.state.log.min.isr",
                "min.insync.replicas"):
        assert props[key] == "1", key
    assert props["group.initial.rebalance.delay.ms"] == "0"
    assert "controller.quorum.bootstrap.servers" not in props  # static voters, formatted without --standalone


def test_server_properties_of_a_broker_joining_the_controller(tmp_path: Path) -> None:
    props = _parse(render_server_properties(log_dir=tmp_path / "data", broker_port=9094, controller_port=0,
                                            node_id=2, join_controller_port=9093))
    assert props["process.roles"] == "broker" and props["node.id"] == "2"
    assert props["controller.quorum.voters"] == "1@127.0.0.1:9093"  # the first node's controller
    assert props["listeners"] == "PLAINTEXT://127.0.0.1:9094"  # no controller listener of its own
    assert props["controller.listener.names"] == "CONTROLLER"
    with pytest.raises(ValueError, match="node_id other than the controller's"):
        LocalKafkaBroker(tmp_path / "b", join=LocalKafkaBroker(tmp_path / "a"))  # not started


def test_extra_config_wins_and_test_config_is_fast(tmp_path: Path) -> None:
    extra = {**TEST_BROKER_CONFIG, "num.partitions": "4"}
    props = _parse(render_server_properties(log_dir=tmp_path, broker_port=1, controller_port=2, extra_config=extra))
    assert props["num.partitions"] == "4" != BROKER_BASE_CONFIG["num.partitions"]
    assert props["log.cleaner.backoff.ms"] == "100"
    assert props["log.segment.delete.delay.ms"] == "0"
    assert props["log.retention.check.interval.ms"] == "1000"


def test_managed_keys_are_rejected(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="log.dirs"):
        render_server_properties(log_dir=tmp_path, broker_port=1, controller_port=2, extra_config={"log.dirs": "/x"})
    with pytest.raises(ValueError, match="listeners"):
        LocalKafkaBroker(tmp_path, extra_config={"listeners": "PLAINTEXT://:1"})


def test_log4j2_routes_cleaner_to_its_own_file(tmp_path: Path) -> None:
    root = ET.fromstring(render_log4j2_config(tmp_path))
    files = {a.get("name"): a.get("fileName") for a in root.iter("File")}
    assert files["cleaner"] == str(tmp_path / "log-cleaner.log")
    loggers = {lg.get("name"): lg for lg in root.iter("Logger")}
    for name in ("kafka.log.LogCleaner", "org.apache.kafka.storage.internals.log.LogCleaner"):
        assert loggers[name].get("level") == "INFO"
        assert loggers[name].get("additivity") == "false"
        assert loggers[name].find("AppenderRef").get("ref") == "cleaner"


def test_pom_lists_broker_tools_and_slf4j1_binding() -> None:
    root = ET.fromstring(render_pom("9.9.9"))
    ns = {"m": "http://maven.apache.org/POM/4.0.0"}
    deps = {(d.findtext("m:artifactId", namespaces=ns), d.findtext("m:version", namespaces=ns))
            for d in root.iterfind("m:dependencies/m:dependency", ns)}
    artifacts = {a for a, _ in deps}
    assert ("kafka_2.13", "9.9.9") in deps and ("kafka-tools", "9.9.9") in deps
    assert {"log4j-slf4j-impl", "log4j-core"} <= artifacts  # Kafka 4.x uses slf4j 1.7
    assert KAFKA_VERSION.count(".") == 2


def test_cluster_id_looks_like_kafka_uuid() -> None:
    for _ in range(50):
        cid = generate_cluster_id()
        assert len(cid) == 22 and not cid.startswith("-")


def test_missing_maven_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no mvn on PATH
    with pytest.raises(BrokerProvisioningError, match="Maven") as info:
        ensure_kafka_jars("0.0.1", cache_root=tmp_path)
    assert isinstance(info.value, AdapterError)


def test_marker_makes_resolution_idempotent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    lib = kafka_home("0.0.2", tmp_path) / "lib"
    lib.mkdir(parents=True)
    (lib / ".complete").write_text("done\n")
    monkeypatch.setenv("PATH", str(tmp_path))  # mvn would be needed if it resolved again
    assert ensure_kafka_jars("0.0.2", cache_root=tmp_path) == lib


def test_cli_status_exits_1_without_broker(tmp_path: Path) -> None:
    result = CliRunner().invoke(broker, ["status", "--state-dir", str(tmp_path / "none")])
    assert result.exit_code == 1
    assert "no broker running" in result.output


def test_cli_stop_without_broker_is_a_noop(tmp_path: Path) -> None:
    result = CliRunner().invoke(broker, ["stop", "--state-dir", str(tmp_path)])
    assert result.exit_code == 0


def test_cli_status_ignores_stale_pid_file(tmp_path: Path) -> None:
    (tmp_path / "broker.json").write_text(
        '{"pid": 999999999, "broker_port": 1, "controller_port": 2, "bootstrap_servers": "127.0.0.1:1"}')
    result = CliRunner().invoke(broker, ["status", "--state-dir", str(tmp_path)])
    assert result.exit_code == 1


def test_cli_start_rejects_bad_override(tmp_path: Path) -> None:
    result = CliRunner().invoke(broker, ["start", "--state-dir", str(tmp_path), "-c", "novalue"])
    assert result.exit_code == 2
    assert "KEY=VALUE" in result.output
