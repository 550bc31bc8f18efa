"""The query server's ASGI app (Starlette): read-only HTTP access to materialized topics.

::

    GET  /v1/topics                              the topics served
    GET  /v1/topics/{topic}/keys/{key}           one key: 200 {value, partition, offset, timestamp, ...},
                                                 404 no live value, 503 + Retry-After cannot answer now
    POST /v1/topics/{topic}/keys:batch           a JSON list of keys: 200 {results: [...]}, one answer per key
    GET  /v1/topics/{topic}/scan                 ?prefix= or ?start=&end=, &limit=, &cursor=: a page of entries
    GET  /openapi.json                           the OpenAPI 3.1 description
    GET  /                                       the status page (HTML; :mod:`materializer.serve.status_page`)

Keys are the records' key bytes: UTF-8 text percent-encoded as one path segment (``/`` is ``%2F``,
``%`` is ``%25``), or ``?key_encoding=base64`` (:mod:`materializer.serve.answers`). Values are
decoded by the topic's value format. Every error is one JSON object ``{"error": "..."}`` with a
4xx or 5xx status; a failure the server did not expect is logged and answered 500 without detail.

Reads go through the run's own read path (:class:`~materializer.view.MaterializedView`): a key is
answered 404 only when the view answers "absent", never when it refuses (another member's
partition, one catching up, stale data). A refused partition goes where the router says
(:mod:`materializer.serve.routing`): to the member that holds it, one hop, whose answer is relayed
(:mod:`materializer.serve.forwarding`), or 503. Multi-gets send each owner its keys in one request;
a scan asks each member that holds a partition not served here for the same page and merges the
pages in (key, partition) order (the cursor is a position in that order, so it resumes on every
member); partitions no member answers for are listed in ``unavailable`` with ``partial: true``.
A get of a live key of a partition served here is read on the event loop
(:mod:`materializer.serve.on_loop`); every other read runs in a worker thread (RocksDB scans and
multi-gets, tombstone lookups in the local log, and a refusal may ask the group coordinator which
member holds the partition).

Mount it in your own app: ``Mount("/kv", app=create_app(...))`` (Starlette) or
``app.mount("/kv", create_app(...))`` (FastAPI).
"""

from __future__ import annotations

import base64
import copy
import dataclasses
import functools
import hmac
import json
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any
from urllib.parse import quote, unquote_to_bytes

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse as _StarletteJSON
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from materializer.adapters.errors import (
    DeserializationError,
    PartitionNotAssignedError,
    SchemaRegistryError,
    StoreError,
)
from materializer.datadir.lease import StaleStoreError
from materializer.serve import answers
from materializer.serve.answers import BadRequest
from materializer.serve.batch import key_groups, one_by_one
from materializer.serve.hosts import AllowedHosts
from materializer.serve.on_loop import entry_on_loop
from materializer.serve.openapi import openapi_document
from materializer.serve.refusals import forward_failure, public_reasons, store_failure
from materializer.serve.routing import (
    FORWARDED_HEADER,
    RETRY_AFTER_S,
    Forward,
    LocalOnly,
    Router,
    Unavailable,
    owner_json,
)
from materializer.serve.sources import NotServing, TopicSource
from materializer.serve.status_page import StatusPage
from materializer.storage.errors import IncompleteDataDirError
from materializer.view import Deletion, Entry, MaterializedView

__all__ = ["create_app"]

logger = logging.getLogger(__name__)


class JSONResponse(_StarletteJSON):
    """Starlette's JSON answer, but a value holding NaN or Infinity (which :func:`json.loads`, and so
    the ``json`` value format, accepts) is written as ``NaN``/``Infinity`` as Python's json does,
    not a ValueError that would turn a whole page into a 500."""

    def render(self, content: Any) -> bytes:
        return json.dumps(content, ensure_ascii=False, allow_nan=True, indent=None,
                          separators=(",", ":")).encode("utf-8")


