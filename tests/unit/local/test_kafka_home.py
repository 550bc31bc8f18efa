"""What :func:`materializer.local.kafka_jars.kafka_distribution` accepts as ``KAFKA_HOME``: the
layout of an unpacked Apache Kafka distribution (``libs/kafka_<scala>-<version>.jar``,
``libs/kafka-clients-<version>.jar``), and one error naming what is missing otherwise."""

from __future__ import annotations

from pathlib import Path

import pytest

from materializer.adapters.errors import BrokerProvisioningError
from materializer.local.kafka_jars import KAFKA_VERSION, cache_dir, default_version, kafka_distribution, kafka_lib


def _home(root: Path, *jars: str) -> Path:
    (root / "libs").mkdir(parents=True)
    for jar in jars:
        (root / "libs" / jar).write_bytes(b"")
    return root


def test_a_distribution_layout_gives_its_lib_and_version(tmp_path: Path, monkeypatch) -> None:
    home = _home(tmp_path / "kafka", "kafka_2.13-3.9.1.jar", "kafka_2.13-3.9.1-test.jar", "kafka-clients-3.9.1.jar",
                 "kafka-streams-3.9.1.jar")
    found = kafka_distribution(home)
    assert (found.lib, found.version) == (home / "libs", "3.9.1")
    monkeypatch.setenv("KAFKA_HOME", str(home))
    assert default_version() == "3.9.1"
    assert kafka_lib() == kafka_lib("3.9.1") == home / "libs"
    with pytest.raises(BrokerProvisioningError, match="holds Apache Kafka 3.9.1, not the 4.3.1 asked for"):
        kafka_lib("4.3.1")
    assert cache_dir("3.9.1", tmp_path).name.startswith("kafka-home-")
    monkeypatch.delenv("KAFKA_HOME")
    assert default_version() == KAFKA_VERSION and cache_dir("3.9.1", tmp_path) == tmp_path / "kafka-3.9.1"


@pytest.mark.parametrize(("jars", "message"), [
    (None, "no such folder"),
    ((), "no broker jar libs/kafka_<scala>-<version>.jar"),
    (("kafka_2.13-3.9.1.jar",), "no libs/kafka-clients-3.9.1.jar beside the broker jar"),
    (("kafka_2.13-3.9.1.jar", "kafka_2.13-4.3.1.jar", "kafka-clients-4.3.1.jar"),
     "broker jars of several versions in .*: 3.9.1, 4.3.1"),
])
def test_what_is_not_a_distribution_is_named(tmp_path: Path, jars, message) -> None:
    home = tmp_path / "kafka" if jars is None else _home(tmp_path / "kafka", *jars)
    with pytest.raises(BrokerProvisioningError, match=r"KAFKA_HOME=.* does not look like an unpacked Apache Kafka "
                                                      rf"distribution .*{message}"):
        kafka_distribution(home)


def test_a_folder_without_libs_is_named(tmp_path: Path) -> None:
    with pytest.raises(BrokerProvisioningError, match="it has no libs/ folder"):
        kafka_distribution(tmp_path)
