"""A topic built aside in its data dir, then swapped in: ``DIR/.staging-<topic>.<hex>/``.

A restore (from a log dir or a snapshot) builds the topic's partition folders, state store and
topic config in a staging folder (the same layout as ``DIR``'s, :mod:`materializer.datadir.layout`)
while readers go on reading ``DIR``'s, then :meth:`TopicStaging.commit` swaps them in at once
(:mod:`materializer.datadir.swap`). Only the holder of ``DIR``'s lock stages a topic.
"""

from __future__ import annotations

import json
import secrets
import shutil
from pathlib import Path
from typing import Any, Mapping

from materializer.datadir.layout import STAGING_PREFIX, partition_dir, state_dir, topic_config_path
from materializer.datadir.lock import DataDirLock
from materializer.datadir.markers import new_generation
from materializer.datadir.swap import SWAP_INTENT_FILE, fsync_tree, roll_forward
from materializer.interrupts import signals_deferred
from materializer.storage.files import find_partition_dirs, write_file_atomically

__all__ = ["TopicStaging"]


class TopicStaging:
    """A folder ``DIR/.staging-<topic>.<hex>/`` in which a command builds a topic's partition folders,
    state store and topic config, swapped into ``DIR`` by :meth:`commit` (:mod:`materializer.datadir.swap`).

    Only the holder of ``DIR``'s :class:`DataDirLock` may use one. As a context manager it deletes
    the folder when the block exits before :meth:`commit` wrote the intent (an error, Ctrl-C); a
    SIGKILL leaves it to the next writer start, which deletes it too.

    Attributes:
        data_dir: the data dir.
        topic: the topic.
        path: the staging folder.
    """

    def __init__(self, lock: DataDirLock, topic: str) -> None:
        if not lock.held:
            raise ValueError(f"{lock!r} is not held: only the data dir's writer stages a topic")
        self.data_dir = lock.data_dir
        self.topic = topic
        self.path = lock.data_dir / f"{STAGING_PREFIX}{topic}.{secrets.token_hex(4)}"
        self.path.mkdir()
        self._intent_written = False

    def partition_dir(self, partition: int) -> Path:
        """Where partition ``partition``'s new folder is built."""
        return partition_dir(self.path, self.topic, partition)

    def state_dir(self) -> Path:
        """Where the new state store is built."""
        return state_dir(self.path, self.topic)

    def topic_config_path(self) -> Path:
        """Where the new topic config is written."""
        return topic_config_path(self.path, self.topic)

    def commit(self, *, recovery_points: Mapping[int, int], log_start_offsets: Mapping[int, int], operation: str,
               facts: Mapping[str, Any] | None = None) -> None:
        """Swap the staged topic into ``DIR`` (:mod:`materializer.datadir.swap`) and mark it complete.

        Args:
            recovery_points / log_start_offsets: partition -> offset, merged into ``DIR``'s
                checkpoints (the topic's other entries are dropped, and its entries in
                ``cleaner-offset-checkpoint``: the new logs have not been cleaned).
            operation: what built it ("restore --from-log-dir"), for the marker and the logs.
            facts: kept in the complete marker.

        Raises:
            OSError: before the intent is written the staged data is left to the context manager
                (``DIR`` untouched); after it, to the next writer start, which finishes the swap.
        """
        staged = sorted(p for (_, p) in find_partition_dirs(self.path, self.topic))
        fsync_tree(self.path)
        intent = {"topic": self.topic, "operation": operation, "partitions": staged,
                  "recovery_points": {str(p): o for p, o in recovery_points.items()},
                  "log_start_offsets": {str(p): o for p, o in log_start_offsets.items()},
                  "facts": dict(facts or {}), "generation": new_generation()}
        try:
            with signals_deferred():  # the intent, a few renames and fsyncs: Ctrl-C takes effect after them
                write_file_atomically(self.path / SWAP_INTENT_FILE,
                                      json.dumps(intent, sort_keys=True).encode("utf-8"))
                self._intent_written = True
                roll_forward(self.data_dir, self.path, intent)
        except KeyboardInterrupt as exc:
            if self._intent_written and not self.path.exists():  # the signal came during the swap, held until now
                exc.add_note(f"it came after the new data of topic {self.topic!r} was swapped into {self.data_dir}")
            raise

    def discard(self) -> None:
        """Delete the staging folder unless its swap began (then the next writer start finishes it)."""
        if not self._intent_written:
            shutil.rmtree(self.path, ignore_errors=True)

    def __enter__(self) -> "TopicStaging":
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self.path.exists():
            self.discard()
