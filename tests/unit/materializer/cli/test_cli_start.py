"""The command line starts light (issue 42): ``--version``, ``--help``, ``-h`` and ``get`` import none of
the Kafka clients, Spark, the query server, Avro, metrics or the log engine, which only the commands
that use them load. Asserted on what Python imports (``-X importtime``), not on a time: the figures
are benchmarks/bench_cli_start.py's."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from materializer.adapters.rocksdb_store import StateStore
from materializer.datadir.layout import state_dir
from materializer.storage.record_batch import Record

#: What no start of the command line needs (each is a third-party package or a module of ours
#: that loads one, or the log engine ``run`` uses).
HEAVY = ("pyspark", "confluent_kafka", "kafka", "rocksdict", "starlette", "uvicorn", "fastavro", "prometheus_client",
         "tqdm", "httpx", "materializer.materializer", "materializer.storage.log", "materializer.storage.record_batch")


def imported_modules(*args: str, stdin: str = "") -> tuple[int, set[str]]:
    """(exit status, the names of every module imported) by ``python -m materializer ARGS``."""
    result = subprocess.run([sys.executable, "-X", "importtime", "-m", "materializer", *args], input=stdin,
                            capture_output=True, text=True, timeout=120, check=False)
    names = {line.split("|")[2].strip() for line in result.stderr.splitlines() if line.startswith("import time:")}
    assert "materializer.cli" in names, result.stderr[-2000:]  # the import report was read
    return result.returncode, names


def heavy_in(names: set[str]) -> list[str]:
    """The packages of :data:`HEAVY` imported (top-level names; ours by module)."""
    return sorted({name if name.startswith("materializer.") else name.split(".")[0]
                   for name in names if name.split(".")[0] in HEAVY or name in HEAVY})


@pytest.mark.parametrize(("args", "needed"), [
    (["--version"], []), (["--help"], []), (["-h"], []), (["get", "--help"], []), (["export", "-h"], []),
    (["run", "-h"], ["rocksdict"]),  # its options' defaults come from the store's options
    (["demo", "--help"], []), (["compact", "--help"], []), (["spark", "--help"], []), (["broker", "start", "-h"], []),
])
def test_help_and_version_import_nothing_heavy(args, needed):
    status, names = imported_modules(*args)
    assert status == 0
    assert heavy_in(names) == needed
    if args[0] in ("--version", "--help", "-h"):  # no command's module either: the list comes from the summaries
        assert sorted(n for n in names if n.startswith("materializer.cli.") and n != "materializer.cli.conventions"
                      and n not in ("materializer.cli.options", "materializer.cli.lazy_commands")) == []


def test_get_imports_the_store_and_nothing_it_does_not_use(tmp_path: Path):
    with StateStore(state_dir(tmp_path, "prices")) as store:
        store.apply({0: [Record(0, 0, b"apple", b"1")]}, {0: 1})
    status, names = imported_modules("get", "--data-dir", str(tmp_path), "--topic", "prices", "apple")
    assert status == 0
    assert heavy_in(names) == ["rocksdict"]  # the store, and nothing else heavy
    status, names = imported_modules("get", "--data-dir", str(tmp_path), "--topic", "prices", "-", stdin="apple\nnone\n")
    assert status == 1  # one key absent: its tombstone is looked for in the local log (none here)
    assert [name for name in heavy_in(names) if not name.startswith("materializer.")] == ["rocksdict"]
