"""The query server's pure parts (materializer.serve): key and cursor encoding, value JSON, the
answers of the ASGI app over a real RocksDB store (driven through the ASGI interface itself, no
network), and the address parser. The broker-backed tests are tests/integration/test_serve.py."""

from __future__ import annotations

import asyncio
import base64
import json
from urllib.parse import quote, unquote

import pytest

pytest.importorskip("starlette")  # the `serve` extra; the test dependency group installs it

from materializer.adapters.errors import PartitionNotAssignedError  # noqa: E402
from materializer.adapters.partition_owner import PartitionOwner  # noqa: E402
from materializer.adapters.rocksdb_store import StateStore  # noqa: E402
from materializer.adapters.serdes import JsonSerde, StrSerde  # noqa: E402
from materializer.health import ProbeResult  # noqa: E402
from materializer.serve import TopicSource, create_app, view_source  # noqa: E402
from materializer.serve import answers  # noqa: E402
from materializer.serve.answers import BadRequest  # noqa: E402
from materializer.serve.routing import LocalOnly  # noqa: E402
from materializer.serve.server import parse_address  # noqa: E402
from materializer.storage.record_batch import Record  # noqa: E402
from materializer.view import MaterializedView, ServedPartitions  # noqa: E402
from tests.tls import self_signed  # noqa: E402


def call_raw(app, method: str, raw_path: str, query: str = "", body: bytes = b"", headers=()):
    """One request through the ASGI interface: (status, headers, body bytes as sent); ``Host: test``
    unless ``headers`` name a host."""
    async def run():
        sent, delivered = [], False

        async def receive():
            nonlocal delivered
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": body, "more_body": False}
            return {"type": "http.disconnect"}

        async def send(message):
            sent.append(message)

        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method,
                 "scheme": "http", "path": unquote(raw_path), "raw_path": raw_path.encode("ascii"), "root_path": "",
                 "query_string": query.encode(),
                 "headers": [*(() if any(k == b"host" for k, _ in headers) else [(b"host", b"test")]), *headers],
                 "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 80)}
        await app(scope, receive, send)
        return sent

    sent = asyncio.run(run())
    start = sent[0]
    return (start["status"], {k.decode().lower(): v.decode() for k, v in start["headers"]},
            b"".join(m.get("body", b"") for m in sent[1:]))


def call(app, method: str, raw_path: str, query: str = "", body: bytes = b"", headers=()):
    """:func:`call_raw` with the body parsed as JSON: (status, headers, JSON body)."""
    status, answer_headers, payload = call_raw(app, method, raw_path, query, body, headers)
    return status, answer_headers, json.loads(payload)


KEYS = {b"a/b": b'{"n": 1}', b"100%": b'{"n": 2}', b"user:1": b'{"n": 3}', b"user:2": b'{"n": 4}',
        b"\xff\x00": b'{"n": 5}', "ключ".encode(): b'{"n": 6}'}


@pytest.fixture
def store(tmp_path):
    with StateStore(tmp_path / "state") as opened:
        records: dict[int, list[Record]] = {0: [], 1: []}
        for i, (key, value) in enumerate(sorted(KEYS.items())):
            records[i % 2].append(Record(len(records[i % 2]), 1_000 + i, key, value))
        records[0].append(Record(len(records[0]), 2_000, b"gone", b"x"))
        records[0].append(Record(len(records[0]), 2_001, b"gone", None))  # tombstone
        opened.apply(records, {p: len(r) for p, r in records.items()})
        yield opened


def where(key: bytes) -> int:
    return sorted(KEYS).index(key) % 2


def test_get_answers_value_partition_offset_timestamp_and_server(store):
    app = create_app([view_source("t", MaterializedView(store, value_serde=JsonSerde()))], served_by="h:1")
    status, _, body = call(app, "GET", "/v1/topics/t/keys/user:1")
    assert status == 200
    assert body["value"] == {"n": 3} and body["key"] == "user:1" and body["topic"] == "t"
    assert body["partition"] == where(b"user:1") and isinstance(body["offset"], int)
    assert body["timestamp"] == 1_000 + sorted(KEYS).index(b"user:1")
    assert body["served_by"] == {"address": "h:1", "group_id": None, "member_id": None}


@pytest.mark.parametrize("key", [b"a/b", b"100%", "ключ".encode()])
def test_percent_encoded_keys_with_slash_and_percent_are_one_segment(store, key):
    app = create_app([view_source("t", MaterializedView(store, value_serde=JsonSerde()))])
    status, _, body = call(app, "GET", "/v1/topics/t/keys/" + quote(key, safe=""))
    assert status == 200, body
    assert body["value"] == json.loads(KEYS[key]) and body["key"] == key.decode()


