"""How long the ``materializer`` command line takes to start (issue 42): ``--version``, ``--help``,
``get --help``, ``run --help`` and a ``get`` of one key from a small state store, beside
``python -c pass`` (the interpreter's own start), each the wall time of a whole process.

A script, not a test (tests/unit/materializer/cli/test_cli_start.py guards what these commands
import, without timing). The commands run in turn, round-robin (one run of each, then the next
round), after ``--warmup`` uncounted rounds, so a machine that slows down slows them all; the
median and the minimum of ``--runs`` rounds are printed, with the start above ``python -c pass``'s
median, and the median CPU time (user + sys), which other work on the machine disturbs less. Every command runs as ``python -m materializer ...`` (what the console script calls) from a
scratch directory, so the package comes from the install, or from ``--baseline REV``'s tree: a
``git archive`` of that revision with this tree's built native core, put first on ``PYTHONPATH``
(before/after in one run). Bytecode is written and used as an installed package's would be
(``PYTHONDONTWRITEBYTECODE`` is removed from the commands' environment; the warm-up writes it).

    .venv/bin/python benchmarks/bench_cli_start.py                     # ~1 min
    .venv/bin/python benchmarks/bench_cli_start.py --baseline main --runs 21
"""

from __future__ import annotations

import argparse
import io
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TOPIC = "prices"


def machine() -> str:
    """nproc, CPU model, load average and Python version, one line."""
    model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("model name")), platform.processor() or "unknown CPU")
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    return f"{os.cpu_count()} CPUs ({model}), load average {load}, Python {platform.python_version()}"


def baseline_tree(rev: str, dest: Path) -> Path:
    """REV's files in ``dest``, importable as the ``materializer`` package from ``PYTHONPATH=dest``
    (``storage/`` and ``adapters/`` linked in where the wheel puts them, this tree's native core
    copied, so a REV that changed the native crate needs a build of its own)."""
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev], capture_output=True, check=True).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(dest, filter="data")
    for package in ("storage", "adapters"):
        (dest / "materializer" / package).symlink_to(dest / package)
    for built in (ROOT / "storage").glob("_native*.so"):
        shutil.copy2(built, dest / "storage")
    return dest


def make_store(data_dir: Path) -> None:
    """A state store of TOPIC with a few keys, as ``run`` leaves it (read by ``get``)."""
    from materializer.adapters.rocksdb_store import StateStore
    from materializer.datadir.layout import state_dir
    from materializer.storage.record_batch import Record

    with StateStore(state_dir(data_dir, TOPIC)) as store:
        store.apply({0: [Record(i, 0, f"product-{i:04d}".encode(), b'{"price": 1}') for i in range(100)]}, {0: 100})


def time_once(command: list[str], env: dict[str, str], cwd: Path) -> tuple[float, float]:
    """Wall seconds and CPU seconds (user + sys, ``getrusage(RUSAGE_CHILDREN)``) of one run of
    ``command`` (its output discarded).

    Raises:
        RuntimeError: the command failed (its stderr quoted).
    """
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    result = subprocess.run(command, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, check=False)
    elapsed = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} exited {result.returncode}: {result.stderr.decode()[-500:]}")
    return elapsed, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=15, help="counted rounds (default 15)")
    parser.add_argument("--warmup", type=int, default=2, help="uncounted rounds first (default 2)")
    parser.add_argument("--baseline", default=None, metavar="REV", help="also time REV's package (git archive)")
    args = parser.parse_args()

    python = sys.executable
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONDONTWRITEBYTECODE", "PYTHONPATH")}
    with tempfile.TemporaryDirectory(prefix="bench-cli-start-") as scratch:
        work = Path(scratch)
        make_store(work / "data")
        trees: list[tuple[str, dict[str, str]]] = []
        if args.baseline:
            tree = baseline_tree(args.baseline, work / "baseline")
            trees.append((f"before ({args.baseline})", {**env, "PYTHONPATH": str(tree)}))
        trees.append(("after (this tree)" if args.baseline else "this tree", env))
        commands = {"--version": ["--version"], "--help": ["--help"], "get --help": ["get", "--help"],
                    "run --help": ["run", "--help"],
                    "get KEY": ["get", "--data-dir", str(work / "data"), "--topic", TOPIC, "product-0042"]}
        cases: list[tuple[str, list[str], dict[str, str]]] = [("python -c pass", [python, "-c", "pass"], env)]
        for label, tree_env in trees:
            cases += [(f"{label}: materializer {name}", [python, "-m", "materializer", *c], tree_env)
                      for name, c in commands.items()]
        print(f"# {' '.join([Path(python).name, *sys.argv])}")
        print(f"# {machine()}")
        print(f"# {args.runs} rounds after {args.warmup} warm-up rounds; wall ms of the whole process; "
              f"get reads 1 key of a 100-key store")
        times: dict[str, list[float]] = {label: [] for label, _, _ in cases}
        cpus: dict[str, list[float]] = {label: [] for label, _, _ in cases}
        for round_number in range(args.warmup + args.runs):
            for label, command, case_env in cases:
                elapsed, cpu = time_once(command, case_env, work)
                if round_number >= args.warmup:
                    times[label].append(elapsed)
                    cpus[label].append(cpu)
        base, base_cpu = statistics.median(times["python -c pass"]), statistics.median(cpus["python -c pass"])
        print(f"{'command':<46} {'wall median':>11} {'wall min':>8} {'above python':>12} {'CPU median':>10} "
              f"{'above python':>12}   (ms)")
        for label, _, _ in cases:
            median, cpu = statistics.median(times[label]), statistics.median(cpus[label])
            print(f"{label:<46} {median * 1000:>11.0f} {min(times[label]) * 1000:>8.0f} {(median - base) * 1000:>12.0f} "
                  f"{cpu * 1000:>10.0f} {(cpu - base_cpu) * 1000:>12.0f}")
        print(f"# {machine()}")


if __name__ == "__main__":
    main()
