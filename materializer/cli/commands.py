"""The ``materializer`` command line (console script; a thin layer over the Python API).

Commands::

    materializer run --bootstrap-servers HOST:PORT --topic TOPIC --data-dir DIR [--until-caught-up]
    materializer export --data-dir DIR --topic TOPIC          JSON Lines, one object per live key
    materializer get --data-dir DIR --topic TOPIC KEY         the value; exit 1 when absent
        (run/get/export: --key-format/--value-format bytes|str|json|avro, --schema-registry-url URL)
    materializer demo [--data-dir DIR]                        end-to-end sample on a local broker
    materializer broker start|stop|status                     a local Apache Kafka broker
    materializer registry start|stop|status                   a local Schema Registry (Apicurio)
    materializer dump-log PATH                                Kafka DumpLogSegments-style dump
    materializer restore ... / compact ...                    offline restore; Kafka LogCleaner compaction

Exit status: 0 success; 1 ``get`` found no such key; 2 usage error or failure (a refusal included:
a data dir another process writes, an incomplete topic); 130 Ctrl-C (SIGINT); 143 SIGTERM in
``restore``/``compact``/``spark compact`` (:mod:`materializer.interrupts`). Failures from storage and
adapters, refusals and interruptions are printed as ONE line on stderr (``--debug`` shows the
traceback).
"""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import os
import signal
import sys
from pathlib import Path
from typing import Iterator, Mapping

import click

from materializer.adapters.errors import AdapterError
from materializer.adapters.rocksdb_store import StateStore, latest_across_partitions
from materializer.adapters.rocksdb_store import StoredValue
from materializer.adapters.serdes import (
    DISPLAY_FORMATS,
    KEY_ENCODINGS,
    Serde,
    decode_for_display,
    make_serde,
    parse_key,
    text_or_base64,
    to_json_compatible,
)
from materializer.cli.broker import broker
from materializer.offline.compact import compact
from materializer.config import (
    DEFAULT_CLEANER_BACKOFF_MS,
    DEFAULT_DEDUPE_BUFFER_SIZE_BYTES,
    DEFAULT_METADATA_REFRESH_INTERVAL_MS,
    DEFAULT_RETENTION_CHECK_INTERVAL_MS,
    MaterializerOptions,
    parse_config_overrides,
    state_dir,
)
from materializer.data_dir import open_when_complete
from materializer.offline.dump_log import dump_log
from materializer.interrupts import exit_status
from materializer.log_format import LOG_FORMATS, formatter_for
from materializer.materializer import Materializer
from materializer.cli.registry import registry
from materializer.metrics import MetricsUnavailableError, require_prometheus_client
from materializer.progress import progress_bar, show_progress
from materializer.offline.restore import restore
from materializer.cli.serde_options import format_options, registry_client, registry_config, registry_options
from materializer.spark.jobs import spark
from materializer.storage.errors import StorageError

__all__ = ["main", "EXIT_ABSENT", "EXIT_FAILURE"]

EXIT_ABSENT = 1
EXIT_FAILURE = 2
_EXPECTED_ERRORS = (AdapterError, StorageError, ValueError, OSError, MetricsUnavailableError)
_CLEANER_LOGGER = "materializer.storage.log_cleaner"
CLEANER_LOG_FILE = "log-cleaner.log"
_COMPRESSIONS = ("none", "gzip", "snappy", "lz4", "zstd")


