"""The kafka-python internals replica fetch (``adapters/replica_fetch/``) relies on, named one by one.

Replica fetch drives kafka-python's network layer below its public clients: ``fetcher.py`` builds a
``kafka.net.compat.KafkaNetClient`` and works through the client's private connection manager
(``client._manager``: bootstrap, metadata, send, the I/O thread ``_manager._net``), and
``connection.py`` encodes and decodes Fetch itself on its direct PLAINTEXT sockets. None of that is kafka-python's documented API,
so pyproject.toml bounds kafka-python (``<3.1``). These tests run without a broker and fail, naming
the missing or changed piece, when a kafka-python release moves one of them; raise the bound only
when they and ``tests/integration/test_replica_fetch.py`` pass on the new release.

The request layout checked here is Kafka's own (``RequestHeader`` v2 after KIP-482, the flexible
versions of ``FetchRequest.json``/``FetchResponse.json``: 12+), not kafka-python's output replayed.
"""

from __future__ import annotations

import inspect
import struct
import threading
from importlib.metadata import version

import pytest

from materializer.adapters.kafka_source import KafkaSourceOptions
from materializer.adapters.replica_fetch import replica_client_config

KAFKA_PYTHON = f"kafka-python {version('kafka-python')}"

# (object, attribute, parameters the call passes by name) for every private or undocumented
# callable replica_fetch/ uses, with where it uses them (all in fetcher.py: ReplicaFetcher).
MANAGER_NEEDS = [
    ("bootstrap", ()),                  # ReplicaFetcher.__init__: bootstrap(request_timeout_ms)
    ("run", ()),                        # metadata refresh, OffsetsForLeaderEpoch, ListOffsets: run(fn, *args)
    ("send", ("node_id",)),             # send(request, node_id=node) -> Future
    ("call_soon", ()),                  # call_soon(gather) -> Future with add_both
    ("close", ()),                      # ReplicaFetcher.close
]
CLUSTER_NEEDS = [
    ("set_topics", ()), ("refresh_metadata", ()), ("request_update", ()), ("topic_id", ()),
    ("topics", ("exclude_internal_topics",)), ("partitions_for_topic", ()), ("leader_for_partition", ()),
    ("leader_epoch_for_partition", ()), ("broker_metadata", ()),
]
NET_NEEDS = [("start", ()), ("stop", ("timeout_ms",))]


def _missing(owner: object, owner_name: str, needs: list[tuple[str, tuple[str, ...]]]) -> list[str]:
    problems = []
    for name, keywords in needs:
        member = getattr(owner, name, None)
        if not callable(member):
            problems.append(f"{owner_name}.{name} is gone")
            continue
        parameters = inspect.signature(member).parameters
        for keyword in keywords:
            if keyword not in parameters:
                problems.append(f"{owner_name}.{name} has no parameter {keyword!r} ({list(parameters)})")
    return problems


def _explain(problems: list[str]) -> str:
    return (f"{KAFKA_PYTHON} changed internals that adapters/replica_fetch/ uses: " + "; ".join(problems)
            + ". Adapt adapters/replica_fetch/, or keep kafka-python within the bound in pyproject.toml.")


@pytest.fixture
def client():
    """A KafkaNetClient built as ReplicaFetcher builds it, toward a port nothing listens on (it
    connects only when bootstrapped, which these tests never do)."""
    try:
        from kafka.net.compat import KafkaNetClient
    except ImportError as exc:
        pytest.fail(_explain([f"kafka.net.compat.KafkaNetClient cannot be imported ({exc})"]))
    built = KafkaNetClient(**replica_client_config(KafkaSourceOptions(), "127.0.0.1:1"))
    yield built
    manager = getattr(built, "_manager", None)
    if manager is not None:
        manager.close()
        manager._net.stop(timeout_ms=5_000)


