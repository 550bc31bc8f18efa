"""The one interface every key and value format implements: exact stored bytes to a typed object,
and a typed key to the bytes a producer wrote for it.

Its own module so that each format's module (:mod:`materializer.adapters.serdes` for ``bytes``,
``str`` and ``json``; :mod:`materializer.adapters.avro_serde` for Avro through a Schema Registry)
builds on it without importing the others; :func:`materializer.adapters.serdes.make_serde` picks
one by name and imports a registry format only when it is asked for (its dependencies load slowly).
"""

from __future__ import annotations

from typing import Any

from .errors import DeserializationError

__all__ = ["Serde"]


class Serde:
    """Turns the exact bytes a producer wrote into a typed object, and a typed key into bytes.

    Subclasses set :attr:`format`. ``decode`` gets where the bytes come from so that its error names
    the record: ``partition`` and ``offset`` (Kafka offsets) as stored beside the value.

    Raises (decode): :class:`DeserializationError` naming topic, partition, offset and the reason.
    Raises (encode): ``TypeError``/``ValueError`` for an object the format cannot hold.
    """

    format = "bytes"

    def __init__(self, topic: str | None = None, field: str = "value") -> None:
        self.topic = topic
        self.field = field

    def decode(self, data: bytes, partition: int | None = None, offset: int | None = None) -> Any:
        """The object ``data`` holds (``bytes`` for this base class)."""
        return bytes(data)

    def encode(self, obj: Any) -> bytes:
        """The bytes a producer using this format writes for ``obj`` (used to look keys up)."""
        if isinstance(obj, (bytes, bytearray, memoryview)):
            return bytes(obj)
        raise TypeError(f"a {self.format} {self.field} must be bytes, not {type(obj).__name__}")

    def _error(self, reason: str, partition: int | None, offset: int | None) -> DeserializationError:
        return DeserializationError(reason, fmt=self.format, field=self.field, topic=self.topic,
                                    partition=partition, offset=offset)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(topic={self.topic!r}, field={self.field!r})"
