"""Shared helpers for comparing our cleaner with a real broker's LogCleaner (tests and benchmark).

Workloads are produced with confluent-kafka, mirrored into a local data directory with the
:class:`~materializer.materializer.Materializer` (broker offsets, ``read_committed``), and the
broker's own cleaning is observed through its ``cleaner-offset-checkpoint`` (Kafka format) and
its ``log-cleaner.log`` ("Log cleaner thread N cleaned log T-P (dirty section = [a, b])").

Nothing here is a test; ``tests/integration/test_compaction_vs_broker.py`` and
``benchmarks/bench_cleaner.py`` import it.
"""

from __future__ import annotations

import random
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping, Sequence

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType

from materializer.testing.compaction_oracle import (
    BrokerCompaction,
    BrokerFilesOnDisk,
    active_segment_base,
    read_topic_records,
)
from materializer.config import MaterializerOptions
from materializer.materializer import Materializer
from materializer.storage.record_batch import Record

__all__ = [
    "CODECS",
    "HOLD_CLEANING_MS",
    "Workload",
    "active_segment_base",
    "alter_topic_configs",
    "broker_cleaned_sections",
    "broker_log_text",
    "consume_records",
    "ingest",
    "produce",
    "produce_transactions",
    "wait_for_broker_cleaning",
]

CODECS: tuple[str, ...] = ("none", "gzip", "snappy", "lz4", "zstd")

#: ``min.compaction.lag.ms`` that keeps the broker's cleaner away while we mirror the topic (1 day).
HOLD_CLEANING_MS = 86_400_000

_SECTION = re.compile(r"Log cleaner thread \d+ cleaned log (\S+) \(dirty section = \[(\d+), (\d+)\]\)")


@dataclass(frozen=True)
class Workload:
    """A keyed update stream for one topic.

    Attributes:
        records_per_partition: records produced to each partition.
        keys: distinct keys per partition (``key-<p>-<n>``).
        value_bytes: value length, bytes (pseudo-random printable text).
        tombstone_ratio: fraction of records that are tombstones (null value).
        header_ratio: fraction of records with headers (1-3 headers, one with a null value).
        batch_records: records per producer batch (``batch.num.messages``).
        seed: random seed; the same seed gives the same stream.
    """

    records_per_partition: int = 1000
    keys: int = 100
    value_bytes: int = 60
    tombstone_ratio: float = 0.1
    header_ratio: float = 0.3
    batch_records: int = 20
    seed: int = 1

    def stream(self, partition: int) -> Iterable[tuple[bytes, bytes | None, list[tuple[str, bytes | None]] | None]]:
        """``(key, value, headers)`` for one partition, deterministic."""
        rng = random.Random(self.seed * 1000 + partition)
        alphabet = b"abcdefghijklmnopqrstuvwxyz0123456789"
        for n in range(self.records_per_partition):
            key = b"key-%d-%d" % (partition, rng.randrange(self.keys))
            if rng.random() < self.tombstone_ratio:
                value = None
            else:
                value = b"%d:" % n + bytes(rng.choice(alphabet) for _ in range(self.value_bytes))
            headers = None
            if rng.random() < self.header_ratio:
                headers = [("seq", b"%d" % n)]
                if n % 2:
                    headers.append(("trace", bytes(rng.choice(alphabet) for _ in range(8))))
                if n % 3 == 0:
                    headers.append(("empty", None))
            yield key, value, headers


def _check_delivery(errors: list[str]):
    def callback(err, _msg) -> None:
        if err is not None:
            errors.append(str(err))
    return callback


def produce(bootstrap_servers: str, topic: str, partitions: Sequence[int], workload: Workload, *,
            codec: str = "none", extra_config: Mapping[str, object] | None = None) -> int:
    """Produce ``workload`` to each partition with ``codec``; returns the records sent.

    Raises:
        RuntimeError: a delivery failed.
    """
    producer = Producer({
        "bootstrap.servers": bootstrap_servers, "compression.type": codec, "linger.ms": 5,
        "batch.num.messages": workload.batch_records, "enable.idempotence": True, **(extra_config or {}),
    })
    errors: list[str] = []
    sent = 0
    streams = {p: iter(workload.stream(p)) for p in partitions}
    while streams:
        for p in list(streams):
            item = next(streams[p], None)
            if item is None:
                del streams[p]
                continue
            key, value, headers = item
            producer.produce(topic, key=key, value=value, headers=headers, partition=p,
                             on_delivery=_check_delivery(errors))
            sent += 1
            if sent % 500 == 0:
                producer.poll(0)
    if producer.flush(30):
        raise RuntimeError("producer could not deliver everything within 30 s")
    if errors:
        raise RuntimeError(f"{len(errors)} deliveries failed, first: {errors[0]}")
    return sent


