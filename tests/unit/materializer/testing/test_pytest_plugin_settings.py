"""Pure parts of the pytest plugin: container environment naming and image choice (no Docker, no broker)."""

from __future__ import annotations

import re

from materializer.testing.pytest_plugin import container_broker_config, container_env, container_image


def _convert_key(name: str) -> str:
    """apache/kafka's ConvertKey (docker/resources/utility/utility.go), re-expressed: a single '_' is '.',
    '___' is '-', '__' is '_', lower case."""
    single = re.sub(r"[^_]_[^_]", lambda m: m.group(0).replace("_", "."), name)
    return single.replace("___", "-").replace("__", "_").lower()


def test_official_image_environment_round_trips_every_property() -> None:
    properties = {**container_broker_config(9092, 9093), "a_b-c.d": "x"}
    env = container_env("apache/kafka:4.3.1", properties)
    assert env.pop("CLUSTER_ID")
    assert {_convert_key(name[len("KAFKA_"):]): value for name, value in env.items()} == properties
    assert env["KAFKA_LOG_CLEANER_BACKOFF_MS"] == "100"


def test_local_image_environment_and_loopback_listeners() -> None:
    properties = container_broker_config(9092, 9093)
    env = container_env("apache-kafka:4.3.1", properties)
    assert env["KAFKA_PROP_controller__quorum__voters"] == "1@127.0.0.1:9093"
    assert "-XX:TieredStopAtLevel=1" in env.pop("KAFKA_JVM_OPTS")
    assert {name[len("KAFKA_PROP_"):].replace("__", "."): v for name, v in env.items()} == properties
    assert all(":9092" not in v or "127.0.0.1:9092" in v for v in properties.values())


def test_image_choice(monkeypatch) -> None:
    monkeypatch.delenv("KAFKA_MATERIALIZER_TC_IMAGE", raising=False)

    class Images:
        def __init__(self, present: set[str]) -> None:
            self.present = present

        def get(self, name: str) -> str:
            if name not in self.present:
                raise LookupError(name)
            return name

    class Engine:
        def __init__(self, present: set[str]) -> None:
            self.images = Images(present)

    assert container_image("4.3.1", Engine({"apache-kafka:4.3.1"})) == "apache-kafka:4.3.1"
    assert container_image("4.3.1", Engine(set())) == "apache/kafka:4.3.1"
    monkeypatch.setenv("KAFKA_MATERIALIZER_TC_IMAGE", "my/kafka:1")
    assert container_image("4.3.1", Engine(set())) == "my/kafka:1"


def test_testcontainers_mode_without_its_packages_names_the_extra(monkeypatch, tmp_path) -> None:
    import contextlib
    import sys

    import pytest

    from materializer.testing.pytest_plugin import BrokerSettings, _NoBroker, _provide_broker

    monkeypatch.setitem(sys.modules, "testcontainers", None)  # not installed: only the `testing` extra
    settings = BrokerSettings(mode="testcontainers", bootstrap_servers="", version="4.3.1", keep_topics=False,
                              start_early=False, timeout_s=1.0)
    with contextlib.ExitStack() as stack, pytest.raises(_NoBroker) as raised:
        _provide_broker(settings, stack, tmp_path)
    assert "needs testcontainers: pip install 'kafka-materializer[testcontainers]'" in str(raised.value)
