"""The query server's status page, ``GET /``: an HTML page a person reads in a browser (issue 39).

It shows every topic served (:class:`~materializer.serve.status.TopicStatus`: partitions with
their state, owner, high watermark, next offset and lag, local log sizes; group id, member id and
generation; the store's size on disk; the cleaner's rounds; readiness and its reasons) and a key
lookup box: a plain HTML ``GET`` form (``?topic=T&key=K&key_encoding=utf8|base64``) whose answer
the server renders into the page. The lookup is ``GET /v1/topics/{topic}/keys/{key}`` itself
(:meth:`materializer.serve.app._Handlers.lookup`): the same read path, the same forwarding to the
member that holds the key (one hop), the value decoded as the JSON API decodes it; a 404 or 503 is
shown as its error message.

Server-rendered with Jinja2 (autoescaped: a key, value or topic holding markup shows as text) from
``templates/status.html``, shipped as package data. No script and no external resource: the page's
CSS is inline and its ``Content-Security-Policy`` refuses anything but that CSS and a form posted
to itself, so the page loads nothing from anywhere (no CDN). The bearer token
(``--serve-token-file``) protects it as every other endpoint (it shows values): docs/serving.md
says how a browser passes it.
"""

from __future__ import annotations

import datetime
import functools
import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import jinja2
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response
from starlette.templating import Jinja2Templates

from materializer.serve import answers
from materializer.serve.answers import BadRequest
from materializer.serve.sources import TopicSource
from materializer.serve.status import TopicStatus

__all__ = ["StatusPage"]

logger = logging.getLogger(__name__)

#: What the page may load: its inline CSS, and its form sent to itself; nothing else, from nowhere.
CONTENT_SECURITY_POLICY = ("default-src 'none'; style-src 'unsafe-inline'; img-src data:; form-action 'self'; "
                           "base-uri 'none'; frame-ancestors 'none'")
_HEADERS = {"Content-Security-Policy": CONTENT_SECURITY_POLICY, "X-Content-Type-Options": "nosniff",
            "Referrer-Policy": "no-referrer", "Cache-Control": "no-store"}  # it shows values

#: One key lookup: (topic, key bytes) -> (HTTP status, JSON body) of ``GET /v1/topics/{topic}/keys/{key}``.
Lookup = Callable[[str, bytes], tuple[int, dict[str, Any]]]

_HEADLINES = {400: "a bad key", 404: "no live value", 413: "the key is too long",
              503: "cannot answer now (ask again)", 502: "the member that holds it refused",
              500: "the server failed to answer"}


@functools.cache
def _templates() -> Jinja2Templates:
    """The page's template: autoescaped (markup in any value shows as text), strict (a name the
    template misspells is an error, not an empty string)."""
    env = jinja2.Environment(loader=jinja2.PackageLoader("materializer.serve", "templates"),
                             autoescape=True, undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    env.filters["size"] = _size
    return Jinja2Templates(env=env)


@dataclass(frozen=True)
class _Topic:
    name: str
    status: TopicStatus | None
    error: str | None


class StatusPage:
    """The ``GET /`` endpoint (module docstring) of an app over ``sources``: :meth:`page`.

    Args:
        sources: topic -> its :class:`~materializer.serve.sources.TopicSource`.
        lookup: reads one key as the JSON API does (forwarding included).
        served_by: this server's ``host:port`` (None: not named).
    """

    def __init__(self, sources: Mapping[str, TopicSource], lookup: Lookup, served_by: str | None) -> None:
        self.sources, self.lookup, self.served_by = sources, lookup, served_by

    async def page(self, request: Request) -> Response:
        """The page: every topic's status, and the lookup the query asks for (if any)."""
        params = request.query_params
        lookup = None
        if params.get("key"):
            topic = params.get("topic") or next(iter(sorted(self.sources)), "")
            lookup = await run_in_threadpool(self._lookup, topic, params["key"], params.get("key_encoding", "utf8"))
        topics = await run_in_threadpool(self._topics)
        context = {"topics": topics, "lookup": lookup, "served_by": self.served_by,
                   "now": _iso_ms(int(datetime.datetime.now(datetime.UTC).timestamp() * 1000))}
        return _templates().TemplateResponse(request, "status.html", context, headers=_HEADERS)

    def _topics(self) -> list[_Topic]:
        topics = []
        for name in sorted(self.sources):
            source = self.sources[name]
            if source.status is None:
                topics.append(_Topic(name, None, "this source reports no status (a TopicSource without `status`)"))
                continue
            try:
                topics.append(_Topic(name, source.status(), None))
            except Exception:
                logger.exception("the status page failed to read the status of topic %r", name)
                topics.append(_Topic(name, None, "its status could not be read (logged by the server)"))
        return topics

    def _lookup(self, topic: str, text: str, encoding: str) -> dict[str, Any]:
        """What the page shows of ``text``'s lookup in ``topic`` (given as ``encoding``)."""
        shown: dict[str, Any] = {"topic": topic, "key": text, "encoding": encoding}
        try:
            status, body = self.lookup(topic, answers.key_bytes(text, encoding))
        except BadRequest as bad:
            status, body = bad.status, {"error": str(bad)}
        except Exception:
            logger.exception("the status page failed to look up a key of topic %r", topic)
            status, body = 500, {"error": "internal error (logged by the server)"}
        shown["status"] = status
        if status != 200:
            return {**shown, "headline": _HEADLINES.get(status, f"HTTP {status}"), "error": body.get("error", "")}
        served_by = body.get("served_by") or {}
        timestamp = body.get("timestamp")
        return {**shown, "value": json.dumps(body.get("value"), ensure_ascii=False, indent=2),
                "value_format": body.get("value_format"), "partition": body.get("partition"),
                "offset": body.get("offset"),
                "timestamp": "none (NO_TIMESTAMP)" if timestamp is None else f"{timestamp} ({_iso_ms(timestamp)})",
                "served_by": " · ".join(f"{name} {served_by[name]}" for name in ("address", "member_id", "group_id")
                                        if served_by.get(name)) or "this server"}


def _iso_ms(ms: int) -> str:
    """ms since the epoch as ISO 8601 UTC with milliseconds."""
    try:
        moment = datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC)
    except (OverflowError, OSError, ValueError):
        return "out of range"
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _size(value: int | None) -> str:
    """Bytes for a person: ``12.3 MiB (12,897,484 bytes)``; None: ``unknown``."""
    if value is None:
        return "unknown"
    if value < 1024:
        return f"{value} bytes"
    scaled, units = value / 1024, ["KiB", "MiB", "GiB", "TiB"]
    while scaled >= 1024 and len(units) > 1:
        scaled, units = scaled / 1024, units[1:]
    return f"{scaled:.1f} {units[0]} ({value:,} bytes)"
