"""Decoding stored keys and values for display: raw bytes, UTF-8 text, JSON, and the export rule.

The state store keeps keys and values as the exact bytes the producer wrote; nothing is
deserialized on the way in. This module only turns bytes into something a terminal or a JSON
Lines consumer can show:

* :func:`text_or_base64` -- the export rule: a field that is valid UTF-8 is given as text under
  its own name (``"key"``, ``"value"``), otherwise as standard base64 (RFC 4648, with padding)
  under ``"<name>_b64"`` (``"key_b64"``, ``"value_b64"``).
* :func:`decode_for_display` -- ``bytes`` / ``str`` / ``json`` / ``auto`` formats for ``materializer get``.
* :func:`parse_key` -- a key typed on the command line (``utf8``, ``base64`` or ``hex``) to bytes.
* :class:`Serde` and :func:`make_serde` -- typed reads for services: the formats ``bytes``,
  ``str`` (UTF-8), ``json`` (UTF-8 JSON) and ``avro`` (Confluent wire format through a Schema
  Registry, :mod:`materializer.adapters.avro_serde`). Decoding happens on read; a value that does
  not decode raises :class:`~materializer.adapters.errors.DeserializationError` naming the
  partition and offset.
"""

from __future__ import annotations

import base64
import binascii
import datetime
import decimal
import json
import uuid
from typing import Any, Literal, Mapping

from .serde import Serde

__all__ = [
    "SERDE_FORMATS",
    "Serde",
    "BytesSerde",
    "StrSerde",
    "JsonSerde",
    "make_serde",
    "to_json_compatible",
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
        # Decode as UTF-8 first: json.loads(bytes) guesses UTF-16/32 from the first bytes and then
        # reports a misleading codec error for Avro or other binary values.
        try:
            return json.dumps(json.loads(bytes(data).decode("utf-8")), indent=2, ensure_ascii=False)
        except UnicodeDecodeError as exc:
            raise ValueError(f"value is not UTF-8 JSON: byte {exc.start} is not UTF-8 "
                             f"(Avro in the Confluent wire format? use --value-format avro)") from exc
        except json.JSONDecodeError as exc:
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


SERDE_FORMATS: tuple[str, ...] = ("bytes", "str", "json", "avro")


class BytesSerde(Serde):
    """The stored bytes unchanged (``bytes``)."""

    format = "bytes"


class StrSerde(Serde):
    """Strict UTF-8 text (Kafka's ``StringSerializer``/``StringDeserializer`` default charset)."""

    format = "str"

    def decode(self, data: bytes, partition: int | None = None, offset: int | None = None) -> str:
        try:
            return bytes(data).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise self._error(f"not valid UTF-8 at byte {exc.start}", partition, offset) from exc

    def encode(self, obj: Any) -> bytes:
        if isinstance(obj, str):
            return obj.encode("utf-8")
        return super().encode(obj)


class JsonSerde(Serde):
    """UTF-8 JSON (RFC 8259) parsed with :func:`json.loads`.

    ``encode`` writes compact JSON (``separators=(",", ":")``); a producer that wrote other
    whitespace gets different key bytes, so look JSON keys up with the exact bytes in that case.
    """

    format = "json"

    def decode(self, data: bytes, partition: int | None = None, offset: int | None = None) -> Any:
        try:
            return json.loads(bytes(data).decode("utf-8"))
        except UnicodeDecodeError as exc:
            raise self._error(f"not UTF-8 JSON (byte {exc.start} is not UTF-8)", partition, offset) from exc
        except json.JSONDecodeError as exc:
            raise self._error(f"not UTF-8 JSON ({exc})", partition, offset) from exc

    def encode(self, obj: Any) -> bytes:
        if isinstance(obj, (bytes, bytearray, memoryview)):
            return bytes(obj)
        return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def make_serde(fmt: str, *, topic: str | None = None, field: str = "value",
               schema_registry: Any = None, reader_schema: str | None = None) -> Serde:
    """The serde for ``fmt`` (one of :data:`SERDE_FORMATS`) of ``topic``'s ``field`` (``key``/``value``).

    ``avro`` needs ``schema_registry``: a ``confluent_kafka.schema_registry.SchemaRegistryClient``
    (:func:`materializer.adapters.avro_serde.schema_registry_client` builds one from a URL);
    ``reader_schema`` (Avro schema JSON) projects every writer schema onto one shape.

    Raises:
        ValueError: an unknown format, or ``avro`` without a registry.
    """
    if fmt == "bytes":
        return BytesSerde(topic, field)
    if fmt == "str":
        return StrSerde(topic, field)
    if fmt == "json":
        return JsonSerde(topic, field)
    if fmt == "avro":
        if schema_registry is None:
            raise ValueError(f"the avro {field} format needs a Schema Registry (--schema-registry-url)")
        from .avro_serde import AvroSerde

        return AvroSerde(schema_registry, topic=topic, field=field, reader_schema=reader_schema)
    raise ValueError(f"unknown format {fmt!r}; expected one of {', '.join(SERDE_FORMATS)}")


def to_json_compatible(obj: Any) -> Any:
    """``obj`` (a decoded value) with what JSON cannot hold made printable, for ``export``/``get``.

    bytes -> standard base64 text; date/time -> ISO 8601; Decimal/UUID -> text; Mapping/list
    recursively. Avro logical types decode to these (fastavro).
    """
    if isinstance(obj, Mapping):
        return {str(k): to_json_compatible(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_json_compatible(v) for v in obj]
    if isinstance(obj, (bytes, bytearray, memoryview)):
        return base64.b64encode(bytes(obj)).decode("ascii")
    if isinstance(obj, (datetime.date, datetime.time)):
        return obj.isoformat()
    if isinstance(obj, (decimal.Decimal, uuid.UUID)):
        return str(obj)
    return obj
