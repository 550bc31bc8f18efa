"""Where the ``materializer`` command's log lines go: one stderr handler on the root logger, in
``--log-format``, which the Kafka client libraries' lines pass through too, folded when repeated.

Client libraries' loggers:

* kafka-python (the replica fetch path): the ``kafka`` logger and its children (``kafka.conn``,
  ``kafka.client_async``, ...), which propagate to the root logger;
* librdkafka (confluent-kafka): each client is created with ``logger=`` a ``*.librdkafka`` logger
  of the module that owns it, and its ``error_cb`` reports to that logger too
  (:mod:`materializer.adapters.kafka_source`, :mod:`materializer.cli.demo`).

Their lines are shown at WARNING and above, at INFO with ``-v``, DEBUG with ``--debug`` (the
root level), except their reports of a failed connection (:func:`is_connection_report`), which
are shown as INFO: the materializer reports an unreachable broker itself, once, in its own
warning or ``error:`` line, which quotes the client's last report. :class:`RepeatFoldingHandler`
prints a line that repeats within a window once: a
broker that is away gives one line per distinct message, and the repeats are counted in a
``(repeated N more times in S s)`` line when the window ends, when an ``error:`` line is about to
be printed (:func:`flush_repeats`) or at exit. The materializer's own lines are never folded.
"""

from __future__ import annotations

import logging
import re
import sys

from materializer.log_format import formatter_for

__all__ = ["CLIENT_LOGGER_PREFIXES", "RepeatFoldingHandler", "configure_logging", "flush_repeats",
           "is_client_logger", "is_connection_report"]

#: Loggers of the Kafka client libraries (kafka-python's, and the ``*.librdkafka`` ones).
CLIENT_LOGGER_PREFIXES = ("kafka.",)
_CLIENT_LOGGER_NAMES = ("kafka",)
_LIBRDKAFKA_SUFFIX = ".librdkafka"

# Numbers in a client line (milliseconds in a state, retry counts, correlation ids) do not make
# it another message: "after 0ms in state CONNECT" and "after 3ms ..." are one repeated line.
_NUMBERS = re.compile(r"\d+")

# kafka-python's network layer: every line it logs is about a connection (connecting, refused,
# lost, bootstrap retries); the Fetch results it carries are reported by the materializer.
_KAFKA_PYTHON_NETWORK_LOGGERS = ("kafka.net", "kafka.conn", "kafka.client_async")
# librdkafka's log facility for a failed connection (refused, TLS/SASL handshake, timed out).
_LIBRDKAFKA_CONNECTION_FACILITIES = ("FAIL",)

_installed: list[logging.Handler] = []


def is_client_logger(name: str) -> bool:
    """Whether logger ``name`` is a Kafka client library's (its lines are folded when repeated)."""
    return name in _CLIENT_LOGGER_NAMES or name.startswith(CLIENT_LOGGER_PREFIXES) or name.endswith(_LIBRDKAFKA_SUFFIX)


def is_connection_report(record: logging.LogRecord) -> bool:
    """Whether ``record`` is a client library's report of a failed or lost connection: a line of
    kafka-python's network layer (``kafka.net.*``, ``kafka.conn``, ``kafka.client_async``), or a
    librdkafka line of the ``FAIL`` facility (confluent-kafka passes the facility as the first
    argument of its ``logger`` call)."""
    name = record.name
    if name.startswith(_KAFKA_PYTHON_NETWORK_LOGGERS):
        return name in _KAFKA_PYTHON_NETWORK_LOGGERS or name.startswith(
            tuple(prefix + "." for prefix in _KAFKA_PYTHON_NETWORK_LOGGERS))
    args = record.args
    return (name.endswith(_LIBRDKAFKA_SUFFIX) and isinstance(args, tuple) and bool(args)
            and args[0] in _LIBRDKAFKA_CONNECTION_FACILITIES)


