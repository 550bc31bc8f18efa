"""BrokerOutage: the backoff of a continuous run's retries and the one log line at each end of an outage."""

import logging
import socket
import threading

import pytest

from materializer.broker_outage import RETRY_BACKOFF_INITIAL_S, RETRY_BACKOFF_MAX_S, BrokerOutage


def test_backoff_doubles_to_the_cap_with_jitter_and_resets_when_the_cluster_answers():
    outage = BrokerOutage("127.0.0.1:1", threading.Event())
    waits = [outage.next_backoff() for _ in range(7)]
    bases = [1.0, 2.0, 4.0, 8.0, 10.0, 10.0, 10.0]
    assert (RETRY_BACKOFF_INITIAL_S, RETRY_BACKOFF_MAX_S) == (1.0, 10.0)
    for wait, base in zip(waits, bases):
        assert 0.8 * base <= wait <= 1.2 * base
    outage.answered()
    assert 0.8 <= outage.next_backoff() <= 1.2


def test_an_outage_is_logged_once_at_each_end(caplog):
    stopped = threading.Event()
    stopped.set()  # the waits return at once
    outage = BrokerOutage("127.0.0.1:1", stopped)
    assert not outage.away
    with caplog.at_level(logging.DEBUG, logger="materializer.broker_outage"):
        outage.wait(ConnectionError("no answer"))
        outage.wait(ConnectionError("still no answer"))
        assert outage.away and outage.away_since is not None
        outage.answered()
        outage.answered()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2
    assert warnings[0].startswith("no answer; retrying with backoff")
    assert "answers again" in warnings[1]
    assert not outage.away


@pytest.mark.parametrize("listening", [True, False])
def test_bootstrap_answers_only_when_a_server_accepts_connections(listening):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    port = server.getsockname()[1]
    if listening:
        server.listen(1)
    else:
        server.close()
    try:
        outage = BrokerOutage(f"127.0.0.1:1,127.0.0.1:{port}", threading.Event())
        assert outage.bootstrap_answers(timeout_s=1.0) is listening
        # librdkafka takes a protocol prefix in bootstrap.servers too
        with_prefix = BrokerOutage(f"PLAINTEXT://127.0.0.1:{port}", threading.Event())
        assert with_prefix.bootstrap_answers(timeout_s=1.0) is listening
    finally:
        server.close()


def test_mark_records_an_outage_without_a_log_line_or_a_wait(caplog):
    outage = BrokerOutage("127.0.0.1:1", threading.Event())
    outage.mark(away=True)
    assert outage.away and outage.away_since is not None
    since = outage.away_since
    outage.mark(away=True)
    assert outage.away_since == since  # since the first
    outage.mark(away=False)
    assert not outage.away and not caplog.records


def _refusing_address() -> str:
    """host:port of a port nothing listens on (a connection to it is refused)."""
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{closed.getsockname()[1]}"


def test_an_unanswered_round_with_every_bootstrap_server_refusing_is_an_outage_at_once():
    from materializer.adapters.errors import BrokerUnreachableError

    outage = BrokerOutage(_refusing_address(), threading.Event())
    outage.after_round(None, bounded=False)  # answered: nothing to do
    assert not outage.away
    with pytest.raises(BrokerUnreachableError, match="accepts connections"):  # a continuous run waits it out
        outage.after_round(100.0, bounded=False)
    outage.after_round(100.0, bounded=True)  # a bounded run goes on until broker_timeout_ms, marked away
    assert outage.away
    outage.after_round(None, bounded=True)
    assert not outage.away


def test_an_unanswered_round_while_a_bootstrap_server_accepts_is_no_outage_yet():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(4)
        outage = BrokerOutage(f"{_refusing_address()},127.0.0.1:{server.getsockname()[1]}", threading.Event())
        outage.after_round(100.0, bounded=False)  # only broker_timeout_ms tells such a cluster away
        assert not outage.away
        outage.mark(away=True)
        outage.after_round(100.0, bounded=False)  # nor is an accepted connection an answer that ends an outage
        assert outage.away
        outage.after_round(None, bounded=False)
        assert not outage.away


def test_the_bootstrap_servers_are_probed_at_most_once_a_second(monkeypatch):
    from materializer.adapters.errors import BrokerUnreachableError

    outage = BrokerOutage(_refusing_address(), threading.Event())
    probes = []
    monkeypatch.setattr(outage, "bootstrap_answers", lambda: probes.append(1) or False)
    for _ in range(5):
        with pytest.raises(BrokerUnreachableError):
            outage.after_round(100.0, bounded=False)
    assert len(probes) == 1
