"""``materializer broker start|stop|status``: a detached local Apache Kafka broker for development and the demo.

The broker is :class:`~materializer.local.kafka_broker.LocalKafkaBroker` (official jars, KRaft, loopback);
its state lives in ``--state-dir`` (default ``./.materializer/broker``, env ``MATERIALIZER_BROKER_DIR``) and
``broker.json`` there records ``{pid, bootstrap_servers, log_dirs, version}`` so any later command can
find it. ``start`` prints only the bootstrap address on stdout (``BOOTSTRAP=$(materializer broker start)``);
``status`` exits 1 when no broker is running. Wired into the main CLI with ``main.add_command(broker)``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

import click

from materializer.adapters.errors import BrokerProvisioningError
from materializer.local.kafka_broker import KAFKA_VERSION, TEST_BROKER_CONFIG, LocalKafkaBroker

__all__ = ["broker", "DEFAULT_STATE_DIR", "STATE_DIR_ENV_VAR"]

DEFAULT_STATE_DIR = Path(".materializer") / "broker"
STATE_DIR_ENV_VAR = "MATERIALIZER_BROKER_DIR"


def _state_dir_option(func: Callable[..., Any]) -> Callable[..., Any]:
    return click.option(
        "--state-dir", type=click.Path(file_okay=False, path_type=Path), default=DEFAULT_STATE_DIR,
        envvar=STATE_DIR_ENV_VAR, show_default=True, show_envvar=True,
        help="Directory holding the broker's config, data (log.dirs), logs and broker.json.")(func)


def _running(state_dir: Path) -> LocalKafkaBroker | None:
    try:
        broker = LocalKafkaBroker.attach(state_dir)
    except BrokerProvisioningError:
        return None
    return broker if broker.is_running() else None


@click.group()
def broker() -> None:
    """Run a real single-node Apache Kafka broker (KRaft) on 127.0.0.1 from the official jars."""


@broker.command()
@_state_dir_option
@click.option("--timeout", "timeout_s", type=float, default=90.0, show_default=True,
              help="Seconds to wait for the broker to answer.")
@click.option("--test-config", is_flag=True,
              help="Apply the fast-compaction test settings (log.cleaner.backoff.ms=100, ...).")
@click.option("--config", "-c", "overrides", multiple=True, metavar="KEY=VALUE",
              help="Extra broker property, e.g. -c log.cleaner.threads=2 (repeatable).")
@click.option("--kafka-version", default=KAFKA_VERSION, show_default=True, metavar="X.Y.Z",
              help="Apache Kafka release (jars from Maven Central, resolved once into the cache).")
@click.option("--fast-start", is_flag=True,
              help="Start like the test broker: C1 only, class-data-sharing archive, pre-formatted KRaft dir.")
def start(state_dir: Path, timeout_s: float, test_config: bool, overrides: tuple[str, ...], kafka_version: str,
          fast_start: bool) -> None:
    """Start the broker in the background and print its bootstrap address."""
    extra: dict[str, str] = dict(TEST_BROKER_CONFIG) if test_config else {}
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise click.BadParameter(f"expected KEY=VALUE, got {item!r}", param_hint="--config")
        extra[key.strip()] = value.strip()
    already = _running(state_dir)
    if already is not None:
        click.echo(f"broker already running (pid {already.pid}) in {state_dir}", err=True)
        click.echo(already.bootstrap_servers)
        return
    try:
        local = LocalKafkaBroker(state_dir, version=kafka_version, extra_config=extra, fast_start=fast_start)
        local.start(timeout_s=timeout_s, detach=True)
    except (BrokerProvisioningError, ValueError) as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(f"Apache Kafka {local.version} broker started (pid {local.pid}); log.dirs={local.log_dirs}", err=True)
    click.echo(local.bootstrap_servers)


@broker.command()
@_state_dir_option
@click.option("--timeout", "timeout_s", type=float, default=30.0, show_default=True,
              help="Seconds to wait after SIGTERM before SIGKILL.")
def stop(state_dir: Path, timeout_s: float) -> None:
    """Stop the broker recorded in the state dir (no-op when none is running)."""
    if LocalKafkaBroker.read_state(state_dir) is None:
        click.echo(f"no broker running in {state_dir}", err=True)
        return
    try:
        LocalKafkaBroker(state_dir).stop(timeout_s=timeout_s)
    except BrokerProvisioningError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(f"broker in {state_dir} stopped", err=True)


@broker.command()
@_state_dir_option
@click.option("--json", "as_json", is_flag=True, help="Print broker.json instead of a sentence.")
def status(state_dir: Path, as_json: bool) -> None:
    """Print the running broker's address; exit 1 when none is running."""
    running = _running(state_dir)
    if running is None:
        click.echo(f"no broker running in {state_dir}", err=True)
        raise SystemExit(1)
    if as_json:
        click.echo(json.dumps(LocalKafkaBroker.read_state(state_dir), indent=2))
    else:
        click.echo(f"running: pid {running.pid}, bootstrap {running.bootstrap_servers}, "
                   f"log.dirs {running.log_dirs}, Kafka {running.version}")
