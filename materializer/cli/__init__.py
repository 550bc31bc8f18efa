"""The ``materializer`` command line (console script; a thin layer over the Python API).

Commands::

    materializer run --bootstrap-servers HOST:PORT --topic TOPIC --data-dir DIR [--until-caught-up]
    materializer export --data-dir DIR --topic TOPIC          JSON Lines, one object per live key
    materializer get --data-dir DIR --topic TOPIC KEY         the value; exit 1 when absent
        (run/get/export: --key-format/--value-format bytes|str|json|avro, --schema-registry-url URL)
    materializer demo [--data-dir DIR]                        end-to-end sample on a local broker
    materializer broker start|stop|status                     a local Apache Kafka broker
    materializer registry start|stop|status                   a local Schema Registry (Apicurio)
    materializer dump-log PATH                                Kafka DumpLogSegments-style dump
    materializer restore ... / compact ...                    offline restore; Kafka LogCleaner compaction
    materializer spark snapshot|compact|materialize           the same jobs on a Spark cluster

Exit status: 0 success; 1 ``get`` found no such key; 2 usage error or failure (a refusal included:
a data dir another process writes, an incomplete topic); 130 Ctrl-C (SIGINT); 143 SIGTERM in
``restore``/``compact``/``spark compact`` (:mod:`materializer.interrupts`). Failures from storage and
adapters, refusals and interruptions are printed as ONE line on stderr (``--debug`` shows the
traceback).
"""

from __future__ import annotations

import logging
import os
import signal
import sys

import click

from materializer.adapters.errors import AdapterError
from materializer.cli.options import EXIT_ABSENT, EXIT_FAILURE
from materializer.interrupts import exit_status
from materializer.log_format import LOG_FORMATS, formatter_for
from materializer.metrics import MetricsUnavailableError
from materializer.storage.errors import StorageError

__all__ = ["CLEANER_LOG_FILE", "EXIT_ABSENT", "EXIT_FAILURE", "main"]

_EXPECTED_ERRORS = (AdapterError, StorageError, ValueError, OSError, MetricsUnavailableError)


class _Group(click.Group):
    """Turns expected failures into one ``error: ...`` line on stderr and exit status 2, and Ctrl-C /
    SIGTERM into one line and 130 / 143 (instead of click's ``Aborted!`` and 1)."""

    def make_context(self, info_name, args, parent=None, **extra):
        try:
            return super().make_context(info_name, args, parent=parent, **extra)
        except KeyboardInterrupt as exc:  # while the command line is parsed, before invoke
            status = exit_status(exc)
            click.echo(f"error: interrupted ({signal.Signals(status - 128).name})", err=True)
            raise click.exceptions.Exit(status) from exc

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except BrokenPipeError:  # `materializer export | head`: the reader left; not an error
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            ctx.exit(0)
        except _EXPECTED_ERRORS as exc:
            if ctx.obj and ctx.obj.get("debug"):
                raise
            message = " ".join(str(exc).split()) or type(exc).__name__
            click.echo(f"error: {message}", err=True)
            ctx.exit(EXIT_FAILURE)
        except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM in a command that writes (materializer.interrupts)
            if ctx.obj and ctx.obj.get("debug"):
                raise
            status = exit_status(exc)
            notes = " ".join(" ".join(note.split()) for note in getattr(exc, "__notes__", ()))
            click.echo(f"error: interrupted ({signal.Signals(status - 128).name}){'; ' + notes if notes else ''}",
                       err=True)
            ctx.exit(status)


