"""``python -m materializer`` and the ``materializer`` console script (:func:`entry`)."""

from __future__ import annotations

import os
import signal
import sys

from materializer.interrupts import Terminated, exit_status

__all__ = ["entry"]


def _terminated(signum, frame) -> None:  # noqa: ARG001 - signal handler signature
    raise Terminated()


def entry() -> None:
    """Run the command line (:func:`materializer.cli.main`) with SIGTERM raising
    :class:`~materializer.interrupts.Terminated` from the start, as Ctrl-C raises
    ``KeyboardInterrupt``: whenever either arrives, the command unwinds and exits 143 or 130 with one
    line (:mod:`materializer.interrupts`), also while the command line loads (the Kafka client,
    RocksDB...: a few tenths of a second). Commands that handle SIGTERM themselves (``run``'s loop,
    ``spark materialize``) install their own handler while they run.
    """
    signal.signal(signal.SIGTERM, _terminated)
    try:
        from materializer.cli import main
    except KeyboardInterrupt as exc:
        status = exit_status(exc)
        sys.stderr.write(f"error: interrupted ({signal.Signals(status - 128).name}) while the command line loaded\n")
        sys.stderr.flush()
        # Nothing is open or written yet. os._exit, not sys.exit: an interrupt that passed through
        # code run by PyRun_String inside an extension's import can be marked "unhandled" by CPython,
        # and the interpreter would then end the process by SIGINT (-2) instead of with 130.
        os._exit(status)
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
