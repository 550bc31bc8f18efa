"""Topic configuration of a local log, with Kafka's names and defaults (Kafka ``LogConfig``).

Every field is the snake_case form of the Kafka topic config (``segment.bytes`` ->
``segment_bytes``) with Kafka's default. Conversion to and from Kafka's string configs is done
in one place (``from_kafka_configs`` / ``to_kafka_configs``).

Validation follows Kafka's ``ConfigDef`` validators (types: INT configs at most 2**31 - 1;
ranges as in ``LogConfig``), with two deviations:

* Kafka 4.1+ requires ``segment.bytes >= 1048576`` (1 MiB; tests use the internal
  ``internal.segment.bytes``). This local log accepts any ``segment_bytes >= 14`` so tests can use
  small segments; ``internal.segment.bytes`` is read as a synonym that wins when present.
* Kafka accepts ``segment.index.bytes >= 4``, but below 12 bytes the time index holds no entry
  and the first append fails ("attempt to append to a full time index"); here the minimum is 12.

Mirrors ``org.apache.kafka.storage.internals.log.LogConfig``.
"""

from __future__ import annotations

import json
import random
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Mapping

from .files import write_file_atomically
from .varint import INT32_MAX, INT64_MAX

__all__ = ["LogConfig", "LONG_MAX"]

LONG_MAX = INT64_MAX
"""Java ``Long.MAX_VALUE``: "no limit" for offsets and times."""
_INT_MAX = INT32_MAX  # Kafka's ConfigDef INT type
_MIN_SEGMENT_BYTES = 14  # LegacyRecord.RECORD_OVERHEAD_V0
# One entry of each index: TimeIndex entries are 12 bytes, OffsetIndex entries 8.
_MIN_SEGMENT_INDEX_BYTES = 12
# Kafka's BrokerCompressionType names, plus "none" (the producer codec name) as a synonym of uncompressed.
_COMPRESSION_TYPES = ("uncompressed", "none", "zstd", "lz4", "snappy", "gzip", "producer")

# field name -> Kafka topic config name
_KAFKA_NAMES: dict[str, str] = {
    "cleanup_policy": "cleanup.policy",
    "compression_type": "compression.type",
    "segment_bytes": "segment.bytes",
    "segment_ms": "segment.ms",
    "segment_jitter_ms": "segment.jitter.ms",
    "segment_index_bytes": "segment.index.bytes",
    "index_interval_bytes": "index.interval.bytes",
    "min_cleanable_dirty_ratio": "min.cleanable.dirty.ratio",
    "min_compaction_lag_ms": "min.compaction.lag.ms",
    "max_compaction_lag_ms": "max.compaction.lag.ms",
    "delete_retention_ms": "delete.retention.ms",
    "retention_ms": "retention.ms",
    "retention_bytes": "retention.bytes",
    "file_delete_delay_ms": "file.delete.delay.ms",
    "max_message_bytes": "max.message.bytes",
    "preallocate": "preallocate",
}