def _configure_logging(verbose: bool, debug: bool, log_format: str = "text") -> None:
    """Log to stderr at WARNING (INFO with ``verbose``, DEBUG with ``debug``), each line in
    ``log_format`` (:mod:`materializer.log_format`: ``text`` with an ISO 8601 UTC timestamp, or
    ``json``, one object per line). Like :func:`logging.basicConfig`, leaves a root logger that
    already has handlers as it is.

    Raises:
        ValueError: an unknown ``log_format``.
    """
    level = logging.DEBUG if debug else logging.INFO if verbose else logging.WARNING
    handler = logging.StreamHandler(sys.stderr)
    formatter = formatter_for(log_format)
    # Text lines stay one line each unless --debug; JSON keeps the traceback in its exc_info field.
    handler.setFormatter(_WithoutTraceback(formatter) if log_format == "text" and not debug else formatter)
    handler.addFilter(_ClientLogDedup())
    logging.basicConfig(level=level, handlers=[handler])
    if not debug:
        # The client libraries report every failed connection attempt, every metadata refresh that
        # misses a topic (librdkafka; kafka-python for the replica path): what they say reaches the
        # user once, in the materializer's own warnings (the broker is away / back, the topic is
        # gone) and errors. --debug shows them, repeated lines folded.
        for name in ("materializer.adapters.kafka_source.librdkafka", "materializer.cli.demo.librdkafka", "kafka"):
            logging.getLogger(name).setLevel(logging.CRITICAL)


class _ClientLogDedup(logging.Filter):
    """Pass a client library's log line (kafka-python's ``kafka.*``, librdkafka's) at most once per
    ``window_s`` seconds per logger and text: a broker that is away for minutes gives a few lines,
    not thousands. The materializer's own lines always pass."""

    _CLIENT_LOGGERS = ("kafka.", "kafka", "materializer.adapters.kafka_source.librdkafka",
                       "materializer.cli.demo.librdkafka")

    def __init__(self, window_s: float = 60.0) -> None:
        super().__init__()
        self.window_s = window_s
        self._last: dict[tuple[str, str], float] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        if not record.name.startswith(self._CLIENT_LOGGERS):
            return True
        key = (record.name, record.getMessage())
        now = record.created
        last = self._last.get(key)
        if last is not None and now - last < self.window_s:
            return False
        if len(self._last) > 10_000:  # bounded: texts carry addresses and offsets
            self._last.clear()
        self._last[key] = now
        return True


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


@click.group(cls=_Group, context_settings={"auto_envvar_prefix": "MATERIALIZER"})
@click.version_option(package_name="kafka-materializer", prog_name="materializer")
@click.option("--debug", is_flag=True, help="Show tracebacks and debug logs (including librdkafka's).")
@click.option("-v", "--verbose", is_flag=True, help="Log progress at INFO level on stderr.")
@click.option("--log-format", type=click.Choice(LOG_FORMATS), default="text", show_default=True,
              envvar="MATERIALIZER_LOG_FORMAT", show_envvar=True,
              help="Log lines on stderr: text (ISO 8601 UTC timestamp first) or json (one object per line: "
                   "ts, level, logger, message, exc_info).")
@click.pass_context
def main(ctx: click.Context, debug: bool, verbose: bool, log_format: str) -> None:
    """Mirror Kafka topics into a local Kafka-format log and materialize key -> latest value in RocksDB.

    Every option can also come from an environment variable MATERIALIZER_<COMMAND>_<OPTION>
    (e.g. MATERIALIZER_RUN_DATA_DIR, MATERIALIZER_RUN_CLEANER_THREADS); --bootstrap-servers also
    reads KAFKA_BOOTSTRAP_SERVERS.
    """
    ctx.ensure_object(dict)
    ctx.obj["debug"] = debug
    _configure_logging(verbose, debug, log_format)


# One module per command group; each command is attached here (the modules never import this one).
from materializer.cli.broker import broker  # noqa: E402
from materializer.cli.compact import compact  # noqa: E402
from materializer.cli.demo import demo  # noqa: E402
from materializer.cli.dump_log import dump_log  # noqa: E402
from materializer.cli.read import export, get  # noqa: E402
from materializer.cli.registry import registry  # noqa: E402
from materializer.cli.restore import restore  # noqa: E402
from materializer.cli.run import CLEANER_LOG_FILE, run  # noqa: E402
from materializer.cli.spark import spark  # noqa: E402

for _command in (run, export, get, demo, broker, registry, restore, compact, spark):
    main.add_command(_command)
main.add_command(dump_log, name="dump-log")
