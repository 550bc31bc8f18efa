//! Kafka's LZ4 records stream, decompressed without leaving native code.
//!
//! A v2 batch compressed with lz4 holds its records section as one LZ4 frame
//! (`org.apache.kafka.common.compress.Lz4BlockInputStream`; `storage/compression.py` documents
//! the layout):
//!
//! ```text
//! Magic:UInt32LE(0x184D2204) FLG:Int8 BD:Int8 [ContentSize:UInt64LE] HC:Int8
//! Block* => Size:UInt32LE (bit 31 = stored uncompressed) Data [BlockChecksum:UInt32LE]
//! EndMark:UInt32LE(0) [ContentChecksum:UInt32LE]
//! ```
//!
//! Only the frames Kafka's reader takes are read here: version 01, independent blocks, reserved
//! bits zero, no dictionary id, a block size code of 4..7. Anything else is an error, and the
//! Python caller then decompresses that batch with its general decoder
//! (`storage/compression.py`), which also names the file and position of a stream that is
//! really broken. As in Kafka's reader a block size of 0 (with or without the uncompressed bit)
//! ends the frame. Unlike it, the header checksum byte and block checksums are not verified:
//! the batch CRC, checked when the batch was appended, covers every byte, and the broker's own
//! reader verified them when the batch was produced.

const MAGIC: u32 = 0x184D_2204;
const FLG_VERSION_SHIFT: u8 = 6;
const FLG_BLOCK_INDEPENDENCE: u8 = 0x20;
const FLG_BLOCK_CHECKSUM: u8 = 0x10;
const FLG_CONTENT_SIZE: u8 = 0x08;
const FLG_CONTENT_CHECKSUM: u8 = 0x04;
const FLG_DICT_ID: u8 = 0x01;
const FLG_RESERVED: u8 = 0x02;
/// BD: bit 7 and bits 0-3 are reserved
const BD_RESERVED: u8 = 0x8F;
const STORED_UNCOMPRESSED: u32 = 0x8000_0000;

/// Bytes a block may decompress to, from the BD byte's block maximum size code (4..7).
fn block_max_bytes(bd: u8) -> Result<usize, String> {
    match (bd >> 4) & 0x07 {
        4 => Ok(64 << 10),
        5 => Ok(256 << 10),
        6 => Ok(1 << 20),
        7 => Ok(4 << 20),
        code => Err(format!("lz4 frame has an invalid block maximum size code {code}")),
    }
}

fn u32_at(src: &[u8], pos: usize) -> Result<u32, String> {
    src.get(pos..pos + 4)
        .map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")))
        .ok_or_else(|| format!("lz4 frame of {} bytes ends inside a 4-byte field at position {pos}", src.len()))
}

/// A reusable output buffer: its length only grows (so pages are zeroed once, by the first
/// batch that needs them), `filled` bytes of it hold the current stream.
#[derive(Default)]
pub struct Scratch {
    buf: Vec<u8>,
    filled: usize,
}

impl Scratch {
    /// The stream decompressed by the last [`decompress_into`].
    pub fn bytes(&self) -> &[u8] {
        &self.buf[..self.filled]
    }

    /// `n` writable bytes after what is filled.
    fn spare(&mut self, n: usize) -> &mut [u8] {
        if self.buf.len() < self.filled + n {
            self.buf.resize(self.filled + n, 0);
        }
        &mut self.buf[self.filled..self.filled + n]
    }
}

