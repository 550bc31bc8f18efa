"""Record-batch codecs: round trips and the exact stream framings Java Kafka reads."""

from __future__ import annotations

import os
import struct

import cramjam
import pytest

from materializer.storage.compression import (
    LZ4_FRAME_HEADER,
    XERIAL_SNAPPY_HEADER,
    CompressionType,
    compress,
    decompress,
)

PAYLOADS = {
    "empty": b"",
    "one-byte": b"a",
    "text": b"the quick brown fox " * 50,
    "random": os.urandom(5000),
    "multi-block": (os.urandom(1000) + b"z" * 3000) * 60,  # 240 KB: several lz4/snappy blocks
}


@pytest.mark.parametrize("ctype", list(CompressionType))
@pytest.mark.parametrize("name", list(PAYLOADS))
def test_round_trip(ctype: CompressionType, name: str) -> None:
    data = PAYLOADS[name]
    compressed = compress(ctype, data)
    assert decompress(ctype, compressed) == data
    assert decompress(ctype, memoryview(compressed)) == data
    assert decompress(int(ctype), bytearray(compressed)) == data


def test_names() -> None:
    assert [c.name_kafka for c in CompressionType] == ["none", "gzip", "snappy", "lz4", "zstd"]
    assert [int(c) for c in CompressionType] == [0, 1, 2, 3, 4]
    for c in CompressionType:
        assert CompressionType.from_name(c.name_kafka) is c
    assert CompressionType.from_name("producer") is CompressionType.NONE
    assert CompressionType.from_name("uncompressed") is CompressionType.NONE
    assert CompressionType.from_name("ZSTD") is CompressionType.ZSTD
    with pytest.raises(ValueError, match="unknown compression type 'brotli'"):
        CompressionType.from_name("brotli")


def test_unknown_codec_id() -> None:
    with pytest.raises(ValueError):
        compress(5, b"x")
    with pytest.raises(ValueError):
        decompress(7, b"x")


# --- snappy: xerial framing (SnappyOutputStream) ---------------------------------------


def parse_xerial(stream: bytes) -> list[bytes]:
    assert stream[:8] == b"\x82SNAPPY\x00"
    assert struct.unpack(">ii", stream[8:16]) == (1, 1)  # version, minimum compatible version
    blocks, pos = [], 16
    while pos < len(stream):
        (length,) = struct.unpack_from(">i", stream, pos)
        blocks.append(stream[pos + 4 : pos + 4 + length])
        pos += 4 + length
    assert pos == len(stream)
    return blocks


