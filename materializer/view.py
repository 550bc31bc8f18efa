"""Typed reads of a materialized topic: the read API a service or cache lives on.

A :class:`MaterializedView` is a :class:`~materializer.adapters.rocksdb_store.StateStore` seen
through a key serde and a value serde (``bytes``, ``str``, ``json``, ``avro``;
:mod:`materializer.adapters.serdes`). The store keeps the exact bytes the producer wrote;
decoding happens on read, so a view can read the same store as ``str`` today and ``json``
tomorrow.

Consistency: every read answers from one RocksDB state in which the values and the
per-partition next offsets (:meth:`MaterializedView.offsets`) were written by the same atomic
batch, so a view "reflects offsets < next offset" of each partition exactly. A view opened with
``read_only=True`` (the default of :meth:`MaterializedView.open`) follows a ``materializer run``
in another process: it sees the store as of opening or of its last :meth:`MaterializedView.catch_up`,
also across a stop, restart or kill of the writer (where RocksDB's catch-up in place would serve
values from before the writer's flush, the store opens a new secondary instance:
:mod:`materializer.adapters.rocksdb_store.secondary`).
The view returned by :meth:`Materializer.view <materializer.materializer.Materializer.view>` reads
the writer's own store and sees every applied batch at once.

Following a writer: :meth:`MaterializedView.catch_up` moves a view opened with
:meth:`MaterializedView.open` to the writer's latest applied batch only while the topic's
completeness marker says complete and did not change meanwhile, so a view never reads a store
that is being rebuilt, rewound or swapped; when the folder holds another store (the topic was
re-created, restored over or rebuilt) the view opens that one once it is complete. What a view
read before a refused catch-up stays as it was (the earlier data) while the topic is rebuilt or
rewound in place; when its store was replaced by another, or a refused catch-up may have mixed
two states, every read raises until a catch-up succeeds.

Key order: scans go in key *byte* order, which for ``str`` keys is UTF-8 code point order.

Absent keys: :meth:`MaterializedView.deletion` tells a key deleted by a tombstone the local log
still shows (its partition, offset and timestamp) from one never written or whose tombstone the
cleaner or retention removed (:mod:`materializer.deletions`); a view without a local log (a store
given alone) always answers the latter.

Group mode (a view of a consumer-group member, :class:`ServedPartitions`): the store also holds
the entries of partitions the member held earlier (kept for a later reassignment, and stale
since); the view never serves them. A key is routed to its partition as the producers'
partitioner did (:func:`materializer.group.routing.partition_for_key`): the one the member was
configured with, or the one it found from the keys its partitions hold
(:mod:`materializer.group.partitioner`); when another member holds that partition the read
raises :class:`~materializer.adapters.errors.PartitionNotAssignedError` naming it. While the data
cannot tell the partitioner yet, a key the candidates place in different partitions is looked up
in each served here, and a read that would answer "absent" while one of them is another member's
raises :class:`~materializer.adapters.errors.KeyPartitionUndecidedError`. ``items``, ``scan`` and
``count`` cover the served partitions only.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping, NamedTuple

from materializer.adapters.errors import KeyPartitionUndecidedError, PartitionNotAssignedError, StoreReplacedError
from materializer.adapters.partition_owner import PartitionOwner
from materializer.adapters.rocksdb_store import StateStore, StoredValue, latest_across_partitions
from materializer.adapters.serdes import BytesSerde, Serde, make_serde
from materializer.datadir.layout import state_dir
from materializer.datadir.lock import stopped_without_release
from materializer.datadir.markers import TopicStatus, open_when_complete, require_complete, topic_status
from materializer.datadir.lease import Lease, Staleness, member_lease, read_lease, staleness_of, wall_ms
from materializer.deletions import DataDirLogs, Deletion, LiveLogs, TombstoneLog, deletion_of
from materializer.group.partitioner import KeyRouting
from materializer.storage.errors import IncompleteDataDirError


__all__ = ["DataDirLogs", "Deletion", "Entry", "LiveLogs", "MaterializedView", "ServedPartitions", "served_by_marker"]


def _routed_by_murmur2() -> KeyRouting:
    return KeyRouting.configured("murmur2")


@dataclass(frozen=True)
class ServedPartitions:
    """The partitions a consumer-group member's view may serve (module docstring).

    Attributes:
        topic: the topic.
        group_id: the consumer group.
        partitions: returns the partitions served now (called on every read; thread-safe).
        partition_count: returns the topic's partition count (the modulus of the key routing).
        routing: returns how keys are routed now (:class:`~materializer.group.partitioner.KeyRouting`:
            the configured partitioner, or the ones the member's samples of the data leave;
            ``murmur2``, Kafka's ``BuiltInPartitioner.partitionForKey``, by default).
        assigned: returns the partitions assigned here, served or still catching up (None: not
            known, e.g. a reader in another process), so a refusal can say which.
        stopped: a reader in another process: the member that wrote the marker served its
            partitions only while it ran and has stopped without letting them go (killed), or its
            lease is older than the group's session timeout (frozen, stuck); how that was found.
            :attr:`partitions` is then empty. None otherwise.
        owners: returns ``partition -> member`` of the group now (one DescribeConsumerGroups:
            :meth:`materializer.adapters.group_members.GroupMembersClient.partition_owners`), asked
            only when a read is refused, to name the member that holds the key; None: not asked
            (the refusal says how to find it).
        expires_ms: a reader in another process: from this wall-clock time on (ms since the epoch)
            the partitions are not served (:attr:`partitions` is empty), as the data read is then
            older than the group's session timeout (:func:`materializer.datadir.lease.member_lease`);
            :attr:`expiry` says why. None: no such bound.
        expiry: why the partitions are not served from ``expires_ms`` on.
    """

    topic: str
    group_id: str
    partitions: Callable[[], frozenset[int]]
    partition_count: Callable[[], int]
    routing: Callable[[], KeyRouting] = _routed_by_murmur2
    assigned: Callable[[], frozenset[int]] | None = None
    stopped: str | None = None
    owners: Callable[[], Mapping[int, PartitionOwner]] | None = None
    expires_ms: int | None = None
    expiry: str | None = None

    def expired(self) -> bool:
        """The partitions are past :attr:`expires_ms` (never without one)."""
        return self.expires_ms is not None and wall_ms() >= self.expires_ms

    @property
    def partitioner(self) -> str | None:
        """The partitioner keys are routed by (:attr:`KeyRouting.partitioner`; None while several
        are left)."""
        return self.routing().partitioner

    def partitions_of(self, key: bytes) -> frozenset[int]:
        """The partitions a serialized key may be in (:meth:`KeyRouting.partitions_of`): one, unless
        the producers' partitioner is not known yet.

        Raises:
            ValueError: the partition count is not known (not started).
        """
        return self.routing().partitions_of(key, self.partition_count())

    def partition_of(self, key: bytes) -> int:
        """The partition of a serialized key, when the routing names one (:meth:`partitions_of`).

        Raises:
            ValueError: the partition count is not known (not started), or the key may be in
                several partitions.
        """
        candidates = self.partitions_of(key)
        if len(candidates) != 1:
            raise ValueError(f"key {key!r} may be in partition {', '.join(map(str, sorted(candidates)))} by "
                             f"{self.routing().describe()}")
        return next(iter(candidates))

    def check(self, partition: int) -> int:
        """``partition`` when it is served, else :class:`PartitionNotAssignedError` (naming the member
        that holds it when :attr:`owners` can ask the group)."""
        if partition not in self.partitions():
            catching_up = self.assigned is not None and partition in self.assigned()
            stopped = self.expiry if self.stopped is None and self.expired() else self.stopped
            owners, looked_up = ({}, None) if catching_up or stopped is not None else self._owners()
            raise PartitionNotAssignedError(partition, owners.get(partition), topic=self.topic,
                                            group_id=self.group_id, catching_up=catching_up, stopped=stopped,
                                            looked_up=looked_up)
        return partition

    def read(self, key: bytes, get: Callable[[int], StoredValue | None]) -> StoredValue | None:
        """``get(partition)`` of the partition ``key`` is in, or None when the topic does not hold it.

        The routing names one partition: that one, when served (else :meth:`check` raises). It
        names several (the producers' partitioner is not known yet): each of them served here is
        looked in, and the first that has the key answers; absent from all of them answers None
        only when they are all served here, as then no other member can hold it. When the
        partition count grew since some keys were written (:attr:`KeyRouting.grown`), a key may be
        live in several of its partitions: every one must be served here, and the latest of them
        answers (record timestamp, ties the lower partition), as a read without a group does.

        Raises:
            PartitionNotAssignedError: the key's one partition is not served here.
            KeyPartitionUndecidedError: the key may be in a partition not served here, and is in
                none of those served (names the candidate partitions and why).
            ValueError: the partition count is not known (not started).
        """
        routing = self.routing()
        candidates = routing.partitions_of(key, self.partition_count())
        if len(candidates) == 1:
            return get(self.check(next(iter(candidates))))
        served = self.partitions()
        unserved = candidates - served
        if routing.live_in_several:
            if not unserved:
                return latest_across_partitions(v for v in map(get, sorted(candidates)) if v is not None)
        else:
            for partition in sorted(candidates & served):
                found = get(partition)
                if found is not None:
                    return found
            if not unserved:
                return None
        if self.stopped is not None or self.expired():
            self.check(min(unserved))  # the member is gone (or frozen): that is the reason to give
        assigned_here = unserved & self.assigned() if self.assigned is not None else frozenset()
        owners, looked_up = ({}, None) if unserved <= assigned_here else self._owners()
        raise KeyPartitionUndecidedError(repr(key[:64]), candidates, unserved, routing.describe(), topic=self.topic,
                                         group_id=self.group_id, owners={p: owners.get(p) for p in unserved},
                                         looked_up=looked_up, assigned_here=assigned_here,
                                         live_in_several=routing.live_in_several)

    def _owners(self) -> tuple[Mapping[int, PartitionOwner], str | None]:
        """The group's ``partition -> member`` now and, for a partition without one, what asking
        found; ``({}, None)`` when :attr:`owners` is None (not asked)."""
        if self.owners is None:
            return {}, None
        try:
            return self.owners(), (f"no member of group {self.group_id!r} holds it now (a rebalance may be moving "
                                   "it; ask again shortly)")
        except Exception as exc:  # noqa: BLE001 - the refusal stands; say why its owner is not named
            return {}, f"asking group {self.group_id!r} which member holds it failed ({exc})"


_CATCH_UP_ATTEMPTS = 3


@dataclass
class _Origin:
    """Where a view opened by :meth:`MaterializedView.open` reads from, and the marker bytes its
    store goes with."""

    data_dir: Path
    topic: str
    marker: bytes | None
    staleness: Staleness  # of what the store holds, as of the lease read before it was opened or caught up


class Entry(NamedTuple):
    """One live key of a view: decoded key and value, and the record they came from.

    Attributes:
        key / value: decoded by the view's serdes.
        partition: Kafka partition of the record.
        offset: its offset in that partition.
        timestamp: its timestamp, ms since the epoch (CreateTime or LogAppendTime).
    """

    key: Any
    value: Any
    partition: int
    offset: int
    timestamp: int


class MaterializedView:
    """Typed, read-only access to a topic's state store.

    Args:
        store: the open store (the view does not close a store it was given, unless ``owns_store``).
        key_serde / value_serde: decoders (default :class:`BytesSerde`: raw bytes).
        owns_store: :meth:`close` closes ``store``.
        served: a consumer-group member's partitions (:class:`ServedPartitions`): reads route keys
            and serve these partitions only; None (default): every partition of the store.
        staleness: returns how old the store's data is now (:attr:`staleness`); None: unknown (a
            store given without its writer).
        max_staleness_ms: refuse every read while the data is older than this, or of unknown
            age (:class:`~materializer.datadir.lease.StaleStoreError`), ms; None (default): no bound.
        tombstone_log: the topic's local log, where :meth:`deletion` confirms a tombstone; None
            (default): :meth:`deletion` always answers None.

    Keys given to lookups may be typed (``str`` for a ``str`` serde, a dict for ``json``/``avro``:
    encoded by the key serde) or the exact key bytes.

    Raises (reads):
        IncompleteDataDirError / StoreReplacedError: a view from :meth:`open` whose last
            :meth:`catch_up` found its store replaced or possibly mixed (see there).
        PartitionNotAssignedError: with ``served``: the key's partition (or the one asked for) is
            another group member's.
        StaleStoreError: with ``max_staleness_ms``: the data is older than that, or of unknown age.
        DeserializationError: a stored key or value does not decode (names partition and offset).
        SchemaRegistryError: the Avro serde cannot reach the registry.
        StoreError: RocksDB failed or the view is closed.
    """

    def __init__(self, store: StateStore, *, key_serde: Serde | None = None, value_serde: Serde | None = None,
                 owns_store: bool = False, served: ServedPartitions | None = None,
                 staleness: Callable[[], Staleness] | None = None, max_staleness_ms: int | None = None,
                 tombstone_log: TombstoneLog | None = None) -> None:
        if max_staleness_ms is not None and max_staleness_ms < 0:
            raise ValueError(f"max_staleness_ms must be >= 0 ms, got {max_staleness_ms}")
        self.store = store
        self.served = served
        self.max_staleness_ms = max_staleness_ms
        self._staleness = staleness
        self._tombstone_log = tombstone_log
        self.key_serde = key_serde or BytesSerde(field="key")
        self.value_serde = value_serde or BytesSerde(field="value")
        self._raw_keys = type(self.key_serde) is BytesSerde  # store keys are bytes already
        self._owns_store = owns_store
        # set by open(): where the store comes from, to follow its marker and reopen a replaced store
        self._origin: _Origin | None = None
        self._retired: list[StateStore] = []  # stores a reopen replaced, closed with the view

    @classmethod
    def open(cls, data_dir: Path | str, topic: str, *, key_format: str = "bytes", value_format: str = "bytes",
             schema_registry: Any = None, reader_schema: str | None = None,
             read_only: bool = True, max_staleness_ms: int | None = None) -> "MaterializedView":
        """Open the view of ``topic`` in ``data_dir`` (the layout of :mod:`materializer.datadir.layout`).

        Args:
            key_format / value_format: one of ``bytes``, ``str``, ``json``, ``avro``.
            schema_registry: a ``SchemaRegistryClient`` or a registry URL (``avro`` needs one).
            reader_schema: Avro schema JSON the values are resolved to (schema evolution).
            read_only: open as a reader beside a running ``materializer run`` (no lock taken,
                nothing written in the data dir, which may be a read-only mount).
            max_staleness_ms: refuse every read while what the view holds is older than this, ms,
                by the writer's lease read before it was opened or last caught up (:attr:`staleness`);
                None (default): no bound, the age is only reported.

        Raises:
            IncompleteDataDirError: no store for ``topic`` (``run`` or ``restore`` first), or a
                command building or replacing it is in progress or was interrupted (the message says
                which and what to run; :func:`materializer.datadir.markers.require_complete`).
            StoreError: the store cannot be opened.
            ValueError: an unknown format, or ``avro`` without a registry.
            StaleStoreError: not raised here: by the reads, with ``max_staleness_ms``.

        A data dir written by a consumer-group member (``run --group-id``) serves the partitions
        the member held when its marker was last written (:func:`materializer.group.served.serve`:
        at each rebalance; after a bounded run, those it held then; none once a continuous member
        stopped, or was found killed); reads of the others raise
        :class:`PartitionNotAssignedError`, since their kept entries are not kept up to date. A
        continuous member's partitions are served only while what the view holds of them is
        younger than the group's session timeout (the member's lease, :mod:`materializer.datadir.lease`):
        a frozen or stuck member's data is refused from then on, until a catch-up finds it renewed.
        """
        if isinstance(schema_registry, str):
            from materializer.adapters.avro_serde import schema_registry_client

            schema_registry = schema_registry_client(schema_registry)
        key_serde = make_serde(key_format, topic=topic, field="key", schema_registry=schema_registry)
        value_serde = make_serde(value_format, topic=topic, field="value", schema_registry=schema_registry,
                                 reader_schema=reader_schema)
        path = state_dir(Path(data_dir), topic)
        seen: list[TopicStatus] = []
        lease = read_lease(data_dir, topic)  # before the store opens: the store is at least this current
        store = open_when_complete(data_dir, topic, lambda: StateStore(path, read_only=read_only), StateStore.close,
                                   seen=seen.append)
        try:
            # the partitions to serve from the marker the store was opened under (not read again: a
            # rebalance written since would name partitions whose entries this store has stale)
            served = served_by_marker(data_dir, topic, seen[-1], lease=lease)
            origin = _Origin(Path(data_dir), topic, seen[-1].raw, _store_staleness(store, served, lease, seen[-1]))
        except BaseException:
            store.close()
            raise
        view = cls(store, key_serde=key_serde, value_serde=value_serde, owns_store=True, served=served,
                   staleness=lambda: _aged(origin.staleness), max_staleness_ms=max_staleness_ms,
                   tombstone_log=DataDirLogs(data_dir, topic))
        if read_only:
            view._origin = origin
        return view

    # -- lifecycle ---------------------------------------------------------------------------

    def close(self) -> None:
        """Close the store if the view opened it. Idempotent."""
        if self._owns_store:
            self.store.close()
            self._close_retired()

    def _close_retired(self) -> None:
        retired, self._retired = self._retired, []
        for store in retired:
            store.close()

    def __enter__(self) -> "MaterializedView":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def catch_up(self) -> dict[int, int]:
        """A read-only view: see the writer's latest applied batch; return partition -> next offset.

        A view from :meth:`open` follows the topic's completeness marker (module docstring): it
        catches up only while the marker says complete and stays the same around the catch-up
        (tried again up to 3 times while it changes), and when the folder holds another store (a
        re-created topic, a restore, a rebuild) it opens that one instead; in group mode the
        partitions served follow the marker too. A store a reopen replaced is closed at the next
        catch-up that succeeds (a read in another thread may still use it meanwhile; none should
        span two catch-ups).

        Raises:
            IncompleteDataDirError: the topic is being rebuilt or rewound in place (nothing was
                caught up: the view serves what it did); the folder holds another store that is
                not complete yet, or the marker changed during every try: then what the view holds
                is another topic's, or may mix two states, and every read raises this error until
                a catch-up succeeds.
            StoreError: the view reads the writer's own store (it is always current), or RocksDB
                failed (a :class:`StoreReplacedError` from a read: as above).
        """
        origin = self._origin
        if origin is None:
            return self.store.catch_up()
        data_dir, topic = origin.data_dir, origin.topic
        mixed = False  # a catch-up ran while the marker changed: the store may hold a mix
        for _ in range(_CATCH_UP_ATTEMPTS):
            lease = read_lease(data_dir, topic)  # before the catch-up: the store is at least this current
            try:
                before = require_complete(data_dir, topic)
            except IncompleteDataDirError as exc:
                if mixed or self.store.replaced():  # a mix, or a store of data that is gone
                    self.store.refuse_reads(exc)
                raise
            if self.store.refused or self.store.replaced():
                return self._reopen()  # another store, or an earlier catch-up may have mixed two states
            try:
                offsets = self.store.catch_up()
            except StoreReplacedError:
                return self._reopen()
            if topic_status(data_dir, topic).raw == before.raw:
                if before.raw != origin.marker or self.served is not None:
                    # rewritten since (a rebalance), or a group member's: is it still running and renewing?
                    self.served = served_by_marker(data_dir, topic, before, lease=lease)
                    origin.marker = before.raw
                origin.staleness = _store_staleness(self.store, self.served, lease, before)
                self._close_retired()
                return offsets
            mixed = True  # a rebuild, rewind or swap began or ended meanwhile: catch up again past it
        refusal = IncompleteDataDirError(f"topic {topic!r} in {data_dir} changed during each of {_CATCH_UP_ATTEMPTS} "
                                         f"catch-ups of this view (a rebuild or swap in progress); try again")
        self.store.refuse_reads(refusal)
        raise refusal

    def _reopen(self) -> dict[int, int]:
        """Open the topic's store again (another store took the folder, or what the view held may
        mix two states) and serve it from now on; the replaced store is closed at the next catch-up
        that succeeds (a read in another thread may still use it meanwhile). While the topic is not
        complete, the old store refuses reads and :class:`IncompleteDataDirError` is raised."""
        origin = self._origin
        assert origin is not None
        seen: list[TopicStatus] = []
        path = state_dir(origin.data_dir, origin.topic)
        lease = read_lease(origin.data_dir, origin.topic)
        try:
            store = open_when_complete(origin.data_dir, origin.topic, lambda: StateStore(path, read_only=True),
                                       StateStore.close, seen=seen.append)
        except IncompleteDataDirError as exc:
            self.store.refuse_reads(exc)  # what it holds is replaced data: nothing to serve until then
            raise
        self._retired.append(self.store)
        self.store = store
        origin.marker = seen[-1].raw
        self.served = served_by_marker(origin.data_dir, origin.topic, seen[-1], lease=lease)
        origin.staleness = _store_staleness(store, self.served, lease, seen[-1])
        return store.offsets()

    @property
    def staleness(self) -> Staleness:
        """How old what the view serves is now (:class:`~materializer.datadir.lease.Staleness`: ``as_of_ms``,
        ``age_ms``, why unknown, the topic's deletion). A view from :meth:`open`: by the writer's
        lease read before the store was opened or last caught up, over the partitions it serves
        (the age grows until the next :meth:`catch_up`); :meth:`Materializer.view
        <materializer.materializer.Materializer.view>`: by the writer's own record, over its open
        (group mode: served) partitions. Unknown for a view of a store given without its writer."""
        if self._staleness is None:
            return Staleness(None, None, "a view of a store given without its writer")
        return self._staleness()

    def _check_fresh(self) -> None:
        """With ``max_staleness_ms``: refuse a read of data older than that, or of unknown age."""
        if self.max_staleness_ms is not None:
            self.staleness.check(self.max_staleness_ms, f"the view of {self.store.path}", "max_staleness_ms")

    def with_key_bytes(self) -> "MaterializedView":
        """This view with keys taken and given as the stored bytes (the ``bytes`` key format): the
        same store, served partitions, staleness and value format, not owning the store (valid
        while this view's store is). For a server that takes keys as bytes (:mod:`materializer.serve`)."""
        return MaterializedView(self.store, value_serde=self.value_serde, served=self.served,
                                staleness=self._staleness, max_staleness_ms=self.max_staleness_ms,
                                tombstone_log=self._tombstone_log)

    def offsets(self) -> dict[int, int]:
        """Partition -> next offset: the view reflects exactly the records below these offsets."""
        return self.store.offsets()

    # -- reads -------------------------------------------------------------------------------

    def _key_bytes(self, key: Any) -> bytes:
        return self.key_serde.encode(key)

    def _read(self, key: bytes, partition: int | None) -> StoredValue | None:
        """``key``'s stored value: from ``partition`` when given, else (group mode) from the key's
        own partition (:meth:`ServedPartitions.read`: refused when not served here), else the
        latest across partitions."""
        if self.served is None:
            return self.store.get(key, partition)
        if partition is not None:
            return self.store.get(key, self.served.check(partition))
        return self.served.read(key, lambda part: self.store.get(key, part))

    def _served_now(self, partition: int | None) -> frozenset[int] | None:
        """Group mode: the partitions a scan may return (one asked for must be served); None: all."""
        if self.served is None:
            return None
        if partition is not None:
            return frozenset({self.served.check(partition)})
        return self.served.partitions()

    def _entry(self, key: bytes, stored: StoredValue) -> Entry:
        partition, offset, timestamp, value = stored
        return Entry(key if self._raw_keys else self.key_serde.decode(key, partition, offset),
                     self.value_serde.decode(value, partition, offset), partition, offset, timestamp)

    def get(self, key: Any, default: Any = None, *, partition: int | None = None) -> Any:
        """The decoded value of ``key``, or ``default`` when it is absent or deleted.

        Without ``partition``, a key live in several partitions gives the value with the latest
        record timestamp (ties: the lower partition), as :meth:`StateStore.get`; in group mode the
        key's own partition (module docstring).
        """
        self._check_fresh()
        stored = self._read(self._key_bytes(key), partition)
        if stored is None:
            return default
        return self.value_serde.decode(stored.value, stored.partition, stored.offset)

    def get_entry(self, key: Any, *, partition: int | None = None) -> Entry | None:
        """``key``'s :class:`Entry` (value with partition, offset, timestamp), or None."""
        self._check_fresh()
        key_bytes = self._key_bytes(key)
        stored = self._read(key_bytes, partition)
        return None if stored is None else self._entry(key_bytes, stored)

    def deletion(self, key: Any, *, partition: int | None = None) -> Deletion | None:
        """Why ``key`` is absent: its :class:`~materializer.deletions.Deletion` (partition, offset and
        timestamp of its tombstone) when the key is absent and the local log still shows the
        tombstone the store recorded; None when the key is live, or absent without one (never
        written, its tombstone removed by the cleaner after ``delete.retention.ms`` or below the log
        start offset, a store written before tombstones were recorded, or no local log).

        Reads the key as :meth:`get_entry` does first (and refuses as it does); then one lookup of
        the store's tombstone record per partition the key was looked for in, and for a record one
        offset index lookup and batch read of the local log (:func:`materializer.deletions.confirmed`).
        """
        self._check_fresh()
        key_bytes = self._key_bytes(key)
        if self._tombstone_log is None or self._read(key_bytes, partition) is not None:
            return None
        if partition is not None:
            looked_in: Iterable[int] = (partition,)
        elif self.served is not None:
            looked_in = sorted(self.served.partitions_of(key_bytes) & self.served.partitions())
        else:
            looked_in = self.store.partitions()
        return deletion_of(self.store, key_bytes, looked_in, self._tombstone_log)

    def get_many(self, keys: Iterable[Any], *, partition: int | None = None) -> dict[Any, Any]:
        """``key -> decoded value`` for the live ``keys`` (absent ones left out), one RocksDB multi-get.

        The result is keyed by the keys as given. In group mode each key is read from its own
        partition, and the first key of a partition not served raises
        :class:`PartitionNotAssignedError` before anything is read; a key that may be in several
        partitions (the producers' partitioner not known yet) is read as :meth:`get` reads it.
        """
        self._check_fresh()
        given = list(keys)
        encoded = [self._key_bytes(k) for k in given]
        found = self._stored_many(encoded, partition)
        result: dict[Any, Any] = {}
        for key, key_bytes in zip(given, encoded):
            stored = found.get(key_bytes)
            if stored is not None:
                result[key if _hashable(key) else key_bytes] = self.value_serde.decode(
                    stored.value, stored.partition, stored.offset)
        return result

    def get_entries(self, keys: Iterable[Any], *, partition: int | None = None) -> list[Entry | None]:
        """Each key's :class:`Entry` as :meth:`get_entry` gives it, or None, in the keys' order: one
        RocksDB multi-get (per partition in group mode) instead of a lookup per key. Refuses as
        :meth:`get_many` does (the first key of a partition not served raises
        :class:`PartitionNotAssignedError` before anything is read)."""
        self._check_fresh()
        encoded = [self._key_bytes(k) for k in keys]
        found = self._stored_many(encoded, partition)
        return [None if (stored := found.get(key_bytes)) is None else self._entry(key_bytes, stored)
                for key_bytes in encoded]

    def _stored_many(self, encoded: list[bytes], partition: int | None) -> dict[bytes, StoredValue]:
        """The stored values of the live ``encoded`` keys (:meth:`get_many`'s reads and refusals)."""
        if self.served is None:
            return self.store.get_many(encoded, partition)
        by_partition: dict[int, list[bytes]] = {}
        undecided: list[bytes] = []
        if partition is not None:
            by_partition[partition] = encoded
        else:  # one routing snapshot for the whole multi-get (the query server's hot path)
            routing, count = self.served.routing(), self.served.partition_count()
            for key_bytes in encoded:
                candidates = routing.partitions_of(key_bytes, count)
                if len(candidates) == 1:
                    by_partition.setdefault(next(iter(candidates)), []).append(key_bytes)
                else:
                    undecided.append(key_bytes)
        for part in by_partition:  # every partition checked before anything is read
            self.served.check(part)
        found: dict[bytes, StoredValue] = {}
        for part, part_keys in by_partition.items():
            found.update(self.store.get_many(part_keys, part))
        for key_bytes in undecided:
            stored = self._read(key_bytes, None)
            if stored is not None:
                found[key_bytes] = stored
        return found

    def scan(self, start: Any = None, end: Any = None, *, prefix: Any = None,
             partition: int | None = None) -> Iterator[Entry]:
        """Live entries with keys in ``[start, end)`` or starting with ``prefix``, in key byte order.

        ``start``/``end``/``prefix`` are typed keys or bytes (a ``str`` prefix of a ``str`` view is
        its UTF-8 bytes). A key live in two partitions comes once for each, lower partition first.
        """
        self._check_fresh()
        served = self._served_now(partition)
        start_bytes = b"" if start is None else self._key_bytes(start)
        end_bytes = None if end is None else self._key_bytes(end)
        prefix_bytes = None if prefix is None else self._key_bytes(prefix)
        for key, stored in self.store.scan(start_bytes, end_bytes, prefix=prefix_bytes, partition=partition):
            if served is None or stored.partition in served:
                yield self._entry(key, stored)

    def items(self, partition: int | None = None) -> Iterator[Entry]:
        """Every live entry in (partition, key byte) order, or those of one ``partition``."""
        self._check_fresh()
        served = self._served_now(partition)
        if served is None:
            for key, stored in self.store.items(partition):
                yield self._entry(key, stored)
            return
        for part in sorted(served):
            for key, stored in self.store.items(part):
                yield self._entry(key, stored)

    def count(self, partition: int | None = None) -> int:
        """Live (partition, key) entries, exact (iterates the keys: O(keys))."""
        self._check_fresh()
        served = self._served_now(partition)
        if served is None:
            return self.store.count(partition)
        return sum(self.store.count(part) for part in served)

    def __len__(self) -> int:
        return self.count()

    def __contains__(self, key: Any) -> bool:
        self._check_fresh()
        return self._read(self._key_bytes(key), None) is not None

    def __repr__(self) -> str:
        return (f"MaterializedView({str(self.store.path)!r}, key={self.key_serde.format}, "
                f"value={self.value_serde.format})")


def _hashable(key: Any) -> bool:
    try:
        hash(key)
    except TypeError:
        return False
    return True



_READ = object()  # served_by_marker: read the lease now


def served_by_marker(data_dir: Path | str, topic: str, status: TopicStatus | None = None, *,
                     lease: Lease | None | object = _READ) -> ServedPartitions | None:
    """The partitions that readers in other processes may serve from ``topic`` in ``data_dir``:
    what the consumer-group member writing it held when it last wrote its complete marker
    (:func:`materializer.group.served.serve`), or None when no
    group member wrote it (every partition). None of them when the member served them only while
    it ran and has stopped without letting them go (SIGKILL: a clean stop withdraws them; the group
    moves them to other members), or when its lease is older than the group's session timeout (a
    frozen or stuck member: :func:`materializer.datadir.lease.member_lease`); :attr:`ServedPartitions.stopped`
    says so, and :attr:`ServedPartitions.expires_ms` is when the lease read grows that old. A
    snapshot: a rebalance after this call is not seen. ``status``: the marker to read it from (the
    one a store was opened or caught up under); None: the marker now. ``lease``: the member's lease
    as read before the store was opened or caught up (default: read now)."""
    status = status if status is not None else topic_status(data_dir, topic)
    group = status.facts.get("group")
    if not isinstance(group, dict):
        return None
    served = frozenset(int(p) for p in group.get("partitions", ()))
    served_by = group.get("served_by")
    stopped = stopped_without_release(data_dir, served_by) if served else None
    expires_ms = expiry = None
    if stopped is None and served and served_by is not None:  # a continuous member: it must renew its lease
        read = read_lease(data_dir, topic) if lease is _READ else lease
        assert read is None or isinstance(read, Lease)
        expires_ms, expiry = member_lease(read, served_by, served, generation=status.generation)
        if expires_ms is None or wall_ms() >= expires_ms:
            stopped, expires_ms = expiry, None
    if stopped is not None:
        served = frozenset()
    count = int(group.get("partition_count", 0))
    routing = KeyRouting.from_facts(group)  # markers written before detection: their partitioner (murmur2 if none)
    deadline = expires_ms

    def partitions() -> frozenset[int]:
        return served if deadline is None or wall_ms() < deadline else frozenset()

    return ServedPartitions(topic, str(group.get("group_id")), partitions, lambda: count, lambda: routing,
                            stopped=stopped, expires_ms=expires_ms, expiry=expiry if expires_ms is not None else None)


def _store_staleness(store: StateStore, served: ServedPartitions | None, lease: Lease | None,
                     status: TopicStatus) -> Staleness:
    """How old ``store`` (opened or caught up after ``lease`` was read, under ``status``) is: over
    the partitions served (group mode), else over every partition the store or the lease knows."""
    partitions = served.partitions() if served is not None else set(store.offsets()) | set(
        lease.as_of_ms if lease is not None else ())
    return staleness_of(lease, partitions, generation=status.generation)


def _aged(staleness: Staleness) -> Staleness:
    """``staleness`` with its age counted to now."""
    if staleness.as_of_ms is None:
        return staleness
    return dataclasses.replace(staleness, age_ms=max(0, wall_ms() - staleness.as_of_ms))
