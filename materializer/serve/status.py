"""What the status page (``GET /``, :mod:`materializer.serve.status_page`) shows of a topic: a
:class:`TopicStatus` snapshot per topic, read from where each figure already lives.

Of a running :class:`~materializer.materializer.Materializer` (:func:`materializer_status`):

* per partition, the high watermark and the next offset to fetch (``MaterializerStats``'s
  ``latest_high_watermarks`` and ``next_offsets``, the figures of the ``materializer_partition_*``
  Prometheus gauges) and their difference, the lag (:meth:`MaterializerStats.lag`); the bytes of
  its local log (the sum of its segments' ``.log`` files, Kafka's ``UnifiedLog.size``, the broker's
  ``kafka.log:type=Log,name=Size``); whether it is served here, still catching up here, or held by
  another member (group mode: one DescribeConsumerGroups, the same one a refused read asks,
  :attr:`~materializer.view.ServedPartitions.owners`), with that member's serving URL;
* the group id, member id and generation (classic generation id or KIP-848 member epoch) of
  :attr:`Materializer.health`, and readiness as ``/health/ready`` answers it;
* the cleaner's completed rounds (``MaterializerStats.cleaner_rounds``) and the bytes of the
  RocksDB store's folder on disk (SST files, WAL, MANIFEST: what the store takes on disk).

Of any :class:`~materializer.view.MaterializedView` (:func:`view_status`): what the view knows (its
store's next offsets, the partitions it serves, its owners in group mode, the store's size, its
staleness); the high watermarks, lag, cleaner rounds and generation are the writer's, which a view
does not see: :attr:`TopicStatus.unknown` says so, and the page shows them as unknown.

Reading a figure never raises: one that cannot be read now (a store being closed, a coordinator
that does not answer) is None, with the reason in :attr:`TopicStatus.unknown` or
:attr:`TopicStatus.owners_error`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from materializer.adapters.partition_owner import PartitionOwner
from materializer.health import readiness
from materializer.view import MaterializedView

if TYPE_CHECKING:
    from materializer.materializer import Materializer
    from materializer.storage.log import Log

__all__ = ["PartitionStatus", "TopicStatus", "materializer_status", "view_status"]

#: :attr:`PartitionStatus.state` values.
SERVED, CATCHING_UP, ELSEWHERE, NO_OWNER, NOT_OPEN = (
    "served here", "catching up here", "another member", "no owner", "not open here")


@dataclass(frozen=True)
class PartitionStatus:
    """One partition of a topic as this server sees it.

    Attributes:
        partition: the partition.
        state: ``"served here"``, ``"catching up here"`` (assigned here, not yet at the high
            watermark read when it was opened), ``"another member"`` (group mode: :attr:`owner`
            holds it), ``"no owner"`` (group mode: no member holds it now, e.g. in a rebalance) or
            ``"not open here"`` (no group: a partition the run has not taken on, or has closed).
        high_watermark: the latest high watermark known here (offsets); None: not known here.
        next_offset: the next offset to fetch, i.e. the local log end offset (offsets); None: not held here.
        lag: ``high_watermark - next_offset`` (>= 0, offsets); None: not known here.
        log_bytes: bytes of the partition's local log segments (``.log`` files); None: not open here.
        owner: group mode: the member that holds it now (None: not asked, or none).
    """

    partition: int
    state: str
    high_watermark: int | None = None
    next_offset: int | None = None
    lag: int | None = None
    log_bytes: int | None = None
    owner: PartitionOwner | None = None


@dataclass(frozen=True)
class TopicStatus:
    """A topic's status as the page shows it (module docstring).

    Attributes:
        topic: the topic.
        partitions: one per partition known here, by partition.
        ready: the store serves a complete state now (the run's ``/health/ready``); None: not known.
        reasons: why it is not ready, one sentence each.
        group_id: the consumer group (None: no group).
        member_id: this member's id in the group (None: not in it now, or no group).
        generation: the group generation (classic generation id, or KIP-848 member epoch); None: not known.
        store_bytes: bytes of the RocksDB store's files on disk; None: not known.
        log_bytes: bytes of the local logs open here (the sum over :attr:`partitions`); None: not known.
        cleaner_rounds: log cleaner rounds completed since the run started; None: not known.
        staleness: how current the store is, one phrase (:meth:`~materializer.datadir.lease.Staleness.describe`).
        owners_error: group mode: why the group's owners could not be asked, else None.
        unknown: what this source does not know, one phrase each.
    """

    topic: str
    partitions: tuple[PartitionStatus, ...] = ()
    ready: bool | None = None
    reasons: tuple[str, ...] = ()
    group_id: str | None = None
    member_id: str | None = None
    generation: int | None = None
    store_bytes: int | None = None
    log_bytes: int | None = None
    cleaner_rounds: int | None = None
    staleness: str | None = None
    owners_error: str | None = None
    unknown: tuple[str, ...] = ()


def materializer_status(materializer: Materializer) -> TopicStatus:
    """The status of a running (or starting, or stopped) materializer's topic (module docstring).
    Thread-safe: reads snapshots of its stats, health and open logs."""
    stats, health = materializer.stats, materializer.health
    probe = readiness(health, stats.lag())
    highs, nexts, lag = dict(stats.latest_high_watermarks), dict(stats.next_offsets), stats.lag()
    logs = dict(materializer.logs)  # a copy: the run loop opens and closes partitions meanwhile
    unknown: list[str] = []
    view: MaterializedView | None = None
    store_bytes = None
    try:
        view = materializer.view()
        store_bytes = _folder_bytes(view.store.path)
    except Exception as exc:  # noqa: BLE001 - not started, or closing: the page says so
        unknown.append(f"the store ({exc})")
    staleness = None if view is None else view.staleness.describe()
    served = materializer.served_partitions()
    assigned = materializer.assigned_partitions()
    owners, owners_error, count = _owners(view)
    numbers = set(highs) | set(nexts) | set(logs) | set(owners) | set(range(count))
    partitions = []
    for partition in sorted(numbers):
        here = partition in assigned
        if here:
            state = SERVED if partition in served else CATCHING_UP
        elif health.group_id is None:
            state = NOT_OPEN
        else:
            state = ELSEWHERE if partition in owners else NO_OWNER
        partitions.append(PartitionStatus(
            partition, state, highs.get(partition) if here else None, nexts.get(partition) if here else None,
            lag.get(partition) if here else None, _log_bytes(logs.get(partition)) if here else None,
            owners.get(partition)))
    sizes = [p.log_bytes for p in partitions if p.log_bytes is not None]
    return TopicStatus(materializer.topic, tuple(partitions), probe.ok, probe.reasons, health.group_id,
                       health.member_id, health.generation, store_bytes, sum(sizes) if sizes else None,
                       stats.cleaner_rounds, staleness, owners_error, tuple(unknown))


def view_status(topic: str, view: MaterializedView) -> TopicStatus:
    """What a view a user holds knows of ``topic`` (module docstring): per partition its store's next
    offset, served or not (group mode: and its owner), the store's size and staleness; no high
    watermark, lag, cleaner rounds or generation."""
    unknown = ["high watermarks and lag (a view knows the offsets its store holds, not the broker's)",
               "cleaner rounds and the group generation (the writer's)", "local log sizes (the writer's)"]
    try:
        offsets = view.offsets()
        store_bytes: int | None = _folder_bytes(view.store.path)
        staleness: str | None = view.staleness.describe()
    except Exception as exc:  # noqa: BLE001 - a closed or replaced store: the page says so
        offsets, store_bytes, staleness = {}, None, None
        unknown.insert(0, f"the store ({exc})")
    served_partitions = view.served
    served = None if served_partitions is None else served_partitions.partitions()
    owners, owners_error, count = _owners(view)
    partitions = []
    for partition in sorted(set(offsets) | set(owners) | set(range(count))):
        if served is None or partition in served:
            partitions.append(PartitionStatus(partition, SERVED, next_offset=offsets.get(partition),
                                              owner=owners.get(partition)))
        else:
            partitions.append(PartitionStatus(partition, ELSEWHERE if partition in owners else NO_OWNER,
                                              owner=owners.get(partition)))
    return TopicStatus(topic, tuple(partitions), group_id=None if served_partitions is None
                       else served_partitions.group_id, store_bytes=store_bytes, staleness=staleness,
                       owners_error=owners_error, unknown=tuple(unknown))


def _owners(view: MaterializedView | None) -> tuple[Mapping[int, PartitionOwner], str | None, int]:
    """Group mode: (partition -> owner, why they are unknown, the partition count); else ({}, None, 0)."""
    served = None if view is None else view.served
    if served is None:
        return {}, None, 0
    try:
        count = served.partition_count()
    except Exception:  # noqa: BLE001 - the count is only the table's length
        count = 0
    if served.owners is None:
        return {}, "this reader does not ask the group which member holds a partition", count
    try:
        return dict(served.owners()), None, count
    except Exception as exc:  # noqa: BLE001 - the coordinator does not answer: the page says so
        return {}, f"asking the group which member holds each partition failed: {exc}", count


def _log_bytes(log: Log | None) -> int | None:
    try:
        return None if log is None else log.size_in_bytes
    except Exception:  # noqa: BLE001 - a log closed meanwhile
        return None


def _folder_bytes(folder: Path) -> int:
    """Bytes of the files under ``folder`` (a file deleted meanwhile, e.g. by a RocksDB compaction, not counted)."""
    total = 0
    for root, _dirs, files in os.walk(folder):
        for name in files:
            try:
                total += os.stat(os.path.join(root, name), follow_symlinks=False).st_size
            except FileNotFoundError:
                continue
    return total
