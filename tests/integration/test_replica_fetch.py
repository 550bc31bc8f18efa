"""The replica fetch path against a real broker: the local log is the broker's, byte for byte.

``fetch="replica"`` (the default) appends the leader's batches verbatim. Checked here:

* every codec, plain, idempotent and transactional producers (one committed, one aborted
  transaction): the local ``.log`` equals the broker's file, Kafka's own DumpLogSegments prints
  the same batches (baseOffset, lastOffset, producerId, producerEpoch, baseSequence,
  isTransactional, isControl, CRC) and records for both, the ``.txnindex`` entries are the
  broker's, and the store equals what a ``read_committed`` consumer reads;
* after the broker's cleaner compacted the topic (gaps, cleaned batches, removed markers):
  batch for batch the broker's again;
* a local log written by the consumer path (other batch boundaries) is cut back to a boundary
  the broker has and continued verbatim, with no offset lost;
* ``OFFSET_OUT_OF_RANGE`` (DeleteRecords past the local end) continues at the broker's log start
  offset, as a consumer with ``auto.offset.reset=earliest`` would, and says so;
* an open transaction holds the store back at the last stable offset until its COMMIT arrives.
"""

from __future__ import annotations

import logging
import shutil
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from materializer.adapters import replica_fetch
from materializer.local.kafka_broker import DUMP_LOG_SEGMENTS_CLASS
from materializer.adapters.rocksdb_store import StateStore
from materializer.config import MaterializerOptions
from materializer.datadir.layout import partition_dir, state_dir
from materializer.offline.dump_log import parse_dump_output
from materializer.materializer import Materializer
from materializer.ingest.appender import VerbatimAppender
from materializer.storage.log import Log
from materializer.storage.record_batch import RecordBatch, iter_batches
from materializer.storage.transaction_index import TransactionIndex
from tests.integration.broker_reads import latest_per_partition_key, read_topic
from tests.integration.compaction_workloads import (
    Workload,
    alter_topic_configs,
    produce,
    produce_transactions,
    wait_for_broker_cleaning,
)
from tests.integration.test_dump_log_segments import (
    _produce_plain_and_idempotent,
    _produce_transactions,
    _wait_for_markers,
)

pytestmark = pytest.mark.broker

BATCH_FIELDS = ("baseOffset", "lastOffset", "count", "producerId", "producerEpoch", "baseSequence",
                "isTransactional", "isControl", "crc", "compresscodec", "position", "size", "isvalid")


def _run(bootstrap: str, topic: str, data_dir: Path, **options: Any) -> Materializer:
    """Ingest ``topic`` until caught up; returns the closed Materializer (its stats stay readable)."""
    opts = MaterializerOptions(progress=False, poll_timeout_ms=200, cleaner_threads=0, **options)
    with Materializer(bootstrap, topic, data_dir, options=opts) as materializer:
        materializer.run(until_caught_up=True)
    return materializer


def _store_entries(data_dir: Path, topic: str) -> dict[tuple[int, bytes], bytes]:
    with StateStore(state_dir(data_dir, topic)) as store:
        return {(value.partition, key): value.value for key, value in store.items()}


def _consumer_view(bootstrap: str, topic: str, partitions: int) -> dict[tuple[int, bytes], bytes]:
    latest = latest_per_partition_key(read_topic(bootstrap, topic, partitions))
    return {k: v for k, v in latest.items() if k[1] is not None}


def _batches(folder: Path) -> list[bytes]:
    """Every batch of every segment of a partition folder, as bytes, in offset order."""
    found = []
    for log in sorted(folder.glob("*.log")):
        data = log.read_bytes()
        found.extend(bytes(batch.buffer) for _, batch in iter_batches(data, path=str(log)))
    return found


def _dump_batches(broker: Any, log: Path) -> list[tuple[dict, list]]:
    done = broker.run_tool(DUMP_LOG_SEGMENTS_CLASS, ["--deep-iteration", "--print-data-log", "--files", str(log)])
    assert done.returncode == 0, done.stderr
    (parsed,) = parse_dump_output(done.stdout)
    return [({f: b[f] for f in BATCH_FIELDS}, b["records"]) for b in parsed["batches"]]


