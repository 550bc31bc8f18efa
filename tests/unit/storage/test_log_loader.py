"""LogLoader: swap-protocol crash recovery (Kafka LogCleanerTest.testRecoveryAfterCrash, LogLoaderTest),
orphan/missing/corrupt indexes, and truncation of torn or corrupt data."""

import logging

from ._log_test_helpers import make_batch
from materializer.storage.files import CLEANED_FILE_SUFFIX, SWAP_FILE_SUFFIX
from materializer.storage.log import Log
from materializer.storage.log_config import LogConfig
from materializer.storage.log_loader import write_clean_shutdown_file

BATCH = len(make_batch(0))


def config(**kwargs):
    kwargs.setdefault("segment_bytes", 2 * BATCH)
    kwargs.setdefault("file_delete_delay_ms", 0)
    kwargs.setdefault("index_interval_bytes", 1)
    return LogConfig(**kwargs)


def build_log(path, n=8):
    log = Log.open(path, config(), had_clean_shutdown=False)
    for i in range(n):
        log.append_batch(make_batch(i, timestamp=1000 + i))
    return log


def crash(log):
    """Drop the Log object as a crash would: no flush, no trim, no time index entry."""
    for seg in log.log_segments():
        seg.close_handlers()


def offsets(log):
    return [r.offset for r in log.read_records()]


def names(path):
    return sorted(p.name for p in path.iterdir())


def cleaned_copy(log, sources, keep):
    cleaned = log.create_cleaned_segment(sources[0].base_offset)
    for seg in sources:
        for _, batch in seg.read_batches(seg.base_offset):
            if keep(batch):
                cleaned.append(batch.last_offset, bytes(batch.buffer))
    cleaned.on_become_inactive_segment()
    cleaned.flush()
    return cleaned


def reopen(path, **kwargs):
    kwargs.setdefault("had_clean_shutdown", False)
    return Log.open(path, config(), **kwargs)



def test_crash_after_cleaned_files_written(tmp_path):
    path = tmp_path / "t-0"
    log = build_log(path)
    cleaned = cleaned_copy(log, log.log_segments()[:2], lambda b: b.base_offset % 2 == 1)
    cleaned.close_handlers()
    crash(log)
    assert any(n.endswith(CLEANED_FILE_SUFFIX) for n in names(path))
    again = reopen(path)
    assert not any(n.endswith(CLEANED_FILE_SUFFIX) for n in names(path))
    assert offsets(again) == list(range(8))
    again.close()


def test_crash_midway_through_swap_renames(tmp_path):
    """Two new segments; the higher one was renamed .swap, the lower still .cleaned -> swap aborted."""
    path = tmp_path / "t-0"
    log = build_log(path)
    segs = log.log_segments()
    low = cleaned_copy(log, segs[:2], lambda b: b.base_offset % 2 == 1)
    high = cleaned_copy(log, segs[2:3], lambda b: True)
    high.change_file_suffixes(CLEANED_FILE_SUFFIX, SWAP_FILE_SUFFIX)  # descending order: high first
    for s in (low, high):
        s.close_handlers()
    crash(log)
    again = reopen(path)
    assert not any(n.endswith((CLEANED_FILE_SUFFIX, SWAP_FILE_SUFFIX)) for n in names(path))
    assert offsets(again) == list(range(8))
    again.close()


def test_crash_after_all_swap_renames(tmp_path):
    """All new segments are .swap, old segments untouched -> the swap is completed on load."""
    path = tmp_path / "t-0"
    log = build_log(path)
    cleaned = cleaned_copy(log, log.log_segments()[:2], lambda b: b.base_offset % 2 == 1)
    cleaned.change_file_suffixes(CLEANED_FILE_SUFFIX, SWAP_FILE_SUFFIX)
    cleaned.close_handlers()
    crash(log)
    again = reopen(path)
    assert not any(n.endswith(SWAP_FILE_SUFFIX) for n in names(path))
    assert "00000000000000000002.log" not in names(path)
    assert offsets(again) == [1, 3, 4, 5, 6, 7]
    assert [s.base_offset for s in again.log_segments()] == [0, 4, 6]
    again.close()


def test_crash_after_old_segments_renamed_deleted(tmp_path):
    path = tmp_path / "t-0"
    log = build_log(path)
    old = log.log_segments()[:2]
    cleaned = cleaned_copy(log, old, lambda b: b.base_offset % 2 == 1)
    cleaned.change_file_suffixes(CLEANED_FILE_SUFFIX, SWAP_FILE_SUFFIX)
    old[0].change_file_suffixes("", ".deleted")  # crash while renaming the old segments
    cleaned.close_handlers()
    crash(log)
    again = reopen(path)
    assert not any(n.endswith((".deleted", SWAP_FILE_SUFFIX)) for n in names(path))
    assert offsets(again) == [1, 3, 4, 5, 6, 7]
    again.close()


