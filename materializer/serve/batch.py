"""A multi-get's reads (``POST .../keys:batch``): the keys grouped so that each group is one RocksDB
multi-get (:meth:`MaterializedView.get_entries <materializer.view.MaterializedView.get_entries>`)
instead of a lookup per key, and each group is refused or forwarded as a whole.

Without a group every key is read in one multi-get (a key live in several partitions: the latest,
as :meth:`~materializer.view.MaterializedView.get_entry` answers). In group mode the keys are grouped
by the one partition each is in (:meth:`ServedPartitions.partitions_of
<materializer.view.ServedPartitions.partitions_of>`): a partition served here is one multi-get; one
not served is refused once for all its keys (:class:`~materializer.adapters.errors.PartitionNotAssignedError`,
which the app forwards to the owner or answers 503), exactly as each key's own read would be. A key
that may be in several partitions (the producers' partitioner not known yet, or a grown partition
count) is read alone, by :meth:`get_entry`'s rules. A group whose multi-get fails on a value that
does not decode is read again key by key (:func:`one_by_one`), so only that key's answer is the error.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from materializer.view import Entry, MaterializedView

__all__ = ["KeyGroup", "key_groups", "one_by_one"]


@dataclass(frozen=True)
class KeyGroup:
    """Keys read together.

    Attributes:
        indexes: the keys' positions in the request.
        read: reads them: an :class:`Entry` or None (absent) per key, in ``indexes`` order; raises
            the view's refusal for the whole group.
    """

    indexes: list[int]
    read: Callable[[], list[Entry | None]]


def key_groups(view: MaterializedView, keys: Sequence[bytes]) -> list[KeyGroup]:
    """``keys`` (bytes, a view with byte keys) as groups each read in one go (module docstring).

    Raises:
        ValueError: group mode and the topic's partition count is not known yet (as a single get).
    """
    served = view.served
    if served is None:
        return [KeyGroup(list(range(len(keys))), lambda: view.get_entries(keys))] if keys else []
    by_partition: dict[int, list[int]] = {}
    groups: list[KeyGroup] = []
    routing, count = served.routing(), served.partition_count()  # one snapshot for the request
    for at, key in enumerate(keys):
        candidates = routing.partitions_of(key, count)
        if len(candidates) == 1:
            by_partition.setdefault(next(iter(candidates)), []).append(at)
        else:
            groups.append(KeyGroup([at], lambda key=key: [view.get_entry(key)]))  # type: ignore[misc]
    for partition, indexes in by_partition.items():
        part_keys = [keys[at] for at in indexes]
        groups.append(KeyGroup(indexes, lambda p=partition, k=part_keys: view.get_entries(k, partition=p)))  # type: ignore[misc]
    return groups


def one_by_one(view: MaterializedView, keys: Sequence[bytes], group: KeyGroup) -> list[KeyGroup]:
    """``group``'s keys each in a group of its own (read by :meth:`~materializer.view.MaterializedView.get_entry`)."""
    return [KeyGroup([at], lambda key=keys[at]: [view.get_entry(key)]) for at in group.indexes]  # type: ignore[misc]
