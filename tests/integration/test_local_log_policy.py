"""The local log rolls by its own size so a compacted tail exists (issue 9, item 6)."""

from __future__ import annotations

import json

import pytest

from materializer import Materializer, MaterializerOptions
from materializer.datadir.layout import topic_config_path
from materializer.session import LOCAL_SEGMENT_BYTES

pytestmark = pytest.mark.broker


def test_local_segment_bytes_is_capped_unless_configured(kafka_broker, create_topic, tmp_path, caplog):
    topic = create_topic(partitions=1, config={"cleanup.policy": "compact"})  # the broker's 1 GiB segment.bytes
    with Materializer(kafka_broker.bootstrap_servers, topic, tmp_path / "a", options=MaterializerOptions()) as m:
        m.run(until_caught_up=True)
        assert m.log_config.segment_bytes == LOCAL_SEGMENT_BYTES == 64 * 1024 * 1024
    assert json.loads(topic_config_path(tmp_path / "a", topic).read_text())["segment.bytes"] == str(LOCAL_SEGMENT_BYTES)
    options = MaterializerOptions(config_overrides={"segment.bytes": str(2**30)})
    with Materializer(kafka_broker.bootstrap_servers, topic, tmp_path / "b", options=options) as m:
        assert m.log_config.segment_bytes == 2**30  # --config wins
    deleting = create_topic(partitions=1)
    with Materializer(kafka_broker.bootstrap_servers, deleting, tmp_path / "c", options=MaterializerOptions()) as m:
        m.run(until_caught_up=True)
    assert any("retention deletes old segments" in r.getMessage() for r in caplog.records)
