"""Materializer against a fake source (no broker): log/store ordering, restart, rebuild, replay."""

from __future__ import annotations

import dataclasses
import os
import socket
import time

import pytest

import materializer.session as session_module
from materializer.adapters.errors import LeaderNotAvailableError
from materializer.adapters.kafka_source import Fetch, FetchedRecord
from materializer.adapters.rocksdb_store import StateStore
from materializer.config import MaterializerOptions, parse_config_overrides
from materializer.datadir.layout import state_dir, topic_config_path
from materializer.materializer import Materializer
from materializer.health import readiness
from materializer.storage.checkpoint import read_offset_checkpoint
from materializer.storage.compression import CompressionType
from materializer.storage.log import Log
from materializer.storage.log_config import LogConfig
from materializer.storage.log_loader import CLEAN_SHUTDOWN_FILE
from materializer.storage.record_batch import Record, TimestampType

TOPIC = "fake"


class FakeSource:
    """Stands in for KafkaSource: serves ``FakeSource.topic_data`` from the assigned offsets."""

    topic_data: dict[int, list[FetchedRecord]] = {}
    leaderless: set[int] = set()  # partitions in the metadata whose leader is not known yet
    configs: dict[str, str] = {"cleanup.policy": "compact", "compression.type": "producer"}
    instances: list["FakeSource"] = []

    unreachable_since = None  # KafkaSource: since when librdkafka reports the cluster away

    def __init__(self, bootstrap_servers, topic, options=None):
        self.positions_: dict[int, int] = {}
        self.fetched = 0
        FakeSource.instances.append(self)

    @property
    def partitions_without_leader(self):
        return frozenset(self.leaderless)

    def partitions(self, timeout_s=None):
        return sorted(self.topic_data)

    def topic_configs(self):
        return dict(self.configs)

    def watermark_offsets(self, partition, *, wait_for_leader=True):
        if partition in self.leaderless:  # as KafkaSource after its retries: no leader answered
            raise LeaderNotAvailableError(f"{partition}: Broker: Not leader for partition [NOT_LEADER_FOR_PARTITION]")
        records = self.topic_data[partition]
        return (records[0].record.offset if records else 0), (records[-1].record.offset + 1 if records else 0)

    def assign(self, start_offsets, epochs=None):
        self.positions_ = dict(start_offsets)

    def add_partitions(self, start_offsets, epochs=None):
        self.positions_.update(start_offsets)

    def remove_partitions(self, partitions):
        for partition in partitions:
            self.positions_.pop(partition, None)

    def topic_id(self):
        return None  # a cluster without topic ids: nothing to compare

    def cached_log_start_offsets(self, partitions):
        return {p: self.watermark_offsets(p)[0] for p in partitions}

    def fetch(self, max_records, timeout_ms):
        out: list[FetchedRecord] = []
        eof: dict[int, int] = {}
        for partition, records in sorted(self.topic_data.items()):
            if partition not in self.positions_:  # not assigned
                continue
            pending = [r for r in records if r.record.offset >= self.positions_[partition]][: max_records - len(out)]
            out.extend(pending)
            if pending:
                self.positions_[partition] = pending[-1].record.offset + 1
            elif self.positions_[partition] >= self.watermark_offsets(partition)[1]:
                eof[partition] = self.positions_[partition]
        self.fetched += len(out)
        return Fetch(out, eof, sum(len(r.record.value or b"") for r in out))

    def positions(self, partitions):
        return {p: self.positions_[p] for p in partitions}

    def cached_high_watermarks(self, partitions):
        return {p: self.watermark_offsets(p)[1] for p in partitions}

    reachable = True  # KafkaSource.reachable: the cached high watermarks are current

    def close(self):
        pass


@pytest.fixture
def fake_source(monkeypatch):
    FakeSource.instances = []
    FakeSource.topic_data = {}
    FakeSource.leaderless = set()
    FakeSource.configs = {"cleanup.policy": "compact", "compression.type": "producer"}
    monkeypatch.setattr(session_module, "KafkaSource", FakeSource)
    return FakeSource


def _produce(data, partition, start, keys, *, ts_type=TimestampType.CREATE_TIME, tombstone_every=0, step=1):
    records = data.setdefault(partition, [])
    offset = records[-1].record.offset + 1 if records else start
    for i, key in enumerate(keys):
        value = None if tombstone_every and i % tombstone_every == tombstone_every - 1 else f"v{offset}".encode()
        records.append(FetchedRecord(partition, Record(offset, 1_700_000_000_000 + offset, key, value,
                                                       (("h", b"x"), ("n", None))), ts_type))
        offset += step


