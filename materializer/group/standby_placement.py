"""Where a consumer group's standby replicas go: a pure function of the group's members and the
current ``partition -> owner`` assignment (``--standby-replicas N``, issue 40).

The group coordinator assigns each partition to one member and knows nothing of standbys (a
KIP-848 ``consumer`` group has no assignor ``userData``). So every member derives the standbys
itself, from the same DescribeConsumerGroups snapshot, with :func:`place_standbys`: members that
look at the same snapshot agree on every partition's standbys without talking to each other, and
a member follows read-only those placed on it (:mod:`materializer.group.standby`).

The rules are Kafka Streams' (``DefaultStandbyTaskAssignor``, and KIP-1071's server-side
``StickyTaskAssignor``):

* never on the partition's owner, and never two copies of a partition on one member
  (``StandbyTaskAssignmentUtils``: a client that already has the task is not offered);
* ``min(N, members other than the owner)`` copies: fewer when there are not enough members (a
  partition no member owns in the snapshot, during a rebalance, may go to any member);
* spread evenly: a member's load is the partitions it owns plus its standbys, as Kafka Streams'
  ``ClientState.assignedTaskLoad`` counts actives and standbys together, and no member takes more
  than ``ceil(total load / members)`` while another member that may take the copy is below that bound;
* stable across membership changes: among the members below the bound a partition's copy goes to
  the one with the **highest rendezvous weight** (highest-random-weight hashing, Thaler and Ravishankar
  1998) of ``(partition, member)``, a hash that does not depend on the other members.

Why rendezvous weights rather than Kafka's "least loaded first" or KIP-1071's "keep the previous
holder": least loaded first (``DefaultStandbyTaskAssignor``, ties by client id) reshuffles many
standbys when one member joins or leaves, as every load changes; keeping the previous holder
(``StickyTaskAssignor``) needs the previous standby placement, which only a central assignor has:
here each member computes alone, and a member that just joined (or restarted) does not know it, so
two members could disagree and a partition get two copies or none. Rendezvous weights give
stickiness without that memory: a member leaving moves only the copies it held and those of the
partitions whose owner changed (plus a few at the load bound), because every other ``(partition,
member)`` weight is the same as before (``tests/unit/test_standby_placement.py`` measures it). This
is consistent hashing with bounded loads (Mirrokni, Thorup and Zadimoghaddam, 2018) on rendezvous
weights.

Member names should be stable: ``group.instance.id`` when set (a restarted static member keeps
its standbys and the local data behind them), else the member id.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping

__all__ = ["place_standbys", "rendezvous_weight", "standbys_of"]


def rendezvous_weight(partition: int, member: str) -> int:
    """The rendezvous (highest-random-weight) weight of ``member`` for ``partition``: the first 8
    bytes, big-endian, of BLAKE2b-64 over ``b"<partition>\\x00<member as UTF-8>"``. The same in every
    process and Python version (unlike ``hash()``), and independent of the other members."""
    digest = hashlib.blake2b(f"{partition}\x00{member}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def place_standbys(members: Iterable[str], owners: Mapping[int, str | None], replicas: int,
                   partitions: Iterable[int] | None = None) -> dict[int, tuple[str, ...]]:
    """``partition -> standby members`` (module docstring for the rules).

    Args:
        members: the group's members by stable name (duplicates are one member); order does not matter.
        owners: ``partition -> owner`` name in the current assignment; a partition absent, mapped to
            None or to a name not in ``members`` has no owner (it is being moved).
        replicas: N, the standby copies wanted per partition (``--standby-replicas``); 0 places none.
        partitions: the topic's partitions (``range(partition_count)``); None: those of ``owners``.

    Returns:
        Every partition of ``partitions`` -> its standbys, best weight first (an empty tuple when
        no member may hold one). Partitions are taken in ascending order, and each copy goes to the
        member with the highest :func:`rendezvous_weight` among those that do not own or already
        hold the partition and are below the load bound ``ceil((owned + copies) / members)``; when
        all of those are at the bound, to the least loaded of them (then by weight); then chains of
        moves bring members over the bound down where the rules allow (:func:`_even_out`).

    Raises:
        ValueError: ``replicas`` is negative.
    """
    if replicas < 0:
        raise ValueError(f"standby replicas must be >= 0, got {replicas}")
    names = sorted(set(members))
    wanted = sorted(set(owners) if partitions is None else set(partitions))
    owner_of = {p: owner for p in wanted if (owner := owners.get(p)) in names}
    if not names or replicas == 0:
        return {p: () for p in wanted}
    load = dict.fromkeys(names, 0)
    for owner in owner_of.values():
        load[owner] += 1
    copies = {p: min(replicas, len(names) - (1 if p in owner_of else 0)) for p in wanted}
    bound = -(-(sum(load.values()) + sum(copies.values())) // len(names))  # ceil
    holders: dict[int, list[str]] = {}
    for partition in wanted:
        ranked = sorted((m for m in names if m != owner_of.get(partition)),
                        key=lambda m: (-rendezvous_weight(partition, m), m))
        chosen = holders[partition] = []
        for _ in range(copies[partition]):
            free = [m for m in ranked if m not in chosen]
            below = [m for m in free if load[m] < bound]
            pick = below[0] if below else min(free, key=lambda m: (load[m], free.index(m)))
            chosen.append(pick)
            load[pick] += 1
    _even_out(holders, owner_of, load, bound, names)
    return {p: tuple(sorted(h, key=lambda m: (-rendezvous_weight(p, m), m))) for p, h in holders.items()}


def _even_out(holders: dict[int, list[str]], owner_of: Mapping[int, str], load: dict[str, int], bound: int,
              names: list[str]) -> None:
    """Bring members above ``bound`` down where the rules allow: the greedy pass in partition order
    can leave a member over the bound while the only member below it owns the partitions still to
    place. Each round finds the shortest chain of moves (breadth first, members and partitions in a
    fixed order) from a member over the bound to one below it, each copy moving to a member that
    may hold it, and applies it: the members in between keep their load. Stops when no chain exists
    (the owners alone can make an even spread impossible)."""
    while True:
        for start in (m for m in names if load[m] > bound):
            path = _chain(start, holders, owner_of, load, bound, names)
            if path:
                for partition, source, target in path:
                    holders[partition][holders[partition].index(source)] = target
                load[start] -= 1
                load[path[-1][2]] += 1
                break
        else:
            return


def _chain(start: str, holders: Mapping[int, list[str]], owner_of: Mapping[int, str], load: Mapping[str, int],
           bound: int, names: list[str]) -> list[tuple[int, str, str]]:
    """The shortest list of ``(partition, from, to)`` moves that takes one copy off ``start`` and puts
    one on a member below ``bound`` (empty: none)."""
    held_by = {m: sorted(p for p, hs in holders.items() if m in hs) for m in names}
    came_from: dict[str, tuple[int, str]] = {}
    queue, seen = [start], {start}
    while queue:
        member = queue.pop(0)
        for partition in held_by[member]:
            for target in sorted(names, key=lambda m: (-rendezvous_weight(partition, m), m)):
                if target in seen or target == owner_of.get(partition) or target in holders[partition]:
                    continue
                seen.add(target)
                came_from[target] = (partition, member)
                if load[target] < bound:
                    path = []
                    while target != start:
                        partition, source = came_from[target]
                        path.append((partition, source, target))
                        target = source
                    return path[::-1]
                queue.append(target)
    return []


def standbys_of(member: str, placement: Mapping[int, Iterable[str]]) -> frozenset[int]:
    """The partitions ``placement`` (as :func:`place_standbys` returns it) puts a standby of on ``member``."""
    return frozenset(p for p, holders in placement.items() if member in holders)