@pytest.mark.parametrize("direct", [True, False], ids=["own-socket", "kafka-python-connection"])
def test_local_segments_are_the_brokers_for_every_codec_and_transactions(kafka_broker, create_topic, tmp_path,
                                                                          monkeypatch, direct):
    """Both transports: the PLAINTEXT socket and kafka-python's managed connection (SASL/SSL listeners)."""
    monkeypatch.setattr(replica_fetch.fetcher, "DIRECT_FETCH_ON_PLAINTEXT", direct)
    topic = create_topic()
    bootstrap = kafka_broker.bootstrap_servers
    _produce_plain_and_idempotent(bootstrap, topic)
    _produce_transactions(bootstrap, topic)
    broker_dir = kafka_broker.partition_dir(topic, 0)
    _wait_for_markers(broker_dir, {"COMMIT", "ABORT"})

    materializer = _run(bootstrap, topic, tmp_path)
    local_dir = partition_dir(tmp_path, topic, 0)

    # Byte for byte: the broker's single segment and ours.
    (broker_log,) = sorted(broker_dir.glob("*.log"))
    (local_log,) = sorted(local_dir.glob("*.log"))
    assert local_log.name == broker_log.name
    broker_bytes = broker_log.read_bytes()
    assert local_log.read_bytes() == broker_bytes[:local_log.stat().st_size]
    assert local_log.stat().st_size == len(b"".join(_batches(broker_dir)))

    # Kafka's DumpLogSegments prints the same batches and records for both files.
    theirs, ours = _dump_batches(kafka_broker, broker_log), _dump_batches(kafka_broker, local_log)
    assert ours == theirs
    assert {b["compresscodec"] for b, _ in ours} == {"none", "gzip", "snappy", "lz4", "zstd"}
    assert any(b["isControl"] for b, _ in ours) and any(b["isTransactional"] and not b["isControl"] for b, _ in ours)
    assert any(b["producerId"] >= 0 and b["baseSequence"] >= 0 and not b["isTransactional"] for b, _ in ours)

    # The aborted transaction is indexed as the broker indexed it.
    local_txns = TransactionIndex(0, local_log.with_suffix(".txnindex")).all_aborted_txns()
    broker_txns = TransactionIndex(0, broker_log.with_suffix(".txnindex")).all_aborted_txns()
    assert local_txns == broker_txns and len(local_txns) == 1

    # The store is what a read_committed consumer sees: the committed transaction in, the aborted one out.
    entries = _store_entries(tmp_path, topic)
    assert entries == _consumer_view(bootstrap, topic, 1)
    assert (0, b"txn-True-0") in entries and (0, b"txn-False-0") not in entries
    assert materializer.stats.batches_appended == len(theirs)


def test_after_the_brokers_cleaner_ran_the_batches_are_still_the_brokers(kafka_broker, create_topic, tmp_path):
    topic = create_topic(partitions=2, config={
        "cleanup.policy": "compact", "internal.segment.bytes": "16384", "min.cleanable.dirty.ratio": "0.01",
        "delete.retention.ms": "0", "min.compaction.lag.ms": "0", "segment.ms": "100"})
    bootstrap = kafka_broker.bootstrap_servers
    produce(bootstrap, topic, [0, 1], Workload(records_per_partition=1500, keys=60, seed=3), codec="lz4")
    produce_transactions(bootstrap, topic, [0, 1], transactions=12, records_per_transaction=20, keys=60,
                         codec="zstd")
    wait_for_broker_cleaning(kafka_broker.log_dirs, topic, [0, 1])
    # Hold the broker's log still from here (no more rolls or cleaning), so that it can be compared.
    alter_topic_configs(AdminClient({"bootstrap.servers": bootstrap}), topic,
                        {"min.cleanable.dirty.ratio": "1.0", "segment.ms": "604800000"})
    wait_for_broker_cleaning(kafka_broker.log_dirs, topic, [0, 1])
    produce(bootstrap, topic, [0, 1], Workload(records_per_partition=10, keys=60, seed=4))  # an active segment too
    before = {p: _batches(kafka_broker.partition_dir(topic, p)) for p in (0, 1)}

    _run(bootstrap, topic, tmp_path)
    for partition in (0, 1):
        broker_batches = _batches(kafka_broker.partition_dir(topic, partition))
        assert broker_batches == before[partition]
        assert _batches(partition_dir(tmp_path, topic, partition)) == broker_batches
    batches = [RecordBatch(b) for b in before[0]]
    assert any(n.base_offset > p.last_offset + 1 for p, n in zip(batches, batches[1:]))  # gaps from cleaning
    assert _store_entries(tmp_path, topic) == _consumer_view(bootstrap, topic, 2)


