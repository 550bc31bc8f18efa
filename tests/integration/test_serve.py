"""Issue 39 (first slice): the query server (``run --serve``, :mod:`materializer.serve`) against the
session's real broker.

One test runs the CLI (two topics, json values, HTTPS with a self-signed certificate, a bearer
token) and walks every status code of a single member; one serves a Materializer from Python
(str values) from before its run starts, so "not ready" is seen for real; one is a consumer-group
member that shares the topic with another member and answers 503 (never 404) for the other's
partitions. Waits poll a condition with a deadline; nothing is timed.
"""

from __future__ import annotations

import base64
import json
import re
import signal
import ssl
import subprocess
import sys
import threading
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from confluent_kafka import Producer

from materializer.adapters.group_membership import GroupMembership
from materializer.config import MaterializerOptions
from materializer.group.routing import partition_for_key
from materializer.materializer import Materializer
from materializer.serve import QueryServer, create_app, source_of

from tests.tls import self_signed

from .background_run import wait_until

pytestmark = pytest.mark.broker

DEADLINE_S = 90.0  # generous on a loaded 2-core machine; never a timing assertion


class Http:
    """A tiny HTTP(S) client: (status, headers, JSON body) of each request, errors included."""

    def __init__(self, base: str, *, token: str | None = None, cafile: Path | None = None) -> None:
        self.base, self.token = base, token
        self.context = None if cafile is None else ssl.create_default_context(cafile=str(cafile))

    def __call__(self, method: str, path: str, body: Any = None, *, token: str | None = "default"):
        request = urllib.request.Request(self.base + path, method=method,
                                         data=None if body is None else json.dumps(body).encode())
        token = self.token if token == "default" else token
        if token is not None:
            request.add_header("Authorization", f"Bearer {token}")
        if body is not None:
            request.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(request, timeout=30, context=self.context) as response:
                return response.status, _lower(response.headers), json.loads(response.read())
        except urllib.error.HTTPError as error:
            return error.code, _lower(error.headers), json.loads(error.read())


def _lower(headers: Any) -> dict[str, str]:
    return {name.lower(): value for name, value in headers.items()}


def _produce(bootstrap: str, topic: str, records: list[tuple[bytes, bytes | None]]) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True,
                         "partitioner": "murmur2_random"})
    for key, value in records:
        producer.produce(topic, key=key, value=value)
    assert producer.flush(30) == 0


