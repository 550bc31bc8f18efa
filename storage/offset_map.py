"""The cleaner's bounded key -> last offset map (Kafka ``OffsetMap`` / ``SkimpyOffsetMap``).

Kafka's cleaner de-duplicates the dirty section of a log with a fixed-size open-addressing hash
table held in one byte buffer (``SkimpyOffsetMap.java``). A key is never stored: its
MD5 digest stands in for it, so two keys with the same digest are the same key. One entry is::

    Entry => Digest Offset                      (24 bytes with MD5)
      Digest => 16 bytes (MD5 of the record key bytes)
      Offset => Int64    (the latest offset seen for that digest)

``slots = memory_bytes // 24``; an all-zero entry is an empty slot. The i-th probe for a digest
``h`` reads the big-endian int32 at byte ``min(i, 12)`` of ``h`` and adds ``max(0, i - 12)``
(int32 arithmetic), then ``slot = abs(probe) % slots`` (``Utils.abs``: ``abs(MIN_INT) == 0``):
thirteen probes from successive 4-byte windows of the digest, then linear probing.

Capacity is what makes compaction results depend on the map: the cleaner
(``Cleaner.buildOffsetMapForSegment``) stops filling once ``size >= int(slots * load_factor)``
(load factor 0.9 by default), ends the round at the last mapped offset, and leaves the rest of
the dirty section for the next round. Every implementation below reproduces that exactly:

* :class:`SkimpyOffsetMap` - what the cleaner uses, in the native core (``_native.DigestTable``):
  the same digests, capacity and full point, MD5 and probing in Rust, one native pass per batch.
  Its buckets (24 bytes each, linear probing from the digest's first 8 bytes) grow with the
  entries, doubling at 3/4 load while they stay within an eighth of ``slots``, then taking all
  ``slots``: Kafka's buffer size is its most (1/8 more for the moment of that last growth), not
  what every round allocates and zeroes. Where an entry sits is not observable (only which
  digests the map holds, their offsets and its size are), so that changes no cleaned byte; a
  round of 200k keys under the default 128 MiB touches ~12 MiB, and its lookups stay in the CPU caches.
* :class:`ReferenceSkimpyOffsetMap` - Kafka's table on a ``bytearray`` in Python, its layout and
  probe sequence: the readable definition the native table is tested against (same entries,
  same outcome of every put); slow, not on any user's path.
* :class:`DigestDictOffsetMap` - a ``dict`` keyed by the 16-byte digest with the same slot count,
  the same size cap and the same entry counting (123 bytes per key by tracemalloc, 189 by RSS
  in `benchmarks/bench_offset_map.py`, instead of 24 per slot).
  Observable behaviour is identical because a Skimpy map always finds a stored digest or an
  empty slot while ``size < slots``.

The cleaner calls one interface on every map: :meth:`~OffsetMap.map_records_section` (map pass)
and :meth:`~OffsetMap.kept_in_section` (recopy pass, over :meth:`~OffsetMap.retained_in_section`) per batch. :class:`OffsetMap` implements
them in Python over :meth:`~OffsetMap.put`/:meth:`~OffsetMap.get_many` (what the two Python maps
use); :class:`SkimpyOffsetMap` overrides them with one native pass each. The tests hold the two
to the same cleaned bytes.

:func:`new_offset_map` builds the cleaner's map (:class:`SkimpyOffsetMap`).
"""

from __future__ import annotations

import hashlib
import struct
from abc import ABC, abstractmethod
from itertools import compress, repeat
from operator import ge, methodcaller
from typing import cast

from . import _native

__all__ = [
    "OffsetMap",
    "SkimpyOffsetMap",
    "ReferenceSkimpyOffsetMap",
    "DigestDictOffsetMap",
    "new_offset_map",
    "DIGEST_SIZE_BYTES",
    "BYTES_PER_ENTRY",
    "DEFAULT_DEDUPE_BUFFER_SIZE_BYTES",
    "DEFAULT_LOAD_FACTOR",
]

DIGEST_SIZE_BYTES = 16
"""Length of an MD5 digest, the only hash Kafka uses for the offset map."""