def test_base64_key_and_bytes_values(store):
    app = create_app([view_source("t", MaterializedView(store))])  # value format bytes
    encoded = quote(base64.b64encode(b"\xff\x00").decode(), safe="")
    status, _, body = call(app, "GET", f"/v1/topics/t/keys/{encoded}", "key_encoding=base64")
    assert status == 200 and base64.b64decode(body["value"]) == KEYS[b"\xff\x00"]
    assert body["key"] == base64.b64encode(b"\xff\x00").decode()


def test_absent_and_tombstoned_keys_are_404_unknown_topic_404_bad_input_4xx(store):
    app = create_app([view_source("t", MaterializedView(store, value_serde=StrSerde()))])
    assert call(app, "GET", "/v1/topics/t/keys/nope")[0] == 404
    status, _, body = call(app, "GET", "/v1/topics/t/keys/gone")
    assert status == 404 and "no live value" in body["error"]
    status, _, body = call(app, "GET", "/v1/topics/other/keys/k")
    assert status == 404 and body["topics"] == ["t"]
    status, _, body = call(app, "GET", "/v1/topics/t/keys/a", "key_encoding=base64")
    assert status == 400 and "base64" in body["error"]
    assert call(app, "GET", "/v1/topics/t/keys/a", "key_encoding=hex")[0] == 400
    assert call(app, "GET", "/v1/topics/t/keys/%zz")[0] == 400
    status, _, body = call(app, "GET", "/v1/topics/t/keys/a/b")  # not the key "b": refused
    assert status == 400 and "%2F" in body["error"]
    assert call(app, "GET", "/v1/topics/t/keys/" + "k" * (answers.MAX_KEY_BYTES + 1))[0] == 413
    assert call(app, "GET", "/v1/nowhere")[0] == 404
    status, _, body = call(app, "DELETE", "/v1/topics/t/keys/user:1")  # read-only
    assert status == 405 and body == {"error": "method not allowed"}


def test_batch_answers_each_key_and_bounds_the_request(store):
    app = create_app([view_source("t", MaterializedView(store, value_serde=JsonSerde()))])
    status, _, body = call(app, "POST", "/v1/topics/t/keys:batch", body=json.dumps(["user:2", "nope", "a/b"]).encode())
    assert status == 200
    assert [(r["key"], r["status"], r.get("value")) for r in body["results"]] == [
        ("user:2", 200, {"n": 4}), ("nope", 404, None), ("a/b", 200, {"n": 1})]
    assert call(app, "POST", "/v1/topics/t/keys:batch", body=b"{not json")[0] == 400
    assert call(app, "POST", "/v1/topics/t/keys:batch", body=b'{"keys": []}')[0] == 400
    too_many = json.dumps(["k"] * (answers.MAX_BATCH_KEYS + 1)).encode()
    assert call(app, "POST", "/v1/topics/t/keys:batch", body=too_many)[0] == 413
    huge = b'["' + b"k" * answers.MAX_BODY_BYTES + b'"]'
    assert call(app, "POST", "/v1/topics/t/keys:batch", body=huge)[0] == 413


def test_scan_pages_through_a_prefix_with_a_cursor_and_a_range(store):
    app = create_app([view_source("t", MaterializedView(store, value_serde=JsonSerde()))])
    seen, cursor = [], None
    for _ in range(5):
        query = "prefix=user%3A&limit=1" + ("" if cursor is None else f"&cursor={cursor}")
        status, _, body = call(app, "GET", "/v1/topics/t/scan", query)
        assert status == 200 and body["partial"] is False
        seen += [(item["key"], item["value"]) for item in body["items"]]
        cursor = body["next_cursor"]
        if cursor is None:
            break
    assert seen == [("user:1", {"n": 3}), ("user:2", {"n": 4})]
    status, _, body = call(app, "GET", "/v1/topics/t/scan", "start=a&end=user%3A2")
    assert [item["key"] for item in body["items"]] == ["a/b", "user:1"]
    assert call(app, "GET", "/v1/topics/t/scan", "prefix=u&start=a")[0] == 400
    assert call(app, "GET", "/v1/topics/t/scan", "limit=0")[0] == 400
    assert call(app, "GET", "/v1/topics/t/scan", f"limit={answers.MAX_SCAN_LIMIT + 1}")[0] == 400
    assert call(app, "GET", "/v1/topics/t/scan", "cursor=!!")[0] == 400


