"""Seeded mutation fuzzer over real partition folders, run against every reader (issue 7).

A *corpus* is a log dir holding partition folders: ours (:func:`build_corpus`: every codec, plain
and transactional batches, committed and aborted, tombstones, headers, several segments) or a
broker's (copied by the broker test). Each *case* copies one partition folder, applies one seeded
mutation to one of its files (a ``.log`` segment, an ``.index``/``.timeindex``/``.txnindex`` or a
checkpoint), and runs the readers on it:

* ``dump-log``: :func:`dump_log_file` on every segment (problems are reported, never raised);
* strict ``restore``: :func:`restore_from_log_dir`;
* ``repair`` restore: the same with ``RestoreOptions(repair=True)`` (Kafka's recovery cut);
* ``rebuild``: the local log opened after a clean shutdown and read ``read_committed`` (what a
  store rebuild applies);
* ``recovery``: the local log opened after an unclean shutdown from offset 0 (LogLoader) and read.

Every outcome is classified against the *reference*, the pristine folder read ``read_committed``:

* ``equal``: the reader returned exactly the reference's latest value per key;
* ``error``: one of our exceptions (:class:`StorageError`, ``click`` usage errors) naming the mutated
  file (or its folder) -- a clear error, allowed;
* ``recovered``: recovery cut the log, and every batch wholly before the first mutated byte
  survived (nothing intact lost) and what is read equals the reference up to the cut;
* ``shortened``: the segment was cut exactly at a batch boundary, which leaves a valid, shorter
  log that no reader can tell from the original (Kafka neither); the readers return what survived.
  The materializer refetches such a tail of the last segment (its log end moved back); a middle
  segment cut so is caught only when its index has an entry past the cut (README, limits);
* failures: ``traceback`` (any other exception), ``wrong`` (a result that differs from the
  reference with no error: silently wrong), ``lost`` (recovery dropped an intact batch), ``hang``
  (a reader ran longer than ``timeout_s``).

Which mutations can be detected at all: the CRC-32C covers a batch from its attributes on, so the
only bytes a reader must check by other means are the base offset (offset order, segment range),
the length (framing), the partition leader epoch (ignored by readers) and the magic. A base offset
moved forward inside the last segment's range still reads as a valid log; the reader then serves
the same values at other offsets, which the oracle accepts (it compares values per key), and the
materializer refuses such a log when it ends beyond the broker's high watermark.

Run it from the command line for any number of cases::

    python -m tests.fuzz_harness --cases 10000 --seed 1

It prints the counts per reader and outcome, and every failing case with its seed to replay it.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import io
import logging
import os
import random
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import click

from materializer.offline.dump_log import dump_log_file
from materializer.offline.restore import RestoreOptions, restore_from_log_dir
from materializer.storage.compression import CompressionType
from materializer.storage.control_record import ControlRecordType, encode_end_txn_marker
from materializer.storage.errors import StorageError
from materializer.storage.log import Log
from materializer.storage.log_config import LogConfig
from materializer.storage.read_committed import read_committed
from materializer.storage.record_batch_builder import RecordBatchBuilder

__all__ = ["CaseResult", "FuzzReport", "batch_spans", "build_corpus", "run_cases"]

READERS = ("dump-log", "restore", "repair", "rebuild", "recovery")
FAILURES = ("traceback", "wrong", "lost", "hang")
CODECS = ("none", "gzip", "snappy", "lz4", "zstd")
_TOPIC = "fuzz"
# Small preallocated indexes: the default 10 MiB maps (sparse) are remapped at every open.
_INDEX_BYTES = 65536
_CONFIG = LogConfig(segment_index_bytes=_INDEX_BYTES)


@dataclass
class CaseResult:
    """One reader's outcome on one mutated folder."""

    case: int
    reader: str
    outcome: str
    mutation: str
    detail: str = ""


