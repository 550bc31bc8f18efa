"""The background LogCleaner and retention while ``Materializer.run`` ingests (fake source, no broker).

Invariants checked after a run: the log shrank; the cleaner checkpoint advanced; every record
below it is the latest of its key within ``[log start, checkpoint)`` (tombstones carry a delete
horizon still in the future); the store equals the latest value per key; a store rebuilt from the
compacted log equals it; no ``.cleaned``/``.swap`` file and no cleaner thread is left behind.
"""

from __future__ import annotations

import threading
import time

import pytest
from click.testing import CliRunner

import materializer.session as session_module
from materializer.adapters.rocksdb_store import StateStore
from materializer.cli import CLEANER_LOG_FILE, main
from materializer.config import MaterializerOptions, parse_config_overrides
from materializer.datadir.layout import state_dir
from materializer.apply.committed import rebuild_store_from_logs
from materializer.materializer import Materializer
from materializer.storage.checkpoint import CLEANER_OFFSET_CHECKPOINT, read_offset_checkpoint
from materializer.storage.log import Log
from materializer.storage.log_config import LogConfig
from materializer.storage.log_segments import LogSegments
from materializer.storage.record_batch import Record

from .test_materializer import TOPIC, FakeSource, _expected, _produce

FAR_PAST_MS = 1_700_000_000_000  # the fake records' timestamps (Nov 2023): older than any retention.ms below


class PausingSource(FakeSource):
    """A FakeSource that, once ``pause_after`` records were served, serves nothing more until
    ``resume_when()`` holds (or ``wait_s`` passed): ingestion stays in progress meanwhile."""

    pause_after = 0
    resume_when = staticmethod(lambda: True)
    wait_s = 20.0
    resumed_by_condition: bool | None = None
    on_fetch = staticmethod(lambda: None)

    def fetch(self, max_records, timeout_ms):
        PausingSource.on_fetch()
        if self.fetched >= PausingSource.pause_after and PausingSource.resumed_by_condition is None:
            deadline = time.monotonic() + PausingSource.wait_s
            while not PausingSource.resume_when() and time.monotonic() < deadline:
                time.sleep(0.01)
            PausingSource.resumed_by_condition = PausingSource.resume_when()
        return super().fetch(max_records, timeout_ms)


@pytest.fixture
def source(monkeypatch):
    FakeSource.instances = []
    PausingSource.topic_data = {}  # tests assign through ``source``: reset the subclass' own attributes
    PausingSource.configs = {"cleanup.policy": "compact", "compression.type": "producer"}
    PausingSource.pause_after = 0
    PausingSource.resume_when = staticmethod(lambda: True)
    PausingSource.resumed_by_condition = None
    PausingSource.on_fetch = staticmethod(lambda: None)
    monkeypatch.setattr(session_module, "KafkaSource", PausingSource)
    return PausingSource


def _cleaner_checkpoint(data_dir) -> dict[tuple[str, int], int]:
    path = data_dir / CLEANER_OFFSET_CHECKPOINT
    return read_offset_checkpoint(path) if path.exists() else {}


def _open_log(data_dir, partition, config: LogConfig) -> Log:
    return Log.open(data_dir / f"{TOPIC}-{partition}", config, had_clean_shutdown=True)


def _overrides(**configs: str) -> dict[str, str]:
    return parse_config_overrides([f"{k.replace('_', '.')}={v}" for k, v in configs.items()])


def _assert_cleaned_below_checkpoint(log: Log, checkpoint: int, now_ms: int) -> int:
    """Every keyed record below ``checkpoint`` is its key's latest within [log start, checkpoint);
    null keys are gone; tombstones there sit in batches whose delete horizon is still ahead.
    Returns how many records lie below the checkpoint."""
    batches = list(log.read_batches(log.log_start_offset, checkpoint))
    records = [(batch, r) for batch in batches for r in batch.records() if r.offset < checkpoint]
    latest: dict[bytes, int] = {}
    for _, record in records:
        assert record.key is not None, f"null-key record at offset {record.offset} survived cleaning"
        latest[record.key] = record.offset
    for batch, record in records:
        assert latest[record.key] == record.offset, (
            f"offset {record.offset} of key {record.key!r} is superseded by offset {latest[record.key]}")
        if record.value is None:
            assert batch.delete_horizon_ms is not None and batch.delete_horizon_ms > now_ms
    return len(records)


def _no_temporary_files(data_dir) -> bool:
    return not [p for p in data_dir.rglob("*") if p.suffix in (".cleaned", ".swap")]