class _Group(click.Group):
    """Turns expected failures into one ``error: ...`` line on stderr and exit status 2, and Ctrl-C /
    SIGTERM into one line and 130 / 143 (instead of click's ``Aborted!`` and 1)."""

    def make_context(self, info_name, args, parent=None, **extra):
        try:
            return super().make_context(info_name, args, parent=parent, **extra)
        except KeyboardInterrupt as exc:  # while the command line is parsed, before invoke
            status = exit_status(exc)
            click.echo(f"error: interrupted ({signal.Signals(status - 128).name})", err=True)
            raise click.exceptions.Exit(status) from exc

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except BrokenPipeError:  # `materializer export | head`: the reader left; not an error
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            ctx.exit(0)
        except _EXPECTED_ERRORS as exc:
            if ctx.obj and ctx.obj.get("debug"):
                raise
            message = " ".join(str(exc).split()) or type(exc).__name__
            click.echo(f"error: {message}", err=True)
            ctx.exit(EXIT_FAILURE)
        except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM in a command that writes (materializer.interrupts)
            if ctx.obj and ctx.obj.get("debug"):
                raise
            status = exit_status(exc)
            notes = " ".join(" ".join(note.split()) for note in getattr(exc, "__notes__", ()))
            click.echo(f"error: interrupted ({signal.Signals(status - 128).name}){'; ' + notes if notes else ''}",
                       err=True)
            ctx.exit(status)


def _configure_logging(verbose: bool, debug: bool, log_format: str = "text") -> None:
    """Log to stderr at WARNING (INFO with ``verbose``, DEBUG with ``debug``), each line in
    ``log_format`` (:mod:`materializer.log_format`: ``text`` with an ISO 8601 UTC timestamp, or
    ``json``, one object per line). Like :func:`logging.basicConfig`, leaves a root logger that
    already has handlers as it is.

    Raises:
        ValueError: an unknown ``log_format``.
    """
    level = logging.DEBUG if debug else logging.INFO if verbose else logging.WARNING
    handler = logging.StreamHandler(sys.stderr)
    formatter = formatter_for(log_format)
    # Text lines stay one line each unless --debug; JSON keeps the traceback in its exc_info field.
    handler.setFormatter(_WithoutTraceback(formatter) if log_format == "text" and not debug else formatter)
    handler.addFilter(_ClientLogDedup())
    logging.basicConfig(level=level, handlers=[handler])
    if not debug:
        # The client libraries report every failed connection attempt, every metadata refresh that
        # misses a topic (librdkafka; kafka-python for the replica path): what they say reaches the
        # user once, in the materializer's own warnings (the broker is away / back, the topic is
        # gone) and errors. --debug shows them, repeated lines folded.
        for name in ("materializer.adapters.kafka_source.librdkafka", "materializer.cli.demo.librdkafka", "kafka"):
            logging.getLogger(name).setLevel(logging.CRITICAL)


class _ClientLogDedup(logging.Filter):
    """Pass a client library's log line (kafka-python's ``kafka.*``, librdkafka's) at most once per
    ``window_s`` seconds per logger and text: a broker that is away for minutes gives a few lines,
    not thousands. The materializer's own lines always pass."""

    _CLIENT_LOGGERS = ("kafka.", "kafka", "materializer.adapters.kafka_source.librdkafka",
                       "materializer.cli.demo.librdkafka")

    def __init__(self, window_s: float = 60.0) -> None:
        super().__init__()
        self.window_s = window_s
        self._last: dict[tuple[str, str], float] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        if not record.name.startswith(self._CLIENT_LOGGERS):
            return True
        key = (record.name, record.getMessage())
        now = record.created
        last = self._last.get(key)
        if last is not None and now - last < self.window_s:
            return False
        if len(self._last) > 10_000:  # bounded: texts carry addresses and offsets
            self._last.clear()
        self._last[key] = now
        return True


@click.group(cls=_Group, context_settings={"auto_envvar_prefix": "MATERIALIZER"})
@click.version_option(package_name="kafka-materializer", prog_name="materializer")
@click.option("--debug", is_flag=True, help="Show tracebacks and debug logs (including librdkafka's).")
@click.option("-v", "--verbose", is_flag=True, help="Log progress at INFO level on stderr.")
@click.option("--log-format", type=click.Choice(LOG_FORMATS), default="text", show_default=True,
              envvar="MATERIALIZER_LOG_FORMAT", show_envvar=True,
              help="Log lines on stderr: text (ISO 8601 UTC timestamp first) or json (one object per line: "
                   "ts, level, logger, message, exc_info).")
