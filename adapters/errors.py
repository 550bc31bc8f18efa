"""Error types raised by ``materializer.adapters`` (everything that talks to another system).

Hierarchy::

    AdapterError
    ├── BrokerProvisioningError   resolving jars / formatting / starting / stopping a local broker
    ├── KafkaSourceError          consuming from a Kafka cluster (materializer.adapters.kafka_source)
    │   ├── BrokerUnreachableError    the cluster did not answer within the broker timeout
    │   ├── TopicNotFoundError        the topic is not in the cluster's metadata
    │   ├── LeaderNotAvailableError   a partition's leader is not known yet or moved (retriable)
    │   ├── TopicIdChangedError       the topic's id in the metadata is not the local copy's (KIP-516)
    │   ├── GroupCommitError          committing offsets to a consumer group failed (adapters.group_offsets)
    │   └── GroupMembershipError      joining or staying in a consumer group failed (adapters.group_membership)
    ├── PartitionNotAssignedError the key's partition is another group member's (interactive-query routing)
    │   └── KeyPartitionUndecidedError  the key may be in several partitions, some another member's
    └── StoreError                the RocksDB state store (materializer.adapters.rocksdb_store)
        ├── StoreCorruptedError   the store's files are unreadable or inconsistent
        └── StoreLockedError      another process holds the store's lock
    ├── DeserializationError      a stored key/value is not valid str/json/avro (also a ValueError)
    ├── SchemaRegistryError       the Schema Registry cannot be reached or refuses a request
    ├── SchemaRegistryProvisioningError   downloading / starting a local Apicurio Registry
    ├── SparkConnectorProvisioningError   resolving Spark's Kafka connector jars with Maven
    └── SparkClusterProvisioningError     starting / stopping a local Spark standalone cluster

Storage-engine errors (corrupt segments, indexes, checkpoints) live in
``materializer.storage.errors`` and are not subclasses of :class:`AdapterError`.
"""

from __future__ import annotations

from .partition_owner import PartitionOwner

__all__ = [
    "AdapterError",
    "BrokerProvisioningError",
    "BrokerUnreachableError",
    "DeserializationError",
    "GroupCommitError",
    "GroupMembershipError",
    "KafkaSourceError",
    "KeyPartitionUndecidedError",
    "LeaderNotAvailableError",
    "PartitionNotAssignedError",
    "StoreError",
    "StoreCorruptedError",
    "TopicIdChangedError",
    "TopicNotFoundError",
    "StoreLockedError",
    "SchemaRegistryError",
    "SchemaRegistryProvisioningError",
    "SparkConnectorProvisioningError",
    "SparkClusterProvisioningError",
]


class AdapterError(Exception):
    """Root of every error raised by ``materializer.adapters``."""


class BrokerProvisioningError(AdapterError):
    """A local Apache Kafka broker could not be provisioned, started, reached or stopped.

    The message names the failing command (``mvn ...``, ``java ... kafka.Kafka ...``) and
    includes the last lines of its output or of the broker log, so it can be read without
    opening any file.
    """


class SparkConnectorProvisioningError(AdapterError):
    """Spark's Kafka connector (``spark-sql-kafka-0-10``) could not be resolved with Maven.

    The message names the ``mvn`` command and quotes its last output lines (which artifact Maven
    could not find).
    """


class SparkClusterProvisioningError(AdapterError):
    """A local Spark standalone cluster (:mod:`materializer.spark.standalone`: a master and its
    workers from the pip-installed PySpark) could not be started, reached or stopped.

    The message names the daemon (master or worker), its state folder and quotes the last lines of
    its output.
    """


class KafkaSourceError(AdapterError):
    """Consuming records from a Kafka cluster failed (metadata, fetch, deserialization)."""


class BrokerUnreachableError(KafkaSourceError):
    """The cluster did not answer within the broker timeout (transient: it may come back)."""


class TopicNotFoundError(KafkaSourceError):
    """The topic is not in the cluster's metadata (never created, or deleted)."""


