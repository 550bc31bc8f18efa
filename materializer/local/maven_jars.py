"""The jar cache: Maven artifacts resolved once into a folder per product, safe from parallel processes.

Maven itself fetches (so ``~/.m2/settings.xml``, its mirrors and proxies apply); this module decides
*when* and *where*. Layout (root = ``$KAFKA_MATERIALIZER_CACHE`` or ``~/.cache/kafka-materializer``)::

    <root>/<product>/.lock            flock held while one process resolves (the others wait)
    <root>/<product>/<target>.tmp/    staging: filled by Maven or unpacked from its download
    <root>/<product>/<target>/        the staging folder renamed once complete
    <root>/<product>/<target>/.complete   marker: later calls return at once

Products in this cache: the Kafka broker's jars (:mod:`materializer.local.kafka_jars`), Apicurio
Registry (:mod:`materializer.local.schema_registry`), Spark's Kafka connector
(:mod:`materializer.spark.connector_jars`).

Errors are raised as the type the caller passes (``error=``), so each product reports through its
own provisioning error; the message names the ``mvn`` command, the artifacts Maven could not find
and Maven's last output lines.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Callable, Sequence

from materializer.storage.file_lock import lock_file

__all__ = [
    "CACHE_ENV_VAR",
    "default_cache_root",
    "resolve_once",
    "run_maven",
    "copy_maven_dependencies",
    "download_maven_artifact",
]

CACHE_ENV_VAR = "KAFKA_MATERIALIZER_CACHE"

_MARKER = ".complete"
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_MISSING = re.compile(r"Could not find artifact (\S+)")


def default_cache_root() -> Path:
    """``$KAFKA_MATERIALIZER_CACHE`` if set, else ``~/.cache/kafka-materializer``."""
    override = os.environ.get(CACHE_ENV_VAR)
    if override:
        return Path(override).expanduser()
    return Path.home() / ".cache" / "kafka-materializer"


def resolve_once(home: Path, target: Path, what: str, resolve: Callable[[Path], str]) -> Path:
    """``target`` (a folder inside ``home``), filled by ``resolve`` the first time it is asked for.

    When ``target/.complete`` exists, returns at once. Otherwise, holding an exclusive flock on
    ``home/.lock`` (parallel processes wait for one resolution and then find the marker), calls
    ``resolve(staging)`` with an empty ``<target>.tmp`` folder path, renames the staging folder to
    ``target`` (replacing a partial one) and writes the marker: ``what`` and the line ``resolve``
    returns. A ``resolve`` that raises leaves no marker, so the next call tries again.

    Raises:
        whatever ``resolve`` raises.
    """
    if (target / _MARKER).is_file():
        return target
    home.mkdir(parents=True, exist_ok=True)
    with open(home / ".lock", "w") as lock:
        lock_file(lock, purpose="the Maven jar cache")
        if (target / _MARKER).is_file():
            return target
        staging = target.with_name(target.name + ".tmp")
        shutil.rmtree(staging, ignore_errors=True)
        summary = resolve(staging)
        shutil.rmtree(target, ignore_errors=True)
        staging.rename(target)
        (target / _MARKER).write_text(f"{what}\n{summary}\n")
    return target


def run_maven(args: Sequence[str], *, home: Path, what: str, produced: Callable[[], bool],
              error: type[Exception], timeout_s: float = 900.0) -> None:
    """Run ``mvn -q -B -Dstyle.color=never <args>`` in ``home``; succeed when it exits 0 and ``produced()``.

    ``what`` names the product in messages (``"Apache Kafka 4.3.1"``).

    Raises:
        ``error``: ``mvn`` is not on PATH; Maven exits non-zero or ``produced()`` is false (the
            message names the artifacts Maven Central lacks, e.g.
            ``org.apache.kafka:kafka-tools:jar:4.4.0``, the command and Maven's last 25 lines); or
            Maven takes longer than ``timeout_s`` seconds.
    """
    mvn = shutil.which("mvn")
    if mvn is None:
        raise error(f"Maven ('mvn') is not on PATH; it is needed once to download {what} jars into {home}. "
                    "Install Maven (e.g. apt-get install maven).")
    cmd = [mvn, "-q", "-B", "-Dstyle.color=never", *args]
    try:
        done = subprocess.run(cmd, cwd=home, capture_output=True, text=True, timeout=timeout_s,
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as exc:
        raise error(f"'{' '.join(cmd)}' did not finish within {timeout_s:.0f} s") from exc
    if done.returncode != 0 or not produced():
        output = _ANSI.sub("", done.stdout + done.stderr)
        missing = sorted(set(_MISSING.findall(output)))
        raise error(
            (f"{what} is not complete on Maven Central: missing {', '.join(missing)}. " if missing else "")
            + f"Resolving {what} jars failed (exit {done.returncode}): '{' '.join(cmd)}' in {home}\n"
            f"--- last mvn output ---\n" + "\n".join(output.strip().splitlines()[-25:]))


def copy_maven_dependencies(home: Path, pom: str, what: str, *, error: type[Exception], timeout_s: float = 900.0,
                            extra_args: Sequence[str] = ()) -> Path:
    """``home/lib``: the dependencies of the generated ``pom``, copied by Maven once.

    ``home/pom.xml`` is written and ``mvn -U dependency:copy-dependencies`` (plus ``extra_args``,
    e.g. ``-DincludeScope=runtime``) copies into the staging folder; see :func:`resolve_once` for
    the lock and the ``lib/.complete`` marker (``what`` and the jar count).

    Raises:
        ``error``: as :func:`run_maven`; also when Maven copied no jar.
    """
    def copy(staging: Path) -> str:
        (home / "pom.xml").write_text(pom)
        run_maven(["-U", "-f", str(home / "pom.xml"), "dependency:copy-dependencies", f"-DoutputDirectory={staging}",
                   *extra_args], home=home, what=what, produced=lambda: any(staging.rglob("*.jar")),
                  error=error, timeout_s=timeout_s)
        return f"{sum(1 for _ in staging.rglob('*.jar'))} jars"

    return resolve_once(home, home / "lib", what, copy)


def download_maven_artifact(home: Path, coordinates: str, what: str, *, error: type[Exception],
                            timeout_s: float = 900.0) -> Path:
    """The file of one artifact, ``coordinates`` = ``group:artifact:version[:type[:classifier]]``
    (type ``jar`` by default), copied into ``home`` by ``mvn dependency:copy`` unless already there.

    Returns ``home/<artifact>-<version>[-<classifier>].<type>``. Call it inside :func:`resolve_once`
    when something is made of the file (an unpacked archive), so parallel processes download once.

    Raises:
        ValueError: ``coordinates`` has fewer than 3 or more than 5 parts.
        ``error``: as :func:`run_maven`; also when Maven did not produce the file.
    """
    parts = coordinates.split(":")
    if not 3 <= len(parts) <= 5:
        raise ValueError(f"Maven coordinates must be group:artifact:version[:type[:classifier]], got {coordinates!r}")
    artifact, version = parts[1], parts[2]
    kind = parts[3] if len(parts) > 3 else "jar"
    classifier = f"-{parts[4]}" if len(parts) > 4 else ""
    file = home / f"{artifact}-{version}{classifier}.{kind}"
    if not file.is_file():
        home.mkdir(parents=True, exist_ok=True)
        run_maven(["dependency:copy", f"-Dartifact={coordinates}", f"-DoutputDirectory={home}"], home=home,
                  what=what, produced=file.is_file, error=error, timeout_s=timeout_s)
    return file
