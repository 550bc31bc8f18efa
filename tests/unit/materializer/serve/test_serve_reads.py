"""The query server's read path under load (issue 39's goals, benchmarks/bench_serve.py): a
multi-get reads RocksDB with one multi-get per partition, not a lookup per key, with the same
answers; a forward reuses its connection to the owner."""

from __future__ import annotations

import json
import threading
from urllib.parse import quote
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

pytest.importorskip("starlette")  # the `serve` extra; the test dependency group installs it

from materializer.adapters.rocksdb_store import StateStore  # noqa: E402
from materializer.adapters.serdes import JsonSerde  # noqa: E402
from materializer.group.routing import partition_for_key  # noqa: E402
from materializer.serve import TopicSource, create_app, view_source  # noqa: E402
from materializer.storage.record_batch import Record  # noqa: E402
from materializer.view import MaterializedView, ServedPartitions  # noqa: E402
from tests.unit.materializer.serve.test_serve import KEYS, call  # noqa: E402


@pytest.fixture
def kv_store(tmp_path):
    """test_serve.py's KEYS over two partitions, and ``gone`` deleted by a tombstone."""
    with StateStore(tmp_path / "state") as opened:
        records: dict[int, list[Record]] = {0: [], 1: []}
        for i, (key, value) in enumerate(sorted(KEYS.items())):
            records[i % 2].append(Record(len(records[i % 2]), 1_000 + i, key, value))
        records[0] += [Record(len(records[0]), 2_000, b"gone", b"x"), Record(len(records[0]) + 1, 2_001, b"gone", None)]
        opened.apply(records, {p: len(r) for p, r in records.items()})
        yield opened


class _Counted:
    """Counts the store's point reads and multi-gets (wraps the instance's methods)."""

    def __init__(self, store: StateStore, monkeypatch) -> None:
        self.gets = self.multi_gets = 0
        get, get_many = store.get, store.get_many

        def counted_get(*args, **kwargs):
            self.gets += 1
            return get(*args, **kwargs)

        def counted_get_many(*args, **kwargs):
            self.multi_gets += 1
            return get_many(*args, **kwargs)

        monkeypatch.setattr(store, "get", counted_get)
        monkeypatch.setattr(store, "get_many", counted_get_many)


def test_a_multi_get_is_one_multi_get_with_each_keys_own_answer(kv_store, monkeypatch):
    store = kv_store
    app = create_app([view_source("t", MaterializedView(store, value_serde=JsonSerde()))], served_by="h:1")
    asked = [k.decode("utf-8", "replace") for k in KEYS if b"\xff" not in k] + ["gone", "nobody"]
    singles = [call(app, "GET", "/v1/topics/t/keys/" + quote(key, safe="")) for key in asked]
    counted = _Counted(store, monkeypatch)
    status, _, body = call(app, "POST", "/v1/topics/t/keys:batch", body=json.dumps(asked).encode())
    assert status == 200
    assert (counted.gets, counted.multi_gets) == (0, 1)  # every key in one RocksDB multi-get
    assert [r["status"] for r in body["results"]] == [s for s, _, _ in singles]
    for result, (status, _, single) in zip(body["results"], singles, strict=True):
        if status == 200:
            assert {k: result[k] for k in ("key", "value", "partition", "offset", "timestamp")} == {
                k: single[k] for k in ("key", "value", "partition", "offset", "timestamp")}
        else:
            assert result["absent"] is True and result["key"] == single["key"]


def test_a_group_members_multi_get_reads_each_served_partition_once(tmp_path, monkeypatch):
    keys = [f"k{i}".encode() for i in range(40)]
    with StateStore(tmp_path / "state") as store:
        records: dict[int, list[Record]] = {0: [], 1: [], 2: [], 3: []}
        for key in keys:
            part = records[partition_for_key(key, 4)]
            part.append(Record(len(part), 1, key, b'{"k": "' + key + b'"}'))
        store.apply(records, {p: len(r) for p, r in records.items()})
        served = ServedPartitions("t", "g", lambda: frozenset({0, 1}), lambda: 4)
        app = create_app([TopicSource("t", lambda: MaterializedView(store, value_serde=JsonSerde(), served=served),
                                      group_id="g")])
        counted = _Counted(store, monkeypatch)
        status, _, body = call(app, "POST", "/v1/topics/t/keys:batch",
                               body=json.dumps([k.decode() for k in keys]).encode())
        assert status == 200 and (counted.gets, counted.multi_gets) == (0, 2)  # partitions 0 and 1
        for key, result in zip(keys, body["results"], strict=True):
            if partition_for_key(key, 4) in (0, 1):
                assert (result["status"], result["value"]) == (200, {"k": key.decode()}), result
            else:  # not served here and no router: 503 naming the partition, never "absent"
                assert result["status"] == 503 and result["partitions"] == [partition_for_key(key, 4)], result


