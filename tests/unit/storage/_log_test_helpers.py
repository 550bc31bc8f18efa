"""Helpers shared by the segment/log unit tests: build v2 batches with chosen offsets and timestamps."""

from __future__ import annotations

from materializer.storage.record_batch_builder import RecordBatchBuilder

__all__ = ["make_batch", "make_batches"]


def make_batch(base_offset: int, count: int = 1, *, timestamp: int = 1000, value_bytes: int = 10,
               offsets: list[int] | None = None, timestamps: list[int] | None = None) -> bytes:
    """One uncompressed batch with ``count`` records at consecutive offsets (or ``offsets``)."""
    offsets = offsets if offsets is not None else [base_offset + i for i in range(count)]
    builder = RecordBatchBuilder(base_offset)
    for i, offset in enumerate(offsets):
        ts = timestamps[i] if timestamps is not None else timestamp + (offset - base_offset)
        builder.append(offset, ts, b"key-%d" % offset, b"v" * value_bytes)
    return builder.build()


def make_batches(start: int, n: int, per_batch: int = 1, **kwargs) -> list[bytes]:
    """``n`` consecutive batches of ``per_batch`` records starting at offset ``start``."""
    return [make_batch(start + i * per_batch, per_batch, **kwargs) for i in range(n)]
