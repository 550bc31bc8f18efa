"""SIGKILL `materializer run` (background cleaner on) before each rename, unlink, fsync and truncate (issue 7).

A compacted two-partition topic with tombstones, small local segments and a cleaner that backs off
50 ms, so ingest, roll, cleaning (``.cleaned`` -> ``.swap`` -> swap), checkpoints and the store
all happen within one run. One kill per distinct call site of a trace run (the order of calls
varies between runs: the cleaner is a thread) plus ``KILL_CAMPAIGN_RANDOM`` random call numbers; after
each kill ``run --until-caught-up`` again must exit 0 with no traceback, leave no ``.cleaned``/
``.swap`` file, and the store and the local log must give exactly the latest value per (partition,
key) that a read_committed consumer reads from the broker.
"""

from __future__ import annotations

import os
import random

import pytest

from tests.kill_campaign import _latest_per_partition, run_campaign

from .broker_reads import latest_per_partition_key, read_topic
from .test_ingest import Produced, produce

pytestmark = pytest.mark.broker


def test_run_with_cleaner_killed_at_every_call_site(kafka_broker, create_topic, tmp_path):
    topic = create_topic(partitions=2, config={"cleanup.policy": "compact"})
    bootstrap = kafka_broker.bootstrap_servers
    produce(bootstrap, topic, Produced(), count=3000, keys=150, codec="lz4", seed=5, tombstone_ratio=0.15)
    expected = latest_per_partition_key(read_topic(bootstrap, topic, 2))

    def command(data_dir):
        return ["run", "--bootstrap-servers", bootstrap, "--topic", topic, "--data-dir", str(data_dir),
                "--until-caught-up", "--cleaner-backoff-ms", "50", "--config", "segment.bytes=4096",
                "--config", "segment.index.bytes=65536", "--config", "min.cleanable.dirty.ratio=0.01"]

    def check(data_dir):
        from materializer.adapters.rocksdb_store import StateStore
        from materializer.datadir.layout import state_dir

        leftovers = [p.name for p in data_dir.rglob("*") if p.suffix in (".cleaned", ".swap")]
        if leftovers:
            return f"leftover files: {leftovers[:3]}"
        with StateStore(state_dir(data_dir, topic)) as store:
            state = {(v.partition, k): v.value for k, v in store.items()}
        if state != expected:
            return f"store differs from the broker ({len(state)} vs {len(expected)} live keys)"
        if _latest_per_partition(data_dir, topic) != expected:
            return "local log differs from the broker"
        return None

    extra = int(os.environ.get("KILL_CAMPAIGN_RANDOM", "5"))
    chosen = os.environ.get("KILL_CAMPAIGN_SEED", "20261122")  # fixed in CI; "random" draws one
    seed = random.SystemRandom().randrange(2**31) if chosen == "random" else int(chosen)
    report = run_campaign("run", lambda d: None, command, check, extra_random=extra, seed=seed,
                          max_kills=int(os.environ.get("KILL_CAMPAIGN_MAX_RUN_KILLS", "30")), workdir=tmp_path)
    print(f"\n{report.line()} (seed {seed})")
    assert report.sites >= 8 and report.killed >= 1
    assert not report.failures, f"seed {seed}:\n" + "\n".join(report.failures[:10])
