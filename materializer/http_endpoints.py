"""The HTTP port of a running Materializer: Prometheus metrics and Kubernetes health probes.

``materializer run --metrics-port PORT`` (or :class:`EndpointServer` in Python) serves, on one
port, from a daemon thread (stdlib ``http.server.ThreadingHTTPServer``; each request is answered
from a snapshot of the materializer's state and never waits for the run loop)::

    GET /health/live    200 / 503  {"ok": ..., "reasons": [...], "loop_idle_s": ..., ...}
    GET /health/ready   200 / 503  {"ok": ..., "reasons": [...], "caught_up": ..., "lag": {...}, ...}
    GET /metrics        200 text exposition (Prometheus or OpenMetrics, as the Accept header asks);
                        503 text naming ``pip install 'kafka-materializer[metrics]'`` when
                        prometheus_client is not installed
    anything else       404

``HEAD`` is answered like ``GET`` without a body. What live and ready mean:
:mod:`materializer.health`.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING

from materializer.health import ProbeResult, combined, liveness, readiness
from materializer.metrics import INSTALL_HINT

if TYPE_CHECKING:
    from materializer.materializer import Materializer
    from materializer.metrics import MaterializerMetrics

__all__ = ["HEALTH_LIVE_PATH", "HEALTH_READY_PATH", "METRICS_PATH", "EndpointServer"]

logger = logging.getLogger(__name__)

HEALTH_LIVE_PATH = "/health/live"
HEALTH_READY_PATH = "/health/ready"
METRICS_PATH = "/metrics"

_JSON = "application/json"
_TEXT = "text/plain; charset=utf-8"


class EndpointServer:
    """Serves ``/health/live``, ``/health/ready`` and ``/metrics`` of ``materializer`` (module docstring).

    Args:
        materializer: the Materializer whose health is served, or several (the topics of one
            process, :class:`~materializer.topic_set.TopicSet`): each probe then holds when every
            topic's does, its reasons name their topic and its body is ``{"ok", "reasons",
            "topics": {topic: {...}}}`` (:func:`~materializer.health.combined`).
        metrics: its :class:`MaterializerMetrics` (several topics: the registry they share), or
            None when prometheus_client is not installed (``/metrics`` then answers 503 saying
            what to install).

    Raises:
        ValueError: an empty sequence of materializers.

    Use as a context manager or call :meth:`serve` and :meth:`close`. Thread-safe.
    """

    def __init__(self, materializer: "Materializer | Sequence[Materializer]",
                 metrics: "MaterializerMetrics | None" = None) -> None:
        self.materializers = (materializer,) if not isinstance(materializer, Sequence) else tuple(materializer)
        if not self.materializers:
            raise ValueError("no materializer to serve the health of")
        self.materializer = self.materializers[0]
        self.metrics = metrics
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    def serve(self, port: int, addr: str = "127.0.0.1") -> int:
        """Listen on ``addr:port`` (``port`` 0 picks a free one) from a daemon thread.

        Returns:
            the port listened on.

        Raises:
            OSError: the address cannot be bound (port in use, no permission); the message names it.
            RuntimeError: already serving.
        """
        if self._server is not None:
            raise RuntimeError(f"the endpoints of {self._topics()} are already served")
        handler = type("_BoundHandler", (_Handler,), {"endpoints": self})
        try:
            server = ThreadingHTTPServer((addr, port), handler)
        except OSError as exc:
            raise OSError(exc.errno, f"cannot serve metrics and health on {addr}:{port}: {exc.strerror or exc}") \
                from exc
        server.daemon_threads = True
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, name=f"materializer-http-{port}", daemon=True)
        self._thread.start()
        bound = server.server_address[1]
        logger.info("serving %s of %s on http://%s:%d (%s, %s, %s)",
                    "Prometheus metrics and health probes" if self.metrics is not None else "health probes",
                    self._topics(), addr, bound, METRICS_PATH, HEALTH_LIVE_PATH, HEALTH_READY_PATH)
        return bound

    def _topics(self) -> str:
        return ", ".join(m.topic for m in self.materializers)

    def live(self) -> ProbeResult:
        """What ``/health/live`` answers now."""
        if len(self.materializers) == 1:
            return liveness(self.materializer.health)
        return combined({m.topic: liveness(m.health) for m in self.materializers})

    def ready(self) -> ProbeResult:
        """What ``/health/ready`` answers now."""
        if len(self.materializers) == 1:
            return readiness(self.materializer.health, self.materializer.stats.lag())
        return combined({m.topic: readiness(m.health, m.stats.lag()) for m in self.materializers})

    def close(self) -> None:
        """Stop serving and release the port. Idempotent."""
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout=5)

    def __enter__(self) -> "EndpointServer":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class _Handler(BaseHTTPRequestHandler):
    """Routes one request to the probes or the metrics of :attr:`endpoints`."""

    endpoints: EndpointServer
    server_version = "kafka-materializer"

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        self._answer(body=True)

    def do_HEAD(self) -> None:  # noqa: N802
        self._answer(body=False)

    def _answer(self, body: bool) -> None:
        path = self.path.split("?", 1)[0]
        if path == HEALTH_LIVE_PATH:
            self._probe(self.endpoints.live(), body)
        elif path == HEALTH_READY_PATH:
            self._probe(self.endpoints.ready(), body)
        elif path == METRICS_PATH:
            self._metrics(body)
        else:
            self._send(404, _TEXT, f"no such endpoint {path}; try {HEALTH_LIVE_PATH}, {HEALTH_READY_PATH} or "
                                   f"{METRICS_PATH}\n".encode(), body)

    def _probe(self, result: ProbeResult, body: bool) -> None:
        self._send(result.status_code, _JSON, result.to_json() + b"\n", body)

    def _metrics(self, body: bool) -> None:
        metrics = self.endpoints.metrics
        if metrics is None:
            self._send(503, _TEXT, f"Prometheus metrics need the prometheus_client package, which is not "
                                   f"installed: {INSTALL_HINT}\n".encode(), body)
            return
        from prometheus_client.exposition import choose_encoder

        encoder, content_type = choose_encoder(self.headers.get("Accept", ""))
        self._send(200, content_type, encoder(metrics.registry), body)

    def _send(self, status: int, content_type: str, payload: bytes, body: bool) -> None:
        try:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(payload)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            if body:
                self.wfile.write(payload)
        except (BrokenPipeError, ConnectionResetError) as exc:
            # the prober gave up first (its timeout while this process was paused or busy): nothing
            # to answer, and no traceback on stderr for it
            logger.debug("%s left before the answer to %s: %s", self.address_string(), self.path, exc)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - http.server's signature
        logger.debug("%s - %s", self.address_string(), format % args)
