"""Per-partition producer and transaction state (Kafka ``ProducerStateManager``).

A broker keeps one ``ProducerStateManager`` per partition, fed by every appended batch that
carries a producer id (``ProducerId >= 0``). It answers what the log needs of producers:

* **ongoing transactions** - producer id -> first offset of its open transaction (the first
  transactional data batch after its previous end marker);
* the **first unstable offset** - the first offset of the oldest ongoing transaction; the
  **last stable offset** is ``min(first unstable offset, high watermark)``
  (``UnifiedLog.lastStableOffset``): nothing at or past it may be cleaned or served to a
  ``read_committed`` consumer;
* the **active producers** - ``UnifiedLog.lastRecordsOfActiveProducers``: per producer id not
  expired, the last offset of its last data batch of the current epoch and that epoch; the
  cleaner keeps the batch holding that offset (or the current-epoch marker), possibly emptied, so
  producer sequence and fencing state survive cleaning;
* for an end marker, the ``CompletedTxn`` and ``lastStableOffset(completedTxn)`` that an ABORT
  marker's ``.txnindex`` entry records.

Rules, folded batch by batch in offset order (``ProducerAppendInfo``):

* data batch: a new epoch forgets the last data offset of the old epoch; ``last_data_offset``
  becomes the batch's last offset, ``last_timestamp_ms`` its max timestamp; a transactional batch
  opens a transaction at its base offset if none is open;
* control batch with a record (end marker): a new epoch forgets the last data offset; the open
  transaction ends (its first offset is the marker's own base offset when none was open);
  ``last_timestamp_ms`` becomes the marker record's timestamp;
* empty control batch (a marker the cleaner emptied but kept for its producer): replayed as the
  marker it was, using its epoch and max timestamp - the broker's live state was built from the
  original marker (Kafka's replay-from-log path skips empty control batches, but a broker
  normally restores producer state from ``.snapshot`` files, which the local log does not have).

A producer is expired when it has no open transaction and ``now_ms - last_timestamp_ms >=
producer.id.expiration.ms`` (``ProducerStateManager.isProducerExpired``; the broker checks every
``producer.id.expiration.check.interval.ms``, this class when asked).

Ownership: ``Log`` owns one manager (``Log.producer_state_manager``), rebuilt from the segments'
batch headers on first use after open, truncation or retention, and updated on every append
after that. ``read_committed.scan_transactions`` folds a folder it only reads with a fresh one.
Not thread-safe: ``Log`` calls it under ``Log.lock``; the query methods return copies.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Iterable, Iterator, NamedTuple

from .control_record import ControlRecordType, parse_control_record_type
from .errors import CorruptRecordError
from .record_batch import CONTROL_FLAG_MASK, LOG_OVERHEAD, RECORD_BATCH_OVERHEAD, RecordBatch

if TYPE_CHECKING:  # pragma: no cover
    from .segment import LogSegment

__all__ = [
    "CompletedTxn",
    "DEFAULT_PRODUCER_ID_EXPIRATION_MS",
    "LastRecord",
    "ProducerStateEntry",
    "ProducerStateManager",
    "iter_producer_batches",
]

DEFAULT_PRODUCER_ID_EXPIRATION_MS = 86400000
"""``producer.id.expiration.ms`` default (1 day)."""


@dataclass(frozen=True)
class ProducerStateEntry:
    """What the log needs of one producer id (subset of Kafka ``ProducerStateEntry``).

    ``last_data_offset`` is -1 when no data batch of the current epoch is known;
    ``current_txn_first_offset`` is None when no transaction is open; times in ms.
    """

    producer_id: int
    producer_epoch: int = -1
    last_data_offset: int = -1
    last_timestamp_ms: int = -1
    current_txn_first_offset: int | None = None


class LastRecord(NamedTuple):
    """Kafka ``LastRecord``: last data offset (None if unknown) and epoch of an active producer."""

    last_data_offset: int | None
    producer_epoch: int


class CompletedTxn(NamedTuple):
    """Kafka ``CompletedTxn``: a transaction an end marker closed.

    ``first_offset`` is the transaction's first data offset (the marker's base offset when no
    data batch was seen), ``last_offset`` the marker's offset; ``is_aborted`` is None for a control
    batch that is no COMMIT/ABORT marker (an emptied marker, another control type).
    """

    producer_id: int
    first_offset: int
    last_offset: int
    is_aborted: bool | None


def _marker_kind(batch: RecordBatch) -> tuple[bool | None, int | None]:
    """(is_aborted, marker record timestamp) of a control batch; (None, None) when it has no record.

    Raises:
        CorruptRecordError: the control record's key cannot be parsed (file and position named).
    """
    records = batch.records() if batch.header.records_count else ()
    if not records:
        return None, None
    try:
        control_type = parse_control_record_type(records[0].key)
    except ValueError as exc:
        raise CorruptRecordError(f"unreadable control record at offset {records[0].offset}: {exc}",
                                 path=batch.path, position=batch.position) from exc
    aborted = {ControlRecordType.ABORT: True, ControlRecordType.COMMIT: False}.get(control_type)
    return aborted, records[0].timestamp


class ProducerStateManager:
    """Producer id -> ``ProducerStateEntry`` and the ongoing transactions of one partition.

    Feed every batch in offset order with :meth:`update` (batches without a producer id are
    ignored), then ask :meth:`first_unstable_offset`, :meth:`ongoing_transactions`,
    :meth:`last_records_of_active_producers`. Mirrors Kafka ``ProducerStateManager`` (module
    docstring for the rules). Not thread-safe.
    """

    def __init__(self) -> None:
        self._producers: dict[int, ProducerStateEntry] = {}
        self._ongoing: dict[int, int] = {}  # producer id -> first offset of its open transaction

    @classmethod
    def from_segments(cls, segments: Iterable["LogSegment"]) -> "ProducerStateManager":
        """A manager folded from the batch headers of ``segments`` (base offset order).

        Raises:
            CorruptRecordError: a control record's key cannot be parsed.
        """
        manager = cls()
        for segment in segments:
            for batch in iter_producer_batches(segment):
                manager.update(batch)
        return manager

    def update(self, batch: RecordBatch) -> CompletedTxn | None:
        """Apply one batch (Kafka ``ProducerAppendInfo.append`` + ``ProducerStateManager.update``).

        Returns the ``CompletedTxn`` when ``batch`` is a control batch of a producer, else None.

        Raises:
            CorruptRecordError: a control record's key cannot be parsed.
        """
        header = batch.header
        producer_id = header.producer_id
        if producer_id < 0:
            return None
        entry = self._producers.get(producer_id) or ProducerStateEntry(producer_id)
        epoch = header.producer_epoch
        if header.attributes & CONTROL_FLAG_MASK:
            is_aborted, timestamp = _marker_kind(batch)
            last_data_offset = entry.last_data_offset if epoch == entry.producer_epoch else -1
            self._producers[producer_id] = replace(
                entry, producer_epoch=epoch, last_data_offset=last_data_offset,
                last_timestamp_ms=header.max_timestamp if timestamp is None else timestamp,
                current_txn_first_offset=None)
            first_offset = self._ongoing.pop(producer_id, header.base_offset)
            return CompletedTxn(producer_id, first_offset, batch.last_offset, is_aborted)
        txn_first = entry.current_txn_first_offset
        if batch.is_transactional and txn_first is None:
            txn_first = header.base_offset
            self._ongoing[producer_id] = txn_first
        self._producers[producer_id] = replace(
            entry, producer_epoch=epoch, last_data_offset=batch.last_offset,
            last_timestamp_ms=header.max_timestamp, current_txn_first_offset=txn_first)
        return None

    def last_stable_offset(self, completed: CompletedTxn) -> int:
        """Kafka ``lastStableOffset(completedTxn)``, called right after the marker's :meth:`update`:
        the first offset of the oldest transaction still open, else the marker's offset + 1."""
        return min(self._ongoing.values(), default=completed.last_offset + 1)

    def first_unstable_offset(self) -> int | None:
        """First offset of the oldest ongoing transaction, or None when every transaction is decided."""
        return min(self._ongoing.values(), default=None)

    def ongoing_transactions(self) -> dict[int, int]:
        """Producer id -> first offset of its ongoing transaction (a copy)."""
        return dict(self._ongoing)

    def producers(self) -> dict[int, ProducerStateEntry]:
        """Every producer id seen, expired ones included -> its entry (a copy)."""
        return dict(self._producers)

    def last_records_of_active_producers(
        self, now_ms: int, producer_id_expiration_ms: int = DEFAULT_PRODUCER_ID_EXPIRATION_MS,
    ) -> dict[int, LastRecord]:
        """``UnifiedLog.lastRecordsOfActiveProducers`` for the producers not expired at ``now_ms``."""
        result: dict[int, LastRecord] = {}
        for producer_id, entry in self._producers.items():
            expired = (entry.current_txn_first_offset is None
                       and now_ms - entry.last_timestamp_ms >= producer_id_expiration_ms)
            if not expired:
                last = entry.last_data_offset if entry.last_data_offset >= 0 else None
                result[producer_id] = LastRecord(last, entry.producer_epoch)
        return result