def _expected(data):
    state = {}
    for records in data.values():
        for item in records:
            if item.record.key is None:
                continue
            if item.record.value is None:
                state.pop(item.record.key, None)
            else:
                state[item.record.key] = item.record.value
    return state


def _materialize(tmp_path, **options):
    with Materializer("fake:9092", TOPIC, tmp_path, options=MaterializerOptions(fetch="consumer", batch_size=37, **options)) as m:
        stats = m.run(until_caught_up=True)
        state = {k: v.value for k, v in m.store.items()}
    return stats, state


def _local_records(tmp_path, partition):
    with Log.open(tmp_path / f"{TOPIC}-{partition}", LogConfig(), had_clean_shutdown=True) as log:
        return list(log.read_records())


def test_ingest_restart_and_rebuild(tmp_path, fake_source):
    data = fake_source.topic_data
    _produce(data, 0, 0, [b"k%d" % (i % 17) for i in range(300)], tombstone_every=7)
    _produce(data, 1, 0, [b"j%d" % (i % 5) for i in range(50)], ts_type=TimestampType.LOG_APPEND_TIME)
    _produce(data, 2, 0, [b"a", None, b"b", None])

    stats, state = _materialize(tmp_path)
    assert state == _expected(data)
    assert stats.records_fetched == 354 and stats.null_key_records == 2
    assert stats.records_applied == 352
    for partition, records in data.items():
        assert _local_records(tmp_path, partition) == [item.record for item in records]
    assert (tmp_path / CLEAN_SHUTDOWN_FILE).exists()
    assert read_offset_checkpoint(tmp_path / "recovery-point-offset-checkpoint") == {
        (TOPIC, 0): 300, (TOPIC, 1): 50, (TOPIC, 2): 4}
    assert read_offset_checkpoint(tmp_path / "log-start-offset-checkpoint") == {
        (TOPIC, 0): 0, (TOPIC, 1): 0, (TOPIC, 2): 0}
    assert LogConfig.load(topic_config_path(tmp_path, TOPIC)).compact

    # restart: only new records are fetched
    _produce(data, 0, 0, [b"k1", b"new"], step=3)  # offset gaps, as read_committed leaves them
    stats, state = _materialize(tmp_path)
    assert stats.records_fetched == 2 and stats.records_replayed == 0
    assert stats.start_offsets == {0: 300, 1: 50, 2: 4}
    assert state == _expected(data)

    # store deleted: rebuilt from the local log, nothing refetched
    StateStore.destroy(state_dir(tmp_path, TOPIC))
    stats, state = _materialize(tmp_path)
    assert stats.store_rebuilt and stats.records_fetched == 0
    assert stats.records_replayed == 356 - 2
    assert state == _expected(data)


def test_log_ahead_of_store_replays_tail(tmp_path, fake_source):
    data = fake_source.topic_data
    _produce(data, 0, 0, [b"a", b"b", b"c"])
    _materialize(tmp_path)
    # a crash between "log flushed" and "store applied": the log has records the store lacks
    with Log.open(tmp_path / f"{TOPIC}-0", LogConfig(), had_clean_shutdown=True) as log:
        log.append_records([Record(3, 5, b"a", None), Record(4, 5, b"d", b"4")])
    _produce(data, 0, 0, [b"zz", b"zz"])  # broker offsets 3, 4 -- already in the local log
    data[0][3] = FetchedRecord(0, Record(3, 5, b"a", None), TimestampType.CREATE_TIME)
    data[0][4] = FetchedRecord(0, Record(4, 5, b"d", b"4"), TimestampType.CREATE_TIME)
    stats, state = _materialize(tmp_path)
    assert stats.records_replayed == 2 and stats.records_fetched == 0 and not stats.store_rebuilt
    assert state == {b"b": b"v1", b"c": b"v2", b"d": b"4"}


def test_store_ahead_of_log_rebuilds(tmp_path, fake_source):
    data = fake_source.topic_data
    _produce(data, 0, 0, [b"a", b"b"])
    _materialize(tmp_path)
    with StateStore(state_dir(tmp_path, TOPIC)) as store:
        store.apply({0: [Record(10, 0, b"ghost", b"x")]}, {0: 11})
    stats, state = _materialize(tmp_path)
    assert stats.store_rewinds == 1 and not stats.store_rebuilt  # that partition alone is rebuilt
    assert state == {b"a": b"v0", b"b": b"v1"}


