"""Producer state rebuilt from a log's batch headers, as far as the cleaner needs it.

Kafka's broker keeps a ``ProducerStateManager`` per partition, fed by every appended batch that
carries a producer id. The cleaner uses two things from it:

* ``UnifiedLog.lastRecordsOfActiveProducers`` - per active producer id, the last offset of its
  last data batch (absent when its epoch was bumped by a marker since) and its current epoch; the
  batch holding that offset (or the current-epoch marker) is kept, possibly emptied, so producer
  sequence and fencing state survive cleaning.
* the first unstable offset - the first offset of the oldest still-open transaction; nothing at
  or after it may be cleaned (``UnifiedLog.lastStableOffset``).

Our local log has no producer-state snapshots, so both are rebuilt by folding every batch header
of the log in offset order with ``ProducerAppendInfo``'s rules (Kafka 4.4):

* data batch: a new epoch clears the remembered data batches; ``last_data_offset`` becomes the
  batch's last offset, ``last_timestamp_ms`` its max timestamp; a transactional batch opens a
  transaction at its base offset if none is open;
* control batch with a record (end marker): a new epoch clears the remembered data batches; the
  open transaction ends; ``last_timestamp_ms`` becomes the marker record's timestamp;
* empty control batch (a marker the cleaner emptied but kept for its producer): replayed as the
  marker it was, using its epoch and max timestamp - the broker's live producer state was built
  from the original marker (Kafka's replay-from-log path skips empty control batches, but the
  broker normally restores producer state from ``.snapshot`` files, which we do not have).

A producer is active unless it has no open transaction and
``now_ms - last_timestamp_ms >= producer_id_expiration_ms`` (``ProducerStateManager.isProducerExpired``;
the broker applies this check every ``producer.id.expiration.check.interval.ms``, we apply it
when asked). Results for the non-active segments are cached per log and reused while those
segments are unchanged.
"""

from __future__ import annotations

import struct
import threading
import weakref
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Iterable, NamedTuple

from .record_batch import LOG_OVERHEAD, RECORD_BATCH_OVERHEAD, RecordBatch
from .log_view import all_segments

if TYPE_CHECKING:  # pragma: no cover
    from .log import Log

__all__ = [
    "ProducerStateEntry",
    "LastRecord",
    "DEFAULT_PRODUCER_ID_EXPIRATION_MS",
    "scan_producer_states",
    "first_unstable_offset",
    "last_records_of_active_producers",
    "iter_segment_batches",
]

DEFAULT_PRODUCER_ID_EXPIRATION_MS = 86400000
"""``producer.id.expiration.ms`` default (1 day)."""


@dataclass(frozen=True)
class ProducerStateEntry:
    """What the cleaner needs of one producer id (subset of Kafka ``ProducerStateEntry``).

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


def _apply(entry: ProducerStateEntry, batch: RecordBatch) -> ProducerStateEntry:
    header = batch.header
    epoch = header.producer_epoch
    last_data_offset = entry.last_data_offset if epoch == entry.producer_epoch else -1
    if batch.is_control_batch:
        # An emptied marker (61-byte batch kept by the cleaner) still carries the marker's epoch
        # and max timestamp: replay it as the marker it was, which is the state the broker built
        # when the marker was appended (its replay-from-log path would skip it).
        records = batch.records() if header.records_count else ()
        timestamp = records[0].timestamp if records else header.max_timestamp
        return replace(
            entry, producer_epoch=epoch, last_data_offset=last_data_offset,
            last_timestamp_ms=timestamp, current_txn_first_offset=None,
        )
    txn_first = entry.current_txn_first_offset
    if batch.is_transactional and txn_first is None:
        txn_first = header.base_offset
    return replace(
        entry, producer_epoch=epoch, last_data_offset=batch.last_offset,
        last_timestamp_ms=header.max_timestamp, current_txn_first_offset=txn_first,
    )


_PRODUCER_ID_OFFSET = 43
_PRODUCER_ID = struct.Struct(">q")
_LENGTH = struct.Struct(">i")
_READ_CHUNK_BYTES = 1 << 20


def iter_segment_batches(segment) -> Iterable[RecordBatch]:
    """Every complete batch of a segment's ``.log`` that carries a producer id, in file order.

    Reads raw headers and only builds a ``RecordBatch`` for batches with ``ProducerId >= 0``
    (CRC not checked).
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


def _fold(states: dict[int, ProducerStateEntry], batches: Iterable[RecordBatch]) -> None:
    for batch in batches:
        producer_id = batch.header.producer_id
        if producer_id < 0:
            continue
        entry = states.get(producer_id)
        if entry is None:
            entry = ProducerStateEntry(producer_id)
        states[producer_id] = _apply(entry, batch)


_cache_lock = threading.Lock()
_cache: "weakref.WeakKeyDictionary[object, tuple[tuple, dict[int, ProducerStateEntry]]]" = weakref.WeakKeyDictionary()


def _segment_key(segment) -> tuple:
    return (segment.base_offset, str(getattr(segment, "log_path", "")), segment.size_in_bytes, id(segment))


def scan_producer_states(log: "Log") -> dict[int, ProducerStateEntry]:
    """Fold every batch of the log into ``{producer_id: ProducerStateEntry}`` (expired ones included)."""
    segments = all_segments(log)
    prefix_key = tuple(_segment_key(s) for s in segments[:-1])
    with _cache_lock:
        try:
            cached = _cache.get(log)
        except TypeError:
            cached = None
    if cached is not None and cached[0] == prefix_key:
        states = dict(cached[1])
    else:
        states = {}
        for segment in segments[:-1]:
            _fold(states, iter_segment_batches(segment))
        with _cache_lock:
            try:
                _cache[log] = (prefix_key, dict(states))
            except TypeError:
                pass
    if segments:
        _fold(states, iter_segment_batches(segments[-1]))
    return states


def first_unstable_offset(log: "Log") -> int | None:
    """The first offset of the oldest open transaction, or None when every transaction is decided."""
    offsets = [e.current_txn_first_offset for e in scan_producer_states(log).values() if e.current_txn_first_offset is not None]
    return min(offsets) if offsets else None


def last_records_of_active_producers(
    log: "Log", now_ms: int, producer_id_expiration_ms: int = DEFAULT_PRODUCER_ID_EXPIRATION_MS
) -> dict[int, LastRecord]:
    """``UnifiedLog.lastRecordsOfActiveProducers`` for producers not expired at ``now_ms``."""
    result: dict[int, LastRecord] = {}
    for producer_id, entry in scan_producer_states(log).items():
        expired = entry.current_txn_first_offset is None and now_ms - entry.last_timestamp_ms >= producer_id_expiration_ms
        if not expired:
            last = entry.last_data_offset if entry.last_data_offset >= 0 else None
            result[producer_id] = LastRecord(last, entry.producer_epoch)
    return result
