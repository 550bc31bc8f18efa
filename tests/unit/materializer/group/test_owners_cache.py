"""A group member asks the group coordinator who holds a partition at most once a second, and anew
after its own rebalance (materializer.group.owners_cache), not once per refused read."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from materializer.adapters.partition_owner import PartitionOwner
from materializer.config import MaterializerOptions
from materializer.group import member as member_module
from materializer.group.member import GroupMember
from materializer.group.owners_cache import OWNERS_TTL_S, OwnersCache
from materializer.stats import MaterializerStats

OWNER = PartitionOwner(1, "member-b", "c;serve=http://b:1", "/10.0.0.2")


def test_an_answer_is_reused_for_the_ttl_then_asked_again():
    now, epoch, asked = [100.0], [0], []

    def describe():
        asked.append(now[0])
        return {1: OWNER}

    cache = OwnersCache(describe, lambda: epoch[0], clock=lambda: now[0])
    assert [cache() for _ in range(50)] == [{1: OWNER}] * 50 and len(asked) == 1
    now[0] += OWNERS_TTL_S - 0.001
    cache()
    assert len(asked) == 1
    now[0] += 0.001  # 1 s after it was asked: stale
    cache()
    assert len(asked) == 2
    epoch[0] += 1  # a rebalance here: asked again at once
    cache()
    assert len(asked) == 3 and cache.describes == 3
    cache.clear()
    cache()
    assert len(asked) == 4
    now[0] -= 10  # a clock that went back: not trusted
    cache()
    assert len(asked) == 5


def test_a_failure_is_kept_as_long_and_raised_to_every_caller():
    now, asked = [0.0], []

    def describe():
        asked.append(1)
        raise RuntimeError("the coordinator timed out")

    cache = OwnersCache(describe, lambda: 0, clock=lambda: now[0])
    for _ in range(5):
        with pytest.raises(RuntimeError, match="timed out"):
            cache()
    assert len(asked) == 1
    now[0] += OWNERS_TTL_S
    with pytest.raises(RuntimeError):
        cache()
    assert len(asked) == 2


def test_concurrent_callers_wait_for_the_one_describe_in_flight():
    release, asked = threading.Event(), []

    def describe():
        asked.append(1)
        release.wait(10)
        return {1: OWNER}

    cache = OwnersCache(describe, lambda: 0)
    answers: list[object] = []
    threads = [threading.Thread(target=lambda: answers.append(cache())) for _ in range(20)]
    for thread in threads:
        thread.start()
    release.set()
    for thread in threads:
        thread.join(10)
    assert answers == [{1: OWNER}] * 20 and len(asked) == 1


def test_a_members_refused_reads_ask_the_coordinator_once_per_second_and_after_its_rebalance(monkeypatch):
    described = []

    class Members:  # the admin client: counts DescribeConsumerGroups
        def __init__(self, *args, **kwargs):
            pass

        def partition_owners(self, group_id, topic):
            described.append((group_id, topic))
            return {1: OWNER}

    monkeypatch.setattr(member_module, "GroupMembersClient", Members)
    member = GroupMember("b:9092", "t", Path("unused"), MaterializerOptions(group_id="g"), MaterializerStats(),
                         threading.Event(), wake=lambda: None)
    for _ in range(100):  # a burst of refused reads (forwarded gets, a rebalance's 503s)
        assert member.owners() == {1: OWNER}
    assert described == [("g", "t")]
    member.assignment.assign({("t", 0)})  # this member's rebalance callback
    assert member.owners() == {1: OWNER} and len(described) == 2
