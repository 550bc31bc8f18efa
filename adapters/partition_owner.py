"""The group member that holds a topic partition now: a plain value.

Its own module so that what describes owners (:mod:`materializer.adapters.group_members`, asking
the group coordinator) and what reports them (:class:`~materializer.adapters.errors.PartitionNotAssignedError`,
raised by readers) share it without importing each other.

It also owns how a member's query-server address travels through Kafka (issue 39): in the
member's ``client.id``, as ``<name>;serve=<url>``. The group coordinator keeps each member's
``client.id`` from the member's own requests and returns it in DescribeConsumerGroups for both
protocols (KIP-848 ``ConsumerGroupDescribeResponse`` ``ClientId``; classic ``DescribeGroupsResponse``
``ClientId``), which is what :attr:`PartitionOwner.client_id` already is; the address therefore
lives exactly as long as the member: it leaves with it (a leave, or the session timeout of a dead
one) and a restarted member is a new member with its own address. docs/serving.md says why this
carrier rather than ``client.rack``, ``group.instance.id`` or a compacted topic.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["SERVE_MARK", "PartitionOwner", "serving_client_id", "serving_url_of"]

#: What separates a member's client name from its serving URL in its ``client.id``.
SERVE_MARK = ";serve="


def serving_client_id(name: str, url: str | None) -> str:
    """The ``client.id`` of a group member named ``name`` that serves queries at ``url``
    (``http(s)://host:port``; None: it serves none, the name as it is).

    Raises:
        ValueError: ``url`` is not ``http://`` or ``https://``, or holds the mark or whitespace.
    """
    if url is None:
        return name
    if not url.startswith(("http://", "https://")) or SERVE_MARK in url or any(c.isspace() for c in url):
        raise ValueError(f"a serving address must be http(s)://host:port, got {url!r}")
    return f"{name.split(SERVE_MARK, 1)[0]}{SERVE_MARK}{url}"


def serving_url_of(client_id: str) -> str | None:
    """The serving URL a ``client.id`` made by :func:`serving_client_id` carries (None: none)."""
    _, mark, url = client_id.partition(SERVE_MARK)
    return url if mark and url.startswith(("http://", "https://")) else None


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
        serving_url (property): where it answers queries (issue 39), or None.
    """

    partition: int
    member_id: str
    client_id: str
    host: str
    group_instance_id: str | None = None

    @property
    def serving_url(self) -> str | None:
        """The member's query-server URL (``http(s)://host:port``) carried in its ``client.id``
        (:func:`serving_url_of`; module docstring), None when it serves no queries."""
        return serving_url_of(self.client_id)
