"""``materializer restore``: build a data dir from a broker's log dir or an SST snapshot, offline
(:mod:`materializer.offline.restore`, :mod:`materializer.offline.snapshot_restore`)."""

from __future__ import annotations

from pathlib import Path

import click

from materializer.config import parse_config_overrides
from materializer.interrupts import sigterm_interrupts
from materializer.storage.read_committed import AbortedTxnSource

__all__ = ["restore"]


@click.command("restore")
@click.option("--from-log-dir", "log_dirs", multiple=True,
              type=click.Path(file_okay=False, path_type=Path),
              help="A broker log dir (a log.dirs entry) holding <topic>-<partition>/ folders; repeatable. "
                   "Only read: its folders are copied.")
@click.option("--from-snapshot", "snapshot_dir", type=click.Path(exists=True, file_okay=False, path_type=Path),
              help="Instead: an SST snapshot folder (`materializer spark snapshot --format sst --out ...`).")
@click.option("--topic", required=True, help="Kafka topic name.")
@click.option("--data-dir", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="Data directory to fill: <topic>-<partition>/ log folders, state/<topic>/ RocksDB, checkpoints.")
@click.option("--config", "config_items", multiple=True, metavar="KEY=VALUE",
              help="Topic config of the local log (Kafka name, e.g. cleanup.policy=compact); repeatable.")
@click.option("--aborted-txns", type=click.Choice([s.value for s in AbortedTxnSource]), default="auto",
              show_default=True, help="Aborted transactions from .txnindex files, ABORT markers, or both.")
@click.option("--overwrite", is_flag=True, help="Replace the topic's partition folders and state store in DIR.")
@click.option("--repair", is_flag=True,
              help="Accept Kafka's recovery (cut the log at a corrupt batch) instead of failing.")
@click.option("--progress/--no-progress", default=None,
              help="Progress bar on stderr (bytes of the broker's .log files) [default: only on a terminal].")
def restore(log_dirs: tuple[Path, ...], snapshot_dir: Path | None, topic: str, data_dir: Path,
            config_items: tuple[str, ...], aborted_txns: str, overwrite: bool, repair: bool,
            progress: bool | None) -> None:
    """Restore TOPIC into DIR from a broker's log dir, offline (the broker's files are never modified),
    or from an SST snapshot (--from-snapshot: the store is ingested whole, the local logs start
    empty at the snapshot's next offsets).

    Afterwards `materializer export` shows what a read_committed consumer reads from the broker, and
    `materializer run` continues from the restored offsets.

    The topic is built in a staging folder in DIR and swapped in at the end: an interruption
    (Ctrl-C: exit 130, SIGTERM: exit 143, SIGKILL, an error: exit 2) leaves DIR as it was. DIR must
    not be written by another process (a running `materializer run` makes the restore fail at once).
    """
    if bool(log_dirs) == (snapshot_dir is not None):
        raise click.UsageError("give either --from-log-dir (repeatable) or --from-snapshot")
    with sigterm_interrupts():
        _restore_command(log_dirs, snapshot_dir, topic, data_dir, config_items, aborted_txns, overwrite, repair,
                         progress)


def _restore_command(log_dirs: tuple[Path, ...], snapshot_dir: Path | None, topic: str, data_dir: Path,
                     config_items: tuple[str, ...], aborted_txns: str, overwrite: bool, repair: bool,
                     progress: bool | None) -> None:
    if snapshot_dir is not None:
        from materializer.offline.snapshot_restore import restore_from_snapshot

        done = restore_from_snapshot(snapshot_dir, topic, data_dir)
        click.echo(f"{topic}: restored {done.live_keys} live keys of {len(done.next_offsets)} partitions from "
                   f"{snapshot_dir} in {done.elapsed_s:.2f} s; next offsets {done.next_offsets}")
        return
    from materializer.offline.restore import RestoreOptions, restore_from_log_dir

    options = RestoreOptions(config_overrides=parse_config_overrides(config_items),
                             aborted_txn_source=AbortedTxnSource(aborted_txns), overwrite=overwrite, repair=repair,
                             progress=progress)
    result = restore_from_log_dir(list(log_dirs), topic, data_dir, options=options)
    for partition, r in sorted(result.partitions.items()):
        notes = []
        if r.truncations:
            notes.append(f"recovery cut {sum(t.bytes_truncated for t in r.truncations)} bytes")
        if r.open_transaction_bytes:
            notes.append(f"cut {r.open_transaction_bytes} bytes of open transactions")
        extra = f" ({'; '.join(notes)})" if notes else ""
        click.echo(f"{topic}-{partition}: offsets [{r.log_start_offset}, {r.log_end_offset}), "
                   f"{r.records_applied} records applied, {r.aborted_transactions} aborted transactions skipped, "
                   f"{r.bytes_copied} bytes copied{extra}")
    click.echo(f"{topic}: restored {len(result.partitions)} partitions into {data_dir} in {result.elapsed_s:.2f} s; "
               f"{result.live_keys} live keys")