BYTES_PER_ENTRY = DIGEST_SIZE_BYTES + 8
"""Bytes per map entry: digest plus an int64 offset (24)."""

DEFAULT_DEDUPE_BUFFER_SIZE_BYTES = 134217728
"""``log.cleaner.dedupe.buffer.size`` default: 128 MiB shared by all cleaner threads."""

DEFAULT_LOAD_FACTOR = 0.9
"""``log.cleaner.io.buffer.load.factor`` default: fraction of slots the cleaner fills per round."""

_INT32_MIN = -(2**31)
_EMPTY_ENTRY = bytes(BYTES_PER_ENTRY)
_READ_INT32 = struct.Struct(">i").unpack_from
_OFFSET = struct.Struct(">q")
try:  # CPython's own MD5 costs about half of OpenSSL's per call for short keys (no EVP context)
    from _md5 import md5 as _md5
except ImportError:  # pragma: no cover - a CPython built without it
    _md5 = hashlib.md5
_digest = methodcaller("digest")


def _slot_count(memory_bytes: int) -> int:
    if memory_bytes < BYTES_PER_ENTRY:
        raise ValueError(
            f"offset map memory of {memory_bytes} bytes holds no {BYTES_PER_ENTRY}-byte entry"
        )
    return memory_bytes // BYTES_PER_ENTRY


