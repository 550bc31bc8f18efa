"""The operations fault campaign in CI (issue 21, deliverable 10): one test per scenario of ``tests/ops_campaign.py``.

Each test runs a few short trials of its scenario against a real broker (the session's, or a
dedicated one the scenario starts, stops, cuts or pauses) through the CLI as subprocesses, and
asserts that every trial ended as its scenario expects (``tests.ops_campaign.EXPECTED_OUTCOMES``:
``exact`` for each scenario here): every command ended exact (``export`` equals a read_committed
consumer of the broker), what was intact before an interruption comes back exact, and a refusal
shows only where a step requires it (the second writer, a rerun of ``restore`` without
``--overwrite`` on a data dir that holds the topic). A clear refusal anywhere else fails the test as
a silently wrong answer, a crash or a hang does; so does an uninterrupted calibration run that is
not exact. The outcome counts are printed. On failure the message holds the summary table and
every failing trial's steps.

Variants cycle with the round number, so the rounds below cover, per scenario: topic re-created
between runs (replica path), while a continuous run runs (consumer path) and between runs
(consumer path); the leader's tail cut and diverged (both paths); ``delete_records`` to the high
watermark past the local end (replica path, nothing after it), inside a batch before a fresh run
(replica path, then a rebuild), and past the local end with records after it (consumer path);
signals during ``restore --from-log-dir``, four ``run`` restarts with the fetch path switched
around an open transaction, ``restore --from-snapshot`` and ``compact``; ``run`` + ``run``,
``run`` + ``restore --overwrite`` and ``run`` + ``compact``; readers on a read-only mount; the
broker SIGSTOPped for a minute then restarted; the broker restarted three times under a continuous
``run`` with a group (a member joining and leaving around the restarts) and without. The seed is fixed (``OPS_CAMPAIGN_SEED``;
``random`` draws one, printed in the failure message); longer campaigns: ``python -m
tests.ops_campaign --trials N``.
"""

from __future__ import annotations

import os
import random

import pytest

from tests.ops_campaign import OUTCOMES, expected_outcomes, failures, run_scenario, summary_table

pytestmark = pytest.mark.broker

_CHOSEN = os.environ.get("OPS_CAMPAIGN_SEED", "20261124")
SEED = random.SystemRandom().randrange(2**31) if _CHOSEN == "random" else int(_CHOSEN)


def _campaign(name: str, broker, seed: int, rounds: int, workdir) -> None:
    trials = run_scenario(name, broker, seed=seed, rounds=rounds, workdir=workdir)
    counts = {outcome: sum(t.outcome == outcome for t in trials) for outcome in OUTCOMES}
    print(f"\n{summary_table(trials)}\n" + "\n".join(t.line() for t in trials)
          + f"\n{name}: " + ", ".join(f"{n} {outcome}" for outcome, n in counts.items() if n))
    assert len(trials) >= rounds, f"{name}: {len(trials)} trials for {rounds} rounds"
    expected = expected_outcomes(name)
    bad = [t for t in trials if t.outcome not in expected]
    assert not bad, f"{name}, seed {seed}: {len(bad)} of {len(trials)} trials not {' or '.join(sorted(expected))}\n" \
                    f"{summary_table(trials)}\n{failures(trials)}"


@pytest.mark.parametrize("seed", [SEED])
def test_topic_recreated(kafka_broker, tmp_path, seed):
    _campaign("topic-recreated", kafka_broker, seed, 3, tmp_path)


@pytest.mark.parametrize("seed", [SEED])
def test_leader_tail_lost_with_divergent_writes(kafka_broker, tmp_path, seed):
    _campaign("leader-divergence", kafka_broker, seed, 1, tmp_path)


@pytest.mark.parametrize("seed", [SEED])
def test_log_start_offset_past_the_local_end(kafka_broker, tmp_path, seed):
    _campaign("log-start-past-local-end", kafka_broker, seed, 3, tmp_path)


@pytest.mark.parametrize("seed", [SEED])
def test_signals_during_every_writing_command(kafka_broker, tmp_path, seed):
    _campaign("interrupted-writers", kafka_broker, seed, 4, tmp_path)


@pytest.mark.parametrize("seed", [SEED])
def test_two_writers_on_one_data_dir(kafka_broker, tmp_path, seed):
    _campaign("two-writers", kafka_broker, seed, 3, tmp_path)


@pytest.mark.parametrize("seed", [SEED])
def test_readers_on_a_read_only_mount(kafka_broker, tmp_path, seed):
    _campaign("read-only-readers", kafka_broker, seed, 1, tmp_path)


@pytest.mark.parametrize("seed", [SEED])
def test_broker_paused_for_a_minute_then_restarted(kafka_broker, tmp_path, seed):
    _campaign("broker-paused", kafka_broker, seed, 1, tmp_path)


@pytest.mark.parametrize("seed", [SEED])
def test_broker_restarted_three_times_with_and_without_a_group(kafka_broker, tmp_path, seed):
    _campaign("broker-restarts", kafka_broker, seed, 2, tmp_path)


# issue 37: the log start offset moved under a running member; a long-lived view across restarts

@pytest.mark.parametrize("seed", [SEED])
def test_log_start_offset_moved_under_a_running_member(kafka_broker, tmp_path, seed):
    _campaign("log-start-while-running", kafka_broker, seed, 4, tmp_path)


@pytest.mark.parametrize("seed", [SEED])
def test_a_long_lived_view_across_restarts_of_run(kafka_broker, tmp_path, seed):
    _campaign("long-lived-view", kafka_broker, seed, 2, tmp_path)


@pytest.mark.parametrize("seed", [SEED])
def test_partitions_added_under_a_running_member(kafka_broker, tmp_path, seed):
    _campaign("partitions-added", kafka_broker, seed, 2, tmp_path)
