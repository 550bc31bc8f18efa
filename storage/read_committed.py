"""Reading a partition the way a ``read_committed`` Kafka consumer sees it.

A ``read_committed`` fetch has two halves:

* the broker (``UnifiedLog.read`` with ``FetchIsolation.TXN_COMMITTED``) serves batches only
  below the **last stable offset** (LSO: the first offset of the oldest transaction that has no
  COMMIT/ABORT marker yet) and attaches the **aborted transactions** overlapping the fetched
  range, ``(producer_id, first_offset)`` pairs collected from the ``.txnindex`` files
  (``LogSegment.collectAbortedTxns``: entries with ``last_offset >= fetch offset`` and
  ``first_offset < upper bound``);
* the consumer (``clients/.../consumer/internals/CompletedFetch.nextFetchedRecord``) keeps those
  transactions in a queue ordered by ``first_offset``. For every batch that has a producer id it
  first moves each queued transaction with ``first_offset <= batch.last_offset`` into a set of
  aborted producer ids; a control batch whose first record is an ABORT marker removes its
  producer id from the set; a *transactional* data batch whose producer id is in the set is
  skipped whole. Control batches never reach the application.

:class:`CommittedReader` re-expresses both halves over local files.

Where the aborted transactions come from (:class:`AbortedTxnSource`):

* ``INDEX``: only the ``.txnindex`` files, exactly as the broker answers a fetch. Correct for a
  broker's folder, whose transaction indexes the broker maintains (and rebuilds on recovery).
* ``SCAN``: rebuilt from the log itself: batch headers are folded in offset order through a
  :class:`.ProducerStateManager` (which tracks per producer the first offset of its open
  transaction); every ABORT marker yields ``AbortedTxn(producer_id, first_offset,
  marker_offset, last_stable_offset)``.
* ``AUTO`` (default): the union of both, keyed by ``(producer_id, marker offset)``, preferring
  the index entry. A missing ``.txnindex`` is normal in Kafka (created lazily, only when a marker
  in the segment aborts a transaction), and a ``.txnindex`` emptied by a local recovery looks the
  same, so an absent entry never proves "not aborted"; an ABORT marker in the log always does.
  The index entry wins when both exist because it keeps a first offset that may lie before the
  log start offset or in batches the cleaner removed.

The header pass is needed in every mode anyway: the LSO is not stored on disk and must be
recomputed from the open transactions, as the broker's ``ProducerStateManager`` does on load.

Memory: bounded by the number of producers with an open transaction plus the number of aborted
transactions (the same data the ``.txnindex`` files hold), never by the size of a transaction:
no batch is buffered. The log is read twice (headers, then records).

A broker's partition folder can be read in place, strictly read-only, with
:class:`ReadOnlyPartition` (files opened ``rb`` and memory-mapped read-only; nothing is created,
truncated or renamed). Because it cannot run recovery it is strict: a batch with a wrong CRC,
or an incomplete batch anywhere but at the end of the last segment (a write in flight), raises
:class:`CorruptRecordError` naming the file and byte position; an unfinished swap (``.swap`` /
``.cleaned`` files) raises :class:`UnfinishedSegmentSwapError` (open a copy with ``Log.open`` instead).

Mirrors ``CompletedFetch`` (consumer), ``UnifiedLog.collectAbortedTransactions`` /
``LogSegment.collectAbortedTxns`` and ``ProducerStateManager.lastStableOffset``.
"""

from __future__ import annotations

import heapq
import logging
import mmap
import os
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Iterator, NamedTuple, Protocol, Sequence

from .control_record import ControlRecordType, parse_control_record_type
from .errors import (
    CorruptIndexError,
    CorruptRecordError,
    InvalidOffsetError,
    LogNotFoundError,
    UnfinishedSegmentSwapError,
)
from .producer_state_manager import ProducerStateManager
from .files import (
    CLEANED_FILE_SUFFIX,
    LOG_FILE_SUFFIX,
    SWAP_FILE_SUFFIX,
    offset_from_file_name,
    parse_partition_dir_name,
    transaction_index_file,
)
from .record_batch import LOG_OVERHEAD, Record, RecordBatch, iter_batches
from .transaction_index import AbortedTxn, TransactionIndex
from .varint import INT32_MAX

