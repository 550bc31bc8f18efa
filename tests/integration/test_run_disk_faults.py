"""`materializer run` on a full disk and on a read-only file system, against a real broker (issue 7).

The data dir is a small real tmpfs (``tests/tmpfs.py``). Whatever the space left, `run
--until-caught-up` either succeeds or ends with exit status 2 and one ``error:`` line naming a file
under the data dir (no traceback, no SIGBUS); once space is back, the next run gives exactly what a
read_committed consumer reads.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.tmpfs import fill, mounted_tmpfs, remount

from .broker_reads import latest_per_partition_key, read_topic
from .test_ingest import Produced, produce

pytestmark = pytest.mark.broker


def _run(bootstrap: str, topic: str, data_dir) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "materializer", "run", "--bootstrap-servers", bootstrap, "--topic",
                           topic, "--data-dir", str(data_dir), "--until-caught-up", "--config",
                           "segment.index.bytes=65536", "--config", "segment.bytes=16384"],
                          capture_output=True, text=True, timeout=180)


def _assert_clean_failure(result, under) -> None:
    assert result.returncode == 2, (result.returncode, result.stderr[-1500:])
    last = result.stderr.strip().splitlines()[-1]
    assert "Traceback" not in result.stderr and last.startswith("error: ") and str(under) in last, result.stderr[-1500:]


def _store_state(data_dir, topic):
    from materializer.adapters.rocksdb_store import StateStore
    from materializer.datadir.layout import state_dir

    with StateStore(state_dir(data_dir, topic)) as store:
        return {(v.partition, k): v.value for k, v in store.items()}


def test_run_on_a_full_disk_and_a_read_only_one(kafka_broker, create_topic, tmp_path):
    topic = create_topic(partitions=2, config={"cleanup.policy": "compact"})
    bootstrap = kafka_broker.bootstrap_servers
    produce(bootstrap, topic, Produced(), count=4000, keys=400, codec="none", seed=9)
    expected = latest_per_partition_key(read_topic(bootstrap, topic, 2))
    failures = 0
    for leave_kib in (0, 64, 256, 512):
        with mounted_tmpfs(tmp_path, "4m") as disk:
            filler = fill(disk, leave_kib * 1024)
            data_dir = disk / "data"
            result = _run(bootstrap, topic, data_dir)
            if result.returncode != 0:
                failures += 1
                _assert_clean_failure(result, disk)
                filler.unlink()
                result = _run(bootstrap, topic, data_dir)
            assert result.returncode == 0, result.stderr[-1500:]
            # Opening the store to check it writes a RocksDB OPTIONS file: give it room (a run that
            # fitted in the space left may have used all of it).
            filler.unlink(missing_ok=True)
            assert _store_state(data_dir, topic) == expected
            if leave_kib == 512:
                remount(disk, "ro")
                try:
                    _assert_clean_failure(_run(bootstrap, topic, data_dir), disk)
                finally:
                    remount(disk, "rw")
                assert _run(bootstrap, topic, data_dir).returncode == 0
                assert _store_state(data_dir, topic) == expected
    assert failures >= 2  # the small amounts of space really ran out
