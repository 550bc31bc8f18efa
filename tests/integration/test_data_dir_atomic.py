"""One writer per data dir and atomic restores, against a real broker (issue 21, deliverables 4 and 5).

* ``restore --from-log-dir --overwrite`` of a live broker's log dir, over a data dir holding an
  earlier restore, is stopped with SIGINT, SIGTERM or SIGKILL at random moments: ``export`` then
  serves the earlier complete state (or the new one, when the restore had finished) or refuses
  with exit 2 - never part of a restore - and a rerun equals a read_committed consumer;
* a second writer (``restore --overwrite``, ``run``, ``compact`` beside a running ``run``; many
  ``run`` started at once) fails at once with one line naming the holder, and what it would have
  written (``topic-configs/<topic>.json``, a staging folder) is not written; readers meanwhile
  never wait.
"""

from __future__ import annotations

import base64
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from confluent_kafka import Producer

from materializer.cli import main
from materializer.datadir.layout import topic_config_path, topic_status_path
from materializer.datadir.lock import DataDirLock

from .broker_reads import latest_per_partition_key, read_topic

pytestmark = pytest.mark.broker

PARTITIONS = 3
_CLI = [sys.executable, "-m", "materializer"]
_STATE: dict[str, object] = {}


def _produce(bootstrap: str, topic: str, round_number: int, records: int) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 20,
                         "batch.size": 256 * 1024, "compression.type": "none"})
    rng = random.Random(round_number)
    for n in range(records):
        key = b"key-%06d" % rng.randrange(records // 3)
        value = None if n % 17 == 5 else b"round-%d-%d-" % (round_number, n) + rng.randbytes(60)
        while True:
            try:
                producer.produce(topic, key=key, value=value, partition=n % PARTITIONS)
                break
            except BufferError:
                producer.poll(0.05)
    assert producer.flush(60) == 0


def _export(directory: Path, topic: str) -> tuple[int, str, dict[tuple[int, bytes], bytes]]:
    """``export`` (exit status, stderr without the age line a successful export ends it with,
    {(partition, key): value})."""
    result = CliRunner().invoke(main, ["export", "--data-dir", str(directory), "--topic", topic, "--key-format",
                                       "bytes", "--value-format", "bytes"])
    rows = [json.loads(line) for line in result.stdout.splitlines()] if result.exit_code == 0 else []
    stderr = result.stderr
    if result.exit_code == 0:  # how old the export is: as of the run's lease, or unknown after a restore
        *before, age = stderr.splitlines(keepends=True)
        assert age.startswith(f"topic {topic!r} in {directory}: "), stderr
        stderr = "".join(before)
    return result.exit_code, stderr, {(r["partition"], base64.b64decode(r["key_b64"])):
                                      base64.b64decode(r["value_b64"]) for r in rows}


def _restore(log_dir: Path, topic: str, directory: Path) -> list[str]:
    return [*_CLI, "restore", "--from-log-dir", str(log_dir), "--topic", topic, "--data-dir", str(directory),
            "--overwrite", "--no-progress"]


@pytest.fixture
def history(kafka_broker, create_topic, tmp_path_factory):
    """A topic restored once into a template data dir (the earlier state), then grown on the broker
    (the new state): (topic, template dir, earlier state, new state, seconds one restore takes)."""
    if "history" not in _STATE:
        bootstrap = kafka_broker.bootstrap_servers
        topic = create_topic("atomic-restore", PARTITIONS, {"retention.ms": "-1", "segment.bytes": "4194304"})
        _produce(bootstrap, topic, 1, 40_000)
        template = tmp_path_factory.mktemp("atomic") / "template"
        done = subprocess.run(_restore(kafka_broker.log_dirs, topic, template), capture_output=True, text=True,
                              timeout=300)
        assert done.returncode == 0, done.stderr
        earlier = latest_per_partition_key(read_topic(bootstrap, topic, PARTITIONS))
        _produce(bootstrap, topic, 2, 80_000)
        new = latest_per_partition_key(read_topic(bootstrap, topic, PARTITIONS))
        probe = template.parent / "probe"
        started = time.monotonic()
        done = subprocess.run(_restore(kafka_broker.log_dirs, topic, probe), capture_output=True, text=True,
                              timeout=300)
        seconds = time.monotonic() - started
        assert done.returncode == 0, done.stderr
        assert _export(probe, topic)[2] == new
        shutil.rmtree(probe)
        _STATE["history"] = (topic, template, earlier, new, seconds)
    return _STATE["history"]


def test_restore_stopped_at_random_moments_leaves_the_earlier_state_or_a_refusal(kafka_broker, history, tmp_path):
    topic, template, earlier, new, seconds = history
    assert _export(template, topic) == (0, "", earlier) and earlier != new
    seed = int(os.environ.get("ATOMIC_RESTORE_SEED", "20261124"))
    rng = random.Random(seed)
    outcomes = []
    trials = [signal.SIGINT, signal.SIGTERM, signal.SIGKILL] * 2 + [None]  # None: SIGKILL once the swap begins
    for trial, chosen in enumerate(trials):
        directory = tmp_path / f"trial-{trial}"
        shutil.copytree(template, directory)
        signum = signal.SIGKILL if chosen is None else chosen
        # the command's own start included; some may finish. ``seconds`` is the fastest restore seen so
        # far: one timed on a busy machine would let most signals arrive after the end.
        delay = rng.uniform(0.3, seconds * 1.15)
        process = subprocess.Popen(_restore(kafka_broker.log_dirs, topic, directory), stdout=subprocess.DEVNULL,
                                   stderr=subprocess.PIPE, text=True)
        if chosen is None:
            started = time.monotonic()
            while not list(directory.glob(".staging-*/swap-intent.json")) and process.poll() is None:
                assert time.monotonic() - started < 120
            delay = time.monotonic() - started
        else:
            time.sleep(delay)
        process.send_signal(signum)
        _, stderr = process.communicate(timeout=120)
        status, refusal, state = _export(directory, topic)
        name = signal.Signals(signum).name
        outcome = (name, round(delay, 2), process.returncode, status,
                   "new" if state == new else "earlier" if state == earlier else f"{len(state)} keys")
        outcomes.append(outcome)
        if process.returncode == 0:  # done before the signal
            assert (status, state == new) == (0, True), outcome
        elif signum == signal.SIGKILL:
            assert process.returncode == -signal.SIGKILL, (outcome, stderr)
            if status == 2:  # killed in the swap: refused until the next writer finishes it
                assert refusal.count("\n") == 1 and "is incomplete" in refusal and "finishes the swap" in refusal
            else:
                assert status == 0 and state in (earlier, new), outcome
        else:
            assert process.returncode == 128 + signum, (outcome, stderr)
            # one error line, last (the WARNING lines before it are the restore's own: a live broker's
            # preallocated active index is rebuilt)
            lines = stderr.splitlines()
            assert [line for line in lines if "error" in line.lower() or "Traceback" in line or "Aborted" in line] \
                == lines[-1:] and lines[-1].startswith(f"error: interrupted ({name})"), stderr
            assert status == 0 and state in (earlier, new), outcome  # a swap under way is finished first
            assert not list(directory.glob(".staging-*")), outcome
        again_started = time.monotonic()
        again = subprocess.run(_restore(kafka_broker.log_dirs, topic, directory), capture_output=True, text=True,
                               timeout=300)
        assert again.returncode == 0, again.stderr
        seconds = min(seconds, time.monotonic() - again_started)
        assert _export(directory, topic) == (0, "", new), outcome
        assert not list(directory.glob(".staging-*"))
        shutil.rmtree(directory)
    print(f"\nseed {seed}, one restore {seconds:.2f} s: {outcomes}")
    assert sum(1 for o in outcomes if o[2] != 0) >= 4  # most signals landed mid-restore


def _start_run(bootstrap: str, topic: str, directory: Path) -> subprocess.Popen:
    return subprocess.Popen([*_CLI, "run", "--bootstrap-servers", bootstrap, "--topic", topic, "--data-dir",
                             str(directory), "--no-progress", "--cleaner-threads", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for(condition, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out after {timeout_s} s waiting for {what}"
        time.sleep(0.2)


def test_a_second_writer_beside_a_running_run_fails_at_once_and_writes_nothing(kafka_broker, history, tmp_path):
    topic, template, _, new, _ = history
    directory = tmp_path / "data"
    shutil.copytree(template, directory)
    run = _start_run(kafka_broker.bootstrap_servers, topic, directory)
    try:
        _wait_for(lambda: _export(directory, topic) == (0, "", new), 120, "the run to catch up")  # readers never wait
        config_path, marker = topic_config_path(directory, topic), topic_status_path(directory, topic)
        before = {path: (path.read_bytes(), path.stat().st_mtime_ns) for path in (config_path, marker)}
        holder = f"is being written by `materializer run` (pid {run.pid}, since "
        for command in (_restore(kafka_broker.log_dirs, topic, directory),
                        [*_CLI, "run", "--bootstrap-servers", kafka_broker.bootstrap_servers, "--topic", topic,
                         "--data-dir", str(directory), "--until-caught-up", "--config", "segment.bytes=123456"],
                        [*_CLI, "compact", "--data-dir", str(directory), "--topic", topic]):
            started = time.monotonic()
            refused = subprocess.run(command, capture_output=True, text=True, timeout=60)
            assert time.monotonic() - started < 10, command
            assert refused.returncode == 2 and refused.stderr.count("\n") == 1, (command, refused.stderr)
            assert refused.stderr.startswith(f"error: {directory} {holder}"), refused.stderr
            assert {path: (path.read_bytes(), path.stat().st_mtime_ns) for path in before} == before, command
            assert not list(directory.glob(".staging-*"))
        assert _export(directory, topic) == (0, "", new)
    finally:
        run.send_signal(signal.SIGTERM)
        out, err = run.communicate(timeout=60)
    assert run.returncode == 0, err
    assert f"{topic}: fetched" in out


def test_run_refused_while_compact_holds_the_data_dir(kafka_broker, history, tmp_path):
    topic, template, earlier, _, _ = history
    directory = tmp_path / "data"
    shutil.copytree(template, directory)
    config_before = topic_config_path(directory, topic).read_bytes()
    with DataDirLock.acquire(directory, "compact"):
        refused = subprocess.run([*_CLI, "run", "--bootstrap-servers", kafka_broker.bootstrap_servers, "--topic",
                                  topic, "--data-dir", str(directory), "--until-caught-up",
                                  "--config", "segment.bytes=123456"], capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1, refused.stderr
    assert refused.stderr.startswith(f"error: {directory} is being written by `materializer compact` "
                                     f"(pid {os.getpid()}, since ")
    assert topic_config_path(directory, topic).read_bytes() == config_before
    assert _export(directory, topic) == (0, "", earlier)


def test_simultaneous_starts_name_the_lock(kafka_broker, history, tmp_path):
    topic, _, _, new, _ = history
    directory = tmp_path / "data"
    runs = [subprocess.Popen([*_CLI, "run", "--bootstrap-servers", kafka_broker.bootstrap_servers, "--topic", topic,
                              "--data-dir", str(directory), "--until-caught-up", "--no-progress",
                              "--cleaner-threads", "0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for _ in range(8)]
    results = [(run.pid, run.returncode, err) for run in runs for _, err in [run.communicate(timeout=300)]]
    succeeded = [r for r in results if r[1] == 0]
    refused = [r for r in results if r[1] != 0]
    assert succeeded, results
    for pid, status, err in refused:
        assert status == 2 and err.count("\n") == 1, (pid, status, err)
        assert err.startswith(f"error: {directory} is being written by `materializer run` (pid "), err
    assert _export(directory, topic) == (0, "", new)
    print(f"\n{len(succeeded)} of {len(results)} simultaneous runs took the data dir; the others named the holder")


def test_run_marks_a_new_or_rebuilt_store_incomplete_until_it_has_caught_up(kafka_broker, history, tmp_path):
    from materializer import Materializer, MaterializerOptions
    from materializer.datadir.layout import state_dir
    from materializer.datadir.markers import require_complete, topic_status
    from materializer.storage.errors import IncompleteDataDirError

    topic, template, _, new, _ = history
    options = MaterializerOptions(progress=False, cleaner_threads=0)
    fresh = tmp_path / "fresh"
    with Materializer(kafka_broker.bootstrap_servers, topic, fresh, options=options) as materializer:
        with pytest.raises(IncompleteDataDirError, match="`materializer run` loading a new state store .* it is "
                                                         r"still in progress: `materializer run` \(pid "):
            require_complete(fresh, topic)
        status, stderr, _ = _export(fresh, topic)
        assert status == 2 and stderr.count("\n") == 1 and "wait until `materializer run` has caught up" in stderr
        require_complete(fresh, topic, needs_store=False)  # kafkalog may read the logs meanwhile
        materializer.run(until_caught_up=True)
        assert topic_status(fresh, topic).state == "complete"
    assert _export(fresh, topic) == (0, "", new)

    rebuilt = tmp_path / "rebuilt"
    shutil.copytree(fresh, rebuilt)
    shutil.rmtree(state_dir(rebuilt, topic))
    with Materializer(kafka_broker.bootstrap_servers, topic, rebuilt, options=options) as materializer:
        assert materializer.stats.store_rebuilt
        assert "rebuilding the state store from the local log" in (topic_status(rebuilt, topic).operation or "")
        materializer.run(until_caught_up=True)
    assert _export(rebuilt, topic) == (0, "", new)
