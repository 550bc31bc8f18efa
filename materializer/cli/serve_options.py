"""``run``'s query server options (issue 39): ``--serve HOST:PORT`` starts the read-only HTTP query
server of :mod:`materializer.serve` in the run's process, for every topic the run materializes.

Options::

    --serve HOST:PORT           listen there (PORT alone: 127.0.0.1:PORT; port 0: a free one)
    --serve-token-file FILE     every request must carry "Authorization: Bearer <the file's text>"
    --serve-cert FILE           PEM certificate chain: serve HTTPS (with --serve-key)
    --serve-key FILE            PEM private key of --serve-cert
    --serve-ca-file FILE        PEM CA certificates that verify the other members' HTTPS when
                                forwarding (default: --serve-cert itself)
    --serve-advertise HOST[:PORT]  the address other members (and answers' served_by) name this
                                server by (default: the --serve address; required with --group-id
                                when --serve binds 0.0.0.0 or ::)
    --serve-allowed-hosts NAME  a further name a request's Host header may carry (repeatable, or
                                comma-separated; *.example.com, or * for any): others get 400

With ``--group-id``, the member's advertised URL (:mod:`materializer.serve.addresses`) rides in
its ``client.id`` (issue 39,
:mod:`materializer.adapters.partition_owner`), so any member forwards a key of a partition it does
not serve to the member that does (:mod:`materializer.serve.forwarding`).

The address served is printed on stderr (``serving queries on http://127.0.0.1:PORT``; ``(advertised
as URL; ...)`` when another is announced).
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
    """``--serve``, ``--serve-token-file``, ``--serve-cert``, ``--serve-key``, ``--serve-ca-file``,
    ``--serve-advertise``, ``--serve-allowed-hosts`` (module docstring)."""
    func = click.option("--serve-allowed-hosts", "serve_allowed_hosts", metavar="NAME", multiple=True,
                        help="With --serve: a further name requests may carry in their Host header (repeatable or "
                             "comma-separated; *.example.com for a domain, * for any). The bound and advertised "
                             "hosts, localhost, 127.0.0.1 and ::1 are always allowed; other Host headers get 400 "
                             "(a defence against DNS rebinding).")(func)
    func = click.option("--serve-advertise", "serve_advertise", metavar="HOST[:PORT]", default=None,
                        help="With --serve: the address other members forward to and answers name (like Kafka's "
                             "advertised.listeners), e.g. the name a container or NAT publishes; PORT defaults to "
                             "the bound one. Default: the --serve address. With --group-id, required when --serve "
                             "binds 0.0.0.0 or ::.")(func)
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
        advertised_url: the URL other members forward to (:func:`~materializer.serve.addresses.advertised_url`:
            ``--serve-advertise``, else the bound address; without a group, for 0.0.0.0 or ::,
            this machine's name, ``socket.getfqdn()``).
        cafile: PEM CA certificates that verify other members' HTTPS (None: plain HTTP).
        allowed_hosts: the names a request's ``Host`` header may carry
            (:func:`~materializer.serve.addresses.allowed_host_names`).
    """

    server: QueryServer
    token: str | None
    advertised_url: str
    cafile: Path | None
    allowed_hosts: tuple[str, ...] = ()


def bind_query_server(serve: str | None, token_file: Path | None, cert: Path | None, key: Path | None,
                      ca_file: Path | None, advertise: str | None = None, allowed_hosts: Sequence[str] = (),
                      *, grouped: bool = False) -> PreparedServer | None:
    """Check the options and bind the query server's port (None: --serve not given). ``grouped``:
    the run is a group member, so its URL is announced to the others.

    Raises:
        click.BadParameter: a malformed --serve or --serve-advertise, a wildcard --serve without
            --serve-advertise in a group, options without --serve, TLS options without each other,
            or an empty token file.
        CommandError: the serve extra is not installed, or the address cannot be bound.
    """
    if serve is None:
        if token_file or cert or key or ca_file or advertise or allowed_hosts:
            raise click.BadParameter("needs --serve", param_hint="--serve-token-file/--serve-cert/--serve-key/"
                                                                 "--serve-ca-file/--serve-advertise/--serve-allowed-hosts")
        return None
    if (cert is None) != (key is None):
        raise click.BadParameter("give both or neither", param_hint="--serve-cert/--serve-key")
    try:
        from materializer.serve.server import QueryServer, parse_address
    except ImportError as exc:
        raise CommandError(f"--serve needs Starlette, uvicorn and Jinja2: {INSTALL_HINT} ({exc})") from exc
    from materializer.serve.addresses import WILDCARD_HOSTS, advertised_url, allowed_host_names

    try:
        host, port = parse_address(serve)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--serve") from exc
    try:  # checked before binding: the port picked is only needed to fill in the URL
        advertised_url(host, port or 1, tls=cert is not None, advertise=advertise, required=grouped,
                       machine_name="localhost")
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--serve-advertise" if advertise else "--serve") from exc
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
    # a wildcard bind without a group announces nothing: its answers name this machine (served_by)
    machine = socket.getfqdn() if host in WILDCARD_HOSTS and advertise is None else None
    advertised = advertised_url(host, server.port, tls=server.tls, advertise=advertise, required=grouped,
                                machine_name=machine)
    names = allowed_host_names(host, advertised, [n for item in allowed_hosts for n in item.split(",")])
    return PreparedServer(server, token, advertised, ca_file or cert, names)


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
                                served_by=prepared.advertised_url.split("//", 1)[1], router=router,
                                allowed_hosts=prepared.allowed_hosts)
        server.start()
    except (OSError, RuntimeError) as exc:
        server.close()
        raise CommandError(str(exc)) from exc
    except Exception as exc:  # ssl.SSLError is an OSError; anything else uvicorn raises while loading
        server.close()
        raise CommandError(f"cannot serve queries on {server.host}:{server.port}: {exc}") from exc
    stack.callback(server.close)
    announced = "" if prepared.advertised_url == server.url else f"advertised as {prepared.advertised_url}; "
    click.echo(f"serving queries on {server.url} ({announced}topics: {', '.join(m.topic for m in materializers)})",
               err=True)
    return server
