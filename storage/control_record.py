"""Control records: the key/value schemas of records in control batches (attribute bit 5).

Mirrors Kafka ``ControlRecordType`` and ``EndTransactionMarker``
(``clients/.../common/record/internal``; schemas ``ControlRecordTypeSchema``,
``EndTxnMarker.json`` version 0). All integers big-endian::

    ControlRecordKey => Version => Int16 (0)  Type => Int16
    EndTxnMarker (value of ABORT/COMMIT) => Version => Int16 (0)  CoordinatorEpoch => Int32

Newer key versions are parsed as version 0 (fields may only be appended); a negative
version means corruption. The cleaner never compacts control records by key.
"""

from __future__ import annotations

import struct
from enum import IntEnum
from typing import NamedTuple

__all__ = [
    "CONTROL_RECORD_KEY_VERSION",
    "ControlRecordType",
    "END_TXN_MARKER_VERSION",
    "EndTransactionMarker",
    "control_record_key",
    "decode_end_txn_marker",
    "encode_end_txn_marker",
    "parse_control_record_type",
]

CONTROL_RECORD_KEY_VERSION = 0
END_TXN_MARKER_VERSION = 0

_KEY_STRUCT = struct.Struct(
    ">"
    "h"  # Version => Int16
    "h"  # Type => Int16
)
_END_TXN_STRUCT = struct.Struct(
    ">"
    "h"  # Version => Int16
    "i"  # CoordinatorEpoch => Int32
)


class ControlRecordType(IntEnum):
    """Kafka ``ControlRecordType``; ``UNKNOWN`` stands for a type id this code does not know."""

    UNKNOWN = -1
    ABORT = 0
    COMMIT = 1
    LEADER_CHANGE = 2
    SNAPSHOT_HEADER = 3
    SNAPSHOT_FOOTER = 4
    KRAFT_VERSION = 5
    KRAFT_VOTERS = 6

    @classmethod
    def from_type_id(cls, type_id: int) -> ControlRecordType:
        """Map a type id to a member, ``UNKNOWN`` for ids not listed (``fromTypeId``)."""
        try:
            member = cls(type_id)
        except ValueError:
            return cls.UNKNOWN
        return member if type_id >= 0 else cls.UNKNOWN


class EndTransactionMarker(NamedTuple):
    """A transaction's COMMIT or ABORT marker (Kafka ``EndTransactionMarker``)."""

    control_type: ControlRecordType
    coordinator_epoch: int


def control_record_key(control_type: ControlRecordType | int) -> bytes:
    """The 4-byte key of a control record of ``control_type`` (``ControlRecordType.recordKey``).

    Raises:
        ValueError: ``control_type`` is ``UNKNOWN`` or not a known type id.
    """
    control_type = ControlRecordType(control_type)
    if control_type == ControlRecordType.UNKNOWN:
        raise ValueError("cannot serialize UNKNOWN control record type")
    return _KEY_STRUCT.pack(CONTROL_RECORD_KEY_VERSION, control_type)


def parse_control_record_type(key: bytes | bytearray | memoryview | None) -> ControlRecordType:
    """Type of a control record from its key (``ControlRecordType.parse``).

    Returns ``UNKNOWN`` for a type id this code does not know.

    Raises:
        ValueError: key is ``None`` or shorter than 4 bytes, or its version is negative.
    """
    if key is None or len(key) < _KEY_STRUCT.size:
        size = "null" if key is None else f"{len(key)}-byte"
        raise ValueError(f"invalid control record key: {size} key, expected at least {_KEY_STRUCT.size} bytes")
    version, type_id = _KEY_STRUCT.unpack_from(key, 0)
    if version < CONTROL_RECORD_KEY_VERSION:
        raise ValueError(f"invalid version found for control record: {version}. May indicate data corruption")
    return ControlRecordType.from_type_id(type_id)


def encode_end_txn_marker(
    control_type: ControlRecordType | int, coordinator_epoch: int
) -> tuple[bytes, bytes]:
    """Key and value of an end-transaction marker record (``EndTransactionMarker.serializeValue``).

    Append the pair to a transactional control batch (``is_transactional=True,
    is_control_batch=True``, with the transaction's producer id and epoch).

    Raises:
        ValueError: ``control_type`` is not COMMIT or ABORT, or the epoch is not an int32.
    """
    control_type = ControlRecordType(control_type)
    if control_type not in (ControlRecordType.COMMIT, ControlRecordType.ABORT):
        raise ValueError(f"invalid control record type for end transaction marker {control_type.name}")
    if not -(2**31) <= coordinator_epoch < 2**31:
        raise ValueError(f"coordinator_epoch {coordinator_epoch} does not fit an int32")
    return control_record_key(control_type), _END_TXN_STRUCT.pack(END_TXN_MARKER_VERSION, coordinator_epoch)


def decode_end_txn_marker(
    key: bytes | bytearray | memoryview | None, value: bytes | bytearray | memoryview | None
) -> EndTransactionMarker:
    """Parse an end-transaction marker record (``EndTransactionMarker.deserialize``).

    Raises:
        ValueError: the key is not a COMMIT/ABORT control key, or the value is null,
            shorter than 6 bytes or has a negative version.
    """
    control_type = parse_control_record_type(key)
    if control_type not in (ControlRecordType.COMMIT, ControlRecordType.ABORT):
        raise ValueError(f"invalid control record type for end transaction marker {control_type.name}")
    if value is None or len(value) < _END_TXN_STRUCT.size:
        size = "null" if value is None else f"{len(value)}-byte"
        raise ValueError(f"invalid end transaction marker: {size} value, expected {_END_TXN_STRUCT.size} bytes")
    version, coordinator_epoch = _END_TXN_STRUCT.unpack_from(value, 0)
    if version < END_TXN_MARKER_VERSION:
        raise ValueError(f"invalid version found for end transaction marker: {version}. May indicate data corruption")
    return EndTransactionMarker(control_type, coordinator_epoch)
