"""The one writer of a topic's state store while a run goes on: committed log records become store writes.

:class:`StoreApplier` owns what the store holds relative to the logs: each partition's next offset
in the store, the log start offset the store follows, the apply worker thread of the replica path.
Everything that writes the store during a run goes through it:

* the replica path hands it durable bounds (:meth:`StoreApplier.submit`: the logs' last stable
  offsets after an fsync); the stretch up to each bound is read back ``read_committed`` and applied
  by the :class:`~materializer.apply.worker.ApplyWorker` thread while the next response is appended,
  or in the calling thread when update callbacks want the records one by one;
* the consumer path hands it the records it appended and fsynced (:meth:`StoreApplier.apply_records`);
* a cut log rewinds its partition (:meth:`StoreApplier.rewind`), a raised log start offset drops the
  entries of records below it (:meth:`StoreApplier.drop_below_log_start`).

Invariants: the store never runs ahead of the log (nothing past an fsynced bound is applied), and
after a cut or a raised log start offset the partition holds exactly what a store rebuilt from the
log would hold.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping, MutableSequence

from materializer.adapters.errors import DeserializationError
from materializer.adapters.rocksdb_store import StateStore, StoredValue
from materializer.adapters.serdes import Serde
from materializer.apply.committed import RecordCheck, apply_checked_records, rebuild_store_from_logs
from materializer.apply.store_loader import HeldEntries, LoadResult, apply_threads, load_committed_partitions
from materializer.apply.worker import ApplyWorker
from materializer.stats import MaterializerStats
from materializer.storage.log import Log
from materializer.storage.read_committed import CommittedReader
from materializer.storage.record_batch import Record

__all__ = ["FormatCheck", "StoreApplier", "UpdateCallback"]

logger = logging.getLogger(__name__)

#: ``callback(key, old, new, partition)`` after a record reached the store (see ``Materializer.on_update``).
UpdateCallback = Callable[[bytes, "StoredValue | None", "StoredValue | None", int], None]

#: Bad records logged one by one before only every 10,000th is (``on_bad_record="skip"``).
_SKIP_WARNINGS = 10


class FormatCheck:
    """Whether a record's key and value decode in the configured formats (a tombstone's value is not
    decoded), as a :data:`~materializer.apply.committed.RecordCheck`.

    Args:
        key_serde / value_serde: the formats.
        on_bad_record: ``"fail"``: a bad record raises; ``"skip"``: it is logged, counted in
            ``stats.records_skipped`` and not applied (it stays in the local log).
        stats: where skipped records are counted.

    Raises (call):
        DeserializationError: a bad record with ``on_bad_record="fail"``.
    """

    def __init__(self, key_serde: Serde, value_serde: Serde, on_bad_record: str, stats: MaterializerStats) -> None:
        self._key_serde, self._value_serde = key_serde, value_serde
        self._fail = on_bad_record == "fail"
        self._stats = stats

    def __call__(self, partition: int, record: Record) -> bool:
        if record.key is None:
            return False  # never materialized (counted as a null key by the caller)
        try:
            self._key_serde.decode(record.key, partition, record.offset)
            if record.value is not None:
                self._value_serde.decode(record.value, partition, record.offset)
        except DeserializationError as exc:
            if self._fail:
                raise
            self._stats.records_skipped += 1
            skipped = self._stats.records_skipped
            if skipped <= _SKIP_WARNINGS or skipped % 10_000 == 0:
                logger.warning("skipped (%d so far, kept in the local log, not materialized): %s", skipped, exc)
            return False
        return True


class StoreApplier:
    """Apply committed log records to ``store`` (module docstring).

    Args:
        store: the topic's open state store.
        logs: partition -> open log; read live (partitions added later count).
        stats: the run's statistics (applied records and bytes, next offsets, rewinds...).
        topic: the topic (for messages and the worker's name).
        check: the format check of every record, or None (bytes: nothing to check, the fast path).
        callbacks: the update callbacks, a list the caller may extend while running.
        on_loading: called with a reason before the store loses entries it will get back
            (a rewind): the caller marks the topic incomplete for readers.
        threaded: apply the replica path's stretches on an :class:`ApplyWorker` thread (started by
            :meth:`begin`).

    Thread safety: one ingest thread calls it; only the worker thread applies in the background,
    never at the same time as the ingest thread (every other write drains the worker first).
    """

    def __init__(self, store: StateStore, logs: Mapping[int, Log], stats: MaterializerStats, *, topic: str,
                 check: RecordCheck | None, callbacks: MutableSequence[UpdateCallback],
                 on_loading: Callable[[str], None], threaded: bool) -> None:
        self.store = store
        self._logs = logs
        self._stats = stats
        self._topic = topic
        self.check = check  # the format check every record passes (None: bytes, nothing to check)
        self._callbacks = callbacks
        self._on_loading = on_loading
        self._threaded = threaded
        self._offsets: dict[int, int] = {}  # next offset committed in the store
        # While the store is bulk loaded, the worker's stretches leave their entries here, unwritten,
        # and the next stretch starts at _read_to; drain() writes them (so every other store write,
        # which drains first, sees _read_to == _offsets and nothing held).
        self._held = HeldEntries(apply_threads())
        self._read_to: dict[int, int] = {}
        self._start_offsets: dict[int, int] = {}  # log start offset the store's entries follow
        self._null_key_warned = False
        self._worker: ApplyWorker | None = None

    def begin(self, store: StateStore) -> None:
        """Take over ``store`` once it is reconciled with the logs (at start it may have been rebuilt
        whole): read every partition's offsets from it and start the worker thread (``threaded``)."""
        self.store = store
        stored = store.offsets()
        for partition in self._logs:
            self.add_partition(partition, stored)
        if self._threaded and self._worker is None:
            self._worker = ApplyWorker(self._apply_stable, name=f"materializer-apply-{self._topic}")

    def add_partition(self, partition: int, stored: Mapping[int, int] | None = None) -> None:
        """Start tracking ``partition`` (its log open in ``logs``): its store offset is the store's,
        or the log start offset when the store holds nothing of it yet."""
        log = self._logs[partition]
        stored = self.store.offsets() if stored is None else stored
        self._offsets[partition] = max(stored.get(partition, log.log_start_offset), log.log_start_offset)
        self._start_offsets[partition] = self.store.start_offset(partition)

    def remove_partition(self, partition: int) -> None:
        """Stop tracking ``partition`` (its log is about to be closed): drains first, so nothing of it
        is in flight or held; its store entries and next offset stay in the store. No-op when not
        tracked.

        Raises:
            StoreError / StorageError / DeserializationError: what the drained apply raised.
        """
        self.drain()
        self._offsets.pop(partition, None)
        self._start_offsets.pop(partition, None)
        self._read_to.pop(partition, None)

    def applied_offsets(self) -> dict[int, int]:
        """Partition -> next offset to apply: everything below it is written to the store (the
        offset is taken after the store write). Any thread may call it (a copy is returned)."""
        return dict(self._offsets)

    # -- the two ways records arrive --------------------------------------------------------

    def submit(self, bounds: Mapping[int, int]) -> None:
        """Replica path: apply each partition's committed records up to its bound (``partition ->
        end offset``, the log's last stable offset when it was fsynced): on the worker thread, or
        here (after draining it) when update callbacks want the records in this thread.

        Raises:
            StoreError / StorageError / DeserializationError: what an apply raised (here, or by the
                next call when the worker raised it).
        """
        if not bounds:
            return
        if self._callbacks or self._worker is None:
            self.drain()
            self._apply_stable(bounds)
        else:
            self._worker.submit(bounds)

    def apply_records(self, to_apply: Mapping[int, list[Record]], next_offsets: Mapping[int, int]) -> None:
        """Consumer path: apply records just appended and fsynced (keyed, checked, in offset order per
        partition) and the partitions' next offsets, in one atomic write; call the update callbacks.

        Raises:
            StoreError: the store cannot be written or a next offset would move backwards.
        """
        if not next_offsets:
            return
        updates = self._updates(to_apply) if self._callbacks else ()
        applied_bytes = sum(len(r.key or b"") + len(r.value or b"") for records in to_apply.values() for r in records)
        started = time.monotonic()
        self._stats.records_applied += self.store.apply(to_apply, next_offsets)
        self._stats.apply_s += time.monotonic() - started
        self._stats.bytes_applied += applied_bytes
        for partition, offset in next_offsets.items():
            self._offsets[partition] = offset
            if offset > self._stats.next_offsets.get(partition, 0):
                self._stats.next_offsets[partition] = offset
        for key, old, new, partition in updates:
            for callback in self._callbacks:
                callback(key, old, new, partition)

    def note_null_keys(self, partition: int, count: int) -> None:
        """Count records with a null key (kept in the log, never materialized); warn once."""
        self._stats.null_key_records += count
        if not self._null_key_warned:
            self._null_key_warned = True
            logger.warning("%s-%d has records with a null key: they are kept in the local log but cannot be "
                           "materialized (counted in stats.null_key_records)", self._topic, partition)

    # -- the store follows its logs ------------------------------------------------------------

    def rewind(self, partition: int, cut_offset: int) -> None:
        """Make the store's ``partition`` hold exactly what its log holds after a cut at
        ``cut_offset``: when the store has applied offsets at or past the cut, its entries are
        dropped and rebuilt from the log (values and next offset; :meth:`StateStore.drop_partition`,
        then the committed records from the log start offset), before anything new of the partition
        is applied. A crash in between leaves the partition without a next offset, which the next
        start replays. The worker must be drained (the caller cut the log after draining it).

        Raises:
            StoreError / CorruptRecordError: the store cannot be written, the log cannot be read.
        """
        log = self._logs[partition]
        stored = self._offsets.get(partition)
        if stored is None or stored <= cut_offset:
            self._offsets[partition] = max(stored if stored is not None else log.log_start_offset,
                                           log.log_start_offset)
            return
        self._on_loading(f"rewinding partition {partition} to its cut log")
        dropped = self.store.drop_partition(partition)
        self._start_offsets[partition] = 0
        applied = rebuild_store_from_logs(self.store, {partition: log}, keep=self.check)
        next_offset = self.store.offsets().get(partition, log.log_start_offset)
        logger.warning("%s-%d: the state store had applied offsets up to %d; rewound it to the cut log (%d entries "
                       "dropped, %d records applied again, next offset %d)", self._topic, partition, stored, dropped,
                       applied, next_offset)
        self._stats.store_rewinds += 1
        self._stats.records_replayed += applied
        self._offsets[partition] = next_offset

    def drop_below_log_start(self, partitions: Iterable[int] | None = None) -> None:
        """Drop the store entries of records below each log start offset that moved (they are gone
        from the log, so from what a consumer of the topic reads now and from a store rebuilt from
        the log; :meth:`StateStore.drop_below`). A comparison per partition when none moved, so the
        fetch paths call it every round.

        Called from the ingest thread, it first drains the worker and writes the entries a bulk load
        held back when a log start offset moved (the cleaner threads' retention, the leader's log
        start): an apply in flight or held may still write entries below the new start, and the
        drop must come after them, or those entries would stay while the store records the new
        start as already followed.

        Raises:
            StoreError / StorageError / DeserializationError: what the drained apply raised, or the
                store cannot be written.
        """
        moved = [p for p in sorted(self._logs if partitions is None else partitions)
                 if p in self._logs and self._logs[p].log_start_offset > self._start_offsets.get(p, 0)]
        if not moved:
            return
        if self._worker is None or not self._worker.is_current_thread():
            self.drain()
        self._drop_below_log_start(moved)

    def _drop_below_log_start(self, partitions: Iterable[int]) -> None:
        """:meth:`drop_below_log_start` by the store's only writer at that moment (the worker, or
        the ingest thread with the worker idle): one atomic write per partition, the entries and
        the partition's offsets together."""
        for partition in partitions:
            log = self._logs[partition]
            start = log.log_start_offset
            if start <= self._start_offsets.get(partition, 0):
                continue
            dropped = self.store.drop_below(partition, start)
            self._start_offsets[partition] = start
            if self._offsets.get(partition, start) < start:
                self._offsets[partition] = start
            if dropped:
                logger.info("%s-%d: dropped %d state store entries whose latest record is below the log start "
                            "offset %d", self._topic, partition, dropped, start)
                self._stats.store_entries_expired += dropped

    # -- the worker ----------------------------------------------------------------------------

    def drain(self) -> None:
        """Wait for the worker to apply everything submitted (no-op without one).

        Raises:
            StoreError / StorageError / DeserializationError: what an apply raised.
        """
        if self._worker is not None:
            self._worker.drain()
        self._write_held()

    def _write_held(self) -> None:
        """Write the entries the bulk-loading stretches held back (the worker idle, or this is it)."""
        try:
            if self._held:
                started = time.monotonic()
                self._held.write(self.store)
                self._held.release()
                self._stats.apply_s += time.monotonic() - started
        finally:  # slots written before a failed one are in the store: their offsets count
            self._offsets.update(self._held.take_written())
        self._read_to.clear()

    def _drop_held(self) -> None:
        """Forget the held entries: the store's offsets stay where the store is, so the records are
        applied again from the log."""
        self._held.drop()
        self._read_to.clear()

    def restart_worker(self) -> None:
        """Replace the worker (one that failed keeps its failure; a heal goes on with a new one).
        Its queue and the entries it held are dropped: the next bounds submitted cover them."""
        if self._worker is not None:
            self._worker.close()
            self._drop_held()
            self._worker = ApplyWorker(self._apply_stable, name=f"materializer-apply-{self._topic}")

    def close(self) -> None:
        """Stop the worker (what it has not applied is replayed from the log at the next start). Idempotent."""
        worker, self._worker = self._worker, None
        if worker is not None:
            worker.close()
        self._drop_held()

    # -- applying --------------------------------------------------------------------------------

    def _apply_stable(self, bounds: Mapping[int, int]) -> None:
        """Apply each partition's committed records from its store offset up to its bound: all of
        them in one bulk load unless records are checked or update callbacks want them one by one.
        Runs on the worker or, with callbacks, in the ingest thread; never both at once."""
        started = time.monotonic()
        readers = {}
        if self._held and any(self._logs[p].log_start_offset > self._start_offsets.get(p, 0) for p in bounds):
            self._write_held()  # held entries go in before a drop below the new log start
        self._drop_below_log_start(bounds)  # retention by the cleaner threads moves log start offsets too
        for partition, end in bounds.items():
            log = self._logs[partition]
            start = self._read_to.get(partition, self._offsets.get(partition, log.log_start_offset))
            if start < log.log_start_offset:
                # Retention (the cleaner's, on compact,delete topics) deleted records the store had not
                # applied: continue where the log starts, as a consumer with auto.offset.reset=earliest would.
                logger.warning("%s: offsets [%d, %d) were deleted by retention before they reached the state "
                               "store; continuing at the log start offset %d", log.dir.name, start,
                               log.log_start_offset, log.log_start_offset)
                start = log.log_start_offset
            if end > start:
                readers[partition] = CommittedReader.from_log(log, start, end)
        if self._callbacks:
            for partition, reader in readers.items():
                self._apply_with_updates(partition, reader)
        elif self.check is not None:
            for partition, reader in readers.items():
                self._applied(partition, apply_checked_records(self.store, partition, reader, self.check))
        elif readers and self._worker is not None and self._worker.is_current_thread() and self.store.bulk_loading:
            # a bulk load (a cold start): stretches share held entries, written when full or by drain()
            for partition, result in load_committed_partitions(self.store, readers, hold=self._held).items():
                self._applied(partition, result, written=False)
                self._read_to[partition] = result.next_offset
            self._offsets.update(self._held.take_written())
        elif readers:
            for partition, result in load_committed_partitions(self.store, readers).items():
                self._applied(partition, result)
        self._stats.apply_s += time.monotonic() - started

    def _apply_with_updates(self, partition: int, reader: CommittedReader) -> None:
        """Apply one partition's stretch record by record and call the update callbacks."""
        read = list(reader.records())
        records = [r for r in read if r.key is not None]
        keep = [r for r in records if self.check(partition, r)] if self.check is not None else records
        updates = self._updates({partition: keep})
        applied = self.store.apply({partition: keep}, {partition: reader.next_offset})
        written = sum(len(r.key or b"") + len(r.value or b"") for r in keep)
        self._applied(partition, LoadResult(applied, len(read) - len(records), reader.next_offset, written))
        for key, old, new, p in updates:
            for callback in self._callbacks:
                callback(key, old, new, p)

    def _applied(self, partition: int, result: LoadResult, written: bool = True) -> None:
        """Account for one partition's applied stretch: store offset (``written``: the stretch is in
        the store, not held), stats, null keys."""
        stats = self._stats
        stats.bytes_applied += result.bytes_written
        if written:
            self._offsets[partition] = result.next_offset
        stats.records_applied += result.applied
        if result.next_offset > stats.next_offsets.get(partition, 0):
            stats.next_offsets[partition] = result.next_offset
        if result.null_keys:
            self.note_null_keys(partition, result.null_keys)

    def _updates(self, to_apply: Mapping[int, list[Record]]) -> list[tuple[bytes, StoredValue | None,
                                                                         StoredValue | None, int]]:
        """(key, old, new, partition) of each record about to be applied, in order."""
        updates = []
        for partition, records in to_apply.items():
            current: dict[bytes, StoredValue | None] = {}
            for record in records:
                key = record.key
                assert key is not None  # null keys never reach the store
                old = current[key] if key in current else self.store.get(key, partition)
                new = None if record.value is None else StoredValue(partition, record.offset, record.timestamp,
                                                                   record.value)
                current[key] = new
                updates.append((key, old, new, partition))
        return updates
