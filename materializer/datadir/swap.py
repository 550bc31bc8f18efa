"""The swap of a staged topic into its data dir, and its roll-forward by the next writer start.

A restore (from a log dir or a snapshot) builds the topic in a staging folder inside ``DIR``
(:class:`~materializer.datadir.staging.TopicStaging`; same file system: renames are atomic), then::

    fsync the staging tree ─▶ swap-intent.json ─▶ marker incomplete ─▶ for each folder/file of the
    topic: DIR's ─▶ old/, staging's ─▶ DIR ─▶ DIR's other partition folders of the topic ─▶ old/
    ─▶ fsync folders ─▶ merge the checkpoint entries ─▶ marker complete ─▶ delete the staging folder

An interruption before the intent leaves ``DIR`` as it was (the next writer start deletes the
staging folder); from the intent on, every step can be redone, and the next writer start redoes
the remaining ones (:meth:`~materializer.datadir.lock.DataDirLock.acquire` rolls the swap forward). Readers refuse the topic
while the marker says incomplete.

The intent (``DIR/.staging-<topic>.<hex>/swap-intent.json``, JSON)::

    {"topic", "operation", "partitions": [p, ...], "recovery_points": {"<p>": offset},
     "log_start_offsets": {"<p>": offset}, "facts": {...}, "generation"}
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path
from typing import Any, Mapping

from materializer.datadir.layout import STAGING_PREFIX, state_dir, topic_config_path
from materializer.datadir.markers import mark_complete, mark_incomplete
from materializer.interrupts import signals_deferred
from materializer.storage.checkpoint import (
    CLEANER_OFFSET_CHECKPOINT,
    LOG_START_OFFSET_CHECKPOINT,
    RECOVERY_POINT_CHECKPOINT,
    update_offset_checkpoint,
)
from materializer.storage.errors import IncompleteDataDirError
from materializer.storage.files import find_partition_dirs, flush_dir, partition_dir_name

__all__ = ["SWAP_INTENT_FILE", "finish_interrupted", "fsync_tree", "roll_forward"]

logger = logging.getLogger(__name__)

#: The swap's point of no return, inside the staging folder.
SWAP_INTENT_FILE = "swap-intent.json"
_OLD = "old"
_LEGACY_RESTORE_PREFIX = ".restore-"  # temporary partition copies of restores before staging folders


def fsync_tree(root: Path) -> None:
    """fsync every file and folder under ``root`` (the staged data is durable before it is swapped in).

    Raises:
        OSError: naming the file that could not be synced.
    """
    for folder, _, files in os.walk(root):
        for path in [*(os.path.join(folder, name) for name in files), folder]:
            try:
                fd = os.open(path, os.O_RDONLY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
            except OSError as exc:
                raise OSError(exc.errno, f"syncing {path} failed: {exc.strerror or exc}") from exc


def roll_forward(data_dir: Path, staging: Path, intent: Mapping[str, Any]) -> None:
    """Do the swap steps of ``intent`` (as :meth:`~materializer.datadir.staging.TopicStaging.commit`
    wrote it into ``staging``) that are not done yet: each can be redone (module docstring).

    Raises:
        OSError: a rename, fsync or checkpoint write failed; the next writer start does it again.
    """
    topic = intent["topic"]
    generation = intent["generation"]
    mark_incomplete(data_dir, topic, f"`materializer {intent['operation']}` swapping the new data of the topic in",
                    "the next command that writes the data dir (`materializer run`, `restore`, `compact`) "
                    "finishes the swap", generation=generation)
    old = staging / _OLD
    partitions = [int(p) for p in intent["partitions"]]
    items = [partition_dir_name(topic, p) for p in partitions]
    items += [str(state_dir(Path(), topic)), str(topic_config_path(Path(), topic))]
    for relative in items:
        new, target = staging / relative, data_dir / relative
        if not os.path.lexists(new):
            continue  # moved in already
        if os.path.lexists(target):
            (old / relative).parent.mkdir(parents=True, exist_ok=True)
            os.rename(target, old / relative)
        target.parent.mkdir(parents=True, exist_ok=True)
        os.rename(new, target)
    for (_, partition), folder in sorted(find_partition_dirs(data_dir, topic).items()):
        if partition not in partitions:  # a partition the new data does not have
            old.mkdir(exist_ok=True)
            os.rename(folder, old / folder.name)
    for folder in (data_dir, state_dir(data_dir, topic).parent, topic_config_path(data_dir, topic).parent):
        if folder.is_dir():
            flush_dir(folder)

    def of_topic(topic_partition: tuple[str, int]) -> bool:
        return topic_partition[0] == topic

    for name, offsets in ((RECOVERY_POINT_CHECKPOINT, intent["recovery_points"]),
                          (LOG_START_OFFSET_CHECKPOINT, intent["log_start_offsets"])):
        update_offset_checkpoint(data_dir / name, {(topic, int(p)): int(o) for p, o in offsets.items()},
                                 remove=of_topic, replace_corrupt=True)
    if (data_dir / CLEANER_OFFSET_CHECKPOINT).exists():
        update_offset_checkpoint(data_dir / CLEANER_OFFSET_CHECKPOINT, remove=of_topic, replace_corrupt=True)
    mark_complete(data_dir, topic, generation=generation, written_by=intent["operation"], **intent["facts"])
    shutil.rmtree(staging)
    logger.info("%s: swapped the new data of topic %s into %s", intent["operation"], topic, data_dir)


def finish_interrupted(data_dir: Path) -> None:
    """What a writer start does first, under the lock: roll every begun swap forward, delete every
    staging folder whose swap did not begin (and older restores' ``.restore-*`` copies)."""
    for child in sorted(data_dir.iterdir()):
        if not child.is_dir() or child.is_symlink():
            continue
        if child.name.startswith(STAGING_PREFIX):
            intent_path = child / SWAP_INTENT_FILE
            try:
                intent = json.loads(intent_path.read_bytes())
            except FileNotFoundError:
                intent = None
            except ValueError as exc:  # written atomically: only damage makes it unreadable
                raise IncompleteDataDirError(f"{intent_path} is unreadable ({exc}): the swap it describes cannot be "
                                             f"finished; move {child} away and restore the topic again") from exc
            if intent is None:
                logger.warning("deleting %s, left by a command that was interrupted before it changed %s",
                               child, data_dir)
                shutil.rmtree(child)
            else:
                logger.warning("finishing the swap of topic %s that `materializer %s` began in %s", intent["topic"],
                               intent["operation"], data_dir)
                with signals_deferred():
                    roll_forward(data_dir, child, intent)
        elif child.name.startswith(_LEGACY_RESTORE_PREFIX):
            logger.warning("deleting %s, a partial copy left by an interrupted restore", child)
            shutil.rmtree(child)
