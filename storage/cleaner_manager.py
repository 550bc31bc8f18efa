"""Which log to clean next, how far, and the per-partition cleaning state (Kafka ``LogCleanerManager``).

The ``cleaner-offset-checkpoint`` file of each data directory holds, per partition, the
*first dirty offset*: the end offset of the last successful cleaning round. A log is split into::

    [log_start_offset, first_dirty_offset)           clean section (keys unique after cleaning)
    [first_dirty_offset, first_uncleanable_offset)   cleanable dirty section
    [first_uncleanable_offset, log_end_offset)       uncleanable (active segment, lag, LSO)

Selection (``grabFilthiestCompactedLog``): among logs with ``compact`` in ``cleanup.policy`` that
are neither being cleaned/paused nor marked uncleanable and have ``total_bytes > 0``, a log is
eligible when ``cleanable_ratio > min.cleanable.dirty.ratio`` (strictly) or it is overdue
(``max.compaction.lag.ms`` passed) and has cleanable bytes; the one with the highest ratio wins.

Cleaning state machine (Kafka ``LogCleaningState``; a partition absent from the table is "None")::

    None ──grab/deletable_logs──▶ IN_PROGRESS ──done_cleaning/done_deleting──▶ None
    None ──abort_and_pause──▶ Paused(1)
    IN_PROGRESS ──abort_and_pause──▶ ABORTED ──done_cleaning/done_deleting──▶ Paused(1)
    Paused(i) ──abort_and_pause──▶ Paused(i+1)
    Paused(i) ──resume──▶ Paused(i-1) … Paused(1) ──resume──▶ None

Any other transition raises ``IllegalCleaningStateError`` naming the current state.
``abort_and_pause_cleaning`` blocks (on a ``threading.Condition``) until the partition is paused;
a cleaner notices ``ABORTED`` through :meth:`LogCleanerManager.check_cleaning_aborted`, which
raises ``LogCleaningAbortedError``. All methods are thread-safe (one re-entrant lock).

Mirrors ``LogCleanerManager``, ``LogToClean``, ``LogCleaningState`` and ``OffsetsToClean`` of
``org.apache.kafka.storage.internals.log``.
"""

from __future__ import annotations

import logging
import math
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Sequence

from .checkpoint import CLEANER_OFFSET_CHECKPOINT, read_offset_checkpoint, update_offset_checkpoint, write_offset_checkpoint
from .cleaner_stats import PreCleanStats
from .errors import CorruptCheckpointError, LogCleaningAbortedError, StorageError
from .log_config import LONG_MAX

if TYPE_CHECKING:  # pragma: no cover
    from .log import Log

__all__ = [
    "LogCleaningState",
    "LogCleaningPaused",
    "LOG_CLEANING_IN_PROGRESS",
    "LOG_CLEANING_ABORTED",
    "OffsetsToClean",
    "LogToClean",
    "LogCleanerManager",
    "LogCleaningError",
    "IllegalCleaningStateError",
    "cleanable_offsets",
    "calculate_cleanable_bytes",
    "max_compaction_delay",
]

logger = logging.getLogger("materializer.storage.log_cleaner")

TopicPartition = tuple[str, int]


class LogCleaningError(StorageError):
    """Computing or running a cleaning for one log failed (Kafka ``LogCleaningException``).

    ``topic_partition`` names the log; the cleaner thread marks it uncleanable.
    """

    def __init__(self, message: str, *, topic_partition: TopicPartition):
        super().__init__(message)
        self.topic_partition = topic_partition


class IllegalCleaningStateError(StorageError):
    """A cleaning-state transition that the state machine does not allow."""


class LogCleaningState:
    """Base of the cleaning states (Kafka ``LogCleaningState``)."""

    __slots__ = ()


class _LogCleaningInProgress(LogCleaningState):
    __slots__ = ()

    def __repr__(self) -> str:
        return "LogCleaningInProgress"


class _LogCleaningAborted(LogCleaningState):
    __slots__ = ()

    def __repr__(self) -> str:
        return "LogCleaningAborted"


@dataclass(frozen=True)
class LogCleaningPaused(LogCleaningState):
    """Cleaning paused ``paused_count`` times; each resume undoes one pause."""

    paused_count: int

    def __repr__(self) -> str:
        return f"LogCleaningPaused({self.paused_count})"


LOG_CLEANING_IN_PROGRESS: LogCleaningState = _LogCleaningInProgress()
LOG_CLEANING_ABORTED: LogCleaningState = _LogCleaningAborted()