def test_snappy_writes_xerial_frame() -> None:
    assert XERIAL_SNAPPY_HEADER == bytes.fromhex("82534e41505059000000000100000001")
    data = PAYLOADS["multi-block"]
    blocks = parse_xerial(compress(CompressionType.SNAPPY, data))
    assert len(blocks) == -(-len(data) // (32 * 1024))  # 32 KiB of input per block
    assert b"".join(bytes(cramjam.snappy.decompress_raw(b)) for b in blocks) == data


def test_snappy_reads_raw_stream() -> None:
    # librdkafka producers write bare raw snappy; xerial's SnappyInputStream accepts it
    data = PAYLOADS["text"]
    raw = bytes(cramjam.snappy.compress_raw(data))
    assert decompress(CompressionType.SNAPPY, raw) == data


def test_snappy_reads_concatenated_xerial_streams() -> None:
    first, second = b"first part " * 10, b"second part " * 10
    stream = compress(CompressionType.SNAPPY, first) + compress(CompressionType.SNAPPY, second)
    assert decompress(CompressionType.SNAPPY, stream) == first + second


def test_snappy_truncated_xerial_stream() -> None:
    stream = compress(CompressionType.SNAPPY, PAYLOADS["text"])
    with pytest.raises(ValueError, match="overruns the stream"):
        decompress(CompressionType.SNAPPY, stream[:-3])


# --- lz4: the frame KafkaLZ4BlockInputStream accepts ----------------------------------


def lz4_block_decode(block: bytes) -> bytes:
    """Minimal LZ4 block decoder (independent of cramjam) for the frame checks below."""
    out = bytearray()
    pos = 0
    while True:
        token = block[pos]
        pos += 1
        literal_length = token >> 4
        if literal_length == 15:
            while True:
                extra = block[pos]
                pos += 1
                literal_length += extra
                if extra != 255:
                    break
        out += block[pos : pos + literal_length]
        pos += literal_length
        if pos == len(block):  # the last sequence has literals only
            return bytes(out)
        distance = block[pos] | (block[pos + 1] << 8)
        pos += 2
        match_length = token & 0x0F
        if match_length == 15:
            while True:
                extra = block[pos]
                pos += 1
                match_length += extra
                if extra != 255:
                    break
        for _ in range(match_length + 4):  # byte by byte: matches may overlap
            out.append(out[-distance])


def kafka_lz4_reader_accepts(frame: bytes) -> bytes:
    """Re-statement of KafkaLZ4BlockInputStream's header checks and block walk."""
    assert struct.unpack_from("<I", frame, 0)[0] == 0x184D2204
    flg, bd = frame[4], frame[5]
    assert flg & 0b11 == 0, "reserved bits (incl. dict id) must be 0"
    assert (flg >> 5) & 1 == 1, "dependent block stream is unsupported"
    assert (flg >> 6) & 3 == 1, "version must be 1"
    assert bd & 0x8F == 0 and 4 <= (bd >> 4) & 7 <= 7
    max_block = 1 << (2 * ((bd >> 4) & 7) + 8)
    pos = 6 + (8 if (flg >> 3) & 1 else 0) + 1  # content size, then HC byte
    out = []
    while True:
        (word,) = struct.unpack_from("<I", frame, pos)
        pos += 4
        size = word & 0x7FFFFFFF
        if size == 0:
            pos += 4 if (flg >> 2) & 1 else 0
            break
        assert size <= max_block
        block = frame[pos : pos + size]
        pos += size + (4 if (flg >> 4) & 1 else 0)
        if word & 0x80000000:
            out.append(block)
        else:
            decoded = lz4_block_decode(block)
            assert len(decoded) <= max_block
            out.append(decoded)
    assert pos == len(frame)
    return b"".join(out)


@pytest.mark.parametrize("name", list(PAYLOADS))
def test_lz4_frame_is_kafka_compatible(name: str) -> None:
    data = PAYLOADS[name]
    frame = compress(CompressionType.LZ4, data)
    assert frame.startswith(LZ4_FRAME_HEADER)
    assert LZ4_FRAME_HEADER == bytes.fromhex("04224d18604082")
    assert kafka_lz4_reader_accepts(frame) == data
    # liblz4 verifies the header checksum byte, so this also proves HC = 0x82 is right
    assert bytes(cramjam.lz4.decompress(frame)) == data


def test_lz4_incompressible_block_stored_raw() -> None:
    data = os.urandom(1000)
    frame = compress(CompressionType.LZ4, data)
    (word,) = struct.unpack_from("<I", frame, 7)
    assert word == 0x80000000 | 1000
    assert frame[11:1011] == data


def test_lz4_reads_other_writers_frames() -> None:
    # e.g. librdkafka / liblz4 defaults: linked blocks, content checksum
    data = PAYLOADS["multi-block"]
    frame = bytes(cramjam.lz4.compress(data))
    assert decompress(CompressionType.LZ4, frame) == data


# --- gzip / zstd -----------------------------------------------------------------------


def test_gzip_multi_member() -> None:
    stream = compress(CompressionType.GZIP, b"abc") + compress(CompressionType.GZIP, b"def")
    assert stream[:2] == b"\x1f\x8b"
    assert decompress(CompressionType.GZIP, stream) == b"abcdef"


def test_zstd_streaming_frame_without_content_size() -> None:
    compressor = cramjam.zstd.Compressor()
    compressor.compress(PAYLOADS["text"])
    frame = bytes(compressor.finish())
    assert decompress(CompressionType.ZSTD, frame) == PAYLOADS["text"]


@pytest.mark.parametrize("ctype", [c for c in CompressionType if c != CompressionType.NONE])
def test_garbage_raises_value_error(ctype: CompressionType) -> None:
    with pytest.raises(ValueError):
        decompress(ctype, b"\x00\x01garbage that is not a stream" * 3)
