"""Every example runs, as a user would run it, and prints what it promises."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.broker

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_materialize_topic_example(kafka_broker, tmp_path):
    result = subprocess.run([sys.executable, str(EXAMPLES / "materialize_topic.py"), "--bootstrap-servers",
                             kafka_broker.bootstrap_servers, "--data-dir", str(tmp_path / "data")],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    first, second = [line for line in result.stdout.splitlines() if line.startswith("fetched ")]
    assert first.startswith("fetched 1000 records") and second.startswith("fetched 200 records")
    assert "local log folders: ['example-user-emails-0', 'example-user-emails-1']" in result.stdout


def test_spark_snapshot_example(tmp_path):
    result = subprocess.run([sys.executable, str(EXAMPLES / "spark" / "snapshot_log_dir.py"), "--out",
                             str(tmp_path)], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "warm store: " in result.stdout and "equal to the snapshot: True" in result.stdout
    live = int(result.stdout.split("Parquet snapshot: ")[1].split(" live keys")[0])
    assert 300 < live <= 400  # 400 SKUs, every 11th update a tombstone; the aborted transaction never counts


def test_orders_join_example_joins_co_partitioned_topics_locally(kafka_broker, tmp_path):
    result = subprocess.run([sys.executable, str(EXAMPLES / "service" / "orders_join.py"), "--bootstrap-servers",
                             kafka_broker.bootstrap_servers, "--data-dir", str(tmp_path / "join")],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    lines = [line for line in result.stdout.splitlines() if line.startswith("instance ")]
    assert [line.split(":")[0] for line in lines] == ["instance a", "instance b"], result.stdout
    held = [set(map(int, line.split("partitions [")[1].split("]")[0].split(", "))) for line in lines]
    assert not held[0] & held[1] and held[0] | held[1] == set(range(6))  # the group split the partitions
    joined = [int(line.split("; ")[1].split(" latest orders")[0]) for line in lines]
    assert sum(joined) == 60 and all(n > 0 for n in joined)  # every customer's latest order, in one instance
    assert all(line.endswith(", 0 customers missing") for line in lines)  # co-partitioned: always local


def _warm_up(bootstrap: str, data_dir: Path, produce: int) -> str:
    result = subprocess.run([sys.executable, str(EXAMPLES / "service" / "cache_warmup.py"), "--bootstrap-servers",
                             bootstrap, "--topic", "example-cache-skus", "--data-dir", str(data_dir),
                             "--produce", str(produce)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout


def test_cache_warmup_example_restores_locally_and_fetches_only_the_tail(kafka_broker, tmp_path):
    first = _warm_up(kafka_broker.bootstrap_servers, tmp_path / "cache", 5000)
    assert ": 500 live keys; fetched 5000 records from the broker" in first
    second = _warm_up(kafka_broker.bootstrap_servers, tmp_path / "cache", 300)
    assert ": 500 live keys; fetched 300 records from the broker, replayed 0 from the local log" in second
    # The second producer run wrote sku-00007 last at i = 277 (300 records over 30 keys: i % 30 == 7).
    assert "sku-00007 -> {'sku': 'sku-00007', 'price_cents': 277," in second


@pytest.mark.schema_registry
def test_http_service_example_serves_avro_values_of_a_live_topic(kafka_broker, create_topic, schema_registry_url,
                                                                 tmp_path):
    import json
    import signal
    import socket
    import time
    import urllib.error
    import urllib.request

    from confluent_kafka import Producer
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    topic = create_topic(partitions=2, config={"cleanup.policy": "compact"})
    schema = {"type": "record", "name": "Profile", "fields": [{"name": "name", "type": "string"},
                                                              {"name": "visits", "type": "int"}]}
    serialize = AvroSerializer(SchemaRegistryClient({"url": schema_registry_url}), json.dumps(schema))
    ctx = SerializationContext(topic, MessageField.VALUE)
    producer = Producer({"bootstrap.servers": kafka_broker.bootstrap_servers})
    for i in range(200):
        producer.produce(topic, key=f"user-{i % 20:02d}", value=serialize({"name": f"n{i}", "visits": i}, ctx))
    assert producer.flush(30) == 0
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    service = subprocess.Popen([sys.executable, str(EXAMPLES / "service" / "http_service.py"), "--bootstrap-servers",
                                kafka_broker.bootstrap_servers, "--schema-registry-url", schema_registry_url,
                                "--topic", topic, "--data-dir", str(tmp_path / "data"), "--port", str(port)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def get(path):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read())
        except OSError:
            return None, None

    try:
        deadline = time.monotonic() + 120
        while get("/health")[0] != 200:
            assert service.poll() is None and time.monotonic() < deadline, "the service never became ready"
            time.sleep(0.2)
        status, body = get("/profiles/user-07")
        assert status == 200 and body["value"] == {"name": "n187", "visits": 187}
        assert get("/profiles/nobody")[0] == 404
        status, listed = get("/profiles?prefix=user-1&limit=5")
        assert status == 200 and [e["key"] for e in listed] == [f"user-1{i}" for i in range(5)]

        producer.produce(topic, key="user-07", value=serialize({"name": "fresh", "visits": 1000}, ctx))
        assert producer.flush(30) == 0
        deadline = time.monotonic() + 60
        while get("/profiles/user-07")[1]["value"]["name"] != "fresh":
            assert time.monotonic() < deadline, "the update never reached the service"
            time.sleep(0.2)
    finally:
        service.send_signal(signal.SIGTERM)
        _, stderr = service.communicate(timeout=60)
    # uvicorn shuts down gracefully, then re-raises the SIGTERM it caught (exit status -15).
    assert service.returncode in (0, -signal.SIGTERM), stderr[-2000:]
    assert "Traceback" not in stderr and "Finished server process" in stderr
    # The lifespan hook closed the Materializer: clean-shutdown marker written, nothing to recover next time.
    assert (tmp_path / "data" / ".kafka_cleanshutdown").exists()