@dataclass(frozen=True)
class OffsetsToClean:
    """The cleanable range ``[first_dirty_offset, first_uncleanable_dirty_offset)`` of a log.

    ``force_update_checkpoint`` is true when the checkpointed offset was out of
    ``[log_start_offset, log_end_offset]`` and has been reset to ``log_start_offset``.
    """

    first_dirty_offset: int
    first_uncleanable_dirty_offset: int
    force_update_checkpoint: bool


def _topic_partition(log: Any) -> TopicPartition:
    return (log.topic, log.partition)


def _data_dir(log: Any) -> Path:
    return Path(log.dir).parent


def cleanable_offsets(log: "Log", last_clean_offset: int | None, now_ms: int) -> OffsetsToClean:
    """The range of dirty offsets that can be cleaned now (Kafka ``LogCleanerManager.cleanableOffsets``).

    ``first_dirty_offset`` = ``last_clean_offset`` (the checkpoint), or ``log_start_offset`` when
    absent, below ``log_start_offset`` or above ``log_end_offset`` (then
    ``force_update_checkpoint``). The first uncleanable offset is the minimum of the last stable
    offset, the active segment's base offset and - when ``min.compaction.lag.ms > 0`` - the base
    offset of the first dirty non-active segment whose largest timestamp is
    ``> now_ms - min.compaction.lag.ms``; it is never below ``first_dirty_offset``.
    """
    log_start_offset = log.log_start_offset
    checkpoint_dirty_offset = log_start_offset if last_clean_offset is None else last_clean_offset
    if checkpoint_dirty_offset < log_start_offset:
        if not (log.config.compact and log.config.delete):
            logger.warning(
                "Resetting first dirty offset of %s to log start offset %d since the checkpointed offset %d is invalid.",
                log.dir, log_start_offset, checkpoint_dirty_offset,
            )
        first_dirty_offset, force_update = log_start_offset, True
    elif checkpoint_dirty_offset > log.log_end_offset:
        logger.warning(
            "The last checkpoint dirty offset for partition %s is %d, which is larger than the log end offset %d. "
            "Resetting to the log start offset %d.",
            log.dir, checkpoint_dirty_offset, log.log_end_offset, log_start_offset,
        )
        first_dirty_offset, force_update = log_start_offset, True
    else:
        first_dirty_offset, force_update = checkpoint_dirty_offset, False

    candidates = [log.last_stable_offset, log.active_segment.base_offset]
    min_compaction_lag_ms = max(log.config.min_compaction_lag_ms, 0)
    if min_compaction_lag_ms > 0:
        for segment in log.non_active_log_segments_from(first_dirty_offset):
            if segment.largest_timestamp > now_ms - min_compaction_lag_ms:
                candidates.append(segment.base_offset)
                break
    first_uncleanable = min(candidates)
    logger.debug(
        "Finding range of cleanable offsets for log=%s. Last clean offset=%s now=%d => firstDirtyOffset=%d "
        "firstUncleanableOffset=%d activeSegment.baseOffset=%d",
        log.dir, last_clean_offset, now_ms, first_dirty_offset, first_uncleanable, log.active_segment.base_offset,
    )
    return OffsetsToClean(first_dirty_offset, max(first_dirty_offset, first_uncleanable), force_update)


def calculate_cleanable_bytes(log: "Log", first_dirty_offset: int, uncleanable_offset: int) -> tuple[int, int]:
    """``(first_uncleanable_offset, cleanable_bytes)`` (Kafka ``LogCleanerManager.calculateCleanableBytes``).

    ``uncleanable_offset`` is rounded down to the base offset of the non-active segment holding
    it (or the active segment's base offset); ``cleanable_bytes`` is the size of
    ``log_segments(min(first_dirty, first_uncleanable), first_uncleanable)``.
    """
    non_active = log.non_active_log_segments_from(uncleanable_offset)
    first_uncleanable_segment = non_active[0] if non_active else log.active_segment
    first_uncleanable_offset = first_uncleanable_segment.base_offset
    cleanable_bytes = sum(
        s.size_in_bytes for s in log.log_segments(min(first_dirty_offset, first_uncleanable_offset), first_uncleanable_offset)
    )
    return first_uncleanable_offset, cleanable_bytes