_PRODUCER_ID_OFFSET = 43  # BaseOffset(8) Length(4) PartitionLeaderEpoch(4) Magic(1) CRC(4) Attributes(2)
                          # LastOffsetDelta(4) BaseTimestamp(8) MaxTimestamp(8) -> ProducerId
_PRODUCER_ID = struct.Struct(">q")
_LENGTH = struct.Struct(">i")
_READ_CHUNK_BYTES = 1 << 20


def iter_producer_batches(segment: "LogSegment") -> Iterator[RecordBatch]:
    """Every complete batch of a segment's ``.log`` that carries a producer id, in file order.

    Reads raw headers in 1 MiB chunks and builds a ``RecordBatch`` only for batches with
    ``ProducerId >= 0`` (CRC not checked); stops at a truncated tail.
    """
    records = segment.log
    size = records.size_in_bytes
    position = 0
    while position < size:
        chunk = records.read(position, min(_READ_CHUNK_BYTES, size - position))
        view = memoryview(chunk)
        available = len(chunk)
        consumed = 0
        while available - consumed >= RECORD_BATCH_OVERHEAD:
            batch_size = _LENGTH.unpack_from(view, consumed + 8)[0] + LOG_OVERHEAD
            if batch_size < RECORD_BATCH_OVERHEAD or batch_size > available - consumed:
                break
            if _PRODUCER_ID.unpack_from(view, consumed + _PRODUCER_ID_OFFSET)[0] >= 0:
                yield RecordBatch(view[consumed:consumed + batch_size])
            consumed += batch_size
        if consumed == 0:
            # a batch larger than the chunk (or a truncated tail): fall back to the framed reader
            for _, batch in records.batches_from(position):
                if batch.header.producer_id >= 0:
                    yield batch
            return
        position += consumed
