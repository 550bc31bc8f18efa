"""TransactionIndex / AbortedTxn: re-expresses the scenarios of Kafka's TransactionIndexTest."""

import pytest

from materializer.storage.errors import CorruptIndexError, InvalidOffsetError
from materializer.storage.transaction_index import ABORTED_TXN_SIZE, AbortedTxn, TransactionIndex


@pytest.fixture
def index(tmp_path):
    return TransactionIndex(0, tmp_path / "00000000000000000000.txnindex")


def test_file_created_lazily(index):
    assert not index.path.exists() and index.is_empty()
    index.append(AbortedTxn(0, 0, 10, 11))
    assert index.path.stat().st_size == ABORTED_TXN_SIZE == 34
    assert not index.is_empty()


def test_position_set_correctly_when_opened(index):
    txns = [AbortedTxn(0, 0, 10, 11), AbortedTxn(1, 5, 15, 13)]
    for t in txns:
        index.append(t)
    reopened = TransactionIndex(0, index.path)
    assert reopened.last_offset == 15
    reopened.append(AbortedTxn(2, 18, 28, 25))
    assert reopened.all_aborted_txns() == txns + [AbortedTxn(2, 18, 28, 25)]


def test_sanity_check(tmp_path, index):
    for t in [AbortedTxn(0, 0, 10, 11), AbortedTxn(1, 5, 15, 13)]:
        index.append(t)
    index.sanity_check()
    later = TransactionIndex(100, index.path)
    with pytest.raises(CorruptIndexError):
        later.sanity_check()


def test_last_offset_must_increase(index):
    index.append(AbortedTxn(1, 5, 15, 13))
    with pytest.raises(InvalidOffsetError):
        index.append(AbortedTxn(0, 0, 15, 11))
    with pytest.raises(InvalidOffsetError):
        index.append(AbortedTxn(0, 0, 10, 11))


def test_collect_aborted_transactions(index):
    txns = [AbortedTxn(0, 0, 10, 11), AbortedTxn(1, 5, 15, 13), AbortedTxn(2, 18, 35, 25),
            AbortedTxn(3, 32, 50, 40)]
    for t in txns:
        index.append(t)
    assert index.collect_aborted_txns(0, 32).aborted_transactions == txns[:3]
    assert index.collect_aborted_txns(0, 32).is_complete is True
    assert index.collect_aborted_txns(0, 33).aborted_transactions == txns
    assert index.collect_aborted_txns(0, 100).is_complete is False
    assert index.collect_aborted_txns(11, 20).aborted_transactions == txns[1:3]


def test_truncate(index):
    txns = [AbortedTxn(0, 0, 10, 2), AbortedTxn(1, 5, 15, 16), AbortedTxn(2, 18, 35, 25)]
    for t in txns:
        index.append(t)
    index.truncate_to(50)
    assert index.all_aborted_txns() == txns
    index.truncate_to(15)
    assert index.all_aborted_txns() == txns[:1]
    assert index.last_offset == 10
    index.append(AbortedTxn(4, 12, 14, 14))


def test_serde_and_version():
    txn = AbortedTxn(983493, 5, 15, 12)
    assert AbortedTxn.from_bytes(txn.to_bytes()) == txn
    bad = b"\x00\x01" + txn.to_bytes()[2:]
    with pytest.raises(CorruptIndexError):
        AbortedTxn.from_bytes(bad)


def test_rename_reset_delete(index, tmp_path):
    index.append(AbortedTxn(0, 0, 10, 11))
    new_path = tmp_path / "00000000000000000000.txnindex.swap"
    index.rename_to(new_path)
    assert new_path.exists() and index.path == new_path
    index.flush()
    index.reset()
    assert index.is_empty() and index.last_offset is None
    assert index.delete_if_exists() and not new_path.exists()
    assert not index.delete_if_exists()


def test_iterators_are_independent(index):
    for t in [AbortedTxn(0, 0, 10, 11), AbortedTxn(1, 5, 15, 13)]:
        index.append(t)
    it1, it2 = iter(index), iter(index)
    assert next(it1) == next(it2)
    assert list(it1) == list(it2)