def produce_transactions(bootstrap_servers: str, topic: str, partitions: Sequence[int], *, transactions: int,
                         records_per_transaction: int, keys: int, abort_every: int = 3, seed: int = 7,
                         codec: str = "none") -> dict[str, int]:
    """Transactions over ``partitions``, every ``abort_every``-th aborted, interleaved with
    non-transactional records; ends with non-transactional records so that the last offset of
    each partition is a committed data record. Returns counts by kind.
    """
    rng = random.Random(seed)
    txn = Producer({"bootstrap.servers": bootstrap_servers, "transactional.id": f"{topic}-txn",
                    "compression.type": codec, "linger.ms": 2})
    plain = Producer({"bootstrap.servers": bootstrap_servers, "compression.type": codec, "linger.ms": 2,
                      "enable.idempotence": True})
    txn.init_transactions(30)
    counts = {"committed": 0, "aborted": 0, "plain": 0}
    for t in range(transactions):
        txn.begin_transaction()
        for n in range(records_per_transaction):
            p = partitions[n % len(partitions)]
            value = None if rng.random() < 0.1 else b"txn-%d-%d" % (t, n)
            txn.produce(topic, key=b"key-%d" % rng.randrange(keys), value=value, partition=p,
                        headers=[("txn", b"%d" % t)])
        txn.flush(30)  # the aborted records must reach the log before the marker
        if t % abort_every == abort_every - 1:
            txn.abort_transaction(30)
            counts["aborted"] += records_per_transaction
        else:
            txn.commit_transaction(30)
            counts["committed"] += records_per_transaction
        for p in partitions:
            for _ in range(3):
                plain.produce(topic, key=b"key-%d" % rng.randrange(keys), value=b"plain-%d" % t, partition=p)
                counts["plain"] += 1
        plain.flush(30)
    for p in partitions:
        plain.produce(topic, key=b"last", value=b"end", partition=p)
        counts["plain"] += 1
    if plain.flush(30):
        raise RuntimeError("plain producer could not deliver")
    return counts


def alter_topic_configs(admin: AdminClient, topic: str, configs: Mapping[str, str], *, settle_s: float = 0.3) -> None:
    """``IncrementalAlterConfigs`` SET of ``configs``; waits ``settle_s`` for the broker to apply them."""
    entries = [ConfigEntry(name, str(value), incremental_operation=AlterConfigOpType.SET)
               for name, value in configs.items()]
    resource = ConfigResource(ResourceType.TOPIC, topic, incremental_configs=entries)
    for future in admin.incremental_alter_configs([resource]).values():
        future.result(30)
    time.sleep(settle_s)


def ingest(bootstrap_servers: str, topic: str, data_dir: Path, *, compression: str | None = None,
           max_batch_bytes: int = 4096, isolation_level: str = "read_committed", fetch: str | None = None) -> None:
    """Mirror ``topic`` into ``data_dir`` with the Materializer until caught up (resumes where it stopped).
    ``fetch`` as :class:`MaterializerOptions` (None: the consumer path when ``compression`` is given)."""
    options = MaterializerOptions(compression=compression, max_batch_bytes=max_batch_bytes, fetch=fetch,
                                  isolation_level=isolation_level, progress=False, poll_timeout_ms=200)
    with Materializer(bootstrap_servers, topic, data_dir, options=options) as materializer:
        materializer.run(until_caught_up=True)


def consume_records(bootstrap_servers: str, topic: str, partition: int, end_offset: int, *,
                    isolation_level: str = "read_committed") -> list[Record]:
    """Every record of ``topic``-``partition`` with offset < ``end_offset``, read from the beginning."""
    rows = read_topic_records(bootstrap_servers, topic, [partition], isolation_level=isolation_level,
                              end_offsets={partition: end_offset})
    return [record for record, _ in rows[partition]]


def wait_for_broker_cleaning(log_dirs: Path, topic: str, partitions: Sequence[int], *,
                             timeout_s: float = 60.0) -> dict[int, int]:
    """Wait until the broker's checkpoint of every partition equals its active segment's base offset
    (:meth:`BrokerCompaction.wait_for_broker_compaction` on a log dir read in place).

    Returns ``partition -> checkpoint``.

    Raises:
        TimeoutError: naming the partitions still behind and their checkpoints.
    """
    broker = BrokerCompaction(BrokerFilesOnDisk("", log_dirs))
    return broker.wait_for_broker_compaction(topic, timeout_s, partitions=partitions)


def broker_log_text(cleaner_log: Path | None) -> str:
    """Text of the broker's ``log-cleaner.log`` plus its sibling ``server.log``.

    Kafka 4.3 logs the per-round statistics through the logger
    ``org.apache.kafka.storage.internals.log.LogCleaner$CleanerThread``, which a log4j2 config
    naming only ``...LogCleaner`` does not route to ``log-cleaner.log`` (``$`` is no hierarchy
    separator), so they can land in ``server.log``.
    """
    if cleaner_log is None:
        return ""
    texts = []
    for path in (Path(cleaner_log), Path(cleaner_log).parent / "server.log"):
        if path.exists():
            texts.append(path.read_text(encoding="utf-8", errors="replace"))
    return "\n".join(texts)


def broker_cleaned_sections(cleaner_log: Path | None, topic: str, partition: int) -> list[tuple[int, int]]:
    """``(first dirty, end)`` of every round the broker logged for ``topic``-``partition``, sorted."""
    name = f"{topic}-{partition}"
    return sorted((int(a), int(b)) for log_name, a, b in _SECTION.findall(broker_log_text(cleaner_log))
                  if log_name == name)