class _Refused(Exception):
    """An answer other than 200: status, JSON body, headers."""

    def __init__(self, status: int, body: dict[str, Any], headers: Mapping[str, str] | None = None) -> None:
        super().__init__(body.get("error"))
        self.status, self.body, self.headers = status, body, dict(headers or {})


class _ForwardTo(Exception):
    """The view refused a key whose partition another member answers (:class:`Forward`)."""

    def __init__(self, forward: Forward) -> None:
        super().__init__(forward.url)
        self.forward = forward


def _unavailable(error: str, **fields: Any) -> _Refused:
    return _Refused(503, {"error": error, **fields}, {"Retry-After": str(RETRY_AFTER_S)})


def create_app(sources: Iterable[TopicSource], *, token: str | None = None, served_by: str | None = None,
               router: Router | None = None, allowed_hosts: Iterable[str] | None = None) -> Starlette:
    """The query server's ASGI app over ``sources`` (module docstring).

    Args:
        sources: one :class:`~materializer.serve.sources.TopicSource` per topic
            (:func:`~materializer.serve.sources.source_of` of a running Materializer).
        token: when given, every request must carry ``Authorization: Bearer <token>``; others get
            401 with ``WWW-Authenticate: Bearer`` (RFC 6750 §3).
        served_by: this server's address (``host:port``), named in each answer's ``served_by``.
        router: who answers a partition the local view refuses (:mod:`materializer.serve.routing`;
            default :class:`~materializer.serve.routing.LocalOnly`: 503).
        allowed_hosts: the names a request's ``Host`` header may carry; others get 400 (DNS
            rebinding: :mod:`materializer.serve.hosts`). None: any (an app mounted in another
            checks them there, e.g. with Starlette's ``TrustedHostMiddleware``).

    Raises:
        ValueError: two sources of one topic, an empty token, or no allowed host.
    """
    by_topic: dict[str, TopicSource] = {}
    for source in sources:
        if source.topic in by_topic:
            raise ValueError(f"topic {source.topic!r} is given twice")
        by_topic[source.topic] = source
    if token is not None and not token:
        raise ValueError("the bearer token is empty")
    handlers = _Handlers(by_topic, served_by, router or LocalOnly())
    routes = [
        Route("/v1/topics", handlers.topics, methods=["GET"]),
        Route("/v1/topics/{topic}/keys:batch", handlers.batch, methods=["POST"]),
        Route("/v1/topics/{topic}/keys/{key:path}", handlers.get, methods=["GET"]),
        Route("/v1/topics/{topic}/scan", handlers.scan, methods=["GET"]),
        Route("/openapi.json", handlers.openapi, methods=["GET"]),
        Route("/", StatusPage(by_topic, handlers.lookup, served_by).page, methods=["GET"]),
    ]
    app = Starlette(routes=routes, exception_handlers={HTTPException: _http_error, Exception: _internal_error})
    if token is not None:
        app.add_middleware(_BearerToken, token=token)
    if allowed_hosts is not None:  # added last: the outermost, so a foreign Host is refused first
        app.add_middleware(AllowedHosts, names=tuple(allowed_hosts))
    return app


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    error = {404: "no such endpoint", 405: "method not allowed"}.get(exc.status_code, str(exc.detail))
    return JSONResponse({"error": error}, exc.status_code, headers=exc.headers)


async def _internal_error(request: Request, exc: Exception) -> Response:
    # Starlette's ServerErrorMiddleware logs the traceback (through the server) after this answer
    return JSONResponse({"error": "internal error (logged by the server)"}, 500)


