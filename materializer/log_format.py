"""Log line formats of the ``materializer`` command (``--log-format text|json``), stdlib only.

* ``text``: ``2025-01-31T12:00:00.123Z materializer: WARNING materializer.materializer: message``,
  the time in ISO 8601 UTC with milliseconds; a traceback follows on the next lines.
* ``json``: one JSON object per line, ``{"ts": "2025-01-31T12:00:00.123Z", "level": "WARNING",
  "logger": "materializer.materializer", "message": "..."}``, plus ``"exc_info"`` (the formatted
  traceback, one string) and ``"stack_info"`` when the record has them. Newlines inside the
  message or traceback are escaped by JSON, so every line is one object (for log shippers).
"""

from __future__ import annotations

import json
import logging
import time

__all__ = ["LOG_FORMATS", "IsoUtcFormatter", "JsonFormatter", "TEXT_FORMAT", "formatter_for"]

#: The ``--log-format`` choices.
LOG_FORMATS = ("text", "json")

#: Layout of a ``text`` line.
TEXT_FORMAT = "%(asctime)s materializer: %(levelname)s %(name)s: %(message)s"


def _iso_utc(created: float) -> str:
    """``created`` (seconds since the epoch) as ``YYYY-MM-DDTHH:MM:SS.mmmZ``."""
    seconds = int(created)
    millis = int((created - seconds) * 1000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{millis:03d}Z"


class IsoUtcFormatter(logging.Formatter):
    """A :class:`logging.Formatter` whose ``%(asctime)s`` is ISO 8601 UTC with milliseconds
    (``2025-01-31T12:00:00.123Z``) whatever the machine's time zone; ``datefmt`` is ignored."""

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:  # noqa: N802 - stdlib name
        """The record's creation time, ISO 8601 UTC."""
        return _iso_utc(record.created)


class JsonFormatter(logging.Formatter):
    """Formats each record as one line of JSON: ``ts`` (ISO 8601 UTC), ``level``, ``logger``,
    ``message`` (``%`` arguments applied), and ``exc_info`` / ``stack_info`` when present.

    Non-ASCII text is kept as UTF-8 (``ensure_ascii=False``); a message argument that cannot be
    formatted is reported by :mod:`logging` as usual (``--- Logging error ---`` on stderr).
    """

    def format(self, record: logging.LogRecord) -> str:
        """The record as one JSON object, without a trailing newline."""
        entry = {
            "ts": _iso_utc(record.created),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            if not record.exc_text:
                record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            entry["exc_info"] = record.exc_text
        if record.stack_info:
            entry["stack_info"] = self.formatStack(record.stack_info)
        return json.dumps(entry, ensure_ascii=False, default=str)


def formatter_for(log_format: str) -> logging.Formatter:
    """The formatter of a ``--log-format`` choice.

    Raises:
        ValueError: ``log_format`` is not one of :data:`LOG_FORMATS`.
    """
    if log_format == "text":
        return IsoUtcFormatter(TEXT_FORMAT)
    if log_format == "json":
        return JsonFormatter()
    raise ValueError(f"unknown log format {log_format!r}; expected one of {', '.join(LOG_FORMATS)}")