class LeaderNotAvailableError(KafkaSourceError):
    """The broker asked is not (or not yet) a partition's leader: ``LEADER_NOT_AVAILABLE`` or
    ``NOT_LEADER_OR_FOLLOWER`` (e.g. right after ``CreatePartitions``, before the new partition's
    leader took it on, or while leadership moves). Retriable, as Kafka's clients treat it
    (``InvalidMetadataException``): ask again after a metadata refresh."""


class TopicIdChangedError(KafkaSourceError):
    """The cluster's metadata names another topic id for the topic than the one its local copy
    holds (KIP-516): the topic was deleted (``found`` is None) or deleted and re-created under the
    same name (``found`` is the new id). A Kafka broker compares the same ids
    (``UnifiedLog.initializeTopicId``, ``InconsistentTopicIdException``) and never appends one
    topic's records to another's log.

    Attributes:
        topic: the topic name.
        expected: the id the local copy holds (``uuid.UUID``).
        found: the id in the metadata now, or None when the topic is not in the metadata.
    """

    def __init__(self, topic: str, expected, found, detail: str = "") -> None:
        from ..storage.partition_metadata import topic_id_to_string

        self.topic, self.expected, self.found = topic, expected, found
        old = topic_id_to_string(expected)
        if found is None:
            message = f"topic {topic!r} (id {old}) was deleted: it is no longer in the cluster's metadata"
        else:
            message = (f"topic {topic!r} was re-created: the cluster's id is {topic_id_to_string(found)}, the local "
                       f"copy holds {old}")
        super().__init__(message + (f" ({detail})" if detail else ""))


class GroupCommitError(KafkaSourceError):
    """An OffsetCommit to a consumer group failed; the message names the group, the topic (and
    partition) and the broker's error.

    Attributes:
        active_members: the group has members of its own (another application uses it), so a
            member-less commit is refused until it is empty again.
    """

    def __init__(self, message: str, *, active_members: bool = False) -> None:
        super().__init__(message)
        self.active_members = active_members


class PartitionNotAssignedError(AdapterError):
    """A read asked for a key whose partition this group member is not assigned: the key lives in
    another member's store (Kafka Streams' ``InvalidStateStorePartitionException`` for interactive
    queries, KIP-535). Route the read to :attr:`owner` (see :func:`materializer.group.routing.owner_of`).

    Attributes:
        partition: the key's partition (:func:`materializer.group.routing.partition_for_key`).
        owner: the member that holds it now (a
            :class:`~materializer.adapters.partition_owner.PartitionOwner`), or None when no member
            of the group does (a rebalance is moving it), or it was not looked up.
        looked_up: when :attr:`owner` is None: what asking the group found (no member holds it, or
            why asking failed); None: the group was not asked (the message says how to ask it).
        topic, group_id: the topic and consumer group, when known (None otherwise).
        catching_up: the partition *is* assigned to this member, which is still fetching what it
            missed (a rebalance, a failover or a restart just gave it the partition): its entries
            are older than what the previous owner served, so it answers once caught up (as Kafka
            Streams does not query a restoring task). Retry the same member shortly.
        stopped: a reader in another process: the member that served the partition stopped
            without letting it go (killed), so the group moves it to another member; how it was
            found (None otherwise). Read from the member that holds it now.
    """

    def __init__(self, partition: int, owner: PartitionOwner | None, *, topic: str | None = None,
                 group_id: str | None = None, catching_up: bool = False, stopped: str | None = None,
                 looked_up: str | None = None) -> None:
        self.partition, self.owner, self.topic, self.group_id = partition, owner, topic, group_id
        self.catching_up, self.stopped, self.looked_up = catching_up, stopped, looked_up
        where = f"partition {partition}" + (f" of topic {topic!r}" if topic is not None else "")
        group = f" of group {group_id!r}" if group_id is not None else ""
        if stopped is not None:
            who = f"consumer group {group_id!r}" if group_id is not None else "the group"
            super().__init__(f"{where} is not served from this data dir: {stopped}; {who} moves it to another "
                             f"member, whose data dir serves it ({_owner_text(owner, group, looked_up)})")
            return
        if catching_up:
            super().__init__(f"{where} is assigned to this member{group} but still catching up: it is served once "
                             "it reaches the high watermark read when it was assigned")
            return
        super().__init__(f"{where} is not assigned to this member: {_owner_text(owner, group, looked_up)}")


