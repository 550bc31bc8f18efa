"""Which member of a consumer group holds which partition of a topic (DescribeConsumerGroups).

Kafka's ``Admin.describeConsumerGroups`` (``KafkaAdminClient``; KIP-222) asks the group's
coordinator for its members and, per member, the partitions it is assigned now: the
``DescribeGroups`` API (key 15) for classic groups, whose member assignments are the leader's
``ConsumerProtocolAssignment`` as handed out by the last SyncGroup, and ``ConsumerGroupDescribe``
(key 69, KIP-848) for groups of the ``consumer`` protocol, whose ``assignment`` is what each member
holds now (``target_assignment`` is where the coordinator is moving it). librdkafka (2.8 and
later) sends ``ConsumerGroupDescribe`` first and falls back to ``DescribeGroups`` when the
coordinator answers ``GROUP_ID_NOT_FOUND`` (a classic group, or none) or ``UNSUPPORTED_VERSION``.

This adapter asks once per call (no cache: membership changes with every rebalance) through
confluent-kafka's :class:`~confluent_kafka.admin.AdminClient`, and reads the topic's partition count
from the cluster's metadata (a Metadata request that never auto-creates the topic).

Caveat: librdkafka's coordinator-targeted admin requests can abort the process when a connection
drops under them (librdkafka issues 3663 and 4605; see :mod:`materializer.adapters.group_offsets`),
so a long-running service that routes many requests should expect the broker connection to stay up
or call this from a process it can restart.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient

from materializer.adapters.errors import KafkaSourceError, TopicNotFoundError
from materializer.adapters.kafka_source import map_kafka_error, map_kafka_errors
from materializer.adapters.partition_owner import PartitionOwner

__all__ = ["GroupMembersClient"]

_client_logger = logging.getLogger("materializer.adapters.group_members.librdkafka")

#: Group states/errors that mean "no such group": it has no member, so no partition has an owner.
_NO_GROUP_ERRORS = frozenset(
    getattr(KafkaError, name) for name in ("GROUP_ID_NOT_FOUND",) if hasattr(KafkaError, name))


class GroupMembersClient:
    """Reads consumer groups' members and topics' partition counts from ``bootstrap_servers``.

    Args:
        bootstrap_servers: ``host:port[,host:port]`` (None: ``client_config`` must hold
            ``bootstrap.servers``).
        client_config: librdkafka settings for the admin client (security: ``security.protocol``,
            ``sasl.*``, ``ssl.*``); they win over the defaults, except that metadata requests never
            auto-create a topic.
        timeout_s: seconds one request (and its answer) may take (10 s).

    One client may serve many calls (one AdminClient and its connections); it is thread-safe as
    confluent-kafka's AdminClient is.

    Raises:
        KafkaSourceError: the admin client cannot be created (an invalid setting, no
            ``bootstrap.servers``).
    """

    def __init__(self, bootstrap_servers: str | None = None,
                 client_config: Mapping[str, str | int | float | bool] | None = None, *,
                 timeout_s: float = 10.0) -> None:
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be positive, got {timeout_s}")
        config: dict[str, str | int | float | bool] = {}
        if bootstrap_servers is not None:
            config["bootstrap.servers"] = bootstrap_servers
        config.update(client_config or {})
        if not config.get("bootstrap.servers"):
            raise KafkaSourceError("describing consumer groups needs bootstrap servers "
                                   "(bootstrap_servers, or bootstrap.servers in client_config)")
        # librdkafka's admin client is a producer handle, whose default lets Metadata create the topic
        config["allow.auto.create.topics"] = False
        self.bootstrap_servers = str(config["bootstrap.servers"])
        self.timeout_s = timeout_s
        try:
            self._admin = AdminClient(config, logger=_client_logger)
        except (KafkaException, ValueError, TypeError) as exc:
            raise map_kafka_error(exc, f"creating an admin client for {self.bootstrap_servers}") from exc

    def partition_count(self, topic: str) -> int:
        """The number of partitions of ``topic`` in the cluster's metadata (Metadata request).

        Raises:
            TopicNotFoundError: the topic is not in the metadata.
            BrokerUnreachableError: the cluster did not answer within ``timeout_s``.
            KafkaSourceError: any other error of the request.
        """
        context = f"reading the partition count of topic {topic!r} from {self.bootstrap_servers}"
        with map_kafka_errors(context):
            metadata = self._admin.list_topics(topic=topic, timeout=self.timeout_s)
        found = metadata.topics.get(topic)
        if found is None:
            raise TopicNotFoundError(f"{context}: the topic is not in the metadata (does the topic exist?)")
        if found.error is not None:
            raise map_kafka_error(found.error, context)
        if not found.partitions:
            raise TopicNotFoundError(f"{context}: the metadata lists no partition")
        return len(found.partitions)

    def partition_owners(self, group_id: str, topic: str) -> dict[int, PartitionOwner]:
        """``partition -> owner`` of ``topic``'s partitions that a member of consumer group
        ``group_id`` is assigned now (one DescribeConsumerGroups request; a KIP-848 member's
        current ``assignment``, not its target). Partitions no member holds are absent; a group
        that does not exist (``GROUP_ID_NOT_FOUND``, or the classic coordinator's ``Dead`` group)
        or has no member gives ``{}``.

        Raises:
            BrokerUnreachableError: the coordinator did not answer within ``timeout_s``.
            KafkaSourceError: any other error (``GROUP_AUTHORIZATION_FAILED``: the principal lacks
                DESCRIBE on the group).
        """
        context = f"describing consumer group {group_id!r} on {self.bootstrap_servers}"
        with map_kafka_errors(context):
            future = self._admin.describe_consumer_groups([group_id], request_timeout=self.timeout_s)[group_id]
            try:
                description = future.result(timeout=self.timeout_s + 5.0)
            except KafkaException as exc:
                error = exc.args[0] if exc.args and isinstance(exc.args[0], KafkaError) else None
                if error is not None and error.code() in _NO_GROUP_ERRORS:
                    return {}
                raise
        owners: dict[int, PartitionOwner] = {}
        for member in description.members or ():
            assignment = member.assignment.topic_partitions if member.assignment is not None else ()
            for topic_partition in assignment:
                if topic_partition.topic == topic and topic_partition.partition not in owners:
                    owners[topic_partition.partition] = PartitionOwner(
                        partition=topic_partition.partition, member_id=member.member_id,
                        client_id=member.client_id, host=member.host,
                        group_instance_id=member.group_instance_id or None)
        return owners