@dataclass
class FuzzReport:
    """Counts per (reader, outcome), and the failing cases."""

    cases: int = 0
    counts: collections.Counter = field(default_factory=collections.Counter)
    failures: list[CaseResult] = field(default_factory=list)

    def add(self, result: CaseResult) -> None:
        self.counts[(result.reader, result.outcome)] += 1
        if result.outcome in FAILURES:
            self.failures.append(result)

    def table(self) -> str:
        outcomes = ("equal", "error", "recovered", "shortened", *FAILURES)
        lines = [f"{'reader':10}" + "".join(f"{o:>11}" for o in outcomes)]
        for reader in READERS:
            lines.append(f"{reader:10}" + "".join(f"{self.counts[(reader, o)]:>11}" for o in outcomes))
        return "\n".join(lines)


# -- corpus ----------------------------------------------------------------------------------

def build_corpus(log_dir: Path, *, seed: int = 0) -> list[Path]:
    """Write one partition folder per codec under ``log_dir`` (``fuzz-0`` .. ``fuzz-4``).

    Each holds about 60 batches over several 1.5 KB segments: plain batches of 1-6 records over 40
    keys (10% tombstones, headers), transactional batches of two producers, committed and aborted
    with COMMIT/ABORT markers (so ``.txnindex`` files exist). Returns the folders.
    """
    rng = random.Random(seed)
    folders = []
    for partition, codec in enumerate(CODECS):
        folder = log_dir / f"{_TOPIC}-{partition}"
        compression = CompressionType.from_name(codec)
        with Log.open(folder, LogConfig(segment_bytes=1500, index_interval_bytes=200),
                      had_clean_shutdown=True) as log:
            offset = 0
            open_txn: dict[int, bool] = {}
            for i in range(60):
                producer = rng.choice((7, 8)) if rng.random() < 0.35 else None
                if producer is not None and producer in open_txn and rng.random() < 0.5:
                    control = ControlRecordType.COMMIT if open_txn.pop(producer) else ControlRecordType.ABORT
                    builder = RecordBatchBuilder(offset, producer_id=producer, producer_epoch=0, base_sequence=-1,
                                                 is_transactional=True, is_control_batch=True)
                    key, value = encode_end_txn_marker(control, 0)
                    builder.append(offset, 10_000 + i, key, value)
                    log.append_batch(builder.build())
                    offset += 1
                    continue
                if producer is not None:
                    open_txn.setdefault(producer, rng.random() < 0.6)
                    builder = RecordBatchBuilder(offset, compression=compression, producer_id=producer,
                                                 producer_epoch=0, base_sequence=i, is_transactional=True)
                else:
                    builder = RecordBatchBuilder(offset, compression=compression)
                for _ in range(rng.randint(1, 6)):
                    key = b"key-%02d" % rng.randrange(40)
                    value = None if rng.random() < 0.1 else rng.randbytes(rng.randrange(0, 40))
                    headers = [("h", rng.randbytes(3))] if rng.random() < 0.3 else []
                    builder.append(offset, 10_000 + i, key, value, headers)
                    offset += 1
                log.append_batch(builder.build())
            for producer, commit in open_txn.items():  # close every transaction: LSO = log end
                control = ControlRecordType.COMMIT if commit else ControlRecordType.ABORT
                builder = RecordBatchBuilder(offset, producer_id=producer, producer_epoch=0, base_sequence=-1,
                                             is_transactional=True, is_control_batch=True)
                key, value = encode_end_txn_marker(control, 0)
                builder.append(offset, 20_000, key, value)
                log.append_batch(builder.build())
                offset += 1
        folders.append(folder)
    return folders


# -- mutations -------------------------------------------------------------------------------

def batch_spans(data: bytes) -> list[tuple[int, int]]:
    """(position, end) of each framed batch of a .log file's bytes, up to the first that does not fit."""
    spans, position = [], 0
    while position + 12 <= len(data):
        end = position + 12 + int.from_bytes(data[position + 8:position + 12], "big")
        if end > len(data):
            break
        spans.append((position, end))
        position = end
    return spans