@click.pass_context
def main(ctx: click.Context, debug: bool, verbose: bool, log_format: str) -> None:
    """Mirror Kafka topics into a local Kafka-format log and materialize key -> latest value in RocksDB.

    Every option can also come from an environment variable MATERIALIZER_<COMMAND>_<OPTION>
    (e.g. MATERIALIZER_RUN_DATA_DIR, MATERIALIZER_RUN_CLEANER_THREADS); --bootstrap-servers also
    reads KAFKA_BOOTSTRAP_SERVERS.
    """
    ctx.ensure_object(dict)
    ctx.obj["debug"] = debug
    _configure_logging(verbose, debug, log_format)


_data_dir_option = click.option(
    "--data-dir", required=True, type=click.Path(file_okay=False, path_type=Path),
    help="Data directory: <topic>-<partition>/ log folders, state/<topic>/ RocksDB, checkpoints.")
_topic_option = click.option("--topic", required=True, help="Kafka topic name.")


@main.command()
@click.option("--bootstrap-servers", required=True, envvar="KAFKA_BOOTSTRAP_SERVERS", show_envvar=True,
              help="Kafka cluster address, host:port[,host:port].")
@_topic_option
@_data_dir_option
@click.option("--until-caught-up", is_flag=True,
              help="Exit once every partition reached the high watermark seen at start (else run until Ctrl-C).")
@click.option("--fetch", type=click.Choice(["replica", "consumer"]), default=None,
              help="replica: fetch the leaders' record batches verbatim (Kafka Fetch API, kafka-python), so the local "
                   "log holds the broker's bytes, markers and producer state; needs only READ on the topic. "
                   "consumer: records through confluent-kafka, local batches rebuilt (for client settings the "
                   "replica path refuses, or --isolation-level read_uncommitted). [default: replica; consumer "
                   "with --isolation-level read_uncommitted]")
@click.option("--compression", type=click.Choice(_COMPRESSIONS),
              help="Codec of the local batches (consumer path) [default: the topic's compression.type; "
                   "'producer' -> none].")
@click.option("--batch-size", type=click.IntRange(min=1), default=10_000, show_default=True,
              help="Records fetched per poll (consume num_messages; consumer path).")
@click.option("--max-batch-bytes", type=click.IntRange(min=1), default=1024 * 1024, show_default=True,
              help="Largest local record batch, bytes (uncompressed estimate).")
@click.option("--config", "config_items", multiple=True, metavar="KEY=VALUE",
              help="Topic config override for the local log (Kafka name, e.g. segment.bytes=1048576); repeatable.")
@click.option("--isolation-level", type=click.Choice(["read_committed", "read_uncommitted"]),
              default="read_committed", show_default=True,
              help="What the store sees; the replica path materializes read_committed only.")
@click.option("--timeout", "timeout_s", type=click.FloatRange(min=0.1), default=30.0, show_default=True,
              help="Seconds to wait for the broker (requests, and while unreachable) before failing; a "
                   "continuous run (no --until-caught-up) keeps retrying with backoff instead.")
@click.option("--progress/--no-progress", default=None, help="Progress bar [default: only on a terminal].")
@click.option("--cleaner-threads", type=click.IntRange(min=0), default=1, show_default=True,
              help="Background log cleaner threads on a compacted topic (Kafka log.cleaner.threads); 0 disables.")
@click.option("--cleaner-backoff-ms", type=click.IntRange(min=0), default=DEFAULT_CLEANER_BACKOFF_MS,
              show_default=True, help="Cleaner sleep when no log needs cleaning, ms (log.cleaner.backoff.ms).")
@click.option("--dedupe-buffer-size", "dedupe_buffer_size_bytes", type=click.IntRange(min=1),
              default=DEFAULT_DEDUPE_BUFFER_SIZE_BYTES, show_default=True,
              help="Offset map memory of all cleaner threads, bytes (log.cleaner.dedupe.buffer.size).")
