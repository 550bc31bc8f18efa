"""Why a key is absent: deleted by a tombstone the local log still shows, or plain "not found".

The state store deletes a key when it applies its tombstone (a record with a null value) and, in
the same ``WriteBatch``, records where that tombstone was (partition, offset, timestamp) in its
tombstones column family (:meth:`StateStore.tombstone
<materializer.adapters.rocksdb_store.StateStore.tombstone>`); a put costs nothing more and leaves
the record, which is read only for a key absent from the store.

A record is a claim, not an answer: Kafka's LogCleaner removes a tombstone once it is older than
``delete.retention.ms`` (the delete horizon, ``LogCleaner.cleanSegments`` / KIP-534), retention or
DeleteRecords move the log start offset past it, and a record may be left over from an earlier
delete. So :func:`deletion_of` says "deleted at offset X" only when the local log confirms it now
(:func:`confirmed`): ``X`` is at or above the log start offset (the log's and the one the store's
entries follow) and below the store's next offset, and the batch holding ``X`` -- one offset index
lookup and a read of a few batches from there, never a scan -- has a record at exactly ``X`` that
is a tombstone of this key. Otherwise the answer is plain "not found", which is also what a store
without records (written before they existed) or a view without a local log says. It is never
asked for a key the store holds live: "deleted" only ever qualifies an absence.

Records whose tombstone is gone are expired by the store's writer (:func:`expire_tombstones`):
below a raised log start offset in the same batch as the entries (``StateStore.drop_below``), with
the partition's entries (``drop_partition``), and after the cleaner's rounds.

Two ways to reach the local log (:class:`TombstoneLog`): the running materializer's own
:class:`~materializer.storage.log.Log` objects (:class:`LiveLogs`), or a data dir's partition
folders read in place by a reader in another process (:class:`DataDirLogs`: nothing is written).
"""

from __future__ import annotations

import bisect
import mmap
import os
import struct
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple, Protocol

from materializer.adapters.rocksdb_store import StateStore
from materializer.adapters.rocksdb_store.layout import Tombstone
from materializer.datadir.layout import partition_dir
from materializer.storage.checkpoint import LOG_START_OFFSET_CHECKPOINT, read_offset_checkpoint
from materializer.storage.errors import StorageError
from materializer.storage.files import LOG_FILE_SUFFIX, log_file, offset_from_file_name, offset_index_file

if TYPE_CHECKING:  # pragma: no cover - the log engine is loaded when a tombstone is looked up (issue 42)
    from materializer.storage.log import Log
    from materializer.storage.record_batch import RecordBatch

__all__ = ["DataDirLogs", "Deletion", "LiveLogs", "TombstoneLog", "confirmed", "deletion_of", "expire_tombstones"]

_INDEX_ENTRY = struct.Struct(">ii")  # OffsetIndex entry: relative offset, position (Kafka OffsetIndex)


class Deletion(NamedTuple):
    """A key's tombstone, confirmed in the local log: the key was deleted by the record at
    ``offset`` of ``partition`` (timestamp ``timestamp``, ms since the epoch; -1: none)."""

    partition: int
    offset: int
    timestamp: int


class TombstoneLog(Protocol):
    """Point reads of a topic's local log (module docstring)."""

    def log_start_offset(self, partition: int) -> int | None:
        """The partition's log start offset now; None when there is no local log of it."""

    def batch_at(self, partition: int, offset: int) -> RecordBatch | None:
        """The batch holding ``offset`` (base offset <= offset <= last offset), or None when the
        log holds no batch there (cleaned away, below the log start, past the end)."""


class LiveLogs:
    """:class:`TombstoneLog` over a running materializer's logs (``logs()``: partition -> Log, read
    on every call). :meth:`Log.read_batches` locates the batch under the log's lock (offset index)
    and reads it without it, as a fetch does."""

    def __init__(self, logs: Callable[[], Mapping[int, Log]]) -> None:
        self._logs = logs

    def log_start_offset(self, partition: int) -> int | None:
        log = self._logs().get(partition)
        return None if log is None else log.log_start_offset

    def batch_at(self, partition: int, offset: int) -> RecordBatch | None:
        log = self._logs().get(partition)
        if log is None:
            return None
        try:
            for batch in log.read_batches(offset, offset + 1):
                return batch if batch.base_offset <= offset <= batch.last_offset else None
        except StorageError:  # below the log start now, or closed under the read: not confirmed
            return None
        return None


