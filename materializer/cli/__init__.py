"""The ``materializer`` command line (console script; a thin layer over the Python API).

Commands::

    materializer run --bootstrap-servers HOST:PORT --topic TOPIC --data-dir DIR [--until-caught-up]
    materializer export --data-dir DIR --topic TOPIC          JSON Lines, one object per live key
    materializer get --data-dir DIR --topic TOPIC KEY...      the value; several keys or - (stdin):
                                                              JSON Lines; exit 1 when one is absent
        (run/get/export: --key-format/--value-format bytes|str|json|avro, --schema-registry-url URL)
    materializer demo [--data-dir DIR]                        end-to-end sample on a local broker
    materializer broker start|stop|status                     a local Apache Kafka broker
    materializer registry start|stop|status                   a local Schema Registry (Apicurio)
    materializer dump-log PATH                                Kafka DumpLogSegments-style dump
    materializer restore ... / compact ...                    offline restore; Kafka LogCleaner compaction
    materializer spark snapshot|compact|materialize           the same jobs on a Spark cluster

Exit status: 0 success (``--help``, ``--version`` too); 1 ``get`` found no such key, ``broker|registry
status`` found none running; 2 usage error or failure (a refusal included: a data dir another
process writes, an incomplete topic); 130 Ctrl-C (SIGINT; ``run`` after finishing its batch and
printing its summary); 143 SIGTERM in ``restore``/``compact``/``spark compact``
(:mod:`materializer.interrupts`; ``run`` stops cleanly on SIGTERM and exits 0). Every error, usage
errors included, and every interruption is printed as ONE ``error: ...`` line on stderr (``--debug``
shows the traceback). Global options (``--debug``, ``-v``, ``--log-format``) go before or after the
command; every option also reads ``MATERIALIZER_<COMMAND>_<OPTION>``
(:mod:`materializer.cli.conventions`). The Kafka clients' log lines are folded
(:mod:`materializer.cli.log_setup`). ``-h`` is ``--help`` everywhere. Each command's module is imported
when the command is looked up (:mod:`materializer.cli.lazy_commands`), so ``--version``, ``--help``
and ``get`` start without the Kafka clients or the log engine.
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Any

import click

from materializer.cli.conventions import (
    GLOBAL_SETTINGS,
    HELP_OPTION_NAMES,
    apply_conventions,
    global_options,
    usage_error_line,
)
from materializer.cli.lazy_commands import CommandSpec, LazyCommands, format_sections
from materializer.cli.options import EXIT_ABSENT, EXIT_FAILURE
from materializer.interrupts import exit_status

__all__ = ["CLEANER_LOG_FILE", "COMMAND_SECTIONS", "EXIT_ABSENT", "EXIT_FAILURE", "main"]

#: Every command: ``materializer --help``'s sections in order, each command's module, attribute and
#: one-line summary (what the help lists, without importing the command's module: ``--help``,
#: ``--version`` and ``get`` load only what they use; ``run``'s module alone loads the Kafka
#: clients, RocksDB and the log engine).
COMMAND_SECTIONS: dict[str, dict[str, CommandSpec]] = {
    "Main commands": {
        "run": ("materializer.cli.run", "run", "Consume topics into a data dir's local log and state store."),
        "get": ("materializer.cli.read", "get", "Print the latest value of one or more keys."),
        "export": ("materializer.cli.read", "export", "Print every live key and its value as JSON Lines."),
        "demo": ("materializer.cli.demo", "demo", "Run an end-to-end sample on a local broker."),
    },
    "Other commands": {
        "broker": ("materializer.cli.broker", "broker", "Start, stop or show a local Apache Kafka broker."),
        "registry": ("materializer.cli.registry", "registry", "Start, stop or show a local Schema Registry."),
        "restore": ("materializer.cli.restore", "restore", "Restore a topic from a broker's log dir, offline."),
        "compact": ("materializer.cli.compact", "compact", "Run one Kafka log-cleaner round on a topic's local log."),
        "dump-log": ("materializer.cli.dump_log", "dump_log", "Print a .log file's batches and records."),
        "spark": ("materializer.cli.spark", "spark", "Run the snapshot, compaction and materialize jobs on Spark."),
    },
}


def _expected_errors() -> tuple[type[BaseException], ...]:
    """The failures a command reports as one ``error:`` line (imported when one propagates, not at start)."""
    from materializer.adapters.errors import AdapterError
    from materializer.metrics import MetricsUnavailableError
    from materializer.storage.errors import StorageError

    return AdapterError, StorageError, ValueError, OSError, MetricsUnavailableError


def _flush_repeats() -> None:
    from materializer.cli.log_setup import flush_repeats

    flush_repeats()


def _interrupted_line(status: int, notes: str = "") -> str:
    return f"error: interrupted ({signal.Signals(status - 128).name}){'; ' + notes if notes else ''}"


class _Group(click.Group):
    """Turns expected failures into one ``error: ...`` line on stderr and exit status 2, usage errors
    and :class:`click.ClickException` too (instead of click's ``Usage:``/``Error:`` lines, exit 1 or
    2), and Ctrl-C / SIGTERM into one line and 130 / 143 (instead of click's ``Aborted!`` and 1),
    also while the command line is parsed or a prompt waits."""

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        """Run the command line, as :meth:`click.Group.main`, with the errors on one line each.

        Exit status (standalone): the command's, 0 after ``--help``/``--version``, 2 after an error,
        130/143 after an interruption. With ``standalone_mode=False`` click's own behaviour is kept
        (exceptions raised to the caller).
        """
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        try:
            status = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except click.exceptions.NoArgsIsHelpError as exc:  # `materializer` alone: the help, as click prints it
            exc.show()
            sys.exit(EXIT_FAILURE)
        except click.UsageError as exc:
            _flush_repeats()
            click.echo(usage_error_line(exc), err=True)
            sys.exit(EXIT_FAILURE)
        except click.ClickException as exc:
            _flush_repeats()
            click.echo(f"error: {' '.join(exc.format_message().split())}", err=True)
            sys.exit(EXIT_FAILURE)
        except click.Abort as exc:  # a prompt interrupted (click turns Ctrl-C / Ctrl-D there into Abort)
            interrupt = exc.__cause__ if isinstance(exc.__cause__, KeyboardInterrupt) else KeyboardInterrupt()
            click.echo(_interrupted_line(exit_status(interrupt)), err=True)
            sys.exit(exit_status(interrupt))
        sys.exit(status if isinstance(status, int) else 0)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """The commands by section (:data:`COMMAND_SECTIONS`), each with its one-line summary, none imported."""
        if isinstance(self.commands, LazyCommands):
            format_sections(self.commands, COMMAND_SECTIONS, formatter)
        else:
            super().format_commands(ctx, formatter)

    def make_context(self, info_name, args, parent=None, **extra):
        try:
            return super().make_context(info_name, args, parent=parent, **extra)
        except KeyboardInterrupt as exc:  # while the command line is parsed, before invoke
            status = exit_status(exc)
            click.echo(_interrupted_line(status), err=True)
            raise click.exceptions.Exit(status) from exc

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except BrokenPipeError:  # `materializer export | head`: the reader left; not an error
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            ctx.exit(0)
        except _expected_errors() as exc:
            if ctx.obj and ctx.obj.get("debug"):
                raise
            _flush_repeats()
            message = " ".join(str(exc).split()) or type(exc).__name__
            click.echo(f"error: {message}", err=True)
            ctx.exit(EXIT_FAILURE)
        except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM in a command that writes (materializer.interrupts)
            if ctx.obj and ctx.obj.get("debug"):
                raise
            _flush_repeats()
            status = exit_status(exc)
            notes = " ".join(" ".join(note.split()) for note in getattr(exc, "__notes__", ()))
            click.echo(_interrupted_line(status, notes), err=True)
            ctx.exit(status)


def _configure_logging(verbose: bool, debug: bool, log_format: str = "text") -> None:
    """:func:`materializer.cli.log_setup.configure_logging` (looked up here at each call, so tests can
    replace it)."""
    from materializer.cli.log_setup import configure_logging

    configure_logging(verbose, debug, log_format)


def _before_command(ctx: click.Context) -> None:
    """Configure logging from the global options given anywhere on the command line, once, just
    before the command's own callback runs."""
    settings = {**GLOBAL_SETTINGS, **(ctx.find_root().obj or {})}
    _configure_logging(settings["verbose"], settings["debug"], settings["log_format"])


@click.group(cls=_Group, params=global_options(root=True), context_settings={"help_option_names": HELP_OPTION_NAMES})
@click.version_option(package_name="kafka-materializer", prog_name="materializer")
@click.pass_context
def main(ctx: click.Context) -> None:
    """Mirror Kafka topics into a local Kafka-format log and materialize key -> latest value in RocksDB.

    --debug, -v and --log-format may also be given after the command (run ... -v). Every option
    can also come from an environment variable MATERIALIZER_<COMMAND>_<OPTION> (e.g.
    MATERIALIZER_RUN_DATA_DIR); a command in a group reads MATERIALIZER_<GROUP>_<COMMAND>_<OPTION>,
    then MATERIALIZER_<GROUP>_<OPTION> (e.g. MATERIALIZER_BROKER_START_STATE_DIR, then
    MATERIALIZER_BROKER_STATE_DIR). Each command's --help lists its names.
    --bootstrap-servers also reads KAFKA_BOOTSTRAP_SERVERS.
    """
    ctx.ensure_object(dict)


def _prepared(name: str, command: click.Command) -> click.Command:
    """A command just imported, given the conventions (:func:`~materializer.cli.conventions.apply_conventions`)."""
    apply_conventions(command, (name,), _before_command)
    return command


# One module per command group, imported when its command is looked up (the modules never import this one).
main.commands = LazyCommands({name: spec for specs in COMMAND_SECTIONS.values() for name, spec in specs.items()},
                             _prepared)


def __getattr__(name: str) -> Any:
    if name == "CLEANER_LOG_FILE":  # `run`'s, without importing `run` before it is needed
        from materializer.cli.run import CLEANER_LOG_FILE

        return CLEANER_LOG_FILE
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
