"""`materializer registry start|status|stop` runs a real Apicurio Registry that confluent-kafka's client talks to."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient

from materializer.adapters.errors import SchemaRegistryProvisioningError
from materializer.local.schema_registry import LocalSchemaRegistry

pytestmark = pytest.mark.schema_registry


def cli(*args):
    return subprocess.run([sys.executable, "-m", "materializer", "registry", *args], capture_output=True, text=True,
                          timeout=300)


def test_registry_commands_and_compatibility(tmp_path):
    state = str(tmp_path / "registry")
    assert cli("status", "--state-dir", state).returncode == 1
    started = cli("start", "--state-dir", state)
    try:
        assert started.returncode == 0, started.stderr[-2000:]
        url = started.stdout.strip()
        assert url.startswith("http://127.0.0.1:") and url.endswith("/apis/ccompat/v7")
        status = cli("status", "--state-dir", state, "--json")
        assert status.returncode == 0 and json.loads(status.stdout)["url"] == url
        again = cli("start", "--state-dir", state)  # idempotent: prints the running one's URL
        assert again.returncode == 0 and again.stdout.strip() == url

        client = SchemaRegistryClient({"url": url})
        v1 = {"type": "record", "name": "T", "fields": [{"name": "a", "type": "long"}]}
        v2 = {**v1, "fields": [*v1["fields"], {"name": "b", "type": "string", "default": ""}]}
        first = client.register_schema("t-value", Schema(json.dumps(v1), "AVRO"))
        second = client.register_schema("t-value", Schema(json.dumps(v2), "AVRO"))
        assert first != second
        assert json.loads(client.get_schema(first).schema_str)["fields"] == v1["fields"]
        assert client.get_latest_version("t-value").schema_id == second
    finally:
        stopped = cli("stop", "--state-dir", state)
    assert stopped.returncode == 0
    assert cli("status", "--state-dir", state).returncode == 1


def test_attach_without_a_registry_names_the_file(tmp_path):
    with pytest.raises(SchemaRegistryProvisioningError, match="registry.json"):
        LocalSchemaRegistry.attach(tmp_path)
    with pytest.raises(SchemaRegistryProvisioningError, match="not started"):
        LocalSchemaRegistry(tmp_path).url