def test_damaged_store_is_rebuilt(tmp_path, fake_source):
    data = fake_source.topic_data
    _produce(data, 0, 0, [b"a", b"b"])
    _materialize(tmp_path)
    for manifest in state_dir(tmp_path, TOPIC).glob("MANIFEST*"):
        manifest.write_bytes(b"garbage")
    stats, state = _materialize(tmp_path)
    assert stats.store_rebuilt and stats.records_fetched == 0
    assert state == {b"a": b"v0", b"b": b"v1"}


def test_store_of_format_version_1_is_rebuilt(tmp_path, fake_source, caplog):
    # Version 1 keyed the data by key alone; a store written by it is rebuilt from the local log
    # (one warning saying why), not an error the user must fix.
    import struct

    from materializer.adapters.rocksdb_store import FORMAT_VERSION_KEY

    data = fake_source.topic_data
    _produce(data, 0, 0, [b"a", b"b"])
    _materialize(tmp_path)
    with StateStore(state_dir(tmp_path, TOPIC)) as store:
        store._metadata[FORMAT_VERSION_KEY] = struct.pack(">i", 1)
    caplog.set_level("WARNING", logger="materializer")
    stats, state = _materialize(tmp_path)
    assert stats.store_rebuilt and stats.records_fetched == 0
    assert state == {b"a": b"v0", b"b": b"v1"}
    assert [r.getMessage() for r in caplog.records if "format version 1" in r.getMessage()
            and "rebuilding it from the local log" in r.getMessage()]


def test_same_key_in_two_partitions_stays_two_entries(tmp_path, fake_source):
    # Issue 7.1: one partition's record or tombstone never touches another partition's entry.
    data = fake_source.topic_data
    for partition, offset, timestamp, value in [(0, 0, 1_000, b"B"), (1, 0, 2_000, b"A"), (0, 1, 3_000, b"C"),
                                                 (1, 1, 4_000, None)]:
        data.setdefault(partition, []).append(
            FetchedRecord(partition, Record(offset, timestamp, b"dup", value), TimestampType.CREATE_TIME))
    with Materializer("fake:9092", TOPIC, tmp_path, options=MaterializerOptions(fetch="consumer")) as m:
        m.run(until_caught_up=True)
        assert [(k, v) for k, v in m.store.items()] == [(b"dup", (0, 1, 3_000, b"C"))]
    data[1].append(FetchedRecord(1, Record(2, 5_000, b"dup", b"D"), TimestampType.CREATE_TIME))
    StateStore.destroy(state_dir(tmp_path, TOPIC))  # and a store rebuilt from the local log agrees
    with Materializer("fake:9092", TOPIC, tmp_path, options=MaterializerOptions(fetch="consumer")) as m:
        stats = m.run(until_caught_up=True)
        assert stats.store_rebuilt and stats.records_fetched == 1
        assert m.store.get_all(b"dup") == {0: (0, 1, 3_000, b"C"), 1: (1, 2, 5_000, b"D")}
        assert m.store.get(b"dup") == (1, 2, 5_000, b"D") and m.store.get(b"dup", 0).value == b"C"


def test_compression_and_batch_cap(tmp_path, fake_source):
    data = fake_source.topic_data
    _produce(data, 0, 0, [b"k%d" % i for i in range(200)])
    stats, _ = _materialize(tmp_path, compression="zstd", max_batch_bytes=500)
    with Log.open(tmp_path / f"{TOPIC}-0", LogConfig(), had_clean_shutdown=True) as log:
        batches = list(log.read_batches())
    assert {b.compression_type for b in batches} == {CompressionType.ZSTD}
    assert len(batches) == stats.batches_appended > 200 // 37
    assert [r for b in batches for r in b.records()] == [item.record for item in data[0]]


def test_topic_compression_type_is_default_and_overrides_win(tmp_path, fake_source):
    fake_source.configs = {"cleanup.policy": "compact", "compression.type": "lz4", "segment.bytes": "1073741824"}
    _produce(fake_source.topic_data, 0, 0, [b"a"] * 120)
    _materialize(tmp_path, config_overrides=parse_config_overrides(["segment.bytes=500"]))
    with Log.open(tmp_path / f"{TOPIC}-0", LogConfig(), had_clean_shutdown=True) as log:
        batches = list(log.read_batches())
        assert len(log.log_segments()) > 1
    assert {b.compression_type for b in batches} == {CompressionType.LZ4}
    assert LogConfig.load(topic_config_path(tmp_path, TOPIC)).segment_bytes == 500


def test_empty_log_starts_at_broker_log_start_offset(tmp_path, fake_source):
    _produce(fake_source.topic_data, 0, 1000, [b"a", b"b"])
    stats, state = _materialize(tmp_path)
    assert stats.start_offsets == {0: 1000}
    assert read_offset_checkpoint(tmp_path / "log-start-offset-checkpoint") == {(TOPIC, 0): 1000}
    assert state == {b"a": b"v1000", b"b": b"v1001"}


