"""A partition folder's topic identity: the ``partition.metadata`` file (KIP-516).

Format (UTF-8), exactly two lines and **no trailing newline** (Kafka ``PartitionMetadata.encode``)::

    version: 0
    topic_id: 9KOGHmr0RPSRSxPNPI8CZA

The topic id is Kafka's ``Uuid.toString()``: the 16 bytes (most significant long first) in
URL-safe base64 without padding, 22 characters.

Reading (Kafka ``PartitionMetadataReadBuffer``): each of the first two lines is split once on a
colon followed by whitespace (``:\\s+``) into a key and a value; the keys must be ``version`` and
``topic_id`` in that order; the version must be an int32 ``>= 0`` (a higher one is accepted, for
downgrades); the id goes through ``Uuid.fromString`` and must not be the zero uuid. Anything after
the second line is ignored. Lines end at ``\\n``, ``\\r`` or ``\\r\\n`` (``BufferedReader.readLine``).

Writing (Kafka ``PartitionMetadataFile.maybeFlush``): ``partition.metadata.tmp`` is written and
fsynced, renamed over ``partition.metadata``, and (beyond Kafka, which leaves it to the next
flush) the folder is fsynced so the rename survives a crash.

Mirrors ``org.apache.kafka.storage.internals.checkpoint.PartitionMetadataFile``,
``PartitionMetadata``, ``PartitionMetadataReadBuffer`` and ``org.apache.kafka.common.Uuid``.
"""

from __future__ import annotations

import base64
import binascii
import re
import uuid
from pathlib import Path

from .errors import CorruptPartitionMetadataError
from .files import write_file_atomically

__all__ = [
    "CURRENT_PARTITION_METADATA_VERSION",
    "PARTITION_METADATA_FILE",
    "PartitionMetadata",
    "PartitionMetadataFile",
    "ZERO_TOPIC_ID",
    "parse_partition_metadata",
    "topic_id_from_string",
    "topic_id_to_string",
]

PARTITION_METADATA_FILE = "partition.metadata"
CURRENT_PARTITION_METADATA_VERSION = 0
ZERO_TOPIC_ID = uuid.UUID(int=0)
"""Kafka ``Uuid.ZERO_UUID`` (``AAAAAAAAAAAAAAAAAAAAAA``): "no topic id"; never a real topic's."""

_MAX_UUID_STRING_CHARS = 24  # Uuid.fromString refuses longer input before decoding
# java.util.Base64.getUrlDecoder(): the URL-safe alphabet, then at most two '=' pad characters.
_URL_SAFE_BASE64 = re.compile(r"[A-Za-z0-9_-]*(={0,2})")
_KEY_VALUE = re.compile(r":[ \t\n\x0b\f\r]+")  # Java's ":\\s+" (ASCII whitespace only)
_INT32_MAX = 2**31 - 1


def topic_id_to_string(topic_id: uuid.UUID) -> str:
    """Kafka ``Uuid.toString()``: URL-safe base64 of the 16 bytes, no padding (22 characters).

    Raises:
        TypeError: ``topic_id`` is not a ``uuid.UUID``.
    """
    if not isinstance(topic_id, uuid.UUID):
        raise TypeError(f"a topic id is a uuid.UUID, not {type(topic_id).__name__}")
    return base64.urlsafe_b64encode(topic_id.bytes).rstrip(b"=").decode("ascii")