def test_the_client_exposes_its_connection_manager_and_io_loop(client):
    manager = getattr(client, "_manager", None)
    assert manager is not None, _explain(["KafkaNetClient._manager is gone"])
    problems = _missing(manager, "KafkaNetClient._manager", MANAGER_NEEDS)
    net = getattr(manager, "_net", None)
    if net is None:
        problems.append("KafkaNetClient._manager._net is gone")
    else:
        problems += _missing(net, "KafkaNetClient._manager._net", NET_NEEDS)
    cluster = getattr(manager, "cluster", None)
    if cluster is None:
        problems.append("KafkaNetClient._manager.cluster is gone")
    else:
        problems += _missing(cluster, "KafkaNetClient._manager.cluster", CLUSTER_NEEDS)
        # ReplicaFetcher sets this key so a metadata request never re-creates a deleted topic;
        # a renamed key would be set and ignored, silently.
        if "allow_auto_create_topics" not in getattr(cluster, "config", {}):
            problems.append("KafkaNetClient._manager.cluster.config has no 'allow_auto_create_topics' key")
    if not hasattr(manager, "broker_version_data"):
        problems.append("KafkaNetClient._manager.broker_version_data is gone")
    assert not problems, _explain(problems)


def test_the_io_thread_runs_calls_and_call_soon_resolves_a_future_with_add_both(client):
    manager = client._manager
    manager._net.start()
    assert manager.run(lambda a, b: a + b, 2, 3) == 5, _explain(["_manager.run(fn, *args) does not return fn's value"])
    done = threading.Event()
    seen = []
    manager.call_soon(lambda: "gathered").add_both(lambda value: (seen.append(value), done.set()))
    assert done.wait(5), _explain(["_manager.call_soon(fn).add_both(callback) never called back"])
    assert seen == ["gathered"], _explain([f"_manager.call_soon(fn).add_both got {seen}, expected fn's value"])


def test_cluster_metadata_answers_for_an_unknown_topic_without_a_broker(client):
    from kafka.structs import TopicPartition

    cluster = client._manager.cluster
    cluster.set_topics(["prices"])
    assert not cluster.partitions_for_topic("prices")
    assert cluster.topic_id("prices") is None
    assert cluster.leader_for_partition(TopicPartition("prices", 0)) is None
    assert "prices" not in cluster.topics(exclude_internal_topics=False)


def test_broker_version_data_negotiates_fetch_v12_or_later_with_a_kafka_4_broker():
    # ReplicaFetcher.supports_diverging_epoch and _send_direct read _manager.broker_version_data.api_version(request);
    # against Kafka 4.0 (Fetch up to v17) the result must carry LastFetchedEpoch (v12+, KIP-320).
    from kafka.net.manager import BrokerVersionData  # what KafkaConnectionManager stores there
    from kafka.protocol.consumer import FetchRequest

    probe = FetchRequest(replica_id=-1, max_wait_ms=0, min_bytes=1, topics=[], min_version=4, max_version=12)
    assert BrokerVersionData((4, 0)).api_version(probe) == 12


def test_fetch_request_encodes_with_kafkas_request_header_v2():
    # connection.FetchConnection.send: API_VERSION set on the instance, with_header(), encode(framed, header).
    from kafka.protocol.consumer import FetchRequest

    request = FetchRequest(replica_id=-1, max_wait_ms=500, min_bytes=1, max_bytes=1 << 20, isolation_level=0,
                           topics=[], min_version=4, max_version=12)
    request.API_VERSION = 12
    request.with_header(correlation_id=7, client_id="kafka-materializer-replica-fetch")
    frame = request.encode(framed=True, header=True)
    (size,) = struct.unpack_from(">i", frame, 0)
    assert size == len(frame) - 4
    # RequestHeader v2: api_key int16 (Fetch = 1), api_version int16, correlation_id int32,
    # client_id nullable string (int16 length), then an empty tagged-field section.
    client_id = b"kafka-materializer-replica-fetch"
    expected_header = struct.pack(">hhih", 1, 12, 7, len(client_id)) + client_id + b"\x00"
    assert frame[4:4 + len(expected_header)] == expected_header


def test_fetch_response_knows_its_flexible_versions():
    # connection.FetchConnection.receive reads ResponseHeader v1's tagged fields by hand when the version
    # is flexible, then FetchResponse.decode(view, version=...).
    from kafka.protocol.consumer import FetchResponse

    assert not FetchResponse.flexible_version_q(11)
    assert FetchResponse.flexible_version_q(12)
    assert callable(getattr(FetchResponse, "decode", None))
