"""SIGKILL `compact` and `restore` just before each of their renames, unlinks, fsyncs and truncates (issues 7, 21).

One kill per distinct call site (plus ``KILL_CAMPAIGN_RANDOM`` random call numbers, default 10,
seed ``KILL_CAMPAIGN_SEED``, fixed unless ``random``), each on fresh data; the command run again must exit 0 with no
traceback, leave no ``.cleaned``/``.swap`` file, and give the same latest value per (partition, key)
as before (compact) or as the source log dir (restore). A restore replaces an earlier restore of
other data: right after each kill, the store (``export``'s reader) and the local logs (``kafkalog``)
serve the earlier data or the new data, the same for both, or refuse. ``python -m tests.kill_campaign --kills N``
runs a long campaign. See ``tests/kill_campaign.py``.
"""

from __future__ import annotations

import os
import random

import pytest

from tests.kill_campaign import compact_campaign, restore_campaign


@pytest.mark.parametrize("campaign", [compact_campaign, restore_campaign], ids=["compact", "restore"])
def test_killed_at_every_call_site_recovers_exactly(campaign, tmp_path):
    extra = int(os.environ.get("KILL_CAMPAIGN_RANDOM", "10"))
    chosen = os.environ.get("KILL_CAMPAIGN_SEED", "20261122")  # fixed in CI; "random" draws one
    seed = random.SystemRandom().randrange(2**31) if chosen == "random" else int(chosen)
    report = campaign(extra_random=extra, seed=seed, workdir=tmp_path)
    print(f"\n{report.line()} (seed {seed})")
    assert report.sites >= 5 and report.killed >= report.sites  # the kills really landed mid-command
    assert not report.failures, f"seed {seed}:\n" + "\n".join(report.failures[:10])
