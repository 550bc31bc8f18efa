"""The ``kafka_broker`` fixture gives a real Apache Kafka broker: produce, consume, on-disk folder, DumpLogSegments."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import Consumer, Producer

from materializer.local.kafka_broker import DUMP_LOG_SEGMENTS_CLASS

pytestmark = pytest.mark.broker


def _produce(bootstrap: str, topic: str, records: list[tuple[bytes, bytes | None]]) -> list[int]:
    offsets: list[int] = []
    errors: list[object] = []

    def on_delivery(err: object, msg: object) -> None:
        if err is not None:
            errors.append(err)
        else:
            offsets.append(msg.offset())  # type: ignore[attr-defined]

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0, "acks": "all"})
    for key, value in records:
        producer.produce(topic, key=key, value=value, on_delivery=on_delivery)
    remaining = producer.flush(30)
    assert remaining == 0 and not errors, f"undelivered={remaining} errors={errors}"
    return offsets


def _consume(bootstrap: str, topic: str, count: int, timeout_s: float = 30.0) -> list[tuple[int, bytes, bytes]]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"g-{topic}",
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})
    consumer.subscribe([topic])
    got: list[tuple[int, bytes, bytes]] = []
    deadline = time.monotonic() + timeout_s
    try:
        while len(got) < count and time.monotonic() < deadline:
            msg = consumer.poll(1.0)
            if msg is None:
                continue
            assert msg.error() is None, msg.error()
            got.append((msg.offset(), msg.key(), msg.value()))
    finally:
        consumer.close()
    return got


def test_produce_then_consume_roundtrip(kafka_broker, create_topic) -> None:
    topic = create_topic("roundtrip", partitions=1)
    offsets = _produce(kafka_broker.bootstrap_servers, topic, [(b"k1", b"v1"), (b"k2", b"v2")])
    assert offsets == [0, 1]
    assert _consume(kafka_broker.bootstrap_servers, topic, 2) == [(0, b"k1", b"v1"), (1, b"k2", b"v2")]


def test_partition_folder_and_dump_log_segments(kafka_broker, create_topic) -> None:
    topic = create_topic("dumped", partitions=2, config={"cleanup.policy": "compact"})
    _produce(kafka_broker.bootstrap_servers, topic, [(b"key-%d" % i, b"value-%d" % i) for i in range(3)])

    # all three keys hash to some partition; find the one holding data
    folders = [kafka_broker.partition_dir(topic, p) for p in (0, 1)]
    for folder in folders:
        assert (folder / "00000000000000000000.log").is_file(), sorted(p.name for p in folder.iterdir())
    if kafka_broker.log_dirs is not None:
        assert folders[0].parent == kafka_broker.log_dirs
    segment = max((f / "00000000000000000000.log" for f in folders), key=lambda p: p.stat().st_size)
    assert segment.stat().st_size > 0

    done = kafka_broker.run_tool(DUMP_LOG_SEGMENTS_CLASS, ["--deep-iteration", "--files", str(segment)], timeout_s=120)
    assert done.returncode == 0, done.stderr
    assert f"Dumping {segment}" in done.stdout
    assert "baseOffset: 0" in done.stdout
    assert "| offset: 0 " in done.stdout
    assert "isvalid: true" in done.stdout


def test_create_topic_waits_for_every_partition_leader(kafka_admin, create_topic) -> None:
    topic = create_topic(partitions=3)
    metadata = kafka_admin.list_topics(topic=topic, timeout=10)
    partitions = metadata.topics[topic].partitions
    assert sorted(partitions) == [0, 1, 2]
    assert all(p.leader >= 0 for p in partitions.values())


def test_broker_cleaner_log_is_readable(kafka_broker) -> None:
    """A local broker routes the cleaner's loggers to log-cleaner.log; a container's output is copied."""
    assert kafka_broker.cleaner_log is not None
    assert kafka_broker.cleaner_log.is_file()
    assert "Starting the log cleaner" in kafka_broker.cleaner_log.read_text()


def test_cli_start_status_stop_detached_broker(tmp_path) -> None:
    from click.testing import CliRunner

    from materializer.local.kafka_broker import LocalKafkaBroker
    from materializer.cli.broker import broker

    state_dir = tmp_path / "cli-broker"
    runner = CliRunner()
    started = runner.invoke(broker, ["start", "--state-dir", str(state_dir)])
    try:
        assert started.exit_code == 0, started.output
        bootstrap = started.stdout.strip().splitlines()[-1]
        assert bootstrap.startswith("127.0.0.1:")
        attached = LocalKafkaBroker.attach(state_dir)
        assert attached.bootstrap_servers == bootstrap and attached.is_running()
        status = runner.invoke(broker, ["status", "--state-dir", str(state_dir)])
        assert status.exit_code == 0 and bootstrap in status.stdout
    finally:
        stopped = runner.invoke(broker, ["stop", "--state-dir", str(state_dir)])
    assert stopped.exit_code == 0, stopped.output
    assert runner.invoke(broker, ["status", "--state-dir", str(state_dir)]).exit_code == 1
    assert not (state_dir / "broker.json").exists()


def test_a_port_taken_before_the_broker_binds_it_is_replaced(tmp_path, monkeypatch) -> None:
    """Ports are picked free and bound later by the JVM; another process (a parallel test run)
    may take one in between: the start tries again on new ports instead of failing."""
    import socket

    from materializer.local.kafka_broker import TEST_BROKER_CONFIG, LocalKafkaBroker

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        original, picks = LocalKafkaBroker._choose_ports, []

        def racing(self):  # the first pick loses the race for its broker port
            broker_port, controller_port = original(self)
            picks.append(broker_port)
            if len(picks) == 1:
                self.broker_port = broker_port = taken.getsockname()[1]
            return broker_port, controller_port
        monkeypatch.setattr(LocalKafkaBroker, "_choose_ports", racing)
        with LocalKafkaBroker(tmp_path / "broker", extra_config=TEST_BROKER_CONFIG, fast_start=True) as broker:
            assert len(picks) == 2 and broker.broker_port != taken.getsockname()[1]
            assert "Address already in use" in (tmp_path / "broker" / "logs" / "server.log").read_text()