class DataDirLogs:
    """:class:`TombstoneLog` over the partition folders of ``topic`` in ``data_dir``, read in place
    by a reader in another process (files opened read-only; nothing is created or renamed).

    The segment is the ``.log`` file with the greatest base offset at or below the offset; its
    ``.index`` gives the position to read from (the entries up to the first that does not ascend:
    an active segment's index is preallocated with zeros); the batches from there are read until
    the one holding the offset. A file the writer swaps or deletes meanwhile (the cleaner,
    retention) makes the read answer None: not confirmed, so "not found".
    """

    def __init__(self, data_dir: Path | str, topic: str) -> None:
        self._data_dir = Path(data_dir)
        self._topic = topic

    def log_start_offset(self, partition: int) -> int | None:
        folder = partition_dir(self._data_dir, self._topic, partition)
        bases = self._bases(folder)
        if not bases:
            return None
        try:  # written on close and by retention; the first segment bounds it otherwise
            checkpoint = read_offset_checkpoint(self._data_dir / LOG_START_OFFSET_CHECKPOINT)
        except (StorageError, OSError):
            checkpoint = {}
        return max(bases[0], checkpoint.get((self._topic, partition), 0))

    def batch_at(self, partition: int, offset: int) -> RecordBatch | None:
        from materializer.storage.record_batch import iter_batches

        folder = partition_dir(self._data_dir, self._topic, partition)
        bases = self._bases(folder)
        at = bisect.bisect_right(bases, offset) - 1
        if at < 0:
            return None
        base = bases[at]
        try:
            position = _index_position(offset_index_file(folder, base), base, offset)
            with open(log_file(folder, base), "rb") as f:
                size = os.fstat(f.fileno()).st_size
                if size <= position:
                    return None
                data = mmap.mmap(f.fileno(), size, access=mmap.ACCESS_READ)
            for _, batch in iter_batches(data, position):
                if batch.last_offset >= offset:
                    batch.ensure_valid()  # a position from another file's index lands on no valid batch
                    return batch if batch.base_offset <= offset else None
        except (OSError, ValueError, StorageError):
            return None
        return None

    @staticmethod
    def _bases(folder: Path) -> list[int]:
        try:
            names = os.listdir(folder)
        except OSError:
            return []
        return sorted(offset_from_file_name(n) for n in names if n.endswith(LOG_FILE_SUFFIX))


def _index_position(index_path: Path, base_offset: int, offset: int) -> int:
    """The byte position of the greatest offset index entry at or below ``offset`` (0: none, or no
    index), over the entries that ascend (an active segment's index ends in preallocated zeros)."""
    try:
        raw = index_path.read_bytes()
    except FileNotFoundError:
        return 0
    target = offset - base_offset
    position = 0
    last_relative = -1
    for relative, entry_position in _INDEX_ENTRY.iter_unpack(raw[:len(raw) - len(raw) % _INDEX_ENTRY.size]):
        if relative <= last_relative or relative > target:
            break
        last_relative, position = relative, entry_position
    return position


def confirmed(log: TombstoneLog, store: StateStore, key: bytes, tombstone: Tombstone) -> bool:
    """Whether the local log still shows ``tombstone`` as ``key``'s (module docstring): its offset
    is at or above the log start offset (the log's and the one ``store``'s entries follow), below
    the store's next offset of its partition, and the record there is a tombstone of ``key``."""
    partition, offset = tombstone.partition, tombstone.offset
    log_start = log.log_start_offset(partition)
    next_offset = store.offsets().get(partition)
    if log_start is None or next_offset is None or not max(log_start, store.start_offset(partition)) <= offset < next_offset:
        return False
    batch = log.batch_at(partition, offset)
    if batch is None or batch.is_control_batch:
        return False
    try:
        records = batch.records()
    except (StorageError, ValueError):  # a batch that does not decode confirms nothing
        return False
    for record in records:
        if record.offset == offset:
            return record.key == key and record.value is None
    return False  # the cleaner removed the record at that offset


def deletion_of(store: StateStore, key: bytes, partitions: Iterable[int], log: TombstoneLog | None) -> Deletion | None:
    """The confirmed tombstone of ``key`` in ``partitions`` (those the caller found it absent
    from), or None: plain "not found". When it was deleted in several, the latest (record
    timestamp, then the lower partition), as a live value across partitions is chosen.

    Raises:
        StoreError: the store is closed or failed.
    """
    if log is None:
        return None
    found = []
    for partition in partitions:
        tombstone = store.tombstone(key, partition)
        if tombstone is not None and confirmed(log, store, key, tombstone):
            found.append(Deletion(*tombstone))
    return min(found, key=lambda d: (-d.timestamp, d.partition), default=None)


def expire_tombstones(store: StateStore, partition: int, log: TombstoneLog, below: int) -> int:
    """Forget ``partition``'s tombstone records below offset ``below`` (the cleaner's checkpoint:
    only the cleaned part of the log lost records) whose tombstone the local log no longer shows
    (:func:`confirmed`), in one write; returns how many. Called by the store's writer.

    Raises:
        StoreError: the store is closed, read-only or failed.
    """
    gone = [key for key, tombstone in store.tombstone_records(partition)
            if tombstone.offset < below and not confirmed(log, store, key, tombstone)]
    return store.forget_tombstones(partition, gone) if gone else 0