def _owner_text(owner: PartitionOwner | None, group: str, looked_up: str | None) -> str:
    """Who holds a partition, for a refusal: the owner, what asking the group found, or how to ask."""
    if owner is not None:
        instance = f", group instance id {owner.group_instance_id!r}" if owner.group_instance_id is not None else ""
        return (f"it is held by member {owner.member_id!r}{group} (client id {owner.client_id!r}, "
                f"host {owner.host!r}{instance})")
    if looked_up is not None:
        return looked_up
    return ("the member that holds it was not looked up: materializer.owner_of(key, topic=..., group_id=..., "
            "bootstrap_servers=...) names it, as does `materializer get` with --bootstrap-servers")


class KeyPartitionUndecidedError(PartitionNotAssignedError):
    """A read of a key that may be in several partitions (the topic producers' partitioner is not
    known yet, or none known places the topic's keys): it is absent from those this member serves,
    and another may hold it, so "absent" would not be known to be true. Read it from the member
    that holds the others, or name the producers' partitioner (``run --partitioner``).

    Attributes:
        partitions: the partitions the key may be in (one per candidate partitioner).
        unserved: those of them this member does not serve (:attr:`partition` is the first).
        owners: partition -> the member that holds it now, for those looked up (missing: unknown).
        why: how the candidates were found (:meth:`materializer.group.partitioner.KeyRouting.describe`).
        catching_up: True when every partition of :attr:`unserved` is assigned to this member and
            still catching up (retry the same member shortly); ``assigned_here`` lists those that are.
        live_in_several: the partition count grew since some keys were written, so the key may be
            live in several of :attr:`partitions` and the latest of them is the answer: it may have
            been found here, but not every partition it may be in is served here.
        (and :class:`PartitionNotAssignedError`'s, of the first partition of :attr:`unserved`)
    """

    def __init__(self, key: str, partitions: frozenset[int], unserved: frozenset[int], why: str, *,
                 topic: str | None = None, group_id: str | None = None,
                 owners: dict[int, PartitionOwner | None] | None = None, looked_up: str | None = None,
                 assigned_here: frozenset[int] = frozenset(), live_in_several: bool = False) -> None:
        first = min(unserved)
        super().__init__(first, (owners or {}).get(first), topic=topic, group_id=group_id, looked_up=looked_up)
        self.partitions, self.unserved, self.owners, self.why = partitions, unserved, dict(owners or {}), why
        self.assigned_here = assigned_here & unserved
        self.catching_up = unserved <= assigned_here
        group = f" of group {group_id!r}" if group_id is not None else ""

        def holder(p: int) -> str:
            if p in assigned_here:
                return f"assigned to this member{group} but still catching up"
            return _owner_text((owners or {}).get(p), group, looked_up)

        elsewhere = sorted(unserved - assigned_here)
        if elsewhere and looked_up is None and not any((owners or {}).get(p) for p in elsewhere):
            held = ("; ".join(f"partition {p}: {holder(p)}" for p in sorted(self.assigned_here)) +
                    ("; " if self.assigned_here else "") +
                    f"the members that hold {'the others' if self.assigned_here else 'them'} were not looked up: "
                    "materializer.owner_of(key, topic=..., "
                    "group_id=..., bootstrap_servers=...) names them, as does `materializer get` with "
                    "--bootstrap-servers")
        else:
            held = "; ".join(f"partition {p}: {holder(p)}" for p in sorted(unserved))
        served = sorted(partitions - unserved)
        if live_in_several:
            absent = f"{_partitions(served)} {'is' if len(served) == 1 else 'are'} served here, but " if served else ""
            unknown = "its latest value"
        else:
            absent = f"it is absent from {_partitions(served)} served here, and " if served else ""
            unknown = "whether the topic holds it"
        not_here = _partitions(sorted(unserved))
        Exception.__init__(
            self, f"key {key}{f' of topic {topic!r}' if topic is not None else ''} may be in "
                  f"{_partitions(sorted(partitions))}: {why}; {absent}{not_here} "
                  f"{'is' if len(unserved) == 1 else 'are'} not served by this member, so {unknown} "
                  f"is not known here ({held}); "
                  + ("retry this member once it has caught up" if self.catching_up else
                     f"read it from the member that holds {'it' if len(unserved) == 1 else 'them'}")
                  + ", or run the members with --partitioner set to the producers' partitioner")


