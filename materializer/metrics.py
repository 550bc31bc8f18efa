"""Prometheus metrics of a running :class:`~materializer.materializer.Materializer`.

``pip install 'kafka-materializer[metrics]'`` adds `prometheus_client
<https://prometheus.github.io/client_python/>`_; ``materializer run --metrics-port PORT`` then
serves ``http://ADDR:PORT/metrics`` beside the health probes ``/health/live`` and ``/health/ready``
(:mod:`materializer.http_endpoints`). In Python, ``EndpointServer(materializer,
MaterializerMetrics(materializer)).serve(port)`` serves all three; :meth:`MaterializerMetrics.serve`
only ``/metrics``.

Nothing is counted twice and nothing costs the ingest loop a lock: the metrics are read at
scrape time from what the Materializer keeps anyway (:class:`MaterializerStats`,
:attr:`Materializer.health`), on a registry of their own (never prometheus_client's global
``REGISTRY``, so two materializers in one process do not collide). The only extra work while
ingesting is librdkafka's statistics document (``statistics.interval.ms``, every 5 s by default),
of which a few per-partition numbers are kept (:meth:`MaterializerMetrics.observe_client_statistics`).

Every metric carries a ``topic`` label; per-partition ones a ``partition`` label too. The list,
with units, is :data:`METRICS` (and the "Prometheus metrics" table of docs/operations.md).
"""

from __future__ import annotations

import json
import logging
import threading
import weakref
from typing import TYPE_CHECKING, Any, Iterator, Mapping

if TYPE_CHECKING:
    from materializer.materializer import Materializer

__all__ = ["INSTALL_HINT", "METRICS", "MaterializerMetrics", "MetricsUnavailableError", "require_prometheus_client"]

logger = logging.getLogger(__name__)

#: What to install when prometheus_client is missing.
INSTALL_HINT = "pip install 'kafka-materializer[metrics]'"