def _mutate(data: bytearray, rng: random.Random, spans: list[tuple[int, int]]) -> tuple[bytearray, int, str]:
    """Apply one mutation; return (new bytes, first byte position that differs, description)."""
    n = len(data)
    kind = rng.choice(("bitflip", "byte", "truncate", "insert", "duplicate", "zero", "swap", "header"))
    if n == 0:
        kind = "insert"
    if kind == "bitflip":
        at = rng.randrange(n)
        data[at] ^= 1 << rng.randrange(8)
        return data, at, f"flip a bit at {at}"
    if kind == "byte":
        at = rng.randrange(n)
        data[at] = rng.randrange(256)
        return data, at, f"set byte {at}"
    if kind == "truncate":
        at = rng.randrange(n)
        return data[:at], at, f"truncate at {at}"
    if kind == "insert":
        at = rng.randrange(n + 1)
        blob = rng.randbytes(rng.randint(1, 64))
        return data[:at] + blob + data[at:], at, f"insert {len(blob)} bytes at {at}"
    if kind == "duplicate" and n > 1:
        start = rng.randrange(n)
        end = min(n, start + rng.randint(1, 400))
        at = rng.randrange(n + 1)
        return data[:at] + data[start:end] + data[at:], at, f"duplicate [{start},{end}) at {at}"
    if kind == "zero":
        start = rng.randrange(n)
        end = min(n, start + rng.randint(1, 100))
        data[start:end] = bytes(end - start)
        return data, start, f"zero [{start},{end})"
    if kind == "swap" and len(spans) >= 2:
        i, j = sorted(rng.sample(range(len(spans)), 2))
        (a0, a1), (b0, b1) = spans[i], spans[j]
        swapped = data[:a0] + data[b0:b1] + data[a1:b0] + data[a0:a1] + data[b1:]
        return swapped, a0, f"swap batches at {a0} and {b0}"
    if spans:  # "header": a field of one batch header (base offset, length, epoch, magic, crc, attributes)
        position, _ = rng.choice(spans)
        field_at = rng.choice((0, 7, 8, 11, 12, 16, 17, 21, 22))
        at = position + field_at
        data[at] ^= 1 << rng.randrange(8)
        return data, at, f"flip a header bit at {at} (batch at {position}, field byte {field_at})"
    at = rng.randrange(n)
    data[at] ^= 0xFF
    return data, at, f"invert byte {at}"


# -- readers and the oracle ------------------------------------------------------------------

class _Hang(Exception):
    pass


@contextlib.contextmanager
def _deadline(seconds: float):
    def on_alarm(signum, frame):  # noqa: ARG001
        raise _Hang()

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _latest(records) -> dict[bytes, bytes]:
    state: dict[bytes, bytes] = {}
    for record in records:
        if record.key is None:
            continue
        if record.value is None:
            state.pop(record.key, None)
        else:
            state[record.key] = record.value
    return state


def _reference(folder: Path) -> tuple[dict[bytes, bytes], list[tuple[str, int, int, bytes]]]:
    """(latest value per key, [(segment name, position, end, batch bytes)]) of a pristine folder."""
    with Log.open(folder, _CONFIG, had_clean_shutdown=True) as log:
        state = _latest(read_committed(log))
    batches = []
    for segment in sorted(folder.glob("*.log")):
        data = segment.read_bytes()
        batches.extend((segment.name, p, e, data[p:e]) for p, e in batch_spans(data))
    return state, batches


def _values(partitions):
    return partitions.values() if isinstance(partitions, dict) else partitions


def _names_the_file(exc: BaseException, mutated: Path) -> bool:
    """The error names the mutated file, or a file of (a copy of) its partition folder."""
    text = str(exc)
    return (str(mutated) in text or mutated.name in text or str(mutated.parent) in text
            or f"/{_TOPIC}-0/" in text or f"/.restore-{_TOPIC}-0/" in text)


def _classify_error(exc: BaseException, mutated: Path) -> tuple[str, str]:
    if isinstance(exc, _Hang):
        return "hang", "reader exceeded its deadline"
    if isinstance(exc, (StorageError, click.ClickException, FileExistsError)) or (
            isinstance(exc, ValueError) and _names_the_file(exc, mutated)):
        if _names_the_file(exc, mutated) or not mutated.suffix == ".log":
            return "error", type(exc).__name__
        return "traceback", f"{type(exc).__name__} names no file: {exc}"
    return "traceback", f"{type(exc).__name__}: {exc}"


