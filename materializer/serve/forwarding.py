"""Forwarding a read to the member that serves its partition (issue 39: any member answers any key).

:class:`Forwarding` is the :class:`~materializer.serve.routing.Router` of a consumer-group member's
query server: a key of a partition another member holds goes to that member's serving URL (carried
in its ``client.id``, :mod:`materializer.adapters.partition_owner`) in one hop, marked with
:data:`~materializer.serve.routing.FORWARDED_HEADER` so the owner answers it itself or 503, never
forwards it again (ksqlDB's ``HARouting`` "skip forward" flag does the same). The owner's answer
(200, 404 or its own 503) is relayed as it is, so ``served_by`` names the owner. An owner that does
not answer within :data:`FORWARD_TIMEOUT_S` (dead and not yet timed out of the group, or
unreachable) is 503 with ``Retry-After`` naming it: never an absent or stale answer.

The client is urllib3 (the app runs it in its worker threads) through
:func:`~materializer.adapters.member_http.member_pool`: connections to each owner are kept alive and
reused (a forward costs no TCP or TLS handshake once warm), no proxy from the environment, no
redirect followed (a 3xx is 502 naming the owner, never the token sent elsewhere), with the bearer
token the members share and TLS verified against a CA file (``run --serve-ca-file``, default the
member's own ``--serve-cert``) or the system's CAs. A member with a CA file runs TLS, so it never
sends the token to an owner's plain ``http://`` URL (503 naming it).
"""

from __future__ import annotations

import json
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import urllib3

from materializer.adapters.errors import KeyPartitionUndecidedError, PartitionNotAssignedError
from materializer.adapters.member_http import NO_REDIRECT, member_pool
from materializer.serve.routing import FORWARDED_HEADER, Forward, LocalOnly, Unavailable

__all__ = ["FORWARD_TIMEOUT_S", "Forwarded", "Forwarding", "OwnerUnreachable"]

#: Seconds a forwarded request may take to connect and to answer (each).
FORWARD_TIMEOUT_S = 5.0

#: The largest answer read from an owner, bytes (a page of 1,000 entries of large values fits).
_MAX_ANSWER_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True)
class Forwarded:
    """An owner's answer: HTTP status, JSON body, ``Retry-After`` (None: not given)."""

    status: int
    body: dict[str, Any]
    retry_after: str | None = None


class OwnerUnreachable(Exception):
    """The owner did not answer (connection refused or reset, timeout, TLS failure, not JSON).

    Attributes:
        kind: a kind of :data:`materializer.serve.refusals.OWNER_FAILURES` when the failure is not
            an exception of its own (None: found from the chain of causes).
    """

    def __init__(self, message: str, kind: str | None = None) -> None:
        super().__init__(message)
        self.kind = kind


class Forwarding(LocalOnly):
    """A :class:`~materializer.serve.routing.Router` that forwards a key to the member that holds its
    partition (module docstring).

    Args:
        token: the bearer token sent to the owner (the members share one; None: none).
        cafile: PEM CA certificates that verify an owner's HTTPS (None: the system's CAs).
        timeout_s: connect and read timeout of a forwarded request, seconds.
    """

    def __init__(self, *, token: str | None = None, cafile: Path | str | None = None,
                 timeout_s: float = FORWARD_TIMEOUT_S) -> None:
        self.token, self.timeout_s, self.cafile = token, timeout_s, cafile
        self._pool = member_pool(ssl.create_default_context(cafile=None if cafile is None else str(cafile)),
                                 timeout_s=timeout_s)

    def who_answers(self, topic: str, refusal: PartitionNotAssignedError) -> Unavailable | Forward:
        """:class:`Forward` to the owner the refusal names when it is another member with a serving
        URL; else :class:`Unavailable` (catching up here, no owner in a rebalance, an owner that
        serves no queries, a key whose partition is undecided)."""
        owner = refusal.owner
        if (isinstance(refusal, KeyPartitionUndecidedError) or refusal.catching_up or owner is None
                or owner.serving_url is None):
            return super().who_answers(topic, refusal)
        return Forward(refusal.partition, owner, owner.serving_url)

    def send(self, url: str, method: str, path: str, body: bytes | None = None) -> Forwarded:
        """``method path`` (path with its query, as the client sent it) on the query server at
        ``url``, marked forwarded, with the token.

        Raises:
            OwnerUnreachable: no HTTP answer with a JSON body within the timeout, or ``url`` is plain
                ``http://`` while a CA file is configured (this member runs TLS).
        """
        if self.cafile is not None and not url.startswith("https://"):
            raise OwnerUnreachable(f"this member verifies owners' TLS with {self.cafile}, so it does not send a "
                                   f"request (and the token) to the plain URL {url}", kind="tls")
        headers = {FORWARDED_HEADER: "1", "Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = "application/json"
        if self.token is not None:
            headers["Authorization"] = f"Bearer {self.token}"
        try:
            answer = self._pool.request(method, url + path, body=body, headers=headers, preload_content=False,
                                        **NO_REDIRECT)
            try:
                raw = answer.read(_MAX_ANSWER_BYTES + 1)
            except BaseException:
                answer.close()  # a connection with an answer half read is never reused
                raise
        except (urllib3.exceptions.HTTPError, OSError, ValueError) as exc:  # refused, reset, timeouts, TLS errors
            raise OwnerUnreachable(f"{type(exc).__name__}: {exc}") from exc
        if len(raw) > _MAX_ANSWER_BYTES:
            answer.close()
            raise OwnerUnreachable(f"the answer is larger than {_MAX_ANSWER_BYTES} bytes")
        answer.release_conn()  # read to its end: the connection goes back to the pool
        retry_after = answer.headers.get("Retry-After")
        if 200 <= answer.status < 300:
            return Forwarded(answer.status, _json(raw), retry_after)
        try:
            answered = _json(raw)
        except OwnerUnreachable:
            if not 300 <= answer.status < 500:
                raise
            # a redirect (not followed) or a 4xx that is not this app's JSON (a proxy's or a parent
            # app's "Not Found"): about the URL, which the caller reports as such (502)
            answered = {"error": f"{answer.status} {answer.reason}, not JSON: {raw[:200]!r}"}
        if 300 <= answer.status < 400:
            answered = {"error": f"a redirect to {answer.headers.get('Location')!r}, not followed"}
        return Forwarded(answer.status, answered, retry_after)


def _json(raw: bytes) -> dict[str, Any]:
    try:
        parsed = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise OwnerUnreachable(f"the answer is not JSON ({exc})") from exc
    if not isinstance(parsed, dict):
        raise OwnerUnreachable("the answer is not a JSON object")
    return parsed
