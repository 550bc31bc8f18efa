"""How commands that write a data dir meet SIGINT and SIGTERM.

Both signals unwind the command like an exception, so its cleanup runs (a restore's staging folder
is removed, open logs are closed without their checkpoints, the data dir's lock is released) and
the CLI prints one line::

    SIGINT  (Ctrl-C)          KeyboardInterrupt ─▶ cleanup ─▶ "error: interrupted (SIGINT) ..."  exit 130
    SIGTERM (kill, systemd)   Terminated        ─▶ cleanup ─▶ "error: interrupted (SIGTERM) ..." exit 143

(128 + the signal number, as a shell reports a process a signal stopped.) Python turns SIGINT into
``KeyboardInterrupt`` already; :func:`sigterm_interrupts` makes SIGTERM raise :class:`Terminated`,
a ``KeyboardInterrupt`` too, so every ``except Exception`` lets it through and every ``finally``
runs. The ``materializer`` console script installs that handler from its first moment
(:func:`materializer.__main__.entry`); ``restore``, ``compact`` and ``spark compact`` install it
themselves too, for callers of the click commands that are not the console script. SIGKILL cannot be caught: what it leaves is finished or removed by the next command that
writes the data dir (:class:`materializer.datadir.lock.DataDirLock`).

A step that must not be cut in the middle by the process itself (the short rename sequence of a
swap) runs under :func:`signals_deferred`: a signal arriving then takes effect right after it.
The ``run`` loop handles both signals itself (:func:`stop_after_the_batch`, installed by
:meth:`Materializer.run <materializer.materializer.Materializer.run>` and :meth:`TopicSet.run
<materializer.topic_set.TopicSet.run>`): the first finishes the batch in progress, a second aborts.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from typing import Any, Callable, Iterator

__all__ = ["Terminated", "exit_status", "restore_handlers", "signals_deferred", "sigterm_interrupts",
           "stop_after_the_batch"]

_DEFERRED = (signal.SIGINT, signal.SIGTERM)


class Terminated(KeyboardInterrupt):
    """SIGTERM arrived (raised by the handler :func:`sigterm_interrupts` installs)."""

    signum = signal.SIGTERM


def exit_status(interrupt: KeyboardInterrupt) -> int:
    """The exit status of a command stopped by ``interrupt``: 128 + its signal (130 SIGINT, 143 SIGTERM)."""
    return 128 + int(getattr(interrupt, "signum", signal.SIGINT))


def _raise_terminated(signum, frame) -> None:  # noqa: ARG001 - signal handler signature
    raise Terminated()


@contextlib.contextmanager
def sigterm_interrupts() -> Iterator[None]:
    """While the block runs, SIGTERM raises :class:`Terminated` in the main thread (elsewhere: no-op,
    Python delivers signals to the main thread only). The previous handler is restored after."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)


@contextlib.contextmanager
def signals_deferred() -> Iterator[None]:
    """Hold SIGINT and SIGTERM until the block ends, then deliver the first one that arrived to the
    handler in place before (so ``KeyboardInterrupt``/:class:`Terminated` is raised after the block,
    not inside it). Main thread only; elsewhere the block just runs."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    arrived: list[int] = []

    def hold(signum, frame) -> None:  # noqa: ARG001 - signal handler signature
        arrived.append(signum)

    previous = {signum: signal.signal(signum, hold) for signum in _DEFERRED}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, signal.SIG_DFL if handler is None else handler)  # None: set outside Python
        if arrived:
            signal.raise_signal(arrived[0])


def stop_after_the_batch(stop_requested: threading.Event, stop: Callable[[int], None], *,
                         aborted: Callable[[], None] | None = None) -> dict[int, Any] | None:
    """Install SIGINT (Ctrl-C) and SIGTERM (what systemd and Kubernetes send) handlers for a run
    loop: the first signal calls ``stop(signum)``, which asks the loop to return after the batch in
    progress (so the caller closes cleanly: checkpoints and the clean-shutdown marker, no recovery
    on the next start); one arriving once ``stop_requested`` is set calls ``aborted`` and raises
    ``KeyboardInterrupt`` at once. Main thread only (elsewhere nothing is installed: None);
    returns the previous handlers, for :func:`restore_handlers`."""
    if threading.current_thread() is not threading.main_thread():
        return None

    def on_signal(signum, frame) -> None:  # noqa: ARG001 - signal handler signature
        if stop_requested.is_set():
            if aborted is not None:
                aborted()
            raise KeyboardInterrupt
        stop(signum)

    return {signum: signal.signal(signum, on_signal) for signum in _DEFERRED}


def restore_handlers(previous: dict[int, Any] | None) -> None:
    """Put back the handlers :func:`stop_after_the_batch` returned (None: nothing was installed)."""
    for signum, handler in (previous or {}).items():
        signal.signal(signum, handler)