if TYPE_CHECKING:  # pragma: no cover
    from .log import Log

__all__ = [
    "AbortedTxnSource",
    "BatchKind",
    "checked_segment_batches",
    "classify_batches",
    "CommittedReader",
    "PartitionSegment",
    "ReadOnlyPartition",
    "TransactionScan",
    "read_committed",
    "scan_transactions",
]

logger = logging.getLogger(__name__)

_LENGTH_FIELD_END = 12  # BaseOffset (Int64) + Length (Int32)


class AbortedTxnSource(str, Enum):
    """Where :class:`CommittedReader` takes the aborted transactions from (module docstring)."""

    INDEX = "index"
    SCAN = "scan"
    AUTO = "auto"


class PartitionSegment(Protocol):
    """What the reader needs of a segment: its base offset, ``.txnindex`` and batches."""

    base_offset: int

    def transaction_index(self) -> TransactionIndex:
        """The segment's transaction index (the file may not exist)."""

    def batches(self) -> Iterator[tuple[int, RecordBatch]]:
        """``(position, batch)`` for every complete batch, in file order (CRC not checked)."""


class _LogSegmentView:
    """A segment of an open :class:`Log`, bounded by its size when the snapshot was taken.

    Strict: the log's own writer appends whole batches, so bytes after the last complete batch
    (in any segment, the active one included) are damage, never a write in flight.
    """

    def __init__(self, segment, size_in_bytes: int):
        self.base_offset = segment.base_offset
        self.path = str(segment.log_path)
        self._segment = segment
        self._size_in_bytes = size_in_bytes

    def transaction_index(self) -> TransactionIndex:
        return self._segment.txn_index

    def batches(self) -> Iterator[tuple[int, RecordBatch]]:
        end = 0
        for position, batch in self._segment.log.batches_from(0, self._size_in_bytes):
            yield position, batch
            end = position + batch.size_in_bytes
        if end < self._size_in_bytes:
            raise CorruptRecordError(
                f"incomplete record batch: {self._size_in_bytes - end} bytes after the last complete batch "
                f"of the {self._size_in_bytes}-byte segment do not form a batch",
                path=self.path, position=end)


def _checked_batches(segment: PartitionSegment, next_base_offset: int | None) -> Iterator[tuple[int, RecordBatch]]:
    """``segment.batches()`` with the offset checks a broker applies on append and on recovery.

    Offsets increase from batch to batch (``LogValidator``/``ProducerAppendInfo``: a batch's base
    offset is above the previous batch's last offset), stay at or above the segment's base offset,
    below the next segment's base offset, and within the segment's Int32 relative-offset range
    (``LogSegment.ensureOffsetInRange``). The base offset is not covered by the CRC, so a flipped
    bit there is caught only by these checks.

    Raises:
        CorruptRecordError: naming the file, the byte position, and in ``offset`` the first offset
            not read intact.
    """
    path = getattr(segment, "path", None) or str(getattr(segment, "log_path", "<segment>"))
    base = segment.base_offset
    expected = base
    batches = segment.batches()
    while True:
        try:
            position, batch = next(batches)
        except StopIteration:
            return
        except CorruptRecordError as exc:  # framing, magic, torn tail: say where intact data ends
            if exc.offset is None:
                exc.offset = expected
            raise
        problem = None
        if batch.base_offset < expected:
            problem = (f"batch base offset {batch.base_offset} is below the segment's base offset {base}"
                       if expected == base else
                       f"batch base offset {batch.base_offset} is not above the previous batch's last offset "
                       f"{expected - 1}")
        elif batch.last_offset < batch.base_offset:
            problem = f"batch last offset {batch.last_offset} is below its base offset {batch.base_offset}"
        elif batch.last_offset - base > INT32_MAX:
            problem = (f"batch last offset {batch.last_offset} does not fit the Int32 relative offsets of the "
                       f"segment based at {base}")
        elif next_base_offset is not None and batch.last_offset >= next_base_offset:
            problem = (f"batch last offset {batch.last_offset} is not below the next segment's base offset "
                       f"{next_base_offset}")
        if problem is not None:
            raise CorruptRecordError(problem, path=path, position=position, offset=expected)
        yield position, batch
        expected = batch.next_offset


