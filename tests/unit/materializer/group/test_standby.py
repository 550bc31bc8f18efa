"""Standby replicas (:mod:`materializer.group.standby`): the planner's share of the placement, and
a member that follows standbys, is ready without them, never serves nor publishes them, and
serves one assigned to it after fetching only the delta."""

from __future__ import annotations

import time

import pytest

import materializer.group.member as member_module
from materializer.adapters.errors import BrokerUnreachableError, PartitionNotAssignedError
from materializer.adapters.group_members import GroupDescription, MemberName
from materializer.adapters.partition_owner import PartitionOwner
from materializer.config import MaterializerOptions
from materializer.group.assignment import AssignmentChanges
from materializer.group.standby import StandbyPlanner, standby_lag
from materializer.health import readiness
from materializer.materializer import Materializer
from materializer.stats import MaterializerStats
from tests.unit.materializer.test_materializer import TOPIC, FakeMembership, _produce, fake_source  # noqa: F401


def _owner(partition: int, member: str) -> PartitionOwner:
    return PartitionOwner(partition, member, "client", "/127.0.0.1")


def _description(owners: dict[int, str], members: tuple[str, ...] = ("member-1", "member-2")) -> GroupDescription:
    return GroupDescription(tuple(MemberName(m) for m in members), {p: _owner(p, m) for p, m in owners.items()})


