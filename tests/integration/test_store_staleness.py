"""Readers say how old the store is, and refuse what is too old, against a real broker (issue 37, item 5).

A continuous ``materializer run`` renews the store's lease (``DIR/topic-lease/<topic>.json``) only
while it is current (:mod:`materializer.datadir.lease`). Each test makes the run stop being current in one
of the ways the issue found silent (a full disk, a deleted topic, a frozen group member) and checks
what ``export``, ``get`` and views then say: the age on stderr / ``--metadata``, a refusal past
``--max-staleness-ms``, a frozen member's partitions refused past the group's session timeout and
served again once it renews. Every wait is for a condition, with a deadline.
"""

from __future__ import annotations

import datetime
import json
import os
import re
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Producer

from materializer.adapters.errors import PartitionNotAssignedError
from materializer.datadir.lease import StaleStoreError, read_lease, wall_ms
from materializer.storage.errors import IncompleteDataDirError
from materializer.view import MaterializedView
from tests.tmpfs import fill, mounted_tmpfs

from .background_run import wait_until
from .leader_changes import delete_topic
from .test_group_materializer import _group

pytestmark = pytest.mark.broker

KEYS = 60
SETTLE_S = 90.0  # a generous deadline on a loaded 2-core machine (never a timing assertion)
_AS_OF = re.compile(r"as of (\S+) \((\d+) ms ago, per the lease of `materializer run`")


def _write(bootstrap: str, topic: str, round_: int, pad: int = 0) -> dict[str, str]:
    """Write every key ``k0``..``k59`` once with the value ``k<i>:<round_>`` (and ``pad`` spaces);
    return key -> value."""
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5,
                         "partitioner": "murmur2_random"})  # Java's placement: how a member routes keys
    written = {}
    for i in range(KEYS):
        key, value = f"k{i}", f"k{i}:{round_}" + " " * pad
        producer.produce(topic, key=key.encode(), value=value.encode())
        written[key] = value
    assert producer.flush(30) == 0
    return written


def _materializer(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "materializer", *args], capture_output=True, text=True, timeout=120)


def _export(data_dir: Path, topic: str, *extra: str) -> tuple[int, str, dict[str, str]]:
    """``export`` (exit status, stderr, key -> value)."""
    result = _materializer("export", "--data-dir", str(data_dir), "--topic", topic, "--key-format", "str",
                           "--value-format", "str", *extra)
    rows = [json.loads(line) for line in result.stdout.splitlines()] if result.returncode == 0 else []
    return result.returncode, result.stderr, {row["key"]: row["value"] for row in rows}


def _get(data_dir: Path, topic: str, key: str, *extra: str) -> subprocess.CompletedProcess:
    return _materializer("get", "--data-dir", str(data_dir), "--topic", topic, "--key-format", "str",
                         "--value-format", "str", *extra, key)


