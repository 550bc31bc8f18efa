"""TCP ports on the host for the local services: pick a free one, check one, see whether one answers.

A port picked here is free when it is picked, not when the service binds it later: another process
may take it in between. :class:`~materializer.local.kafka_broker.LocalKafkaBroker` therefore starts
again on new ports when its JVM reports "Address already in use".
"""

from __future__ import annotations

import socket
from typing import Collection

__all__ = ["free_port", "port_is_free", "port_answers"]


def free_port(host: str = "127.0.0.1", *, exclude: Collection[int] = ()) -> int:
    """A TCP port on ``host`` that the kernel hands out as free (bind to port 0), none of ``exclude``.

    Raises:
        OSError: ``host`` is not an address of this machine.
    """
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((host, 0))
            port = int(sock.getsockname()[1])
        if port not in exclude:
            return port


def port_is_free(host: str, port: int) -> bool:
    """Whether a listener could bind ``host:port`` now. ``SO_REUSEADDR`` as Kafka's acceptor sets it:
    a port whose last connections linger in TIME_WAIT counts as free."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def port_answers(host: str, port: int, timeout_s: float = 0.5) -> bool:
    """Whether a TCP connection to ``host:port`` is accepted within ``timeout_s`` seconds."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False
