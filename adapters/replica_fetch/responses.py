"""What the replica fetcher's requests answer, parsed from kafka-python's decoded responses: each
partition of a Fetch response as :class:`PartitionData` (:func:`partition_data`), the ends of leader
epochs (:func:`epoch_end_offsets`) and ListOffsets answers (:func:`list_offsets_answers`); and the
error codes after which the leader is looked up again (:data:`REFRESH_METADATA`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import NamedTuple

import kafka.errors as kafka_errors

from ..errors import KafkaSourceError

__all__ = ["EpochEndOffset", "FetchPosition", "OFFSET_OUT_OF_RANGE", "PartitionData", "REFRESH_METADATA",
           "epoch_end_offsets", "list_offsets_answers", "partition_data"]

logger = logging.getLogger(__name__)

#: Errors after which the leader is looked up again (Kafka ``Errors`` with invalid metadata).
REFRESH_METADATA = frozenset({
    kafka_errors.NotLeaderForPartitionError.errno, kafka_errors.LeaderNotAvailableError.errno,
    kafka_errors.FencedLeaderEpochError.errno, kafka_errors.UnknownLeaderEpochError.errno,
    kafka_errors.UnknownTopicOrPartitionError.errno, kafka_errors.ReplicaNotAvailableError.errno,
    kafka_errors.KafkaStorageError.errno, kafka_errors.OffsetNotAvailableError.errno,
    kafka_errors.UnknownTopicIdError.errno, kafka_errors.InconsistentTopicIdError.errno,
})
OFFSET_OUT_OF_RANGE = kafka_errors.OffsetOutOfRangeError.errno


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


def partition_data(topic: str, part, position: FetchPosition, current_leader_epoch: int) -> PartitionData:
    """One partition of a Fetch response (kafka-python's ``FetchResponse`` partition) as
    :class:`PartitionData`, for a request that asked it from ``position`` with
    ``current_leader_epoch``. A leader-change code (:data:`REFRESH_METADATA`: the caller looks the
    leader up again) or another retriable one is logged and returned with empty records, as is
    ``OFFSET_OUT_OF_RANGE`` (the caller knows where its log ends).

    Raises:
        KafkaSourceError: a non-retriable error (authorization: the topic's READ permission).
    """
    code = part.error_code
    partition = part.partition_index
    if code and code != OFFSET_OUT_OF_RANGE:
        error = kafka_errors.for_code(code)
        if code in REFRESH_METADATA:
            logger.info("fetch %s-%d: %s; refreshing the leader", topic, partition, error.__name__)
        elif not getattr(error, "retriable", False):
            hint = (" (the replica fetch path needs the topic's READ permission, as a consumer does)"
                    if "Authorization" in error.__name__ else "")
            raise KafkaSourceError(f"cannot fetch {topic}-{partition}: {error.__name__} "
                                   f"(error code {code}){hint}")
        else:
            logger.warning("fetch %s-%d: %s (retrying)", topic, partition, error.__name__)
    diverging = getattr(part, "diverging_epoch", None)
    diverging_epoch = None
    if not code and diverging is not None and diverging.epoch >= 0:  # Kafka FetchResponse.isDivergingEpoch
        diverging_epoch = EpochEndOffset(diverging.epoch, diverging.end_offset)
    records = part.records if not code and diverging_epoch is None and part.records else b""
    return PartitionData(partition, position.offset, records, part.high_watermark,
                         part.last_stable_offset, part.log_start_offset, code, diverging_epoch,
                         current_leader_epoch, position.last_fetched_epoch)


def epoch_end_offsets(topic: str, response) -> tuple[dict[int, EpochEndOffset], bool]:
    """partition -> the leader's :class:`EpochEndOffset` in an OffsetsForLeaderEpoch response, and
    whether a partition answered a retriable or leader-change error instead (left out: ask again
    after a metadata refresh).

    Raises:
        KafkaSourceError: a non-retriable error (authorization: needs the topic's DESCRIBE).
    """
    result: dict[int, EpochEndOffset] = {}
    retry = False
    for answered in response.topics:
        for part in answered.partitions:
            if part.error_code:
                error = kafka_errors.for_code(part.error_code)
                if not getattr(error, "retriable", False) and part.error_code not in REFRESH_METADATA:
                    raise KafkaSourceError(f"OffsetsForLeaderEpoch for {topic}-{part.partition}: "
                                           f"{error.__name__} (error code {part.error_code})")
                retry = True
                continue
            result[part.partition] = EpochEndOffset(part.leader_epoch, part.end_offset)
    return result, retry


def list_offsets_answers(topic: str, response, answers: dict[int, list[int]], which: int) -> set[int]:
    """Put each partition's offset of a ListOffsets response into ``answers[partition][which]``
    (partitions not in ``answers`` ignored); return the partitions that answered a retriable or
    leader-change error (to ask again).

    Raises:
        KafkaSourceError: a non-retriable error (authorization: needs the topic's DESCRIBE).
    """
    retry: set[int] = set()
    for answered in response.topics:
        for part in answered.partitions:
            if part.partition_index not in answers:
                continue
            code = part.error_code
            if code:
                error = kafka_errors.for_code(code)
                if code in REFRESH_METADATA or getattr(error, "retriable", False):
                    retry.add(part.partition_index)
                    continue
                raise KafkaSourceError(f"cannot read watermarks of {topic}-{part.partition_index}: "
                                       f"{error.__name__} (error code {code})")
            answers[part.partition_index][which] = part.offset
    return retry
