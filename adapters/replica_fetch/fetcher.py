""":class:`ReplicaFetcher`: one topic's Fetch requests to the partition leaders, their responses
returned as the leader's bytes (the package docstring tells why and how).

It owns the fetch in flight (:meth:`ReplicaFetcher.send` / :meth:`ReplicaFetcher.receive`), the
cluster metadata it fetches by (kafka-python's connection manager: bootstrap, leaders, leader
epochs, topic id, every SASL/SSL connection) and what the last fetches tell about the cluster (the
partitions without an answering leader, since when no leader answers). Requests are built by
:mod:`.requests`, responses parsed by :mod:`.responses`; on PLAINTEXT listeners Fetch goes over
:mod:`.connection`'s own sockets.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Iterable, Mapping
from concurrent.futures import TimeoutError as FutureTimeout
from functools import partial

import kafka.errors as kafka_errors
from kafka.net.compat import KafkaNetClient
from kafka.protocol.consumer import FetchRequest
from kafka.structs import TopicPartition

from ..errors import (
    BrokerUnreachableError,
    KafkaSourceError,
    LeaderNotAvailableError,
    TopicIdChangedError,
    TopicNotFoundError,
)
from ..kafka_source import KafkaSourceOptions
from . import requests
from .client_config import DEFAULT_FETCH_MAX_BYTES, DEFAULT_PARTITION_FETCH_MAX_BYTES, replica_client_config
from .connection import DirectConnections
from .responses import (
    REFRESH_METADATA,
    EpochEndOffset,
    FetchPosition,
    PartitionData,
    epoch_end_offsets,
    list_offsets_answers,
    partition_data,
)

__all__ = ["DIRECT_FETCH_ON_PLAINTEXT", "RAMP_START_PARTITION_BYTES", "ReplicaFetcher"]

logger = logging.getLogger(__name__)

#: ``max.partition.fetch.bytes`` of the first request, bytes; doubled per request up to the configured one.
RAMP_START_PARTITION_BYTES = 1024 * 1024
#: How long watermarks() waits between asks while a partition has no answering leader, seconds.
_LEADER_RETRY_S = 0.1

#: Fetch over :class:`~.connection.DirectConnections` on PLAINTEXT listeners (False: always through
#: kafka-python's managed connections, as on SASL/SSL listeners; the tests run both).
DIRECT_FETCH_ON_PLAINTEXT = True


class ReplicaFetcher:
    """Fetch one topic's raw record batches from the partition leaders (package docstring).

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
        self._connections = DirectConnections(self._client_id)  # used when _direct
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
        self._connections.close()  # a receive blocked in recv_into fails at once
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
            by_node.setdefault(leader, []).append(
                requests.offset_for_leader_epoch_partition(partition, self.leader_epoch(partition), epoch))
        result: dict[int, EpochEndOffset] = {}
        for node, parts in by_node.items():
            request = requests.offset_for_leader_epoch_request(self.topic, parts)
            try:
                response = self._manager.run(self._manager.send, request, node)
            except kafka_errors.KafkaError as exc:
                if isinstance(exc, kafka_errors.KafkaConnectionError) or getattr(exc, "retriable", False):
                    raise BrokerUnreachableError(f"OffsetsForLeaderEpoch to node {node} failed: {exc}") from exc
                raise KafkaSourceError(f"OffsetsForLeaderEpoch for {self.topic} failed: {exc}") from exc
            answered, retry = epoch_end_offsets(self.topic, response)
            result.update(answered)
            if retry:
                cluster.request_update()
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
        isolation = (requests.READ_COMMITTED if self.options.isolation_level == "read_committed"
                     else requests.READ_UNCOMMITTED)
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
            for which, timestamp in ((0, requests.EARLIEST_TIMESTAMP), (1, requests.LATEST_TIMESTAMP)):
                request = requests.list_offsets_request(self.topic, isolation, timestamp,
                                                        {p: self.leader_epoch(p) for p in parts})
                try:
                    response = self._manager.run(self._manager.send, request, node)
                except kafka_errors.KafkaError as exc:
                    if isinstance(exc, kafka_errors.KafkaConnectionError) or getattr(exc, "retriable", False):
                        raise BrokerUnreachableError(f"cannot read watermarks of {self.topic} from node {node} "
                                                     f"({self.bootstrap_servers}): {exc}") from exc
                    raise KafkaSourceError(f"cannot read watermarks of {self.topic}: {exc}") from exc
                retry |= list_offsets_answers(self.topic, response, answers, which)
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
        probe = requests.fetch_version_probe()
        return self._manager.broker_version_data.api_version(probe) >= requests.DIVERGING_EPOCH_VERSION

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
            by_node.setdefault(leader, []).append(requests.fetch_partition(
                partition, epochs[partition], position.offset, position.last_fetched_epoch, self._ramp_bytes))
        self._ramp_bytes = min(2 * self._ramp_bytes, self.partition_max_bytes)
        if missing:
            cluster.request_update()
        topic_id = self.topic_id_in_metadata()  # by id when the cluster has ids (requests.fetch_request)
        return {node: requests.fetch_request(self.topic, topic_id, parts, max_wait_ms, self.fetch_max_bytes)
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
        fetches = self._requests(wanted, max_wait_ms, epochs)
        done = threading.Event()
        state: dict = {"positions": wanted, "epochs": epochs, "responses": {}, "errors": {},
                       "sent_at": time.monotonic(),
                       "by_node": {node: [part.partition for part in request.topics[0].partitions]
                                   for node, request in fetches.items()}}
        if wanted and not fetches:
            # No partition has a known leader: a broker that shut down left none in the metadata, and a
            # refresh that cannot reach the cluster keeps it so. Nothing is fetched, which counts toward
            # broker_timeout_ms as a failed request does (else an outage would never be reported).
            state["errors"][-1] = kafka_errors.KafkaConnectionError(
                f"no leader known for any partition of {self.topic} (the metadata cannot be refreshed)")
        if self._direct:
            self._send_direct(fetches, max_wait_ms, state)
            self._pending = (done, state)
            return

        async def gather():
            futures = {node: self._manager.send(request, node_id=node) for node, request in fetches.items()}
            for node, future in futures.items():
                try:
                    state["responses"][node] = await future
                except Exception as exc:  # noqa: BLE001 - a node's failure is reported per node
                    state["errors"][node] = exc

        if not fetches:
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
                if code in REFRESH_METADATA:
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
        """Drop the direct connections a fetch's requests went out on (``DirectConnections.drop``)."""
        for node, connection in list(state.get("sent", {}).items()):
            self._connections.drop(node, connection)

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

    def _send_direct(self, fetches: Mapping[int, FetchRequest], max_wait_ms: int, state: dict) -> None:
        """Send each node's request over its own connection (:class:`~.connection.DirectConnections`,
        opened on first use); their responses are read on the receiver thread."""
        state["sent"] = {}
        timeout_s = (self.options.request_timeout_ms + max_wait_ms) / 1000.0
        for node, request in fetches.items():
            try:
                connection = self._connections.connection(node, partial(self._broker_address, node), timeout_s)
                version = self._manager.broker_version_data.api_version(request)
                connection.send(request, version)
                state["sent"][node] = connection
            except kafka_errors.KafkaError as exc:
                self._connections.drop(node)
                state["errors"][node] = exc
        state["receiving"] = self._connections.receive_all(state["sent"], state["responses"], state["errors"])

    def _broker_address(self, node: int) -> tuple[str, int]:
        """(host, port) of broker ``node`` in the cached metadata.

        Raises:
            KafkaConnectionError: the node is not in the metadata.
        """
        broker = self._manager.cluster.broker_metadata(node)
        if broker is None:
            raise kafka_errors.KafkaConnectionError(f"node {node} is not in the metadata")
        return broker.host, broker.port

    def fetch(self, positions: Mapping[int, FetchPosition | int], max_wait_ms: int) -> list[PartitionData]:
        """:meth:`send` then :meth:`receive` (same errors)."""
        self.send(positions, max_wait_ms)
        return self.receive()

    def _partition_data(self, part, state: dict) -> PartitionData:
        """One partition of a response to the fetch ``state`` (:func:`~.responses.partition_data`);
        a leader-change code asks for new metadata."""
        partition = part.partition_index
        data = partition_data(self.topic, part, state["positions"].get(partition, FetchPosition(-1)),
                              state["epochs"].get(partition, -1))
        if data.error in REFRESH_METADATA:
            self._manager.cluster.request_update()
        return data

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