@click.option("--retention-check-interval-ms", type=click.IntRange(min=1),
              default=DEFAULT_RETENTION_CHECK_INTERVAL_MS, show_default=True,
              help="How often retention.ms/retention.bytes are applied, ms (log.retention.check.interval.ms).")
@click.option("-X", "client_items", multiple=True, metavar="KEY=VALUE",
              help="librdkafka setting for the consumer (e.g. -X security.protocol=SASL_SSL); repeatable; wins "
                   "over --command-config. The replica path translates security.protocol, sasl.*, ssl.* and "
                   "client.id, and reads fetch.max.bytes / max.partition.fetch.bytes.")
@click.option("--command-config", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="Java properties file of client settings (as Kafka's tools take), passed to librdkafka.")
@click.option("--metadata-refresh-interval-ms", type=click.IntRange(min=1),
              default=DEFAULT_METADATA_REFRESH_INTERVAL_MS, show_default=True,
              help="How often a continuous run looks for partitions added to the topic, ms.")
@format_options(with_auto=False, default="bytes")
@click.option("--on-bad-record", type=click.Choice(["fail", "skip"]), default="fail", show_default=True,
              help="A key/value that does not decode in --key-format/--value-format: fail (error naming partition "
                   "and offset) or skip (kept in the local log, not materialized, counted).")
@click.option("--on-topic-recreated", type=click.Choice(["rebuild", "fail"]), default="rebuild", show_default=True,
              help="The topic was deleted and re-created under the same name (another topic id, KIP-516): rebuild "
                   "(drop the local logs and state store, materialize the new topic; also while running) or fail.")
@registry_options
@click.option("--metrics-port", type=click.IntRange(min=0, max=65535), default=0, show_default=True,
              help="Serve Prometheus metrics on http://ADDRESS:PORT/metrics; 0 = off. Needs "
                   "pip install 'kafka-materializer[metrics]'.")
@click.option("--metrics-address", default="127.0.0.1", show_default=True,
              help="Address the metrics server listens on (0.0.0.0: every interface).")
@click.option("--statistics-interval-ms", type=click.IntRange(min=0), default=5000, show_default=True,
              help="With --metrics-port and --fetch consumer: librdkafka statistics.interval.ms, whose "
                   "per-partition numbers become materializer_librdkafka_* metrics, ms; 0 = none.")