def test_a_partition_not_served_here_is_503_naming_its_owner_never_404(store):
    owner = PartitionOwner(1 - where(b"user:1"), "member-b", "client-b", "/10.0.0.2")
    served = ServedPartitions("t", "g", lambda: frozenset({where(b"user:1")}), lambda: 2,
                              owners=lambda: {owner.partition: owner})
    view = MaterializedView(store, value_serde=JsonSerde(), served=served)
    app = create_app([TopicSource("t", lambda: view, group_id="g", member_id=lambda: "member-a")])
    other = next(k for k in KEYS if k.isascii() and b"/" not in k and b"%" not in k
                 and served.partition_of(k) == owner.partition)
    mine = next(k for k in KEYS if k.isascii() and b"/" not in k and b"%" not in k
                and served.partition_of(k) != owner.partition)
    status, headers, body = call(app, "GET", f"/v1/topics/t/keys/{other.decode()}")
    assert status == 503 and headers["retry-after"] == "1"
    assert body["partitions"] == [owner.partition] and body["owners"][str(owner.partition)]["member_id"] == "member-b"
    # absent and in a partition another member holds: still 503, not 404
    absent = next(k for k in (f"absent-{i}".encode() for i in range(100)) if served.partition_of(k) == owner.partition)
    assert call(app, "GET", f"/v1/topics/t/keys/{absent.decode()}")[0] == 503
    status, _, body = call(app, "GET", f"/v1/topics/t/keys/{mine.decode()}")
    assert status == 200 and body["value"] == json.loads(KEYS[mine])
    assert body["served_by"] == {"address": None, "group_id": "g", "member_id": "member-a"}
    status, _, body = call(app, "GET", "/v1/topics/t/scan")
    assert body["partial"] is True and body["partitions"] == [1 - owner.partition]
    assert {item["partition"] for item in body["items"]} == {1 - owner.partition}
    status, _, body = call(app, "POST", "/v1/topics/t/keys:batch", body=json.dumps([other.decode()]).encode())
    assert status == 200 and body["results"][0]["status"] == 503


def test_not_ready_is_503_with_reasons(store):
    view = MaterializedView(store, value_serde=JsonSerde())
    app = create_app([TopicSource("t", lambda: view, lambda: ProbeResult(False, ("catching up",)))])
    status, headers, body = call(app, "GET", "/v1/topics/t/keys/user:1")
    assert status == 503 and headers["retry-after"] == "1" and body["reasons"] == ["catching up"]


def test_bearer_token(store):
    app = create_app([view_source("t", MaterializedView(store, value_serde=JsonSerde()))], token="s3cret")
    status, headers, body = call(app, "GET", "/v1/topics/t/keys/user:1")
    assert status == 401 and headers["www-authenticate"].startswith("Bearer") and "token" in body["error"]
    assert call(app, "GET", "/v1/topics/t/keys/user:1", headers=[(b"authorization", b"Bearer wrong")])[0] == 401
    assert call(app, "GET", "/v1/topics/t/keys/user:1", headers=[(b"authorization", b"Bearer s3cret")])[0] == 200


def test_an_unexpected_failure_is_a_json_500_not_a_traceback(store, caplog):
    def broken():
        raise RuntimeError("boom")

    app = create_app([TopicSource("t", broken)])
    status, _, body = call(app, "GET", "/v1/topics/t/keys/k")
    assert status == 500 and body == {"error": "internal error (logged by the server)"}
    assert "boom" in caplog.text


def test_openapi_names_every_endpoint(store):
    status, _, body = call(create_app([]), "GET", "/openapi.json")
    assert status == 200 and body["openapi"].startswith("3.")
    assert set(body["paths"]) == {"/v1/topics", "/v1/topics/{topic}/keys/{key}", "/v1/topics/{topic}/keys:batch",
                                  "/v1/topics/{topic}/scan"}


def test_keys_cursors_and_values():
    assert answers.key_from_raw_path(b"/v1/topics/t/keys/a%2Fb%25", "a/b%") == b"a/b%"
    assert answers.key_from_raw_path(b"/kv/v1/topics/t/keys/%FF%00") == b"\xff\x00"  # not UTF-8: raw bytes
    with pytest.raises(BadRequest, match="one path segment"):
        answers.key_from_raw_path(b"/v1/topics/t/keys/a/b", "a/b")
    with pytest.raises(BadRequest):
        answers.key_from_raw_path(b"/keys/%2")
    assert answers.key_bytes("AAE=", "base64") == b"\x00\x01"
    assert answers.key_text(b"\xff", "utf8") == "base64:/w=="
    for key, partition in ((b"", 0), (b"\xff" * 3, 7), (b"k", 2**31 - 1)):
        assert answers.decode_cursor(answers.encode_cursor(key, partition)) == (key, partition)
    assert answers.prefix_end(b"ab") == b"ac" and answers.prefix_end(b"a\xff") == b"b"
    assert answers.prefix_end(b"\xff\xff") is None
    assert answers.json_value(b"\x00", "bytes") == "AA==" and answers.json_value({"b": b"\x01"}, "avro") == {"b": "AQ=="}
    assert answers.json_value("text", "str") == "text"


def test_parse_address():
    assert parse_address("0.0.0.0:8080") == ("0.0.0.0", 8080)
    assert parse_address("8080") == ("127.0.0.1", 8080)
    assert parse_address("[::1]:0") == ("::1", 0)
    for bad in ("host:", "host:99999", "host:x"):
        with pytest.raises(ValueError):
            parse_address(bad)


