"""The replica path's rules without a broker: VerbatimAppender on hand-built v2 batches, and the
translation of consumer settings into kafka-python's (the broker tests are in
tests/integration/test_replica_fetch.py)."""

from __future__ import annotations

import pytest

from materializer.adapters.kafka_source import KafkaSourceOptions
from materializer.adapters.replica_fetch import (
    OFFSET_OUT_OF_RANGE,
    EpochEndOffset,
    FetchPosition,
    PartitionData,
    replica_client_config,
)
from materializer.config import MaterializerOptions
from materializer.ingest.appender import LogTruncation, OffsetGap, VerbatimAppender, truncation_target
from materializer.storage.control_record import ControlRecordType, encode_end_txn_marker
from materializer.storage.errors import CorruptRecordError
from materializer.storage.log import Log
from materializer.storage.read_committed import CommittedReader
from materializer.storage.record_batch_builder import RecordBatchBuilder

TOPIC = "t"


def batch(base: int, count: int, *, producer_id: int = -1, transactional: bool = False, marker: str | None = None,
          step: int = 1, epoch: int = -1) -> bytes:
    builder = RecordBatchBuilder(base, producer_id=producer_id, producer_epoch=0 if producer_id >= 0 else -1,
                                 base_sequence=0 if producer_id >= 0 and not marker else -1,
                                 is_transactional=transactional or marker is not None,
                                 is_control_batch=marker is not None, partition_leader_epoch=epoch)
    if marker is not None:
        key, value = encode_end_txn_marker(ControlRecordType[marker], 0)
        builder.append(base, 1_700_000_000_000, key, value)
    else:
        for i in range(count):
            builder.append(base + i * step, 1_700_000_000_000 + i, b"k%d" % ((base + i * step) % 3), b"v%d" % (base + i))
    return builder.build()


def part(fetch_offset: int, records: bytes, *, error: int = 0, high: int = 1000, last_fetched_epoch: int = -1,
         diverging: EpochEndOffset | None = None, current_epoch: int = -1, log_start: int = 0) -> PartitionData:
    return PartitionData(0, fetch_offset, records, high, high, log_start, error, diverging, current_epoch,
                         last_fetched_epoch)


def at(offset: int, epoch: int = -1) -> dict[int, FetchPosition]:
    return {0: FetchPosition(offset, epoch)}


@pytest.fixture
def log(tmp_path):
    with Log.open(tmp_path / f"{TOPIC}-0") as opened:
        yield opened


def appender(log: Log, watermarks=(0, 1000)) -> VerbatimAppender:
    return VerbatimAppender(TOPIC, {0: log}, lambda partition: watermarks)


def log_bytes(log: Log) -> bytes:
    log.flush()
    return b"".join(bytes(b.buffer) for b in log.read_batches())


def test_batches_are_appended_verbatim_and_a_partial_tail_waits(log):
    first, second = batch(0, 5), batch(5, 3)
    fetched = first + second[:-7]  # the broker cut the second batch at its size limit
    done = appender(log).append([part(0, fetched)])
    assert done.partitions == [0] and done.batches == 1 and done.records == 5
    assert log_bytes(log) == first and log.log_end_offset == 5
    assert appender(log).positions_after([part(0, fetched)]) == at(5)
    appender(log).append([part(5, second)])
    assert log_bytes(log) == first + second


def test_an_answer_to_an_older_position_is_dropped(log):
    a = appender(log)
    a.append([part(0, batch(0, 5))])
    done = a.append([part(0, batch(0, 5))])  # a pipelined response for offset 0 arriving late
    assert done.partitions == [] and log.log_end_offset == 5
    # After a cut back (below), a response to the position before the cut must not leave a hole.
    done = a.append([part(9, batch(9, 2))])
    assert done.partitions == [] and log.log_end_offset == 5


def test_gaps_from_the_brokers_cleaner_are_kept(log):
    appender(log).append([part(0, batch(0, 3) + batch(10, 2, step=4))])
    assert [b.base_offset for b in log.read_batches()] == [0, 10]
    assert log.log_end_offset == 15


