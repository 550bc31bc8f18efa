"""``materializer compact``: one Kafka log-cleaner round, now, on a topic's local logs.

The local logs of a data directory (layout in :mod:`materializer.datadir.layout`) are cleaned with the
storage engine's ``LogCleaner`` rules (:func:`materializer.storage.log_cleaner.clean_log`), using
the topic config the materializer saved in ``DIR/topic-configs/<topic>.json`` (``segment.bytes``,
``segment.index.bytes``, ``delete.retention.ms``, ``min.compaction.lag.ms``, ...). As in
Kafka 4.3, an emptied batch is kept (as a 61-byte header) when its next offset is the round's
first uncleanable offset.

Per partition the dirty section is ``[first_dirty_offset, first_uncleanable_offset)``:

* ``first_dirty_offset`` comes from ``DIR/cleaner-offset-checkpoint`` (Kafka's
  ``OffsetCheckpointFile`` format, ``<topic> <partition> <offset>`` lines), or the log start
  offset when the partition has no entry;
* ``first_uncleanable_offset`` is where Kafka's cleaner would stop now (last stable offset,
  active segment, ``min.compaction.lag.ms``; rounded down to a segment base offset), or exactly
  ``upto_offset`` when given: the offset map then covers ``[first_dirty_offset, upto_offset)``,
  records from ``upto_offset`` on are kept as they are, and the active segment is rolled first
  when ``upto_offset`` lies beyond its base offset.

Before a forced round the segment holding ``upto_offset`` is split so that ``upto_offset`` is a
segment base offset (:func:`materializer.storage.segment_split.split_segment_at`, done by
``clean_log(..., split_segment=True)``), as it always is on a broker (Kafka's first
uncleanable offset is a segment base). Without it the cleaner would recopy the records from
``upto_offset`` to the end of that local segment and stamp a delete horizon on their batches
when they hold tombstones, so those tombstones would expire one round earlier than on the
broker whose checkpoint ``upto_offset`` mirrors. Records and offsets are unchanged by the split.

``min.cleanable.dirty.ratio`` is ignored (the caller asked for a round now). When the offset map
(``dedupe_buffer_size_bytes / 24`` slots, filled to 90 %) cannot hold every key of the section,
several rounds run back to back, as Kafka's cleaner thread would. The end offset of the last
round is written to the checkpoint.

While it works the command holds the data dir's lock (:class:`~materializer.datadir.lock.DataDirLock`,
Kafka's ``LogManager.lockLogDirs``): a running ``materializer run`` or ``restore`` makes it fail at
once naming that process, and no writer starts while it cleans. The logs are opened and closed with
:class:`~materializer.storage.log_manager.TopicLogs`: the directory's ``.kafka_cleanshutdown``
marker is removed while they are open; on success the recovery-point and log-start-offset
checkpoints are written and the marker restored when allowed; after an error neither is written
(the next open recovers the logs past their recovery points).

An interrupted round (Ctrl-C, SIGTERM, SIGKILL, a full disk) leaves a valid log, as a broker's
cleaner does: cleaned segments are built in ``.cleaned`` files, renamed to ``.swap`` and then
swapped in (Kafka's ``Cleaner.cleanSegments`` / ``UnifiedLog.replaceSegments``); the next open
(``LogLoader``) deletes ``.cleaned`` files and finishes ``.swap`` renames, so each segment holds
either its old records or its cleaned ones. Ctrl-C exits 130 and SIGTERM 143, with one line.

With ``threads=N > 1`` (Kafka ``log.cleaner.threads``) the partitions are cleaned in parallel by
N cleaner processes, each with its own offset map of ``dedupe_buffer_size_bytes // N`` bytes, as
Kafka's ``LogCleaner`` gives each of its N ``CleanerThread`` s ``log.cleaner.dedupe.buffer.size / N``.
Each free worker takes the partition with the largest dirty section left (Kafka's threads take the
filthiest log, ``LogCleanerManager.grabFilthiestCompactedLog``; here every partition is cleaned
anyway, so the largest first balances the workers), as the storage engine's cleaner manager
measures it: ``cleanableOffsets``, then ``LogToClean``'s cleanable bytes; a checkpoint entry out
of its log's range is reset to the log start offset then, as there. They are processes, not
threads: most of a round is per-batch Python code that holds the GIL, so threads of one process
would share one core.
The parent keeps the data dir's lock and the logs' ``TopicLogs``; it hands a partition's log to a
worker by closing (flushing) it, the worker opens it as cleanly shut down, cleans it and closes
it; a round moves neither the log start offset nor the recovery point (the log end offset), so
the parent's closed log still holds what ``TopicLogs.close`` checkpoints. Each worker merges its partition's entry into the shared
``cleaner-offset-checkpoint`` under the checkpoint's ``flock``
(:func:`~materializer.storage.checkpoint.update_offset_checkpoint`), so no entry is lost. The
first error stops the other workers at their next abort check (their rounds in progress are
undone: ``.cleaned`` files removed) and is raised naming its partition; Ctrl-C and SIGTERM go to
the parent (the workers ignore them), which stops the workers the same way before exiting; a
worker whose parent died stops too.

Mirrors Kafka's ``LogCleaner.CleanerThread.cleanLog`` + ``recordStats`` for one forced round.
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import signal
import threading
import time
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

from materializer.datadir.layout import partition_dir, topic_config_path
from materializer.datadir.lock import DataDirLock
from materializer.storage.checkpoint import CLEANER_OFFSET_CHECKPOINT, read_offset_checkpoint, update_offset_checkpoint
from materializer.storage.cleaner import Cleaner
from materializer.storage.cleaner_manager import LogToClean, cleanable_offsets
from materializer.storage.clock import wall_clock_ms
from materializer.storage.errors import LogCleaningAbortedError, StorageError
from materializer.storage.files import find_partition_dirs
from materializer.storage.log import Log
from materializer.storage.log_cleaner import CleaningRound, RoundTotals, clean_log
from materializer.storage.log_config import LogConfig
from materializer.storage.log_manager import TopicLogs
from materializer.storage.offset_map import DEFAULT_DEDUPE_BUFFER_SIZE_BYTES, DEFAULT_LOAD_FACTOR, new_offset_map

__all__ = [
    "CompactionError",
    "PartitionCompaction",
    "compact_topic",
    "find_partitions",
    "format_partition_summary",
    "format_topic_summary",
    "logs_bytes",
]


_MB = 1024.0 * 1024.0


class CompactionError(StorageError):
    """The data directory cannot be compacted as asked (missing log or config, wrong policy, busy)."""


@dataclass(frozen=True)
class PartitionCompaction(RoundTotals):
    """What :func:`compact_topic` did to one partition.

    Attributes:
        topic, partition: the partition.
        first_dirty_offset: start of the dirty section (checkpoint or log start offset).
        end_offset: the checkpoint written (first dirty offset of the next round).
        rounds: the cleaning rounds run (empty when there was nothing to clean).
        size_before_bytes / size_after_bytes: ``.log`` bytes of the partition before and after.
        elapsed_s: wall time of the partition's rounds, seconds.
        nothing_cleanable_because: with no round, why the dirty section was empty.
    """

    topic: str
    partition: int
    first_dirty_offset: int
    end_offset: int
    rounds: tuple[CleaningRound, ...]
    size_before_bytes: int
    size_after_bytes: int
    elapsed_s: float
    nothing_cleanable_because: str = ""


def find_partitions(data_dir: Path, topic: str) -> list[int]:
    """Partitions of ``topic`` that have a ``<topic>-<partition>`` folder in ``data_dir``, sorted."""
    return sorted(partition for _, partition in find_partition_dirs(data_dir, topic))


def logs_bytes(data_dir: Path, topic: str, partition: int | None) -> int | None:
    """Bytes of the topic's local logs (only ``partition`` if given): the progress bar's total;
    None when they cannot be listed (``compact_topic`` then reports why)."""
    try:
        partitions = [partition] if partition is not None else find_partitions(Path(data_dir), topic)
        total = 0
        for p in partitions:
            with os.scandir(partition_dir(data_dir, topic, p)) as entries:
                total += sum(e.stat().st_size for e in entries if e.name.endswith(".log"))
        return total
    except (OSError, StorageError):
        return None


def _load_config(data_dir: Path, topic: str) -> LogConfig:
    path = topic_config_path(data_dir, topic)
    if not path.exists():
        raise CompactionError(f"no saved topic config for {topic!r} at {path} (run `materializer run` first)")
    try:
        config = LogConfig.load(path)
    except (ValueError, KeyError) as exc:  # json.JSONDecodeError is a ValueError
        raise CompactionError(f"unreadable topic config {path}: {exc}") from exc
    if not config.compact:
        raise CompactionError(
            f"topic {topic!r} has cleanup.policy={','.join(config.cleanup_policy) or '(empty)'}: "
            "only topics with cleanup.policy=compact are cleaned")
    return config


def compact_topic(
    data_dir: Path | str,
    topic: str,
    *,
    partition: int | None = None,
    upto_offset: int | None = None,
    dedupe_buffer_size_bytes: int = DEFAULT_DEDUPE_BUFFER_SIZE_BYTES,
    now_ms: int | None = None,
    on_partition_done: Callable[[PartitionCompaction], None] | None = None,
    threads: int = 1,
) -> list[PartitionCompaction]:
    """Run one cleaning round now on every local partition of ``topic`` (or only ``partition``).

    Args:
        data_dir: the materializer's data directory.
        topic: the topic; its config is read from ``DIR/topic-configs/<topic>.json``.
        partition: clean only this partition.
        upto_offset: the first uncleanable offset, exactly (see the module docstring); None =
            Kafka's own bound.
        dedupe_buffer_size_bytes: offset map budget of all cleaner threads together (Kafka
            ``log.cleaner.dedupe.buffer.size``), bytes; each of the ``threads`` workers gets
            ``dedupe_buffer_size_bytes // threads`` (``// 24`` slots, 90 % usable per round).
        now_ms: the round's wall clock in ms (delete horizons = now + ``delete.retention.ms``);
            default: the current time.
        on_partition_done: called after each partition (for progress output), in the calling
            thread, in the order the partitions finish.
        threads: cleaner workers (Kafka ``log.cleaner.threads``), >= 1. With more than one,
            partitions are cleaned in parallel by that many worker processes (at most one per
            partition; see the module docstring). The segments and checkpoints written are
            the same as with one as long as each worker's map holds its partitions' keys.

    Returns:
        One :class:`PartitionCompaction` per partition, in partition order.

    Raises:
        CompactionError: no such data dir / partition folder / saved config; topic not
            compacted; ``upto_offset`` beyond a log end offset or its last stable offset;
            ``threads < 1``; with ``threads > 1``, any failure of a worker (its partition named).
        DataDirLockedError: another process writes the data dir (``materializer run`` ...),
            named in the message.
        CorruptCheckpointError / CorruptRecordError: damaged checkpoint or segment files.
    """
    data_dir = Path(data_dir)
    if not data_dir.is_dir():
        raise CompactionError(f"data directory {data_dir} does not exist")
    if upto_offset is not None and upto_offset < 0:
        raise CompactionError(f"--upto-offset must be >= 0, got {upto_offset}")
    if threads < 1:
        raise CompactionError(f"--threads must be >= 1, got {threads}")
    with DataDirLock.acquire(data_dir, "compact"):
        return _compact_locked(data_dir, topic, partition, upto_offset, dedupe_buffer_size_bytes, now_ms,
                               on_partition_done, threads)


def _compact_locked(data_dir: Path, topic: str, partition: int | None, upto_offset: int | None,
                    dedupe_buffer_size_bytes: int, now_ms: int | None,
                    on_partition_done: Callable[[PartitionCompaction], None] | None,
                    threads: int = 1) -> list[PartitionCompaction]:
    """:func:`compact_topic` once the data dir's lock is held."""
    config = _load_config(data_dir, topic)
    available = find_partitions(data_dir, topic)
    if partition is not None:
        if partition not in available:
            raise CompactionError(f"no local log for {topic}-{partition} in {data_dir}")
        partitions = [partition]
    else:
        if not available:
            raise CompactionError(f"no local log for topic {topic!r} in {data_dir}")
        partitions = available
    map_budget = dedupe_buffer_size_bytes // threads  # Kafka LogCleaner: dedupe buffer size / threads
    _check_map_budget(dedupe_buffer_size_bytes, threads)
    workers = min(threads, len(partitions))
    checkpoints = read_offset_checkpoint(data_dir / CLEANER_OFFSET_CHECKPOINT)  # fail early if corrupt
    if workers <= 1:
        cleaner = _new_cleaner(0, map_budget)
        results: list[PartitionCompaction] = []
        with TopicLogs.open(data_dir, topic, partitions, config) as topic_logs:
            for p in partitions:
                result = _compact_partition(topic_logs.logs[p], cleaner, upto_offset, now_ms)
                results.append(result)
                if on_partition_done is not None:
                    on_partition_done(result)
        return results
    with _CleanerWorkers(workers, map_budget) as pool:  # started before any log file is open
        with TopicLogs.open(data_dir, topic, partitions, config) as topic_logs:
            order = _largest_dirty_first(data_dir, topic_logs.logs, checkpoints, upto_offset, now_ms)
            by_partition = pool.clean(topic_logs, order, upto_offset, now_ms, on_partition_done)
    return [by_partition[p] for p in partitions]


