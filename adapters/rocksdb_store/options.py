"""A state store's RocksDB settings (:class:`StateStoreOptions`), converted to rocksdict's options in
one place; the memory budget several stores share is :class:`~materializer.adapters.rocksdb_store.StoreMemory`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from rocksdict import DBCompressionType, Options, WriteOptions

from .memory import StoreMemory

__all__ = ["COMPRESSION_TYPES", "StateStoreOptions"]

COMPRESSION_TYPES = {
    "none": DBCompressionType.none,
    "snappy": DBCompressionType.snappy,
    "lz4": DBCompressionType.lz4,
    "zstd": DBCompressionType.zstd,
}


@dataclass(frozen=True)
class StateStoreOptions:
    """RocksDB settings of a state store, converted in one place by :meth:`to_options`.

    Attributes:
        write_buffer_size_bytes: memtable size before a flush to an SST file (64 MiB).
        max_write_buffer_number: memtables kept in memory (3).
        compression: SST block compression: "none", "snappy", "lz4" (default) or "zstd".
        sync_writes: fsync the WAL on every ``apply`` (False: the WAL is written but not fsynced;
            a process crash loses nothing, a power loss may lose the last batches, which are
            then replayed from the local log).
        memory: one budget for the memtables and block cache of every store opened with these
            options in this process (:class:`~materializer.adapters.rocksdb_store.StoreMemory`,
            Kafka Streams' bounded-memory setup); None (default): RocksDB sizes each store on
            its own (up to ``write_buffer_size_bytes * max_write_buffer_number`` of memtables
            per column family, a block cache per store).
    """

    write_buffer_size_bytes: int = 64 * 1024 * 1024
    max_write_buffer_number: int = 3
    compression: Literal["none", "snappy", "lz4", "zstd"] = "lz4"
    sync_writes: bool = False
    memory: StoreMemory | None = None

    def to_options(self) -> Options:
        """The ``rocksdict.Options`` (raw mode, create if missing) for these settings.

        Raises:
            ValueError: unknown ``compression``.
        """
        if self.compression not in COMPRESSION_TYPES:
            raise ValueError(f"unknown RocksDB compression {self.compression!r}; expected one of "
                             f"{', '.join(COMPRESSION_TYPES)}")
        options = Options(raw_mode=True)
        options.create_if_missing(True)
        options.create_missing_column_families(True)
        options.set_write_buffer_size(self.write_buffer_size_bytes)
        options.set_max_write_buffer_number(self.max_write_buffer_number)
        options.set_compression_type(COMPRESSION_TYPES[self.compression]())
        options.set_atomic_flush(True)
        if self.memory is not None:
            self.memory.configure(options)
        return options

    def to_write_options(self) -> WriteOptions:
        """The ``rocksdict.WriteOptions`` of every ``WriteBatch`` the store writes."""
        write_options = WriteOptions()
        write_options.sync = self.sync_writes
        return write_options
