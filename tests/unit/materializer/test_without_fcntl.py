"""The package, its public API, its CLI and its pytest plugin load where ``fcntl`` cannot be imported
(Windows); only taking a file lock fails there, with an error that says why.

Each check runs in a fresh interpreter with ``sys.modules['fcntl'] = None``, which makes every
``import fcntl`` raise ImportError, as on a platform without it.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

_NO_FCNTL = "import sys\nsys.modules['fcntl'] = None\n"


def _run(code: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", _NO_FCNTL + textwrap.dedent(code)], capture_output=True, text=True,
                          cwd=cwd, timeout=120)


def test_the_public_api_and_the_cli_import_without_fcntl(tmp_path: Path) -> None:
    done = _run("""
        import materializer
        for name in materializer.__all__:
            getattr(materializer, name)
        import materializer.cli
        import materializer.testing.pytest_plugin
        print("imported", len(materializer.__all__))
    """, tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("imported ")


def test_taking_a_file_lock_without_fcntl_names_what_needs_it(tmp_path: Path) -> None:
    done = _run("""
        from materializer.datadir.lock import DataDirLock
        from materializer.storage.file_lock import FileLockUnavailableError
        try:
            DataDirLock.acquire("d", "run")
        except FileLockUnavailableError as exc:
            print(exc)
    """, tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("file locks need fcntl (POSIX: Linux, macOS); the data dir lock is not supported on ")


def test_pytest_loads_the_plugin_through_its_entry_point_without_fcntl(tmp_path: Path) -> None:
    (tmp_path / "test_uses_nothing.py").write_text(textwrap.dedent("""
        def test_plugin_is_registered(request):
            plugin = request.config.pluginmanager.get_plugin("kafka_materializer")
            assert plugin is not None and plugin.__name__ == "materializer.testing.pytest_plugin"
    """))
    run = _run("""
        import pytest
        sys.exit(pytest.main(["-q", "-p", "no:cacheprovider", "test_uses_nothing.py"]))
    """, tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "1 passed" in run.stdout
    fixtures = _run("""
        import pytest
        sys.exit(pytest.main(["-q", "-p", "no:cacheprovider", "--fixtures", "test_uses_nothing.py"]))
    """, tmp_path)
    assert fixtures.returncode == 0, fixtures.stdout + fixtures.stderr
    assert "kafka_materializer_topic_factory" in fixtures.stdout