def test_local_only_router_names_the_owner_from_the_refusal():
    owner = PartitionOwner(3, "m", "c", "/h")
    answer = LocalOnly().who_answers("t", PartitionNotAssignedError(3, owner, topic="t", group_id="g"))
    assert answer.partitions == (3,) and answer.owners == {3: owner} and not answer.catching_up


@pytest.mark.parametrize(("extra", "expected"), [
    (["--serve", "here:nope"], "is not HOST:PORT"),
    (["--serve-token-file", "{token}"], "needs --serve"),
    (["--serve", "127.0.0.1:0", "--serve-cert", "{token}"], "give both or neither"),
    (["--serve", "127.0.0.1:0", "--serve-token-file", "{empty}"], "is empty"),
    (["--serve", "127.0.0.1:{busy}"], "cannot serve queries on 127.0.0.1:"),
    (["--serve", "127.0.0.1:0", "--serve-cert", "{token}", "--serve-key", "{token}"], "cannot serve queries"),
])
def test_run_refuses_bad_serve_options_with_one_error_line(tmp_path, extra, expected):
    """Before anything runs (no broker is asked): one ``error:`` line, exit 2."""
    import socket

    from click.testing import CliRunner

    from materializer.cli import main

    (tmp_path / "token").write_text("t\n")
    (tmp_path / "empty").write_text(" \n")
    with socket.create_server(("127.0.0.1", 0)) as busy:
        args = [a.format(token=tmp_path / "token", empty=tmp_path / "empty", busy=busy.getsockname()[1])
                for a in extra]
        result = CliRunner().invoke(main, ["run", "--bootstrap-servers", "127.0.0.1:1", "--topic", "t",
                                           "--data-dir", str(tmp_path / "data"), "--no-progress", *args])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and expected in lines[0], result.stderr


def test_a_partition_assigned_here_and_still_catching_up_is_503_saying_so(store):
    served = ServedPartitions("t", "g", lambda: frozenset({0}), lambda: 2, assigned=lambda: frozenset({0, 1}))
    app = create_app([TopicSource("t", lambda: MaterializedView(store, value_serde=JsonSerde(), served=served))])
    key = next(k for k in KEYS if k.isascii() and b"/" not in k and b"%" not in k and served.partition_of(k) == 1)
    status, headers, body = call(app, "GET", f"/v1/topics/t/keys/{key.decode()}")
    assert status == 503 and headers["retry-after"] == "1"
    assert body["catching_up"] is True and body["partitions"] == [1] and body["owners"] == {"1": None}


# -- the second slice: the serving URL carried in client.id, forwarding to the owner ------------------


def test_the_serving_url_rides_in_client_id_and_is_read_back():
    from materializer.adapters.partition_owner import serving_client_id, serving_url_of

    assert serving_client_id("kafka-materializer-t", None) == "kafka-materializer-t"
    carried = serving_client_id("kafka-materializer-t", "https://10.0.0.7:8439")
    assert carried == "kafka-materializer-t;serve=https://10.0.0.7:8439"
    assert serving_url_of(carried) == "https://10.0.0.7:8439"
    assert serving_client_id(carried, "http://h:1") == "kafka-materializer-t;serve=http://h:1"  # replaced, not stacked
    assert PartitionOwner(0, "m", carried, "/10.0.0.7").serving_url == "https://10.0.0.7:8439"
    for plain in ("kafka-materializer-t", "app;serve=ftp://x", "app;serve="):
        assert serving_url_of(plain) is None
    for bad in ("10.0.0.7:8439", "http://a b:1", "http://x;serve=y"):
        with pytest.raises(ValueError):
            serving_client_id("n", bad)


def test_the_forwarding_router_forwards_only_to_another_member_with_a_url():
    from materializer.adapters.errors import KeyPartitionUndecidedError
    from materializer.serve.forwarding import Forwarding
    from materializer.serve.routing import Forward, Unavailable

    router = Forwarding()
    with_url = PartitionOwner(3, "member-b", "c;serve=http://h:1", "/h")
    answer = router.who_answers("t", PartitionNotAssignedError(3, with_url, topic="t", group_id="g"))
    assert answer == Forward(3, with_url, "http://h:1")
    without_url = PartitionOwner(3, "member-b", "c", "/h")
    for refusal in (PartitionNotAssignedError(3, without_url, topic="t", group_id="g"),
                    PartitionNotAssignedError(3, None, topic="t", group_id="g"),
                    PartitionNotAssignedError(3, None, topic="t", group_id="g", catching_up=True),
                    KeyPartitionUndecidedError("k", frozenset({2, 3}), frozenset({3}), "why", topic="t",
                                               group_id="g", owners={3: with_url})):
        assert isinstance(router.who_answers("t", refusal), Unavailable), refusal


