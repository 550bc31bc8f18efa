"""Test-suite-wide hooks.

``make test`` runs the suite in two pytest-xdist workers with ``--dist loadgroup``. The tests
under ``tests/integration`` and ``tests/docs`` share a worker's session services (its broker,
Schema Registry and Spark session), and a document's blocks build on each other, so they are
sent in two groups, each run in order by one worker against that worker's own broker: the Spark,
documentation, example and operations-campaign tests, and the other broker tests. The unit tests
fill the gaps one by one. Without xdist nothing here applies.

The groups are given by a scheduler of our own rather than ``xdist_group`` markers: pytest-xdist
3.8 marks a group by rewriting ``item._nodeid``, which pytest 9 no longer reads.
"""

from __future__ import annotations

from typing import Any

import pytest

#: Node-id prefixes (relative to the rootdir) of the first group; the rest of _SHARED_SERVICES is
#: the second. The two take about as long (`--durations`, 2026-11-26).
_FIRST_GROUP = (
    "tests/docs/",
    "tests/integration/test_spark_",
    "tests/integration/test_examples.py",
    "tests/integration/test_operations_campaign.py",
    "tests/integration/test_avro_with_schema_registry.py",
    "tests/integration/test_schema_registry_server.py",
)
#: Tests that use the session's services.
_SHARED_SERVICES = ("tests/integration/", "tests/docs/")


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class BrokerTestsInTwoGroups(LoadScopeScheduling):
        """xdist's scope scheduling with two scopes for the tests that use the session's services
        and one scope per other test."""

        def _split_scope(self, nodeid: str) -> str:
            if nodeid.startswith(_FIRST_GROUP):
                return "shared-services-1"
            if nodeid.startswith(_SHARED_SERVICES):
                return "shared-services-2"
            return nodeid

    return BrokerTestsInTwoGroups(config, log)