def run(bootstrap_servers: str, topic: str, data_dir: Path, until_caught_up: bool, fetch: str | None,
        compression: str | None,
        batch_size: int, max_batch_bytes: int, config_items: tuple[str, ...], isolation_level: str,
        timeout_s: float, progress: bool | None, cleaner_threads: int, cleaner_backoff_ms: int,
        dedupe_buffer_size_bytes: int, retention_check_interval_ms: int, client_items: tuple[str, ...],
        command_config: Path | None, metadata_refresh_interval_ms: int, key_format: str, value_format: str,
        on_bad_record: str, on_topic_recreated: str, registry_url: str | None, registry_basic_auth: str | None,
        registry_items: tuple[str, ...], metrics_port: int, metrics_address: str,
        statistics_interval_ms: int) -> None:
    """Consume TOPIC into DIR's local log and state store.

    By default the leaders' record batches are fetched and appended verbatim (--fetch replica):
    the local .log files equal the broker's, and the store is applied read_committed from them.
    Fetching resumes where the local log ends; Ctrl-C finishes the current batch, stops the
    log cleaner, flushes and exits. On a compacted topic a background log cleaner compacts the
    local log while it runs; its per-round statistics go to DIR/log-cleaner.log, as a broker's
    do. Prints a one-line summary (records, bytes, seconds, cleaning) at the end. With
    --metrics-port, Prometheus metrics are served while it runs (from before the store is
    reconciled with the local log until the summary).

    With --key-format/--value-format other than bytes, every record is decoded before it is
    applied (Avro: schemas from --schema-registry-url); the store keeps the exact bytes.
    """
    if metrics_port:
        require_prometheus_client()  # fail before anything is fetched or written
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
        schema_registry_config=registry_config(registry_basic_auth, registry_items))
    materializer = Materializer(bootstrap_servers, topic, data_dir, options=options)
    with contextlib.ExitStack() as stack:
        if metrics_port:
            from materializer.metrics import MaterializerMetrics

            metrics = stack.enter_context(
                MaterializerMetrics(materializer, statistics_interval_ms=statistics_interval_ms))
            metrics.serve(metrics_port, addr=metrics_address)
        stack.enter_context(_cleaner_log_file(data_dir, enabled=cleaner_threads > 0))
        try:  # run() starts it: a continuous run waits for a broker that is away at start too
            stats = materializer.run(until_caught_up=until_caught_up)
            live_keys = materializer.store.count() if materializer.store is not None else 0
        finally:
            materializer.close()
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
    if stats.topic_recreations:
        retention += f"; the topic was re-created {stats.topic_recreations} time(s) and materialized again"
    click.echo(f"{topic}: fetched {stats.records_fetched} records ({stats.bytes_fetched} bytes) in "
               f"{stats.elapsed_s:.2f} s, appended {stats.batches_appended} batches ({stats.bytes_appended} bytes), "
               f"applied {stats.records_applied} records, replayed {stats.records_replayed} from the local log"
               f"{rebuilt}; {live_keys} live keys{cleaned}{retention}")
    if stats.cleaner_checkpoints_reset:
        click.echo(f"warning: {stats.cleaner_checkpoints_reset} unreadable cleaner-offset-checkpoint file(s) were reset; "
                   f"see {data_dir / 'log-cleaner.log'}", err=True)
    if stats.cleaner_threads_died:
        raise click.ClickException(f"{stats.cleaner_threads_died} log cleaner thread(s) died; "
                                   f"see {data_dir / 'log-cleaner.log'} (the local log was not compacted since)")


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
    file_handler = logging.FileHandler(data_dir / CLEANER_LOG_FILE, encoding="utf-8", delay=True)
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


class _WithoutTraceback(logging.Formatter):
    """Without --debug, a logged exception shows on stderr as ``message: error`` on the same line;
    its traceback still goes to the files that log it in full (``log-cleaner.log``)."""

    def __init__(self, inner: logging.Formatter) -> None:
        super().__init__()
        self.inner = inner

    def format(self, record: logging.LogRecord) -> str:
        if record.exc_info:
            error = record.exc_info[1]
            record = logging.makeLogRecord({**record.__dict__, "msg": f"{record.getMessage()}: {error}",
                                            "args": None, "exc_info": None, "exc_text": None})
        return self.inner.format(record)


class _MinLevelFilter(logging.Filter):
    """Passes records of the log cleaner only at or above ``level`` (other loggers untouched)."""

    def __init__(self, level: int) -> None:
        super().__init__()
        self.level = level

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= self.level or not record.name.startswith(_CLEANER_LOGGER)


def _open_existing_store(data_dir: Path, topic: str) -> StateStore:
    """The topic's store, opened as a reader (no lock taken, nothing written, a read-only mount will
    do), if the topic is complete (:func:`~materializer.data_dir.open_when_complete`).

    Raises:
        IncompleteDataDirError: no store, or a command building or replacing it is in progress or
            was interrupted (an ``error:`` line and exit 2; exit 1 stays "key absent" alone).
    """
    return open_when_complete(data_dir, topic, lambda: StateStore(state_dir(data_dir, topic), read_only=True),
                              StateStore.close)


