"""What the query server reads from a request and writes into its answers: keys as bytes, values
as JSON by the topic's value format, scan cursors, and the documented bounds.

Pure functions: no I/O, no Starlette (the unit tests hold them to their contracts).

Keys are the record keys' exact bytes (the store keeps what the producer wrote, whatever the key
format): a path segment is percent-decoded to bytes (RFC 3986 §2.1; ``/`` is ``%2F`` and ``%`` is
``%25`` inside one segment), and ``key_encoding=base64`` takes the decoded text as standard base64
(RFC 4648 §4) of the bytes, for keys that are not UTF-8 text.

Values are decoded by the topic's value format (:mod:`materializer.adapters.serdes`) and made JSON:
``str`` a JSON string, ``json`` the document itself, ``avro`` the datum decoded through the
Schema Registry (bytes as base64, decimals and UUIDs as text, dates and times as ISO 8601),
``bytes`` standard base64.
"""

from __future__ import annotations

import base64
import binascii
import struct
from typing import Any
from urllib.parse import unquote, unquote_to_bytes

from materializer.adapters.serdes import to_json_compatible
from materializer.deletions import Deletion

__all__ = ["MAX_BATCH_KEYS", "MAX_BODY_BYTES", "MAX_KEY_BYTES", "MAX_SCAN_LIMIT", "DEFAULT_SCAN_LIMIT",
           "KEY_ENCODINGS", "BadRequest", "absent", "decode_cursor", "encode_cursor", "json_value", "key_bytes",
           "key_from_raw_path", "key_text", "prefix_end"]

#: The largest key a request may name, bytes after decoding (413 above it).
MAX_KEY_BYTES = 16 * 1024
#: The most keys one ``keys:batch`` request may ask for (413 above it).
MAX_BATCH_KEYS = 1000
#: The largest ``keys:batch`` request body, bytes (413 above it).
MAX_BODY_BYTES = 1024 * 1024
#: Entries one scan page returns when ``limit`` is not given, and the most it may ask for (400 above it).
DEFAULT_SCAN_LIMIT = 100
MAX_SCAN_LIMIT = 1000
#: The values of the ``key_encoding`` query parameter.
KEY_ENCODINGS = ("utf8", "base64")

_CURSOR = struct.Struct(">BI")  # version, partition of the last entry returned; its key follows
_CURSOR_VERSION = 1


class BadRequest(ValueError):
    """A request the server refuses with a 4xx status and a one-line JSON error.

    Attributes:
        status: 400 (malformed) or 413 (over a documented bound).
    """

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


def key_from_raw_path(raw_path: bytes, matched: str | None = None) -> bytes:
    """The key bytes of ``.../keys/{key}`` from the request's undecoded path (ASGI ``raw_path``): its
    last segment, percent-decoded, so ``%2F`` in a key stays inside it. ``matched``: the key as the
    router matched it in the decoded path; a key with an unencoded ``/`` (several raw segments)
    differs from the last segment and is refused rather than read as its last part.

    Raises:
        BadRequest: a ``%`` not followed by two hex digits, or an unencoded ``/`` in the key.
    """
    segment = raw_path.rsplit(b"/", 1)[-1]
    for at in range(len(segment)):
        if segment[at] == 0x25 and not _hex2(segment[at + 1:at + 3]):
            raise BadRequest(f"the key's percent-encoding is malformed at byte {at} (RFC 3986 §2.1: '%' then two "
                             "hex digits; '%25' is a literal '%')")
    if matched is not None and unquote(segment.decode("ascii", "replace")) != matched:
        raise BadRequest("a key is one path segment: percent-encode '/' in it as %2F")
    return unquote_to_bytes(segment)


def _hex2(pair: bytes) -> bool:
    return len(pair) == 2 and all(c in b"0123456789abcdefABCDEF" for c in pair)