def _cleaner_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("kafka-log-cleaner-thread")]


@pytest.mark.parametrize("threads", [1, 2])
def test_cleaner_compacts_while_ingesting(tmp_path, source, threads):
    data = source.topic_data
    _produce(data, 0, 0, [b"k%d" % (i % 40) for i in range(3000)], tombstone_every=11)
    _produce(data, 0, 0, [None, b"k1", None])
    _produce(data, 1, 0, [b"j%d" % (i % 10) for i in range(1000)], tombstone_every=7)
    # ingestion pauses half way until the cleaner has cleaned partition 0 at least once
    source.pause_after = 2000
    source.resume_when = staticmethod(lambda: _cleaner_checkpoint(tmp_path).get((TOPIC, 0), 0) > 0)
    overrides = _overrides(segment_bytes="4096", min_cleanable_dirty_ratio="0.01")
    options = MaterializerOptions(fetch="consumer", batch_size=100, config_overrides=overrides, cleaner_threads=threads,
                                  cleaner_backoff_ms=10)

    with Materializer("fake:9092", TOPIC, tmp_path, options=options) as m:
        stats = m.run(until_caught_up=True)
        state = {k: v.value for k, v in m.store.items()}
        config = m.log_config
    assert _cleaner_threads() == []
    assert source.resumed_by_condition, "the cleaner did not clean partition 0 while ingesting"
    assert state == _expected(data)
    assert stats.cleaner_rounds >= 1
    assert stats.cleaner_bytes_read > stats.cleaner_bytes_written > 0
    assert stats.cleaner_records_read > stats.cleaner_records_written > 0
    assert _no_temporary_files(tmp_path)

    checkpoints = _cleaner_checkpoint(tmp_path)
    assert checkpoints[(TOPIC, 0)] > 0
    now_ms = time.time_ns() // 1_000_000
    logs = {p: _open_log(tmp_path, p, config) for p in data}
    try:
        assert sum(log.size_in_bytes for log in logs.values()) < stats.bytes_appended  # the log shrank
        for partition, log in logs.items():
            checkpoint = checkpoints.get((TOPIC, partition), log.log_start_offset)
            assert log.log_start_offset <= checkpoint <= log.log_end_offset
            below = _assert_cleaned_below_checkpoint(log, checkpoint, now_ms)
            if partition == 0:
                assert below < checkpoint  # superseded records are gone
        # a store rebuilt from the compacted logs equals the one built while ingesting
        with StateStore(tmp_path / "rebuilt") as rebuilt:
            rebuild_store_from_logs(rebuilt, logs)
            assert {k: v.value for k, v in rebuilt.items()} == state
            assert rebuilt.offsets() == {p: log.log_end_offset for p, log in logs.items()}
    finally:
        for log in logs.values():
            log.close()

    # the same through the Materializer: store deleted -> rebuilt from the compacted local log
    StateStore.destroy(state_dir(tmp_path, TOPIC))
    with Materializer("fake:9092", TOPIC, tmp_path, options=options) as m:
        stats = m.run(until_caught_up=True)
        assert stats.store_rebuilt and stats.records_fetched == 0
        assert {k: v.value for k, v in m.store.items()} == _expected(data)


def test_stop_shuts_the_cleaner_down(tmp_path, source):
    _produce(source.topic_data, 0, 0, [b"k%d" % (i % 20) for i in range(2000)])
    holder: dict[str, Materializer] = {}

    def stop_once_cleaned():
        if _cleaner_checkpoint(tmp_path).get((TOPIC, 0), 0) > 0 or source.instances[0].fetched >= 2000:
            holder["m"].stop()

    source.pause_after = 1000
    source.resume_when = staticmethod(lambda: _cleaner_checkpoint(tmp_path).get((TOPIC, 0), 0) > 0)
    source.on_fetch = staticmethod(stop_once_cleaned)
    options = MaterializerOptions(fetch="consumer", batch_size=100, cleaner_backoff_ms=10,
                                  config_overrides=_overrides(segment_bytes="2048", min_cleanable_dirty_ratio="0.01"))
    with Materializer("fake:9092", TOPIC, tmp_path, options=options) as m:
        holder["m"] = m
        m.run()  # not until caught up: returns on stop()
        assert m.cleaner is None and _cleaner_threads() == []
        assert {k: v.value for k, v in m.store.items()} == _expected(
            {0: [r for r in source.topic_data[0] if r.record.offset < m.logs[0].log_end_offset]})
    assert _no_temporary_files(tmp_path)