def test_a_log_written_by_the_consumer_path_is_continued_verbatim(kafka_broker, create_topic, tmp_path, monkeypatch,
                                                                  caplog):
    topic = create_topic()
    bootstrap = kafka_broker.bootstrap_servers
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "enable.idempotence": True})

    def send(start: int, count: int) -> None:
        for i in range(start, start + count):
            producer.produce(topic, key=b"k%d" % (i % 25), value=b"v%d" % i, partition=0)
            if i % 7 == 0:
                producer.flush(30)  # many small broker batches
        assert producer.flush(30) == 0

    send(0, 200)
    _run(bootstrap, topic, tmp_path, fetch="consumer", max_batch_bytes=400)  # local batches of other boundaries
    local_dir = partition_dir(tmp_path, topic, 0)
    # End the local log at one of its batch boundaries that lies inside a broker batch, as a
    # consumer-path run stopped there would have left it.
    broker_spans = [(b.base_offset, b.last_offset) for _, b in iter_batches(b"".join(_batches(kafka_broker.partition_dir(topic, 0))))]
    local_bases = [b.base_offset for _, b in iter_batches(b"".join(_batches(local_dir)))]
    inside = [o for o in local_bases if any(base < o <= last for base, last in broker_spans)]
    assert inside, (local_bases, broker_spans)
    from materializer.storage.log import Log

    with Log.open(local_dir) as log:
        log.truncate_to(inside[-1])
    consumer_batches = _batches(local_dir)
    send(200, 100)
    # The cut back happens only with the replacing batch in hand: no append step ends with a log
    # shorter than before it (a store never waits ahead of its log for a response).
    original_append, shrunk = VerbatimAppender.append, []

    def append_never_shrinking(self, fetched):
        before = {p: log.log_end_offset for p, log in self.logs.items()}
        done = original_append(self, fetched)
        shrunk.extend(p for p, log in self.logs.items() if log.log_end_offset < before[p])
        return done
    monkeypatch.setattr(VerbatimAppender, "append", append_never_shrinking)
    with caplog.at_level(logging.WARNING, logger="materializer.ingest.appender"):
        _run(bootstrap, topic, tmp_path, fetch="replica")
    assert "inside the broker's batch" in caplog.text and shrunk == []

    broker_batches = _batches(kafka_broker.partition_dir(topic, 0))
    local_batches = _batches(local_dir)
    # The tail is the broker's, batch for batch; what precedes it is the consumer path's.
    tail = [b for b in local_batches if b not in consumer_batches]
    assert tail and tail == broker_batches[-len(tail):]
    with StateStore(state_dir(tmp_path, topic)) as store:
        assert store.offsets() == {0: 300}
    records = read_topic(bootstrap, topic, 1)[0]
    with Log.open(local_dir) as log:
        local = [(r.offset, r.key, r.value) for r in log.read_records()]
    assert local == [(r.offset, r.key, r.value) for r, _ in records]  # no offset lost or doubled
    assert _store_entries(tmp_path, topic) == _consumer_view(bootstrap, topic, 1)


def test_offsets_deleted_on_the_broker_before_they_were_fetched(kafka_broker, create_topic, tmp_path, caplog):
    topic = create_topic()
    bootstrap = kafka_broker.bootstrap_servers
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0})
    for i in range(100):
        producer.produce(topic, key=b"k%d" % i, value=b"first", partition=0)
    producer.flush(30)
    _run(bootstrap, topic, tmp_path)
    for i in range(100, 200):
        producer.produce(topic, key=b"k%d" % i, value=b"second", partition=0)
    producer.flush(30)
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.delete_records([TopicPartition(topic, 0, 150)])[TopicPartition(topic, 0, 150)].result(30)

    with caplog.at_level(logging.WARNING, logger="materializer.ingest.appender"):
        _run(bootstrap, topic, tmp_path)
    assert "offsets [100, 150) were deleted on the broker" in caplog.text
    # As a follower: the local log restarts at the broker's log start offset; and as a consumer
    # reading the topic now: the keys written only below it (k0..k99, "first") are gone.
    entries = _store_entries(tmp_path, topic)
    assert entries == {(0, b"k%d" % i): b"second" for i in range(150, 200)}
    with StateStore(state_dir(tmp_path, topic)) as store:
        assert store.offsets() == {0: 200}


