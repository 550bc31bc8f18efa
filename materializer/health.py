"""Liveness and readiness of a :class:`~materializer.materializer.Materializer`, as Kubernetes probes read them.

Two questions with different answers and different consequences (Kubernetes restarts a container
whose liveness probe fails; it stops routing traffic to one whose readiness probe fails):

``live``
    The process' run loop is making progress: an iteration of :meth:`Materializer.run` (a fetch,
    an attempt to start, a retry after a backoff), a step of a store replay or rebuild, or records
    applied to the store happened within ``liveness_timeout_ms``, and ingest has not failed. It says nothing about the broker:
    a run waiting with backoff for a broker that is away, or for a deleted topic to come back,
    iterates and stays live, so a liveness probe never restarts it for something a restart cannot
    fix. It turns false when the loop is wedged (a blocked call that never returns, a deadlock)
    or after ingest failed.

``ready``
    The store serves a complete state: the run loop runs, ingest has not failed, and
    :attr:`MaterializerHealth.caught_up` holds (every partition reached the high watermark seen
    at start at least once, the topic is marked complete). It turns false again while the store
    may be stale or incomplete:

    * the broker does not answer (the store keeps its last state, fetching resumes when it
      answers; ready again once caught up again): at once when no bootstrap server accepts a
      connection, after ``broker_timeout_ms`` when one accepts but does not answer
      (:mod:`materializer.broker_outage`);
    * the topic was deleted (the store keeps its last state until the topic is back);
    * the topic was re-created under the same name (another topic id, KIP-516): the local copy is
      dropped and materialized again; ready once the new topic is caught up;
    * a partition has no leader to fetch from, or was added to the topic and not taken on yet
      (:mod:`materializer.partition_availability`; the detail's ``unavailable_partitions`` says
      which and why).

    Readiness is strict on purpose (never serve silently stale data); every replica of a service
    loses readiness together when their common broker goes away, while their liveness stays true.

:class:`RunHeartbeat` is the one owner of "when did the run loop last make progress";
:func:`liveness` and :func:`readiness` turn a :class:`~materializer.stats.MaterializerHealth`
snapshot into a :class:`ProbeResult` (HTTP 200 or 503 and a small JSON body saying why), which
:mod:`materializer.http_endpoints` serves on ``/health/live`` and ``/health/ready``.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from materializer.stats import MaterializerHealth

__all__ = ["ProbeResult", "RunHeartbeat", "combined", "liveness", "readiness"]

#: HTTP status of a probe that holds, and of one that does not (Kubernetes treats 200-399 as success).
STATUS_OK = 200
STATUS_UNAVAILABLE = 503


class RunHeartbeat:
    """When the run loop last made progress (``time.monotonic()`` seconds).

    :meth:`beat` is called by the run loop's thread at each iteration; :meth:`idle_s` by any
    thread (a health probe). ``progress`` counters given to :meth:`idle_s` (the store replay's
    offsets done, the records applied) count as a beat when they moved since the previous call,
    so a long replay or rebuild inside a start, which does not iterate the loop, stays live while
    it advances (a probe must come at least once per timeout to see it move).
    Thread-safe.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._last_beat = clock()
        self._progress: object = None

    def beat(self) -> None:
        """The run loop made progress now."""
        now = self._clock()
        with self._lock:
            self._last_beat = now

    def idle_s(self, progress: object = None) -> float:
        """Seconds since the last beat (>= 0); a ``progress`` value other than the previous call's counts as a beat."""
        now = self._clock()
        with self._lock:
            if progress is not None and progress != self._progress:
                if self._progress is not None:
                    self._last_beat = now
                self._progress = progress
            return max(0.0, now - self._last_beat)


@dataclass(frozen=True)
class ProbeResult:
    """The answer of one probe.

    Attributes:
        ok: the probe holds (HTTP 200), else HTTP 503.
        reasons: why it does not hold, one sentence each (empty when ``ok``).
        detail: the numbers it was decided on (JSON-serializable).
    """

    ok: bool
    reasons: tuple[str, ...] = ()
    detail: Mapping[str, object] = field(default_factory=dict)

    @property
    def status_code(self) -> int:
        """200 when ``ok``, else 503."""
        return STATUS_OK if self.ok else STATUS_UNAVAILABLE

    def to_json(self) -> bytes:
        """``{"ok": ..., "reasons": [...], <detail>}`` as UTF-8 JSON (the HTTP body)."""
        return json.dumps({"ok": self.ok, "reasons": list(self.reasons), **self.detail}, sort_keys=True).encode()


