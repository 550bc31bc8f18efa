"""The topic producers' partitioner, found from the keys its partitions hold (group-mode routing).

A consumer-group member holds some partitions of a topic; a read of a key is answered from the
key's partition, the one its producer sent it to (:func:`materializer.group.routing.partition_for_key`).
Which partitioner the producers used is not recorded anywhere in Kafka, but the data tells: a key
stored in partition ``P`` of an ``n``-partition topic was placed there by a partitioner whose hash
``h`` gives ``h % n == P``. Java's producer, Kafka Streams and librdkafka's ``murmur2*`` hash with
murmur2 (``BuiltInPartitioner.partitionForKey``), librdkafka's default ``consistent_random`` (so
confluent-kafka's) with CRC32, Sarama and librdkafka's ``fnv1a*`` with FNV-1a: a few dozen keys
of a partition tell these three families apart (a wrong family places each key there with
probability about ``1/n``).

The rule (what "a key fits a partitioner" means here):

* A key in partition ``P`` fits a partitioner when the partitioner places it in ``P`` under the
  current partition count ``n``, **or under any earlier count** ``n'`` with ``P < n' <= n``: Kafka
  only ever adds partitions (``CreatePartitions``), and a key written before an increase stays in
  the partition the count of then gave it. So data written before an increase never rules out the
  producers' own partitioner. (The price: a key of partition 0 fits every partitioner, as a topic
  may once have had one partition; evidence comes from the other partitions.)
* An empty key fits ``consistent_random`` in any partition (librdkafka sends it to a random one);
  ``consistent`` puts it in partition 0 (``CRC32(b"") == 0``); murmur2 and FNV-1a hash it.
* A partitioner is ruled out by one sampled key that does not fit it; the candidates are the
  partitioners no sampled key ruled out. Readers route a key by every candidate
  (:meth:`KeyRouting.partitions_of`): when the candidates disagree on its partition it is looked
  up in each, and "absent" is answered only when every one of those partitions was looked in
  (:meth:`materializer.view.ServedPartitions.read`). No candidate left (a custom partitioner, or
  records produced to explicit partitions) means a key may be in any partition.
* Once one family is left, it is *grown* (:attr:`KeyRouting.grown`) when it places some sampled
  key only under an earlier count (the partition count grew since that key was written); while
  several are left, they are when every one of them does; every candidate is once the run saw the
  count go up: a key may then be in its partition under any count up to the
  current one, and may be live in several of them at once (written before and after the
  increase; partitions are independent, so a tombstone in one leaves the other's value live). A
  read answers such a key only when every partition it may be in is served here, with the latest
  of them by record timestamp (ties: the lower partition), as a read without a group does
  (:meth:`materializer.adapters.rocksdb_store.StateStore.get`); else it refuses.
* A partitioner the operator configured (``run --partitioner``) is trusted by readers; a sampled
  key that does not fit it is an error of the run (:class:`PartitionerMismatchError`), since
  reads of such keys would answer "absent" for keys the topic holds.

The work is bounded: :meth:`PartitionerDetection.sample` reads at most :data:`SAMPLE_KEYS` keys of a
partition, from a random point of its key range, and samples a partition again only once the
store's next offset for it has doubled since (never O(all keys) per round). A sample keeps each
key's three hashes (and the key's first bytes, for messages), not the key.
"""

from __future__ import annotations

import itertools
import os
import random
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Protocol

from materializer.group.routing import FAMILIES, PARTITIONERS, family_of, key_hash, partition_for_key

__all__ = ["AUTO", "KeyRouting", "PartitionerDetection", "PartitionerMismatchError", "SAMPLE_KEYS", "describe"]

#: ``MaterializerOptions.partitioner`` / ``run --partitioner`` value that detects the partitioner.
AUTO = "auto"

#: Keys read per partition sample.
SAMPLE_KEYS = 32

#: Partitions sampled per :meth:`PartitionerDetection.sample` call at most (the rest at later calls).
_PARTITIONS_PER_ROUND = 64

_FAMILY_ORDER = tuple(FAMILIES)
_SHOWN_KEY_BYTES = 64

#: What each family is, for messages.
_WHO = {"murmur2": "Java's producer, Kafka Streams", "crc32": "librdkafka's and confluent-kafka's default",
        "fnv1a": "Sarama's"}