def test_an_open_transaction_holds_the_store_at_the_last_stable_offset(kafka_broker, create_topic, tmp_path):
    topic = create_topic()
    bootstrap = kafka_broker.bootstrap_servers
    plain = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0})
    txn = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"open-{uuid.uuid4().hex}"})
    txn.init_transactions(30)
    plain.produce(topic, key=b"before", value=b"1", partition=0)
    plain.flush(30)
    txn.begin_transaction()
    txn.produce(topic, key=b"in-txn", value=b"t", partition=0)
    txn.flush(30)
    plain.produce(topic, key=b"after", value=b"2", partition=0)
    plain.flush(30)

    _run(bootstrap, topic, tmp_path)
    entries = _store_entries(tmp_path, topic)
    assert entries == {(0, b"before"): b"1"}  # "after" waits behind the open transaction, as read_committed does
    with StateStore(state_dir(tmp_path, topic)) as store:
        assert store.offsets() == {0: 1}

    txn.commit_transaction(30)
    _wait_for_markers(kafka_broker.partition_dir(topic, 0), {"COMMIT"})
    _run(bootstrap, topic, tmp_path)
    assert _store_entries(tmp_path, topic) == {(0, b"before"): b"1", (0, b"in-txn"): b"t", (0, b"after"): b"2"}
    assert _store_entries(tmp_path, topic) == _consumer_view(bootstrap, topic, 1)


def test_update_callbacks_see_committed_records_in_offset_order(kafka_broker, create_topic, tmp_path):
    topic = create_topic()
    bootstrap = kafka_broker.bootstrap_servers
    _produce_transactions(bootstrap, topic)
    _wait_for_markers(kafka_broker.partition_dir(topic, 0), {"COMMIT", "ABORT"})
    seen: list[tuple[bytes, bytes | None]] = []
    opts = MaterializerOptions(progress=False, poll_timeout_ms=200, cleaner_threads=0)
    with Materializer(bootstrap, topic, tmp_path, options=opts) as materializer:
        materializer.on_update(lambda key, old, new, partition: seen.append((key, new.value if new else None)))
        materializer.run(until_caught_up=True)
    assert seen == [(b"txn-True-%d" % i, b"txn value %d" % i) for i in range(4)]



@pytest.mark.parametrize("fetch", ["replica", "consumer"])
def test_a_sasl_plain_listener_with_the_consumers_settings(tmp_path, fetch):
    """The same ``-X`` settings secure both paths: librdkafka's names, translated for kafka-python
    (whose own connections carry the replica path's fetches on a SASL listener). A wrong password
    fails the start with the broker's answer, not a hang."""
    from materializer.adapters.errors import KafkaSourceError
    from materializer.local.kafka_broker import TEST_BROKER_CONFIG, LocalKafkaBroker

    with LocalKafkaBroker(tmp_path / "broker", extra_config=TEST_BROKER_CONFIG, fast_start=True,
                          sasl_plain_users={"alice": "alice-secret"}) as broker:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap_servers})
        from confluent_kafka.admin import NewTopic

        admin.create_topics([NewTopic("secured", 2, 1)])["secured"].result(30)
        _produce_transactions(broker.bootstrap_servers, "secured")
        _wait_for_markers(broker.partition_dir("secured", 0), {"COMMIT", "ABORT"})
        secured = {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN", "sasl.username": "alice",
                   "sasl.password": "alice-secret"}
        _run(broker.sasl_bootstrap_servers, "secured", tmp_path / "data", fetch=fetch, client_config=secured)
        assert _store_entries(tmp_path / "data", "secured") == _consumer_view(broker.bootstrap_servers, "secured", 2)
        if fetch == "replica":
            assert _batches(partition_dir(tmp_path / "data", "secured", 0)) == _batches(broker.partition_dir("secured", 0))
        wrong = {**secured, "sasl.password": "wrong"}
        with pytest.raises(KafkaSourceError):
            _run(broker.sasl_bootstrap_servers, "secured", tmp_path / "other", fetch=fetch, client_config=wrong,
                 request_timeout_ms=5_000, broker_timeout_ms=5_000)


