"""``materializer registry start|stop|status``: a detached local Schema Registry for development and the examples.

The registry is :class:`~materializer.local.schema_registry.LocalSchemaRegistry` (Apicurio
Registry from Maven Central, Confluent-compatible API, in-memory storage, loopback only); its state
lives in ``--state-dir`` (default ``./.materializer/registry``, env ``MATERIALIZER_REGISTRY_DIR``) and
``registry.json`` there records ``{pid, url, port, version}``. ``start`` prints only the URL on stdout
(``SCHEMA_REGISTRY_URL=$(materializer registry start)``); ``status`` exits 1 when none is running
(see :mod:`.local_service`).
"""

from __future__ import annotations

from pathlib import Path

import click

from materializer.cli.local_service import LocalServiceCommands
from materializer.local.schema_registry import LocalSchemaRegistry

__all__ = ["registry"]

_COMMANDS = LocalServiceCommands(
    LocalSchemaRegistry, "registry", "the registry's log (registry.out) and registry.json", address_name="URL",
    describe=lambda running: f"running: pid {running.pid}, url {running.url}, Apicurio Registry {running.version}")
registry = _COMMANDS.group(
    help="Run a real Schema Registry (Apicurio, Confluent-compatible API) on 127.0.0.1 from Maven Central.")


@registry.command()
@_COMMANDS.state_dir_option
@click.option("--port", type=click.IntRange(min=0, max=65535), default=0, help="HTTP port [default: a free one].")
@click.option("--timeout", "timeout_s", type=float, default=120.0, show_default=True,
              help="Seconds to wait for the registry to answer.")
def start(state_dir: Path, port: int, timeout_s: float) -> None:
    """Start the registry in the background and print its URL (first run: downloads 109 MB with Maven)."""
    _COMMANDS.start(
        state_dir,
        lambda: LocalSchemaRegistry(state_dir, port=port).start(timeout_s=timeout_s, detach=True),
        lambda local: f"Apicurio Registry {local.version} started in {local.startup_s:.1f} s (pid {local.pid}); "
                      f"log {local.state_dir / 'registry.out'}")