@pytest.fixture
def two_members(store):
    """Two group members over one store: A serves one partition, B (a real server on 127.0.0.1)
    the other; the group names B, with B's URL in its client id, as A's owner of that partition."""
    from materializer.serve import QueryServer
    from materializer.serve.forwarding import Forwarding

    p_a, p_b = where(b"user:1"), 1 - where(b"user:1")
    served_b = ServedPartitions("t", "g", lambda: frozenset({p_b}), lambda: 2)
    app_b = create_app([TopicSource("t", lambda: MaterializedView(store, value_serde=JsonSerde(), served=served_b),
                                    group_id="g", member_id=lambda: "member-b")], token="tok", served_by="b:1")
    with QueryServer(app_b) as server_b:
        owner_b = PartitionOwner(p_b, "member-b", f"kafka-materializer-t;serve={server_b.url}", "/127.0.0.1")
        served_a = ServedPartitions("t", "g", lambda: frozenset({p_a}), lambda: 2, owners=lambda: {p_b: owner_b})

        def app_a(token: str | None = "tok"):
            return create_app([TopicSource("t", lambda: MaterializedView(store, value_serde=JsonSerde(),
                                                                         served=served_a),
                                           group_id="g", member_id=lambda: "member-a")],
                              token="tok", served_by="a:1", router=Forwarding(token=token, timeout_s=5))

        yield app_a, server_b, p_a, p_b


AUTH = ((b"authorization", b"Bearer tok"),)


