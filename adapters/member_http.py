"""The HTTP client of the group members' query servers (issue 39): one ``urllib`` opener that
sends a request to exactly the URL given.

Python's default opener follows redirects, carrying the request's headers (the members' bearer
token in ``Authorization``) to wherever a 3xx points, and routes through ``http_proxy`` /
``https_proxy`` from the environment. A member's URL comes from the group (its ``client.id``), so
neither is wanted: :func:`member_opener` honours no proxy and follows no redirect (a 3xx comes back
as :class:`urllib.error.HTTPError` with that status, for the caller to refuse).
"""

from __future__ import annotations

import ssl
import urllib.request
from email.message import Message
from typing import IO, Any

__all__ = ["member_opener"]


class _RefuseRedirects(urllib.request.HTTPRedirectHandler):
    """Follows no redirect: the 3xx goes on to ``HTTPDefaultErrorHandler``, which raises it."""

    def redirect_request(self, req: urllib.request.Request, fp: IO[bytes], code: int, msg: str,
                         headers: Message, newurl: str) -> Any:
        return None


def member_opener(context: ssl.SSLContext | None) -> urllib.request.OpenerDirector:
    """An opener that uses no proxy, follows no redirect and verifies HTTPS with ``context``
    (None: the system's CAs).

    Its ``open(request, timeout=s)`` raises :class:`urllib.error.HTTPError` for any status from 300
    (a redirect is not followed) and :class:`OSError` (``URLError``, timeouts, TLS failures) when
    no answer comes.
    """
    return urllib.request.build_opener(urllib.request.ProxyHandler({}), _RefuseRedirects(),
                                       urllib.request.HTTPSHandler(context=context))
