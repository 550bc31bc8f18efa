"""``materializer registry start|stop|status``: a detached local Schema Registry for development and the examples.

The registry is :class:`~materializer.local.schema_registry.LocalSchemaRegistry` (Apicurio
Registry from Maven Central, Confluent-compatible API, in-memory storage, loopback only); its state
lives in ``--state-dir`` (default ``./.materializer/registry``, env ``MATERIALIZER_REGISTRY_DIR``) and
``registry.json`` there records ``{pid, url, port, version}``. ``start`` prints only the URL on stdout
(``SCHEMA_REGISTRY_URL=$(materializer registry start)``); ``status`` exits 1 when none is running.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

import click

from materializer.adapters.errors import SchemaRegistryProvisioningError
from materializer.local.schema_registry import LocalSchemaRegistry

__all__ = ["registry", "DEFAULT_STATE_DIR", "STATE_DIR_ENV_VAR"]

DEFAULT_STATE_DIR = Path(".materializer") / "registry"
STATE_DIR_ENV_VAR = "MATERIALIZER_REGISTRY_DIR"


def _state_dir_option(func: Callable[..., Any]) -> Callable[..., Any]:
    return click.option(
        "--state-dir", type=click.Path(file_okay=False, path_type=Path), default=DEFAULT_STATE_DIR,
        envvar=STATE_DIR_ENV_VAR, show_default=True, show_envvar=True,
        help="Directory holding the registry's log (registry.out) and registry.json.")(func)


def _running(state_dir: Path) -> LocalSchemaRegistry | None:
    try:
        registry = LocalSchemaRegistry.attach(state_dir)
    except SchemaRegistryProvisioningError:
        return None
    return registry if registry.is_running() else None


@click.group()
def registry() -> None:
    """Run a real Schema Registry (Apicurio, Confluent-compatible API) on 127.0.0.1 from Maven Central."""


@registry.command()
@_state_dir_option
@click.option("--port", type=click.IntRange(min=0, max=65535), default=0, help="HTTP port [default: a free one].")
@click.option("--timeout", "timeout_s", type=float, default=120.0, show_default=True,
              help="Seconds to wait for the registry to answer.")
def start(state_dir: Path, port: int, timeout_s: float) -> None:
    """Start the registry in the background and print its URL (first run: downloads 109 MB with Maven)."""
    already = _running(state_dir)
    if already is not None:
        click.echo(f"schema registry already running (pid {already.pid}) in {state_dir}", err=True)
        click.echo(already.url)
        return
    try:
        local = LocalSchemaRegistry(state_dir, port=port).start(timeout_s=timeout_s, detach=True)
    except SchemaRegistryProvisioningError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(f"Apicurio Registry {local.version} started in {local.startup_s:.1f} s (pid {local.pid}); "
               f"log {local.state_dir / 'registry.out'}", err=True)
    click.echo(local.url)


@registry.command()
@_state_dir_option
def stop(state_dir: Path) -> None:
    """Stop the registry recorded in the state dir (no-op when none is running)."""
    if LocalSchemaRegistry.read_state(state_dir) is None:
        click.echo(f"no schema registry running in {state_dir}", err=True)
        return
    try:
        LocalSchemaRegistry(state_dir).stop()
    except SchemaRegistryProvisioningError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(f"schema registry in {state_dir} stopped", err=True)


@registry.command()
@_state_dir_option
@click.option("--json", "as_json", is_flag=True, help="Print registry.json instead of a sentence.")
def status(state_dir: Path, as_json: bool) -> None:
    """Print the running registry's URL; exit 1 when none is running."""
    running = _running(state_dir)
    if running is None:
        click.echo(f"no schema registry running in {state_dir}", err=True)
        raise SystemExit(1)
    if as_json:
        click.echo(json.dumps(LocalSchemaRegistry.read_state(state_dir), indent=2))
    else:
        click.echo(f"running: pid {running.pid}, url {running.url}, Apicurio Registry {running.version}")
