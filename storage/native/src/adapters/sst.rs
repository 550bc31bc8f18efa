//! A writer of RocksDB SST files (BlockBasedTable format) for a sorted run of puts, so a state
//! store rebuild writes its file without one Python object (or rocksdict call) per key.
//!
//! Follows RocksDB 9.8 (the one inside rocksdict 0.3.29), re-expressed from its sources:
//! `table/block_based/block_builder.cc` (BlockBuilder: prefix-compressed entries with restart
//! points), `table/block_based/block_based_table_builder.cc` (BlockBasedTableBuilder: data blocks
//! cut at the block size, one index entry per data block, block trailer, compression kept only
//! when it saves 1/8), `table/meta_blocks.cc` (PropertyBlockBuilder, MetaIndexBuilder),
//! `table/format.cc` (BlockHandle, Footer of format_version 1..5) and `table/sst_file_writer.cc`
//! (what SstFileWriter adds for `IngestExternalFile`: sequence number 0, the
//! `rocksdb.external_sst_file.version` 2 and `.global_seqno` 0 properties).
//!
//! File layout: data blocks | index block | properties block | metaindex block | footer.
//! Every block is followed by a 5-byte trailer: compression type (0 none, 4 LZ4) and the masked
//! CRC32C of the block contents plus that type byte. The file declares format_version 5 with
//! CRC32C checksums: its footer (unlike format_version 6's) carries the index handle itself and
//! block checksums do not depend on the block's offset.
//! What is left out, all optional to a reader: filters, index key shortening
//! (`FindShortestSeparator`; each index key is the block's last key), db/session identities
//! (without them RocksDB keys its block cache by the ingesting DB's session and file number).

use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::Path;

/// Block compression of the data blocks (`CompressionType`: kNoCompression 0, kLZ4Compression 4).
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Compression {
    None,
    Lz4,
}

impl Compression {
    /// The store's compression name ("none", "lz4"); `None` for one this writer does not write.
    pub fn from_name(name: &str) -> Option<Compression> {
        match name {
            "none" => Some(Compression::None),
            "lz4" => Some(Compression::Lz4),
            _ => None,
        }
    }

    /// `rocksdb.compression` property value (`CompressionTypeToString`).
    fn property_name(self) -> &'static str {
        match self {
            Compression::None => "NoCompression",
            Compression::Lz4 => "LZ4",
        }
    }
}

const NO_COMPRESSION: u8 = 0;
const LZ4_COMPRESSION: u8 = 4;
/// `kCRC32c` in the footer's checksum type byte.
const CHECKSUM_CRC32C: u8 = 1;
const FORMAT_VERSION: u32 = 5;
/// `kBlockBasedTableMagicNumber`.
const MAGIC: u64 = 0x88e2_41b7_85f4_cff7;
/// `BlockBasedTableOptions::block_restart_interval` default; index and meta blocks restart every entry.
const DATA_RESTART_INTERVAL: usize = 16;
/// `max_compressed_bytes_per_kb` default: a compressed block is kept only at <= 7/8 of its size.
const MAX_COMPRESSED_BYTES_PER_KB: usize = 896;
/// Internal key trailer of a put: (sequence number 0 << 8) | kTypeValue (1), fixed64 LE.
const VALUE_TRAILER: [u8; 8] = [1, 0, 0, 0, 0, 0, 0, 0];
/// Internal key trailer of a delete: (sequence number 0 << 8) | kTypeDeletion (0), as
/// `SstFileWriter::Delete` writes it; its value is empty.
const DELETION_TRAILER: [u8; 8] = [0; 8];
/// `TablePropertiesCollectorFactory::Context::kUnknownColumnFamily` (what SstFileWriter records).
const UNKNOWN_COLUMN_FAMILY: u64 = 0x7fff_ffff;

