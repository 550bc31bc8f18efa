"""Kafka's own follower catching up, for bench_materializer.py's cold-start table (case k).

A second :class:`~materializer.local.kafka_broker.LocalKafkaBroker` (broker-only node
:data:`FOLLOWER_NODE_ID`) joins the benchmark broker's KRaft cluster, once. Each measurement then:

1. checks that the follower holds no partition of the topic (it starts empty);
2. sends one ``AlterPartitionReassignments`` request (KIP-455; kafka-python's
   ``KafkaAdminClient.alter_partition_reassignments``) moving every partition to replicas
   ``[leader, follower]``; the clock starts just before the request;
3. polls the follower's partition directories every :data:`POLL_S` seconds until, for every
   partition, the follower's ``.log`` files hold as many bytes as the leader's (the leader's
   files do not change: nothing is produced and the topic's cleaner is held back); the clock
   stops there. Kafka's follower (``ReplicaFetcherThread`` -> ``UnifiedLog.appendAsFollower``)
   appends the leader's batches verbatim, so equal sizes mean equal logs; outside the timed part
   the bytes are compared (the concatenated ``.log`` files of each partition; the segment
   boundaries may differ, as a follower rolls on its own appends) and the time at which the
   reassignment left ``ListPartitionReassignments`` (the follower joined the ISR and the
   controller completed it) is noted;
4. reassigns every partition back to ``[leader]`` and waits until the follower has deleted its
   copies (``LogManager.asyncDelete``: ``<topic>-<p>.<id>-delete``, then removed after
   ``file.delete.delay.ms``, 0 with :data:`TEST_BROKER_CONFIG`'s ``log.segment.delete.delay.ms``),
   so the next measurement starts empty again.

The follower is not throttled (no ``leader/follower.replication.throttled.*`` configs) and runs
Kafka's default ``replica.fetch.*`` / ``num.replica.fetchers`` settings; :meth:`Follower.settings`
reads them back from the follower with DescribeConfigs for the output. Kafka's follower does not
fsync on append (``log.flush.interval.messages`` defaults to Long.MAX_VALUE; segments are
flushed when rolled, in the background), while the Materializer fsyncs each fetch.
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

from confluent_kafka.admin import AdminClient, ConfigResource, ResourceType
from kafka import KafkaAdminClient
from kafka import TopicPartition as KafkaPythonTopicPartition

from materializer.local.kafka_broker import NODE_ID, TEST_BROKER_CONFIG, LocalKafkaBroker
from materializer.storage.files import LOG_FILE_SUFFIX

#: node.id of the joining broker (the benchmark broker is NODE_ID, 1).
FOLLOWER_NODE_ID = 2
#: Seconds between two looks at the follower's partition directories while it catches up.
POLL_S = 0.005
#: Broker settings read back from the follower for the output: replica fetch and throttles.
SETTING_KEYS = ("num.replica.fetchers", "replica.fetch.max.bytes", "replica.fetch.response.max.bytes",
                "replica.fetch.min.bytes", "replica.fetch.wait.max.ms", "replica.fetch.backoff.ms",
                "replica.socket.receive.buffer.bytes", "leader.replication.throttled.rate",
                "follower.replication.throttled.rate")
#: The topic's settings read back for the output: the replicas a quota would throttle.
TOPIC_SETTING_KEYS = ("leader.replication.throttled.replicas", "follower.replication.throttled.replicas")
_CHUNK = 8 * 1024 * 1024


@dataclass
class CatchUp:
    """One catch-up of the follower (:meth:`Follower.catch_up`).

    seconds: from the AlterPartitionReassignments request to equal ``.log`` sizes on every partition;
    bytes: the leader's ``.log`` bytes; segments_match: the follower's segment files have the
    leader's names and sizes; reassignment_s: from the request until the reassignment was no
    longer listed (ListPartitionReassignments, polled every 20 ms after the timed part);
    remove_s: seconds the removal of the replica and of the follower's copies took;
    first_bytes_s: from the request until a follower ``.log`` file first held a byte (the
    controller's reassignment, the metadata reaching the follower, its fetcher's first response).
    """

    seconds: float
    bytes: int
    segments_match: bool
    reassignment_s: float
    remove_s: float
    first_bytes_s: float


class FollowerError(RuntimeError):
    """The follower did not catch up, its log differs from the leader's, or it did not let go of a partition."""


