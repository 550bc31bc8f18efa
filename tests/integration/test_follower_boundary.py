"""Where the broker's truth changes behind the local copy (issue 21): a leader whose log diverged, a
topic deleted and re-created under the same name, offsets deleted on the broker before they were
fetched, a transaction left open across a switch of the fetch path. Each case ends with the store
equal to what a read_committed consumer reads from the broker now, or with one clear error.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from confluent_kafka import Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from materializer import Materializer, MaterializerOptions
from materializer.adapters.replica_fetch import requests as fetch_requests
from materializer.local.kafka_broker import LocalKafkaBroker
from materializer.cli import main
from materializer.storage.leader_epoch_cache import LEADER_EPOCH_CHECKPOINT_FILE
from materializer.storage.partition_metadata import PARTITION_METADATA_FILE, PartitionMetadataFile
from materializer.view import MaterializedView

from .background_run import BackgroundRun, wait_until
from .broker_reads import latest_per_partition_key, read_topic
from .leader_changes import create_topic, cut_leader_tail, delete_topic, leader_epochs, produce_keys

pytestmark = pytest.mark.broker

FETCH_PATHS = ("replica", "consumer")
#: Kafka refuses DeleteRecords on a topic that is only compacted (POLICY_VIOLATION).
DELETABLE = {"cleanup.policy": "compact,delete", "retention.ms": "-1"}


def _run(bootstrap: str, topic: str, data_dir: Path, *extra: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, ["run", "--bootstrap-servers", bootstrap, "--topic", topic, "--data-dir",
                                       str(data_dir), "--until-caught-up", "--no-progress", "--cleaner-threads", "0",
                                       "--timeout", "20", *extra])
    return result.exit_code, result.stdout, result.stderr


def _exported(data_dir: Path, topic: str) -> dict[tuple[int, bytes], bytes]:
    result = CliRunner().invoke(main, ["export", "--data-dir", str(data_dir), "--topic", topic])
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    return {(row["partition"], row["key"].encode()): row["value"].encode() for row in rows}


def _truth(bootstrap: str, topic: str, partitions: int) -> dict[tuple[int, bytes], bytes]:
    return latest_per_partition_key(read_topic(bootstrap, topic, partitions))


def _delete_records(bootstrap: str, topic: str, before_offset: int) -> None:
    """Kafka DeleteRecords on partition 0: its log start offset becomes ``before_offset``."""
    admin = AdminClient({"bootstrap.servers": bootstrap})  # kept alive until the futures complete
    for future in admin.delete_records([TopicPartition(topic, 0, before_offset)]).values():
        future.result(30)


@pytest.fixture(scope="module")
def own_broker(tmp_path_factory):
    """A broker of this module's own, stopped and restarted by the divergence tests."""
    broker = LocalKafkaBroker(tmp_path_factory.mktemp("own-broker"), fast_start=True).start()
    try:
        yield broker
    finally:
        broker.stop()


@pytest.mark.parametrize("fetch", [*FETCH_PATHS, "replica-before-fetch-v12"])
def test_a_leader_log_that_diverged_is_truncated_as_a_follower_truncates(own_broker, tmp_path, fetch, caplog,
                                                                          monkeypatch):
    """The leader loses the tail of its log (cut at a batch boundary while it is stopped) and takes
    different records at the same offsets after its restart, under a higher leader epoch: the
    local log is cut back to the divergence point and the store rewound, so no record the leader
    no longer has is served."""
    bootstrap = own_broker.bootstrap_servers
    topic = f"diverged-{fetch}"
    if fetch == "replica-before-fetch-v12":
        # As against a broker before Kafka 2.7: Fetch without LastFetchedEpoch, so the divergence is
        # found by OffsetsForLeaderEpoch at start instead of a DivergingEpoch answer.
        monkeypatch.setattr(fetch_requests, "MAX_FETCH_VERSION", 11)
        monkeypatch.setattr(fetch_requests, "MAX_FETCH_VERSION_BY_NAME", 11)
        fetch = "replica"
    create_topic(bootstrap, topic, 1)
    produce_keys(bootstrap, topic, "a", 60)
    code, out, err = _run(bootstrap, topic, tmp_path, "--fetch", fetch)
    assert code == 0, err
    local = tmp_path / f"{topic}-0"
    assert (local / PARTITION_METADATA_FILE).read_bytes() == \
        (own_broker.partition_dir(topic, 0) / PARTITION_METADATA_FILE).read_bytes()
    epochs_before = leader_epochs(own_broker, topic, 0)

    own_broker.stop()
    cut_at = cut_leader_tail(own_broker, topic, 0, keep_batches=40)
    own_broker.start()
    assert own_broker.bootstrap_servers == bootstrap
    epochs_after = leader_epochs(own_broker, topic, 0)
    assert epochs_after[-1][0] > epochs_before[-1][0] and epochs_after[-1][1] == cut_at, epochs_after
    produce_keys(bootstrap, topic, "b", 50)  # other keys at the cut offsets and beyond

    code, out, err = _run(bootstrap, topic, tmp_path, "--fetch", fetch)
    assert code == 0, err
    assert "truncated the local log 1 time(s)" in out, out
    # The replica path's batches are the leader's: cut exactly at the divergence point. The consumer
    # path's local batches are its own: cut at the start of the one holding it, refetched from there.
    target = cut_at if fetch == "replica" else 0
    assert f"truncated the local log from offset 60 (leader epoch 0) to {target}" in caplog.text
    state = _exported(tmp_path, topic)
    assert state == _truth(bootstrap, topic, 1)
    assert not any(key.startswith(b"a") and int(key[1:]) >= cut_at for _, key in state)
    if fetch == "replica":  # the batches are the broker's: so is the epoch history
        assert (local / LEADER_EPOCH_CHECKPOINT_FILE).read_bytes() == \
            (own_broker.partition_dir(topic, 0) / LEADER_EPOCH_CHECKPOINT_FILE).read_bytes()


