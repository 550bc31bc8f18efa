"""Check what ``make dist`` wrote: one abi3 manylinux wheel and one sdist that can build it.

Usage: ``python .ci/check_dist.py DIST_DIR`` (run by ``make dist``; needs ``packaging``, which
``build`` depends on). Exit status 0 when every check passes, else 1 with one line per failed check
on stderr, each naming the file and what was expected and found.

Wheel (PEP 427 name and ``WHEEL`` file, PEP 425 tags):
  * exactly one tag, ``cp311-abi3-manylinux_<glibc>_<arch>``: one wheel serves CPython 3.11+;
  * one import root, ``materializer``, beside its ``.dist-info``; no ``tests``, no crate sources;
  * the native core as ``materializer/storage/_native.abi3.so`` (the stable-ABI name) and no other
    shared object; ``py.typed`` and ``_native.pyi`` for type checkers; the status page's template.
Sdist: the native crate (``storage/native``: Cargo.toml, Cargo.lock and every ``.rs`` file the
checkout has) and the build configuration (pyproject.toml, setup.cfg, MANIFEST.in).
"""

from __future__ import annotations

import sys
import tarfile
import zipfile
from pathlib import Path

from packaging.utils import parse_wheel_filename

CHECKOUT = Path(__file__).resolve().parents[1]
IMPORT_ROOT = "materializer"
NATIVE_MODULE = "materializer/storage/_native.abi3.so"
TYPING_FILES = ("materializer/py.typed", "materializer/storage/_native.pyi")
PACKAGE_DATA = ("materializer/serve/templates/status.html",)
BUILD_FILES = ("pyproject.toml", "setup.cfg", "MANIFEST.in", "storage/native/Cargo.toml",
               "storage/native/Cargo.lock")


def check_wheel(wheel: Path) -> list[str]:
    """Problems with ``wheel`` (an empty list when it is the wheel described in the module doc)."""
    problems = []
    _name, version, _build, tags = parse_wheel_filename(wheel.name)
    if len(tags) != 1:
        problems.append(f"{wheel.name}: expected one tag, found {sorted(map(str, tags))}")
    for tag in tags:
        if (tag.interpreter, tag.abi) != ("cp311", "abi3") or not tag.platform.startswith("manylinux_"):
            problems.append(f"{wheel.name}: tag {tag} is not cp311-abi3-manylinux_*")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        dist_info = next((n.split("/")[0] for n in names if n.split("/")[0].endswith(".dist-info")), None)
        roots = {name.split("/")[0] for name in names} - {dist_info}
        if roots != {IMPORT_ROOT}:
            problems.append(f"{wheel.name}: import roots {sorted(roots)}, expected only {IMPORT_ROOT!r}")
        shared = [n for n in names if n.endswith(".so") or ".so." in n]
        if shared != [NATIVE_MODULE]:
            problems.append(f"{wheel.name}: shared objects {shared}, expected only {NATIVE_MODULE}")
        for required in (*TYPING_FILES, *PACKAGE_DATA):
            if required not in names:
                problems.append(f"{wheel.name}: {required} is missing")
        stray = [n for n in names if "/tests/" in f"/{n}" or n.endswith((".rs", "Cargo.toml", "Cargo.lock"))]
        if stray:
            problems.append(f"{wheel.name}: tests or crate sources in the wheel: {stray[:5]}")
        wheel_file = archive.read(f"{dist_info}/WHEEL").decode() if dist_info else ""
        if "Root-Is-Purelib: false" not in wheel_file:
            problems.append(f"{wheel.name}: WHEEL does not say Root-Is-Purelib: false")
        if dist_info != f"kafka_materializer-{version}.dist-info":
            problems.append(f"{wheel.name}: .dist-info is {dist_info!r}, expected kafka_materializer-{version}.dist-info")
    return problems


def check_sdist(sdist: Path) -> list[str]:
    """Problems with ``sdist`` (an empty list when it holds everything a wheel is built from)."""
    with tarfile.open(sdist) as archive:
        top = sdist.name.removesuffix(".tar.gz")
        names = {name.removeprefix(top + "/") for name in archive.getnames()}
    crate_sources = sorted(str(path.relative_to(CHECKOUT)) for path in (CHECKOUT / "storage/native/src").rglob("*.rs"))
    missing = [name for name in (*BUILD_FILES, *crate_sources) if name not in names]
    return [f"{sdist.name}: missing {name}" for name in missing]


def main(dist_dir: Path) -> int:
    """Check ``dist_dir``; print the problems and return the exit status."""
    wheels, sdists = sorted(dist_dir.glob("*.whl")), sorted(dist_dir.glob("*.tar.gz"))
    problems = []
    if len(wheels) != 1 or len(sdists) != 1:
        problems.append(f"{dist_dir}: expected one wheel and one sdist, found {[p.name for p in wheels + sdists]}")
    for wheel in wheels:
        problems += check_wheel(wheel)
    for sdist in sdists:
        problems += check_sdist(sdist)
    for problem in problems:
        print(f"error: {problem}", file=sys.stderr)
    if not problems:
        print(f"{dist_dir}: " + ", ".join(p.name for p in wheels + sdists) + " checked")
    return 1 if problems else 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python .ci/check_dist.py DIST_DIR")
    sys.exit(main(Path(sys.argv[1])))
