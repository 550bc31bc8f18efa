"""Dropping a re-created topic's local copy, or a revoked partition's folder, stopped at any step.

No broker: the logs are written with ``TopicLogs`` and the drop is cut by a KeyboardInterrupt
right after its N-th rename or folder removal (as Ctrl-C or SIGTERM-as-KeyboardInterrupt would;
a SIGKILL there leaves the same files). Whatever the step, the next start must not open the new
topic's (or the partition's next) empty log at the old log start offset: that would skip every
record of the new topic below it, and serve the store as complete without them.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import uuid
from pathlib import Path
from typing import Iterator

from materializer.storage.log_config import LogConfig
from materializer.storage.log_manager import TopicLogs, delete_partition_dir
from materializer.storage.record_batch import Record
from materializer.datadir.identity import check_local_copy, drop_local_copy

TOPIC = "t"
OLD_LOG_START = 5000


@contextlib.contextmanager
def _interrupted_after(count: int) -> Iterator[list[int]]:
    """Raise KeyboardInterrupt right after the ``count``-th ``os.replace``, ``os.rename`` or
    ``shutil.rmtree`` inside the block; yields a one-item list holding how many ran."""
    done = [0]
    originals = {(os, "replace"): os.replace, (os, "rename"): os.rename, (shutil, "rmtree"): shutil.rmtree}

    def wrap(real):
        def call(*args, **kwargs):
            result = real(*args, **kwargs)
            done[0] += 1
            if done[0] == count:
                raise KeyboardInterrupt
            return result
        return call

    for (module, name), real in originals.items():
        setattr(module, name, wrap(real))
    try:
        yield done
    finally:
        for (module, name), real in originals.items():
            setattr(module, name, real)


def _old_topic(data_dir: Path, partitions: list[int]) -> uuid.UUID:
    """The old topic: each partition's log starts at 5000 (retention moved it) and holds 10 records."""
    topic_id = uuid.uuid4()
    data_dir.mkdir(parents=True)
    with TopicLogs.open(data_dir, TOPIC, partitions, LogConfig(), topic_id=topic_id) as logs:
        for partition in partitions:
            log = logs.logs[partition]
            log.truncate_fully_and_start_at(OLD_LOG_START)
            log.append_records([Record(offset=OLD_LOG_START + i, timestamp=0, key=b"k%d" % i, value=b"v")
                                for i in range(10)])
    return topic_id


def test_a_drop_of_a_recreated_topic_stopped_at_any_step_never_starts_the_new_topic_at_the_old_log_start(tmp_path):
    partitions = [0, 1]
    for step in range(1, 50):
        data_dir = tmp_path / f"step-{step}"
        _old_topic(data_dir, partitions)
        with _interrupted_after(step) as done:
            try:
                drop_local_copy(data_dir, TOPIC)
                finished = True
            except KeyboardInterrupt:
                finished = False
        new_id = uuid.uuid4()
        check_local_copy(data_dir, TOPIC, new_id, partitions)  # the next start drops what is left
        with TopicLogs.open(data_dir, TOPIC, partitions, LogConfig(), topic_id=new_id) as logs:
            starts = {p: (log.log_start_offset, log.log_end_offset) for p, log in logs.logs.items()}
        assert starts == {0: (0, 0), 1: (0, 0)}, f"stopped after step {step}"
        if finished:
            break
    assert finished and done[0] >= 5  # the store, the checkpoints and both folders were interruption points


def test_a_partition_folder_delete_stopped_at_any_step_never_leaves_its_log_start_behind(tmp_path):
    for step in range(1, 20):
        data_dir = tmp_path / f"step-{step}"
        topic_id = _old_topic(data_dir, [0])
        with _interrupted_after(step) as done:
            try:
                delete_partition_dir(data_dir, TOPIC, 0)
                finished = True
            except KeyboardInterrupt:
                finished = False
        with TopicLogs.open(data_dir, TOPIC, [0], LogConfig(), topic_id=topic_id) as logs:
            log = logs.logs[0]
            # either the folder is still there (its records intact) or the next log starts from nothing
            assert (log.log_start_offset, log.log_end_offset) in ((OLD_LOG_START, OLD_LOG_START + 10), (0, 0)), \
                f"stopped after step {step}"
        if finished:
            break
    assert finished and done[0] >= 3