def max_compaction_delay(log: "Log", first_dirty_offset: int, now_ms: int) -> int:
    """How long (ms) the log is overdue per ``max.compaction.lag.ms``; 0 if not overdue.

    Uses the earliest positive first-batch timestamp among the dirty non-active segments
    (Kafka ``LogCleanerManager.maxCompactionDelay``).
    """
    timestamps = [
        ts for ts in (s.first_batch_timestamp() for s in log.non_active_log_segments_from(first_dirty_offset)) if ts > 0
    ]
    earliest = min(timestamps) if timestamps else LONG_MAX
    clean_until_ms = now_ms - max(log.config.max_compaction_lag_ms, 0)
    return clean_until_ms - earliest if earliest < clean_until_ms else 0


@dataclass(frozen=True)
class LogToClean:
    """A log with its clean/cleanable sizes and ratio (Kafka ``LogToClean``).

    ``clean_bytes`` = size of ``log_segments(-1, first_dirty_offset)``; ``first_uncleanable_offset``
    and ``cleanable_bytes`` come from :func:`calculate_cleanable_bytes`; ``cleanable_ratio`` =
    ``cleanable_bytes / total_bytes`` (NaN for an empty log, as Java's 0.0/0). The segment holding
    ``first_dirty_offset`` may count on both sides, as in Kafka.
    """

    topic_partition: TopicPartition
    log: Any
    first_dirty_offset: int
    needs_compaction_now: bool
    clean_bytes: int
    first_uncleanable_offset: int
    cleanable_bytes: int
    total_bytes: int
    cleanable_ratio: float

    @classmethod
    def of(cls, log: "Log", first_dirty_offset: int, uncleanable_offset: int, needs_compaction_now: bool = False) -> "LogToClean":
        """Compute sizes and ratio for ``log`` cleaned from ``first_dirty_offset`` up to ``uncleanable_offset``."""
        clean_bytes = sum(s.size_in_bytes for s in log.log_segments(-1, first_dirty_offset))
        first_uncleanable_offset, cleanable_bytes = calculate_cleanable_bytes(log, first_dirty_offset, uncleanable_offset)
        total_bytes = clean_bytes + cleanable_bytes
        ratio = cleanable_bytes / total_bytes if total_bytes else math.nan
        return cls(
            _topic_partition(log), log, first_dirty_offset, needs_compaction_now, clean_bytes,
            first_uncleanable_offset, cleanable_bytes, total_bytes, ratio,
        )


