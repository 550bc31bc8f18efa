"""Reading one topic from a Kafka cluster with confluent-kafka: partitions, watermarks, configs, records.

No consumer group is joined: every partition is assigned explicitly at an offset chosen by the
caller (``assign``), offsets are never committed (``enable.auto.commit=false``), and
``group.id`` is set only because the client requires one. Records are read with
``isolation.level=read_committed`` by default, so aborted transactional records and control
markers are skipped and leave offset gaps; the caller sees each record with the broker's
offset, timestamp and timestamp type (``CreateTime`` / ``LogAppendTime``).

``enable.partition.eof=true``: librdkafka reports "reached end of partition at offset N" once
per catch-up; :meth:`KafkaSource.fetch` returns those N in ``Fetch.eof_offsets`` instead of raising.

Error handling: every librdkafka error is translated in :func:`map_kafka_error` into
:class:`KafkaSourceError` (``raise ... from``). A cluster that stops answering is reported by
``fetch`` once it has been unreachable for ``KafkaSourceOptions.broker_timeout_ms`` and a
metadata probe fails too -- it never hangs.

Adapter over ``confluent_kafka.Consumer`` / ``confluent_kafka.admin.AdminClient``.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Callable, Iterator, Literal, Mapping, NamedTuple, Protocol, Sequence, cast

from confluent_kafka import (
    OFFSET_INVALID,
    TIMESTAMP_LOG_APPEND_TIME,
    TIMESTAMP_NOT_AVAILABLE,
    Consumer,
    KafkaError,
    KafkaException,
    TopicCollection,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, ConfigResource, ResourceType

from ..storage.record_batch import NO_TIMESTAMP, Record, TimestampType
from .errors import BrokerUnreachableError, KafkaSourceError, LeaderNotAvailableError, TopicNotFoundError

__all__ = [
    "ConsumedMessage",
    "Fetch",
    "FetchedRecord",
    "KafkaSource",
    "KafkaSourceOptions",
    "TOPIC_CONFIG_NAMES",
    "map_kafka_error",
    "map_kafka_errors",
]

logger = logging.getLogger(__name__)
_client_logger = logging.getLogger(__name__ + ".librdkafka")

#: Topic configs the materializer needs (``describe_configs`` returns these and all others).
TOPIC_CONFIG_NAMES: tuple[str, ...] = (
    "cleanup.policy", "compression.type", "segment.bytes", "segment.ms", "index.interval.bytes",
    "segment.index.bytes", "min.cleanable.dirty.ratio", "min.compaction.lag.ms", "max.compaction.lag.ms",
    "delete.retention.ms", "retention.ms", "retention.bytes",
)

# Client errors after which fetching cannot continue (others are retried by librdkafka).
_FATAL_FETCH_ERRORS = frozenset({
    KafkaError.UNKNOWN_TOPIC_OR_PART,
    KafkaError._UNKNOWN_TOPIC,
    KafkaError._UNKNOWN_PARTITION,
    KafkaError.TOPIC_AUTHORIZATION_FAILED,
    KafkaError.GROUP_AUTHORIZATION_FAILED,
    KafkaError._AUTHENTICATION,
    KafkaError._SSL,
    KafkaError._INVALID_ARG,
})
# Errors reported through error_cb that mean "the cluster cannot be reached".
_UNREACHABLE_ERRORS = frozenset({
    KafkaError._ALL_BROKERS_DOWN,
    KafkaError._TRANSPORT,
    KafkaError._RESOLVE,
    KafkaError._TIMED_OUT,
})
#: The partition's leader is not known yet or moved: retriable after a metadata refresh.
_LEADERSHIP_ERRORS = frozenset({
    KafkaError.LEADER_NOT_AVAILABLE,
    KafkaError.NOT_LEADER_FOR_PARTITION,  # NOT_LEADER_OR_FOLLOWER since KIP-392
    # librdkafka's cached metadata lacks a partition added since (a group may assign it first)
    KafkaError._UNKNOWN_PARTITION,
})
#: Pause between two asks for the watermarks of a partition without a leader, seconds.
_LEADER_RETRY_S = 0.1
#: Longest single wait inside ``KafkaSource.fetch`` before it re-checks for arrived records, seconds.
_FETCH_SLICE_S = 0.05


@dataclass(frozen=True)
class KafkaSourceOptions:
    """Client settings of a :class:`KafkaSource`.

    Attributes:
        isolation_level: "read_committed" (default; skips aborted records) or "read_uncommitted".
        group_id: ``group.id`` sent to the client; no group is joined and nothing is committed.
        request_timeout_ms: timeout of metadata, watermark and describe-configs requests (30 s).
        broker_timeout_ms: how long the cluster may be unreachable during ``fetch`` before
            :class:`KafkaSourceError` is raised (30 s).
        client_config: extra librdkafka settings (security, ``fetch.max.bytes``...); they win.
        statistics_callback: called with each librdkafka statistics JSON document (a ``str``;
            librdkafka's ``stats_cb``), from the thread that fetches, every
            ``statistics_interval_ms``. None (default): librdkafka collects no statistics. The
            adapter does not parse the document; a callback that raises is logged and ignored.
        statistics_interval_ms: librdkafka ``statistics.interval.ms`` used when
            ``statistics_callback`` is set, ms (5,000); ``client_config`` wins.
    """

    isolation_level: Literal["read_committed", "read_uncommitted"] = "read_committed"
    group_id: str = "kafka-materializer"
    request_timeout_ms: int = 30_000
    broker_timeout_ms: int = 30_000
    client_config: Mapping[str, str] = field(default_factory=dict)
    statistics_callback: Callable[[str], None] | None = None
    statistics_interval_ms: int = 5_000

    def consumer_config(self, bootstrap_servers: str) -> dict[str, object]:
        """The librdkafka consumer configuration."""
        config: dict[str, object] = {
            "bootstrap.servers": bootstrap_servers,
            "group.id": self.group_id,
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "enable.partition.eof": True,
            "isolation.level": self.isolation_level,
            "auto.offset.reset": "earliest",
            "socket.timeout.ms": min(self.request_timeout_ms, 60_000),
        }
        if self.statistics_callback is not None:
            config["statistics.interval.ms"] = self.statistics_interval_ms
        config.update(self.client_config)
        return config

    def admin_config(self, bootstrap_servers: str) -> dict[str, str | int | float | bool]:
        """The librdkafka admin client configuration (consumer-only keys left out)."""
        config: dict[str, str | int | float | bool] = {"bootstrap.servers": bootstrap_servers}
        consumer_only = ("group.id", "enable.", "isolation.level", "auto.offset.reset", "fetch.", "max.partition")
        config.update({k: v for k, v in self.client_config.items()
                       if not k.startswith(consumer_only) and k != "statistics.interval.ms"})
        return config


class FetchedRecord(NamedTuple):
    """One consumed record with its partition, batch timestamp type and the leader epoch its batch
    was written under (``Message.leader_epoch()``, KIP-320; -1 when the broker sent none)."""

    partition: int
    record: Record
    timestamp_type: TimestampType
    leader_epoch: int = -1


class Fetch(NamedTuple):
    """Result of one :meth:`KafkaSource.fetch`.

    Attributes:
        records: records in the order the client returned them (offset order per partition).
        eof_offsets: partition -> offset at which the client reported "end of partition".
        size_in_bytes: sum of key, value and header bytes of ``records``.
    """

    records: list[FetchedRecord]
    eof_offsets: dict[int, int]
    size_in_bytes: int


def map_kafka_error(error: BaseException | KafkaError, context: str) -> KafkaSourceError:
    """Translate a confluent-kafka error (``KafkaException``, ``KafkaError`` or a client timeout)
    into one :class:`KafkaSourceError` whose message starts with ``context``."""
    kafka_error = error
    if isinstance(error, KafkaException) and error.args and isinstance(error.args[0], KafkaError):
        kafka_error = error.args[0]
    if isinstance(kafka_error, KafkaError):
        code = kafka_error.code()
        reason = kafka_error.str()
        if code in _UNREACHABLE_ERRORS:
            hint = " (is the broker running and is --bootstrap-servers right?)"
        elif code in (KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC):
            hint = " (does the topic exist?)"
        else:
            hint = ""
        kind = (BrokerUnreachableError if code in _UNREACHABLE_ERRORS
                else TopicNotFoundError if code in (KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC)
                else LeaderNotAvailableError if code in _LEADERSHIP_ERRORS
                else KafkaSourceError)
        return kind(f"{context}: {reason} [{kafka_error.name()}]{hint}")
    if isinstance(error, TimeoutError):
        return BrokerUnreachableError(f"{context}: timed out (is the broker running?)")
    return KafkaSourceError(f"{context}: {error}")


@contextlib.contextmanager
def map_kafka_errors(context: str) -> Iterator[None]:
    """Context manager: re-raise client exceptions via :func:`map_kafka_error`."""
    try:
        yield
    except KafkaSourceError:
        raise
    except (KafkaException, TimeoutError, ValueError, RuntimeError) as exc:
        raise map_kafka_error(exc, context) from exc


class ConsumedMessage(Protocol):
    """A message ``Consumer.consume`` returned, as librdkafka fills it: partition and offset are
    always set (confluent-kafka's stubs type them Optional, as on a message not yet produced)."""

    def error(self) -> KafkaError | None: ...
    def partition(self) -> int: ...
    def offset(self) -> int: ...
    def timestamp(self) -> tuple[int, int]: ...
    def key(self) -> bytes | None: ...
    def value(self) -> bytes | None: ...
    def headers(self) -> Sequence[tuple[str, bytes | None]] | None: ...
    def leader_epoch(self) -> int | None: ...


def _timestamp(message: ConsumedMessage) -> tuple[int, TimestampType]:
    ts_type, ts = message.timestamp()
    if ts_type == TIMESTAMP_NOT_AVAILABLE:
        return NO_TIMESTAMP, TimestampType.CREATE_TIME
    if ts_type == TIMESTAMP_LOG_APPEND_TIME:
        return ts, TimestampType.LOG_APPEND_TIME
    return ts, TimestampType.CREATE_TIME


class _ClientLog:
    """librdkafka's ``logger`` for one client: forwards every line to the module's client logger
    and keeps the text of the last ``FAIL`` line (a refused connection, a TLS or SASL handshake
    failure) for the errors raised later."""

    def __init__(self) -> None:
        self.last_failure: str | None = None

    def log(self, level: int, message: str, *args: object) -> None:
        _client_logger.log(level, message, *args)
        if args and args[0] == "FAIL":
            self.last_failure = str(args[-1]).split("]: ", 1)[-1]  # without the "[thrd:...]" prefix


class KafkaSource:
    """Consumes one topic partition by partition from explicit offsets.

    Args:
        bootstrap_servers: ``host:port[,host:port]``.
        topic: the topic to read.
        options: client settings.

    Not thread-safe. Close with :meth:`close` or use as a context manager.
    """

    def __init__(self, bootstrap_servers: str, topic: str, options: KafkaSourceOptions | None = None) -> None:
        self.bootstrap_servers = bootstrap_servers
        self.topic = topic
        self.options = options or KafkaSourceOptions()
        self._timeout_s = self.options.request_timeout_ms / 1000.0
        self._unreachable_since: float | None = None
        #: Partitions the last :meth:`partitions` found without a leader (-1) in the metadata.
        self.partitions_without_leader: frozenset[int] = frozenset()
        self._last_client_error: KafkaError | None = None
        self._admin: AdminClient | None = None
        self._admin_lock = threading.Lock()
        self._client_log = _ClientLog()
        callbacks: dict[str, object] = {"logger": self._client_log, "error_cb": self._on_client_error}
        if self.options.statistics_callback is not None:
            callbacks["stats_cb"] = self._on_statistics
        with map_kafka_errors(f"cannot create a Kafka consumer for {bootstrap_servers}"):
            self._consumer: Consumer | None = Consumer(self.options.consumer_config(bootstrap_servers), **callbacks)

    # -- lifecycle ---------------------------------------------------------------------------

    def close(self) -> None:
        """Close the consumer (no offsets are committed) and let the admin client go. Idempotent."""
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            with contextlib.suppress(KafkaException, RuntimeError):
                consumer.close()
        self.release_admin_client()

    def release_admin_client(self) -> None:
        """Let the admin client (topic configs and id: ``describe_configs``, ``describe_topics``) go
        with its librdkafka threads and connections until it is needed again: a run whose fetcher
        follows the topic id itself asks the admin client nothing after its start. Thread-safe."""
        with self._admin_lock:
            self._admin = None  # destroyed with its last reference (librdkafka has no close for it)

    def __enter__(self) -> "KafkaSource":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _require_consumer(self) -> Consumer:
        if self._consumer is None:
            raise KafkaSourceError(f"Kafka source for topic {self.topic!r} is closed")
        return self._consumer

    def _on_client_error(self, error: KafkaError) -> None:
        self._last_client_error = error
        if error.code() in _UNREACHABLE_ERRORS:
            if self._unreachable_since is None:
                self._unreachable_since = time.monotonic()
            logger.debug("Kafka client: %s", error.str())
        else:
            # on the client's logger: the CLI folds its repeated lines (librdkafka reports one per retry)
            _client_logger.warning("Kafka client error: %s", error.str())

    def _with_client_report(self, error: KafkaSourceError) -> KafkaSourceError:
        """``error`` with the client's last connection failure appended: a TLS or SASL handshake
        failure reaches ``list_topics`` only as a transport failure, its cause in librdkafka's
        ``FAIL`` log line (served by a poll, done only while nothing is assigned, so no record
        can be taken)."""
        consumer = self._consumer
        if consumer is not None:
            with contextlib.suppress(KafkaException, RuntimeError):
                if not consumer.assignment():
                    consumer.poll(0)
        failure = self._client_log.last_failure
        if failure is None or failure in str(error):
            return error
        return type(error)(f"{error}; the client last reported: {failure}")

    def _on_statistics(self, stats_json: str) -> None:
        # Called by librdkafka inside consume(): an exception here would surface from fetch() as
        # a client error, so a broken statistics consumer must not stop ingest.
        callback = self.options.statistics_callback
        if callback is None:  # registered only with a callback set
            return
        try:
            callback(stats_json)
        except Exception:  # noqa: BLE001 - statistics are best effort
            logger.exception("librdkafka statistics callback failed (ignored)")

    # -- metadata ----------------------------------------------------------------------------

    def partitions(self, timeout_s: float | None = None) -> list[int]:
        """The topic's partition ids, sorted. ``timeout_s``: how long to wait for the metadata,
        seconds (default: ``request_timeout_ms``).

        Raises:
            TopicNotFoundError: the topic is not in the metadata.
            KafkaSourceError: the cluster is unreachable within the timeout.
        """
        consumer = self._require_consumer()
        context = f"cannot read metadata of topic {self.topic!r} from {self.bootstrap_servers}"
        try:
            with map_kafka_errors(context):
                metadata = consumer.list_topics(self.topic, timeout=self._timeout_s if timeout_s is None else timeout_s)
        except KafkaSourceError as exc:
            raise self._with_client_report(exc) from exc.__cause__
        topic = metadata.topics.get(self.topic)
        if topic is None:
            raise TopicNotFoundError(f"{context}: topic not in metadata (does the topic exist?)")
        if topic.error is not None:
            raise map_kafka_error(topic.error, context)
        if not topic.partitions:
            raise KafkaSourceError(f"{context}: topic has no partitions")
        self.partitions_without_leader = frozenset(p for p, meta in topic.partitions.items() if meta.leader < 0)
        return sorted(topic.partitions)

    @property
    def unreachable_since(self) -> float | None:
        """Since when (``time.monotonic()`` seconds) the client has reported the cluster unreachable
        (all brokers down, a transport failure, a timeout), None once records or a partition end
        arrived since."""
        return self._unreachable_since

    def watermark_offsets(self, partition: int, *, wait_for_leader: bool = True) -> tuple[int, int]:
        """``(low, high)`` watermarks of ``partition`` as the leader reports them now.

        ``low`` is the log start offset; ``high`` the high watermark (next offset to be written
        and replicated). A partition whose leader is not known yet or moved (just created, a
        leader election) is asked again every 100 ms up to the request timeout, as the Java
        consumer's ``endOffsets`` retries an ``InvalidMetadataException``; ``wait_for_leader=False``
        asks once.

        Raises:
            LeaderNotAvailableError: no leader answered for the partition (within the request
                timeout, or at once with ``wait_for_leader=False``).
            KafkaSourceError: any other failure (``BrokerUnreachableError``, ``TopicNotFoundError``).
        """
        consumer = self._require_consumer()
        deadline = time.monotonic() + self._timeout_s
        while True:
            try:
                with map_kafka_errors(f"cannot read watermarks of {self.topic}-{partition} from "
                                      f"{self.bootstrap_servers}"):
                    low, high = consumer.get_watermark_offsets(TopicPartition(self.topic, partition),
                                                               timeout=self._timeout_s, cached=False)
                return int(low), int(high)
            except LeaderNotAvailableError:
                if not wait_for_leader or time.monotonic() + _LEADER_RETRY_S > deadline:
                    raise
                time.sleep(_LEADER_RETRY_S)

    @property
    def reachable(self) -> bool:
        """False from a client error saying the cluster cannot be reached (all brokers down, a
        transport error) until records or an end of partition arrive again, or the cluster answers
        a metadata request after ``broker_timeout_ms``: whether the cached high watermarks
        (:meth:`cached_high_watermarks`) are being kept current by fetch answers."""
        return self._unreachable_since is None

    def cached_high_watermarks(self, partitions: list[int]) -> dict[int, int]:
        """Partition -> high watermark as librdkafka last learned it (from fetch responses), with no
        request to the broker (``get_watermark_offsets(cached=True)``); partitions whose watermark
        is not known yet (nothing fetched since the assignment) are absent. Never raises: returns
        ``{}`` when the source is closed or the client refuses.
        """
        return self._cached_watermarks(partitions, 1)

    def _cached_watermarks(self, partitions: list[int], which: int) -> dict[int, int]:
        """Partition -> the client's cached low (``which`` 0) or high (1) watermark; unknown ones absent."""
        consumer = self._consumer
        if consumer is None:
            return {}
        result: dict[int, int] = {}
        for partition in partitions:
            try:
                value = consumer.get_watermark_offsets(TopicPartition(self.topic, partition), cached=True)[which]
            except (KafkaException, RuntimeError):
                continue
            if value is not None and value >= 0:
                result[partition] = int(value)
        return result

    def _admin_client(self) -> AdminClient:
        with self._admin_lock:  # start() asks for configs and the topic id from two threads at once
            if self._admin is None:
                self._admin = AdminClient(self.options.admin_config(self.bootstrap_servers), logger=_client_logger)
            return self._admin

    def topic_id(self) -> uuid.UUID | None:
        """The topic's id in the cluster (KIP-516; ``describe_topics``, one request), or None when the
        topic does not exist.

        Raises:
            KafkaSourceError: the cluster is unreachable or refuses (authorization).
        """
        context = f"cannot describe topic {self.topic!r} on {self.bootstrap_servers}"
        try:
            with map_kafka_errors(context):
                futures = self._admin_client().describe_topics(TopicCollection([self.topic]),
                                                               request_timeout=self._timeout_s)
                description = futures[self.topic].result(timeout=self._timeout_s + 5)
        except TopicNotFoundError:
            return None
        found = description.topic_id
        if found is None:
            return None
        mask = (1 << 64) - 1
        value = ((found.get_most_significant_bits() & mask) << 64) | (found.get_least_significant_bits() & mask)
        return uuid.UUID(int=value) if value else None

    def topic_configs(self) -> dict[str, str]:
        """Every topic config the broker returns (``describe_configs``), name -> value string.

        Entries without a value (sensitive ones) are left out. The result always covers
        :data:`TOPIC_CONFIG_NAMES` on a Kafka broker.

        Raises:
            KafkaSourceError: unreachable cluster, unknown topic or no permission.
        """
        context = f"cannot describe configs of topic {self.topic!r} on {self.bootstrap_servers}"
        with map_kafka_errors(context):
            resource = ConfigResource(ResourceType.TOPIC, self.topic)
            futures = self._admin_client().describe_configs([resource], request_timeout=self._timeout_s)
            entries = next(iter(futures.values())).result(timeout=self._timeout_s + 5)
        return {name: entry.value for name, entry in entries.items() if entry.value is not None}

    # -- fetching ----------------------------------------------------------------------------

    def _partitions_at(self, start_offsets: Mapping[int, int],
                       epochs: Mapping[int, int] | None) -> list[TopicPartition]:
        result = []
        for partition, offset in sorted(start_offsets.items()):
            epoch = (epochs or {}).get(partition, -1)
            if epoch >= 0:
                result.append(TopicPartition(self.topic, partition, int(offset), leader_epoch=int(epoch)))
            else:
                result.append(TopicPartition(self.topic, partition, int(offset)))
        return result

    def assign(self, start_offsets: Mapping[int, int], epochs: Mapping[int, int] | None = None) -> None:
        """Assign exactly these partitions, each from its start offset (replaces any assignment).

        ``epochs[partition]``, when given and >= 0, is the leader epoch of the record before the
        start offset: librdkafka then validates the position with OffsetsForLeaderEpoch before it
        fetches (KIP-320) and, when the leader's log diverged before the start offset, fetches from
        the first offset known to diverge, which the caller sees as records below its start offset.
        An offset below the partition's log start offset resets to the earliest offset.
        """
        consumer = self._require_consumer()
        with map_kafka_errors(f"cannot assign partitions of topic {self.topic!r}"):
            consumer.assign(self._partitions_at(start_offsets, None))
            self._validate(start_offsets, epochs)

    def seek(self, partition: int, offset: int, epoch: int = -1) -> None:
        """Move ``partition``'s fetch position to ``offset`` (with the leader ``epoch`` of the record
        before it when >= 0, which librdkafka validates as in :meth:`assign`); records already
        fetched for the partition are dropped by the client.

        Raises:
            KafkaSourceError: the seek fails.
        """
        consumer = self._require_consumer()
        with map_kafka_errors(f"cannot seek {self.topic}-{partition} to offset {offset}"):
            consumer.seek(self._partitions_at({partition: offset}, {partition: epoch})[0])

    def add_partitions(self, start_offsets: Mapping[int, int], epochs: Mapping[int, int] | None = None) -> None:
        """Add these partitions to the assignment, each from its start offset; the others keep their
        positions (librdkafka ``incremental_assign``); ``epochs`` as in :meth:`assign`.

        Raises:
            KafkaSourceError: the assignment fails.
        """
        consumer = self._require_consumer()
        with map_kafka_errors(f"cannot assign new partitions of topic {self.topic!r}"):
            consumer.incremental_assign(self._partitions_at(start_offsets, None))
            self._validate(start_offsets, epochs)

    def remove_partitions(self, partitions: Sequence[int]) -> None:
        """Take these partitions out of the assignment; the others keep their positions, and what the
        client fetched for these and not handed out yet is dropped (librdkafka ``incremental_unassign``).

        Raises:
            KafkaSourceError: the unassignment fails.
        """
        if not partitions:
            return
        consumer = self._require_consumer()
        with map_kafka_errors(f"cannot unassign partitions {sorted(partitions)} of topic {self.topic!r}"):
            consumer.incremental_unassign([TopicPartition(self.topic, p) for p in sorted(partitions)])

    def _validate(self, start_offsets: Mapping[int, int], epochs: Mapping[int, int] | None) -> None:
        """Seek each assigned partition that has a known epoch to its offset with that epoch: a seek
        with a leader epoch is what makes librdkafka validate the position (an assignment with one
        is validated only while the client has no metadata of the partition yet; seen with 2.16)."""
        consumer = self._require_consumer()
        for tp in self._partitions_at(start_offsets, epochs):
            if tp.leader_epoch is not None and tp.leader_epoch >= 0:
                consumer.seek(tp)

    def cached_log_start_offsets(self, partitions: list[int]) -> dict[int, int]:
        """Partition -> the broker's log start offset as librdkafka last learned it from fetch
        responses (no request); unknown ones are absent. Never raises."""
        return self._cached_watermarks(partitions, 0)

    def fetch(self, max_records: int, timeout_ms: int) -> Fetch:
        """Return up to ``max_records`` records, waiting at most ``timeout_ms`` for the first.

        Raises:
            KafkaSourceError: a non-retriable error (unknown topic, authorization...) or the
                cluster has been unreachable for longer than ``broker_timeout_ms``.
        """
        consumer = self._require_consumer()
        # librdkafka's batch consume returns only with max_records messages or at its timeout, so
        # one long call made every short tail (and the last fetch of each catch-up) cost the full
        # timeout. Waiting in short slices returns as soon as anything (records or partition EOF
        # events) has arrived, while a busy queue still fills whole batches within one slice.
        deadline = time.monotonic() + timeout_ms / 1000.0
        with map_kafka_errors(f"cannot fetch from topic {self.topic!r}"):
            messages = consumer.consume(num_messages=max_records, timeout=0)
            while not messages:
                remaining_s = deadline - time.monotonic()
                if remaining_s <= 0:
                    break
                messages = consumer.consume(num_messages=max_records, timeout=min(remaining_s, _FETCH_SLICE_S))
        records: list[FetchedRecord] = []
        eof_offsets: dict[int, int] = {}
        size_in_bytes = 0
        append = records.append
        for message in cast(list[ConsumedMessage], messages):
            error = message.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    eof_offsets[message.partition()] = message.offset()
                    continue
                if error.fatal() or error.code() in _FATAL_FETCH_ERRORS:
                    raise map_kafka_error(error, f"cannot fetch {self.topic}-{message.partition()}")
                logger.warning("fetch from %s-%s: %s (retrying)", self.topic, message.partition(), error.str())
                continue
            timestamp, timestamp_type = _timestamp(message)
            key, value, raw_headers = message.key(), message.value(), message.headers()
            if key:
                size_in_bytes += len(key)
            if value:
                size_in_bytes += len(value)
            if raw_headers:
                headers = tuple(raw_headers)
                for name, header_value in headers:
                    size_in_bytes += len(name) + (len(header_value) if header_value else 0)
            else:
                headers = ()
            epoch = message.leader_epoch()
            append(FetchedRecord(message.partition(), Record(message.offset(), timestamp, key, value, headers),
                                 timestamp_type, -1 if epoch is None else epoch))
        if records or eof_offsets:
            self._unreachable_since = None
        else:
            self._check_reachable()
        return Fetch(records, eof_offsets, size_in_bytes)

    def _check_reachable(self) -> None:
        since = self._unreachable_since
        if since is None:
            return
        elapsed_ms = (time.monotonic() - since) * 1000.0
        if elapsed_ms < self.options.broker_timeout_ms:
            return
        try:
            self._require_consumer().list_topics(self.topic, timeout=min(self._timeout_s, 5.0))
        except KafkaException as exc:
            last = self._last_client_error.str() if self._last_client_error is not None else str(exc)
            raise BrokerUnreachableError(
                f"Kafka cluster {self.bootstrap_servers} unreachable for {elapsed_ms / 1000.0:.0f} s "
                f"(broker timeout {self.options.broker_timeout_ms} ms): {last}") from exc
        self._unreachable_since = None

    def positions(self, partitions: list[int]) -> dict[int, int]:
        """The consumer's next fetch offset per partition (partitions without a position are absent)."""
        consumer = self._require_consumer()
        with map_kafka_errors(f"cannot read positions of topic {self.topic!r}"):
            result = consumer.position([TopicPartition(self.topic, p) for p in partitions])
        return {tp.partition: tp.offset for tp in result if tp.offset != OFFSET_INVALID and tp.offset >= 0}

    def __repr__(self) -> str:
        return f"KafkaSource({self.bootstrap_servers!r}, {self.topic!r})"
