"""Committing offsets to a Kafka consumer group without joining it (a confluent-kafka Consumer that never subscribes).

Kafka's OffsetCommit request (``OffsetCommitRequest``, API key 8) with generation id -1 and an
empty member id stores offsets for a group that has no members: the group coordinator accepts
it for an Empty (or not yet existing) group, "the group is only using Kafka to store offsets"
(``GroupCoordinator.handleCommitOffsets``; the KIP-848 coordinator keeps that rule for a group
without members). A librdkafka consumer with ``group.id`` that never subscribes sends exactly that
when asked to commit explicit offsets (the "simple consumer" commit of ``assign()`` users), and
its group machinery finds the coordinator again after a broker restart, holding the commit until
the cluster answers.

The AdminClient's ``alter_consumer_group_offsets`` would send the same request, but librdkafka's
coordinator-targeted admin requests can abort the whole process when a connection drops under
them (``rd_kafka_enq_once_del_source_return: Assertion `eonce->refcnt > 0' failed``, librdkafka
issues 3663 and 4605, seen here on a broker restart), so a long-running run does not use them.

A group with active members refuses member-less commits (``UNKNOWN_MEMBER_ID``,
``ILLEGAL_GENERATION``, ``REBALANCE_IN_PROGRESS``; KIP-848 groups ``STALE_MEMBER_EPOCH`` and the
like): :class:`GroupCommitError` then says that another application uses the group.

Adapter over ``confluent_kafka.Consumer``; nothing here reads offsets back.
"""

from __future__ import annotations

import collections
import contextlib
import logging
from collections.abc import Mapping
from concurrent.futures import Future

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from materializer.adapters.errors import GroupCommitError
from materializer.adapters.kafka_source import KafkaSourceOptions, map_kafka_error

__all__ = ["COMMIT_METADATA", "GroupOffsetsClient"]

logger = logging.getLogger(__name__)
_client_logger = logging.getLogger("materializer.adapters.kafka_source.librdkafka")

#: The metadata string stored with each committed offset (shown by tools that print it).
COMMIT_METADATA = "kafka-materializer"

#: Error codes that mean the group has members of its own (another application uses it).
_ACTIVE_GROUP_ERRORS = frozenset(
    getattr(KafkaError, name) for name in ("UNKNOWN_MEMBER_ID", "ILLEGAL_GENERATION", "REBALANCE_IN_PROGRESS",
                                           "GROUP_SUBSCRIBED_TO_TOPIC", "STALE_MEMBER_EPOCH", "FENCED_MEMBER_EPOCH")
    if hasattr(KafkaError, name))


class GroupOffsetsClient:
    """Commits one topic's offsets to consumer group ``group`` on ``bootstrap_servers``.

    Args:
        bootstrap_servers: ``host:port[,host:port]``.
        group: the consumer group id.
        topic: the topic whose partitions' offsets are committed.
        options: client settings (``client_config``: security settings and the like; its
            ``group.id`` and commit settings are overridden).

    Thread-safety: one thread; :meth:`commit` answers arrive through :meth:`poll` in that thread.

    Raises:
        GroupCommitError: the client cannot be created (an invalid setting).
    """

    def __init__(self, bootstrap_servers: str, group: str, topic: str, options: KafkaSourceOptions) -> None:
        self.bootstrap_servers, self.group, self.topic = bootstrap_servers, group, topic
        config: dict[str, object] = {"bootstrap.servers": bootstrap_servers,
                                     "socket.timeout.ms": min(options.request_timeout_ms, 60_000)}
        config.update({k: v for k, v in options.client_config.items() if k != "statistics.interval.ms"})
        config.update({"group.id": group, "enable.auto.commit": False, "enable.auto.offset.store": False,
                       "on_commit": self._on_commit})
        self._pending: collections.deque[Future[None]] = collections.deque()
        try:
            self._consumer: Consumer | None = Consumer(config, logger=_client_logger)
        except (KafkaException, ValueError, TypeError) as exc:
            raise self._error(exc) from exc

    def commit(self, offsets: Mapping[int, int]) -> Future[None]:
        """Send one OffsetCommit of ``offsets`` (partition -> next offset to consume, >= 0) without
        waiting for it; the answer arrives through :meth:`poll`.

        Returns:
            a future that completes with None once the coordinator stored every offset, or with
            :class:`GroupCommitError` (``active_members`` set when the group has members).

        Raises:
            GroupCommitError: closed, or the request could not be queued.
        """
        if self._consumer is None:
            raise GroupCommitError(f"the offset committer of group {self.group!r} is closed")
        partitions = [TopicPartition(self.topic, p, o, metadata=COMMIT_METADATA) for p, o in sorted(offsets.items())]
        done: Future[None] = Future()
        self._pending.append(done)
        try:
            self._consumer.commit(offsets=partitions, asynchronous=True)
        except (KafkaException, ValueError, TypeError, RuntimeError) as exc:
            self._pending.remove(done)
            raise self._error(exc) from exc
        return done

    def poll(self, timeout_s: float = 0.0) -> None:
        """Serve the client's callbacks (commit answers) for up to ``timeout_s`` seconds (0: only
        what has arrived). Never returns records: nothing is subscribed or assigned."""
        consumer = self._consumer
        if consumer is not None:
            consumer.poll(timeout_s)

    def _on_commit(self, error: KafkaError | None, partitions: list[TopicPartition]) -> None:
        """librdkafka's answer to the oldest commit: complete its future."""
        if not self._pending:
            return
        done = self._pending.popleft()
        failed = next((tp for tp in partitions or [] if tp.error is not None), None)
        if error is not None:
            done.set_exception(self._error(error))
        elif failed is not None and failed.error is not None:
            done.set_exception(self._error(failed.error, partition=failed.partition))
        else:
            done.set_result(None)

    def _error(self, error: BaseException | KafkaError, partition: int | None = None) -> GroupCommitError:
        """A :class:`GroupCommitError` naming the group (and partition) for a client error."""
        kafka_error = error.args[0] if isinstance(error, KafkaException) and error.args else error
        where = f"{self.topic}-{partition}" if partition is not None else self.topic
        context = f"cannot commit offsets of {where} to consumer group {self.group!r} on {self.bootstrap_servers}"
        if isinstance(kafka_error, KafkaError) and kafka_error.code() in _ACTIVE_GROUP_ERRORS:
            return GroupCommitError(f"{context}: the group has active members ({kafka_error.name()}): another "
                                    f"application uses it; give the materializer a group of its own",
                                    active_members=True)
        return GroupCommitError(str(map_kafka_error(kafka_error, context)))

    def close(self) -> None:
        """Close the client; commits still unanswered fail with :class:`GroupCommitError`. Idempotent."""
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            with contextlib.suppress(KafkaException, RuntimeError):
                consumer.close()
        while self._pending:
            self._pending.popleft().set_exception(
                GroupCommitError(f"the offset committer of group {self.group!r} was closed before the answer"))
