"""The compaction oracle: what a Kafka broker's log cleaner keeps, predicted and checked against a real broker.

Two halves:

* **Prediction, no broker.** :class:`CompactionOracle` holds a scratch partition folder in Kafka's
  on-disk format and cleans it with this project's own cleaner (``materializer.storage``, which
  follows Kafka's ``Cleaner`` / ``LogCleaner`` / ``LogCleanerManager``), so "what does the broker keep
  once its cleaner has cleaned up to offset N" is answered by the same code that compacts the
  materializer's logs. Records go in as produced (:meth:`CompactionOracle.append`, offsets assigned
  from the log end offset), as raw v2 batches, or as a copy of a broker partition folder
  (:meth:`CompactionOracle.from_partition_dir`). :meth:`CompactionOracle.clean` runs the rounds of
  one cleaning pass with a first uncleanable offset ``N`` and a wall clock ``now_ms``;
  :func:`predict_compaction` does both in one call.

  Tombstones and transaction markers (KIP-534): the first round that cleans a batch holding a
  tombstone stamps ``delete horizon = now_ms + delete.retention.ms`` on it; a *later* round whose
  ``now_ms`` is at or past that horizon drops the tombstone (and the marker of a transaction with
  no data left). So "after ``delete.retention.ms``" is a second :meth:`~CompactionOracle.clean` with
  ``now_ms >= first now_ms + delete.retention.ms`` over a later dirty section, as on the broker.

* **Checking, with a broker.** :class:`BrokerCompaction` watches a broker's cleaner through its
  ``cleaner-offset-checkpoint`` (:meth:`~BrokerCompaction.wait_for_broker_compaction`), cleans a
  local copy (a materializer data directory) to exactly the broker's checkpoint with
  :func:`materializer.offline.compact.compact_topic`, and compares record for record with what a
  ``read_committed`` consumer reads below it (:meth:`~BrokerCompaction.assert_compacted_like_broker`).
  Failures read as a diff: offsets only on one side, then the first differing field
  (:func:`diff_records`). The pytest plugin's ``kafka_materializer_compaction`` fixture is one of
  these bound to the session's broker.

Local and broker batch boundaries may differ (the materializer rebuilds batches); the record-level
result does not depend on them for keyed records with consecutive offsets, which is what is compared.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping, Protocol, Sequence, cast

from materializer.storage.checkpoint import CLEANER_OFFSET_CHECKPOINT, read_offset_checkpoint
from materializer.storage.cleaner import Cleaner
from materializer.storage.compression import CompressionType
from materializer.storage.files import LOG_FILE_SUFFIX, offset_from_file_name
from materializer.storage.log import Log
from materializer.storage.log_cleaner import CleaningRound, CleanResult, clean_log
from materializer.storage.log_config import LogConfig
from materializer.storage.offset_map import DEFAULT_DEDUPE_BUFFER_SIZE_BYTES, new_offset_map
from materializer.storage.record_batch import Record

if TYPE_CHECKING:  # confluent-kafka is imported only by the functions that consume
    from materializer.adapters.kafka_source import ConsumedMessage

__all__ = [
    "BrokerCompaction",
    "BrokerFilesOnDisk",
    "BrokerLogDirs",
    "CompactionOracle",
    "ComparedPartition",
    "active_segment_base",
    "diff_records",
    "predict_compaction",
    "read_topic_records",
]

_FIELDS = ("timestamp", "key", "value", "headers")


# ---------------------------------------------------------------------------------------------- diff

def diff_records(broker: Sequence[Record], local: Sequence[Record], *, left: str = "broker",
                 right: str = "local", limit: int = 10) -> str | None:
    """A readable difference between two record lists, or ``None`` when they are equal.

    Lists are matched by offset. The text names the offsets only in ``broker`` / only in
    ``local`` (first ``limit`` of each, with their keys), then the first common offset whose
    records differ and which field differs first (``timestamp``, ``key``, ``value``, ``headers``)
    with both values.
    """
    if list(broker) == list(local):
        return None
    theirs = {r.offset: r for r in broker}
    ours = {r.offset: r for r in local}
    lines = [f"{left}: {len(theirs)} records, {right}: {len(ours)} records"]
    for name, mine, other in ((left, theirs, ours), (right, ours, theirs)):
        only = sorted(set(mine) - set(other))
        if only:
            shown = ", ".join(f"{o} (key={mine[o].key!r}{', tombstone' if mine[o].value is None else ''})"
                              for o in only[:limit])
            lines.append(f"offsets only in {name} ({len(only)}): {shown}{' ...' if len(only) > limit else ''}")
    for offset in sorted(set(theirs) & set(ours)):
        a, b = theirs[offset], ours[offset]
        if a != b:
            name = next(f for f in _FIELDS if getattr(a, f) != getattr(b, f))
            lines.append(f"first differing record at offset {offset} (key={a.key!r}): field {name}: "
                         f"{left} {getattr(a, name)!r} vs {right} {getattr(b, name)!r}")
            break
    if len(lines) == 1:  # same records, different order or duplicates
        lines.append("same offsets and records, but not in the same order or with duplicates")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------- oracle

def _log_config(config: LogConfig | Mapping[str, str] | None) -> LogConfig:
    if config is None:
        return LogConfig(cleanup_policy=("compact",))
    if isinstance(config, LogConfig):
        return config
    return LogConfig.from_kafka_configs({"cleanup.policy": "compact", **{str(k): str(v) for k, v in config.items()}})


class CompactionOracle:
    """A scratch partition ``<directory>/<topic>-<partition>`` cleaned with this project's Kafka cleaner.

    Args:
        config: the topic configuration, a :class:`LogConfig` or Kafka topic configs
            (``{"segment.bytes": "4096", "delete.retention.ms": "1000", ...}``; ``cleanup.policy``
            defaults to ``compact``). ``segment.bytes`` matters: Kafka never cleans the active
            segment, and the cleaner groups segments by size.
        topic / partition: names of the scratch folder (only used in messages).
        directory: parent folder (the "log dir"); a temporary one, deleted by :meth:`close`, when None.

    Use as a context manager. Not thread-safe.

    Raises:
        ValueError: a topic config does not parse.
    """

    def __init__(self, config: LogConfig | Mapping[str, str] | None = None, *, topic: str = "oracle",
                 partition: int = 0, directory: Path | None = None) -> None:
        self.config = _log_config(config)
        self._owned = directory is None
        self.directory = Path(directory) if directory is not None else Path(tempfile.mkdtemp(prefix="compaction-oracle-"))
        self.topic, self.partition = topic, partition
        self.log = Log.open(self.directory / f"{topic}-{partition}", self.config, had_clean_shutdown=True)
        self.rounds: list[CleaningRound] = []

    @classmethod
    def from_partition_dir(cls, partition_dir: Path, config: LogConfig | Mapping[str, str] | None = None, *,
                           directory: Path | None = None) -> "CompactionOracle":
        """An oracle over a *copy* of a broker partition folder ``<topic>-<partition>`` (segments,
        indexes, snapshots); the original is not touched.

        Raises:
            FileNotFoundError: ``partition_dir`` does not exist.
            CorruptRecordError: a segment holds a corrupt batch (named by file and position).
        """
        partition_dir = Path(partition_dir)
        if not partition_dir.is_dir():
            raise FileNotFoundError(f"no partition folder {partition_dir}")
        topic, _, number = partition_dir.name.rpartition("-")
        target_root = Path(directory) if directory is not None else Path(tempfile.mkdtemp(prefix="compaction-oracle-"))
        shutil.copytree(partition_dir, target_root / partition_dir.name)
        oracle = cls.__new__(cls)
        oracle.config = _log_config(config)
        oracle._owned = directory is None
        oracle.directory = target_root
        oracle.topic, oracle.partition = topic, int(number)
        oracle.log = Log.open(target_root / partition_dir.name, oracle.config, had_clean_shutdown=True)
        oracle.rounds = []
        return oracle

    # -- input --------------------------------------------------------------------------------
    def append(self, records: Iterable[Record | tuple], *, timestamp_ms: int | None = None,
               compression: CompressionType | str = CompressionType.NONE, batch_records: int = 100) -> list[int]:
        """Append records as a producer would; returns their offsets.

        Each item is a :class:`Record` (its offset is replaced by the next one of this log, its
        timestamp kept) or a tuple ``(key, value)`` / ``(key, value, headers)`` (``value`` None is a
        tombstone). Records are written in batches of ``batch_records`` with ``compression``;
        timestamps default to ``timestamp_ms`` or the wall clock (ms since the epoch).

        Raises:
            ValueError: an item is neither a Record nor a 2/3-tuple.
        """
        now = int(time.time() * 1000) if timestamp_ms is None else timestamp_ms
        codec = compression if isinstance(compression, CompressionType) else CompressionType[str(compression).upper()]
        next_offset = self.log.log_end_offset
        batch: list[Record] = []
        offsets: list[int] = []
        for item in records:
            if isinstance(item, Record):
                record = Record(next_offset, item.timestamp, item.key, item.value, item.headers)
            elif isinstance(item, tuple) and len(item) in (2, 3):
                record = Record(next_offset, now, item[0], item[1], item[2] if len(item) == 3 else ())
            else:
                raise ValueError(f"record #{len(offsets)}: expected a Record or (key, value[, headers]), got {item!r}")
            batch.append(record)
            offsets.append(next_offset)
            next_offset += 1
            if len(batch) >= batch_records:
                self.log.append_records(batch, compression=codec)
                batch = []
        if batch:
            self.log.append_records(batch, compression=codec)
        return offsets

    def append_batches(self, batches: Iterable[bytes]) -> None:
        """Append raw v2 record batches (e.g. read from a broker segment) as they are.

        Raises:
            InvalidOffsetError / CorruptRecordError: a batch does not follow the log end offset or is damaged.
        """
        self.log.append_batches(batches)

    # -- cleaning -----------------------------------------------------------------------------
    def clean(self, upto_offset: int | None = None, *, now_ms: int | None = None,
              dedupe_buffer_size_bytes: int = DEFAULT_DEDUPE_BUFFER_SIZE_BYTES) -> CleanResult:
        """One cleaning pass over ``[first dirty offset, upto_offset)``, as the broker's cleaner thread.

        Args:
            upto_offset: the first uncleanable offset (the broker's ``cleaner-offset-checkpoint``
                value you want to match); None = where Kafka's cleaner would stop now (active
                segment, last stable offset, ``min.compaction.lag.ms``). The segment holding it is
                split there so every record from it on stays untouched, as on a broker.
            now_ms: the round's wall clock, ms since the epoch (delete horizons are
                ``now_ms + delete.retention.ms``; tombstones whose horizon is ``<= now_ms`` go).
            dedupe_buffer_size_bytes: Kafka ``log.cleaner.dedupe.buffer.size`` of one cleaner
                thread, bytes; when the offset map fills, several rounds run (as on the broker).

        Returns:
            the :class:`CleanResult` (dirty sections of each round in ``rounds``; first dirty offset
            from this oracle's own ``cleaner-offset-checkpoint``, updated afterwards).

        Raises:
            ValueError: ``upto_offset`` beyond the log end offset or the last stable offset.
        """
        cleaner = Cleaner(offset_map=new_offset_map(dedupe_buffer_size_bytes), empty_batch_upper_bound="round")
        result = clean_log(self.log, first_uncleanable_offset=upto_offset, now_ms=now_ms, cleaner=cleaner,
                           split_segment=upto_offset is not None)
        self.rounds.extend(result.rounds)
        return result

    @property
    def cleaner_checkpoint(self) -> int | None:
        """This oracle's ``cleaner-offset-checkpoint`` entry (first dirty offset of the next pass)."""
        path = self.directory / CLEANER_OFFSET_CHECKPOINT
        return read_offset_checkpoint(path).get((self.topic, self.partition)) if path.exists() else None

    # -- output -------------------------------------------------------------------------------
    def records(self, end_offset: int | None = None, *, include_aborted: bool = False) -> list[Record]:
        """Records below ``end_offset`` (all when None) as a ``read_committed`` consumer reads them:
        no control records and, unless ``include_aborted``, no records of aborted transactions."""
        if include_aborted:
            return list(self.log.read_records(None, end_offset))
        return _committed_below(self.log, end_offset)

    def latest_per_key(self, end_offset: int | None = None) -> dict[bytes | None, bytes]:
        """key -> latest value below ``end_offset`` (a tombstone removes its key): what a
        materialized view of this partition holds."""
        latest: dict[bytes | None, bytes] = {}
        for record in self.records(end_offset):
            if record.value is None:
                latest.pop(record.key, None)
            else:
                latest[record.key] = record.value
        return latest

    def close(self) -> None:
        """Close the log; delete the scratch directory when this oracle created it. Idempotent."""
        if self.log is not None:
            self.log.close()
            self.log = None  # type: ignore[assignment]
        if self._owned:
            shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self) -> "CompactionOracle":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def predict_compaction(records: Iterable[Record | tuple], config: LogConfig | Mapping[str, str] | None = None, *,
                       upto_offset: int | None = None, now_ms: int | None = None,
                       compression: CompressionType | str = CompressionType.NONE,
                       batch_records: int = 100) -> list[Record]:
    """What the broker keeps of ``records`` (appended from offset 0) once its cleaner has cleaned up
    to ``upto_offset`` at wall clock ``now_ms``: the ``read_committed`` records of the whole log,
    cleaned part and the untouched rest. See :class:`CompactionOracle` for the arguments.

    Raises:
        ValueError: bad records or config, or ``upto_offset`` beyond the log end offset.
    """
    with CompactionOracle(config) as oracle:
        oracle.append(records, compression=compression, batch_records=batch_records, timestamp_ms=now_ms)
        oracle.clean(upto_offset, now_ms=now_ms)
        return oracle.records()