def test_replace_then_reopen(tmp_path):
    path = tmp_path / "t-0"
    log = build_log(path)
    cleaned = cleaned_copy(log, log.log_segments()[:2], lambda b: b.base_offset % 2 == 1)
    log.replace_segments([cleaned], log.log_segments()[:2])
    log.close()
    again = reopen(path, had_clean_shutdown=True)
    assert offsets(again) == [1, 3, 4, 5, 6, 7]
    again.close()


def test_orphan_index_files_deleted(tmp_path):
    path = tmp_path / "t-0"
    log = build_log(path, 2)
    log.close()
    (path / "00000000000000000500.index").write_bytes(b"\x00" * 8)
    (path / "00000000000000000500.timeindex").write_bytes(b"")
    again = reopen(path, had_clean_shutdown=True)
    assert "00000000000000000500.index" not in names(path)
    assert "00000000000000000500.timeindex" not in names(path)
    again.close()


def test_missing_index_is_rebuilt(tmp_path):
    path = tmp_path / "t-0"
    log = build_log(path)
    expected = [s.index.all_entries() for s in log.log_segments()]
    log.close()
    (path / "00000000000000000002.index").unlink()
    again = reopen(path, had_clean_shutdown=True)
    assert [s.index.all_entries() for s in again.log_segments()][1] == expected[1]
    assert offsets(again) == list(range(8))
    again.close()


def test_corrupt_index_is_rebuilt(tmp_path):
    path = tmp_path / "t-0"
    log = build_log(path)
    log.close()
    (path / "00000000000000000002.index").write_bytes(b"\x00" * 7)
    again = reopen(path, had_clean_shutdown=True)
    assert next(again.read_batches(3)).base_offset == 3
    again.close()


def test_untrimmed_active_index_after_crash_is_recovered(tmp_path):
    path = tmp_path / "t-0"
    log = build_log(path, 7)
    crash(log)  # active .index is still preallocated (zeros)
    again = reopen(path)
    assert offsets(again) == list(range(7)) and again.log_end_offset == 7
    again.append_batch(make_batch(7))
    assert offsets(again) == list(range(8))
    again.close()


def test_torn_trailing_write_keeps_complete_batches(tmp_path, caplog):
    path = tmp_path / "t-0"
    log = build_log(path, 7)
    crash(log)
    active = path / "00000000000000000006.log"
    with open(active, "ab") as f:
        f.write(make_batch(7)[:40])
    with caplog.at_level(logging.WARNING):
        again = reopen(path)
    assert offsets(again) == list(range(7)) and again.log_end_offset == 7
    [t] = again.recovery_truncations
    assert t.path == active and t.position == BATCH and t.bytes_truncated == 40
    assert str(active) in caplog.text
    again.close()


def test_flipped_byte_truncates_and_deletes_later_segments(tmp_path):
    path = tmp_path / "t-0"
    log = build_log(path, 8)
    crash(log)
    victim = path / "00000000000000000002.log"
    data = bytearray(victim.read_bytes())
    data[BATCH + 70] ^= 0x01  # second batch of the segment (offset 3)
    victim.write_bytes(bytes(data))
    again = reopen(path)
    assert offsets(again) == [0, 1, 2] and again.log_end_offset == 3
    [t] = again.recovery_truncations
    assert t.path == victim and t.position == BATCH and t.bytes_truncated == BATCH
    assert [p.name for p in t.deleted_segments] == ["00000000000000000004.log", "00000000000000000006.log"]
    assert "00000000000000000004.log" not in names(path)
    again.append_batch(make_batch(3))
    assert offsets(again) == [0, 1, 2, 3]
    again.close()


def test_recovery_point_skips_flushed_segments(tmp_path):
    path = tmp_path / "t-0"
    log = build_log(path, 8)
    log.close()
    victim = path / "00000000000000000000.log"
    data = bytearray(victim.read_bytes())
    data[70] ^= 0x01
    victim.write_bytes(bytes(data))
    again = reopen(path, recovery_point=4)
    assert again.recovery_truncations == [] and again.log_end_offset == 8
    again.close()


def test_clean_shutdown_marker_skips_recovery(tmp_path):
    path = tmp_path / "t-0"
    log = build_log(path, 4)
    log.close()
    write_clean_shutdown_file(tmp_path)
    victim = path / "00000000000000000002.log"
    data = bytearray(victim.read_bytes())
    data[70] ^= 0x01
    victim.write_bytes(bytes(data))
    again = Log.open(path, config())
    assert again.recovery_truncations == [] and again.log_end_offset == 4
    again.close()


def test_log_start_offset_beyond_log_end_deletes_everything(tmp_path):
    path = tmp_path / "t-0"
    log = build_log(path, 4)
    log.close()
    again = reopen(path, log_start_offset=100)
    assert [s.base_offset for s in again.log_segments()] == [100]
    assert again.log_start_offset == 100 and again.log_end_offset == 100
    again.close()


def test_stray_deleted_files_removed(tmp_path):
    path = tmp_path / "t-0"
    log = build_log(path, 2)
    log.close()
    (path / "00000000000000000099.log.deleted").write_bytes(b"x")
    again = reopen(path)
    assert "00000000000000000099.log.deleted" not in names(path)
    again.close()
