"""Test-suite-wide hooks.

``make test`` runs the suite in two pytest-xdist workers with ``--dist loadgroup``: every test
under ``tests/integration`` and ``tests/docs`` belongs to one group, which one worker runs in
collection order against its one broker (as without xdist: they share the session's broker,
Schema Registry and Spark session, and a document's blocks build on each other), while the other
worker runs the unit tests at the same time. Without xdist nothing here applies.

The group is given by a scheduler of our own rather than ``xdist_group`` markers: pytest-xdist
3.8 marks a group by rewriting ``item._nodeid``, which pytest 9 no longer reads.
"""

from __future__ import annotations

from typing import Any

import pytest

#: Test folders (relative to the rootdir, as node ids are) whose tests share the session's services.
_SHARED_SERVICES = ("tests/integration/", "tests/docs/")


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class SharedServicesInOneWorker(LoadScopeScheduling):
        """xdist's scope scheduling with one scope for the tests that share the session's broker
        and one scope per other test."""

        def _split_scope(self, nodeid: str) -> str:
            return "shared-services" if nodeid.startswith(_SHARED_SERVICES) else nodeid

    return SharedServicesInOneWorker(config, log)