def client_config(items: tuple[str, ...], command_config: Path | None) -> dict[str, str]:
    """librdkafka settings from ``--command-config`` (Java properties: ``key=value`` or ``key: value``
    lines, ``#``/``!`` comments) and ``-X key=value`` items, which win, as kcat and Kafka's tools take them.

    Raises:
        ValueError: an item or line without a key and ``=`` (the file and line are named).
    """
    config: dict[str, str] = {}
    if command_config is not None:
        for number, raw in enumerate(command_config.read_text(encoding="utf-8").splitlines(), start=1):
            line = raw.strip()
            if not line or line[0] in "#!":
                continue
            separator = min((i for i in (line.find("="), line.find(":")) if i > 0), default=-1)
            if separator < 0:
                raise ValueError(f"{command_config} line {number}: {raw!r} is not key=value")
            config[line[:separator].strip()] = line[separator + 1:].strip()
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"-X {item!r} is not key=value")
        config[key.strip()] = value.strip()
    return config


_progress_option = click.option(
    "--progress/--no-progress", default=None, help="Progress bar on stderr [default: only on a terminal].")


@main.command()
@_data_dir_option
@_topic_option
@format_options(with_auto=True, default="auto")
@registry_options
@_progress_option
def export(data_dir: Path, topic: str, key_format: str, value_format: str, registry_url: str | None,
           registry_basic_auth: str | None, registry_items: tuple[str, ...], progress: bool | None) -> None:
    """Print every live (partition, key) as JSON Lines, in partition then key byte order.

    One object per line: {"partition": int, "offset": int, "key": ..., "value": ...}.
    With the default format auto, key and value are UTF-8 text, and one that is not valid UTF-8 is
    given as standard base64 in "key_b64" / "value_b64" instead; bytes always gives base64 in
    "*_b64"; str, json and avro give the decoded text or object (Avro bytes as base64, logical
    types as ISO 8601 text). A value that does not decode fails with its partition and offset.
    Kafka compacts each partition on its own, so a key that lives in two partitions is printed
    once for each, with that partition's latest value.
    """
    registry = registry_client(registry_url, registry_basic_auth, registry_items, key_format, value_format)
    key_serde = None if key_format == "auto" else make_serde(key_format, topic=topic, field="key",
                                                             schema_registry=registry)
    value_serde = None if value_format == "auto" else make_serde(value_format, topic=topic, field="value",
                                                                 schema_registry=registry)
    with _open_existing_store(data_dir, topic) as store:
        total = store.count() if show_progress(progress) else None  # an extra pass over the keys
        with progress_bar(progress, total=total, unit="keys", desc=f"{topic}: export") as bar:
            for key, stored in store.items():
                line: dict[str, object] = {"partition": stored.partition, "offset": stored.offset}
                line.update(_export_field("key", key, key_serde, stored))
                line.update(_export_field("value", stored.value, value_serde, stored))
                click.echo(json.dumps(line, ensure_ascii=False))
                bar.update(1)


def _export_field(name: str, data: bytes, serde: Serde | None, stored: StoredValue) -> Mapping[str, object]:
    if serde is None:
        return text_or_base64(name, data)
    if serde.format == "bytes":
        return {f"{name}_b64": base64.b64encode(data).decode("ascii")}
    return {name: to_json_compatible(serde.decode(data, stored.partition, stored.offset))}


@main.command()
@_data_dir_option
@_topic_option
@click.argument("key")
@click.option("--key-encoding", type=click.Choice(KEY_ENCODINGS), default="utf8", show_default=True,
              help="How KEY is written on the command line when --key-format is bytes.")
@click.option("--key-format", type=click.Choice(["bytes", "str", "json", "avro"]), default="bytes", show_default=True,
              help="How keys were serialized: bytes/str (KEY as --key-encoding says), json (KEY is JSON, "
                   "looked up as compact JSON), avro (KEY is JSON, serialized with the latest <topic>-key schema).")
@click.option("--value-format", "--format", "fmt", type=click.Choice(DISPLAY_FORMATS + ("avro",)), default="auto",
              show_default=True,
              help="auto: UTF-8 text or 'base64:...'; str: strict UTF-8; json: pretty JSON; bytes: raw bytes; "
                   "avro: Confluent wire format decoded with the Schema Registry, printed as JSON.")
@click.option("--partition", type=click.IntRange(min=0), default=None,
              help="Read KEY's value in this partition only.")
