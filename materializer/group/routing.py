"""Interactive-query routing: the partition a producer sends a key to, and the group member that
holds that partition now.

A group-partitioned materializer (one member of a consumer group, like a Kafka Streams KTable
instance) holds only the partitions the group coordinator assigns it; a read of a key whose
partition another member holds is answered there (Kafka Streams' interactive queries: KIP-67's
``metadataForKey``, KIP-535's ``queryMetadataForKey``). Two steps, each Kafka's own rule:

* :func:`partition_for_key`: the producer's partitioner for a keyed record, so the answer is the
  partition the record was written to. The default, ``murmur2``, is Java's
  ``BuiltInPartitioner.partitionForKey`` (``Utils.toPositive(Utils.murmur2(key)) % numPartitions``),
  also the rule of Kafka Streams, Kafka Connect and librdkafka's ``murmur2_random``; librdkafka's own
  default is ``consistent_random`` (CRC32), and ``fnv1a`` is Sarama's. Use the partitioner the
  topic's producers use.
* :func:`owner_of`: the member whose current assignment holds that partition (DescribeConsumerGroups,
  :mod:`materializer.adapters.group_members`).

The hashes run in the native core (``storage/native/src/clients/partitioner.rs``); CRC32 is
``zlib.crc32``.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from materializer.adapters.partition_owner import PartitionOwner
from materializer.storage import _native

if TYPE_CHECKING:  # pragma: no cover - imported by owner_of: partition_for_key needs no Kafka client
    from materializer.adapters.group_members import GroupMembersClient

__all__ = ["FAMILIES", "PARTITIONERS", "PartitionOwner", "family_of", "key_hash", "owner_of", "partition_for_key"]

Key = bytes | bytearray | memoryview | str


def _positive_murmur2(key: bytes | bytearray | memoryview) -> int:
    # Utils.toPositive: clear the sign bit (not abs(): Integer.MIN_VALUE has no positive abs)
    return _native.murmur2(key) & 0x7FFFFFFF


#: partitioner name -> (hash of a key as an unsigned int, whether an empty key goes to a random
#: partition). librdkafka's ``*_random`` variants send a NULL key to a random partition and
#: ``consistent_random`` an empty one too (``rd_kafka_msg_partitioner_consistent_random``).
_PARTITIONERS: dict[str, tuple[Callable[[bytes | bytearray | memoryview], int], bool]] = {
    "murmur2": (_positive_murmur2, False),
    "murmur2_random": (_positive_murmur2, False),
    "consistent": (zlib.crc32, False),
    "consistent_random": (zlib.crc32, True),
    "fnv1a": (_native.fnv1a, False),
    "fnv1a_random": (_native.fnv1a, False),
}

#: The partitioner names :func:`partition_for_key` accepts (librdkafka's ``partitioner`` values
#: for keyed records; ``murmur2`` is the Java producer's).
PARTITIONERS: tuple[str, ...] = tuple(_PARTITIONERS)

#: Hash family -> the partitioners of :data:`PARTITIONERS` that hash a non-empty key with it (so
#: place it in the same partition): they differ only for a null key, and ``consistent_random``
#: for an empty one too.
FAMILIES: dict[str, tuple[str, ...]] = {
    "murmur2": ("murmur2", "murmur2_random"),
    "crc32": ("consistent", "consistent_random"),
    "fnv1a": ("fnv1a", "fnv1a_random"),
}


def family_of(partitioner: str) -> str:
    """The hash family (a key of :data:`FAMILIES`) of ``partitioner``.

    Raises:
        ValueError: ``partitioner`` is not one of :data:`PARTITIONERS`.
    """
    for family, names in FAMILIES.items():
        if partitioner in names:
            return family
    raise ValueError(f"unknown partitioner {partitioner!r}: one of {', '.join(PARTITIONERS)}")


def key_hash(family: str, key: bytes | bytearray | memoryview) -> int:
    """The non-negative hash of ``key`` that the partitioners of ``family`` take modulo the
    partition count (``murmur2``: ``Utils.toPositive(Utils.murmur2(key))``; ``crc32``: CRC32;
    ``fnv1a``: librdkafka's ``abs`` of the signed FNV-1a hash).

    Raises:
        KeyError: ``family`` is not one of :data:`FAMILIES`.
    """
    return _PARTITIONERS[FAMILIES[family][0]][0](key)


def partition_for_key(key: Key, partitions: int, *, partitioner: str = "murmur2") -> int:
    """The partition, in ``[0, partitions)``, that a producer sends a record with ``key`` to.

    Args:
        key: the record's serialized key (``bytes``-like); a ``str`` is encoded as UTF-8, as Java's
            ``StringSerializer`` and confluent-kafka's ``Producer`` encode it.
        partitions: the topic's partition count (the producer's metadata when it sent the record).
        partitioner: the producer's partitioner:

            * ``"murmur2"`` (default) and ``"murmur2_random"``: Java's producer
              (``BuiltInPartitioner.partitionForKey``: ``Utils.toPositive(Utils.murmur2(key)) %
              partitions``), Kafka Streams, librdkafka's ``murmur2*``;
            * ``"consistent"`` and ``"consistent_random"`` (librdkafka's default): ``CRC32(key) %
              partitions``;
            * ``"fnv1a"`` and ``"fnv1a_random"``: librdkafka's (and Sarama's) FNV-1a, ``abs`` of
              the signed 32-bit hash, ``% partitions``.

    Returns:
        The partition number.

    Raises:
        ValueError: ``partitioner`` is not one of :data:`PARTITIONERS`; ``partitions`` is not
            positive; ``key`` is None (a record without key goes wherever the producer's sticky
            partitioner puts it, so no partition owns it); ``key`` is empty and the partitioner is
            ``consistent_random`` (librdkafka sends empty keys to a random partition too).
        TypeError: ``partitions`` is not an int, or ``key`` is neither bytes-like nor ``str``.
    """
    spec = _PARTITIONERS.get(partitioner)
    if spec is None:
        raise ValueError(f"unknown partitioner {partitioner!r}: one of {', '.join(PARTITIONERS)}")
    if isinstance(partitions, bool) or not isinstance(partitions, int):
        raise TypeError(f"partitions must be an int, got {type(partitions).__name__}")
    if partitions <= 0:
        raise ValueError(f"partitions must be at least 1, got {partitions}")
    if key is None:
        raise ValueError("a null key has no partition: the producer sends a record without key to a partition "
                         "of its choice (sticky or random), so no partition owns it")
    if isinstance(key, str):
        key = key.encode()
    elif not isinstance(key, (bytes, bytearray, memoryview)):
        raise TypeError(f"key must be bytes-like or str, got {type(key).__name__}")
    hash_of, empty_is_random = spec
    if empty_is_random and len(key) == 0:
        raise ValueError(f"an empty key has no partition with the {partitioner!r} partitioner: librdkafka sends "
                         "it to a random partition (the 'consistent' partitioner sends it to CRC32(b'') = 0)")
    return hash_of(key) % partitions


def owner_of(key: Key, *, topic: str, group_id: str, bootstrap_servers: str | None = None,
             client_config: Mapping[str, str | int | float | bool] | None = None, partitions: int | None = None,
             partitioner: str = "murmur2", timeout_s: float = 10.0,
             client: GroupMembersClient | None = None) -> PartitionOwner | None:
    """The member of consumer group ``group_id`` that holds ``key``'s partition of ``topic`` now.

    The partition is :func:`partition_for_key`; the owner is the member whose current assignment
    (DescribeConsumerGroups; Kafka's ``Admin.describeConsumerGroups``, KIP-848 ``consumer`` and
    classic groups alike) lists it. Each call asks the group coordinator again (one
    DescribeConsumerGroups, plus one Metadata request when ``partitions`` is None): membership
    changes with every rebalance, so an answer is only as fresh as the call.

    Args:
        key, partitioner: as in :func:`partition_for_key`.
        topic: the topic the group consumes.
        group_id: the consumer group (``group.id``).
        bootstrap_servers: ``host:port[,...]`` of the cluster (or ``bootstrap.servers`` in
            ``client_config``); unused when ``client`` is given.
        client_config: librdkafka settings of the admin client (security settings).
        partitions: the topic's partition count; None reads it from the cluster's metadata.
        timeout_s: seconds each request may take (10 s).
        client: a :class:`~materializer.adapters.group_members.GroupMembersClient` to reuse
            (one admin client, its connections kept) instead of a new one per call.

    Returns:
        The :class:`~materializer.adapters.partition_owner.PartitionOwner` (partition, member id,
        client id, host, group instance id; ``serving_url``: the member's query server, issue 39,
        carried in its client id), or None when no member holds the partition (the group
        has no member or does not exist, or a rebalance is moving the partition).

    Raises:
        ValueError, TypeError: as :func:`partition_for_key` raises them.
        TopicNotFoundError: ``partitions`` is None and the topic is not in the metadata.
        BrokerUnreachableError: the cluster did not answer within ``timeout_s``.
        KafkaSourceError: any other error of the requests (no bootstrap servers, authorization).
    """
    # argument errors before any request
    partition = partition_for_key(key, 1 if partitions is None else partitions, partitioner=partitioner)
    from materializer.adapters.group_members import GroupMembersClient

    members = client or GroupMembersClient(bootstrap_servers, client_config, timeout_s=timeout_s)
    if partitions is None:
        partition = partition_for_key(key, members.partition_count(topic), partitioner=partitioner)
    return members.partition_owners(group_id, topic).get(partition)