def test_cli_serve_answers_every_status_over_https_with_a_token(kafka_broker, create_topic, tmp_path) -> None:
    bootstrap = kafka_broker.bootstrap_servers
    orders, users = create_topic(partitions=3), create_topic(partitions=2)
    documents = {b"a/b": {"n": 1}, b"100%": {"n": 2}, b"user:1": {"n": 3}, b"user:2": {"n": 4},
                 b"user:3": {"n": 5}, b"\xff\x00": {"n": 6}, "ключ".encode(): {"n": 7}}
    _produce(bootstrap, orders, [(k, json.dumps(v).encode()) for k, v in documents.items()]
             + [(b"gone", b'{"n": 0}'), (b"gone", None)])
    _produce(bootstrap, users, [(b"u", b'["x"]')])
    cert, key = self_signed(tmp_path)
    token_file = tmp_path / "token"
    token_file.write_text("s3cret\n")
    process = subprocess.Popen(
        [sys.executable, "-m", "materializer", "run", "--bootstrap-servers", bootstrap, "--topic", orders,
         "--topic", users, "--data-dir", str(tmp_path / "data"), "--no-progress", "--value-format", "json",
         "--cleaner-threads", "0", "--serve", "127.0.0.1:0", "--serve-token-file", str(token_file),
         "--serve-cert", str(cert), "--serve-key", str(key)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    stderr: list[str] = []
    reader = threading.Thread(target=lambda: stderr.extend(iter(process.stderr.readline, "")), daemon=True)
    reader.start()
    try:
        found = wait_until(lambda: next((m for m in map(re.compile(r"serving queries on (https://\S+)").search,
                                                        list(stderr)) if m), None), DEADLINE_S,
                           "the 'serving queries on' line")
        http = Http(found.group(1), token="s3cret", cafile=cert)

        # a bearer token is required
        status, headers, body = http("GET", f"/v1/topics/{orders}/keys/user:1", token=None)
        assert status == 401 and headers["www-authenticate"].startswith("Bearer") and "token" in body["error"]
        assert http("GET", f"/v1/topics/{orders}/keys/user:1", token="wrong")[0] == 401

        # 200 once caught up (503 with Retry-After meanwhile, if the request comes first)
        def answered():
            got = http("GET", f"/v1/topics/{orders}/keys/user:1")
            assert got[0] in (200, 503), got
            if got[0] == 503:
                assert got[1]["retry-after"] == "1" and got[2]["error"]
            return got if got[0] == 200 else None

        status, _, body = wait_until(answered, DEADLINE_S, "the key answered")
        assert body["value"] == {"n": 3} and body["partition"] == partition_for_key(b"user:1", 3)
        assert body["offset"] >= 0 and body["timestamp"] > 0 and body["served_by"]["address"].startswith("127.0.0.1:")
        wait_until(lambda: http("GET", f"/v1/topics/{users}/keys/u")[0] == 200, DEADLINE_S, "the second topic")
        assert http("GET", f"/v1/topics/{users}/keys/u")[2]["value"] == ["x"]

        # keys with '/' and '%' as one percent-encoded segment, non-ASCII, base64 for binary keys
        for raw, document in documents.items():
            path = (f"/v1/topics/{orders}/keys/{quote(base64.b64encode(raw).decode(), safe='')}?key_encoding=base64"
                    if raw == b"\xff\x00" else f"/v1/topics/{orders}/keys/{quote(raw, safe='')}")
            status, _, body = http("GET", path)
            assert (status, body["value"], body["partition"]) == (200, document, partition_for_key(raw, 3)), raw

        status, _, body = http("GET", f"/v1/topics/{orders}/keys/%FF%00")  # percent-encoded bytes, not UTF-8
        assert (status, body["value"], body["key"]) == (200, {"n": 6}, "base64:/wA=")

        # 404: absent, tombstoned, unknown topic; 400/413: bad input; 405: no write endpoint
        for missing in ("nope", "gone"):
            status, _, body = http("GET", f"/v1/topics/{orders}/keys/{missing}")
            assert status == 404 and "no live value" in body["error"]
        status, _, body = http("GET", "/v1/topics/no-such-topic/keys/k")
        assert status == 404 and body["topics"] == sorted([orders, users])
        assert http("GET", f"/v1/topics/{orders}/keys/%3D%3D?key_encoding=base64")[0] == 400
        assert http("GET", f"/v1/topics/{orders}/keys/a/b")[0] == 400  # '/' must be %2F, never read as key 'b'
        assert http("GET", f"/v1/topics/{orders}/keys/{'k' * 17_000}")[0] == 413
        assert http("PUT", f"/v1/topics/{orders}/keys/k", {"v": 1})[0] == 405

        # multi-get
        status, _, body = http("POST", f"/v1/topics/{orders}/keys:batch", ["user:2", "nope", "a/b"])
        assert status == 200
        assert [(r["key"], r["status"], r.get("value")) for r in body["results"]] == [
            ("user:2", 200, {"n": 4}), ("nope", 404, None), ("a/b", 200, {"n": 1})]
        assert http("POST", f"/v1/topics/{orders}/keys:batch", ["k"] * 1001)[0] == 413
        assert http("POST", f"/v1/topics/{orders}/keys:batch", {"keys": []})[0] == 400

        # scan: a prefix two at a time with the cursor, then everything
        items, cursor = [], None
        while True:
            status, _, body = http("GET", f"/v1/topics/{orders}/scan?prefix=user%3A&limit=2"
                                   + ("" if cursor is None else f"&cursor={cursor}"))
            assert status == 200 and len(body["items"]) <= 2
            items += body["items"]
            cursor = body["next_cursor"]
            if cursor is None:
                break
        assert [(i["key"], i["value"]) for i in items] == [("user:1", {"n": 3}), ("user:2", {"n": 4}),
                                                            ("user:3", {"n": 5})]
        status, _, body = http("GET", f"/v1/topics/{orders}/scan?limit=1000&key_encoding=base64")
        assert sorted(base64.b64decode(i["key"]) for i in body["items"]) == sorted(documents)
        assert body["partial"] is False and body["next_cursor"] is None
        assert http("GET", f"/v1/topics/{orders}/scan?cursor=nonsense")[0] == 400

        status, _, body = http("GET", "/openapi.json")
        assert status == 200 and "/v1/topics/{topic}/keys/{key}" in body["paths"]
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(60)
        finally:
            process.kill()
    reader.join(10)
    assert process.returncode == 0, "".join(stderr)


def test_a_server_started_before_the_run_answers_503_until_caught_up(kafka_broker, create_topic, tmp_path) -> None:
    bootstrap = kafka_broker.bootstrap_servers
    topic = create_topic(partitions=2)
    _produce(bootstrap, topic, [(f"k{i}".encode(), f"v{i}".encode()) for i in range(50)])
    options = MaterializerOptions(progress=False, cleaner_threads=0, poll_timeout_ms=200, value_format="str")
    materializer = Materializer(bootstrap, topic, tmp_path / "data", options=options)
    with QueryServer(create_app([source_of(materializer)])) as server:
        http = Http(server.url)
        status, headers, body = http("GET", f"/v1/topics/{topic}/keys/k1")
        assert status == 503 and headers["retry-after"] == "1" and "not running" in body["error"]
        materializer.run_in_background()
        try:
            wait_until(lambda: http("GET", f"/v1/topics/{topic}/keys/k1")[0] == 200, DEADLINE_S, "caught up")
            status, _, body = http("GET", f"/v1/topics/{topic}/keys/k49")
            assert status == 200 and body["value"] == "v49"  # str: a JSON string
            status, _, body = http("POST", f"/v1/topics/{topic}/keys:batch", [f"k{i}" for i in range(60)])
            assert [r["status"] for r in body["results"]] == [200] * 50 + [404] * 10
            assert [r["value"] for r in body["results"][:50]] == [f"v{i}" for i in range(50)]
        finally:
            materializer.close()
        status, _, body = http("GET", f"/v1/topics/{topic}/keys/k1")
        assert status == 503, body  # stopped: no store to read any more


def test_a_group_member_answers_its_partitions_and_503_for_the_others(kafka_broker, create_topic, tmp_path) -> None:
    bootstrap = kafka_broker.bootstrap_servers
    partitions = 6
    topic = create_topic(partitions=partitions)
    keys = [f"k{i}".encode() for i in range(120)]
    _produce(bootstrap, topic, [(k, b"v-" + k) for k in keys])
    group = f"serve-{uuid.uuid4().hex[:10]}"
    options = MaterializerOptions(progress=False, cleaner_threads=0, poll_timeout_ms=200, partitioner="murmur2",
                                  group_session_timeout_ms=6_000)
    with GroupMembership(bootstrap, group, [topic]) as other:
        other.wait_until(lambda held: len(held) == partitions, DEADLINE_S)
        member = Materializer(bootstrap, topic, tmp_path / "data", options=options, group_id=group)
        member.run_in_background()
        try:
            with QueryServer(create_app([source_of(member)], served_by="me:1")) as server:
                http = Http(server.url)
                wait_until(lambda: member.health.ready and 0 < len(member.served_partitions()) < partitions
                           and len(member.assigned_partitions()) == len(member.served_partitions()),
                           DEADLINE_S, "the member to serve part of the topic")
                mine = member.served_partitions()
                own_key = next(k for k in keys if partition_for_key(k, partitions) in mine)
                status, _, body = http("GET", f"/v1/topics/{topic}/keys/{own_key.decode()}")
                assert status == 200 and body["value"] == base64.b64encode(b"v-" + own_key).decode()  # bytes
                assert body["served_by"] == {"address": "me:1", "group_id": group,
                                             "member_id": member.health.member_id}

                their_key = next(k for k in keys if partition_for_key(k, partitions) not in mine)
                their_partition = partition_for_key(their_key, partitions)
                status, headers, body = http("GET", f"/v1/topics/{topic}/keys/{their_key.decode()}")
                assert status == 503 and headers["retry-after"] == "1", body
                assert body["partitions"] == [their_partition]
                assert body["owners"][str(their_partition)]["member_id"] == other.member_id
                absent = next(k for k in (f"absent-{i}" for i in range(1000))
                              if partition_for_key(k, partitions) not in mine)
                assert http("GET", f"/v1/topics/{topic}/keys/{absent}")[0] == 503  # never 404

                status, _, body = http("GET", f"/v1/topics/{topic}/scan?limit=1000")
                assert body["partial"] is True and body["partitions"] == sorted(mine)
                assert sorted(i["key"].encode() for i in body["items"]) == \
                    sorted(k for k in keys if partition_for_key(k, partitions) in mine)
                status, _, body = http("POST", f"/v1/topics/{topic}/keys:batch",
                                       [own_key.decode(), their_key.decode()])
                assert [r["status"] for r in body["results"]] == [200, 503]
        finally:
            member.close()
