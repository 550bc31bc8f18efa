"""The group member that holds a topic partition now: a plain value.

Its own module so that what describes owners (:mod:`materializer.adapters.group_members`, asking
the group coordinator) and what reports them (:class:`~materializer.adapters.errors.PartitionNotAssignedError`,
raised by readers) share it without importing each other.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["PartitionOwner"]


@dataclass(frozen=True)
class PartitionOwner:
    """The group member that holds a topic partition now (one member of a DescribeConsumerGroups
    answer: Kafka's ``MemberDescription``).

    Attributes:
        partition: the topic's partition the member is assigned.
        member_id: the member id the group coordinator gave it (``Consumer.memberid()`` in
            confluent-kafka; a UUID chosen by the client in KIP-848 groups).
        client_id: the member's ``client.id``.
        host: the address the coordinator saw the member connect from (``/10.0.0.7``).
        group_instance_id: its ``group.instance.id`` (KIP-345 static membership), or None.
    """

    partition: int
    member_id: str
    client_id: str
    host: str
    group_instance_id: str | None = None
