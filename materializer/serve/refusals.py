"""What a 503 of the query server tells its client, and what it leaves to the server's log.

The errors behind a 503 carry the server's internals: a store error names the data dir and the
RocksDB files, a failed ingest its exception text, a Schema Registry error the registry's URL (with
any credentials in it), a failed forward the CA file's path. A client gets a stable sentence and a
``reason`` kind it can act on; the detail goes to the run's log (WARNING, logger
``materializer.serve``), where an operator reads it.

Kinds (the ``reason`` field of a 503 body):

===================  ==========================================================================
``stale``            the store is older than its staleness bound (``max_staleness_ms``)
``incomplete``       the topic's data dir is being built or replaced, or was left incomplete
``schema_registry``  the Schema Registry did not answer a value's schema
``store``            the RocksDB store failed to read
``ingest_failed``    (a readiness reason) the run's ingest failed
``tls``              forwarding: the owner's certificate is not verified by this member's CA
                     file, the handshake failed, or the owner's URL is plain ``http://`` while
                     this member runs TLS (never sent in clear)
``timeout``          forwarding: the owner did not connect or answer in time
``refused``          forwarding: the owner's port refused the connection
``reset``            forwarding: the connection was reset or closed before an answer
``unresolved``       forwarding: the owner's host name does not resolve
``bad_answer``       forwarding: the owner answered something that is not JSON
``unreachable``      forwarding: any other failure to reach the owner
===================  ==========================================================================
"""

from __future__ import annotations

import json
import logging
import socket
import ssl
import urllib.error
from collections.abc import Iterable, Iterator

from materializer.adapters.errors import SchemaRegistryError
from materializer.datadir.lease import StaleStoreError
from materializer.storage.errors import IncompleteDataDirError

__all__ = ["OWNER_FAILURES", "STORE_FAILURES", "forward_failure", "public_reasons", "store_failure"]

logger = logging.getLogger("materializer.serve")

#: Kind -> the sentence a client reads, for a read the store could not answer.
STORE_FAILURES = {
    "stale": "the store is older than its staleness bound allows (or its age is not known)",
    "incomplete": "the topic's data dir is being built or replaced, or was left incomplete",
    "schema_registry": "the Schema Registry did not answer for a value's schema",
    "store": "the store failed to read",
}

#: Kind -> what went wrong reaching the owner of a partition (forwarding).
OWNER_FAILURES = {
    "tls": "TLS failure (its certificate is not verified by this member's --serve-ca-file, the handshake "
           "failed, or its URL is not https:// while this member runs TLS)",
    "timeout": "no answer in time",
    "refused": "connection refused",
    "reset": "the connection was closed before an answer",
    "unresolved": "its host name does not resolve",
    "bad_answer": "its answer is not JSON",
    "unreachable": "it cannot be reached",
}


def store_failure(exc: Exception, topic: str) -> tuple[str, str]:
    """``(kind, sentence)`` for a read of ``topic`` refused with ``exc`` (a
    :class:`StaleStoreError`, :class:`IncompleteDataDirError`, :class:`SchemaRegistryError` or
    :class:`StoreError`); logs ``exc`` in full."""
    kind = ("stale" if isinstance(exc, StaleStoreError) else "incomplete" if isinstance(exc, IncompleteDataDirError)
            else "schema_registry" if isinstance(exc, SchemaRegistryError) else "store")
    logger.warning("a read of topic %r is answered 503 (%s): %s: %s", topic, kind, type(exc).__name__, exc)
    return kind, f"topic {topic!r} cannot be read now: {STORE_FAILURES[kind]} (the detail is in the server's log)"


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc``, its causes and contexts, and a ``URLError``'s ``reason``, each once."""
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo:
        at = todo.pop()
        if at is None or id(at) in seen:
            continue
        seen.add(id(at))
        yield at
        reason = at.reason if isinstance(at, urllib.error.URLError) else None
        todo += [at.__cause__, at.__context__, reason if isinstance(reason, BaseException) else None]


def forward_failure(exc: BaseException, url: str) -> tuple[str, str]:
    """``(kind, what went wrong)`` for a forward to ``url`` that got no answer (``exc``, e.g. a
    :class:`~materializer.serve.forwarding.OwnerUnreachable` raised from the client's error); logs
    ``exc`` in full. A ``kind`` attribute on any exception of the chain wins; then the first of
    TLS, timeout, refused, reset, unresolved, not JSON found in the chain."""
    kind = next((k for e in _chain(exc) if isinstance(k := getattr(e, "kind", None), str) and k in OWNER_FAILURES),
                None)
    if kind is None:
        chain = list(_chain(exc))
        for name, types in (("tls", (ssl.SSLError, ssl.CertificateError)), ("timeout", (TimeoutError,)),
                            ("refused", (ConnectionRefusedError,)),
                            ("reset", (ConnectionError, EOFError)), ("unresolved", (socket.gaierror,)),
                            ("bad_answer", (json.JSONDecodeError, UnicodeDecodeError))):
            if any(isinstance(e, types) for e in chain):
                kind = name
                break
        else:
            kind = "unreachable"
    logger.warning("a request forwarded to %s got no answer (%s): %s: %s", url, kind, type(exc).__name__, exc)
    return kind, OWNER_FAILURES[kind]


def public_reasons(reasons: Iterable[str]) -> list[str]:
    """Readiness reasons (:func:`materializer.health.readiness`) as a client reads them: a failed
    ingest's exception text (paths, broker addresses) is replaced by its kind; the others are
    about the cluster and the group, and stay."""
    public = []
    for reason in reasons:
        if reason.startswith("ingest failed"):
            logger.warning("the query server answers 503: %s", reason)
            kind = reason.split(":", 2)[1].strip() if reason.count(":") >= 2 else "error"
            reason = f"ingest failed ({kind}; the detail is in the server's log)"
        public.append(reason)
    return public
