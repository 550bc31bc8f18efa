"""``partition_for_key`` (the producers' partitioners), its argument errors, and
``PartitionNotAssignedError``; the broker tests are tests/integration/test_routing.py."""

from __future__ import annotations

import random
import zlib

import pytest

import materializer
from materializer.adapters.errors import AdapterError, KafkaSourceError, PartitionNotAssignedError
from materializer.adapters.group_members import GroupMembersClient
from materializer.adapters.partition_owner import PartitionOwner
from materializer.group.routing import PARTITIONERS, owner_of, partition_for_key
from materializer.storage import _native

# Kafka's UtilsTest.testMurmur2 (clients/src/test/java/org/apache/kafka/common/utils/UtilsTest.java)
KAFKA_MURMUR2 = {
    b"21": -973932308,
    b"foobar": -790332482,
    b"a-little-bit-long-string": -985981536,
    b"a-little-bit-longer-string": -1486304829,
    b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
    b"abc": 479470107,
}

# librdkafka's unittest_murmur2 / unittest_fnv1a (src/rdmurmur2.c, src/rdfnv1a.c): the keys, and
# the hashes as int32 ("java_murmur2_results", "golang_hashfnv_results")
_UNALIGNED = b"PreAmbleWillBeRemoved,ThePrePartThatIs"
LIBRDKAFKA_KEYS = [b"kafka", b"giberish123456789", b"1234", b"234", b"34", b"4",
                   _UNALIGNED, _UNALIGNED[1:], _UNALIGNED[2:], _UNALIGNED[3:], b""]
LIBRDKAFKA_MURMUR2 = [0xd067cf64, 0x8f552b0c, 0x9fc97b14, 0xe7c009ca, 0x873930da, 0x5a4b5ca1,
                      0x78424f1c, 0x4a62b377, 0xe0e4e09e, 0x62b8b43f, 0x106e08d9]
LIBRDKAFKA_FNV1A = [0xd33c4e1, 0x77a58295, 0x23bdd03, 0x2dea3cd2, 0x740fa83e, 0x310ca263,
                    0x65cbd69c, 0x6e49c79a, 0x69eed356, 0x6abcc023, 0x7ee3623b]


def _int32(value: int) -> int:
    return value - (1 << 32) if value & 0x80000000 else value


def _reference_murmur2(data: bytes) -> int:
    """Utils.murmur2 re-expressed over Python ints (the test's own reading of the Java code)."""
    m, mask = 0x5BD1E995, 0xFFFFFFFF
    h = (0x9747B28C ^ len(data)) & mask
    whole = len(data) & ~3
    for i in range(0, whole, 4):
        k = (int.from_bytes(data[i:i + 4], "little") * m) & mask
        k ^= k >> 24
        h = ((h * m) & mask) ^ ((k * m) & mask)
    tail = data[whole:]
    if len(tail) == 3:
        h ^= tail[2] << 16
    if len(tail) >= 2:
        h ^= tail[1] << 8
    if tail:
        h = ((h ^ tail[0]) * m) & mask
    h ^= h >> 13
    h = (h * m) & mask
    h ^= h >> 15
    return _int32(h)


def _reference_fnv1a(data: bytes) -> int:
    h = 0x811C9DC5
    for byte in data:
        h = ((h ^ byte) * 0x01000193) & 0xFFFFFFFF
    signed = _int32(h)
    return (-signed) & 0xFFFFFFFF if signed < 0 else signed


def test_murmur2_is_kafkas_utils_murmur2_on_its_own_test_vectors():
    for key, expected in KAFKA_MURMUR2.items():
        assert _native.murmur2(key) == expected, key


def test_murmur2_and_fnv1a_match_librdkafkas_unit_test_vectors():
    for key, murmur, fnv in zip(LIBRDKAFKA_KEYS, LIBRDKAFKA_MURMUR2, LIBRDKAFKA_FNV1A, strict=True):
        assert _native.murmur2(key) == _int32(murmur), key
        assert _native.fnv1a(key) == fnv, key


def test_native_hashes_match_the_reference_for_every_length_and_byte():
    rng = random.Random(25)
    keys = [bytes(rng.randrange(256) for _ in range(length)) for length in range(0, 41) for _ in range(50)]
    keys += [b"\xff" * n for n in range(9)] + [b"\x80" * n for n in range(9)]
    for key in keys:
        assert _native.murmur2(key) == _reference_murmur2(key), key
        assert _native.fnv1a(key) == _reference_fnv1a(key), key


def test_fnv1a_of_int32_min_stays_0x80000000():
    # rd_fnv1a takes the absolute value of the signed hash; -INT32_MIN wraps to itself
    assert _reference_fnv1a(b"") == 0x7EE3623B
    assert all(_native.fnv1a(bytes([b])) < 1 << 32 for b in range(256))


def test_partition_for_key_is_javas_built_in_partitioner():
    for key, hashed in KAFKA_MURMUR2.items():
        for partitions in (1, 3, 12, 17, 1000):
            expected = (hashed & 0x7FFFFFFF) % partitions  # Utils.toPositive(murmur2) % numPartitions
            assert partition_for_key(key, partitions) == expected
            assert partition_for_key(key, partitions, partitioner="murmur2_random") == expected


