"""Conventions every ``materializer`` command follows, applied to the whole command tree at once
(:func:`apply_conventions`, as each command is loaded) so a command module cannot forget one.

Global options
    ``--debug``, ``-v/--verbose`` and ``--log-format text|json`` are accepted before the command
    and after it, at any depth (``materializer -v run ...``, ``materializer run ... -v``,
    ``materializer broker start -v``). A flag given anywhere is on; a ``--log-format`` given later
    on the command line wins. Logging is configured once, just before the command runs.

Environment variables
    Every option of a command at path ``P1 ... Pn`` (``run``; ``broker start``) can come from
    ``MATERIALIZER_<P1>_..._<Pn>_<OPTION>``, then from the shorter prefixes down to
    ``MATERIALIZER_<P1>_<OPTION>`` (the group-wide name, shared by every command of the group),
    then from the option's own aliases (``KAFKA_BOOTSTRAP_SERVERS``, ``SCHEMA_REGISTRY_URL``,
    ``MATERIALIZER_BROKER_DIR``); the first one set wins, an option on the command line wins over
    all. ``<OPTION>`` is the option's first long name in upper case with ``-`` as ``_``
    (``--state-dir``: ``STATE_DIR``, ``--timeout``: ``TIMEOUT``), or its letter for a short-only
    option (``-X``: ``X``). Examples: ``run --data-dir``: ``MATERIALIZER_RUN_DATA_DIR``;
    ``broker start --state-dir``: ``MATERIALIZER_BROKER_START_STATE_DIR`` or
    ``MATERIALIZER_BROKER_STATE_DIR``; ``spark snapshot --out``:
    ``MATERIALIZER_SPARK_SNAPSHOT_OUT`` or ``MATERIALIZER_SPARK_OUT``; ``dump-log --json``:
    ``MATERIALIZER_DUMP_LOG_JSON``. A repeatable option takes whitespace-separated items. Each
    command's ``--help`` lists the names. The global options read ``MATERIALIZER_DEBUG``,
    ``MATERIALIZER_VERBOSE`` and ``MATERIALIZER_LOG_FORMAT``.

Errors
    Every error is one ``error: ...`` line on stderr and exit status 2 (:data:`EXIT_FAILURE`):
    usage errors too (``error: no such option '--foo' (see 'materializer run --help')``), and a
    :class:`click.ClickException` raised by a command. Ctrl-C is one ``error: interrupted
    (SIGINT)`` line and 130 (:mod:`materializer.interrupts`). ``--help`` and ``--version`` exit 0.
"""

from __future__ import annotations

import functools
from typing import IO, Any, Callable, Iterator

import click

from materializer.cli.options import EXIT_FAILURE
from materializer.log_format import LOG_FORMATS

__all__ = [
    "CommandError",
    "ENV_PREFIX",
    "GLOBAL_SETTINGS",
    "HELP_OPTION_NAMES",
    "apply_conventions",
    "global_options",
    "option_envvars",
    "usage_error_line",
    "walk_commands",
]

ENV_PREFIX = "MATERIALIZER"

#: ``-h`` is ``--help`` on every command (set on each, so a command invoked on its own has it too).
HELP_OPTION_NAMES = ["-h", "--help"]

#: What the global options record in the root context's ``obj``: name -> value when not given.
GLOBAL_SETTINGS: dict[str, Any] = {"debug": False, "verbose": False, "log_format": "text"}


class CommandError(click.ClickException):
    """A command's failure the user can act on, shown as one ``error: MESSAGE`` line, exit status 2,
    also when the command is invoked outside the ``materializer`` group (its own ``main``)."""

    exit_code = EXIT_FAILURE

    def show(self, file: IO[Any] | None = None) -> None:
        """Print ``error: MESSAGE`` (whitespace folded to one line) on stderr."""
        click.echo(f"error: {' '.join(self.format_message().split())}", err=True)


def usage_error_line(error: click.UsageError) -> str:
    """``error: <click's message, first letter in lower case, on one line> (see '<command path> --help')``."""
    message = " ".join(error.format_message().split()).rstrip(".")
    if message[:1].isupper() and message[1:2].islower():  # "No such option" -> "no such option"; "KEY ..." stays
        message = message[0].lower() + message[1:]
    command_path = error.ctx.command_path if error.ctx is not None else ENV_PREFIX.lower()
    return f"error: {message} (see '{command_path} --help')"


