"""Is the local copy of a topic a copy of the topic the cluster has under that name? (KIP-516)

A topic deleted and re-created under the same name is another topic: new id, offsets from 0,
other records. A Kafka broker never appends one topic's records to another's log: each partition
folder holds the topic id in ``partition.metadata`` (``UnifiedLog.initializeTopicId``), a log
whose id differs from the metadata's is refused (``InconsistentTopicIdException``) and, on a
broker's start, moved aside as a stray (``LogManager.isStrayReplica``). The materializer keeps
the same file in each ``DIR/<topic>-<partition>/`` and compares, on every start, the ids found
there with the id in the cluster's metadata (:func:`check_local_copy`):

* the same id: carry on;
* another id, or local partitions the topic no longer has: the topic was re-created. With
  ``on_topic_recreated="rebuild"`` (the default) the local logs, the state store and the topic's
  checkpoint entries are dropped (:func:`drop_local_copy`) and the topic is materialized again
  from scratch, with one warning naming both ids; with ``"fail"``,
  :class:`~materializer.adapters.errors.TopicIdChangedError` stops the run;
* folders without ``partition.metadata`` (written before the materializer kept it): adopted;
  their leader epochs still catch a re-created topic whose log differs (the first fetch diverges).

While a run goes on, the replica path's fetcher compares the ids before every request and the
consumer path after every fetch; both end in the same drop-and-rebuild, done live.
"""

from __future__ import annotations

import logging
import re
import shutil
import uuid
from pathlib import Path
from typing import Literal, NamedTuple

from materializer.adapters.errors import TopicIdChangedError
from materializer.adapters.rocksdb_store import StateStore
from materializer.datadir.layout import state_dir
from materializer.datadir.markers import mark_incomplete
from materializer.storage.checkpoint import (
    CLEANER_OFFSET_CHECKPOINT,
    LOG_START_OFFSET_CHECKPOINT,
    RECOVERY_POINT_CHECKPOINT,
    update_offset_checkpoint,
)
from materializer.storage.files import delete_log_dir, find_partition_dirs
from materializer.storage.partition_metadata import PartitionMetadataFile, topic_id_to_string

__all__ = ["LocalCopy", "check_local_copy", "drop_local_copy", "read_local_copy", "remove_deleted_folders",
           "ON_TOPIC_RECREATED"]

logger = logging.getLogger(__name__)

#: What to do when the cluster's topic is another than the local copy's: drop and rebuild, or stop.
ON_TOPIC_RECREATED = ("rebuild", "fail")


class LocalCopy(NamedTuple):
    """What the data dir holds of a topic: partition -> its folder's topic id (None: no
    ``partition.metadata``), and whether the topic's state store exists."""

    topic_ids: dict[int, uuid.UUID | None]
    has_store: bool


def read_local_copy(data_dir: Path, topic: str) -> LocalCopy:
    """The topic's partition folders in ``data_dir`` and the ids in their ``partition.metadata``.

    Raises:
        StorageError: a ``partition.metadata`` file is malformed (file and line named).
    """
    folders = find_partition_dirs(Path(data_dir), topic)
    ids = {partition: PartitionMetadataFile(folder).read() for (_, partition), folder in folders.items()}
    return LocalCopy(ids, StateStore.exists(state_dir(data_dir, topic)))


def check_local_copy(data_dir: Path, topic: str, cluster_topic_id: uuid.UUID | None, partitions: list[int],
                     on_topic_recreated: Literal["rebuild", "fail"] = "rebuild") -> bool:
    """Compare the local copy of ``topic`` with the cluster's (module docstring); drop it when the
    topic was re-created and ``on_topic_recreated`` is ``"rebuild"``.

    Args:
        data_dir: the data dir.
        topic: the topic.
        cluster_topic_id: the id in the cluster's metadata (None: the cluster has no ids, before
            Kafka 2.8: nothing to compare).
        partitions: the topic's partitions in the cluster's metadata.
        on_topic_recreated: ``"rebuild"`` or ``"fail"``.

    Returns:
        True when a local copy of another topic was dropped.

    Raises:
        TopicIdChangedError: the local copy is of another topic and ``on_topic_recreated`` is ``"fail"``.
        StorageError / OSError: a folder cannot be read or deleted.
    """
    if cluster_topic_id is None:
        return False
    local = read_local_copy(data_dir, topic)
    others = {p: found for p, found in local.topic_ids.items() if found is not None and found != cluster_topic_id}
    gone = sorted(set(local.topic_ids) - set(partitions))
    if not others and not gone:
        return False
    old_id = next(iter(others.values()), None)
    if old_id is not None:
        detail = (f"partition folders {sorted(others)} of {data_dir} hold topic id {topic_id_to_string(old_id)}")
    else:
        detail = f"the local copy has partitions {gone} that the topic no longer has"
    if on_topic_recreated == "fail":
        raise TopicIdChangedError(topic, old_id or cluster_topic_id, cluster_topic_id,
                                  f"{detail}; --on-topic-recreated rebuild drops the local copy and materializes "
                                  f"the new topic")
    logger.warning("topic %s was re-created (the cluster's id is %s; %s): dropping its local logs and state store in "
                   "%s and materializing it again from the new topic", topic, topic_id_to_string(cluster_topic_id),
                   detail, data_dir)
    drop_local_copy(data_dir, topic)
    return True


def drop_local_copy(data_dir: Path, topic: str) -> None:
    """Delete ``topic``'s partition folders, state store and checkpoint entries in ``data_dir``.

    Order: the topic marked incomplete (readers refuse it from here on), the store (a crash
    after it leaves logs without a store, which the next start rebuilds, or drops again when the
    ids still differ), the checkpoint entries, so the next logs of the topic start from nothing,
    then each partition folder (renamed to ``<folder>.<32 hex>-delete`` first, Kafka's
    ``LocalLog.logDeleteDirName``, so a crash never leaves half a folder under the partition's
    name). The entries go before the folders: a crash between the two then leaves folders with
    the old topic id, which the next start drops again, never the old topic's log start offset
    for the new topic's empty log (which would skip the new topic's records below it). Other
    topics of the data dir are untouched.

    Raises:
        OSError: a file cannot be deleted (the path named).
    """
    data_dir = Path(data_dir)
    mark_incomplete(data_dir, topic, "the topic was re-created: `materializer run` drops the old topic's local copy "
                    "and materializes the new one", "wait until `materializer run` has caught up (or run `materializer "
                    "run --until-caught-up` if it was stopped)")
    StateStore.destroy(state_dir(data_dir, topic))
    for name in (RECOVERY_POINT_CHECKPOINT, LOG_START_OFFSET_CHECKPOINT, CLEANER_OFFSET_CHECKPOINT):
        path = data_dir / name
        if path.exists():
            update_offset_checkpoint(path, remove=lambda tp: tp[0] == topic, replace_corrupt=True)
    for (_, _partition), folder in sorted(find_partition_dirs(data_dir, topic).items()):
        delete_log_dir(folder)


def remove_deleted_folders(data_dir: Path, topic: str) -> int:
    """Finish deletions a crash interrupted: remove ``<topic>-<partition>.<32 hex>-delete`` folders
    (:func:`drop_local_copy` renames a folder so before deleting it). Returns how many."""
    pattern = re.compile(re.escape(topic) + r"-\d+\.[0-9a-f]{32}-delete")
    removed = 0
    for folder in Path(data_dir).glob(f"{topic}-*-delete"):
        if pattern.fullmatch(folder.name) and folder.is_dir():
            logger.info("removing %s, left by a deletion that was interrupted", folder)
            shutil.rmtree(folder)
            removed += 1
    return removed
