"""Decoding stored keys and values for display: raw bytes, UTF-8 text, JSON, and the export rule.

The state store keeps keys and values as the exact bytes the producer wrote; nothing is
deserialized on the way in. This module only turns bytes into something a terminal or a JSON
Lines consumer can show:

* :func:`text_or_base64` -- the export rule: a field that is valid UTF-8 is given as text under
  its own name (``"key"``, ``"value"``), otherwise as standard base64 (RFC 4648, with padding)
  under ``"<name>_b64"`` (``"key_b64"``, ``"value_b64"``).
* :func:`decode_for_display` -- ``bytes`` / ``str`` / ``json`` / ``auto`` formats for ``materializer get``.
* :func:`parse_key` -- a key typed on the command line (``utf8``, ``base64`` or ``hex``) to bytes.

Avro / Schema Registry decoding belongs in its own adapter later.
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Literal

__all__ = [
    "DISPLAY_FORMATS",
    "KEY_ENCODINGS",
    "DisplayFormat",
    "KeyEncoding",
    "decode_for_display",
    "parse_key",
    "text_or_base64",
]

DisplayFormat = Literal["auto", "bytes", "str", "json"]
KeyEncoding = Literal["utf8", "base64", "hex"]
DISPLAY_FORMATS: tuple[str, ...] = ("auto", "bytes", "str", "json")
KEY_ENCODINGS: tuple[str, ...] = ("utf8", "base64", "hex")


def text_or_base64(name: str, data: bytes) -> dict[str, str]:
    """Return ``{name: text}`` when ``data`` is valid UTF-8, else ``{name + "_b64": base64}``.

    >>> text_or_base64("key", b"p-1")
    {'key': 'p-1'}
    >>> text_or_base64("value", b"\\xff")
    {'value_b64': '/w=='}
    """
    try:
        return {name: bytes(data).decode("utf-8")}
    except UnicodeDecodeError:
        return {f"{name}_b64": base64.b64encode(data).decode("ascii")}


def decode_for_display(data: bytes, fmt: str = "auto") -> str | bytes:
    """Decode ``data`` for printing.

    Formats:
        ``bytes``: returned unchanged (the caller writes them to a binary stream).
        ``str``: strict UTF-8 text.
        ``json``: UTF-8 JSON, re-indented with 2 spaces.
        ``auto``: UTF-8 text as stored, else standard base64 prefixed with ``base64:``.

    Raises:
        ValueError: ``data`` is not valid for the requested format, or ``fmt`` is unknown.
    """
    if fmt == "bytes":
        return bytes(data)
    if fmt == "str":
        try:
            return bytes(data).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ValueError(f"value is not valid UTF-8 (byte {exc.start}); use --format bytes or auto") from exc
    if fmt == "json":
        try:
            return json.dumps(json.loads(bytes(data)), indent=2, ensure_ascii=False)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ValueError(f"value is not UTF-8 JSON: {exc}") from exc
    if fmt == "auto":
        try:
            return bytes(data).decode("utf-8")
        except UnicodeDecodeError:
            return "base64:" + base64.b64encode(data).decode("ascii")
    raise ValueError(f"unknown display format {fmt!r}; expected one of {', '.join(DISPLAY_FORMATS)}")


def parse_key(text: str, encoding: str = "utf8") -> bytes:
    """Turn a key typed by a user into the stored key bytes.

    Raises:
        ValueError: ``text`` is not valid in ``encoding`` or ``encoding`` is unknown.
    """
    if encoding == "utf8":
        return text.encode("utf-8")
    if encoding == "base64":
        try:
            return base64.b64decode(text, validate=True)
        except binascii.Error as exc:
            raise ValueError(f"key is not valid base64: {exc}") from exc
    if encoding == "hex":
        try:
            return bytes.fromhex(text)
        except ValueError as exc:
            raise ValueError(f"key is not valid hex: {exc}") from exc
    raise ValueError(f"unknown key encoding {encoding!r}; expected one of {', '.join(KEY_ENCODINGS)}")
