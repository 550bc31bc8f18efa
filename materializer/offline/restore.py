"""Offline restore: build a data directory from a Kafka broker's log dir, without the broker.

``materializer restore --from-log-dir BROKER_LOG_DIR --topic TOPIC --data-dir DIR``

The broker's folders are never modified, and neither is ``DIR`` until the end: the restore holds
``DIR``'s lock (:class:`~materializer.datadir.lock.DataDirLock`: a running ``materializer run`` or
another restore makes it fail at once, naming the holder) and builds the whole topic in a staging
folder ``DIR/.staging-<topic>.<hex>/`` (:class:`~materializer.datadir.staging.TopicStaging`). Each
``BROKER_LOG_DIR/<topic>-<p>/`` is COPIED there (plain byte copies, no hard links: a hard link
would let our recovery truncate the broker's file), and only the copy is ever opened for writing:

1. copy the segment files: every ``.log`` first, then ``.index``/``.timeindex``/``.txnindex``
   and any ``.swap``/``.cleaned`` file (so the loader can finish an interrupted swap), then the
   partition's ``partition.metadata`` (its topic id, KIP-516) and ``leader-epoch-checkpoint``
   (KIP-101); ``.deleted`` and ``.snapshot`` files are not needed. A live broker's folder can be
   copied, but the active segment's tail may then be a batch still being written: the strict
   check refuses it (restore again, or ``--repair`` cuts it);
2. strict check of the copy (unless ``repair``): every batch's CRC-32C, offsets in order inside
   their segments, and no incomplete batch anywhere, the last segment's end included (a backup
   cut short is not taken for a write in flight). Kafka's recovery would silently cut the log at the
   first bad batch and drop every later segment; here such damage fails the restore with the
   broker's file, the byte position and what was expected (``--repair`` accepts Kafka's cut);
   Copied offset indexes whose entries point past the end of their ``.log`` are deleted (with a
   warning naming the file, the entry's byte position and the expected bound) and rebuilt;
3. open the copy with :class:`Log` (``LogLoader``: swap completion, index checks, recovery from the
   broker's ``recovery-point-offset-checkpoint``, log start offset from its
   ``log-start-offset-checkpoint``);
4. cut the local log at the last stable offset when a transaction is still open (its outcome is
   not in the copy; ``materializer run`` later fetches it from the broker with read_committed);
5. materialize: the committed records (:mod:`materializer.storage.read_committed`: aborted
   transactions and control batches skipped, as a ``read_committed`` consumer sees them) are
   applied to the staged ``state/<topic>/`` in chunks, each chunk and the partition's next offset
   in one atomic write; a tombstone deletes its key, null-key records are skipped;
6. swap the staged partition folders, state store and ``topic-configs/<topic>.json`` into ``DIR``
   (the previous ones of the topic, ``--overwrite``, are moved aside and deleted), merge the
   ``recovery-point-offset-checkpoint`` and ``log-start-offset-checkpoint`` entries, drop the
   topic's ``cleaner-offset-checkpoint`` entries, and write the topic's completeness marker last.
   The clean-shutdown marker is not written (another process may have used DIR); the next open
   recovers only past the recovery point.

Afterwards ``materializer export`` prints what a read_committed consumer of the broker reads
(latest value per key), and ``materializer run`` continues from each partition's end offset.

An interruption (Ctrl-C, SIGTERM, SIGKILL, a full disk, an error) before step 6 leaves ``DIR`` as
it was (the staging folder is deleted at once, or by the next command that writes ``DIR``);
during step 6 readers refuse the topic (its marker says incomplete) until the swap is finished,
by this restore or by the next command that writes ``DIR``. Never a partial topic that ``export``
serves: a rerun after an interruption restores into a ``DIR`` that still holds the previous data.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, NamedTuple, Sequence


from materializer.adapters.rocksdb_store import StateStore, StateStoreOptions
from materializer.datadir.layout import state_dir, topic_config_path
from materializer.datadir.lock import DataDirLock
from materializer.datadir.markers import topic_status
from materializer.datadir.staging import TopicStaging
from materializer.progress import progress_bar
from materializer.apply.store_loader import DEFAULT_CHUNK_BYTES
from materializer.storage.checkpoint import (
    LOG_START_OFFSET_CHECKPOINT,
    RECOVERY_POINT_CHECKPOINT,
    read_offset_checkpoint,
)
from materializer.apply.committed import apply_committed_records
from materializer.storage.errors import CorruptRecordError
from materializer.storage.files import (
    CLEANED_FILE_SUFFIX,
    INDEX_FILE_SUFFIX,
    LOG_FILE_SUFFIX,
    SWAP_FILE_SUFFIX,
    TIME_INDEX_FILE_SUFFIX,
    TXN_INDEX_FILE_SUFFIX,
    find_partition_dirs,
    topic_partition_dirs,
)
from materializer.storage.log import Log
from materializer.storage.log_config import LogConfig
from materializer.storage.log_loader import RecoveryTruncation
from materializer.storage.read_committed import (
    AbortedTxnSource,
    ReadOnlyPartition,
    scan_transactions,
)

__all__ = ["PartitionRestore", "RestoreOptions", "RestoreResult", "copy_partition", "restore_from_log_dir"]

logger = logging.getLogger(__name__)

_INDEX_SUFFIXES = (INDEX_FILE_SUFFIX, TIME_INDEX_FILE_SUFFIX, TXN_INDEX_FILE_SUFFIX)
#: Kafka's per-partition metadata files, copied as they are: the topic id (``PartitionMetadataFile``,
#: KIP-516) and the leader epoch cache (``LeaderEpochCheckpointFile``, KIP-101).
PARTITION_METADATA_FILES = ("partition.metadata", "leader-epoch-checkpoint")


@dataclass(frozen=True)
class RestoreOptions:
    """How :func:`restore_from_log_dir` builds the data directory.

    Attributes:
        config_overrides: topic configs (Kafka names) of the local log; Kafka's defaults otherwise
            (the topic's configs live in the cluster metadata, not in the log dir).
        aborted_txn_source: where aborted transactions come from ("auto": ``.txnindex`` files
            and ABORT markers; see :mod:`materializer.storage.read_committed`).
        apply_chunk_bytes: bytes of decoded store entries held before a state store write
            (48 MiB; see :mod:`materializer.apply.store_loader`).
        overwrite: replace the topic's existing partition folders, state store and topic config in
            DIR (at the end, in one swap: until then DIR keeps them).
        repair: accept Kafka's recovery cut of corrupt batches instead of failing.
        store: RocksDB options of the state store.
        progress: draw a progress bar on stderr (bytes of the broker's ``.log`` files, advanced
            as each partition is copied, checked and materialized); None = only when stderr is
            a terminal.
    """

    config_overrides: Mapping[str, str] = field(default_factory=dict)
    aborted_txn_source: AbortedTxnSource = AbortedTxnSource.AUTO
    apply_chunk_bytes: int = DEFAULT_CHUNK_BYTES
    overwrite: bool = False
    repair: bool = False
    store: StateStoreOptions = field(default_factory=StateStoreOptions)
    progress: bool | None = None

    def __post_init__(self) -> None:
        if self.apply_chunk_bytes < 1:
            raise ValueError(f"apply_chunk_bytes must be >= 1 byte, got {self.apply_chunk_bytes}")


class PartitionRestore(NamedTuple):
    """What was restored for one partition (offsets; bytes).

    ``truncations``: what recovery cut from the copy (a torn tail of a live copy, or with
    ``repair`` corrupt data). ``open_transaction_bytes``: bytes cut because a transaction was
    still open (from the last stable offset on).
    """

    partition: int
    source_dir: Path
    bytes_copied: int
    log_start_offset: int
    log_end_offset: int
    last_stable_offset: int
    records_applied: int
    null_key_records: int
    aborted_transactions: int
    truncations: tuple[RecoveryTruncation, ...]
    open_transaction_bytes: int


@dataclass
class RestoreResult:
    """Result of :func:`restore_from_log_dir`: per-partition details, live keys and time (s)."""

    topic: str
    data_dir: Path
    partitions: dict[int, PartitionRestore]
    live_keys: int
    elapsed_s: float

    @property
    def next_offsets(self) -> dict[int, int]:
        """Partition -> next offset the state store reflects (= the local log end offset)."""
        return {p: r.log_end_offset for p, r in self.partitions.items()}


def _log_bytes(source_dir: Path) -> int:
    """Bytes of the ``.log`` files in a broker partition folder (the progress bar's measure; 0 if unreadable)."""
    total = 0
    try:
        with os.scandir(source_dir) as entries:
            for entry in entries:
                if entry.name.endswith(LOG_FILE_SUFFIX):
                    with contextlib.suppress(OSError):
                        total += entry.stat().st_size
    except OSError:
        return 0
    return total


def _broker_checkpoints(broker_log_dirs: Sequence[Path]) -> tuple[dict, dict]:
    recovery_points: dict[tuple[str, int], int] = {}
    log_start_offsets: dict[tuple[str, int], int] = {}
    for log_dir in broker_log_dirs:
        recovery_points.update(read_offset_checkpoint(log_dir / RECOVERY_POINT_CHECKPOINT))
        log_start_offsets.update(read_offset_checkpoint(log_dir / LOG_START_OFFSET_CHECKPOINT))
    return recovery_points, log_start_offsets


def _copy_order(name: str) -> int | None:
    if name.endswith(LOG_FILE_SUFFIX):
        return 0
    if name.endswith(_INDEX_SUFFIXES):
        return 1
    if name.endswith(SWAP_FILE_SUFFIX) or name.endswith(CLEANED_FILE_SUFFIX):
        return 2
    if name in PARTITION_METADATA_FILES:
        return 3
    return None


def copy_partition(source: Path, target: Path) -> int:
    """Copy the segment files of ``source`` (and its ``partition.metadata`` and
    ``leader-epoch-checkpoint``) into the new folder ``target``; returns bytes copied.

    A live broker's folder may change meanwhile: a file deleted or renamed before its copy is
    skipped; the caller checks the copy (:func:`restore_from_log_dir` does).

    Raises:
        FileExistsError: ``target`` exists.
        OSError: a file could not be read or written.
    """
    target.mkdir(parents=True)
    names = [(order, n) for n in os.listdir(source) if (order := _copy_order(n)) is not None]
    copied = 0
    for _, name in sorted(names):
        src = source / name
        try:
            shutil.copy2(src, target / name)  # a real copy (never a link); keeps the mtime retention uses
        except FileNotFoundError:
            logger.info("%s disappeared while copying (deleted or renamed by the broker); skipped", src)
            continue
        except OSError as exc:
            raise OSError(exc.errno, f"copying {src} to {target / name} failed: {exc.strerror or exc}") from exc
        copied += (target / name).stat().st_size
    return copied


def _drop_untrusted_indexes(copy_dir: Path, source_dir: Path) -> None:
    """Delete copied ``.index``/``.timeindex`` files whose entries point past the end of their
    ``.log`` file (or that are not whole entries); ``Log.open`` then rebuilds them from the log.

    Kafka's loader does not check positions for segments below the recovery point, and a bad
    entry would make reads (and the next offset) silently wrong.
    """
    for index_path in sorted(copy_dir.glob(f"*{INDEX_FILE_SUFFIX}")):
        log_path = index_path.with_suffix(LOG_FILE_SUFFIX)
        log_size = log_path.stat().st_size if log_path.exists() else 0
        data = index_path.read_bytes()
        problem = None
        if len(data) % 8:
            problem = f"its size {len(data)} bytes is not a multiple of the 8-byte entry size"
        else:
            for position in range(0, len(data), 8):
                file_position = int.from_bytes(data[position + 4:position + 8], "big", signed=True)
                if not 0 <= file_position < max(log_size, 1):
                    problem = (f"the entry at byte position {position} points to byte position {file_position} of "
                               f"{source_dir / log_path.name}, expected a position below its size {log_size} bytes")
                    break
        if problem:
            logger.warning("offset index %s is not usable (%s); rebuilding it from the log",
                           source_dir / index_path.name, problem)
            index_path.unlink()
            index_path.with_suffix(TIME_INDEX_FILE_SUFFIX).unlink(missing_ok=True)


def _check_copy(copy_dir: Path, source_dir: Path, source: AbortedTxnSource) -> None:
    """Strict CRC/framing check of the copy; errors name the broker's file, not the copy."""
    names = os.listdir(copy_dir)
    if any(n.endswith(SWAP_FILE_SUFFIX) or n.endswith(CLEANED_FILE_SUFFIX) for n in names):
        return  # an interrupted swap: checked after Log.open completes it
    try:
        scan_transactions(ReadOnlyPartition(copy_dir, strict=True), source=source, verify_crc=True)
    except CorruptRecordError as exc:
        path = None if exc.path is None else exc.path.replace(str(copy_dir), str(source_dir))
        message = str(exc).replace(str(copy_dir), str(source_dir))
        hint = ("; if the folder was copied from a running broker, a write may have been in flight: restore again"
                if "incomplete record batch" in message else "")
        error = CorruptRecordError(f"{message} (restore stopped{hint}; --repair accepts Kafka's recovery, which cuts "
                                   f"the log there and drops every later segment)")
        error.path, error.position = path, exc.position
        raise error from None


def _check_destination(data_dir: Path, topic: str, overwrite: bool) -> None:
    """Refuse (``FileExistsError``) a ``DIR`` that holds data of ``topic`` unless ``overwrite``."""
    existing: list[Path] = list(find_partition_dirs(data_dir, topic).values())
    store_path = state_dir(data_dir, topic)
    if store_path.exists():
        existing.append(store_path)
    if topic_config_path(data_dir, topic).exists():
        existing.append(topic_config_path(data_dir, topic))
    if existing and not overwrite:
        raise FileExistsError(f"{data_dir} already holds data of topic {topic!r} ({existing[0]}); "
                              f"use --overwrite to replace it")
    status = topic_status(data_dir, topic)
    if not existing and status.state == "incomplete" and not overwrite:
        raise FileExistsError(f"{data_dir} holds an incomplete topic {topic!r} ({status.operation}); "
                              f"use --overwrite to replace it")


def _restore_partition(partition: int, source_dir: Path, staging: TopicStaging, config: LogConfig,
                       store: StateStore, options: RestoreOptions, recovery_point: int | None,
                       log_start_offset: int | None) -> PartitionRestore:
    copy_dir = staging.partition_dir(partition)
    copied = copy_partition(source_dir, copy_dir)
    if not options.repair:
        _check_copy(copy_dir, source_dir, options.aborted_txn_source)
    _drop_untrusted_indexes(copy_dir, source_dir)
    # --repair: recover every segment (Kafka's unclean-shutdown recovery from offset 0), since the
    # strict check that would have caught corruption below the broker's recovery point was skipped.
    log = Log.open(copy_dir, config, log_start_offset=log_start_offset,
                   recovery_point=None if options.repair else recovery_point, had_clean_shutdown=False)
    try:
        truncations = tuple(log.recovery_truncations)
        if truncations and not options.repair and any(t.deleted_segments for t in truncations):
            raise CorruptRecordError(f"recovery of the copy of {source_dir} dropped segments: {truncations}")
        for truncation in truncations:
            logger.warning("restore of %s: recovery cut %d bytes at byte position %d of %s", source_dir,
                           truncation.bytes_truncated, truncation.position, truncation.path)
        scan = scan_transactions(log, source=options.aborted_txn_source, verify_crc=not options.repair)
        open_bytes = 0
        if scan.last_stable_offset < log.log_end_offset:
            size_before = log.size_in_bytes
            logger.warning("%s: transactions of producers %s are still open; the local log ends at their first "
                           "offset %d (was %d)", source_dir, sorted(scan.open_transactions), scan.last_stable_offset,
                           log.log_end_offset)
            log.truncate_to(scan.last_stable_offset)
            open_bytes = size_before - log.size_in_bytes
        start = max(store.offsets().get(partition, log.log_start_offset), log.log_start_offset)
        applied, null_keys, aborted, _ = apply_committed_records(
            store, partition, log, start, source=options.aborted_txn_source, verify_crc=False,
            chunk_bytes=options.apply_chunk_bytes)
        log.flush()
        return PartitionRestore(partition, source_dir, copied, log.log_start_offset, log.log_end_offset,
                                scan.last_stable_offset, applied, null_keys, aborted, truncations, open_bytes)
    finally:
        log.close()


def restore_from_log_dir(broker_log_dir: Path | str | Sequence[Path | str], topic: str, data_dir: Path | str, *,
                         options: RestoreOptions | None = None) -> RestoreResult:
    """Build ``data_dir``'s local log and state store for ``topic`` from a broker's log dir(s).

    The broker's files are only read (copied); see the module docstring for every step.

    Args:
        broker_log_dir: the broker's ``log.dirs`` entry (or several), holding ``<topic>-<p>/`` folders.
        topic: the topic to restore (every partition found).
        data_dir: the materializer data directory to fill.
        options: restore options.

    Returns:
        per-partition offsets and counts, the number of live keys and the elapsed seconds.

    Raises:
        LogNotFoundError: no log dir or no partition folder of ``topic``.
        DataDirLockedError: another process writes ``data_dir`` (``materializer run`` ...); nothing
            was written.
        FileExistsError: ``data_dir`` already holds the topic and ``options.overwrite`` is False.
        CorruptRecordError: a batch of the broker's log fails its CRC or framing check (file,
            byte position, expected vs actual named), unless ``options.repair``.
        CorruptCheckpointError: a broker checkpoint file is malformed (file and line named).
        StoreError: the state store cannot be written.
        KeyboardInterrupt: Ctrl-C (or :class:`~materializer.interrupts.Terminated`: SIGTERM, under
            :func:`~materializer.interrupts.sigterm_interrupts`).

        On any of these ``data_dir`` keeps what it held (module docstring).
    """
    started = time.monotonic()
    options = options or RestoreOptions()
    dirs = [Path(broker_log_dir)] if isinstance(broker_log_dir, (str, Path)) else [Path(d) for d in broker_log_dir]
    data_dir = Path(data_dir)
    found = topic_partition_dirs(dirs, topic)
    recovery_points, log_start_offsets = _broker_checkpoints(dirs)
    config = LogConfig.from_kafka_configs(dict(options.config_overrides))
    restored: dict[int, PartitionRestore] = {}
    log_bytes = {p: _log_bytes(d) for p, d in found.items()}
    with DataDirLock.acquire(data_dir, "restore --from-log-dir") as lock:
        _check_destination(data_dir, topic, options.overwrite)
        with TopicStaging(lock, topic) as staging:
            try:
                config_path = staging.topic_config_path()
                config_path.parent.mkdir(parents=True, exist_ok=True)
                config.save(config_path)
                with StateStore(staging.state_dir(), options.store) as store, \
                        progress_bar(options.progress, total=sum(log_bytes.values()), unit="B", unit_scale=True,
                                     desc=f"{topic}: restore") as bar:
                    for partition, source_dir in sorted(found.items()):
                        key = (topic, partition)
                        bar.set_postfix_str(f"partition {partition}")
                        restored[partition] = _restore_partition(partition, source_dir, staging, config, store,
                                                                 options, recovery_points.get(key),
                                                                 log_start_offsets.get(key))
                        bar.update(log_bytes[partition])
                        logger.info("restored %s: %s", source_dir, restored[partition])
                    live_keys = store.count()
            except KeyboardInterrupt as exc:
                exc.add_note(f"the restore was stopped before it changed {data_dir}")
                raise
            staging.commit(recovery_points={p: r.log_end_offset for p, r in restored.items()},
                           log_start_offsets={p: r.log_start_offset for p, r in restored.items()},
                           operation="restore --from-log-dir",
                           facts={"next_offsets": {str(p): r.log_end_offset for p, r in restored.items()},
                                  "live_keys": live_keys})
    return RestoreResult(topic, data_dir, restored, live_keys, time.monotonic() - started)