def test_a_batch_failing_its_crc_is_refused_with_its_position(log):
    good, bad = batch(0, 3), bytearray(batch(3, 3))
    bad[-1] ^= 0xFF
    with pytest.raises(CorruptRecordError, match=r"Fetch response of t-0 at offset 0: the batch at byte \d+"):
        appender(log).append([part(0, good + bytes(bad))])
    assert log.log_end_offset == 3  # the good batch before it is kept


def test_a_log_ending_inside_a_broker_batch_is_cut_back_to_a_common_boundary(log):
    # Local batches [0..5] and [6..7] (written by the consumer path); the broker's are [0..3], [4..7], [8..9].
    log.append_batch(batch(0, 6))
    log.append_batch(batch(6, 2))  # the local log ends at 8: at the broker's [8..9] start
    a = appender(log)
    a.append([part(8, batch(8, 2))])
    assert log.log_end_offset == 10  # aligned: appended as is
    log.truncate_fully_and_start_at(0)
    log.append_batch(batch(0, 6))
    log.append_batch(batch(6, 1))  # the local log now ends at 7, inside the broker's [4..7]
    local = log_bytes(log)
    a.append([part(7, batch(4, 4) + batch(8, 2))])
    # fetch again from the local batch holding 4, which starts at 0; the log is not cut yet, so it
    # never ends below what a state store may already hold while the response travels
    assert a.positions() == at(0) and log_bytes(log) == local
    a.append([part(7, batch(8, 2))])  # a late answer to the old position: dropped
    assert log_bytes(log) == local
    done = a.append([part(0, batch(0, 4) + batch(4, 4) + batch(8, 2))])  # cut at 0 and appended at once
    assert log_bytes(log) == batch(0, 4) + batch(4, 4) + batch(8, 2) and a.positions() == at(10)
    assert done.truncations == {0: LogTruncation(0, 7, 0, -1, -1, "realign")}  # the store is rewound with it


def test_a_realign_over_a_range_the_broker_has_cleaned_keeps_the_brokers_gap(log):
    # Local (consumer path) [0..5] and [6..8], ending inside the broker's [7..9]; the broker's
    # cleaner has since removed offset 6: the fetch from the boundary 6 answers with 7 first.
    log.append_batch(batch(0, 6))
    log.append_batch(batch(6, 3))
    a = appender(log)
    a.append([part(9, batch(7, 3))])
    assert a.positions() == at(6) and log.log_end_offset == 9
    a.append([part(6, batch(7, 3))])
    assert [b.base_offset for b in log.read_batches()] == [0, 7] and log.log_end_offset == 10


def test_offset_out_of_range_below_the_brokers_log_start_restarts_the_log_there(log, caplog):
    log.append_batch(batch(0, 5))
    a = appender(log, watermarks=(20, 40))
    done = a.append([part(5, b"", error=OFFSET_OUT_OF_RANGE)])
    # As a follower: every local record is stale, the log restarts at the leader's log start offset.
    assert done.gaps == {0: OffsetGap(0, 5, 20)} and a.positions() == at(20)
    assert done.truncations[0].new_end_offset == 20 and log.log_start_offset == 20
    assert "offsets [5, 20) were deleted on the broker" in caplog.text
    done = a.append([part(20, batch(18, 4), log_start=20)])  # the broker's log start lies inside its batch
    assert [b.base_offset for b in log.read_batches()] == [18] and a.positions() == at(22)
    assert done.log_start_offsets == {0: 20}  # the caller raises the local log start offset to it


def test_a_local_log_beyond_the_brokers_high_watermark_is_cut_back_to_it(log, caplog):
    for base in range(0, 50, 10):
        log.append_batch(batch(base, 10))
    done = appender(log, watermarks=(0, 40)).append([part(50, b"", error=OFFSET_OUT_OF_RANGE)])
    assert done.truncations == {0: LogTruncation(0, 50, 40, -1, -1, "leader's high watermark")}
    assert log.log_end_offset == 40 and "beyond the leader's high watermark 40" in caplog.text