def test_parse_config_overrides():
    assert parse_config_overrides(["segment.ms=1", " cleanup.policy = compact,delete "]) == {
        "segment.ms": "1", "cleanup.policy": "compact,delete"}
    with pytest.raises(ValueError):
        parse_config_overrides(["novalue"])
    with pytest.raises(ValueError, match="unknown topic config 'a.b'"):
        parse_config_overrides(["a.b=1"])  # would have no effect: refused rather than ignored
    with pytest.raises(ValueError, match="segment.ms"):
        parse_config_overrides(["segment.ms=0"])


def _json_records(data, partition, values):
    records = data.setdefault(partition, [])
    for value in values:
        offset = records[-1].record.offset + 1 if records else 0
        records.append(FetchedRecord(partition, Record(offset, 1_700_000_000_000 + offset, b"k%d" % (offset % 3),
                                                       value), TimestampType.CREATE_TIME))


def test_a_value_that_does_not_decode_stops_the_run_before_anything_of_its_fetch_is_written(tmp_path, fake_source):
    from materializer.adapters.errors import DeserializationError

    data = fake_source.topic_data
    _json_records(data, 0, [b'{"v": %d}' % i for i in range(5)] + [b"not json"] + [b'{"v": 9}'])
    with pytest.raises(DeserializationError) as err:
        _materialize(tmp_path, value_format="json")
    assert (err.value.partition, err.value.offset) == (0, 5)
    assert "fake-0 at offset 5" in str(err.value)
    assert _local_records(tmp_path, 0) == []  # the whole fetch was refused: the next start fetches it again
    # The same topic read as bytes (the default) materializes everything.
    stats, state = _materialize(tmp_path)
    assert stats.records_applied == 7 and state[b"k2"] == b"not json"


def test_skip_keeps_a_bad_record_in_the_log_but_not_in_the_store_also_on_replay(tmp_path, fake_source):
    data = fake_source.topic_data
    _json_records(data, 0, [b'{"v": 0}', b'{"v": 1}', b'{"v": 2}', b"\xff", None, b'{"v": 5}'])
    stats, state = _materialize(tmp_path, value_format="json", on_bad_record="skip")
    assert stats.records_skipped == 1
    # k0: offset 3 (bad, skipped) keeps offset 0's value; k1: offset 4 is a tombstone (never decoded).
    assert state == {b"k0": b'{"v": 0}', b"k2": b'{"v": 5}'}
    assert len(_local_records(tmp_path, 0)) == 6  # the local log still mirrors the topic
    # A rebuild from the local log applies the same rule.
    import shutil
    shutil.rmtree(state_dir(tmp_path, TOPIC))
    stats, state = _materialize(tmp_path, value_format="json", on_bad_record="skip")
    assert stats.store_rebuilt and stats.records_skipped == 1
    assert state == {b"k0": b'{"v": 0}', b"k2": b'{"v": 5}'}


def test_view_reads_the_running_store_typed(tmp_path, fake_source):
    data = fake_source.topic_data
    _json_records(data, 0, [b'{"v": 0}', b'{"v": 1}'])
    with Materializer("fake:9092", TOPIC, tmp_path,
                      options=MaterializerOptions(fetch="consumer", key_format="str", value_format="json")) as m:
        m.run(until_caught_up=True)
        view = m.view()
        assert view.get("k1") == {"v": 1} and view.get_entry("k0").offset == 0