@pytest.mark.parametrize("fetch", FETCH_PATHS)
@pytest.mark.parametrize("shape", ["shorter", "longer", "more-partitions"])
def test_a_topic_recreated_between_runs_is_materialized_again(kafka_broker, tmp_path, fetch, shape, caplog):
    bootstrap = kafka_broker.bootstrap_servers
    topic = f"recreated-{fetch}-{shape}-{time.time_ns()}"
    create_topic(bootstrap, topic, 2)
    produce_keys(bootstrap, topic, "old", 200, partitions=2, tombstone_every=7)
    code, _, err = _run(bootstrap, topic, tmp_path, "--fetch", fetch)
    assert code == 0, err
    old_id = PartitionMetadataFile(tmp_path / f"{topic}-0").read()
    view = MaterializedView.open(tmp_path, topic)  # a reader that stays open across the re-creation

    delete_topic(bootstrap, topic)
    partitions = 3 if shape == "more-partitions" else 2
    create_topic(bootstrap, topic, partitions)
    produce_keys(bootstrap, topic, "new", {"shorter": 40, "longer": 400, "more-partitions": 300}[shape],
                 partitions=partitions)

    code, _, err = _run(bootstrap, topic, tmp_path, "--fetch", fetch, "--on-topic-recreated", "fail")
    assert code == 2 and err.count("error:") == 1 and "re-created" in err, err
    assert _exported(tmp_path, topic)  # refused: the old copy is still there, untouched

    code, out, err = _run(bootstrap, topic, tmp_path, "--fetch", fetch)
    assert code == 0, err
    assert "re-created 1 time" in out, out
    assert "was re-created" in caplog.text and str(old_id) not in caplog.text  # ids in Kafka's form
    new_id = PartitionMetadataFile(tmp_path / f"{topic}-0").read()
    assert new_id is not None and new_id != old_id
    truth = _truth(bootstrap, topic, partitions)
    assert _exported(tmp_path, topic) == truth
    with view:  # it opens the new topic's store instead of catching up into it (it served the old one)
        view.catch_up()
        assert {(entry.partition, entry.key): entry.value for entry in view.items()} == truth


def _store_state(materializer: Materializer) -> dict[tuple[int, bytes], bytes]:
    return {(v.partition, k): v.value for k, v in materializer.store.items()}


@pytest.mark.parametrize("fetch", FETCH_PATHS)
def test_a_topic_deleted_and_recreated_while_run_runs(kafka_broker, tmp_path, fetch):
    """Deleted: the run keeps serving its last state with caught_up=False and never re-creates the
    topic itself (metadata requests do not auto-create). Re-created: the local copy is dropped and
    the new topic materialized, live."""
    bootstrap = kafka_broker.bootstrap_servers
    topic = f"live-recreated-{fetch}-{time.time_ns()}"
    create_topic(bootstrap, topic, 2)
    produce_keys(bootstrap, topic, "old", 300, partitions=2)
    options = MaterializerOptions(fetch=fetch, cleaner_threads=0, request_timeout_ms=5_000,
                                  broker_timeout_ms=5_000)
    with Materializer(bootstrap, topic, tmp_path, options=options) as materializer:
        background = BackgroundRun(materializer)
        try:
            assert materializer.wait_until_caught_up(60)
            delete_topic(bootstrap, topic)
            wait_until(lambda: not materializer.health.caught_up, 30, "caught_up=False after the deletion")
            time.sleep(3)  # the run keeps asking for the topic's metadata meanwhile
            admin = AdminClient({"bootstrap.servers": bootstrap})
            assert topic not in admin.list_topics(timeout=5).topics, "the run re-created the deleted topic"
            assert materializer.health.running and materializer.health.failed is None
            create_topic(bootstrap, topic, 3)
            produce_keys(bootstrap, topic, "new", 120, partitions=3)
            truth = _truth(bootstrap, topic, 3)
            wait_until(lambda: materializer.health.caught_up and materializer.store is not None
                      and _store_state(materializer) == truth, 60, "the new topic materialized")
        finally:
            background.stop()
        assert materializer.stats.topic_recreations == 1


