"""The HTTP clients of the group members' query servers (issue 39): each sends a request to exactly
the URL given.

Python's default opener follows redirects, carrying the request's headers (the members' bearer
token in ``Authorization``) to wherever a 3xx points, and routes through ``http_proxy`` /
``https_proxy`` from the environment. A member's URL comes from the group (its ``client.id``), so
neither is wanted: :func:`member_opener` (``urllib``, a connection per request: the CLI's one-off
``get``) honours no proxy and follows no redirect (a 3xx comes back as
:class:`urllib.error.HTTPError` with that status, for the caller to refuse). :func:`member_pool`
(urllib3, kept-alive connections: a member forwarding reads to another) does the same: urllib3's
``PoolManager`` reads no proxy from the environment, and :data:`NO_REDIRECT` hands a 3xx back as
the answer; a failed request is not retried.
"""

from __future__ import annotations

import ssl
import urllib.request
from email.message import Message
from typing import IO, Any

__all__ = ["NO_REDIRECT", "member_opener", "member_pool"]

#: ``PoolManager.request`` keywords of every request to a member: no redirect followed (the 3xx is the
#: answer) and no retry (urllib3's ``Retry`` would also resend a request a member reset).
NO_REDIRECT: dict[str, Any] = {"redirect": False, "retries": False}


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


def member_pool(context: ssl.SSLContext | None, *, timeout_s: float, connections: int = 16) -> Any:
    """A urllib3 ``PoolManager`` that keeps up to ``connections`` idle connections per member, uses no
    proxy, verifies HTTPS with ``context`` (None: the system's CAs, urllib3's default) and waits
    ``timeout_s`` seconds to connect and as long for each read. Send each request with
    :data:`NO_REDIRECT`. A request beyond ``connections`` at once opens a connection that is closed
    after it (``block=False``): never a wait for the pool.

    Raises:
        ImportError: urllib3 is not installed (``pip install 'kafka-materializer[serve]'``).
    """
    import urllib3

    return urllib3.PoolManager(num_pools=64, maxsize=connections, block=False, ssl_context=context,
                               timeout=urllib3.Timeout(connect=timeout_s, read=timeout_s))
