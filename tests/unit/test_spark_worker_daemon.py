"""The Python worker daemon drops PySpark's bundled archives from ``sys.path`` only when they are copies."""

from __future__ import annotations

import sys
import zipfile
from pathlib import Path

from materializer.adapters.spark_worker_daemon import drop_bundled_zips


def _archive(path: Path, *names: str) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w") as archive:
        for name in names:
            archive.writestr(name, "")
    return str(path)


def _site(tmp_path: Path, *, py4j: bool) -> tuple[Path, dict[str, str]]:
    """A site-packages folder holding pyspark (with its python/lib zips and jars) and maybe py4j."""
    site = tmp_path / "site-packages"
    (site / "pyspark").mkdir(parents=True)
    (site / "pyspark" / "__init__.py").write_text("")
    if py4j:
        (site / "py4j").mkdir()
        (site / "py4j" / "__init__.py").write_text("")
    lib, jars = site / "pyspark" / "python" / "lib", site / "pyspark" / "jars"
    entries = {
        "pyspark.zip": _archive(lib / "pyspark.zip", "pyspark/__init__.py"),
        "py4j.zip": _archive(lib / "py4j-0.10.9.9-src.zip", "py4j/__init__.py"),
        "core.jar": _archive(jars / "spark-core_2.13-4.0.1.jar", "org/apache/spark/SparkContext.class"),
        "python.jar": _archive(jars / "with-python.jar", "helper.py"),
        "elsewhere.zip": _archive(tmp_path / "user" / "deps.zip", "deps/__init__.py"),
    }
    return site, entries


def test_copies_inside_the_installed_pyspark_are_dropped_and_nothing_else(tmp_path):
    site, entries = _site(tmp_path, py4j=True)
    path = [entries["pyspark.zip"], entries["py4j.zip"], entries["core.jar"], entries["python.jar"],
            entries["elsewhere.zip"], str(site)]
    sys.path_importer_cache[entries["core.jar"]] = None
    sys.path_importer_cache[entries["core.jar"] + "/org"] = None
    try:
        removed = drop_bundled_zips(path)
        assert entries["core.jar"] not in sys.path_importer_cache
        assert entries["core.jar"] + "/org" not in sys.path_importer_cache
    finally:
        sys.path_importer_cache.pop(entries["core.jar"], None)
        sys.path_importer_cache.pop(entries["core.jar"] + "/org", None)
    assert removed == [entries["pyspark.zip"], entries["py4j.zip"], entries["core.jar"]]
    # a jar with Python inside and a zip outside the package may provide modules: kept
    assert path == [entries["python.jar"], entries["elsewhere.zip"], str(site)]


def test_py4j_zip_stays_when_py4j_is_not_installed(tmp_path):
    site, entries = _site(tmp_path, py4j=False)
    path = [entries["pyspark.zip"], entries["py4j.zip"], str(site)]
    assert drop_bundled_zips(path) == [entries["pyspark.zip"]]
    assert path == [entries["py4j.zip"], str(site)]


def test_nothing_is_dropped_without_an_installed_pyspark(tmp_path):
    site, entries = _site(tmp_path, py4j=True)
    path = [entries["pyspark.zip"], entries["py4j.zip"], entries["core.jar"]]  # pyspark only in the zip
    assert drop_bundled_zips(path) == []
    assert path == [entries["pyspark.zip"], entries["py4j.zip"], entries["core.jar"]]