#: name -> (type, labels besides ``topic``, help text with the unit). The exposition adds
#: nothing to these names (counters already end in ``_total``).
METRICS: dict[str, tuple[str, tuple[str, ...], str]] = {
    # ingest
    "materializer_fetched_records_total": ("counter", (), "Records received from the broker (records)."),
    "materializer_fetched_bytes_total": ("counter", (), "Key, value and header bytes received from the broker (bytes)."),
    "materializer_fetches_total": ("counter", (), "Fetch calls made by the run loop, empty ones included (calls)."),
    "materializer_fetch_seconds_total": (
        "counter", (), "Time spent fetching from the client, waiting for records included (seconds)."),
    "materializer_appended_batches_total": ("counter", (), "Record batches appended to the local logs (batches)."),
    "materializer_appended_bytes_total": ("counter", (), "Bytes of the record batches appended to the local logs (bytes)."),
    "materializer_append_seconds_total": (
        "counter", (), "Time spent building and appending local record batches, compression included (seconds)."),
    "materializer_fsync_seconds_total": ("counter", (), "Time spent flushing (fsync) the local logs (seconds)."),
    "materializer_applied_records_total": (
        "counter", (), "Fetched records applied to the state store, puts and deletes (records)."),
    "materializer_applied_bytes_total": (
        "counter", (), "Key and value bytes of the fetched records applied to the state store (bytes)."),
    "materializer_apply_seconds_total": ("counter", (), "Time spent writing fetched records to the state store (seconds)."),
    "materializer_null_key_records_total": (
        "counter", (), "Fetched records with a null key, kept in the log but not materialized (records)."),
    # partitions
    "materializer_partition_next_offset": (
        "gauge", ("partition",), "Next offset to fetch: the local log end offset, past trailing transaction markers "
                                 "once the client reported the partition's end (consumer path); the last stable "
                                 "offset applied to the store (replica path) (offset)."),
    "materializer_partition_high_watermark": (
        "gauge", ("partition",), "Highest high watermark known: read on start, then from fetch responses (offset)."),
    "materializer_partition_lag": (
        "gauge", ("partition",), "High watermark minus next offset: offsets not fetched yet (offsets)."),
    # replay / rebuild of the store from the local log on start
    "materializer_replayed_records_total": (
        "counter", (), "Records applied to the state store from the local logs on start (records)."),
    "materializer_replay_target_offsets": (
        "gauge", (), "Offsets the replay or rebuild of the state store from the local logs has to read (offsets)."),
    "materializer_replay_done_offsets": ("gauge", (), "Offsets of that replay or rebuild read so far (offsets)."),
    "materializer_store_rebuilt": ("gauge", (), "1 when the state store was rebuilt from the local logs on start (0/1)."),
    "materializer_store_memory_used_bytes": (
        "gauge", (), "With a state store memory budget (--store-memory-mb): what its block cache holds now, the "
                     "memtables charged to it included; one budget for every topic of the process, so each topic's sample is the same value: do not sum them (bytes)."),
    "materializer_store_memtable_bytes": (
        "gauge", (), "With a state store memory budget: what the memtables of the stores sharing it take now; the same value for each topic sharing it (bytes)."),
    # health
    "materializer_running": ("gauge", (), "1 while the ingest loop runs (0/1)."),
    "materializer_caught_up": (
        "gauge", (), "1 once every partition reached the high watermark seen at start, while the broker answers "
                     "and the topic exists (0/1)."),
    "materializer_failed": ("gauge", (), "1 when an error stopped ingest; serve nothing then (0/1)."),
    "materializer_broker_reachable": ("gauge", (), "1 while the Kafka cluster answers the run's requests (0/1)."),
    "materializer_live": (
        "gauge", (), "1 while the run loop makes progress (the /health/live probe; broker reachability does not "
                     "count) (0/1)."),
    "materializer_ready": (
        "gauge", (), "1 while the store serves a complete state (the /health/ready probe: running, caught up) (0/1)."),
    "materializer_run_loop_idle_seconds": (
        "gauge", (), "Time since the run loop last made progress (an iteration, a start attempt, a replay step) "
                     "(seconds)."),
    # consumer group commits (--commit-group)
    "materializer_group_commits_total": (
        "counter", (), "Offset commits of the applied offsets the consumer group coordinator accepted (requests)."),
    "materializer_group_commit_failures_total": (
        "counter", (), "Offset commits of the applied offsets to the consumer group that failed (requests)."),
    "materializer_group_committed_offset": (
        "gauge", ("partition",), "Applied offset last committed to the consumer group (offset)."),
    # consumer group membership (--group-id)
    "materializer_group_assigned_partitions": (
        "gauge", (), "Partitions materialized: with --group-id those the consumer group assigned this member (each "
                     "served once caught up), else every open partition (partitions)."),
    "materializer_group_rebalances_total": (
        "counter", (), "Assignment changes of the consumer group (--group-id) the run loop applied (rebalances)."),
    "materializer_group_kept_partitions_dropped_total": (
        "counter", (), "Partitions moved to other members whose kept local log and store entries were dropped "
                       "(--revoked-retention-ms / --revoked-retention-bytes) (partitions)."),
    "materializer_group_misrouted_partitions": (
        "gauge", (), "With --group-id: partitions held whose sampled keys the partitioner reads route by "
                     "(--partitioner, or the detected one) places in another partition under the current partition "
                     "count (written before the count grew, or by another partitioner), so reads of those keys look "
                     "in another partition (partitions)."),
    "materializer_group_partitioner_candidates": (
        "gauge", (), "With --group-id: hash families (murmur2, CRC32, FNV-1a) reads route keys by: 1 when "
                     "--partitioner is set or the sampled keys tell it; more while they cannot tell (a read they "
                     "route to different partitions looks in each and is refused when one is another member's); 0 "
                     "when no known partitioner places every sampled key (families)."),
    "materializer_group_generation": (
        "gauge", (), "With --group-id: the classic group's generation id or the KIP-848 member epoch, once known "
                     "(generation)."),
    # the leader's truth (issue 21): cuts, re-creations, deleted offsets
    "materializer_log_truncations_total": (
        "counter", (), "Cuts of a local log back to what the leader holds (a diverging epoch, a leader that lost "
                       "data, a fetch path switch), each with its store partition rewound (cuts)."),
    "materializer_truncated_offsets_total": ("counter", (), "Offsets those cuts removed (offsets)."),
    "materializer_store_rewinds_total": (
        "counter", (), "Store partitions rebuilt from a cut log (partitions)."),
    "materializer_topic_recreations_total": (
        "counter", (), "Times the topic was found re-created (another topic id) and materialized again (times)."),
    "materializer_offsets_deleted_before_fetch_total": (
        "counter", (), "Offsets the broker deleted (retention, DeleteRecords) before they were fetched (offsets)."),
    "materializer_store_entries_expired_total": (
        "counter", (), "Store entries dropped because their record fell below the log start offset (entries)."),
    # cleaner and retention
    "materializer_cleaner_rounds_total": ("counter", (), "Cleaning rounds the background log cleaner completed (rounds)."),
    "materializer_cleaner_read_bytes_total": ("counter", (), "Bytes the cleaner's recopy passes read (bytes)."),
    "materializer_cleaner_written_bytes_total": ("counter", (), "Bytes the cleaner's recopy passes wrote (bytes)."),
    "materializer_cleaner_read_records_total": ("counter", (), "Records the cleaner's recopy passes read (records)."),
    "materializer_cleaner_written_records_total": ("counter", (), "Records the cleaner's recopy passes wrote (records)."),
    "materializer_cleaner_max_dirty_ratio": (
        "gauge", (), "Cleanable ratio of the dirtiest log when the cleaner last chose one (ratio, 0..1)."),
    "materializer_retention_checks_total": ("counter", (), "Retention checks made by the run loop (checks)."),
    "materializer_retention_deleted_segments_total": (
        "counter", (), "Segments the run loop's retention checks deleted (segments)."),
    # librdkafka statistics (statistics.interval.ms)
    "materializer_librdkafka_statistics_total": (
        "counter", (), "librdkafka statistics documents received (documents)."),
    "materializer_librdkafka_consumer_lag": (
        "gauge", ("partition",), "librdkafka's consumer_lag: high watermark (or last stable offset) minus the "
                                 "consumer's position, as of the last statistics document (offsets)."),
    "materializer_librdkafka_rx_messages_total": (
        "counter", ("partition",), "librdkafka's rxmsgs: messages the client fetched for the partition (messages)."),
    "materializer_librdkafka_rx_bytes_total": (
        "counter", ("partition",), "librdkafka's rxbytes: message bytes the client fetched for the partition (bytes)."),
    "materializer_librdkafka_fetch_state": (
        "gauge", ("partition", "state"), "librdkafka's fetch_state of the partition: 1 for the current state (0/1)."),
}


