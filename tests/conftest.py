"""Test-suite-wide hooks.

``make test`` runs the suite with pytest-xdist's ``--dist loadgroup``: every test under
``tests/integration`` and ``tests/docs`` joins one group, so they run one after another in one
worker against that worker's one broker (as they would without xdist: they share the session's
broker, Schema Registry and Spark session), while the unit tests run in the other workers at the
same time. Without xdist the marker does nothing.
"""

from __future__ import annotations

from pathlib import Path

import pytest

_TESTS = Path(__file__).parent
_SHARED_SERVICES = (_TESTS / "integration", _TESTS / "docs")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if any(folder in item.path.parents for folder in _SHARED_SERVICES):
            item.add_marker(pytest.mark.xdist_group("shared-services"))
