"""What a consumer-group member's data dir tells readers in other processes: the partitions they
may serve of it, and how they route a key to its partition.

The topic's completeness marker (:class:`~materializer.session.StoreMarker`) carries it as its
``group`` facts: ``{"group_id", "partitions", "partition_count", "partitioner",
"partitioner_candidates", "partitioner_source"}`` and, for a continuous run, ``"served_by"`` (the
data dir lock's holder). Readers (``get``, ``export``, :meth:`MaterializedView.open`,
:func:`materializer.view.served_by_marker`, the ``kafkalog`` source) serve those partitions only
and refuse the others' keys, whose entries are kept here for a later assignment and go stale.
A member names the partitions it has caught up on (:func:`serve`) and, before it joins, withdraws
what the previous run of the data dir named (:func:`withdraw`): the group may have moved them
meanwhile (Kafka Streams does not query a task's store while it restores either).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from materializer.group.partitioner import KeyRouting
from materializer.session import StoreMarker
from materializer.storage.files import find_partition_dirs

if TYPE_CHECKING:
    from materializer.datadir.holder import DataDirHolder

__all__ = ["serve", "withdraw"]


def serve(marker: StoreMarker, group_id: str, partitions: Iterable[int], partition_count: int,
          routing: KeyRouting | str = "murmur2", *, held_by: DataDirHolder | None = None) -> None:
    """From now on readers in other processes serve ``partitions`` only of ``marker``'s topic,
    routing keys over ``partition_count`` partitions by ``routing`` (a :class:`KeyRouting`: the
    configured partitioner or the detected candidates, written as ``partitioner``,
    ``partitioner_candidates`` and ``partitioner_source``; a name: that partitioner, configured).
    Written into the complete marker at once when the topic is complete, else when it becomes
    complete (:meth:`StoreMarker.set_group`). ``held_by`` (a continuous run: the data dir lock's
    holder): served only while it holds the data dir; once it is gone without withdrawing them
    (SIGKILL), readers refuse them, as the group moves them elsewhere
    (:func:`materializer.datadir.lock.stopped_without_release`).

    Raises:
        OSError: the marker cannot be written.
    """
    if isinstance(routing, str):
        routing = KeyRouting.configured(routing)
    group = {"group_id": group_id, "partitions": sorted(partitions), "partition_count": partition_count,
             **routing.facts()}
    if held_by is not None:
        group["served_by"] = {"pid": held_by.pid, "host": held_by.host, "since": held_by.since}
    marker.set_group(group)


def withdraw(marker: StoreMarker, group_id: str) -> None:
    """At start, before joining group ``group_id``: readers in other processes stop serving what the
    previous run of this data dir served (its marker names it, a SIGKILLed run's too; a run
    without a group served every partition). The group may give those partitions to other
    members, or back here, meanwhile; either way the entries kept here are older than what is
    served elsewhere until this run catches up, and :func:`serve` names the partitions again once
    it has. A marker of a run without a group gets the topic's partition folders' count as its
    routing modulus (any key is refused, whatever its partition). Nothing is written while the
    topic is not complete (readers refuse it anyway).

    Raises:
        OSError: the marker cannot be written.
    """
    facts = marker.complete_facts()
    if facts is None:
        return
    group = facts.get("group")
    if isinstance(group, dict):
        if not group.get("partitions"):
            return
        marker.set_group({**group, "partitions": []})
        return
    count = len(find_partition_dirs(marker.data_dir, marker.topic))
    if count:
        marker.set_group({"group_id": group_id, "partitions": [], "partition_count": count})
