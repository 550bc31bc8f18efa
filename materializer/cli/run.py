"""``materializer run``: consume a topic into a data dir's local log and state store (the Python API's
:meth:`Materializer.run` behind a command), with the cleaner's log file and the run's summary."""

from __future__ import annotations

import contextlib
import logging
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Iterator, get_args

import click
import cloup

from materializer.cli.conventions import CommandError
from materializer.cli.options import client_config, data_dir_option
from materializer.cli.serde_options import format_options, registry_config, registry_options
from materializer.cli.serve_options import bind_query_server, serve_options, start_query_server
from materializer.config import (
    DEFAULT_CLEANER_BACKOFF_MS,
    DEFAULT_COMMIT_INTERVAL_MS,
    DEFAULT_DEDUPE_BUFFER_SIZE_BYTES,
    DEFAULT_GROUP_JOIN_TIMEOUT_MS,
    DEFAULT_GROUP_SESSION_TIMEOUT_MS,
    DEFAULT_METADATA_REFRESH_INTERVAL_MS,
    DEFAULT_RETENTION_CHECK_INTERVAL_MS,
    DEFAULT_REVOKED_RETENTION_MS,
    FetchPath,
    GroupProtocol,
    IsolationLevel,
    MaterializerOptions,
    OnBadRecord,
    OnTopicRecreated,
    Partitioner,
    parse_config_overrides,
)
from materializer.config import DEFAULT_LEASE_INTERVAL_MS

# The materializer (Kafka clients, log engine) loads when the command runs, not for its --help (issue 42).
if TYPE_CHECKING:  # pragma: no cover
    from materializer.materializer import Materializer
    from materializer.stats import MaterializerStats

__all__ = ["CLEANER_LOG_FILE", "run"]

_CLEANER_LOGGER = "materializer.storage.log_cleaner"
CLEANER_LOG_FILE = "log-cleaner.log"
_COMPRESSIONS = ("none", "gzip", "snappy", "lz4", "zstd")


class _SectionedCommand(cloup.Command):
    """``run``'s options in sections (cloup's option groups): the options of no section, the global
    options the conventions add once the command is built (:mod:`materializer.cli.conventions`)
    included, are listed last under "Other options"."""

    def get_ungrouped_options(self, ctx: click.Context) -> list[click.Option]:
        """Every option of no section, ``--help`` last."""
        grouped = {id(option) for group in self.option_groups for option in group.options}
        help_option = self.get_help_option(ctx)
        return [param for param in self.params if isinstance(param, click.Option) and id(param) not in grouped
                and param is not help_option] + ([help_option] if help_option is not None else [])