# ---------------------------------------------------------------------------------------------- broker

def read_topic_records(bootstrap_servers: str, topic: str, partitions: int | Iterable[int], *,
                       isolation_level: str = "read_committed", end_offsets: Mapping[int, int] | None = None,
                       timeout_s: float = 60.0) -> dict[int, list[tuple[Record, int]]]:
    """Read ``partitions`` (a count or the partition numbers) from offset 0 to their end, or to
    ``end_offsets[p]`` (exclusive), with a consumer in no group (``isolation_level`` as given).

    Returns partition -> ``[(Record, confluent-kafka timestamp type)]`` in offset order.

    Raises:
        AssertionError: a fetch error, or a partition not read to its end within ``timeout_s`` seconds.
    """
    from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

    wanted = list(range(partitions)) if isinstance(partitions, int) else list(partitions)
    end_offsets = dict(end_offsets or {})
    consumer = Consumer({"bootstrap.servers": bootstrap_servers, "group.id": f"{topic}-reference-reader",
                         "enable.auto.commit": False, "enable.partition.eof": True,
                         "isolation.level": isolation_level, "auto.offset.reset": "earliest"})
    # From the log start offset (OFFSET_BEGINNING): retention or DeleteRecords may have moved it past 0.
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in wanted])
    out: dict[int, list[tuple[Record, int]]] = {p: [] for p in wanted}
    done: set[int] = set()
    deadline = time.monotonic() + timeout_s
    try:
        while len(done) < len(wanted) and time.monotonic() < deadline:
            for msg in cast("list[ConsumedMessage]", consumer.consume(1000, timeout=0.5)):
                partition = msg.partition()
                error = msg.error()
                if error is not None:
                    assert error.code() == KafkaError._PARTITION_EOF, error
                    done.add(partition)
                    continue
                if partition in done or msg.offset() >= end_offsets.get(partition, msg.offset() + 1):
                    done.add(partition)
                    continue
                ts_type, ts = msg.timestamp()
                out[partition].append((Record(msg.offset(), ts, msg.key(), msg.value(),
                                              tuple(msg.headers() or ())), ts_type))
    finally:
        consumer.close()
    assert len(done) == len(wanted), f"the consumer did not read {topic} {sorted(set(wanted) - done)} to the end"
    return out


