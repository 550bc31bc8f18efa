"""``materializer broker start|stop|status``: a detached local Apache Kafka broker for development and the demo.

The broker is :class:`~materializer.local.kafka_broker.LocalKafkaBroker` (official jars, KRaft, loopback);
its state lives in ``--state-dir`` (default ``./.materializer/broker``, env ``MATERIALIZER_BROKER_DIR``) and
``broker.json`` there records ``{pid, bootstrap_servers, log_dirs, version}`` so any later command can
find it. ``start`` prints only the bootstrap address on stdout (``BOOTSTRAP=$(materializer broker start)``);
``status`` exits 1 when no broker is running (see :mod:`.local_service`). Wired into the main CLI with
``main.add_command(broker)``.
"""

from __future__ import annotations

from pathlib import Path

import click

from materializer.cli.local_service import LocalServiceCommands
from materializer.local.kafka_broker import KAFKA_VERSION, TEST_BROKER_CONFIG, LocalKafkaBroker

__all__ = ["broker"]

_COMMANDS = LocalServiceCommands(
    LocalKafkaBroker, "broker", "the broker's config, data (log.dirs), logs and broker.json",
    stop_timeout_option=True, address_name="address",
    describe=lambda running: f"running: pid {running.pid}, bootstrap {running.bootstrap_servers}, "
                             f"log.dirs {running.log_dirs}, Kafka {running.version}")
broker = _COMMANDS.group(help="Run a real single-node Apache Kafka broker (KRaft) on 127.0.0.1 from the official jars.")


@broker.command()
@_COMMANDS.state_dir_option
@click.option("--timeout", "timeout_s", type=float, default=90.0, show_default=True,
              help="Seconds to wait for the broker to answer.")
@click.option("--test-config", is_flag=True,
              help="Apply the fast-compaction test settings (log.cleaner.backoff.ms=100, ...).")
@click.option("--config", "-c", "overrides", multiple=True, metavar="KEY=VALUE",
              help="Extra broker property, e.g. -c log.cleaner.threads=2 (repeatable).")
@click.option("--kafka-version", default=None, metavar="X.Y.Z",
              help=f"Apache Kafka release (jars from Maven Central, resolved once into the cache) [default: "
                   f"{KAFKA_VERSION}; with KAFKA_HOME set, the jars of that unpacked Kafka distribution "
                   f"(its libs/) and its version].")
@click.option("--fast-start", is_flag=True,
              help="Start like the test broker: C1 only, class-data-sharing archive, pre-formatted KRaft dir.")
def start(state_dir: Path, timeout_s: float, test_config: bool, overrides: tuple[str, ...], kafka_version: str | None,
          fast_start: bool) -> None:
    """Start the broker in the background and print its bootstrap address."""
    extra: dict[str, str] = dict(TEST_BROKER_CONFIG) if test_config else {}
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise click.BadParameter(f"expected KEY=VALUE, got {item!r}", param_hint="--config")
        extra[key.strip()] = value.strip()
    _COMMANDS.start(
        state_dir,
        lambda: LocalKafkaBroker(state_dir, version=kafka_version, extra_config=extra,
                                 fast_start=fast_start).start(timeout_s=timeout_s, detach=True),
        lambda local: f"Apache Kafka {local.version} broker started (pid {local.pid}); log.dirs={local.log_dirs}")