def test_ingest_follows_the_leader_to_another_replica(tmp_path):
    """A two-broker cluster; the partition's leader (node 2) shuts down while ``run`` ingests
    (a controlled shutdown moves the leadership to node 1, the other in-sync replica). The
    replica path looks the leader up again and goes on fetching from node 1: the local log is
    node 1's, batch for batch (a follower appends its leader's batches verbatim), and the store
    holds what a read_committed consumer reads, records produced after the change included."""
    import time

    from confluent_kafka.admin import NewTopic

    from materializer.local.kafka_broker import TEST_BROKER_CONFIG, LocalKafkaBroker

    with LocalKafkaBroker(tmp_path / "node1", extra_config=TEST_BROKER_CONFIG, fast_start=True) as first, \
            LocalKafkaBroker(tmp_path / "node2", extra_config=TEST_BROKER_CONFIG, fast_start=True,
                             join=first, node_id=2) as second:
        bootstrap = first.bootstrap_servers
        admin = AdminClient({"bootstrap.servers": bootstrap})
        admin.create_topics([NewTopic("moving", num_partitions=1, replica_assignment=[[2, 1]],
                                      config={"min.insync.replicas": "1"})])["moving"].result(30)

        def wait_for_leader(node: int) -> None:
            deadline = time.monotonic() + 30
            while True:
                partitions = admin.list_topics("moving", timeout=10).topics["moving"].partitions
                if 0 in partitions and partitions[0].leader == node:
                    return
                assert time.monotonic() < deadline, f"node {node} did not become the leader: {partitions}"
                time.sleep(0.2)
        wait_for_leader(2)
        producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5,
                             "enable.idempotence": True})
        sent = 0

        def send(count: int) -> None:
            nonlocal sent
            for _ in range(count):
                producer.produce("moving", key=b"k%d" % (sent % 50), value=b"v%d" % sent, partition=0)
                sent += 1
                if sent % 100 == 0:
                    producer.flush(30)
            assert producer.flush(30) == 0

        send(1_000)
        options = MaterializerOptions(progress=False, poll_timeout_ms=200, cleaner_threads=0)
        with Materializer(bootstrap, "moving", tmp_path / "data", options=options) as materializer:
            materializer.run_in_background()
            assert materializer.wait_until_caught_up(60)
            epoch_before = materializer.fetcher.leader_epoch(0)
            second.stop()  # controlled shutdown: node 1 becomes the leader
            wait_for_leader(1)
            send(1_000)
            deadline = time.monotonic() + 60
            while materializer.stats.next_offsets.get(0, 0) < sent:
                assert time.monotonic() < deadline, f"ingest stuck at {materializer.stats.next_offsets} of {sent}"
                assert not materializer.health.failed, materializer.health
                time.sleep(0.1)
            materializer.stop()
            assert materializer.fetcher.leader_epoch(0) > epoch_before  # the fetcher followed the change
        assert _batches(partition_dir(tmp_path / "data", "moving", 0)) == _batches(first.partition_dir("moving", 0))
        assert _store_entries(tmp_path / "data", "moving") == _consumer_view(bootstrap, "moving", 1)
        assert len(_consumer_view(bootstrap, "moving", 1)) == 50