class RepeatFoldingHandler(logging.Handler):
    """Passes records to ``inner``; a client library's connection report
    (:func:`is_connection_report`) at ERROR or WARNING is passed as INFO, so it is dropped below
    ``client_level``; a client library's record whose (logger, level, text with the
    numbers left out) was passed less than ``window_s`` seconds before is counted instead, and the
    count is passed on as one ``<text> (repeated N more times in S s)`` record when the window
    ends (at the next such record after it), at :meth:`flush_repeats` and at :meth:`close`.

    Thread-safe (``logging.Handler``'s lock). The number of remembered texts is bounded.
    """

    def __init__(self, inner: logging.Handler, window_s: float = 60.0, client_level: int = logging.NOTSET) -> None:
        super().__init__()
        self.inner = inner
        self.client_level = client_level
        self.window_s = window_s
        # key -> [first record of the window, repeats since]
        self._windows: dict[tuple[str, int, str], list] = {}

    def emit(self, record: logging.LogRecord) -> None:
        """Pass ``record`` on, or count it as a repeat."""
        if not is_client_logger(record.name):
            self.inner.handle(record)
            return
        if record.levelno > logging.INFO and is_connection_report(record):
            record = logging.makeLogRecord({**record.__dict__, "levelno": logging.INFO, "levelname": "INFO"})
        if record.levelno < self.client_level:
            return
        key = (record.name, record.levelno, _NUMBERS.sub("#", record.getMessage()))
        window = self._windows.get(key)
        if window is not None and record.created - window[0].created < self.window_s:
            window[1] += 1
            return
        if window is not None:
            self._pass_count(window[0], window[1], record.created)
        if len(self._windows) > 10_000:  # bounded: texts carry addresses and topic names
            self.flush_repeats()
        self._windows[key] = [record, 0]
        self.inner.handle(record)

    def _pass_count(self, first: logging.LogRecord, repeats: int, until: float) -> None:
        if repeats:
            self.inner.handle(logging.makeLogRecord({
                **first.__dict__, "msg": f"{first.getMessage()} (repeated {repeats} more times in "
                                         f"{until - first.created:.1f} s)", "created": until,
                "args": None, "exc_info": None, "exc_text": None}))

    def flush_repeats(self) -> None:
        """Pass on the counts of every open window, and forget the windows."""
        import time

        self.acquire()
        try:
            windows, self._windows = self._windows, {}
        finally:
            self.release()
        now = time.time()
        for first, repeats in windows.values():
            self._pass_count(first, repeats, now)

    def flush(self) -> None:
        """Flush the inner handler."""
        self.inner.flush()

    def close(self) -> None:
        """Pass on the pending counts, then close the inner handler."""
        self.flush_repeats()
        self.inner.close()
        super().close()


class _WithoutTraceback(logging.Formatter):
    """Without --debug, a logged exception shows on stderr as ``message: error`` on the same line;
    its traceback still goes to the files that log it in full (``log-cleaner.log``)."""

    def __init__(self, inner: logging.Formatter) -> None:
        super().__init__()
        self.inner = inner

    def format(self, record: logging.LogRecord) -> str:
        if record.exc_info:
            error = record.exc_info[1]
            record = logging.makeLogRecord({**record.__dict__, "msg": f"{record.getMessage()}: {error}",
                                            "args": None, "exc_info": None, "exc_text": None})
        return self.inner.format(record)


def configure_logging(verbose: bool, debug: bool, log_format: str = "text") -> None:
    """Log to stderr at WARNING (INFO with ``verbose``, DEBUG with ``debug``), each line in
    ``log_format`` (:mod:`materializer.log_format`: ``text`` with an ISO 8601 UTC timestamp, or
    ``json``, one object per line), the client libraries' repeated lines folded
    (:class:`RepeatFoldingHandler`). Like :func:`logging.basicConfig`, leaves a root logger that
    already has handlers of someone else (an application, pytest) as it is; called again, replaces
    the handler it installed.

    Raises:
        ValueError: an unknown ``log_format``.
    """
    formatter = formatter_for(log_format)
    root = logging.getLogger()
    for previous in _installed:
        root.removeHandler(previous)
    _installed.clear()
    if root.handlers:
        return
    stream = logging.StreamHandler(sys.stderr)
    # Text lines stay one line each unless --debug; JSON keeps the traceback in its exc_info field.
    stream.setFormatter(_WithoutTraceback(formatter) if log_format == "text" and not debug else formatter)
    level = logging.DEBUG if debug else logging.INFO if verbose else logging.WARNING
    handler = RepeatFoldingHandler(stream, client_level=level)
    root.addHandler(handler)
    root.setLevel(level)
    _installed.append(handler)


def flush_repeats() -> None:
    """Print the pending repeat counts of the handler :func:`configure_logging` installed (before an
    ``error:`` line, so the counts come before it)."""
    for handler in _installed:
        if isinstance(handler, RepeatFoldingHandler):
            handler.flush_repeats()
