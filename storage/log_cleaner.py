"""Background log cleaning and the one-shot ``clean_log`` entry point (Kafka ``LogCleaner``).

``LogCleaner`` runs ``CleanerConfig.num_threads`` daemon threads. Each loop of a thread
(``LogCleaner.CleanerThread.doWork``):

1. ``LogCleanerManager.grab_filthiest_compacted_log`` picks the eligible compacted log with the
   highest cleanable ratio and marks it in progress; the thread cleans it with its own
   ``Cleaner`` (one offset map per thread), logs the round's statistics and calls
   ``done_cleaning`` (checkpoint = end offset). A failing log is marked uncleanable.
2. It then runs retention (:func:`.retention.delete_old_segments`) on every compacted log that
   is not being cleaned (``deletable_logs`` / ``done_deleting``).
3. If nothing was cleaned it sleeps ``backoff_ms`` (woken early by :meth:`LogCleaner.shutdown`
   or :meth:`LogCleaner.wakeup`).

:func:`clean_log` cleans one log now, ignoring ``min.cleanable.dirty.ratio``, optionally up to a
caller-forced first uncleanable offset (``materializer compact --upto-offset N``), and writes
the new first dirty offset to the data dir's ``cleaner-offset-checkpoint``.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Mapping, Sequence

from .clock import wall_clock_ms
from .checkpoint import CLEANER_OFFSET_CHECKPOINT, read_offset_checkpoint, update_offset_checkpoint
from .cleaner import Cleaner, EmptyBatchUpperBound
from .cleaner_config import CleanerConfig
from .cleaner_manager import (
    LogCleanerManager,
    LogCleaningError,
    LogToClean,
    TopicPartition,
    cleanable_offsets,
)
from .cleaner_stats import CleanerStats, PreCleanStats, format_cleaner_stats
from .errors import CorruptRecordError, LogCleaningAbortedError
from .offset_map import new_offset_map
from .retention import delete_old_segments
from .segment_split import split_segment_at

if TYPE_CHECKING:  # pragma: no cover
    from .log import Log

__all__ = ["LogCleaner", "CleaningRound", "CleanResult", "RoundTotals", "clean_log"]

logger = logging.getLogger("materializer.storage.log_cleaner")



@dataclass(frozen=True)
class CleaningRound:
    """One round: the dirty section ``[first_dirty_offset, end_offset)`` it cleaned and its stats."""

    first_dirty_offset: int
    end_offset: int
    stats: CleanerStats


class RoundTotals:
    """Totals over ``self.rounds`` (a sequence of :class:`CleaningRound`), Kafka's per-round
    "MB of log processed" figures summed: bytes and records read by the recopy passes and
    written to cleaned segments."""

    rounds: Sequence[CleaningRound]

    @property
    def bytes_read(self) -> int:
        """Bytes read by the recopy passes of all rounds."""
        return sum(r.stats.bytes_read for r in self.rounds)

    @property
    def bytes_written(self) -> int:
        """Bytes written to cleaned segments in all rounds."""
        return sum(r.stats.bytes_written for r in self.rounds)

    @property
    def records_read(self) -> int:
        """Records read by the recopy passes of all rounds."""
        return sum(r.stats.messages_read for r in self.rounds)

    @property
    def records_written(self) -> int:
        """Records written to cleaned segments in all rounds."""
        return sum(r.stats.messages_written for r in self.rounds)


@dataclass
class CleanResult(RoundTotals):
    """Outcome of :func:`clean_log`: the rounds run and the checkpoint written (``end_offset``)."""

    topic_partition: TopicPartition
    first_dirty_offset: int
    end_offset: int
    rounds: list[CleaningRound] = field(default_factory=list)


def _checkpoint_path(log: "Log") -> Path:
    return Path(log.dir).parent / CLEANER_OFFSET_CHECKPOINT


def clean_log(
    log: "Log",
    *,
    first_uncleanable_offset: int | None = None,
    now_ms: int | None = None,
    cleaner: Cleaner | None = None,
    split_segment: bool = False,
) -> CleanResult:
    """Clean ``log`` now, regardless of ``min.cleanable.dirty.ratio``; returns what was done.

    Follows Kafka ``LogCleaner.CleanerThread.cleanLog`` for one log, outside the cleaner threads.
    The dirty section starts at the checkpointed first dirty offset (``cleaner-offset-checkpoint``
    of ``log.dir.parent``; reset to the log start offset when missing or out of range).

    * ``first_uncleanable_offset=None``: the section ends where Kafka's cleaner would stop now
      (last stable offset, active segment, ``min.compaction.lag.ms``; rounded down to a segment
      base offset).
    * ``first_uncleanable_offset=N``: the offset map covers exactly ``[first_dirty, N)`` and records
      from ``N`` on are kept as they are: batches starting at or after ``N`` are copied verbatim
      when their segment is recopied (no filtering, no delete horizon), as Kafka leaves its
      uncleanable segments alone; a batch straddling ``N`` is filtered below ``N`` and, per Kafka's
      batch rule, gets a delete horizon if it keeps a tombstone. If ``N`` is beyond the active
      segment's base offset the active segment is rolled first. ``N`` below the first dirty
      offset cleans nothing. With ``split_segment=True`` the inactive segment holding ``N`` is
      first split at ``N`` (:func:`.segment_split.split_segment_at`, crash-safe), so that - as on
      a broker, whose first uncleanable offset is always a segment base offset - no batch
      straddles ``N`` and every record from ``N`` on stays byte for byte as it was.

    ``now_ms`` (ms since the epoch, default: the wall clock) drives ``min.compaction.lag.ms`` and
    delete horizons. ``cleaner`` carries the offset map, its load factor and the emptied-batch
    rule (``empty_batch_upper_bound``); default: ``Cleaner()`` (128 MiB map, Kafka 4.3 rule).

    Rounds repeat while the offset map fills before the end of the section, so the checkpoint
    written at the end is the section's end (``N`` when forced). The checkpoint file is written
    when a round ran or the stored checkpoint was out of range; only this partition's entry is
    changed, under the file's ``flock`` (:func:`.checkpoint.update_offset_checkpoint`), so logs
    of one data dir may be cleaned by ``clean_log`` calls in parallel threads or processes.

    Raises:
        ValueError: ``N`` is beyond the log end offset or the last stable offset (an open transaction).
        CorruptRecordError: a segment holds a corrupt batch.
    """
    tp: TopicPartition = (log.topic, log.partition)
    now = wall_clock_ms() if now_ms is None else now_ms
    if cleaner is None:
        cleaner = Cleaner()
    with log.lock:
        last_clean = read_offset_checkpoint(_checkpoint_path(log)).get(tp)
        offsets = cleanable_offsets(log, last_clean, now)
        first_dirty = offsets.first_dirty_offset
        if first_uncleanable_offset is None:
            upper = LogToClean.of(log, first_dirty, offsets.first_uncleanable_dirty_offset).first_uncleanable_offset
        else:
            upper = first_uncleanable_offset
            if upper > log.log_end_offset:
                raise ValueError(
                    f"first uncleanable offset {upper} is beyond the log end offset {log.log_end_offset} of {log.dir}"
                )
            lso = log.last_stable_offset
            if upper > lso:
                raise ValueError(
                    f"first uncleanable offset {upper} is beyond the last stable offset {lso} of {log.dir} "
                    "(an open transaction); Kafka never cleans past it"
                )
            if upper > log.active_segment.base_offset:
                log.roll()
            if split_segment:
                split_segment_at(log, upper)
    result = CleanResult(tp, first_dirty, first_dirty)
    dirty = first_dirty
    while dirty < upper:
        end_offset, stats = cleaner.do_clean(log, dirty, upper, now, protect_from_offset=first_uncleanable_offset)
        end_offset = min(max(end_offset, dirty), upper) if first_uncleanable_offset is not None else end_offset
        result.rounds.append(CleaningRound(dirty, end_offset, stats))
        logger.info("%s", format_cleaner_stats(cleaner.id, log.dir.name, dirty, end_offset, stats))
        if end_offset <= dirty:
            break
        dirty = end_offset
    result.end_offset = dirty
    if result.rounds or offsets.force_update_checkpoint:
        # merged under the checkpoint's flock: cleaners of other partitions (threads, processes) write it too
        update_offset_checkpoint(_checkpoint_path(log), {tp: dirty})
    return result


class _ThreadShutdown(Exception):
    """Raised inside a cleaner thread's check to unwind a round on shutdown."""