class OffsetMap(ABC):
    """A bounded map from record key (by MD5 digest) to the latest offset (Kafka ``OffsetMap``).

    Offsets are Kafka offsets. ``latest_offset`` is the last offset passed to :meth:`put` or
    :meth:`update_latest_offset` (``-1`` after :meth:`clear`). Not thread-safe: each cleaner
    thread owns one map.
    """

    __slots__ = ("_slots", "_entries", "_latest_offset")

    def __init__(self, memory_bytes: int):
        self._slots = _slot_count(memory_bytes)
        self._entries = 0
        self._latest_offset = -1

    @property
    def slots(self) -> int:
        """Number of 24-byte entries the memory budget holds (``memory_bytes // 24``)."""
        return self._slots

    @property
    def size(self) -> int:
        """Number of distinct digests stored since the last :meth:`clear`."""
        return self._entries

    def __len__(self) -> int:
        return self._entries

    @property
    def latest_offset(self) -> int:
        """The latest offset put into the map, or ``-1`` when nothing was put since :meth:`clear`."""
        return self._latest_offset

    def update_latest_offset(self, offset: int) -> None:
        """Set :attr:`latest_offset` without storing a key (used to skip offset gaps)."""
        self._latest_offset = offset

    @property
    def utilization(self) -> float:
        """``size / slots`` (Kafka ``OffsetMap.utilization``, the "buffer utilization" stat)."""
        return self._entries / self._slots

    def _check_not_full(self) -> None:
        if self._entries >= self._slots:
            raise ValueError(
                "Attempted to add a new entry to a full offset map, "
                f"entries: {self._entries}, slots: {self._slots}"
            )

    @abstractmethod
    def put(self, key: bytes | memoryview, offset: int) -> None:
        """Record ``offset`` as the latest offset of ``key``; sets :attr:`latest_offset`.

        Raises:
            ValueError: the map already holds ``slots`` entries (checked before looking the key
                up, as Kafka does).
        """

    @abstractmethod
    def get(self, key: bytes | memoryview) -> int:
        """The offset stored for ``key``'s digest, or ``-1`` if absent."""

    @abstractmethod
    def clear(self) -> None:
        """Forget every entry and reset :attr:`latest_offset` to ``-1``."""

    def put_many(self, keys: list[bytes], offsets: list[int]) -> None:
        """:meth:`put` each ``keys[i] -> offsets[i]`` in order (no ``None`` keys).

        Same result, and the same ``ValueError`` at the same entry when the map fills up, as
        calling :meth:`put` in a loop; subclasses may do it in bulk.
        """
        put = self.put
        for key, offset in zip(keys, offsets):
            put(key, offset)

    def get_many(self, keys: list[bytes]) -> list[int]:
        """``[self.get(key) for key in keys]`` (no ``None`` keys); subclasses may do it in bulk."""
        get = self.get
        return [get(key) for key in keys]

    def map_records_section(self, data: bytes, count: int, base_offset: int, start: int, end: int,
                            max_entries: int) -> tuple[int, bool]:
        """Kafka ``Cleaner.buildOffsetMapForSegment``'s inner loop over one records section:
        put every keyed record with ``start <= offset < end`` while the map holds fewer than
        ``max_entries`` entries.

        ``data`` is an uncompressed v2 records section of ``count`` records whose offset deltas
        are relative to ``base_offset``. Returns ``(records_read, stopped)``: the records read
        before stopping (``count`` when not stopped) and whether a record found the map at
        ``max_entries`` (the round then ends before it).

        This is the pass of the Python maps (a keys-only scan, then one :meth:`put_many` when
        every record fits, else :meth:`put` record by record); :class:`SkimpyOffsetMap` does the
        same in one native pass.

        Raises:
            ValueError: a framing error in ``data`` (nothing is put then).
        """
        offsets, keys, _ = _native.scan_keys(data, count, base_offset)
        if (
            offsets
            and None not in keys
            and min(offsets) >= start
            and max(offsets) < end
            and self._entries + len(keys) <= max_entries
        ):
            # every record is mapped and the map cannot fill up part way: one bulk put
            self.put_many(cast("list[bytes]", keys), offsets)
            return len(offsets), False
        put = self.put
        for records_read, (offset, key) in enumerate(zip(offsets, keys)):
            if key is not None and start <= offset < end:
                if self._entries >= max_entries:
                    return records_read, True
                put(key, offset)
        return len(offsets), False

    def retained_in_section(self, data: bytes, count: int, base_offset: int
                            ) -> tuple[list[int], list[bool | None], list[int]]:
        """Kafka ``Cleaner.shouldRetainRecord``'s offset test for every record of one records section.

        ``data``, ``count`` and ``base_offset`` as in :meth:`map_records_section`. Returns
        ``(offsets, keep, tombstone indices)``: absolute offsets; ``keep[i]`` True when the
        record's offset is past :attr:`latest_offset` or ``>= get(key)``, False when a later
        offset of its key is stored, None for a null key at or below :attr:`latest_offset`;
        indices of records with a null value.

        A keys-only scan, then :meth:`get_many` (every map; :class:`SkimpyOffsetMap`'s recopy pass
        is its native :meth:`kept_in_section` instead).

        Raises:
            ValueError: a framing error in ``data``.
        """
        offsets, keys, tombstones = _native.scan_keys(data, count, base_offset)
        latest_offset = self._latest_offset
        keep: list[bool | None]
        if None not in keys:
            keep = list(map(ge, offsets, self.get_many(cast("list[bytes]", keys))))
            if offsets and max(offsets) > latest_offset:
                keep = [k or offset > latest_offset for k, offset in zip(keep, offsets)]
        else:
            get = self.get
            keep = [
                True if offset > latest_offset else None if key is None else offset >= get(key)
                for offset, key in zip(offsets, keys)
            ]
        return offsets, keep, tombstones

    def kept_in_section(self, data: bytes, count: int, base_offset: int, retain_deletes: bool
                        ) -> tuple[list[int], bool, int]:
        """Kafka ``Cleaner.shouldRetainRecord`` for every record of one records section.

        :meth:`retained_in_section`'s decision, then: a null key at or below :attr:`latest_offset`
        is dropped and counted invalid; a kept tombstone is dropped when ``retain_deletes`` is
        False (its batch's delete horizon has passed, KIP-534) unless its offset is past
        :attr:`latest_offset`. Returns ``(indices of the kept records ascending, whether a kept
        record is a tombstone, invalid records)``.

        Raises:
            ValueError: a framing error in ``data``.
        """
        offsets, keep, tombstones = self.retained_in_section(data, count, base_offset)
        invalid = keep.count(None)
        decided = [bool(k) for k in keep]
        latest_offset = self._latest_offset
        contains_tombstones = False
        for i in tombstones:
            if decided[i]:
                if retain_deletes or offsets[i] > latest_offset:
                    contains_tombstones = True
                else:
                    decided[i] = False
        return list(compress(range(len(decided)), decided)), contains_tombstones, invalid


