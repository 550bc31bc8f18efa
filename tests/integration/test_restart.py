"""Restart on a real broker: only new records are fetched; a deleted store is rebuilt from the local log
without refetching; the CLI ``run`` / ``export`` / ``get`` work on the same data directory."""

from __future__ import annotations

import json
import shutil

import pytest
from click.testing import CliRunner

from materializer.cli import main
from materializer.datadir.layout import state_dir
from materializer.storage.checkpoint import read_offset_checkpoint
from materializer.storage.log_loader import CLEAN_SHUTDOWN_FILE

from .broker_reads import read_topic
from .test_ingest import CODECS, Produced, local_records, materialize, produce

pytestmark = pytest.mark.broker


def test_restart_fetches_only_new_records_and_rebuilds_store(kafka_broker, create_topic, tmp_path):
    partitions = 3
    topic = create_topic(partitions=partitions, config={"cleanup.policy": "compact"})
    bootstrap = kafka_broker.bootstrap_servers
    produced = Produced()
    produce(bootstrap, topic, produced, count=2500, keys=400, codec="lz4", seed=1)

    stats, state = materialize(bootstrap, topic, tmp_path)
    assert stats.records_fetched == 2500 and stats.start_offsets == {p: 0 for p in range(partitions)}
    assert state == produced.expected_state()
    first_end = {p: hw for p, hw in stats.high_watermarks.items()}

    for seed, codec in enumerate(CODECS, start=2):
        produce(bootstrap, topic, produced, count=300, keys=500, codec=codec, seed=seed)
    stats, state = materialize(bootstrap, topic, tmp_path)
    assert stats.start_offsets == first_end
    assert stats.records_fetched == 5 * 300  # only the new records
    assert stats.records_replayed == 0 and not stats.store_rebuilt
    assert state == produced.expected_state()
    assert read_offset_checkpoint(tmp_path / "recovery-point-offset-checkpoint") == {
        (topic, p): hw for p, hw in stats.high_watermarks.items()}
    assert (tmp_path / CLEAN_SHUTDOWN_FILE).exists()

    shutil.rmtree(state_dir(tmp_path, topic))
    stats, state = materialize(bootstrap, topic, tmp_path)
    assert stats.store_rebuilt
    assert stats.records_fetched == 0  # nothing refetched: the local log has it all
    assert stats.records_replayed == 2500 + 5 * 300
    assert state == produced.expected_state()

    broker = read_topic(bootstrap, topic, partitions)
    for partition in range(partitions):
        assert local_records(tmp_path, topic, partition) == [record for record, _ in broker[partition]]


def test_cli_run_export_get(kafka_broker, create_topic, tmp_path):
    topic = create_topic(partitions=2, config={"cleanup.policy": "compact"})
    bootstrap = kafka_broker.bootstrap_servers
    produced = Produced()
    produce(bootstrap, topic, produced, count=600, keys=50, codec="zstd")
    runner = CliRunner()
    args = ["run", "--bootstrap-servers", bootstrap, "--topic", topic, "--data-dir", str(tmp_path),
            "--until-caught-up", "--config", "segment.bytes=4096", "--compression", "snappy",
            "--max-batch-bytes", "1000"]
    result = runner.invoke(main, args)
    assert result.exit_code == 0, result.output
    assert f"{topic}: fetched 600 records" in result.stdout
    assert len(list((tmp_path / f"{topic}-0").glob("*.log"))) > 1  # the override rolled small segments

    result = runner.invoke(main, args)
    assert result.exit_code == 0 and f"{topic}: fetched 0 records" in result.stdout

    expected = produced.expected_state()
    result = runner.invoke(main, ["export", "--data-dir", str(tmp_path), "--topic", topic])
    assert result.exit_code == 0
    exported = [json.loads(line) for line in result.stdout.splitlines()]
    assert len(exported) == len(expected)
    for line in exported:
        key = line["key"].encode()
        assert (line["partition"], line["offset"]) == expected[key][:2]
        assert ("value" in line) != ("value_b64" in line)

    key, (_, _, value) = next(iter(sorted(expected.items())))
    result = runner.invoke(main, ["get", "--data-dir", str(tmp_path), "--topic", topic, "--format", "bytes",
                                  key.decode()])
    assert result.exit_code == 0 and result.stdout_bytes == value
    deleted = [k for k, (_, _, v) in produced.latest.items() if v is None]
    if deleted:
        result = runner.invoke(main, ["get", "--data-dir", str(tmp_path), "--topic", topic, deleted[0].decode()])
        assert result.exit_code == 1
