"""The address a query server announces, and the host names it answers to (issue 39).

A member binds one address (``run --serve HOST:PORT``, Kafka's ``listeners``) and announces
another for the others to use (``--serve-advertise HOST[:PORT]``, Kafka's ``advertised.listeners``):
a member bound to ``0.0.0.0`` in a container, or behind NAT, is reached at a name or port that is
not the one it bound. The announced URL is what rides in the member's ``client.id``
(:mod:`materializer.adapters.partition_owner`), what ``owner_of`` returns and what the others
forward to; its host is also a name the server answers to (:mod:`materializer.serve.hosts`).

Like Kafka (``KafkaConfig.validateValues``: "advertised.listeners cannot use the nonroutable
meta-address 0.0.0.0"), a wildcard address (``0.0.0.0``, ``::``) is never announced: a group member
bound to one must be told what to announce (:func:`advertised_url` raises).

Pure functions: no I/O.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable

__all__ = ["LOOPBACK_NAMES", "MAX_HOST_CHARS", "WILDCARD_HOSTS", "advertised_url", "allowed_host_names",
           "host_of_url", "parse_advertise"]

#: The addresses that mean "every interface": bound to, never announced.
WILDCARD_HOSTS = frozenset({"0.0.0.0", "::", ""})

#: The names a request from this machine may carry in its ``Host`` header whatever the bound address.
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")

#: The longest host name (RFC 1035 §2.3.4: 255 octets on the wire, 253 characters written out).
MAX_HOST_CHARS = 253

_LABEL = re.compile(r"^(?!-)[A-Za-z0-9_-]{1,63}(?<!-)$")  # RFC 1123 §2.1; '_' as container names use it


def _check_host(host: str, what: str) -> str:
    """``host`` as a URL writes it (IPv6 in brackets), once it is an IP address or a DNS name.

    Raises:
        ValueError: empty, a wildcard, a name over 253 characters or with a label that is not
            letters, digits, ``-`` and ``_`` (63 at most, not starting or ending with ``-``).
    """
    if host in WILDCARD_HOSTS:
        raise ValueError(f"{what} cannot be the wildcard address {host or '(empty)'!r}: other members cannot "
                         "connect to it; give the name or address they reach this machine at")
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        pass
    else:
        if address.is_unspecified:
            raise ValueError(f"{what} cannot be the wildcard address {host!r}")
        return f"[{host}]" if address.version == 6 else host
    name = host[:-1] if host.endswith(".") else host
    if len(name) > MAX_HOST_CHARS or not all(_LABEL.match(label) for label in name.split(".")):
        raise ValueError(f"{what} {host!r} is not a host name (labels of letters, digits, '-' and '_', at most 63 "
                         f"characters each and {MAX_HOST_CHARS} in all) nor an IP address")
    return host


def parse_advertise(text: str) -> tuple[str, int | None]:
    """``HOST``, ``HOST:PORT`` or ``[IPv6]:PORT`` as ``(host, port)`` (port None: not given).

    Raises:
        ValueError: a malformed address, a wildcard host, a port outside 1..65535.
    """
    text = text.strip()
    port: int | None = None
    if text.startswith("["):  # [IPv6] or [IPv6]:PORT
        host, bracket, rest = text[1:].partition("]")
        if not bracket or (rest and not rest.startswith(":")):
            raise ValueError(f"{text!r} is not HOST[:PORT] ([IPv6]:PORT for an IPv6 address)")
        port_text = rest[1:] if rest else None
    elif text.count(":") == 1:
        host, _, port_text = text.partition(":")
    elif ":" in text:  # a bare IPv6 address: no port can follow it
        host, port_text = text, None
    else:
        host, port_text = text, None
    if port_text is not None:
        if not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
            raise ValueError(f"{text!r} is not HOST[:PORT] (a port from 1 to 65535)")
        port = int(port_text)
    _check_host(host, "the advertised host")
    return host, port


def advertised_url(bound_host: str, bound_port: int, *, tls: bool, advertise: str | None,
                   required: bool, machine_name: str | None = None) -> str:
    """The URL others reach the server at: ``http(s)://HOST:PORT``.

    Args:
        bound_host, bound_port: the address bound (the port picked, for port 0).
        tls: the server runs HTTPS (``https://``).
        advertise: ``HOST[:PORT]`` to announce (``--serve-advertise``; the port defaults to the
            bound one); None: the bound address.
        required: the URL is announced to other members (group mode), so a wildcard bound address
            without ``advertise`` is an error rather than a guess.
        machine_name: this machine's name (``socket.getfqdn()``), for a wildcard bound host that is
            not ``required``.

    Raises:
        ValueError: ``advertise`` is malformed or a wildcard; or it is None, the bound host is a
            wildcard and ``required``.

    Without ``advertise`` and not ``required``, a wildcard bound host is named ``machine_name``
    (when it is a host name; else the loopback address): the URL then only names the server in its
    own answers (``served_by``), nothing is announced.
    """
    scheme = "https" if tls else "http"
    if advertise is not None:
        host, port = parse_advertise(advertise)
        return f"{scheme}://{_check_host(host, 'the advertised host')}:{port or bound_port}"
    if bound_host in WILDCARD_HOSTS:
        if required:
            raise ValueError(f"{bound_host or '(empty)'} (every interface) is bound but cannot be announced to the "
                             "other members: give --serve-advertise HOST[:PORT], the name or address they reach "
                             "this member at")
        loopback = "::1" if bound_host == "::" else "127.0.0.1"
        try:
            return f"{scheme}://{_check_host(machine_name or loopback, 'the machine name')}:{bound_port}"
        except ValueError:
            bound_host = loopback
    return f"{scheme}://{_check_host(bound_host, 'the bound host')}:{bound_port}"


def host_of_url(url: str) -> str:
    """The host of ``http(s)://HOST:PORT[/prefix]`` (IPv6 without brackets)."""
    authority = url.split("//", 1)[-1].split("/", 1)[0]
    if authority.startswith("["):
        return authority[1:].split("]", 1)[0]
    return authority.rsplit(":", 1)[0] if ":" in authority else authority


def allowed_host_names(bound_host: str, advertised: str | None, extra: Iterable[str] = ()) -> tuple[str, ...]:
    """The names the server answers to in a request's ``Host`` header (:mod:`materializer.serve.hosts`):
    the bound host (not a wildcard), the advertised URL's host, :data:`LOOPBACK_NAMES` and ``extra``
    (``--serve-allowed-hosts``), lower-cased, each once, in that order."""
    names = [] if bound_host in WILDCARD_HOSTS else [bound_host]
    if advertised is not None:
        names.append(host_of_url(advertised))
    names += [*LOOPBACK_NAMES, *(e.strip() for e in extra if e.strip())]
    return tuple(dict.fromkeys(n.lower().strip("[]") for n in names))
