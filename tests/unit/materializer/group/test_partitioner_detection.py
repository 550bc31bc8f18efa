"""The producers' partitioner found from the keys a topic's partitions hold
(:mod:`materializer.group.partitioner`), and how readers route by it (issue 37, item 1).

Keys are placed here with :func:`partition_for_key`, whose agreement with Java's producer and with
librdkafka's partitioners is checked against the real broker in tests/integration/test_routing.py.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from materializer.adapters.errors import KeyPartitionUndecidedError, PartitionNotAssignedError
from materializer.adapters.partition_owner import PartitionOwner
from materializer.adapters.rocksdb_store import StateStore
from materializer.datadir.layout import state_dir
from materializer.group.partitioner import (
    KeyRouting,
    PartitionerDetection,
    SAMPLE_KEYS,
)
from materializer.group.routing import FAMILIES, PARTITIONERS, key_hash, partition_for_key
from materializer.storage.record_batch import Record
from materializer.view import MaterializedView, ServedPartitions

MURMUR2 = FAMILIES["murmur2"]
CRC32 = FAMILIES["crc32"]
FNV1A = FAMILIES["fnv1a"]


def _keys(n: int, prefix: str = "key") -> list[bytes]:
    return [f"{prefix}-{i}".encode() for i in range(n)]


def _placed(keys: list[bytes], count: int, partitioner: str) -> dict[int, list[bytes]]:
    by_partition: dict[int, list[bytes]] = {}
    for key in keys:
        by_partition.setdefault(partition_for_key(key, count, partitioner=partitioner), []).append(key)
    return by_partition


def _detect(by_partition: dict[int, list[bytes]], count: int, partitioner: str = "auto") -> PartitionerDetection:
    detection = PartitionerDetection(partitioner)
    for partition, keys in by_partition.items():
        detection.record(partition, keys[:SAMPLE_KEYS])
    return detection


@pytest.mark.parametrize("producer, family", [("murmur2_random", MURMUR2), ("consistent_random", CRC32),
                                              ("fnv1a_random", FNV1A)])
def test_a_few_dozen_keys_per_partition_tell_the_family(producer: str, family: tuple[str, ...]) -> None:
    routing = _detect(_placed(_keys(400), 6, producer), 6).routing(6)
    assert routing.candidates == family and routing.decided and routing.source == "detected"
    assert routing.partitioner == {"murmur2_random": "murmur2", "consistent_random": "consistent_random",
                                   "fnv1a_random": "fnv1a"}[producer]
    for key in _keys(50, "other"):  # one partition per key, the producer's
        assert routing.partitions_of(key, 6) == {partition_for_key(key, 6, partitioner=producer)}


def test_no_sample_leaves_every_partitioner_and_a_key_may_be_in_each_ones_partition() -> None:
    routing = PartitionerDetection().routing(6)
    assert routing.candidates == PARTITIONERS and not routing.decided and routing.partitioner is None
    key = next(k for k in _keys(100) if len({partition_for_key(k, 6, partitioner=p) for p in
                                              ("murmur2", "consistent", "fnv1a")}) == 3)
    assert routing.partitions_of(key, 6) == {partition_for_key(key, 6, partitioner=p)
                                             for p in ("murmur2", "consistent", "fnv1a")}


def test_a_tiny_partition_leaves_several_candidates() -> None:
    # one key, placed in partition 2 of 6 by every family: the data cannot tell them apart yet
    key = next(k for k in _keys(5000) if all(key_hash(f, k) % 6 == 2 for f in FAMILIES))
    routing = _detect({2: [key]}, 6).routing(6)
    assert routing.candidates == PARTITIONERS and not routing.decided
    assert "not known yet" in routing.describe()


def test_keys_in_partition_zero_rule_out_nothing() -> None:
    # a topic may once have had one partition: every key there fits every partitioner
    crc32_keys = _placed(_keys(400), 6, "consistent")[0]
    routing = _detect({0: crc32_keys}, 6).routing(6)
    assert routing.candidates == PARTITIONERS
    # murmur2 and FNV-1a place them in partition 0 only under one partition, CRC32 under six: not
    # taken for growth while CRC32 fits as they are (a read found in its partition is answered)
    assert routing.grown == ()


def test_keys_written_before_the_partition_count_grew_keep_their_partitioner() -> None:
    keys = _keys(400)
    before = _placed(keys[:300], 4, "murmur2")  # written while the topic had 4 partitions
    after = _placed(keys[300:], 6, "murmur2")  # then grown to 6
    merged = {p: before.get(p, []) + after.get(p, []) for p in range(6)}
    # the keys from before are not where murmur2 puts them over 6 partitions...
    assert any(partition_for_key(k, 6) != p for p, ks in before.items() for k in ks)
    detection = _detect(merged, 6)
    routing = detection.routing(6)
    # ... yet they rule murmur2 out of no count: it stays, and the other families are ruled out
    assert routing.candidates == MURMUR2, routing
    # the partitions holding keys from before are reported, and murmur2 is known to have placed
    # keys under a smaller count: a key may be in its partition under 1..6 partitions
    assert detection.unplaced(6) and detection.unplaced(6) <= set(before)
    assert routing.grown == MURMUR2 and routing.live_in_several and "count grew" in routing.describe()
    key = keys[0]
    assert routing.partitions_of(key, 6) == {partition_for_key(key, n) for n in range(1, 7)}
    # without keys from before, nothing says the count grew: one partition per key
    fresh = _detect(after, 6).routing(6)
    assert fresh.grown == () and fresh.partitions_of(key, 6) == {partition_for_key(key, 6)}
    assert KeyRouting.from_facts(routing.facts()) == routing


def test_a_count_the_run_saw_grow_makes_every_candidate_grown() -> None:
    detection = _detect(_placed(_keys(400), 6, "murmur2"), 6)  # every sampled key where 6 partitions put it
    detection.saw_partition_count(6)
    assert detection.routing(6).grown == ()
    detection.saw_partition_count(4)  # e.g. a view of a run that began at 4 and saw 6 later
    grown = detection.routing(6)
    assert grown.candidates == MURMUR2 and grown.grown == MURMUR2
    configured = PartitionerDetection("murmur2")
    configured.saw_partition_count(4)
    assert configured.routing(6).grown == ("murmur2",) and configured.routing(4).grown == ()


def _key_moved_by_growth(old: int, new: int, prefix: str = "moved") -> bytes:
    return next(k for k in _keys(10_000, prefix) if partition_for_key(k, old) != partition_for_key(k, new))


def test_after_growth_a_key_live_in_two_partitions_answers_the_latest_or_is_refused(store) -> None:
    # K written while the topic had 4 partitions, again after it grew to 6: live in both partitions
    key = _key_moved_by_growth(4, 6)
    old_p, new_p = partition_for_key(key, 4), partition_for_key(key, 6)
    store.apply({old_p: [Record(0, 1_000, key, b"before")], new_p: [Record(0, 2_000, key, b"after")]},
                {old_p: 1, new_p: 1})
    routing = KeyRouting(MURMUR2, "detected", MURMUR2)
    maybe = routing.partitions_of(key, 6)
    assert {old_p, new_p} <= maybe

    def view_serving(partitions: set[int]) -> MaterializedView:
        group = ServedPartitions("t", "g", lambda: frozenset(partitions), lambda: 6, lambda: routing)
        return MaterializedView(store, served=group)

    assert view_serving(set(range(6))).get(key) == b"after"  # every partition it may be in: the latest
    for partitions in ({new_p}, {old_p}, set(range(6)) - {old_p}):
        # one of them elsewhere: the other member may hold a later value (or this one is the later)
        with pytest.raises(KeyPartitionUndecidedError) as refused:
            view_serving(partitions).get(key)
        assert "its latest value is not known here" in str(refused.value) and "count grew" in str(refused.value)
    absent = _key_moved_by_growth(4, 6, prefix="absent")
    assert view_serving(set(range(6))).get(absent) is None
    # undecided without growth, the same key found in one candidate partition is answered from it
    undecided = KeyRouting(MURMUR2 + CRC32, "detected")
    group = ServedPartitions("t", "g", lambda: frozenset({new_p}), lambda: 6, lambda: undecided)
    if new_p in undecided.partitions_of(key, 6):
        assert MaterializedView(store, served=group).get(key) == b"after"


def test_a_count_change_reconsiders_the_samples() -> None:
    # keys written over 9 partitions, sampled while this member still read 6: over 6 no count up to
    # 6 places them, over 9 the producers' count does (the count read late, never the data wrong)
    placed = {p: ks for p, ks in _placed(_keys(600), 9, "murmur2").items() if p < 6}
    detection = _detect(placed, 6)
    assert "murmur2" not in detection.routing(6).candidates
    assert detection.routing(9).candidates == MURMUR2


def test_no_known_partitioner_means_any_partition() -> None:
    # records produced to explicit partitions (or by a custom partitioner)
    placed = {p: _keys(40, f"p{p}") for p in range(6)}
    routing = _detect(placed, 6).routing(6)
    assert routing.candidates == () and not routing.decided and routing.partitioner is None
    assert routing.partitions_of(b"anything", 6) == frozenset(range(6))
    assert "no known partitioner" in routing.describe()


def test_empty_keys() -> None:
    # librdkafka's consistent_random sends an empty key to a random partition, consistent to CRC32(b"") = 0,
    # murmur2 and FNV-1a hash it
    crc32_keys = _placed(_keys(400), 6, "consistent_random")
    empty_elsewhere = dict(crc32_keys)
    empty_elsewhere[3] = [b"", *crc32_keys[3]]
    routing = _detect(empty_elsewhere, 6).routing(6)
    assert routing.candidates == ("consistent_random",)
    assert routing.partitions_of(b"", 6) == frozenset(range(6))  # it may be anywhere
    empty_at_zero = dict(crc32_keys)
    empty_at_zero[0] = [b"", *crc32_keys[0]]
    assert _detect(empty_at_zero, 6).routing(6).candidates == CRC32
    murmur2_keys = _placed([b"", *_keys(400)], 6, "murmur2")
    routing = _detect(murmur2_keys, 6).routing(6)
    assert routing.candidates == MURMUR2
    assert routing.partitions_of(b"", 6) == {partition_for_key(b"", 6)}


def test_a_configured_partitioner_the_data_contradicts_is_named_with_the_one_that_fits() -> None:
    placed = _placed(_keys(400), 6, "consistent_random")
    detection = _detect(placed, 6, partitioner="murmur2")
    routing = detection.routing(6)  # readers trust it (its misplaced keys taken as written before growth)...
    assert routing.candidates == ("murmur2",) and routing.source == "configured"
    problem = detection.contradiction(6)  # ... and the run fails
    assert problem is not None
    assert "'murmur2'" in problem and "--partitioner consistent" in problem and "consistent_random" in problem
    assert "key b'key-" in problem and "answer absent" in problem
    assert _detect(placed, 6, partitioner="consistent_random").contradiction(6) is None
    explicit = _detect({p: _keys(40, f"p{p}") for p in range(6)}, 6, partitioner="murmur2").contradiction(6)
    assert explicit is not None and "no known partitioner" in explicit


def test_the_marker_facts_round_trip_and_old_markers_keep_their_meaning() -> None:
    routing = KeyRouting(("murmur2", "murmur2_random", "fnv1a"), "detected")
    facts = routing.facts()
    assert facts == {"partitioner": None, "partitioner_candidates": ["murmur2", "murmur2_random", "fnv1a"],
                     "partitioner_source": "detected", "partitioner_grown": []}
    assert KeyRouting.from_facts(facts) == routing
    assert KeyRouting.from_facts(KeyRouting(MURMUR2, "detected").facts()).partitioner == "murmur2"
    # written before detection: the partitioner alone (murmur2 when not even that), as configured
    assert KeyRouting.from_facts({"partitioner": "consistent_random"}) == KeyRouting.configured("consistent_random")
    assert KeyRouting.from_facts({}) == KeyRouting.configured("murmur2")
    # a name this version does not know: no candidate, a key may be anywhere
    assert KeyRouting.from_facts({"partitioner_candidates": ["sticky"]}).candidates == ()


def test_sampling_is_bounded_and_follows_growth(tmp_path: Path) -> None:
    store = StateStore(state_dir(tmp_path, "t"))
    try:
        placed = _placed(_keys(2000), 4, "consistent_random")

        def apply(limit: int) -> None:
            records = {p: [Record(i, 1, k, b"v") for i, k in enumerate(ks[:limit])] for p, ks in placed.items()}
            store.apply(records, {p: len(rs) for p, rs in records.items()})

        apply(10)
        detection = PartitionerDetection()
        assert detection.sample(store) == [0, 1, 2, 3]
        assert detection.sampled_keys == 40  # a partition with fewer keys than a sample: all of them
        assert detection.sample(store) == []  # nothing grew
        apply(100)
        assert detection.sample(store) == [0, 1, 2, 3]  # grew (and the samples were short)
        assert detection.sampled_keys == 4 * SAMPLE_KEYS
        apply(150)
        assert detection.sample(store) == []  # not twice the offsets of the last sample yet
        apply(250)
        assert detection.sample(store) == [0, 1, 2, 3]
        assert detection.routing(4).candidates == CRC32
        samples = {tuple(s.hashes) for s in itertools.chain.from_iterable(detection._samples.values())}
        assert len(samples) == 4 * SAMPLE_KEYS  # distinct keys, from anywhere in each partition's range
    finally:
        store.close()


@pytest.fixture
def store(tmp_path: Path):
    store = StateStore(state_dir(tmp_path, "t"))
    yield store
    store.close()


def _key_split_by_families(count: int, crc32_partition: int | None = None, prefix: str = "probe") -> bytes:
    """A key that murmur2 and CRC32 put in different partitions of ``count``."""
    return next(k for k in _keys(10_000, prefix)
                if partition_for_key(k, count) != partition_for_key(k, count, partitioner="consistent")
                and (crc32_partition is None or partition_for_key(k, count, partitioner="consistent") == crc32_partition))


def test_an_undecided_read_looks_in_each_candidate_partition_and_refuses_absent_when_one_is_elsewhere(store) -> None:
    routing = KeyRouting(MURMUR2 + CRC32, "detected")
    live = _key_split_by_families(4)
    crc32_p, murmur2_p = partition_for_key(live, 4, partitioner="consistent"), partition_for_key(live, 4)
    store.apply({crc32_p: [Record(0, 1, live, b"value")]}, {crc32_p: 1})
    served = {crc32_p}
    owners = {murmur2_p: PartitionOwner(murmur2_p, "member-2", "svc", "/10.0.0.2")}
    group = ServedPartitions("t", "g", lambda: frozenset(served), lambda: 4, lambda: routing, owners=lambda: owners)
    view = MaterializedView(store, served=group)
    assert view.get(live) == b"value"  # found in a candidate partition served here: answered
    assert view.get_many([live]) == {live: b"value"} and live in view
    absent = _key_split_by_families(4, crc32_partition=crc32_p, prefix="absent")  # its murmur2 partition is not served here
    with pytest.raises(KeyPartitionUndecidedError) as refused:
        view.get(absent)
    error = refused.value
    assert isinstance(error, PartitionNotAssignedError)
    other = partition_for_key(absent, 4)
    assert error.partitions == {crc32_p, other} and error.unserved == {other} and error.partition == other
    assert f"may be in partitions {', '.join(map(str, sorted({crc32_p, other})))}" in str(error)
    assert "not known yet" in str(error) and "--partitioner" in str(error)
    if other == murmur2_p:
        assert "held by member 'member-2'" in str(error)
    else:
        assert "no member of group 'g' holds it now" in str(error)
    served.add(other)  # every candidate partition served here: absent is the answer
    assert view.get(absent) is None and absent not in view


def test_a_refusal_names_the_owner_when_the_group_can_be_asked(store) -> None:
    owner = PartitionOwner(1, "member-7", "svc-b", "/10.0.0.7")
    key = next(k for k in _keys(100) if partition_for_key(k, 2) == 1)
    asked = ServedPartitions("t", "g", lambda: frozenset({0}), lambda: 2, owners=lambda: {1: owner})
    with pytest.raises(PartitionNotAssignedError, match="held by member 'member-7' of group 'g'"):
        MaterializedView(store, served=asked).get(key)

    def unreachable() -> dict[int, PartitionOwner]:
        raise OSError("no broker")

    failing = ServedPartitions("t", "g", lambda: frozenset({0}), lambda: 2, owners=unreachable)
    with pytest.raises(PartitionNotAssignedError, match=r"asking group 'g' which member holds it failed \(no broker\)"):
        MaterializedView(store, served=failing).get(key)
    unasked = ServedPartitions("t", "g", lambda: frozenset({0}), lambda: 2)
    with pytest.raises(PartitionNotAssignedError, match="was not looked up: materializer.owner_of"):
        MaterializedView(store, served=unasked).get(key)


def test_an_undecided_read_whose_other_partition_is_catching_up_here_says_so_without_asking_the_group(store) -> None:
    key = _key_split_by_families(4)
    crc32_p, murmur2_p = partition_for_key(key, 4, partitioner="consistent"), partition_for_key(key, 4)

    def not_asked() -> dict[int, PartitionOwner]:
        raise AssertionError("the group is asked only for partitions other members hold")

    group = ServedPartitions("t", "g", lambda: frozenset({crc32_p}), lambda: 4,
                             lambda: KeyRouting(MURMUR2 + CRC32, "detected"),
                             assigned=lambda: frozenset({crc32_p, murmur2_p}), owners=not_asked)
    with pytest.raises(KeyPartitionUndecidedError) as refused:
        MaterializedView(store, served=group).get(key)
    assert refused.value.catching_up and refused.value.unserved == {murmur2_p}
    assert f"partition {murmur2_p}: assigned to this member of group 'g' but still catching up" in str(refused.value)
    assert "retry this member once it has caught up" in str(refused.value)


def test_a_routings_partitions_are_each_candidates_partition_for_every_set_of_candidates():
    # partitions_of hashes a non-empty key once per family (the multi-get's hot path): the same set
    # as asking partition_for_key of every candidate, grown or not, for empty keys too
    keys = [b"", b"k", b"user:1", bytes(range(40)), "ключ".encode()]
    for size in range(1, 4):
        for candidates in itertools.combinations(PARTITIONERS, size):
            for grown in ((), candidates[:1]):
                routing = KeyRouting(candidates, "detected", grown)
                for key in keys:
                    for count in (1, 3, 7):
                        try:
                            expected = {partition_for_key(key, n, partitioner=name) for name in candidates
                                        for n in (range(1, count + 1) if name in grown else (count,))}
                        except ValueError:  # an empty key under consistent_random: any partition
                            expected = set(range(count))
                        assert routing.partitions_of(key, count) == expected, (candidates, grown, key, count)
