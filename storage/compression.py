"""Record-batch compression codecs, byte-compatible with Java Kafka's.

In a v2 batch the whole records section (everything after the 61-byte header) is
compressed as one stream; attribute bits 0-2 name the codec
(``org.apache.kafka.common.record.CompressionType``)::

    0 none | 1 gzip | 2 snappy | 3 lz4 | 4 zstd

Stream formats, as Kafka's ``org.apache.kafka.common.compress`` package writes them:

* gzip (``GzipCompression``): an RFC 1952 gzip member; level 6 (Deflater default).
* snappy (``SnappyCompression``/``SnappyFactory`` -> xerial ``SnappyOutputStream``)::

      XerialHeader => Magic(8 bytes: 0x82 'S' 'N' 'A' 'P' 'P' 'Y' 0x00)
                      Version => Int32 (1)  CompatibleVersion => Int32 (1)
      Block        => CompressedLength => Int32 (big-endian)  Data => raw snappy

  each block compresses up to 32 KiB of input. xerial ``SnappyInputStream`` also
  accepts a bare raw snappy stream without the header, which is what librdkafka
  producers write; :func:`decompress` reads both.
* lz4 (``Lz4Compression`` -> ``KafkaLZ4BlockOutputStream``/``Lz4BlockOutputStream``):
  the LZ4 frame format v1.5.1 restricted to what ``KafkaLZ4BlockInputStream`` accepts::

      Magic  => Int32 LE 0x184D2204
      FLG    => Int8  version=01, blockIndependence=1, blockChecksum=0,
                       contentSize=0, contentChecksum=0, reserved(incl. dictId)=0  -> 0x60
      BD     => Int8  blockMaxSize=4 (64 KiB)                                     -> 0x40
      HC     => Int8  (xxhash32(FLG, BD) >> 8) & 0xFF                            -> 0x82
      Block  => Size => Int32 LE (bit 31 set = stored uncompressed)  Data
      EndMark=> Int32 LE 0

  Kafka's reader rejects dependent blocks, a dictionary id, a version other than 1
  and block sizes outside 4..7; it skips a content size and ignores a content
  checksum. We write the frame above ourselves (liblz4's default frame uses linked
  blocks, which Kafka refuses). Kafka compresses at level 9 (LZ4 HC); we use the fast
  compressor, which any LZ4 decoder reads.
* zstd (``ZstdCompression``/``ZstdFactory``): a standard zstd frame; level 3.
"""

from __future__ import annotations

from enum import IntEnum

import cramjam

__all__ = [
    "CompressionType",
    "LZ4_FRAME_HEADER",
    "XERIAL_SNAPPY_HEADER",
    "compress",
    "decompress",
]

GZIP_LEVEL = 6
ZSTD_LEVEL = 3

XERIAL_SNAPPY_MAGIC = b"\x82SNAPPY\x00"
XERIAL_SNAPPY_HEADER = XERIAL_SNAPPY_MAGIC + (1).to_bytes(4, "big") + (1).to_bytes(4, "big")
"""xerial ``SnappyCodec`` header: magic, version 1, minimum compatible version 1 (16 bytes)."""
XERIAL_SNAPPY_BLOCK_BYTES = 32 * 1024
"""xerial ``SnappyOutputStream`` default block size (input bytes per compressed block)."""

LZ4_MAGIC = 0x184D2204
LZ4_FLG = 0x60
"""Version 01, independent blocks, no block/content checksum, no content size, no dict id."""
LZ4_BD = 0x40
"""Block maximum size code 4 = 64 KiB (``KafkaLZ4BlockOutputStream.BLOCKSIZE_64KB``)."""
LZ4_HC = 0x82
"""Header checksum byte: second byte of xxhash32(seed 0) over [FLG, BD] = [0x60, 0x40]."""
LZ4_FRAME_HEADER = LZ4_MAGIC.to_bytes(4, "little") + bytes((LZ4_FLG, LZ4_BD, LZ4_HC))
LZ4_BLOCK_BYTES = 64 * 1024
LZ4_INCOMPRESSIBLE_MASK = 0x80000000
_LZ4_END_MARK = bytes(4)


