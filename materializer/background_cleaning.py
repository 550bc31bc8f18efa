"""The log cleaner threads and the retention of one topic while :meth:`Materializer.run` runs (Kafka
``LogManager``'s cleaner and its ``cleanupLogs`` task).

:class:`BackgroundCleaning` owns the :class:`~materializer.storage.log_cleaner.LogCleaner` of a
compacted topic: it starts it on the topic's logs, gives it partitions added later, shuts it down
(rounds in progress aborted, their ``.cleaned`` files removed), adds each round's statistics to the
run's :class:`~materializer.stats.MaterializerStats`, and keeps the damage a cleaner thread found
until the run loop heals it (the threads never touch the store or fetch). The cleaner threads
apply retention to the logs they clean after each attempt, as Kafka's do; otherwise the run loop
asks for it (:meth:`BackgroundCleaning.check_retention`), which after cleaner rounds also has the
store forget the tombstone records whose tombstones the cleaner removed (:mod:`materializer.deletions`).
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

from materializer.apply.applier import StoreApplier
from materializer.config import MaterializerOptions
from materializer.deletions import LiveLogs, expire_tombstones
from materializer.stats import MaterializerStats
from materializer.storage.cleaner_manager import TopicPartition
from materializer.storage.cleaner_stats import CleanerStats
from materializer.storage.errors import CorruptRecordError
from materializer.storage.log import Log
from materializer.storage.log_cleaner import LogCleaner
from materializer.storage.log_config import LogConfig
from materializer.storage.retention import delete_old_segments

__all__ = ["BackgroundCleaning"]

logger = logging.getLogger(__name__)


class BackgroundCleaning:
    """The cleaner threads of ``topic``'s logs in ``data_dir`` (``options.cleaner_config()``; none
    when it is disabled or the topic is not compacted).

    Thread-safety: :meth:`start`, :meth:`stop`, :meth:`add_partitions` and :meth:`take_damage`
    are called by the run loop; the cleaner threads call the round and damage callbacks, which
    write ``stats`` and the damage reports under one lock.
    """

    def __init__(self, data_dir: Path, topic: str, options: MaterializerOptions, stats: MaterializerStats) -> None:
        self._data_dir = data_dir
        self._topic = topic
        self._options = options
        self._stats = stats
        self._lock = threading.Lock()  # stats written by cleaner threads, damage reports
        self.cleaner: LogCleaner | None = None
        self._logs: dict[TopicPartition, Log] | None = None  # the manager re-reads it: partitions added later
        self._damaged: dict[int, CorruptRecordError] = {}  # partition -> damage a cleaner thread found
        self._rounds_unswept = 0  # cleaner rounds since the store last forgot removed tombstones

    @property
    def running(self) -> bool:
        """True while the cleaner threads run (they also apply retention to the compacted logs)."""
        return self.cleaner is not None

    def start(self, logs: dict[int, Log], log_config: LogConfig | None) -> None:
        """Start the cleaner threads on ``logs`` (partition -> log) when the topic is compacted and
        cleaning is enabled; no-op when running already."""
        config = self._options.cleaner_config()
        if self.cleaner is not None or config is None or not logs or log_config is None or not log_config.compact:
            return
        self._logs = {(self._topic, partition): log for partition, log in logs.items()}
        cleaner = LogCleaner(self._data_dir, self._logs, config, on_round=self._add_round, on_damage=self._on_damage)
        logger.info("starting %d log cleaner thread(s) on %s (dedupe buffer %d bytes, backoff %d ms)",
                    config.num_threads, self._topic, config.dedupe_buffer_size_bytes, config.backoff_ms)
        cleaner.startup()
        self.cleaner = cleaner

    def add_partitions(self, logs: dict[int, Log], partitions: list[int]) -> None:
        """Clean ``partitions`` (added to the topic since start) too, when running."""
        if self._logs is not None:
            for partition in partitions:
                self._logs[(self._topic, partition)] = logs[partition]

    def stop(self) -> None:
        """Shut the cleaner down and wait for its threads (a round in progress is aborted)."""
        cleaner, self.cleaner = self.cleaner, None
        self._logs = None
        if cleaner is None:
            return
        cleaner.shutdown(timeout_s=None)
        with self._lock:
            self._stats.cleaner_checkpoints_reset += cleaner.cleaner_manager.corrupt_checkpoints_reset
            self._stats.cleaner_threads_died += cleaner.dead_thread_count
        if cleaner.dead_thread_count:
            logger.warning("%d log cleaner thread(s) of %s died; see the log above", cleaner.dead_thread_count,
                           self._topic)

    def check_retention(self, logs: dict[int, Log], applier: StoreApplier, now_ms: int | None = None) -> int:
        """Apply retention (:func:`~materializer.storage.retention.delete_old_segments`:
        ``retention.ms``, ``retention.bytes``, log start offset) to ``logs`` now, unless the cleaner
        threads run (they apply it to the compacted logs themselves); the store (``applier``'s)
        drops the keys whose latest record fell below a raised log start offset. After cleaner
        rounds, the store forgets the tombstone records below each cleaner checkpoint whose
        tombstone is gone (:func:`~materializer.deletions.expire_tombstones`). ``now_ms``
        defaults to the wall clock. Returns the segments deleted.

        Raises:
            StoreError: the drained apply failed, or the store cannot be written.
            StorageError: a segment cannot be deleted.
        """
        self._expire_tombstones(logs, applier)
        if self.running:
            return 0
        applier.drain()  # no apply reads a segment retention deletes
        deleted = 0
        for _, log in sorted(logs.items()):
            before = log.log_start_offset
            count = delete_old_segments(log, now_ms)
            if count:
                logger.info("retention deleted %d segment(s) of %s; log start offset %d -> %d", count, log.dir.name,
                            before, log.log_start_offset)
            deleted += count
        if deleted:
            applier.drop_below_log_start()
        self._stats.retention_checks += 1
        self._stats.retention_segments_deleted += deleted
        return deleted

    def _expire_tombstones(self, logs: dict[int, Log], applier: StoreApplier) -> int:
        """After cleaner rounds: the store (its writer, the worker drained) forgets the tombstone
        records below each partition's cleaner checkpoint that the log no longer confirms. Returns
        how many."""
        with self._lock:
            rounds, self._rounds_unswept = self._rounds_unswept, 0
        cleaner = self.cleaner
        if not rounds or cleaner is None:
            return 0
        cleaned = cleaner.cleaner_manager.all_cleaner_checkpoints()
        applier.drain()
        source = LiveLogs(lambda: logs)
        forgotten = sum(expire_tombstones(applier.store, partition, source, cleaned[(self._topic, partition)])
                        for partition in sorted(logs) if (self._topic, partition) in cleaned)
        if forgotten:
            logger.info("%s: forgot %d tombstone record(s) whose tombstones the cleaner removed", self._topic,
                        forgotten)
        return forgotten

    def take_damage(self) -> dict[int, CorruptRecordError]:
        """The damage cleaner threads reported since the last call (partition -> error), cleared."""
        with self._lock:
            damaged, self._damaged = self._damaged, {}
        return damaged

    def _on_damage(self, topic_partition: TopicPartition, exc: CorruptRecordError) -> None:
        """A cleaner thread found a corrupt batch: the run loop heals the log."""
        with self._lock:
            self._damaged[topic_partition[1]] = exc

    def _add_round(self, round_stats: CleanerStats) -> None:
        """Add one completed round's ``CleanerStats`` (called from a cleaner thread)."""
        with self._lock:
            stats = self._stats
            stats.cleaner_rounds += 1
            self._rounds_unswept += 1
            stats.cleaner_bytes_read += round_stats.bytes_read
            stats.cleaner_bytes_written += round_stats.bytes_written
            stats.cleaner_records_read += round_stats.messages_read
            stats.cleaner_records_written += round_stats.messages_written
            cleaner = self.cleaner
            if cleaner is not None:
                stats.cleaner_max_dirty_ratio = cleaner.cleaner_manager.dirtiest_log_cleanable_ratio
