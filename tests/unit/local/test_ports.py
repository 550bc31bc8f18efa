"""Free ports for the local services (:mod:`materializer.local.ports`)."""

from __future__ import annotations

import socket

import pytest

from materializer.local import ports
from materializer.local.ports import free_port, port_answers, port_is_free


def test_a_listening_port_is_taken_and_answers() -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        assert not port_is_free("127.0.0.1", port)
        assert port_answers("127.0.0.1", port)
    assert port_is_free("127.0.0.1", port)
    assert not port_answers("127.0.0.1", port)


def test_free_port_is_bindable() -> None:
    port = free_port()
    assert port_is_free("127.0.0.1", port)


def test_free_port_skips_the_excluded(monkeypatch: pytest.MonkeyPatch) -> None:
    handed_out = iter([41000, 41001, 41002])

    class KernelPicks:  # bind(port 0) gets the kernel's next pick
        def __init__(self, *args: object) -> None:
            self.port = 0

        def __enter__(self) -> "KernelPicks":
            return self

        def __exit__(self, *exc: object) -> None:
            pass

        def bind(self, address: tuple[str, int]) -> None:
            self.port = next(handed_out)

        def getsockname(self) -> tuple[str, int]:
            return ("127.0.0.1", self.port)

    monkeypatch.setattr(ports.socket, "socket", KernelPicks)
    assert free_port(exclude={41000, 41001}) == 41002