@pytest.mark.parametrize("fetch", ["replica", "consumer"])
def test_an_ssl_listener_with_the_consumers_settings(tmp_path, fetch):
    """TLS with the consumer's ``-X`` settings on both paths (``ssl.ca.location`` translated to
    kafka-python's ``ssl_cafile``): the replica path's local log is the broker's byte for byte,
    and a CA that did not sign the broker's certificate fails the start instead of hanging."""
    import subprocess

    from confluent_kafka.admin import NewTopic

    from materializer.adapters.errors import KafkaSourceError
    from materializer.local.kafka_broker import TEST_BROKER_CONFIG, LocalKafkaBroker
    from materializer.local.kafka_jars import find_java

    with LocalKafkaBroker(tmp_path / "broker", extra_config=TEST_BROKER_CONFIG, fast_start=True,
                          ssl_listener=True) as broker:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap_servers})
        admin.create_topics([NewTopic("tls", 2, 1)])["tls"].result(30)
        _produce_transactions(broker.bootstrap_servers, "tls")
        _wait_for_markers(broker.partition_dir("tls", 0), {"COMMIT", "ABORT"})
        tls = {"security.protocol": "SSL", "ssl.ca.location": str(broker.ssl_ca_location)}
        _run(broker.ssl_bootstrap_servers, "tls", tmp_path / "data", fetch=fetch, client_config=tls)
        assert _store_entries(tmp_path / "data", "tls") == _consumer_view(broker.bootstrap_servers, "tls", 2)
        if fetch == "replica":
            assert _batches(partition_dir(tmp_path / "data", "tls", 0)) == _batches(broker.partition_dir("tls", 0))
        other_ca = tmp_path / "other-ca.pem"  # a self-signed certificate that signed nothing of the broker's
        keytool = str(Path(find_java()).with_name("keytool"))
        store = ["-keystore", str(tmp_path / "other.p12"), "-storepass", "other-secret", "-alias", "other"]
        for args in (["-genkeypair", "-keyalg", "RSA", "-dname", "CN=other", "-storetype", "PKCS12", *store],
                     ["-exportcert", "-rfc", "-file", str(other_ca), *store]):
            subprocess.run([keytool, *args], check=True, capture_output=True, timeout=60)
        with pytest.raises(KafkaSourceError) as failed:
            _run(broker.ssl_bootstrap_servers, "tls", tmp_path / "other", fetch=fetch,
                 client_config={**tls, "ssl.ca.location": str(other_ca)}, request_timeout_ms=5_000,
                 broker_timeout_ms=5_000)
        assert "certificate verify failed" in str(failed.value)  # the cause, not only "transport failure"


def test_close_does_not_wait_for_the_fetch_in_flight(kafka_broker, create_topic):
    """A pipelined Fetch is always in flight; the broker holds it up to its max wait when no data
    arrives. Closing shuts the socket down, so the receiving thread returns at once instead of
    holding the shutdown of a service for the rest of that wait."""
    import time

    topic = create_topic()  # empty: the broker answers only after max_wait_ms
    fetcher = replica_fetch.ReplicaFetcher(kafka_broker.bootstrap_servers, topic)
    fetcher.send({0: 0}, max_wait_ms=30_000)
    time.sleep(0.5)  # the request is on the broker, waiting
    started = time.monotonic()
    fetcher.close()
    assert time.monotonic() - started < 15, "close() waited for the broker's answer"


def test_bulk_applies_and_a_rebuild_through_native_sst_files(kafka_broker, create_topic, tmp_path, monkeypatch):
    """Enough distinct keys for the bulk path (>= 20,000 puts per apply in the default lz4 store):
    the SST files the native core writes are ingested by RocksDB, and the store equals what a
    read_committed consumer reads, after the replica path's applies and after a rebuild from the
    local log (the store deleted)."""
    native = []
    ingest = StateStore._ingest

    def counting_ingest(store: StateStore, sst_paths: list[Path]) -> None:
        if all(path.read_bytes()[-12:-8] == (5).to_bytes(4, "little") for path in sst_paths):  # native format_version
            native.append(sum(path.stat().st_size for path in sst_paths))
        ingest(store, sst_paths)

    monkeypatch.setattr(StateStore, "_ingest", counting_ingest)
    topic = create_topic(partitions=2)
    bootstrap = kafka_broker.bootstrap_servers
    produce(bootstrap, topic, [0, 1], Workload(records_per_partition=30_000, keys=25_000, value_bytes=40,
                                               header_ratio=0.0, batch_records=500, seed=5), codec="lz4")
    expected = _consumer_view(bootstrap, topic, 2)
    assert len(expected) > 25_000  # live keys: the rebuild writes more than 20,000 puts

    _run(bootstrap, topic, tmp_path)
    assert _store_entries(tmp_path, topic) == expected
    applies = len(native)

    shutil.rmtree(state_dir(tmp_path, topic))
    materializer = _run(bootstrap, topic, tmp_path)
    assert materializer.stats.store_rebuilt
    assert len(native) == applies + 1  # the whole rebuild: one native SST file
    assert _store_entries(tmp_path, topic) == expected