@dataclass(frozen=True)
class LogConfig:
    """Topic configuration (units in the names; defaults are Kafka's).

    Attributes:
        cleanup_policy: subset of ("compact", "delete"); empty = keep forever.
        compression_type: Kafka ``compression.type`` ("producer", "gzip", ...).
        segment_bytes: roll when a segment would exceed this many bytes (1 GiB).
        segment_ms: roll when record timestamps span this many ms (7 days).
        segment_jitter_ms: random roll jitter upper bound in ms (0).
        segment_index_bytes: preallocated size of an active .index/.timeindex in bytes (10 MiB).
        index_interval_bytes: bytes between offset index entries (4096).
        min_cleanable_dirty_ratio: dirty/total ratio that makes a log cleanable (0.5).
        min_compaction_lag_ms / max_compaction_lag_ms: compaction lag bounds in ms.
        delete_retention_ms: how long tombstones survive after a cleaning (24 h).
        retention_ms / retention_bytes: delete-policy limits (-1 = unlimited bytes).
        file_delete_delay_ms: delay before ``.deleted`` files are removed (60 s).
        max_message_bytes: largest batch accepted, bytes (1048588).
        preallocate: preallocate new ``.log`` files to ``segment_bytes``.

    Raises (constructor):
        ValueError: a value outside Kafka's validator range.
    """

    cleanup_policy: tuple[str, ...] = ("delete",)
    compression_type: str = "producer"
    segment_bytes: int = 1073741824
    segment_ms: int = 604800000
    segment_jitter_ms: int = 0
    segment_index_bytes: int = 10485760
    index_interval_bytes: int = 4096
    min_cleanable_dirty_ratio: float = 0.5
    min_compaction_lag_ms: int = 0
    max_compaction_lag_ms: int = LONG_MAX
    delete_retention_ms: int = 86400000
    retention_ms: int = 604800000
    retention_bytes: int = -1
    file_delete_delay_ms: int = 60000
    max_message_bytes: int = 1048588
    preallocate: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.cleanup_policy, str):
            object.__setattr__(self, "cleanup_policy", _split_list(self.cleanup_policy))
        else:
            object.__setattr__(self, "cleanup_policy", tuple(self.cleanup_policy))
        for policy in self.cleanup_policy:
            if policy not in ("compact", "delete"):
                raise ValueError(f"invalid cleanup.policy {policy!r}: must be a subset of [compact, delete]")
        if self.compression_type.strip().lower() not in _COMPRESSION_TYPES:
            raise ValueError(f"invalid value {self.compression_type!r} for configuration compression.type: must be "
                             f"one of {', '.join(_COMPRESSION_TYPES)}")
        checks = [
            (_MIN_SEGMENT_BYTES <= self.segment_bytes <= _INT_MAX, "segment.bytes", self.segment_bytes,
             f"in [{_MIN_SEGMENT_BYTES}, {_INT_MAX}]"),
            (self.segment_ms >= 1, "segment.ms", self.segment_ms, ">= 1"),
            (self.segment_jitter_ms >= 0, "segment.jitter.ms", self.segment_jitter_ms, ">= 0"),
            (_MIN_SEGMENT_INDEX_BYTES <= self.segment_index_bytes <= _INT_MAX, "segment.index.bytes",
             self.segment_index_bytes, f"in [{_MIN_SEGMENT_INDEX_BYTES}, {_INT_MAX}] (one entry of each index)"),
            (0 <= self.index_interval_bytes <= _INT_MAX, "index.interval.bytes", self.index_interval_bytes,
             f"in [0, {_INT_MAX}]"),
            (0.0 <= self.min_cleanable_dirty_ratio <= 1.0, "min.cleanable.dirty.ratio",
             self.min_cleanable_dirty_ratio, "in [0, 1]"),
            (self.min_compaction_lag_ms >= 0, "min.compaction.lag.ms", self.min_compaction_lag_ms, ">= 0"),
            (self.max_compaction_lag_ms >= 1, "max.compaction.lag.ms", self.max_compaction_lag_ms, ">= 1"),
            (self.delete_retention_ms >= 0, "delete.retention.ms", self.delete_retention_ms, ">= 0"),
            (self.retention_ms >= -1, "retention.ms", self.retention_ms, ">= -1"),
            (self.file_delete_delay_ms >= 0, "file.delete.delay.ms", self.file_delete_delay_ms, ">= 0"),
            (0 <= self.max_message_bytes <= _INT_MAX, "max.message.bytes", self.max_message_bytes,
             f"in [0, {_INT_MAX}]"),
        ]
        for ok, name, value, rule in checks:
            if not ok:
                raise ValueError(f"invalid value {value} for configuration {name}: must be {rule}")
        if self.min_compaction_lag_ms > self.max_compaction_lag_ms:
            raise ValueError(
                f"conflict: min.compaction.lag.ms {self.min_compaction_lag_ms} is greater than "
                f"max.compaction.lag.ms {self.max_compaction_lag_ms}"
            )

    # -- derived ---------------------------------------------------------------------------

    @property
    def compact(self) -> bool:
        """True if ``cleanup.policy`` includes ``compact``."""
        return "compact" in self.cleanup_policy

    @property
    def delete(self) -> bool:
        """True if ``cleanup.policy`` includes ``delete``."""
        return "delete" in self.cleanup_policy

    @property
    def max_index_size(self) -> int:
        """``segment.index.bytes`` (Kafka ``maxIndexSize``), bytes."""
        return self.segment_index_bytes

    @property
    def init_file_size(self) -> int:
        """Initial ``.log`` file length in bytes: ``segment_bytes`` when preallocating, else 0."""
        return self.segment_bytes if self.preallocate else 0

    def max_segment_ms(self) -> int:
        """Roll time in ms: ``min(max.compaction.lag.ms, segment.ms)`` for compacted topics, else ``segment.ms``."""
        if self.compact and self.max_compaction_lag_ms > 0:
            return min(self.max_compaction_lag_ms, self.segment_ms)
        return self.segment_ms

    def random_segment_jitter_ms(self) -> int:
        """A roll jitter in ``[0, min(segment.jitter.ms, segment.ms))`` ms; 0 when jitter is off."""
        bound = min(self.segment_jitter_ms, self.segment_ms)
        return 0 if bound <= 0 else random.randrange(bound)

    # -- conversion ------------------------------------------------------------------------

    @classmethod
    def from_kafka_configs(cls, configs: Mapping[str, str], base: "LogConfig | None" = None) -> "LogConfig":
        """Build a config from Kafka topic config strings (``{"segment.bytes": "1048576", ...}``).

        Unknown keys are ignored; missing keys keep ``base``'s value (or Kafka's default).
        ``internal.segment.bytes`` overrides ``segment.bytes`` when set.

        Raises:
            ValueError: a value does not parse or is out of range.
        """
        values = asdict(base) if base is not None else {}
        types = {f.name: f.type for f in fields(cls)}
        for field_name, kafka_name in _KAFKA_NAMES.items():
            if kafka_name not in configs or configs[kafka_name] is None:
                continue
            values[field_name] = _parse_value(field_name, types[field_name], configs[kafka_name])
        internal = configs.get("internal.segment.bytes")
        if internal not in (None, "", "null"):
            values["segment_bytes"] = _parse_value("segment_bytes", "int", internal)
        return cls(**values)

    @staticmethod
    def kafka_config_names() -> tuple[str, ...]:
        """The Kafka topic config names this local log follows (plus ``internal.segment.bytes``)."""
        return (*_KAFKA_NAMES.values(), "internal.segment.bytes")

    def to_kafka_configs(self) -> dict[str, str]:
        """Return every field as a Kafka topic config string."""
        out: dict[str, str] = {}
        for field_name, kafka_name in _KAFKA_NAMES.items():
            value = getattr(self, field_name)
            if isinstance(value, tuple):
                out[kafka_name] = ",".join(value)
            elif isinstance(value, bool):
                out[kafka_name] = "true" if value else "false"
            else:
                out[kafka_name] = str(value)
        return out

    def save(self, path: Path) -> None:
        """Write ``to_kafka_configs()`` as JSON to ``path`` atomically (temp file, fsync, rename),
        so a crash never leaves a half-written config beside the log."""
        write_file_atomically(Path(path), (json.dumps(self.to_kafka_configs(), indent=2, sort_keys=True) + "\n")
                              .encode("utf-8"))

    @classmethod
    def load(cls, path: Path) -> "LogConfig":
        """Read a JSON file written by ``save``.

        Raises:
            ValueError: the file is not a JSON object of Kafka config strings.
        """
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        if not isinstance(data, dict):
            raise ValueError(f"{path}: expected a JSON object of Kafka topic configs")
        return cls.from_kafka_configs({str(k): str(v) for k, v in data.items()})


def _split_list(text: str) -> tuple[str, ...]:
    return tuple(part.strip().lower() for part in text.split(",") if part.strip())


def _parse_value(field_name: str, type_name: object, text: str) -> object:
    kind = str(type_name)
    raw = str(text).strip()
    try:
        if "tuple" in kind:
            return _split_list(raw)
        if kind in ("bool", "<class 'bool'>"):
            if raw.lower() not in ("true", "false"):
                raise ValueError(raw)
            return raw.lower() == "true"
        if kind in ("float", "<class 'float'>"):
            return float(raw)
        if kind in ("int", "<class 'int'>"):
            return int(raw)
        return raw
    except ValueError:
        raise ValueError(f"invalid value {text!r} for configuration {_KAFKA_NAMES[field_name]}") from None