def test_a_new_partition_without_a_leader_yet_is_taken_on_at_the_next_refresh(tmp_path, fake_source):
    # Right after CreatePartitions the metadata lists a partition whose leader has not taken it on
    # (ListOffsets: NOT_LEADER_OR_FOLLOWER). The refresh opens the others and leaves it for the next
    # one, with no folder, instead of ending the run.
    data = fake_source.topic_data
    _produce(data, 0, 0, [b"a", b"b"])
    with Materializer("fake:9092", TOPIC, tmp_path, options=MaterializerOptions(fetch="consumer")) as m:
        m.run(until_caught_up=True)
        _produce(data, 1, 0, [b"c"])
        _produce(data, 2, 5, [b"d", b"e"])
        fake_source.leaderless = {2}
        assert m.add_new_partitions() == [1]
        assert not (tmp_path / f"{TOPIC}-2").exists()
        assert sorted(m.logs) == [0, 1]
        # not ready while the store has none of partition 2's keys: readiness says which and why
        probe = readiness(m.health)
        assert not m.health.caught_up and dict(m.health.unavailable_partitions) == {
            2: "in the topic but not taken on yet: no leader known for it"}
        assert probe.detail["unavailable_partitions"] == {"2": "in the topic but not taken on yet: no leader known "
                                                                 "for it"}
        assert any(reason.startswith("no leader to fetch from for partition(s) 2: ") for reason in probe.reasons)
        fake_source.leaderless = set()
        assert m.add_new_partitions() == [2]
        assert m.health.unavailable_partitions == {}
        assert m.logs[2].log_start_offset == 5
        m.run(until_caught_up=True)
        assert {k: v.value for k, v in m.store.items()} == _expected(data)
        with pytest.raises(LeaderNotAvailableError):  # asked for by name (a group's assignment), it is an error
            fake_source.leaderless = {3}
            _produce(data, 3, 0, [b"f"])
            m.open_partitions([3])
        assert not (tmp_path / f"{TOPIC}-3").exists()


class FakeMembership:
    """Stands in for GroupMembership: assigns ``initial`` at once, then what a test hands it."""

    initial: frozenset[int] = frozenset()
    instance: "FakeMembership | None" = None
    running, error, member_id, generation = True, None, "member-1", 1

    def __init__(self, bootstrap_servers, group_id, topics, *, on_assign, on_revoke, on_lost, **kwargs):
        self.on_assign, self.on_revoke = on_assign, on_revoke
        FakeMembership.instance = self
        on_assign(frozenset((TOPIC, p) for p in self.initial))

    def session_timeout_ms(self, configured):
        return configured  # a classic group's: the member's own setting

    def close(self):
        pass


def test_an_assigned_partition_without_a_leader_yet_is_opened_once_it_has_one(tmp_path, fake_source, monkeypatch):
    import materializer.group.member as member_module

    monkeypatch.setattr(member_module, "GroupMembership", FakeMembership)
    FakeMembership.initial = frozenset({0})
    data = fake_source.topic_data
    _produce(data, 0, 0, [b"a", b"b"])
    _produce(data, 1, 0, [b"c"])
    options = MaterializerOptions(fetch="consumer", group_id="g")
    with Materializer("fake:9092", TOPIC, tmp_path, options=options) as m:
        m.run(until_caught_up=True)
        assert sorted(m.logs) == [0]
        fake_source.leaderless = {1}
        FakeMembership.instance.on_assign(frozenset({(TOPIC, 1)}))
        m.run(until_caught_up=True)  # the assignment is not applied yet, and the run does not fail
        assert sorted(m.logs) == [0] and not (tmp_path / f"{TOPIC}-1").exists()
        assert m.stats.group_rebalances == 0
        fake_source.leaderless = set()
        m.run(until_caught_up=True)
        assert sorted(m.logs) == [0, 1] and m.stats.group_rebalances == 1
        assert {k: v.value for k, v in m.store.items()} == _expected(data)


def test_a_membership_that_ended_stops_the_run_instead_of_serving_on(tmp_path, fake_source, monkeypatch):
    # Once the member is out of the group its partitions go to others: going on would serve stale data.
    import materializer.group.member as member_module
    from materializer.adapters.errors import GroupMembershipError

    monkeypatch.setattr(member_module, "GroupMembership", FakeMembership)
    FakeMembership.initial = frozenset({0})
    _produce(fake_source.topic_data, 0, 0, [b"a"])
    with Materializer("fake:9092", TOPIC, tmp_path, options=MaterializerOptions(fetch="consumer", group_id="g")) as m:
        m.run(until_caught_up=True)
        FakeMembership.instance.running = False  # its thread ended (a fatal error, a fenced member)
        with pytest.raises(GroupMembershipError, match="the membership ended"):
            m.run(until_caught_up=True)
        assert m.health.failed is not None and not m.health.ready


def _member(tmp_path, monkeypatch, initial, **options):
    import materializer.group.member as member_module

    monkeypatch.setattr(member_module, "GroupMembership", FakeMembership)
    FakeMembership.initial = frozenset(initial)
    return Materializer("fake:9092", TOPIC, tmp_path, options=MaterializerOptions(fetch="consumer", group_id="g", **options))


def _revoke(m, *partitions):
    FakeMembership.instance.on_revoke(frozenset((TOPIC, p) for p in partitions))
    m.run(until_caught_up=True)  # applies the change
    assert not set(partitions) & set(m.logs)


