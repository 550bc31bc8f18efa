"""Options of a :class:`~materializer.materializer.Materializer` (:class:`MaterializerOptions`) and
their defaults. Where they take effect on disk, the data directory, is :mod:`materializer.datadir`'s
(its layout: :mod:`materializer.datadir.layout`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, Mapping, get_args

from materializer.adapters.rocksdb_store import StateStoreOptions
from materializer.adapters.serdes import SERDE_FORMATS
from materializer.storage.cleaner_config import CleanerConfig
from materializer.storage.log_config import LogConfig

if TYPE_CHECKING:  # pragma: no cover - the Kafka client loads with the source, not with the options (issue 42)
    from materializer.adapters.kafka_source import KafkaSourceOptions

__all__ = [
    "DEFAULT_CLEANER_BACKOFF_MS",
    "DEFAULT_COMMIT_INTERVAL_MS",
    "DEFAULT_DEDUPE_BUFFER_SIZE_BYTES",
    "DEFAULT_GROUP_JOIN_TIMEOUT_MS",
    "DEFAULT_GROUP_SESSION_TIMEOUT_MS",
    "DEFAULT_LEASE_INTERVAL_MS",
    "DEFAULT_LIVENESS_TIMEOUT_MS",
    "DEFAULT_MAX_BATCH_BYTES",
    "DEFAULT_METADATA_REFRESH_INTERVAL_MS",
    "DEFAULT_RETENTION_CHECK_INTERVAL_MS",
    "FetchPath",
    "IsolationLevel",
    "MaterializerOptions",
    "OnBadRecord",
    "OnTopicRecreated",
    "GroupProtocol",
    "Partitioner",
    "parse_config_overrides",
]

FetchPath = Literal["replica", "consumer"]
IsolationLevel = Literal["read_committed", "read_uncommitted"]
OnBadRecord = Literal["fail", "skip"]
OnTopicRecreated = Literal["rebuild", "fail"]
GroupProtocol = Literal["auto", "consumer", "classic"]
Partitioner = Literal["auto", "murmur2", "murmur2_random", "consistent", "consistent_random", "fnv1a", "fnv1a_random"]
# ^ the option values of MaterializerOptions.fetch, isolation_level, on_bad_record, on_topic_recreated,
# group_protocol and partitioner (besides "auto": the partitioners materializer.group.routing hashes)

#: Largest local batch the materializer builds, bytes (Kafka's default ``batch.size`` is 16 KiB;
#: we match the broker's fetch granularity instead so compressed batches stay efficient).
DEFAULT_MAX_BATCH_BYTES = 1024 * 1024

#: Kafka ``log.cleaner.backoff.ms``: a cleaner thread's sleep when no log needs cleaning, ms.
DEFAULT_CLEANER_BACKOFF_MS = 15_000

#: Kafka ``log.cleaner.dedupe.buffer.size``: offset map memory shared by all cleaner threads, bytes.
DEFAULT_DEDUPE_BUFFER_SIZE_BYTES = 128 * 1024 * 1024

#: Kafka ``log.retention.check.interval.ms``: how often segment retention runs, ms.
DEFAULT_RETENTION_CHECK_INTERVAL_MS = 300_000
DEFAULT_METADATA_REFRESH_INTERVAL_MS = 300_000

#: The shortest default liveness timeout, ms: a run loop with no progress for this long counts as
#: wedged (:mod:`materializer.health`); the default is the larger of it and 4 request timeouts.
DEFAULT_LIVENESS_TIMEOUT_MS = 120_000

#: How often the applied offsets are committed to ``commit_group`` at most, ms (a Kafka consumer's
#: ``auto.commit.interval.ms`` is 5,000; lag exporters scrape every 15-60 s).
DEFAULT_COMMIT_INTERVAL_MS = 1_000
#: Kafka's consumer ``session.timeout.ms`` default (classic group protocol), ms.
DEFAULT_GROUP_SESSION_TIMEOUT_MS = 45_000
#: How long a group member's start waits for its first assignment, ms.
DEFAULT_GROUP_JOIN_TIMEOUT_MS = 60_000
#: How long a group member keeps a partition the group moved elsewhere, ms: Kafka Streams'
#: ``state.cleanup.delay.ms`` default.
DEFAULT_REVOKED_RETENTION_MS = 600_000
#: How often ``run`` renews its store's lease at most, ms (``run --lease-interval-ms``).
DEFAULT_LEASE_INTERVAL_MS = 2_000


@dataclass(frozen=True)
class MaterializerOptions:
    """How a :class:`~materializer.materializer.Materializer` fetches, writes and materializes.

    Attributes:
        fetch: how records reach the local log. ``replica`` fetches the leader's record batches
            verbatim with the Kafka Fetch API (:mod:`materializer.adapters.replica_fetch`), so the
            local ``.log`` files hold the broker's bytes (producer ids, sequences, transaction
            markers, aborted data with its ``.txnindex``) and the store is applied from them
            ``read_committed``; it needs only the topic's READ permission, as a consumer. ``consumer``
            reads records with confluent-kafka (librdkafka) and builds local batches from them; use
            it where the cluster needs a client setting kafka-python lacks (the replica path names
            it and refuses), with ``isolation_level="read_uncommitted"`` or to re-encode the local
            batches (``compression``). None (default): ``replica``, or ``consumer`` when
            ``isolation_level="read_uncommitted"`` or ``compression`` asks for what only it does.
        compression: Kafka ``compression.type`` of the local batches ("none", "gzip", "snappy",
            "lz4", "zstd"); None = the topic's ``compression.type`` ("producer" -> none). Consumer
            path only: the replica path keeps the broker's batches as they are.
        batch_size: records asked from the client per fetch (``consume(num_messages=...)``), 10,000
            (consumer path; the replica path asks for ``fetch.max.bytes`` / ``max.partition.fetch.bytes``
            of ``client_config``, 50 MiB / 8 MiB).
        max_batch_bytes: cap of one local record batch, bytes (1 MiB, uncompressed estimate); the
            topic's ``max.message.bytes`` and ``segment.bytes`` cap it too (consumer path).
        poll_timeout_ms: longest wait for records in one fetch, ms (500).
        config_overrides: topic configs (Kafka names, e.g. ``{"segment.bytes": "1048576"}``)
            that win over what the broker reports.
        isolation_level: "read_committed" (default) or "read_uncommitted".
        request_timeout_ms: metadata / watermark / describe-configs timeout, ms (30 s).
        broker_timeout_ms: how long the cluster may go unanswered while running before it counts
            as away, ms (30 s): a bounded run (``until_caught_up``) then fails; a continuous run
            reports ``broker_reachable`` false (readiness 503) and retries with backoff. A cluster
            none of whose bootstrap servers accepts a connection counts as away at once.
        client_config: extra librdkafka consumer settings (security...).
        store: RocksDB options of the state store.
        progress: show a tqdm progress bar; None = only when stderr is a terminal.
        cleaner_threads: Kafka ``log.cleaner.threads``: background cleaner threads while
            running on a topic whose ``cleanup.policy`` contains ``compact`` (1); 0 disables
            the cleaner (Kafka ``log.cleaner.enable=false``).
        cleaner_backoff_ms: Kafka ``log.cleaner.backoff.ms``: a cleaner thread's sleep when no
            log is eligible, ms (15,000).
        dedupe_buffer_size_bytes: Kafka ``log.cleaner.dedupe.buffer.size``: offset map memory
            for all cleaner threads together, bytes (134,217,728 = 128 MiB).
        retention_check_interval_ms: Kafka ``log.retention.check.interval.ms``: how often the
            run loop applies ``retention.ms`` / ``retention.bytes`` to the logs of a topic whose
            ``cleanup.policy`` contains ``delete``, ms (300,000). With the cleaner running on a
            ``compact,delete`` topic the cleaner threads apply retention instead, after each
            cleaning attempt, as Kafka's do.
        metadata_refresh_interval_ms: how often a running ``run`` asks the cluster for the topic's
            partitions and starts ingesting partitions added since, ms (300,000 = librdkafka's
            ``topic.metadata.refresh.interval.ms``), at most 5,000 ms: added partitions are taken
            on (readiness waits for them) within seconds. In group mode the count is also read
            again at every rebalance: readers route keys by it.
        key_format / value_format: ``bytes`` (default: no check), ``str``, ``json`` or ``avro``: what
            keys/values must decode as. Other than ``bytes``, ``run`` decodes every record before
            applying it (the store still keeps the exact bytes; :meth:`Materializer.view` reads
            them typed).
        schema_registry_url: Schema Registry base URL for ``avro`` (Confluent's, or Apicurio's
            ``.../apis/ccompat/v7``).
        schema_registry_config: more registry client settings (``basic.auth.user.info``, ``ssl.*``).
        on_bad_record: a record that does not decode: ``fail`` (default) stops ``run`` with an
            error naming partition and offset before anything of its fetch is written; ``skip``
            keeps it in the local log (the log mirrors the topic), leaves the store's value of its
            key unchanged, logs it and counts it in ``stats.records_skipped``.
        on_topic_recreated: the cluster's topic has another id than the local copy's (deleted and
            re-created under the same name, KIP-516): ``rebuild`` (default) drops the local logs and
            the store and materializes the new topic, with one warning naming both ids, also while
            running; ``fail`` stops with :class:`~materializer.adapters.errors.TopicIdChangedError`.
        liveness_timeout_ms: how long the run loop may make no progress (no iteration, start
            attempt or replay step) before :attr:`MaterializerHealth.live` turns false, ms. None
            (default): the larger of 120,000 and 4 x ``request_timeout_ms`` (a start makes a few
            requests one after another, each up to the request timeout, while the broker hangs).
        commit_group: a Kafka consumer group to commit the applied offsets to (the store's next
            offset to apply per partition, after the store write), so ``kafka-consumer-groups.sh
            --describe`` and lag exporters show the materializer's lag; None (default): no commits.
            The offsets are never read back (the store's offsets stay the truth); the group must
            have no members (a "simple" group, OffsetCommit with generation -1):
            :mod:`materializer.group.commit`.
        commit_interval_ms: how often the applied offsets are committed at most, ms (1,000);
            unchanged offsets are committed again once a minute (``offsets.retention.minutes``
            expires the offsets of a group nobody commits to).
        group_id: join this Kafka consumer group as a member and materialize only the partitions
            the group coordinator assigns (several materializers then split the topic, as Kafka
            Streams instances split a KTable); None (default): every partition. Records are still
            fetched by the chosen fetch path; the group only decides who holds what, and nothing
            is committed to it (:mod:`materializer.adapters.group_membership`). Must differ from
            ``commit_group`` (a group with members refuses member-less commits).
        group_protocol: ``auto`` (default: KIP-848's ``consumer`` protocol when the broker speaks it,
            Kafka 4.0+, else ``classic``), ``consumer`` or ``classic`` (cooperative-sticky, KIP-429).
        group_session_timeout_ms: classic protocol only: ``session.timeout.ms``, ms (45,000); a
            KIP-848 group's session timeout is the group's ``consumer.session.timeout.ms`` config.
            Readers of a continuous member's data dir refuse its partitions once its lease is older
            than the session timeout: this one, or the KIP-848 group's, which the member reads when
            it starts (:mod:`materializer.datadir.lease`).
        group_join_timeout_ms: how long :meth:`Materializer.start` waits for the first assignment,
            ms (60,000); when it passes with the member in the group but nothing assigned (more
            members than partitions), the member starts with no partition and is ready.
        group_instance_id: group mode: ``group.instance.id`` (KIP-345 static membership): a member
            that stops and starts again with the same id within the session timeout gets its
            partitions back without a rebalance, so a rolling restart moves nothing (meanwhile
            nobody fetches them: readers of its data dir serve them as of the stop). Each member
            needs its own id. None (default): dynamic membership; a stop hands the partitions over
            at once.
        serving_url: group mode: the URL (``http(s)://host:port``) of this member's query server
            (``run --serve``), carried to the other members in its ``client.id``
            (:func:`materializer.adapters.partition_owner.serving_client_id`) so any member can
            forward a key to its owner (issue 39). None (default): it serves no queries.
        revoked_retention_ms: group mode: how long the local log and store entries of a partition
            the group moved to another member are kept after it left, so that when it comes back
            only the delta is fetched, ms (600,000: Kafka Streams' ``state.cleanup.delay.ms``); -1
            keeps them until the disk bound below, 0 drops them at once. Measured from the
            partition folder's modification time, set when the partition is closed
            (:mod:`materializer.group.kept`).
        revoked_retention_bytes: group mode: the most bytes the kept partition folders may hold
            together; beyond it the partitions released longest ago are dropped first; -1
            (default): no bound.
        partitioner: group mode: the partitioner the topic's producers use, by which reads route a
            key to its partition (:func:`materializer.group.routing.partition_for_key`). ``"auto"``
            (default): found from the data (:mod:`materializer.group.partitioner`: samples of
            the keys each partition held here holds tell murmur2, CRC32 and FNV-1a apart); while
            they cannot tell yet, a read that the candidates route to different partitions looks
            in each, and is refused rather than answered "absent" when one of them is another
            member's. Or a name: ``murmur2`` (Java's producer, Kafka Streams), ``murmur2_random``,
            librdkafka's ``consistent_random`` (confluent-kafka's default), ``consistent``,
            ``fnv1a``, ``fnv1a_random``: readers route by it alone, and a run whose sampled keys
            it does not place where they are fails
            (:class:`~materializer.group.partitioner.PartitionerMismatchError`).
        lease_interval_ms: how often ``run`` renews the store's lease at most, ms (2,000): the file
            ``DIR/topic-lease/<topic>.json`` that tells readers how current the store is, renewed
            only while the run is current (:mod:`materializer.datadir.lease`). In group mode readers refuse
            a member's partitions once its lease is older than the group's session timeout, so a
            longer interval than a third of it is cut to that.
    """

    fetch: FetchPath | None = None
    compression: str | None = None
    batch_size: int = 10_000
    max_batch_bytes: int = DEFAULT_MAX_BATCH_BYTES
    poll_timeout_ms: int = 500
    config_overrides: Mapping[str, str] = field(default_factory=dict)
    isolation_level: IsolationLevel = "read_committed"
    request_timeout_ms: int = 30_000
    broker_timeout_ms: int = 30_000
    client_config: Mapping[str, str] = field(default_factory=dict)
    store: StateStoreOptions = field(default_factory=StateStoreOptions)
    progress: bool | None = None
    cleaner_threads: int = 1
    cleaner_backoff_ms: int = DEFAULT_CLEANER_BACKOFF_MS
    dedupe_buffer_size_bytes: int = DEFAULT_DEDUPE_BUFFER_SIZE_BYTES
    retention_check_interval_ms: int = DEFAULT_RETENTION_CHECK_INTERVAL_MS
    metadata_refresh_interval_ms: int = DEFAULT_METADATA_REFRESH_INTERVAL_MS
    key_format: str = "bytes"
    value_format: str = "bytes"
    schema_registry_url: str | None = None
    schema_registry_config: Mapping[str, str] = field(default_factory=dict)
    on_bad_record: OnBadRecord = "fail"
    on_topic_recreated: OnTopicRecreated = "rebuild"
    liveness_timeout_ms: int | None = None
    commit_group: str | None = None
    commit_interval_ms: int = DEFAULT_COMMIT_INTERVAL_MS
    group_id: str | None = None
    group_protocol: GroupProtocol = "auto"
    group_session_timeout_ms: int = DEFAULT_GROUP_SESSION_TIMEOUT_MS
    group_join_timeout_ms: int = DEFAULT_GROUP_JOIN_TIMEOUT_MS
    group_instance_id: str | None = None
    revoked_retention_ms: int = DEFAULT_REVOKED_RETENTION_MS
    revoked_retention_bytes: int = -1
    partitioner: Partitioner = "auto"
    lease_interval_ms: int = DEFAULT_LEASE_INTERVAL_MS
    serving_url: str | None = None

    def __post_init__(self) -> None:
        for name in ("key_format", "value_format"):
            if getattr(self, name) not in SERDE_FORMATS:
                raise ValueError(f"{name} must be one of {', '.join(SERDE_FORMATS)}, got {getattr(self, name)!r}")
        if self.fetch is None:
            consumer_only = self.isolation_level == "read_uncommitted" or self.compression is not None
            object.__setattr__(self, "fetch", "consumer" if consumer_only else "replica")
        if self.fetch not in ("replica", "consumer"):
            raise ValueError(f"fetch must be 'replica' or 'consumer', got {self.fetch!r}")
        if self.fetch == "replica" and self.isolation_level != "read_committed":
            raise ValueError("isolation_level='read_uncommitted' needs fetch='consumer': the replica path "
                             "materializes read_committed (the local log keeps aborted data either way)")
        if self.fetch == "replica" and self.compression is not None:
            raise ValueError("compression re-encodes the local batches, which needs fetch='consumer': the replica "
                             "path keeps the broker's batches (and their codec) as they are")
        if self.on_bad_record not in ("fail", "skip"):
            raise ValueError(f"on_bad_record must be 'fail' or 'skip', got {self.on_bad_record!r}")
        if self.on_topic_recreated not in ("rebuild", "fail"):
            raise ValueError(f"on_topic_recreated must be 'rebuild' or 'fail', got {self.on_topic_recreated!r}")
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1 record, got {self.batch_size}")
        if self.max_batch_bytes < 1:
            raise ValueError(f"max_batch_bytes must be >= 1 byte, got {self.max_batch_bytes}")
        if self.poll_timeout_ms < 0:
            raise ValueError(f"poll_timeout_ms must be >= 0 ms, got {self.poll_timeout_ms}")
        if self.cleaner_threads < 0:
            raise ValueError(f"cleaner_threads must be >= 0 (0 disables the cleaner), got {self.cleaner_threads}")
        if self.cleaner_backoff_ms < 0:
            raise ValueError(f"cleaner_backoff_ms must be >= 0 ms, got {self.cleaner_backoff_ms}")
        if self.dedupe_buffer_size_bytes < 1:
            raise ValueError(f"dedupe_buffer_size_bytes must be >= 1 byte, got {self.dedupe_buffer_size_bytes}")
        if self.metadata_refresh_interval_ms < 1:
            raise ValueError(f"metadata_refresh_interval_ms must be >= 1 ms, got {self.metadata_refresh_interval_ms}")
        if self.retention_check_interval_ms < 1:
            raise ValueError(f"retention_check_interval_ms must be >= 1 ms, got {self.retention_check_interval_ms}")
        if self.liveness_timeout_ms is not None and self.liveness_timeout_ms < 1:
            raise ValueError(f"liveness_timeout_ms must be >= 1 ms, got {self.liveness_timeout_ms}")
        if self.commit_group is not None and not self.commit_group.strip():
            raise ValueError("commit_group must be a consumer group name, got an empty string")
        if self.commit_interval_ms < 1:
            raise ValueError(f"commit_interval_ms must be >= 1 ms, got {self.commit_interval_ms}")
        if self.group_id is not None and not self.group_id.strip():
            raise ValueError("group_id must be a consumer group name, got an empty string")
        if self.group_id is not None and self.group_id == self.commit_group:
            raise ValueError(f"commit_group and group_id are both {self.group_id!r}: the offsets are committed "
                             "member-less (generation -1), which a group with members refuses; use another "
                             "commit_group")
        if self.group_protocol not in ("auto", "consumer", "classic"):
            raise ValueError(f"group_protocol must be 'auto', 'consumer' or 'classic', got {self.group_protocol!r}")
        if self.group_session_timeout_ms < 1:
            raise ValueError(f"group_session_timeout_ms must be >= 1 ms, got {self.group_session_timeout_ms}")
        if self.group_join_timeout_ms < 0:
            raise ValueError(f"group_join_timeout_ms must be >= 0 ms, got {self.group_join_timeout_ms}")
        if self.group_instance_id is not None and not self.group_instance_id.strip():
            raise ValueError("group_instance_id must be a non-empty name, got an empty string")
        if self.revoked_retention_ms < -1:
            raise ValueError(f"revoked_retention_ms must be >= 0 ms, or -1 for no bound, got {self.revoked_retention_ms}")
        if self.revoked_retention_bytes < -1:
            raise ValueError("revoked_retention_bytes must be >= 0 bytes, or -1 for no bound, got "
                             f"{self.revoked_retention_bytes}")
        if self.lease_interval_ms < 1:
            raise ValueError(f"lease_interval_ms must be >= 1 ms, got {self.lease_interval_ms}")
        partitioners = get_args(Partitioner)[1:]
        if self.partitioner not in get_args(Partitioner):
            raise ValueError(f"partitioner must be auto or one of {', '.join(partitioners)}, got {self.partitioner!r}")

    @property
    def effective_liveness_timeout_ms(self) -> int:
        """``liveness_timeout_ms``, or its default: max(120,000, 4 x ``request_timeout_ms``), ms."""
        if self.liveness_timeout_ms is not None:
            return self.liveness_timeout_ms
        return max(DEFAULT_LIVENESS_TIMEOUT_MS, 4 * self.request_timeout_ms)

    def source_options(self) -> KafkaSourceOptions:
        """The :class:`KafkaSourceOptions` for these options."""
        from materializer.adapters.kafka_source import KafkaSourceOptions

        return KafkaSourceOptions(isolation_level=self.isolation_level, request_timeout_ms=self.request_timeout_ms,
                                  broker_timeout_ms=self.broker_timeout_ms, client_config=dict(self.client_config))


    def cleaner_config(self) -> CleanerConfig | None:
        """The :class:`CleanerConfig` of the background cleaner; None when ``cleaner_threads`` is 0."""
        if self.cleaner_threads == 0:
            return None
        return CleanerConfig(num_threads=self.cleaner_threads, dedupe_buffer_size_bytes=self.dedupe_buffer_size_bytes,
                             backoff_ms=self.cleaner_backoff_ms)


def parse_config_overrides(items: list[str] | tuple[str, ...]) -> dict[str, str]:
    """Parse ``["segment.bytes=1048576", ...]`` into a dict, validated as Kafka's LogConfig does.

    Each value is checked on its own against Kafka's validators (:class:`LogConfig`), so a bad
    override fails here, before anything is fetched or written, and not on the first append.

    Raises:
        ValueError: an item without ``=`` or with an empty name, a name that is not a topic config
            the local log follows, or a value of the wrong type or out of range (the message names
            the config and the allowed values).
    """
    known = LogConfig.kafka_config_names()
    configs: dict[str, str] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name.strip():
            raise ValueError(f"config override {item!r} is not of the form key=value")
        name = name.strip()
        if name not in known:
            raise ValueError(f"unknown topic config {name!r} in --config {item!r}; the local log follows: "
                             f"{', '.join(sorted(known))}")
        configs[name] = value.strip()
    LogConfig.from_kafka_configs(configs)
    return configs

