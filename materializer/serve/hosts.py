"""The ``Host`` header check of the query server: a defence against DNS rebinding (issue 39).

A page in a browser can make its own name (``evil.example``) resolve to ``127.0.0.1`` after it
loads, then read ``http://evil.example:8439/...`` as same-origin: the browser connects to the query
server on this machine with ``Host: evil.example``. Refusing every ``Host`` the server is not
known by stops that read (the same rule as Starlette's ``TrustedHostMiddleware`` and Django's
``ALLOWED_HOSTS``; the answer here is one JSON error, as every other answer of the app).

The names come from :func:`materializer.serve.addresses.allowed_host_names`: the bound and
advertised hosts, ``localhost``, ``127.0.0.1``, ``::1`` and ``run --serve-allowed-hosts``. A
forwarded request between members names the owner's advertised host, so it passes.
"""

from __future__ import annotations

from collections.abc import Iterable

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

__all__ = ["AllowedHosts", "host_name"]


def host_name(header: str) -> str:
    """The host of a ``Host`` header value (RFC 9110 §7.2: ``uri-host [":" port]``), lower-case,
    an IPv6 address without its brackets."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[1:].split("]", 1)[0]
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


class AllowedHosts:
    """An ASGI middleware that answers 400 ``{"error": ...}`` to an HTTP request whose ``Host``
    header names none of ``names``, or that has no ``Host`` header or several (RFC 9112 §3.2).

    Args:
        app: the app to protect.
        names: host names or addresses (any case; IPv6 with or without brackets); ``*.example.com``
            matches every name under ``example.com``; ``*`` matches any ``Host`` (no check).

    Raises:
        ValueError: ``names`` is empty.
    """

    def __init__(self, app: ASGIApp, names: Iterable[str]) -> None:
        self.app = app
        allowed = [n.strip().lower().strip("[]") for n in names if n.strip()]
        if not allowed:
            raise ValueError("no host name is allowed: give at least one (or '*' for any)")
        self.any = "*" in allowed
        self.exact = frozenset(n for n in allowed if not n.startswith("*."))
        self.suffixes = tuple(n[1:] for n in allowed if n.startswith("*."))  # ".example.com"

    def allows(self, header: str) -> bool:
        """Whether a request with ``Host: header`` is answered."""
        if self.any:
            return True
        host = host_name(header)
        return bool(host) and (host in self.exact or host.endswith(self.suffixes))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            given = [v.decode("latin-1") for k, v in scope["headers"] if k == b"host"]
            header = given[0] if given else ""
            if len(given) != 1 or not self.allows(header):  # none, or several (RFC 9112 §3.2: 400)
                shown = header if len(header) <= 100 else header[:100] + "..."
                response = JSONResponse({"error": f"the Host header {shown!r} is not a name this server answers to "
                                                  "(run --serve-allowed-hosts adds names)"}, 400)
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)
