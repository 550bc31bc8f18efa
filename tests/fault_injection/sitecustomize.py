"""Loaded by a child Python whose PYTHONPATH starts with this folder: SIGKILL at the Nth file-system call.

The calls counted are the ones a crash between two of them can leave half done: ``os.rename``,
``os.replace``, ``os.unlink``, ``os.remove``, ``os.fsync``, ``os.fdatasync``, ``os.ftruncate``,
``os.truncate``, ``shutil.rmtree`` and ``shutil.copyfile``. Environment:

* ``FAULT_KILL_AT=N``: SIGKILL this process just before the Nth counted call (1-based).
* ``FAULT_TRACE=FILE``: append one line per counted call, ``<n> <call> <caller file:line>``,
  so a first pass lists every call site and later passes kill at each one.

Nothing of this is imported by the project; it exists only for the fault-injection tests.
"""

import os
import shutil
import signal
import sys
import threading

_KILL_AT = int(os.environ.get("FAULT_KILL_AT", "0") or 0)
_TRACE = os.environ.get("FAULT_TRACE")
_lock = threading.Lock()
_count = 0


def _caller() -> str:
    frame = sys._getframe(2)
    while frame is not None and (frame.f_code.co_filename == __file__
                                 or "/shutil.py" in frame.f_code.co_filename
                                 or "/pathlib" in frame.f_code.co_filename):
        frame = frame.f_back
    if frame is None:
        return "?"
    path = frame.f_code.co_filename
    marker = path.rfind("/materializer/") if "/materializer/" in path else -1
    for root in ("/storage/", "/adapters/", "/materializer/"):
        if root in path:
            marker = path.rfind(root)
            break
    return f"{path[marker + 1:] if marker >= 0 else os.path.basename(path)}:{frame.f_lineno}"


def _wrap(module, name):
    original = getattr(module, name)

    def counted(*args, **kwargs):
        global _count
        with _lock:
            _count += 1
            n = _count
        if _TRACE:
            with open(_TRACE, "a") as trace:
                trace.write(f"{n} {name} {_caller()}\n")
        if n == _KILL_AT:
            os.kill(os.getpid(), signal.SIGKILL)
        return original(*args, **kwargs)

    setattr(module, name, counted)


if _KILL_AT or _TRACE:
    for _name in ("rename", "replace", "unlink", "remove", "fsync", "fdatasync", "ftruncate", "truncate"):
        if hasattr(os, _name):
            _wrap(os, _name)
    for _name in ("rmtree", "copyfile"):
        _wrap(shutil, _name)