def _wait(condition, what: str, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


def test_the_planner_hands_this_members_share_to_the_run_loop_and_keeps_it_when_the_describe_fails() -> None:
    answers: list[GroupDescription | Exception] = [
        _description({0: "a", 1: "b", 2: "c", 3: "a", 4: "b", 5: "c"}, ("a", "b", "c"))]
    woken = []
    assignment = AssignmentChanges(TOPIC, wake=lambda: woken.append(1))

    def describe() -> GroupDescription:
        answer = answers[-1]
        if isinstance(answer, Exception):
            raise answer
        return answer

    planner = StandbyPlanner(1, describe, lambda: "b", lambda: 6, assignment, label="test")
    mine = planner.plan()
    # three members owning two partitions each, one copy: b holds two standbys, none of its own (1, 4)
    assert mine is not None and len(mine) == 2 and not mine & {1, 4}
    assert assignment.standby == mine and woken == [1]
    assert planner.plan() == mine and woken == [1]  # the same placement is no change
    answers.append(BrokerUnreachableError("the coordinator does not answer"))
    assert planner.plan() is None and assignment.standby == mine and planner.error is not None
    # b is given partition 0 of a: the placement excludes it from b's standbys, whatever they were
    answers.append(_description({0: "b", 1: "b", 2: "c", 3: "a", 4: "b", 5: "c"}, ("a", "b", "c")))
    assert 0 not in (planner.plan() or {0}) and planner.error is None
    # a member the coordinator does not list yet places nothing (the others do not count it)
    assert StandbyPlanner(1, describe, lambda: "z", lambda: 6, AssignmentChanges(TOPIC), label="t").plan() is None
    with pytest.raises(ValueError):
        StandbyPlanner(0, describe, lambda: "b", lambda: 6, assignment, label="test")


def test_standby_lag_reads_the_latest_high_watermark_and_the_time_of_the_fetch_that_brought_it() -> None:
    stats = MaterializerStats()
    stats.next_offsets.update({1: 7, 2: 3})
    stats.latest_high_watermarks.update({1: 10, 2: 3})
    stats.high_watermarks_seen_ms.update({1: 1_000})
    assert standby_lag([2, 1, 5], stats, now_ms=1_250) == {
        1: {"log_end_offset": 7, "high_watermark": 10, "lag": 3, "fetched_ms_ago": 250},
        2: {"log_end_offset": 3, "high_watermark": 3, "lag": 0, "fetched_ms_ago": None},
        5: {"log_end_offset": 0, "high_watermark": None, "lag": None, "fetched_ms_ago": None}}


def test_a_member_follows_its_standbys_unserved_and_serves_a_promoted_one_after_the_delta(
        tmp_path, fake_source, monkeypatch) -> None:  # noqa: F811
    described = [_description({0: "member-1", 1: "member-2", 2: "member-2"})]

    class Members:  # DescribeConsumerGroups: member-2 owns 1 and 2, so member-1 holds their standbys
        def __init__(self, *args, **kwargs):
            pass

        def describe(self, group_id, topic):
            return described[-1]

    monkeypatch.setattr(member_module, "GroupMembership", FakeMembership)
    monkeypatch.setattr(member_module, "GroupMembersClient", Members)
    FakeMembership.initial = frozenset({0})
    data = fake_source.topic_data
    _produce(data, 0, 0, [b"a0", b"a1"])
    _produce(data, 1, 0, [b"b0", b"b1", b"b2"])
    _produce(data, 2, 0, [b"c0"])
    options = MaterializerOptions(fetch="consumer", group_id="g", standby_replicas=1, commit_group=None)
    assigned = []
    with Materializer("fake:9092", TOPIC, tmp_path, options=options) as m:
        m.on_assign(assigned.append)
        _wait(lambda: m.assignment is not None and m.assignment.standby == {1, 2}, "the standbys placed")
        m.run(until_caught_up=True)
        assert sorted(m.logs) == [0, 1, 2]
        assert m.served_partitions() == {0} and m.assigned_partitions() == {0} and assigned == []
        health = m.health
        assert health.caught_up and health.assigned_partitions == (0,) and set(health.standby_partitions) == {1, 2}
        with pytest.raises(PartitionNotAssignedError):
            m.view().get(b"b0")  # a standby's key is refused (its owner answers it)
        marker = m._session.marker.complete_facts()
        assert marker["group"]["partitions"] == [0]  # readers of the data dir never serve a standby
        m.run(until_caught_up=True)  # (the bounded run stops once its own partitions are caught up)
        while m.logs[1].log_end_offset < 3 or m.logs[2].log_end_offset < 1:
            m._step(False, _timers(m))
        probe = readiness(m.health, m.stats.lag())
        assert set(probe.detail["group"]["standby_partitions"]) == {"1", "2"} and "1" not in probe.detail["lag"]
        fetched = m.stats.records_fetched

        # Two records more on partition 1, then the coordinator gives it to this member.
        _produce(data, 1, 0, [b"b3", b"b4"])
        FakeMembership.instance.on_assign(frozenset({(TOPIC, 1)}))
        described.append(_description({0: "member-1", 1: "member-1", 2: "member-2"}))
        m._member.rebalance(m._session, close=m.close_partitions, took_on=m._took_on)  # as run's next round does
        # not served, nor caught up, before it fetched what the previous owner may have served
        assert 1 not in m.caught_up_partitions() and m.served_partitions() == {0} and not m.health.caught_up
        m.run(until_caught_up=True)
        assert m.stats.group_standby_promotions == 1
        assert m.stats.group_standby_promotion_offsets == 2  # offsets 3 and 4: the delta, nothing more
        assert m.stats.records_fetched - fetched == 2  # not fetched again from the start
        assert m.served_partitions() == {0, 1} and assigned == [frozenset({1})]
        assert m.view().get(b"b4") == b"v4" and m.view().get(b"b0") == b"v0"
        assert m._session.marker.complete_facts()["group"]["partitions"] == [0, 1]

        # Partition 1 goes back to member-2, whose standby it is here again: still open, but revoked
        # (on_revoke), no longer served nor named in the marker.
        revoked = []
        m.on_revoke(revoked.append)
        FakeMembership.instance.on_revoke(frozenset({(TOPIC, 1)}))
        described.append(_description({0: "member-1", 1: "member-2", 2: "member-2"}))
        _wait(lambda: m.assignment.standby == {1, 2}, "1 is a standby here again")
        m.run(until_caught_up=True)
        assert revoked == [frozenset({1})] and sorted(m.logs) == [0, 1, 2] and m.served_partitions() == {0}
        assert m._session.marker.complete_facts()["group"]["partitions"] == [0]

        # Partition 2 is no longer placed here: closed and kept (its folder stays until it expires).
        described.append(_description({0: "member-1", 1: "member-2", 2: "member-2"}, ("member-1", "member-2", "m4")))
        _wait(lambda: 2 not in m.assignment.standby, "the standby of 2 moved to m4")
        m.run(until_caught_up=True)
        assert 2 not in m.logs and (tmp_path / f"{TOPIC}-2").is_dir()
        assert m.stats.group_rebalances == 2  # the promotion and the revocation; standby changes are not rebalances


def _timers(m: Materializer):
    from materializer.periodic import RunTimers

    return RunTimers.starting(m.options, time.monotonic())
