"""Gets answered on the event loop (materializer.serve.on_loop) and the server's fast paths
(materializer.serve.server.fast_paths): a live local key skips the worker thread; everything
else (refusals, owners asked of the group, absent keys, not ready, Avro) still goes through it
and answers exactly as before; the server never changes the process's event loop policy."""

from __future__ import annotations

import asyncio
import json
import threading
import urllib.request

import pytest

pytest.importorskip("starlette")  # the `serve` extra; the test dependency group installs it

import materializer.serve.app as app_module  # noqa: E402
from materializer.adapters.partition_owner import PartitionOwner  # noqa: E402
from materializer.adapters.serdes import JsonSerde  # noqa: E402
from materializer.health import ProbeResult  # noqa: E402
from materializer.serve import QueryServer, TopicSource, create_app, view_source  # noqa: E402
from materializer.serve.server import fast_paths  # noqa: E402
from materializer.view import MaterializedView, ServedPartitions  # noqa: E402
from tests.unit.materializer.serve.test_serve import KEYS, call, where  # noqa: E402
from tests.unit.materializer.serve.test_serve import store as store  # noqa: E402, F401 - the fixture


@pytest.fixture
def hops(monkeypatch):
    """Records each read handed to a worker thread (Starlette's run_in_threadpool) by the function's name."""
    handed: list[str] = []
    real = app_module.run_in_threadpool

    async def recorded(func, *args, **kwargs):
        handed.append(func.__name__)
        return await real(func, *args, **kwargs)

    monkeypatch.setattr(app_module, "run_in_threadpool", recorded)
    return handed


def test_a_live_local_key_is_answered_on_the_loop_with_the_threads_answer(store, hops):
    app = create_app([view_source("t", MaterializedView(store, value_serde=JsonSerde()))], served_by="h:1")
    status, _, body = call(app, "GET", "/v1/topics/t/keys/user:1")
    assert status == 200 and hops == []  # no worker thread
    custom = create_app([TopicSource("t", lambda: MaterializedView(store, value_serde=JsonSerde()))], served_by="h:1")
    assert call(custom, "GET", "/v1/topics/t/keys/user:1") == (status, _, body)  # a user's source: read in a thread
    assert hops == ["_get"]
    assert body["value"] == {"n": 3} and body["partition"] == where(b"user:1") and body["value_format"] == "json"
    assert body["served_by"] == {"address": "h:1", "group_id": None, "member_id": None}


def test_absent_not_ready_and_refused_keys_are_still_answered_by_the_thread(store, hops):
    view = MaterializedView(store, value_serde=JsonSerde())
    app = create_app([view_source("t", view)])
    status, _, body = call(app, "GET", "/v1/topics/t/keys/gone")
    assert status == 404 and body["absent"] is True  # absent: the thread reads it again (and looks for its tombstone)
    not_ready = create_app([TopicSource("t", lambda: view, lambda: ProbeResult(False, ("catching up",)),
                                        reads_on_loop=True)])
    status, _, body = call(not_ready, "GET", "/v1/topics/t/keys/user:1")
    assert status == 503 and body["reasons"] == ["catching up"]
    assert hops == ["_get", "_get"]


def test_a_refused_key_asks_the_group_for_its_owner_in_a_worker_thread_never_on_the_loop(store, hops):
    owner = PartitionOwner(1 - where(b"user:1"), "member-b", "client-b", "/10.0.0.2")
    asked_on: list[str] = []

    def owners():
        asked_on.append(threading.current_thread().name)
        return {owner.partition: owner}

    served = ServedPartitions("t", "g", lambda: frozenset({where(b"user:1")}), lambda: 2, owners=owners)
    view = MaterializedView(store, value_serde=JsonSerde(), served=served)
    app = create_app([TopicSource("t", lambda: view, group_id="g", reads_on_loop=True)])
    other = next(k for k in KEYS if k.isascii() and b"/" not in k and b"%" not in k
                 and served.partition_of(k) == owner.partition)
    loop_thread = threading.current_thread().name  # call() runs the app's loop on this thread
    status, _, body = call(app, "GET", f"/v1/topics/t/keys/{other.decode()}")
    assert status == 503 and body["owners"][str(owner.partition)]["member_id"] == "member-b"
    assert hops == ["_get"] and asked_on and loop_thread not in asked_on
    assert view.served is served  # the loop's read changed a copy of the source's view, not the view itself
    status, _, body = call(app, "GET", "/v1/topics/t/keys/user:1")
    assert status == 200 and hops == ["_get"] and len(asked_on) == 1  # its own partition: on the loop


def test_the_server_uses_the_fast_parser_and_loop_without_changing_the_process_policy(store):
    assert fast_paths() == ("httptools", "uvloop")  # the serve extra installs both (pyproject.toml)
    policy = asyncio.get_event_loop_policy()
    seen: list[str] = []

    async def loop_kind(scope, receive, send):
        seen.append(type(asyncio.get_running_loop()).__module__)
        await create_app([view_source("t", MaterializedView(store, value_serde=JsonSerde()))])(scope, receive, send)

    with QueryServer(loop_kind) as server:
        with urllib.request.urlopen(f"{server.url}/v1/topics/t/keys/user:1", timeout=10) as answer:
            assert json.loads(answer.read())["value"] == {"n": 3}
        assert asyncio.get_event_loop_policy() is policy  # uvicorn's loop="uvloop" would have set uvloop's
    assert seen and seen[0].startswith("uvloop")
