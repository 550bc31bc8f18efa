"""``python -m materializer`` and the ``materializer`` console script (:func:`entry`)."""

from __future__ import annotations

import os
import signal
import sys

from materializer.interrupts import Terminated, exit_status

__all__ = ["entry"]

#: Signals received while the command line loads (noted, acted on once it has loaded).
_received: list[int] = []


def _noted(signum, frame) -> None:  # noqa: ARG001 - signal handler signature
    _received.append(signum)


def _terminated(signum, frame) -> None:  # noqa: ARG001 - signal handler signature
    raise Terminated()


def _interrupted_while_loading(signum: int) -> None:
    """Exit with one line: nothing is open or written yet."""
    sys.stderr.write(f"error: interrupted ({signal.Signals(signum).name}) while the command line loaded\n")
    sys.stderr.flush()
    # os._exit, not sys.exit: an interrupt that passed through code run by PyRun_String inside an
    # extension's import can be marked "unhandled" by CPython, and the interpreter would then end
    # the process by SIGINT (-2) instead of with 130.
    os._exit(128 + signum)


def entry() -> None:
    """Run the command line (:func:`materializer.cli.main`) with SIGTERM raising
    :class:`~materializer.interrupts.Terminated`, as Ctrl-C raises ``KeyboardInterrupt``: whenever
    either arrives, the command unwinds and exits 143 or 130 with one line
    (:mod:`materializer.interrupts`). While the command line loads (click and the package: about a
    tenth of a second; each command imports the Kafka clients or RocksDB itself) a signal is only noted and acted on once it has loaded: raised inside
    the import machinery, Python may print it as "Exception ignored" and go on loading. Commands
    that handle SIGTERM themselves (``run``'s loop, ``spark materialize``) install their own
    handler while they run.
    """
    signal.signal(signal.SIGTERM, _noted)
    signal.signal(signal.SIGINT, _noted)
    try:
        from materializer.cli import main
    except KeyboardInterrupt as exc:  # raised by a handler installed during the import
        _interrupted_while_loading(_received[0] if _received else exit_status(exc) - 128)
    signal.signal(signal.SIGTERM, _terminated)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # Ctrl-C as Python raises it by default
    if _received:  # noted during the import (or before the handlers changed): nothing ran yet
        _interrupted_while_loading(_received[0])
    try:
        main(prog_name="materializer")
    finally:
        # The command is over (its exit status decided): a signal arriving while the interpreter
        # shuts down, when Python has put the default handlers back, must not turn a finished
        # command into one "killed by SIGINT".
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)


if __name__ == "__main__":
    entry()
