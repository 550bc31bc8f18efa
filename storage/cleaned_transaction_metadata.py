"""Transaction state tracked while the cleaner walks a log (Kafka ``CleanedTransactionMetadata``).

The cleaner learns the aborted transactions of the range it reads from the transaction indexes
(``AbortedTxn`` entries, consumed in order of their first offset as the walk passes them) and then:

* drops every transactional data batch of a producer whose aborted transaction is open at that
  point (whatever its keys);
* keeps an ABORT marker while any batch of its transaction was still seen in this pass (and then
  re-appends the ``AbortedTxn`` to the cleaned segment's ``.txnindex``); otherwise the marker may
  be discarded (after its delete horizon, see ``Cleaner``);
* keeps a COMMIT marker while any batch of its transaction was seen in this pass;
* lets an empty control batch (an already-cleaned marker) be discarded.

Mirrors ``org.apache.kafka.storage.internals.log.CleanedTransactionMetadata``.
"""

from __future__ import annotations

import heapq
from typing import TYPE_CHECKING, Iterable

from .control_record import ControlRecordType, parse_control_record_type
from .transaction_index import AbortedTxn

if TYPE_CHECKING:  # pragma: no cover
    from .record_batch import RecordBatch
    from .transaction_index import TransactionIndex

__all__ = ["CleanedTransactionMetadata"]


class _AbortedTransactionMetadata:
    __slots__ = ("aborted_txn", "last_observed_batch_offset")

    def __init__(self, aborted_txn: AbortedTxn):
        self.aborted_txn = aborted_txn
        self.last_observed_batch_offset: int | None = None


class CleanedTransactionMetadata:
    """Ongoing committed/aborted transactions during one walk over a log; not thread-safe.

    ``cleaned_index`` (settable) receives the ``AbortedTxn`` of every ABORT marker that is kept.
    """

    def __init__(self) -> None:
        self._ongoing_committed_txns: set[int] = set()
        self._ongoing_aborted_txns: dict[int, _AbortedTransactionMetadata] = {}
        self._aborted_transactions: list[tuple[int, int, AbortedTxn]] = []  # heap by first offset
        self._sequence = 0
        self.cleaned_index: "TransactionIndex | None" = None

    @property
    def has_pending_aborts(self) -> bool:
        """True while aborted transactions are queued ahead of the walk (data batches must be reported)."""
        return bool(self._aborted_transactions)

    def add_aborted_transactions(self, aborted_transactions: Iterable[AbortedTxn]) -> None:
        """Queue aborted transactions (from ``.txnindex`` files) found ahead of the walk."""
        for txn in aborted_transactions:
            heapq.heappush(self._aborted_transactions, (txn.first_offset, self._sequence, txn))
            self._sequence += 1

    def _consume_aborted_txns_up_to(self, offset: int) -> None:
        heap = self._aborted_transactions
        while heap and heap[0][0] <= offset:
            txn = heapq.heappop(heap)[2]
            if txn.producer_id not in self._ongoing_aborted_txns:
                self._ongoing_aborted_txns[txn.producer_id] = _AbortedTransactionMetadata(txn)

    def on_control_batch_read(self, control_batch: "RecordBatch") -> bool:
        """Account for a control batch; True if it may be discarded.

        Raises:
            ValueError: the control record's key is malformed (from ``parse_control_record_type``).
        """
        self._consume_aborted_txns_up_to(control_batch.last_offset)
        records = control_batch.records()
        if not records:
            return True  # an empty control batch was already cleaned
        control_type = parse_control_record_type(records[0].key)
        producer_id = control_batch.producer_id
        if control_type == ControlRecordType.ABORT:
            metadata = self._ongoing_aborted_txns.pop(producer_id, None)
            if metadata is not None and metadata.last_observed_batch_offset is not None:
                # keep the marker until every batch of the transaction has been removed
                if self.cleaned_index is not None:
                    self.cleaned_index.append(metadata.aborted_txn)
                return False
            return True
        if control_type == ControlRecordType.COMMIT:
            # discardable if no batch of the transaction was seen in this pass
            if producer_id in self._ongoing_committed_txns:
                self._ongoing_committed_txns.discard(producer_id)
                return False
            return True
        return False

    def on_batch_read(self, batch: "RecordBatch") -> bool:
        """Account for a data batch; True if it belongs to an aborted transaction (discard it)."""
        self._consume_aborted_txns_up_to(batch.last_offset)
        if not batch.is_transactional:
            return False
        metadata = self._ongoing_aborted_txns.get(batch.producer_id)
        if metadata is not None:
            metadata.last_observed_batch_offset = batch.last_offset
            return True
        self._ongoing_committed_txns.add(batch.producer_id)
        return False