def log_files(partition_dir: Path) -> list[Path]:
    """The ``.log`` segment files of a partition directory, in base-offset order (none if it is missing)."""
    if not partition_dir.is_dir():
        return []
    return sorted(partition_dir.glob(f"*{LOG_FILE_SUFFIX}"))


def log_size(partition_dir: Path) -> int:
    """Bytes of a partition directory's ``.log`` files (0 if it is missing)."""
    total = 0
    try:
        with os.scandir(partition_dir) as it:
            entries = list(it)
    except FileNotFoundError:
        return 0
    for entry in entries:
        if entry.name.endswith(LOG_FILE_SUFFIX):
            try:
                total += entry.stat().st_size
            except FileNotFoundError:  # a segment deleted meanwhile
                pass
    return total


def same_bytes(leader: list[Path], follower: list[Path]) -> bool:
    """Whether the concatenations of two lists of files hold the same bytes (streamed, 8 MiB chunks)."""
    def chunks(paths: list[Path]):
        for path in paths:
            with open(path, "rb") as f:
                while block := f.read(_CHUNK):
                    yield block

    a, b = chunks(leader), chunks(follower)
    pending_a = pending_b = b""
    while True:
        if not pending_a:
            pending_a = next(a, b"")
        if not pending_b:
            pending_b = next(b, b"")
        if not pending_a or not pending_b:
            return not pending_a and not pending_b
        n = min(len(pending_a), len(pending_b))
        if pending_a[:n] != pending_b[:n]:
            return False
        pending_a, pending_b = pending_a[n:], pending_b[n:]


