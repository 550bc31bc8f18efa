"""``materializer compact --threads N`` / ``compact_topic(threads=N)``: partitions cleaned in parallel
worker processes (Kafka ``log.cleaner.threads``) write what one thread writes; errors name their
partition; Ctrl-C leaves valid logs."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from materializer.cli.compact import compact
from materializer.offline.compact import CompactionError, _largest_dirty_first, compact_topic
from materializer.storage.checkpoint import (
    CLEANER_OFFSET_CHECKPOINT,
    LOG_START_OFFSET_CHECKPOINT,
    RECOVERY_POINT_CHECKPOINT,
    read_offset_checkpoint,
    write_offset_checkpoint,
)
from materializer.storage.compression import CompressionType
from materializer.storage.log import Log
from materializer.storage.log_config import LogConfig
from materializer.storage.log_loader import has_clean_shutdown_file, write_clean_shutdown_file
from materializer.storage.log_manager import TopicLogs

from .test_compact_command import COMPACT, TOPIC, _expected, _make_dir, _read, _records

NOW_MS = 1_700_000_100_000  # fixed: delete horizons are part of the bytes written


def _partitions() -> dict[int, list]:
    return {p: _records(150 + 40 * p, 9 + 2 * p, tombstone_every=4) for p in range(5)}


def _files(data_dir: Path) -> dict[str, bytes]:
    """Every live file of the data dir (``.deleted`` segments are removed on the next open; lock
    files are empty)."""
    return {str(f.relative_to(data_dir)): f.read_bytes() for f in sorted(data_dir.rglob("*"))
            if f.is_file() and not f.name.endswith((".deleted", ".lock"))}


def _valid(data_dir: Path, partition: int, original: list, upto: int) -> bool:
    """The log reads as a valid (partly) cleaned log: the records an interrupted round may leave
    (each group of segments either as it was or cleaned: Kafka's aborted round) - every record kept
    by a full round, only records of the original, in offset order."""
    read = _read(data_dir, partition)
    by_offset = {r.offset: r for r in original}
    offsets = [r.offset for r in read]
    return (offsets == sorted(offsets) and all(by_offset.get(r.offset) == r for r in read)
            and {r.offset for r in _expected(original, upto)} <= set(offsets))


def _leftovers(data_dir: Path) -> list[str]:
    return [f.name for f in data_dir.rglob("*") if f.name.endswith((".cleaned", ".swap"))]


@pytest.mark.parametrize("upto_offset", [None, 120])
@pytest.mark.parametrize("compression", [CompressionType.NONE, CompressionType.ZSTD])
def test_threads_write_the_same_segments_and_checkpoints_as_one(tmp_path: Path, upto_offset, compression) -> None:
    files = {}
    results = {}
    for threads in (1, 2, 3):
        data_dir = _make_dir(tmp_path / str(threads), _partitions(), compression=compression)
        done: list[int] = []
        results[threads] = compact_topic(data_dir, TOPIC, upto_offset=upto_offset, now_ms=NOW_MS, threads=threads,
                                         on_partition_done=lambda r, done=done: done.append(r.partition))
        assert sorted(done) == [0, 1, 2, 3, 4]
        assert [r.partition for r in results[threads]] == [0, 1, 2, 3, 4]  # partition order, whatever finished first
        assert not _leftovers(data_dir)
        assert has_clean_shutdown_file(data_dir)
        files[threads] = _files(data_dir)
        checkpoints = read_offset_checkpoint(data_dir / CLEANER_OFFSET_CHECKPOINT)
        assert set(checkpoints) == {(TOPIC, p) for p in range(5)}
        assert read_offset_checkpoint(data_dir / RECOVERY_POINT_CHECKPOINT)
        assert read_offset_checkpoint(data_dir / LOG_START_OFFSET_CHECKPOINT)
    assert files[2] == files[1] and files[3] == files[1]
    for threads in (2, 3):
        for one, many in zip(results[1], results[threads]):
            assert (many.end_offset, many.records_read, many.records_written, many.bytes_written) == \
                   (one.end_offset, one.records_read, one.records_written, one.bytes_written)


def test_the_dedupe_buffer_is_divided_among_the_threads(tmp_path: Path) -> None:
    """Kafka's LogCleaner gives each thread dedupe.buffer.size / threads: a budget of 24 slots holds
    21 keys per round with one thread, 10 with two (so more rounds), and none with 48 threads."""
    recs = {p: _records(100, 20) for p in range(2)}
    one = compact_topic(_make_dir(tmp_path / "1", recs), TOPIC, upto_offset=80, now_ms=NOW_MS,
                        dedupe_buffer_size_bytes=24 * 24, threads=1)
    two = compact_topic(_make_dir(tmp_path / "2", recs), TOPIC, upto_offset=80, now_ms=NOW_MS,
                        dedupe_buffer_size_bytes=24 * 24, threads=2)
    assert [len(r.rounds) for r in two] > [len(r.rounds) for r in one]
    for p in range(2):
        assert _read(tmp_path / "2" / "data", p) == _expected(recs[p], 80)
    with pytest.raises(CompactionError, match="for each of 48 threads.*decrease log.cleaner.threads"):
        compact_topic(tmp_path / "2" / "data", TOPIC, dedupe_buffer_size_bytes=24 * 24, threads=48)


def test_the_workers_take_the_largest_cleanable_section_first_as_the_cleaner_manager_measures_it(
        tmp_path: Path, caplog) -> None:
    """The partitions are handed out largest dirty section first, measured as Kafka's
    LogCleanerManager measures a log (cleanableOffsets, LogToClean's cleanable bytes): the active
    segment, which a round never cleans, does not count. A checkpoint entry beyond its log end is
    reset to the log start offset then, with one warning (the round finds it in range)."""
    config = {**COMPACT, "segment.bytes": str(1 << 20)}  # one segment unless rolled
    data_dir = _make_dir(tmp_path, {0: _records(300, 30), 1: _records(40, 10)}, config)
    with Log.open(data_dir / f"{TOPIC}-1", LogConfig.from_kafka_configs(config), had_clean_shutdown=True) as log:
        log.roll()  # partition 1: a cleanable segment of 40 records; partition 0: 300 in its active segment
        log.append_records(_records(5, 10, start=40))
    write_clean_shutdown_file(data_dir)
    write_offset_checkpoint(data_dir / CLEANER_OFFSET_CHECKPOINT, {(TOPIC, 1): 10_000})
    with TopicLogs.open(data_dir, TOPIC, [0, 1], LogConfig.from_kafka_configs(config)) as topic_logs:
        assert topic_logs.logs[0].size_in_bytes > topic_logs.logs[1].size_in_bytes
        with caplog.at_level(logging.WARNING, logger="materializer.storage.log_cleaner"):
            assert _largest_dirty_first(data_dir, topic_logs.logs, {(TOPIC, 1): 10_000}, None, NOW_MS) == [1, 0]
            assert _largest_dirty_first(data_dir, topic_logs.logs, {}, 45, NOW_MS) == [1, 0]  # forced: the same
    assert read_offset_checkpoint(data_dir / CLEANER_OFFSET_CHECKPOINT) == {(TOPIC, 1): 0}
    assert [r.getMessage() for r in caplog.records] == [
        f"The last checkpoint dirty offset for partition {data_dir / f'{TOPIC}-1'} is 10000, which is larger than "
        "the log end offset 45. Resetting to the log start offset 0."]


def test_an_error_in_one_partition_is_raised_with_its_name(tmp_path: Path) -> None:
    recs = {p: _records(100 if p != 2 else 60, 7) for p in range(4)}
    data_dir = _make_dir(tmp_path, recs)
    with pytest.raises(CompactionError, match=rf"beyond the log end offset 60 of \S*{TOPIC}-2"):
        compact_topic(data_dir, TOPIC, upto_offset=80, now_ms=NOW_MS, threads=2)
    assert not _leftovers(data_dir)
    assert (TOPIC, 2) not in read_offset_checkpoint(data_dir / CLEANER_OFFSET_CHECKPOINT)
    for p in (0, 1, 3):  # each log valid: as it was, cleaned, or partly cleaned when the error stopped its worker
        assert _valid(data_dir, p, recs[p], 80)
    assert _read(data_dir, 2) == recs[2]
    result = CliRunner().invoke(compact, ["--data-dir", str(data_dir), "--topic", TOPIC, "--upto-offset", "80",
                                          "--threads", "2"])
    assert result.exit_code == 2
    assert result.output.splitlines()[-1].startswith("error: ") and f"{TOPIC}-2" in result.output.splitlines()[-1]


def test_a_corrupt_segment_is_reported_with_its_partition_and_the_other_logs_stay_valid(tmp_path: Path) -> None:
    recs = _partitions()
    data_dir = _make_dir(tmp_path, recs)
    segment = sorted((data_dir / f"{TOPIC}-3").glob("*.log"))[1]
    data = bytearray(segment.read_bytes())
    data[len(data) // 2:len(data) // 2 + 8] = b"\xff" * 8  # inside a batch: CRC mismatch or bad framing
    segment.write_bytes(bytes(data))
    with pytest.raises(Exception, match=f"{TOPIC}-3") as raised:
        compact_topic(data_dir, TOPIC, upto_offset=120, now_ms=NOW_MS, threads=2)
    assert not isinstance(raised.value, (KeyboardInterrupt, SystemExit))
    assert not _leftovers(data_dir)
    for p in (0, 1, 2, 4):
        assert _valid(data_dir, p, recs[p], 120)


def test_an_interruption_stops_the_workers_and_leaves_valid_logs(tmp_path: Path) -> None:
    """KeyboardInterrupt in the caller (here: raised by the callback once the first partition is
    done) stops the other workers at their next abort check; their rounds are undone."""
    recs = {p: _records(3000, 50, tombstone_every=7) for p in range(4)}
    configs = {"cleanup.policy": "compact", "segment.bytes": "8192", "delete.retention.ms": "1000"}
    data_dir = _make_dir(tmp_path / "a", recs, configs)

    def interrupt(_result) -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        compact_topic(data_dir, TOPIC, upto_offset=2500, now_ms=NOW_MS, threads=2, on_partition_done=interrupt)
    assert not _leftovers(data_dir)
    assert not has_clean_shutdown_file(data_dir)  # as after a crash: the next open recovers the logs
    for p in range(4):
        assert _valid(data_dir, p, recs[p], 2500)
    # a new run finishes the job: the records and checkpoints of an uninterrupted run (the segment
    # layout may differ: groups an aborted round swapped in are smaller, as on a broker)
    compact_topic(data_dir, TOPIC, upto_offset=2500, now_ms=NOW_MS, threads=2)
    reference = _make_dir(tmp_path / "b", recs, configs)
    compact_topic(reference, TOPIC, upto_offset=2500, now_ms=NOW_MS)
    for p in range(4):
        assert _read(data_dir, p) == _read(reference, p) == _expected(recs[p], 2500)
    assert read_offset_checkpoint(data_dir / CLEANER_OFFSET_CHECKPOINT) == \
           read_offset_checkpoint(reference / CLEANER_OFFSET_CHECKPOINT)


# Loaded (as sitecustomize) by the command's processes only: a cleaner worker about to swap in the
# first .cleaned segment it built writes MID_ROUND_MARKER and waits until the command stops its
# workers (what the SIGINT does), so the signal always lands mid-round, on any machine.
_HOLD_MID_ROUND = textwrap.dedent("""
    import os, sys, time

    _replace = os.replace

    def _replace_held_mid_round(src, dst, *args, **kwargs):
        stop = getattr(sys.modules.get("materializer.offline.compact"), "_worker_stop", None)
        if stop is not None and str(src).endswith(".cleaned"):  # a worker process, mid-round
            open(os.environ["MID_ROUND_MARKER"], "a").close()
            deadline = time.monotonic() + 60
            while not stop.is_set() and time.monotonic() < deadline:
                stop.wait(0.05)
        return _replace(src, dst, *args, **kwargs)

    os.replace = _replace_held_mid_round
""")


def test_ctrl_c_of_the_command_is_130_one_line_and_no_worker_outlives_it(tmp_path: Path) -> None:
    """A real SIGINT to the process group, as a terminal's Ctrl-C, while 2 workers clean: sent once a
    worker holds a cleaned segment it has not swapped in yet (it waits there for the stop)."""
    recs = {p: _records(4_000, 400, tombstone_every=9) for p in range(4)}
    data_dir = _make_dir(tmp_path, recs, {"cleanup.policy": "compact", "segment.bytes": "65536"})
    hook, marker = tmp_path / "hook", tmp_path / "mid-round"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(_HOLD_MID_ROUND)
    env = {**os.environ, "MID_ROUND_MARKER": str(marker),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(hook), os.environ.get("PYTHONPATH")]))}
    process = subprocess.Popen([sys.executable, "-m", "materializer", "compact", "--data-dir", str(data_dir),
                                "--topic", TOPIC, "--threads", "2", "--upto-offset", "3600"], env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while not marker.exists():  # until a worker holds a cleaned segment: the SIGINT lands mid-round
            assert process.poll() is None, f"the command ended (rc {process.returncode}) before a round ran: " \
                                           f"{process.communicate()}"
            assert time.monotonic() < deadline, "no worker built a cleaned segment in 60 s"
            time.sleep(0.005)
        os.killpg(process.pid, signal.SIGINT)
        _, err = process.communicate(timeout=120)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # every process of the group (the workers too) has exited
            try:
                os.killpg(process.pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.1)
        else:
            pytest.fail("a worker process outlived the command")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
    assert process.returncode == 130, err
    assert err.startswith("error: interrupted (SIGINT); the local logs are valid") and err.count("\n") == 1, err
    assert "Traceback" not in err
    assert not _leftovers(data_dir)
    for p in range(4):
        assert _valid(data_dir, p, recs[p], 3600)


def test_a_caller_running_threads_gets_workers_that_were_not_forked_from_it(tmp_path: Path) -> None:
    """With another thread running, the workers come from a fork server (a fork would copy locks
    that thread may hold); the result is the same."""
    import threading

    from materializer.offline import compact as compact_module

    release = threading.Event()
    other = threading.Thread(target=release.wait, daemon=True)
    other.start()
    try:
        assert compact_module._start_method() in ("forkserver", "spawn")
        data_dir = _make_dir(tmp_path / "threads", _partitions())
        compact_topic(data_dir, TOPIC, upto_offset=120, now_ms=NOW_MS, threads=2)
    finally:
        release.set()
        other.join()
    reference = _make_dir(tmp_path / "one", _partitions())
    compact_topic(reference, TOPIC, upto_offset=120, now_ms=NOW_MS)
    assert _files(data_dir) == _files(reference)
