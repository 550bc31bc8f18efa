"""The seeded mutation fuzzer over our own segments, run on every CI (issue 7).

Every codec, transactional batches with COMMIT/ABORT markers, tombstones, several segments; each
case mutates one file (a segment, an index, a checkpoint) and runs dump-log, strict and repair
restore, a store rebuild and LogLoader recovery on it (see ``tests/fuzz_harness.py`` for the
oracle). A case may end in equal data, a clear error naming the file, or a recovery that keeps every
intact batch; a traceback, silently wrong data, a lost intact batch or a hang fails the test.

``FUZZ_CASES`` (default 500) and ``FUZZ_SEED`` (default 20261122, fixed so that CI is
reproducible; ``FUZZ_SEED=random`` draws a new one, printed on failure) choose the run; ``python -m
tests.fuzz_harness --cases N --seed S`` runs any number outside pytest. Every seed that found a bug
stays in ``REGRESSION_SEEDS``.
"""

from __future__ import annotations

import os
import random

import pytest

from tests.fuzz_harness import build_corpus, run_cases


#: (seed, case count) of runs that found a bug, replayed on every run: .txnindex entries and a
#: segment cut at load (438200162), a damaged last segment deleting every segment (1050630248).
REGRESSION_SEEDS = [(438200162, 300), (1050630248, 340)]


def _seed() -> int:
    chosen = os.environ.get("FUZZ_SEED", "20261122")
    return random.SystemRandom().randrange(2**31) if chosen == "random" else int(chosen)


@pytest.mark.parametrize(("seed", "cases"), REGRESSION_SEEDS, ids=[str(s) for s, _ in REGRESSION_SEEDS])
def test_seeds_that_found_bugs(tmp_path, seed, cases):
    corpus = tmp_path / "corpus"
    build_corpus(corpus, seed=seed)
    report = run_cases(corpus, cases, seed=seed, work_dir=tmp_path, first_case=cases - 60)
    assert not report.failures, "\n".join(f"case {f.case} {f.reader} {f.outcome}: {f.mutation} -- {f.detail}"
                                          for f in report.failures[:20])


def test_mutated_segments_never_give_silently_wrong_data(tmp_path):
    cases = int(os.environ.get("FUZZ_CASES", "500"))
    seed = _seed()
    corpus = tmp_path / "corpus"
    build_corpus(corpus, seed=seed)
    report = run_cases(corpus, cases, seed=seed, work_dir=tmp_path)
    print(f"\nfuzz: {report.cases} cases, seed {seed}\n{report.table()}")
    assert report.cases == cases
    failures = "\n".join(f"case {f.case} {f.reader} {f.outcome}: {f.mutation} -- {f.detail}" for f in report.failures[:20])
    assert not report.failures, f"seed {seed} (replay with FUZZ_SEED={seed}):\n{failures}"
