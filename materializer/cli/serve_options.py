"""``run``'s query server options (issue 39): ``--serve HOST:PORT`` starts the read-only HTTP query
server of :mod:`materializer.serve` in the run's process, for every topic the run materializes.

Options::

    --serve HOST:PORT           listen there (PORT alone: 127.0.0.1:PORT; port 0: a free one)
    --serve-token-file FILE     every request must carry "Authorization: Bearer <the file's text>"
    --serve-cert FILE           PEM certificate chain: serve HTTPS (with --serve-key)
    --serve-key FILE            PEM private key of --serve-cert

The address served is printed on stderr (``serving queries on http://127.0.0.1:PORT``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import click

from materializer.cli.conventions import CommandError

if TYPE_CHECKING:
    from materializer.materializer import Materializer
    from materializer.serve.server import QueryServer

__all__ = ["INSTALL_HINT", "serve_options", "start_query_server"]

INSTALL_HINT = "pip install 'kafka-materializer[serve]'"

_FILE = click.Path(exists=True, dir_okay=False, path_type=Path)


def serve_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """``--serve``, ``--serve-token-file``, ``--serve-cert``, ``--serve-key`` (module docstring)."""
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
                             "/v1/topics/TOPIC/keys:batch, GET /v1/topics/TOPIC/scan, /openapi.json (docs/serving.md; "
                             f"needs {INSTALL_HINT}).")(func)
    return func


def start_query_server(stack: contextlib.ExitStack, materializers: Sequence[Materializer], serve: str | None,
                       token_file: Path | None, cert: Path | None, key: Path | None) -> QueryServer | None:
    """Start the query server of ``materializers`` as the options ask (None: not asked), closed by
    ``stack``; prints the URL on stderr.

    Raises:
        click.BadParameter: a malformed --serve, TLS options without --serve or without each other,
            or an empty token file.
        CommandError: the serve extra is not installed, or the server cannot start (address in use,
            a certificate that does not load).
    """
    if serve is None:
        if token_file or cert or key:
            raise click.BadParameter("needs --serve", param_hint="--serve-token-file/--serve-cert/--serve-key")
        return None
    if (cert is None) != (key is None):
        raise click.BadParameter("give both or neither", param_hint="--serve-cert/--serve-key")
    try:
        from materializer.serve import QueryServer, create_app, source_of
        from materializer.serve.server import parse_address
    except ImportError as exc:
        raise CommandError(f"--serve needs Starlette and uvicorn: {INSTALL_HINT} ({exc})") from exc
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
        server.app = create_app([source_of(m) for m in materializers], token=token,
                                served_by=f"{host}:{server.port}")
        server.start()
    except (OSError, RuntimeError) as exc:
        raise CommandError(str(exc)) from exc
    except Exception as exc:  # ssl.SSLError is an OSError; anything else uvicorn raises while loading
        raise CommandError(f"cannot serve queries on {host}:{port}: {exc}") from exc
    stack.callback(server.close)
    click.echo(f"serving queries on {server.url} (topics: {', '.join(m.topic for m in materializers)})", err=True)
    return server
