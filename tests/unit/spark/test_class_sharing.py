"""The Spark driver's class-data-sharing archive: which JVM options a session gets, and when a
dump written by an earlier driver JVM becomes the archive (no JVM started here; the Spark
integration tests start sessions with it)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from materializer.spark.class_sharing import cds_dir, driver_java_options, note_driver_pid


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_the_first_session_dumps_and_a_later_one_maps_the_published_archive(tmp_path: Path) -> None:
    options, dump = driver_java_options("4.0.1", cache_root=tmp_path)
    assert dump is not None and options.startswith(f"-XX:ArchiveClassesAtExit={dump} ")
    assert dump.parent == cds_dir(tmp_path)
    dump.write_bytes(b"archive")  # what the driver JVM writes while exiting
    note_driver_pid(dump, os.getpid())  # ... but it still runs: not published
    assert driver_java_options("4.0.1", cache_root=tmp_path)[0].startswith("-XX:ArchiveClassesAtExit=")
    assert dump.exists()
    note_driver_pid(dump, _dead_pid())  # the JVM has exited: the dump is complete
    options, again = driver_java_options("4.0.1", cache_root=tmp_path)
    archive = Path(options.split()[0].split("=", 1)[1])
    assert again is None and options.startswith("-XX:SharedArchiveFile=") and archive.read_bytes() == b"archive"
    assert not dump.exists() and not dump.with_suffix(".pid").exists()


def test_another_class_path_or_spark_version_gets_its_own_archive(tmp_path: Path) -> None:
    _, plain = driver_java_options("4.0.1", cache_root=tmp_path)
    _, with_connector = driver_java_options("4.0.1", ["/jars/spark-sql-kafka.jar"], cache_root=tmp_path)
    _, other_version = driver_java_options("4.1.0", cache_root=tmp_path)
    stems = {path.name.split(".")[0] for path in (plain, with_connector, other_version) if path is not None}
    assert len(stems) == 3


def test_an_empty_dump_from_a_dead_jvm_is_dropped_not_published(tmp_path: Path) -> None:
    _, dump = driver_java_options("4.0.1", cache_root=tmp_path)
    assert dump is not None
    dump.write_bytes(b"")  # the JVM died before writing anything
    note_driver_pid(dump, _dead_pid())
    options, next_dump = driver_java_options("4.0.1", cache_root=tmp_path)
    assert options.startswith("-XX:ArchiveClassesAtExit=") and next_dump != dump and not dump.exists()
