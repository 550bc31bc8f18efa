"""Fetching a topic's record batches verbatim with the Kafka Fetch API, as a replica copies them.

A follower replica (Kafka ``ReplicaFetcherThread``) and a tiered-storage copy keep the leader's
batches byte for byte: producer id, epoch and base sequence, the transactional and control flags,
ABORT/COMMIT markers, aborted data and batch boundaries. A consumer (librdkafka) hands out
records instead, so a log rebuilt from them loses all of that. :class:`ReplicaFetcher` sends
Fetch requests (``isolation_level=READ_UNCOMMITTED``, ``replica_id=-1``: a consumer's fetch,
which needs only the topic's READ ACL, and reads up to the high watermark, the offsets every
replica already has) and returns each partition's ``records`` field untouched: whole v2 batches,
maybe followed by a partial one that the next fetch returns whole (Kafka ``FetchResponse``).

The protocol layer is kafka-python's (``kafka.protocol``: every Fetch version from 4 to 12, the
``records`` field as plain ``bytes``), and so is the network layer for metadata, API version
negotiation and every SASL (PLAIN, SCRAM, GSSAPI, OAUTHBEARER) or SSL connection. On a PLAINTEXT
listener the Fetch requests themselves go over :class:`_FetchConnection`, a blocking socket per
leader that reads each response with ``recv_into`` into one buffer and decodes it in place:
kafka-python's own receive path reads 4 KiB per ``recv`` and copies a response about six times,
which measured 4.4x slower in a one-off script, not kept (165 against 725 MB/s for the same
124 MB). Responses are read on a receiver thread (``recv_into`` releases the GIL), so the next one
arrives while the caller appends the previous one. aiokafka's protocol layer is the same code base
run on asyncio; an event loop beside the materializer's threads bought nothing. confluent-kafka exposes no raw batches.

Leader discovery and changes: partitions are grouped by their leader from the topic's metadata;
``NOT_LEADER_OR_FOLLOWER``, ``FENCED_LEADER_EPOCH``, ``UNKNOWN_LEADER_EPOCH``,
``LEADER_NOT_AVAILABLE`` and their kind refresh the metadata and retry (the partition's data is
empty in that round). ``OFFSET_OUT_OF_RANGE`` is returned to the caller, who knows where its log
ends (:class:`PartitionData.error`). An unreachable cluster raises
:class:`~materializer.adapters.errors.BrokerUnreachableError` after ``broker_timeout_ms``;
authorization and other non-retriable errors raise :class:`KafkaSourceError`.

The follower's safety checks (``AbstractFetcherThread``; the rules in
``shared/docs/kafka-follower-semantics.md``):

* **Topic identity (KIP-516).** Requests name the topic by its id from Fetch v13 on, so the broker
  answers ``UNKNOWN_TOPIC_ID`` / ``INCONSISTENT_TOPIC_ID`` instead of serving a re-created topic
  under the same name. The id the local copy holds is given with :meth:`ReplicaFetcher.expect_topic_id`;
  before every request the cached metadata is compared with it, and a topic that left the metadata
  or came back with another id raises :class:`~materializer.adapters.errors.TopicIdChangedError`.
  Metadata requests never auto-create the topic (``allow_auto_topic_creation=false``).
* **Leader epochs (KIP-101, KIP-279, KIP-320, KIP-595).** Each partition is fetched with
  ``CurrentLeaderEpoch`` from the metadata and ``LastFetchedEpoch`` = the epoch of the local log's
  last batch (:class:`FetchPosition`); a leader whose log diverged answers with ``DivergingEpoch``
  (:attr:`PartitionData.diverging_epoch`), which the caller truncates to. Against brokers older
  than Fetch v12, :meth:`ReplicaFetcher.offsets_for_leader_epoch` (OffsetsForLeaderEpoch v2+)
  answers the same question.

Client settings are the consumer's (librdkafka names, :class:`KafkaSourceOptions.client_config`)
translated by :func:`replica_client_config`; a security setting that has no kafka-python equal
is refused with its name rather than ignored.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import struct
import threading
import time
import uuid
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import NamedTuple

import kafka.errors as kafka_errors
from kafka.net.compat import KafkaNetClient
from kafka.protocol.consumer import FetchRequest, FetchResponse, ListOffsetsRequest, OffsetForLeaderEpochRequest
from kafka.structs import TopicPartition

from ..storage.varint import decode_unsigned_varint
from .errors import (
    BrokerUnreachableError,
    KafkaSourceError,
    LeaderNotAvailableError,
    TopicIdChangedError,
    TopicNotFoundError,
)
from .kafka_source import KafkaSourceOptions

__all__ = ["EpochEndOffset", "FetchPosition", "PartitionData", "ReplicaFetcher", "replica_client_config",
           "DEFAULT_FETCH_MAX_BYTES", "DEFAULT_PARTITION_FETCH_MAX_BYTES"]

logger = logging.getLogger(__name__)

#: Kafka consumer ``fetch.max.bytes`` default: the most one Fetch response may carry, bytes (50 MiB).
DEFAULT_FETCH_MAX_BYTES = 50 * 1024 * 1024
#: Bytes asked per partition (``max.partition.fetch.bytes``): 8 MiB here against the consumer's
#: 1 MiB, because the batches are appended whole and bigger responses cost fewer round trips.
DEFAULT_PARTITION_FETCH_MAX_BYTES = 8 * 1024 * 1024
#: Longest wait between two connection attempts to a broker that refused one, ms (the Java
#: client's ``reconnect.backoff.max.ms``; ``-X reconnect.backoff.max.ms=`` sets it).
DEFAULT_RECONNECT_BACKOFF_MAX_MS = 1_000
#: ``max.partition.fetch.bytes`` of the first request, bytes; doubled per request up to the configured one.
RAMP_START_PARTITION_BYTES = 1024 * 1024

# Fetch v4 added isolation levels and the last stable offset; v12 LastFetchedEpoch/DivergingEpoch
# (KIP-595); v13 names topics by id only (KIP-516). Kafka 4.0 dropped v0-v3 (KIP-896). v14+ add
# nothing a client fetch needs.
_MIN_FETCH_VERSION = 4
_MAX_FETCH_VERSION = 13
_MAX_FETCH_VERSION_BY_NAME = 12  # when the cluster reports no topic id (metadata before v10)
_DIVERGING_EPOCH_VERSION = 12
_READ_UNCOMMITTED = 0
_READ_COMMITTED = 1
# ListOffsets timestamps asking for the log start offset and the latest offset (Kafka ListOffsetsRequest).
_EARLIEST_TIMESTAMP = -2
_LATEST_TIMESTAMP = -1
#: How long watermarks() waits between asks while a partition has no answering leader, seconds.
_LEADER_RETRY_S = 0.1
_CONSUMER_REPLICA_ID = -1

# Errors after which the leader is looked up again (Kafka ``Errors`` with invalid metadata).
_REFRESH_METADATA = frozenset({
    kafka_errors.NotLeaderForPartitionError.errno, kafka_errors.LeaderNotAvailableError.errno,
    kafka_errors.FencedLeaderEpochError.errno, kafka_errors.UnknownLeaderEpochError.errno,
    kafka_errors.UnknownTopicOrPartitionError.errno, kafka_errors.ReplicaNotAvailableError.errno,
    kafka_errors.KafkaStorageError.errno, kafka_errors.OffsetNotAvailableError.errno,
    kafka_errors.UnknownTopicIdError.errno, kafka_errors.InconsistentTopicIdError.errno,
})
OFFSET_OUT_OF_RANGE = kafka_errors.OffsetOutOfRangeError.errno

_INT32 = struct.Struct(">i")

#: Fetch over :class:`_FetchConnection` on PLAINTEXT listeners (False: always through kafka-python's
#: managed connections, as on SASL/SSL listeners; the tests run both).
DIRECT_FETCH_ON_PLAINTEXT = True


class _FetchConnection:
    """One blocking PLAINTEXT socket to a leader for Fetch requests (module docstring: why).

    Requests are encoded by kafka-python (``ApiMessage.encode`` with the request header); a
    response is read whole into a reused buffer (its 4-byte size, then ``recv_into``) and decoded
    from a memoryview: the response header (correlation id, and tagged fields from v12 on,
    ``ResponseHeader`` v1) by hand, the body by ``FetchResponse.decode``, whose ``records`` are
    copied out as ``bytes`` once. One request may be outstanding, sent before the previous
    response is processed (pipelining).

    Raises (send/receive):
        KafkaConnectionError: the socket failed or closed, or the response answers another request.
    """

    def __init__(self, host: str, port: int, client_id: str, timeout_s: float) -> None:
        try:
            self._sock = socket.create_connection((host, port), timeout=timeout_s)
        except OSError as exc:
            raise kafka_errors.KafkaConnectionError(f"cannot connect to {host}:{port}: {exc}") from exc
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._address = f"{host}:{port}"
        self._client_id = client_id
        self._correlation_id = 0
        self._pending: tuple[int, int] | None = None  # (correlation id, api version)
        self._buffer = bytearray(1 << 20)

    def shutdown(self) -> None:
        """End the connection but keep its file descriptor: a ``recv`` blocked in another thread, or
        one about to start, returns at once (close alone does not wake it), and the descriptor
        cannot be reused by a new socket while that thread may still read it."""
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        """:meth:`shutdown`, then release the descriptor; only once no other thread can read it."""
        self.shutdown()
        self._sock.close()

    def send(self, request: FetchRequest, version: int) -> None:
        self._correlation_id = (self._correlation_id + 1) % 2**31
        request.API_VERSION = version
        request.with_header(correlation_id=self._correlation_id, client_id=self._client_id)
        try:
            self._sock.sendall(request.encode(framed=True, header=True))
        except OSError as exc:
            raise kafka_errors.KafkaConnectionError(f"{self._address}: cannot send a Fetch request: {exc}") from exc
        self._pending = (self._correlation_id, version)

    def _read_exactly(self, view: memoryview) -> None:
        got = 0
        while got < len(view):
            count = self._sock.recv_into(view[got:])
            if count == 0:
                raise kafka_errors.KafkaConnectionError(f"{self._address} closed the connection")
            got += count

    def receive(self):
        if self._pending is None:
            raise RuntimeError("no Fetch request outstanding")
        (correlation_id, version), self._pending = self._pending, None
        try:
            size_view = memoryview(bytearray(4))
            self._read_exactly(size_view)
            (size,) = _INT32.unpack(size_view)
            if size < 4 or size > 1 << 31:
                raise kafka_errors.KafkaConnectionError(f"{self._address}: invalid response size {size}")
            if len(self._buffer) < size:
                self._buffer = bytearray(size)
            view = memoryview(self._buffer)[:size]
            self._read_exactly(view)
        except OSError as exc:
            raise kafka_errors.KafkaConnectionError(f"{self._address}: cannot read a Fetch response: {exc}") from exc
        (received_id,) = _INT32.unpack_from(view, 0)
        if received_id != correlation_id:
            raise kafka_errors.KafkaConnectionError(
                f"{self._address}: response for request {received_id}, expected {correlation_id}")
        position = 4
        if FetchResponse.flexible_version_q(version):  # ResponseHeader v1: tagged fields follow
            count, position = decode_unsigned_varint(view, position)
            for _ in range(count):
                _, position = decode_unsigned_varint(view, position)
                length, position = decode_unsigned_varint(view, position)
                position += length
        return FetchResponse.decode(view[position:], version=version)


# librdkafka setting -> kafka-python argument.
_RENAMED = {
    "client.id": "client_id",
    "security.protocol": "security_protocol",
    "sasl.mechanism": "sasl_mechanism",
    "sasl.mechanisms": "sasl_mechanism",
    "sasl.username": "sasl_plain_username",
    "sasl.password": "sasl_plain_password",
    "sasl.kerberos.service.name": "sasl_kerberos_service_name",
    "ssl.ca.location": "ssl_cafile",
    "ssl.certificate.location": "ssl_certfile",
    "ssl.key.location": "ssl_keyfile",
    "ssl.key.password": "ssl_password",
    "ssl.crl.location": "ssl_crlfile",
}
# Settings of the consumer that do not change how a Fetch request is sent or secured.
_CONSUMER_ONLY = ("group.", "enable.", "isolation.level", "auto.", "fetch.", "max.partition.fetch.bytes",
                  "statistics.", "session.timeout.ms", "heartbeat.", "max.poll.", "queued.", "debug",
                  "log_level", "log.", "socket.", "broker.", "topic.", "api.version", "client.rack",
                  "reconnect.", "retry.", "metadata.", "partition.assignment.", "check.crcs", "allow.")


def replica_client_config(options: KafkaSourceOptions, bootstrap_servers: str) -> dict[str, object]:
    """kafka-python client arguments equal to the consumer's librdkafka settings.

    ``options.client_config`` keys are librdkafka names (``security.protocol``, ``sasl.*``,
    ``ssl.*``, ``client.id``...); consumer-only keys (``group.id``, ``fetch.*``...) are left out
    (the fetch sizes are read by :class:`ReplicaFetcher` itself).

    Raises:
        ValueError: a ``sasl.*``/``ssl.*``/``security.*`` setting (or another unknown one) that
            kafka-python cannot honour: it is named, with ``--fetch consumer`` as the way out.
    """
    config: dict[str, object] = {
        "bootstrap_servers": bootstrap_servers.split(","),
        "client_id": "kafka-materializer-replica-fetch",
        "request_timeout_ms": options.request_timeout_ms,
        "receive_message_max_bytes": DEFAULT_FETCH_MAX_BYTES + 1024 * 1024,
        # kafka-python backs reconnects off up to 30 s: after a minute-long broker outage a run
        # stayed unready for 30-56 s once the broker was back. The Java client's bound, 1 s.
        "reconnect_backoff_max_ms": DEFAULT_RECONNECT_BACKOFF_MAX_MS,
    }
    for key, value in options.client_config.items():
        if key in _RENAMED:
            name = _RENAMED[key]
            config[name] = str(value).upper() if name in ("security_protocol", "sasl_mechanism") else value
        elif key == "ssl.endpoint.identification.algorithm":
            config["ssl_check_hostname"] = str(value).lower() == "https"
        elif key in ("request.timeout.ms",):
            config["request_timeout_ms"] = int(value)
        elif key in ("reconnect.backoff.ms", "reconnect.backoff.max.ms"):
            config[key.replace(".", "_")] = int(value)
        elif key.startswith(_CONSUMER_ONLY) and not key.startswith(("sasl.", "ssl.", "security.")):
            continue
        else:
            raise ValueError(f"client setting {key!r} has no equal in the replica fetch path (kafka-python); "
                             "use --fetch consumer (fetch='consumer') for this cluster")
    return config


class FetchPosition(NamedTuple):
    """Where to fetch a partition from (Kafka ``FetchRequestData.FetchPartition``).

    Attributes:
        offset: ``FetchOffset``: the next offset wanted (the local log end offset).
        last_fetched_epoch: ``LastFetchedEpoch`` (Fetch v12+, KIP-595): the leader epoch of the
            local log's last batch, -1 when unknown (no divergence check then).
    """

    offset: int
    last_fetched_epoch: int = -1


class EpochEndOffset(NamedTuple):
    """A leader's answer about an epoch (Kafka ``FetchResponseData.EpochEndOffset`` / ``OffsetForLeaderEpoch``
    ``EpochEndOffset``): the largest epoch it knows that is ``<=`` the one asked, and the offset that
    epoch ends at (exclusive). (-1, -1) when the leader knows no such epoch."""

    epoch: int
    end_offset: int


@dataclass(frozen=True)
class PartitionData:
    """One partition's part of a Fetch response (Kafka ``FetchResponseData.PartitionData``).

    Attributes:
        partition: partition number.
        fetch_offset: the offset asked for.
        records: the broker's bytes from the batch holding ``fetch_offset`` on (its first batch may
            start below ``fetch_offset``), as stored in its ``.log`` file; may end in a partial
            batch. Empty when ``error`` is set, ``diverging_epoch`` is set, or nothing is new.
        high_watermark / last_stable_offset / log_start_offset: the leader's offsets (-1 unknown).
        error: Kafka error code (0 none); only ``OFFSET_OUT_OF_RANGE`` and leader-change codes
            reach the caller (the latter with empty records, already handled by a metadata refresh).
        diverging_epoch: ``DivergingEpoch`` (Fetch v12+): the leader's log diverges from the local
            one after ``end_offset`` of ``epoch`` (the caller truncates before fetching again);
            None when the leader found no divergence.
        current_leader_epoch: the ``CurrentLeaderEpoch`` the request carried (-1: none); a batch
            stamped with a higher epoch must not be appended (KAFKA-18723).
        last_fetched_epoch: the ``LastFetchedEpoch`` the request carried (-1: none).
    """

    partition: int
    fetch_offset: int
    records: bytes
    high_watermark: int
    last_stable_offset: int
    log_start_offset: int
    error: int = 0
    diverging_epoch: EpochEndOffset | None = None
    current_leader_epoch: int = -1
    last_fetched_epoch: int = -1


class ReplicaFetcher:
    """Fetch one topic's raw record batches from the partition leaders (module docstring).

    Usage::

        with ReplicaFetcher("127.0.0.1:9092", "orders", options) as fetcher:
            fetcher.expect_topic_id(local_topic_id)  # else the first id seen is kept
            for part in fetcher.fetch({0: FetchPosition(0), 1: FetchPosition(0)}, max_wait_ms=500):
                ...  # part.records: v2 batches exactly as the leader stores them

    :meth:`send` / :meth:`receive` split a fetch so the next request is in flight while the caller
    appends the previous response (the network I/O runs on kafka-python's own thread). The first
    request asks :data:`RAMP_START_PARTITION_BYTES` per partition and each next one twice as
    much, up to ``max.partition.fetch.bytes``: a cold start has batches to append within
    milliseconds instead of waiting for full responses.

    Raises (constructor):
        KafkaSourceError: the cluster cannot be bootstrapped within ``request_timeout_ms`` or the
            topic does not exist.
        ValueError: a client setting that cannot be translated (:func:`replica_client_config`).

    Attributes:
        topic_id: the topic's id in the cluster's metadata when the fetcher started (``uuid.UUID``;
            None for a cluster whose metadata has no ids, before Kafka 2.8).
    """

    def __init__(self, bootstrap_servers: str, topic: str, options: KafkaSourceOptions | None = None) -> None:
        self.bootstrap_servers = bootstrap_servers
        self.topic = topic
        self.options = options or KafkaSourceOptions()
        settings = self.options.client_config
        self.fetch_max_bytes = int(settings.get("fetch.max.bytes", DEFAULT_FETCH_MAX_BYTES))
        self.partition_max_bytes = int(settings.get("max.partition.fetch.bytes", DEFAULT_PARTITION_FETCH_MAX_BYTES))
        # The first requests ask for less and double up to partition_max_bytes: the caller has its
        # first batches to append (and its apply thread to work on) before a full response arrives.
        self._ramp_bytes = min(RAMP_START_PARTITION_BYTES, self.partition_max_bytes)
        client_config = replica_client_config(self.options, bootstrap_servers)
        self._client_id = str(client_config["client_id"])
        self._direct = (DIRECT_FETCH_ON_PLAINTEXT
                        and str(client_config.get("security_protocol", "PLAINTEXT")).upper() == "PLAINTEXT")
        self._connections: dict[int, _FetchConnection] = {}
        # Connections dropped while the receive thread may still read them: shut down at once, their
        # descriptors released by that thread before its next job (or by close()). Releasing one
        # while a recv is about to start would let a new socket reuse the number and that recv read
        # another connection's bytes, or wait its whole timeout on an idle one.
        self._retired: list[_FetchConnection] = []
        self._connections_lock = threading.Lock()
        # Reads the direct connections' responses while the caller appends the previous one
        # (recv_into releases the GIL); one fetch at a time, so one thread.
        self._receiver = ThreadPoolExecutor(max_workers=1, thread_name_prefix="replica-fetch-receive")
        self._client = KafkaNetClient(**client_config)
        self._manager = self._client._manager
        # A metadata request must never create the topic (kafka-python asks for auto-creation by
        # default): a topic deleted while this runs would come back with broker defaults.
        self._manager.cluster.config["allow_auto_create_topics"] = False
        self._net = self._manager._net
        self._net.start()  # kafka-python's I/O thread: responses arrive while the caller appends
        self._pending: tuple[threading.Event, dict] | None = None
        self._unreachable_since: float | None = None
        self._leaderless: dict[int, str] = {}
        self._rotation = 0
        self.topic_id: uuid.UUID | None = None
        self._expected_topic_id: uuid.UUID | None = None
        self._woken = threading.Event()
        try:
            self._manager.bootstrap(self.options.request_timeout_ms)
            self._manager.cluster.set_topics([topic])
            self._refresh_metadata()
            if not self._manager.cluster.partitions_for_topic(topic):
                raise TopicNotFoundError(f"topic {topic!r} does not exist on {bootstrap_servers}")
            self.topic_id = self.topic_id_in_metadata()
            self._expected_topic_id = self.topic_id
        except kafka_errors.KafkaError as exc:
            self.close()
            unreachable = isinstance(exc, (kafka_errors.KafkaConnectionError, kafka_errors.KafkaTimeoutError,
                                           kafka_errors.NodeNotReadyError))
            kind = BrokerUnreachableError if unreachable else KafkaSourceError
            raise kind(f"cannot read metadata of topic {topic!r} from {bootstrap_servers}: {exc}") from exc
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Close the connections and stop the I/O thread. Idempotent."""
        client, self._client = self._client, None
        if client is None:
            return
        with self._connections_lock:
            connections, self._connections = list(self._connections.values()), {}
        for connection in connections:
            connection.shutdown()  # a receive blocked in recv_into fails at once
        self._receiver.shutdown(wait=True)
        for connection in connections:  # no thread reads them any more
            connection.close()
        self._close_retired()
        try:
            self._manager.close()
        finally:
            self._net.stop(timeout_ms=5_000)

    def __enter__(self) -> "ReplicaFetcher":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _refresh_metadata(self) -> None:
        self._manager.run(self._manager.cluster.refresh_metadata)

    def refresh_metadata(self) -> None:
        """Ask the cluster for the topic's metadata now (leaders, epochs, topic id) and wait for it.

        Raises:
            KafkaSourceError: the request fails (the cluster is unreachable).
        """
        try:
            self._refresh_metadata()
        except kafka_errors.KafkaError as exc:
            raise BrokerUnreachableError(f"cannot read metadata of topic {self.topic!r} from "
                                         f"{self.bootstrap_servers}: {exc}") from exc

    def topic_id_in_metadata(self) -> uuid.UUID | None:
        """The topic's id in the cached metadata; None when unknown (no id, or the all-zero id
        Kafka sends for a topic it does not know)."""
        found = self._manager.cluster.topic_id(self.topic)
        return None if found is None or found.int == 0 else found

    def expect_topic_id(self, topic_id: uuid.UUID | None) -> None:
        """Fetch only while the cluster's metadata names ``topic_id`` for the topic (the id the local
        copy holds); None: no check. :meth:`send` raises :class:`TopicIdChangedError` from the
        first metadata that names another id, or that lacks the topic."""
        self._expected_topic_id = topic_id

    def check_topic_id(self) -> None:
        """Compare the cached metadata with the expected topic id (:meth:`expect_topic_id`).

        Raises:
            TopicIdChangedError: the topic is gone from the metadata, or has another id.
        """
        expected = self._expected_topic_id
        if expected is None:
            return
        cluster = self._manager.cluster
        if not cluster.partitions_for_topic(self.topic):
            if self.topic in cluster.topics(exclude_internal_topics=False):
                return  # known, but without partitions right now: not a different topic
            raise TopicIdChangedError(self.topic, expected, None)
        found = self.topic_id_in_metadata()
        if found is not None and found != expected:
            raise TopicIdChangedError(self.topic, expected, found)

    def partitions(self) -> list[int]:
        """The topic's partitions in the cached metadata, sorted."""
        return sorted(self._manager.cluster.partitions_for_topic(self.topic) or ())

    def leader_epoch(self, partition: int) -> int:
        """The partition leader's epoch from the latest metadata (-1 unknown)."""
        epoch = self._manager.cluster.leader_epoch_for_partition(TopicPartition(self.topic, partition))
        return -1 if epoch is None else epoch

    def offsets_for_leader_epoch(self, epochs: Mapping[int, int]) -> dict[int, EpochEndOffset]:
        """Ask each partition's leader where epoch ``epochs[partition]`` ends (OffsetsForLeaderEpoch
        v2+, KIP-101/KIP-279, as a client: replica id -1; ``AbstractFetcherThread.truncateToEpochEndOffsets``).

        Returns:
            partition -> the leader's :class:`EpochEndOffset` (``endOffsetFor`` on its epoch cache:
            the largest epoch ``<=`` the one asked and where it ends; (-1, -1) when undefined).
            Partitions whose leader is unknown or answered a retriable error are left out (ask
            again after a metadata refresh).

        Raises:
            BrokerUnreachableError: no leader answered within the request timeout.
            KafkaSourceError: a non-retriable error (authorization: needs the topic's DESCRIBE).
        """
        cluster = self._manager.cluster
        by_node: dict[int, list] = {}
        for partition, epoch in sorted(epochs.items()):
            leader = cluster.leader_for_partition(TopicPartition(self.topic, partition))
            if leader is None or leader < 0:
                cluster.request_update()
                continue
            by_node.setdefault(leader, []).append(OffsetForLeaderEpochRequest.OffsetForLeaderTopic.OffsetForLeaderPartition(
                partition=partition, current_leader_epoch=self.leader_epoch(partition), leader_epoch=epoch))
        result: dict[int, EpochEndOffset] = {}
        for node, parts in by_node.items():
            request = OffsetForLeaderEpochRequest(
                replica_id=_CONSUMER_REPLICA_ID,
                topics=[OffsetForLeaderEpochRequest.OffsetForLeaderTopic(topic=self.topic, partitions=parts)],
                min_version=3)  # v3: replica id (a client's -1), what Kafka 4.x brokers accept from clients
            try:
                response = self._manager.run(self._manager.send, request, node)
            except kafka_errors.KafkaError as exc:
                if isinstance(exc, kafka_errors.KafkaConnectionError) or getattr(exc, "retriable", False):
                    raise BrokerUnreachableError(f"OffsetsForLeaderEpoch to node {node} failed: {exc}") from exc
                raise KafkaSourceError(f"OffsetsForLeaderEpoch for {self.topic} failed: {exc}") from exc
            for topic in response.topics:
                for part in topic.partitions:
                    if part.error_code:
                        error = kafka_errors.for_code(part.error_code)
                        if not getattr(error, "retriable", False) and part.error_code not in _REFRESH_METADATA:
                            raise KafkaSourceError(f"OffsetsForLeaderEpoch for {self.topic}-{part.partition}: "
                                                   f"{error.__name__} (error code {part.error_code})")
                        cluster.request_update()
                        continue
                    result[part.partition] = EpochEndOffset(part.leader_epoch, part.end_offset)
        return result

    def watermarks(self, partitions: Iterable[int], *, wait_for_leader: bool = True) -> dict[int, tuple[int, int]]:
        """``partition -> (low, high)`` as the leaders report them now: the log start offset and
        the latest offset for ``options.isolation_level`` (the high watermark, or the last stable
        offset under ``read_committed``), what a consumer's ``get_watermark_offsets`` answers.

        One ListOffsets request (v2+; ``EARLIEST`` then ``LATEST``, Kafka ``ListOffsetsRequest``)
        per leader and kind for all the partitions at once, with each partition's current leader
        epoch (KIP-320: a stale leader answers ``FENCED_LEADER_EPOCH`` rather than old offsets). A
        partition whose leader is unknown or moved is asked again after a metadata refresh every
        100 ms up to ``request_timeout_ms``, as the Java consumer's ``endOffsets`` retries an
        ``InvalidMetadataException``; ``wait_for_leader=False`` asks once.

        Raises:
            LeaderNotAvailableError: a partition had no answering leader in time (at once with
                ``wait_for_leader=False``); its message names the partitions.
            TopicNotFoundError: the topic is not in the metadata.
            BrokerUnreachableError: a leader did not answer within the request timeout.
            KafkaSourceError: a non-retriable error (authorization: needs the topic's DESCRIBE).
        """
        wanted = sorted(set(partitions))
        deadline = time.monotonic() + self.options.request_timeout_ms / 1000.0
        isolation = _READ_COMMITTED if self.options.isolation_level == "read_committed" else _READ_UNCOMMITTED
        found: dict[int, tuple[int, int]] = {}
        while True:
            pending = [p for p in wanted if p not in found]
            if not pending:
                return {p: found[p] for p in wanted}
            retry = self._list_offsets(pending, isolation, found)
            if not retry:
                continue
            if not wait_for_leader or time.monotonic() + _LEADER_RETRY_S > deadline:
                raise LeaderNotAvailableError(f"no leader answered ListOffsets for {self.topic} partitions "
                                              f"{sorted(retry)} on {self.bootstrap_servers}")
            time.sleep(_LEADER_RETRY_S)
            self.refresh_metadata()
            if not self._manager.cluster.partitions_for_topic(self.topic) \
                    and self.topic not in self._manager.cluster.topics(exclude_internal_topics=False):
                raise TopicNotFoundError(f"topic {self.topic!r} does not exist on {self.bootstrap_servers}")

    def _list_offsets(self, partitions: list[int], isolation: int, found: dict[int, tuple[int, int]]) -> set[int]:
        """Ask the leaders of ``partitions`` for their earliest and latest offsets into ``found``
        (partition -> (low, high), set once both are answered); returns the partitions to ask again."""
        cluster = self._manager.cluster
        retry: set[int] = set()
        by_node: dict[int, list[int]] = {}
        for partition in partitions:
            leader = cluster.leader_for_partition(TopicPartition(self.topic, partition))
            if leader is None or leader < 0:
                retry.add(partition)
            else:
                by_node.setdefault(leader, []).append(partition)
        for node, parts in by_node.items():
            answers: dict[int, list[int]] = {p: [-1, -1] for p in parts}
            for which, timestamp in ((0, _EARLIEST_TIMESTAMP), (1, _LATEST_TIMESTAMP)):
                request = ListOffsetsRequest(
                    replica_id=_CONSUMER_REPLICA_ID, isolation_level=isolation,
                    topics=[ListOffsetsRequest.ListOffsetsTopic(name=self.topic, partitions=[
                        ListOffsetsRequest.ListOffsetsTopic.ListOffsetsPartition(
                            partition_index=p, current_leader_epoch=self.leader_epoch(p), timestamp=timestamp)
                        for p in parts])],
                    min_version=2)
                try:
                    response = self._manager.run(self._manager.send, request, node)
                except kafka_errors.KafkaError as exc:
                    if isinstance(exc, kafka_errors.KafkaConnectionError) or getattr(exc, "retriable", False):
                        raise BrokerUnreachableError(f"cannot read watermarks of {self.topic} from node {node} "
                                                     f"({self.bootstrap_servers}): {exc}") from exc
                    raise KafkaSourceError(f"cannot read watermarks of {self.topic}: {exc}") from exc
                for topic in response.topics:
                    for part in topic.partitions:
                        if part.partition_index not in answers:
                            continue
                        code = part.error_code
                        if code:
                            error = kafka_errors.for_code(code)
                            if code in _REFRESH_METADATA or getattr(error, "retriable", False):
                                retry.add(part.partition_index)
                                continue
                            raise KafkaSourceError(f"cannot read watermarks of {self.topic}-{part.partition_index}: "
                                                   f"{error.__name__} (error code {code})")
                        answers[part.partition_index][which] = part.offset
            for partition, (low, high) in answers.items():
                if partition not in retry and low >= 0 and high >= 0:
                    found[partition] = (low, high)
                else:
                    retry.add(partition)
        if retry:
            cluster.request_update()
        return retry

    def supports_diverging_epoch(self) -> bool:
        """True when the Fetch version this cluster speaks carries ``LastFetchedEpoch`` (v12+)."""
        probe = FetchRequest(replica_id=_CONSUMER_REPLICA_ID, max_wait_ms=0, min_bytes=1, topics=[],
                             min_version=_MIN_FETCH_VERSION, max_version=_MAX_FETCH_VERSION)
        return self._manager.broker_version_data.api_version(probe) >= _DIVERGING_EPOCH_VERSION

    def _requests(self, positions: Mapping[int, FetchPosition], max_wait_ms: int,
                  epochs: dict[int, int]) -> dict[int, FetchRequest]:
        """One FetchRequest per leader node; partitions without a known leader are left out.
        ``epochs`` receives each partition's ``CurrentLeaderEpoch`` as sent."""
        cluster = self._manager.cluster
        by_node: dict[int, list] = {}
        order = sorted(positions)
        if order:  # rotate: only the first partition with data is sure to get a batch above its size limit
            self._rotation = (self._rotation + 1) % len(order)
            order = order[self._rotation:] + order[:self._rotation]
        missing = False
        for partition in order:
            leader = cluster.leader_for_partition(TopicPartition(self.topic, partition))
            if leader is None or leader < 0:
                missing = True
                continue
            position = positions[partition]
            epochs[partition] = self.leader_epoch(partition)
            by_node.setdefault(leader, []).append(FetchRequest.FetchTopic.FetchPartition(
                partition=partition, current_leader_epoch=epochs[partition],
                fetch_offset=position.offset, last_fetched_epoch=position.last_fetched_epoch, log_start_offset=-1,
                partition_max_bytes=self._ramp_bytes))
        self._ramp_bytes = min(2 * self._ramp_bytes, self.partition_max_bytes)
        if missing:
            cluster.request_update()
        topic_id = self.topic_id_in_metadata()
        # By id (v13+, KIP-516) when the cluster has ids: a re-created topic is then an error, not data.
        max_version = _MAX_FETCH_VERSION if topic_id is not None else _MAX_FETCH_VERSION_BY_NAME
        return {node: FetchRequest(
            replica_id=_CONSUMER_REPLICA_ID, max_wait_ms=max_wait_ms, min_bytes=1, max_bytes=self.fetch_max_bytes,
            isolation_level=_READ_UNCOMMITTED, session_id=0, session_epoch=-1,
            topics=[FetchRequest.FetchTopic(topic=self.topic, topic_id=topic_id or uuid.UUID(int=0),
                                            partitions=parts)],
            forgotten_topics_data=[], rack_id="", min_version=_MIN_FETCH_VERSION, max_version=max_version)
            for node, parts in by_node.items()}

    def send(self, positions: Mapping[int, FetchPosition | int], max_wait_ms: int) -> None:
        """Send Fetch requests for ``positions`` (partition -> :class:`FetchPosition`, or a bare fetch
        offset without a last fetched epoch) without waiting.

        The broker holds each request up to ``max_wait_ms`` (ms) when it has nothing new.
        At most one fetch is outstanding (:attr:`in_flight`): :meth:`receive` or :meth:`abandon`
        must come before the next ``send``.

        Raises:
            TopicIdChangedError: the cached metadata lacks the topic or names another id than the
                expected one (:meth:`expect_topic_id`); nothing is sent.
            RuntimeError: a fetch is in flight already (a caller's bug).
        """
        if self._pending is not None:
            raise RuntimeError("a fetch is already in flight: call receive() or abandon() first")
        self.check_topic_id()
        wanted = {p: pos if isinstance(pos, FetchPosition) else FetchPosition(pos) for p, pos in positions.items()}
        epochs: dict[int, int] = {}
        requests = self._requests(wanted, max_wait_ms, epochs)
        done = threading.Event()
        state: dict = {"positions": wanted, "epochs": epochs, "responses": {}, "errors": {},
                       "sent_at": time.monotonic(),
                       "by_node": {node: [part.partition for part in request.topics[0].partitions]
                                   for node, request in requests.items()}}
        if wanted and not requests:
            # No partition has a known leader: a broker that shut down left none in the metadata, and a
            # refresh that cannot reach the cluster keeps it so. Nothing is fetched, which counts toward
            # broker_timeout_ms as a failed request does (else an outage would never be reported).
            state["errors"][-1] = kafka_errors.KafkaConnectionError(
                f"no leader known for any partition of {self.topic} (the metadata cannot be refreshed)")
        if self._direct:
            self._send_direct(requests, max_wait_ms, state)
            self._pending = (done, state)
            return

        async def gather():
            futures = {node: self._manager.send(request, node_id=node) for node, request in requests.items()}
            for node, future in futures.items():
                try:
                    state["responses"][node] = await future
                except Exception as exc:  # noqa: BLE001 - a node's failure is reported per node
                    state["errors"][node] = exc

        if not requests:
            done.set()
        else:
            self._manager.call_soon(gather).add_both(lambda _: done.set())
        self._pending = (done, state)

    def receive(self, timeout_s: float | None = None) -> list[PartitionData]:
        """Wait for the fetch :meth:`send` started; return its partitions' data.

        ``timeout_s`` defaults to the request timeout plus the fetch's wait.

        Raises:
            BrokerUnreachableError: no leader has answered for ``broker_timeout_ms``.
            KafkaSourceError: a non-retriable error (authorization, unsupported version...).
        """
        if self._pending is None:
            raise RuntimeError("no fetch in flight: call send() first")
        waiting_since = time.monotonic()
        (done, state), self._pending = self._pending, None
        wait_s = timeout_s if timeout_s is not None else self.options.request_timeout_ms / 1000.0 + 5.0
        finished = state["receiving"] if "sent" in state else done
        if not self._wait(finished, wait_s):
            self._drop_connections(state)  # a late answer on them must not be read as the next one's
            if self._woken.is_set():  # stop(): give up this fetch
                self._woken.clear()
                return []
            state["errors"][-1] = kafka_errors.KafkaTimeoutError(f"no Fetch response within {wait_s:.0f} s")
        result: list[PartitionData] = []
        for response in list(state["responses"].values()):
            for topic in response.responses:
                for part in topic.partitions:
                    result.append(self._partition_data(part, state))
        self._note_leaderless(state, result)
        if state["errors"]:
            # unanswered since it was sent, or since this wait began when the caller's own work
            # (an append, a store rewind) came in between
            self._note_unreachable(state["errors"], max(state["sent_at"], waiting_since))
        elif state["responses"]:
            self._unreachable_since = None
        if not state["responses"] and state["positions"]:
            time.sleep(0.05)  # no leader known yet or connection backoff: do not spin
        return result

    @property
    def in_flight(self) -> bool:
        """True between :meth:`send` and the :meth:`receive` (or :meth:`abandon`) that takes its fetch:
        the one owner of that state (a caller keeping its own copy can disagree with it after an
        error between the two, and the next :meth:`send` would then raise)."""
        return self._pending is not None

    def abandon(self) -> bool:
        """Give up the fetch in flight, if any, without waiting for it: its connections are dropped
        (a response still coming on one must not be read as the answer to the next request; the
        next :meth:`send` opens new ones), so the next :meth:`send` starts afresh. For a caller that
        failed between :meth:`send` and :meth:`receive` (the cluster went away while it appended
        the previous response). Returns True when a fetch was in flight."""
        pending, self._pending = self._pending, None
        if pending is None:
            return False
        self._drop_connections(pending[1])
        return True

    @property
    def unreachable_since(self) -> float | None:
        """Since when (``time.monotonic()`` seconds) the fetches have failed to reach a leader (a
        connection refused or dropped, a timeout, no leader known for any partition); None while
        the last one got every answer."""
        return self._unreachable_since

    def leaderless(self) -> dict[int, str]:
        """Partitions the last fetch could not ask a leader for, each with why: no leader in the
        metadata (a new partition, a leader whose broker is down with no in-sync replica left), a
        leader that did not answer (connection refused or dropped, timeout), or one that answered it
        leads no longer (``NOT_LEADER_OR_FOLLOWER`` and its kind; asked again after a metadata
        refresh). Empty when every partition was answered. Thread-safe (replaced, never mutated)."""
        return self._leaderless

    def _note_leaderless(self, state: dict, result: list[PartitionData]) -> None:
        """Record :meth:`leaderless` for the fetch ``state`` whose answers are ``result``."""
        answered = {part.partition: part.error for part in result}
        failed_nodes = {node: exc for node, exc in state["errors"].items() if node >= 0}
        whole = state["errors"].get(-1)
        leaderless: dict[int, str] = {}
        for partition in state["positions"]:
            code = answered.get(partition)
            if code is not None:
                if code in _REFRESH_METADATA:
                    leaderless[partition] = (f"its leader answered {kafka_errors.for_code(code).__name__}; "
                                             "looking the leader up again")
                continue
            if partition not in state["epochs"]:
                leaderless[partition] = "no leader in the cluster's metadata"
                continue
            node = next((n for n, parts in state["by_node"].items() if partition in parts), -1)
            cause = failed_nodes.get(node, whole)
            if cause is not None:
                leaderless[partition] = f"its leader, broker {node}, does not answer ({cause})"
        self._leaderless = leaderless

    def _drop_connections(self, state: dict) -> None:
        """Drop the direct connections a fetch's requests went out on (:meth:`_drop_connection`)."""
        for node, connection in list(state.get("sent", {}).items()):
            self._drop_connection(node, connection)

    def wakeup(self) -> None:
        """Make a :meth:`receive` waiting in another thread (or the next one) return ``[]`` at once,
        dropping the connections of that fetch (a stop must not wait for a broker that does not
        answer). Thread- and signal-safe."""
        self._woken.set()

    def _wait(self, finished, wait_s: float) -> bool:
        """Wait for ``finished`` (an Event or a Future) up to ``wait_s`` seconds in short slices;
        False on timeout or :meth:`wakeup`."""
        deadline = time.monotonic() + wait_s
        while True:
            remaining = deadline - time.monotonic()
            if self._woken.is_set() or remaining <= 0:
                return False
            if isinstance(finished, threading.Event):
                if finished.wait(min(remaining, 0.1)):
                    return True
            else:
                try:
                    finished.result(timeout=min(remaining, 0.1))  # the job records its own failures
                    return True
                except FutureTimeout:
                    continue

    def _send_direct(self, requests: Mapping[int, FetchRequest], max_wait_ms: int, state: dict) -> None:
        """Send each node's request over its :class:`_FetchConnection` (opened on first use)."""
        state["sent"] = {}
        timeout_s = (self.options.request_timeout_ms + max_wait_ms) / 1000.0
        for node, request in requests.items():
            try:
                connection = self._connections.get(node)
                if connection is None:
                    broker = self._manager.cluster.broker_metadata(node)
                    if broker is None:
                        raise kafka_errors.KafkaConnectionError(f"node {node} is not in the metadata")
                    connection = _FetchConnection(broker.host, broker.port, self._client_id, timeout_s)
                    with self._connections_lock:
                        self._connections[node] = connection
                version = self._manager.broker_version_data.api_version(request)
                connection.send(request, version)
                state["sent"][node] = connection
            except kafka_errors.KafkaError as exc:
                self._drop_connection(node)
                state["errors"][node] = exc
        state["receiving"] = self._receiver.submit(self._receive_direct, state)

    def _receive_direct(self, state: dict) -> None:
        self._close_retired()  # this thread's previous job is over: nothing reads them
        for node, connection in state["sent"].items():
            try:
                state["responses"][node] = connection.receive()
            except (kafka_errors.KafkaError, ValueError, OSError) as exc:
                self._drop_connection(node, connection)
                state["errors"][node] = exc

    def _drop_connection(self, node: int, connection: _FetchConnection | None = None) -> None:
        """Stop using ``node``'s connection (``connection``, if given, only when it is still the
        one in use: a connection opened since then is kept). It is shut down now and its descriptor
        released later (``_retired``)."""
        with self._connections_lock:
            current = self._connections.get(node)
            if current is None or (connection is not None and current is not connection):
                return
            del self._connections[node]
            self._retired.append(current)
        current.shutdown()

    def _close_retired(self) -> None:
        with self._connections_lock:
            retired, self._retired = self._retired, []
        for connection in retired:
            connection.close()

    def fetch(self, positions: Mapping[int, FetchPosition | int], max_wait_ms: int) -> list[PartitionData]:
        """:meth:`send` then :meth:`receive` (same errors)."""
        self.send(positions, max_wait_ms)
        return self.receive()

    def _partition_data(self, part, state: dict) -> PartitionData:
        code = part.error_code
        partition = part.partition_index
        position = state["positions"].get(partition, FetchPosition(-1))
        if code and code != OFFSET_OUT_OF_RANGE:
            error = kafka_errors.for_code(code)
            if code in _REFRESH_METADATA:
                logger.info("fetch %s-%d: %s; refreshing the leader", self.topic, partition, error.__name__)
                self._manager.cluster.request_update()
            elif not getattr(error, "retriable", False):
                hint = (" (the replica fetch path needs the topic's READ permission, as a consumer does)"
                        if "Authorization" in error.__name__ else "")
                raise KafkaSourceError(f"cannot fetch {self.topic}-{partition}: {error.__name__} "
                                       f"(error code {code}){hint}")
            else:
                logger.warning("fetch %s-%d: %s (retrying)", self.topic, partition, error.__name__)
        diverging = getattr(part, "diverging_epoch", None)
        diverging_epoch = None
        if not code and diverging is not None and diverging.epoch >= 0:  # Kafka FetchResponse.isDivergingEpoch
            diverging_epoch = EpochEndOffset(diverging.epoch, diverging.end_offset)
        records = part.records if not code and diverging_epoch is None and part.records else b""
        return PartitionData(partition, position.offset, records, part.high_watermark,
                             part.last_stable_offset, part.log_start_offset, code, diverging_epoch,
                             state["epochs"].get(partition, -1), position.last_fetched_epoch)

    def _note_unreachable(self, errors: Mapping[int, BaseException], sent_at: float) -> None:
        """A fetch sent at ``sent_at`` (monotonic seconds) failed: the cluster has not answered since
        then (a broker that accepts connections but never answers, a stopped JVM, fails only when
        the request times out, so the outage is counted from the request, not from its timeout).

        Raises:
            KafkaSourceError: a non-retriable error.
            BrokerUnreachableError: no answer for ``broker_timeout_ms``.
        """
        for exc in errors.values():
            if isinstance(exc, kafka_errors.KafkaError) and not getattr(exc, "retriable", True) \
                    and not isinstance(exc, (kafka_errors.KafkaConnectionError, kafka_errors.NodeNotReadyError)):
                raise KafkaSourceError(f"cannot fetch from topic {self.topic!r}: {exc}") from exc
        self._manager.cluster.request_update()
        now = time.monotonic()
        if self._unreachable_since is None:
            self._unreachable_since = min(now, sent_at)
        elapsed_ms = (now - self._unreachable_since) * 1000.0
        if elapsed_ms >= self.options.broker_timeout_ms:
            raise BrokerUnreachableError(
                f"Kafka cluster {self.bootstrap_servers} unreachable for {elapsed_ms / 1000.0:.0f} s (broker timeout "
                f"{self.options.broker_timeout_ms} ms): {'; '.join(str(e) for e in errors.values())}")
        logger.debug("fetch from %s failed (%s); retrying", self.bootstrap_servers, errors)

