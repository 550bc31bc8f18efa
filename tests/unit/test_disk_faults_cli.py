"""`restore` and `compact` on a full disk and on a read-only file system (issue 7).

Each runs as the CLI in a child process on a real tmpfs (``tests/tmpfs.py``). Whatever the space
left, the command either succeeds with exact data or ends with exit status 2 and one ``error:`` line
naming a file under the data dir: no traceback, no SIGBUS. Once space is back, running it again
gives exactly the data a read_committed reader of the source sees: nothing intact is lost.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.fuzz_harness import build_corpus
from tests.kill_campaign import _latest_per_partition
from tests.tmpfs import fill, mounted_tmpfs, remount

TOPIC = "fuzz"
_LOCAL_CONFIG = ["--config", "segment.index.bytes=4096", "--config", "cleanup.policy=compact",
                 "--config", "min.cleanable.dirty.ratio=0.01", "--config", "segment.bytes=1500"]


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "materializer", *args], capture_output=True, text=True, timeout=120)


def _assert_clean_failure(result: subprocess.CompletedProcess, under: Path) -> None:
    assert result.returncode == 2, (result.returncode, result.stderr[-1500:])
    lines = result.stderr.strip().splitlines()
    assert "Traceback" not in result.stderr and lines[-1].startswith("error: "), result.stderr[-1500:]
    assert str(under) in lines[-1], lines[-1]


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    folder = tmp_path_factory.mktemp("source")
    build_corpus(folder, seed=1)
    return folder, _latest_per_partition(folder, TOPIC)


def _restored_state(data_dir: Path) -> dict:
    from materializer.adapters.rocksdb_store import StateStore
    from materializer.datadir.layout import state_dir

    with StateStore(state_dir(data_dir, TOPIC)) as store:
        return {(v.partition, k): v.value for k, v in store.items()}


@pytest.mark.parametrize("leave_kib", [0, 8, 32, 96, 200, 320, 480])
def test_restore_onto_a_full_disk(tmp_path, source, leave_kib):
    folder, expected = source
    with mounted_tmpfs(tmp_path, "2m") as disk:
        filler = fill(disk, leave_kib * 1024)
        data_dir = disk / "data"
        result = _cli("restore", "--from-log-dir", str(folder), "--topic", TOPIC, "--data-dir", str(data_dir),
                      *_LOCAL_CONFIG)
        if result.returncode != 0:
            _assert_clean_failure(result, disk)
            filler.unlink()
            result = _cli("restore", "--from-log-dir", str(folder), "--topic", TOPIC, "--data-dir", str(data_dir),
                          "--overwrite", *_LOCAL_CONFIG)
            assert result.returncode == 0, result.stderr[-1500:]
        else:
            filler.unlink()  # opening the store to read it writes a new RocksDB MANIFEST
        assert _restored_state(data_dir) == expected
        assert _latest_per_partition(data_dir, TOPIC) == expected


@pytest.mark.parametrize("leave_kib", [0, 4, 16, 48, 96, 160])
def test_compact_on_a_full_disk(tmp_path, source, leave_kib):
    folder, expected = source
    with mounted_tmpfs(tmp_path, "4m") as disk:
        data_dir = disk / "data"
        assert _cli("restore", "--from-log-dir", str(folder), "--topic", TOPIC, "--data-dir", str(data_dir),
                    *_LOCAL_CONFIG).returncode == 0
        filler = fill(disk, leave_kib * 1024)
        result = _cli("compact", "--data-dir", str(data_dir), "--topic", TOPIC, "--quiet")
        if result.returncode != 0:
            _assert_clean_failure(result, disk)
        filler.unlink()
        result = _cli("compact", "--data-dir", str(data_dir), "--topic", TOPIC, "--quiet")
        assert result.returncode == 0, result.stderr[-1500:]
        assert not [p for p in data_dir.rglob("*") if p.suffix in (".cleaned", ".swap")]
        assert _latest_per_partition(data_dir, TOPIC) == expected


@pytest.mark.parametrize("command", ["compact", "restore"])
def test_read_only_file_system(tmp_path, source, command):
    folder, expected = source
    with mounted_tmpfs(tmp_path, "8m") as disk:
        data_dir = disk / "data"
        restore = ["restore", "--from-log-dir", str(folder), "--topic", TOPIC, "--data-dir", str(data_dir),
                   *_LOCAL_CONFIG]
        assert _cli(*restore).returncode == 0
        remount(disk, "ro")
        try:
            args = ["compact", "--data-dir", str(data_dir), "--topic", TOPIC] if command == "compact" \
                else [*restore, "--overwrite"]
            _assert_clean_failure(_cli(*args), disk)
        finally:
            remount(disk, "rw")
        assert _latest_per_partition(data_dir, TOPIC) == expected  # nothing was damaged
