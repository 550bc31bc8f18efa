"""Open, checkpoint and close one topic's partition logs in a data dir (Kafka ``LogManager``).

Files of the data dir this module maintains (Kafka ``LogManager``)::

    DIR/recovery-point-offset-checkpoint   <topic> <partition> <recovery point>   (checkpointLogRecoveryOffsets)
    DIR/log-start-offset-checkpoint        <topic> <partition> <log start offset> (checkpointLogStartOffsets)
    DIR/.kafka_cleanshutdown               present iff every log of DIR was flushed and closed

Lifecycle of a :class:`TopicLogs` (``loadLogs`` and ``shutdown`` for one topic)::

    open:  clean = marker present ─▶ read both checkpoints (a corrupt one is logged and ignored:
           every log then recovers from offset 0) ─▶ Log.open each partition (recovery past its
           recovery point unless clean) ─▶ delete the marker (a crash from here is unclean)
    close: close (flush) every log ─▶ merge this topic's entries into both checkpoints
           ─▶ write the marker (see below)

Unlike a broker, which owns every log of its log dirs, one data dir may be shared by several
processes, one per topic, each owning its topic's logs and checkpoint entries. Hence:

* checkpoints are merged (:func:`.checkpoint.update_offset_checkpoint`, under an exclusive
  ``flock``): entries of other topics are kept;
* the marker is per directory, so a process restores it on close only if it knows every log of
  the directory is clean: the marker was present when it opened its logs, or every partition
  folder of the directory is one of the logs it opened (and recovered), or a folder of the same
  topic it left unopened (a consumer-group member's unassigned partition) that was opened later
  or was not left by an unclean shutdown; and no other process
  has logs of the directory open right now (each open ``TopicLogs`` holds a shared ``flock`` on
  ``DIR/.kafka_cleanshutdown.lock``; the close needs it exclusively). Otherwise the marker stays
  absent and the next open recovers each log past its recovery point (after a clean close
  that is only the segment holding the log end offset). Still assumed: no other process
  opened logs of the directory and crashed while this one had its logs open with the marker
  present at its open.
* several topics of the directory open in one process (a ``TopicSet``) act as one owner, as a
  broker's logs do: the first open reads the marker (and deletes it) and the others open with
  what it read; the last close writes it back when every one of them may (each as above, with
  every topic open in the process counting as its own) and no other process has logs open.

Not thread-safe; the logs themselves are (``Log.lock``).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import uuid
import weakref
from pathlib import Path
from typing import IO, Iterable, Mapping

from .checkpoint import (
    CLEANER_OFFSET_CHECKPOINT,
    LOG_START_OFFSET_CHECKPOINT,
    RECOVERY_POINT_CHECKPOINT,
    read_offset_checkpoint,
    update_offset_checkpoint,
)
from .errors import CorruptCheckpointError
from .file_lock import lock_file
from .files import delete_log_dir, find_partition_dirs, partition_dir_name
from .log import Log
from .log_config import LogConfig
from .log_loader import (
    CLEAN_SHUTDOWN_FILE,
    delete_clean_shutdown_file,
    has_clean_shutdown_file,
    write_clean_shutdown_file,
)

__all__ = ["TopicLogs", "checkpoint_topic_logs", "delete_partition_dir"]

logger = logging.getLogger(__name__)

_DIR_LOCK_SUFFIX = ".lock"


class _OpenInProcess:
    """The topics of one data dir whose logs this process has open (several TopicLogs act as one
    owner of the clean-shutdown marker: module docstring)."""

    def __init__(self, clean: bool) -> None:
        self.clean = clean  # the marker was present at the first open
        self.topics: dict[str, int] = {}  # topic -> open TopicLogs of it
        self.may_write_marker = True  # no close so far found a reason not to

    def holders(self) -> int:
        return sum(self.topics.values())


_open_dirs: dict[Path, _OpenInProcess] = {}
_open_dirs_lock = threading.Lock()


def _joined(data_dir: Path, topic: str) -> bool:
    """Count an open of ``topic``'s logs in ``data_dir`` by this process; returns whether the
    marker was present when the process's first open read it (read and recorded here)."""
    key = data_dir.resolve()
    with _open_dirs_lock:
        state = _open_dirs.get(key)
        if state is None:
            state = _open_dirs[key] = _OpenInProcess(has_clean_shutdown_file(data_dir))
            clean = state.clean
        elif topic in state.topics:
            clean = has_clean_shutdown_file(data_dir)  # the same topic twice is no sibling: as before
        else:
            clean = state.clean
        state.topics[topic] = state.topics.get(topic, 0) + 1
        return clean