class LogCleanerManager:
    """Cleaning state, cleaner checkpoints and filthiest-log choice for a set of logs.

    ``data_dirs`` are the folders holding partition folders (one ``cleaner-offset-checkpoint``
    each); a log's data dir is ``log.dir.parent``. ``logs`` maps ``(topic, partition)`` to its
    ``Log`` and may change while the manager runs (it is re-read on each call). See the module
    docstring for the state machine. Thread-safe.
    """

    def __init__(self, data_dirs: Path | str | Sequence[Path | str], logs: Mapping[TopicPartition, "Log"]):
        if isinstance(data_dirs, (str, Path)):
            data_dirs = [data_dirs]
        self._checkpoints: dict[Path, Path] = {
            Path(d).resolve(): Path(d).resolve() / CLEANER_OFFSET_CHECKPOINT for d in data_dirs
        }
        self.logs = logs
        self._in_progress: dict[TopicPartition, LogCleaningState] = {}
        self._uncleanable_partitions: dict[Path, set[TopicPartition]] = {}
        self._lock = threading.RLock()
        self._paused_cleaning_cond = threading.Condition(self._lock)
        self.dirtiest_log_cleanable_ratio = 0.0
        """The highest cleanable ratio seen by the last selection (Kafka's max-dirty-percent / 100)."""
        self.time_of_last_run_ms = 0
        """``now_ms`` of the last :meth:`grab_filthiest_compacted_log` call."""
        self.corrupt_checkpoints_reset = 0
        """Unreadable cleaner checkpoint files found and reset (see :meth:`all_cleaner_checkpoints`)."""

    # -- checkpoints -------------------------------------------------------------------------

    @property
    def data_dirs(self) -> list[Path]:
        """The data directories whose cleaner checkpoints this manager maintains."""
        return list(self._checkpoints)

    def checkpoint_path(self, data_dir: Path | str) -> Path:
        """Path of ``data_dir``'s ``cleaner-offset-checkpoint``.

        Raises:
            KeyError: ``data_dir`` is not managed.
        """
        return self._checkpoints[Path(data_dir).resolve()]

    def all_cleaner_checkpoints(self) -> dict[TopicPartition, int]:
        """First dirty offset of every partition in every managed checkpoint file."""
        with self._lock:
            result: dict[TopicPartition, int] = {}
            for path in self._checkpoints.values():
                try:
                    result.update(read_offset_checkpoint(path))
                except CorruptCheckpointError as exc:
                    self._reset_corrupt_checkpoint(path, exc)
            return result

    def _reset_corrupt_checkpoint(self, path: Path, exc: CorruptCheckpointError) -> None:
        """An unreadable cleaner checkpoint: log it and start that file afresh.

        Kafka's ``allCleanerCheckpoints`` logs a failure to read the file and goes on with no
        checkpoints for its logs, so each is cleaned from its log start offset (always safe:
        cleaning is idempotent). Kafka then leaves the file broken and fails every update; here it
        is rewritten empty so the next round's checkpoint is kept. Counted in
        :attr:`corrupt_checkpoints_reset`.
        """
        logger.error("Failed to read the cleaner checkpoint file %s (%s); resetting it: its logs are cleaned "
                     "from their log start offsets", path, exc)
        write_offset_checkpoint(path, {})
        self.corrupt_checkpoints_reset += 1

    def update_checkpoints(
        self,
        data_dir: Path | str,
        partition_to_update_or_add: tuple[TopicPartition, int] | None = None,
        partition_to_remove: TopicPartition | None = None,
    ) -> None:
        """Rewrite ``data_dir``'s checkpoint: drop partitions of managed topics not in ``logs``,
        remove and/or set one entry.

        Unmanaged data dirs are ignored, as in Kafka. Unlike a broker, which hosts every log of
        its dirs, one data dir may be shared by materializers of different topics (one process
        per topic), so entries of topics this manager does not manage are kept, and the
        read-modify-write holds an exclusive ``flock`` on the checkpoint's lock file.
        """
        with self._lock:
            path = self._checkpoints.get(Path(data_dir).resolve())
            if path is None:
                return
            managed_topics = {topic for topic, _ in self.logs}
            updates = dict([partition_to_update_or_add]) if partition_to_update_or_add is not None else {}
            for attempt in (1, 2):
                try:
                    update_offset_checkpoint(
                        path, updates,
                        lambda tp: tp == partition_to_remove or (tp[0] in managed_topics and tp not in self.logs),
                    )
                    return
                except CorruptCheckpointError as exc:
                    if attempt == 2:
                        raise
                    self._reset_corrupt_checkpoint(path, exc)

    def maybe_truncate_checkpoint(self, data_dir: Path | str, topic_partition: TopicPartition, offset: int) -> None:
        """Lower the partition's checkpoint to ``offset`` if it is above it (after a log truncation)."""
        with self._lock:
            log = self.logs.get(topic_partition)
            path = self._checkpoints.get(Path(data_dir).resolve())
            if log is None or path is None or not log.config.compact:
                return
            try:
                update_offset_checkpoint(
                    path, lambda existing: {topic_partition: offset} if existing.get(topic_partition, 0) > offset else {})
            except CorruptCheckpointError as exc:
                self._reset_corrupt_checkpoint(path, exc)  # no entry left to lower

    # -- selection ---------------------------------------------------------------------------

    def grab_filthiest_compacted_log(self, now_ms: int, pre_clean_stats: PreCleanStats | None = None) -> LogToClean | None:
        """Choose the log to clean next and mark it ``IN_PROGRESS``; ``None`` if none is eligible.

        Checkpoints found out of range are rewritten (reset to the log start offset) even for
        logs that are not chosen.

        Raises:
            LogCleaningError: computing one log's cleanable range failed (names the partition).
        """
        stats = pre_clean_stats if pre_clean_stats is not None else PreCleanStats()
        with self._lock:
            self.time_of_last_run_ms = now_ms
            last_clean = self.all_cleaner_checkpoints()
            dirty_logs: list[LogToClean] = []
            for tp, log in list(self.logs.items()):
                if not log.config.compact or tp in self._in_progress or self._is_uncleanable(log, tp):
                    continue
                try:
                    offsets = cleanable_offsets(log, last_clean.get(tp), now_ms)
                    if offsets.force_update_checkpoint:
                        self.update_checkpoints(_data_dir(log), (tp, offsets.first_dirty_offset))
                    delay_ms = max_compaction_delay(log, offsets.first_dirty_offset, now_ms)
                    stats.update_max_compaction_delay(delay_ms)
                    ltc = LogToClean.of(log, offsets.first_dirty_offset, offsets.first_uncleanable_dirty_offset, delay_ms > 0)
                except Exception as exc:
                    raise LogCleaningError(
                        f"Failed to calculate log cleaning stats for partition {tp[0]}-{tp[1]}: {exc}", topic_partition=tp
                    ) from exc
                if ltc.total_bytes > 0:
                    dirty_logs.append(ltc)
            self.dirtiest_log_cleanable_ratio = max((ltc.cleanable_ratio for ltc in dirty_logs), default=0.0)
            cleanable = [
                ltc for ltc in dirty_logs
                if (ltc.needs_compaction_now and ltc.cleanable_bytes > 0)
                or ltc.cleanable_ratio > ltc.log.config.min_cleanable_dirty_ratio
            ]
            if not cleanable:
                return None
            stats.record_cleanable_partitions(len(cleanable))
            filthiest = max(cleanable, key=lambda ltc: ltc.cleanable_ratio)
            self._in_progress[filthiest.topic_partition] = LOG_CLEANING_IN_PROGRESS
            return filthiest

    def pause_cleaning_for_non_compacted_partitions(self) -> dict[TopicPartition, "Log"]:
        """Pause (``Paused(1)``) and return every non-compacted log not already in a state.

        The retention caller resumes them with :meth:`resume_cleaning` afterwards.
        """
        with self._lock:
            result = {
                tp: log for tp, log in list(self.logs.items())
                if not log.config.compact and tp not in self._in_progress
            }
            for tp in result:
                self._in_progress[tp] = LogCleaningPaused(1)
            return result

    def deletable_logs(self) -> dict[TopicPartition, "Log"]:
        """Mark ``IN_PROGRESS`` and return compacted logs that are free and not uncleanable.

        The caller runs retention on them and then calls :meth:`done_deleting`.
        """
        with self._lock:
            result = {
                tp: log for tp, log in list(self.logs.items())
                if tp not in self._in_progress and log.config.compact and not self._is_uncleanable(log, tp)
            }
            for tp in result:
                self._in_progress[tp] = LOG_CLEANING_IN_PROGRESS
            return result

    # -- state machine -----------------------------------------------------------------------

    def cleaning_state(self, topic_partition: TopicPartition) -> LogCleaningState | None:
        """The partition's state, ``None`` when it has none."""
        with self._lock:
            return self._in_progress.get(topic_partition)

    def set_cleaning_state(self, topic_partition: TopicPartition, state: LogCleaningState | None) -> None:
        """Force a state (tests and recovery tools); ``None`` removes it."""
        with self._lock:
            if state is None:
                self._in_progress.pop(topic_partition, None)
            else:
                self._in_progress[topic_partition] = state
            self._paused_cleaning_cond.notify_all()

    def abort_cleaning(self, topic_partition: TopicPartition) -> None:
        """Abort an in-progress cleaning of the partition and wait for it; leaves the state as before."""
        with self._lock:
            self.abort_and_pause_cleaning(topic_partition)
            self.resume_cleaning([topic_partition])

    def abort_and_pause_cleaning(self, topic_partition: TopicPartition, timeout_s: float | None = None) -> None:
        """Abort the partition's cleaning if in progress and pause further cleaning; block until paused.

        None -> Paused(1); IN_PROGRESS -> ABORTED (the cleaner then moves it to Paused(1));
        Paused(i) -> Paused(i+1).

        Raises:
            IllegalCleaningStateError: the state is ABORTED.
            TimeoutError: ``timeout_s`` elapsed before the cleaner paused.
        """
        with self._lock:
            state = self._in_progress.get(topic_partition)
            if state is None:
                self._in_progress[topic_partition] = LogCleaningPaused(1)
            elif state is LOG_CLEANING_IN_PROGRESS:
                self._in_progress[topic_partition] = LOG_CLEANING_ABORTED
            elif isinstance(state, LogCleaningPaused):
                self._in_progress[topic_partition] = LogCleaningPaused(state.paused_count + 1)
            else:
                raise IllegalCleaningStateError(
                    f"Compaction for partition {topic_partition} cannot be aborted and paused since it is in {state!r} state."
                )
            if not self._paused_cleaning_cond.wait_for(lambda: self._is_paused(topic_partition), timeout_s):
                raise TimeoutError(f"cleaning of {topic_partition} was not paused within {timeout_s} s")

    def resume_cleaning(self, topic_partitions: Iterable[TopicPartition]) -> None:
        """Undo one pause of each partition: Paused(1) -> None, Paused(i) -> Paused(i-1).

        Raises:
            IllegalCleaningStateError: a partition is not paused.
        """
        with self._lock:
            for tp in topic_partitions:
                state = self._in_progress.get(tp)
                if state is None:
                    raise IllegalCleaningStateError(f"Compaction for partition {tp} cannot be resumed since it is not paused.")
                if not isinstance(state, LogCleaningPaused):
                    raise IllegalCleaningStateError(
                        f"Compaction for partition {tp} cannot be resumed since it is in {state!r} state."
                    )
                if state.paused_count == 1:
                    del self._in_progress[tp]
                else:
                    self._in_progress[tp] = LogCleaningPaused(state.paused_count - 1)

    def check_cleaning_aborted(self, topic_partition: TopicPartition) -> None:
        """Raise ``LogCleaningAbortedError`` if the partition's state is ABORTED (polled by the cleaner)."""
        with self._lock:
            if self._in_progress.get(topic_partition) is LOG_CLEANING_ABORTED:
                raise LogCleaningAbortedError(f"cleaning of {topic_partition[0]}-{topic_partition[1]} was aborted")

    def done_cleaning(self, topic_partition: TopicPartition, data_dir: Path | str, end_offset: int) -> None:
        """End a cleaning round: IN_PROGRESS -> None writing ``end_offset`` to the checkpoint; ABORTED -> Paused(1).

        Raises:
            IllegalCleaningStateError: the partition has no state or is paused.
        """
        with self._lock:
            state = self._in_progress.get(topic_partition)
            if state is None:
                raise IllegalCleaningStateError(f"State for partition {topic_partition} should exist.")
            if state is LOG_CLEANING_IN_PROGRESS:
                self.update_checkpoints(data_dir, (topic_partition, end_offset))
                del self._in_progress[topic_partition]
            elif state is LOG_CLEANING_ABORTED:
                self._in_progress[topic_partition] = LogCleaningPaused(1)
                self._paused_cleaning_cond.notify_all()
            else:
                raise IllegalCleaningStateError(f"In-progress partition {topic_partition} cannot be in {state!r} state.")

    def done_deleting(self, topic_partitions: Iterable[TopicPartition]) -> None:
        """End retention on partitions from :meth:`deletable_logs`: IN_PROGRESS -> None; ABORTED -> Paused(1).

        Raises:
            IllegalCleaningStateError: a partition has no state or is paused.
        """
        with self._lock:
            for tp in topic_partitions:
                state = self._in_progress.get(tp)
                if state is None:
                    raise IllegalCleaningStateError(f"State for partition {tp} should exist.")
                if state is LOG_CLEANING_IN_PROGRESS:
                    del self._in_progress[tp]
                elif state is LOG_CLEANING_ABORTED:
                    self._in_progress[tp] = LogCleaningPaused(1)
                    self._paused_cleaning_cond.notify_all()
                else:
                    raise IllegalCleaningStateError(f"In-progress partition {tp} cannot be in {state!r} state.")

    # -- uncleanable partitions --------------------------------------------------------------

    def mark_partition_uncleanable(self, data_dir: Path | str, topic_partition: TopicPartition) -> None:
        """Exclude the partition from cleaning until it is removed from ``logs``."""
        with self._lock:
            self._uncleanable_partitions.setdefault(Path(data_dir).resolve(), set()).add(topic_partition)

    def uncleanable_partitions(self, data_dir: Path | str) -> frozenset[TopicPartition]:
        """Partitions of ``data_dir`` marked uncleanable."""
        with self._lock:
            return frozenset(self._uncleanable_partitions.get(Path(data_dir).resolve(), ()))

    def maintain_uncleanable_partitions(self) -> None:
        """Forget uncleanable partitions that are no longer in ``logs``."""
        with self._lock:
            for partitions in self._uncleanable_partitions.values():
                partitions.intersection_update(self.logs.keys())
            for data_dir in [d for d, p in self._uncleanable_partitions.items() if not p]:
                del self._uncleanable_partitions[data_dir]

    # -- internals ---------------------------------------------------------------------------

    def _is_uncleanable(self, log: Any, topic_partition: TopicPartition) -> bool:
        return topic_partition in self._uncleanable_partitions.get(_data_dir(log).resolve(), ())

    def _is_paused(self, topic_partition: TopicPartition) -> bool:
        return isinstance(self._in_progress.get(topic_partition), LogCleaningPaused)

