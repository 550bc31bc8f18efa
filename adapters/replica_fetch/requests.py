"""The requests the replica fetcher sends, built from kafka-python's protocol classes (``kafka.protocol``):
Fetch (as a consumer: ``replica_id=-1``), ListOffsets and OffsetsForLeaderEpoch, and the versions it
asks for.

Fetch v4 added isolation levels and the last stable offset; v12 ``LastFetchedEpoch`` /
``DivergingEpoch`` (KIP-595); v13 names topics by id only (KIP-516). Kafka 4.0 dropped v0-v3
(KIP-896). v14+ add nothing a client fetch needs.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence

from kafka.protocol.consumer import FetchRequest, ListOffsetsRequest, OffsetForLeaderEpochRequest

__all__ = ["CONSUMER_REPLICA_ID", "DIVERGING_EPOCH_VERSION", "EARLIEST_TIMESTAMP", "LATEST_TIMESTAMP",
           "MAX_FETCH_VERSION", "MAX_FETCH_VERSION_BY_NAME", "MIN_FETCH_VERSION", "READ_COMMITTED",
           "READ_UNCOMMITTED", "fetch_partition", "fetch_request", "fetch_version_probe", "list_offsets_request",
           "offset_for_leader_epoch_partition", "offset_for_leader_epoch_request"]

MIN_FETCH_VERSION = 4
MAX_FETCH_VERSION = 13
MAX_FETCH_VERSION_BY_NAME = 12  # when the cluster reports no topic id (metadata before v10)
DIVERGING_EPOCH_VERSION = 12
READ_UNCOMMITTED = 0
READ_COMMITTED = 1
# ListOffsets timestamps asking for the log start offset and the latest offset (Kafka ListOffsetsRequest).
EARLIEST_TIMESTAMP = -2
LATEST_TIMESTAMP = -1
CONSUMER_REPLICA_ID = -1  # a client's fetch: needs only the topic's READ ACL, reads up to the high watermark


def fetch_partition(partition: int, current_leader_epoch: int, fetch_offset: int, last_fetched_epoch: int,
                    partition_max_bytes: int) -> FetchRequest.FetchTopic.FetchPartition:
    """One partition of a Fetch request (Kafka ``FetchRequestData.FetchPartition``): from
    ``fetch_offset``, with ``CurrentLeaderEpoch`` and ``LastFetchedEpoch`` (-1: unknown), at most
    ``partition_max_bytes`` bytes."""
    return FetchRequest.FetchTopic.FetchPartition(
        partition=partition, current_leader_epoch=current_leader_epoch, fetch_offset=fetch_offset,
        last_fetched_epoch=last_fetched_epoch, log_start_offset=-1, partition_max_bytes=partition_max_bytes)


def fetch_request(topic: str, topic_id: uuid.UUID | None, partitions: Sequence[FetchRequest.FetchTopic.FetchPartition],
                  max_wait_ms: int, max_bytes: int) -> FetchRequest:
    """A sessionless ``READ_UNCOMMITTED`` Fetch request of ``partitions`` of ``topic``: by id (v13+,
    KIP-516) when the cluster has ids (a re-created topic is then an error, not data), else by name
    (up to v12). The broker holds it up to ``max_wait_ms`` (ms) when it has nothing new; the
    response carries at most ``max_bytes`` bytes."""
    max_version = MAX_FETCH_VERSION if topic_id is not None else MAX_FETCH_VERSION_BY_NAME
    return FetchRequest(
        replica_id=CONSUMER_REPLICA_ID, max_wait_ms=max_wait_ms, min_bytes=1, max_bytes=max_bytes,
        isolation_level=READ_UNCOMMITTED, session_id=0, session_epoch=-1,
        topics=[FetchRequest.FetchTopic(topic=topic, topic_id=topic_id or uuid.UUID(int=0), partitions=partitions)],
        forgotten_topics_data=[], rack_id="", min_version=MIN_FETCH_VERSION, max_version=max_version)


def fetch_version_probe() -> FetchRequest:
    """An empty Fetch request spanning the versions this fetcher speaks: the version a cluster would
    answer it with is the one its fetches use."""
    return FetchRequest(replica_id=CONSUMER_REPLICA_ID, max_wait_ms=0, min_bytes=1, topics=[],
                        min_version=MIN_FETCH_VERSION, max_version=MAX_FETCH_VERSION)


def list_offsets_request(topic: str, isolation_level: int, timestamp: int,
                         leader_epochs: Mapping[int, int]) -> ListOffsetsRequest:
    """A ListOffsets request (v2+, Kafka ``ListOffsetsRequest``) asking for ``timestamp``
    (:data:`EARLIEST_TIMESTAMP` or :data:`LATEST_TIMESTAMP`) of each partition of ``leader_epochs``
    (partition -> its current leader epoch, KIP-320: a stale leader answers ``FENCED_LEADER_EPOCH``)."""
    return ListOffsetsRequest(
        replica_id=CONSUMER_REPLICA_ID, isolation_level=isolation_level,
        topics=[ListOffsetsRequest.ListOffsetsTopic(name=topic, partitions=[
            ListOffsetsRequest.ListOffsetsTopic.ListOffsetsPartition(
                partition_index=partition, current_leader_epoch=epoch, timestamp=timestamp)
            for partition, epoch in leader_epochs.items()])],
        min_version=2)


def offset_for_leader_epoch_partition(partition: int, current_leader_epoch: int, leader_epoch: int):
    """One partition of an OffsetsForLeaderEpoch request: where does ``leader_epoch`` end?"""
    return OffsetForLeaderEpochRequest.OffsetForLeaderTopic.OffsetForLeaderPartition(
        partition=partition, current_leader_epoch=current_leader_epoch, leader_epoch=leader_epoch)


def offset_for_leader_epoch_request(topic: str, partitions: Sequence) -> OffsetForLeaderEpochRequest:
    """An OffsetsForLeaderEpoch request (v3+: replica id, a client's -1, what Kafka 4.x brokers
    accept from clients; KIP-101/KIP-279) of ``partitions`` (:func:`offset_for_leader_epoch_partition`)."""
    return OffsetForLeaderEpochRequest(
        replica_id=CONSUMER_REPLICA_ID,
        topics=[OffsetForLeaderEpochRequest.OffsetForLeaderTopic(topic=topic, partitions=list(partitions))],
        min_version=3)