def _intact_prefix(reference_batches, mutated_name: str, first_changed: int) -> list[bytes]:
    """Batches wholly before the first mutated byte, in segments up to the mutated one."""
    kept = []
    for name, _, end, blob in reference_batches:
        if name > mutated_name:
            break
        if name == mutated_name and end > first_changed:
            break
        kept.append(blob)
    return kept


def _check_recovered(log: Log, reference_state, reference_batches, mutated: Path, first_changed: int) -> tuple[str, str]:
    """After a recovery: intact batches kept, and the read equals the reference up to the cut."""
    present = []
    for segment in sorted(log.dir.glob("*.log")):
        data = segment.read_bytes()
        present.extend(data[p:e] for p, e in batch_spans(data))
    if mutated.suffix == ".log":
        intact = _intact_prefix(reference_batches, mutated.name, first_changed)
        if present[:len(intact)] != intact:
            return "lost", f"{len(intact)} intact batches before the damage, {len(present)} present"
    state = _latest(read_committed(log))
    if state == reference_state:
        return "equal", ""
    if log.recovery_truncations:
        return "recovered", f"cut at {log.recovery_truncations[0].position}"
    return "wrong", "state differs from the reference and nothing was cut"


def _run_reader(reader: str, case_dir: Path, mutated: Path, reference_state, reference_batches,
                first_changed: int, timeout_s: float) -> tuple[str, str]:
    folder = mutated.parent if mutated.parent.name.startswith(f"{_TOPIC}-") else case_dir / "log" / f"{_TOPIC}-0"
    try:
        with _deadline(timeout_s):
            if reader == "dump-log":
                problems = []
                for segment in sorted(folder.glob("*.log")):
                    problems.extend(dump_log_file(segment, io.BytesIO()))
                if problems:
                    return ("error", "problems reported") if any(
                        mutated.name in p.path or str(mutated) in p.path for p in problems) or mutated.suffix != ".log" \
                        else ("traceback", f"problem names another file: {problems[0]}")
                return "equal", ""
            if reader in ("restore", "repair"):
                out = case_dir / f"out-{reader}"
                shutil.rmtree(out, ignore_errors=True)
                result = restore_from_log_dir(case_dir / "log", _TOPIC, out,
                                              options=RestoreOptions(repair=reader == "repair", overwrite=True,
                                                                     config_overrides={"segment.index.bytes": str(_INDEX_BYTES)}))
                from materializer.adapters.rocksdb_store import StateStore
                from materializer.datadir.layout import state_dir
                with StateStore(state_dir(out, _TOPIC)) as store:
                    state = {k: v.value for k, v in store.items()}
                if state == reference_state:
                    return "equal", ""
                cut = any(p.truncations or p.open_transaction_bytes for p in _values(result.partitions))
                if reader == "repair" and cut:
                    return "recovered", "repair cut the log"
                return "wrong", f"restore returned {len(state)} keys, reference {len(reference_state)}"
            work = case_dir / f"work-{reader}" / folder.name
            shutil.rmtree(work.parent, ignore_errors=True)
            shutil.copytree(folder, work)
            if reader == "rebuild":  # after a clean shutdown: only index checks may trigger a recovery at load
                with Log.open(work, _CONFIG, had_clean_shutdown=True) as log:
                    return _check_recovered(log, reference_state, reference_batches, mutated, first_changed)
            with Log.open(work, _CONFIG, recovery_point=0, had_clean_shutdown=False) as log:
                return _check_recovered(log, reference_state, reference_batches, mutated, first_changed)
    except BaseException as exc:  # noqa: BLE001 - the oracle classifies every outcome
        if isinstance(exc, KeyboardInterrupt):
            raise
        return _classify_error(exc, mutated)


def _targets(folder: Path, log_dir: Path) -> list[Path]:
    files = sorted(folder.glob("*.log")) * 6  # segments are the main target
    files += sorted(folder.glob("*.index")) + sorted(folder.glob("*.timeindex")) + sorted(folder.glob("*.txnindex"))
    files += [p for p in (log_dir / "recovery-point-offset-checkpoint", log_dir / "log-start-offset-checkpoint")
              if p.exists()]
    return files


