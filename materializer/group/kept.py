"""What a consumer-group member keeps of the partitions the group moved to other members, and when
it lets them go.

A group member (``Materializer(group_id=...)``) that loses a partition keeps its local log folder
and its state store entries, so when the partition comes back only the delta is fetched. Kept for
ever they would fill the disk of a member that saw many partitions over its life, so they expire
as Kafka Streams expires the state directories of tasks no longer assigned
(``StateDirectory.cleanRemovedTasks``, ``state.cleanup.delay.ms``, 10 minutes by default): a
partition is released at its folder's last modification time, which :func:`mark_released` sets
when the member closes the partition (a revocation, or the member's own clean close; after a
crash it is the folder's last change), and it expires when

* ``revoked_retention_ms`` passed since it was released (-1: never by time; 0: at once), or
* the kept folders together exceed ``revoked_retention_bytes`` (-1: unbounded): the partitions
  released longest ago go first, as Kafka's ``retention.bytes`` deletes the oldest segments.

Only folder bytes are counted (segments and indexes); the partition's store entries go with it.
An expired partition loses its store entries first and its folder last
(:meth:`GroupMember.expire_kept <materializer.group.member.GroupMember.expire_kept>`):
a crash in between leaves a folder without store entries, which the next assignment re-applies
from the log, never store entries without the log they came from.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Container, Iterable
from dataclasses import dataclass
from pathlib import Path

from materializer.storage.files import find_partition_dirs

__all__ = ["KeptPartition", "expired", "kept_partitions", "mark_released"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class KeptPartition:
    """One partition folder a group member keeps but does not hold.

    Attributes:
        partition: the partition.
        folder: its ``<topic>-<partition>`` folder.
        released_ms: when the member let it go (the folder's modification time), ms since the epoch.
        size_bytes: the bytes of the files in the folder (segments, indexes, checkpoints).
    """

    partition: int
    folder: Path
    released_ms: int
    size_bytes: int


def mark_released(folders: Iterable[Path]) -> None:
    """Record that the member let these partition folders go now (their modification time), the
    clock :func:`expired` measures ``revoked_retention_ms`` from. A folder that vanished is
    skipped; one whose time cannot be set is logged and keeps its last change as its release
    time (never an error: the partition is closed either way)."""
    for folder in folders:
        try:
            os.utime(folder)
        except FileNotFoundError:
            continue
        except OSError as exc:
            logger.warning("could not record when %s was let go (%s); its last change counts instead", folder, exc)


def _size_bytes(folder: Path) -> int:
    total = 0
    for entry in os.scandir(folder):
        try:
            if entry.is_file(follow_symlinks=False):
                total += entry.stat(follow_symlinks=False).st_size
        except FileNotFoundError:  # a file deleted while we look (nothing writes a kept folder, but be safe)
            continue
    return total


def kept_partitions(data_dir: Path | str, topic: str, held: Container[int]) -> list[KeptPartition]:
    """The partition folders of ``topic`` in ``data_dir`` that are not in ``held``, oldest release
    first.

    Raises:
        OSError: the data dir cannot be listed.
    """
    kept = []
    for (_, partition), folder in find_partition_dirs(Path(data_dir), topic).items():
        if partition in held:
            continue
        try:
            released_ms = int(folder.stat().st_mtime * 1000)
            size = _size_bytes(folder)
        except FileNotFoundError:
            continue
        kept.append(KeptPartition(partition, folder, released_ms, size))
    kept.sort(key=lambda k: (k.released_ms, k.partition))
    return kept


def expired(kept: list[KeptPartition], retention_ms: int, retention_bytes: int,
            now_ms: int | None = None) -> list[KeptPartition]:
    """The kept partitions to let go (module docstring): released ``retention_ms`` or longer ago,
    then, oldest release first, as many as it takes to bring the rest to ``retention_bytes`` or
    below. -1 disables either bound.

    Args:
        kept: as :func:`kept_partitions` returns them (oldest release first).
        retention_ms: the longest a partition is kept, ms; -1 for no bound by time.
        retention_bytes: the most bytes all kept folders may hold together; -1 for no bound.
        now_ms: the time to measure from, ms since the epoch (default: the wall clock).
    """
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    doomed = [k for k in kept if retention_ms >= 0 and now_ms - k.released_ms >= retention_ms]
    if retention_bytes >= 0:
        left = [k for k in kept if k not in doomed]
        total = sum(k.size_bytes for k in left)
        for k in left:  # oldest release first
            if total <= retention_bytes:
                break
            doomed.append(k)
            total -= k.size_bytes
    return sorted(doomed, key=lambda k: (k.released_ms, k.partition))