def test_the_apply_thread_never_applies_past_what_was_fsynced(kafka_broker, create_topic, tmp_path, monkeypatch):
    """The store is applied on its own thread while the ingest thread appends further responses:
    every store write must carry next offsets the logs had fsynced before it (design invariant:
    the store never runs ahead of the durable log). Each flush here waits 10 ms between the
    append and its fsync, so an apply that read the log's current last stable offset instead of
    its fsynced bound would write offsets nothing has fsynced yet, and fail this test. The store
    exists before the checked run: a new store is bulk loaded, its stretches held and written by
    the ingest thread's drain, while here the worker must write each stretch itself."""
    topic = create_topic(partitions=2)
    bootstrap = kafka_broker.bootstrap_servers
    produce(bootstrap, topic, [0, 1], Workload(records_per_partition=50, keys=400, value_bytes=60, header_ratio=0.0,
                                               batch_records=50, seed=20), codec="lz4")
    _run(bootstrap, topic, tmp_path)
    produce(bootstrap, topic, [0, 1], Workload(records_per_partition=6_000, keys=400, value_bytes=60,
                                               header_ratio=0.0, batch_records=50, seed=21), codec="lz4")
    produce_transactions(bootstrap, topic, [0, 1], transactions=6, records_per_transaction=40, keys=400, codec="lz4")
    durable: dict[str, int] = {}
    violations: list[str] = []
    apply_threads: set[str] = set()
    flush, apply = Log.flush, StateStore.apply_store_entries

    def slow_flush(log: Log) -> None:
        end = log.log_end_offset  # appended, not yet fsynced
        time.sleep(0.01)
        flush(log)
        durable[log.dir.name] = max(durable.get(log.dir.name, 0), end)

    def checked_apply(store: StateStore, entries, next_offsets, **kwargs):
        apply_threads.add(threading.current_thread().name)
        for partition, offset in next_offsets.items():
            fsynced = durable.get(f"{topic}-{partition}", 0)
            if offset > fsynced:
                violations.append(f"partition {partition}: store next offset {offset} > fsynced {fsynced}")
        return apply(store, entries, next_offsets, **kwargs)

    monkeypatch.setattr(Log, "flush", slow_flush)
    monkeypatch.setattr(StateStore, "apply_store_entries", checked_apply)
    # 64 KiB per partition and fetch: many rounds, so applies overlap the appends that follow them
    _run(bootstrap, topic, tmp_path, client_config={"max.partition.fetch.bytes": "65536"})
    assert not violations, violations[:5]
    assert any(name.startswith("materializer-apply") for name in apply_threads), apply_threads
    assert _store_entries(tmp_path, topic) == _consumer_view(bootstrap, topic, 2)


@pytest.mark.parametrize("isolation_level", ["read_committed", "read_uncommitted"])
def test_watermarks_are_what_a_consumer_is_told(kafka_broker, create_topic, isolation_level):
    """The replica path asks the leaders for watermarks itself (one ListOffsets per leader for all
    partitions) instead of keeping a librdkafka consumer for it: the answers must be librdkafka's,
    with a log start moved by DeleteRecords and an open transaction between the last stable offset
    and the high watermark."""
    from materializer.adapters.errors import LeaderNotAvailableError
    from materializer.adapters.kafka_source import KafkaSource, KafkaSourceOptions

    topic = create_topic(partitions=3)
    bootstrap = kafka_broker.bootstrap_servers
    plain = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0})
    for i in range(30):
        plain.produce(topic, key=b"k%d" % i, value=b"v", partition=i % 2)
    plain.flush(30)
    txn = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"wm-{uuid.uuid4().hex}"})
    txn.init_transactions(30)
    txn.begin_transaction()
    txn.produce(topic, key=b"open", value=b"t", partition=1)
    txn.flush(30)
    plain.produce(topic, key=b"after", value=b"x", partition=1)
    plain.flush(30)
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.delete_records([TopicPartition(topic, 0, 5)]).values():
        future.result(30)

    options = KafkaSourceOptions(isolation_level=isolation_level)
    with KafkaSource(bootstrap, topic, options) as source:
        expected = {p: source.watermark_offsets(p) for p in range(3)}
    with replica_fetch.ReplicaFetcher(bootstrap, topic, options) as fetcher:
        assert fetcher.watermarks([2, 0, 1]) == expected
        with pytest.raises(LeaderNotAvailableError, match=r"\[7\]"):
            fetcher.watermarks([0, 7], wait_for_leader=False)
    assert expected[0] == (5, 15)
    # partition 1: 15 plain records, the open transaction's record at 15, "after" at 16
    assert expected[1] == ((0, 15) if isolation_level == "read_committed" else (0, 17))
    assert expected[2] == (0, 0)
    txn.abort_transaction(30)
