"""The broker stopped and restarted while `run` ingests, and partitions added to a topic being ingested (issue 7).

A dedicated broker (the session's is shared) is stopped while a continuous `Materializer.run()`
holds a consumer on it, for longer than ``broker_timeout_ms``, and started again on the same ports
and log dir: the run keeps going (it backs off and retries; librdkafka reconnects) and the store and
local log end equal to what a read_committed consumer reads. With the broker down for longer than
``--timeout``, ``run --until-caught-up`` ends with one error line instead of waiting forever.
"""

from __future__ import annotations

import time

import pytest
from click.testing import CliRunner
from confluent_kafka.admin import AdminClient, NewPartitions, NewTopic

from materializer import Materializer, MaterializerOptions
from materializer.local.kafka_broker import LocalKafkaBroker
from materializer.cli import main

from .background_run import BackgroundRun, wait_until
from .broker_reads import latest_per_partition_key, read_topic
from .test_ingest import Produced, produce

pytestmark = pytest.mark.broker


def _latest(bootstrap: str, topic: str, partitions: int) -> dict[tuple[int, bytes], bytes]:
    return latest_per_partition_key(read_topic(bootstrap, topic, partitions))


def _create(bootstrap: str, topic: str, partitions: int) -> AdminClient:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1,
                                  config={"cleanup.policy": "compact"})])[topic].result(30)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        metadata = admin.list_topics(topic=topic, timeout=5).topics[topic]
        if len(metadata.partitions) == partitions and all(p.leader >= 0 for p in metadata.partitions.values()):
            return admin
        time.sleep(0.2)
    raise AssertionError(f"topic {topic} has no leaders after 30 s")


def _state(materializer: Materializer) -> dict[tuple[int, bytes], bytes]:
    return {(v.partition, k): v.value for k, v in materializer.store.items()}


def _high_watermarks(bootstrap: str, topic: str, partitions: int) -> dict[int, int]:
    return {p: rows[-1][0].offset + 1 if rows else 0 for p, rows in read_topic(bootstrap, topic, partitions).items()}


def test_run_survives_a_broker_restart(tmp_path):
    broker = LocalKafkaBroker(tmp_path / "broker").start()
    try:
        bootstrap = broker.bootstrap_servers
        topic = "restarted"
        _create(bootstrap, topic, 2)
        produce(bootstrap, topic, Produced(), count=1500, keys=200, codec="zstd", seed=1)
        # The broker stays away longer than broker_timeout_ms: a continuous run retries with backoff.
        options = MaterializerOptions(broker_timeout_ms=2_000, request_timeout_ms=2_000, cleaner_threads=0)
        with Materializer(bootstrap, topic, tmp_path / "data", options=options) as materializer:
            background = BackgroundRun(materializer)
            try:
                first = _high_watermarks(bootstrap, topic, 2)
                wait_until(lambda: background.log_end_offsets() == first, 60, "the first catch-up")
                broker.stop()
                time.sleep(8)  # longer than broker_timeout_ms: the run logs, backs off and retries
                assert materializer.health.running and materializer.health.failed is None
                broker.start()
                assert broker.bootstrap_servers == bootstrap  # same ports: the consumer reconnects
                produce(bootstrap, topic, Produced(), count=1500, keys=300, codec="lz4", seed=2)
                second = _high_watermarks(bootstrap, topic, 2)
                wait_until(lambda: background.log_end_offsets() == second, 90, "the catch-up after the restart")
            finally:
                background.stop()
            assert _state(materializer) == _latest(bootstrap, topic, 2)
    finally:
        broker.stop()
    # With the broker down for longer than --timeout, `run --until-caught-up` ends with one error line.
    result = CliRunner().invoke(main, ["run", "--bootstrap-servers", bootstrap, "--topic", topic,
                                       "--data-dir", str(tmp_path / "data"), "--until-caught-up", "--timeout", "3"])
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith("error: ") and "Traceback" not in result.output


def test_partitions_added_while_run_ingests(kafka_broker, tmp_path):
    bootstrap = kafka_broker.bootstrap_servers
    topic = f"growing-{time.time_ns()}"
    admin = _create(bootstrap, topic, 2)
    produce(bootstrap, topic, Produced(), count=600, keys=100, seed=3)
    options = MaterializerOptions(cleaner_threads=0, metadata_refresh_interval_ms=500)
    with Materializer(bootstrap, topic, tmp_path / "data", options=options) as materializer:
        background = BackgroundRun(materializer)
        try:
            wait_until(lambda: background.log_end_offsets() == _high_watermarks(bootstrap, topic, 2), 60,
                        "the first catch-up")
            admin.create_partitions([NewPartitions(topic, 4)])[topic].result(30)
            wait_until(lambda: len(admin.list_topics(topic=topic, timeout=5).topics[topic].partitions) == 4, 30,
                        "4 partitions")
            produce(bootstrap, topic, Produced(), count=900, keys=150, seed=4)
            expected = _high_watermarks(bootstrap, topic, 4)
            assert expected[2] > 0 and expected[3] > 0
            wait_until(lambda: background.log_end_offsets() == expected, 60, "the new partitions to be ingested")
        finally:
            background.stop()
        assert _state(materializer) == _latest(bootstrap, topic, 4)
        assert (tmp_path / "data" / f"{topic}-3").is_dir()