class _BearerToken:
    """Refuses a request without the token (401): ``Authorization: Bearer <token>`` (RFC 6750 §3),
    or, so that a person's browser can open the status page with its own login prompt, HTTP Basic
    with the token as the password and any user name (RFC 7617). The 401 of ``/`` asks for Basic
    (a browser prompts), every other path's for Bearer."""

    def __init__(self, app: ASGIApp, token: str) -> None:
        self.app, self._token = app, token.encode()
        self._bearer = b"Bearer " + self._token

    def _allows(self, given: bytes) -> bool:
        scheme, _, credentials = given.partition(b" ")
        if scheme.lower() == b"basic":
            try:
                _user, colon, password = base64.b64decode(credentials.strip(), validate=True).partition(b":")
            except ValueError:
                return False
            return bool(colon) and hmac.compare_digest(password, self._token)
        return hmac.compare_digest(given, self._bearer)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and not self._allows(dict(scope["headers"]).get(b"authorization", b"")):
            challenge = ('Basic realm="materializer", charset="UTF-8"' if scope["path"] == "/"
                         else 'Bearer realm="materializer"')
            response = JSONResponse({"error": "a bearer token is required (Authorization: Bearer <token>; "
                                              "a browser: HTTP Basic, the token as the password)"}, 401,
                                    headers={"WWW-Authenticate": challenge})
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)


def _answered(handler: Callable[[Any, Request], Awaitable[Response]]) -> Callable[[Any, Request], Awaitable[Response]]:
    """Turns a handler's :class:`_Refused` and :class:`BadRequest` into their JSON answers and
    anything unexpected into a logged 500 (never a traceback to the client)."""

    @functools.wraps(handler)
    async def wrapped(self: Any, request: Request) -> Response:
        try:
            return await handler(self, request)
        except _Refused as refused:
            return JSONResponse(refused.body, refused.status, headers=refused.headers)
        except BadRequest as bad:
            return JSONResponse({"error": str(bad)}, bad.status)
        except Exception:
            logger.exception("the query server failed to answer %s %s", request.method, request.url.path)
            return JSONResponse({"error": "internal error (logged by the server)"}, 500)

    return wrapped