@click.option("--metadata", is_flag=True,
              help="Print 'partition P offset O timestamp T' on stderr too, and the other partitions the key lives in.")
@registry_options
def get(data_dir: Path, topic: str, key: str, key_encoding: str, key_format: str, fmt: str, partition: int | None,
        metadata: bool, registry_url: str | None, registry_basic_auth: str | None,
        registry_items: tuple[str, ...]) -> None:
    """Print the latest value of KEY; exit status 1 when the key is absent or deleted, 2 on any error.

    Without --partition, a key that lives in more than one partition (after a partition-count
    increase, or producers with different partitioners) gives the value whose record has the latest
    timestamp; equal timestamps: the lower partition number ("last write wins across partitions").
    """
    registry = registry_client(registry_url, registry_basic_auth, registry_items, key_format, fmt)
    key_bytes = _key_bytes(key, key_encoding, key_format, topic, registry)
    with _open_existing_store(data_dir, topic) as store:
        found = store.get_all(key_bytes)
    if partition is not None:
        stored = found.get(partition)
    else:
        stored = latest_across_partitions(found.values())
    if stored is None:
        where = f" partition {partition} of" if partition is not None else ""
        click.echo(f"key {key!r} not found in{where} topic {topic!r}", err=True)
        sys.exit(EXIT_ABSENT)
    if metadata:
        click.echo(f"partition {stored.partition} offset {stored.offset} timestamp {stored.timestamp}", err=True)
        others = sorted(p for p in found if p != stored.partition)
        if others:
            click.echo(f"the key also lives in partition(s) {', '.join(map(str, others))}", err=True)
    if fmt == "avro":
        datum = make_serde("avro", topic=topic, schema_registry=registry).decode(stored.value, stored.partition,
                                                                               stored.offset)
        click.echo(json.dumps(to_json_compatible(datum), indent=2, ensure_ascii=False))
        return
    try:
        shown = decode_for_display(stored.value, fmt)
    except ValueError as exc:
        raise ValueError(f"partition {stored.partition} offset {stored.offset}: {exc}") from exc
    if isinstance(shown, bytes):
        click.echo(shown, nl=False)
    else:
        click.echo(shown)


def _key_bytes(key: str, encoding: str, key_format: str, topic: str, registry: object) -> bytes:
    if key_format in ("bytes", "str"):
        return parse_key(key, encoding)
    try:
        datum = json.loads(key)
    except json.JSONDecodeError as exc:
        raise ValueError(f"KEY must be JSON for --key-format {key_format}: {exc}") from exc
    return make_serde(key_format, topic=topic, field="key", schema_registry=registry).encode(datum)


@main.command()
@click.option("--data-dir", type=click.Path(file_okay=False, path_type=Path), default=Path("demo-data"),
              show_default=True, help="Data directory for the demo's local log and state store.")
@click.option("--bootstrap-servers", default=None,
              help="Use this Kafka cluster instead of starting a local broker.")
@click.option("--broker-dir", type=click.Path(file_okay=False, path_type=Path),
              default=Path(".materializer") / "broker", show_default=True,
              help="State directory of the local broker (reused when one is already running there).")
def demo(data_dir: Path, bootstrap_servers: str | None, broker_dir: Path) -> None:
    """End-to-end sample: local broker, compacted topic 'product-prices' (3 partitions, 4000 updates
    with headers and tombstones), materialize until caught up, print keys and partition folders."""
    from materializer.cli.demo import run_demo

    result = run_demo(data_dir, bootstrap_servers=bootstrap_servers, broker_dir=broker_dir, echo=click.echo)
    if not result.matches:
        raise click.ClickException("the state store does not match the produced records")


# Commands owned by other modules (broker provisioning, DumpLogSegments, offline restore, LogCleaner).
main.add_command(broker)
main.add_command(registry)
main.add_command(dump_log, name="dump-log")
main.add_command(restore)
main.add_command(compact)
main.add_command(spark)