def _remember(ctx: click.Context, param: click.Parameter, value: Any) -> None:
    """Record a global option given on any command of the line in the root context's ``obj``."""
    settings = ctx.find_root().ensure_object(dict)
    for name, default in GLOBAL_SETTINGS.items():
        settings.setdefault(name, default)
    if value is not None and value is not False:
        settings[param.name or ""] = value


def global_options(*, root: bool) -> list[click.Option]:
    """``--debug``, ``-v/--verbose`` and ``--log-format``; the ``root`` copies read the environment
    (``MATERIALIZER_DEBUG``, ``MATERIALIZER_VERBOSE``, ``MATERIALIZER_LOG_FORMAT``), the copies on
    commands do not (one name per setting)."""

    def env(name: str) -> str | None:
        return f"{ENV_PREFIX}_{name}" if root else None

    return [
        click.Option(["--debug"], is_flag=True, default=False, expose_value=False, callback=_remember,
                     envvar=env("DEBUG"), show_envvar=root,
                     help="Show tracebacks and debug logs (including the Kafka clients')."),
        click.Option(["-v", "--verbose"], is_flag=True, default=False, expose_value=False, callback=_remember,
                     envvar=env("VERBOSE"), show_envvar=root,
                     help="Log progress at INFO level on stderr (the Kafka clients' INFO lines too)."),
        click.Option(["--log-format"], type=click.Choice(LOG_FORMATS), default="text" if root else None,
                     show_default=root, expose_value=False, callback=_remember, envvar=env("LOG_FORMAT"),
                     show_envvar=root,
                     help="Log lines on stderr: text (ISO 8601 UTC timestamp first) or json (one object per "
                          "line: ts, level, logger, message, exc_info)."),
    ]


def _option_word(option: click.Option) -> str:
    long_names = [opt for opt in option.opts if opt.startswith("--")]
    word = long_names[0][2:] if long_names else option.opts[0].lstrip("-")
    return word.upper().replace("-", "_")


def option_envvars(path: tuple[str, ...], option: click.Option, aliases: tuple[str, ...] = ()) -> list[str]:
    """The environment variables ``option`` of the command at ``path`` (names below ``materializer``)
    reads, most specific first (the rule in the module docstring), then ``aliases``."""
    word = _option_word(option)
    parts = [name.upper().replace("-", "_") for name in path]
    names = [f"{ENV_PREFIX}_{'_'.join(parts[:depth])}_{word}" for depth in range(len(parts), 0, -1)]
    return names + [alias for alias in aliases if alias not in names]


def walk_commands(group: click.Group, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], click.Command]]:
    """Every command below ``group`` with its path of names, depth first (groups before their commands)."""
    for name, command in sorted(group.commands.items()):
        yield path + (name,), command
        if isinstance(command, click.Group):
            yield from walk_commands(command, path + (name,))


def apply_conventions(command: click.Command, path: tuple[str, ...],
                      before_command: Callable[[click.Context], None]) -> None:
    """Give ``command`` (at ``path``, its names below ``materializer``) and every command below it the
    global options, ``-h`` and the environment variables of the module docstring, and make each leaf
    command call ``before_command(ctx)`` (logging set-up) just before its own callback. Call once
    per command, when it is attached (:class:`~materializer.cli.lazy_commands.LazyCommands` does).

    Raises:
        ValueError: a command already has one of the global options' names (it would shadow them).
    """
    global_names = {opt for option in global_options(root=False) for opt in option.opts}
    below = walk_commands(command, path) if isinstance(command, click.Group) else iter(())
    for where, each in [(path, command), *below]:
        clash = global_names.intersection(opt for param in each.params for opt in param.opts)
        if clash:
            raise ValueError(f"'{' '.join(where)}' has an option named like a global option: {sorted(clash)}")
        for param in each.params:
            if isinstance(param, click.Option) and param.opts:  # (a help section's title option has no name)
                aliases = tuple([param.envvar] if isinstance(param.envvar, str) else param.envvar or ())
                param.envvar = option_envvars(where, param, aliases)
                param.show_envvar = True
        each.params.extend(global_options(root=False))
        each.context_settings = {**each.context_settings, "help_option_names": HELP_OPTION_NAMES}
        # click (>= 8.1.8) keeps the help option it built for the first context that asked: one built
        # before (the command invoked on its own, in a test) would lack -h
        each._help_option = None
        if not isinstance(each, click.Group) and each.callback is not None:
            each.callback = _calling_first(before_command, each.callback)


def _calling_first(before: Callable[[click.Context], None], callback: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(callback)
    def run(*args: Any, **kwargs: Any) -> Any:
        before(click.get_current_context())
        return callback(*args, **kwargs)

    return run