class _Handlers:
    """The endpoints, over the topics served (one instance per app)."""

    def __init__(self, sources: Mapping[str, TopicSource], served_by: str | None, router: Router) -> None:
        self.sources, self.served_by, self.router = sources, served_by, router

    # -- helpers (worker thread) -----------------------------------------------------------------

    def _source(self, request: Request) -> TopicSource:
        topic = request.path_params["topic"]
        source = self.sources.get(topic)
        if source is None:
            raise _Refused(404, {"error": f"topic {topic!r} is not served here", "topic": topic,
                                 "topics": sorted(self.sources)})
        return source

    def _ready_view(self, source: TopicSource) -> MaterializedView:
        """The view to read, once the topic is ready; else 503 saying why."""
        if source.readiness is not None:
            probe = source.readiness()
            if not probe.ok:
                reasons = public_reasons(probe.reasons)
                raise _unavailable(f"topic {source.topic!r} cannot be served now: " + "; ".join(reasons),
                                   topic=source.topic, reasons=reasons)
        try:
            return source.view()
        except NotServing as exc:
            raise _unavailable(str(exc), topic=source.topic) from exc

    def _served_by(self, source: TopicSource) -> dict[str, str | None]:
        return {"address": self.served_by, "group_id": source.group_id, "member_id": source.member_id()}

    def _refusal(self, source: TopicSource, exc: Exception, forwarded: bool) -> _Refused | _ForwardTo:
        """The answer to a read the view refused (module docstring); ``forwarded``: the request came
        from another member, so it is not forwarded again."""
        if isinstance(exc, PartitionNotAssignedError):
            answer = self.router.who_answers(source.topic, exc)
            if isinstance(answer, Forward):
                if not forwarded:
                    return _ForwardTo(answer)
                answer = Unavailable(f"{exc}; this request was forwarded by another member and is not forwarded "
                                     "again (one hop): ask again", (answer.partition,), {answer.partition: answer.owner})
            return _Refused(503, {"error": answer.reason, "topic": source.topic, "partitions": list(answer.partitions),
                                  "owners": {str(p): owner_json(o) for p, o in answer.owners.items()},
                                  "catching_up": answer.catching_up, "served_by": self._served_by(source)},
                            {"Retry-After": str(answer.retry_after_s)})
        if isinstance(exc, (StaleStoreError, IncompleteDataDirError, SchemaRegistryError, StoreError)):
            kind, error = store_failure(exc, source.topic)
            return _unavailable(error, topic=source.topic, reason=kind)
        if isinstance(exc, DeserializationError):
            return _Refused(500, {"error": str(exc), "topic": source.topic, "partition": exc.partition,
                                  "offset": exc.offset})
        raise exc

    def _read(self, source: TopicSource, read: Callable[[], Any], forwarded: bool = False) -> Any:
        try:
            return read()
        except (PartitionNotAssignedError, StaleStoreError, IncompleteDataDirError, SchemaRegistryError,
                StoreError, DeserializationError) as exc:
            raise self._refusal(source, exc, forwarded) from exc

    def _send(self, forward: Forward, source: TopicSource, method: str, path: str,
              body: bytes | None = None) -> dict[str, Any]:
        """The owner's 200 answer to ``method path``; its key-absent 404 (``"absent": true``) and its
        5xx as they are; 502 naming it for any other 4xx (a refused token, no such endpoint, a topic
        it does not serve); 503 with ``Retry-After`` naming it when it does not answer."""
        from materializer.serve.forwarding import Forwarding, OwnerUnreachable

        assert isinstance(self.router, Forwarding)
        try:
            answer = self.router.send(forward.url, method, path, body)
        except OwnerUnreachable as exc:
            kind, why = forward_failure(exc, forward.url)  # the detail (paths, TLS text) goes to the log
            raise _unavailable(f"partition {forward.partition} of topic {source.topic!r} is held by member "
                               f"{forward.owner.member_id!r} at {forward.url}, which did not answer: {why}",
                               reason=kind, topic=source.topic, partitions=[forward.partition],
                               owners={str(forward.partition): owner_json(forward.owner)},
                               served_by=self._served_by(source)) from exc
        if answer.status == 401:  # not the client's token: the members' tokens differ
            raise _Refused(502, {"error": f"member {forward.owner.member_id!r} at {forward.url} refused this member's "
                                          "bearer token (members must share --serve-token-file)",
                                 "topic": source.topic, "partitions": [forward.partition]})
        if answer.status == 200:
            return answer.body
        if (answer.status == 404 and answer.body.get("absent") is True) or answer.status >= 500:
            headers = {"Retry-After": answer.retry_after} if answer.retry_after else {}
            raise _Refused(answer.status, answer.body, headers)  # the owner's "absent", or why it cannot answer
        # any other 4xx (no such endpoint: a serving URL without the mount prefix; the topic not served
        # there) is about the members' setup, not the key: never relayed as "absent"
        raise _Refused(502, {"error": f"member {forward.owner.member_id!r} at {forward.url} answered {answer.status} "
                                      f"({answer.body.get('error')}): check its serving URL (with any mount prefix)",
                             "topic": source.topic, "partitions": [forward.partition],
                             "owners": {str(forward.partition): owner_json(forward.owner)}})

    def _deletion(self, source: TopicSource, view: MaterializedView, key: bytes, forwarded: bool) -> Deletion | None:
        """Where the local log shows ``key``'s tombstone, for a key just read absent; None when it does
        not, or a refusal came since (a rebalance): the absence stands either way."""
        try:
            return self._read(source, functools.partial(view.deletion, key), forwarded)
        except (_ForwardTo, _Refused):
            return None

    def _entry_json(self, entry: Entry, fmt: str, encoding: str) -> dict[str, Any]:
        return {"key": answers.key_text(entry.key, encoding), "value": answers.json_value(entry.value, fmt),
                "partition": entry.partition, "offset": entry.offset,
                "timestamp": entry.timestamp if entry.timestamp >= 0 else None}  # -1: NO_TIMESTAMP (RecordBatch)

    def lookup(self, topic: str, key: bytes) -> tuple[int, dict[str, Any]]:
        """``key`` of ``topic`` as ``GET /v1/topics/{topic}/keys/{key}`` answers it, forwarding
        included: (HTTP status, JSON body). The status page's lookup box (worker thread)."""
        source = self.sources.get(topic)
        if source is None:
            return 404, {"error": f"topic {topic!r} is not served here", "topic": topic}
        try:
            return 200, self._get(source, key, "utf8", f"/v1/topics/{quote(topic, safe='')}/keys/{quote(key, safe='')}")
        except _Refused as refused:
            return refused.status, refused.body

    # -- endpoints ------------------------------------------------------------------------------

    @_answered
    async def topics(self, request: Request) -> Response:
        return JSONResponse({"topics": sorted(self.sources)})

    @_answered
    async def openapi(self, request: Request) -> Response:
        return JSONResponse(openapi_document())

    @_answered
    async def get(self, request: Request) -> Response:
        encoding = request.query_params.get("key_encoding", "utf8")
        raw_path = request.scope.get("raw_path")
        matched = request.path_params["key"]
        given = answers.key_from_raw_path(raw_path, matched) if raw_path else matched.encode("utf-8")
        key = answers.key_bytes(given, encoding)
        source = self._source(request)
        on_loop = entry_on_loop(source, key)  # a live key of a partition served here: no thread hop
        if on_loop is not None:
            return JSONResponse(self._found(source, *on_loop, encoding))
        return JSONResponse(await run_in_threadpool(self._get, source, key, encoding,
                                                    _path_of(request), FORWARDED_HEADER in request.headers))

    def _get(self, source: TopicSource, key: bytes, encoding: str, path: str = "",
             forwarded: bool = False) -> dict[str, Any]:
        view = self._ready_view(source)
        try:
            entry = self._read(source, lambda: view.get_entry(key), forwarded)
        except _ForwardTo as to:
            return self._send(to.forward, source, "GET", path)
        if entry is None:
            raise _Refused(404, answers.absent(source.topic, answers.key_text(key, encoding),
                                               self._deletion(source, view, key, forwarded)))
        return self._found(source, view, entry, encoding)

    def _found(self, source: TopicSource, view: MaterializedView, entry: Entry, encoding: str) -> dict[str, Any]:
        return {"topic": source.topic, **self._entry_json(entry, view.value_serde.format, encoding),
                "value_format": view.value_serde.format, "served_by": self._served_by(source)}

    @_answered
    async def batch(self, request: Request) -> Response:
        encoding = request.query_params.get("key_encoding", "utf8")
        source = self._source(request)
        body = await _bounded_body(request)
        try:
            given = json.loads(body)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise BadRequest(f"the body is not JSON: {exc}") from exc
        except RecursionError as exc:  # arrays nested past the interpreter's recursion limit
            raise BadRequest("the body is not a JSON list of keys: it nests too deeply") from exc
        if not isinstance(given, list) or not all(isinstance(k, str) for k in given):
            raise BadRequest("the body must be a JSON list of keys (strings)")
        if len(given) > answers.MAX_BATCH_KEYS:
            raise BadRequest(f"{len(given)} keys asked for, more than the {answers.MAX_BATCH_KEYS} allowed", 413)
        keys = [answers.key_bytes(k, encoding) for k in given]
        return JSONResponse(await run_in_threadpool(self._batch, source, keys, given, encoding, _path_of(request),
                                                    FORWARDED_HEADER in request.headers))

    def _batch(self, source: TopicSource, keys: list[bytes], given: list[str], encoding: str, path: str = "",
               forwarded: bool = False) -> dict[str, Any]:
        view = _owners_asked_once(self._ready_view(source))
        fmt = view.value_serde.format
        served_by = self._served_by(source)
        results: list[dict[str, Any]] = [{} for _ in keys]  # a forwarded key's: filled by its owner's answer below
        elsewhere: dict[str, tuple[Forward, list[int]]] = {}  # owner URL -> (forward, indexes of its keys)
        pending = key_groups(view, keys)  # one multi-get per group (materializer.serve.batch)
        while pending:
            group = pending.pop()
            try:
                entries = self._read(source, group.read, forwarded)
            except _Refused as refused:
                if isinstance(refused.__cause__, DeserializationError) and len(group.indexes) > 1:
                    pending += one_by_one(view, keys, group)  # only the key whose value does not decode fails
                    continue
                for at in group.indexes:
                    results[at] = {"key": answers.key_text(keys[at], encoding), "status": refused.status,
                                   **refused.body}
                continue
            except _ForwardTo as to:
                elsewhere.setdefault(to.forward.url, (to.forward, []))[1].extend(group.indexes)
                continue
            for at, entry in zip(group.indexes, entries, strict=True):
                if entry is None:
                    text = answers.key_text(keys[at], encoding)
                    results[at] = {"status": 404, **answers.absent(
                        source.topic, text, self._deletion(source, view, keys[at], forwarded))}
                else:
                    results[at] = {"status": 200, **self._entry_json(entry, fmt, encoding), "served_by": served_by}
        for forward, indexes in elsewhere.values():  # one request per owner, its keys in order
            indexes.sort()
            body = json.dumps([given[at] for at in indexes]).encode()
            try:
                answer = self._send(forward, source, "POST", path, body)
                owned = [{**r, "served_by": answer.get("served_by")} for r in answer.get("results", ())]
                if len(owned) != len(indexes):
                    raise _unavailable(f"member {forward.owner.member_id!r} at {forward.url} answered "
                                       f"{len(owned)} results for {len(indexes)} keys")
            except _Refused as refused:
                owned = [{"key": answers.key_text(keys[at], encoding), "status": refused.status, **refused.body}
                         for at in indexes]
            for at, result in zip(indexes, owned, strict=True):
                results[at] = result
        return {"topic": source.topic, "results": results, "served_by": self._served_by(source)}

    @_answered
    async def scan(self, request: Request) -> Response:
        params = request.query_params
        encoding = params.get("key_encoding", "utf8")
        source = self._source(request)
        raw = _raw_query(request.scope.get("query_string") or b"")
        prefix, start, end = (None if raw.get(name) is None else answers.key_bytes(raw[name], encoding)
                              for name in ("prefix", "start", "end"))
        if prefix is not None and (start is not None or end is not None):
            raise BadRequest("give either prefix or start/end, not both")
        if prefix is not None:
            start, end = prefix, answers.prefix_end(prefix)
        try:
            limit = int(params.get("limit", answers.DEFAULT_SCAN_LIMIT))
        except ValueError as exc:
            raise BadRequest(f"limit must be an integer: {exc}") from exc
        if not 1 <= limit <= answers.MAX_SCAN_LIMIT:
            raise BadRequest(f"limit must be from 1 to {answers.MAX_SCAN_LIMIT}, got {limit}")
        after = None if params.get("cursor") is None else answers.decode_cursor(params["cursor"])
        local = await run_in_threadpool(self._scan, source, start, end, limit, after, encoding)
        if FORWARDED_HEADER in request.headers or not local["partial"] or not hasattr(self.router, "send"):
            return JSONResponse(local)
        return JSONResponse(await run_in_threadpool(self._scan_members, source, local, limit, encoding,
                                                    _path_of(request)))

    def _scan_members(self, source: TopicSource, local: dict[str, Any], limit: int, encoding: str,
                      path: str) -> dict[str, Any]:
        """``local`` (a page of the partitions served here) merged with the same page from each member
        that holds another partition, in (key, partition) order (module docstring)."""
        view = self._ready_view(source)
        served = view.served
        assert served is not None
        covered = set(local["partitions"])
        unavailable: dict[str, Any] = {}
        try:
            owners = dict(served.owners()) if served.owners is not None else {}
        except Exception as exc:  # noqa: BLE001 - every other partition is then unavailable, said so
            owners, why = {}, f"asking the group which member holds it failed ({exc})"
        else:
            why = "no member holds it now (a rebalance may be moving it)"
        by_url: dict[str, list[int]] = {}
        for partition in range(served.partition_count()):
            if partition in covered:
                continue
            owner = owners.get(partition)
            if owner is None or owner.serving_url is None:
                unavailable[str(partition)] = {"error": why if owner is None else "its member serves no queries",
                                               "owner": owner_json(owner)}
            else:
                by_url.setdefault(owner.serving_url, []).append(partition)
        items = [(_item_key(i), i["partition"], {**i, "served_by": local["served_by"]}) for i in local["items"]]
        more = local["next_cursor"] is not None
        for url, partitions in by_url.items():
            forward = Forward(partitions[0], owners[partitions[0]], url)
            try:
                page = self._send(forward, source, "GET", path)
            except _Refused as refused:
                for partition in partitions:
                    unavailable[str(partition)] = {"error": refused.body.get("error"),
                                                   "owner": owner_json(owners[partition])}
                continue
            answered = set(page.get("partitions") or ()) & set(partitions)
            try:
                theirs = [(_item_key(item), item["partition"], {**item, "served_by": page.get("served_by")})
                          for item in page.get("items", ()) if item["partition"] in answered]
            except (KeyError, TypeError, ValueError) as exc:  # binascii.Error is a ValueError
                for partition in partitions:
                    unavailable[str(partition)] = {"error": f"member at {url} answered a scan page without the "
                                                            f"items' key bytes ({type(exc).__name__}: {exc})",
                                                   "owner": owner_json(owners[partition])}
                continue
            covered |= answered
            for partition in set(partitions) - answered:  # moved since the group was described
                unavailable[str(partition)] = {"error": f"member at {url} does not serve it now",
                                               "owner": owner_json(owners[partition])}
            items += theirs
            more = more or page.get("next_cursor") is not None
        items.sort(key=lambda kpi: (kpi[0], kpi[1]))
        more = more or len(items) > limit
        items = items[:limit]
        return {"topic": source.topic, "items": [i for _, _, i in items],
                "next_cursor": answers.encode_cursor(items[-1][0], items[-1][1]) if more and items else None,
                "partitions": sorted(covered), "partial": bool(unavailable), "unavailable": unavailable,
                "served_by": self._served_by(source)}

    def _scan(self, source: TopicSource, start: bytes | None, end: bytes | None, limit: int,
              after: tuple[bytes, int] | None, encoding: str) -> dict[str, Any]:
        view = self._ready_view(source)
        if after is not None and (start is None or after[0] > start):
            start = after[0]
        if start is not None and end is not None and start >= end:
            start = end  # nothing left: an empty page
        page: list[Entry] = []
        # group mode: a rebalance may land during the scan; the page and its "partitions" both
        # keep to the partitions served before and after it, so a partition gained or lost meanwhile
        # is reported as not covered (another member's to answer) instead of covered and missing
        before = None if view.served is None else frozenset(view.served.partitions())

        def read() -> None:
            for entry in view.scan(start, end):
                if after is not None and (entry.key, entry.partition) <= after:
                    continue
                if before is not None and entry.partition not in before:
                    continue
                page.append(entry)
                if len(page) > limit:
                    return

        self._read(source, read)
        more = len(page) > limit
        page = page[:limit]
        last = page[-1] if page else None  # the cursor: every covered entry up to it is on the page
        served = None
        if view.served is not None and before is not None:
            served = sorted(before & frozenset(view.served.partitions()))
            page = [entry for entry in page if entry.partition in served]
        fmt = view.value_serde.format
        total = None if view.served is None else view.served.partition_count()
        # key_b64: the exact key bytes, which a merge across members orders and resumes on
        return {"topic": source.topic, "items": [{**self._entry_json(e, fmt, encoding),
                                                  "key_b64": base64.b64encode(e.key).decode("ascii")} for e in page],
                "next_cursor": answers.encode_cursor(last.key, last.partition) if more and last else None,
                # group mode: the scan covers the partitions served here only
                "partitions": served, "partial": served is not None and len(served) < (total or 0),
                "served_by": self._served_by(source)}


