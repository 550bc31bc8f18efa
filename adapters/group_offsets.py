"""Committing offsets to a Kafka consumer group without joining it (confluent-kafka's AdminClient).

Kafka's OffsetCommit request (``OffsetCommitRequest``, API key 8) with generation id -1 and an
empty member id stores offsets for a group that has no members: the group coordinator accepts
it for an Empty (or not yet existing) group, "the group is only using Kafka to store offsets"
(``GroupCoordinator.handleCommitOffsets``; the new coordinator of KIP-848 keeps that rule for
simple commits). ``AdminClient.alter_consumer_group_offsets`` sends exactly that request, the
same one ``kafka-consumer-groups.sh --reset-offsets --execute`` sends.

A group with active members refuses it (``UNKNOWN_MEMBER_ID``, ``ILLEGAL_GENERATION``,
``REBALANCE_IN_PROGRESS``, ``GROUP_SUBSCRIBED_TO_TOPIC``): :class:`GroupCommitError` then says
that another application uses the group.

Adapter over ``confluent_kafka.admin.AdminClient``; nothing here reads offsets back.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from concurrent.futures import Future

from confluent_kafka import ConsumerGroupTopicPartitions, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient

from materializer.adapters.errors import GroupCommitError
from materializer.adapters.kafka_source import KafkaSourceOptions, map_kafka_error

__all__ = ["COMMIT_METADATA", "GroupOffsetsClient"]

logger = logging.getLogger(__name__)

#: The metadata string stored with each committed offset (shown by tools that print it).
COMMIT_METADATA = "kafka-materializer"

#: Error codes that mean the group has members of its own (another application uses it).
_ACTIVE_GROUP_ERRORS = frozenset({
    KafkaError.UNKNOWN_MEMBER_ID, KafkaError.ILLEGAL_GENERATION, KafkaError.REBALANCE_IN_PROGRESS,
    getattr(KafkaError, "GROUP_SUBSCRIBED_TO_TOPIC", -12345), getattr(KafkaError, "STALE_MEMBER_EPOCH", -12346),
    getattr(KafkaError, "FENCED_MEMBER_EPOCH", -12347)})


class GroupOffsetsClient:
    """Commits one topic's offsets to consumer group ``group`` on ``bootstrap_servers``.

    Args:
        bootstrap_servers: ``host:port[,host:port]``.
        group: the consumer group id.
        topic: the topic whose partitions' offsets are committed.
        options: client settings (security settings of ``client_config`` apply; the request
            timeout bounds each commit, ms).

    Thread-safety: one caller thread; the returned futures complete on librdkafka's thread.
    """

    def __init__(self, bootstrap_servers: str, group: str, topic: str, options: KafkaSourceOptions) -> None:
        self.bootstrap_servers, self.group, self.topic = bootstrap_servers, group, topic
        self._timeout_s = options.request_timeout_ms / 1000.0
        self._admin: AdminClient | None = AdminClient(options.admin_config(bootstrap_servers))

    def commit(self, offsets: Mapping[int, int]) -> Future[None]:
        """Send one OffsetCommit of ``offsets`` (partition -> next offset to consume, >= 0) without
        waiting for it.

        Returns:
            a future that completes with None once the coordinator stored every offset, or with
            :class:`GroupCommitError` (``active_members`` set when the group has members).

        Raises:
            GroupCommitError: closed, or the request could not be built.
        """
        if self._admin is None:
            raise GroupCommitError(f"the offset committer of group {self.group!r} is closed")
        partitions = [TopicPartition(self.topic, p, o, metadata=COMMIT_METADATA) for p, o in sorted(offsets.items())]
        done: Future[None] = Future()
        try:
            futures = self._admin.alter_consumer_group_offsets(
                [ConsumerGroupTopicPartitions(self.group, partitions)], request_timeout=self._timeout_s)
        except (KafkaException, ValueError, TypeError) as exc:
            raise self._error(exc) from exc
        (future,) = futures.values()
        future.add_done_callback(lambda f: self._settle(f, done))
        return done

    def _settle(self, future: Future, done: Future[None]) -> None:
        """Turn the AdminClient future into ``done``: None, or the first group or partition error."""
        try:
            result = future.result()
        except Exception as exc:  # noqa: BLE001 - every failure is handed to the caller
            done.set_exception(self._error(exc))
            return
        failed = [tp for tp in (result.topic_partitions or []) if tp.error is not None]
        if failed:
            done.set_exception(self._error(failed[0].error, partition=failed[0].partition))
        else:
            done.set_result(None)

    def _error(self, error: BaseException | KafkaError, partition: int | None = None) -> GroupCommitError:
        """A :class:`GroupCommitError` naming the group (and partition) for a client error."""
        kafka_error = error.args[0] if isinstance(error, KafkaException) and error.args else error
        where = f"{self.topic}-{partition}" if partition is not None else self.topic
        context = f"cannot commit offsets of {where} to consumer group {self.group!r} on {self.bootstrap_servers}"
        active = isinstance(kafka_error, KafkaError) and kafka_error.code() in _ACTIVE_GROUP_ERRORS
        if isinstance(kafka_error, KafkaError) and active:
            message = (f"{context}: the group has active members ({kafka_error.name()}): another application uses "
                       f"it; give the materializer a group of its own")
        else:
            message = str(map_kafka_error(kafka_error, context))
        return GroupCommitError(message, active_members=active)

    def close(self) -> None:
        """Release the client (a commit in flight may still complete). Idempotent."""
        self._admin = None
