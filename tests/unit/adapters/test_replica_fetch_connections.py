"""The replica fetcher's direct connections across threads (adapters/replica_fetch/connection.py): a connection
dropped while the receive thread reads it is shut down at once but keeps its file descriptor until
that thread is done, so a new socket can never get the same number while a recv may still use it
(which let a stopped group member's close wait 30 s on another connection's idle socket)."""

from __future__ import annotations

import socket
import threading

import kafka.errors as kafka_errors
import pytest

from materializer.adapters.replica_fetch import ReplicaFetcher
from materializer.adapters.replica_fetch.connection import DirectConnections, FetchConnection


@pytest.fixture
def silent_broker():
    """A TCP listener that accepts connections and never answers."""
    server = socket.create_server(("127.0.0.1", 0))
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.1)
        while not stop.is_set():
            try:
                accepted.append(server.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield server.getsockname()[1]
    stop.set()
    thread.join()
    for sock in accepted:
        sock.close()
    server.close()


def _direct_with(connections: dict[int, FetchConnection]) -> DirectConnections:
    """DirectConnections holding ``connections`` (no cluster: the connection bookkeeping alone)."""
    direct = DirectConnections("test")
    direct._by_node = dict(connections)
    return direct


def _fetcher_with(connections: dict[int, FetchConnection]) -> ReplicaFetcher:
    """A ReplicaFetcher holding only ``connections`` (no cluster: the connection bookkeeping alone)."""
    fetcher = object.__new__(ReplicaFetcher)
    fetcher._connections = _direct_with(connections)
    return fetcher


def test_a_dropped_connection_wakes_its_reader_and_keeps_its_descriptor_until_released(silent_broker) -> None:
    connection = FetchConnection("127.0.0.1", silent_broker, "test", timeout_s=30.0)
    direct = _direct_with({1: connection})
    connection._pending = (1, 12)  # a Fetch is outstanding: receive() waits for its response
    failure: list[BaseException] = []
    reader = threading.Thread(target=lambda: failure.append(pytest.raises(kafka_errors.KafkaConnectionError,
                                                                           connection.receive).value))
    reader.start()
    direct.drop(1)
    reader.join(10)
    assert not reader.is_alive() and failure, "the blocked receive was not woken"
    assert direct._by_node == {}
    assert connection._sock.fileno() != -1  # still ours: no new socket can take its number
    direct.close_retired()
    assert connection._sock.fileno() == -1 and direct._retired == []


def test_a_failed_old_connection_does_not_drop_the_one_opened_since(silent_broker) -> None:
    old = FetchConnection("127.0.0.1", silent_broker, "test", timeout_s=30.0)
    new = FetchConnection("127.0.0.1", silent_broker, "test", timeout_s=30.0)
    direct = _direct_with({1: new})
    direct.drop(1, old)  # the receive thread reports the old one's failure late
    assert direct._by_node == {1: new} and new._sock.fileno() != -1
    direct.drop(1, new)
    assert direct._by_node == {} and direct._retired == [new]
    direct.close_retired()
    old.close()


def test_an_outage_counts_from_the_unanswered_request_not_from_its_timeout() -> None:
    """A broker that accepts connections but never answers (a stopped JVM) fails a fetch only when
    the request times out (request timeout + 5 s): that failure alone already spans the broker
    timeout, so the outage is reported at once (it took a second timed-out fetch before: a 60 s
    SIGSTOP of the broker never showed in health with the default 30 s timeouts)."""
    from types import SimpleNamespace
    import time

    from materializer.adapters.errors import BrokerUnreachableError
    from materializer.adapters.kafka_source import KafkaSourceOptions

    def fetcher() -> ReplicaFetcher:
        made = _fetcher_with({})
        made.bootstrap_servers, made.topic = "127.0.0.1:9092", "prices"
        made.options = KafkaSourceOptions(broker_timeout_ms=1_000)
        made._manager = SimpleNamespace(cluster=SimpleNamespace(request_update=lambda: None))
        made._unreachable_since = None
        return made

    timed_out = {1: kafka_errors.KafkaTimeoutError("no Fetch response within 6 s")}
    with pytest.raises(BrokerUnreachableError, match="unreachable for 6 s"):
        fetcher()._note_unreachable(timed_out, sent_at=time.monotonic() - 6.0)
    refused = fetcher()
    refused._note_unreachable({1: kafka_errors.KafkaConnectionError("refused")}, sent_at=time.monotonic())
    assert refused._unreachable_since is not None  # a refusal right away: counted from now, no error yet


def test_abandon_drops_the_fetch_in_flight_and_its_connections(silent_broker) -> None:
    """A caller that failed between send and receive abandons the fetch: nothing is in flight any
    more (the next send may go), and the connection it went out on is dropped, so an answer still
    coming on it is never read as the answer to the next request."""
    connection = FetchConnection("127.0.0.1", silent_broker, "test", timeout_s=30.0)
    fetcher = _fetcher_with({1: connection})
    fetcher._pending = (threading.Event(), {"sent": {1: connection}})
    assert fetcher.in_flight
    assert fetcher.abandon() is True
    direct = fetcher._connections
    assert not fetcher.in_flight and direct._by_node == {} and direct._retired == [connection]
    assert fetcher.abandon() is False  # nothing in flight: nothing to do
    direct.close_retired()


def test_leaderless_names_each_partition_the_last_fetch_could_not_ask_a_leader_for() -> None:
    from materializer.adapters.replica_fetch import FetchPosition, PartitionData

    fetcher = _fetcher_with({})
    state = {"positions": {p: FetchPosition(0) for p in range(5)}, "epochs": {0: 1, 1: 1, 2: 1, 3: 1},
             "by_node": {1: [0, 1], 2: [2, 3]},
             "errors": {2: kafka_errors.KafkaConnectionError("127.0.0.1:9: Connection refused")}}
    answered = [PartitionData(0, 0, b"", 10, 10, 0),
                PartitionData(1, 0, b"", -1, -1, -1, error=kafka_errors.NotLeaderForPartitionError.errno)]
    fetcher._note_leaderless(state, answered)
    assert fetcher.leaderless() == {
        1: "its leader answered NotLeaderForPartitionError; looking the leader up again",
        2: "its leader, broker 2, does not answer (KafkaConnectionError: 127.0.0.1:9: Connection refused)",
        3: "its leader, broker 2, does not answer (KafkaConnectionError: 127.0.0.1:9: Connection refused)",
        4: "no leader in the cluster's metadata"}
    fetcher._note_leaderless({**state, "errors": {}}, answered[:1] + [PartitionData(p, 0, b"", 1, 1, 0)
                                                                        for p in (1, 2, 3)])
    assert fetcher.leaderless() == {4: "no leader in the cluster's metadata"}