def _owners_asked_once(view: MaterializedView) -> MaterializedView:
    """``view`` (a copy) whose refusals ask the group which member holds a partition once in all,
    not once per refused key: a batch of 1,000 keys of other members' partitions is one
    DescribeConsumerGroups, and a coordinator that fails or times out is waited for once. The
    owners are as of the batch's first refusal, as one lookup per key would be a moment apart."""
    served = view.served
    if served is None or served.owners is None:
        return view
    ask = served.owners
    outcome: list[Mapping[int, Any] | Exception] = []

    def owners() -> Mapping[int, Any]:
        if not outcome:
            try:
                outcome.append(ask())
            except Exception as exc:  # noqa: BLE001 - raised again below, to every refusal of the batch
                outcome.append(exc)
        if isinstance(outcome[0], Exception):
            raise outcome[0]
        return outcome[0]

    once = copy.copy(view)  # the source's view may be shared: only this copy's `served` changes
    once.served = dataclasses.replace(served, owners=owners)
    return once


def _item_key(item: Mapping[str, Any]) -> bytes:
    """The exact key bytes of a scan item: its ``key_b64``, never re-parsed from the display text
    ``key`` (a UTF-8 key may itself start with ``base64:``) nor held to the request's key limit (a
    stored key may be longer than a client may ask for).

    Raises:
        KeyError, TypeError, ValueError: no ``key_b64``, or not base64.
    """
    return base64.b64decode(item["key_b64"], validate=True)


