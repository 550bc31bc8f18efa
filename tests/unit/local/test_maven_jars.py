"""The jar cache (:mod:`materializer.local.maven_jars`): once per product, one resolver at a time,
nothing marked complete that is not, Maven's failures named (a stand-in ``mvn`` answers)."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from materializer.local.maven_jars import download_maven_artifact, resolve_once, run_maven


class CacheError(Exception):
    """The product's provisioning error in these tests."""


def _fake_mvn(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, script: str) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    mvn = bin_dir / "mvn"
    mvn.write_text("#!/bin/sh\necho \"$@\" >> \"$(dirname \"$0\")/calls\"\n" + script)
    mvn.chmod(mvn.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return bin_dir / "calls"


def test_resolve_once_marks_the_target_and_does_not_resolve_again(tmp_path: Path) -> None:
    calls: list[Path] = []

    def resolve(staging: Path) -> str:
        calls.append(staging)
        staging.mkdir()
        (staging / "a.jar").write_text("jar")
        return "1 jar"

    target = resolve_once(tmp_path, tmp_path / "lib", "Product 1.0", resolve)
    assert target == tmp_path / "lib" and (target / "a.jar").read_text() == "jar"
    assert (target / ".complete").read_text() == "Product 1.0\n1 jar\n"
    assert calls == [tmp_path / "lib.tmp"] and not calls[0].exists()
    assert resolve_once(tmp_path, tmp_path / "lib", "Product 1.0", resolve) == target and len(calls) == 1


def test_a_failed_resolution_is_not_marked_and_the_next_call_starts_over(tmp_path: Path) -> None:
    def fail(staging: Path) -> str:
        staging.mkdir()
        (staging / "half.jar").write_text("partial")
        raise CacheError("network down")

    with pytest.raises(CacheError, match="network down"):
        resolve_once(tmp_path, tmp_path / "lib", "Product", fail)
    assert not (tmp_path / "lib").exists()

    def succeed(staging: Path) -> str:
        assert not staging.exists()  # the partial staging of the failed call is gone
        staging.mkdir()
        return "ok"

    assert (resolve_once(tmp_path, tmp_path / "lib", "Product", succeed) / ".complete").is_file()


_RACER = """
import sys, time
from pathlib import Path
from materializer.local.maven_jars import resolve_once
home = Path(sys.argv[1])
def resolve(staging):
    with open(home / "resolutions", "a") as log:
        log.write("x\\n")
    time.sleep(0.5)  # the other process arrives meanwhile and must wait on the lock
    staging.mkdir()
    return "done"
print(resolve_once(home, home / "lib", "Product", resolve))
"""


def test_parallel_processes_resolve_once(tmp_path: Path) -> None:
    racers = [subprocess.Popen([sys.executable, "-c", _RACER, str(tmp_path)], stdout=subprocess.PIPE, text=True)
              for _ in range(3)]
    outputs = [racer.communicate(timeout=60)[0].strip() for racer in racers]
    assert all(racer.returncode == 0 for racer in racers)
    assert outputs == [str(tmp_path / "lib")] * 3
    assert (tmp_path / "resolutions").read_text() == "x\n"


def test_download_maven_artifact_names_the_file_and_downloads_once(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _fake_mvn(tmp_path, monkeypatch, """
for arg in "$@"; do case "$arg" in -DoutputDirectory=*) out="${arg#-DoutputDirectory=}";; esac; done
echo archive > "$out/app-1.2-all.tar.gz"
""")
    home = tmp_path / "cache" / "app-1.2"
    file = download_maven_artifact(home, "org.example:app:1.2:tar.gz:all", "App 1.2", error=CacheError)
    assert file == home / "app-1.2-all.tar.gz" and file.read_text() == "archive\n"
    assert "dependency:copy -Dartifact=org.example:app:1.2:tar.gz:all" in calls.read_text()
    assert download_maven_artifact(home, "org.example:app:1.2:tar.gz:all", "App 1.2", error=CacheError) == file
    assert len(calls.read_text().splitlines()) == 1
    with pytest.raises(ValueError, match="group:artifact:version"):
        download_maven_artifact(home, "org.example:app", "App", error=CacheError)


def test_maven_success_without_the_file_is_an_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_mvn(tmp_path, monkeypatch, "exit 0\n")
    with pytest.raises(CacheError, match=r"Resolving App 1\.2 jars failed \(exit 0\): '.*mvn .*dependency:copy"):
        download_maven_artifact(tmp_path / "home", "org.example:app:1.2", "App 1.2", error=CacheError)


def test_maven_failure_names_the_missing_artifacts_and_quotes_the_output(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_mvn(tmp_path, monkeypatch, r"""
printf '\033[1;31m[ERROR]\033[m Could not find artifact org.example:lib:jar:9.9 in central\n'
echo "[ERROR] last line"
exit 1
""")
    with pytest.raises(CacheError) as info:
        run_maven(["dependency:copy-dependencies"], home=tmp_path, what="App 9.9", produced=lambda: True,
                  error=CacheError)
    message = str(info.value)
    assert message.startswith("App 9.9 is not complete on Maven Central: missing org.example:lib:jar:9.9. ")
    assert message.endswith("--- last mvn output ---\n[ERROR] Could not find artifact org.example:lib:jar:9.9 "
                            "in central\n[ERROR] last line")  # colours stripped


def test_no_maven_on_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(CacheError, match=r"Maven \('mvn'\) is not on PATH; it is needed once to download App"):
        run_maven([], home=tmp_path, what="App", produced=lambda: True, error=CacheError)


def test_maven_taking_too_long(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_mvn(tmp_path, monkeypatch, "exec sleep 30\n")
    with pytest.raises(CacheError, match="did not finish within 1 s"):
        run_maven([], home=tmp_path, what="App", produced=lambda: True, error=CacheError, timeout_s=1.0)
