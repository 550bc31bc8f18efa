"""``materializer spark compact``: the project's log cleaner on every partition of a topic, in parallel on Spark.

    materializer spark compact --log-dir /backups/kafka-logs --topic prices --out /tmp/prices-compacted

Input: partition folders (a broker's log dir, a copy, or a materializer data dir); they are only
read. ``OUT`` is a data dir the driver holds the lock of (:class:`~materializer.datadir.lock.DataDirLock`:
a process writing ``OUT`` makes the job fail at once) and marks incomplete until the end. Each
Spark task takes one Kafka partition and, in its own work folder ``OUT/.staging-<topic>.p<partition>``
(deleted by the next writer of ``OUT`` if the job dies):

1. copies the partition's segment files (``.log`` first, then indexes; never links), with the
   source's log start offset (from its ``log-start-offset-checkpoint``) and the topic config
   (``--config``; ``cleanup.policy=compact`` always);
2. runs one forced cleaning round (:func:`materializer.offline.compact.compact_topic`: Kafka's
   ``LogCleaner`` rules, offset map, grouping, ``.cleaned``/``.swap``, delete horizon,
   transactions) up to Kafka's own bound (the active segment is not cleaned), or up to the log
   end with ``--to-log-end``; every task uses the same ``now`` (the driver's clock at job start),
   so delete horizons do not depend on which executor ran when;
3. moves the cleaned ``<topic>-<p>/`` into ``OUT`` and reports its offsets.

The driver then writes ``OUT``'s ``cleaner-offset-checkpoint``, ``recovery-point-offset-checkpoint``,
``log-start-offset-checkpoint`` and ``topic-configs/<topic>.json`` once (tasks never share a
checkpoint file), and the topic's completeness marker last. ``OUT`` is a materializer data
directory: ``kafkalog``, ``dump-log``, Kafka's ``DumpLogSegments`` and ``materializer restore
--from-log-dir OUT`` read it; ``kafkalog`` refuses it until the marker says complete (an interrupted
job: run it again with ``--overwrite``).

Same result, byte for byte, as ``materializer compact`` on each partition one after another with
the same clock (a test compares them).
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Sequence

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from materializer.storage.log_config import LogConfig

__all__ = ["PartitionCompactionResult", "spark_compact"]


@dataclass(frozen=True)
class PartitionCompactionResult:
    """One partition's round, as a task reports it (plain values: it crosses from executor to driver).

    Attributes:
        partition: the Kafka partition.
        log_start_offset / log_end_offset: of the cleaned copy.
        cleaner_checkpoint: first dirty offset of the next round (``cleaner-offset-checkpoint``).
        size_before_bytes / size_after_bytes: ``.log`` bytes before and after.
        records_read / records_written: by the round's recopy passes.
        elapsed_s: the task's wall time, copy included, seconds.
    """

    partition: int
    log_start_offset: int
    log_end_offset: int
    cleaner_checkpoint: int
    size_before_bytes: int
    size_after_bytes: int
    records_read: int
    records_written: int
    elapsed_s: float


def _compact_task(partition: int, source_dir: str, out: str, topic: str, configs: Mapping[str, str],
                  log_start_offset: int, to_log_end: bool, now_ms: int,
                  dedupe_buffer_size_bytes: int) -> dict[str, Any]:
    """Executor side: copy, clean and move one partition (see the module docstring)."""
    from materializer.offline.compact import compact_topic
    from materializer.datadir.layout import STAGING_PREFIX, partition_dir, topic_config_path
    from materializer.offline.restore import copy_partition
    from materializer.storage.checkpoint import (
        CLEANER_OFFSET_CHECKPOINT,
        LOG_START_OFFSET_CHECKPOINT,
        read_offset_checkpoint,
        update_offset_checkpoint,
    )
    from materializer.storage.log import Log
    from materializer.storage.log_config import LogConfig

    started = time.monotonic()
    work = Path(out) / f"{STAGING_PREFIX}{topic}.p{partition}"
    shutil.rmtree(work, ignore_errors=True)
    target = partition_dir(work, topic, partition)
    copy_partition(Path(source_dir), target)
    config = LogConfig.from_kafka_configs(dict(configs))
    config_path = topic_config_path(work, topic)
    config_path.parent.mkdir(parents=True, exist_ok=True)
    config.save(config_path)
    update_offset_checkpoint(work / LOG_START_OFFSET_CHECKPOINT, {(topic, partition): log_start_offset})
    upto = None
    if to_log_end:
        with Log.open(target, config, log_start_offset=log_start_offset) as log:
            upto = log.log_end_offset
    (result,) = compact_topic(work, topic, partition=partition, upto_offset=upto, now_ms=now_ms,
                              dedupe_buffer_size_bytes=dedupe_buffer_size_bytes)
    with Log.open(target, config, log_start_offset=log_start_offset, had_clean_shutdown=True) as log:
        log_start, log_end = log.log_start_offset, log.log_end_offset
    checkpoint = read_offset_checkpoint(work / CLEANER_OFFSET_CHECKPOINT).get((topic, partition), result.end_offset)
    destination = partition_dir(Path(out), topic, partition)
    shutil.rmtree(destination, ignore_errors=True)
    target.rename(destination)
    shutil.rmtree(work, ignore_errors=True)
    return asdict(PartitionCompactionResult(
        partition=partition, log_start_offset=log_start, log_end_offset=log_end, cleaner_checkpoint=checkpoint,
        size_before_bytes=result.size_before_bytes, size_after_bytes=result.size_after_bytes,
        records_read=result.records_read, records_written=result.records_written,
        elapsed_s=time.monotonic() - started))


def spark_compact(spark: SparkSession, log_dirs: Sequence[Path | str], topic: str, out: Path | str, *,
                  configs: Mapping[str, str] | None = None, to_log_end: bool = False, now_ms: int | None = None,
                  dedupe_buffer_size_bytes: int | None = None,
                  overwrite: bool = False) -> list[PartitionCompactionResult]:
    """Clean every partition of ``topic`` found in ``log_dirs`` into ``out``, one Spark task each.

    Args:
        spark: a session (:func:`materializer.spark.jobs.spark_session`).
        log_dirs: folders holding ``<topic>-<partition>/`` (read only).
        topic: the topic.
        out: the output data directory (created; on a file system every executor shares).
        configs: topic configs by Kafka name (``delete.retention.ms``, ``min.compaction.lag.ms``,
            ``segment.bytes``, ...); ``cleanup.policy`` is always ``compact``.
        to_log_end: clean up to the log end offset (the active segment too) instead of Kafka's bound.
        now_ms: the rounds' clock, ms since the epoch (delete horizons); default: now.
        dedupe_buffer_size_bytes: offset map budget of each task, bytes (Kafka's default 128 MiB).
        overwrite: replace an existing ``out`` (everything in it is deleted once its lock is held).

    Returns:
        one :class:`PartitionCompactionResult` per partition, in partition order.

    Raises:
        LogNotFoundError: no partition folder of ``topic``.
        FileExistsError: ``out`` exists and ``overwrite`` is False.
        DataDirLockedError: another process writes ``out``; nothing was written.
        CorruptCheckpointError: a source checkpoint is malformed.
        Spark's error wrapping the task's (``CompactionError``, ``CorruptRecordError`` naming the
        file and byte position): see :func:`materializer.spark.jobs.executor_error`.
    """
    from materializer.datadir.lock import DataDirLock
    from materializer.datadir.markers import mark_complete, mark_incomplete, new_generation
    from materializer.storage.checkpoint import LOG_START_OFFSET_CHECKPOINT, read_offset_checkpoint
    from materializer.storage.files import topic_partition_dirs
    from materializer.storage.log_config import LogConfig
    from materializer.storage.offset_map import DEFAULT_DEDUPE_BUFFER_SIZE_BYTES

    roots = [Path(d).absolute() for d in log_dirs]  # tasks run in the executors' folders (a cluster's work dirs)
    sources = topic_partition_dirs(roots, topic)
    log_starts: dict[tuple[str, int], int] = {}
    for root in roots:
        log_starts.update(read_offset_checkpoint(root / LOG_START_OFFSET_CHECKPOINT))
    out = Path(out).absolute()
    if out.exists() and not overwrite:
        raise FileExistsError(f"{out} already exists; use --overwrite to replace it")
    topic_configs = {**dict(configs or {}), "cleanup.policy": "compact"}
    config = LogConfig.from_kafka_configs(topic_configs)  # validate on the driver, before any task runs
    now = int(time.time() * 1000) if now_ms is None else now_ms
    budget = dedupe_buffer_size_bytes or DEFAULT_DEDUPE_BUFFER_SIZE_BYTES
    with DataDirLock.acquire(out, "spark compact"):
        _empty_but_the_lock(out)  # --overwrite: what a previous job (or anything else) left
        mark_incomplete(out, topic, "`materializer spark compact` writing the cleaned partition folders",
                        f"run `materializer spark compact --topic {topic} --out {out} --overwrite` again",
                        generation=new_generation())
        work = [(p, str(d), str(out), topic, topic_configs, log_starts.get((topic, p), 0), to_log_end, now, budget)
                for p, d in sorted(sources.items())]
        rows = (spark.sparkContext.parallelize(work, len(work))
                .map(lambda args: _compact_task(*args)).collect())
        results = sorted((PartitionCompactionResult(**row) for row in rows), key=lambda r: r.partition)
        _write_driver_files(out, topic, config, results)
        mark_complete(out, topic, written_by="spark compact",
                      log_end_offsets={str(r.partition): r.log_end_offset for r in results})
    return results


def _empty_but_the_lock(out: Path) -> None:
    """Delete everything in ``out`` but its ``.lock`` (held by the caller)."""
    from materializer.datadir.layout import LOCK_FILE

    for child in sorted(out.iterdir()):
        if child.name == LOCK_FILE:
            continue
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child)
        else:
            child.unlink()


def _write_driver_files(out: Path, topic: str, config: LogConfig, results: list[PartitionCompactionResult]) -> None:
    """What only the driver writes into ``out`` once every task is done: ``topic-configs/<topic>.json``,
    the cleaner, recovery point and log start offset checkpoints, and ``_compaction.json``."""
    from materializer.datadir.layout import topic_config_path
    from materializer.storage.checkpoint import (
        CLEANER_OFFSET_CHECKPOINT,
        LOG_START_OFFSET_CHECKPOINT,
        RECOVERY_POINT_CHECKPOINT,
        update_offset_checkpoint,
    )

    config_path = topic_config_path(out, topic)
    config_path.parent.mkdir(parents=True, exist_ok=True)
    config.save(config_path)
    update_offset_checkpoint(out / CLEANER_OFFSET_CHECKPOINT, {(topic, r.partition): r.cleaner_checkpoint
                                                               for r in results})
    update_offset_checkpoint(out / RECOVERY_POINT_CHECKPOINT, {(topic, r.partition): r.log_end_offset
                                                               for r in results})
    update_offset_checkpoint(out / LOG_START_OFFSET_CHECKPOINT, {(topic, r.partition): r.log_start_offset
                                                                 for r in results})
    (out / "_compaction.json").write_text(json.dumps([asdict(r) for r in results], indent=2) + "\n")
