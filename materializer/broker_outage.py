"""A continuous run's view of a Kafka cluster that is away, and the backoff of its retries.

:class:`BrokerOutage` is the one owner of that state: since when the cluster has not answered,
the next retry's wait (capped exponential backoff with jitter, as librdkafka's
``reconnect.backoff.ms`` / ``reconnect.backoff.max.ms``), and the one log line at each end of an
outage.

When the cluster is away: a request failed for ``broker_timeout_ms`` (a broker that accepts
connections but does not answer, a stopped JVM), or at once when a fetch round got no answer and
no bootstrap server accepts a TCP connection (:meth:`BrokerOutage.after_round`): a refused
connection is a definite answer, so readiness drops within a second of the whole cluster going
down rather than after ``broker_timeout_ms``. A bounded run still gives up only after
``broker_timeout_ms`` (``--timeout``): a short restart does not fail a job.
"""

from __future__ import annotations

import logging
import random
import socket
import threading
import time
from collections.abc import Callable

from materializer.adapters.errors import BrokerUnreachableError, KafkaSourceError

__all__ = ["RETRY_BACKOFF_INITIAL_S", "RETRY_BACKOFF_MAX_S", "BrokerOutage"]

logger = logging.getLogger(__name__)

#: The first retry's backoff, doubled up to the maximum (librdkafka's reconnect.backoff.max.ms is
#: 10 s too), seconds.
RETRY_BACKOFF_INITIAL_S = 1.0
RETRY_BACKOFF_MAX_S = 10.0

#: After failed fetches, the bootstrap servers are probed at most this often, seconds (a round that
#: fails again within it reuses the last probe's answer).
BOOTSTRAP_PROBE_INTERVAL_S = 1.0


class BrokerOutage:
    """Whether ``bootstrap_servers`` (``host:port[,host:port]``) answer, and how long to wait before
    trying again. Waits end early when ``stop_requested`` is set; ``on_away`` is called when
    :meth:`wait` finds an outage beginning (a run's readiness drops). Run-loop thread only, except
    :attr:`away`, which readers of health may read from any thread."""

    def __init__(self, bootstrap_servers: str, stop_requested: threading.Event,
                 on_away: Callable[[], None] | None = None) -> None:
        self.bootstrap_servers = bootstrap_servers
        self._stop_requested = stop_requested
        self._on_away = on_away
        self.away_since: float | None = None  # time.monotonic(); None while the cluster answers
        self._backoff_s = RETRY_BACKOFF_INITIAL_S
        self._probed: tuple[float, bool] | None = None  # (when, answered) of the last after_round probe

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
            if self._on_away is not None:
                self._on_away()
            logger.warning("%s; retrying with backoff (up to %.0f s) until it answers", exc, RETRY_BACKOFF_MAX_S)
        else:
            logger.debug("broker still unreachable: %s", exc)
        self._stop_requested.wait(self.next_backoff())

    def retry(self, attempt: Callable[[], None], *, bounded: bool, timeout_s: float, beat: Callable[[], None],
              topic_missing: Callable[[KafkaSourceError], None] | None = None) -> bool:
        """Call ``attempt`` (a run's start) until it succeeds; then the outage ends (:meth:`answered`).

        A continuous run (not ``bounded``) probes the bootstrap servers first, so a stop is not held
        up by a request that waits out its timeout on a cluster that is away, and waits out an
        unreachable cluster with backoff (:meth:`wait`) for as long as it runs; while no bootstrap
        server accepts a connection nothing blocks for longer than a second. A bounded run tries
        again every 0.5 s and fails after ``timeout_s`` seconds (``broker_timeout_ms``).
        ``topic_missing`` (a start again after the topic was dropped) takes what the attempt
        raised when the new topic is not in the metadata yet, or has no leaders, and waits for it.
        ``beat`` is called at each attempt: waiting for a cluster (or a topic) is progress, not a
        wedge. Returns False when stopped before an attempt succeeded.

        Raises:
            BrokerUnreachableError: a bounded run's cluster did not answer within ``timeout_s``.
            KafkaSourceError: what the attempt raised (a missing topic without ``topic_missing``).
        """
        deadline = time.monotonic() + timeout_s
        attempts = 0
        while not self._stop_requested.is_set():
            attempts += 1
            beat()
            try:
                # a continuous run probes first, so a Ctrl-C is not held up by a metadata request
                # that waits out --timeout on a broker that is away at start
                if (attempts > 1 or not bounded) and not self.bootstrap_answers():
                    raise BrokerUnreachableError(f"no broker of {self.bootstrap_servers} accepts connections (is "
                                                 f"the broker running and is --bootstrap-servers right?)")
                attempt()
                self.answered()
                return True
            except BrokerUnreachableError as exc:
                if bounded:
                    if time.monotonic() >= deadline:
                        raise
                    self._stop_requested.wait(0.5)
                    continue
                self.wait(exc)
            except KafkaSourceError as exc:
                if topic_missing is None:
                    raise
                topic_missing(exc)
        return False

    def answered(self) -> None:
        """The cluster answered: end an outage (one log line) and reset the backoff."""
        self._backoff_s = RETRY_BACKOFF_INITIAL_S
        if self.away_since is not None:
            logger.warning("the Kafka cluster %s answers again (unreachable for %.1f s)", self.bootstrap_servers,
                           time.monotonic() - self.away_since)
            self.away_since = None

    def after_round(self, unanswered_since: float | None, *, bounded: bool) -> None:
        """A fetch round returned. ``unanswered_since`` (``time.monotonic()`` seconds): since when the
        fetch path's requests have got no answer (``Ingest.unanswered_since``); None when this
        round was answered, which ends an outage (:meth:`answered`).

        A round that got no answer while no bootstrap server accepts a TCP connection (probed at
        most every :data:`BOOTSTRAP_PROBE_INTERVAL_S`) means the cluster is away now: a continuous
        run gets a :class:`BrokerUnreachableError` to wait out with backoff; a ``bounded`` one
        (``until_caught_up``) is marked away (``health.broker_reachable`` false) and goes on
        retrying until its fetch path gives up after ``broker_timeout_ms``. A round that got no
        answer from a cluster that still accepts connections changes nothing: only
        ``broker_timeout_ms`` tells such a cluster away, and only an answered round ends an outage
        (a connection accepted by a broker that is shutting down, or starting, is not an answer).

        Raises:
            BrokerUnreachableError: a continuous run's cluster refuses every connection.
        """
        if unanswered_since is None:
            self._probed = None
            self.answered()
            return
        now = time.monotonic()
        if self._probed is None or now - self._probed[0] >= BOOTSTRAP_PROBE_INTERVAL_S:
            self._probed = (now, self.bootstrap_answers())
        if self._probed[1]:
            return
        if bounded:
            if self.away_since is None:
                logger.warning("no broker of %s accepts connections; retrying until the broker timeout",
                               self.bootstrap_servers)
            self.mark(True)
            return
        raise BrokerUnreachableError(f"no broker of {self.bootstrap_servers} accepts connections (unanswered for "
                                     f"{now - unanswered_since:.1f} s)")

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