fn put_varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push((value as u8) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

/// `BlockHandle`: where a block is (its trailer not counted in `size`).
#[derive(Clone, Copy, Default)]
struct BlockHandle {
    offset: u64,
    size: u64,
}

impl BlockHandle {
    /// `BlockHandle::EncodeTo`: varint64 offset, varint64 size.
    fn encode(self, out: &mut Vec<u8>) {
        put_varint(out, self.offset);
        put_varint(out, self.size);
    }
}

/// `BlockBuilder`: entries `varint32 shared, varint32 unshared, varint32 value length, key
/// suffix, value`, the key stored whole (shared 0) at every restart point; then the restart
/// offsets and their count, fixed32 LE (the count's top bit 0: binary-search data block index).
struct BlockBuilder {
    buffer: Vec<u8>,
    restarts: Vec<u32>,
    since_restart: usize,
    restart_interval: usize,
    last_key: Vec<u8>,
    entries: usize,
}

impl BlockBuilder {
    fn new(restart_interval: usize) -> Self {
        BlockBuilder { buffer: Vec::new(), restarts: vec![0], since_restart: 0, restart_interval,
                       last_key: Vec::new(), entries: 0 }
    }

    /// Adds `key` (already after the previous key) with `value`.
    fn add(&mut self, key: &[u8], value: &[u8]) {
        let shared = if self.since_restart < self.restart_interval {
            self.last_key.iter().zip(key).take_while(|(a, b)| a == b).count()
        } else {
            self.restarts.push(self.buffer.len() as u32);
            self.since_restart = 0;
            0
        };
        put_varint(&mut self.buffer, shared as u64);
        put_varint(&mut self.buffer, (key.len() - shared) as u64);
        put_varint(&mut self.buffer, value.len() as u64);
        self.buffer.extend_from_slice(&key[shared..]);
        self.buffer.extend_from_slice(value);
        self.last_key.clear();
        self.last_key.extend_from_slice(key);
        self.since_restart += 1;
        self.entries += 1;
    }

    /// `BlockBuilder::CurrentSizeEstimate`: the finished block's size.
    fn size_estimate(&self) -> usize {
        self.buffer.len() + 4 * self.restarts.len() + 4
    }

    /// `BlockBuilder::Finish`: appends the restart array; the builder is then `reset`.
    fn finish(&mut self) -> &[u8] {
        for restart in &self.restarts {
            self.buffer.extend_from_slice(&restart.to_le_bytes());
        }
        self.buffer.extend_from_slice(&(self.restarts.len() as u32).to_le_bytes());
        &self.buffer
    }

    fn reset(&mut self) {
        self.buffer.clear();
        self.restarts.clear();
        self.restarts.push(0);
        self.since_restart = 0;
        self.last_key.clear();
        self.entries = 0;
    }
}

/// `crc32c::Mask`: the stored form of a CRC32C (a CRC of data holding CRCs stays meaningful).
fn masked_crc32c(contents: &[u8], block_type: u8) -> u32 {
    let crc = crc32c::crc32c_append(crc32c::crc32c(contents), &[block_type]);
    (crc.rotate_right(15)).wrapping_add(0xa282_ead8)
}

/// Writes one file; `finish` completes it (`BlockBasedTableBuilder`).
struct TableWriter {
    out: BufWriter<File>,
    offset: u64,
    compression: Compression,
    compressed: Vec<u8>,
}

impl TableWriter {
    /// `BlockBasedTableBuilder::WriteBlock` / `WriteMaybeCompressedBlock`: the block, LZ4
    /// compressed when asked and worth it, then its trailer. Returns its handle.
    fn write_block(&mut self, contents: &[u8], compress: bool) -> io::Result<BlockHandle> {
        let (body, block_type) = if compress && self.compression == Compression::Lz4 && self.lz4(contents) {
            (&self.compressed[..], LZ4_COMPRESSION)
        } else {
            (contents, NO_COMPRESSION)
        };
        let handle = BlockHandle { offset: self.offset, size: body.len() as u64 };
        self.out.write_all(body)?;
        self.out.write_all(&[block_type])?;
        self.out.write_all(&masked_crc32c(body, block_type).to_le_bytes())?;
        self.offset += body.len() as u64 + 5;
        Ok(handle)
    }

    /// `LZ4_Compress` with compress_format_version 2 (format_version >= 2): varint32 of the
    /// uncompressed size, then one LZ4 block. False when it does not save enough
    /// (`GoodCompressionRatio`), as RocksDB then stores the block uncompressed.
    fn lz4(&mut self, contents: &[u8]) -> bool {
        self.compressed.clear();
        put_varint(&mut self.compressed, contents.len() as u64);
        let header = self.compressed.len();
        self.compressed.resize(header + lz4_flex::block::get_maximum_output_size(contents.len()), 0);
        let Ok(written) = lz4_flex::block::compress_into(contents, &mut self.compressed[header..]) else {
            return false;
        };
        self.compressed.truncate(header + written);
        self.compressed.len() <= (MAX_COMPRESSED_BYTES_PER_KB * contents.len()) >> 10
    }
}

/// Counters for the properties block (`TableProperties`).
#[derive(Default)]
struct Counts {
    entries: u64,
    deletions: u64,
    data_blocks: u64,
    raw_key_bytes: u64,
    raw_value_bytes: u64,
}

/// Writes `entries` (user keys strictly ascending in bytewise order, each with its value, or
/// `None` for a delete) to a new SST file at `path` that `IngestExternalFile` accepts, data
/// blocks cut at `block_size` bytes (uncompressed). Returns the number of entries written.
///
/// A delete hides every older value of its key once the file is ingested (RocksDB gives the
/// file a sequence number above what the store holds), as a `WriteBatch` delete would.
///
/// Errors: `InvalidInput` for no entries (RocksDB ingests no empty file) or a key not above
/// the previous one (named by position); any I/O error of creating or writing `path`.
pub fn write_sst<'a>(path: &Path, entries: impl IntoIterator<Item = (&'a [u8], Option<&'a [u8]>)>,
                     compression: Compression, block_size: usize) -> io::Result<u64> {
    let mut table = TableWriter { out: BufWriter::with_capacity(1 << 20, File::create(path)?), offset: 0,
                                  compression, compressed: Vec::new() };
    let mut data = BlockBuilder::new(DATA_RESTART_INTERVAL);
    let mut index = BlockBuilder::new(1);
    let mut handle = Vec::with_capacity(20);
    let mut counts = Counts::default();
    let mut internal_key = Vec::new();
    let mut previous: Option<&[u8]> = None;
    for (key, value) in entries {
        if previous.is_some_and(|p| p >= key) {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, format!(
                "{}: entry {} is not above the previous key (SST keys must ascend without duplicates)",
                path.display(), counts.entries)));
        }
        previous = Some(key);
        // FlushBlockBySizePolicy, simplified: cut the block once it has reached block_size
        if data.entries > 0 && data.size_estimate() >= block_size {
            flush_data_block(&mut table, &mut data, &mut index, &mut handle, &mut counts)?;
        }
        internal_key.clear();
        internal_key.extend_from_slice(key);
        internal_key.extend_from_slice(if value.is_some() { &VALUE_TRAILER } else { &DELETION_TRAILER });
        counts.deletions += u64::from(value.is_none());
        let value = value.unwrap_or_default();
        data.add(&internal_key, value);
        counts.entries += 1;
        counts.raw_key_bytes += internal_key.len() as u64;
        counts.raw_value_bytes += value.len() as u64;
    }
    if counts.entries == 0 {
        drop(table);
        let _ = std::fs::remove_file(path);
        return Err(io::Error::new(io::ErrorKind::InvalidInput,
                                  format!("{}: no entries (RocksDB ingests no empty SST file)", path.display())));
    }
    flush_data_block(&mut table, &mut data, &mut index, &mut handle, &mut counts)?;
    let data_size = table.offset;
    let index_handle = table.write_block(index.finish(), false)?;
    let properties = properties_block(&counts, compression, data_size, index_handle.size + 5);
    let properties_handle = table.write_block(&properties, false)?;
    // MetaIndexBuilder: meta block name -> handle; only the properties block here
    let mut metaindex = BlockBuilder::new(1);
    handle.clear();
    properties_handle.encode(&mut handle);
    metaindex.add(b"rocksdb.properties", &handle);
    let metaindex_handle = table.write_block(metaindex.finish(), false)?;
    table.out.write_all(&footer(metaindex_handle, index_handle))?;
    // not fsynced here: IngestExternalFile syncs the file it links into the store
    // (ExternalSstFileIngestionJob::Prepare), as it does for SstFileWriter's
    table.out.flush()?;
    Ok(counts.entries)
}

