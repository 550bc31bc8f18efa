"""A long-lived MaterializedView stays consistent with the offsets it reports while `run` is stopped
and started again under it (issue 37, item 4).

The view (a RocksDB secondary instance, caught up every 0.3 s) follows a `materializer run`
subprocess on a topic a producer keeps writing (updates and tombstones). `run` is stopped with
SIGTERM (a clean close: its memtables are flushed), started again, killed with SIGKILL (its next
start replays the write-ahead log into an SST file) and started again. After every catch-up, every
key the view answers (point lookups and a scan) must be what a read_committed consumer reads at the
offsets the view reports: the latest record of the key below them. RocksDB's own catch-up in place
served the values its memtables held from before the writer's flush instead (RocksDB issues 14444
and 15051), while reporting the new offsets.
"""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from confluent_kafka import Producer

from materializer.datadir.markers import topic_status
from materializer.group.routing import partition_for_key
from materializer.view import MaterializedView

from .background_run import wait_until
from .broker_reads import read_topic
from .leader_changes import create_topic

pytestmark = pytest.mark.broker

PARTITIONS = 2
KEYS = [b"key-%d" % i for i in range(80)]
CATCH_UP_INTERVAL_S = 0.3


class _Writer:
    """A producer thread: random keys, a tombstone in seven, each key to its murmur2 partition, until stopped."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self._producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "acks": "all",
                                   "enable.idempotence": True})
        self._topic = topic
        self._stop = threading.Event()
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._write, daemon=True)
        self._thread.start()

    def _write(self) -> None:
        rng = random.Random(37)
        try:
            n = 0
            while not self._stop.is_set():
                key = rng.choice(KEYS)
                value = None if rng.random() < 1 / 7 else b"value-%d" % n
                self._producer.produce(self._topic, key=key, value=value,
                                       partition=partition_for_key(key, PARTITIONS))
                n += 1
                if n % 40 == 0:
                    self._producer.flush(30)
                    self._stop.wait(0.02)
            assert self._producer.flush(30) == 0
        except BaseException as exc:  # noqa: BLE001 - reported by stop()
            self.error = exc

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(60)
        assert not self._thread.is_alive() and self.error is None, self.error


class _Run:
    """`materializer run` in a subprocess (continuous, replica path)."""

    def __init__(self, bootstrap: str, topic: str, data_dir: Path, log: Path) -> None:
        self._stderr = log.open("ab")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "materializer", "run", "--bootstrap-servers", bootstrap, "--topic", topic,
             "--data-dir", str(data_dir), "--no-progress"], stdout=subprocess.DEVNULL, stderr=self._stderr)

    def stop(self, signum: int) -> int:
        self.process.send_signal(signum)
        code = self.process.wait(60)
        self._stderr.close()
        return code


def _latest_below(records, offsets: dict[int, int]) -> dict[bytes, bytes]:
    """Key -> value of its latest record below each partition's offset (a tombstone: absent)."""
    latest: dict[bytes, bytes] = {}
    for partition, rows in records.items():
        end = offsets.get(partition, 0)
        for record, _ in rows:
            if record.offset >= end:
                break
            if record.value is None:
                latest.pop(record.key, None)
            else:
                latest[record.key] = record.value
    return latest


def test_a_long_lived_view_stays_consistent_across_stops_and_kills_of_run(kafka_broker, tmp_path):
    bootstrap = kafka_broker.bootstrap_servers
    topic = f"long-lived-view-{time.time_ns()}"
    # compacted, but the broker compacts nothing during the test: a consumer reads every record
    create_topic(bootstrap, topic, PARTITIONS, {"cleanup.policy": "compact", "min.compaction.lag.ms": "86400000"})
    data_dir = tmp_path / "data"
    run_log = tmp_path / "run.log"
    writer = _Writer(bootstrap, topic)
    run = _Run(bootstrap, topic, data_dir, run_log)
    snapshots: list[tuple[str, dict[int, int], dict[bytes, bytes], dict[bytes, bytes]]] = []
    view = None
    try:
        wait_until(lambda: topic_status(data_dir, topic).complete, 60, "run's first catch-up")
        view = MaterializedView.open(data_dir, topic)

        def follow(phase: str, seconds: float, until=lambda: True) -> None:
            """Catch the view up every 0.3 s for ``seconds`` (and until ``until()``); record what it answers."""
            deadline = time.monotonic() + seconds
            while True:
                offsets = view.catch_up()
                got = {key: value for key in KEYS if (value := view.get(key)) is not None}
                scanned = {entry.key: entry.value for entry in view.items()}
                snapshots.append((phase, offsets, got, scanned))
                if time.monotonic() >= deadline and until():
                    return
                time.sleep(CATCH_UP_INTERVAL_S)

        def moved_since(phase: str) -> bool:
            first = next(offsets for name, offsets, _, _ in snapshots if name == phase)
            return snapshots[-1][1] != first

        follow("running", 3)
        assert run.stop(signal.SIGTERM) == 0, run_log.read_text()
        follow("stopped by SIGTERM", 2)
        run = _Run(bootstrap, topic, data_dir, run_log)
        follow("restarted", 3, lambda: moved_since("restarted"))
        run.stop(signal.SIGKILL)
        follow("killed", 1.5)
        run = _Run(bootstrap, topic, data_dir, run_log)
        follow("restarted after SIGKILL", 3, lambda: moved_since("restarted after SIGKILL"))
        assert run.stop(signal.SIGTERM) == 0, run_log.read_text()
        follow("stopped by SIGTERM again", 2)
    finally:
        if run.process.poll() is None:
            run.stop(signal.SIGKILL)
        writer.stop()
        if view is not None:
            view.close()

    records = read_topic(bootstrap, topic, PARTITIONS)  # read_committed, from offset 0
    wrong = []
    for phase, offsets, got, scanned in snapshots:
        truth = _latest_below(records, offsets)
        for key in KEYS:
            if got.get(key) != truth.get(key) or scanned.get(key) != truth.get(key):
                wrong.append((phase, offsets, key, got.get(key), scanned.get(key), truth.get(key)))
    assert not wrong, f"{len(wrong)} wrong answers, e.g. (phase, offsets, key, get, scan, truth): {wrong[:5]}"
    phases = [phase for phase, *_ in snapshots]
    assert all(phases.count(phase) >= 3 for phase in set(phases)), phases
    assert snapshots[-1][1] != snapshots[0][1]  # the view followed the writes
