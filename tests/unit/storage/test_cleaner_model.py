"""The cleaner against a hand-written model of Kafka's compaction, on workloads that write one key
several times in a row: twice at adjacent offsets in one batch and across two batches, a tombstone
right after a value and a value right after a tombstone (both ways), runs of three, and random
workloads where the next record repeats the previous key half the time.

The model (:func:`_model_round`) is Kafka's rule for one round over ``[0, upto)`` (``Cleaner.cleanInto``
with ``shouldRetainRecord``, KIP-534 delete horizons): of the records below ``upto`` only the last of
each key stays; a tombstone that stays gets the delete horizon ``now + delete.retention.ms`` the
first time a round keeps it and is dropped by the first round at or past that horizon; records from
``upto`` on are untouched. A cleaner that keeps the first of two adjacent writes of a key serves the
older value after a reader's tombstone is gone (the key comes back), which only these workloads show:
the other hand models write keys round-robin (``offset % keys``), never twice in a row.

Every round runs on both kinds of offset map: :class:`SkimpyOffsetMap` (the default; its map and
recopy passes are native) and :class:`DigestDictOffsetMap` (the Python passes).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

import pytest

from materializer.storage.cleaner import Cleaner
from materializer.storage.compression import CompressionType
from materializer.storage.log import Log
from materializer.storage.log_cleaner import clean_log
from materializer.storage.offset_map import DigestDictOffsetMap, SkimpyOffsetMap
from materializer.storage.record_batch_builder import RecordBatchBuilder

from .cleaner_fixtures import make_log

NOW = 1_700_000_000_000
RETENTION_MS = 1_000
MAPS = {"skimpy": SkimpyOffsetMap, "digest-dict": DigestDictOffsetMap}
CODECS = (CompressionType.NONE, CompressionType.NONE, CompressionType.ZSTD, CompressionType.LZ4,
          CompressionType.GZIP, CompressionType.SNAPPY)


@dataclass
class Kept:
    """A record of the model's log: offset, key, value (None: tombstone) and, for a tombstone a
    round kept, its delete horizon (ms)."""

    offset: int
    key: bytes
    value: bytes | None
    horizon: int | None = None


def _model_round(log: list[Kept], upto: int, now_ms: int) -> list[Kept]:
    """Kafka's result of one round over ``[0, upto)`` at ``now_ms`` (module docstring)."""
    last = {r.key: r.offset for r in log if r.offset < upto}
    out = []
    for r in log:
        if r.offset >= upto:
            out.append(r)  # past the round: untouched, no delete horizon
        elif last[r.key] != r.offset:
            continue  # a later record of its key is below upto
        elif r.value is not None:
            out.append(r)
        elif r.horizon is None:
            out.append(Kept(r.offset, r.key, None, now_ms + RETENTION_MS))  # kept: its horizon starts now
        elif now_ms < r.horizon:
            out.append(r)
    return out


def _append(log: Log, model: list[Kept], batches: list[list[tuple[bytes, bytes | None]]],
            rng: random.Random) -> list[int]:
    """Append ``batches`` (one codec drawn per batch) to ``log`` and ``model``; returns their base offsets."""
    bases = []
    for records in batches:
        base = log.log_end_offset
        builder = RecordBatchBuilder(base, compression=rng.choice(CODECS))
        for i, (key, value) in enumerate(records):
            builder.append(base + i, NOW - 10_000, key, value)
            model.append(Kept(base + i, key, value))
        log.append_batch(builder.build())
        bases.append(base)
    return bases


def _read(log: Log) -> list[tuple[int, bytes, bytes | None]]:
    return [(r.offset, r.key, r.value) for r in log.read_records()]


def _expected(model: list[Kept]) -> list[tuple[int, bytes, bytes | None]]:
    return [(r.offset, r.key, r.value) for r in model]


def _clean(log: Log, map_kind: str, upto: int, now_ms: int) -> None:
    clean_log(log, first_uncleanable_offset=upto, now_ms=now_ms, split_segment=True,
              cleaner=Cleaner(offset_map=MAPS[map_kind](24 * 4096), clock_ms=lambda: now_ms))


def _latest(rows) -> dict[bytes, bytes]:
    """What a reader of the whole log serves: key -> value of its last record, tombstones removing it."""
    state: dict[bytes, bytes] = {}
    for _, key, value in rows:
        if value is None:
            state.pop(key, None)
        else:
            state[key] = value
    return state


