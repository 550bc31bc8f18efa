"""Options, settings and exit statuses shared by the command groups."""

from __future__ import annotations

from pathlib import Path

import click

__all__ = ["EXIT_ABSENT", "EXIT_FAILURE", "client_config", "data_dir_option", "key_value_items", "progress_option", "topic_option"]

EXIT_ABSENT = 1  # `materializer get`: no such key
EXIT_FAILURE = 2  # usage error, failure or refusal (one `error: ...` line on stderr)

data_dir_option = click.option(
    "--data-dir", required=True, type=click.Path(file_okay=False, path_type=Path),
    help="Data directory: <topic>-<partition>/ log folders, state/<topic>/ RocksDB, checkpoints.")
topic_option = click.option("--topic", required=True, help="Kafka topic name.")

progress_option = click.option(
    "--progress/--no-progress", default=None, help="Progress bar on stderr [default: only on a terminal].")


def client_config(items: tuple[str, ...], command_config: Path | None) -> dict[str, str]:
    """librdkafka settings from ``--command-config`` (Java properties: ``key=value`` or ``key: value``
    lines, ``#``/``!`` comments) and ``-X key=value`` items, which win, as kcat and Kafka's tools take them.

    Raises:
        ValueError: an item or line without a key and ``=`` (the file and line are named).
    """
    config: dict[str, str] = {}
    if command_config is not None:
        for number, raw in enumerate(command_config.read_text(encoding="utf-8").splitlines(), start=1):
            line = raw.strip()
            if not line or line[0] in "#!":
                continue
            separator = min((i for i in (line.find("="), line.find(":")) if i > 0), default=-1)
            if separator < 0:
                raise ValueError(f"{command_config} line {number}: {raw!r} is not key=value")
            config[line[:separator].strip()] = line[separator + 1:].strip()
    config.update(key_value_items(items, "-X"))
    return config


def key_value_items(items: tuple[str, ...], flag: str) -> dict[str, str]:
    """``key=value`` items of a repeatable option (``-X``, ``-S``), stripped, later ones winning.

    Raises:
        ValueError: an item without a key and ``=`` (the option ``flag`` is named).
    """
    config: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"{flag} {item!r} is not key=value")
        config[key.strip()] = value.strip()
    return config