def test_partition_for_key_consistent_and_fnv1a():
    for key in LIBRDKAFKA_KEYS[:-1]:
        for partitions in (1, 3, 12, 17):
            for name in ("consistent", "consistent_random"):
                assert partition_for_key(key, partitions, partitioner=name) == zlib.crc32(key) % partitions
            for name in ("fnv1a", "fnv1a_random"):
                assert partition_for_key(key, partitions, partitioner=name) == _reference_fnv1a(key) % partitions


def test_empty_key_has_a_partition_except_with_consistent_random():
    assert partition_for_key(b"", 17) == (0x106E08D9 & 0x7FFFFFFF) % 17
    assert partition_for_key(b"", 17, partitioner="consistent") == 0
    assert partition_for_key(b"", 17, partitioner="fnv1a_random") == 0x7EE3623B % 17
    with pytest.raises(ValueError, match="empty key .* 'consistent_random' .* random partition"):
        partition_for_key(b"", 17, partitioner="consistent_random")


def test_str_and_buffer_keys_are_their_bytes():
    for name in PARTITIONERS:
        expected = partition_for_key("prodüct-1".encode(), 17, partitioner=name)
        assert partition_for_key("prodüct-1", 17, partitioner=name) == expected
        assert partition_for_key(bytearray("prodüct-1".encode()), 17, partitioner=name) == expected
        assert partition_for_key(memoryview("prodüct-1".encode()), 17, partitioner=name) == expected


@pytest.mark.parametrize("partitioner", PARTITIONERS)
def test_a_null_key_has_no_partition(partitioner):
    with pytest.raises(ValueError, match="null key has no partition"):
        partition_for_key(None, 3, partitioner=partitioner)  # type: ignore[arg-type]


@pytest.mark.parametrize("partitions", [0, -1, -12])
def test_partitions_must_be_positive(partitions):
    with pytest.raises(ValueError, match=f"partitions must be at least 1, got {partitions}"):
        partition_for_key(b"k", partitions)


@pytest.mark.parametrize("partitions", [3.0, "3", True, None])
def test_partitions_must_be_an_int(partitions):
    with pytest.raises(TypeError, match="partitions must be an int"):
        partition_for_key(b"k", partitions)  # type: ignore[arg-type]


def test_unknown_partitioner_names_the_known_ones():
    with pytest.raises(ValueError, match="unknown partitioner 'random': one of murmur2, murmur2_random, consistent"):
        partition_for_key(b"k", 3, partitioner="random")


def test_a_key_that_is_not_bytes_like():
    with pytest.raises(TypeError, match="key must be bytes-like or str, got int"):
        partition_for_key(42, 3)  # type: ignore[arg-type]


def test_owner_of_checks_its_arguments_before_any_request():
    # no broker at all: the argument error comes first
    for bad in ({"partitions": 0}, {"partitioner": "sticky"}):
        with pytest.raises(ValueError):
            owner_of(b"k", topic="t", group_id="g", bootstrap_servers="127.0.0.1:1", **bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="null key"):
        owner_of(None, topic="t", group_id="g", bootstrap_servers="127.0.0.1:1")  # type: ignore[arg-type]


def test_group_members_client_needs_bootstrap_servers():
    with pytest.raises(KafkaSourceError, match="needs bootstrap servers"):
        GroupMembersClient()
    with pytest.raises(ValueError, match="timeout_s must be positive"):
        GroupMembersClient("127.0.0.1:1", timeout_s=0)


def test_partition_not_assigned_error_names_the_partition_and_its_owner():
    owner = PartitionOwner(partition=7, member_id="m-1", client_id="svc-a", host="/10.0.0.7",
                           group_instance_id="instance-a")
    error = PartitionNotAssignedError(7, owner, topic="prices", group_id="views")
    assert isinstance(error, AdapterError)
    assert (error.partition, error.owner, error.topic, error.group_id) == (7, owner, "prices", "views")
    assert str(error) == ("partition 7 of topic 'prices' is not assigned to this member: it is held by member 'm-1' "
                          "of group 'views' (client id 'svc-a', host '/10.0.0.7', group instance id 'instance-a')")


def test_partition_not_assigned_error_without_owner():
    error = PartitionNotAssignedError(3, None)
    assert (error.partition, error.owner, error.topic, error.group_id) == (3, None, None, None)
    assert error.looked_up is None
    assert str(error) == ("partition 3 is not assigned to this member: the member that holds it was not looked up: "
                          "materializer.owner_of(key, topic=..., group_id=..., bootstrap_servers=...) names it, as "
                          "does `materializer get` with --bootstrap-servers")
    asked = PartitionNotAssignedError(3, None, group_id="g", looked_up="no member of group 'g' holds it now")
    assert str(asked) == "partition 3 is not assigned to this member: no member of group 'g' holds it now"
    dynamic = PartitionNotAssignedError(3, PartitionOwner(3, "m-2", "svc-b", "/10.0.0.8"), topic="t")
    assert str(dynamic) == ("partition 3 of topic 't' is not assigned to this member: it is held by member 'm-2' "
                            "(client id 'svc-b', host '/10.0.0.8')")


def test_routing_names_are_public():
    assert materializer.partition_for_key is partition_for_key
    assert materializer.owner_of is owner_of
    assert materializer.PartitionOwner is PartitionOwner
    assert materializer.PartitionNotAssignedError is PartitionNotAssignedError