class MetricsUnavailableError(RuntimeError):
    """prometheus_client is not installed (the ``metrics`` extra); the message says how to install it."""


def require_prometheus_client():
    """Import and return the ``prometheus_client`` module.

    Raises:
        MetricsUnavailableError: it is not installed; the message names ``pip install
            'kafka-materializer[metrics]'``.
    """
    try:
        import prometheus_client
        import prometheus_client.core  # noqa: F401 - the metric families live there
    except ImportError as exc:
        raise MetricsUnavailableError(
            f"Prometheus metrics need the prometheus_client package, which is not installed: {INSTALL_HINT}") from exc
    return prometheus_client


class MaterializerMetrics:
    """Prometheus metrics (:data:`METRICS`) of one Materializer, on a registry of their own.

    Args:
        materializer: the Materializer to observe. Create the metrics before it starts (before
            ``with materializer:`` / :meth:`Materializer.start`) to get librdkafka's statistics
            and to see a store rebuild's progress; the other metrics work at any time.
        statistics_interval_ms: librdkafka ``statistics.interval.ms``, ms (5,000); 0 asks for
            no statistics (the ``materializer_librdkafka_*`` metrics then stay absent). A
            ``statistics.interval.ms`` in the client config (``-X``) wins.
        registry: the ``prometheus_client.CollectorRegistry`` to register on; default: a new one
            (never the global ``REGISTRY``). The metrics of several materializers (one per topic)
            may share one registry: each metric is then one family with a sample per topic.

    Values are read when scraped; reading is thread-safe and never blocks ingest.

    Raises:
        MetricsUnavailableError: prometheus_client is not installed.
        RuntimeError: ``statistics_interval_ms`` > 0 and the Materializer already started.
        ValueError: ``registry`` already holds the metrics of a materializer of the same topic.
    """

    def __init__(self, materializer: "Materializer", *, statistics_interval_ms: int = 5_000,
                 registry: Any | None = None) -> None:
        prometheus_client = require_prometheus_client()
        self.materializer = materializer
        self.registry = registry if registry is not None else prometheus_client.CollectorRegistry()
        collector = _Collector.of(self.registry)
        if any(m.materializer.topic == materializer.topic for m in collector.observed):
            raise ValueError(f"the metrics of topic {materializer.topic!r} are already on this registry")
        self._lock = threading.Lock()
        self._statistics_documents = 0
        self._client_partitions: dict[int, dict[str, Any]] = {}
        self._server = None
        self._server_thread: threading.Thread | None = None
        if statistics_interval_ms:
            materializer.on_client_statistics(self.observe_client_statistics, statistics_interval_ms)
        collector.observed.append(self)

    # -- librdkafka statistics ---------------------------------------------------------------

    def observe_client_statistics(self, stats_json: str) -> None:
        """Keep ``consumer_lag``, ``rxmsgs``, ``rxbytes`` and ``fetch_state`` of each partition of
        the topic from one librdkafka statistics document (the ``topics.<topic>.partitions.<p>``
        section; librdkafka's internal partition -1 is left out).

        Raises:
            ValueError: ``stats_json`` is not JSON (the Materializer logs and ignores it).
        """
        document = json.loads(stats_json)
        topic = (document.get("topics") or {}).get(self.materializer.topic) or {}
        partitions: dict[int, dict[str, Any]] = {}
        for key, section in (topic.get("partitions") or {}).items():
            try:
                partition = int(section.get("partition", key))
            except (TypeError, ValueError):
                continue
            if partition < 0:
                continue
            partitions[partition] = {name: section.get(name)
                                     for name in ("consumer_lag", "rxmsgs", "rxbytes", "fetch_state")}
        with self._lock:
            self._statistics_documents += 1
            self._client_partitions.update(partitions)

    # -- exposition --------------------------------------------------------------------------

    def serve(self, port: int, addr: str = "127.0.0.1") -> int:
        """Serve ``/metrics`` over HTTP on ``addr:port`` from a daemon thread
        (``prometheus_client.start_http_server``); ``port`` 0 picks a free port. For the health
        probes on the same port use :class:`~materializer.http_endpoints.EndpointServer` instead.

        Returns:
            the port listened on.

        Raises:
            OSError: the address cannot be bound (port in use, no permission).
            RuntimeError: already serving.
        """
        if self._server is not None:
            raise RuntimeError(f"metrics of {self.materializer.topic} are already served")
        prometheus_client = require_prometheus_client()
        try:
            server, thread = prometheus_client.start_http_server(port, addr=addr, registry=self.registry)
        except OSError as exc:
            raise OSError(exc.errno, f"cannot serve metrics on {addr}:{port}: {exc.strerror or exc}") from exc
        self._server, self._server_thread = server, thread
        logger.info("serving Prometheus metrics of %s on http://%s:%d/metrics", self.materializer.topic, addr,
                    server.server_port)
        return server.server_port

    def render(self) -> bytes:
        """The metrics in Prometheus' text exposition format (what ``/metrics`` returns)."""
        return require_prometheus_client().generate_latest(self.registry)

    def close(self) -> None:
        """Stop serving (if :meth:`serve` was called) and release the port. Idempotent."""
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()
        thread, self._server_thread = self._server_thread, None
        if thread is not None:
            thread.join(timeout=5)

    def __enter__(self) -> "MaterializerMetrics":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- what the collector reads ------------------------------------------------------------

    def _samples(self) -> dict[str, list[tuple[tuple[str, ...], float]]]:
        """name -> [(label values besides topic, value)] of every metric, read now."""
        m = self.materializer
        s = m.stats
        health = m.health
        next_offsets = dict(s.next_offsets)
        highs = dict(s.latest_high_watermarks)
        lag = s.lag()

        def one(value: float) -> list[tuple[tuple[str, ...], float]]:
            return [((), float(value))]

        def per_partition(values: Mapping[int, float]) -> list[tuple[tuple[str, ...], float]]:
            return [((str(p),), float(v)) for p, v in sorted(values.items())]

        memory = m.options.store.memory
        samples = {
            "materializer_fetched_records_total": one(s.records_fetched),
            "materializer_fetched_bytes_total": one(s.bytes_fetched),
            "materializer_fetches_total": one(s.fetches),
            "materializer_fetch_seconds_total": one(s.fetch_s),
            "materializer_appended_batches_total": one(s.batches_appended),
            "materializer_appended_bytes_total": one(s.bytes_appended),
            "materializer_append_seconds_total": one(s.append_s),
            "materializer_fsync_seconds_total": one(s.fsync_s),
            "materializer_applied_records_total": one(s.records_applied),
            "materializer_applied_bytes_total": one(s.bytes_applied),
            "materializer_apply_seconds_total": one(s.apply_s),
            "materializer_null_key_records_total": one(s.null_key_records),
            "materializer_partition_next_offset": per_partition(next_offsets),
            "materializer_partition_high_watermark": per_partition(highs),
            "materializer_partition_lag": per_partition(lag),
            "materializer_replayed_records_total": one(s.records_replayed),
            "materializer_replay_target_offsets": one(s.replay_target_offsets),
            "materializer_replay_done_offsets": one(s.replay_done_offsets),
            "materializer_store_rebuilt": one(s.store_rebuilt),
            "materializer_store_memory_used_bytes": [] if memory is None else one(memory.used_bytes),
            "materializer_store_memtable_bytes": [] if memory is None else one(memory.memtable_bytes),
            "materializer_running": one(health.running),
            "materializer_caught_up": one(health.caught_up),
            "materializer_failed": one(health.failed is not None),
            "materializer_broker_reachable": one(health.broker_reachable),
            "materializer_live": one(health.live),
            "materializer_ready": one(health.ready),
            "materializer_run_loop_idle_seconds": one(health.loop_idle_s),
            "materializer_group_commits_total": one(s.group_commits),
            "materializer_group_commit_failures_total": one(s.group_commit_failures),
            "materializer_group_committed_offset": per_partition(dict(s.group_committed_offsets)),
            "materializer_group_assigned_partitions": one(len(m.assigned_partitions())),
            "materializer_group_rebalances_total": one(s.group_rebalances),
            "materializer_group_kept_partitions_dropped_total": one(s.group_kept_partitions_dropped),
            "materializer_group_misrouted_partitions": one(len(s.group_misrouted_partitions)),
            "materializer_group_partitioner_candidates": ([] if m.options.group_id is None
                                                          else one(s.group_partitioner_candidates)),
            "materializer_group_generation": [] if health.generation is None else one(health.generation),
            "materializer_log_truncations_total": one(s.log_truncations),
            "materializer_truncated_offsets_total": one(s.offsets_truncated),
            "materializer_store_rewinds_total": one(s.store_rewinds),
            "materializer_topic_recreations_total": one(s.topic_recreations),
            "materializer_offsets_deleted_before_fetch_total": one(sum(dict(s.offset_gaps).values())),
            "materializer_store_entries_expired_total": one(s.store_entries_expired),
            "materializer_cleaner_rounds_total": one(s.cleaner_rounds),
            "materializer_cleaner_read_bytes_total": one(s.cleaner_bytes_read),
            "materializer_cleaner_written_bytes_total": one(s.cleaner_bytes_written),
            "materializer_cleaner_read_records_total": one(s.cleaner_records_read),
            "materializer_cleaner_written_records_total": one(s.cleaner_records_written),
            "materializer_cleaner_max_dirty_ratio": one(s.cleaner_max_dirty_ratio),
            "materializer_retention_checks_total": one(s.retention_checks),
            "materializer_retention_deleted_segments_total": one(s.retention_segments_deleted),
        }
        with self._lock:
            documents = self._statistics_documents
            client = {p: dict(v) for p, v in self._client_partitions.items()}
        if documents:
            samples["materializer_librdkafka_statistics_total"] = one(documents)
            samples["materializer_librdkafka_consumer_lag"] = [
                ((str(p),), float(v["consumer_lag"])) for p, v in sorted(client.items())
                if isinstance(v.get("consumer_lag"), (int, float)) and v["consumer_lag"] >= 0]
            for name, field in (("materializer_librdkafka_rx_messages_total", "rxmsgs"),
                                ("materializer_librdkafka_rx_bytes_total", "rxbytes")):
                samples[name] = [((str(p),), float(v[field])) for p, v in sorted(client.items())
                                 if isinstance(v.get(field), (int, float))]
            samples["materializer_librdkafka_fetch_state"] = [
                ((str(p), str(v["fetch_state"])), 1.0) for p, v in sorted(client.items()) if v.get("fetch_state")]
        return samples


