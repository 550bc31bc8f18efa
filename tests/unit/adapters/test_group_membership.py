"""GroupMembership without a broker: the protocol choice from ApiVersions, refused settings."""

from __future__ import annotations

import pytest

from materializer.adapters.errors import GroupMembershipError, KafkaSourceError
from materializer.adapters.group_membership import (
    CONSUMER_GROUP_HEARTBEAT_API_KEY,
    GroupMembership,
    consumer_protocol_in_api_versions,
)
from materializer.adapters.kafka_source import KafkaSourceOptions


def test_consumer_protocol_needs_consumer_group_heartbeat_v1() -> None:
    """Kafka 4.0+ advertise ConsumerGroupHeartbeat v0-v1; 3.7-3.9 only the early-access v0, which
    librdkafka does not speak; older brokers not at all."""
    assert CONSUMER_GROUP_HEARTBEAT_API_KEY == 68
    assert consumer_protocol_in_api_versions({68: (0, 1), 1: (4, 17)})
    assert not consumer_protocol_in_api_versions({68: (0, 0), 1: (4, 17)})
    assert not consumer_protocol_in_api_versions({1: (0, 13)})


def test_settings_the_membership_owns_are_refused_before_connecting() -> None:
    for key in ("group.id", "group.protocol", "session.timeout.ms", "partition.assignment.strategy"):
        with pytest.raises(GroupMembershipError, match=key) as failure:
            GroupMembership("127.0.0.1:1", "g", ["t"], protocol="classic",
                            options=KafkaSourceOptions(client_config={key: "x"}))
        assert failure.value.group == "g" and isinstance(failure.value, KafkaSourceError)


def test_unknown_protocol_and_no_topic_are_refused() -> None:
    with pytest.raises(GroupMembershipError, match="unknown group protocol 'eager'"):
        GroupMembership("127.0.0.1:1", "g", ["t"], protocol="eager")  # type: ignore[arg-type]
    with pytest.raises(GroupMembershipError, match="no topic"):
        GroupMembership("127.0.0.1:1", "g", [], protocol="classic")


def test_an_unreachable_cluster_is_a_typed_error_naming_the_group() -> None:
    options = KafkaSourceOptions(request_timeout_ms=1_000)
    with pytest.raises(GroupMembershipError, match="'g'"):
        GroupMembership("127.0.0.1:1", "g", ["t"], protocol="classic", options=options)
