"""Options, settings and exit statuses shared by the command groups."""

from __future__ import annotations

from pathlib import Path

import click

__all__ = ["EXIT_ABSENT", "EXIT_FAILURE", "client_config", "data_dir_option", "key_value_items", "progress_option",
           "read_properties", "topic_option"]

EXIT_ABSENT = 1  # `materializer get`: no such key
EXIT_FAILURE = 2  # usage error, failure or refusal (one `error: ...` line on stderr)

data_dir_option = click.option(
    "--data-dir", required=True, type=click.Path(file_okay=False, path_type=Path),
    help="Data directory: <topic>-<partition>/ log folders, state/<topic>/ RocksDB, checkpoints.")
topic_option = click.option("--topic", required=True, help="Kafka topic name.")

progress_option = click.option(
    "--progress/--no-progress", default=None, help="Progress bar on stderr [default: only on a terminal].")


def client_config(items: tuple[str, ...], command_config: Path | None) -> dict[str, str]:
    """librdkafka settings from ``--command-config`` (:func:`read_properties`) and ``-X key=value``
    items, which win, as kcat and Kafka's tools take them.

    Raises:
        ValueError: an item without a key and ``=``; a file that cannot be parsed (file and line named).
    """
    config: dict[str, str] = {}
    if command_config is not None:
        config.update(read_properties(command_config))
    config.update(key_value_items(items, "-X"))
    return config


def read_properties(path: Path) -> dict[str, str]:
    """The settings of a Java ``.properties`` file, as ``java.util.Properties.load`` reads it (Kafka's
    ``Utils.loadProps``, behind every tool's ``--command-config``): ``key=value``, ``key: value`` or
    ``key value`` lines; ``#`` and ``!`` comments; a line ending in an odd number of backslashes
    continues on the next (its leading whitespace dropped); ``\\t``, ``\\n``, ``\\uXXXX``, ``\\=``,
    ``\\:``, ``\\ `` and ``\\\\`` escapes; a key alone has the empty value; a later key wins. The
    values are stripped of surrounding whitespace, as Kafka's ``ConfigDef.parseType`` trims a
    string setting. Parsed by ``jproperties``; the file is read as UTF-8 (Java reads ISO-8859-1: the
    same for ASCII and ``\\uXXXX`` escapes, a non-UTF-8 file is refused rather than guessed).

    Raises:
        ValueError: the file is not UTF-8, or has a malformed escape (the file and where are named).
        OSError: the file cannot be read.
    """
    from jproperties import ParseError, Properties

    properties = Properties()
    try:
        with path.open("rb") as stream:
            properties.load(stream, encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path}: not UTF-8 text ({exc.reason}; write other characters as \\uXXXX)") from exc
    except ParseError as exc:
        raise ValueError(f"{path} line {exc.line_number}: {exc.message}") from exc
    return {key: value.strip() for key, value in properties.properties.items()}


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