def _run(bootstrap: str, topic: str, data_dir: Path, *extra: str) -> subprocess.Popen:
    """A continuous ``run`` renewing its lease every 200 ms (unless ``extra`` says otherwise)."""
    return subprocess.Popen([sys.executable, "-m", "materializer", "run", "--bootstrap-servers", bootstrap,
                             "--topic", topic, "--data-dir", str(data_dir), "--no-progress",
                             "--lease-interval-ms", "200", *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _stop(run: subprocess.Popen) -> tuple[int, str]:
    """SIGCONT and SIGTERM ``run`` if it still runs; its exit status and stderr."""
    if run.poll() is None:
        run.send_signal(signal.SIGCONT)
        run.terminate()
    try:
        _, stderr = run.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        run.kill()
        _, stderr = run.communicate()
    return run.returncode, stderr


def _as_of_ms(stderr: str) -> tuple[int, int]:
    """(as of, ms since the epoch; age, ms) from a reader's age line."""
    found = _AS_OF.search(stderr)
    assert found is not None, stderr
    return round(datetime.datetime.fromisoformat(found.group(1)).timestamp() * 1000), int(found.group(2))


def _serves(view: MaterializedView, key: str, value: str) -> bool:
    """``view``, caught up, gives ``value`` for ``key`` (a refusal: not yet)."""
    try:
        view.catch_up()
        return view.get(key) == value
    except (PartitionNotAssignedError, IncompleteDataDirError):
        return False


def test_a_run_stuck_on_a_full_disk_leaves_an_age_that_readers_report_and_bound(kafka_broker, create_topic,
                                                                                tmp_path):
    """Seen: after a failed catch-up on a full disk, `export` exited 0 with an empty stderr while most
    of its values were older than the broker's. Now the lease stops when the run stops being
    current: readers print the age (as of a time before the values they miss were produced) and
    refuse past --max-staleness-ms; the run's own error names the file (no traceback)."""
    topic = create_topic(partitions=2, config={"cleanup.policy": "compact"})
    bootstrap = kafka_broker.bootstrap_servers
    first = _write(bootstrap, topic, 0)
    with mounted_tmpfs(tmp_path, "8m") as disk:
        data_dir = disk / "data"
        run = _run(bootstrap, topic, data_dir, "--config", "segment.bytes=16384", "--config",
                   "segment.index.bytes=65536", "--cleaner-backoff-ms", "100")
        try:
            # the store holds the first round a moment before the lease says the run is current
            exported = wait_until(lambda: (e := _export(data_dir, topic))[0] == 0 and e[2] == first
                                  and _AS_OF.search(e[1]) is not None and e,
                                  SETTLE_S, "the run to catch up with the first round and say so")
            _, age_ms = _as_of_ms(exported[1])
            assert age_ms < SETTLE_S * 1000, exported[1]
            fill(disk, 0)
            produced_ms = wall_ms()
            second = _write(bootstrap, topic, 1, pad=4096)  # every value changes: 240 KiB that do not fit
            run.wait(timeout=SETTLE_S)  # it fails on the first write that does not fit
        finally:
            status, stderr = _stop(run)
        # the run's failure: one error line naming the file under the full disk, no traceback
        assert status == 2, stderr[-3000:]
        assert "Traceback" not in stderr and "Logging error" not in stderr, stderr[-3000:]
        last = stderr.strip().splitlines()[-1]
        assert last.startswith("error: ") and str(disk) in last, stderr[-3000:]

        # the readers: the store is the first round's (older than the broker's), and they say how old
        status, stderr, state = _export(data_dir, topic)
        assert status == 0 and state == first != second, stderr
        as_of, _ = _as_of_ms(stderr)
        assert as_of <= produced_ms, (stderr, produced_ms)  # as of a time before the second round existed
        get = _get(data_dir, topic, "k7", "--metadata")
        assert get.returncode == 0 and get.stdout == "k7:0\n" and _as_of_ms(get.stderr)[0] == as_of, get.stderr

        # bounded: refused once older than the bound (the age grows while nothing renews the lease)
        refused = wait_until(lambda: (e := _export(data_dir, topic, "--max-staleness-ms", "1500"))[0] == 2 and e,
                             SETTLE_S, "export to refuse a store older than 1500 ms")
        lines = refused[1].strip().splitlines()
        assert len(lines) == 1 and re.match(rf"error: topic {topic!r} in {re.escape(str(data_dir))} is \d+ ms old, "
                                            r"more than --max-staleness-ms 1500: as of ", lines[0]), refused[1]
        get = _get(data_dir, topic, "k7", "--max-staleness-ms", "1500")
        assert get.returncode == 2 and "more than --max-staleness-ms 1500" in get.stderr, get.stderr
        assert get.stdout == ""
        status, stderr, state = _export(data_dir, topic, "--max-staleness-ms", str(3_600_000))
        assert status == 0 and state == first, stderr
        with MaterializedView.open(data_dir, topic, key_format="str", value_format="str") as view:
            assert view.staleness.as_of_ms == as_of and view.staleness.age_ms >= 1500
        with MaterializedView.open(data_dir, topic, key_format="str", value_format="str",
                                   max_staleness_ms=1500) as view:
            with pytest.raises(StaleStoreError, match="more than max_staleness_ms 1500"):
                view.get("k7")


def test_a_deleted_topics_data_dir_says_so(kafka_broker, create_topic, tmp_path):
    """Seen: a deleted topic's last state was exported with exit 0 and nothing said. Now the run
    records the deletion in the lease and stops renewing it: export and get say the topic was
    deleted (the state is its last one), and the age grows past any bound."""
    topic = create_topic(partitions=2)
    bootstrap = kafka_broker.bootstrap_servers
    written = _write(bootstrap, topic, 0)
    data_dir = tmp_path / "data"
    run = _run(bootstrap, topic, data_dir)
    try:
        wait_until(lambda: (e := _export(data_dir, topic))[0] == 0 and e[2] == written, SETTLE_S,
                   "the run to catch up")
        delete_topic(bootstrap, topic)
        status, stderr, state = wait_until(
            lambda: (e := _export(data_dir, topic))[0] == 0 and "deleted" in e[1] and e, SETTLE_S,
            "export to say the topic was deleted")
        assert state == written  # its last state, said to be so
        assert "the topic was deleted in the cluster (found at " in stderr and "this is its last state" in stderr
        lease = read_lease(data_dir, topic)
        assert lease is not None and lease.topic_deleted_ms is not None
        get = _get(data_dir, topic, "k3")
        assert get.returncode == 0 and get.stdout == "k3:0\n" and "the topic was deleted in the cluster" in get.stderr
        wait_until(lambda: _export(data_dir, topic, "--max-staleness-ms", "1000")[0] == 2, SETTLE_S,
                   "export to refuse the deleted topic's store once older than 1000 ms")
    finally:
        status, stderr = _stop(run)
    assert status == 0, stderr[-3000:]


@pytest.mark.parametrize("protocol", ["consumer", "classic"])
def test_a_frozen_group_member_is_refused_past_its_session_timeout_and_served_once_it_renews(
        kafka_broker, kafka_admin, create_topic, tmp_path, protocol):
    """Seen: a member frozen (SIGSTOP) past the session timeout still holds its data dir's lock, so
    its readers served the partitions the group had moved. Now it stops renewing its lease, and
    readers refuse its partitions once the lease is older than the group's session timeout (the
    message says so: 6 s, a KIP-848 group's own config, read by the member at start, or the classic
    member's option); once resumed, it rejoins, renews, and is served again."""
    topic = create_topic(partitions=2)
    bootstrap = kafka_broker.bootstrap_servers
    written = _write(bootstrap, topic, 0)
    data_dir = tmp_path / "member"
    if protocol == "consumer":  # a group config of 6 s; the member's own option stays at its 45 s default
        group, timeout = _group(kafka_admin), []
    else:
        group, timeout = f"lease-{uuid.uuid4().hex[:10]}", ["--group-session-timeout-ms", "6000"]
    member = _run(bootstrap, topic, data_dir, "--group-id", group, "--group-protocol", protocol, *timeout,
                  "--lease-interval-ms", "500")
    lapsed = re.compile(r"has not renewed its lease since \S+, longer than the group's session timeout \(6000 ms\)")
    try:
        served = wait_until(lambda: (g := _get(data_dir, topic, "k5")).returncode == 0 and g, SETTLE_S,
                            "the member to serve k5")
        assert served.stdout == f"{written['k5']}\n"
        held = MaterializedView.open(data_dir, topic, key_format="str", value_format="str")  # never caught up
        following = MaterializedView.open(data_dir, topic, key_format="str", value_format="str")
        assert held.get("k5") == following.get("k5") == written["k5"]
        os.kill(member.pid, signal.SIGSTOP)
        try:
            refused = wait_until(lambda: (g := _get(data_dir, topic, "k5")).returncode == 2 and g, SETTLE_S,
                                 "get to refuse the frozen member's partition")
            assert refused.stdout == "" and lapsed.search(refused.stderr), refused.stderr
            status, stderr, _ = _export(data_dir, topic)
            assert status == 2 and lapsed.search(stderr), stderr
            with pytest.raises(PartitionNotAssignedError, match=lapsed.pattern):
                held.get("k5")  # what it holds is as old: refused without a catch-up
            following.catch_up()
            with pytest.raises(PartitionNotAssignedError, match=lapsed.pattern):
                following.get("k5")
            with MaterializedView.open(data_dir, topic, key_format="str", value_format="str") as fresh:
                with pytest.raises(PartitionNotAssignedError, match=lapsed.pattern):
                    fresh.get("k5")
        finally:
            os.kill(member.pid, signal.SIGCONT)
        again = wait_until(lambda: (g := _get(data_dir, topic, "k5")).returncode == 0 and g, SETTLE_S,
                           "the resumed member to be served again")
        assert again.stdout == f"{written['k5']}\n"
        wait_until(lambda: _serves(following, "k5", written["k5"]), SETTLE_S, "the view to serve the resumed member")
        held.close()
        following.close()
    finally:
        status, stderr = _stop(member)
    assert status == 0, stderr[-3000:]
