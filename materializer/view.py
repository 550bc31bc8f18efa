"""Typed reads of a materialized topic: the read API a service or cache lives on.

A :class:`MaterializedView` is a :class:`~materializer.adapters.rocksdb_store.StateStore` seen
through a key serde and a value serde (``bytes``, ``str``, ``json``, ``avro``;
:mod:`materializer.adapters.serdes`). The store keeps the exact bytes the producer wrote;
decoding happens on read, so a view can read the same store as ``str`` today and ``json``
tomorrow.

Consistency: every read answers from one RocksDB state in which the values and the
per-partition next offsets (:meth:`MaterializedView.offsets`) were written by the same atomic
batch, so a view "reflects offsets < next offset" of each partition exactly. A view opened with
``read_only=True`` (the default of :meth:`MaterializedView.open`) follows a ``materializer run``
in another process: it sees the store as of opening or of its last :meth:`MaterializedView.catch_up`.
The view returned by :meth:`Materializer.view <materializer.materializer.Materializer.view>` reads
the writer's own store and sees every applied batch at once.

Key order: scans go in key *byte* order, which for ``str`` keys is UTF-8 code point order.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable, Iterator, NamedTuple

from materializer.adapters.rocksdb_store import StateStore, StoredValue
from materializer.adapters.serdes import BytesSerde, Serde, make_serde
from materializer.data_dir import open_when_complete, state_dir

__all__ = ["Entry", "MaterializedView"]


class Entry(NamedTuple):
    """One live key of a view: decoded key and value, and the record they came from.

    Attributes:
        key / value: decoded by the view's serdes.
        partition: Kafka partition of the record.
        offset: its offset in that partition.
        timestamp: its timestamp, ms since the epoch (CreateTime or LogAppendTime).
    """

    key: Any
    value: Any
    partition: int
    offset: int
    timestamp: int


class MaterializedView:
    """Typed, read-only access to a topic's state store.

    Args:
        store: the open store (the view does not close a store it was given, unless ``owns_store``).
        key_serde / value_serde: decoders (default :class:`BytesSerde`: raw bytes).
        owns_store: :meth:`close` closes ``store``.

    Keys given to lookups may be typed (``str`` for a ``str`` serde, a dict for ``json``/``avro``:
    encoded by the key serde) or the exact key bytes.

    Raises (reads):
        DeserializationError: a stored key or value does not decode (names partition and offset).
        SchemaRegistryError: the Avro serde cannot reach the registry.
        StoreError: RocksDB failed or the view is closed.
    """

    def __init__(self, store: StateStore, *, key_serde: Serde | None = None, value_serde: Serde | None = None,
                 owns_store: bool = False) -> None:
        self.store = store
        self.key_serde = key_serde or BytesSerde(field="key")
        self.value_serde = value_serde or BytesSerde(field="value")
        self._raw_keys = type(self.key_serde) is BytesSerde  # store keys are bytes already
        self._owns_store = owns_store

    @classmethod
    def open(cls, data_dir: Path | str, topic: str, *, key_format: str = "bytes", value_format: str = "bytes",
             schema_registry: Any = None, reader_schema: str | None = None,
             read_only: bool = True) -> "MaterializedView":
        """Open the view of ``topic`` in ``data_dir`` (the layout of :mod:`materializer.config`).

        Args:
            key_format / value_format: one of ``bytes``, ``str``, ``json``, ``avro``.
            schema_registry: a ``SchemaRegistryClient`` or a registry URL (``avro`` needs one).
            reader_schema: Avro schema JSON the values are resolved to (schema evolution).
            read_only: open as a reader beside a running ``materializer run`` (no lock taken,
                nothing written in the data dir, which may be a read-only mount).

        Raises:
            IncompleteDataDirError: no store for ``topic`` (``run`` or ``restore`` first), or a
                command building or replacing it is in progress or was interrupted (the message says
                which and what to run; :func:`materializer.data_dir.require_complete`).
            StoreError: the store cannot be opened.
            ValueError: an unknown format, or ``avro`` without a registry.
        """
        if isinstance(schema_registry, str):
            from materializer.adapters.avro_serde import schema_registry_client

            schema_registry = schema_registry_client(schema_registry)
        key_serde = make_serde(key_format, topic=topic, field="key", schema_registry=schema_registry)
        value_serde = make_serde(value_format, topic=topic, field="value", schema_registry=schema_registry,
                                 reader_schema=reader_schema)
        path = state_dir(Path(data_dir), topic)
        store = open_when_complete(data_dir, topic, lambda: StateStore(path, read_only=read_only), StateStore.close)
        return cls(store, key_serde=key_serde, value_serde=value_serde, owns_store=True)

    # -- lifecycle ---------------------------------------------------------------------------

    def close(self) -> None:
        """Close the store if the view opened it. Idempotent."""
        if self._owns_store:
            self.store.close()

    def __enter__(self) -> "MaterializedView":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def catch_up(self) -> dict[int, int]:
        """A read-only view: see the writer's latest applied batch; return partition -> next offset.

        Raises:
            StoreError: the view reads the writer's own store (it is always current), or RocksDB failed.
        """
        return self.store.catch_up()

    def offsets(self) -> dict[int, int]:
        """Partition -> next offset: the view reflects exactly the records below these offsets."""
        return self.store.offsets()

    # -- reads -------------------------------------------------------------------------------

    def _key_bytes(self, key: Any) -> bytes:
        return self.key_serde.encode(key)

    def _entry(self, key: bytes, stored: StoredValue) -> Entry:
        partition, offset, timestamp, value = stored
        return Entry(key if self._raw_keys else self.key_serde.decode(key, partition, offset),
                     self.value_serde.decode(value, partition, offset), partition, offset, timestamp)

    def get(self, key: Any, default: Any = None, *, partition: int | None = None) -> Any:
        """The decoded value of ``key``, or ``default`` when it is absent or deleted.

        Without ``partition``, a key live in several partitions gives the value with the latest
        record timestamp (ties: the lower partition), as :meth:`StateStore.get`.
        """
        stored = self.store.get(self._key_bytes(key), partition)
        if stored is None:
            return default
        return self.value_serde.decode(stored.value, stored.partition, stored.offset)

    def get_entry(self, key: Any, *, partition: int | None = None) -> Entry | None:
        """``key``'s :class:`Entry` (value with partition, offset, timestamp), or None."""
        key_bytes = self._key_bytes(key)
        stored = self.store.get(key_bytes, partition)
        return None if stored is None else self._entry(key_bytes, stored)

    def get_many(self, keys: Iterable[Any], *, partition: int | None = None) -> dict[Any, Any]:
        """``key -> decoded value`` for the live ``keys`` (absent ones left out), one RocksDB multi-get.

        The result is keyed by the keys as given.
        """
        given = list(keys)
        encoded = [self._key_bytes(k) for k in given]
        found = self.store.get_many(encoded, partition)
        result: dict[Any, Any] = {}
        for key, key_bytes in zip(given, encoded):
            stored = found.get(key_bytes)
            if stored is not None:
                result[key if _hashable(key) else key_bytes] = self.value_serde.decode(
                    stored.value, stored.partition, stored.offset)
        return result

    def scan(self, start: Any = None, end: Any = None, *, prefix: Any = None,
             partition: int | None = None) -> Iterator[Entry]:
        """Live entries with keys in ``[start, end)`` or starting with ``prefix``, in key byte order.

        ``start``/``end``/``prefix`` are typed keys or bytes (a ``str`` prefix of a ``str`` view is
        its UTF-8 bytes). A key live in two partitions comes once for each, lower partition first.
        """
        start_bytes = b"" if start is None else self._key_bytes(start)
        end_bytes = None if end is None else self._key_bytes(end)
        prefix_bytes = None if prefix is None else self._key_bytes(prefix)
        for key, stored in self.store.scan(start_bytes, end_bytes, prefix=prefix_bytes, partition=partition):
            yield self._entry(key, stored)

    def items(self, partition: int | None = None) -> Iterator[Entry]:
        """Every live entry in (partition, key byte) order, or those of one ``partition``."""
        for key, stored in self.store.items(partition):
            yield self._entry(key, stored)

    def count(self, partition: int | None = None) -> int:
        """Live (partition, key) entries, exact (iterates the keys: O(keys))."""
        return self.store.count(partition)

    def __len__(self) -> int:
        return self.count()

    def __contains__(self, key: Any) -> bool:
        return self.store.get(self._key_bytes(key)) is not None

    def __repr__(self) -> str:
        return (f"MaterializedView({str(self.store.path)!r}, key={self.key_serde.format}, "
                f"value={self.value_serde.format})")


def _hashable(key: Any) -> bool:
    try:
        hash(key)
    except TypeError:
        return False
    return True

