"""KafkaSource without a broker: error mapping, options, and a dead cluster fails instead of hanging."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import KafkaError, KafkaException

from materializer.adapters.errors import KafkaSourceError, LeaderNotAvailableError
from materializer.adapters.kafka_source import KafkaSource, KafkaSourceOptions, map_kafka_error, map_kafka_errors


def test_map_kafka_error_variants():
    error = map_kafka_error(KafkaException(KafkaError(KafkaError._TRANSPORT, "Broker transport failure")), "ctx")
    assert str(error).startswith("ctx: Broker transport failure [_TRANSPORT]")
    assert "is the broker running" in str(error)
    error = map_kafka_error(KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART), "ctx")
    assert "UNKNOWN_TOPIC_OR_PART" in str(error) and "does the topic exist" in str(error)
    assert "timed out" in str(map_kafka_error(TimeoutError(), "ctx"))
    # a partition added since librdkafka's metadata: retried as a leader not known yet (an operator
    # campaign saw a group member fail on it when assigned a new partition, consumer path)
    error = map_kafka_error(KafkaException(KafkaError(KafkaError._UNKNOWN_PARTITION)), "ctx")
    assert isinstance(error, LeaderNotAvailableError)


def test_map_kafka_errors_chains_cause():
    with pytest.raises(KafkaSourceError) as info:
        with map_kafka_errors("reading"):
            raise KafkaException(KafkaError(KafkaError._TIMED_OUT))
    assert isinstance(info.value.__cause__, KafkaException)


def test_consumer_config_defaults_and_overrides():
    config = KafkaSourceOptions(client_config={"fetch.max.bytes": "1000", "security.protocol": "PLAINTEXT"}) \
        .consumer_config("h:1")
    assert config["enable.auto.commit"] is False
    assert config["enable.partition.eof"] is True
    assert config["isolation.level"] == "read_committed"
    assert config["fetch.max.bytes"] == "1000"
    admin = KafkaSourceOptions(client_config={"fetch.max.bytes": "1", "security.protocol": "PLAINTEXT"}) \
        .admin_config("h:1")
    assert admin == {"bootstrap.servers": "h:1", "security.protocol": "PLAINTEXT"}


def test_unreachable_cluster_metadata_fails_within_timeout():
    started = time.monotonic()
    with KafkaSource("127.0.0.1:1", "t", KafkaSourceOptions(request_timeout_ms=1000)) as source:
        with pytest.raises(KafkaSourceError, match="cannot read metadata of topic 't' from 127.0.0.1:1"):
            source.partitions()
    assert time.monotonic() - started < 10


def test_unreachable_cluster_fetch_fails_after_broker_timeout():
    options = KafkaSourceOptions(request_timeout_ms=1000, broker_timeout_ms=1500)
    with KafkaSource("127.0.0.1:1", "t", options) as source:
        source.assign({0: 0})
        started = time.monotonic()
        with pytest.raises(KafkaSourceError, match="unreachable for"):
            while time.monotonic() - started < 30:
                assert source.fetch(100, 200).records == []
    assert time.monotonic() - started < 15
