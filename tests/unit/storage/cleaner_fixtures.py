"""Helpers for the cleaner tests: logs, batches and views in the style of Kafka's LogCleanerTest."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Iterable, Iterator

from materializer.storage.clock import wall_clock_ms as now_ms
from materializer.storage.control_record import ControlRecordType, encode_end_txn_marker
from materializer.storage.log import Log
from materializer.storage.log_config import LogConfig
from materializer.storage.offset_map import OffsetMap
from materializer.storage.record_batch_builder import RecordBatchBuilder

LARGE_TIMESTAMP = 2**63 - 1 - 2 * 86400000


class FakeOffsetMap(OffsetMap):
    """Kafka's ``LogTestUtils.FakeOffsetMap``: keys stored as-is, ``slots`` as given, ``clear`` keeps ``latest_offset``."""

    __slots__ = ("_map",)

    def __init__(self, slots: int = 2**31 - 1):
        self._slots = slots
        self._entries = 0
        self._latest_offset = -1
        self._map: dict[bytes, int] = {}

    def put(self, key, offset):
        key = bytes(key)
        self._map[key] = offset
        self._entries = len(self._map)
        self._latest_offset = offset

    def get(self, key):
        return self._map.get(bytes(key), -1)

    def clear(self):
        # like Kafka's FakeOffsetMap, keeps latest_offset (Kafka's tests rely on it)
        self._map = {}
        self._entries = 0


def make_log(tmp_path: Path, name: str = "topic-0", **config) -> Log:
    settings = {"cleanup_policy": ("compact",), "file_delete_delay_ms": 0, "segment_bytes": 1024}
    settings.update(config)
    return Log.open(tmp_path / name, LogConfig(**settings), had_clean_shutdown=True)


def key(k: int) -> bytes:
    return str(k).encode()


def append(log: Log, k: int | None, v: int | bytes | None, *, timestamp: int = -1, producer_id: int = -1,
           producer_epoch: int = -1, sequence: int = -1, transactional: bool = False, offset: int | None = None) -> int:
    """Append one single-record batch at the log end offset (or ``offset``); returns its offset."""
    offset = log.log_end_offset if offset is None else offset
    builder = RecordBatchBuilder(offset, producer_id=producer_id, producer_epoch=producer_epoch,
                                 base_sequence=sequence, is_transactional=transactional)
    value = v if isinstance(v, bytes) or v is None else str(v).encode()
    builder.append(offset, timestamp, None if k is None else key(k), value)
    log.append_batch(builder.build())
    return offset


def tombstone(log: Log, k: int, **kw) -> int:
    return append(log, k, None, **kw)


class ProducerAppender:
    """``newProducerAppender``: one batch per call, sequences continuing from 0."""

    def __init__(self, log: Log, producer_id: int, producer_epoch: int = 0, transactional: bool = True):
        self.log, self.producer_id, self.producer_epoch, self.transactional = log, producer_id, producer_epoch, transactional
        self.sequence = 0

    def append(self, keys: Iterable[int]) -> None:
        keys = list(keys)
        base = self.log.log_end_offset
        builder = RecordBatchBuilder(base, producer_id=self.producer_id, producer_epoch=self.producer_epoch,
                                     base_sequence=self.sequence, is_transactional=self.transactional)
        for i, k in enumerate(keys):
            builder.append(base + i, now_ms(), key(k), key(k))
        self.log.append_batch(builder.build())
        self.sequence += len(keys)


def marker(log: Log, producer_id: int, producer_epoch: int, control_type: ControlRecordType,
           timestamp: int | None = None) -> int:
    offset = log.log_end_offset
    builder = RecordBatchBuilder(offset, producer_id=producer_id, producer_epoch=producer_epoch,
                                 is_transactional=True, is_control_batch=True)
    k, v = encode_end_txn_marker(control_type, 0)
    builder.append(offset, now_ms() if timestamp is None else timestamp, k, v)
    log.append_batch(builder.build())  # Log indexes ABORT markers in the segment's .txnindex
    return offset


def commit(log: Log, producer_id: int, producer_epoch: int = 0, timestamp: int | None = None) -> int:
    return marker(log, producer_id, producer_epoch, ControlRecordType.COMMIT, timestamp)


def abort(log: Log, producer_id: int, producer_epoch: int = 0, timestamp: int | None = None) -> int:
    return marker(log, producer_id, producer_epoch, ControlRecordType.ABORT, timestamp)


def batches(log: Log):
    for segment in log.log_segments():
        for _, batch in segment.log.batches_from(0):
            yield batch


def keys_in_log(log: Log) -> list[int]:
    """``LogTestUtils.keysInLog``: keys of keyed, non-null records of data batches."""
    return [int(r.key) for b in batches(log) if not b.is_control_batch for r in b.records()
            if r.key is not None and r.value is not None]


def offsets_in_log(log: Log) -> list[int]:
    """Offsets of every keyed record with a value (markers included, as in Kafka's test)."""
    return [r.offset for b in batches(log) for r in b.records() if r.key is not None and r.value is not None]


def last_offsets_per_batch(log: Log) -> list[int]:
    return [b.last_offset for b in batches(log)]


def last_sequences(log: Log) -> dict[int, int]:
    return {b.producer_id: b.last_sequence for b in batches(log) if b.producer_id >= 0 and not b.is_control_batch}


@contextlib.contextmanager
def interrupted_after_renames(count: int) -> Iterator[None]:
    """Raise KeyboardInterrupt right after the ``count``-th ``os.replace`` inside the block, as a
    signal handled between two bytecodes would; ``os.replace`` is restored on the way out."""
    real_replace = os.replace
    renames = 0

    def replace_then_interrupt(src, dst) -> None:
        nonlocal renames
        real_replace(src, dst)
        renames += 1
        if renames == count:
            raise KeyboardInterrupt

    os.replace = replace_then_interrupt
    try:
        yield
    finally:
        os.replace = real_replace
