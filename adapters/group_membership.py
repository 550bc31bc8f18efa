"""Membership in a Kafka consumer group without consuming: the group coordinator assigns the
partitions, records are fetched elsewhere (the replica path).

:class:`GroupMembership` is a confluent-kafka ``Consumer`` that subscribes to one or more topics
under ``group.id`` and takes part in the group's rebalances, but never fetches a record: every
partition it is assigned is paused in the same rebalance callback that assigns it (librdkafka
serves a partition's pause before its fetch start, both being operations on the partition's
queue, and a paused partition is never put in a Fetch request), ``enable.auto.commit=false`` and
nothing is ever committed. What it holds is the membership (member id, generation or member
epoch) and the assignment; the caller fetches the assigned partitions itself.

Protocols:

* **consumer** (KIP-848, Kafka 4.0+): ``group.protocol=consumer``. The member sends
  ConsumerGroupHeartbeat (API key 68) with its subscription; the broker's group coordinator
  computes the target assignment with a server-side assignor (``uniform`` or ``range``,
  ``group.consumer.assignors``; ``remote_assignor`` chooses one) and moves partitions member by
  member: a partition reaches its new owner only after the old owner revoked it (the
  ``ConsumerGroupMember`` reconciliation), and nobody else stops. The session timeout and the
  heartbeat interval are the group's (``group.consumer.session.timeout.ms`` = 45 s and
  ``group.consumer.heartbeat.interval.ms`` = 5 s on the broker; per group with
  IncrementalAlterConfigs on the GROUP resource, ``consumer.session.timeout.ms`` and
  ``consumer.heartbeat.interval.ms``, within the broker's min/max): the client may not set them.
* **classic** (JoinGroup/SyncGroup/Heartbeat, Kafka's ``ConsumerCoordinator``) with
  ``partition.assignment.strategy=cooperative-sticky`` (KIP-429, incremental cooperative
  rebalancing, the ``CooperativeStickyAssignor``): a rebalance revokes only the partitions that
  move, the others stay assigned throughout, and a second rebalance hands the revoked ones to
  their new owner. ``session_timeout_ms`` and ``heartbeat_interval_ms`` apply (within the
  broker's ``group.min.session.timeout.ms`` .. ``group.max.session.timeout.ms``).

``protocol="auto"`` (the default) asks the bootstrap broker's ApiVersions whether it speaks
ConsumerGroupHeartbeat v1 or later (what librdkafka needs, and what a Kafka 4.0+ broker with the
``group.version`` feature advertises; Kafka 3.7-3.9 advertise only the early-access v0) and
chooses ``consumer`` when it does, ``classic`` otherwise. librdkafka itself does not fall back:
against a broker without KIP-848 it retries the heartbeat forever and reports nothing above its
debug log, so the choice is made before the client is created.

Callbacks (``on_assign(added)``, ``on_revoke(removed)``, ``on_lost(lost)``, each a frozenset of
``(topic, partition)``) follow the consumer's ``ConsumerRebalanceListener``: ``on_revoke`` is
called while the partitions are still assigned (before they are given up, so the caller can stop
its work on them), ``on_assign`` after they were added (and paused), ``on_lost`` when the member
lost them without a revocation (its session expired, or it was fenced: another member may
already own them). With both protocols the sets are the *changes*: partitions that stay assigned
are in none of them (KIP-429; KIP-848 is incremental by design). Closing the membership revokes
everything it holds (``on_revoke`` with the whole assignment), as ``KafkaConsumer.close`` does.

Threading: the client is polled by one daemon thread of this object (``poll_interval_ms``, well
inside ``max.poll.interval.ms``: a member that stops polling for longer leaves the group), and
every callback runs on that thread, one at a time, in the order the rebalances happened. A
callback should return quickly (heartbeats are sent by librdkafka's own threads, but the next
rebalance waits for it); one that raises is logged and ignored. :meth:`assignment`,
:attr:`member_id`, :attr:`generation` and the wait methods may be called from any thread.

Adapter over ``confluent_kafka.Consumer``; the ApiVersions probe uses kafka-python (the replica
path's client), with the same translated security settings.
"""

from __future__ import annotations

import contextlib
import json
import logging
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Literal

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from materializer.adapters.errors import GroupMembershipError
from materializer.adapters.kafka_source import KafkaSourceOptions