@click.command("run", cls=_SectionedCommand)
@cloup.option_group(
    "Connection",
    click.option("--bootstrap-servers", required=True, envvar="KAFKA_BOOTSTRAP_SERVERS", show_envvar=True,
                 help="Kafka cluster address, host:port[,host:port]."),
    click.option("--topic", "topics", required=True, multiple=True,
                 help="Kafka topic name; repeat it to materialize several topics in this process (one data dir, "
                      "a store per topic; with --group-id one member for all of them, topics with the same "
                      "partition count co-partitioned)."),
    click.option("--until-caught-up", is_flag=True,
                 help="Exit once every partition reached the high watermark seen at start (else run until Ctrl-C)."),
    click.option("--fetch", type=click.Choice(["replica", "consumer"]), default=None,
                 help="replica: fetch the leaders' record batches verbatim (Kafka Fetch API, kafka-python), so the local "
                      "log holds the broker's bytes, markers and producer state; needs only READ on the topic. "
                      "consumer: records through confluent-kafka, local batches rebuilt (for client settings the "
                      "replica path refuses, or --isolation-level read_uncommitted). [default: replica; consumer "
                      "with --isolation-level read_uncommitted]"),
    click.option("--isolation-level", type=click.Choice(["read_committed", "read_uncommitted"]),
                 default="read_committed", show_default=True,
                 help="What the store sees; the replica path materializes read_committed only."),
    click.option("--timeout", "timeout_s", type=click.FloatRange(min=0.1), default=30.0, show_default=True,
                 help="Seconds to wait for the broker (requests, and while unreachable) before failing; a "
                      "continuous run (no --until-caught-up) keeps retrying with backoff instead, not ready "
                      "meanwhile (at once when no bootstrap server accepts a connection)."),
    click.option("--batch-size", type=click.IntRange(min=1), default=10_000, show_default=True,
                 help="Records fetched per poll (consume num_messages; consumer path)."),
    click.option("--metadata-refresh-interval-ms", type=click.IntRange(min=1),
                 default=DEFAULT_METADATA_REFRESH_INTERVAL_MS, show_default=True,
                 help="How often a continuous run looks for partitions added to the topic, ms (at most 5000; "
                      "with --group-id also at every rebalance)."),
    click.option("-X", "client_items", multiple=True, metavar="KEY=VALUE",
                 help="librdkafka setting for the consumer (e.g. -X security.protocol=SASL_SSL); repeatable; wins "
                      "over --command-config. The replica path translates security.protocol, sasl.*, ssl.* and "
                      "client.id, and reads fetch.max.bytes / max.partition.fetch.bytes."),
    click.option("--command-config", type=click.Path(exists=True, dir_okay=False, path_type=Path),
                 help="Java properties file of client settings (as Kafka's tools take), passed to librdkafka."),
    click.option("--on-topic-recreated", type=click.Choice(["rebuild", "fail"]), default="rebuild", show_default=True,
                 help="The topic was deleted and re-created under the same name (another topic id, KIP-516): rebuild "
                      "(drop the local logs and state store, materialize the new topic; also while running) or fail."),
    click.option("--progress/--no-progress", default=None, help="Progress bar [default: only on a terminal]."),
)
@cloup.option_group(
    "Storage",
    data_dir_option,
    click.option("--compression", type=click.Choice(_COMPRESSIONS),
                 help="Codec of the local batches (consumer path) [default: the topic's compression.type; "
                      "'producer' -> none]."),
    click.option("--max-batch-bytes", type=click.IntRange(min=1), default=1024 * 1024, show_default=True,
                 help="Largest local record batch, bytes (uncompressed estimate)."),
    click.option("--config", "config_items", multiple=True, metavar="KEY=VALUE",
                 help="Topic config override for the local log (Kafka name, e.g. segment.bytes=1048576); repeatable."),
    click.option("--store-memory-mb", type=click.IntRange(min=1), default=None,
                 help="One memory budget, MiB, for the RocksDB memtables and block cache of every topic's state store "
                      "in this process (Kafka Streams' bounded-memory setup: memtables up to half of it, then "
                      "flushed). [default: none; RocksDB sizes each store alone: up to 3 x 64 MiB of memtables per "
                      "store while it is written, a block cache each]"),
    click.option("--retention-check-interval-ms", type=click.IntRange(min=1),
                 default=DEFAULT_RETENTION_CHECK_INTERVAL_MS, show_default=True,
                 help="How often retention.ms/retention.bytes are applied, ms (log.retention.check.interval.ms)."),
    click.option("--lease-interval-ms", type=click.IntRange(min=1), default=DEFAULT_LEASE_INTERVAL_MS, show_default=True,
                 help="How often the store's lease (DIR/topic-lease/<topic>.json) is renewed at most, ms: it tells readers "
                      "how current the store is, and is renewed only while the run is current (get --metadata, export "
                      "and views report the age; --max-staleness-ms bounds it). With --group-id readers refuse the "
                      "member's partitions once it is older than the group's session timeout (the interval is cut to a third of it)."),
)
@cloup.option_group(
    "Cleaner",
    click.option("--cleaner-threads", type=click.IntRange(min=0), default=1, show_default=True,
                 help="Background log cleaner threads on a compacted topic (Kafka log.cleaner.threads); 0 disables."),
    click.option("--cleaner-backoff-ms", type=click.IntRange(min=0), default=DEFAULT_CLEANER_BACKOFF_MS,
                 show_default=True, help="Cleaner sleep when no log needs cleaning, ms (log.cleaner.backoff.ms)."),
    click.option("--dedupe-buffer-size", "dedupe_buffer_size_bytes", type=click.IntRange(min=1),
                 default=DEFAULT_DEDUPE_BUFFER_SIZE_BYTES, show_default=True,
                 help="Offset map memory of all cleaner threads, bytes (log.cleaner.dedupe.buffer.size)."),
)
@cloup.option_group(
    "Group",
    click.option("--group-id", metavar="GROUP", default=None,
                 help="Join this Kafka consumer group and materialize only the partitions its coordinator assigns "
                      "(run one process per member, each with its own --data-dir; they split the topic). Partitions "
                      "assigned elsewhere keep their folders here (see --revoked-retention-ms). Nothing is committed to the "
                      "group; it must differ from --commit-group."),
    click.option("--group-protocol", type=click.Choice(["auto", "consumer", "classic"]), default="auto",
                 show_default=True,
                 help="With --group-id: consumer (KIP-848, Kafka 4.0+), classic (cooperative-sticky), or auto (consumer "
                      "when the broker speaks it)."),
    click.option("--group-session-timeout-ms", type=click.IntRange(min=1), default=DEFAULT_GROUP_SESSION_TIMEOUT_MS,
                 show_default=True,
                 help="With --group-id and the classic protocol: session.timeout.ms, ms (a KIP-848 group's is the "
                      "group config consumer.session.timeout.ms, which the member reads at start). Readers of the "
                      "member's data dir refuse its partitions once its lease is older than the session timeout."),
    click.option("--group-join-timeout-ms", type=click.IntRange(min=0), default=DEFAULT_GROUP_JOIN_TIMEOUT_MS,
                 show_default=True,
                 help="With --group-id: how long the start waits for the first assignment, ms; then it runs with "
                      "what it has (nothing, when the group has more members than partitions)."),
    click.option("--group-instance-id", metavar="ID", default=None,
                 help="With --group-id: group.instance.id (KIP-345 static membership), one per member: a member that "
                      "restarts with the same id within the session timeout gets its partitions back without a "
                      "rebalance (a rolling restart moves nothing; meanwhile nobody fetches them)."),
    click.option("--revoked-retention-ms", type=click.IntRange(min=-1), default=DEFAULT_REVOKED_RETENTION_MS,
                 show_default=True,
                 help="With --group-id: keep the local log and store entries of a partition the group moved to another "
                      "member this long, so that when it comes back only the delta is fetched, ms (Kafka Streams' "
                      "state.cleanup.delay.ms); -1 = until --revoked-retention-bytes, 0 = drop at once."),
    click.option("--revoked-retention-bytes", type=click.IntRange(min=-1), default=-1, show_default=True,
                 help="With --group-id: the most bytes the kept partition folders may hold together; beyond it the "
                      "partitions let go longest ago are dropped first; -1 = no bound."),
    click.option("--partitioner", type=click.Choice(get_args(Partitioner)), default="auto", show_default=True,
                 help="With --group-id: the partitioner the topic's producers use, by which reads route a key to its "
                      "partition. auto: found from the keys each partition holds (murmur2, CRC32 or FNV-1a); until "
                      "they tell, a read the candidates route to another member's partition is refused, never "
                      "answered absent. Or murmur2 (Java, Kafka Streams), consistent_random (librdkafka's and "
                      "confluent-kafka's default), ...: reads route by it, and keys it does not place where they "
                      "are fail the run."),
    click.option("--commit-group", metavar="GROUP", default=None,
                 help="Commit the offsets applied to the state store to this Kafka consumer group (never read back), "
                      "so kafka-consumer-groups --describe and lag exporters show the lag. The group must have no "
                      "members of its own."),
    click.option("--commit-interval-ms", type=click.IntRange(min=1), default=DEFAULT_COMMIT_INTERVAL_MS,
                 show_default=True, help="With --commit-group: commit at most this often, ms."),
)
@cloup.option_group(
    "Formats",
    format_options(with_auto=False, default="bytes"),
    click.option("--on-bad-record", type=click.Choice(["fail", "skip"]), default="fail", show_default=True,
                 help="A key/value that does not decode in --key-format/--value-format: fail (error naming partition "
                      "and offset) or skip (kept in the local log, not materialized, counted)."),
    registry_options,
)
@cloup.option_group(
    "Serving",
    serve_options,
)
@cloup.option_group(
    "Metrics",
    click.option("--metrics-port", type=click.IntRange(min=0, max=65535), default=0, show_default=True,
                 help="Serve http://ADDRESS:PORT/health/live and /health/ready (Kubernetes probes: 200 or 503 with a "
                      "JSON body saying why) and /metrics (Prometheus; needs pip install "
                      "'kafka-materializer[metrics]', else it answers 503); 0 = off."),
    click.option("--metrics-address", default="127.0.0.1", show_default=True,
                 help="Address the metrics and health server listens on (0.0.0.0: every interface)."),
    click.option("--liveness-timeout-ms", type=click.IntRange(min=1), default=None,
                 help="/health/live answers 503 once the run loop made no progress for this long, ms (a wedged "
                      "process; waiting for an absent broker is progress). [default: max(120000, 4 x --timeout)]"),
    click.option("--statistics-interval-ms", type=click.IntRange(min=0), default=5000, show_default=True,
                 help="With --metrics-port and --fetch consumer: librdkafka statistics.interval.ms, whose "
                      "per-partition numbers become materializer_librdkafka_* metrics, ms; 0 = none."),
)
def run(bootstrap_servers: str, topics: tuple[str, ...], data_dir: Path, until_caught_up: bool, fetch: FetchPath | None,
        compression: str | None,
        batch_size: int, max_batch_bytes: int, config_items: tuple[str, ...], isolation_level: IsolationLevel,
        timeout_s: float, progress: bool | None, cleaner_threads: int, cleaner_backoff_ms: int,
        dedupe_buffer_size_bytes: int, retention_check_interval_ms: int, store_memory_mb: int | None,
        client_items: tuple[str, ...],
        command_config: Path | None, metadata_refresh_interval_ms: int, key_format: str, value_format: str,
        on_bad_record: OnBadRecord, on_topic_recreated: OnTopicRecreated, registry_url: str | None, registry_basic_auth: str | None,
        registry_items: tuple[str, ...], metrics_port: int, metrics_address: str,
        liveness_timeout_ms: int | None, commit_group: str | None, commit_interval_ms: int,
        group_id: str | None, group_protocol: GroupProtocol, group_session_timeout_ms: int,
        group_join_timeout_ms: int, group_instance_id: str | None, revoked_retention_ms: int, revoked_retention_bytes: int,
        partitioner: Partitioner, lease_interval_ms: int, statistics_interval_ms: int, serve: str | None,
        serve_token_file: Path | None, serve_cert: Path | None, serve_key: Path | None,
        serve_ca_file: Path | None, serve_advertise: str | None, serve_allowed_hosts: tuple[str, ...]) -> None:
    """Consume TOPIC into DIR's local log and state store (repeat --topic for several topics).

    \b
    Example:
      materializer run --bootstrap-servers localhost:9092 --topic prices --data-dir data --until-caught-up
      materializer get --data-dir data --topic prices product-0001

    By default the leaders' record batches are fetched and appended verbatim (--fetch replica):
    the local .log files equal the broker's, and the store is applied read_committed from them.
    Fetching resumes where the local log ends; Ctrl-C finishes the current batch, stops the
    log cleaner, flushes, prints the summary and exits 130 (SIGTERM, as systemd and Kubernetes
    stop a service: the same, exit 0). On a compacted topic a background log cleaner compacts the
    local log while it runs; its per-round statistics go to DIR/log-cleaner.log, as a broker's
    do. Prints a one-line summary (records, bytes, seconds, cleaning) at the end. With
    --metrics-port, /health/live, /health/ready and Prometheus /metrics are served while it runs
    (from before the store is reconciled with the local log until the summary). With
    --commit-group, the applied offsets are committed to that consumer group for lag tools. With
    --group-id, the process is a member of that consumer group and materializes the partitions
    assigned to it; --until-caught-up then stops once those are caught up.

    Several --topic options materialize every topic into DIR from this one process (a store per
    topic under DIR/state/, one lock, one metrics port, one summary line per topic). With
    --group-id they share one group member: topics with the same partition count are
    co-partitioned (partition p of each on the same member, as Kafka Streams requires for joins),
    the first of them named leading; the group assigns the lead topics' partitions.

    With --key-format/--value-format other than bytes, every record is decoded before it is
    applied (Avro: schemas from --schema-registry-url); the store keeps the exact bytes.
    """
    from materializer.adapters.rocksdb_store import StateStoreOptions, StoreMemory
    from materializer.topic_set import TopicSet

    # bound before the group is joined: the member's client.id carries its URL
    prepared = bind_query_server(serve, serve_token_file, serve_cert, serve_key, serve_ca_file, serve_advertise,
                                 serve_allowed_hosts, grouped=group_id is not None)
    options = MaterializerOptions(
        fetch=fetch, compression=compression, batch_size=batch_size, max_batch_bytes=max_batch_bytes,
        config_overrides=parse_config_overrides(config_items),
        isolation_level=isolation_level,
        request_timeout_ms=int(timeout_s * 1000), broker_timeout_ms=int(timeout_s * 1000), progress=progress,
        cleaner_threads=cleaner_threads, cleaner_backoff_ms=cleaner_backoff_ms,
        dedupe_buffer_size_bytes=dedupe_buffer_size_bytes, retention_check_interval_ms=retention_check_interval_ms,
        metadata_refresh_interval_ms=metadata_refresh_interval_ms,
        client_config=client_config(client_items, command_config), key_format=key_format,
        value_format=value_format,
        on_bad_record=on_bad_record,
        on_topic_recreated=on_topic_recreated,
        schema_registry_url=registry_url,
        schema_registry_config=registry_config(registry_basic_auth, registry_items),
        liveness_timeout_ms=liveness_timeout_ms, commit_group=commit_group, commit_interval_ms=commit_interval_ms,
        group_id=group_id, group_protocol=group_protocol, group_session_timeout_ms=group_session_timeout_ms,
        group_join_timeout_ms=group_join_timeout_ms, group_instance_id=group_instance_id,
        revoked_retention_ms=revoked_retention_ms,
        revoked_retention_bytes=revoked_retention_bytes, partitioner=partitioner, lease_interval_ms=lease_interval_ms,
        serving_url=prepared.advertised_url if prepared is not None and group_id is not None else None,
        store=StateStoreOptions(memory=StoreMemory(store_memory_mb << 20)) if store_memory_mb else StateStoreOptions())
    if len(set(topics)) != len(topics):
        raise click.BadParameter(f"a topic is named more than once: {', '.join(topics)}", param_hint="--topic")
    topic_set = TopicSet(bootstrap_servers, topics, data_dir, options=options)
    materializers = list(topic_set.materializers.values())
    # one topic runs on this thread (its own signal handlers and progress bar); several on one thread each
    runner: Materializer | TopicSet = materializers[0] if len(materializers) == 1 else topic_set
    with contextlib.ExitStack() as stack:
        if metrics_port:
            _serve_endpoints(stack, materializers, metrics_port, metrics_address, statistics_interval_ms)
        stack.enter_context(_cleaner_log_file(data_dir, enabled=cleaner_threads > 0))
        if prepared is not None:
            stack.callback(prepared.server.close)  # the port, also when the run fails before the server starts
        query_server = start_query_server(stack, prepared, materializers)
        try:  # run() starts it: a continuous run waits for a broker that is away at start too
            runner.run(until_caught_up=until_caught_up)
            # in group mode: the assigned partitions' keys (the kept ones of other partitions are not served)
            live_keys = {m.topic: m.view().count() if m.store is not None else 0 for m in materializers}
            assigned = {m.topic: sorted(m.assigned_partitions()) for m in materializers}
        except Exception as exc:
            if runner.stopped_by_signal == signal.SIGINT:
                # Ctrl-C came while a client call that signals cannot cut (librdkafka's metadata
                # request) waited for an unreachable broker: the failure that ended it is the interruption's
                raise KeyboardInterrupt() from exc
            raise
        finally:
            if query_server is not None:
                query_server.close()  # before the stores close: no read of a closed store
            runner.close()
    for materializer in materializers:
        _summarize(materializer.topic, materializer.stats, live_keys[materializer.topic],
                   assigned[materializer.topic], group_id)
    if len(materializers) > 1 and group_id is not None:
        leads = {t: topic_set.lead_of(t) for t in topics}
        followers = [f"{t} follows {lead}" for t, lead in leads.items() if t != lead]
        if followers:
            click.echo(f"co-partitioned in group {group_id!r}: {'; '.join(followers)}")
    died = sum(m.stats.cleaner_threads_died for m in materializers)
    if any(m.stats.cleaner_checkpoints_reset for m in materializers):
        click.echo(f"warning: {sum(m.stats.cleaner_checkpoints_reset for m in materializers)} unreadable "
                   f"cleaner-offset-checkpoint file(s) were reset; see {data_dir / 'log-cleaner.log'}", err=True)
    if died:
        raise CommandError(f"{died} log cleaner thread(s) died; "
                           f"see {data_dir / 'log-cleaner.log'} (the local log was not compacted since)")
    if runner.stopped_by_signal == signal.SIGINT:
        # Ctrl-C: the run stopped cleanly, but the caller (a shell, a script) must see it was interrupted
        click.echo("error: interrupted (SIGINT); the run stopped after its current batch (summary above)", err=True)
        raise SystemExit(128 + signal.SIGINT)


