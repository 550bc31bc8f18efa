"""Fetching a topic's record batches verbatim with the Kafka Fetch API, as a replica copies them.

A follower replica (Kafka ``ReplicaFetcherThread``) and a tiered-storage copy keep the leader's
batches byte for byte: producer id, epoch and base sequence, the transactional and control flags,
ABORT/COMMIT markers, aborted data and batch boundaries. A consumer (librdkafka) hands out
records instead, so a log rebuilt from them loses all of that. :class:`ReplicaFetcher` sends
Fetch requests (``isolation_level=READ_UNCOMMITTED``, ``replica_id=-1``: a consumer's fetch,
which needs only the topic's READ ACL, and reads up to the high watermark, the offsets every
replica already has) and returns each partition's ``records`` field untouched: whole v2 batches,
maybe followed by a partial one that the next fetch returns whole (Kafka ``FetchResponse``).

The protocol layer is kafka-python's (``kafka.protocol``: every Fetch version from 4 to 12, the
``records`` field as plain ``bytes``), and so is the network layer for metadata, API version
negotiation and every SASL (PLAIN, SCRAM, GSSAPI, OAUTHBEARER) or SSL connection. On a PLAINTEXT
listener the Fetch requests themselves go over the fetcher's own sockets (:mod:`.connection`: a
blocking socket per leader read with ``recv_into`` on a receiver thread, 4.4x faster than
kafka-python's receive path). confluent-kafka exposes no raw batches.

Leader discovery and changes: partitions are grouped by their leader from the topic's metadata;
``NOT_LEADER_OR_FOLLOWER``, ``FENCED_LEADER_EPOCH``, ``UNKNOWN_LEADER_EPOCH``,
``LEADER_NOT_AVAILABLE`` and their kind refresh the metadata and retry (the partition's data is
empty in that round). ``OFFSET_OUT_OF_RANGE`` is returned to the caller, who knows where its log
ends (:class:`PartitionData.error`). An unreachable cluster raises
:class:`~materializer.adapters.errors.BrokerUnreachableError` after ``broker_timeout_ms``;
authorization and other non-retriable errors raise :class:`KafkaSourceError`.

The follower's safety checks (``AbstractFetcherThread``; the rules in
``shared/docs/kafka-follower-semantics.md``):

* **Topic identity (KIP-516).** Requests name the topic by its id from Fetch v13 on, so the broker
  answers ``UNKNOWN_TOPIC_ID`` / ``INCONSISTENT_TOPIC_ID`` instead of serving a re-created topic
  under the same name. The id the local copy holds is given with :meth:`ReplicaFetcher.expect_topic_id`;
  before every request the cached metadata is compared with it, and a topic that left the metadata
  or came back with another id raises :class:`~materializer.adapters.errors.TopicIdChangedError`.
  Metadata requests never auto-create the topic (``allow_auto_topic_creation=false``).
* **Leader epochs (KIP-101, KIP-279, KIP-320, KIP-595).** Each partition is fetched with
  ``CurrentLeaderEpoch`` from the metadata and ``LastFetchedEpoch`` = the epoch of the local log's
  last batch (:class:`FetchPosition`); a leader whose log diverged answers with ``DivergingEpoch``
  (:attr:`PartitionData.diverging_epoch`), which the caller truncates to. Against brokers older
  than Fetch v12, :meth:`ReplicaFetcher.offsets_for_leader_epoch` (OffsetsForLeaderEpoch v2+)
  answers the same question.

Client settings are the consumer's (librdkafka names, :class:`KafkaSourceOptions.client_config`)
translated by :func:`replica_client_config`; a security setting that has no kafka-python equal
is refused with its name rather than ignored.

The package, one responsibility per module:

* :mod:`.fetcher`: :class:`ReplicaFetcher`, the fetch in flight, metadata and outage accounting;
* :mod:`.requests`: the Fetch, ListOffsets and OffsetsForLeaderEpoch requests and their versions;
* :mod:`.responses`: their answers parsed (:class:`PartitionData`, :class:`EpochEndOffset`) and
  the error codes after which the leader is looked up again;
* :mod:`.connection`: the direct PLAINTEXT connections and their receiver thread;
* :mod:`.client_config`: the consumer's settings translated for kafka-python.

``tests/unit/adapters/test_kafka_python_contract.py`` names every kafka-python internal the
package uses.
"""

from __future__ import annotations

from .client_config import DEFAULT_FETCH_MAX_BYTES, DEFAULT_PARTITION_FETCH_MAX_BYTES, replica_client_config
from .fetcher import ReplicaFetcher
from .responses import OFFSET_OUT_OF_RANGE, EpochEndOffset, FetchPosition, PartitionData

__all__ = ["DEFAULT_FETCH_MAX_BYTES", "DEFAULT_PARTITION_FETCH_MAX_BYTES", "EpochEndOffset", "FetchPosition",
           "OFFSET_OUT_OF_RANGE", "PartitionData", "ReplicaFetcher", "replica_client_config"]