def test_a_kept_partition_expires_by_time_store_entries_folder_and_checkpoints_with_it(tmp_path, fake_source,
                                                                                           monkeypatch):
    import os

    data = fake_source.topic_data
    for p in (0, 1, 2):
        _produce(data, p, 0, [f"k{p}-{i}".encode() for i in range(5)])
    with _member(tmp_path, monkeypatch, {0, 1, 2}, revoked_retention_ms=600_000) as m:
        m.run(until_caught_up=True)
        _revoke(m, 1, 2)
        assert m.expire_kept_partitions() == []  # released just now
        assert m.store.count(1) == 5 and (tmp_path / f"{TOPIC}-1").is_dir()
        released = os.stat(tmp_path / f"{TOPIC}-1").st_mtime
        os.utime(tmp_path / f"{TOPIC}-1", (released - 601, released - 601))  # released 601 s ago
        assert m.expire_kept_partitions() == [1]
        assert m.store.count(1) == 0 and m.store.count(2) == 5 and m.store.count(0) == 5
        assert not (tmp_path / f"{TOPIC}-1").exists() and (tmp_path / f"{TOPIC}-2").is_dir()
        assert (TOPIC, 1) not in read_offset_checkpoint(tmp_path / "recovery-point-offset-checkpoint")
        assert m.stats.group_kept_partitions_dropped == 1
        # assigned again, it is fetched whole and served as the topic holds it
        FakeMembership.instance.on_assign(frozenset({(TOPIC, 1)}))
        fetched = m.stats.records_fetched
        m.run(until_caught_up=True)
        assert m.stats.records_fetched - fetched == 5 and m.store.count(1) == 5
    assert not [p for p in tmp_path.iterdir() if p.name.endswith("-delete")]


def test_kept_partitions_beyond_the_byte_bound_go_oldest_release_first(tmp_path, fake_source, monkeypatch):
    import os

    data = fake_source.topic_data
    for p in (0, 1, 2):
        _produce(data, p, 0, [f"k{p}-{i}".encode() for i in range(5)])
    with _member(tmp_path, monkeypatch, {0, 1, 2}, revoked_retention_ms=-1) as m:
        m.run(until_caught_up=True)
        _revoke(m, 1)
        one_folder = sum(f.stat().st_size for f in (tmp_path / f"{TOPIC}-1").iterdir())  # closed: indexes trimmed
        now = os.stat(tmp_path / f"{TOPIC}-1").st_mtime
        os.utime(tmp_path / f"{TOPIC}-1", (now - 10, now - 10))
        # the bound once one folder's size is known (the group member holds the options it was made with)
        m.options = m._member.options = dataclasses.replace(m.options, revoked_retention_bytes=one_folder + 100)
        _revoke(m, 2)  # two folders kept now, over the bound: the one let go first goes
        assert not (tmp_path / f"{TOPIC}-1").exists() and (tmp_path / f"{TOPIC}-2").is_dir()
        assert m.store.count(1) == 0 and m.store.count(2) == 5


def test_with_no_retention_a_revoked_partition_is_dropped_at_once(tmp_path, fake_source, monkeypatch):
    data = fake_source.topic_data
    for p in (0, 1):
        _produce(data, p, 0, [f"k{p}-{i}".encode() for i in range(3)])
    with _member(tmp_path, monkeypatch, {0, 1}, revoked_retention_ms=0) as m:
        m.run(until_caught_up=True)
        _revoke(m, 1)
        assert not (tmp_path / f"{TOPIC}-1").exists() and m.store.count(1) == 0 and m.store.count(0) == 3


def test_a_kept_folder_whose_store_entries_were_dropped_is_applied_again_from_the_log(tmp_path, fake_source,
                                                                                        monkeypatch):
    # What a crash between the two steps of an expiry leaves (store entries go first, the folder last):
    # when the partition comes back, its log is applied again and nothing is fetched twice.
    data = fake_source.topic_data
    for p in (0, 1):
        _produce(data, p, 0, [f"k{p}-{i}".encode() for i in range(4)])
    with _member(tmp_path, monkeypatch, {0, 1}, revoked_retention_ms=-1) as m:
        m.run(until_caught_up=True)
        _revoke(m, 1)
        assert m.store.drop_partition(1) == 4
        FakeMembership.instance.on_assign(frozenset({(TOPIC, 1)}))
        fetched = m.stats.records_fetched
        m.run(until_caught_up=True)
        assert m.stats.records_fetched == fetched and m.store.count(1) == 4
        assert {k: v.value for k, v in m.store.items()} == _expected(data)


def _key_of(partition: int, partitions: int = 2) -> bytes:
    from materializer.group.routing import partition_for_key

    return next(k for k in (f"key-{i}".encode() for i in range(1000)) if partition_for_key(k, partitions) == partition)


