"""``materializer compact``: one cleaning round of a data dir's local log now, with Kafka's per-round
statistics (:func:`materializer.offline.compact.compact_topic`)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click

from materializer.cli.options import EXIT_FAILURE
from materializer.interrupts import sigterm_interrupts
from materializer.progress import NoProgress, progress_bar, show_progress
from materializer.storage.cleaner_stats import format_cleaner_stats
from materializer.storage.errors import StorageError
from materializer.storage.offset_map import DEFAULT_DEDUPE_BUFFER_SIZE_BYTES

if TYPE_CHECKING:  # pragma: no cover - the log engine loads when the command runs, not for its --help (issue 42)
    from materializer.offline.compact import PartitionCompaction

__all__ = ["compact"]


@click.command("compact")
@click.option("--data-dir", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="Data directory holding the <topic>-<partition>/ log folders.")
@click.option("--topic", required=True, help="Kafka topic name.")
@click.option("--partition", type=click.IntRange(min=0), default=None,
              help="Clean only this partition [default: every local partition of TOPIC].")
@click.option("--upto-offset", type=click.IntRange(min=0), default=None, metavar="N",
              help="First uncleanable offset, exactly: map [first dirty, N), keep records from N on, "
                   "checkpoint N [default: Kafka's bound - active segment, last stable offset, "
                   "min.compaction.lag.ms].")
@click.option("--dedupe-buffer-size", "dedupe_buffer_size_bytes", type=click.IntRange(min=24),
              default=DEFAULT_DEDUPE_BUFFER_SIZE_BYTES, show_default=True, metavar="BYTES",
              help="Offset map budget of all cleaner threads (Kafka log.cleaner.dedupe.buffer.size): "
                   "BYTES/THREADS/24 slots each, 90% used per round.")
@click.option("--threads", type=click.IntRange(min=1), default=1, show_default=True, metavar="N",
              help="Clean up to N partitions in parallel (Kafka log.cleaner.threads), each in its own "
                   "process with BYTES/N of the offset map.")
@click.option("--now-ms", type=int, default=None, metavar="MS",
              help="Wall clock of the round in ms since the epoch (delete horizons) [default: now].")
@click.option("--quiet", is_flag=True, help="Print only the per-partition summary lines.")
@click.option("--progress/--no-progress", default=None,
              help="Progress bar on stderr (bytes of the partitions' logs) [default: only on a terminal].")
@click.pass_context
def compact(ctx: click.Context, data_dir: Path, topic: str, partition: int | None, upto_offset: int | None,
            dedupe_buffer_size_bytes: int, threads: int, now_ms: int | None, quiet: bool,
            progress: bool | None) -> None:
    """Run one Kafka log-cleaner round now on TOPIC's local logs in DIR.

    Uses the topic config saved by `materializer run` (DIR/topic-configs/TOPIC.json) and the
    cleaner checkpoint DIR/cleaner-offset-checkpoint. Prints Kafka's per-round statistics and a
    summary line per partition (as each finishes; with --threads N up to N partitions are cleaned
    at once, by N processes, as a broker with log.cleaner.threads=N). Exit status 2 on failure or when another process writes DIR (one
    `error: ...` line on stderr); 130 on Ctrl-C, 143 on SIGTERM (the logs stay valid).
    """

    from materializer.offline.compact import compact_topic, format_partition_summary, format_topic_summary, logs_bytes

    bar = NoProgress()

    def report(result: PartitionCompaction) -> None:
        bar.clear()  # the lines go to stdout; on a terminal they share the screen with the bar
        if not quiet:
            for cleaning_round in result.rounds:
                click.echo(format_cleaner_stats(0, f"{result.topic}-{result.partition}",
                                                cleaning_round.first_dirty_offset, cleaning_round.end_offset,
                                                cleaning_round.stats).strip("\n"))
        click.echo(format_partition_summary(result))
        bar.update(result.size_before_bytes)
        bar.refresh()

    try:
        if show_progress(progress):
            bar = progress_bar(True, total=logs_bytes(data_dir, topic, partition), unit="B", unit_scale=True,
                               desc=f"{topic}: compact")
        try:
            with sigterm_interrupts():
                results = compact_topic(data_dir, topic, partition=partition, upto_offset=upto_offset,
                                        dedupe_buffer_size_bytes=dedupe_buffer_size_bytes, now_ms=now_ms,
                                        on_partition_done=report, threads=threads)
        except KeyboardInterrupt as exc:
            exc.add_note("the local logs are valid (an interrupted cleaning round is undone or finished when "
                         "they are next opened)")
            raise
        finally:
            bar.close()
    except (StorageError, ValueError, OSError) as exc:
        if ctx.obj and ctx.obj.get("debug"):
            raise
        message = " ".join(str(exc).split()) or type(exc).__name__
        click.echo(f"error: {message}", err=True)
        ctx.exit(EXIT_FAILURE)
        return
    if len(results) > 1:
        click.echo(format_topic_summary(results))
