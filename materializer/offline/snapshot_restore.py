"""Restore a data directory from an SST snapshot (``materializer spark snapshot --format sst``).

``materializer restore --from-snapshot OUT --topic TOPIC --data-dir DIR``

The snapshot holds the latest value per (partition, key) of a topic, as sorted RocksDB SST files
in the state store's own layout, and ``_manifest.json`` with each partition's next offset. The
restore holds ``DIR``'s lock (:class:`~materializer.datadir.lock.DataDirLock`) and builds the topic in
a staging folder (:class:`~materializer.datadir.staging.TopicStaging`), swapped into ``DIR`` at the end:

1. checks the manifest (its topic, format ``sst``, every file present);
2. ingests the files into a new ``state/<topic>/`` (RocksDB ``IngestExternalFile``: the files
   are copied in whole, no per-key writes) and writes the next offsets in the same store;
3. starts each partition's local log empty at its next offset (as a broker's log whose start
   offset moved there);
4. swaps the store, the partition folders and the topic config into ``DIR``, merges the
   recovery-point and log-start-offset checkpoints, and writes the topic's completeness marker.

An interruption before step 4 leaves ``DIR`` as it was; during it, readers refuse the topic until
the swap is finished (by this restore, or by the next command that writes ``DIR``).

``materializer run`` then fetches from those offsets. If the broker's log start offset has moved
past one (retention deleted records the snapshot does not reflect), ``run`` refetches that
partition from the broker's log start and re-materializes it rather than leave a gap.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

from materializer.adapters.rocksdb_store import StateStore, StateStoreOptions
from materializer.datadir.layout import partition_dir, state_dir
from materializer.datadir.lock import DataDirLock
from materializer.datadir.markers import topic_status
from materializer.datadir.staging import TopicStaging
from materializer.storage.log import Log
from materializer.storage.log_config import LogConfig

__all__ = ["SnapshotRestore", "restore_from_snapshot", "MANIFEST_FILE"]

MANIFEST_FILE = "_manifest.json"


@dataclass(frozen=True)
class SnapshotRestore:
    """What :func:`restore_from_snapshot` did: next offsets per partition, live keys, seconds."""

    topic: str
    next_offsets: dict[int, int]
    live_keys: int
    elapsed_s: float


def _read_manifest(snapshot_dir: Path, topic: str) -> tuple[dict[int, int], list[Path]]:
    manifest_path = snapshot_dir / MANIFEST_FILE
    try:
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise FileNotFoundError(f"{manifest_path} does not exist: not a snapshot folder "
                                f"(`materializer spark snapshot --format sst` writes one)") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{manifest_path} is not valid JSON: {exc}") from exc
    if manifest.get("topic") != topic:
        raise ValueError(f"{manifest_path} is a snapshot of topic {manifest.get('topic')!r}, not {topic!r}")
    if manifest.get("format") != "sst":
        raise ValueError(f"{manifest_path}: the snapshot's format is {manifest.get('format', 'parquet')!r}; "
                         f"restore needs --format sst")
    try:
        next_offsets = {int(p): int(o) for p, o in manifest["partitions"].items()}
        files = [snapshot_dir / "sst" / name for name in manifest.get("files", {}).values()]
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"{manifest_path}: malformed manifest ({exc})") from exc
    missing = [f for f in files if not f.is_file()]
    if missing:
        raise FileNotFoundError(f"{missing[0]} is listed in {manifest_path} but missing")
    return next_offsets, files


def restore_from_snapshot(snapshot_dir: Path | str, topic: str, data_dir: Path | str, *,
                          store_options: StateStoreOptions | None = None) -> SnapshotRestore:
    """Fill ``data_dir`` with ``topic``'s state from an SST snapshot (see the module docstring).

    Args:
        snapshot_dir: the ``--out`` folder of ``materializer spark snapshot --format sst``.
        topic: the topic (must match the manifest's).
        data_dir: the materializer data directory; must not hold ``topic`` yet.

    Returns:
        next offsets, live keys and elapsed seconds.

    Raises:
        FileNotFoundError: no manifest, or a listed SST file is missing.
        ValueError: the manifest is of another topic, not ``sst``, or malformed.
        DataDirLockedError: another process writes ``data_dir``; nothing was written.
        FileExistsError: ``data_dir`` already holds the topic's store or partition folders.
        StoreError: RocksDB refused a file.
        KeyboardInterrupt: Ctrl-C (or SIGTERM under :func:`~materializer.interrupts.sigterm_interrupts`).

        On any of these ``data_dir`` keeps what it held.
    """
    started = time.monotonic()
    snapshot_dir, data_dir = Path(snapshot_dir), Path(data_dir)
    next_offsets, files = _read_manifest(snapshot_dir, topic)
    with DataDirLock.acquire(data_dir, "restore --from-snapshot") as lock:
        existing = [p for p in [state_dir(data_dir, topic), *(partition_dir(data_dir, topic, p) for p in next_offsets)]
                    if p.exists()]
        if existing:
            raise FileExistsError(f"{data_dir} already holds data of topic {topic!r} ({existing[0]}); restore a "
                                  f"snapshot into a new data directory")
        if topic_status(data_dir, topic).state == "incomplete":
            raise FileExistsError(f"{data_dir} holds an incomplete topic {topic!r}; restore a snapshot into a new "
                                  f"data directory")
        config = LogConfig()
        with TopicStaging(lock, topic) as staging:
            try:
                config_path = staging.topic_config_path()
                config_path.parent.mkdir(parents=True, exist_ok=True)
                config.save(config_path)
                with StateStore(staging.state_dir(), store_options) as store:
                    live_keys = store.ingest_snapshot(files, next_offsets)
                for partition, offset in next_offsets.items():
                    with Log.open(staging.partition_dir(partition), config, had_clean_shutdown=True) as log:
                        log.truncate_fully_and_start_at(offset)
            except KeyboardInterrupt as exc:
                exc.add_note(f"the restore was stopped before it changed {data_dir}")
                raise
            staging.commit(recovery_points=next_offsets, log_start_offsets=next_offsets,
                           operation="restore --from-snapshot",
                           facts={"next_offsets": {str(p): o for p, o in next_offsets.items()},
                                  "live_keys": live_keys, "snapshot": str(snapshot_dir)})
    return SnapshotRestore(topic, next_offsets, live_keys, time.monotonic() - started)