class _Collector:
    """prometheus_client custom collector: builds the metric families of :data:`METRICS` at scrape
    time, one family per name with the samples of every materializer observed on its registry
    (several topics of one process: one ``topic`` label value each)."""

    def __init__(self) -> None:
        self.observed: list[MaterializerMetrics] = []

    @classmethod
    def of(cls, registry: Any) -> "_Collector":
        """The registry's collector of ours, registered on it by the first call."""
        collector = _COLLECTORS.get(registry)
        if collector is None:
            collector = _COLLECTORS[registry] = cls()
            registry.register(collector)
        return collector

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        samples = [(metrics.materializer.topic, metrics._samples()) for metrics in list(self.observed)]
        for name, (kind, labels, documentation) in METRICS.items():
            if not any(name in values for _, values in samples):
                continue
            family_type = CounterMetricFamily if kind == "counter" else GaugeMetricFamily
            family = family_type(name, documentation, labels=("topic", *labels))
            for topic, values in samples:
                for label_values, value in values.get(name, ()):
                    family.add_metric((topic, *label_values), value)
            yield family


#: registry -> our collector on it: prometheus_client refuses a second collector of the same names
_COLLECTORS: "weakref.WeakKeyDictionary[Any, _Collector]" = weakref.WeakKeyDictionary()
