"""LogConfig: Kafka names, defaults, validation, JSON round trip."""

import pytest

from materializer.storage.log_config import LONG_MAX, LogConfig


def test_kafka_defaults():
    c = LogConfig()
    assert c.segment_bytes == 1073741824 and c.segment_ms == 604800000
    assert c.segment_index_bytes == 10485760 and c.index_interval_bytes == 4096
    assert c.max_compaction_lag_ms == LONG_MAX and c.file_delete_delay_ms == 60000
    assert c.max_message_bytes == 1048588 and c.cleanup_policy == ("delete",)
    assert c.delete and not c.compact


def test_from_kafka_configs_and_back():
    c = LogConfig.from_kafka_configs({
        "cleanup.policy": "compact, delete", "segment.bytes": "1048576", "min.cleanable.dirty.ratio": "0.01",
        "preallocate": "true", "unknown.key": "x", "max.compaction.lag.ms": "1000",
    })
    assert c.compact and c.delete and c.segment_bytes == 1048576 and c.preallocate
    assert c.min_cleanable_dirty_ratio == 0.01
    assert LogConfig.from_kafka_configs(c.to_kafka_configs()) == c
    assert c.max_segment_ms() == 1000
    assert LogConfig(segment_ms=500).max_segment_ms() == 500


def test_internal_segment_bytes_wins():
    c = LogConfig.from_kafka_configs({"segment.bytes": "1048576", "internal.segment.bytes": "1024"})
    assert c.segment_bytes == 1024


def test_empty_cleanup_policy_allowed():
    c = LogConfig.from_kafka_configs({"cleanup.policy": ""})
    assert c.cleanup_policy == () and not c.compact and not c.delete


@pytest.mark.parametrize("kwargs", [
    {"segment_bytes": 13}, {"segment_ms": 0}, {"cleanup_policy": ("bogus",)},
    {"min_cleanable_dirty_ratio": 1.5}, {"min_compaction_lag_ms": 10, "max_compaction_lag_ms": 5},
    {"retention_ms": -2},
])
def test_validation(kwargs):
    with pytest.raises(ValueError):
        LogConfig(**kwargs)


def test_bad_string_value():
    with pytest.raises(ValueError, match="segment.bytes"):
        LogConfig.from_kafka_configs({"segment.bytes": "big"})


def test_save_load(tmp_path):
    c = LogConfig(cleanup_policy=("compact",), segment_bytes=4096, delete_retention_ms=5)
    c.save(tmp_path / "config.json")
    assert LogConfig.load(tmp_path / "config.json") == c


def test_jitter_bounds():
    assert LogConfig().random_segment_jitter_ms() == 0
    c = LogConfig(segment_ms=10, segment_jitter_ms=100)
    assert all(0 <= c.random_segment_jitter_ms() < 10 for _ in range(50))


@pytest.mark.parametrize(("configs", "message"), [
    ({"segment.index.bytes": "8"}, "segment.index.bytes: must be in [12, 2147483647]"),
    ({"segment.bytes": str(2**31)}, "segment.bytes: must be in [14, 2147483647]"),
    ({"compression.type": "brotli"}, "compression.type: must be one of"),
    ({"max.message.bytes": "-1"}, "max.message.bytes"),
    ({"segment.ms": "soon"}, "invalid value 'soon' for configuration segment.ms"),
])
def test_kafka_validators_name_the_config_and_range(configs, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        LogConfig.from_kafka_configs(configs)


def test_smallest_index_size_still_appends(tmp_path):
    from materializer.storage.compression import CompressionType
    from materializer.storage.log import Log
    from materializer.storage.record_batch import Record, TimestampType

    with Log.open(tmp_path / "t-0", LogConfig(segment_index_bytes=12, index_interval_bytes=10)) as log:
        for i in range(5):
            log.append_records([Record(i * 2 + j, 1000 + i, b"k", b"v" * 50) for j in range(2)],
                               compression=CompressionType.NONE, timestamp_type=TimestampType.CREATE_TIME)
        assert log.log_end_offset == 10
