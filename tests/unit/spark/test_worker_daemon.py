"""The Python worker daemon drops PySpark's bundled archives from ``sys.path`` only when they are copies."""

from __future__ import annotations

import sys
import zipfile
from pathlib import Path

from materializer.spark.worker_daemon import drop_bundled_zips


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


def _planner_like_process(secret: str | None) -> list[str]:
    """Runs a Python process whose ``PYTHONPATH`` starts as Spark's for its planning workers (the
    installed PySpark's ``pyspark.zip`` and ``spark-core`` jar), imports pyspark, then calls
    :func:`drop_bundled_zips_in_spark_worker` twice; returns ``[first result, second result,
    archives left on sys.path or in the importer cache]`` as printed lines."""
    import glob
    import os
    import subprocess

    import pyspark

    package = os.path.dirname(os.path.realpath(pyspark.__file__))
    jar = glob.glob(os.path.join(package, "jars", "spark-core_*.jar"))[0]
    zipped = os.path.join(package, "python", "lib", "pyspark.zip")
    script = ("import importlib, sys\n"
              "import pyspark\n"
              "try:\n    import no_such_module_anywhere\nexcept ImportError:\n    pass\n"  # importers for every entry
              "from materializer.spark.worker_daemon import drop_bundled_zips_in_spark_worker as drop\n"
              "print(drop()); print(drop())\n"
              "importlib.invalidate_caches()\n"
              "print(sorted(p for p in list(sys.path) + list(sys.path_importer_cache) if p.endswith('.jar')))\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHON_WORKER_FACTORY_SECRET"}
    env["PYTHONPATH"] = os.pathsep.join([zipped, jar] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    if secret is not None:
        env["PYTHON_WORKER_FACTORY_SECRET"] = secret
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return [done.stdout.splitlines(), jar, zipped]


def test_a_spark_started_process_drops_the_jar_once_even_after_importing_pyspark():
    (first, second, left), jar, zipped = _planner_like_process("secret")
    assert first == second == repr([zipped, jar])
    assert left == "[]"  # invalidate_caches no longer reaches the jar


def test_a_process_spark_did_not_start_keeps_its_path():
    (first, second, left), jar, _ = _planner_like_process(None)
    assert first == second == "[]"
    assert left == repr([jar, jar])  # on sys.path and in the importer cache