class CompressionType(IntEnum):
    """Kafka ``CompressionType``: the codec id stored in attribute bits 0-2."""

    NONE = 0
    GZIP = 1
    SNAPPY = 2
    LZ4 = 3
    ZSTD = 4

    @property
    def name_kafka(self) -> str:
        """Kafka's name for the codec: ``"none"``, ``"gzip"``, ``"snappy"``, ``"lz4"``, ``"zstd"``."""
        return self.name.lower()

    @classmethod
    def from_name(cls, name: str) -> CompressionType:
        """Parse a ``compression.type`` config value or a codec name (case-insensitive).

        ``"producer"`` (keep the producer's codec) and ``"uncompressed"`` map to ``NONE``.

        Raises:
            ValueError: unknown name.
        """
        key = name.strip().lower()
        if key in ("producer", "uncompressed"):
            return cls.NONE
        for member in cls:
            if member.name_kafka == key:
                return member
        raise ValueError(
            f"unknown compression type {name!r}; expected one of "
            "none, uncompressed, producer, gzip, snappy, lz4, zstd"
        )


def compress(ctype: CompressionType | int, data: bytes | bytearray | memoryview) -> bytes:
    """Compress a records section with ``ctype`` in the stream format Java Kafka writes.

    Raises:
        ValueError: unknown codec id.
    """
    ctype = CompressionType(ctype)
    if ctype == CompressionType.NONE:
        return bytes(data)
    if ctype == CompressionType.GZIP:
        return bytes(cramjam.gzip.compress(data, level=GZIP_LEVEL))
    if ctype == CompressionType.SNAPPY:
        return _xerial_snappy_compress(data)
    if ctype == CompressionType.LZ4:
        return _kafka_lz4_compress(data)
    return bytes(cramjam.zstd.compress(data, level=ZSTD_LEVEL))


def decompress(ctype: CompressionType | int, data: bytes | bytearray | memoryview) -> bytes:
    """Decompress a records section written by any Kafka client or broker.

    Raises:
        ValueError: unknown codec id, or the stream is malformed (message names the codec).
    """
    ctype = CompressionType(ctype)
    try:
        if ctype == CompressionType.NONE:
            return bytes(data)
        if ctype == CompressionType.GZIP:
            return bytes(cramjam.gzip.decompress(data))
        if ctype == CompressionType.SNAPPY:
            return _snappy_decompress(data)
        if ctype == CompressionType.LZ4:
            return bytes(cramjam.lz4.decompress(data))
        return bytes(cramjam.zstd.decompress(data))
    except ValueError:
        raise
    except Exception as exc:  # cramjam raises DecompressionError (not a ValueError)
        raise ValueError(f"cannot decompress {ctype.name_kafka} stream: {exc}") from exc


def _xerial_snappy_compress(data: bytes | bytearray | memoryview) -> bytes:
    view = memoryview(data).cast("B")
    parts = [XERIAL_SNAPPY_HEADER]
    for start in range(0, len(view), XERIAL_SNAPPY_BLOCK_BYTES):
        block = bytes(cramjam.snappy.compress_raw(view[start : start + XERIAL_SNAPPY_BLOCK_BYTES]))
        parts.append(len(block).to_bytes(4, "big"))
        parts.append(block)
    return b"".join(parts)


def _snappy_decompress(data: bytes | bytearray | memoryview) -> bytes:
    view = memoryview(data).cast("B")
    if bytes(view[:8]) != XERIAL_SNAPPY_MAGIC:
        return bytes(cramjam.snappy.decompress_raw(view))
    parts = []
    pos = 0
    end = len(view)
    while pos < end:
        # xerial's reader also accepts concatenated streams, each with its own header.
        if bytes(view[pos : pos + 8]) == XERIAL_SNAPPY_MAGIC:
            pos += len(XERIAL_SNAPPY_HEADER)
            continue
        if pos + 4 > end:
            raise ValueError(f"xerial snappy stream truncated in a block length at position {pos}")
        length = int.from_bytes(view[pos : pos + 4], "big")
        pos += 4
        if length < 0 or pos + length > end:
            raise ValueError(f"xerial snappy block of {length} bytes at position {pos} overruns the stream")
        parts.append(bytes(cramjam.snappy.decompress_raw(view[pos : pos + length])))
        pos += length
    return b"".join(parts)


def _kafka_lz4_compress(data: bytes | bytearray | memoryview) -> bytes:
    view = memoryview(data).cast("B")
    parts = [LZ4_FRAME_HEADER]
    for start in range(0, len(view), LZ4_BLOCK_BYTES):
        raw = view[start : start + LZ4_BLOCK_BYTES]
        block = bytes(cramjam.lz4.compress_block(raw, store_size=False))
        if len(block) >= len(raw):  # incompressible: store as is, flag in the size word
            parts.append((len(raw) | LZ4_INCOMPRESSIBLE_MASK).to_bytes(4, "little"))
            parts.append(bytes(raw))
        else:
            parts.append(len(block).to_bytes(4, "little"))
            parts.append(block)
    parts.append(_LZ4_END_MARK)
    return b"".join(parts)
