"""A damaged local log never replays short (issue 7, items 2 and 3), against a real broker.

The segments below the recovery point are not re-checked when a log is opened after a clean
shutdown (Kafka's LogLoader neither). Damage there -- a middle segment cut mid-batch, a flipped bit
in a batch's base offset (outside the CRC) -- used to make a store rebuild stop early and exit 0,
serving stale values, resurrected deletes and missing keys, and the lost offsets were never fetched
again. Now the rebuild finds the damage, recovers that log from the damaged offset (cut, later
segments deleted), and `run` fetches the cut offsets from the broker again: the store equals the
latest value per key that a read_committed consumer reads.
"""

from __future__ import annotations

import shutil

import pytest

from materializer import Materializer, MaterializerOptions
from materializer.datadir.layout import state_dir
from materializer.datadir.markers import topic_status
from tests.fuzz_harness import batch_spans

from .background_run import BackgroundRun, wait_until
from .test_ingest import Produced, produce

pytestmark = pytest.mark.broker

_SMALL_SEGMENTS = {"segment.bytes": "4096"}


def _materialize(bootstrap: str, topic: str, data_dir):
    options = MaterializerOptions(config_overrides=_SMALL_SEGMENTS, cleaner_threads=0)
    with Materializer(bootstrap, topic, data_dir, options=options) as materializer:
        stats = materializer.run(until_caught_up=True)
        state = {key: (v.partition, v.offset, v.value) for key, v in materializer.store.items()}
    return stats, state


def _batch_positions(path) -> list[int]:
    return [start for start, _ in batch_spans(path.read_bytes())]


def _cut_mid_batch(path) -> None:
    last = _batch_positions(path)[-1]
    with open(path, "r+b") as f:
        f.truncate(last + 30)


def _flip_base_offset_bit(path) -> None:
    positions = _batch_positions(path)
    data = bytearray(path.read_bytes())
    data[positions[len(positions) // 2] + 7] ^= 0x04  # bit 2 of the base offset's last byte
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("damage", [_cut_mid_batch, _flip_base_offset_bit], ids=["cut-mid-batch", "base-offset-bit"])
def test_rebuild_over_a_damaged_middle_segment_refetches_what_was_cut(kafka_broker, create_topic, tmp_path, damage,
                                                                      caplog):
    topic = create_topic(partitions=2, config={"cleanup.policy": "compact"})
    bootstrap = kafka_broker.bootstrap_servers
    produced = Produced()
    produce(bootstrap, topic, produced, count=3000, keys=300, codec="lz4", seed=7, batch_bytes=1024)
    _, state = _materialize(bootstrap, topic, tmp_path)
    assert state == produced.expected_state()

    segments = sorted((tmp_path / f"{topic}-0").glob("*.log"))
    assert len(segments) >= 3, segments
    damage(segments[1])
    shutil.rmtree(state_dir(tmp_path, topic))

    stats, state = _materialize(bootstrap, topic, tmp_path)
    assert stats.store_rebuilt
    assert state == produced.expected_state()
    assert stats.records_fetched > 0  # the cut offsets of partition 0 were fetched again
    assert stats.start_offsets[0] < stats.high_watermarks[0]
    assert any("damaged local log" in r.getMessage() and str(segments[1]) in r.getMessage() for r in caplog.records)


def test_log_start_offset_checkpoint_past_the_log_end_refetches_the_partition(kafka_broker, create_topic, tmp_path,
                                                                              caplog):
    # Issue 7.5: a log-start-offset-checkpoint value past the log end made LogLoader delete the
    # local segments, and every later `run` failed fetching out of range. Now the empty log restarts
    # at the broker's log start offset, as a consumer with auto.offset.reset=earliest would.
    from materializer.storage.checkpoint import read_offset_checkpoint, write_offset_checkpoint

    topic = create_topic(partitions=2, config={"cleanup.policy": "compact"})
    bootstrap = kafka_broker.bootstrap_servers
    produced = Produced()
    produce(bootstrap, topic, produced, count=800, keys=100, codec="zstd", seed=11)
    _materialize(bootstrap, topic, tmp_path)

    checkpoint = tmp_path / "log-start-offset-checkpoint"
    offsets = read_offset_checkpoint(checkpoint)
    offsets[(topic, 1)] = 1_000_000
    write_offset_checkpoint(checkpoint, offsets)

    stats, state = _materialize(bootstrap, topic, tmp_path)
    assert state == produced.expected_state()
    assert stats.start_offsets[1] == 0 and stats.records_fetched == stats.high_watermarks[1]
    assert not stats.store_rebuilt  # only partition 1's entries were dropped and fetched again
    assert any("outside the broker's offsets [0, " in r.getMessage() and "at offset 1000000" in r.getMessage()
               and str(checkpoint) in r.getMessage() for r in caplog.records)
    stats, state = _materialize(bootstrap, topic, tmp_path)  # and the next start is an ordinary one
    assert stats.records_fetched == 0 and state == produced.expected_state()


def test_damage_a_cleaner_thread_finds_while_run_runs_is_healed_live(kafka_broker, create_topic, tmp_path, caplog):
    """Issue 21.6: damage below the recovery point, with the clean-shutdown marker present and the
    store intact, is found by no replay; the background cleaner reads it while a continuous run
    goes on. The log is recovered there, the store partition rewound, the cut offsets fetched again."""
    topic = create_topic(partitions=2, config={"cleanup.policy": "compact"})
    bootstrap = kafka_broker.bootstrap_servers
    produced = Produced()
    produce(bootstrap, topic, produced, count=3000, keys=300, codec="lz4", seed=9, batch_bytes=1024)
    _materialize(bootstrap, topic, tmp_path)
    segments = sorted((tmp_path / f"{topic}-0").glob("*.log"))
    assert len(segments) >= 3, segments
    _cut_mid_batch(segments[1])

    options = MaterializerOptions(config_overrides={**_SMALL_SEGMENTS, "min.cleanable.dirty.ratio": "0.01"},
                                  cleaner_threads=1, cleaner_backoff_ms=50)
    with Materializer(bootstrap, topic, tmp_path, options=options) as materializer:
        background = BackgroundRun(materializer)
        try:
            wait_until(lambda: materializer.stats.log_truncations >= 1 or not background.thread.is_alive(), 60,
                       "the cleaner to find the damage")
            assert materializer.wait_until_caught_up(60)  # not before the cut offsets are applied again
            state = {key: (v.partition, v.offset, v.value) for key, v in materializer.store.items()}
            assert topic_status(tmp_path, topic).complete  # readers elsewhere are served again
        finally:
            background.stop()
    assert state == produced.expected_state()
    assert materializer.stats.records_fetched > 0  # the cut offsets of partition 0 came again
    assert any("damaged local log" in r.getMessage() and str(segments[1]) in r.getMessage() for r in caplog.records)