__all__ = ["CONSUMER_GROUP_HEARTBEAT_API_KEY", "GroupMembership", "Partitions", "broker_speaks_consumer_protocol",
           "consumer_protocol_in_api_versions"]

logger = logging.getLogger(__name__)
_client_logger = logging.getLogger("materializer.adapters.group_membership.librdkafka")

#: ``(topic, partition)`` pairs.
Partitions = frozenset[tuple[str, int]]
#: ``on_assign`` / ``on_revoke`` / ``on_lost`` callback.
PartitionsCallback = Callable[[Partitions], None]

#: Kafka ``ApiKeys.CONSUMER_GROUP_HEARTBEAT`` (KIP-848).
CONSUMER_GROUP_HEARTBEAT_API_KEY = 68
#: The first ConsumerGroupHeartbeat version librdkafka uses (Kafka 4.0; v0 was 3.7-3.9's early access).
_MIN_CONSUMER_GROUP_HEARTBEAT_VERSION = 1

#: librdkafka's serialized ``rd_kafka_consumer_group_metadata_t`` starts with this, then the
#: generation id (classic) or member epoch (KIP-848) as a native-endian int32.
_GROUP_METADATA_MAGIC = b"CGMDv2:"

#: Settings this adapter owns; ``client_config`` may not override them.
_OWNED_KEYS = frozenset({"group.id", "group.protocol", "enable.auto.commit", "enable.auto.offset.store",
                         "partition.assignment.strategy", "session.timeout.ms", "heartbeat.interval.ms",
                         "group.instance.id", "max.poll.interval.ms", "group.remote.assignor"})
#: Consumer settings that mean nothing to a member that never fetches, left out of ``client_config``.
_FETCH_KEYS = ("fetch.", "isolation.level", "auto.offset.reset", "queued.", "max.partition.fetch.bytes",
               "enable.partition.eof", "check.crcs", "statistics.interval.ms")


def consumer_protocol_in_api_versions(api_versions: Mapping[int, tuple[int, int]]) -> bool:
    """True when an ApiVersions answer (API key -> (min, max) version) carries ConsumerGroupHeartbeat
    v1 or later: the broker runs KIP-848's consumer protocol as librdkafka speaks it (Kafka 4.0+)."""
    versions = api_versions.get(CONSUMER_GROUP_HEARTBEAT_API_KEY)
    return versions is not None and versions[1] >= _MIN_CONSUMER_GROUP_HEARTBEAT_VERSION


def broker_speaks_consumer_protocol(bootstrap_servers: str, options: KafkaSourceOptions | None = None) -> bool:
    """Ask a bootstrap broker (ApiVersions, Kafka ``ApiVersionsRequest``) whether it speaks KIP-848's
    consumer group protocol; see :func:`consumer_protocol_in_api_versions`.

    Args:
        bootstrap_servers: ``host:port[,host:port]``.
        options: client settings (security); librdkafka names, translated as the replica path does.

    Raises:
        ValueError: a client setting kafka-python cannot honour (the caller chooses a protocol itself).
        GroupMembershipError: no broker answered within ``options.request_timeout_ms``.
    """
    from kafka.net.compat import KafkaNetClient  # the replica path's client; imported when probing

    from materializer.adapters.replica_fetch import replica_client_config

    options = options or KafkaSourceOptions()
    config = replica_client_config(options, bootstrap_servers)
    config["client_id"] = "kafka-materializer-group-probe"
    client = KafkaNetClient(**config)
    manager = client._manager
    manager._net.start()
    try:
        manager.bootstrap(options.request_timeout_ms)
        return consumer_protocol_in_api_versions(manager.broker_version_data.api_versions)
    except Exception as exc:  # kafka-python's errors: connection, timeout, SASL/SSL
        raise GroupMembershipError(f"cannot ask {bootstrap_servers} which group protocols it speaks "
                                   f"(ApiVersions): {exc}", group="", code=type(exc).__name__) from exc
    finally:
        with contextlib.suppress(Exception):
            manager.close()
        manager._net.stop(timeout_ms=5_000)


def _pairs(partitions: Iterable[TopicPartition]) -> Partitions:
    return frozenset((tp.topic, tp.partition) for tp in partitions)