def checked_segment_batches(log_path: Path | str, next_base_offset: int | None, *,
                            is_last: bool) -> Iterator[tuple[int, RecordBatch]]:
    """``(position, batch)`` of one ``<base>.log`` file, read-only, with every framing and offset check
    of :class:`ReadOnlyPartition` (``is_last``: a torn tail is a write in flight, not an error).

    Raises:
        CorruptRecordError: naming the file and byte position (CRCs are not checked here).
    """
    return _checked_batches(_FileSegment(Path(log_path), is_last=is_last), next_base_offset)


def _with_next_base(segments: Sequence[PartitionSegment]) -> Iterator[tuple[PartitionSegment, int | None]]:
    for i, segment in enumerate(segments):
        yield segment, (segments[i + 1].base_offset if i + 1 < len(segments) else None)


class _FileSegment:
    """One ``<base>.log`` file of a folder, read through a read-only memory map."""

    def __init__(self, log_path: Path, *, is_last: bool):
        self.log_path = log_path
        self.path = str(log_path)
        self.base_offset = offset_from_file_name(log_path.name)
        self.is_last = is_last

    def transaction_index(self) -> TransactionIndex:
        return TransactionIndex(self.base_offset, transaction_index_file(self.log_path.parent, self.base_offset))

    def batches(self) -> Iterator[tuple[int, RecordBatch]]:
        path = str(self.log_path)
        with open(self.log_path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size == 0:
                return
            # The map outlives this block while batches (memoryview slices) reference it.
            data = mmap.mmap(f.fileno(), size, access=mmap.ACCESS_READ)
        end = 0
        for position, batch in iter_batches(data, 0, path=path):
            yield position, batch
            end = position + batch.size_in_bytes
        if end < size:
            self._check_tail(data, end, size)

    def _check_tail(self, data: mmap.mmap, position: int, size: int) -> None:
        remaining = size - position
        if remaining >= _LENGTH_FIELD_END:
            length = int.from_bytes(data[position + 8:position + 12], "big", signed=True)
            detail = (f"the batch length field says {length} bytes, so the batch needs {length + LOG_OVERHEAD} "
                      f"bytes, but only {remaining} bytes remain in the {size}-byte file")
        else:
            detail = f"{remaining} trailing bytes are too few for a batch header ({_LENGTH_FIELD_END} bytes needed)"
        if self.is_last:
            logger.info("%s: incomplete batch at byte position %d (a write in flight?): %s; reading stops there",
                        self.log_path, position, detail)
            return
        raise CorruptRecordError(f"incomplete record batch: {detail}", path=str(self.log_path), position=position)


class ReadOnlyPartition:
    """A partition folder (``<topic>-<partition>``) read in place without modifying anything.

    Lists ``<base>.log`` files in base offset order at construction. ``log_start_offset`` is the
    first segment's base offset unless given (e.g. from the broker's ``log-start-offset-checkpoint``).

    ``strict``: an incomplete batch at the end of the last segment is an error too (by default it
    is taken as a write in flight and reading stops there).

    Raises:
        LogNotFoundError: ``dir_path`` is not a folder.
        UnfinishedSegmentSwapError: the folder holds ``.swap``/``.cleaned`` files of a swap in progress
            or interrupted.
    """

    def __init__(self, dir_path: Path | str, *, log_start_offset: int | None = None, strict: bool = False):
        self.dir = Path(dir_path)
        if not self.dir.is_dir():
            raise LogNotFoundError(f"partition folder {self.dir} does not exist")
        try:
            self.topic, self.partition = parse_partition_dir_name(self.dir.name)
        except ValueError:
            self.topic, self.partition = self.dir.name, -1
        names = sorted(os.listdir(self.dir))
        unfinished = [n for n in names if n.endswith(SWAP_FILE_SUFFIX) or n.endswith(CLEANED_FILE_SUFFIX)]
        if unfinished:
            raise UnfinishedSegmentSwapError(
                f"{self.dir} holds files of an interrupted segment swap ({', '.join(unfinished[:3])}); it cannot be "
                f"read in place: copy the folder and open the copy with Log.open, which completes the swap",
                path=str(self.dir))
        logs = sorted((n for n in names if n.endswith(LOG_FILE_SUFFIX)), key=offset_from_file_name)
        self._segments = [_FileSegment(self.dir / n, is_last=(i == len(logs) - 1) and not strict)
                          for i, n in enumerate(logs)]
        first = self._segments[0].base_offset if self._segments else 0
        self.log_start_offset = first if log_start_offset is None else max(first, log_start_offset)

    @property
    def segments(self) -> list[_FileSegment]:
        """The segments in base offset order."""
        return list(self._segments)

    def __repr__(self) -> str:
        return f"ReadOnlyPartition({str(self.dir)!r}, segments={len(self._segments)})"


class TransactionScan(NamedTuple):
    """Result of :func:`scan_transactions`.

    Attributes:
        aborted_transactions: aborted transactions sorted by ``first_offset``.
        last_stable_offset: first offset of the oldest open transaction, else ``log_end_offset``.
        log_end_offset: next offset after the last complete batch (the log start offset if empty).
        open_transactions: producer id -> first offset of its still-open transaction.
        batches: number of batches scanned.
    """

    aborted_transactions: list[AbortedTxn]
    last_stable_offset: int
    log_end_offset: int
    open_transactions: dict[int, int]
    batches: int


def _snapshot(partition: "Log | ReadOnlyPartition") -> tuple[list, int]:
    """(segments, log start offset) of a Log (sizes frozen under its lock) or a read-only folder."""
    if isinstance(partition, ReadOnlyPartition):
        return partition.segments, partition.log_start_offset
    with partition.lock:
        return ([_LogSegmentView(s, s.size_in_bytes) for s in partition.log_segments()], partition.log_start_offset)


def _is_abort_marker(batch: RecordBatch) -> bool | None:
    """True/False for an ABORT/COMMIT marker batch, None for other control or empty batches."""
    records = batch.records()
    if not records:
        return None
    try:
        control_type = parse_control_record_type(records[0].key)
    except ValueError as exc:
        raise CorruptRecordError(f"unreadable control record at offset {records[0].offset}: {exc}",
                                 path=batch.path, position=batch.position) from exc
    if control_type == ControlRecordType.ABORT:
        return True
    if control_type == ControlRecordType.COMMIT:
        return False
    return None


def _check_index_entry_points_at_its_marker(txn: AbortedTxn, batch: RecordBatch, index_files) -> None:
    """A ``.txnindex`` entry's last offset must hold that producer's ABORT marker when the log still
    holds a batch there (the file has no checksum; a wrong entry would hide committed data)."""
    if txn.last_offset < batch.base_offset:
        return  # the marker's batch is gone (removed by the cleaner after its delete horizon)
    if batch.is_control_batch and batch.producer_id == txn.producer_id and _is_abort_marker(batch):
        return
    what = (f"a control batch of producer {batch.producer_id}" if batch.is_control_batch
            else f"a data batch of producer {batch.producer_id}")
    raise CorruptIndexError(
        f"{index_files[(txn.producer_id, txn.last_offset)]}: aborted transaction {txn} ends at offset "
        f"{txn.last_offset}, which holds {what} at byte position {batch.position} of {batch.path}, not "
        f"producer {txn.producer_id}'s ABORT marker; delete the file to read the ABORT markers instead")


def scan_transactions(partition: "Log | ReadOnlyPartition", *, source: AbortedTxnSource = AbortedTxnSource.AUTO,
                      verify_crc: bool = True) -> TransactionScan:
    """Fold every batch header of ``partition`` into its aborted transactions and last stable offset.

    Args:
        partition: an open :class:`Log` or a :class:`ReadOnlyPartition`.
        source: where aborted transactions come from (module docstring).
        verify_crc: check every batch's CRC-32C on the way (cheap next to decoding records).

    Raises:
        CorruptRecordError: a batch fails its CRC, framing or offset-order check (file and byte
            position named), bytes that are no batch follow the last batch of a segment (except at
            the end of a read-only folder's last segment: a write in flight), or an
            end-transaction marker cannot be parsed.
        CorruptIndexError: a ``.txnindex`` entry has an unknown version, ends at an offset that holds
            no ABORT marker of its producer, or starts outside that producer's transaction.
    """
    source = AbortedTxnSource(source)
    segments, log_start_offset = _snapshot(partition)
    producer_state = ProducerStateManager()  # a fresh fold: the folder may not be a Log
    last_marker: dict[int, int] = {}  # producer id -> offset of its latest COMMIT/ABORT marker
    scanned: dict[tuple[int, int], AbortedTxn] = {}
    indexed: dict[tuple[int, int], AbortedTxn] = {}
    index_files: dict[tuple[int, int], str] = {}
    previous_markers: dict[tuple[int, int], int] = {}
    log_end_offset = segments[0].base_offset if segments else log_start_offset
    count = 0
    for segment, next_base_offset in _with_next_base(segments):
        pending: list[AbortedTxn] = []
        if source != AbortedTxnSource.SCAN:
            index = segment.transaction_index()
            for txn in index.all_aborted_txns():
                indexed[(txn.producer_id, txn.last_offset)] = txn
                index_files[(txn.producer_id, txn.last_offset)] = str(index.path)
                pending.append(txn)
            pending.sort(key=lambda t: t.last_offset, reverse=True)
        for position, batch in _checked_batches(segment, next_base_offset):
            if verify_crc:
                batch.ensure_valid(position=position)
            count += 1
            log_end_offset = batch.next_offset
            while pending and pending[-1].last_offset <= batch.last_offset:
                _check_index_entry_points_at_its_marker(pending.pop(), batch, index_files)
            completed = producer_state.update(batch)
            if completed is None or completed.is_aborted is None:
                continue
            producer_id = completed.producer_id
            previous_markers[(producer_id, completed.last_offset)] = last_marker.get(producer_id, -(2**63))
            last_marker[producer_id] = completed.last_offset
            if completed.is_aborted and source != AbortedTxnSource.INDEX:
                scanned[(producer_id, completed.last_offset)] = AbortedTxn(
                    producer_id, completed.first_offset, completed.last_offset,
                    producer_state.last_stable_offset(completed))
    for key, txn in indexed.items():
        found = scanned.get(key)
        if found is not None and not previous_markers[key] < txn.first_offset <= found.first_offset:
            raise CorruptIndexError(
                f"{index_files[key]}: aborted transaction {txn} starts at offset {txn.first_offset}, but the log "
                f"shows producer {txn.producer_id}'s transaction starting at {found.first_offset} after its "
                "previous marker" + (f" at {previous_markers[key]}" if previous_markers[key] >= 0 else "") +
                "; delete the file to read the ABORT markers instead")
    merged = {**scanned, **indexed}
    missing = [key for key in scanned if key not in indexed]
    if indexed and missing and source == AbortedTxnSource.AUTO:
        logger.info("%d ABORT markers have no .txnindex entry (index missing or rebuilt); using the markers",
                    len(missing))
    aborted = sorted(merged.values(), key=lambda t: (t.first_offset, t.last_offset))
    unstable = producer_state.first_unstable_offset()
    last_stable_offset = log_end_offset if unstable is None else unstable
    return TransactionScan(aborted, last_stable_offset, log_end_offset, producer_state.ongoing_transactions(), count)


class BatchKind(Enum):
    """What a ``read_committed`` consumer does with a batch (:func:`classify_batches`)."""

    DATA = "data"        # returned to the application
    ABORTED = "aborted"  # a transactional batch of an aborted transaction: skipped whole
    CONTROL = "control"  # a COMMIT/ABORT marker or other control batch: never returned


def classify_batches(batches: Iterable[RecordBatch], aborted_transactions: Sequence[AbortedTxn],
                     start_offset: int, end_offset: int) -> Iterator[tuple[RecordBatch, BatchKind]]:
    """The consumer half of ``read_committed`` (Kafka ``CompletedFetch.nextFetchedRecord``).

    ``batches`` are the batches from ``start_offset`` on, in offset order; ``aborted_transactions``
    the partition's (a superset is fine: those overlapping ``[start_offset, end_offset)`` are used,
    as the broker attaches them to a fetch). Each batch is yielded with what the consumer does with
    it. Works on any contiguous run of batches, so a reader may start at any segment.
    """
    queue = [(t.first_offset, t.producer_id) for t in aborted_transactions
             if t.last_offset >= start_offset and t.first_offset < end_offset]
    heapq.heapify(queue)
    aborted_producers: set[int] = set()
    for batch in batches:
        producer_id = batch.producer_id
        if producer_id >= 0:
            while queue and queue[0][0] <= batch.last_offset:
                aborted_producers.add(heapq.heappop(queue)[1])
            if batch.is_control_batch:
                if _is_abort_marker(batch):
                    aborted_producers.discard(producer_id)
            elif batch.is_transactional and producer_id in aborted_producers:
                yield batch, BatchKind.ABORTED
                continue
        yield batch, (BatchKind.CONTROL if batch.is_control_batch else BatchKind.DATA)


class CommittedReader:
    """Iterate a partition's committed data as a ``read_committed`` consumer fetching from
    ``start_offset`` up to the last stable offset would (module docstring).

    Usage::

        reader = CommittedReader(log, start_offset=0)
        for record in reader.records():
            ...
        reader.next_offset   # where a consumer would fetch next (the LSO once exhausted)

    Args:
        partition: an open :class:`Log` or a :class:`ReadOnlyPartition`. A Log keeps its single
            writer; batches appended after construction are not read.
        start_offset: first offset to return (default: the log start offset).
        source: where aborted transactions come from.
        verify_crc: check batch CRCs in the header pass.

    Raises:
        InvalidOffsetError: ``start_offset`` is below the log start offset.
        CorruptRecordError / CorruptIndexError: see :func:`scan_transactions`.
    """

    def __init__(self, partition: "Log | ReadOnlyPartition", *, start_offset: int | None = None,
                 source: AbortedTxnSource = AbortedTxnSource.AUTO, verify_crc: bool = True,
                 _live_scan: TransactionScan | None = None):
        self.partition = partition
        # _live_scan (from_log): the log's own state instead of a header pass, batches via its index
        self._live_batches: Iterator[RecordBatch] | None = None
        if _live_scan is None:
            self.scan = scan_transactions(partition, source=source, verify_crc=verify_crc)
            segments, log_start_offset = _snapshot(partition)
        else:
            self.scan, segments, log_start_offset = _live_scan, [], partition.log_start_offset
        start = log_start_offset if start_offset is None else start_offset
        if start < log_start_offset:
            raise InvalidOffsetError(f"offset {start} is below the log start offset {log_start_offset} of "
                                     f"{getattr(partition, 'dir', partition)}")
        self.start_offset = start
        self.end_offset = self.scan.last_stable_offset
        self.next_offset = start
        if _live_scan is not None:
            # The segments are taken now: retention raising the log start offset later (the cleaner
            # threads') does not fail this read, nor does a segment deleted under it (Log.read_batches).
            self._live_batches = partition.read_batches(start, self.end_offset)  # type: ignore[union-attr]
        self._segments: Sequence = segments
        self.batches_skipped_aborted = 0
        self.control_batches = 0

    @classmethod
    def from_log(cls, log: "Log", start_offset: int, end_offset: int | None = None) -> "CommittedReader":
        """A reader over ``[start_offset, end_offset)`` of a live :class:`Log`, with no header pass.

        The end defaults to the log's last stable offset (its ``ProducerStateManager``, kept on
        append); aborted transactions come from its ``.txnindex`` files
        (:meth:`Log.collect_aborted_transactions`, written when each ABORT marker was appended);
        batches are found through the offset index. This is how a broker answers a
        ``read_committed`` fetch (Kafka ``UnifiedLog.read`` with ``FetchIsolation.TXN_COMMITTED``
        and ``collectAbortedTransactions``), so an appender can apply each new stretch at the cost
        of that stretch, not of the whole log. The batches were CRC-checked when appended.

        Raises:
            InvalidOffsetError: ``start_offset`` is below the log start offset.
        """
        with log.lock:
            end = log.last_stable_offset if end_offset is None else end_offset
            aborted = log.collect_aborted_transactions(start_offset, end) if end > start_offset else []
            scan = TransactionScan(aborted, end, log.log_end_offset,
                                   log.producer_state_manager.ongoing_transactions(), 0)
            return cls(log, start_offset=start_offset, _live_scan=scan)

    @property
    def last_stable_offset(self) -> int:
        """The LSO computed by the header pass (reading stops there)."""
        return self.scan.last_stable_offset

    @property
    def log_end_offset(self) -> int:
        """Next offset after the last complete batch at construction."""
        return self.scan.log_end_offset

    def _raw_batches(self) -> Iterator[RecordBatch]:
        start, end = self.start_offset, self.end_offset
        if self._live_batches is not None:
            yield from self._live_batches
            return
        for segment, upper in _with_next_base(self._segments):
            if upper is not None and upper <= start:
                continue  # every batch of this segment is below start_offset
            for _, batch in _checked_batches(segment, upper):
                if batch.base_offset >= end:
                    return
                if batch.last_offset < start:
                    continue
                yield batch

    def batches(self) -> Iterator[RecordBatch]:
        """Committed data batches in offset order (a batch may hold records below ``start_offset``
        or, when ``end_offset`` falls inside it, from ``end_offset`` on; :meth:`records` drops
        them). Advances ``next_offset`` past each batch, never past ``end_offset``."""
        for batch, kind in classify_batches(self._raw_batches(), self.scan.aborted_transactions,
                                            self.start_offset, self.end_offset):
            if kind is BatchKind.ABORTED:
                self.batches_skipped_aborted += 1
            elif kind is BatchKind.CONTROL:
                self.control_batches += 1
            else:
                yield batch
            # a batch straddling end_offset: its records from end_offset on are the next read's
            self.next_offset = max(self.next_offset, min(batch.next_offset, self.end_offset))
        self.next_offset = max(self.next_offset, self.end_offset)

    def records(self) -> Iterator[Record]:
        """Committed data records with offsets in ``[start_offset, last_stable_offset)``."""
        start, end = self.start_offset, self.end_offset
        for batch in self.batches():
            for record in batch.records():
                if start <= record.offset < end:
                    yield record


def read_committed(partition: "Log | ReadOnlyPartition | Path | str", start_offset: int | None = None, *,
                   source: AbortedTxnSource = AbortedTxnSource.AUTO, verify_crc: bool = True) -> Iterator[Record]:
    """Committed data records of ``partition`` from ``start_offset`` up to its last stable offset.

    ``partition`` may be an open :class:`Log`, a :class:`ReadOnlyPartition`, or the path of a
    partition folder (read in place, read-only). See :class:`CommittedReader` for the rules and
    the errors raised.
    """
    if isinstance(partition, (str, Path)):
        partition = ReadOnlyPartition(partition)
    return CommittedReader(partition, start_offset=start_offset, source=source, verify_crc=verify_crc).records()
