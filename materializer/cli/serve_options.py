"""``run``'s query server options (issue 39): ``--serve HOST:PORT`` starts the read-only HTTP query
server of :mod:`materializer.serve` in the run's process, for every topic the run materializes.

Options::

    --serve HOST:PORT           listen there (PORT alone: 127.0.0.1:PORT; port 0: a free one)
    --serve-token-file FILE     every request must carry "Authorization: Bearer <the file's text>"
    --serve-cert FILE           PEM certificate chain: serve HTTPS (with --serve-key)
    --serve-key FILE            PEM private key of --serve-cert
    --serve-ca-file FILE        PEM CA certificates that verify the other members' HTTPS when
                                forwarding (default: --serve-cert itself)

With ``--group-id``, the member's URL rides in its ``client.id`` (issue 39,
:mod:`materializer.adapters.partition_owner`), so any member forwards a key of a partition it does
not serve to the member that does (:mod:`materializer.serve.forwarding`).

The address served is printed on stderr (``serving queries on http://127.0.0.1:PORT``).
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import click

from materializer.cli.conventions import CommandError

if TYPE_CHECKING:
    from materializer.materializer import Materializer
    from materializer.serve.server import QueryServer

__all__ = ["INSTALL_HINT", "PreparedServer", "bind_query_server", "serve_options", "start_query_server"]

INSTALL_HINT = "pip install 'kafka-materializer[serve]'"

_FILE = click.Path(exists=True, dir_okay=False, path_type=Path)


def serve_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """``--serve``, ``--serve-token-file``, ``--serve-cert``, ``--serve-key``, ``--serve-ca-file`` (module docstring)."""
    func = click.option("--serve-ca-file", "serve_ca_file", type=_FILE, default=None,
                        help="With --serve and --group-id: PEM CA certificates that verify the other members' HTTPS "
                             "when a key is forwarded to them (default: --serve-cert).")(func)
    func = click.option("--serve-key", "serve_key", type=_FILE, default=None,
                        help="With --serve-cert: the certificate's PEM private key.")(func)
    func = click.option("--serve-cert", "serve_cert", type=_FILE, default=None,
                        help="With --serve: serve HTTPS with this PEM certificate (chain); needs --serve-key.")(func)
    func = click.option("--serve-token-file", "serve_token_file", type=_FILE, default=None,
                        help="With --serve: every request must carry 'Authorization: Bearer TOKEN', TOKEN being "
                             "this file's text (surrounding whitespace stripped); others get 401.")(func)
    func = click.option("--serve", "serve", metavar="HOST:PORT", default=None,
                        help="Serve read-only HTTP queries of every topic on HOST:PORT while it runs (PORT alone: "
                             "127.0.0.1; 0: a free port, printed): GET /v1/topics/TOPIC/keys/KEY, POST "
                             "/v1/topics/TOPIC/keys:batch, GET /v1/topics/TOPIC/scan, /openapi.json, a status page at / "
                             "(docs/serving.md; "
                             f"needs {INSTALL_HINT}).")(func)
    return func


@dataclass
class PreparedServer:
    """A query server bound to its port (so its URL is known before the group is joined), not started.

    Attributes:
        server: the :class:`~materializer.serve.server.QueryServer`.
        token: the bearer token (None: none).
        advertised_url: the URL other members forward to (the bound host; for 0.0.0.0 or ::, this
            machine's name, ``socket.getfqdn()``).
        cafile: PEM CA certificates that verify other members' HTTPS (None: plain HTTP).
    """

    server: QueryServer
    token: str | None
    advertised_url: str
    cafile: Path | None


def bind_query_server(serve: str | None, token_file: Path | None, cert: Path | None, key: Path | None,
                      ca_file: Path | None) -> PreparedServer | None:
    """Check the options and bind the query server's port (None: --serve not given).

    Raises:
        click.BadParameter: a malformed --serve, TLS options without --serve or without each other,
            or an empty token file.
        CommandError: the serve extra is not installed, or the address cannot be bound.
    """
    if serve is None:
        if token_file or cert or key or ca_file:
            raise click.BadParameter("needs --serve", param_hint="--serve-token-file/--serve-cert/--serve-key/--serve-ca-file")
        return None
    if (cert is None) != (key is None):
        raise click.BadParameter("give both or neither", param_hint="--serve-cert/--serve-key")
    try:
        from materializer.serve.server import QueryServer, parse_address
    except ImportError as exc:
        raise CommandError(f"--serve needs Starlette, uvicorn and Jinja2: {INSTALL_HINT} ({exc})") from exc
    try:
        host, port = parse_address(serve)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--serve") from exc
    token = None
    if token_file is not None:
        token = token_file.read_text(encoding="utf-8").strip()
        if not token:
            raise click.BadParameter(f"{token_file} is empty", param_hint="--serve-token-file")
    server = QueryServer(None, host, port, certfile=cert, keyfile=key)
    try:
        server.bind()
    except OSError as exc:
        raise CommandError(str(exc)) from exc
    advertised = server.url
    if host in ("0.0.0.0", "::"):  # every interface: other members reach it by this machine's name
        advertised = advertised.replace(f"//{'[::]' if host == '::' else host}:", f"//{socket.getfqdn()}:", 1)
    return PreparedServer(server, token, advertised, ca_file or cert)


def start_query_server(stack: contextlib.ExitStack, prepared: PreparedServer | None,
                       materializers: Sequence[Materializer]) -> QueryServer | None:
    """Start the query server ``prepared`` (None: not asked) over ``materializers``, closed by
    ``stack``; prints the URL on stderr. Members of a group forward keys they do not serve to
    their owners (:class:`~materializer.serve.forwarding.Forwarding`).

    Raises:
        CommandError: the server cannot start (a certificate that does not load).
    """
    if prepared is None:
        return None
    from materializer.serve import create_app, source_of
    from materializer.serve.forwarding import Forwarding

    server = prepared.server
    grouped = any(m.options.group_id is not None for m in materializers)
    router = Forwarding(token=prepared.token, cafile=prepared.cafile) if grouped else None
    try:
        server.app = create_app([source_of(m) for m in materializers], token=prepared.token,
                                served_by=prepared.advertised_url.split("//", 1)[1], router=router)
        server.start()
    except (OSError, RuntimeError) as exc:
        server.close()
        raise CommandError(str(exc)) from exc
    except Exception as exc:  # ssl.SSLError is an OSError; anything else uvicorn raises while loading
        server.close()
        raise CommandError(f"cannot serve queries on {server.host}:{server.port}: {exc}") from exc
    stack.callback(server.close)
    click.echo(f"serving queries on {server.url} (topics: {', '.join(m.topic for m in materializers)})", err=True)
    return server
