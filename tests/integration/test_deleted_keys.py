"""Issues 39 and 42: a deleted key says where its tombstone is while the local log still shows it,
against the session's real broker.

One compacted topic: ``k`` written then deleted (and written again later), ``g`` written then
deleted, ``filler`` written two segments of record time later (the local log rolls before it, so
the tombstones are in a segment the cleaner may clean). The offsets asserted are those the broker
gave the producer's delivery reports. The query server (404 with ``deleted``, in a GET and a batch)
and ``materializer get`` (exit 1, "deleted at offset X") answer while the run holds the data dir,
and after a first ``materializer compact`` round (which keeps tombstones: it sets their delete
horizon); ``k`` written again is live; after the second round, past ``delete.retention.ms``,
removed the tombstones, both say plain "not found", as for a key never written. Waits poll a
condition with a deadline.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
from confluent_kafka import Producer

from materializer.config import MaterializerOptions
from materializer.materializer import Materializer
from materializer.serve import QueryServer, create_app, source_of
from materializer.storage.read_committed import read_committed

from .background_run import wait_until
from .test_serve import Http

pytestmark = pytest.mark.broker

DEADLINE_S = 90.0  # generous on a loaded 2-core machine; never a timing assertion
SEGMENT_MS = 60_000
DELETE_RETENTION_MS = 1_000


def _produce(bootstrap: str, topic: str, records: list[tuple[bytes, bytes | None, int]]) -> dict[bytes, list[int]]:
    """Produce ``(key, value, timestamp ms)`` in order, one flush each (one batch each); returns
    key -> the offsets the broker's delivery reports gave, in order."""
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True})
    offsets: dict[bytes, list[int]] = {}

    def delivered(error, message) -> None:
        assert error is None, error
        offsets.setdefault(message.key(), []).append(message.offset())

    for key, value, timestamp in records:
        producer.produce(topic, key=key, value=value, timestamp=timestamp, on_delivery=delivered)
        assert producer.flush(30) == 0
    return offsets


def _get(data_dir: Path, topic: str, key: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "materializer", "get", "--data-dir", str(data_dir), "--topic", topic,
                           "--value-format", "str", key], capture_output=True, text=True, timeout=120)


