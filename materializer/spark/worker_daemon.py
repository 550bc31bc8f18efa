"""PySpark's worker daemon with the ``kafkalog`` reader already imported (``spark.python.daemon.module``).

Spark starts one Python daemon per executor (``PythonWorkerFactory``: ``python -m <daemon module>
pyspark.worker``) and forks a worker from it for each concurrent task; with
``spark.python.worker.reuse`` (Spark's default) a worker serves task after task.
:func:`materializer.spark.jobs.spark_session` names this module as the daemon, which does two things
before handing over to ``pyspark.daemon.manager()``:

1. **No zip or jar of the installed PySpark stays on ``sys.path``.** Spark puts
   ``$SPARK_HOME/python/lib/pyspark.zip``, ``py4j-*-src.zip`` and the ``spark-core`` jar
   (``SparkContext.jarOfObject``) first on every Python worker's ``PYTHONPATH``
   (``PythonUtils.sparkPythonPath``, ``PythonWorkerFactory``). With a pip-installed PySpark,
   ``SPARK_HOME`` is the installed package itself, so the zips are copies of what site-packages
   already holds and the jar holds no Python at all. Each zip or jar that an import looks into gets
   a ``zipimporter``, and every task's ``pyspark.worker_util.setup_spark_files`` calls
   ``importlib.invalidate_caches()``, which on Python 3.10 and 3.11 re-reads the whole archive
   directory once per importer (CPython gh-103200, made lazy in 3.12; Spark stops calling it
   needlessly in SPARK-54744): 5,261 entries for ``spark-core_2.13-4.0.1.jar``, ~0.1 s of every
   task on this project's benchmark machine. An entry is dropped only when it lies inside the
   very ``pyspark`` package that the rest of the path finds: a ``python/lib`` zip (the same
   release; the py4j zip only when a py4j package is importable without it), or a ``jars/*.jar``
   holding no ``.py`` file.
2. **Forked workers inherit the imports** of ``pyspark.worker``, pyarrow and
   :mod:`materializer.spark.source` (and the native core), instead of each worker
   importing them in its first task. An import that fails here is skipped: the task that needs
   the module then fails with the import error as it would without this daemon.

Spark's planning processes for Python data sources (``pyspark.sql.worker.*``) are started through
``pyspark.daemon`` whatever this setting says (``PythonWorkerFactory.defaultDaemonModule``), so
they start with the zips; :func:`drop_bundled_zips_in_spark_worker` removes them from inside such a
process once the ``kafkalog`` source's code first runs there (its planning workers are reused,
query after query).

Run by Spark only (``python -m materializer.spark.worker_daemon pyspark.worker``); it
writes nothing to stdout except what ``pyspark.daemon`` writes (the port, read by the JVM).
"""

from __future__ import annotations

import importlib
import importlib.machinery
import os
import sys

__all__ = ["DAEMON_MODULE", "drop_bundled_zips", "drop_bundled_zips_in_spark_worker", "main"]

#: The value of ``spark.python.daemon.module`` that selects this daemon.
DAEMON_MODULE = "materializer.spark.worker_daemon"

_PRELOADED = ("pyarrow", "pyspark.worker", "materializer.spark.source")


def drop_bundled_zips(path: list[str]) -> list[str]:
    """The entries removed from ``path`` (in place, and from ``sys.path_importer_cache``): the
    ``python/lib/pyspark.zip`` and ``python/lib/py4j-*-src.zip`` copies and the ``jars/*.jar``
    files (with no ``.py`` inside) of the ``pyspark`` package that ``path`` finds without them.

    Nothing is removed when no such package is found; the py4j zip stays when py4j is not
    importable without it. Must run before ``pyspark`` is imported.
    """
    folders = [entry for entry in path if not entry.endswith((".zip", ".jar"))]
    spec = importlib.machinery.PathFinder.find_spec("pyspark", folders)
    if spec is None or not spec.submodule_search_locations:
        return []
    package = os.path.realpath(list(spec.submodule_search_locations)[0])
    has_py4j = importlib.machinery.PathFinder.find_spec("py4j", folders) is not None
    removed = []
    for entry in list(path):
        name, parent = os.path.basename(entry), os.path.dirname(os.path.realpath(entry))
        if parent == os.path.join(package, "python", "lib"):
            bundled = name == "pyspark.zip" or (has_py4j and name.startswith("py4j-") and name.endswith("-src.zip"))
        elif parent == os.path.join(package, "jars") and name.endswith(".jar"):
            bundled = not _holds_python(entry)
        else:
            bundled = False
        if bundled:
            path.remove(entry)
            for cached in [key for key in sys.path_importer_cache if key == entry or key.startswith(entry + os.sep)]:
                del sys.path_importer_cache[cached]
            removed.append(entry)
    return removed


_dropped_in_this_process: list[str] | None = None


def drop_bundled_zips_in_spark_worker() -> list[str]:
    """:func:`drop_bundled_zips` on ``sys.path``, once per process, and only in a Python process
    Spark started (``PYTHON_WORKER_FACTORY_SECRET`` set: a worker daemon and its forks, such as the
    ``pyspark.sql.worker`` planning processes); returns what the first call removed.

    For a process that imported ``pyspark`` already: modules it loaded from ``pyspark.zip`` keep
    working (they are found through ``pyspark.__path__``, not ``sys.path``); the point is the
    ``spark-core`` jar, whose 5,261-entry directory each ``importlib.invalidate_caches()`` call
    re-reads on Python 3.10/3.11 (~25 ms idle, per planning call). Raises nothing.
    """
    global _dropped_in_this_process
    if _dropped_in_this_process is None:
        _dropped_in_this_process = []
        if os.environ.get("PYTHON_WORKER_FACTORY_SECRET"):
            _dropped_in_this_process = drop_bundled_zips(sys.path)
    return _dropped_in_this_process


def _holds_python(archive: str) -> bool:
    """Whether the zip/jar ``archive`` has a ``.py``/``.pyc`` entry (unreadable: assume it has)."""
    import zipfile

    try:
        with zipfile.ZipFile(archive) as jar:
            return any(name.endswith((".py", ".pyc")) for name in jar.namelist())
    except (OSError, zipfile.BadZipFile):
        return True


def main() -> None:
    """Drop the bundled archives, pre-import the workers' modules, then run ``pyspark.daemon.manager()``."""
    if "pyspark" not in sys.modules:  # never imported yet when Spark runs this module
        drop_bundled_zips(sys.path)
    for module in _PRELOADED:
        try:
            importlib.import_module(module)
        except ImportError:
            pass
    from pyspark import daemon

    daemon.manager()


if __name__ == "__main__":
    main()