def _summarize(topic: str, stats: MaterializerStats, live_keys: int, assigned: list[int], group_id: str | None) -> None:
    """Print one topic's one-line summary: records, bytes, seconds, cleaning, what changed."""
    rebuilt = " (state store rebuilt from the local log)" if stats.store_rebuilt else ""
    cleaned = (f"; cleaner: {stats.cleaner_rounds} rounds, read {stats.cleaner_bytes_read} bytes, "
               f"wrote {stats.cleaner_bytes_written} bytes" if stats.cleaner_rounds else "")
    retention = (f"; retention deleted {stats.retention_segments_deleted} segments"
                 if stats.retention_segments_deleted else "")
    retention += (f"; skipped {stats.records_skipped} records that did not decode" if stats.records_skipped else "")
    if stats.log_truncations:
        retention += (f"; truncated the local log {stats.log_truncations} time(s) to the leader's "
                      f"({stats.offsets_truncated} offsets)")
    if stats.offset_gaps:
        retention += f"; {sum(stats.offset_gaps.values())} offsets were deleted on the broker before they were fetched"
    if group_id is not None:
        retention += f"; member of group {group_id!r} with partitions {assigned}"
    if stats.topic_recreations:
        retention += f"; the topic was re-created {stats.topic_recreations} time(s) and materialized again"
    click.echo(f"{topic}: fetched {stats.records_fetched} records ({stats.bytes_fetched} bytes) in "
               f"{stats.elapsed_s:.2f} s, appended {stats.batches_appended} batches ({stats.bytes_appended} bytes), "
               f"applied {stats.records_applied} records, replayed {stats.records_replayed} from the local log"
               f"{rebuilt}; {live_keys} live keys{cleaned}{retention}")