class Follower:
    """A broker-only node joined to ``leader``'s cluster, and the catch-up measurement of ``topic``.

    Args:
        leader: the started benchmark broker (its controller is the cluster's).
        state_dir: the follower's state directory (created).
        topic, partitions: the topic whose partitions the follower replicates.
        timeout_s: seconds a catch-up or a removal may take before :class:`FollowerError`.

    Use as a context manager (starts and stops the follower broker). Not thread-safe.
    """

    def __init__(self, leader: LocalKafkaBroker, state_dir: Path, topic: str, partitions: int,
                 timeout_s: float = 600.0) -> None:
        self.leader = leader
        self.topic = topic
        self.partitions = partitions
        self.timeout_s = timeout_s
        # The benchmark broker's settings apart from the cleaner's; nothing about replication.
        self.broker = LocalKafkaBroker(state_dir, extra_config=TEST_BROKER_CONFIG, join=leader,
                                       node_id=FOLLOWER_NODE_ID)
        self._admin: KafkaAdminClient | None = None
        self._deleted = re.compile(rf"^{re.escape(topic)}-\d+\.[0-9a-f]+-delete$")

    def __enter__(self) -> "Follower":
        self.broker.start()
        self._admin = KafkaAdminClient(bootstrap_servers=self.leader.bootstrap_servers,
                                       client_id="bench-follower", request_timeout_ms=30_000)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._admin is not None:
            self._admin.close()
        self.broker.stop()

    @property
    def admin(self) -> KafkaAdminClient:
        if self._admin is None:
            raise FollowerError("the follower is not started (use it as a context manager)")
        return self._admin

    def settings(self) -> dict[str, str]:
        """:data:`SETTING_KEYS` as the follower broker reports them and the topic's
        :data:`TOPIC_SETTING_KEYS` (DescribeConfigs; "unset" if absent, "" if empty)."""
        admin = AdminClient({"bootstrap.servers": self.leader.bootstrap_servers})
        found: dict[str, str] = {}
        for resource, keys in ((ConfigResource(ResourceType.BROKER, str(FOLLOWER_NODE_ID)), SETTING_KEYS),
                               (ConfigResource(ResourceType.TOPIC, self.topic), TOPIC_SETTING_KEYS)):
            configs = admin.describe_configs([resource])[resource].result(30)
            found.update({key: (configs[key].value if key in configs and configs[key].value is not None
                                else "unset") for key in keys})
        return found

    def _reassign(self, replicas: list[int]) -> None:
        result = self.admin.alter_partition_reassignments(
            {KafkaPythonTopicPartition(self.topic, p): replicas for p in range(self.partitions)})
        failed = {tp: error for tp, error in result.items() if error is not None}
        if failed or len(result) != self.partitions:
            raise FollowerError(f"AlterPartitionReassignments to {replicas}: {failed or result}")

    def _reassigning(self) -> bool:
        ongoing = self.admin.list_partition_reassignments(
            [KafkaPythonTopicPartition(self.topic, p) for p in range(self.partitions)])
        return bool(ongoing)

    def _held_dirs(self) -> list[str]:
        names = {f"{self.topic}-{p}" for p in range(self.partitions)}
        if not self.broker.log_dirs.is_dir():
            return []
        return sorted(d.name for d in self.broker.log_dirs.iterdir() if d.name in names or self._deleted.match(d.name))

    def catch_up(self) -> CatchUp:
        """One measurement (steps 1-4 of the module docstring).

        Raises:
            FollowerError: the follower held a partition before the request, did not catch up or
                let go within ``timeout_s``, or its bytes differ from the leader's.
        """
        held = self._held_dirs()
        if held:
            raise FollowerError(f"the follower is not empty before the measurement: {held}")
        leader_dirs = [self.leader.partition_dir(self.topic, p) for p in range(self.partitions)]
        follower_dirs = [self.broker.partition_dir(self.topic, p) for p in range(self.partitions)]
        target = [log_size(d) for d in leader_dirs]
        pending = list(range(self.partitions))
        first_bytes_s = None
        started = time.perf_counter()
        self._reassign([NODE_ID, FOLLOWER_NODE_ID])
        while pending:
            sizes = {p: log_size(follower_dirs[p]) for p in pending}
            if first_bytes_s is None and any(sizes.values()):
                first_bytes_s = time.perf_counter() - started
            pending = [p for p in pending if sizes[p] != target[p]]
            if not pending:
                break
            if time.perf_counter() - started > self.timeout_s:
                raise FollowerError(f"the follower did not catch up within {self.timeout_s:.0f} s: "
                                    f"partitions {pending}, .log bytes "
                                    f"{[log_size(follower_dirs[p]) for p in pending]} of {[target[p] for p in pending]}")
            time.sleep(POLL_S)
        seconds = time.perf_counter() - started
        if first_bytes_s is None:  # every partition complete at the first look
            first_bytes_s = seconds
        while self._reassigning():
            if time.perf_counter() - started > self.timeout_s:
                raise FollowerError(f"the reassignment to [{NODE_ID}, {FOLLOWER_NODE_ID}] did not complete "
                                    f"within {self.timeout_s:.0f} s")
            time.sleep(0.02)
        reassignment_s = time.perf_counter() - started
        segments_match = True
        for p in range(self.partitions):
            leader_files, follower_files = log_files(leader_dirs[p]), log_files(follower_dirs[p])
            if not same_bytes(leader_files, follower_files):
                raise FollowerError(f"partition {p}: the follower's .log bytes differ from the leader's")
            segments_match &= ([(f.name, f.stat().st_size) for f in leader_files]
                               == [(f.name, f.stat().st_size) for f in follower_files])
        removing = time.perf_counter()
        self._reassign([NODE_ID])
        while self._reassigning() or self._held_dirs():
            if time.perf_counter() - removing > self.timeout_s:
                raise FollowerError(f"the follower still holds {self._held_dirs()} {self.timeout_s:.0f} s "
                                    f"after the reassignment back to [{NODE_ID}]")
            time.sleep(0.05)
        return CatchUp(seconds, sum(target), segments_match, reassignment_s, time.perf_counter() - removing,
                       first_bytes_s)