def test_a_diverging_epoch_truncates_to_the_divergence_point_and_nothing_of_the_answer_is_appended(log):
    log.append_batch(batch(0, 10, epoch=0))
    log.append_batch(batch(10, 10, epoch=1))
    log.append_batch(batch(20, 10, epoch=1))  # the leader lost [25, 30) and more of epoch 1 after 20
    a = appender(log)
    assert a.positions() == at(30, 1)  # LastFetchedEpoch: the epoch of the last local batch
    done = a.append([part(30, batch(30, 5, epoch=3), last_fetched_epoch=1, diverging=EpochEndOffset(1, 20))])
    assert done.truncations == {0: LogTruncation(0, 30, 20, 1, 1, "diverging epoch")} and done.batches == 0
    assert log.log_end_offset == 20 and a.positions() == at(20, 1)
    assert log.leader_epoch_cache.entries() == [(0, 0), (1, 10)]


def test_a_diverging_epoch_the_local_log_never_had_asks_again_from_the_epoch_before_it(log):
    log.append_batch(batch(0, 10, epoch=0))
    log.append_batch(batch(10, 10, epoch=2))  # epoch 2 never reached the new leader, which went 0 -> 3
    a = appender(log)
    a.append([part(20, b"", last_fetched_epoch=2, diverging=EpochEndOffset(0, 15))])
    # The leader's epoch 0 ends at 15; the local epoch 0 ends at 10 (where epoch 2 started): cut at 10.
    assert log.log_end_offset == 10 and a.positions() == at(10, 0)


def test_an_answer_to_an_older_last_fetched_epoch_is_dropped(log):
    log.append_batch(batch(0, 10, epoch=0))
    a = appender(log)
    done = a.append([part(10, batch(10, 5, epoch=0), last_fetched_epoch=-1)])  # sent before the epoch was known
    assert done.batches == 0 and log.log_end_offset == 10


def test_batches_of_a_leader_epoch_above_the_current_one_wait_for_fresher_metadata(log):
    done = appender(log).append([part(0, batch(0, 5, epoch=4) + batch(5, 5, epoch=5) + batch(10, 5, epoch=4),
                                      current_epoch=4)])
    assert done.batches == 1 and log.log_end_offset == 5  # KAFKA-18723: nothing from the epoch-5 batch on


@pytest.mark.parametrize(("leader", "fetch_offset", "expected"), [
    (EpochEndOffset(-1, -1), 30, (30, True)),  # the leader knows no such epoch: the fetch offset
    (EpochEndOffset(-1, 25), 30, (25, True)),  # a leader without epochs: its end offset
    (EpochEndOffset(1, 25), 30, (20, True)),  # same epoch: min(local end 20, leader end 25)
    (EpochEndOffset(1, 15), 30, (15, True)),  # same epoch: min(local end 20, leader end 15)
    (EpochEndOffset(2, 25), 30, (20, False)),  # unknown here: where the local epoch before it (1) ends
    (EpochEndOffset(5, 40), 30, (30, True)),  # no local answer for it (endOffsetFor undefined): min(40, LEO)
])
def test_truncation_target_follows_the_followers_rule(log, leader, fetch_offset, expected):
    log.append_batch(batch(0, 10, epoch=0))
    log.append_batch(batch(10, 10, epoch=1))
    log.append_batch(batch(20, 10, epoch=3))
    assert truncation_target(log, leader, fetch_offset) == expected


def test_committed_reader_from_log_follows_markers_as_they_are_appended(log):
    a = appender(log)
    a.append([part(0, batch(0, 2, producer_id=7, transactional=True) + batch(2, 2))])
    assert log.last_stable_offset == 0  # producer 7's transaction is open
    a.append([part(4, batch(4, 1, producer_id=7, marker="ABORT") + batch(5, 1, producer_id=8, transactional=True)
                     + batch(6, 1, producer_id=8, marker="COMMIT"))])
    reader = CommittedReader.from_log(log, 0)
    assert [r.offset for r in reader.records()] == [2, 3, 5]  # aborted data and markers left out
    assert reader.next_offset == 7 == log.last_stable_offset
    assert [r.offset for r in CommittedReader.from_log(log, 3).records()] == [3, 5]