def describe(partitioners: Iterable[str]) -> str:
    """``partitioners`` for a message, by family: ``"murmur2 or murmur2_random (Java's producer,
    Kafka Streams), consistent_random (...)"``; ``"none"`` when empty."""
    chosen = set(partitioners)
    parts = []
    for family, names in FAMILIES.items():
        mine = [name for name in names if name in chosen]
        if mine:
            parts.append(f"{' or '.join(mine)} ({_WHO[family]})")
    return ", ".join(parts) if parts else "none"


class PartitionerMismatchError(ValueError):
    """The configured partitioner (``run --partitioner``) does not place keys the topic holds where
    they are: reads would route them to another partition and answer "absent" for keys the topic
    holds. The message names a sampled key, its partition, and the partitioners that fit."""


@dataclass(frozen=True)
class KeyRouting:
    """How readers find a key's partition: the partitioners the topic's producers may use.

    Attributes:
        candidates: names of :data:`~materializer.group.routing.PARTITIONERS`, in that order: the
            configured one, or those that fit every sampled key; empty: none fits (a key may be in
            any partition).
        source: ``"configured"`` (``run --partitioner``, and markers written before detection
            existed) or ``"detected"`` (from the data: :class:`PartitionerDetection`).
        grown: the candidates that place some sampled key only under an earlier, smaller
            partition count, or all of them once the run saw the count grow: a key routed by one of
            these may be in its partition under any count up to the current one (module docstring).
    """

    candidates: tuple[str, ...]
    source: str = "configured"
    grown: tuple[str, ...] = ()

    @classmethod
    def configured(cls, partitioner: str, grown: bool = False) -> KeyRouting:
        """Route by ``partitioner`` alone (a name of :data:`~materializer.group.routing.PARTITIONERS`);
        ``grown``: the partition count grew since some of the topic's keys were written."""
        return cls((partitioner,), "configured", (partitioner,) if grown else ())

    @classmethod
    def from_facts(cls, group: Mapping[str, Any]) -> KeyRouting:
        """The routing a topic marker's ``group`` facts record (:meth:`facts`). A marker written
        before detection existed has ``partitioner`` alone (``murmur2`` when absent too): routed by
        it, as then. A name this version does not know leaves no candidate (any partition)."""
        candidates = group.get("partitioner_candidates")
        if isinstance(candidates, list):
            known = all(name in PARTITIONERS for name in candidates)
            grown = group.get("partitioner_grown")
            grown = tuple(n for n in PARTITIONERS if n in grown) if isinstance(grown, list) else ()
            return cls(tuple(n for n in PARTITIONERS if n in candidates) if known else (),
                       str(group.get("partitioner_source", "detected")), grown if known else ())
        name = group.get("partitioner", "murmur2")
        return cls((name,) if name in PARTITIONERS else (), "configured")

    def facts(self) -> dict[str, Any]:
        """The marker's fields: ``partitioner`` (:attr:`partitioner`, null while undecided),
        ``partitioner_candidates``, ``partitioner_source`` and ``partitioner_grown``."""
        return {"partitioner": self.partitioner, "partitioner_candidates": list(self.candidates),
                "partitioner_source": self.source, "partitioner_grown": list(self.grown)}

    @property
    def families(self) -> tuple[str, ...]:
        """The hash families of :attr:`candidates`."""
        return tuple(f for f in _FAMILY_ORDER if any(family_of(n) == f for n in self.candidates))

    @property
    def partitioner(self) -> str | None:
        """The partitioner readers route by when one family is left: the configured name, else the
        family's usual name (``murmur2``, ``consistent_random`` when it is a candidate, ``fnv1a``);
        None while several families (or none) are left."""
        if self.source == "configured" and len(self.candidates) == 1:
            return self.candidates[0]
        if len(self.families) != 1:
            return None
        return "consistent_random" if "consistent_random" in self.candidates else self.candidates[0]

    @property
    def decided(self) -> bool:
        """Every key has one partition: one family left (an empty key of a CRC32 topic may still
        have several, see :meth:`partitions_of`)."""
        return len(self.families) == 1

    def partitions_of(self, key: bytes, partition_count: int) -> frozenset[int]:
        """The partitions ``key`` may be in, of ``partition_count``: each candidate's partition for
        it (for a :attr:`grown` candidate, under every count up to ``partition_count``); every
        partition when no candidate is left, or for an empty key under ``consistent_random``
        (librdkafka sends it to a random partition).

        Raises:
            ValueError: ``partition_count`` is not positive.
        """
        if partition_count <= 0:
            raise ValueError(f"partitions must be at least 1, got {partition_count}: the partition count is not "
                             "known (not started)")
        if key and not self.grown and self.candidates:  # the hot path: one hash per family, not per name
            return frozenset([key_hash(family, key) % partition_count for family in self._families])
        found: set[int] = set()
        for name in self.candidates or ():
            counts = range(1, partition_count + 1) if name in self.grown else (partition_count,)
            try:
                found.update(partition_for_key(key, count, partitioner=name) for count in counts)
            except ValueError:  # an empty key under consistent_random: any partition
                return frozenset(range(partition_count))
        return frozenset(found) if self.candidates else frozenset(range(partition_count))

    @cached_property
    def _families(self) -> tuple[str, ...]:
        """:attr:`families`, computed once: every partitioner of a family places a non-empty key in
        the same partition, ``key_hash(family, key) % partition_count``
        (:data:`~materializer.group.routing.FAMILIES`, :func:`~materializer.group.routing.partition_for_key`)."""
        return self.families

    @property
    def live_in_several(self) -> bool:
        """A key may be live in several of its partitions at once (:attr:`grown`): a read must see
        them all and answer the latest."""
        return bool(self.grown)

    def describe(self) -> str:
        """For messages: the candidates and how they were found (a clause)."""
        if self.grown:
            return (f"{self._describe_candidates()}, and the topic's partition count grew since some keys were written "
                    f"(sampled keys sit where {describe(self.grown)} put them under a smaller count), so a key may be "
                    "live in its partition under any count up to the current one")
        return self._describe_candidates()

    def _describe_candidates(self) -> str:
        if self.source == "configured":
            return f"keys are routed by the configured partitioner {describe(self.candidates)}"
        if not self.candidates:
            return ("no known partitioner places every sampled key (none of murmur2, CRC32 and FNV-1a does: a custom "
                    "partitioner, or records produced to explicit partitions), so a key may be in any partition")
        if self.decided:
            return f"keys are routed by the detected partitioner {describe(self.candidates)}"
        return f"the producers' partitioner is not known yet: the keys sampled so far fit {describe(self.candidates)}"