def test_a_key_of_another_members_partition_is_answered_by_that_member(two_members):
    app_a, server_b, p_a, p_b = two_members
    app = app_a()
    theirs, mine = b"user:2", b"user:1"  # stored in the partition murmur2 routes them to
    assert (where(theirs), where_partition(theirs.decode()), where(mine), where_partition(mine.decode())) == (
        p_b, p_b, p_a, p_a)
    status, _, body = call(app, "GET", f"/v1/topics/t/keys/{quote(theirs, safe='')}", headers=AUTH)
    assert status == 200 and body["value"] == json.loads(KEYS[theirs]) and body["partition"] == p_b
    assert body["served_by"] == {"address": "b:1", "group_id": "g", "member_id": "member-b"}  # the owner's answer
    absent = next(k for k in (f"absent-{i}" for i in range(100)) if where_partition(k) == p_b)
    status, _, body = call(app, "GET", f"/v1/topics/t/keys/{absent}", headers=AUTH)
    assert status == 404 and "no live value" in body["error"]  # the owner's 404
    # multi-get: each key answered where it lives, in order
    status, _, body = call(app, "POST", "/v1/topics/t/keys:batch", headers=AUTH,
                           body=json.dumps([theirs.decode(), mine.decode(), absent]).encode())
    assert [(r["status"], (r.get("served_by") or {}).get("member_id")) for r in body["results"]] == [
        (200, "member-b"), (200, "member-a"), (404, "member-b")]
    # scan: both members' pages merged in key order, paged with the cursor
    seen, cursor = [], None
    while True:
        status, _, page = call(app, "GET", "/v1/topics/t/scan", query="limit=2&key_encoding=base64"
                               + ("" if cursor is None else f"&cursor={cursor}"), headers=AUTH)
        assert status == 200 and page["partial"] is False and page["partitions"] == [0, 1], page
        seen += [base64.b64decode(i["key"]) for i in page["items"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == sorted(KEYS)
    # forwarded once already: answered here or 503, never forwarded again
    status, _, body = call(app, "GET", f"/v1/topics/t/keys/{quote(theirs, safe='')}",
                           headers=(*AUTH, (b"x-materializer-forwarded", b"1")))
    assert status == 503 and "one hop" in body["error"]
    # the forward carries the token: without it the owner refuses (its 401 is 502 here: not the client's token)
    status, _, body = call(app_a(token=None), "GET", f"/v1/topics/t/keys/{quote(theirs, safe='')}", headers=AUTH)
    assert status == 502 and "member-b" in body["error"] and "token" in body["error"]
    # an owner that does not answer: 503 with Retry-After naming it, never 404
    server_b.close()
    status, headers, body = call(app, "GET", f"/v1/topics/t/keys/{absent}", headers=AUTH)
    assert status == 503 and headers["retry-after"] == "1" and "member-b" in body["error"]
    assert body["owners"][str(p_b)]["serving_url"] == server_b.url
    status, _, page = call(app, "GET", "/v1/topics/t/scan", headers=AUTH)
    assert page["partial"] is True and page["partitions"] == [p_a] and list(page["unavailable"]) == [str(p_b)]


def where_partition(key: str) -> int:
    from materializer.group.routing import partition_for_key

    return partition_for_key(key, 2)


def test_a_value_with_nan_or_infinity_is_answered_not_a_500(tmp_path):
    # json.loads (the json value format) accepts NaN and Infinity; rendering them must not fail the page
    with StateStore(tmp_path / "nan") as opened:
        opened.apply({0: [Record(0, 1, b"k", b'{"x": NaN, "y": Infinity}'), Record(1, 2, b"l", b'{"n": 1}')]},
                     {0: 2})
        app = create_app([view_source("t", MaterializedView(opened, value_serde=JsonSerde()))])
        status, _, body = call_raw(app, "GET", "/v1/topics/t/keys/k")
        assert status == 200 and b'"x":NaN' in body and b'"y":Infinity' in body
        status, _, body = call_raw(app, "POST", "/v1/topics/t/keys:batch", body=b'["k", "l"]')
        assert status == 200 and b"NaN" in body and b'"n":1' in body
        status, _, body = call_raw(app, "GET", "/v1/topics/t/scan")
        assert status == 200 and b"Infinity" in body and b'"l"' in body


def test_a_batch_of_a_lone_surrogate_or_of_too_deep_json_is_400(store):
    app = create_app([view_source("t", MaterializedView(store, value_serde=JsonSerde()))])
    for body in (b'["\\ud800"]', b"[" * 100_000 + b"]" * 100_000):
        status, _, answer = call(app, "POST", "/v1/topics/t/keys:batch", body=body)
        assert status == 400 and answer["error"], (body[:20], answer)


def test_scan_bounds_are_the_query_bytes_even_when_not_utf8(store):
    # %FF is the byte 0xff (as in the path), not U+FFFD
    app = create_app([view_source("t", MaterializedView(store, value_serde=JsonSerde()))])
    status, _, page = call(app, "GET", "/v1/topics/t/scan", query="prefix=%FF")
    assert status == 200 and [i["key"] for i in page["items"]] == ["base64:/wA="], page
    status, _, page = call(app, "GET", "/v1/topics/t/scan", query="start=%FF%00&end=%FF%01")
    assert status == 200 and [i["key"] for i in page["items"]] == ["base64:/wA="], page
    status, _, page = call(app, "GET", "/v1/topics/t/scan", query="prefix=user%3a")
    assert [i["key"] for i in page["items"]] == ["user:1", "user:2"]


def test_a_scan_across_members_merges_on_the_exact_key_bytes(store, two_members):
    # the owner's items are ordered and resumed on their key bytes, not on the display text: a UTF-8
    # key that starts with "base64:" is itself, and a stored key longer than a request may give is no 413
    app_a, _, p_a, p_b = two_members
    odd = [b"base64:AAAA", b"z" * (answers.MAX_KEY_BYTES + 1)]
    store.apply({p_b: [Record(100 + i, 3_000 + i, key, b'{"n": 0}') for i, key in enumerate(odd)]}, {p_b: 102})
    expected = sorted([*KEYS, *odd])
    for encoding in ("utf8", "base64"):
        seen, exact, cursor = [], [], None
        for _ in range(len(expected)):
            status, _, page = call(app_a(), "GET", "/v1/topics/t/scan", query=f"limit=2&key_encoding={encoding}"
                                   + ("" if cursor is None else f"&cursor={cursor}"), headers=AUTH)
            assert status == 200 and page["partial"] is False, page
            seen += [i["key"] for i in page["items"]]
            exact += [i.get("key_b64") for i in page["items"]]
            cursor = page["next_cursor"]
            if cursor is None:
                break
        assert seen == [answers.key_text(k, encoding) for k in expected], encoding
        assert exact == [base64.b64encode(k).decode() for k in expected]  # each item carries its key bytes


def test_forwarding_under_a_mount_prefix_and_an_owner_404_that_is_not_absent(store):
    # Mount("/kv") leaves raw_path whole: the forward must drop this app's prefix (the owner's serving
    # URL carries its own), and an owner 404 that is not "absent" (no such endpoint) is 502, never 404
    from starlette.applications import Starlette
    from starlette.routing import Mount

    from materializer.serve import QueryServer
    from materializer.serve.forwarding import Forwarding

    p_a, p_b = where(b"user:1"), 1 - where(b"user:1")
    served_b = ServedPartitions("t", "g", lambda: frozenset({p_b}), lambda: 2)
    app_b = create_app([TopicSource("t", lambda: MaterializedView(store, value_serde=JsonSerde(), served=served_b),
                                    group_id="g", member_id=lambda: "member-b")], served_by="b:1")
    with QueryServer(Starlette(routes=[Mount("/kv", app=app_b)])) as server_b:
        def member_a(serving_url: str):
            owner_b = PartitionOwner(p_b, "member-b", f"kafka-materializer-t;serve={serving_url}", "/127.0.0.1")
            served_a = ServedPartitions("t", "g", lambda: frozenset({p_a}), lambda: 2, owners=lambda: {p_b: owner_b})
            return Starlette(routes=[Mount("/kv", app=create_app(
                [TopicSource("t", lambda: MaterializedView(store, value_serde=JsonSerde(), served=served_a),
                             group_id="g", member_id=lambda: "member-a")], served_by="a:1", router=Forwarding()))])

        app = member_a(server_b.url + "/kv")
        status, _, body = call(app, "GET", "/kv/v1/topics/t/keys/user%3A2")
        assert status == 200 and body["value"] == {"n": 4} and body["served_by"]["member_id"] == "member-b", body
        absent = next(k for k in (f"absent-{i}" for i in range(100)) if where_partition(k) == p_b)
        status, _, body = call(app, "GET", f"/kv/v1/topics/t/keys/{absent}")
        assert status == 404 and body["absent"] is True and "no live value" in body["error"], body
        status, _, body = call(app, "POST", "/kv/v1/topics/t/keys:batch", body=json.dumps(["user:2", absent]).encode())
        assert [r["status"] for r in body["results"]] == [200, 404] and body["results"][1]["absent"] is True, body
        status, _, page = call(app, "GET", "/kv/v1/topics/t/scan")
        assert status == 200 and page["partial"] is False and len(page["items"]) == len(KEYS), page
        # a serving URL without the owner's mount prefix: its "no such endpoint" 404 is 502 naming it
        wrong = member_a(server_b.url)
        for key in ("user%3A2", absent):
            status, _, body = call(wrong, "GET", f"/kv/v1/topics/t/keys/{key}")
            assert status == 502 and "member-b" in body["error"] and "404" in body["error"], body
        status, _, body = call(wrong, "POST", "/kv/v1/topics/t/keys:batch", body=json.dumps([absent]).encode())
        assert [r["status"] for r in body["results"]] == [502], body


@pytest.fixture
def recorders():
    """Two plain HTTP servers on 127.0.0.1 that record each request's (path, Authorization); the first
    (``redirector``) answers 302 to the second, the second (``target``) 200 with a JSON object."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    seen: dict[str, list[tuple[str, str | None]]] = {"redirector": [], "target": []}
    servers = {}

    def handler(name):
        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 - http.server's naming
                seen[name].append((self.path, self.headers.get("Authorization")))
                if name == "redirector":
                    self.send_response(302)
                    self.send_header("Location", f"http://127.0.0.1:{servers['target'].server_port}{self.path}")
                    body = b'{"error": "moved"}'
                else:
                    self.send_response(200)
                    body = b'{"ok": true}'
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass
        return Handler

    for name in ("target", "redirector"):
        servers[name] = ThreadingHTTPServer(("127.0.0.1", 0), handler(name))
        threading.Thread(target=servers[name].serve_forever, daemon=True).start()
    yield {n: f"http://127.0.0.1:{s.server_port}" for n, s in servers.items()}, seen
    for server in servers.values():
        server.shutdown()
        server.server_close()


def test_a_forward_follows_no_redirect_and_no_proxy_and_no_plain_http_under_tls(store, recorders, monkeypatch,
                                                                                 tmp_path):
    from materializer.serve.forwarding import Forwarding

    urls, seen = recorders
    p_a, p_b = where(b"user:1"), 1 - where(b"user:1")

    def member_a(serving_url: str, router):
        owner_b = PartitionOwner(p_b, "member-b", f"kafka-materializer-t;serve={serving_url}", "/127.0.0.1")
        served_a = ServedPartitions("t", "g", lambda: frozenset({p_a}), lambda: 2, owners=lambda: {p_b: owner_b})
        return create_app([TopicSource("t", lambda: MaterializedView(store, value_serde=JsonSerde(), served=served_a),
                                       group_id="g", member_id=lambda: "member-a")], router=router)

    # a redirect is not followed: the token never reaches where it points; 502 naming the owner
    status, _, body = call(member_a(urls["redirector"], Forwarding(token="tok")), "GET", "/v1/topics/t/keys/user%3A2")
    assert status == 502 and "member-b" in body["error"] and "302" in body["error"], body
    assert seen == {"redirector": [("/v1/topics/t/keys/user%3A2", "Bearer tok")], "target": []}
    # http_proxy from the environment is not used: the request goes to the owner itself
    for name in ("no_proxy", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("http_proxy", urls["redirector"])
    answer = Forwarding(token="tok").send(urls["target"], "GET", "/v1/x")
    assert answer.status == 200 and answer.body == {"ok": True}
    assert seen["target"] == [("/v1/x", "Bearer tok")] and len(seen["redirector"]) == 1
    # a member that verifies TLS with a CA file never sends the token to a plain http:// owner: 503 naming it
    ca, _ = self_signed(tmp_path)
    status, headers, body = call(member_a(urls["target"], Forwarding(token="tok", cafile=ca)), "GET",
                                 "/v1/topics/t/keys/user%3A2")
    assert status == 503 and "member-b" in body["error"] and urls["target"] in body["error"], body
    assert headers["retry-after"] and len(seen["target"]) == 1


def test_remote_get_follows_no_redirect_and_no_plain_http_under_tls(recorders, monkeypatch, tmp_path):
    from materializer.cli import remote_get as module
    from materializer.cli.conventions import CommandError

    urls, seen = recorders

    class Members:  # the group names the redirector as the owner of every partition
        def __init__(self, *args):
            pass

        def partition_count(self, topic):
            return 1

        def partition_owners(self, group_id, topic):
            return {0: PartitionOwner(0, "member-b", f"c;serve={urls['redirector']}", "/127.0.0.1")}

    monkeypatch.setattr(module, "GroupMembersClient", Members)
    token = tmp_path / "token"
    token.write_text("tok")
    with pytest.raises(CommandError, match="302"):
        module.remote_get("b:9092", "g", "t", b"k", partitioner="murmur2", config={}, fmt=None,
                          token_file=token, ca_file=None)
    assert len(seen["redirector"]) == 1 and seen["target"] == []
    ca, _ = self_signed(tmp_path)
    with pytest.raises(CommandError, match="not https"):
        module.remote_get("b:9092", "g", "t", b"k", partitioner="murmur2", config={}, fmt=None,
                          token_file=token, ca_file=ca)
    assert len(seen["redirector"]) == 1 and seen["target"] == []


def test_a_batch_asks_the_group_for_owners_once_not_once_per_refused_key(store):
    from materializer.serve import QueryServer
    from materializer.serve.forwarding import Forwarding

    p_a, p_b = where(b"user:1"), 1 - where(b"user:1")
    theirs = ["user:2"]  # stored in, and routed to, B's partition
    absent = [k for k in (f"absent-{i}" for i in range(200)) if where_partition(k) == p_b][:5]
    served_b = ServedPartitions("t", "g", lambda: frozenset({p_b}), lambda: 2)
    app_b = create_app([TopicSource("t", lambda: MaterializedView(store, value_serde=JsonSerde(), served=served_b),
                                    group_id="g", member_id=lambda: "member-b")])
    with QueryServer(app_b) as server_b:
        asked = []

        def owners():
            asked.append(1)
            if fail:
                raise RuntimeError("the coordinator timed out")
            return {p_b: PartitionOwner(p_b, "member-b", f"c;serve={server_b.url}", "/127.0.0.1")}

        served_a = ServedPartitions("t", "g", lambda: frozenset({p_a}), lambda: 2, owners=owners)
        app = create_app([TopicSource("t", lambda: MaterializedView(store, value_serde=JsonSerde(), served=served_a),
                                      group_id="g", member_id=lambda: "member-a")], router=Forwarding())
        fail = False
        status, _, body = call(app, "POST", "/v1/topics/t/keys:batch", body=json.dumps(theirs + absent).encode())
        assert [r["status"] for r in body["results"]] == [200] * len(theirs) + [404] * len(absent), body
        assert len(asked) == 1
        fail, asked[:] = True, []
        status, _, body = call(app, "POST", "/v1/topics/t/keys:batch", body=json.dumps(theirs + absent).encode())
        assert [r["status"] for r in body["results"]] == [503] * (len(theirs) + len(absent)), body
        assert "timed out" in body["results"][-1]["error"] and len(asked) == 1
        status, _, body = call(app, "GET", f"/v1/topics/t/keys/{absent[0]}")  # the next request asks again
        assert status == 503 and len(asked) == 2


@pytest.mark.parametrize("sequence", [
    ({0, 1}, {0}, {0}),  # partition 1 revoked as the scan starts: served before, not after
    ({0}, {0, 1}, {0, 1}),  # partition 1 assigned as the scan starts: served after, not before
], ids=["revoked-during-the-scan", "assigned-during-the-scan"])
def test_a_scan_during_a_rebalance_reports_exactly_the_partitions_its_page_covers(store, sequence):
    """The served partitions are read before, during (the view's own snapshot) and after the scan;
    the page and its "partitions" keep to those served throughout, so a merging client never takes
    a partition as covered while its keys are missing, nor gets keys of one said not covered."""
    calls = []

    def partitions() -> frozenset[int]:
        calls.append(None)
        return frozenset(sequence[min(len(calls), len(sequence)) - 1])

    view = MaterializedView(store, value_serde=JsonSerde(),
                            served=ServedPartitions("t", "g", partitions, lambda: 2))
    app = create_app([TopicSource("t", lambda: view, group_id="g", member_id=lambda: "member-a")])
    status, _, body = call(app, "GET", "/v1/topics/t/scan")
    assert status == 200 and body["partitions"] == [0] and body["partial"] is True
    assert {item["partition"] for item in body["items"]} == {0}
    assert sorted(base64.b64decode(item["key_b64"]) for item in body["items"]) == sorted(
        k for k in KEYS if where(k) == 0)
