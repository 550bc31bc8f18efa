"""Who answers a key's partition: the one point where the query server decides between answering
here and answering elsewhere.

A partition this member serves is read from its own store. Any other gets either
:class:`Forward` (another member holds it and the group coordinator names its serving URL, carried
in its ``client.id``: :mod:`materializer.adapters.partition_owner`), which the app sends there in
one hop and never twice (a forwarded request carries :data:`FORWARDED_HEADER`, as ksqlDB's
``HARouting`` flags a forwarded pull query "skip forward"), or :class:`Unavailable`, HTTP 503 with
``Retry-After`` (one still catching up here, one no member holds during a rebalance, an owner
without an address), naming the owner when the group coordinator named one. :class:`LocalOnly`
never forwards; :class:`~materializer.serve.forwarding.Forwarding` does. A standby that may answer
within a lag bound (KIP-535) is the next answer to plug in here.
The decision follows the read path's refusal (:class:`~materializer.adapters.errors.PartitionNotAssignedError`
from :class:`~materializer.view.ServedPartitions`), so the server never answers "absent" for a key
the view refuses to answer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from materializer.adapters.errors import KeyPartitionUndecidedError, PartitionNotAssignedError
from materializer.adapters.partition_owner import PartitionOwner

__all__ = ["FORWARDED_HEADER", "RETRY_AFTER_S", "Forward", "LocalOnly", "Router", "Unavailable", "owner_json"]

#: Seconds a 503 asks a client to wait before it asks again (``Retry-After``, RFC 9110 §10.2.3).
RETRY_AFTER_S = 1

#: The header that marks a request one member forwarded to another: it is answered locally or 503,
#: never forwarded again (one hop).
FORWARDED_HEADER = "X-Materializer-Forwarded"


@dataclass(frozen=True)
class Forward:
    """Another member answers the partition: send the request to :attr:`owner`'s serving URL.

    Attributes:
        partition: the key's partition.
        owner: the member that holds it, as the group coordinator named it.
        url: its query server, ``http(s)://host:port`` (:attr:`PartitionOwner.serving_url`).
    """

    partition: int
    owner: PartitionOwner
    url: str


@dataclass(frozen=True)
class Unavailable:
    """No one answers the partition now: HTTP 503 with ``Retry-After``.

    Attributes:
        reason: one sentence (the read path's refusal).
        partitions: the partitions the key may be in that are not served here.
        owners: partition -> its owner as the group coordinator named it (None: no member holds it,
            or the group was not asked).
        catching_up: the partition is assigned here and still fetching up to the high watermark.
        retry_after_s: seconds before asking again.
    """

    reason: str
    partitions: tuple[int, ...]
    owners: dict[int, PartitionOwner | None]
    catching_up: bool = False
    retry_after_s: int = RETRY_AFTER_S


class Router(Protocol):
    """Decides who answers a key whose partition the local view refused to read."""

    def who_answers(self, topic: str, refusal: PartitionNotAssignedError) -> Unavailable | Forward:
        """The answer for a read of ``topic`` that the local view refused with ``refusal``."""
        ...


class LocalOnly:
    """A :class:`Router` of a member that answers only its own partitions (this slice: no forwarding)."""

    def who_answers(self, topic: str, refusal: PartitionNotAssignedError) -> Unavailable | Forward:
        """:class:`Unavailable` naming the owners ``refusal`` carries (module docstring)."""
        if isinstance(refusal, KeyPartitionUndecidedError):
            unserved = tuple(sorted(refusal.unserved))
            return Unavailable(str(refusal), unserved, {p: refusal.owners.get(p) for p in unserved})
        return Unavailable(str(refusal), (refusal.partition,), {refusal.partition: refusal.owner},
                           catching_up=refusal.catching_up)


def owner_json(owner: PartitionOwner | None) -> dict[str, str | None] | None:
    """An owner as JSON: ``{"member_id", "client_id", "host", "group_instance_id", "serving_url"}``
    (None: unknown)."""
    if owner is None:
        return None
    return {"member_id": owner.member_id, "client_id": owner.client_id, "host": owner.host,
            "group_instance_id": owner.group_instance_id, "serving_url": owner.serving_url}
