"""A continuous run's view of a Kafka cluster that is away, and the backoff of its retries.

:class:`BrokerOutage` is the one owner of that state: since when the cluster has not answered,
the next retry's wait (capped exponential backoff with jitter, as librdkafka's
``reconnect.backoff.ms`` / ``reconnect.backoff.max.ms``), and the one log line at each end of an
outage.
"""

from __future__ import annotations

import logging
import random
import socket
import threading
import time

__all__ = ["RETRY_BACKOFF_INITIAL_S", "RETRY_BACKOFF_MAX_S", "BrokerOutage"]

logger = logging.getLogger(__name__)

#: The first retry's backoff, doubled up to the maximum (librdkafka's reconnect.backoff.max.ms is
#: 10 s too), seconds.
RETRY_BACKOFF_INITIAL_S = 1.0
RETRY_BACKOFF_MAX_S = 10.0


class BrokerOutage:
    """Whether ``bootstrap_servers`` (``host:port[,host:port]``) answer, and how long to wait before
    trying again. Waits end early when ``stop_requested`` is set. Run-loop thread only, except
    :attr:`away`, which readers of health may read from any thread."""

    def __init__(self, bootstrap_servers: str, stop_requested: threading.Event) -> None:
        self.bootstrap_servers = bootstrap_servers
        self._stop_requested = stop_requested
        self.away_since: float | None = None  # time.monotonic(); None while the cluster answers
        self._backoff_s = RETRY_BACKOFF_INITIAL_S

    @property
    def away(self) -> bool:
        """True from a failed request until the cluster answers again."""
        return self.away_since is not None

    def next_backoff(self) -> float:
        """The next retry's wait, seconds: doubled from 1 s up to 10 s, with +-20% jitter (so that
        many instances do not retry in step)."""
        backoff = self._backoff_s
        self._backoff_s = min(backoff * 2, RETRY_BACKOFF_MAX_S)
        return backoff * random.uniform(0.8, 1.2)

    def wait(self, exc: BaseException) -> None:
        """The cluster did not answer (``exc`` says how): log it once per outage, then sleep the
        next backoff (or until stopped)."""
        if self.away_since is None:
            self.away_since = time.monotonic()
            logger.warning("%s; retrying with backoff (up to %.0f s) until it answers", exc, RETRY_BACKOFF_MAX_S)
        else:
            logger.debug("broker still unreachable: %s", exc)
        self._stop_requested.wait(self.next_backoff())

    def answered(self) -> None:
        """The cluster answered: end an outage (one log line) and reset the backoff."""
        self._backoff_s = RETRY_BACKOFF_INITIAL_S
        if self.away_since is not None:
            logger.warning("the Kafka cluster %s answers again (unreachable for %.1f s)", self.bootstrap_servers,
                           time.monotonic() - self.away_since)
            self.away_since = None

    def mark(self, away: bool) -> None:
        """Record whether the cluster answers, without a log line or a wait (another owner's wait
        for the same cluster, which logs once for all: a TopicSet joining its group)."""
        if not away:
            self.away_since = None
        elif self.away_since is None:
            self.away_since = time.monotonic()

    def bootstrap_answers(self, timeout_s: float = 1.0) -> bool:
        """True when a TCP connection to one of the bootstrap servers succeeds within ``timeout_s``
        seconds each (a cheap probe before a start that would block for a request timeout)."""
        for address in self.bootstrap_servers.split(","):
            host, _, port = address.strip().rpartition("://")[2].rpartition(":")  # PLAINTEXT://host:port too
            try:
                with socket.create_connection((host.strip("[]") or "localhost", int(port)), timeout=timeout_s):
                    return True
            except (OSError, ValueError):
                continue
        return False
