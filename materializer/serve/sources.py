"""What the query server serves of a topic: a :class:`TopicSource` per topic, made from a running
:class:`~materializer.materializer.Materializer` (:func:`source_of`) or from any
:class:`~materializer.view.MaterializedView` a user holds (:func:`view_source`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from materializer.health import ProbeResult, readiness
from materializer.serve.status import TopicStatus, materializer_status, view_status
from materializer.view import MaterializedView

if TYPE_CHECKING:
    from materializer.materializer import Materializer

__all__ = ["NotServing", "TopicSource", "source_of", "view_source"]


class NotServing(Exception):
    """The topic has no store to read yet (the run has not started it) or any more (closed): 503."""


@dataclass(frozen=True)
class TopicSource:
    """One topic as the query server reads it.

    Attributes:
        topic: the topic name.
        view: returns the view to read now, keys as the stored bytes (raises :class:`NotServing`
            when there is none); its refusals (not served here, stale) become 503 answers.
        readiness: returns whether the store serves a complete state now (the run's
            ``/health/ready``: caught up to the high watermarks, the broker answers, in the group);
            not ready answers 503 with its reasons. None: always ready (a view a user manages).
        group_id: the consumer group of a member (None: no group).
        member_id: returns the member id the group coordinator gave (None: not in a group now).
        status: returns what the status page (``GET /``) shows of the topic
            (:class:`~materializer.serve.status.TopicStatus`: partitions with high watermark, lag
            and owner, group generation, store and log sizes, cleaner rounds); None: the page
            says the source reports none.
        reads_on_loop: ``readiness``, ``view`` and the view's reads touch only memory and the local
            store (no network, no lock held for long), so a point get may run on the server's event
            loop (:mod:`materializer.serve.on_loop`); False (default, for callables a user wrote):
            every read runs in a worker thread.
    """

    topic: str
    view: Callable[[], MaterializedView]
    readiness: Callable[[], ProbeResult] | None = None
    group_id: str | None = None
    member_id: Callable[[], str | None] = lambda: None
    status: Callable[[], TopicStatus] | None = None
    reads_on_loop: bool = False


def source_of(materializer: Materializer) -> TopicSource:
    """The :class:`TopicSource` of a running materializer: its own store (:meth:`Materializer.view`),
    ready as its ``/health/ready`` (:func:`materializer.health.readiness`)."""

    def view() -> MaterializedView:
        if materializer.store is None:
            raise NotServing(f"topic {materializer.topic!r} has no store yet: the run is starting (or has stopped)")
        return materializer.view().with_key_bytes()

    def ready() -> ProbeResult:
        return readiness(materializer.health, materializer.stats.lag())

    return TopicSource(materializer.topic, view, ready, group_id=materializer.options.group_id,
                       member_id=lambda: materializer.member_id, reads_on_loop=True,
                       status=lambda: materializer_status(materializer))


def view_source(topic: str, view: MaterializedView) -> TopicSource:
    """A :class:`TopicSource` serving ``view`` as it is (e.g. :meth:`MaterializedView.open` of a data
    dir another process runs; the caller calls its :meth:`~MaterializedView.catch_up`). Its refusals
    (group partitions not served, ``max_staleness_ms``) still answer 503. Its status page shows what
    the view knows (:func:`~materializer.serve.status.view_status`: no high watermark, lag or cleaner rounds)."""
    # per request: a catch-up may have replaced the store
    return TopicSource(topic, view.with_key_bytes, status=lambda: view_status(topic, view),
                       reads_on_loop=True)