def _serve_endpoints(stack: contextlib.ExitStack, materializers: list[Materializer], port: int, address: str,
                     statistics_interval_ms: int) -> None:
    """Serve /health/live, /health/ready and /metrics of every topic on ``address:port`` until
    ``stack`` closes (several topics: one registry, a ``topic`` label each; each probe holds when
    every topic's does). Without prometheus_client the probes are served all the same (Kubernetes
    needs them more than metrics) and /metrics answers 503 naming the install; one warning says so
    at start."""
    from materializer.http_endpoints import EndpointServer
    from materializer.metrics import MaterializerMetrics, MetricsUnavailableError

    metrics = None
    try:
        for materializer in materializers:
            metrics = stack.enter_context(MaterializerMetrics(
                materializer, statistics_interval_ms=statistics_interval_ms,
                registry=None if metrics is None else metrics.registry))
    except MetricsUnavailableError as exc:
        logging.getLogger(__name__).warning("%s; serving only /health/live and /health/ready on port %d", exc, port)
    server = stack.enter_context(EndpointServer(materializers, metrics))
    server.serve(port, addr=address)


@contextlib.contextmanager
def _cleaner_log_file(data_dir: Path, *, enabled: bool) -> Iterator[None]:
    """Append the log cleaner's INFO lines (Kafka's per-round statistics) to ``DIR/log-cleaner.log``,
    in Kafka's log4j layout ``[time] LEVEL message (logger)``, as a broker's ``log-cleaner.log``.

    Warnings still reach stderr; INFO lines reach it only with ``-v``.
    """
    if not enabled:
        yield
        return
    # No mkdir here: the file opens at the first cleaner line, after the Materializer made DIR.
    cleaner_logger = logging.getLogger(_CLEANER_LOGGER)
    previous_level = cleaner_logger.level
    file_handler = _CleanerLogFile(data_dir / CLEANER_LOG_FILE, encoding="utf-8", delay=True)
    file_handler.setLevel(logging.INFO)
    file_handler.setFormatter(logging.Formatter("[%(asctime)s] %(levelname)s %(message)s (%(name)s)"))
    # the root level gates what reaches stderr; the file gets INFO regardless
    stderr_level = logging.getLogger().getEffectiveLevel()
    stderr_filter = _MinLevelFilter(stderr_level)
    root_handlers = list(logging.getLogger().handlers)
    for handler in root_handlers:
        handler.addFilter(stderr_filter)
    cleaner_logger.addHandler(file_handler)
    if cleaner_logger.getEffectiveLevel() > logging.INFO:
        cleaner_logger.setLevel(logging.INFO)
    try:
        yield
    finally:
        cleaner_logger.removeHandler(file_handler)
        cleaner_logger.setLevel(previous_level)
        for handler in root_handlers:
            handler.removeFilter(stderr_filter)
        file_handler.close()


