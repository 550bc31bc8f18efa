"""The query server's 404 for a deleted key (materializer.deletions): ``deleted`` with the tombstone's
partition, offset and timestamp while the local log still shows it, in a GET, in a batch, and
relayed from the member that owns the key's partition. Over a real store and real local logs,
driven through the ASGI interface; the broker-backed test is tests/integration/test_deleted_keys.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("starlette")  # the `serve` extra; the test dependency group installs it

from materializer.adapters.partition_owner import PartitionOwner  # noqa: E402
from materializer.adapters.rocksdb_store import StateStore  # noqa: E402
from materializer.adapters.serdes import StrSerde  # noqa: E402
from materializer.serve import TopicSource, create_app, view_source  # noqa: E402
from materializer.storage.log import Log  # noqa: E402
from materializer.storage.record_batch import Record  # noqa: E402
from materializer.view import LiveLogs, MaterializedView, ServedPartitions  # noqa: E402
from tests.unit.materializer.serve.test_serve import call, where_partition  # noqa: E402

AUTH = ((b"authorization", b"Bearer tok"),)


@pytest.fixture
def deleted(tmp_path: Path):
    """Two partitions; in each, a key routed there (murmur2) written then deleted at offset 1, and
    one written only: ``(store, logs, {partition: (deleted key, live key)})``."""
    keys: dict[int, tuple[str, str]] = {}
    for p in (0, 1):
        names = [k for k in (f"key-{i}" for i in range(100)) if where_partition(k) == p]
        keys[p] = (names[0], names[1])
    logs = {}
    with StateStore(tmp_path / "state") as store:
        for p, (gone, live) in keys.items():
            records = [Record(0, 5_000 + p, gone.encode(), b"v"), Record(1, 6_000 + p, gone.encode(), None),
                       Record(2, 7_000 + p, live.encode(), b"w")]
            logs[p] = Log.open(tmp_path / f"t-{p}")
            logs[p].append_records(records)
            store.apply({p: records}, {p: 3})
        yield store, logs, keys
    for log in logs.values():
        log.close()


def test_a_deleted_key_is_404_with_its_tombstone_a_never_written_one_without(deleted) -> None:
    store, logs, keys = deleted
    app = create_app([view_source("t", MaterializedView(store, value_serde=StrSerde(),
                                                        tombstone_log=LiveLogs(lambda: logs)))])
    gone, live = keys[1]
    status, _, body = call(app, "GET", f"/v1/topics/t/keys/{gone}")
    assert status == 404 and body["absent"] is True
    assert body["deleted"] == {"partition": 1, "offset": 1, "timestamp": 6_001}
    assert "deleted by the tombstone at offset 1 of partition 1" in body["error"]
    status, _, body = call(app, "GET", "/v1/topics/t/keys/never")
    assert status == 404 and body["absent"] is True and "deleted" not in body
    status, _, body = call(app, "POST", "/v1/topics/t/keys:batch", body=json.dumps([gone, live, "never"]).encode())
    results = body["results"]
    assert [r["status"] for r in results] == [404, 200, 404]
    assert results[0]["deleted"] == {"partition": 1, "offset": 1, "timestamp": 6_001} and "deleted" not in results[2]
    # without a local log (a view of a store alone): plain not found
    bare = create_app([view_source("t", MaterializedView(store, value_serde=StrSerde()))])
    assert "deleted" not in call(bare, "GET", f"/v1/topics/t/keys/{gone}")[2]


def test_the_owners_deleted_answer_is_relayed_for_a_forwarded_key(deleted) -> None:
    from materializer.serve import QueryServer
    from materializer.serve.forwarding import Forwarding

    store, logs, keys = deleted
    served_b = ServedPartitions("t", "g", lambda: frozenset({1}), lambda: 2)
    app_b = create_app([TopicSource("t", lambda: MaterializedView(store, value_serde=StrSerde(), served=served_b,
                                                                  tombstone_log=LiveLogs(lambda: logs)),
                                    group_id="g", member_id=lambda: "member-b")], token="tok", served_by="b:1")
    with QueryServer(app_b) as server_b:
        owner_b = PartitionOwner(1, "member-b", f"kafka-materializer-t;serve={server_b.url}", "/127.0.0.1")
        served_a = ServedPartitions("t", "g", lambda: frozenset({0}), lambda: 2, owners=lambda: {1: owner_b})
        app_a = create_app([TopicSource("t", lambda: MaterializedView(store, value_serde=StrSerde(), served=served_a,
                                                                      tombstone_log=LiveLogs(lambda: logs)),
                                        group_id="g", member_id=lambda: "member-a")],
                           token="tok", served_by="a:1", router=Forwarding(token="tok", timeout_s=5))
        theirs, mine = keys[1][0], keys[0][0]
        status, _, body = call(app_a, "GET", f"/v1/topics/t/keys/{theirs}", headers=AUTH)
        assert status == 404 and body["deleted"] == {"partition": 1, "offset": 1, "timestamp": 6_001}, body
        status, _, body = call(app_a, "POST", "/v1/topics/t/keys:batch", headers=AUTH,
                               body=json.dumps([theirs, mine]).encode())
        assert [(r["status"], r["deleted"]["partition"], (r.get("served_by") or {}).get("member_id"))
                for r in body["results"]] == [(404, 1, "member-b"), (404, 0, None)], body  # the owner's, relayed