def _left(data_dir: Path, topic: str, may_write_marker: bool) -> bool:
    """Count a close (or abandon) of ``topic``'s logs. Returns whether it was the process's last
    open one in ``data_dir`` and every close was allowed to write the marker."""
    key = data_dir.resolve()
    with _open_dirs_lock:
        state = _open_dirs[key]
        state.may_write_marker &= may_write_marker
        state.topics[topic] -= 1
        if state.topics[topic] == 0:
            del state.topics[topic]
        if state.holders():
            return False
        del _open_dirs[key]
        return state.may_write_marker


def _topics_open_in_process(data_dir: Path) -> frozenset[str]:
    with _open_dirs_lock:
        state = _open_dirs.get(data_dir.resolve())
        return frozenset() if state is None else frozenset(state.topics)


def _read_checkpoint_or_empty(path: Path) -> dict[tuple[str, int], int]:
    """``read_offset_checkpoint``, but a corrupt file is logged and treated as empty (Kafka
    ``LogManager.loadLogs`` recovers every log when it cannot read the recovery points)."""
    try:
        return read_offset_checkpoint(path)
    except CorruptCheckpointError as exc:
        logger.warning("ignoring %s: %s", path, exc)
        return {}


def checkpoint_topic_logs(data_dir: Path | str, topic: str, recovery_points: Mapping[int, int],
                          log_start_offsets: Mapping[int, int]) -> None:
    """Merge ``topic``'s per-partition recovery points and log start offsets into the data dir's
    ``recovery-point-offset-checkpoint`` and ``log-start-offset-checkpoint``.

    Entries of other topics and partitions are kept; a corrupt file is logged and replaced.
    """
    data_dir = Path(data_dir)
    for name, offsets in ((RECOVERY_POINT_CHECKPOINT, recovery_points),
                          (LOG_START_OFFSET_CHECKPOINT, log_start_offsets)):
        update_offset_checkpoint(data_dir / name, {(topic, p): offset for p, offset in offsets.items()},
                                 replace_corrupt=True)


def delete_partition_dir(data_dir: Path | str, topic: str, partition: int) -> bool:
    """Delete one closed partition's folder and its entries in the data dir's checkpoints.

    The folder goes as :func:`~.files.delete_log_dir` deletes it (renamed ``*-delete`` first, as
    Kafka's ``LogManager.asyncDelete``), and the partition's entries leave
    ``recovery-point-offset-checkpoint``, ``log-start-offset-checkpoint`` and
    ``cleaner-offset-checkpoint``, so a later log of that partition starts from nothing. Returns
    False when there was no folder. The log must not be open (no process may hold it).

    Raises:
        OSError: the folder cannot be renamed or removed (the path named).
    """
    data_dir = Path(data_dir)
    folder = data_dir / partition_dir_name(topic, partition)
    existed = folder.is_dir()
    # Entries first: a crash between the two leaves a folder without entries, never entries without
    # a folder (a later log of the partition would start at them, skipping what lies below). The
    # folder is then opened from its own segments: its log start offset falls back to its first
    # segment's base offset (records below a log start inside that segment come back).
    for name in (RECOVERY_POINT_CHECKPOINT, LOG_START_OFFSET_CHECKPOINT, CLEANER_OFFSET_CHECKPOINT):
        path = data_dir / name
        if path.exists():
            update_offset_checkpoint(path, remove=[(topic, partition)], replace_corrupt=True)
    if existed:
        delete_log_dir(folder)
    return existed


