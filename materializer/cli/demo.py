"""``materializer demo``: a sample compacted topic on a real broker, materialized end to end.

Steps: start a local Apache Kafka broker (unless a bootstrap address is given or one is already
running in the broker state dir), create the compacted topic ``product-prices``, produce a few
thousand price updates with headers and tombstones over several partitions, run the
Materializer until caught up, check the store against what was produced, print a short report,
clean the local log once with Kafka's cleaner rules (as `materializer compact --upto-offset`),
and stop the broker it started.

The sample data is deterministic for a given ``seed``: keys ``product-0000``...; values are JSON
``{"product": ..., "price_cents": int, "currency": "EUR", "version": int}``; headers
``source=demo`` and ``version=<n>``; about one record in twelve is a tombstone.

This module produces with confluent-kafka directly: it is a sample-data generator, not part of
the materializer's read path.
"""

from __future__ import annotations

import json
import logging
import random
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import click

from materializer.cli.conventions import CommandError
from materializer.adapters.errors import KafkaSourceError
from materializer.datadir.layout import state_dir, topic_config_path
from materializer.storage.files import find_partition_dirs

# The Kafka client, the broker launcher and the materializer load when the demo runs, not for its
# --help (issue 42).
if TYPE_CHECKING:  # pragma: no cover
    from materializer.local.kafka_broker import LocalKafkaBroker
    from materializer.stats import MaterializerStats

__all__ = [
    "DEMO_PARTITIONS",
    "DEMO_TOPIC",
    "DEMO_TOPIC_CONFIG",
    "DemoResult",
    "create_demo_topic",
    "produce_price_updates",
    "run_demo",
]

_client_logger = logging.getLogger(__name__ + ".librdkafka")

DEMO_TOPIC = "product-prices"
DEMO_PARTITIONS = 3
_DEMO_UPDATES = 4000
DEMO_TOPIC_CONFIG = {
    "cleanup.policy": "compact",
    "compression.type": "producer",
    "min.cleanable.dirty.ratio": "0.5",
    "segment.ms": "600000",
}


@dataclass
class DemoResult:
    """What the demo did."""

    bootstrap_servers: str
    produced_records: int
    expected: dict[bytes, bytes]
    live_keys: int
    matches: bool
    stats: MaterializerStats
    partition_dirs: list[Path]


def create_demo_topic(bootstrap_servers: str, topic: str = DEMO_TOPIC, partitions: int = DEMO_PARTITIONS,
                      timeout_s: float = 30.0) -> bool:
    """Create the compacted demo topic; returns False when it already existed.

    Raises:
        KafkaSourceError: the broker refused or did not answer.
    """
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap_servers}, logger=_client_logger)
    futures = admin.create_topics([NewTopic(topic, partitions, 1, config=DEMO_TOPIC_CONFIG)],
                                  request_timeout=timeout_s)
    try:
        futures[topic].result(timeout=timeout_s)
    except KafkaException as exc:
        if exc.args and exc.args[0].code() == 36:  # TOPIC_ALREADY_EXISTS
            return False
        raise KafkaSourceError(f"cannot create topic {topic!r} on {bootstrap_servers}: {exc}") from exc
    return True


def produce_price_updates(bootstrap_servers: str, topic: str = DEMO_TOPIC, *, products: int = 400,
                          updates: int = 4000, seed: int = 7, timeout_s: float = 60.0) -> dict[bytes, bytes | None]:
    """Produce ``updates`` price updates for ``products`` products (zstd, idempotent producer).

    Returns key -> last produced value (None = deleted by a tombstone). Each key always goes to
    the same partition (default partitioner), so "last produced" is the last in its partition.

    Raises:
        KafkaSourceError: a record was not acknowledged.
    """
    rng = random.Random(seed)
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap_servers, "compression.type": "zstd",
                         "linger.ms": 20, "enable.idempotence": True}, logger=_client_logger)
    latest: dict[bytes, bytes | None] = {}
    versions: dict[bytes, int] = {}
    failures: list[str] = []

    def on_delivery(err, _msg) -> None:
        if err is not None:
            failures.append(err.str())

    for i in range(updates):
        key = f"product-{rng.randrange(products):04d}".encode()
        version = versions.get(key, 0) + 1
        versions[key] = version
        if latest.get(key) is not None and rng.random() < 1 / 12:
            value = None
        else:
            value = json.dumps({"product": key.decode(), "price_cents": rng.randrange(99, 99_999),
                                "currency": "EUR", "version": version}, separators=(",", ":")).encode()
        latest[key] = value
        producer.produce(topic, key=key, value=value, headers=[("source", b"demo"), ("version", str(version).encode())],
                         on_delivery=on_delivery)
        if i % 1000 == 999:
            producer.poll(0)
    remaining = producer.flush(timeout_s)
    if remaining or failures:
        raise KafkaSourceError(f"demo producer: {remaining} records unacknowledged, {len(failures)} failed "
                               f"({failures[:1]})")
    return latest


def _reset_local_topic(data_dir: Path, topic: str) -> None:
    for path in (find_partition_dirs(data_dir, topic).values() if data_dir.is_dir() else ()):
        shutil.rmtree(path)
    shutil.rmtree(state_dir(data_dir, topic), ignore_errors=True)
    topic_config_path(data_dir, topic).unlink(missing_ok=True)