@pytest.mark.parametrize("fetch", FETCH_PATHS)
def test_offsets_deleted_past_the_local_end_neither_hang_nor_stay_served(kafka_broker, tmp_path, fetch):
    """DeleteRecords moves the broker's log start offset to its high watermark, beyond the local
    log end: `run --until-caught-up` returns, the local log restarts there, and the store no longer
    serves keys whose records the broker deleted (what a consumer reads now: nothing)."""
    bootstrap = kafka_broker.bootstrap_servers
    topic = f"deleted-records-{fetch}-{time.time_ns()}"
    create_topic(bootstrap, topic, 1, DELETABLE)
    produce_keys(bootstrap, topic, "early", 50)
    code, _, err = _run(bootstrap, topic, tmp_path, "--fetch", fetch)
    assert code == 0, err
    produce_keys(bootstrap, topic, "late", 50)
    _delete_records(bootstrap, topic, 100)
    started = time.monotonic()
    code, out, err = _run(bootstrap, topic, tmp_path, "--fetch", fetch)
    assert code == 0, err
    assert time.monotonic() - started < 30
    assert _exported(tmp_path, topic) == _truth(bootstrap, topic, 1) == {}


def test_records_below_a_log_start_offset_inside_a_batch_are_never_applied(kafka_broker, tmp_path):
    """DeleteRecords to an offset inside one of the broker's batches: the replica path appends the
    whole batch (the broker's bytes) but neither the fetch nor a later rebuild applies the records
    below the log start offset."""
    bootstrap = kafka_broker.bootstrap_servers
    topic = f"mid-batch-{time.time_ns()}"
    create_topic(bootstrap, topic, 1, DELETABLE)
    produce_keys(bootstrap, topic, "k", 100, batch=100)  # one batch of 100 records
    _delete_records(bootstrap, topic, 50)
    truth = _truth(bootstrap, topic, 1)
    assert len(truth) == 50
    code, _, err = _run(bootstrap, topic, tmp_path)
    assert code == 0, err
    assert _exported(tmp_path, topic) == truth

    shutil.rmtree(tmp_path / "state" / topic)
    code, out, err = _run(bootstrap, topic, tmp_path)
    assert code == 0 and "rebuilt" in out, (out, err)
    assert _exported(tmp_path, topic) == truth


def test_a_transaction_open_across_a_switch_of_the_fetch_path(kafka_broker, tmp_path):
    """The replica path copies a transaction that is still open; it is committed; the consumer path
    continues the log (it never sees markers) and then the replica path again: every committed
    record is served, every time."""
    bootstrap = kafka_broker.bootstrap_servers
    topic = f"switch-open-txn-{time.time_ns()}"
    create_topic(bootstrap, topic, 1)
    produce_keys(bootstrap, topic, "plain", 20)
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"{topic}-tx"})
    producer.init_transactions(30)
    producer.begin_transaction()
    for i in range(10):
        producer.produce(topic, key=f"tx{i}".encode(), value=b"committed", partition=0)
    producer.flush(30)
    produce_keys(bootstrap, topic, "mid", 5)  # non-transactional records inside the open transaction
    code, _, err = _run(bootstrap, topic, tmp_path, "--fetch", "replica")
    assert code == 0, err
    assert not any(key.startswith(b"tx") for _, key in _exported(tmp_path, topic))  # held back: still open
    producer.commit_transaction(30)
    produce_keys(bootstrap, topic, "after", 5)
    truth = _truth(bootstrap, topic, 1)
    assert sum(key.startswith(b"tx") for _, key in truth) == 10
    code, _, err = _run(bootstrap, topic, tmp_path, "--fetch", "consumer")
    assert code == 0, err
    assert _exported(tmp_path, topic) == truth
    produce_keys(bootstrap, topic, "last", 5)
    code, _, err = _run(bootstrap, topic, tmp_path, "--fetch", "replica")
    assert code == 0, err
    assert _exported(tmp_path, topic) == _truth(bootstrap, topic, 1)