def _raw_query(query_string: bytes) -> dict[str, bytes]:
    """The query's parameters as bytes (``+`` is a space, ``%XX`` any byte; the last of a repeated
    name wins, as Starlette's ``query_params``): a key's bytes that are not UTF-8 (``%FF``) stay
    themselves, where ``query_params`` would decode them to U+FFFD, as the path's key does."""
    params: dict[str, bytes] = {}
    for pair in query_string.split(b"&"):
        if not pair:
            continue
        name, _, value = pair.partition(b"=")
        params[unquote_to_bytes(name.replace(b"+", b" ")).decode("latin-1")] = unquote_to_bytes(
            value.replace(b"+", b" "))
    return params


def _path_of(request: Request) -> str:
    """The request's path and query as the client sent them (still percent-encoded), to send on,
    without the prefix this app is mounted at (``root_path``: Starlette's ``Mount`` sets it and
    leaves ``raw_path`` whole); the owner's serving URL carries its own prefix (docs/serving.md)."""
    raw = request.scope.get("raw_path") or request.url.path.encode()
    root = (request.scope.get("root_path") or "").rstrip("/")
    for prefix in {quote(root).encode("ascii"), root.encode("utf-8")} if root else ():
        if raw.startswith(prefix + b"/"):
            raw = raw[len(prefix):]
            break
    query = request.scope.get("query_string") or b""
    return raw.decode("latin-1") + ("?" + query.decode("latin-1") if query else "")


async def _bounded_body(request: Request) -> bytes:
    """The request body, refused (413) past :data:`~materializer.serve.answers.MAX_BODY_BYTES`
    before it is all read."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > answers.MAX_BODY_BYTES:
        raise BadRequest(f"the body has {declared} bytes, more than the {answers.MAX_BODY_BYTES} allowed", 413)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > answers.MAX_BODY_BYTES:
            raise BadRequest(f"the body has more than the {answers.MAX_BODY_BYTES} bytes allowed", 413)
        chunks.append(chunk)
    return b"".join(chunks)
