"""Kafka's checkpoint file format, shared by every checkpoint a log dir or a partition folder holds
(``recovery-point-offset-checkpoint``, ``log-start-offset-checkpoint``, ``cleaner-offset-checkpoint``,
``leader-epoch-checkpoint``)::

    0           <- version (Integer.parseInt of the whole line: no blanks)
    2           <- number of entries
    <entry>     <- one line each, in the entry format of the file (see each reader)
    <entry>

Lines end as ``BufferedReader.readLine`` ends them (``\\n``, ``\\r``, ``\\r\\n``); every line written
ends in ``\\n``. A missing file, an empty one, or one that stops after the version line has no
entries (``CheckpointReadBuffer.read``). Reading refuses another version, a version or count line
that is not an int, an entry line its format does not parse, and a count that differs from the
entry lines, with :class:`~materializer.storage.errors.CorruptCheckpointError` naming the file and
the line. A write replaces the whole file: ``<file>.tmp``, fsync, atomic rename, fsync of the
folder (:func:`~materializer.storage.files.write_file_atomically`).

Mirrors ``org.apache.kafka.server.common.CheckpointFile`` (its ``CheckpointReadBuffer``,
``CheckpointWriteBuffer`` and ``EntryFormatter``): each file's entry format is a function here.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Callable, Iterable, TypeVar

from .errors import CorruptCheckpointError
from .files import write_file_atomically

__all__ = ["CHECKPOINT_VERSION", "INT32", "INT64", "java_int", "read_checkpoint", "write_checkpoint"]

#: The only version of every checkpoint file Kafka writes.
CHECKPOINT_VERSION = 0

INT32 = (-(2**31), 2**31 - 1)
INT64 = (-(2**63), 2**63 - 1)
_JAVA_INT = re.compile(r"[+-]?[0-9]+")
_LINE_END = re.compile(r"\r\n|\r|\n")

T = TypeVar("T")


def java_int(token: str, bounds: tuple[int, int] = INT32) -> int | None:
    """``Integer.parseInt`` (``bounds`` :data:`INT32`) or ``Long.parseLong`` (:data:`INT64`) of one
    token: the int, or None where Java throws ``NumberFormatException`` (blanks, ``_``, out of range)."""
    if not _JAVA_INT.fullmatch(token):
        return None
    value = int(token)
    return value if bounds[0] <= value <= bounds[1] else None


def read_checkpoint(path: Path, parse_entry: Callable[[str, int], T | None], *, description: str,
                    expected_format: str, version: int = CHECKPOINT_VERSION) -> list[T]:
    """The entries of the checkpoint file at ``path``, in file order (module docstring for the rules).

    Args:
        path: the file; a missing one has no entries.
        parse_entry: ``(line, line_number) -> entry``, or None when the line is not an entry of this
            file (reported as a malformed line); it may raise :class:`CorruptCheckpointError` itself
            for a well-formed entry that is invalid (it names the line then).
        description: what the file is, for messages (``"checkpoint file"``).
        expected_format: an entry line's shape, for messages (``"'<epoch> <start offset>'"``).
        version: the version the file must have.

    Raises:
        CorruptCheckpointError: bytes that are not UTF-8, another version, a line that is not an
            int or an entry, or a count that differs from the entry lines (the file and the line
            named).
        OSError: the file exists but cannot be read.
    """
    try:
        raw = Path(path).read_bytes()
    except FileNotFoundError:
        return []
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line_number = raw.count(b"\n", 0, exc.start) + 1
        raise CorruptCheckpointError(f"{description} {path} is not UTF-8 text: byte position {exc.start} "
                                     f"(line {line_number}) holds 0x{raw[exc.start]:02x}") from None
    lines = _LINE_END.split(text)
    if lines[-1] == "":
        lines.pop()  # the end of the last line, not a line
    if not lines:
        return []
    read_version = java_int(lines[0])
    if read_version is None:
        raise CorruptCheckpointError(f"malformed line 1 in {description} {path}: {lines[0]!r} "
                                     f"(expected the version {version})")
    if read_version != version:
        raise CorruptCheckpointError(f"unrecognised version {read_version} in {description} {path} "
                                     f"(line 1, expected {version})")
    if len(lines) < 2:
        return []
    expected = java_int(lines[1])
    if expected is None:
        raise CorruptCheckpointError(f"malformed line 2 in {description} {path}: {lines[1]!r} "
                                     f"(expected the number of entries)")
    entries: list[T] = []
    for line_number, line in enumerate(lines[2:], start=3):
        entry = parse_entry(line, line_number)
        if entry is None:
            raise CorruptCheckpointError(f"malformed line {line_number} in {description} {path}: {line!r} "
                                         f"(expected {expected_format})")
        entries.append(entry)
    if len(entries) != expected:
        raise CorruptCheckpointError(f"expected {expected} entries in {description} {path} (line 2), "
                                     f"but found {len(entries)}")
    return entries


def write_checkpoint(path: Path, entry_lines: Iterable[str], *, version: int = CHECKPOINT_VERSION) -> None:
    """Replace the checkpoint file at ``path`` with ``entry_lines`` (each one entry, without its line
    end) under the version and count lines, atomically (module docstring).

    Raises:
        OSError: the write, fsync or rename failed (a full disk, a read-only file system); the
            message names the file and the old file is untouched.
    """
    lines = list(entry_lines)
    text = "".join(f"{line}\n" for line in (str(version), str(len(lines)), *lines))
    write_file_atomically(Path(path), text.encode("utf-8"))