def test_consumer_settings_are_translated_or_refused():
    options = KafkaSourceOptions(client_config={
        "security.protocol": "sasl_ssl", "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": "u",
        "sasl.password": "p", "ssl.ca.location": "/ca.pem", "ssl.endpoint.identification.algorithm": "none",
        "group.id": "ignored", "fetch.max.bytes": "1000", "client.id": "me"})
    config = replica_client_config(options, "a:9092,b:9092")
    assert config["bootstrap_servers"] == ["a:9092", "b:9092"]
    assert config["security_protocol"] == "SASL_SSL" and config["sasl_mechanism"] == "SCRAM-SHA-512"
    assert (config["sasl_plain_username"], config["sasl_plain_password"]) == ("u", "p")
    assert config["ssl_cafile"] == "/ca.pem" and config["ssl_check_hostname"] is False
    assert config["client_id"] == "me" and "group_id" not in config
    with pytest.raises(ValueError, match="'ssl.keystore.location' has no equal .* use --fetch consumer"):
        replica_client_config(KafkaSourceOptions(client_config={"ssl.keystore.location": "/k.p12"}), "a:9092")
    # reconnects back off as the consumer's settings say, else up to the Java client's 1 s (kafka-python: 30 s)
    assert replica_client_config(KafkaSourceOptions(), "a:9092")["reconnect_backoff_max_ms"] == 1_000
    tuned = replica_client_config(KafkaSourceOptions(client_config={"reconnect.backoff.max.ms": "5000",
                                                                    "reconnect.backoff.ms": "20"}), "a:9092")
    assert (tuned["reconnect_backoff_max_ms"], tuned["reconnect_backoff_ms"]) == (5000, 20)


def test_the_fetch_path_follows_the_settings_given():
    assert MaterializerOptions().fetch == "replica"
    assert MaterializerOptions(isolation_level="read_uncommitted").fetch == "consumer"
    assert MaterializerOptions(compression="zstd").fetch == "consumer"
    with pytest.raises(ValueError, match="needs fetch='consumer'"):
        MaterializerOptions(fetch="replica", isolation_level="read_uncommitted")
    with pytest.raises(ValueError, match="needs fetch='consumer'"):
        MaterializerOptions(fetch="replica", compression="zstd")
    with pytest.raises(ValueError, match="fetch must be"):
        MaterializerOptions(fetch="follower")  # type: ignore[arg-type]


def test_an_empty_log_starting_inside_a_broker_batch_takes_that_batch_whole(log):
    # A log restored from a snapshot starts at the snapshot's next offset, 6, inside the broker's [4..7].
    log.truncate_fully_and_start_at(6)
    done = appender(log).append([part(6, batch(4, 4) + batch(8, 2))])
    assert done.batches == 2 and log.log_end_offset == 10  # appended at once: no second round trip
    assert [b.base_offset for b in log.read_batches()] == [4, 8] and log.log_start_offset == 4
    assert [r.offset for r in CommittedReader.from_log(log, 6).records()] == [6, 7, 8, 9]


def test_partitions_added_while_a_fetch_is_in_flight_give_it_up_so_the_next_request_names_them():
    # The request in flight was sent without them; when the open partitions have nothing new the
    # leader holds it for poll_timeout_ms (measured: a caught-up partition handed over by the group
    # was served 0.51 s after its assignment, 0.025 s once the request is given up).
    from materializer.ingest.replica import ReplicaIngest

    class Fetcher:
        woken = 0
        in_flight = False

        def wakeup(self):
            self.woken += 1

    ingest = object.__new__(ReplicaIngest)
    ingest.fetcher = Fetcher()
    ingest.add_partitions({3: 0})
    assert ingest.fetcher.woken == 0  # nothing in flight: the next request is built from the logs
    ingest.fetcher.in_flight = True
    ingest.add_partitions({4: 0})
    assert ingest.fetcher.woken == 1
