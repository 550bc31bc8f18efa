"""The periodic tasks of a run loop, counted from the start of :meth:`Materializer.run
<materializer.materializer.Materializer.run>` (Kafka's ``KafkaScheduler`` tasks of a broker's
``LogManager``: a first delay, then a fixed interval).

The loop asks each task whether it is due between two fetches; nothing runs on a timer thread, so
a task never races the fetch path for the logs or the store.
"""

from __future__ import annotations

from dataclasses import dataclass

from materializer.config import MaterializerOptions

__all__ = ["INITIAL_TASK_DELAY_MS", "Every", "RunTimers"]

#: Kafka ``log.initial.task.delay.ms``: the longest wait before the first retention check, ms.
INITIAL_TASK_DELAY_MS = 30_000

#: How often the run loop copies the client's cached high watermarks into the stats, seconds.
_WATERMARK_REFRESH_S = 1.0

#: The longest a continuous run goes without reading the topic's partitions, seconds (the default
#: consumer heartbeat interval of a KIP-848 group, at which members learn the group's assignment
#: after partitions are added): added partitions are taken on (and readiness waits for them)
#: within seconds, not at the next ``metadata_refresh_interval_ms``. Readers route keys by this
#: count: a member still on the old count after producers moved to the new one would route a key
#: to its old partition. One metadata request per topic; none while the cluster is away.
_PARTITION_PROBE_S = 5.0


class Every:
    """A periodic task of the run loop: :meth:`due` is True once per ``interval_s`` seconds (the
    first time ``first_s`` seconds after ``now``, default ``interval_s``); times are
    ``time.monotonic()`` seconds."""

    def __init__(self, interval_s: float, now: float, first_s: float | None = None) -> None:
        self.interval_s = interval_s
        self.next = now + (interval_s if first_s is None else first_s)

    def due(self, now: float) -> bool:
        """True when the task is due at ``now``; the next time is then ``interval_s`` later."""
        if now < self.next:
            return False
        self.next = now + self.interval_s
        return True


@dataclass
class RunTimers:
    """The run loop's periodic tasks: retention (Kafka ``log.retention.check.interval.ms``, first
    after ``log.initial.task.delay.ms``), the metadata refresh (new partitions) and the consumer
    path's high watermark refresh. (A group member keeps its own:
    :meth:`materializer.group.member.GroupMember.begin_run`.)"""

    retention: Every
    metadata: Every
    watermarks: Every

    @classmethod
    def starting(cls, options: MaterializerOptions, now: float) -> RunTimers:
        """The timers of a run starting at ``now`` (``time.monotonic()`` seconds)."""
        retention_s = options.retention_check_interval_ms / 1000.0
        return cls(retention=Every(retention_s, now, first_s=min(retention_s, INITIAL_TASK_DELAY_MS / 1000.0)),
                   metadata=Every(min(options.metadata_refresh_interval_ms / 1000.0, _PARTITION_PROBE_S), now),
                   watermarks=Every(_WATERMARK_REFRESH_S, now))
