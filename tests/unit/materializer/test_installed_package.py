"""The tests exercise the package pip installed, not a source tree that happens to shadow it.

CI runs the unit tests twice: in ``.venv`` (an editable install of the checkout) and in a venv
that installed only the wheel from ``make dist`` (.ci/installed_wheel.sh). In the second, a
checkout ahead of site-packages on ``sys.path`` would silently test the checkout instead; these
tests fail then, naming both paths.
"""

from __future__ import annotations

import json
import sysconfig
from importlib.metadata import Distribution, distributions
from pathlib import Path
from urllib.parse import unquote, urlparse

import materializer
import materializer.storage._native as native


def _installed_by_pip() -> Distribution:
    """The kafka-materializer that an installer put on sys.path (its .dist-info has INSTALLER), not
    the ``kafka_materializer.egg-info`` an editable build leaves in the checkout."""
    found = [d for d in distributions(name="kafka-materializer") if d.read_text("INSTALLER")]
    assert len(found) == 1, f"expected one installed kafka-materializer, found {[str(d.locate_file('')) for d in found]}"
    return found[0]


DIST = _installed_by_pip()


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


def test_the_native_core_is_the_module_built_for_this_install():
    module = Path(native.__file__).resolve()
    assert module.parent == Path(materializer.storage.__file__).resolve().parent
    if _editable_project() is None:
        # A wheel: one extension for every CPython >= 3.11 (pyo3's abi3-py311), the stable-ABI name.
        assert module.name == "_native.abi3.so"
    else:
        # An editable build names it for the interpreter that built it: setuptools-rust applies
        # bdist_wheel's py_limited_api (setup.cfg) only when it builds a wheel.
        assert module.name == "_native" + sysconfig.get_config_var("EXT_SUFFIX")
