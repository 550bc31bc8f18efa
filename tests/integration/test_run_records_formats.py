"""``materializer run`` records the topic's key/value formats (and registry URL) in the data dir,
and ``get``/``export`` decode with them when not told, against a real broker."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from confluent_kafka import Producer

from materializer.cli import main
from materializer.datadir.formats import TopicFormats, read_topic_formats

pytestmark = pytest.mark.broker


def test_get_and_export_decode_as_run_declared(kafka_broker, create_topic, tmp_path):
    topic = create_topic(partitions=1, config={"cleanup.policy": "compact"})
    bootstrap = kafka_broker.bootstrap_servers
    producer = Producer({"bootstrap.servers": bootstrap})
    for sku in range(3):
        producer.produce(topic, key=f"sku-{sku}".encode(), value=json.dumps({"sku": sku, "price": 100 + sku}).encode())
    assert producer.flush(30) == 0
    runner = CliRunner()
    result = runner.invoke(main, ["run", "--bootstrap-servers", bootstrap, "--topic", topic, "--data-dir",
                                  str(tmp_path), "--until-caught-up", "--key-format", "str", "--value-format", "json"])
    assert result.exit_code == 0, result.output
    assert read_topic_formats(tmp_path, topic) == TopicFormats("str", "json", None)

    got = runner.invoke(main, ["get", "--data-dir", str(tmp_path), "--topic", topic, "sku-1"])
    assert got.exit_code == 0 and json.loads(got.stdout) == {"sku": 1, "price": 101}
    assert got.stdout.startswith("{\n  ")  # json: pretty-printed, as --value-format json prints it
    exported = [json.loads(line) for line in runner.invoke(main, ["export", "--data-dir", str(tmp_path),
                                                                  "--topic", topic]).stdout.splitlines()]
    assert [(line["key"], line["value"]) for line in exported] == [
        (f"sku-{sku}", {"sku": sku, "price": 100 + sku}) for sku in range(3)]
