"""The tests exercise the package pip installed, not a source tree that happens to shadow it.

CI runs the unit tests twice: in ``.venv`` (an editable install of the checkout) and in a venv
that installed only the wheel from ``make dist`` (.ci/installed_wheel.sh). In the second, a
checkout ahead of site-packages on ``sys.path`` would silently test the checkout instead; these
tests fail then, naming both paths.
"""

from __future__ import annotations

import json
from importlib.metadata import distribution
from pathlib import Path
from urllib.parse import unquote, urlparse

import materializer
import materializer.storage._native as native

DIST = distribution("kafka-materializer")


def _editable_project() -> Path | None:
    """The project directory of an editable install (PEP 610 ``direct_url.json``), else None."""
    text = DIST.read_text("direct_url.json")
    if not text:
        return None
    direct_url = json.loads(text)
    if not direct_url.get("dir_info", {}).get("editable"):
        return None
    return Path(unquote(urlparse(direct_url["url"]).path))


def test_materializer_is_imported_from_where_pip_installed_it():
    project = _editable_project()
    imported = Path(materializer.__file__).resolve()
    if project is not None:
        assert imported == (project / "materializer" / "__init__.py").resolve()
    else:
        installed = Path(str(DIST.locate_file("materializer/__init__.py"))).resolve()
        assert imported == installed, (f"imported {imported}, but the kafka-materializer metadata found first on "
                                       f"sys.path (under {DIST.locate_file('')}) says {installed}")


def test_the_native_core_is_the_abi3_module_beside_its_package():
    # One extension for every CPython >= 3.11 (pyo3 abi3-py311): the stable-ABI file name, next to
    # the materializer.storage package that was imported.
    module = Path(native.__file__).resolve()
    assert module.name == "_native.abi3.so"
    assert module.parent == Path(materializer.storage.__file__).resolve().parent
