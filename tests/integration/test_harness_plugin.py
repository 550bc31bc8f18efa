"""The pytest plugin as a user meets it: an inner ``pytest`` run in a fresh folder (no conftest, the plugin
comes from the installed entry point), against this session's broker or none at all."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from materializer.local.kafka_broker import TEST_BROKER_CONFIG, LocalKafkaBroker
from materializer.local.kafka_jars import kafka_home

pytestmark = pytest.mark.broker

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _inner_pytest(folder: Path, *args: str, env: dict[str, str] | None = None,
                  timeout_s: float = 300) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items()
             if not k.startswith(("KAFKA_MATERIALIZER_BROKER", "KAFKA_BOOTSTRAP_SERVERS", "KAFKA_LOG_DIRS",
                                  "PYTEST_ADDOPTS", "PYTEST_XDIST"))}
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rA", *args],
                          cwd=folder, capture_output=True, text=True, timeout=timeout_s, env={**clean, **(env or {})})


def test_topic_factory_deletes_its_topics_unless_asked_to_keep_them(kafka_broker, kafka_admin, tmp_path) -> None:
    (tmp_path / "test_topics.py").write_text(textwrap.dedent("""
        def test_make(kafka_materializer_topic_factory, kafka_materializer_producer, kafka_materializer_consumer):
            topic = kafka_materializer_topic_factory("harness-" + __import__("os").environ["SUFFIX"], partitions=2)
            kafka_materializer_producer.produce(topic, key=b"k", value=b"v", partition=1)
            assert kafka_materializer_producer.flush(10) == 0
            consumer = kafka_materializer_consumer(topic)
            msg = None
            for _ in range(30):
                msg = consumer.poll(1.0)
                if msg is not None:
                    break
            assert msg is not None and msg.value() == b"v" and msg.partition() == 1
            assert consumer.memberid()  # it joined a group of its own
    """))
    stamp = str(time.time_ns())
    deleted = _inner_pytest(tmp_path, f"--kafka-bootstrap-servers={kafka_broker.bootstrap_servers}",
                            env={"SUFFIX": f"del-{stamp}"})
    assert deleted.returncode == 0, deleted.stdout[-3000:]
    assert "kafka-materializer broker: external" in deleted.stdout
    kept = _inner_pytest(tmp_path, f"--kafka-bootstrap-servers={kafka_broker.bootstrap_servers}",
                         "--kafka-keep-topics", env={"SUFFIX": f"keep-{stamp}"})
    assert kept.returncode == 0, kept.stdout[-3000:]
    topics = kafka_admin.list_topics(timeout=10).topics
    assert f"harness-keep-{stamp}" in topics
    assert f"harness-del-{stamp}" not in topics


def test_no_broker_fails_with_the_reason_and_never_skips(tmp_path) -> None:
    (tmp_path / "test_needs_broker.py").write_text("def test_it(kafka_broker):\n    pass\n")
    external = _inner_pytest(tmp_path, "--kafka-broker=external")
    assert external.returncode == 1, external.stdout[-2000:]
    assert "1 error" in external.stdout and "skipped" not in external.stdout
    assert "--kafka-broker=external but no --kafka-bootstrap-servers" in external.stdout

    containers = _inner_pytest(tmp_path, "--kafka-broker=testcontainers",
                               env={"DOCKER_HOST": f"unix://{tmp_path}/no-docker.sock"})
    assert containers.returncode == 1 and "skipped" not in containers.stdout
    assert "no Docker engine answered" in containers.stdout

    # A release that will never exist (4.4.0 was used here until Maven Central got its jars and the
    # missing artifact became a dependency of theirs).
    missing = _inner_pytest(tmp_path, "--kafka-broker=local", "--kafka-version=3.99.9")
    assert missing.returncode == 1 and "skipped" not in missing.stdout
    assert "Apache Kafka 3.99.9 is not complete on Maven Central: missing org.apache.kafka:" in missing.stdout


def test_a_second_kafka_version_in_the_same_run(tmp_path) -> None:
    """Kafka 3.9.1 (the last 3.x) from Maven Central next to the session's 4.3.1 broker."""
    with LocalKafkaBroker(tmp_path / "kafka-3.9", version="3.9.1", extra_config=TEST_BROKER_CONFIG,
                          fast_start=True) as broker:
        producer = Producer({"bootstrap.servers": broker.bootstrap_servers})
        producer.produce("old-broker", key=b"k", value=b"3.9")
        assert producer.flush(30) == 0
        consumer = Consumer({"bootstrap.servers": broker.bootstrap_servers, "group.id": "g"})
        consumer.assign([TopicPartition("old-broker", 0, 0)])
        msg = consumer.poll(20)
        consumer.close()
        assert msg is not None and msg.value() == b"3.9"
        cmdline = Path(f"/proc/{broker.pid}/cmdline").read_bytes().split(b"\0")
        assert str(kafka_home("3.9.1") / "lib" / "*").encode() in cmdline  # the 3.9.1 jars, not 4.3.1


def test_the_test_harness_example_passes(kafka_broker) -> None:
    """``examples/test_harness`` run as its README says, against this session's broker (external mode:
    its log dir through KAFKA_LOG_DIRS, so the compaction oracle reads the broker's checkpoint)."""
    assert kafka_broker.log_dirs is not None or kafka_broker.kind == "testcontainers"
    env = {"KAFKA_LOG_DIRS": str(kafka_broker.log_dirs)} if kafka_broker.log_dirs is not None else {}
    args = [f"--kafka-bootstrap-servers={kafka_broker.bootstrap_servers}"] if env else ["--kafka-broker=testcontainers"]
    done = _inner_pytest(EXAMPLES / "test_harness", *args, env=env)
    assert done.returncode == 0, done.stdout[-4000:]
    assert "3 passed" in done.stdout
