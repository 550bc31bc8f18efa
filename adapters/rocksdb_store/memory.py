"""One memory budget for several RocksDB state stores: their memtables and block cache under one limit.

RocksDB sizes each store on its own: every column family may keep ``max_write_buffer_number``
memtables of ``write_buffer_size`` bytes (3 x 64 MiB by default here) and every DB gets a block
cache of its own, so a process that holds a store per topic (``materializer run --topic a --topic
b ...``) grows with its topics while they are written. :class:`StoreMemory` is what Kafka Streams
documents as bounded memory (``BoundedMemoryRocksDBConfig``: one ``LRUCache`` and one
``WriteBufferManager`` for every store of an instance): one LRU block cache of ``limit_bytes`` to
which one write buffer manager charges the memtables of every store opened with the same object;
once those pass their share, RocksDB flushes a memtable of the store being written. Index and
filter blocks go to the cache too (charged there, instead of held by every open table file).
A soft bound: writes are never stalled, so stores written faster than they flush pass it for a
while (``benchmarks/bench_store_memory.py``).

What it does not bound: a cold start's bulk load writes its large writes as SST files and ingests
them (no memtable), and its chunks are bounded by the loader (``materializer.apply.store_loader``); RocksDB's own
per-file and per-iterator overheads stay outside any cache.
"""

from __future__ import annotations

from rocksdict import BlockBasedOptions, Cache, Options, WriteBufferManager

__all__ = ["StoreMemory"]


class StoreMemory:
    """A block cache of ``limit_bytes`` that the memtables of every store opened with this object
    are charged to, at most ``memtable_share`` of it (module docstring).

    Pass it in :class:`~materializer.adapters.rocksdb_store.StateStoreOptions` (``memory=``): every
    store opened with those options, in this process, shares it. It pickles as its two numbers (a
    process that unpickles it gets a budget of its own).

    Args:
        limit_bytes: the budget, bytes (at least 1 MiB).
        memtable_share: the part of it the memtables may take before a flush (0 < share <= 1;
            Kafka Streams' example uses 0.5).

    Raises:
        ValueError: a budget below 1 MiB or a share outside (0, 1].
    """

    def __init__(self, limit_bytes: int, memtable_share: float = 0.5) -> None:
        if limit_bytes < 1 << 20:
            raise ValueError(f"a state store memory budget needs at least 1 MiB, not {limit_bytes} bytes")
        if not 0 < memtable_share <= 1:
            raise ValueError(f"memtable_share must be in (0, 1], not {memtable_share}")
        self.limit_bytes = limit_bytes
        self.memtable_share = memtable_share
        self._cache = Cache(limit_bytes)
        # allow_stall=False: writes are never held up, so the share is a soft bound (8 stores written
        # at once took a 64 MiB budget's memtables to 30-99 MiB). With stalls on, a write to one
        # store waited for good while other stores, written no more, held the memtables: hung.
        self._write_buffers = WriteBufferManager.new_write_buffer_manager_with_cache(
            int(limit_bytes * memtable_share), False, self._cache)

    def configure(self, options: Options) -> None:
        """Make ``options`` (a DB's or a column family's) use this budget."""
        options.set_write_buffer_manager(self._write_buffers)
        table = BlockBasedOptions()
        table.set_block_cache(self._cache)
        table.set_cache_index_and_filter_blocks(True)
        table.set_pin_l0_filter_and_index_blocks_in_cache(True)
        options.set_block_based_table_factory(table)

    @property
    def used_bytes(self) -> int:
        """Bytes the cache holds now, memtables charged to it included."""
        return self._cache.get_usage()

    @property
    def memtable_bytes(self) -> int:
        """Bytes the memtables of the stores sharing this budget take now."""
        return self._write_buffers.get_usage()

    def __reduce__(self) -> tuple[type[StoreMemory], tuple[int, float]]:
        return StoreMemory, (self.limit_bytes, self.memtable_share)

    def __repr__(self) -> str:
        return f"StoreMemory(limit_bytes={self.limit_bytes}, memtable_share={self.memtable_share})"