class _CleanerLogFile(logging.FileHandler):
    """``DIR/log-cleaner.log``. A line that cannot be written (a full disk, a read-only file system)
    costs that line, never the run: one warning on stderr names the file (not logging's traceback
    per line), and closing does not raise (the run's own error, which names its file, stays the
    one reported)."""

    _failing = False

    def handleError(self, record: logging.LogRecord) -> None:  # noqa: N802 - logging's name
        """Warn once (naming the file and the error) instead of printing a traceback per line."""
        error = sys.exc_info()[1]
        if not self._failing:
            self._failing = True
            reason = error.strerror if isinstance(error, OSError) and error.strerror else error
            logging.getLogger(__name__).warning("cannot write %s (%s): the log cleaner's lines are not kept there "
                                                "until it can", self.baseFilename, reason)

    def close(self) -> None:
        """Close the file; its unwritten lines are given up (said once, as for a failed line)."""
        try:
            super().close()
        except OSError:
            self.handleError(logging.LogRecord(_CLEANER_LOGGER, logging.INFO, "", 0, "", None, None))


class _MinLevelFilter(logging.Filter):
    """Passes records of the log cleaner only at or above ``level`` (other loggers untouched)."""

    def __init__(self, level: int) -> None:
        super().__init__()
        self.level = level

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= self.level or not record.name.startswith(_CLEANER_LOGGER)