/// Writes the data block and adds its index entry: its last internal key -> its handle.
fn flush_data_block(table: &mut TableWriter, data: &mut BlockBuilder, index: &mut BlockBuilder,
                    handle: &mut Vec<u8>, counts: &mut Counts) -> io::Result<()> {
    let block = table.write_block(data.finish(), true)?;
    handle.clear();
    block.encode(handle);
    index.add(&data.last_key, handle);
    data.reset();
    counts.data_blocks += 1;
    Ok(())
}

/// `PropertyBlockBuilder`: the table properties as a block of name -> value, names ascending
/// (RocksDB refuses "properties unsorted"). Numbers are varint64 unless noted; the two
/// `external_sst_file` ones are fixed-width, as `SstFileWriter`'s property collector writes them.
fn properties_block(counts: &Counts, compression: Compression, data_size: u64, index_size: u64) -> Vec<u8> {
    let varint = |value: u64| {
        let mut out = Vec::new();
        put_varint(&mut out, value);
        out
    };
    let mut properties: Vec<(&str, Vec<u8>)> = vec![
        // BlockBasedTablePropertiesCollector: kBinarySearch index, fixed32
        ("rocksdb.block.based.table.index.type", 0u32.to_le_bytes().to_vec()),
        ("rocksdb.column.family.id", varint(UNKNOWN_COLUMN_FAMILY)),
        ("rocksdb.comparator", b"leveldb.BytewiseComparator".to_vec()),
        ("rocksdb.compression", compression.property_name().as_bytes().to_vec()),
        ("rocksdb.data.size", varint(data_size)),
        ("rocksdb.deleted.keys", varint(counts.deletions)),
        // ExternalSstFilePropertyNames: kGlobalSeqno fixed64, kVersion fixed32
        ("rocksdb.external_sst_file.global_seqno", 0u64.to_le_bytes().to_vec()),
        ("rocksdb.external_sst_file.version", 2u32.to_le_bytes().to_vec()),
        ("rocksdb.filter.size", varint(0)),
        ("rocksdb.fixed.key.length", varint(0)),
        ("rocksdb.index.key.is.user.key", varint(0)),
        ("rocksdb.index.size", varint(index_size)),
        ("rocksdb.index.value.is.delta.encoded", varint(0)),
        ("rocksdb.key.largest.seqno", varint(0)),
        ("rocksdb.merge.operands", varint(0)),
        ("rocksdb.num.data.blocks", varint(counts.data_blocks)),
        ("rocksdb.num.entries", varint(counts.entries)),
        ("rocksdb.num.range-deletions", varint(0)),
        ("rocksdb.raw.key.size", varint(counts.raw_key_bytes)),
        ("rocksdb.raw.value.size", varint(counts.raw_value_bytes)),
    ];
    properties.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
    let mut block = BlockBuilder::new(1);
    for (name, value) in &properties {
        block.add(name.as_bytes(), value);
    }
    block.finish().to_vec()
}

/// `Footer::EncodeTo` for format_version 1..5 (53 bytes): checksum type, metaindex and index
/// handles zero-padded to 40 bytes, format_version fixed32, magic number fixed64.
fn footer(metaindex: BlockHandle, index: BlockHandle) -> Vec<u8> {
    let mut out = vec![CHECKSUM_CRC32C];
    metaindex.encode(&mut out);
    index.encode(&mut out);
    out.resize(1 + 40, 0);
    out.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    out.extend_from_slice(&MAGIC.to_le_bytes());
    out
}