class LogCleaner:
    """Background cleaner threads over ``logs`` (Kafka ``LogCleaner``). Thread-safe.

    Args:
        data_dirs: folders whose ``cleaner-offset-checkpoint`` files are maintained.
        logs: ``(topic, partition) -> Log``, read anew on every selection (may change).
        config: thread count, offset map budget, backoff (``CleanerConfig``).
        clock_ms: wall clock in ms used for selection, horizons and retention.
        empty_batch_upper_bound: see :class:`.cleaner.Cleaner`.
        on_round: called with each completed round's ``CleanerStats``, from the cleaner thread
            that ran it, after the checkpoint was written (Kafka ``CleanerThread.recordStats``: the
            one place round statistics come out). Aborted rounds are not reported.
        on_damage: called with ``(topic partition, CorruptRecordError)`` from a cleaner thread that
            found a corrupt batch in a log it was cleaning (the log is also marked uncleanable, as
            Kafka marks it), so that the log's owner can recover it and fetch the cut offsets again.
    """

    def __init__(
        self,
        data_dirs: Path | str | Sequence[Path | str],
        logs: Mapping[TopicPartition, "Log"],
        config: CleanerConfig | None = None,
        *,
        clock_ms: Callable[[], int] = wall_clock_ms,
        empty_batch_upper_bound: EmptyBatchUpperBound = "round",
        on_round: Callable[[CleanerStats], None] | None = None,
        on_damage: Callable[[TopicPartition, CorruptRecordError], None] | None = None,
    ):
        self.config = config or CleanerConfig()
        self.on_round = on_round
        self.on_damage = on_damage
        self.cleaner_manager = LogCleanerManager(data_dirs, logs)
        self.clock_ms = clock_ms
        self.empty_batch_upper_bound = empty_batch_upper_bound
        self._threads: list[_CleanerThread] = []
        self._lock = threading.Lock()

    @property
    def logs(self) -> Mapping[TopicPartition, "Log"]:
        """The logs the cleaner chooses from."""
        return self.cleaner_manager.logs

    def startup(self) -> None:
        """Start ``num_threads`` cleaner threads (no-op if already running)."""
        with self._lock:
            if self._threads:
                return
            logger.info("Starting the log cleaner")
            for i in range(self.config.num_threads):
                thread = _CleanerThread(self, i)
                self._threads.append(thread)
                thread.start()

    def shutdown(self, timeout_s: float | None = 30.0) -> None:
        """Stop the threads, aborting rounds in progress (their ``.cleaned`` files are removed)."""
        with self._lock:
            threads, self._threads = self._threads, []
        logger.info("Shutting down the log cleaner.")
        for thread in threads:
            thread.initiate_shutdown()
        for thread in threads:
            thread.join(timeout_s)

    def wakeup(self) -> None:
        """Cut the current backoff sleep of every thread short."""
        for thread in list(self._threads):
            thread.wake.set()

    def __enter__(self) -> "LogCleaner":
        self.startup()
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()

    def abort_cleaning(self, topic_partition: TopicPartition) -> None:
        """Abort the partition's cleaning if in progress and wait for it."""
        self.cleaner_manager.abort_cleaning(topic_partition)

    def abort_and_pause_cleaning(self, topic_partition: TopicPartition) -> None:
        """Abort and pause the partition's cleaning (before truncating or deleting its log)."""
        self.cleaner_manager.abort_and_pause_cleaning(topic_partition)

    def resume_cleaning(self, topic_partitions: Sequence[TopicPartition]) -> None:
        """Undo one pause per partition."""
        self.cleaner_manager.resume_cleaning(topic_partitions)

    @property
    def threads(self) -> list["_CleanerThread"]:
        """The running cleaner threads."""
        return list(self._threads)

    @property
    def dead_thread_count(self) -> int:
        """Threads that died of an unexpected error (Kafka's DeadThreadCount)."""
        return sum(1 for t in self._threads if t.failed)

    def await_cleaned(self, topic_partition: TopicPartition, offset: int, timeout_s: float = 60.0) -> bool:
        """Wait until the partition's checkpoint is ``>= offset``; True if it got there in time."""
        deadline = time.monotonic() + timeout_s
        while True:
            if self.cleaner_manager.all_cleaner_checkpoints().get(topic_partition, -1) >= offset:
                return True
            if time.monotonic() >= deadline:
                return False
            self.wakeup()
            time.sleep(min(0.05, max(deadline - time.monotonic(), 0)))


