"""A small tmpfs for full-disk and read-only tests (needs root to mount).

Outside CI a machine that cannot mount skips the test with the reason; in CI (``CI=true``, which
``.ci/run`` and ``.ci/installed_wheel.sh`` export) the test fails instead, so the check never
silently goes missing.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import uuid
from pathlib import Path
from typing import Iterator

import pytest

__all__ = ["fill", "mounted_tmpfs", "remount"]


@contextlib.contextmanager
def mounted_tmpfs(parent: Path, size: str) -> Iterator[Path]:
    """Mount a tmpfs of ``size`` (mount's syntax: ``3m``, ``512k``) under ``parent``; unmount after."""
    mount_point = Path(parent) / f"tmpfs-{uuid.uuid4().hex[:8]}"
    mount_point.mkdir()
    result = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount_point)],
                            capture_output=True, text=True)
    if result.returncode != 0:
        reason = f"cannot mount a tmpfs here ({result.stderr.strip() or result.returncode}); needs root"
        if os.environ.get("CI") == "true":
            pytest.fail(reason)
        pytest.skip(reason)
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)


def remount(mount_point: Path, options: str) -> None:
    """``mount -o remount,<options>`` (``ro``, ``rw``, ``size=20m``)."""
    subprocess.run(["mount", "-o", f"remount,{options}", str(mount_point)], check=True)


def fill(mount_point: Path, leave_bytes: int) -> Path:
    """Write a filler file so that about ``leave_bytes`` stay free; returns the filler's path."""
    stats = os.statvfs(mount_point)
    free = stats.f_bavail * stats.f_frsize
    filler = mount_point / "filler"
    with open(filler, "wb") as out:
        remaining = max(0, free - leave_bytes)
        chunk = b"\0" * (1 << 16)
        while remaining > 0:
            try:
                remaining -= out.write(chunk[:remaining])
            except OSError:
                break
    return filler