def test_a_partition_assigned_again_is_served_only_once_it_has_caught_up(tmp_path, fake_source, monkeypatch):
    # Its kept entries are older than what the member that held it meanwhile served: serving them
    # while the delta is fetched would be a stale read (in this process and for readers of the marker).
    import materializer.group.member as member_module
    from materializer.adapters.errors import PartitionNotAssignedError
    from materializer.view import MaterializedView, served_by_marker

    monkeypatch.setattr(member_module, "GroupMembership", FakeMembership)
    monkeypatch.setattr(FakeSource, "remove_partitions", lambda self, partitions: None, raising=False)
    FakeMembership.initial = frozenset({0, 1})
    data = fake_source.topic_data
    key0, key1 = _key_of(0), _key_of(1)
    _produce(data, 0, 0, [key0])
    _produce(data, 1, 0, [key1])
    seen_when_assigned: list[object] = []

    def on_assign(partitions: frozenset[int]) -> None:  # the run loop's thread, right after opening
        marker = served_by_marker(tmp_path, TOPIC)
        assert marker is not None
        seen_when_assigned.append((m.served_partitions(), marker.partitions(), m.assigned_partitions()))
        with pytest.raises(PartitionNotAssignedError, match="still catching up") as here:
            m.view().get(key1)
        assert here.value.catching_up
        with MaterializedView.open(tmp_path, TOPIC) as beside, pytest.raises(PartitionNotAssignedError) as there:
            beside.get(key1)
        assert not there.value.catching_up  # a reader of the marker cannot tell

    with Materializer("fake:9092", TOPIC, tmp_path, options=MaterializerOptions(fetch="consumer", group_id="g")) as m:
        m.on_assign(on_assign)
        m.run(until_caught_up=True)
        assert m.served_partitions() == {0, 1} and m.view().get(key1) == b"v0"
        FakeMembership.instance.on_revoke(frozenset({(TOPIC, 1)}))
        m.run(until_caught_up=True)
        assert m.served_partitions() == {0} and served_by_marker(tmp_path, TOPIC).partitions() == {0}
        _produce(data, 1, 0, [key1])  # another member materializes (and serves) v1 meanwhile
        FakeMembership.instance.on_assign(frozenset({(TOPIC, 1)}))
        m.run(until_caught_up=True)
        assert seen_when_assigned == [(frozenset({0}), frozenset({0}), frozenset({0, 1}))]
        assert m.served_partitions() == {0, 1} and served_by_marker(tmp_path, TOPIC).partitions() == {0, 1}
        assert m.view().get(key1) == b"v1"


def test_a_revocation_is_applied_without_asking_the_cluster(tmp_path, fake_source, monkeypatch):
    # A member cut off from the cluster that the group took a partition from must still stop
    # serving it: the partition count is read only when partitions are assigned (a review found it
    # read before the revocations, so an unreachable cluster kept the partition served).
    import materializer.group.member as member_module
    from materializer.adapters.errors import BrokerUnreachableError
    from materializer.view import served_by_marker

    monkeypatch.setattr(member_module, "GroupMembership", FakeMembership)
    monkeypatch.setattr(FakeSource, "remove_partitions", lambda self, partitions: None, raising=False)
    FakeMembership.initial = frozenset({0, 1})
    _produce(fake_source.topic_data, 0, 0, [_key_of(0)])
    _produce(fake_source.topic_data, 1, 0, [_key_of(1)])
    with Materializer("fake:9092", TOPIC, tmp_path, options=MaterializerOptions(fetch="consumer", group_id="g")) as m:
        m.run(until_caught_up=True)
        assert served_by_marker(tmp_path, TOPIC).partitions() == {0, 1}

        def unreachable(self, timeout_s=None):
            raise BrokerUnreachableError("fake:9092 does not answer")

        monkeypatch.setattr(FakeSource, "partitions", unreachable)
        FakeMembership.instance.on_revoke(frozenset({(TOPIC, 1)}))
        m.run(until_caught_up=True)
        assert m.served_partitions() == {0} and served_by_marker(tmp_path, TOPIC).partitions() == {0}