class SkimpyOffsetMap(OffsetMap):
    """Kafka's ``SkimpyOffsetMap`` in the native core: 24-byte entries in buckets that grow with
    the entries up to ``slots`` (module docstring): at most ``slots * 24`` bytes
    (:attr:`memory_bytes`) once grown, and up to 1/8 more for the moment of its last growth.
    ``put``/``put_many`` raise ``ValueError`` when a new entry would not fit. Its map and recopy
    passes are native; :meth:`retained_in_section` is the Python one of :class:`OffsetMap`.
    """

    __slots__ = ("_table",)

    def __init__(self, memory_bytes: int = DEFAULT_DEDUPE_BUFFER_SIZE_BYTES):
        super().__init__(memory_bytes)
        self._table = _native.DigestTable(self._slots)

    @property
    def memory_bytes(self) -> int:
        """Kafka's buffer size for this map, ``slots * 24`` bytes: what its buckets take at most once grown."""
        return self._table.memory_bytes

    def put(self, key: bytes | memoryview, offset: int) -> None:
        self._table.put(key, offset)
        self._entries = self._table.entries
        self._latest_offset = offset

    def get(self, key: bytes | memoryview) -> int:
        return self._table.get(key)

    def put_many(self, keys: list[bytes], offsets: list[int]) -> None:
        if not keys:
            return
        failed_at = self._table.put_many(keys, offsets)
        self._entries = self._table.entries
        if failed_at is None:
            self._latest_offset = offsets[-1]
            return
        if failed_at:
            self._latest_offset = offsets[failed_at - 1]
        self._check_not_full()

    def get_many(self, keys: list[bytes]) -> list[int]:
        return self._table.get_many(keys)

    def map_records_section(self, data: bytes, count: int, base_offset: int, start: int, end: int,
                            max_entries: int) -> tuple[int, bool]:
        visited, stopped, last_put = self._table.map_records(data, count, base_offset, start, end, max_entries)
        self._entries = self._table.entries
        if last_put >= 0:
            self._latest_offset = last_put
        return visited, stopped

    def kept_in_section(self, data: bytes, count: int, base_offset: int, retain_deletes: bool
                        ) -> tuple[list[int], bool, int]:
        return self._table.kept(data, count, base_offset, self._latest_offset, retain_deletes)

    def sorted_entries(self) -> bytes:
        """The entries, 24 bytes each (digest, then big-endian offset), in digest order: for tests
        and debugging (compare :meth:`ReferenceSkimpyOffsetMap.sorted_entries`)."""
        return self._table.sorted_entries()

    def clear(self) -> None:
        self._table.clear()
        self._entries = 0
        self._latest_offset = -1