def run_demo(data_dir: Path, *, bootstrap_servers: str | None = None, broker_dir: Path = Path(".materializer/broker"),
             echo: Callable[[str], None] = print, progress: bool | None = None) -> DemoResult:
    """Run the demo; ``echo`` receives the report lines. Returns :class:`DemoResult`.

    Raises:
        BrokerProvisioningError, KafkaSourceError, StoreError, StorageError.
    """
    data_dir = Path(data_dir)
    from materializer.config import MaterializerOptions
    from materializer.local.kafka_broker import TEST_BROKER_CONFIG, LocalKafkaBroker
    from materializer.materializer import Materializer

    started: LocalKafkaBroker | None = None
    if bootstrap_servers is None:
        try:
            running = LocalKafkaBroker.attach(broker_dir)
            bootstrap_servers = running.bootstrap_servers if running.is_running() else None
        except Exception:  # noqa: BLE001 - no usable broker recorded there: start one
            bootstrap_servers = None
        if bootstrap_servers is None:
            echo(f"starting a local Apache Kafka broker in {broker_dir} ...")
            started = LocalKafkaBroker(broker_dir, extra_config=TEST_BROKER_CONFIG).start()
            bootstrap_servers = started.bootstrap_servers
            echo(f"broker up at {bootstrap_servers} ({started.startup_s:.1f} s)")
        else:
            echo(f"using the broker already running at {bootstrap_servers} ({broker_dir})")
    try:
        if create_demo_topic(bootstrap_servers):
            echo(f"created compacted topic {DEMO_TOPIC!r} with {DEMO_PARTITIONS} partitions")
            _reset_local_topic(data_dir, DEMO_TOPIC)  # a new topic: older local copies are of another broker
        else:
            echo(f"topic {DEMO_TOPIC!r} exists; producing more updates into it")
        produced = produce_price_updates(bootstrap_servers, updates=_DEMO_UPDATES)
        echo(f"produced {_DEMO_UPDATES} price updates for {len(produced)} products (zstd, headers, tombstones)")
        options = MaterializerOptions(progress=progress)
        with Materializer(bootstrap_servers, DEMO_TOPIC, data_dir, options=options) as materializer:
            stats = materializer.run(until_caught_up=True)
            store = materializer.store
            assert store is not None  # open from start to close
            live = {key: stored for key, stored in store.items()}
            partition_dirs = sorted(log.dir for log in materializer.logs.values())
            log_end_offsets = {p: log.log_end_offset for p, log in materializer.logs.items()}
        expected = {k: v for k, v in produced.items() if v is not None}
        matches = {key: stored.value for key, stored in live.items()} == expected
        compaction = _compact(data_dir, log_end_offsets)
        _print_report(echo, data_dir, stats, live, expected, partition_dirs, matches, compaction)
        return DemoResult(bootstrap_servers, _DEMO_UPDATES, expected, len(live), matches, stats, partition_dirs)
    finally:
        if started is not None:
            echo("stopping the broker started for the demo")
            started.stop()


def _compact(data_dir: Path, log_end_offsets: dict[int, int]) -> str:
    """Clean each local partition up to its log end offset (``materializer compact --upto-offset``);
    returns a one-line summary."""
    from materializer.offline.compact import compact_topic

    results = [result for partition, end in sorted(log_end_offsets.items())
               for result in compact_topic(data_dir, DEMO_TOPIC, partition=partition, upto_offset=end)]
    before = sum(r.size_before_bytes for r in results)
    after = sum(r.size_after_bytes for r in results)
    return (f"compacted the local log with Kafka's cleaner rules: {before} -> {after} bytes of .log, "
            f"{sum(r.records_read for r in results)} -> {sum(r.records_written for r in results)} records "
            f"(tombstones kept until their delete horizon)")


def _print_report(echo: Callable[[str], None], data_dir: Path, stats: MaterializerStats, live: dict,
                  expected: dict[bytes, bytes], partition_dirs: list[Path], matches: bool, compaction: str) -> None:
    echo("")
    echo(f"fetched {stats.records_fetched} records ({stats.bytes_fetched} bytes) in {stats.elapsed_s:.2f} s; "
         f"appended {stats.batches_appended} batches ({stats.bytes_appended} bytes); "
         f"applied {stats.records_applied} records")
    echo("")
    echo(f"{'key':<14} {'partition':>9} {'offset':>7}  value")
    for key in sorted(live)[:8]:
        stored = live[key]
        echo(f"{key.decode(errors='replace'):<14} {stored.partition:>9} {stored.offset:>7}  "
             f"{stored.value.decode(errors='replace')}")
    echo("")
    echo(f"live keys: {len(live)} (expected from the produced records: {len(expected)}; store equals the "
         f"latest produced value per key: {'yes' if matches else 'NO'})")
    echo(compaction)
    echo(f"partition folders in {data_dir}:")
    for path in partition_dirs:
        files = sorted(p.name for p in path.iterdir() if p.is_file())
        size = sum((path / name).stat().st_size for name in files if name.endswith(".log"))
        echo(f"  {path.name}/  {size} bytes of .log: {', '.join(files)}")
    echo(f"state store: {state_dir(data_dir, DEMO_TOPIC)}")
    echo(f"next: materializer export --data-dir {data_dir} --topic {DEMO_TOPIC} | head -3")


@click.command("demo")
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
    result = run_demo(data_dir, bootstrap_servers=bootstrap_servers, broker_dir=broker_dir, echo=click.echo)
    if not result.matches:
        raise CommandError("the state store does not match the produced records")