def active_segment_base(partition_dir: Path) -> int:
    """Base offset of the newest ``.log`` segment of a partition folder.

    Raises:
        FileNotFoundError: the folder does not exist or holds no ``.log`` file.
    """
    bases = [offset_from_file_name(p.name) for p in Path(partition_dir).iterdir() if p.name.endswith(LOG_FILE_SUFFIX)]
    if not bases:
        raise FileNotFoundError(f"no {LOG_FILE_SUFFIX} segment in {partition_dir}")
    return max(bases)


class BrokerLogDirs(Protocol):
    """What :class:`BrokerCompaction` needs from a broker (the plugin's ``KafkaBrokerHandle`` has it)."""

    bootstrap_servers: str

    def cleaner_checkpoints(self) -> dict[tuple[str, int], int]: ...

    def active_segment_base(self, topic: str, partition: int) -> int: ...


class BrokerFilesOnDisk:
    """A broker whose ``log.dirs`` folder is readable on this machine (a local broker, or an external
    one with a known ``log.dirs``), for :class:`BrokerCompaction`.

    Args:
        bootstrap_servers: ``host:port[,...]`` of the broker.
        log_dirs: its (single) ``log.dirs`` folder.
    """

    def __init__(self, bootstrap_servers: str, log_dirs: Path) -> None:
        self.bootstrap_servers = bootstrap_servers
        self.log_dirs = Path(log_dirs)

    def cleaner_checkpoints(self) -> dict[tuple[str, int], int]:
        """``cleaner-offset-checkpoint`` of ``log_dirs`` (empty while absent or caught mid-rename)."""
        path = self.log_dirs / CLEANER_OFFSET_CHECKPOINT
        if not path.exists():
            return {}
        try:
            return read_offset_checkpoint(path)
        except Exception:  # noqa: BLE001 - caught mid-rename; the caller polls again
            return {}

    def active_segment_base(self, topic: str, partition: int) -> int:
        """Base offset of the newest segment of ``<log_dirs>/<topic>-<partition>``.

        Raises:
            FileNotFoundError: no such folder or no segment in it.
        """
        return active_segment_base(self.log_dirs / f"{topic}-{partition}")