def test_a_value_that_does_not_decode_fails_only_its_own_key_in_a_multi_get(tmp_path):
    with StateStore(tmp_path / "state") as store:
        store.apply({0: [Record(0, 1, b"good", b'{"n": 1}'), Record(1, 1, b"bad", b"{not json"),
                         Record(2, 1, b"also", b'{"n": 2}')]}, {0: 3})
        app = create_app([view_source("t", MaterializedView(store, value_serde=JsonSerde()))])
        status, _, body = call(app, "POST", "/v1/topics/t/keys:batch", body=b'["good", "bad", "also", "none"]')
        assert status == 200
        assert [r["status"] for r in body["results"]] == [200, 500, 200, 404], body
        assert (body["results"][1]["partition"], body["results"][1]["offset"]) == (0, 1)


def test_forwards_to_one_owner_reuse_one_connection():
    """The forwarding client keeps its connection to an owner alive (HTTP/1.1): ten forwards, one
    TCP connection; the urllib opener before opened one per forward."""
    from materializer.serve.forwarding import Forwarding

    connections: list[tuple[str, int]] = []

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as uvicorn

        def do_GET(self):  # noqa: N802 - http.server's naming
            connections.append(self.client_address)
            body = b'{"ok": true}'
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        router = Forwarding(token="tok")
        for _ in range(10):
            answer = router.send(f"http://127.0.0.1:{server.server_port}", "GET", "/v1/x")
            assert (answer.status, answer.body) == (200, {"ok": True})
        assert len(connections) == 10 and len(set(connections)) == 1, connections
    finally:
        server.shutdown()
        server.server_close()


def test_forwards_over_tls_verify_the_owners_certificate_and_name(kv_store, tmp_path):
    """The pooled client keeps member_http's TLS rule: the owner's certificate is verified against the
    CA file (or the system's CAs) and its name against the URL's host."""
    from materializer.serve import QueryServer
    from materializer.serve.forwarding import Forwarding, OwnerUnreachable
    from tests.tls import self_signed

    (tmp_path / "owner").mkdir()
    (tmp_path / "other").mkdir()
    cert, key = self_signed(tmp_path / "owner")
    other, _ = self_signed(tmp_path / "other")
    app = create_app([view_source("t", MaterializedView(kv_store, value_serde=JsonSerde()))])
    with QueryServer(app, certfile=cert, keyfile=key) as owner:
        assert owner.url.startswith("https://127.0.0.1:")
        answer = Forwarding(cafile=cert).send(owner.url, "GET", "/v1/topics")
        assert (answer.status, answer.body) == (200, {"topics": ["t"]})
        for router, url in ((Forwarding(cafile=other), owner.url), (Forwarding(), owner.url),
                            (Forwarding(cafile=cert), owner.url.replace("127.0.0.1", "localhost"))):
            with pytest.raises(OwnerUnreachable, match="SSL|certificate|hostname"):
                router.send(url, "GET", "/v1/topics")


def test_answers_on_a_kept_alive_connection_are_not_held_back_by_nagle(kv_store):
    """Each answer after a connection's first used to wait for the client's delayed ACK (40 ms on
    Linux): the listening socket lacked IPPROTO_TCP, so asyncio never set TCP_NODELAY. The median
    of ten requests on one connection stays well under 40 ms."""
    import http.client
    import statistics
    import time

    from materializer.serve import QueryServer

    app = create_app([view_source("t", MaterializedView(kv_store, value_serde=JsonSerde()))])
    with QueryServer(app) as server:
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
        try:
            seconds = []
            for _ in range(11):
                started = time.perf_counter()
                conn.request("GET", "/v1/topics/t/keys/user%3A1")
                answer = conn.getresponse()
                assert answer.status == 200 and json.loads(answer.read())["value"] == {"n": 3}
                seconds.append(time.perf_counter() - started)
        finally:
            conn.close()
    assert statistics.median(seconds[1:]) < 0.025, seconds