def topic_id_from_string(text: str) -> uuid.UUID:
    """Kafka ``Uuid.fromString``: decode URL-safe base64 into the 16-byte uuid.

    Refused as Kafka refuses them (``IllegalArgumentException`` there): more than 24 characters;
    a character outside the URL-safe alphabet (``+``, ``/``, whitespace...); padding other than a
    complete ``==`` (Java's decoder wants a whole final quantum); a length that cannot be base64
    (one character left over); anything that does not decode to exactly 16 bytes. Like Java's
    decoder, unused low bits of the last character are ignored. The zero uuid is accepted here
    (``Uuid.fromString`` accepts it); ``partition.metadata`` refuses it.

    Raises:
        ValueError: the text is not a topic id (the message quotes it).
        TypeError: ``text`` is not a str.
    """
    if not isinstance(text, str):
        raise TypeError(f"a topic id string is a str, not {type(text).__name__}")
    if len(text) > _MAX_UUID_STRING_CHARS:
        raise ValueError(f"input string with prefix {text[:_MAX_UUID_STRING_CHARS]!r} is too long to be "
                         f"decoded as a base64 topic id")
    match = _URL_SAFE_BASE64.fullmatch(text)
    if match is None:
        raise ValueError(f"input string {text!r} is not URL-safe base64 (A-Z a-z 0-9 - _)")
    padding = len(match.group(1))
    if padding and (len(text) % 4 != 0 or padding != 2):
        raise ValueError(f"input string {text!r} has a wrong base64 ending unit (padding)")
    body = text[: len(text) - padding]
    if len(body) % 4 == 1:
        raise ValueError(f"input string {text!r} has a last base64 unit without enough valid bits")
    try:
        raw = base64.urlsafe_b64decode(body + "=" * (-len(body) % 4))
    except (binascii.Error, ValueError) as exc:  # pragma: no cover - the checks above leave none
        raise ValueError(f"input string {text!r} is not base64: {exc}") from None
    if len(raw) != 16:
        raise ValueError(f"input string {text!r} decoded as {len(raw)} bytes, which is not equal to the "
                         f"expected 16 bytes of a base64-encoded topic id")
    return uuid.UUID(bytes=raw)


class PartitionMetadata:
    """The content of ``partition.metadata``: ``version`` (int, ``>= 0``) and ``topic_id``
    (Kafka ``PartitionMetadata`` record)."""

    __slots__ = ("version", "topic_id")

    def __init__(self, version: int, topic_id: uuid.UUID):
        self.version = version
        self.topic_id = topic_id

    def encode(self) -> str:
        """The file's text: ``version: <v>\\ntopic_id: <22 chars>``, no trailing newline."""
        return f"version: {self.version}\ntopic_id: {topic_id_to_string(self.topic_id)}"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, PartitionMetadata):
            return NotImplemented
        return (self.version, self.topic_id) == (other.version, other.topic_id)

    def __hash__(self) -> int:
        return hash((self.version, self.topic_id))

    def __repr__(self) -> str:
        return f"PartitionMetadata(version={self.version}, topic_id={topic_id_to_string(self.topic_id)})"


def _read_lines(text: str) -> list[str]:
    """Lines as Java's ``BufferedReader.readLine`` returns them (``\\n``, ``\\r``, ``\\r\\n``)."""
    lines = re.split(r"\r\n|\r|\n", text)
    if lines and lines[-1] == "":
        lines.pop()  # a terminator at the very end opens no new line
    return lines