def _check_map_budget(dedupe_buffer_size_bytes: int, threads: int) -> None:
    """Raise :class:`CompactionError` when a thread's share of the dedupe buffer cannot hold one key
    at the load factor (Kafka ``Cleaner``'s "offset map is too small" check), before any log is opened."""
    slots = (dedupe_buffer_size_bytes // threads) // 24
    if not slots * DEFAULT_LOAD_FACTOR > 1:
        per_thread = f" ({dedupe_buffer_size_bytes // threads} bytes for each of {threads} threads)" if threads > 1 else ""
        raise CompactionError(
            f"dedupe buffer of {dedupe_buffer_size_bytes} bytes{per_thread}: offset map is too small to fit in even "
            "a single message, so log cleaning will never make progress. You can increase "
            "log.cleaner.dedupe.buffer.size or decrease log.cleaner.threads")


def _new_cleaner(cleaner_id: int, map_budget: int, check_done: Callable[[tuple[str, int]], None] | None = None) -> Cleaner:
    """One cleaner thread's ``Cleaner`` with its own offset map of ``map_budget`` bytes."""
    try:
        offset_map = new_offset_map(map_budget)
        if check_done is None:
            return Cleaner(cleaner_id, offset_map, load_factor=DEFAULT_LOAD_FACTOR, empty_batch_upper_bound="round")
        return Cleaner(cleaner_id, offset_map, load_factor=DEFAULT_LOAD_FACTOR, empty_batch_upper_bound="round",
                       check_done=check_done)
    except ValueError as exc:
        raise CompactionError(f"dedupe buffer of {map_budget} bytes: {exc}") from exc


def _largest_dirty_first(data_dir: Path, logs: Mapping[int, Log], checkpoints: Mapping[tuple[str, int], int],
                         upto_offset: int | None, now_ms: int | None) -> list[int]:
    """The partitions of ``logs``, the largest dirty section first (ties in partition order), each
    measured as the log cleaner's manager measures a log when it picks the filthiest (Kafka
    ``LogCleanerManager.cleanableOffsets``, then ``LogToClean``'s cleanable bytes): the segments
    from the first dirty offset up to the round's first uncleanable offset (``upto_offset`` when
    given), bytes. A checkpoint entry out of its log's range is reset to the log start offset now,
    as Kafka's ``grabFilthiestCompactedLog`` does, so the round finds it in range (one warning).

    Raises:
        OSError: ``DIR/cleaner-offset-checkpoint`` cannot be rewritten.
    """
    now = wall_clock_ms() if now_ms is None else now_ms
    dirty_bytes = {}
    for partition, log in logs.items():
        topic_partition = (log.topic, partition)
        offsets = cleanable_offsets(log, checkpoints.get(topic_partition), now)
        if offsets.force_update_checkpoint:
            update_offset_checkpoint(data_dir / CLEANER_OFFSET_CHECKPOINT,
                                     {topic_partition: offsets.first_dirty_offset})
        upper = offsets.first_uncleanable_dirty_offset if upto_offset is None else upto_offset
        dirty_bytes[partition] = LogToClean.of(log, offsets.first_dirty_offset, upper).cleanable_bytes
    return sorted(logs, key=lambda p: (-dirty_bytes[p], p))


# -- parallel cleaning: worker processes ------------------------------------------------------------

# state of a worker process, set by _worker_init
_worker_stop: Any = None  # multiprocessing Event: the parent asks the workers to stop
_worker_parent_pid = 0  # the worker's parent when it started: the caller, or the fork server it started
_worker_cleaner: Cleaner | None = None


def _worker_init(stop: Any, map_budget: int) -> None:
    """Set up a cleaner worker process: its own offset map, the parent's stop event; Ctrl-C and
    SIGTERM are the parent's to handle (it stops the workers through ``stop``)."""
    global _worker_stop, _worker_parent_pid, _worker_cleaner
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    _worker_stop = stop
    _worker_parent_pid = os.getppid()  # re-parented (to init or a subreaper) when that process dies
    _worker_cleaner = _new_cleaner(os.getpid(), map_budget, check_done=_worker_check_done)


def _worker_check_done(topic_partition: tuple[str, int]) -> None:
    """A worker's abort check (Kafka ``CleanerThread.checkDone``): the caller asked to stop, or the
    worker's parent (the caller, or the fork server that dies with it) is gone."""
    if _worker_stop.is_set() or os.getppid() != _worker_parent_pid:
        raise LogCleaningAbortedError(f"cleaning of {topic_partition[0]}-{topic_partition[1]} stopped")


def _worker_clean(log_dir: Path, config: LogConfig, log_start_offset: int, recovery_point: int,
                  upto_offset: int | None, now_ms: int | None) -> tuple[str, Any, int, int]:
    """Clean one partition in a worker process. Returns ``(status, payload, log start offset,
    recovery point)``: ``("done", PartitionCompaction)``, ``("stopped", None)`` when aborted before
    or during the round, or ``("error", exception)`` (the exception itself when it pickles, else a
    :class:`CompactionError` with its text)."""
    if _worker_stop.is_set():
        return "stopped", None, log_start_offset, recovery_point
    assert _worker_cleaner is not None
    log = Log.open(log_dir, config, log_start_offset=log_start_offset, recovery_point=recovery_point,
                   had_clean_shutdown=True)  # the parent flushed and closed it just before
    status: str
    payload: Any = None
    try:
        status, payload = "done", _compact_partition(log, _worker_cleaner, upto_offset, now_ms)
    except LogCleaningAbortedError:
        status = "stopped"
    except Exception as exc:  # noqa: BLE001 - sent to the parent, which raises it
        _worker_stop.set()  # the other workers stop at their next check
        try:
            pickle.loads(pickle.dumps(exc))
            payload = exc
        except Exception:  # noqa: BLE001 - an exception that does not survive pickling
            payload = CompactionError(f"{type(exc).__name__}: {exc}")
        status = "error"
    finally:
        log.close()  # flushed, as the parent's TopicLogs would close it
    return status, payload, log.log_start_offset, log.recovery_point


def _start_method() -> str:
    """``fork`` when this process runs one thread (the workers start at once, the modules already
    imported; nothing another thread holds can be copied half-changed), else ``forkserver``
    (``spawn`` where neither exists)."""
    methods = multiprocessing.get_all_start_methods()
    if "fork" in methods and threading.active_count() == 1:
        return "fork"
    return "forkserver" if "forkserver" in methods else "spawn"


class _CleanerWorkers:
    """``workers`` cleaner processes (module docstring): started on entry, before the logs are
    opened, so they inherit no log file; stopped and waited for on exit, whatever happened."""

    def __init__(self, workers: int, map_budget: int) -> None:
        self.workers = workers
        context = multiprocessing.get_context(_start_method())
        self.stop = context.Event()
        self.executor = ProcessPoolExecutor(workers, mp_context=context, initializer=_worker_init,
                                            initargs=(self.stop, map_budget))

    def __enter__(self) -> "_CleanerWorkers":
        try:
            for future in [self.executor.submit(os.getpid) for _ in range(self.workers)]:
                future.result()  # the workers' offset maps are allocated; a failure is raised here
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()  # a round still running (Ctrl-C, an error in the parent) is aborted and undone
        self.executor.shutdown(wait=True, cancel_futures=True)

    def clean(self, topic_logs: TopicLogs, order: list[int], upto_offset: int | None, now_ms: int | None,
              on_partition_done: Callable[[PartitionCompaction], None] | None) -> dict[int, PartitionCompaction]:
        """Clean the partitions in ``order`` (largest dirty section first) with the workers; returns
        partition -> result. Raises the first error (naming its partition) once every worker is idle."""
        stop = self.stop
        results: dict[int, PartitionCompaction] = {}
        first_error: BaseException | None = None
        pending: dict[Future, int] = {}
        queue = list(order)

        def hand_out() -> None:
            while queue and len(pending) < self.workers and not stop.is_set():
                p = queue.pop(0)
                log = topic_logs.logs[p]
                log.close()  # flushed: the worker opens it as cleanly shut down
                pending[self.executor.submit(_worker_clean, log.dir, log.config, log.log_start_offset,
                                             log.recovery_point, upto_offset, now_ms)] = p

        def take_back(future: Future, p: int) -> None:
            nonlocal first_error
            old = topic_logs.logs[p]  # closed by hand_out; TopicLogs.close checkpoints its offsets
            try:
                status, payload, log_start_offset, recovery_point = future.result()
            except BaseException as exc:  # the worker died or failed to close the log: recover it now
                status, payload = "error", exc
                topic_logs.logs[p] = Log.open(old.dir, old.config, log_start_offset=old.log_start_offset,
                                              recovery_point=old.recovery_point, had_clean_shutdown=False)
            else:
                if (log_start_offset, recovery_point) != (old.log_start_offset, old.recovery_point):
                    # not expected (a round moves neither): reopen so the checkpoints take the worker's
                    topic_logs.logs[p] = Log.open(old.dir, old.config, log_start_offset=log_start_offset,
                                                  recovery_point=recovery_point, had_clean_shutdown=True)
            if status == "done":
                results[p] = payload
                if on_partition_done is not None:
                    on_partition_done(payload)
            elif status == "stopped" and first_error is None and not stop.is_set():  # never expected
                first_error = CompactionError(f"cleaning {old.topic}-{p} stopped unexpectedly")
            elif status == "error" and first_error is None:
                stop.set()
                name = f"{old.topic}-{p}"
                reportable = isinstance(payload, (StorageError, ValueError, OSError)) and name in str(payload)
                first_error = payload if reportable else CompactionError(f"cleaning {name} failed: {payload}")
                if first_error is not payload:
                    first_error.__cause__ = payload

        try:
            hand_out()
            while pending:
                done, _ = wait(pending, return_when=FIRST_COMPLETED)
                for future in done:
                    take_back(future, pending.pop(future))
                hand_out()
        except BaseException:  # Ctrl-C, SIGTERM: the workers undo their rounds before the logs are let go
            stop.set()
            wait(pending)
            raise
        if first_error is not None:
            raise first_error
        return results


def _compact_partition(log: Log, cleaner: Cleaner, upto_offset: int | None, now_ms: int | None) -> PartitionCompaction:
    size_before = log.size_in_bytes
    started = time.monotonic()
    try:
        result = clean_log(log, first_uncleanable_offset=upto_offset, now_ms=now_ms, cleaner=cleaner,
                           split_segment=True)
    except ValueError as exc:  # the cleaner's "beyond the log end / last stable offset"
        raise CompactionError(str(exc)) from exc
    return PartitionCompaction(
        topic=log.topic, partition=log.partition, first_dirty_offset=result.first_dirty_offset,
        end_offset=result.end_offset, rounds=tuple(result.rounds), size_before_bytes=size_before,
        size_after_bytes=log.size_in_bytes, elapsed_s=time.monotonic() - started,
        nothing_cleanable_because="" if result.rounds else _why_nothing_cleanable(log, result.end_offset))


def _why_nothing_cleanable(log: Log, end_offset: int) -> str:
    """Why Kafka's cleaner would find no cleanable records (LogCleanerManager.cleanableOffsets bounds)."""
    active = log.active_segment.base_offset
    config = log.config
    if log.log_end_offset == log.log_start_offset:
        return "the log is empty"
    if end_offset >= active:
        return (f"every record from offset {active} on is in the active segment, which is never cleaned; it rolls "
                f"at segment.bytes={config.segment_bytes} bytes (now {log.active_segment.size_in_bytes}) or when "
                f"its records span segment.ms={config.max_segment_ms()} ms")
    return (f"the dirty section ends at {end_offset}: an open transaction (the last stable offset) or "
            f"min.compaction.lag.ms={config.min_compaction_lag_ms} keeps the records after it")


def _percent_less(after: int, before: int) -> float:
    return 100.0 * (1.0 - after / before) if before else 0.0


def format_partition_summary(result: PartitionCompaction) -> str:
    """One line per partition: section, rounds, bytes/records read and written, MB/s, reduction."""
    name = f"{result.topic}-{result.partition}"
    if not result.rounds:
        because = f": {result.nothing_cleanable_because}" if result.nothing_cleanable_because else ""
        return (f"{name}: nothing to clean (first dirty offset {result.first_dirty_offset}); "
                f"checkpoint {result.end_offset}{because}")
    seconds = result.elapsed_s
    rate = result.bytes_read / _MB / seconds if seconds > 0 else float("inf")
    records_rate = result.records_read / seconds if seconds > 0 else float("inf")
    return (
        f"{name}: cleaned [{result.first_dirty_offset}, {result.end_offset}) in {len(result.rounds)} round(s), "
        f"{seconds:.2f} s: read {result.bytes_read / _MB:,.2f} MB ({result.records_read:,d} records), "
        f"wrote {result.bytes_written / _MB:,.2f} MB ({result.records_written:,d} records), "
        f"{rate:,.1f} MB/sec, {records_rate:,.0f} records/sec, "
        f"{_percent_less(result.bytes_written, result.bytes_read):.1f}% size reduction "
        f"({_percent_less(result.records_written, result.records_read):.1f}% fewer records); "
        f"log {result.size_before_bytes / _MB:,.2f} MB -> {result.size_after_bytes / _MB:,.2f} MB; "
        f"checkpoint {result.end_offset}")


def format_topic_summary(results: list[PartitionCompaction]) -> str:
    """One line totalling several partitions' rounds: MB and records read and written, seconds,
    size reduction (the last line ``materializer compact`` prints for a multi-partition topic)."""
    read = sum(r.bytes_read for r in results)
    written = sum(r.bytes_written for r in results)
    seconds = sum(r.elapsed_s for r in results)
    topic = results[0].topic if results else "?"
    return (f"{topic}: {len(results)} partitions, read {read / _MB:,.2f} MB "
            f"({sum(r.records_read for r in results):,d} records), wrote {written / _MB:,.2f} MB "
            f"({sum(r.records_written for r in results):,d} records) in {seconds:.2f} s, "
            f"{_percent_less(written, read):.1f}% size reduction")
