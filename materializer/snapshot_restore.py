"""Restore a data directory from an SST snapshot (``materializer spark snapshot --format sst``).

``materializer restore --from-snapshot OUT --topic TOPIC --data-dir DIR``

The snapshot holds the latest value per (partition, key) of a topic, as sorted RocksDB SST files
in the state store's own layout, and ``_manifest.json`` with each partition's next offset. The
restore:

1. checks the manifest (its topic, format ``sst``, every file present);
2. ingests the files into a new ``DIR/state/<topic>/`` (RocksDB ``IngestExternalFile``: the files
   are copied in whole, no per-key writes) and writes the next offsets in the same store;
3. starts each partition's local log empty at its next offset (as a broker's log whose start
   offset moved there), writes the recovery-point and log-start-offset checkpoints.

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
from materializer.config import partition_dir, state_dir, topic_config_path
from materializer.storage.log import Log
from materializer.storage.log_config import LogConfig
from materializer.storage.log_manager import checkpoint_topic_logs

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
        FileExistsError: ``data_dir`` already holds the topic's store or partition folders.
        StoreError: RocksDB refused a file.
    """
    started = time.monotonic()
    snapshot_dir, data_dir = Path(snapshot_dir), Path(data_dir)
    next_offsets, files = _read_manifest(snapshot_dir, topic)
    existing = [p for p in [state_dir(data_dir, topic), *(partition_dir(data_dir, topic, p) for p in next_offsets)]
                if p.exists()]
    if existing:
        raise FileExistsError(f"{data_dir} already holds data of topic {topic!r} ({existing[0]}); restore a "
                              f"snapshot into a new data directory")
    data_dir.mkdir(parents=True, exist_ok=True)
    config = LogConfig()
    config_path = topic_config_path(data_dir, topic)
    config_path.parent.mkdir(parents=True, exist_ok=True)
    config.save(config_path)
    with StateStore(state_dir(data_dir, topic), store_options) as store:
        live_keys = store.ingest_snapshot(files, next_offsets)
    for partition, offset in next_offsets.items():
        with Log.open(partition_dir(data_dir, topic, partition), config, had_clean_shutdown=True) as log:
            log.truncate_fully_and_start_at(offset)
    checkpoint_topic_logs(data_dir, topic, next_offsets, next_offsets)
    return SnapshotRestore(topic, next_offsets, live_keys, time.monotonic() - started)