def key_bytes(text: str | bytes, encoding: str) -> bytes:
    """A key given in a request as the stored bytes: ``utf8`` (the bytes as given, a ``str``
    encoded as UTF-8) or ``base64`` (standard alphabet, padded).

    Raises:
        BadRequest: an unknown encoding, text with a lone surrogate (no UTF-8 bytes), base64 that
            does not decode, or a key over :data:`MAX_KEY_BYTES` (413).
    """
    try:
        raw = text.encode("utf-8") if isinstance(text, str) else text
    except UnicodeEncodeError as exc:  # a lone surrogate, e.g. JSON "\ud800": no UTF-8 bytes
        raise BadRequest(f"the key is not Unicode text (it holds a lone surrogate): {exc}") from exc
    if encoding == "base64":
        try:
            raw = base64.b64decode(raw, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise BadRequest(f"the key is not valid base64 (key_encoding=base64): {exc}") from exc
    elif encoding != "utf8":
        raise BadRequest(f"unknown key_encoding {encoding!r}: one of {', '.join(KEY_ENCODINGS)}")
    if len(raw) > MAX_KEY_BYTES:
        raise BadRequest(f"the key has {len(raw)} bytes, more than the {MAX_KEY_BYTES} allowed", 413)
    return raw


def key_text(key: bytes, encoding: str) -> str:
    """A key in an answer, as the request gave it: UTF-8 text (``utf8``; bytes that are not UTF-8
    come as base64 with a ``base64:`` prefix) or base64."""
    if encoding == "utf8":
        try:
            return key.decode("utf-8")
        except UnicodeDecodeError:
            return "base64:" + base64.b64encode(key).decode("ascii")
    return base64.b64encode(key).decode("ascii")


def absent(topic: str, key: str, deletion: Deletion | None) -> dict[str, Any]:
    """The 404 body of a key the topic holds no live value for (``key`` as :func:`key_text` gives it):
    ``error``, ``topic``, ``key``, ``"absent": true`` and, when the local log still shows the
    key's tombstone (:meth:`MaterializedView.deletion <materializer.view.MaterializedView.deletion>`),
    ``deleted``: its ``partition``, ``offset`` and ``timestamp`` (ms; null: none). A batch answer
    carries the same fields and ``"status": 404``."""
    body: dict[str, Any] = {"error": f"topic {topic!r} holds no live value for key {key!r}", "topic": topic,
                            "key": key, "absent": True}
    if deletion is not None:
        timestamp = deletion.timestamp if deletion.timestamp >= 0 else None  # -1: NO_TIMESTAMP
        body["deleted"] = {"partition": deletion.partition, "offset": deletion.offset, "timestamp": timestamp}
        body["error"] += (f": deleted by the tombstone at offset {deletion.offset} of partition {deletion.partition}"
                          + ("" if timestamp is None else f" (timestamp {timestamp})"))
    return body


def json_value(value: Any, fmt: str) -> Any:
    """``value`` decoded by value format ``fmt`` as JSON (module docstring; an Avro datum through
    :func:`~materializer.adapters.serdes.to_json_compatible`, as ``export`` and ``get`` print it)."""
    if fmt == "bytes":
        return base64.b64encode(bytes(value)).decode("ascii")
    if fmt == "avro":
        return to_json_compatible(value)
    return value  # str: the text; json: the document as parsed


def prefix_end(prefix: bytes) -> bytes | None:
    """The smallest key above every key starting with ``prefix`` (None: none, the prefix is all 0xff)."""
    trimmed = prefix.rstrip(b"\xff")
    if not trimmed:
        return None
    return trimmed[:-1] + bytes([trimmed[-1] + 1])


def encode_cursor(key: bytes, partition: int) -> str:
    """An opaque cursor for the entry after (``key``, ``partition``) in scan order (key bytes, then
    partition): URL-safe base64 without padding."""
    return base64.urlsafe_b64encode(_CURSOR.pack(_CURSOR_VERSION, partition) + key).rstrip(b"=").decode("ascii")


def decode_cursor(cursor: str) -> tuple[bytes, int]:
    """The (key, partition) a cursor from :func:`encode_cursor` resumes after.

    Raises:
        BadRequest: not a cursor this server made.
    """
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        version, partition = _CURSOR.unpack_from(raw)
    except (binascii.Error, ValueError, struct.error) as exc:
        raise BadRequest(f"the cursor is not one this server returned ({exc})") from exc
    if version != _CURSOR_VERSION:
        raise BadRequest(f"the cursor is not one this server returned (version {version})")
    return raw[_CURSOR.size:], partition
