"""Where each file and folder of a data directory is: the one place that names them.

The layout (``DIR``; the partition folders follow a broker's ``log.dirs``)::

    DIR/<topic>-<partition>/                 local log: 00000000000000000000.log/.index/.timeindex/...
    DIR/topic-configs/<topic>.json           topic configs (Kafka names) the local log was opened with
    DIR/topic-formats/<topic>.json           key/value formats and registry URL of the last run (get/export's
                                             defaults; :mod:`materializer.datadir.formats`)
    DIR/state/<topic>/                       RocksDB state store (key -> latest value)
    DIR/recovery-point-offset-checkpoint     Kafka checkpoint files, written on close
    DIR/log-start-offset-checkpoint
    DIR/cleaner-offset-checkpoint            first dirty offset per partition, written by the log cleaner
    DIR/.kafka_cleanshutdown                 present only while nothing has the logs open
    DIR/.lock                                flock of the one process writing DIR (JSON: command, pid, since, host;
                                             :mod:`materializer.datadir.lock`)
    DIR/topic-status/<topic>.json            the topic's completeness marker, written last by every command that
                                             builds or replaces the topic's data (readers refuse an incomplete
                                             topic; :mod:`materializer.datadir.markers`)
    DIR/topic-lease/<topic>.json             how current the store is: renewed by `run` while it is current
                                             (:mod:`materializer.datadir.lease`; readers report the age, bound it)
    DIR/.staging-<topic>.<hex>/              a topic being restored, swapped into DIR at the end (then deleted;
                                             :mod:`materializer.datadir.staging`)

Readers (``get``, ``export``, views, ``kafkalog``) write none of these; writers (``run``, ``restore``,
``compact``, ``spark compact``) hold ``DIR/.lock`` first. The checkpoint files are the storage
engine's (:mod:`materializer.storage.checkpoint` names them).
"""

from __future__ import annotations

from pathlib import Path

from materializer.storage.files import partition_dir_name

__all__ = [
    "LOCK_FILE",
    "STAGING_PREFIX",
    "lease_path",
    "partition_dir",
    "state_dir",
    "topic_config_path",
    "topic_formats_path",
    "topic_status_path",
]

#: The lock file of a data dir (Kafka's ``LogManager.LockFileName``).
LOCK_FILE = ".lock"
#: Folder name prefix of a staging folder (``.staging-<topic>.<hex>``; never a partition folder name).
STAGING_PREFIX = ".staging-"


def partition_dir(data_dir: Path | str, topic: str, partition: int) -> Path:
    """``DIR/<topic>-<partition>``: a partition's local log."""
    return Path(data_dir) / partition_dir_name(topic, partition)


def state_dir(data_dir: Path | str, topic: str) -> Path:
    """``DIR/state/<topic>``: the topic's RocksDB state store."""
    return Path(data_dir) / "state" / topic


def topic_config_path(data_dir: Path | str, topic: str) -> Path:
    """``DIR/topic-configs/<topic>.json``: the topic configs the local log was opened with."""
    return Path(data_dir) / "topic-configs" / f"{topic}.json"


def topic_formats_path(data_dir: Path | str, topic: str) -> Path:
    """``DIR/topic-formats/<topic>.json``: the key/value formats the topic was last materialized with."""
    return Path(data_dir) / "topic-formats" / f"{topic}.json"


def topic_status_path(data_dir: Path | str, topic: str) -> Path:
    """``DIR/topic-status/<topic>.json``: the topic's completeness marker (a folder of its own: in
    ``state/`` a topic ``a.json``'s store would share the name of topic ``a``'s marker)."""
    return Path(data_dir) / "topic-status" / f"{topic}.json"


def lease_path(data_dir: Path | str, topic: str) -> Path:
    """``DIR/topic-lease/<topic>.json``: the topic's lease (a folder of its own, as the markers')."""
    return Path(data_dir) / "topic-lease" / f"{topic}.json"
