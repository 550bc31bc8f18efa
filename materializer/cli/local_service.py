"""What ``materializer broker|registry start|stop|status`` share: one local JVM service run detached,
found again through the state file in ``--state-dir``.

A command group module (:mod:`.broker`, :mod:`.registry`) describes its service once with a
:class:`LocalServiceCommands`, whose :meth:`~LocalServiceCommands.group` holds ``stop`` and
``status``; the module adds its own ``start`` command, with the service's options, which calls
:meth:`~LocalServiceCommands.start`. Conventions of all three: ``--state-dir`` defaults to
``.materializer/<group>`` (env ``MATERIALIZER_<GROUP>_DIR``); a
service's address is the only thing printed on stdout (``X=$(materializer broker start)``), every
other line goes to stderr; ``status`` exits 1 when none runs; ``stop`` of none is a no-op; a
provisioning error becomes one ``error:`` line (exit 2, :class:`~.conventions.CommandError`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Generic, TypeVar

import click

from materializer.cli.conventions import CommandError
from materializer.local.jvm_service import JvmService

__all__ = ["LocalServiceCommands"]

S = TypeVar("S", bound=JvmService)
F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class LocalServiceCommands(Generic[S]):
    """The service-independent parts of one local service's command group.

    Attributes:
        service: the service class; ``service.service_name`` names it in messages and its state
            file in ``--state-dir`` records the running one.
        noun: the group's name, and the service in help texts (``"broker"``, ``"registry"``).
        state_dir_holds: what the state dir holds, for ``--state-dir``'s help.
        describe: ``status``'s sentence about the running service.
        address_name: the address in ``status``'s help (``"address"``, ``"URL"``).
        stop_timeout_option: whether ``stop`` takes ``--timeout`` (seconds before SIGKILL).
    """

    service: type[S]
    noun: str
    state_dir_holds: str
    describe: Callable[[S], str]
    address_name: str
    stop_timeout_option: bool = False

    @property
    def default_state_dir(self) -> Path:
        """``--state-dir``'s default: ``.materializer/<noun>`` (relative to the working directory)."""
        return Path(".materializer") / self.noun

    @property
    def state_dir_env_var(self) -> str:
        """The environment variable ``--state-dir`` falls back to: ``MATERIALIZER_<NOUN>_DIR``."""
        return f"MATERIALIZER_{self.noun.upper()}_DIR"

    def group(self, help: str) -> click.Group:
        """The command group named :attr:`noun` with :meth:`stop_command` and :meth:`status_command`."""
        return click.Group(self.noun, help=help, commands=[self.stop_command(), self.status_command()])

    def state_dir_option(self, func: F) -> F:
        """The ``--state-dir DIRECTORY`` option (default, env var, help as configured)."""
        return click.option(
            "--state-dir", type=click.Path(file_okay=False, path_type=Path), default=self.default_state_dir,
            envvar=self.state_dir_env_var, show_default=True, show_envvar=True,
            help=f"Directory holding {self.state_dir_holds}.")(func)

    def running(self, state_dir: Path) -> S | None:
        """The service recorded in ``state_dir`` when its JVM is alive and answers, else None."""
        try:
            found = self.service.attach(state_dir)
        except self.service.provisioning_error:
            return None
        return found if found.is_running() else None

    def start(self, state_dir: Path, launch: Callable[[], S], started: Callable[[S], str]) -> None:
        """The body of a ``start`` command: print the address of the one already running in
        ``state_dir``, else ``launch()`` one (detached), report ``started(service)`` on stderr and
        print its address.

        Raises:
            CommandError: ``launch`` raised the service's provisioning error or a ValueError.
        """
        already = self.running(state_dir)
        if already is not None:
            click.echo(f"{self.service.service_name} already running (pid {already.pid}) in {state_dir}", err=True)
            click.echo(already.address)
            return
        try:
            service = launch()
        except (self.service.provisioning_error, ValueError) as exc:
            raise CommandError(str(exc)) from exc
        click.echo(started(service), err=True)
        click.echo(service.address)

    def stop_command(self) -> click.Command:
        """``stop [--state-dir DIR] [--timeout S]``: SIGTERM, then SIGKILL, the service recorded in the
        state dir; a no-op when none is recorded. ``--timeout`` (seconds before SIGKILL, default 30)
        only with :attr:`stop_timeout_option`."""
        name = self.service.service_name

        @click.command("stop", help=f"Stop the {self.noun} recorded in the state dir (no-op when none is running).")
        @self.state_dir_option
        def stop(state_dir: Path, timeout_s: float = 30.0) -> None:
            if self.service.read_state(state_dir) is None:
                click.echo(f"no {name} running in {state_dir}", err=True)
                return
            try:
                self.service(state_dir).stop(timeout_s=timeout_s)  # stop() finds the pid in the state file
            except self.service.provisioning_error as exc:
                raise CommandError(str(exc)) from exc
            click.echo(f"{name} in {state_dir} stopped", err=True)

        if self.stop_timeout_option:
            click.option("--timeout", "timeout_s", type=float, default=30.0, show_default=True,
                         help="Seconds to wait after SIGTERM before SIGKILL.")(stop)
        return stop

    def status_command(self) -> click.Command:
        """``status [--state-dir DIR] [--json]``: :attr:`describe` of the running service (or the
        state file, with ``--json``) on stdout; exit 1 when none is running."""
        name = self.service.service_name

        @click.command("status", help=f"Print the running {self.noun}'s {self.address_name}; exit 1 when none is running.")
        @self.state_dir_option
        @click.option("--json", "as_json", is_flag=True, help=f"Print {self.service.state_file} instead of a sentence.")
        def status(state_dir: Path, as_json: bool) -> None:
            running = self.running(state_dir)
            if running is None:
                click.echo(f"no {name} running in {state_dir}", err=True)
                raise SystemExit(1)
            if as_json:
                click.echo(json.dumps(self.service.read_state(state_dir), indent=2))
            else:
                click.echo(self.describe(running))

        return status