class GroupMembership:
    """Member of consumer group ``group_id`` for ``topics`` that holds an assignment and fetches nothing.

    See the module docstring for the protocols, the callbacks and the threading. The membership
    starts in the constructor (subscribe, then the poll thread) and ends with :meth:`close` (or
    the ``with`` block): the member leaves the group at once (classic LeaveGroup; KIP-848 a
    heartbeat with member epoch -1, or -2 for a static member, which keeps its partitions until its
    session times out, KIP-345/KIP-848), so the others get its partitions without waiting for a
    session timeout.

    Args:
        bootstrap_servers: ``host:port[,host:port]``.
        group_id: the consumer group id.
        topics: the topics to subscribe to (names, no patterns).
        protocol: ``"auto"`` (default: ``consumer`` when the broker speaks KIP-848, else ``classic``),
            ``"consumer"`` or ``"classic"``.
        session_timeout_ms: classic protocol: ``session.timeout.ms``, ms (45,000, Kafka's default);
            the coordinator removes a member that sent no heartbeat for this long. Ignored (with
            a log line when not the default) by the consumer protocol, whose session timeout the
            group sets (module docstring).
        heartbeat_interval_ms: classic protocol: ``heartbeat.interval.ms``, ms (None: a third of the
            session timeout, at most 3,000, Kafka's default).
        max_poll_interval_ms: ``max.poll.interval.ms``, ms (300,000): the member leaves the group if
            its thread did not poll for this long (it polls every ``poll_interval_ms``).
        group_instance_id: ``group.instance.id`` (KIP-345 static membership): a member that restarts
            with the same id within the session timeout gets its partitions back without a
            rebalance. None (default): dynamic membership.
        client_id: ``client.id`` shown in the broker's logs and ``kafka-consumer-groups.sh --describe``.
        remote_assignor: consumer protocol: ``group.remote.assignor`` (``"uniform"`` or ``"range"``;
            None: the broker's first of ``group.consumer.assignors``).
        options: client settings (security: ``client_config`` with librdkafka names;
            ``request_timeout_ms`` bounds the metadata check at start). Fetch and commit
            settings in it are ignored; settings this adapter owns (``group.id``,
            ``group.protocol``, ``session.timeout.ms``, ...) are refused.
        on_assign, on_revoke, on_lost: rebalance callbacks (module docstring).
        poll_interval_ms: how long one poll of the membership thread waits, ms (100): callbacks
            run at most this late, and :meth:`close` returns about this soon.
        statistics_interval_ms: librdkafka ``statistics.interval.ms``, ms (0: none); when set,
            :attr:`fetch_requests` and :attr:`fetched_messages` are kept from the statistics.

    Raises:
        GroupMembershipError: a setting librdkafka refuses, a topic not in the cluster's metadata,
            no broker answering the metadata request within ``options.request_timeout_ms``, or an
            unknown ``protocol``.
    """

    def __init__(self, bootstrap_servers: str, group_id: str, topics: Iterable[str], *,
                 protocol: Literal["auto", "consumer", "classic"] = "auto",
                 session_timeout_ms: int = 45_000, heartbeat_interval_ms: int | None = None,
                 max_poll_interval_ms: int = 300_000, group_instance_id: str | None = None,
                 client_id: str = "kafka-materializer-group", remote_assignor: str | None = None,
                 options: KafkaSourceOptions | None = None,
                 on_assign: PartitionsCallback | None = None, on_revoke: PartitionsCallback | None = None,
                 on_lost: PartitionsCallback | None = None, poll_interval_ms: int = 100,
                 statistics_interval_ms: int = 0) -> None:
        self.bootstrap_servers, self.group_id = bootstrap_servers, group_id
        self.group_instance_id = group_instance_id
        self.topics = tuple(dict.fromkeys(topics))
        if not self.topics:
            raise GroupMembershipError(f"group {group_id!r}: no topic to subscribe to", group=group_id)
        self.options = options or KafkaSourceOptions()
        owned = sorted(_OWNED_KEYS.intersection(self.options.client_config))
        if owned:
            raise GroupMembershipError(f"group {group_id!r}: client settings {', '.join(owned)} are set by "
                                       "the group membership itself (use its arguments)", group=group_id)
        self.protocol: Literal["consumer", "classic"] = self._resolve_protocol(protocol)
        self._callbacks = {"assign": on_assign, "revoke": on_revoke, "lost": on_lost}
        self._poll_timeout_s = poll_interval_ms / 1000.0
        self._lock = threading.Condition()
        self._assignment: Partitions = frozenset()
        self._member_id: str | None = None
        self._generation: int | None = None
        self._error: GroupMembershipError | None = None
        self._records_received = 0
        self._fetch_requests: int | None = None
        self._fetched_messages: int | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

        config = self._config(session_timeout_ms, heartbeat_interval_ms, max_poll_interval_ms, group_instance_id,
                              client_id, remote_assignor, statistics_interval_ms)
        if self.protocol == "consumer" and session_timeout_ms != 45_000:
            logger.info("group %r uses the consumer protocol (KIP-848): its session timeout is the group's "
                        "consumer.session.timeout.ms, not session_timeout_ms=%d", group_id, session_timeout_ms)
        callbacks: dict[str, Any] = {"logger": _client_logger, "error_cb": self._on_client_error}
        if statistics_interval_ms > 0:
            callbacks["stats_cb"] = self._on_statistics
        try:
            self._consumer = Consumer(config, **callbacks)
        except (KafkaException, ValueError, TypeError) as exc:
            raise self._wrap(exc, "cannot create the group member") from exc
        try:
            self._check_topics()
            self._consumer.subscribe(list(self.topics), on_assign=self._on_assign, on_revoke=self._on_revoke,
                                     on_lost=self._on_lost)
        except BaseException as exc:
            with contextlib.suppress(Exception):
                self._consumer.close()
            if isinstance(exc, (KafkaException, RuntimeError)):
                raise self._wrap(exc, "cannot subscribe") from exc
            raise
        self._thread = threading.Thread(target=self._run, name=f"group-membership-{group_id}", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------------------- set-up

    def _resolve_protocol(self, protocol: str) -> Literal["consumer", "classic"]:
        if protocol == "consumer":
            return "consumer"
        if protocol == "classic":
            return "classic"
        if protocol != "auto":
            raise GroupMembershipError(f"group {self.group_id!r}: unknown group protocol {protocol!r} "
                                       "(auto, consumer or classic)", group=self.group_id)
        try:
            supported = broker_speaks_consumer_protocol(self.bootstrap_servers, self.options)
        except ValueError as exc:
            logger.info("group %r: the classic group protocol, since the broker's protocols cannot be probed "
                        "with these client settings (%s)", self.group_id, exc)
            return "classic"
        except GroupMembershipError as exc:
            raise GroupMembershipError(f"group {self.group_id!r}: {exc}", group=self.group_id,
                                       code=exc.code) from exc
        chosen: Literal["consumer", "classic"] = "consumer" if supported else "classic"
        logger.debug("group %r: %s group protocol (broker at %s)", self.group_id, chosen, self.bootstrap_servers)
        return chosen

    def _config(self, session_timeout_ms: int, heartbeat_interval_ms: int | None, max_poll_interval_ms: int,
                group_instance_id: str | None, client_id: str, remote_assignor: str | None,
                statistics_interval_ms: int) -> dict[str, object]:
        config: dict[str, object] = {"bootstrap.servers": self.bootstrap_servers, "client.id": client_id,
                                     "socket.timeout.ms": min(self.options.request_timeout_ms, 60_000)}
        config.update({k: v for k, v in self.options.client_config.items() if not k.startswith(_FETCH_KEYS)})
        config.update({
            "group.id": self.group_id,
            "group.protocol": self.protocol,
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            # Never used (nothing is fetched); "latest" keeps a fetch that slipped through short.
            "auto.offset.reset": "latest",
            "max.poll.interval.ms": max_poll_interval_ms,
        })
        if self.protocol == "classic":
            config["partition.assignment.strategy"] = "cooperative-sticky"
            config["session.timeout.ms"] = session_timeout_ms
            config["heartbeat.interval.ms"] = heartbeat_interval_ms or min(3_000, max(1, session_timeout_ms // 3))
        elif remote_assignor is not None:
            config["group.remote.assignor"] = remote_assignor
        if group_instance_id is not None:
            config["group.instance.id"] = group_instance_id
        if statistics_interval_ms > 0:
            config["statistics.interval.ms"] = statistics_interval_ms
        return config

    def _check_topics(self) -> None:
        """Refuse topics the cluster does not know: the consumer protocol would just assign nothing."""
        timeout_s = self.options.request_timeout_ms / 1000.0
        for topic in self.topics:
            try:
                metadata = self._consumer.list_topics(topic, timeout=timeout_s)
            except KafkaException as exc:
                raise self._wrap(exc, f"cannot read the metadata of topic {topic!r}") from exc
            found = metadata.topics.get(topic)
            error = found.error if found is not None else None
            if found is None or (error is not None and error.code() in (KafkaError.UNKNOWN_TOPIC_OR_PART,
                                                                        KafkaError._UNKNOWN_TOPIC)):
                raise GroupMembershipError(f"group {self.group_id!r}: topic {topic!r} does not exist on "
                                           f"{self.bootstrap_servers}", group=self.group_id,
                                           code="UNKNOWN_TOPIC_OR_PART")
            if error is not None:
                raise self._wrap(KafkaException(error), f"cannot read the metadata of topic {topic!r}")

    # ------------------------------------------------------------------------------- state

    def assignment(self) -> Partitions:
        """The partitions this member holds now: ``(topic, partition)`` pairs (empty before the first
        assignment and after :meth:`close`). Any thread."""
        return self._assignment

    def session_timeout_ms(self, configured: int) -> int:
        """The group's session timeout, ms: after it without a heartbeat the coordinator expires a
        member and moves its partitions. ``configured`` (``session.timeout.ms``) with the classic
        protocol; a KIP-848 group's ``consumer.session.timeout.ms`` (DescribeConfigs on the GROUP
        resource, KIP-848: the group's own value, else the broker's ``group.consumer.session.timeout.ms``),
        or ``configured`` when the broker does not say (logged)."""
        if self.protocol == "classic":
            return configured
        from confluent_kafka.admin import AdminClient, ConfigResource, ResourceType

        resource = ConfigResource(ResourceType.GROUP, self.group_id)
        try:
            admin = AdminClient(self.options.admin_config(self.bootstrap_servers), logger=_client_logger)
            configs = admin.describe_configs([resource])[resource].result(timeout=self.options.request_timeout_ms / 1000)
            return int(configs["consumer.session.timeout.ms"].value)
        except Exception as exc:  # noqa: BLE001 - a broker without group configs, an ACL: the caller's value
            logger.warning("group %r: cannot read its consumer.session.timeout.ms (%s); taking %d ms", self.group_id,
                           exc, configured)
            return configured

    @property
    def member_id(self) -> str | None:
        """The member id the coordinator gave (classic) or the client chose (KIP-848: a UUID the member
        sends in its first heartbeat); None before joining."""
        return self._member_id

    @property
    def generation(self) -> int | None:
        """The classic group's generation id, or the KIP-848 member epoch, as librdkafka last saw it
        (read from its consumer group metadata after each poll); None before joining or when the
        client does not expose it."""
        return self._generation

    @property
    def error(self) -> GroupMembershipError | None:
        """The last error the client reported for the group (e.g. ``INCONSISTENT_GROUP_PROTOCOL``,
        retried by librdkafka), or the fatal error that ended the membership; None when none came
        since the last assignment."""
        return self._error

    @property
    def running(self) -> bool:
        """True while the membership thread polls (False after :meth:`close` or a fatal error)."""
        return self._thread is not None and self._thread.is_alive()

    @property
    def records_received(self) -> int:
        """Records the client handed to the poll loop: 0 unless a fetch slipped past the pause (each
        is dropped, logged and its partition paused again)."""
        return self._records_received

    @property
    def fetch_requests(self) -> int | None:
        """Fetch requests the client sent, summed over brokers, from the last librdkafka statistics
        (``brokers[*].req.Fetch``); None without ``statistics_interval_ms`` or before the first."""
        return self._fetch_requests

    @property
    def fetched_messages(self) -> int | None:
        """Messages the client received from brokers (librdkafka statistics ``rxmsgs``); None
        without ``statistics_interval_ms`` or before the first statistics."""
        return self._fetched_messages

    def wait_until(self, predicate: Callable[[Partitions], bool], timeout_s: float) -> Partitions:
        """Wait until ``predicate(assignment)`` holds and return that assignment.

        Raises:
            GroupMembershipError: the membership ended with a fatal error, or ``timeout_s`` seconds
                passed (the message names the assignment held and the client's last error).
        """
        deadline = time.monotonic() + timeout_s
        with self._lock:
            while True:
                current = self._assignment
                if predicate(current):
                    return current
                if not self.running and self._error is not None:
                    raise self._error
                left = deadline - time.monotonic()
                if left <= 0:
                    reason = f": {self._error}" if self._error is not None else ""
                    raise GroupMembershipError(
                        f"group {self.group_id!r}: the assignment did not reach the expected state within "
                        f"{timeout_s:g} s (member {self._member_id}, {len(current)} partitions assigned){reason}",
                        group=self.group_id, code=self._error.code if self._error is not None else None)
                self._lock.wait(min(left, 0.5))

    def wait_for_assignment(self, timeout_s: float) -> Partitions:
        """Wait until this member holds at least one partition; see :meth:`wait_until`."""
        return self.wait_until(bool, timeout_s)

    # ------------------------------------------------------------------------------- the thread

    def _run(self) -> None:
        consumer = self._consumer
        try:
            while not self._stop.is_set():
                message = consumer.poll(self._poll_timeout_s)
                if message is not None:
                    self._on_message(message)
                self._refresh_identity()
                if self._error is not None and self._error.fatal:
                    break
        except Exception as exc:  # noqa: BLE001 - a client failure ends the membership with an error
            self._fail(exc, "the group membership failed")
        finally:
            try:
                consumer.close()  # leaves the group; serves the final revocation on this thread
            except Exception as exc:  # noqa: BLE001 - nothing left to do but report it
                logger.warning("group %r: closing the member failed: %s", self.group_id, exc)
            with self._lock:
                self._assignment = frozenset()
                self._lock.notify_all()

    def _on_message(self, message: Any) -> None:
        error = message.error()
        if error is None:
            self._records_received += 1
            if self._records_received == 1:
                logger.error("group %r: the membership received a record of %s-%d although its partitions are "
                             "paused; pausing it again", self.group_id, message.topic(), message.partition())
            with contextlib.suppress(KafkaException, RuntimeError):
                self._consumer.pause([TopicPartition(message.topic(), message.partition())])
            return
        if error.code() == KafkaError._PARTITION_EOF:
            return
        wrapped = self._wrap(KafkaException(error), "the group coordinator refused the member")
        if error.code() == KafkaError._FATAL:
            # librdkafka's client is dead (its fatal() flag is not set on this code): polling it on
            # would keep a member that holds nothing and says it runs.
            wrapped.fatal = True
        self._set_error(wrapped)

    def _refresh_identity(self) -> None:
        with contextlib.suppress(KafkaException, RuntimeError):
            member_id = self._consumer.memberid()
            self._member_id = member_id or None
        with contextlib.suppress(KafkaException, RuntimeError, TypeError, ValueError):
            metadata = self._consumer.consumer_group_metadata()
            if isinstance(metadata, bytes) and metadata.startswith(_GROUP_METADATA_MAGIC):
                start = len(_GROUP_METADATA_MAGIC)
                self._generation = int.from_bytes(metadata[start:start + 4], sys.byteorder, signed=True)

    def _fail(self, exc: BaseException, context: str) -> None:
        """End the membership with a fatal error (the thread leaves the group after this poll)."""
        error = self._wrap(exc, context)
        error.fatal = True
        self._set_error(error)
        self._stop.set()

    def _set_error(self, error: GroupMembershipError) -> None:
        previous = self._error
        if previous is not None and previous.fatal and not error.fatal:
            return  # the error that ended the membership stays the one reported
        if previous is None or previous.code != error.code:
            logger.warning("%s", error)
        with self._lock:
            self._error = error
            self._lock.notify_all()

    def _on_client_error(self, error: KafkaError) -> None:
        """librdkafka's ``error_cb``: client-wide errors (all brokers down, a fatal error)."""
        if error.fatal():
            self._set_error(self._wrap(KafkaException(error), "the group member failed"))
        else:
            logger.debug("group %r: client error %s", self.group_id, error)

    def _on_statistics(self, document: str) -> None:
        try:
            stats = json.loads(document)
            self._fetched_messages = int(stats.get("rxmsgs", 0))
            self._fetch_requests = sum(int(broker.get("req", {}).get("Fetch", 0))
                                       for broker in stats.get("brokers", {}).values())
        except (ValueError, TypeError, AttributeError) as exc:
            logger.debug("group %r: unreadable client statistics: %s", self.group_id, exc)

    # rebalance callbacks: confluent-kafka calls them from poll() (or close()), i.e. on the thread.

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        try:
            consumer.incremental_assign(partitions)
            if partitions:
                consumer.pause(partitions)
        except Exception as exc:  # noqa: BLE001 - an exception must not cross librdkafka's callback
            self._fail(exc, "cannot take the assigned partitions")
            return
        added = _pairs(partitions)
        with self._lock:
            self._assignment = self._assignment | added
            if added:
                self._error = None
            self._lock.notify_all()
        self._refresh_identity()
        if added:
            logger.info("group %r: assigned %s (member %s, generation %s)", self.group_id, _describe(added),
                        self._member_id, self._generation)
            self._call("assign", added)

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self._give_up(consumer, partitions, "revoke")

    def _on_lost(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self._give_up(consumer, partitions, "lost")

    def _give_up(self, consumer: Consumer, partitions: list[TopicPartition], kind: str) -> None:
        removed = _pairs(partitions)
        if removed:
            logger.info("group %r: %s %s (member %s)", self.group_id, "revoked" if kind == "revoke" else "lost",
                        _describe(removed), self._member_id)
            self._call(kind, removed)  # before giving them up (ConsumerRebalanceListener)
        with contextlib.suppress(KafkaException, RuntimeError):  # the client may be closing
            consumer.incremental_unassign(partitions)
        with self._lock:
            self._assignment = self._assignment - removed
            self._lock.notify_all()

    def _call(self, kind: str, partitions: Partitions) -> None:
        callback = self._callbacks[kind]
        if callback is None:
            return
        try:
            callback(partitions)
        except Exception:  # noqa: BLE001 - a caller's bug must not end the membership
            logger.exception("group %r: the on_%s callback raised", self.group_id, kind)

    # ------------------------------------------------------------------------------- errors, close

    def _wrap(self, error: BaseException | KafkaError, context: str) -> GroupMembershipError:
        kafka_error = error.args[0] if isinstance(error, KafkaException) and error.args else error
        if isinstance(kafka_error, KafkaError):
            hint = ""
            if self.group_instance_id is not None and "instance id" in kafka_error.str().lower():
                # UNRELEASED_INSTANCE_ID (KIP-848) / FENCED_INSTANCE_ID (classic), KIP-345
                hint = (f" (static member {self.group_instance_id!r}: a member started again with the same "
                        "--group-instance-id before the group's session timeout expired its previous instance, "
                        "or another process runs with it; start again once the session timeout has passed)")
            return GroupMembershipError(
                f"group {self.group_id!r} on {self.bootstrap_servers}: {context}: {kafka_error.str()} "
                f"[{kafka_error.name()}]{hint}", group=self.group_id, code=kafka_error.name(),
                fatal=kafka_error.fatal())
        return GroupMembershipError(f"group {self.group_id!r} on {self.bootstrap_servers}: {context}: {error}",
                                    group=self.group_id)

    def close(self, timeout_s: float = 30.0) -> None:
        """Leave the group now: stop the thread, which revokes the assignment (``on_revoke``) and
        closes the client (LeaveGroup / a leaving heartbeat). Waits up to ``timeout_s`` seconds for
        the thread. Idempotent; from a callback it only asks the thread to stop."""
        self._stop.set()
        thread = self._thread
        if thread is None or thread is threading.current_thread():
            return
        thread.join(timeout_s)
        if thread.is_alive():
            logger.warning("group %r: the member did not leave within %g s", self.group_id, timeout_s)

    def __enter__(self) -> GroupMembership:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"GroupMembership(group={self.group_id!r}, protocol={self.protocol}, member={self._member_id}, "
                f"generation={self._generation}, partitions={len(self._assignment)})")


def _describe(partitions: Partitions) -> str:
    """``topic-[0, 1, 2]`` per topic, for log lines."""
    by_topic: dict[str, list[int]] = {}
    for topic, partition in partitions:
        by_topic.setdefault(topic, []).append(partition)
    return ", ".join(f"{topic}-{sorted(parts)}" for topic, parts in sorted(by_topic.items()))
