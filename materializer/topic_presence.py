"""Whether the topic a continuous run materializes is still the cluster's topic of that name (KIP-516
topic ids), and how a run goes on when a round fails for the cluster's sake.

:class:`TopicPresence` is the one owner of that state, as
:class:`~materializer.broker_outage.BrokerOutage` is of a cluster that is away (waited out with its
backoff: :meth:`TopicPresence.recover`). When the cluster's topic is not the local copy's any more
(``TopicIdChangedError``, or the topic missing from a metadata refresh):

* **deleted** (no topic of that name): a bounded run fails; a continuous one keeps the store
  serving its last state, reports ``caught_up=False`` (``topic_exists`` false; the lease records
  since when, for readers) and asks the metadata again after each of the outage's backoffs;
* **back** under the same id: the run carries on;
* **re-created** (another id, or deleted and re-created at once): ``on_topic_recreated`` decides:
  fail, or drop the local copy and materialize the new topic from scratch (a follower's
  ``UnifiedLog`` of another topic id is deleted likewise).

Metadata requests never create the topic.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Protocol

from materializer.adapters.errors import BrokerUnreachableError, KafkaSourceError, TopicIdChangedError, TopicNotFoundError
from materializer.broker_outage import BrokerOutage
from materializer.session import Session
from materializer.storage.partition_metadata import topic_id_to_string

__all__ = ["TopicPresence"]

logger = logging.getLogger(__name__)


class _DeletionRecord(Protocol):
    """What records the topic's deletion for readers (:class:`~materializer.datadir.lease.LeaseWriter`)."""

    def topic_deleted(self) -> None: ...

    def topic_back(self) -> None: ...


class TopicPresence:
    """Whether ``topic`` is in the cluster as the local copy's topic in ``data_dir`` (module
    docstring; ``on_topic_recreated``: ``"rebuild"`` or ``"fail"``). Waits end
    early when ``stop_requested`` is set; ``caught_up`` is cleared when the topic goes missing. Run
    loop thread only, except :attr:`missing`, which readers of health may read from any thread."""

    def __init__(self, topic: str, data_dir: Path, on_topic_recreated: str, outage: BrokerOutage,
                 stop_requested: threading.Event, caught_up: threading.Event) -> None:
        self.topic, self.data_dir = topic, data_dir
        self._on_topic_recreated = on_topic_recreated
        self._outage = outage
        self._stop_requested = stop_requested
        self._caught_up = caught_up
        #: True from finding the topic gone until it is back (or re-created and materialized again).
        self.missing = False

    def waiting(self, exc: KafkaSourceError) -> None:
        """A start again after the local copy was dropped found no topic (or no leaders) yet: say so
        once, and wait for the outage's next backoff."""
        if not self.missing:
            logger.warning("%s; waiting for the topic", exc)
            self.missing = True
        self._stop_requested.wait(self._outage.next_backoff())

    def recover(self, exc: Exception, session: Session, lease: _DeletionRecord | None, *, bounded: bool) -> bool:
        """A round of ``session``'s run failed with ``exc``: the cluster is away (a continuous run waits
        for it with the outage's backoff; the fetch resumes where it stopped, the store serving what
        it has meanwhile), or the topic is not the local copy's any more (:meth:`follow`; missing
        from a metadata refresh: followed as deleted). Returns True when the local copy is to be
        dropped and the new topic materialized.

        Raises:
            BrokerUnreachableError: a bounded run's cluster is away (it failed after ``--timeout``).
            TopicNotFoundError: a bounded run's topic is gone, or the cluster has no topic ids.
            TopicIdChangedError: as :meth:`follow`.
            Exception: ``exc``, when it is none of these.
        """
        if isinstance(exc, BrokerUnreachableError):
            if bounded:
                raise exc  # a bounded job: fail after --timeout, as documented
            session.ingest.interrupted()
            self._outage.wait(exc)
            return False
        if isinstance(exc, TopicNotFoundError):  # the metadata refresh of Materializer.add_new_partitions
            if bounded or session.topic_id is None:
                raise exc
            exc = TopicIdChangedError(self.topic, session.topic_id, None, str(exc))
        elif isinstance(exc, TopicIdChangedError):
            session.ingest.interrupted()
        else:
            raise exc
        try:
            return self.follow(exc, session, lease, bounded=bounded)
        except BrokerUnreachableError as away:  # asked again after the broker's backoff
            self._outage.wait(away)
            return False

    def follow(self, exc: TopicIdChangedError, session: Session, lease: _DeletionRecord | None, *,
               bounded: bool) -> bool:
        """The cluster's topic is not the local copy's any more (``exc``): deleted, back, or
        re-created (module docstring). ``lease`` records a deletion for readers. Returns True when
        the local copy is to be dropped and the new topic materialized (``on_topic_recreated``
        ``"rebuild"``); False: carry on (back, or still gone: asked again at the next round).

        Raises:
            TopicIdChangedError: a bounded run's topic was deleted, or ``on_topic_recreated="fail"``.
            BrokerUnreachableError: the metadata request got no answer (the caller waits for the
                cluster; the topic is asked for again after it).
        """
        if exc.found is None:
            if bounded:
                raise exc
            if not self.missing:
                logger.warning("%s; the state store keeps serving its last state (caught_up=False) until the topic "
                               "is back", exc)
                self.missing = True
                self._caught_up.clear()
                if lease is not None:  # readers say so; the lease's age grows from here
                    lease.topic_deleted()
            self._stop_requested.wait(self._outage.next_backoff())
            found = session.cluster_topic_id()
            if found is None:
                return False
            if found == exc.expected:
                logger.warning("topic %s is back (id %s)", self.topic, topic_id_to_string(found))
                self.missing = False
                if lease is not None:
                    lease.topic_back()
                return False
            exc = TopicIdChangedError(self.topic, exc.expected, found)
        if self._on_topic_recreated == "fail":
            raise exc
        logger.warning("%s: dropping its local logs and state store in %s and materializing the new topic", exc,
                       self.data_dir)
        return True

    def recreated(self) -> None:
        """The local copy was dropped: the new topic is materialized from scratch."""
        self.missing = False
