"""The query server's lifecycle: uvicorn serving an ASGI app from a daemon thread of the run's
process, on a socket bound before it starts (so a port in use is an error at once, and port 0
gets a free port that :attr:`QueryServer.port` names)."""

from __future__ import annotations

import asyncio
import importlib.util
import logging
import socket
import threading
import time
from pathlib import Path
from typing import Any, Literal

import uvicorn

__all__ = ["QueryServer", "fast_paths", "parse_address"]

logger = logging.getLogger(__name__)

_START_TIMEOUT_S = 10.0
_STOP_TIMEOUT_S = 10.0


def fast_paths() -> tuple[Literal["httptools", "h11"], Literal["uvloop", "asyncio"]]:
    """``(http, loop)``: uvicorn's HTTP parser and event loop this process serves with: ``httptools``
    (llhttp, in C) and ``uvloop`` (libuv) when installed (the ``serve`` extra installs both where
    wheels exist), else uvicorn's pure-Python ``h11`` and asyncio's own loop. Measured in
    benchmarks/RESULTS.md (2026-11-29, "CPU per request"): together they cut a local get's CPU by
    about a quarter."""
    return ("httptools" if importlib.util.find_spec("httptools") is not None else "h11",
            "uvloop" if importlib.util.find_spec("uvloop") is not None else "asyncio")


def _new_event_loop(kind: str) -> asyncio.AbstractEventLoop:
    """A new event loop of ``kind`` (:func:`fast_paths`) for the server's thread only: never
    ``asyncio.set_event_loop_policy`` (what uvicorn's ``loop="uvloop"`` does), which would change
    the loop of every other asyncio user in the host process."""
    if kind == "uvloop":
        import uvloop

        return uvloop.new_event_loop()
    return asyncio.new_event_loop()


def parse_address(text: str, default_host: str = "127.0.0.1") -> tuple[str, int]:
    """``HOST:PORT``, ``[IPv6]:PORT`` or ``PORT`` (on ``default_host``) as ``(host, port)``.

    Raises:
        ValueError: no port, or a port outside 0..65535.
    """
    host, sep, port_text = text.rpartition(":")
    if not sep:
        host, port_text = default_host, text
    host = host.strip("[]") or default_host
    if not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        raise ValueError(f"{text!r} is not HOST:PORT (a port from 0 to 65535)")
    return host, int(port_text)


def _listening_socket(host: str, port: int, family: socket.AddressFamily) -> socket.socket:
    """A TCP socket listening on ``host:port``, as :func:`socket.create_server` makes it but created
    with ``proto=IPPROTO_TCP``: asyncio sets ``TCP_NODELAY`` only on connections whose socket names
    that protocol (``asyncio.base_events._set_nodelay``), and ``create_server``'s ``proto`` is 0.
    Without it Nagle's algorithm holds an answer's body until the client ACKs its headers, which a
    kept-alive client delays (delayed ACK, 40 ms on Linux): every request after a connection's first
    took over 40 ms.

    Raises:
        OSError: the address cannot be bound.
    """
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as create_server on POSIX
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # and on the listener: Linux's accept copies it
        sock.bind((host, port))
        sock.listen(2048)
    except BaseException:
        sock.close()
        raise
    return sock


class QueryServer:
    """Serves ``app`` on ``host:port`` with uvicorn from a daemon thread until :meth:`close`.

    Args:
        app: an ASGI app (:func:`materializer.serve.create_app`).
        host: the address to listen on (127.0.0.1 by default: this machine only).
        port: the TCP port; 0 picks a free one (:attr:`port`).
        certfile, keyfile: PEM certificate chain and private key: serve HTTPS (uvicorn's
            ``ssl_certfile``/``ssl_keyfile``); both or neither.

    Raises (:meth:`start`):
        OSError: the address cannot be bound (in use, not local), or the certificate and key cannot
            be read, do not load or do not match (an ``ssl.SSLError`` among them).
        ValueError: only one of certfile and keyfile.
        RuntimeError: uvicorn did not start within 10 s.

    Use as a context manager, or :meth:`start` and :meth:`close`.
    """

    def __init__(self, app: Any, host: str = "127.0.0.1", port: int = 0, *, certfile: Path | str | None = None,
                 keyfile: Path | str | None = None) -> None:
        if (certfile is None) != (keyfile is None):
            raise ValueError("TLS needs both a certificate file and a key file")
        self.app, self.host, self.port = app, host, port
        self.tls = certfile is not None
        self._certfile = None if certfile is None else str(certfile)
        self._keyfile = None if keyfile is None else str(keyfile)
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self._socket: socket.socket | None = None
        self._error: BaseException | None = None
        self._loop_kind = "asyncio"

    @property
    def url(self) -> str:
        """``http(s)://host:port`` (IPv6 hosts in brackets)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{'https' if self.tls else 'http'}://{host}:{self.port}"

    def bind(self) -> int:
        """Bind the listening socket now (idempotent) and return the port (port 0: the one picked),
        e.g. to name it in the app before :meth:`start`.

        Raises:
            OSError: the address cannot be bound.
        """
        if self._socket is None:
            family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
            try:
                self._socket = _listening_socket(self.host, self.port, family)
            except OSError as exc:
                raise OSError(exc.errno, f"cannot serve queries on {self.host}:{self.port}: "
                                         f"{exc.strerror or exc}") from exc
            self.port = self._socket.getsockname()[1]
        return self.port

    def start(self) -> QueryServer:
        """Bind, load TLS and start serving; returns once uvicorn accepts connections (errors: class docstring)."""
        http, self._loop_kind = fast_paths()
        config = uvicorn.Config(self.app, lifespan="off", access_log=False, log_config=None,  # the host's logging
                                log_level="warning", ssl_certfile=self._certfile, ssl_keyfile=self._keyfile,
                                http=http, loop="none")  # the loop: made in _serve, for this thread alone
        try:
            config.load()  # TLS files and the app, here: their errors reach the caller
        except OSError as exc:  # ssl.SSLError too
            raise OSError(exc.errno, f"cannot serve queries on {self.host}:{self.port}: the certificate "
                                     f"{self._certfile} and key {self._keyfile} do not load as PEM or do not "
                                     f"match ({exc})") from exc
        self.bind()
        sock = self._socket
        assert sock is not None
        server = self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._serve, args=(server, sock), name="query-server", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + _START_TIMEOUT_S
        while not server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.close()
                raise RuntimeError(f"the query server did not start on {self.url}: {self._error!r}")
            time.sleep(0.01)
        logger.info("serving queries on %s", self.url)
        return self

    def _serve(self, server: uvicorn.Server, sock: socket.socket) -> None:
        kind = self._loop_kind
        try:
            # asyncio.run's cleanup, on a loop of our kind for this thread alone; signal handlers
            # are the main thread's (uvicorn installs none here)
            with asyncio.Runner(loop_factory=lambda: _new_event_loop(kind)) as runner:
                runner.run(server.serve(sockets=[sock]))
        except BaseException as exc:  # noqa: BLE001 - reported by start()
            self._error = exc

    def close(self) -> None:
        """Stop accepting, let requests in flight finish (10 s at most) and release the port. Idempotent."""
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(_STOP_TIMEOUT_S)
            if self._thread.is_alive():
                logger.warning("the query server on %s did not stop within %.0f s", self.url, _STOP_TIMEOUT_S)
            self._thread = None
        if self._socket is not None:
            self._socket.close()
            self._socket = None

    def __enter__(self) -> QueryServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.close()
