"""``materializer get`` and ``export``: read a data dir's state store without writing anything (a
reader opens the store beside a writer, and refuses a topic that is not complete).

Formats not given on the command line (or in the environment) are those the topic's last ``run``
recorded in ``DIR/topic-formats/<topic>.json`` (:mod:`materializer.datadir.formats`) when it
declared ``str``, ``json`` or ``avro``, else each command's own default; likewise
``--schema-registry-url``. A data dir without the record (written before it existed) uses the
commands' defaults.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import itertools
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping, NamedTuple

import click

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
from materializer.cli.options import client_config, data_dir_option, progress_option, topic_option
from materializer.cli.serde_options import format_options, registry_client, registry_options
from materializer.datadir.formats import read_topic_formats
from materializer.group.routing import PARTITIONERS
from materializer.storage.errors import IncompleteDataDirError

# The state store (RocksDB), the local log (for tombstones) and the group's views are imported when
# a command runs, not for its --help (issue 42: the command line starts in a few tenths of a second).
if TYPE_CHECKING:  # pragma: no cover
    from materializer.adapters.partition_owner import PartitionOwner
    from materializer.adapters.rocksdb_store import StateStore, StoredValue
    from materializer.datadir.lease import Staleness
    from materializer.deletions import Deletion
    from materializer.view import ServedPartitions

__all__ = ["export", "get"]

EXIT_ABSENT = 1  # get: no such key (materializer.cli.EXIT_ABSENT)
_RECORDED_DEFAULT_HELP = " [default: what `run` recorded for the topic when str, json or avro, else {}]"
_DECLARED = ("str", "json", "avro")  # run's bytes is "not declared": the reader's own default stays


def _with_recorded(data_dir: Path, topic: str, key_format: str | None, value_format: str | None,
                   registry_url: str | None, *, key_default: str, value_default: str) -> tuple[str, str, str | None]:
    """(key format, value format, registry URL): each as given, else as the topic's last ``run``
    recorded (formats only when declared str/json/avro), else ``key_default``/``value_default``/None.

    Raises:
        ValueError: the record exists but cannot be read (:func:`~materializer.datadir.formats.read_topic_formats`).
    """
    recorded = read_topic_formats(data_dir, topic) if None in (key_format, value_format, registry_url) else None

    def pick(given: str | None, run_used: str | None, default: str) -> str:
        if given is not None:
            return given
        return run_used if run_used in _DECLARED else default

    return (pick(key_format, recorded.key_format if recorded else None, key_default),
            pick(value_format, recorded.value_format if recorded else None, value_default),
            registry_url if registry_url is not None else recorded.schema_registry_url if recorded else None)


class _Opened(NamedTuple):
    """A store opened by a reader, with what it may serve and how old it is."""

    store: StateStore
    served: ServedPartitions | None
    staleness: Callable[[Iterable[int] | None], Staleness]


def _open_existing_store(data_dir: Path, topic: str) -> _Opened:
    """The topic's store, opened as a reader (no lock taken, nothing written, a read-only mount will
    do), if the topic is complete (:func:`~materializer.datadir.markers.open_when_complete`), the
    partitions it may serve (:func:`~materializer.view.served_by_marker`) by the marker it was
    opened under (a marker written since, by a group member started again and caught up, speaks
    for newer data than this store holds), and how old it is (:func:`~materializer.datadir.lease.staleness_of`,
    by the writer's lease read before the store was opened) over given partitions, or by default
    over those served (group mode) or every partition the store or the lease knows.

    Raises:
        IncompleteDataDirError: no store, or a command building or replacing it is in progress or
            was interrupted (an ``error:`` line and exit 2; exit 1 stays "key absent" alone).
    """
    from materializer.adapters.rocksdb_store import StateStore
    from materializer.datadir.layout import state_dir
    from materializer.datadir.lease import read_lease, staleness_of
    from materializer.datadir.markers import TopicStatus, open_when_complete
    from materializer.view import served_by_marker

    seen: list[TopicStatus] = []
    lease = read_lease(data_dir, topic)  # before the store opens: the store is at least this current
    store = open_when_complete(data_dir, topic, lambda: StateStore(state_dir(data_dir, topic), read_only=True),
                               StateStore.close, seen=seen.append)
    try:
        status = seen[-1]
        served = served_by_marker(data_dir, topic, status, lease=lease)

        def staleness(partitions: Iterable[int] | None = None) -> Staleness:
            if partitions is None:
                partitions = (served.partitions() if served is not None
                              else set(store.offsets()) | set(lease.as_of_ms if lease is not None else ()))
            return staleness_of(lease, partitions, generation=status.generation)

        return _Opened(store, served, staleness)
    except BaseException:
        store.close()
        raise


_MAX_STALENESS_HELP = ("Refuse (exit 2) when the store is older than this, ms, or its age is unknown: the age is "
                       "the time since the store last held every record below the high watermark its writer had "
                       "fetched (the writer's lease, DIR/topic-lease/<topic>.json).")


@click.command()
@data_dir_option
@topic_option
@format_options(with_auto=True, default=None, default_help=_RECORDED_DEFAULT_HELP.format("auto"))
@registry_options
@progress_option
@click.option("--max-staleness-ms", type=click.IntRange(min=0), default=None, help=_MAX_STALENESS_HELP)
def export(data_dir: Path, topic: str, key_format: str | None, value_format: str | None, registry_url: str | None,
           registry_basic_auth: str | None, registry_items: tuple[str, ...], progress: bool | None,
           max_staleness_ms: int | None) -> None:
    """Print every live (partition, key) as JSON Lines, in partition then key byte order.

    One object per line: {"partition": int, "offset": int, "key": ..., "value": ...}.
    With the default format auto, key and value are UTF-8 text, and one that is not valid UTF-8 is
    given as standard base64 in "key_b64" / "value_b64" instead; bytes always gives base64 in
    "*_b64"; str, json and avro give the decoded text or object (Avro bytes as base64, logical
    types as ISO 8601 text). A value that does not decode fails with its partition and offset.
    Kafka compacts each partition on its own, so a key that lives in two partitions is printed
    once for each, with that partition's latest value. Formats and --schema-registry-url not given
    are those `materializer run` recorded for the topic (when it declared str, json or avro).
    One line on stderr says how old the export is (as of when, by the writer's lease) or why that
    is unknown, and whether the writer found the topic deleted in the cluster; --max-staleness-ms
    refuses an older one.
    """
    from materializer.progress import progress_bar, show_progress

    key_format, value_format, registry_url = _with_recorded(data_dir, topic, key_format, value_format, registry_url,
                                                            key_default="auto", value_default="auto")
    registry = registry_client(registry_url, registry_basic_auth, registry_items, key_format, value_format)
    key_serde = None if key_format == "auto" else make_serde(key_format, topic=topic, field="key",
                                                             schema_registry=registry)
    value_serde = None if value_format == "auto" else make_serde(value_format, topic=topic, field="value",
                                                                 schema_registry=registry)
    store, served, staleness = _open_existing_store(data_dir, topic)
    with store:
        if served is not None and served.stopped is not None:  # its partitions went stale: not exported as the topic's
            raise IncompleteDataDirError(
                f"topic {topic!r} in {data_dir} was written by a member of consumer group {served.group_id!r}; "
                f"{served.stopped}, and the group moves them to other members: export from their data dirs")
        partitions: list[int | None] = [None] if served is None else [*sorted(served.partitions())]
        if served is not None:
            click.echo(f"a member of consumer group {served.group_id!r} wrote {data_dir}: exporting the partitions it "
                       f"held, {_partition_list(partitions)} of {served.partition_count()}", err=True)
        age = staleness(None)
        age.check(max_staleness_ms, f"topic {topic!r} in {data_dir}", "--max-staleness-ms")
        total = (sum(store.count(p) for p in partitions) if show_progress(progress)  # an extra pass over the keys
                 else None)
        with progress_bar(progress, total=total, unit="keys", desc=f"{topic}: export") as bar:
            for key, stored in itertools.chain.from_iterable(store.items(p) for p in partitions):
                line: dict[str, object] = {"partition": stored.partition, "offset": stored.offset}
                line.update(_export_field("key", key, key_serde, stored))
                line.update(_export_field("value", stored.value, value_serde, stored))
                click.echo(json.dumps(line, ensure_ascii=False))
                bar.update(1)
    click.echo(f"topic {topic!r} in {data_dir}: {age.describe()}", err=True)  # once it is all out


def _partition_list(partitions: list[int | None]) -> str:
    return ", ".join(map(str, partitions)) if partitions else "none"


def _export_field(name: str, data: bytes, serde: Serde | None, stored: StoredValue) -> Mapping[str, object]:
    if serde is None:
        return text_or_base64(name, data)
    if serde.format == "bytes":
        return {f"{name}_b64": base64.b64encode(data).decode("ascii")}
    return {name: to_json_compatible(serde.decode(data, stored.partition, stored.offset))}


@click.command()
@click.option("--data-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Data directory written by `run` (not needed with --group-id: the key is read from the group's "
                   "members over HTTP).")
@topic_option
@click.argument("keys", metavar="KEY...", nargs=-1, required=True)
@click.option("--group-id", default=None,
              help="Without --data-dir: ask the member of this consumer group that holds KEY's partition (run "
                   "--group-id ... --serve), over HTTP; needs --bootstrap-servers.")
@click.option("--partitioner", type=click.Choice(PARTITIONERS), default="murmur2", show_default=True,
              help="With --group-id: the producers' partitioner, to pick the member to ask (another member "
                   "forwards to the right one when it is wrong).")
@click.option("--serve-token-file", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
              help="With --group-id: the members' bearer token file (run --serve-token-file).")
@click.option("--serve-ca-file", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
              help="With --group-id: PEM CA certificates that verify the members' HTTPS (run --serve-cert).")
@click.option("--key-encoding", type=click.Choice(KEY_ENCODINGS), default="utf8", show_default=True,
              help="How KEY is written on the command line when --key-format is bytes.")
@click.option("--key-format", type=click.Choice(["bytes", "str", "json", "avro"]), default=None,
              help="How keys were serialized: bytes/str (KEY as --key-encoding says), json (KEY is JSON, "
                   "looked up as compact JSON), avro (KEY is JSON, serialized with the latest <topic>-key schema)."
                   + _RECORDED_DEFAULT_HELP.format("bytes"))
@click.option("--value-format", "--format", "fmt", type=click.Choice(DISPLAY_FORMATS + ("avro",)), default=None,
              help="auto: UTF-8 text or 'base64:...'; str: strict UTF-8; json: pretty JSON; bytes: raw bytes; "
                   "avro: Confluent wire format decoded with the Schema Registry, printed as JSON."
                   + _RECORDED_DEFAULT_HELP.format("auto"))
@click.option("--partition", type=click.IntRange(min=0), default=None,
              help="Read KEY's value in this partition only.")
@click.option("--metadata", is_flag=True,
              help="Print 'partition P offset O timestamp T' on stderr too, the other partitions the key lives in, "
                   "and how old the store is (as of when, by its writer's lease).")
@click.option("--max-staleness-ms", type=click.IntRange(min=0), default=None, help=_MAX_STALENESS_HELP)
@click.option("--bootstrap-servers", default=None,
              help="In a data dir of `run --group-id`: the Kafka cluster, asked (one DescribeConsumerGroups) which "
                   "member holds KEY's partition when it is not served here, to name it in the error.")
@click.option("-X", "client_items", multiple=True, metavar="KEY=VALUE",
              help="librdkafka setting for that request (e.g. -X security.protocol=SASL_SSL); repeatable; wins over "
                   "--command-config.")
@click.option("--command-config", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="Java properties file of client settings for that request, as `run` takes it.")
@registry_options
def get(data_dir: Path | None, topic: str, keys: tuple[str, ...], group_id: str | None, partitioner: str,
        serve_token_file: Path | None, serve_ca_file: Path | None, key_encoding: str, key_format: str | None,
        fmt: str | None, partition: int | None, metadata: bool, max_staleness_ms: int | None,
        bootstrap_servers: str | None, client_items: tuple[str, ...], command_config: Path | None,
        registry_url: str | None, registry_basic_auth: str | None,
        registry_items: tuple[str, ...]) -> None:
    """Print the latest value of each KEY; exit status 1 when a key is absent or deleted, 2 on any error.

    \b
    Examples:
      materializer get --data-dir data --topic prices product-0001
      materializer get --data-dir data --topic prices product-0001 product-0002
      cut -f1 skus.tsv | materializer get --data-dir data --topic prices -

    One KEY: its value alone on stdout (text with a newline, --format bytes the raw bytes); an
    absent key prints nothing there, says so on stderr and exits 1. Several KEYs, or - (the keys on
    stdin, one per line, empty lines skipped): one JSON line per key, in the order given, each
    {"key": KEY, "partition": P, "offset": O, "timestamp": T, "value": ...} ("value_b64", standard
    base64, for a value that is not UTF-8 text under the default format auto or under bytes; json
    and avro values as JSON), or {"key": KEY, "absent": true} for a key not found, with "deleted":
    {"partition": P, "offset": O, "timestamp": T} when the local log still shows its tombstone. The
    exit status is then 1 when any key is absent (every line is printed), 0 when all are found, 2
    on an error (an error line on stderr; the lines printed before it stand).

    A deleted key whose tombstone the local log still shows is said so on stderr ("deleted at
    offset X (partition P, timestamp T)"); a key never written, or whose tombstone the cleaner
    removed (delete.retention.ms) or retention passed, is "not found".

    Without --partition, a key that lives in more than one partition (after a partition-count
    increase, or producers with different partitioners) gives the value whose record has the latest
    timestamp; equal timestamps: the lower partition number ("last write wins across partitions").
    Formats and --schema-registry-url not given are those `materializer run` recorded for the topic
    (when it declared str, json or avro). In a data dir written by `run --group-id`, KEY is routed
    to its partition by the producers' partitioner as the member recorded it (its --partitioner,
    or the one it found from the keys it holds), and a partition that member did not hold when it
    last wrote is an error (exit 2), never a stale value; with --bootstrap-servers the error names
    the member that holds it. While the member could not tell the partitioner yet, KEY is looked
    up in each partition a candidate puts it in: "not found" (exit 1) only when that member held
    them all, else an error (exit 2) naming them.
    --max-staleness-ms refuses a store older than that (its age: over the partitions the key is
    read from, by the writer's lease); a topic its writer found deleted in the cluster is said on
    stderr.

    With --group-id and --bootstrap-servers instead of --data-dir, KEY (bytes or str keys) is read
    over HTTP from the member of the group that holds its partition, as the group coordinator
    names it with its query server's URL (`run --group-id G --serve ...`; docs/serving.md); "not
    found" is exit 1, a member that cannot answer now exit 2 naming it.
    """
    lines = "-" in keys or len(keys) > 1  # JSON Lines, one per key, whatever stdin held
    if "-" in keys:
        if keys != ("-",):
            raise click.UsageError("- (the keys on stdin) cannot be given with other keys")
        keys = tuple(key for key in sys.stdin.read().splitlines() if key)
        if not keys:
            return
    if data_dir is None:
        if group_id is None or bootstrap_servers is None:
            raise click.UsageError("give --data-dir, or --group-id with --bootstrap-servers")
        if key_format not in (None, "bytes", "str") or partition is not None or max_staleness_ms is not None:
            raise click.UsageError("with --group-id: keys of bytes or str only, no --partition or --max-staleness-ms")
        from materializer.cli.remote_get import echo_value, remote_get

        absent = False
        remote_fmt = None if fmt in (None, "avro") else fmt
        for key in keys:
            answer, shown = remote_get(bootstrap_servers, group_id, topic, parse_key(key, key_encoding),
                                       partitioner=partitioner, config=client_config(client_items, command_config),
                                       fmt=remote_fmt, token_file=serve_token_file,
                                       ca_file=serve_ca_file)
            deleted = answer.get("deleted") if shown is None else None  # the owner's: where its log shows the tombstone
            deletion = None if not isinstance(deleted, dict) else _deletion_from(deleted)
            absent |= shown is None
            if lines:
                click.echo(json.dumps(_remote_line(key, answer if shown is not None else None, remote_fmt, deletion),
                                      ensure_ascii=False))
            elif shown is None:
                said = "not found" if deletion is None else _deleted_at(deletion)
                click.echo(f"key {key!r} {said} in topic {topic!r} (group {group_id!r})", err=True)
            else:
                if metadata:
                    click.echo(f"partition {answer['partition']} offset {answer['offset']} timestamp "
                               f"{answer['timestamp']} served by {answer['served_by']}", err=True)
                echo_value(shown)
        if absent:
            sys.exit(EXIT_ABSENT)
        return
    if group_id is not None:
        raise click.UsageError("--group-id reads over HTTP: give it without --data-dir")
    from materializer.adapters.rocksdb_store import latest_across_partitions

    key_format, fmt, registry_url = _with_recorded(data_dir, topic, key_format, fmt, registry_url,
                                                   key_default="bytes", value_default="auto")
    registry = registry_client(registry_url, registry_basic_auth, registry_items, key_format, fmt)
    found_keys: list[_Found] = []
    store, served, staleness = _open_existing_store(data_dir, topic)
    with store:
        if served is not None and (bootstrap_servers is not None or client_items or command_config is not None):
            served = dataclasses.replace(served, owners=_group_owners(served, bootstrap_servers,
                                                                      client_config(client_items, command_config)))
        for key in keys:
            key_bytes = _key_bytes(key, key_encoding, key_format, topic, registry)
            found = store.get_all(key_bytes)
            looked_in: frozenset[int] | None = None if partition is None else frozenset({partition})
            if served is not None:  # a group member's data dir: the key's partition(s), if it held them
                if partition is None:
                    looked_in = served.partitions_of(key_bytes)
                    stored = served.read(key_bytes, found.get)
                    looked_in &= served.partitions()  # read refuses the others: their age is not this answer's
                else:
                    stored = found.get(served.check(partition))
            else:
                stored = found.get(partition) if partition is not None else latest_across_partitions(found.values())
            age = staleness(looked_in)
            age.check(max_staleness_ms, f"topic {topic!r} in {data_dir}", "--max-staleness-ms")
            deletion = None if stored is not None else _deletion_in_log(
                store, key_bytes, store.partitions() if looked_in is None else sorted(looked_in), data_dir, topic)
            found_keys.append(_Found(key, stored, sorted(p for p in found if stored is None or p != stored.partition),
                                     looked_in, deletion))
        if lines:  # the age over every partition looked in
            looked = [each.looked_in for each in found_keys]
            age = staleness(None if None in looked else frozenset().union(*looked))  # type: ignore[arg-type]
    if age.topic_deleted_ms is not None or metadata:
        click.echo(f"topic {topic!r} in {data_dir}: {age.describe()}", err=True)
    if lines:
        for each in found_keys:
            click.echo(json.dumps(_local_line(each, fmt, topic, registry), ensure_ascii=False))
        if any(each.stored is None for each in found_keys):
            sys.exit(EXIT_ABSENT)
        return
    key, stored, others, looked_in, deletion = found_keys[0]
    if stored is None:
        where = (f" partition {', '.join(map(str, sorted(looked_in)))} of" if looked_in is not None else "")
        said = "not found" if deletion is None else _deleted_at(deletion)
        click.echo(f"key {key!r} {said} in{where} topic {topic!r}", err=True)
        sys.exit(EXIT_ABSENT)
    if metadata:
        click.echo(f"partition {stored.partition} offset {stored.offset} timestamp {stored.timestamp}", err=True)
        if others:
            click.echo(f"the key also lives in partition(s) {', '.join(map(str, others))}", err=True)
    if fmt == "avro":
        click.echo(json.dumps(to_json_compatible(_avro_value(stored, topic, registry)), indent=2, ensure_ascii=False))
        return
    try:
        shown = decode_for_display(stored.value, fmt)
    except ValueError as exc:
        raise ValueError(f"partition {stored.partition} offset {stored.offset}: {exc}") from exc
    if isinstance(shown, bytes):
        click.echo(shown, nl=False)
    else:
        click.echo(shown)


class _Found(NamedTuple):
    """One key ``get`` looked up: its value (None: absent), the other partitions it lives in, the
    partitions looked in (None: every one) and its tombstone when the local log still shows it."""

    key: str
    stored: StoredValue | None
    others: list[int]
    looked_in: frozenset[int] | None
    deletion: Deletion | None


def _avro_value(stored: StoredValue, topic: str, registry: object) -> object:
    return make_serde("avro", topic=topic, schema_registry=registry).decode(stored.value, stored.partition,
                                                                          stored.offset)


def _local_line(found: _Found, fmt: str, topic: str, registry: object) -> dict[str, object]:
    """``get``'s JSON line for one of several keys (the command's docstring)."""
    line: dict[str, object] = {"key": found.key}
    stored = found.stored
    if stored is None:
        return {**line, "absent": True, **({} if found.deletion is None else {"deleted": found.deletion._asdict()})}
    line.update(partition=stored.partition, offset=stored.offset, timestamp=stored.timestamp)
    if fmt == "avro":
        return {**line, "value": to_json_compatible(_avro_value(stored, topic, registry))}
    try:
        return {**line, **_value_field(stored.value, fmt)}
    except ValueError as exc:
        raise ValueError(f"partition {stored.partition} offset {stored.offset}: {exc}") from exc


def _value_field(raw: bytes, fmt: str) -> dict[str, object]:
    """A value in a JSON line by display format: bytes as "value_b64"; auto as UTF-8 text, else
    "value_b64"; str as strict UTF-8 text; json as the JSON it holds.

    Raises:
        ValueError: not UTF-8 (str), not JSON (json).
    """
    if fmt == "bytes":
        return {"value_b64": base64.b64encode(raw).decode("ascii")}
    if fmt == "auto":
        return dict(text_or_base64("value", raw))
    shown = decode_for_display(raw, fmt)  # checks strict UTF-8 / JSON
    return {"value": json.loads(shown) if fmt == "json" else shown}


def _remote_line(key: str, answer: Mapping[str, Any] | None, fmt: str | None, deletion: Deletion | None) -> dict[str, object]:
    """``get --group-id``'s JSON line for one of several keys, from the member's answer (None: absent)."""
    if answer is None:
        return {"key": key, "absent": True, **({} if deletion is None else {"deleted": deletion._asdict()})}
    line: dict[str, object] = {"key": key, "partition": answer["partition"], "offset": answer["offset"],
                               "timestamp": answer["timestamp"]}
    value, value_format = answer["value"], answer.get("value_format", "bytes")
    if value_format in ("json", "avro") and fmt in (None, "json"):
        return {**line, "value": value}
    raw = (base64.b64decode(value) if value_format == "bytes" else
           value.encode("utf-8") if value_format == "str" else json.dumps(value, ensure_ascii=False).encode())
    return {**line, **_value_field(raw, fmt or ("str" if value_format == "str" else "auto"))}


def _deletion_in_log(store: StateStore, key: bytes, partitions: Iterable[int], data_dir: Path,
                     topic: str) -> Deletion | None:
    """Where the local log still shows ``key``'s tombstone (:func:`materializer.deletions.deletion_of`;
    the log engine is imported only when a key is absent)."""
    from materializer.deletions import DataDirLogs, deletion_of

    return deletion_of(store, key, partitions, DataDirLogs(data_dir, topic))


def _deletion_from(deleted: Mapping[str, Any]) -> Deletion:
    """A member's ``deleted`` answer (partition, offset, timestamp or null) as a :class:`~materializer.deletions.Deletion`."""
    from materializer.deletions import Deletion

    timestamp = deleted.get("timestamp")
    return Deletion(int(deleted["partition"]), int(deleted["offset"]), -1 if timestamp is None else int(timestamp))


def _deleted_at(deletion: Deletion) -> str:
    """How ``get`` says a key's tombstone is still in the local log (:mod:`materializer.deletions`)."""
    when = "" if deletion.timestamp < 0 else f", timestamp {deletion.timestamp}"
    return f"deleted at offset {deletion.offset} (partition {deletion.partition}{when})"


def _group_owners(served: ServedPartitions, bootstrap_servers: str | None,
                  config: Mapping[str, str]) -> Callable[[], Mapping[int, PartitionOwner]]:
    """``get``'s lookup of who holds each partition of a group member's topic now, asked only when
    the read is refused (:func:`materializer.group.routing.owner_of`'s request)."""

    def owners() -> Mapping[int, PartitionOwner]:
        from materializer.adapters.group_members import GroupMembersClient

        return GroupMembersClient(bootstrap_servers, config).partition_owners(served.group_id, served.topic)

    return owners


def _key_bytes(key: str, encoding: str, key_format: str, topic: str, registry: object) -> bytes:
    if key_format in ("bytes", "str"):
        return parse_key(key, encoding)
    try:
        datum = json.loads(key)
    except json.JSONDecodeError as exc:
        raise ValueError(f"KEY must be JSON for --key-format {key_format}: {exc}") from exc
    return make_serde(key_format, topic=topic, field="key", schema_registry=registry).encode(datum)
