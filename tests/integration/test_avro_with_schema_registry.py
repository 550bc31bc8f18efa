"""Avro values through a real Schema Registry (Apicurio's Confluent-compatible API) and a real broker (issue 9, item 1).

Values are written by confluent-kafka's own ``AvroSerializer`` against the registry, with a
schema that evolves mid-topic (a field added with a default: a second schema id); the expected
state is what the test produced, kept on the side. Two bad values are produced on their own keys:
one whose schema id the registry does not know, one cut short.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from confluent_kafka import Producer
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from materializer.view import MaterializedView

pytestmark = [pytest.mark.broker, pytest.mark.schema_registry]

PROFILE_V1 = {"type": "record", "name": "Profile", "namespace": "example", "fields": [
    {"name": "id", "type": "long"}, {"name": "name", "type": "string"}]}
PROFILE_V2 = {"type": "record", "name": "Profile", "namespace": "example", "fields": [
    {"name": "id", "type": "long"}, {"name": "name", "type": "string"},
    {"name": "email", "type": ["null", "string"], "default": None}]}


def produce_profiles(bootstrap: str, registry_url: str, topic: str) -> tuple[dict[str, dict], dict[str, int]]:
    """Produce the workload; returns (expected latest value per live key, bad key -> partition)."""
    registry = SchemaRegistryClient({"url": registry_url})
    ctx = SerializationContext(topic, MessageField.VALUE)
    v1 = AvroSerializer(registry, json.dumps(PROFILE_V1))
    v2 = AvroSerializer(registry, json.dumps(PROFILE_V2))
    producer = Producer({"bootstrap.servers": bootstrap})
    expected: dict[str, dict] = {}
    for i in range(300):
        key = f"user-{i % 40:02d}"
        if i % 13 == 12:
            producer.produce(topic, key=key, value=None)
            expected.pop(key, None)
            continue
        value = {"id": i, "name": f"name {i}"}
        if i < 150:
            producer.produce(topic, key=key, value=v1(value, ctx))
        else:
            value["email"] = None if i % 2 else f"u{i}@example.com"
            producer.produce(topic, key=key, value=v2(value, ctx))
        expected[key] = value
    good = v2({"id": 1, "name": "x", "email": None}, ctx)
    unknown_id = b"\x00" + (987654).to_bytes(4, "big") + good[5:]
    producer.produce(topic, key="bad-unknown-schema", value=unknown_id, partition=0)
    producer.produce(topic, key="bad-cut-short", value=good[:-1], partition=1)
    assert producer.flush(30) == 0
    return expected, {"bad-unknown-schema": 0, "bad-cut-short": 1}


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "materializer", *args], capture_output=True, text=True, timeout=180)


def test_avro_values_decode_across_schema_versions_and_bad_ones_are_named(
        kafka_broker, create_topic, schema_registry_url, tmp_path):
    topic = create_topic(partitions=2, config={"cleanup.policy": "compact"})
    bootstrap = kafka_broker.bootstrap_servers
    expected, bad = produce_profiles(bootstrap, schema_registry_url, topic)
    registry = ["--schema-registry-url", schema_registry_url]
    run = ["run", "--bootstrap-servers", bootstrap, "--topic", topic, "--data-dir", str(tmp_path),
           "--until-caught-up", "--key-format", "str", "--value-format", "avro", *registry]

    failed = cli(*run)
    assert failed.returncode == 2
    assert "Traceback" not in failed.stderr
    error = [line for line in failed.stderr.splitlines() if line.startswith("error: ")]
    assert len(error) == 1 and "as avro" in error[0], failed.stderr[-2000:]
    assert ("schema id 987654 is not in the Schema Registry" in error[0]
            or "do not match schema id" in error[0]), error[0]
    assert f"{topic}-" in error[0] and "at offset" in error[0]

    skipped = cli(*run, "--on-bad-record", "skip")
    assert skipped.returncode == 0, skipped.stderr[-2000:]
    assert "skipped 2 records that did not decode" in skipped.stdout
    assert skipped.stderr.count("schema id 987654 is not in the Schema Registry") == 1
    assert skipped.stderr.count("the bytes do not match schema id") == 1

    exported = cli("export", "--data-dir", str(tmp_path), "--topic", topic, "--key-format", "str",
                   "--value-format", "avro", *registry)
    assert exported.returncode == 0, exported.stderr[-2000:]
    assert {line["key"]: line["value"] for line in map(json.loads, exported.stdout.splitlines())} == expected

    key = "user-07"
    shown = cli("get", "--data-dir", str(tmp_path), "--topic", topic, "--value-format", "avro", *registry, key)
    assert shown.returncode == 0 and json.loads(shown.stdout) == expected[key]
    for bad_key in bad:
        absent = cli("get", "--data-dir", str(tmp_path), "--topic", topic, *registry, bad_key)
        assert absent.returncode == 1
    # The raw bytes of a value are still what the producer wrote; as JSON they are refused with a
    # message that says why (not "'utf-32-be' codec can't decode").
    as_json = cli("get", "--data-dir", str(tmp_path), "--topic", topic, "--value-format", "json", key)
    assert as_json.returncode == 2 and "utf-32" not in as_json.stderr.lower()
    assert "--value-format avro" in as_json.stderr

    with MaterializedView.open(tmp_path, topic, key_format="str", value_format="avro",
                               schema_registry=schema_registry_url) as view:
        assert {entry.key: entry.value for entry in view.items()} == expected
        assert view.get_many(["user-01", "user-02"]) == {k: expected[k] for k in ("user-01", "user-02")
                                                          if k in expected}