@dataclass(frozen=True)
class _Sample:
    """One sampled key: its partition, its hash per family (:data:`FAMILIES` order), whether it is
    empty, and its first bytes (for messages)."""

    partition: int
    hashes: tuple[int, ...]
    empty: bool
    shown: str
    # partitioner -> (largest count known not to fit, smallest count known to fit): both monotone,
    # as a key that fits under n fits under every larger count (an earlier count is one of them)
    _known: dict[str, tuple[int, int]] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def of(cls, partition: int, key: bytes) -> _Sample:
        shown = repr(bytes(key[:_SHOWN_KEY_BYTES])) + ("..." if len(key) > _SHOWN_KEY_BYTES else "")
        return cls(partition, tuple(key_hash(f, key) for f in _FAMILY_ORDER), not key, shown)

    def placed(self, name: str, count: int) -> bool:
        """``name`` puts this key in its partition under ``count`` partitions."""
        if self.empty and name == "consistent_random":
            return True
        return self.hashes[_FAMILY_ORDER.index(family_of(name))] % count == self.partition

    def fits(self, name: str, count: int) -> bool:
        """``name`` puts this key in its partition under ``count`` partitions or any earlier count
        ``n'`` with ``partition < n' <= count`` (module docstring)."""
        partition = self.partition
        if partition >= count or self.placed(name, count):
            return True  # (a partition beyond the count: the count read is older than the data; no evidence)
        unfit, fit = self._known.get(name, (0, 1 << 62))
        if count >= fit or count <= unfit:
            return count >= fit
        rest = self.hashes[_FAMILY_ORDER.index(family_of(name))] - partition
        # h % n' == P  <=>  n' divides h - P (h >= P), for n' > P: O(count) once per sample and count
        result = rest >= 0 and (rest == 0 or any(rest % n == 0 for n in range(partition + 1, count)))
        self._known[name] = (unfit, count) if result else (count, fit)
        return result


