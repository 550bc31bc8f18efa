"""How a topic's keys and values were declared when it was materialized, kept in the data dir so
``materializer get``/``export`` decode them the same way without being told again.

File (written by every :class:`~materializer.materializer.Materializer` start, under the data dir's
lock, atomically; read by readers without a lock, never written by them)::

    DIR/topic-formats/<topic>.json    {"key_format": "avro", "value_format": "json",
                                       "schema_registry_url": "http://127.0.0.1:8081", "written_by": "run"}

``key_format``/``value_format`` are the run's (``bytes``, ``str``, ``json``, ``avro``);
``schema_registry_url`` is null without one, and never holds credentials (a ``user:password@``
in the URL is left out; ``--schema-registry-basic-auth`` and ``-S`` settings are not recorded).
A data dir written before this file existed simply has none.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import NamedTuple
from urllib.parse import urlsplit, urlunsplit

from materializer.datadir.layout import topic_formats_path
from materializer.storage.files import write_file_atomically

__all__ = ["TopicFormats", "read_topic_formats", "write_topic_formats"]

_FORMATS = ("bytes", "str", "json", "avro")


class TopicFormats(NamedTuple):
    """What the last run of a topic declared: its ``key_format``, ``value_format`` and
    ``schema_registry_url`` (None without one)."""

    key_format: str
    value_format: str
    schema_registry_url: str | None


def _without_credentials(url: str) -> str:
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    host = parts.hostname or ""
    netloc = f"{host}:{parts.port}" if parts.port is not None else host
    return urlunsplit(parts._replace(netloc=netloc))


def write_topic_formats(data_dir: Path | str, topic: str, formats: TopicFormats, *, written_by: str) -> None:
    """Record ``formats`` for ``topic`` (atomic replace; the caller holds the data dir's lock).

    Raises:
        ValueError: a format that is not one of bytes, str, json, avro.
        OSError: the file cannot be written (named in the message).
    """
    for name, value in (("key_format", formats.key_format), ("value_format", formats.value_format)):
        if value not in _FORMATS:
            raise ValueError(f"{name} {value!r} is not one of {', '.join(_FORMATS)}")
    url = _without_credentials(formats.schema_registry_url) if formats.schema_registry_url else None
    path = topic_formats_path(data_dir, topic)
    path.parent.mkdir(parents=True, exist_ok=True)
    document = {"key_format": formats.key_format, "value_format": formats.value_format,
                "schema_registry_url": url, "written_by": written_by}
    write_file_atomically(path, (json.dumps(document, sort_keys=True) + "\n").encode("utf-8"))


def read_topic_formats(data_dir: Path | str, topic: str) -> TopicFormats | None:
    """What the last run of ``topic`` recorded, or None when nothing was (no file). Reads only.

    Raises:
        ValueError: the file is not such a record (its path is named, and the options that make
            reading it unnecessary).
    """
    path = topic_formats_path(data_dir, topic)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    try:
        document = json.loads(raw)
        formats = TopicFormats(document["key_format"], document["value_format"], document.get("schema_registry_url"))
        if formats.key_format not in _FORMATS or formats.value_format not in _FORMATS:
            raise ValueError(f"formats {formats.key_format!r}/{formats.value_format!r}")
        if formats.schema_registry_url is not None and not isinstance(formats.schema_registry_url, str):
            raise ValueError(f"schema_registry_url {formats.schema_registry_url!r}")
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{path} is not a record of the topic's formats ({exc}); give --key-format, "
                         f"--value-format and --schema-registry-url explicitly") from exc
    return formats