def liveness(health: MaterializerHealth) -> ProbeResult:
    """Whether the run loop makes progress (module docstring): ingest has not failed and the loop's
    last progress is at most ``health.liveness_timeout_s`` seconds old. Broker reachability is
    reported in the detail but never decides it."""
    reasons = []
    if health.failed is not None:
        reasons.append(f"ingest failed: {type(health.failed).__name__}: {health.failed}")
    if health.loop_idle_s > health.liveness_timeout_s:
        reasons.append(f"the run loop made no progress for {health.loop_idle_s:.1f} s (liveness timeout "
                       f"{health.liveness_timeout_s:.1f} s)" + ("" if health.running else "; it is not running"))
    detail = {"running": health.running, "loop_idle_s": round(health.loop_idle_s, 3),
              "liveness_timeout_s": health.liveness_timeout_s, "broker_reachable": health.broker_reachable}
    return ProbeResult(not reasons, tuple(reasons), detail)


def readiness(health: MaterializerHealth, lag: Mapping[int, int] | None = None) -> ProbeResult:
    """Whether the store serves a complete state (module docstring). ``lag`` (partition -> offsets
    not fetched yet, :meth:`MaterializerStats.lag`) goes into the detail and the catching-up reason.
    In group mode the detail's ``group`` names the group id, member id, generation and the
    partitions assigned and open (``assigned_partitions``; each served once caught up)."""
    reasons = []
    if health.failed is not None:
        reasons.append(f"ingest failed: {type(health.failed).__name__}: {health.failed}")
    elif not health.running:
        reasons.append("the run loop is not running")
    if not health.broker_reachable:
        reasons.append("the Kafka cluster does not answer; the store keeps its last state")
    if not health.topic_exists:
        reasons.append("the topic does not exist in the cluster (deleted); the store keeps its last state")
    if health.unavailable_partitions and health.broker_reachable:
        reasons.append("no leader to fetch from for partition(s) " + "; ".join(
            f"{p}: {why}" for p, why in sorted(health.unavailable_partitions.items()))
            + "; their keys may be missing or old")
    if health.group_error is not None and not health.caught_up and not reasons:
        reasons.append(f"the consumer group membership reports: {health.group_error}")
    if not health.caught_up and not reasons:
        behind = sum((lag or {}).values())
        reasons.append("catching up: the store has not reached the high watermarks yet"
                       + (f" ({behind} offsets to fetch)" if behind else ""))
    detail: dict[str, object] = {"running": health.running, "caught_up": health.caught_up,
                                 "broker_reachable": health.broker_reachable, "topic_exists": health.topic_exists}
    if lag is not None:
        detail["lag"] = {str(p): v for p, v in sorted(lag.items())}
    if health.unavailable_partitions:
        detail["unavailable_partitions"] = {str(p): why for p, why in sorted(health.unavailable_partitions.items())}
    if health.group_id is not None:
        detail["group"] = {"group_id": health.group_id, "member_id": health.member_id,
                           "generation": health.generation, "assigned_partitions": list(health.assigned_partitions),
                           "error": health.group_error}
    ok = health.caught_up and health.running and health.failed is None
    return ProbeResult(ok, () if ok else tuple(reasons), detail)


def combined(results: Mapping[str, ProbeResult]) -> ProbeResult:
    """One probe's answer for several topics of one process (:class:`~materializer.topic_set.TopicSet`):
    ok when every topic's is; each reason prefixed with its topic; ``detail`` is
    ``{"topics": {topic: {"ok": ..., **detail}}}``.

    Raises:
        ValueError: no result.
    """
    if not results:
        raise ValueError("no probe result to combine")
    reasons = tuple(f"{topic}: {reason}" for topic, result in results.items() for reason in result.reasons)
    detail = {"topics": {topic: {"ok": result.ok, **result.detail} for topic, result in results.items()}}
    return ProbeResult(all(result.ok for result in results.values()), reasons, detail)