def test_a_deleted_key_says_where_its_tombstone_is_until_the_cleaner_removes_it(kafka_broker, create_topic,
                                                                                  tmp_path) -> None:
    bootstrap = kafka_broker.bootstrap_servers
    # min.compaction.lag.ms: the broker's own cleaner leaves these records alone (record time is
    # within the last hour); the local round below runs at a clock past it
    topic = create_topic(partitions=1, config={"cleanup.policy": "compact", "segment.ms": str(SEGMENT_MS),
                                               "delete.retention.ms": str(DELETE_RETENTION_MS),
                                               "min.compaction.lag.ms": "3600000"})
    t0 = int(time.time() * 1000) - 10 * 60_000
    offsets = _produce(bootstrap, topic, [(b"k", b"v1", t0), (b"k", None, t0 + 1), (b"g", b"x", t0 + 2),
                                          (b"g", None, t0 + 3), (b"filler", b"f", t0 + 2 * SEGMENT_MS)])
    k_tombstone, g_tombstone = offsets[b"k"][1], offsets[b"g"][1]
    data_dir = tmp_path / "data"
    options = MaterializerOptions(progress=False, cleaner_threads=0, poll_timeout_ms=200, value_format="str")

    materializer = Materializer(bootstrap, topic, data_dir, options=options)
    with QueryServer(create_app([source_of(materializer)])) as server:
        http = Http(server.url)
        materializer.run_in_background()
        try:
            wait_until(lambda: http("GET", f"/v1/topics/{topic}/keys/filler")[0] == 200, DEADLINE_S, "caught up")
            status, _, body = http("GET", f"/v1/topics/{topic}/keys/k")
            assert status == 404 and body["absent"] is True, body
            assert body["deleted"] == {"partition": 0, "offset": k_tombstone, "timestamp": t0 + 1}, body
            assert f"tombstone at offset {k_tombstone}" in body["error"]
            status, _, body = http("GET", f"/v1/topics/{topic}/keys/never")
            assert status == 404 and body["absent"] is True and "deleted" not in body, body
            status, _, body = http("POST", f"/v1/topics/{topic}/keys:batch", ["g", "never", "filler"])
            assert [r["status"] for r in body["results"]] == [404, 404, 200], body
            assert body["results"][0]["deleted"]["offset"] == g_tombstone and "deleted" not in body["results"][1]

            # `get` beside the running writer: exit 1 both times, the tombstone's offset for a deleted key
            got = _get(data_dir, topic, "k")
            assert got.returncode == 1 and f"deleted at offset {k_tombstone} (partition 0" in got.stderr, got.stderr
            got = _get(data_dir, topic, "never")
            assert got.returncode == 1 and "not found" in got.stderr and "deleted" not in got.stderr, got.stderr

        finally:
            materializer.close()

    # a cleaner round (the first of two: it removes the values the tombstones replaced and sets the
    # tombstones' delete horizon, KIP-534) at a clock past min.compaction.lag.ms: g's tombstone is
    # still in the (rewritten) log, so still "deleted"
    now_ms = int(time.time() * 1000) + 2 * 3_600_000
    _compact(data_dir, topic, now_ms)
    assert {0, 2} & _offsets_left(data_dir, topic) == set()  # the values the tombstones replaced
    got = _get(data_dir, topic, "g")
    assert got.returncode == 1 and f"deleted at offset {g_tombstone} (partition 0" in got.stderr, got.stderr

    # written again after the delete: live (and new data for the next cleaner round)
    later = t0 + 2 * SEGMENT_MS
    again = _produce(bootstrap, topic, [(b"k", b"v2", later + 1), (b"filler", b"f2", later + 2 * SEGMENT_MS)])[b"k"][0]
    materializer = Materializer(bootstrap, topic, data_dir, options=options)
    with QueryServer(create_app([source_of(materializer)])) as server:
        http = Http(server.url)
        materializer.run_in_background()
        try:
            wait_until(lambda: http("GET", f"/v1/topics/{topic}/keys/k")[0] == 200, DEADLINE_S, "k written again")
            status, _, body = http("GET", f"/v1/topics/{topic}/keys/k")
            assert (body["value"], body["offset"]) == ("v2", again), body
            got = _get(data_dir, topic, "k")
            assert got.returncode == 0 and got.stdout.strip() == "v2", got.stderr
        finally:
            materializer.close()

    # the second round, past the delete horizon (delete.retention.ms): the tombstones are gone
    _compact(data_dir, topic, now_ms + 10 * DELETE_RETENTION_MS)
    assert {k_tombstone, g_tombstone} & _offsets_left(data_dir, topic) == set()  # the premise
    got = _get(data_dir, topic, "g")
    assert got.returncode == 1 and "not found" in got.stderr and "deleted" not in got.stderr, got.stderr
    materializer = Materializer(bootstrap, topic, data_dir, options=options)
    with QueryServer(create_app([source_of(materializer)])) as server:
        http = Http(server.url)
        materializer.run_in_background()
        try:
            wait_until(lambda: http("GET", f"/v1/topics/{topic}/keys/k")[0] == 200, DEADLINE_S, "caught up again")
            status, _, body = http("GET", f"/v1/topics/{topic}/keys/g")
            assert status == 404 and body["absent"] is True and "deleted" not in body, body
        finally:
            materializer.close()


def _compact(data_dir: Path, topic: str, now_ms: int) -> None:
    compacted = subprocess.run([sys.executable, "-m", "materializer", "compact", "--data-dir", str(data_dir),
                                "--topic", topic, "--now-ms", str(now_ms), "--quiet"],
                               capture_output=True, text=True, timeout=120)
    assert compacted.returncode == 0, compacted.stderr


def _offsets_left(data_dir: Path, topic: str) -> set[int]:
    """The offsets of the records the local log holds now (read in place, read-only)."""
    return {r.offset for r in read_committed(data_dir / f"{topic}-0")}