def test_cleaner_disabled_and_not_started_for_delete_topics(tmp_path, source):
    _produce(source.topic_data, 0, 0, [b"k%d" % (i % 5) for i in range(500)])
    started: list[bool] = []
    source.on_fetch = staticmethod(lambda: started.append(bool(_cleaner_threads())))
    options = MaterializerOptions(fetch="consumer", batch_size=50, cleaner_threads=0, cleaner_backoff_ms=0,
                                  config_overrides=_overrides(segment_bytes="1024", min_cleanable_dirty_ratio="0.01"))
    with Materializer("fake:9092", TOPIC, tmp_path, options=options) as m:
        stats = m.run(until_caught_up=True)
    assert not any(started) and stats.cleaner_rounds == 0
    assert not (tmp_path / CLEANER_OFFSET_CHECKPOINT).exists()

    source.configs = {"cleanup.policy": "delete"}
    _produce(source.topic_data, 0, 0, [b"x"] * 200)
    with Materializer("fake:9092", TOPIC, tmp_path, options=MaterializerOptions(fetch="consumer", batch_size=50)) as m:
        m.run(until_caught_up=True)
    assert not any(started)


def test_retention_on_delete_topic_drops_the_keys_whose_records_it_deleted(tmp_path, source):
    source.configs = {"cleanup.policy": "delete", "retention.ms": "3600000"}
    data = source.topic_data
    _produce(data, 0, 0, [b"k%d" % i for i in range(400)])  # 400 distinct keys, all older than retention.ms
    options = MaterializerOptions(fetch="consumer", batch_size=50, retention_check_interval_ms=1,
                                  config_overrides=_overrides(segment_bytes="1024"))
    with Materializer("fake:9092", TOPIC, tmp_path, options=options) as m:
        stats = m.run(until_caught_up=True)
        assert m.check_retention() == 0  # nothing left to delete
        log_start_offset = m.logs[0].log_start_offset
        state = {k: v.value for k, v in m.store.items()}
        kept = {r.key for r in m.logs[0].read_records()}
    assert stats.retention_checks >= 1 and stats.retention_segments_deleted > 0
    assert log_start_offset > 0 and stats.store_entries_expired > 0
    # What the log still holds, no more: a consumer of the topic now, or a store rebuilt from the
    # log, would not see the keys whose records retention deleted.
    assert state == {k: v for k, v in _expected(data).items() if k in kept}
    assert read_offset_checkpoint(tmp_path / "log-start-offset-checkpoint") == {(TOPIC, 0): log_start_offset}

    # a restart neither refetches nor rebuilds: the store is at the log end offset
    with Materializer("fake:9092", TOPIC, tmp_path, options=options) as m:
        stats = m.run(until_caught_up=True)
        assert not stats.store_rebuilt and stats.records_fetched == 0
        assert {k: v.value for k, v in m.store.items()} == state


def test_compact_delete_retention_runs_in_the_cleaner_threads(tmp_path, source):
    # retention.bytes, not retention.ms: a cleaned segment keeps its source files' modification
    # time (Kafka's Cleaner.cleanSegments), and an empty one has no record timestamp, so time
    # retention stops at an empty cleaned head segment until its files age, as on a broker. By
    # size, every segment before the (never empty) active one goes.
    source.configs = {"cleanup.policy": "compact,delete", "retention.bytes": "1"}
    data = source.topic_data
    _produce(data, 0, 0, [b"k%d" % (i % 50) for i in range(1500)])
    holder: dict[str, Materializer] = {}
    source.pause_after = 800
    source.resume_when = staticmethod(lambda: "m" in holder and holder["m"].logs[0].log_start_offset > 0)
    options = MaterializerOptions(fetch="consumer", batch_size=100, cleaner_backoff_ms=10, retention_check_interval_ms=1,
                                  config_overrides=_overrides(segment_bytes="2048", min_cleanable_dirty_ratio="0.01"))
    with Materializer("fake:9092", TOPIC, tmp_path, options=options) as m:
        holder["m"] = m
        stats = m.run(until_caught_up=True)
        state = {k: v.value for k, v in m.store.items()}
        kept = {r.key for r in m.logs[0].read_records()}
        rebuilt = StateStore(tmp_path / "rebuilt")
        rebuild_store_from_logs(rebuilt, m.logs)
        rebuilt_state = {k: v.value for k, v in rebuilt.items()}
        rebuilt.close()
    assert source.resumed_by_condition, "the cleaner threads did not apply retention while ingesting"
    assert stats.retention_checks == 0  # the run loop leaves compacted logs to the cleaner threads
    # What the log still holds (retention deleted every segment but the last, also the latest
    # record of some keys): equal to a store rebuilt from the log.
    assert state == {k: v for k, v in _expected(data).items() if k in kept} == rebuilt_state


