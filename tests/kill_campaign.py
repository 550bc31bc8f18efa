"""SIGKILL a CLI command at every rename, unlink, fsync and truncate it makes, then check recovery (issue 7).

A *trace pass* runs the command once with ``tests/fault_injection/sitecustomize.py`` loaded and
lists every counted file-system call with its call site. Then, for the first call of every distinct
(call, site) pair, plus ``extra_random`` random call numbers, the command runs again on a fresh copy
of the prepared data, is SIGKILLed just before that call, is run again undisturbed (the recovery:
it must exit 0 with no traceback), and ``check`` inspects the result.

``python -m tests.kill_campaign --kills N`` runs a long campaign of the offline commands (compact and
restore, no broker needed) and prints the figures.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

__all__ = ["CampaignReport", "compact_campaign", "restore_campaign", "run_campaign"]

_INJECTOR = Path(__file__).resolve().parent / "fault_injection"
_CLI = [sys.executable, "-m", "materializer"]


@dataclass
class CampaignReport:
    """Kills made, how many landed before the command finished, and the failures found."""

    command: str
    calls_traced: int = 0
    sites: int = 0
    kills: int = 0
    killed: int = 0
    failures: list[str] = field(default_factory=list)

    def line(self) -> str:
        return (f"{self.command}: {self.calls_traced} counted calls at {self.sites} call sites; {self.kills} kill "
                f"runs, {self.killed} killed mid-command, {len(self.failures)} failures")


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FAULT_")}
    env["PYTHONPATH"] = os.pathsep.join([str(_INJECTOR), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.update(extra)
    return env


def _trace(args: Sequence[str], workdir: Path) -> list[tuple[int, str, str]]:
    trace = workdir / "trace.txt"
    trace.unlink(missing_ok=True)
    result = subprocess.run([*_CLI, *args], env=_env(FAULT_TRACE=str(trace)), capture_output=True, text=True,
                            timeout=300)
    if result.returncode != 0:
        raise AssertionError(f"trace pass of {args} failed ({result.returncode}): {result.stderr[-2000:]}")
    calls = []
    for line in trace.read_text().splitlines():
        n, call, site = line.split(" ", 2)
        calls.append((int(n), call, site))
    return calls


def run_campaign(name: str, prepare: Callable[[Path], None], command: Callable[[Path], list[str]],
                 check: Callable[[Path], str | None], *, extra_random: int = 0, seed: int = 0,
                 max_kills: int | None = None, workdir: Path | None = None,
                 check_killed: Callable[[Path], str | None] | None = None) -> CampaignReport:
    """Kill ``command`` at every call site (and ``extra_random`` random calls) on fresh data.

    ``prepare(dir)`` writes the data a run starts from; ``command(dir)`` is the CLI argument list;
    ``check(dir)`` returns None when the data after the recovery run is right, else the problem;
    ``check_killed(dir)`` the same right after the kill, before the recovery run (what a reader
    sees meanwhile).
    """
    report = CampaignReport(name)
    root = Path(tempfile.mkdtemp(prefix=f"kill-{name}-", dir=workdir))
    try:
        template = root / "template"
        template.mkdir()
        prepare(template)
        traced = root / "traced"
        shutil.copytree(template, traced)
        calls = _trace(command(traced), root)
        report.calls_traced = len(calls)
        first_per_site: dict[tuple[str, str], int] = {}
        for n, call, site in calls:
            first_per_site.setdefault((call, site), n)
        report.sites = len(first_per_site)
        rng = random.Random(seed)
        points = sorted(set(first_per_site.values()) | {rng.randint(1, max(1, len(calls))) for _ in range(extra_random)})
        if max_kills is not None:
            points = points[:max_kills]
        for n in points:
            data = root / f"kill-{n}"
            shutil.copytree(template, data)
            killed = subprocess.run([*_CLI, *command(data)], env=_env(FAULT_KILL_AT=str(n)), capture_output=True,
                                    text=True, timeout=300)
            report.kills += 1
            if killed.returncode == -signal.SIGKILL:
                report.killed += 1
            elif killed.returncode != 0:
                report.failures.append(f"kill at call {n}: the command itself failed ({killed.returncode}): "
                                       f"{killed.stderr[-500:]}")
                continue
            site = next((f"{call} at {where}" for m, call, where in calls if m == n), "?")
            problem = None if check_killed is None else check_killed(data)
            if problem is not None:
                report.failures.append(f"kill before call {n} ({site}), before the rerun: {problem}")
            again = subprocess.run([*_CLI, *command(data)], env=_env(), capture_output=True, text=True, timeout=300)
            if again.returncode != 0 or "Traceback" in again.stderr:
                report.failures.append(f"kill before call {n} ({site}): the rerun exited {again.returncode}: "
                                       f"{again.stderr.strip()[-800:]}")
            else:
                problem = check(data)
                if problem is not None:
                    report.failures.append(f"kill before call {n} ({site}): {problem}")
            shutil.rmtree(data, ignore_errors=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return report


# -- the offline commands --------------------------------------------------------------------

def _latest_per_partition(data_dir: Path, topic: str) -> dict[tuple[int, bytes], bytes]:
    from materializer.storage.log import Log
    from materializer.storage.log_config import LogConfig
    from materializer.storage.read_committed import read_committed

    state: dict[tuple[int, bytes], bytes] = {}
    for folder in sorted(data_dir.glob(f"{topic}-*")):
        partition = int(folder.name.rsplit("-", 1)[1])
        with Log.open(folder, LogConfig(segment_index_bytes=65536), had_clean_shutdown=True) as log:
            for record in read_committed(log):
                if record.key is None:
                    continue
                if record.value is None:
                    state.pop((partition, record.key), None)
                else:
                    state[(partition, record.key)] = record.value
    return state


def compact_campaign(*, extra_random: int = 0, seed: int = 0, workdir: Path | None = None) -> CampaignReport:
    """``materializer compact`` on five partitions (every codec, transactions), killed at each call site."""
    from tests.fuzz_harness import build_corpus

    from materializer.storage.log_config import LogConfig

    topic = "fuzz"
    reference: dict = {}

    def prepare(data_dir: Path) -> None:
        build_corpus(data_dir, seed=seed)
        (data_dir / "topic-configs").mkdir()
        LogConfig(cleanup_policy=("compact",), segment_bytes=1500, segment_index_bytes=65536,
                  min_cleanable_dirty_ratio=0.01).save(data_dir / "topic-configs" / f"{topic}.json")
        reference.update(_latest_per_partition(data_dir, topic))

    def check(data_dir: Path) -> str | None:
        leftovers = [p.name for p in data_dir.rglob("*") if p.suffix in (".cleaned", ".swap")]
        if leftovers:
            return f"leftover files after the rerun: {leftovers[:3]}"
        state = _latest_per_partition(data_dir, topic)
        if state != reference:
            missing = set(reference) - set(state)
            return f"latest values differ from before cleaning ({len(state)} vs {len(reference)} keys, missing {list(missing)[:3]})"
        return None

    def check_killed(data_dir: Path) -> str | None:
        """The killed round left a valid log: opened as the next command opens it (``.cleaned`` files
        deleted, ``.swap`` renames finished, recovery past the recovery point), nothing is lost."""
        import logging

        copy = data_dir.parent / f"{data_dir.name}-as-killed"
        shutil.copytree(data_dir, copy)
        loader = logging.getLogger("materializer.storage")
        level = loader.level
        loader.setLevel(logging.ERROR)  # the unclean-shutdown recovery's index rebuilds are expected here
        try:
            from materializer.storage.log_config import LogConfig
            from materializer.storage.log_manager import TopicLogs

            partitions = sorted(int(p.name.rsplit("-", 1)[1]) for p in copy.glob(f"{topic}-*"))
            TopicLogs.open(copy, topic, partitions, LogConfig.load(copy / "topic-configs" / f"{topic}.json")).abandon()
            state = _latest_per_partition(copy, topic)
        finally:
            loader.setLevel(level)
            shutil.rmtree(copy, ignore_errors=True)
        if state != reference:
            return f"the log as the kill left it holds other latest values ({len(state)} vs {len(reference)} keys)"
        return None

    return run_campaign("compact", prepare, lambda d: ["compact", "--data-dir", str(d), "--topic", topic, "--quiet"],
                        check, extra_random=extra_random, seed=seed, workdir=workdir, check_killed=check_killed)


def restore_campaign(*, extra_random: int = 0, seed: int = 0, workdir: Path | None = None) -> CampaignReport:
    """``materializer restore --from-log-dir --overwrite`` of five partitions over a data dir holding an
    earlier restore of other data, killed at each call site. Right after a kill a reader sees the
    earlier data, the new data, or a refusal (never a mix); the rerun gives the new data."""
    from tests.fuzz_harness import build_corpus

    from materializer.offline.restore import RestoreOptions, restore_from_log_dir

    topic = "fuzz"
    source = Path(tempfile.mkdtemp(prefix="kill-restore-source-", dir=workdir))
    build_corpus(source / "new", seed=seed)
    build_corpus(source / "earlier", seed=seed + 1)
    reference = _latest_per_partition(source / "new", topic)
    earlier = _latest_per_partition(source / "earlier", topic)
    options = RestoreOptions(config_overrides={"segment.index.bytes": "65536"}, progress=False)

    def served(data_dir: Path) -> dict | None:
        """What ``export`` would serve (None: refused)."""
        from materializer.adapters.rocksdb_store import StateStore
        from materializer.datadir.layout import state_dir
        from materializer.datadir.markers import open_when_complete
        from materializer.storage.errors import IncompleteDataDirError

        try:
            store = open_when_complete(data_dir, topic, lambda: StateStore(state_dir(data_dir, topic), read_only=True),
                                       StateStore.close)
        except IncompleteDataDirError:
            return None
        with store:
            return {(v.partition, k): v.value for k, v in store.items()}

    def logs_served(data_dir: Path) -> dict | None:
        """Latest value per (partition, key) of what ``kafkalog`` reads from the local logs (None: refused)."""
        from materializer.spark.split_reader import read_split
        from materializer.spark.splits import plan_splits
        from materializer.storage.errors import IncompleteDataDirError

        state: dict = {}
        try:
            for split in plan_splits([data_dir], topic):
                for batch in read_split(split, False):
                    for row in batch.select(["partition", "key", "value"]).to_pylist():
                        if row["value"] is None:
                            state.pop((row["partition"], row["key"]), None)
                        else:
                            state[(row["partition"], row["key"])] = row["value"]
        except IncompleteDataDirError:
            return None
        return state

    def check_killed(data_dir: Path) -> str | None:
        state, logs = served(data_dir / "out"), logs_served(data_dir / "out")
        for what, seen in (("the store", state), ("the local logs", logs)):
            if seen is not None and seen not in (earlier, reference):
                return f"a reader is served {len(seen)} live keys from {what}: neither the earlier data nor the new"
        if state is not None and logs is not None and state != logs:
            return "readers are served the store of one restore and the local logs of the other"
        return None

    def check(data_dir: Path) -> str | None:
        state = served(data_dir / "out")
        if state != reference:
            return f"the restored store differs ({len(state or {})} vs {len(reference)} live keys)"
        if _latest_per_partition(data_dir / "out", topic) != reference:
            return "the restored local log differs from the source"
        return None

    try:
        return run_campaign("restore", lambda d: restore_from_log_dir(source / "earlier", topic, d / "out",
                                                                      options=options),
                            lambda d: ["restore", "--from-log-dir", str(source / "new"), "--topic", topic,
                                       "--data-dir", str(d / "out"), "--overwrite", "--config",
                                       "segment.index.bytes=65536"],
                            check, extra_random=extra_random, seed=seed, workdir=workdir, check_killed=check_killed)
    finally:
        shutil.rmtree(source, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    """Command line: a long campaign of the offline commands; prints the figures."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kills", type=int, default=200, help="random kills per command on top of one per call site")
    parser.add_argument("--seed", type=int, default=int(time.time()))
    args = parser.parse_args(argv)
    started = time.monotonic()
    failures = 0
    for campaign in (compact_campaign, restore_campaign):
        report = campaign(extra_random=args.kills, seed=args.seed)
        print(report.line(), flush=True)
        for failure in report.failures[:20]:
            print("  FAIL", failure)
        failures += len(report.failures)
    print(f"seed {args.seed}, {time.monotonic() - started:.0f} s")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