/// Decompress the Kafka LZ4 frame `src` into `out` (replacing what it held).
///
/// Errors: the frame is not one Kafka's reader takes (version, dependent blocks, dictionary id,
/// block size code) or its bytes end early, a block overruns the frame or its size limit, or a
/// block does not decompress.
pub fn decompress_into(src: &[u8], out: &mut Scratch) -> Result<(), String> {
    out.filled = 0;
    if u32_at(src, 0)? != MAGIC {
        return Err("lz4 frame does not start with the frame magic 0x184D2204".to_string());
    }
    let (&flg, &bd) = (src.get(4).ok_or("lz4 frame ends in its header")?, src.get(5).ok_or("lz4 frame ends in its header")?);
    if flg >> FLG_VERSION_SHIFT != 1 {
        return Err(format!("lz4 frame version {} is not 1", flg >> FLG_VERSION_SHIFT));
    }
    if flg & FLG_BLOCK_INDEPENDENCE == 0 {
        return Err("lz4 frame with dependent blocks".to_string());
    }
    if flg & FLG_DICT_ID != 0 {
        return Err("lz4 frame with a dictionary id".to_string());
    }
    if flg & FLG_RESERVED != 0 || bd & BD_RESERVED != 0 {
        return Err(format!("lz4 frame descriptor sets reserved bits (FLG {flg:#04x}, BD {bd:#04x})"));
    }
    let max_block = block_max_bytes(bd)?;
    let block_checksum = if flg & FLG_BLOCK_CHECKSUM != 0 { 4 } else { 0 };
    // magic, FLG, BD, the optional content size, HC
    let mut pos = 6 + if flg & FLG_CONTENT_SIZE != 0 { 8 } else { 0 } + 1;
    loop {
        let size = u32_at(src, pos)?;
        pos += 4;
        let length = (size & !STORED_UNCOMPRESSED) as usize;
        if length == 0 {
            break; // the end mark (Kafka's reader also ends at a stored block of 0 bytes)
        }
        if length > max_block {
            return Err(format!("lz4 block of {length} bytes at position {pos} exceeds the frame's {max_block}-byte blocks"));
        }
        let block = src.get(pos..pos + length)
            .ok_or_else(|| format!("lz4 block of {length} bytes at position {pos} overruns the {}-byte frame", src.len()))?;
        let written = if size & STORED_UNCOMPRESSED != 0 {
            out.spare(length).copy_from_slice(block);
            length
        } else {
            lz4_flex::block::decompress_into(block, out.spare(max_block))
                .map_err(|e| format!("lz4 block at position {pos} does not decompress: {e}"))?
        };
        out.filled += written;
        pos += length + block_checksum;
    }
    let end = pos + if flg & FLG_CONTENT_CHECKSUM != 0 { 4 } else { 0 };
    if end > src.len() {
        return Err(format!("lz4 frame of {} bytes ends before its content checksum", src.len()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The frame `storage/compression.py` writes: FLG 0x60, BD 0x40, HC 0x82.
    fn kafka_frame(blocks: &[(&[u8], bool)]) -> Vec<u8> {
        let mut frame = vec![0x04, 0x22, 0x4D, 0x18, 0x60, 0x40, 0x82];
        for &(data, stored) in blocks {
            let body = if stored { data.to_vec() } else { lz4_flex::block::compress(data) };
            let size = body.len() as u32 | if stored { STORED_UNCOMPRESSED } else { 0 };
            frame.extend_from_slice(&size.to_le_bytes());
            frame.extend_from_slice(&body);
        }
        frame.extend_from_slice(&[0, 0, 0, 0]);
        frame
    }

    #[test]
    fn reads_compressed_and_stored_blocks() {
        let a: Vec<u8> = (0..60_000u32).map(|i| (i % 251) as u8).collect();
        let b = b"stored as is".to_vec();
        let mut out = Scratch::default();
        decompress_into(&kafka_frame(&[(&a, false), (&b, true)]), &mut out).unwrap();
        assert_eq!(out.bytes(), [a.as_slice(), b.as_slice()].concat());
        // the buffer is reused: a shorter stream leaves nothing of the longer one
        decompress_into(&kafka_frame(&[(&b, true)]), &mut out).unwrap();
        assert_eq!(out.bytes(), b.as_slice());
    }

    #[test]
    fn refuses_what_kafka_does_not_write() {
        let mut out = Scratch::default();
        let mut dependent = kafka_frame(&[(b"x", true)]);
        dependent[4] = 0x40;
        assert!(decompress_into(&dependent, &mut out).unwrap_err().contains("dependent"));
        let mut reserved = kafka_frame(&[(b"x", true)]);
        reserved[5] = 0x41;
        assert!(decompress_into(&reserved, &mut out).unwrap_err().contains("reserved"));
        let mut truncated = kafka_frame(&[(&[7u8; 1000], false)]);
        truncated.truncate(truncated.len() - 10);
        assert!(decompress_into(&truncated, &mut out).is_err());
        assert!(decompress_into(b"\x00\x01", &mut out).is_err());
        let mut oversized = kafka_frame(&[(b"x", true)]);
        oversized[7..11].copy_from_slice(&(70_000u32 | STORED_UNCOMPRESSED).to_le_bytes());
        assert!(decompress_into(&oversized, &mut out).unwrap_err().contains("exceeds"));
    }
}