def test_cli_run_cleaner_options_summary_and_log_file(tmp_path, source):
    data = source.topic_data
    _produce(data, 0, 0, [b"k%d" % (i % 30) for i in range(2000)], tombstone_every=9)
    source.pause_after = 1000
    source.resume_when = staticmethod(lambda: _cleaner_checkpoint(tmp_path).get((TOPIC, 0), 0) > 0)
    result = CliRunner().invoke(main, [
        "run", "--fetch", "consumer", "--bootstrap-servers", "fake:9092", "--topic", TOPIC, "--data-dir", str(tmp_path), "--until-caught-up",
        "--batch-size", "100", "--config", "segment.bytes=4096", "--config", "min.cleanable.dirty.ratio=0.01",
        "--cleaner-threads", "2", "--cleaner-backoff-ms", "10", "--dedupe-buffer-size", str(1 << 20),
        "--retention-check-interval-ms", "60000"])
    assert result.exit_code == 0, result.output
    assert source.resumed_by_condition
    assert "; cleaner: " in result.stdout and " rounds, read " in result.stdout
    report = (tmp_path / CLEANER_LOG_FILE).read_text()
    assert f"cleaned log {TOPIC}-0 (dirty section = [0, " in report, report
    assert "% size reduction" in report
    assert "Log cleaner thread" not in result.stderr  # INFO lines reach stderr only with -v

    result = CliRunner().invoke(main, ["run", "--fetch", "consumer", "--bootstrap-servers", "fake:9092", "--topic", TOPIC, "--data-dir",
                                       str(tmp_path), "--until-caught-up", "--cleaner-threads", "-1"])
    assert result.exit_code == 2 and "--cleaner-threads" in result.output


def test_options_validation_and_cleaner_config():
    assert MaterializerOptions(fetch="consumer", cleaner_threads=0).cleaner_config() is None
    config = MaterializerOptions(fetch="consumer", cleaner_threads=3, cleaner_backoff_ms=7, dedupe_buffer_size_bytes=3 << 20).cleaner_config()
    assert (config.num_threads, config.backoff_ms, config.dedupe_buffer_size_bytes) == (3, 7, 3 << 20)
    default = MaterializerOptions(fetch="consumer")
    assert (default.cleaner_threads, default.cleaner_backoff_ms, default.dedupe_buffer_size_bytes,
            default.retention_check_interval_ms) == (1, 15_000, 128 * 1024 * 1024, 300_000)
    for bad in ({"cleaner_threads": -1}, {"cleaner_backoff_ms": -1}, {"dedupe_buffer_size_bytes": 0},
                {"retention_check_interval_ms": 0}):
        with pytest.raises(ValueError):
            MaterializerOptions(fetch="consumer", **bad)


def test_log_segments_snapshot_while_rolling(tmp_path):
    """A reader without ``Log.lock`` (the cleaner choosing a log) never fails while the writer rolls,
    deletes every segment (retention) and replaces an empty active segment (a batch > segment.bytes)."""
    import sys

    log = Log.open(tmp_path / f"{TOPIC}-0", LogConfig(segment_bytes=200), had_clean_shutdown=True)
    errors: list[BaseException] = []
    done = threading.Event()

    def read() -> None:
        try:
            while not done.is_set():
                segments: LogSegments = log.segments
                snapshot = segments.values()
                assert [s.base_offset for s in snapshot] == sorted(s.base_offset for s in snapshot)
                segments.values(0, 2**40)
                segments.size_in_bytes()
                assert segments.last_segment() is not None
        except BaseException as exc:  # noqa: BLE001 - reported to the main thread
            errors.append(exc)

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    reader = threading.Thread(target=read)
    reader.start()
    try:
        for offset in range(250):
            if offset % 25 == 24:
                log.delete_segments(log.log_segments(), "test")  # rolls an empty active segment first
                log.append_records([Record(offset, FAR_PAST_MS, b"k", b"v" * 300)])  # replaces it
            else:
                log.append_records([Record(offset, FAR_PAST_MS, b"k", b"v" * 40)])
    finally:
        done.set()
        reader.join()
        sys.setswitchinterval(interval)
        log.close()
    assert not errors, errors[0]
    assert log.log_start_offset > 200