class _CleanerThread(threading.Thread):
    """One cleaner thread (Kafka ``LogCleaner.CleanerThread``)."""

    def __init__(self, owner: LogCleaner, thread_id: int):
        super().__init__(name=f"kafka-log-cleaner-thread-{thread_id}", daemon=True)
        self.owner = owner
        self.thread_id = thread_id
        config = owner.config
        self.manager = owner.cleaner_manager
        self.cleaner = Cleaner(
            thread_id,
            new_offset_map(config.offset_map_memory_bytes),
            load_factor=config.dedupe_buffer_load_factor,
            io_buffer_size_bytes=config.io_buffer_size_per_thread_bytes,
            check_done=self._check_done,
            clock_ms=owner.clock_ms,
            empty_batch_upper_bound=owner.empty_batch_upper_bound,
        )
        self.wake = threading.Event()
        self._running = True
        self.failed = False
        self.last_stats = CleanerStats()
        self.last_pre_clean_stats = PreCleanStats()

    def initiate_shutdown(self) -> None:
        self._running = False
        self.wake.set()

    def _check_done(self, topic_partition: TopicPartition) -> None:
        if not self._running:
            raise _ThreadShutdown()
        self.manager.check_cleaning_aborted(topic_partition)

    def run(self) -> None:
        try:
            while self._running:
                cleaned = self._try_clean_filthiest_log()
                if not cleaned and self._running:
                    self.wake.wait(self.owner.config.backoff_ms / 1000.0)
                    self.wake.clear()
                self.manager.maintain_uncleanable_partitions()
        except _ThreadShutdown:
            pass
        except BaseException:  # pragma: no cover - reported through dead_thread_count
            self.failed = True
            logger.exception("Log cleaner thread %d died", self.thread_id)

    def _try_clean_filthiest_log(self) -> bool:
        try:
            return self._clean_filthiest_log()
        except LogCleaningError as exc:
            log = self.manager.logs.get(exc.topic_partition)
            logger.warning(
                "Unexpected exception thrown when cleaning log %s. Marking its partition (%s) as uncleanable",
                exc.topic_partition, exc.topic_partition, exc_info=True,
            )
            data_dir = Path(log.dir).parent if log is not None else Path(".")
            self.manager.mark_partition_uncleanable(data_dir, exc.topic_partition)
            damage = exc.__cause__
            if isinstance(damage, CorruptRecordError) and self.owner.on_damage is not None:
                self.owner.on_damage(exc.topic_partition, damage)
            return False

    def _clean_filthiest_log(self) -> bool:
        pre_clean_stats = PreCleanStats()
        now = self.owner.clock_ms()
        ltc = self.manager.grab_filthiest_compacted_log(now, pre_clean_stats)
        cleaned = False
        if ltc is not None:
            self.last_pre_clean_stats = pre_clean_stats
            try:
                self._clean_log(ltc, now)
                cleaned = True
            except _ThreadShutdown:
                raise
            except Exception as exc:
                raise LogCleaningError(str(exc), topic_partition=ltc.topic_partition) from exc
        deletable = self.manager.deletable_logs()
        try:
            for tp, log in deletable.items():
                try:
                    delete_old_segments(log, self.owner.clock_ms())
                except Exception as exc:
                    raise LogCleaningError(str(exc), topic_partition=tp) from exc
        finally:
            self.manager.done_deleting(list(deletable))
        return cleaned

    def _clean_log(self, cleanable: LogToClean, now_ms: int) -> None:
        start_offset = cleanable.first_dirty_offset
        end_offset = start_offset
        try:
            end_offset, stats = self.cleaner.clean(cleanable, now_ms)
            self.last_stats = stats
            logger.info("%s", format_cleaner_stats(self.thread_id, cleanable.log.dir.name, start_offset, end_offset, stats))
            if self.last_pre_clean_stats.delayed_partitions > 0:
                logger.info(
                    "\tCleanable partitions: %d, Delayed partitions: %d, max delay: %d",
                    self.last_pre_clean_stats.cleanable_partitions, self.last_pre_clean_stats.delayed_partitions,
                    self.last_pre_clean_stats.max_compaction_delay_ms,
                )
            if stats.invalid_messages_read > 0:
                logger.warning("\tFound %d invalid messages during compaction.", stats.invalid_messages_read)
        except LogCleaningAbortedError:
            return  # aborted by abort_and_pause_cleaning; let it go (done_cleaning still runs)
        finally:
            self.manager.done_cleaning(cleanable.topic_partition, Path(cleanable.log.dir).parent, end_offset)
        if self.owner.on_round is not None:
            self.owner.on_round(stats)