class _Store(Protocol):  # what sampling reads of a StateStore
    def offsets(self) -> dict[int, int]: ...
    def scan(self, start: bytes = b"", end: bytes | None = None, *, prefix: bytes | None = None,
             partition: int | None = None) -> Iterable[tuple[bytes, Any]]: ...
    def items(self, partition: int | None = None) -> Iterable[tuple[bytes, Any]]: ...


@dataclass
class PartitionerDetection:
    """The producers' partitioner of one topic, from samples of the keys its partitions hold
    (module docstring). Sampled by the run loop's thread; :meth:`routing` may be called from any
    thread (readers) and returns an immutable :class:`KeyRouting`.

    Args:
        partitioner: :data:`AUTO` (detect) or a name of :data:`~materializer.group.routing.PARTITIONERS`
            (configured: readers route by it; :meth:`contradiction` checks it).
        sample_keys: keys per partition sample.
    """

    partitioner: str = AUTO
    sample_keys: int = SAMPLE_KEYS
    _samples: dict[int, list[_Sample]] = field(default_factory=dict)
    _sampled_at: dict[int, int] = field(default_factory=dict)  # partition -> store next offset when sampled
    _cache: tuple[int, int, KeyRouting] | None = None  # (partition count, version, routing)
    _version: int = 0
    _smallest_count: int = 0  # the smallest partition count the run has seen (0: none yet)
    _random: random.Random = field(default_factory=lambda: random.Random(os.urandom(8)))
    _lock: threading.Lock = field(default_factory=threading.Lock)  # the samples, for readers' threads

    @property
    def configured(self) -> str | None:
        """The configured partitioner, or None when detecting."""
        return None if self.partitioner == AUTO else self.partitioner

    def record(self, partition: int, keys: Iterable[bytes], next_offset: int = 0) -> None:
        """Take ``keys`` (of ``partition``) as its sample, replacing the one before; ``next_offset``:
        the store's next offset of the partition now (when to sample again: :meth:`due`)."""
        sample = [_Sample.of(partition, key) for key in keys]
        with self._lock:
            self._samples[partition] = sample
            self._sampled_at[partition] = next_offset
            self._version += 1

    def due(self, next_offsets: Mapping[int, int]) -> list[int]:
        """Partitions of ``next_offsets`` (the store's next offset per partition) to sample: never
        sampled, or grown to twice the next offset they were sampled at (while they had fewer
        keys than a sample holds, as soon as they grew)."""
        due = []
        for partition, offset in sorted(next_offsets.items()):
            at = self._sampled_at.get(partition)
            if at is None:
                due.append(partition)
            elif offset > at and (offset >= 2 * at or len(self._samples.get(partition, ())) < self.sample_keys):
                due.append(partition)
        return due

    def sample(self, store: _Store, partitions: Iterable[int] | None = None) -> list[int]:
        """Sample the partitions of ``store`` that are due (:meth:`due`; or ``partitions``, those the
        store has), at most 64 per call: up to :attr:`sample_keys` keys each, read from a random
        point of the partition's key range onwards (wrapping to its start). Returns the partitions
        sampled.

        Raises:
            StoreError: RocksDB failed.
        """
        offsets = store.offsets()
        chosen = (self.due(offsets) if partitions is None
                  else [p for p in sorted(set(partitions)) if p in offsets])[:_PARTITIONS_PER_ROUND]
        for partition in chosen:
            start = self._random.getrandbits(64).to_bytes(8, "big")
            keys = [key for key, _ in itertools.islice(store.scan(start, partition=partition), self.sample_keys)]
            if len(keys) < self.sample_keys:
                head = (key for key, _ in store.items(partition) if key < start)
                keys.extend(itertools.islice(head, self.sample_keys - len(keys)))
            self.record(partition, keys, offsets[partition])
        return chosen

    def _samples_all(self) -> list[_Sample]:
        with self._lock:
            return list(itertools.chain.from_iterable(self._samples.values()))

    def fitting(self, partition_count: int) -> tuple[str, ...]:
        """The partitioners every sampled key fits under ``partition_count`` partitions."""
        samples = self._samples_all()
        return tuple(name for name in PARTITIONERS if all(s.fits(name, partition_count) for s in samples))

    def saw_partition_count(self, partition_count: int) -> None:
        """The run read the topic's partition count: once it is larger than one seen before, keys
        may sit in their partitions under the smaller count (every candidate is :attr:`KeyRouting.grown`)."""
        if partition_count <= 0:
            return
        with self._lock:
            if self._smallest_count == 0 or partition_count < self._smallest_count:
                self._smallest_count = partition_count
                self._version += 1

    def routing(self, partition_count: int) -> KeyRouting:
        """How readers route keys now: the configured partitioner, or the candidates that fit every
        sampled key (:meth:`fitting`); each :attr:`~KeyRouting.grown` when the partition count
        grew (:meth:`saw_partition_count`, or a sampled key it places only under a smaller count)."""
        cache, version = self._cache, self._version
        if cache is not None and cache[:2] == (partition_count, version):
            return cache[2]
        if partition_count <= 0:
            routing = (KeyRouting.configured(self.configured) if self.configured is not None
                       else KeyRouting(PARTITIONERS, "detected"))
        else:
            candidates = (self.configured,) if self.configured is not None else self.fitting(partition_count)
            grown = self._grown(candidates, partition_count)
            routing = (KeyRouting.configured(candidates[0], bool(grown)) if self.configured is not None
                       else KeyRouting(candidates, "detected", grown))
        self._cache = (partition_count, version, routing)  # (a sample taken meanwhile: a later version)
        return routing

    def _grown(self, candidates: tuple[str, ...], partition_count: int) -> tuple[str, ...]:
        """The ``candidates`` by which some key may sit in its partition under a smaller count than
        ``partition_count``: all when the run saw a smaller count; else, once one family is left,
        its names when it places some sampled key only under a smaller count; while several are
        left, those that do when every one does (the count grew, whichever is the producers'). A
        wrong family places most keys only under some smaller count; taking that for growth would
        refuse what the producers' family answers exactly, so it counts only when it is certain."""
        if 0 < self._smallest_count < partition_count:
            return candidates
        samples = [s for s in self._samples_all() if s.partition < partition_count]
        needs = tuple(name for name in candidates if any(not s.placed(name, partition_count) for s in samples))
        decided = len({family_of(name) for name in candidates}) == 1
        return needs if decided or len(needs) == len(candidates) else ()

    @property
    def sampled_keys(self) -> int:
        """Keys sampled (the evidence :meth:`routing` rests on)."""
        return len(self._samples_all())

    def contradiction(self, partition_count: int) -> str | None:
        """Configured: why the data contradicts the configured partitioner (a sampled key it does
        not place in its partition under any count up to ``partition_count``, and the
        partitioners that fit), or None."""
        name = self.configured
        if name is None or partition_count <= 0:
            return None
        bad = next((s for s in self._samples_all() if not s.fits(name, partition_count)), None)
        if bad is None:
            return None
        fit = self.fitting(partition_count)
        remedy = (f"the sampled keys fit {describe(fit)}: run with --partitioner {fit[0]} (or without --partitioner, "
                  "which detects it)" if fit else
                  "no known partitioner places every sampled key (a custom partitioner, or records produced to "
                  "explicit partitions): run without --partitioner, so that reads look a key up in every partition "
                  "it may be in and refuse when one of them is another member's")
        return (f"the partitioner {name!r} (--partitioner, MaterializerOptions.partitioner) does not place key "
                f"{bad.shown} in partition {bad.partition}, where the topic holds it, under any partition count up "
                f"to {partition_count}: reads would look such keys up in another partition and answer absent; "
                f"{remedy}")

    def unplaced(self, partition_count: int) -> set[int]:
        """Partitions with a sampled key that the routing (:meth:`routing`) does not send there
        under ``partition_count`` partitions: written before the partition count grew, or by
        another partitioner; reads of such keys look in other partitions."""
        routing = self.routing(partition_count)
        if not routing.candidates or partition_count <= 0:
            return set()  # reads look everywhere
        return {s.partition for s in self._samples_all()
                if s.partition < partition_count and not any(s.placed(n, partition_count) for n in routing.candidates)}