def test_a_restarted_member_serves_nothing_of_its_previous_assignment_until_caught_up(tmp_path, fake_source, monkeypatch):
    # A SIGKILLed (or stopped) member's marker names what it held; the group moves those partitions
    # while it is away, so its restart withdraws them before joining and names them again once caught up.
    import materializer.group.member as member_module
    from materializer.adapters.errors import PartitionNotAssignedError
    from materializer.view import MaterializedView, served_by_marker

    monkeypatch.setattr(member_module, "GroupMembership", FakeMembership)
    FakeMembership.initial = frozenset({0, 1})
    data = fake_source.topic_data
    key1 = _key_of(1)
    _produce(data, 0, 0, [_key_of(0)])
    _produce(data, 1, 0, [key1])
    options = MaterializerOptions(fetch="consumer", group_id="g")
    with Materializer("fake:9092", TOPIC, tmp_path, options=options) as m:
        m.run(until_caught_up=True)
    assert served_by_marker(tmp_path, TOPIC).partitions() == {0, 1}
    _produce(data, 1, 0, [key1])
    with Materializer("fake:9092", TOPIC, tmp_path, options=options) as m:
        m.start()
        assert served_by_marker(tmp_path, TOPIC).partitions() == frozenset()
        assert m.served_partitions() == frozenset() and m.assigned_partitions() == {0, 1}
        with MaterializedView.open(tmp_path, TOPIC) as beside, pytest.raises(PartitionNotAssignedError):
            beside.get(key1)
        m.run(until_caught_up=True)
        assert served_by_marker(tmp_path, TOPIC).partitions() == {0, 1} and m.view().get(key1) == b"v1"


def test_a_kept_folder_that_cannot_be_deleted_is_tried_again_and_the_run_goes_on(tmp_path, fake_source, monkeypatch):
    from materializer.storage.log_manager import TopicLogs

    data = fake_source.topic_data
    for p in (0, 1):
        _produce(data, p, 0, [f"k{p}-{i}".encode() for i in range(3)])
    real_delete = TopicLogs.delete_partition
    failures = iter([OSError(5, "Input/output error")])

    def flaky_delete(self, partition):
        failure = next(failures, None)
        if failure is not None:
            raise failure
        return real_delete(self, partition)

    monkeypatch.setattr(TopicLogs, "delete_partition", flaky_delete)
    with _member(tmp_path, monkeypatch, {0, 1}, revoked_retention_ms=0) as m:
        m.run(until_caught_up=True)
        _revoke(m, 1)  # the first deletion fails: logged, the run goes on
        assert (tmp_path / f"{TOPIC}-1").is_dir() and m.store.count(1) == 0
        assert m.stats.group_kept_partitions_dropped == 0
        assert m.expire_kept_partitions() == [1]  # the next check
        assert not (tmp_path / f"{TOPIC}-1").exists() and m.stats.group_kept_partitions_dropped == 1


def test_a_start_that_fails_once_the_session_is_open_closes_it_before_letting_the_data_dir_go(tmp_path, fake_source,
                                                                                            monkeypatch):
    # Publishing the served partitions (a marker write: a full disk) fails after the logs and the
    # store are open: they are closed while the lock is held, so the next writer finds them closed.
    _produce(fake_source.topic_data, 0, 0, [b"a", b"b"])
    failing = _member(tmp_path, monkeypatch, {0})
    serve = Materializer._serve
    monkeypatch.setattr(Materializer, "_serve", lambda self, session: (_ for _ in ()).throw(OSError("disk full")))
    with pytest.raises(OSError, match="disk full"):
        failing.start()
    assert failing._session is None and failing._data_dir_lock is None
    monkeypatch.setattr(Materializer, "_serve", serve)
    _, state = _materialize(tmp_path)  # the store and logs were let go: opened again in this process
    assert state == {b"a": b"v0", b"b": b"v1"}


def test_a_member_serves_its_share_for_good_after_a_bounded_run_and_only_while_it_runs_in_a_continuous_one(
        tmp_path, fake_source, monkeypatch):
    # Readers refuse a continuous member's partitions once its process is gone (the marker names it,
    # "served_by"); a bounded run's share stays readable after it. The same object may run both ways.
    import threading

    from materializer.datadir.markers import topic_status

    def served_by():
        group = topic_status(tmp_path, TOPIC).facts["group"]
        assert group["partitions"] == [0], group
        return group.get("served_by")

    _produce(fake_source.topic_data, 0, 0, [b"a", b"b"])
    m = _member(tmp_path, monkeypatch, {0})
    with m:
        m.run(until_caught_up=True)
        assert served_by() is None
        runner = threading.Thread(target=m.run)
        runner.start()
        deadline = time.monotonic() + 30
        while served_by() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert served_by() == {"pid": os.getpid(), "host": socket.gethostname(), "since": m._data_dir_lock.holder.since}
        m.stop()
        runner.join(30)
        m.run(until_caught_up=True)  # bounded again: its share is the job's output
        assert served_by() is None
    assert served_by() is None  # kept readable after the close
