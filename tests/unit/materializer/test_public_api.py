"""``materializer.__all__`` is sorted, complete and every name resolves (httpx's test_exported_members)."""

from __future__ import annotations

import logging
import types

import materializer


def test_all_is_sorted_and_unique():
    assert materializer.__all__ == sorted(set(materializer.__all__))


def test_all_equals_public_names():
    # Submodules become attributes once imported; "@py_*" names come from pytest's assertion rewriting.
    public = {name for name in dir(materializer) if not name.startswith(("_", "@"))
              and not isinstance(getattr(materializer, name), types.ModuleType)}
    assert public == set(materializer.__all__)


def test_every_name_resolves_to_its_object():
    for name in materializer.__all__:
        value = getattr(materializer, name)
        assert value.__name__ == name


def test_unknown_attribute():
    try:
        materializer.NoSuchThing  # noqa: B018
    except AttributeError as exc:
        assert "NoSuchThing" in str(exc)
    else:  # pragma: no cover
        raise AssertionError("expected AttributeError")


def test_version_is_pyprojects_as_installed_and_as_the_cli_prints_it():
    import tomllib
    from pathlib import Path

    from click.testing import CliRunner

    from materializer.cli import main

    declared = tomllib.loads((Path(__file__).parents[3] / "pyproject.toml").read_text())["project"]["version"]
    assert materializer.__version__ == declared
    assert CliRunner().invoke(main, ["--version"]).output == f"materializer, version {declared}\n"


def test_as_a_library_its_loggers_print_nothing_until_the_application_configures_logging():
    import subprocess
    import sys

    # the log cleaner's logger (storage) and a module's own: a warning with no logging configured
    # goes to the NullHandler, not to Python's last-resort handler on stderr
    code = ("import logging, materializer.storage.cleaner as cleaner, materializer.view as view\n"
            "cleaner.logger.warning('cleaner line'); logging.getLogger(view.__name__).error('view line')\n"
            "logging.basicConfig(format='%(name)s %(message)s')\n"  # the application's choice, then
            "cleaner.logger.warning('configured line')\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert result.stderr == "materializer.storage.log_cleaner configured line\n"
    assert any(isinstance(h, logging.NullHandler) for h in logging.getLogger("materializer").handlers)
