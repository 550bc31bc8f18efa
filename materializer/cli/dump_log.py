"""``materializer dump-log``: Kafka DumpLogSegments' dump of ``.log`` files
(:mod:`materializer.offline.dump_log`)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import BinaryIO

import click

from materializer.cli.conventions import CommandError
from materializer.offline.dump_log import DumpProblem, dump_log_file, list_log_files

__all__ = ["dump_log"]


def _stdout_binary() -> BinaryIO:
    """The binary stream under ``sys.stdout`` (flushed first), so output is UTF-8 in any locale."""
    sys.stdout.flush()
    return sys.stdout.buffer


@click.command("dump-log")
@click.argument("path", type=click.Path(exists=True, path_type=Path))
@click.option(
    "--json", "as_json", is_flag=True, help="One JSON object per data record instead of DumpLogSegments text."
)
def dump_log(path: Path, as_json: bool) -> None:
    """Print the batches and records of a .log file, or of every .log file in a partition folder.

    Text output matches Kafka's DumpLogSegments --deep-iteration --print-data-log. Exits 2
    with one "error: <file> at byte position <n>: ..." line when a batch is corrupt.
    """
    try:
        log_files = list_log_files(path)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from exc
    out = _stdout_binary()
    problems: list[DumpProblem] = []
    for log_file in log_files:
        try:
            problems.extend(dump_log_file(log_file, out, as_json=as_json))
        except BrokenPipeError:
            raise  # `dump-log | head`: the reader left; the CLI group exits quietly
        except OSError as exc:
            raise CommandError(f"cannot read {log_file}: {exc.strerror or exc}") from exc
    out.flush()
    if problems:
        more = f" (and {len(problems) - 1} more problem(s))" if len(problems) > 1 else ""
        raise CommandError(f"{problems[0]}{more}")