@dataclass
class ComparedPartition:
    """One partition checked by :meth:`BrokerCompaction.assert_compacted_like_broker`.

    Attributes:
        partition: the partition.
        upto_offset: the broker's cleaner checkpoint the local copy was cleaned to (exclusive end).
        records: the records below ``upto_offset`` (equal on both sides).
        local_rounds: dirty sections ``(first dirty, end)`` of the local cleaning rounds.
    """

    partition: int
    upto_offset: int
    records: list[Record]
    local_rounds: list[tuple[int, int]] = field(default_factory=list)


class BrokerCompaction:
    """The broker's cleaner, observed and compared with the local cleaner.

    Args:
        broker: a broker handle with ``bootstrap_servers``, ``cleaner_checkpoints()`` and
            ``active_segment_base(topic, partition)`` (log dir on this machine or in a container).
        data_dirs: topic -> materializer data directory of its local copy (the plugin's
            materialized-view fixture registers the ones it creates here).
        writers: topic -> callable closing the writer that holds that data directory's store lock
            (a running Materializer); called before the local copy is compacted.
    """

    def __init__(self, broker: BrokerLogDirs, data_dirs: dict[str, Path] | None = None,
                 writers: dict[str, Callable[[], None]] | None = None) -> None:
        self.broker = broker
        self.data_dirs: dict[str, Path] = data_dirs if data_dirs is not None else {}
        self.writers: dict[str, Callable[[], None]] = writers if writers is not None else {}

    def _partitions(self, topic: str, partitions: Iterable[int] | None) -> list[int]:
        if partitions is not None:
            return sorted(partitions)
        from confluent_kafka.admin import AdminClient
        metadata = AdminClient({"bootstrap.servers": self.broker.bootstrap_servers}).list_topics(topic, timeout=10)
        info = metadata.topics.get(topic)
        if info is None or info.error is not None or not info.partitions:
            raise ValueError(f"topic {topic!r} has no partitions on {self.broker.bootstrap_servers}")
        return sorted(info.partitions)

    def wait_for_broker_compaction(self, topic: str, timeout_s: float = 60.0, *,
                                   partitions: Iterable[int] | None = None,
                                   until: str = "active_segment", stable_s: float = 1.0) -> dict[int, int]:
        """Wait for the broker's cleaner on ``topic``; returns partition -> cleaner checkpoint offset.

        ``until="active_segment"``: every partition's ``cleaner-offset-checkpoint`` entry reached
        its active segment's base offset (Kafka's cleaner never cleans the active segment, so the
        checkpoint cannot move until a segment rolls). ``until="stable"``: every partition has an
        entry and none moved for ``stable_s`` seconds (use it when ``min.compaction.lag.ms`` or an
        open transaction hold the cleaner below the active segment). Kafka:
        ``LogCleanerManager.updateCheckpoints`` writes the file after each round.

        Raises:
            TimeoutError: after ``timeout_s`` seconds, naming each partition still behind with
                its checkpoint and active segment base offset.
            ValueError: ``until`` is neither value, or the topic does not exist.
        """
        if until not in ("active_segment", "stable"):
            raise ValueError(f"until={until!r}: expected 'active_segment' or 'stable'")
        wanted = self._partitions(topic, partitions)
        deadline = time.monotonic() + timeout_s
        last: dict[int, int | None] = {}
        since = time.monotonic()
        while True:
            checkpoints = self.broker.cleaner_checkpoints()
            now = {p: checkpoints.get((topic, p)) for p in wanted}
            if until == "active_segment":
                targets = {p: self.broker.active_segment_base(topic, p) for p in wanted}
                reached = {p: -1 if c is None else c for p, c in now.items()}
                behind = {p: (now[p], t) for p, t in targets.items() if reached[p] < t}
                if not behind:
                    return reached  # every checkpoint is at or past its active segment's base
                what = f"partition -> (checkpoint, active segment base) {behind}"
            else:
                if now != last:
                    last, since = now, time.monotonic()
                elif time.monotonic() - since >= stable_s:
                    stable = {p: v for p, v in now.items() if v is not None}
                    if len(stable) == len(now):
                        return stable
                what = f"partition -> checkpoint {now} (not yet stable for {stable_s} s)"
            if time.monotonic() > deadline:
                raise TimeoutError(f"the broker's cleaner did not finish {topic} within {timeout_s:.0f} s: {what}")
            time.sleep(0.1)

    def assert_compacted_like_broker(self, topic: str, data_dir: Path | None = None, *,
                                     partitions: Iterable[int] | None = None, timeout_s: float = 60.0,
                                     until: str = "active_segment",
                                     dedupe_buffer_size_bytes: int = DEFAULT_DEDUPE_BUFFER_SIZE_BYTES,
                                     on_compacted: Callable[[int, Any], None] | None = None,
                                     ) -> dict[int, ComparedPartition]:
        """Wait for the broker's cleaner, clean the local copy to the same offsets, compare records.

        Steps per partition: :meth:`wait_for_broker_compaction` gives checkpoint ``N``;
        ``materializer compact --partition P --upto-offset N`` (:func:`materializer.offline.compact.compact_topic`)
        cleans the local log of ``data_dir`` (the local cleaner's own checkpoint gives its first
        dirty offset, so calling this again after more data checks the next pass); then the local
        records below ``N`` (read_committed: no control records, no aborted data) must equal what a
        ``read_committed`` consumer reads from the broker below ``N``: offset, timestamp, key,
        value, headers.

        Args:
            data_dir: the local copy's data directory; None = the one registered for ``topic`` in
                :attr:`data_dirs` (the ``kafka_materializer_view`` fixture registers its own, and
                its materializer is closed first: it holds the store lock).
            on_compacted: called with ``(partition, PartitionCompaction)`` after each local clean.

        Returns:
            partition -> :class:`ComparedPartition`.

        Raises:
            AssertionError: records differ (the message is :func:`diff_records` output).
            TimeoutError: the broker's cleaner did not get there within ``timeout_s`` seconds.
            ValueError: no data dir known for ``topic``.
            CompactionError: the local copy cannot be compacted (no such partition, not compacted...).
        """
        from materializer.offline.compact import compact_topic

        if data_dir is None:
            if topic not in self.data_dirs:
                raise ValueError(f"no local copy known for topic {topic!r}: pass data_dir, or materialize it with the "
                                 "kafka_materializer_view fixture first")
            data_dir = self.data_dirs[topic]
        if topic in self.writers and Path(data_dir) == Path(self.data_dirs.get(topic, "")):
            self.writers.pop(topic)()  # the compaction needs the store lock the writer holds
        checkpoints = self.wait_for_broker_compaction(topic, timeout_s, partitions=partitions, until=until)
        broker_rows = read_topic_records(self.broker.bootstrap_servers, topic, list(checkpoints),
                                         end_offsets=checkpoints)
        compared: dict[int, ComparedPartition] = {}
        for partition, upto in checkpoints.items():
            (result,) = compact_topic(data_dir, topic, partition=partition, upto_offset=upto,
                                      dedupe_buffer_size_bytes=dedupe_buffer_size_bytes)
            if on_compacted is not None:
                on_compacted(partition, result)
            theirs = [record for record, _ in broker_rows[partition]]
            ours = _local_committed_records(Path(data_dir), topic, partition, upto)
            problem = diff_records(theirs, ours)
            assert problem is None, (f"{topic}-{partition} cleaned up to offset {upto} differs from the broker's "
                                     f"compaction:\n{problem}")
            compared[partition] = ComparedPartition(partition, upto, theirs,
                                                    [(r.first_dirty_offset, r.end_offset) for r in result.rounds])
        return compared


def _local_committed_records(data_dir: Path, topic: str, partition: int, end_offset: int) -> list[Record]:
    from materializer.datadir.layout import partition_dir, topic_config_path

    config = LogConfig.load(topic_config_path(data_dir, topic))
    log = Log.open(partition_dir(data_dir, topic, partition), config, had_clean_shutdown=True)
    try:
        return _committed_below(log, end_offset)
    finally:
        log.close()


def _committed_below(log: Log, end_offset: int | None) -> list[Record]:
    """``read_committed`` records of ``log`` (below its last stable offset) with offset < ``end_offset``."""
    from materializer.storage.read_committed import read_committed

    out: list[Record] = []
    for record in read_committed(log):
        if end_offset is not None and record.offset >= end_offset:
            break
        out.append(record)
    return out