def run_cases(corpus_dir: Path, cases: int, *, seed: int, work_dir: Path | None = None,
              timeout_s: float = 20.0, readers: tuple[str, ...] = READERS, first_case: int = 0) -> FuzzReport:
    """Run cases ``first_case`` .. ``cases - 1`` over the partition folders of ``corpus_dir`` (a log dir).

    Case ``i`` uses ``random.Random(f"{seed}-{i}")``, so a failing case replays alone.
    """
    report = FuzzReport()
    folders = sorted(p for p in corpus_dir.iterdir() if p.is_dir() and p.name.rsplit("-", 1)[-1].isdigit())
    references = {folder: _reference(folder) for folder in folders}
    work_root = Path(tempfile.mkdtemp(prefix="fuzz-", dir=work_dir))
    quiet = logging.getLogger("materializer")
    level = quiet.level
    quiet.setLevel(logging.CRITICAL)
    try:
        for case in range(max(0, first_case), cases):
            rng = random.Random(f"{seed}-{case}")
            source = rng.choice(folders)
            case_dir = work_root / f"case-{case}"
            log_dir = case_dir / "log"
            folder = log_dir / f"{_TOPIC}-0"
            shutil.copytree(source, folder)
            for checkpoint in ("recovery-point-offset-checkpoint", "log-start-offset-checkpoint"):
                if (corpus_dir / checkpoint).exists():
                    lines = (corpus_dir / checkpoint).read_text().splitlines()
                    kept = [line for line in lines[2:] if line.split(" ")[0] == source.name.rsplit("-", 1)[0]
                            and line.split(" ")[1] == source.name.rsplit("-", 1)[1]]
                    renamed = [f"{_TOPIC} 0 {line.split(' ')[2]}" for line in kept]
                    (log_dir / checkpoint).write_text("\n".join(["0", str(len(renamed)), *renamed]) + "\n")
            target = rng.choice(_targets(folder, log_dir))
            data = bytearray(target.read_bytes())
            spans = batch_spans(bytes(data)) if target.suffix == ".log" else []
            mutated, first_changed, description = _mutate(data, rng, spans)
            target.write_bytes(bytes(mutated))
            state, batches = references[source]
            mutation = f"{source.name}/{target.name}: {description}"
            # A .log cut exactly at a batch boundary is a valid, shorter log: no reader can tell (Kafka
            # neither); what survived is read exactly, so a differing result is "shortened", not wrong.
            clean_cut = (target.suffix == ".log" and description.startswith("truncate")
                         and (first_changed == 0 or first_changed in {end for _, end in spans}))
            for reader in readers:
                outcome, detail = _run_reader(reader, case_dir, target, state, batches, first_changed, timeout_s)
                if clean_cut and outcome == "wrong":
                    outcome = "shortened"
                report.add(CaseResult(case, reader, outcome, mutation, detail))
            report.cases += 1
            shutil.rmtree(case_dir, ignore_errors=True)
    finally:
        quiet.setLevel(level)
        shutil.rmtree(work_root, ignore_errors=True)
    return report


def main(argv: list[str] | None = None) -> int:
    """Command line: build our corpus (or use ``--corpus LOG_DIR``), run cases, print the figures."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=int, default=1000, help="mutated folders to try (default 1000)")
    parser.add_argument("--seed", type=int, default=int(time.time()), help="seed (default: the time)")
    parser.add_argument("--corpus", type=Path, help="a log dir of partition folders (default: build ours)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="fuzz-corpus-") as tmp:
        corpus = args.corpus
        if corpus is None:
            corpus = Path(tmp)
            build_corpus(corpus, seed=args.seed)
        started = time.monotonic()
        report = run_cases(corpus, args.cases, seed=args.seed)
        elapsed = time.monotonic() - started
    print(f"{report.cases} cases x {len(READERS)} readers, seed {args.seed}, {elapsed:.1f} s "
          f"(python {sys.version.split()[0]}, {os.cpu_count()} cpus)")
    print(report.table())
    for failure in report.failures[:50]:
        print(f"FAIL case {failure.case} {failure.reader} {failure.outcome}: {failure.mutation} -- {failure.detail}")
    return 1 if report.failures else 0


if __name__ == "__main__":
    sys.exit(main())