def _partition_dirs(data_dir: Path) -> set[tuple[str, int]]:
    return set(find_partition_dirs(data_dir))


class TopicLogs:
    """The open partition logs of one topic in one data dir (see the module docstring).

    Use :meth:`open`, then :meth:`close` (or a ``with`` block: a clean exit closes; an exception
    closes the logs without writing the checkpoints or the marker, so their next open recovers
    them as after a crash).

    Attributes:
        data_dir: the data dir holding the ``<topic>-<partition>`` folders.
        topic: the topic.
        logs: partition -> open ``Log`` (empty once closed).
        had_clean_shutdown: the clean-shutdown marker was present when the logs were opened.
    """

    def __init__(self, data_dir: Path, topic: str, logs: dict[int, Log], had_clean_shutdown: bool,
                 dir_lock: IO[bytes] | None, dir_was_ours: bool, config: LogConfig | None = None,
                 topic_id: uuid.UUID | None = None) -> None:
        self.data_dir = data_dir
        self.topic_id = topic_id
        self._config = config if config is not None else next(iter(logs.values())).config if logs else LogConfig()
        self.topic = topic
        self.logs = logs
        self.had_clean_shutdown = had_clean_shutdown
        self._dir_lock = dir_lock
        self._dir_was_ours = dir_was_ours
        #: Partitions of this topic whose folders were neither opened nor recovered since an unclean
        #: shutdown: while any is left the clean-shutdown marker is not written.
        self._unrecovered: set[int] = set()
        #: Set by :meth:`open`: counts this topic out of the process's open topics once (_left).
        self._leave_on_collect: weakref.finalize | None = None

    @classmethod
    def open(cls, data_dir: Path | str, topic: str, partitions: Iterable[int], config: LogConfig,
             topic_id: uuid.UUID | None = None) -> "TopicLogs":
        """Open (creating if needed) ``DIR/<topic>-<p>`` for every partition (Kafka ``loadLogs``).

        ``partitions`` may be a subset of the topic's folders (a consumer-group member opens only
        its assigned partitions): the others are left closed and untouched, and still count as
        this topic's for the clean-shutdown marker.

        With ``topic_id`` every folder holds that id in ``partition.metadata`` (written before any
        segment byte; a folder with another id raises :class:`InconsistentTopicIdError`, Kafka
        ``LogManager.getOrCreateLog``).

        Recovery points and log start offsets come from the data dir's checkpoints; without the
        marker each log is recovered past its recovery point, and what recovery cut is logged
        (``Log.recovery_truncations``). The marker is deleted once every log is open.

        Raises:
            StorageError: a log cannot be opened (the logs opened so far are closed again;
                neither the checkpoints nor the marker are touched).
        """
        data_dir = Path(data_dir)
        partitions = sorted(partitions)
        dir_lock = open(data_dir / (CLEAN_SHUTDOWN_FILE + _DIR_LOCK_SUFFIX), "a+b")
        logs: dict[int, Log] = {}
        joined = False
        try:
            lock_file(dir_lock, purpose="the log dir lock", shared=True)
            clean = _joined(data_dir, topic)
            joined = True
            # Folders of this topic left unopened (a consumer-group member's partitions that another
            # member holds) are ours too; after an unclean shutdown they count as recovered only once
            # add_partition opened (recovered) them (``_unrecovered``). Folders of the other topics
            # open in this process are ours too (checked again at close: they may open later).
            dirs = _partition_dirs(data_dir)
            ours = _topics_open_in_process(data_dir)  # this topic (counted by _joined) and the others
            dir_was_ours = all(dir_topic in ours for dir_topic, _ in dirs)
            unrecovered = set() if clean else {p for t, p in dirs if t == topic} - set(partitions)
            recovery_points = _read_checkpoint_or_empty(data_dir / RECOVERY_POINT_CHECKPOINT)
            log_start_offsets = _read_checkpoint_or_empty(data_dir / LOG_START_OFFSET_CHECKPOINT)
            for partition in partitions:
                key = (topic, partition)
                log = Log.open(data_dir / partition_dir_name(topic, partition), config,
                               log_start_offset=log_start_offsets.get(key),
                               recovery_point=recovery_points.get(key), had_clean_shutdown=clean,
                               topic_id=topic_id)
                logs[partition] = log
                for truncation in log.recovery_truncations:
                    logger.warning("recovery of %s: %s", log.dir, truncation)
            delete_clean_shutdown_file(data_dir)  # logs are open for writing: a crash from here is unclean
        except BaseException:
            for log in logs.values():
                with contextlib.suppress(Exception):
                    log.close()
            if joined:
                _left(data_dir, topic, may_write_marker=clean)  # the marker is untouched while it is there
            dir_lock.close()
            raise
        topic_logs = cls(data_dir, topic, logs, clean, dir_lock, dir_was_ours, config, topic_id)
        topic_logs._unrecovered = unrecovered
        # counted out exactly once: by close or abandon, or (never closed) when collected, as a crash
        topic_logs._leave_on_collect = weakref.finalize(topic_logs, _left, data_dir, topic, False)
        return topic_logs

    def __enter__(self) -> "TopicLogs":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abandon()

    def add_partition(self, partition: int) -> Log:
        """Open (creating if needed) the log of a partition added to the topic while running.

        Its recovery point and log start offset come from the data dir's checkpoints, as in
        :meth:`open`; the clean-shutdown marker was already consumed by :meth:`open`, so a folder
        left by an earlier run is recovered past its recovery point.

        Raises:
            ValueError: ``partition`` is open already.
            StorageError: the log cannot be opened.
        """
        if partition in self.logs:
            raise ValueError(f"partition {partition} of {self.topic} is open already")
        key = (self.topic, partition)
        recovery_points = _read_checkpoint_or_empty(self.data_dir / RECOVERY_POINT_CHECKPOINT)
        log_start_offsets = _read_checkpoint_or_empty(self.data_dir / LOG_START_OFFSET_CHECKPOINT)
        log = Log.open(self.data_dir / partition_dir_name(self.topic, partition), self._config,
                       log_start_offset=log_start_offsets.get(key), recovery_point=recovery_points.get(key),
                       had_clean_shutdown=False, topic_id=self.topic_id)
        self.logs[partition] = log
        self._unrecovered.discard(partition)  # recovered past its recovery point just now
        return log

    def remove_partition(self, partition: int) -> None:
        """Stop serving one partition's log while the others stay open: flush and close it, merge its
        recovery point and log start offset into the data dir's checkpoints, and forget it. The
        folder stays, so :meth:`add_partition` later reopens it where it ended (recovery checks
        only what lies past the checkpointed recovery point, i.e. nothing); Kafka's replica that
        stops fetching without deleting the partition (``ReplicaManager.stopReplicas`` with
        ``deletePartition=false``, ``LogManager`` keeping the log). For a consumer-group member
        whose partition was revoked.

        Raises:
            KeyError: ``partition`` is not open here.
            StorageError / OSError: the log cannot be flushed or the checkpoints written (the log
                is forgotten all the same; its next open recovers it).
        """
        log = self.logs.pop(partition)
        log.close()
        checkpoint_topic_logs(self.data_dir, self.topic, {partition: log.recovery_point},
                              {partition: log.log_start_offset})

    def delete_partition(self, partition: int) -> bool:
        """Delete the folder and checkpoint entries of a partition of this topic that is not open
        (:func:`delete_partition_dir`); it no longer holds back the clean-shutdown marker. For a
        consumer-group member dropping a partition it kept after the group moved it elsewhere.
        Returns False when there was no folder.

        Raises:
            ValueError: ``partition`` is open here.
            OSError: the folder cannot be renamed or removed.
        """
        if partition in self.logs:
            raise ValueError(f"partition {partition} of {self.topic} is open: close it first")
        existed = delete_partition_dir(self.data_dir, self.topic, partition)
        self._unrecovered.discard(partition)
        return existed

    def recover_partition(self, partition: int, from_offset: int) -> Log:
        """Reopen one partition's log with Kafka's unclean-shutdown recovery from ``from_offset``.

        For damage found while reading (a torn or corrupt batch, offsets out of order) in a segment
        that recovery at open did not check: the log is closed and reopened by ``LogLoader`` with
        the recovery point at ``from_offset``, so every segment from the one holding it is
        checked, the first invalid batch and everything after it are cut, and later segments are
        deleted (Kafka ``LogLoader.recoverLog``). ``logs[partition]`` is replaced.

        Returns:
            the reopened log; its ``recovery_truncations`` say what was cut.

        Raises:
            KeyError: ``partition`` is not open here.
            StorageError: the log cannot be reopened.
        """
        old = self.logs[partition]
        old.close()
        log = Log.open(old.dir, old.config, log_start_offset=old.log_start_offset,
                       recovery_point=min(from_offset, old.log_end_offset), had_clean_shutdown=False,
                       topic_id=self.topic_id)
        self.logs[partition] = log
        for truncation in log.recovery_truncations:
            logger.warning("recovery of %s: %s", log.dir, truncation)
        return log

    def checkpoint(self) -> None:
        """Merge every open log's recovery point and log start offset into the data dir's
        checkpoints (Kafka ``checkpointLogRecoveryOffsets`` + ``checkpointLogStartOffsets``)."""
        checkpoint_topic_logs(self.data_dir, self.topic,
                              {p: log.recovery_point for p, log in self.logs.items()},
                              {p: log.log_start_offset for p, log in self.logs.items()})

    def close(self) -> None:
        """Close (flush) every log, write the checkpoints, and restore the clean-shutdown marker
        when allowed (module docstring). Idempotent.

        Raises:
            StorageError / OSError: a log cannot be flushed or a checkpoint written; the
                remaining logs are still closed and the marker is not written.
        """
        if self._dir_lock is None:
            return
        try:
            try:
                for log in self.logs.values():
                    log.close()
            except BaseException:
                self.abandon()
                raise
            self.checkpoint()
            self.logs = {}
            ours = _topics_open_in_process(self.data_dir)  # this topic's and the others open in this process
            last = self._leave(self.had_clean_shutdown or (not self._unrecovered and (
                self._dir_was_ours or all(dir_topic in ours for dir_topic, _ in _partition_dirs(self.data_dir)))))
            if last:
                try:
                    lock_file(self._dir_lock, purpose="the log dir lock", blocking=False)
                except BlockingIOError:
                    logger.info("not writing %s: another process has logs of %s open",
                                CLEAN_SHUTDOWN_FILE, self.data_dir)
                else:
                    write_clean_shutdown_file(self.data_dir)
        finally:
            self._leave(may_write_marker=False)  # a checkpoint failed: no marker from this process
            self._release_dir_lock()

    def abandon(self) -> None:
        """Close the logs without checkpoints or marker (after an error; as if the process died:
        no other topic of the directory open in this process writes the marker either)."""
        for log in self.logs.values():
            with contextlib.suppress(Exception):
                log.close()
        self.logs = {}
        self._leave(may_write_marker=False)
        self._release_dir_lock()

    def _leave(self, may_write_marker: bool) -> bool:
        """Leave the process's count of open topics of the data dir, once (:func:`_left`); True
        when this was the last and every one left may write the marker."""
        leave = self._leave_on_collect
        if leave is None or leave.detach() is None:
            return False
        return _left(self.data_dir, self.topic, may_write_marker)

    def _release_dir_lock(self) -> None:
        if self._dir_lock is not None:
            self._dir_lock.close()
            self._dir_lock = None

    def __repr__(self) -> str:
        return f"TopicLogs({str(self.data_dir)!r}, {self.topic!r}, partitions={sorted(self.logs)})"
