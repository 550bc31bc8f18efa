"""The compaction oracle without a broker: predictions, the delete horizon, the readable diff."""

from __future__ import annotations

from pathlib import Path

import pytest

from materializer.testing.compaction_oracle import CompactionOracle, diff_records, predict_compaction
from materializer.storage.record_batch import Record

NOW = 1_700_000_000_000
CONFIG = {"segment.bytes": "2048", "delete.retention.ms": "1000"}


def _updates(count: int, keys: int = 5, tombstone_every: int = 0) -> list[tuple[bytes, bytes | None]]:
    return [(b"k%d" % (i % keys), None if tombstone_every and i % tombstone_every == tombstone_every - 1
             else b"v%d" % i) for i in range(count)]


def test_prediction_keeps_the_latest_record_per_key_below_the_first_uncleanable_offset() -> None:
    kept = predict_compaction(_updates(200), CONFIG, upto_offset=150, now_ms=NOW)
    below = [(r.offset, r.key, r.value) for r in kept if r.offset < 150]
    assert below == [(145 + i, b"k%d" % i, b"v%d" % (145 + i)) for i in range(5)]
    assert [r.offset for r in kept if r.offset >= 150] == list(range(150, 200))  # untouched tail


def test_tombstone_kept_by_the_first_round_and_removed_after_delete_retention() -> None:
    records = _updates(100) + [(b"k0", None)] + _updates(100)[1:5]  # offset 100: tombstone of k0
    with CompactionOracle(CONFIG) as oracle:
        oracle.append(records, timestamp_ms=NOW)
        first_end = oracle.log.log_end_offset
        oracle.clean(first_end, now_ms=NOW)
        assert [(r.offset, r.value) for r in oracle.records() if r.key == b"k0"] == [(100, None)]
        assert oracle.cleaner_checkpoint == first_end

        oracle.append([(b"k%d" % (1 + i % 4), b"w%d" % i) for i in range(40)], timestamp_ms=NOW)  # k0 untouched
        oracle.clean(oracle.log.log_end_offset - 1, now_ms=NOW + 999)  # before the horizon: kept
        assert any(r.key == b"k0" and r.value is None for r in oracle.records())

        oracle.append([(b"k2", b"y"), (b"k3", b"z")], timestamp_ms=NOW)
        oracle.clean(oracle.log.log_end_offset - 1, now_ms=NOW + 1000)  # at the horizon: removed
        assert not any(r.key == b"k0" for r in oracle.records())
        assert oracle.latest_per_key()[b"k3"] == b"z"


def test_diff_names_offsets_on_one_side_and_the_first_differing_field() -> None:
    broker = [Record(1, 10, b"a", b"1"), Record(3, 10, b"b", None), Record(4, 10, b"c", b"3", (("h", b"x"),))]
    local = [Record(2, 10, b"a", b"1"), Record(3, 10, b"b", None), Record(4, 10, b"c", b"3", (("h", b"y"),))]
    text = diff_records(broker, local)
    assert "offsets only in broker (1): 1 (key=b'a')" in text
    assert "offsets only in local (1): 2 (key=b'a')" in text
    assert "first differing record at offset 4 (key=b'c'): field headers" in text
    assert diff_records(broker, list(broker)) is None


def test_oracle_on_a_copied_partition_folder_leaves_the_original(tmp_path: Path) -> None:
    with CompactionOracle(CONFIG, topic="t", partition=0, directory=tmp_path / "src") as source:
        source.append(_updates(120), timestamp_ms=NOW)
        source.log.flush()
        folder = source.log.dir
        before = sorted((p.name, p.stat().st_size) for p in folder.iterdir())
        with CompactionOracle.from_partition_dir(folder, CONFIG) as copy:
            copy.clean(copy.log.log_end_offset, now_ms=NOW)
            assert len(copy.records()) == 5
        assert sorted((p.name, p.stat().st_size) for p in folder.iterdir()) == before


def test_bad_input_is_named() -> None:
    with CompactionOracle(CONFIG) as oracle:
        with pytest.raises(ValueError, match="record #1"):
            oracle.append([(b"k", b"v"), b"not a record"])
    with pytest.raises(FileNotFoundError, match="no partition folder"):
        CompactionOracle.from_partition_dir(Path("/nonexistent/t-0"))
