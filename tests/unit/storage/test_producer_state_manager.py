"""ProducerStateManager: the one owner of producer and transaction state of a Log."""

from __future__ import annotations

from materializer.storage.log import Log
from materializer.storage.log_config import LogConfig
from materializer.storage.producer_state_manager import CompletedTxn, LastRecord, ProducerStateManager
from materializer.storage.record_batch import RecordBatch
from materializer.storage.transaction_index import AbortedTxn
from tests.unit.storage.test_read_committed import LogWriter

DAY_MS = 86_400_000


def _open(tmp_path) -> Log:
    return Log.open(tmp_path / "t-0", LogConfig(segment_bytes=400))


def _interleaved(log: Log) -> LogWriter:
    w = LogWriter(log)
    w.plain(2)           # 0-1
    w.txn(7, 2)          # 2-3   producer 7 opens at 2
    w.txn(8, 1)          # 4     producer 8 opens at 4
    w.end(7, commit=False)  # 5  ABORT of 7: LSO then is 4 (8 still open)
    w.txn(7, 1)          # 6     producer 7 opens again at 6
    w.end(8, commit=True)   # 7
    return w


def test_log_answers_stable_offsets_and_active_producers(tmp_path):
    with _open(tmp_path) as log:
        _interleaved(log)
        assert log.number_of_segments > 1
        assert log.producer_state_manager.ongoing_transactions() == {7: 6}
        assert log.first_unstable_offset == 6
        assert log.last_stable_offset == 6
        log.high_watermark = 5
        assert log.last_stable_offset == 5
        log.high_watermark = None
        # the batches carry timestamp 1000: expired long ago unless a transaction is open
        assert log.last_records_of_active_producers(now_ms=2 * DAY_MS) == {7: LastRecord(6, 0)}
        assert log.last_records_of_active_producers(now_ms=1000) == {7: LastRecord(6, 0), 8: LastRecord(4, 0)}
        aborted = [t for s in log.log_segments() for t in s.txn_index.all_aborted_txns()]
        assert aborted == [AbortedTxn(7, 2, 5, 4)]


def test_rebuilt_on_load_equals_updated_on_append(tmp_path):
    with _open(tmp_path) as log:
        _interleaved(log)
        live = log.producer_state_manager.producers()
    with Log.open(tmp_path / "t-0", LogConfig(segment_bytes=400)) as reopened:
        assert reopened.producer_state_manager.producers() == live
        assert reopened.first_unstable_offset == 6


def test_abort_after_reopen_uses_transactions_opened_before(tmp_path):
    with _open(tmp_path) as log:
        w = LogWriter(log)
        w.txn(7, 2)   # 0-1
        w.txn(8, 1)   # 2
    with Log.open(tmp_path / "t-0", LogConfig(segment_bytes=400)) as log:
        w = LogWriter(log)
        w.end(8, commit=False)  # 3: aborts [2, 3]; 7 still open at 0
        aborted = [t for s in log.log_segments() for t in s.txn_index.all_aborted_txns()]
        assert aborted == [AbortedTxn(8, 2, 3, 0)]


def test_truncation_rebuilds_the_state(tmp_path):
    with _open(tmp_path) as log:
        _interleaved(log)
        assert log.first_unstable_offset == 6
        log.truncate_to(6)
        assert log.first_unstable_offset == 4
        assert log.producer_state_manager.ongoing_transactions() == {8: 4}


def test_update_returns_completed_transactions(tmp_path):
    with _open(tmp_path) as log:
        _interleaved(log)
        manager = ProducerStateManager()
        completed = [c for b in log.read_batches() if (c := manager.update(RecordBatch(b.buffer))) is not None]
    assert completed == [CompletedTxn(7, 2, 5, True), CompletedTxn(8, 4, 7, False)]