# the key x written at adjacent offsets; a, b, c are its values, None a tombstone
PATTERNS = {
    "twice in one batch": [[(b"x", b"a"), (b"x", b"b")]],
    "twice across two batches": [[(b"x", b"a")], [(b"x", b"b")]],
    "tombstone after a value in one batch": [[(b"x", b"a"), (b"x", None)]],
    "tombstone after a value across two batches": [[(b"x", b"a")], [(b"x", None)]],
    "value after a tombstone in one batch": [[(b"x", None), (b"x", b"b")]],
    "value after a tombstone across two batches": [[(b"x", None)], [(b"x", b"b")]],
    "three times, the last in the next batch": [[(b"y", b"1"), (b"x", b"a"), (b"x", b"b")], [(b"x", b"c")]],
    "value, tombstone, value in one batch": [[(b"x", b"a"), (b"x", None), (b"x", b"c")]],
    "two tombstones in one batch": [[(b"x", b"a")], [(b"x", None), (b"x", None)]],
    "two keys, each twice": [[(b"x", b"a"), (b"x", b"b"), (b"y", b"1"), (b"y", None)]],
}


@pytest.mark.parametrize("map_kind", sorted(MAPS))
@pytest.mark.parametrize("pattern", sorted(PATTERNS))
def test_adjacent_writes_of_one_key_keep_only_the_last(tmp_path: Path, pattern: str, map_kind: str) -> None:
    """A first round keeps the last write of x (a tombstone too, with a delete horizon); a second
    round past the horizon removes that tombstone, and the key stays gone."""
    rng = random.Random(pattern)
    log = make_log(tmp_path, segment_bytes=1 << 20, delete_retention_ms=RETENTION_MS)
    model: list[Kept] = []
    written = [[(b"w", b"0")], *PATTERNS[pattern], [(b"z", b"9")], [(b"w", b"1")]]
    try:
        _append(log, model, written[:-1], rng)
        upto = log.log_end_offset
        _clean(log, map_kind, upto, NOW)
        model = _model_round(model, upto, NOW)
        assert _read(log) == _expected(model)
        _append(log, model, written[-1:], rng)  # a dirty section for the second round, x untouched
        upto = log.log_end_offset
        _clean(log, map_kind, upto, NOW + RETENTION_MS)
        model = _model_round(model, upto, NOW + RETENTION_MS)
        assert _read(log) == _expected(model)
        assert [v for _, k, v in _read(log) if k == b"x"] in ([], [_latest_of(written, b"x")])
        assert _latest(_read(log)) == _latest((0, k, v) for batch in written for k, v in batch)
    finally:
        log.close()


def _latest_of(batches, key: bytes) -> bytes | None:
    return [v for batch in batches for k, v in batch if k == key][-1]


def _sticky_batches(rng: random.Random, batches: int, keys: int, *, repeat: float,
                    tombstones: float, tag: str) -> list[list[tuple[bytes, bytes | None]]]:
    """``batches`` batches of 1-6 records; each record repeats the previous one's key with
    probability ``repeat`` (also across batches), else picks one of ``keys`` keys."""
    out, previous, seq = [], None, 0
    for _ in range(batches):
        records = []
        for _ in range(rng.randint(1, 6)):
            key = previous if previous is not None and rng.random() < repeat else b"k%d" % rng.randrange(keys)
            records.append((key, None if rng.random() < tombstones else f"{tag}{seq}".encode()))
            previous, seq = key, seq + 1
        out.append(records)
    return out


@pytest.mark.parametrize("map_kind", sorted(MAPS))
@pytest.mark.parametrize("seed", range(6))
def test_rounds_over_workloads_that_repeat_keys_equal_the_model(tmp_path: Path, seed: int, map_kind: str) -> None:
    """Three rounds (two below the log end, the third past the delete horizon) over a log of many
    segments; every round's result equals the model's, and so what a reader serves."""
    rng = random.Random(seed)
    log = make_log(tmp_path, segment_bytes=900, delete_retention_ms=RETENTION_MS)
    model: list[Kept] = []
    try:
        repeats = 0
        for round_number, now in enumerate((NOW, NOW + 10, NOW + RETENTION_MS + 10)):
            batches = _sticky_batches(rng, 40, 15, repeat=0.5, tombstones=0.25, tag=f"r{round_number}-")
            records = [r for batch in batches for r in batch]
            repeats += sum(a[0] == b[0] for a, b in zip(records, records[1:]))
            bases = _append(log, model, batches, rng)
            # the first two rounds end at a batch boundary inside what was just appended; the last at the end
            upto = log.log_end_offset if round_number == 2 else rng.choice(bases[len(bases) // 2:])
            _clean(log, map_kind, upto, now)
            model = _model_round(model, upto, now)
            rows = _read(log)
            assert rows == _expected(model), f"round {round_number} (upto {upto})"
            assert _latest(rows) == _latest(_expected(model))
        assert repeats > 50  # the workload did write keys twice in a row
        assert len(log.log_segments()) > 3
    finally:
        log.close()
def _starts_batch(log: Log, offset: int) -> bool:
    return any(batch.base_offset == offset for segment in log.log_segments()
               for _, batch in segment.log.batches_from(0))