def _partitions(partitions: list[int]) -> str:
    return f"partition{'s' if len(partitions) != 1 else ''} {', '.join(map(str, partitions))}"


class GroupMembershipError(KafkaSourceError):
    """Joining consumer group ``group``, or staying in it, failed; the message names the group and
    the broker's (or client's) reason.

    Raised by :class:`materializer.adapters.group_membership.GroupMembership`: a topic that is not
    in the cluster's metadata, a group whose members speak another protocol or assignor
    (``INCONSISTENT_GROUP_PROTOCOL``, Kafka ``ConsumerGroupCommand``'s "inconsistent group
    protocol"), a fenced static member (``FENCED_INSTANCE_ID``, KIP-345), an authorization
    failure, a client setting librdkafka refuses, or a membership that never received an
    assignment in time.

    Attributes:
        group: the consumer group id.
        code: the Kafka (or librdkafka) error name, e.g. ``"INCONSISTENT_GROUP_PROTOCOL"``; None
            when the error is not the broker's (a timeout of this adapter).
        fatal: librdkafka marked the error fatal: the client can no longer take part in the group.
    """

    def __init__(self, message: str, *, group: str, code: str | None = None, fatal: bool = False) -> None:
        super().__init__(message)
        self.group, self.code, self.fatal = group, code, fatal


class StoreError(AdapterError):
    """The RocksDB state store failed."""


class StoreCorruptedError(StoreError):
    """The RocksDB state store's files are unreadable or inconsistent."""


class StoreLockedError(StoreError):
    """Another process holds the RocksDB state store's lock."""


class StoreReplacedError(StoreError):
    """A reader's state store folder now holds another store (another RocksDB identity: the topic
    was re-created, restored over or rebuilt): open it again."""


class DeserializationError(AdapterError, ValueError):
    """A stored key or value is not valid in the format it is read as (``str``, ``json``, ``avro``).

    Attributes:
        topic, partition, offset: where the record is (``partition``/``offset`` None when unknown).
        field: ``"key"`` or ``"value"``.
        fmt: the format it was read as.
        reason: what was wrong (an unknown schema id, bytes that do not match the schema, ...).
    """

    def __init__(self, reason: str, *, fmt: str, field: str = "value", topic: str | None = None,
                 partition: int | None = None, offset: int | None = None) -> None:
        self.reason, self.fmt, self.field = reason, fmt, field
        self.topic, self.partition, self.offset = topic, partition, offset
        where = ""
        if partition is not None:
            where = f" of {topic}-{partition}" if topic else f" of partition {partition}"
        if offset is not None:
            where += f" at offset {offset}"
        super().__init__(f"cannot read the {field}{where} as {fmt}: {reason}")


class SchemaRegistryProvisioningError(AdapterError):
    """A local Schema Registry (Apicurio) could not be downloaded, started, reached or stopped."""


class SchemaRegistryError(AdapterError):
    """The Schema Registry could not be reached or refused a request (not a decoding problem)."""