class ReferenceSkimpyOffsetMap(OffsetMap):
    """Kafka's ``SkimpyOffsetMap`` in plain Python over one ``bytearray`` of 24-byte entries.

    The readable definition :class:`SkimpyOffsetMap` is tested against; not used by the cleaner.
    """

    __slots__ = ("_buffer",)

    def __init__(self, memory_bytes: int = DEFAULT_DEDUPE_BUFFER_SIZE_BYTES):
        super().__init__(memory_bytes)
        self._buffer = bytearray(self._slots * BYTES_PER_ENTRY)

    def _position_of(self, digest: bytes, attempt: int) -> int:
        if attempt <= DIGEST_SIZE_BYTES - 4:
            probe = _READ_INT32(digest, attempt)[0]
        else:
            # int32 overflow wraps in Java
            probe = _READ_INT32(digest, DIGEST_SIZE_BYTES - 4)[0] + attempt - DIGEST_SIZE_BYTES + 4
            probe = (probe - _INT32_MIN) % 2**32 + _INT32_MIN
        slot = (0 if probe == _INT32_MIN else abs(probe)) % self._slots
        return slot * BYTES_PER_ENTRY

    def put(self, key: bytes | memoryview, offset: int) -> None:
        self._check_not_full()
        digest = _md5(key).digest()
        buffer = self._buffer
        attempt = 0
        position = self._position_of(digest, 0)
        while buffer[position : position + BYTES_PER_ENTRY] != _EMPTY_ENTRY:
            if buffer[position : position + DIGEST_SIZE_BYTES] == digest:
                _OFFSET.pack_into(buffer, position + DIGEST_SIZE_BYTES, offset)
                self._latest_offset = offset
                return
            attempt += 1
            position = self._position_of(digest, attempt)
        buffer[position : position + DIGEST_SIZE_BYTES] = digest
        _OFFSET.pack_into(buffer, position + DIGEST_SIZE_BYTES, offset)
        self._latest_offset = offset
        self._entries += 1

    def get(self, key: bytes | memoryview) -> int:
        digest = _md5(key).digest()
        buffer = self._buffer
        # guards against endless probing of a completely full map (Kafka's maxAttempts)
        max_attempts = self._slots + DIGEST_SIZE_BYTES - 4
        attempt = 0
        while attempt < max_attempts:
            position = self._position_of(digest, attempt)
            if buffer[position : position + BYTES_PER_ENTRY] == _EMPTY_ENTRY:
                return -1
            if buffer[position : position + DIGEST_SIZE_BYTES] == digest:
                return _OFFSET.unpack_from(buffer, position + DIGEST_SIZE_BYTES)[0]
            attempt += 1
        return -1

    def sorted_entries(self) -> bytes:
        """The entries, 24 bytes each (digest, then big-endian offset), in digest order."""
        buffer = self._buffer
        entries = (bytes(buffer[at:at + BYTES_PER_ENTRY]) for at in range(0, len(buffer), BYTES_PER_ENTRY))
        return b"".join(sorted(entry for entry in entries if entry != _EMPTY_ENTRY))

    def clear(self) -> None:
        self._entries = 0
        self._latest_offset = -1
        self._buffer[:] = bytes(len(self._buffer))


class DigestDictOffsetMap(OffsetMap):
    """Same contract and capacity as :class:`SkimpyOffsetMap`, stored in a ``dict`` keyed by digest.

    About twice as fast in CPython; about 120 bytes of RAM per distinct key.
    """

    __slots__ = ("_offsets",)

    def __init__(self, memory_bytes: int = DEFAULT_DEDUPE_BUFFER_SIZE_BYTES):
        super().__init__(memory_bytes)
        self._offsets: dict[bytes, int] = {}

    def put(self, key: bytes | memoryview, offset: int) -> None:
        if self._entries >= self._slots:
            self._check_not_full()
        digest = _md5(key).digest()
        offsets = self._offsets
        if digest not in offsets:
            self._entries += 1
        offsets[digest] = offset
        self._latest_offset = offset

    def get(self, key: bytes | memoryview) -> int:
        return self._offsets.get(_md5(key).digest(), -1)

    def put_many(self, keys: list[bytes], offsets: list[int]) -> None:
        if not keys:
            return
        if self._entries + len(keys) > self._slots:
            super().put_many(keys, offsets)  # may fill up part way: raise at the same entry as put
            return
        # hashing, digests and dict updates all run in C; later duplicates win as with put
        self._offsets.update(zip(map(_digest, map(_md5, keys)), offsets))
        self._entries = len(self._offsets)
        self._latest_offset = offsets[-1]

    def get_many(self, keys: list[bytes]) -> list[int]:
        return list(map(self._offsets.get, map(_digest, map(_md5, keys)), repeat(-1)))

    def clear(self) -> None:
        self._offsets = {}
        self._entries = 0
        self._latest_offset = -1


def new_offset_map(memory_bytes: int = DEFAULT_DEDUPE_BUFFER_SIZE_BYTES) -> OffsetMap:
    """Build the cleaner's offset map for a budget of ``memory_bytes`` (per cleaner thread):
    a :class:`SkimpyOffsetMap` of ``memory_bytes // 24`` slots (RAM: as many buckets as its
    entries need, at most that budget once grown, 1/8 more while its last growth copies).

    Raises:
        ValueError: ``memory_bytes`` is smaller than one 24-byte entry.
    """
    return SkimpyOffsetMap(memory_bytes)