def parse_partition_metadata(text: str, location: str) -> PartitionMetadata:
    """Parse the text of a ``partition.metadata`` file (Kafka ``PartitionMetadataReadBuffer.read``).

    Args:
        text: the file's text.
        location: the file's path, for messages.

    Raises:
        CorruptPartitionMetadataError: a missing or malformed line (the message names
            ``location``, the line number and the line), a negative version, or the zero id.
    """
    lines = _read_lines(text)

    def key_value(number: int, expected_key: str) -> tuple[str, str]:
        if number > len(lines):
            raise CorruptPartitionMetadataError(
                f"malformed line in partition metadata file {location}: line {number} is missing "
                f"(expected {expected_key}: ...)", path=location, line=number)
        line = lines[number - 1]
        parts = _KEY_VALUE.split(line, maxsplit=1)
        if len(parts) != 2 or parts[0] != expected_key:
            raise CorruptPartitionMetadataError(
                f"malformed line in partition metadata file {location}: line {number} is {line!r} "
                f"(expected {expected_key}: ...)", path=location, line=number)
        return line, parts[1]

    line, value = key_value(1, "version")
    if not re.fullmatch(r"[+-]?[0-9]+", value) or not -_INT32_MAX - 1 <= int(value) <= _INT32_MAX:
        raise CorruptPartitionMetadataError(
            f"malformed line in partition metadata file {location}: line 1 is {line!r} (the version is not "
            f"an int32)", path=location, line=1)
    version = int(value)
    if version < CURRENT_PARTITION_METADATA_VERSION:
        raise CorruptPartitionMetadataError(
            f"unrecognized version of partition metadata file {location}: {version} (line 1)", path=location, line=1)
    line, value = key_value(2, "topic_id")
    try:
        topic_id = topic_id_from_string(value)
    except ValueError as exc:
        raise CorruptPartitionMetadataError(
            f"malformed line in partition metadata file {location}: line 2 is {line!r} ({exc})",
            path=location, line=2) from None
    if topic_id == ZERO_TOPIC_ID:
        raise CorruptPartitionMetadataError(
            f"invalid topic id in partition metadata file {location}: line 2 holds the zero uuid",
            path=location, line=2)
    return PartitionMetadata(version, topic_id)


class PartitionMetadataFile:
    """``<dir_path>/partition.metadata``: read and (atomically) write a partition's topic id.

    Not thread-safe; the owning ``Log`` serializes writers with ``Log.lock``.
    """

    def __init__(self, dir_path: Path):
        self.dir = Path(dir_path)
        self.path = self.dir / PARTITION_METADATA_FILE

    def exists(self) -> bool:
        """True when ``partition.metadata`` exists."""
        return self.path.exists()

    def read_metadata(self) -> PartitionMetadata | None:
        """The whole file's content, or None when the file is missing.

        Raises:
            CorruptPartitionMetadataError: the file is malformed or not UTF-8 (file and line named).
            OSError: the file exists but cannot be read.
        """
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return None
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            line = raw.count(b"\n", 0, exc.start) + 1
            raise CorruptPartitionMetadataError(
                f"partition metadata file {self.path} is not UTF-8 text: byte position {exc.start} (line {line}) "
                f"holds 0x{raw[exc.start]:02x}", path=str(self.path), line=line) from None
        return parse_partition_metadata(text, str(self.path))

    def read(self) -> uuid.UUID | None:
        """The topic id the file holds, or None when the file is missing.

        Raises:
            CorruptPartitionMetadataError: the file is malformed (file and line named).
            OSError: the file exists but cannot be read.
        """
        metadata = self.read_metadata()
        return None if metadata is None else metadata.topic_id

    def write(self, topic_id: uuid.UUID) -> None:
        """Write ``version: 0`` and ``topic_id`` (byte-equal to Kafka's file): ``partition.metadata.tmp``,
        fsync, atomic rename, fsync of the folder.

        Raises:
            ValueError: ``topic_id`` is the zero uuid (a file no reader would accept).
            TypeError: ``topic_id`` is not a ``uuid.UUID``.
            OSError: the write, fsync or rename failed (the message names the file).
        """
        if not isinstance(topic_id, uuid.UUID):
            raise TypeError(f"a topic id is a uuid.UUID, not {type(topic_id).__name__}")
        if topic_id == ZERO_TOPIC_ID:
            raise ValueError(f"cannot write the zero topic id to {self.path}")
        text = PartitionMetadata(CURRENT_PARTITION_METADATA_VERSION, topic_id).encode()
        write_file_atomically(self.path, text.encode("utf-8"))

    def delete(self) -> None:
        """Remove the file (no error when it is missing)."""
        self.path.unlink(missing_ok=True)

    def __repr__(self) -> str:
        return f"PartitionMetadataFile(path={str(self.path)!r})"
