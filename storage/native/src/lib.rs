//! `materializer.storage._native`: the hot loops over Kafka v2 record bytes.
//!
//! Only loops over bytes live here; the Python modules of `storage/` stay the API and the
//! readable definition of each format (`record_reference.py` is the reference decoder the
//! tests hold this code to). Every function takes the *uncompressed records section* of one
//! batch (the bytes after the 61-byte batch header) and its header fields.

use pyo3::buffer::PyBuffer;
use pyo3::exceptions::{PyOSError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList, PyString, PyTuple};
use std::mem::MaybeUninit;
use std::sync::Mutex;

// The Kafka log engine's loops (storage/ on the Python side), the adapters' writers
// (RocksDB SST files, Arrow columns for Spark) and the producers' key hashes (clients/, for
// materializer/routing.py) are separate module trees; this file only binds them to Python,
// under the one extension module `materializer.storage._native`.
mod adapters;
mod clients;
mod storage;

use adapters::columns::{BinaryColumn, KafkaColumns};
use adapters::sst;
use clients::partitioner;
use storage::lz4_frame;
use storage::md5_lanes::digest_all;
use storage::offset_map::{digest_of, SkimpyTable};
use storage::records::{self, walk, DecodeResult};

fn value_error(message: String) -> PyErr {
    PyValueError::new_err(message)
}

/// Run `f` over the bytes of `obj` (bytes, bytearray, memoryview, mmap): no copy.
fn with_bytes<R>(obj: &Bound<'_, PyAny>, f: impl FnOnce(&[u8]) -> PyResult<R>) -> PyResult<R> {
    if let Ok(bytes) = obj.downcast::<PyBytes>() {
        return f(bytes.as_bytes());
    }
    let buffer: PyBuffer<u8> = PyBuffer::get(obj)?;
    if !buffer.is_c_contiguous() {
        return Err(PyValueError::new_err("records section buffer is not contiguous"));
    }
    // SAFETY: the buffer is C-contiguous, `len_bytes` long, and kept alive (and exported, so not
    // resized) by `buffer` for the whole call. The cleaner's calls (`map_records`, `retained`,
    // `encode_retained`, `clear`) release the GIL while they only read it: their buffers are
    // the calling thread's own read buffers, which no other thread writes during the call.
    let data = unsafe { std::slice::from_raw_parts(buffer.buf_ptr() as *const u8, buffer.len_bytes()) };
    f(data)
}

fn py_bytes_or_none<'py>(py: Python<'py>, item: Option<&[u8]>) -> Bound<'py, PyAny> {
    match item {
        Some(bytes) => PyBytes::new(py, bytes).into_any(),
        None => py.None().into_bound(py),
    }
}

#[inline(always)]
fn timestamp_of(base_timestamp: i64, delta: i64, log_append_time: Option<i64>) -> i64 {
    log_append_time.unwrap_or_else(|| base_timestamp.wrapping_add(delta))
}

/// Decode `count` records: `(offsets, timestamps, keys, values, headers)`, parallel lists.
///
/// Timestamps are ms (`log_append_time` replaces every one when the batch is LogAppendTime);
/// keys and values are `bytes` or `None`; headers a tuple of `(str, bytes | None)` per record.
/// Raises `ValueError` on any framing error (Kafka `DefaultRecord.readFrom`).
#[pyfunction]
#[pyo3(signature = (data, count, base_offset, base_timestamp, log_append_time))]
fn decode_records<'py>(
    py: Python<'py>,
    data: &Bound<'py, PyAny>,
    count: i64,
    base_offset: i64,
    base_timestamp: i64,
    log_append_time: Option<i64>,
) -> PyResult<Bound<'py, PyTuple>> {
    with_bytes(data, |data| {
        let n = count.max(0) as usize;
        let mut offsets = Vec::with_capacity(n);
        let mut timestamps = Vec::with_capacity(n);
        let keys = PyList::empty(py);
        let values = PyList::empty(py);
        let headers = PyList::empty(py);
        let empty = PyTuple::empty(py);
        let mut failure: Option<PyErr> = None;
        walk(data, count, true, |_, record| {
            offsets.push(base_offset.wrapping_add(record.offset_delta));
            timestamps.push(timestamp_of(base_timestamp, record.timestamp_delta, log_append_time));
            let result = (|| -> PyResult<()> {
                keys.append(py_bytes_or_none(py, record.key))?;
                values.append(py_bytes_or_none(py, record.value))?;
                if record.headers.is_empty() {
                    headers.append(&empty)?;
                } else {
                    let mut items = Vec::with_capacity(record.headers.len());
                    for (key, value) in &record.headers {
                        // Java's new String(bytes, UTF_8) replaces malformed input
                        let key = PyString::new(py, &String::from_utf8_lossy(key));
                        items.push(PyTuple::new(py, [key.into_any(), py_bytes_or_none(py, *value)])?);
                    }
                    headers.append(PyTuple::new(py, items)?)?;
                }
                Ok(())
            })();
            result.map_err(|err| {
                let text = err.to_string();
                failure = Some(err);
                text
            })
        })
        .map_err(|message| failure.take().unwrap_or_else(|| value_error(message)))?;
        PyTuple::new(
            py,
            [
                PyList::new(py, offsets)?.into_any(),
                PyList::new(py, timestamps)?.into_any(),
                keys.into_any(),
                values.into_any(),
                headers.into_any(),
            ],
        )
    })
}

/// Keys-only scan: `(offsets, keys, tombstone indices)` (Kafka's cleaner needs no more).
///
/// Raises `ValueError` on any framing error, as `decode_records`.
#[pyfunction]
fn scan_keys<'py>(py: Python<'py>, data: &Bound<'py, PyAny>, count: i64, base_offset: i64) -> PyResult<Bound<'py, PyTuple>> {
    with_bytes(data, |data| {
        let mut offsets = Vec::with_capacity(count.max(0) as usize);
        let mut keys: Vec<Option<Bound<'py, PyBytes>>> = Vec::with_capacity(count.max(0) as usize);
        let mut tombstones = Vec::new();
        walk(data, count, false, |index, record| {
            offsets.push(base_offset.wrapping_add(record.offset_delta));
            keys.push(record.key.map(|key| PyBytes::new(py, key)));
            if record.value.is_none() {
                tombstones.push(index);
            }
            Ok(())
        })
        .map_err(value_error)?;
        PyTuple::new(
            py,
            [PyList::new(py, offsets)?.into_any(), PyList::new(py, keys)?.into_any(), PyList::new(py, tombstones)?.into_any()],
        )
    })
}

fn write_varint(out: &mut Vec<u8>, value: i64) {
    let mut zigzag = ((value << 1) ^ (value >> 63)) as u64;
    while zigzag > 0x7F {
        out.push((zigzag as u8 & 0x7F) | 0x80);
        zigzag >>= 7;
    }
    out.push(zigzag as u8);
}

/// The records section of a cleaned batch that keeps records `indices` (ascending) of `data`
/// (Kafka `MemoryRecords.buildRetainedRecordsInto`: same base offset, so offset deltas stay;
/// timestamps re-based on the new base timestamp). Key, value and headers are copied byte for byte.
///
/// The new base timestamp is `delete_horizon_ms` when given (KIP-534 puts the horizon there),
/// else the first kept record's timestamp. Returns `(section, base_timestamp, max_timestamp)`
/// (max of the kept records' timestamps, -1 when `indices` is empty).
/// Raises `ValueError` on a framing error or an index out of range.
#[pyfunction]
#[pyo3(signature = (data, count, base_timestamp, log_append_time, indices, delete_horizon_ms))]
fn encode_retained<'py>(py: Python<'py>, data: &Bound<'py, PyAny>, count: i64, base_timestamp: i64,
                        log_append_time: Option<i64>, indices: Vec<usize>, delete_horizon_ms: Option<i64>)
                        -> PyResult<(Bound<'py, PyBytes>, i64, i64)> {
    with_bytes(data, |data| {
        // the walk and the copy run without the GIL; only the bytes object is made with it
        let (out, new_base, max_timestamp) = py.allow_threads(|| -> Result<(Vec<u8>, i64, i64), String> {
            let mut kept: Vec<(i64, i64, usize, usize)> = Vec::with_capacity(indices.len()); // ts, offset delta, tail start, end
            let mut wanted = indices.iter().peekable();
            let mut start = 0usize;
            walk(data, count, false, |index, record| {
                let record_start = start;
                start = record.end;
                if wanted.peek() == Some(&&index) {
                    wanted.next();
                    // the tail (KeyLength onwards) starts after Length, Attributes and the two deltas
                    let mut pos = record_start;
                    records::read_varint(data, &mut pos)?;
                    pos += 1;
                    records::read_varint(data, &mut pos)?;
                    records::read_varint(data, &mut pos)?;
                    let timestamp = timestamp_of(base_timestamp, record.timestamp_delta, log_append_time);
                    kept.push((timestamp, record.offset_delta, pos, record.end));
                }
                Ok(())
            })?;
            if let Some(index) = wanted.next() {
                return Err(format!("record index {index} is not below the record count {count}"));
            }
            let new_base = delete_horizon_ms.or_else(|| kept.first().map(|k| k.0)).unwrap_or(-1);
            let mut out = Vec::with_capacity(data.len());
            let mut body = Vec::with_capacity(64);
            let mut max_timestamp = -1i64;
            for (timestamp, offset_delta, tail_start, end) in kept {
                body.clear();
                body.push(0); // Attributes
                write_varint(&mut body, timestamp.wrapping_sub(new_base));
                write_varint(&mut body, offset_delta);
                body.extend_from_slice(&data[tail_start..end]);
                write_varint(&mut out, body.len() as i64);
                out.extend_from_slice(&body);
                max_timestamp = max_timestamp.max(timestamp);
            }
            Ok((out, new_base, max_timestamp))
        })
        .map_err(value_error)?;
        Ok((PyBytes::new(py, &out), new_base, max_timestamp))
    })
}

/// Kafka's `SkimpyOffsetMap` table: `slots` entries of 24 bytes, MD5 digests, linear probing.
///
/// Bookkeeping that is not per entry (latest offset, the cleaner's load factor) stays in the
/// Python `OffsetMap` class that owns one of these.
#[pyclass(module = "materializer.storage._native")]
struct DigestTable {
    table: SkimpyTable,
}

fn key_bytes<'a>(key: &'a Bound<'_, PyAny>) -> PyResult<&'a [u8]> {
    Ok(key.downcast::<PyBytes>()?.as_bytes())
}

#[pymethods]
impl DigestTable {
    #[new]
    fn new(slots: usize) -> PyResult<Self> {
        if slots == 0 {
            return Err(PyValueError::new_err("an offset map needs at least one slot"));
        }
        Ok(DigestTable { table: SkimpyTable::new(slots) })
    }

    /// Entries in use (distinct digests).
    #[getter]
    fn entries(&self) -> usize {
        self.table.entries
    }

    #[getter]
    fn slots(&self) -> usize {
        self.table.slots()
    }

    /// Kafka's buffer size for the map, `slots * 24` bytes (the buckets grow up to it; `SkimpyTable`).
    #[getter]
    fn memory_bytes(&self) -> usize {
        self.table.memory_bytes()
    }

    /// Store `offset` for `key` (bytes). Raises `ValueError` when the map is full.
    fn put(&mut self, key: &Bound<'_, PyAny>, offset: i64) -> PyResult<()> {
        let digest = with_bytes(key, |key| Ok(digest_of(key)))?;
        self.table.put(&digest, offset).map_err(value_error)
    }

    /// The offset stored for `key`, or -1.
    fn get(&self, key: &Bound<'_, PyAny>) -> PyResult<i64> {
        let digest = with_bytes(key, |key| Ok(digest_of(key)))?;
        Ok(self.table.get(&digest))
    }

    /// `put(keys[i], offsets[i])` in order. Returns `None` when all were stored, else the index
    /// of the first entry that did not fit (the ones before it are stored, as a loop of `put`
    /// would leave them).
    fn put_many(&mut self, keys: &Bound<'_, PyList>, offsets: Vec<i64>) -> PyResult<Option<usize>> {
        if keys.len() != offsets.len() {
            return Err(PyValueError::new_err("keys and offsets differ in length"));
        }
        for (index, (key, offset)) in keys.iter().zip(offsets).enumerate() {
            let digest = digest_of(key_bytes(&key)?);
            if self.table.put(&digest, offset).is_err() {
                return Ok(Some(index));
            }
        }
        Ok(None)
    }

    /// The entries, 24 bytes each (the digest, then the big-endian offset), in digest order.
    fn sorted_entries<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, &self.table.sorted_entries())
    }

    /// `[get(key) for key in keys]`.
    fn get_many(&self, keys: &Bound<'_, PyList>) -> PyResult<Vec<i64>> {
        keys.iter().map(|key| Ok(self.table.get(&digest_of(key_bytes(&key)?)))).collect()
    }

    /// Keys-only scan of a records section fused with the map update (the cleaner's
    /// `buildOffsetMapForSegment` inner loop): every keyed record with `start <= offset < end`
    /// is put while the map holds fewer than `max_entries` entries.
    ///
    /// Returns `(visited, stopped, last_put_offset)`: records read before stopping (every record
    /// of the batch when not stopped), whether a keyed record in range found the map at
    /// `max_entries` (the round then ends there), and the offset of the last put (-1 if none).
    /// Raises `ValueError` on a framing error (nothing is put then).
    #[allow(clippy::too_many_arguments)]
    fn map_records(&mut self, data: &Bound<'_, PyAny>, count: i64, base_offset: i64, start: i64, end: i64,
                   max_entries: usize) -> PyResult<(usize, bool, i64)> {
        let py = data.py();
        let table = &mut self.table;
        with_bytes(data, |data| {
            // the walk, the MD5s and the puts run without the GIL (other cleaner threads run meanwhile)
            py.allow_threads(|| {
                // framing is checked for the whole batch before any entry is written
                let mut records: Vec<(i64, Option<&[u8]>)> = Vec::with_capacity(count.max(0) as usize);
                walk(data, count, false, |_, record| {
                    let offset = base_offset.wrapping_add(record.offset_delta);
                    let in_range = offset >= start && offset < end;
                    records.push((offset, if in_range { record.key } else { None }));
                    Ok(())
                })?;
                let keys: Vec<&[u8]> = records.iter().filter_map(|(_, key)| *key).collect();
                let mut digests = Vec::new();
                digest_all(&keys, &mut digests);
                for digest in &digests {
                    table.prefetch(digest);
                }
                let mut digests = digests.iter();
                let mut last_put = -1i64;
                for (visited, (offset, key)) in records.iter().enumerate() {
                    if key.is_some() {
                        if table.entries >= max_entries {
                            return Ok((visited, true, last_put));
                        }
                        table.put(digests.next().expect("a digest per key"), *offset)?;
                        last_put = *offset;
                    }
                }
                Ok((records.len(), false, last_put))
            })
            .map_err(value_error)
        })
    }

    /// Kafka `Cleaner.shouldRetainRecord` for every record of a records section: the indices of the
    /// records the cleaner keeps (ascending), whether a kept one is a tombstone, and how many null-key
    /// records at or below `latest_offset` were dropped (Kafka's invalid records). A tombstone the
    /// map keeps is dropped when `retain_deletes` is false (its batch's delete horizon has passed,
    /// KIP-534) unless its offset is past `latest_offset`. Raises `ValueError` on a framing error.
    fn kept(&self, data: &Bound<'_, PyAny>, count: i64, base_offset: i64, latest_offset: i64, retain_deletes: bool)
            -> PyResult<(Vec<u32>, bool, usize)> {
        let py = data.py();
        let table = &self.table;
        with_bytes(data, |data| {
            py.allow_threads(|| {
                // (offset, key to look up, null key, tombstone); no lookup past latest_offset
                let mut records: Vec<(i64, Option<&[u8]>, bool, bool)> = Vec::with_capacity(count.max(0) as usize);
                walk(data, count, false, |_, record| {
                    let offset = base_offset.wrapping_add(record.offset_delta);
                    let key = if offset > latest_offset { None } else { record.key };
                    records.push((offset, key, record.key.is_none(), record.value.is_none()));
                    Ok(())
                })?;
                let keys: Vec<&[u8]> = records.iter().filter_map(|record| record.1).collect();
                let mut digests = Vec::new();
                digest_all(&keys, &mut digests);
                for digest in &digests {
                    table.prefetch(digest);
                }
                let mut digests = digests.iter();
                let mut kept = Vec::with_capacity(records.len());
                let mut contains_tombstones = false;
                let mut invalid = 0usize;
                for (index, (offset, key, null_key, tombstone)) in records.iter().enumerate() {
                    let keep = match key {
                        Some(_) => *offset >= table.get(digests.next().expect("a digest per key")),
                        None if *offset > latest_offset => true,
                        None => {
                            debug_assert!(*null_key);
                            invalid += 1;
                            false
                        }
                    };
                    if !keep {
                        continue;
                    }
                    if *tombstone {
                        if !retain_deletes && *offset <= latest_offset {
                            continue;
                        }
                        contains_tombstones = true;
                    }
                    kept.push(index as u32);
                }
                Ok((kept, contains_tombstones, invalid))
            })
            .map_err(value_error)
        })
    }

    fn clear(&mut self, py: Python<'_>) {
        let table = &mut self.table;
        py.allow_threads(|| table.clear()); // zeroes the buckets in use
    }
}

/// Spark Kafka source columns filled batch by batch, handed to pyarrow as buffers.
#[pyclass(module = "materializer.storage._native")]
struct ArrowColumns {
    columns: KafkaColumns,
}

fn column_buffers<'py>(py: Python<'py>, out: &Bound<'py, PyDict>, name: &str, column: &BinaryColumn) -> PyResult<()> {
    let validity = if column.nulls > 0 { PyBytes::new(py, &column.validity).into_any() } else { py.None().into_bound(py) };
    let offsets: &[u8] = bytemuck_i32(&column.offsets);
    out.set_item(name, (validity, PyBytes::new(py, offsets), PyBytes::new(py, &column.data), column.nulls))
}

fn bytemuck_i32(values: &[i32]) -> &[u8] {
    // SAFETY: i32 has no padding and any byte pattern is a valid u8; the slice covers exactly
    // the same memory. Arrow buffers are little-endian, as is every target this is built for.
    unsafe { std::slice::from_raw_parts(values.as_ptr() as *const u8, std::mem::size_of_val(values)) }
}

fn bytemuck_i64(values: &[i64]) -> &[u8] {
    // SAFETY: as bytemuck_i32.
    unsafe { std::slice::from_raw_parts(values.as_ptr() as *const u8, std::mem::size_of_val(values)) }
}

#[pymethods]
impl ArrowColumns {
    #[new]
    fn new(include_headers: bool) -> Self {
        ArrowColumns { columns: KafkaColumns::new(include_headers) }
    }

    #[getter]
    fn rows(&self) -> usize {
        self.columns.rows()
    }

    /// Bytes in the key, value and header buffers (flush well before Arrow's 2 GiB offsets limit).
    #[getter]
    fn data_bytes(&self) -> usize {
        self.columns.data_bytes()
    }

    /// Append the records of one batch whose offset is in `[start, end)`; returns rows added.
    /// `timestamp_type` is Spark's `timestampType` (0 CreateTime, 1 LogAppendTime).
    /// Raises `ValueError` on a framing error (nothing of that batch is added).
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (data, count, base_offset, base_timestamp, log_append_time, timestamp_type, partition, start, end))]
    fn add_records(&mut self, data: &Bound<'_, PyAny>, count: i64, base_offset: i64, base_timestamp: i64,
                   log_append_time: Option<i64>, timestamp_type: i32, partition: i32, start: i64, end: i64)
                   -> PyResult<usize> {
        with_bytes(data, |data| {
            let include_headers = self.columns.include_headers;
            let mut staged = KafkaColumns::new(include_headers);
            walk(data, count, include_headers, |_, record| {
                let offset = base_offset.wrapping_add(record.offset_delta);
                if offset < start || offset >= end {
                    return Ok(());
                }
                staged.keys.push(record.key);
                staged.values.push(record.value);
                staged.offsets.push(offset);
                staged.timestamps_us.push(timestamp_of(base_timestamp, record.timestamp_delta, log_append_time).wrapping_mul(1000));
                if include_headers {
                    for (key, value) in &record.headers {
                        staged.header_keys.push(Some(String::from_utf8_lossy(key).as_bytes()));
                        staged.header_values.push(*value);
                    }
                    staged.header_lists.push(staged.header_keys.len as i32);
                }
                Ok(())
            })
            .map_err(value_error)?;
            let added = staged.rows();
            self.append(staged, timestamp_type, partition);
            Ok(added)
        })
    }

    /// The buffers of every row added since the last call, and reset:
    /// `{"rows": n, "key"|"value"|"header_key"|"header_value": (validity|None, offsets, data, nulls),
    ///   "offset"|"timestamp": int64 bytes, "partition"|"timestampType": int32 bytes,
    ///   "header_list": int32 offsets bytes, "header_rows": n headers}`.
    fn take<'py>(&mut self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let include_headers = self.columns.include_headers;
        let columns = std::mem::replace(&mut self.columns, KafkaColumns::new(include_headers));
        let out = PyDict::new(py);
        out.set_item("rows", columns.rows())?;
        column_buffers(py, &out, "key", &columns.keys)?;
        column_buffers(py, &out, "value", &columns.values)?;
        out.set_item("offset", PyBytes::new(py, bytemuck_i64(&columns.offsets)))?;
        out.set_item("timestamp", PyBytes::new(py, bytemuck_i64(&columns.timestamps_us)))?;
        out.set_item("partition", PyBytes::new(py, bytemuck_i32(&columns.partitions)))?;
        out.set_item("timestampType", PyBytes::new(py, bytemuck_i32(&columns.timestamp_types)))?;
        if columns.include_headers {
            out.set_item("header_list", PyBytes::new(py, bytemuck_i32(&columns.header_lists)))?;
            out.set_item("header_rows", columns.header_keys.len)?;
            column_buffers(py, &out, "header_key", &columns.header_keys)?;
            column_buffers(py, &out, "header_value", &columns.header_values)?;
        }
        Ok(out)
    }
}

impl ArrowColumns {
    fn append(&mut self, staged: KafkaColumns, timestamp_type: i32, partition: i32) {
        let target = &mut self.columns;
        let rows = staged.rows();
        append_binary(&mut target.keys, &staged.keys);
        append_binary(&mut target.values, &staged.values);
        target.offsets.extend_from_slice(&staged.offsets);
        target.timestamps_us.extend_from_slice(&staged.timestamps_us);
        target.timestamp_types.extend(std::iter::repeat_n(timestamp_type, rows));
        target.partitions.extend(std::iter::repeat_n(partition, rows));
        if target.include_headers {
            let shift = target.header_keys.len as i32;
            target.header_lists.extend(staged.header_lists[1..].iter().map(|o| o + shift));
            append_binary(&mut target.header_keys, &staged.header_keys);
            append_binary(&mut target.header_values, &staged.header_values);
        }
    }
}

fn append_binary(target: &mut BinaryColumn, staged: &BinaryColumn) {
    for i in 0..staged.len {
        let valid = staged.validity[i / 8] & (1 << (i % 8)) != 0;
        let item = &staged.data[staged.offsets[i] as usize..staged.offsets[i + 1] as usize];
        target.push(if valid { Some(item) } else { None });
    }
}

/// Latest state-store entry per `(partition, key)`, for rebuilding a store in bulk.
///
/// Keys are the store's data keys (`Int32 partition BE + key`); values the stored value
/// (`Int64 offset BE + Int64 timestamp ms BE + value`) or `None` for a tombstone. Later records
/// replace earlier ones, as applying them in offset order would. Entries live in one byte arena
/// (no allocation per record); de-duplication happens once, in `sort_latest` (run by the
/// `take_*` methods when not yet done).
#[pyclass(module = "materializer.storage._native")]
struct StoreEntries {
    arena: Vec<u8>,
    entries: Vec<StoreEntry>,
    /// `entries` holds only the latest entry of each key, in key order
    sorted: bool,
    /// where `add_batches` decompresses an lz4 records section (reused across batches)
    scratch: lz4_frame::Scratch,
    /// the arena and entries `sort_and_dedupe` replaced, kept to gather into the next time:
    /// a fresh page costs a page fault on first touch, which on a virtual machine made up a
    /// large part of a load's system time
    spare_arena: Vec<u8>,
    spare_entries: Vec<StoreEntry>,
}

#[derive(Clone, Copy)]
struct StoreEntry {
    key_start: usize,
    key_len: usize,
    value_start: usize,
    /// `usize::MAX` for a tombstone
    value_len: usize,
}

const TOMBSTONE: usize = usize::MAX;

/// What `StoreEntries::sort_and_dedupe` sorts: a store entry's position and the parts of its
/// key that decide most comparisons without reading the arena.
struct SortKey {
    partition: u32,
    /// the 8 key bytes after the common prefix, zero-padded, big-endian
    window: u64,
    /// key bytes after the common prefix when at most 8 (all in `window`), else `u32::MAX`
    short_len: u32,
    index: u32,
}

/// Length of the prefix every key of `keys` shares (0 for none or no keys).
fn common_prefix_len<'a>(mut keys: impl Iterator<Item = &'a [u8]>) -> usize {
    let Some(first) = keys.next() else { return 0 };
    let mut common = first.len();
    for key in keys {
        common = first[..common].iter().zip(key).take_while(|(a, b)| a == b).count();
        if common == 0 {
            break;
        }
    }
    common
}

/// The 8 bytes of `key` after `skip`, zero-padded, as a big-endian number: ordering by it agrees
/// with ordering the keys by their bytes (equal windows are decided by the whole key).
fn window_after(key: &[u8], skip: usize) -> u64 {
    let mut window = [0u8; 8];
    let tail = key.get(skip..).unwrap_or(&[]);
    let n = tail.len().min(8);
    window[..n].copy_from_slice(&tail[..n]);
    u64::from_be_bytes(window)
}

/// Entries the gather of `StoreEntries::sort_and_dedupe` looks ahead: their arena bytes are
/// prefetched half that far ahead (the entry itself must arrive first).
const PREFETCH_ENTRIES: usize = 16;

/// A hint to load the cache line at `p` (no effect where the target has no such instruction).
#[inline(always)]
fn prefetch(p: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch never faults, whatever the address
    unsafe {
        std::arch::x86_64::_mm_prefetch(p.cast::<i8>(), std::arch::x86_64::_MM_HINT_T0)
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

/// Below this many entries `StoreEntries::sort_and_dedupe` runs on one thread: starting threads
/// would cost more than they save.
const PARALLEL_SORT_MIN_ENTRIES: usize = 1 << 16;

/// Bytes an entry takes in the arena: its key, then its value (none for a tombstone).
fn entry_bytes(entry: &StoreEntry) -> usize {
    entry.key_len + if entry.value_len == TOMBSTONE { 0 } else { entry.value_len }
}

/// The positions of `entries` by partition (the 4 bytes leading each store key), each in push
/// order, the partitions ascending (so in store-key order). A batch's records are pushed
/// together, so most entries continue the previous entry's partition.
fn by_partition(arena: &[u8], entries: &[StoreEntry]) -> Vec<Vec<u32>> {
    let mut groups: std::collections::BTreeMap<[u8; 4], Vec<u32>> = std::collections::BTreeMap::new();
    let mut current: Option<([u8; 4], Vec<u32>)> = None;
    for (i, entry) in entries.iter().enumerate() {
        let partition: [u8; 4] = arena[entry.key_start..entry.key_start + 4].try_into().expect("4 bytes");
        match &mut current {
            Some((p, positions)) if *p == partition => positions.push(i as u32),
            _ => {
                if let Some((p, positions)) = current.take() {
                    groups.insert(p, positions);
                }
                let mut positions = groups.remove(&partition).unwrap_or_default();
                positions.push(i as u32);
                current = Some((partition, positions));
            }
        }
    }
    if let Some((p, positions)) = current {
        groups.insert(p, positions);
    }
    groups.into_values().collect()
}

/// Of the entries at `positions` (in push order, which is offset order), the positions of the
/// latest entry of each key, in key order.
fn latest_order(arena: &[u8], entries: &[StoreEntry], positions: &[u32]) -> Vec<u32> {
    let key_of = |i: u32| {
        let e = &entries[i as usize];
        &arena[e.key_start..e.key_start + e.key_len]
    };
    // Sorting by the arena's bytes alone costs a cache miss per comparison. The keys of a
    // topic often share a prefix ("user-", "order:"), so each entry carries its partition,
    // the 8 key bytes after the common prefix and, when the key ends within them, its length:
    // those decide the order (a shorter key with the same zero-padded window is its prefix).
    // Only keys running past the window compare their whole bytes on a tie. Equal keys end
    // in push order, which is offset order, so the last of a run is the latest record.
    let common = common_prefix_len(positions.iter().map(|&i| &key_of(i)[4..]));
    let mut order: Vec<SortKey> = positions
        .iter()
        .map(|&i| {
            let key = key_of(i);
            let rest = key.len() - 4 - common;
            SortKey {
                partition: u32::from_be_bytes([key[0], key[1], key[2], key[3]]),
                window: window_after(&key[4..], common),
                short_len: if rest <= 8 { rest as u32 } else { u32::MAX },
                index: i,
            }
        })
        .collect();
    let cmp_keys = |a: &SortKey, b: &SortKey| {
        (a.partition, a.window).cmp(&(b.partition, b.window)).then_with(|| {
            if a.short_len != u32::MAX && b.short_len != u32::MAX {
                a.short_len.cmp(&b.short_len)
            } else {
                key_of(a.index).cmp(key_of(b.index))
            }
        })
    };
    // A stable radix sort by the fixed-width part (the window's ordering rule above) keeps
    // push order among equal parts; only runs of long keys sharing one window then need
    // their whole bytes compared (a stable sort again: equal keys stay in offset order).
    radsort::sort_by_key(&mut order, |k| (k.partition, k.window, k.short_len));
    let mut start = 0;
    while start < order.len() {
        let first = &order[start];
        let same = |k: &SortKey| (k.partition, k.window, k.short_len) == (first.partition, first.window, first.short_len);
        let end = start + 1 + order[start + 1..].iter().take_while(|k| same(k)).count();
        if first.short_len == u32::MAX && end - start > 1 {
            order[start..end].sort_by(|a, b| key_of(a.index).cmp(key_of(b.index)));
        }
        start = end;
    }
    (0..order.len())
        .filter(|&n| n + 1 == order.len() || cmp_keys(&order[n], &order[n + 1]).is_ne())
        .map(|n| order[n].index)
        .collect()
}

/// Copies the entries at `order` from `old` into `arena` (exactly their bytes) one after the
/// other and describes them in `kept`, positions counted from `base` (where `arena` starts in
/// the whole new arena). Each entry's bytes are prefetched a few entries ahead.
fn gather(old: &[u8], entries: &[StoreEntry], order: &[u32], arena: &mut [MaybeUninit<u8>],
          kept: &mut [MaybeUninit<StoreEntry>], base: usize) {
    let mut at = 0usize;
    for (n, &i) in order.iter().enumerate() {
        if let Some(&ahead) = order.get(n + PREFETCH_ENTRIES) {
            prefetch(std::ptr::from_ref(&entries[ahead as usize]).cast());
        }
        if let Some(&ahead) = order.get(n + PREFETCH_ENTRIES / 2) {
            let e = &entries[ahead as usize];
            for line in (e.key_start..e.key_start + entry_bytes(e)).step_by(64) {
                prefetch(old[line..].as_ptr());
            }
        }
        // an entry's value follows its key in the arena (`take_batch` pushes them so): one copy
        let entry = entries[i as usize];
        debug_assert_eq!(entry.value_start, entry.key_start + entry.key_len);
        let bytes = entry_bytes(&entry);
        let (source, target) = (&old[entry.key_start..entry.key_start + bytes], &mut arena[at..at + bytes]);
        // SAFETY: both ranges were bounds-checked just above and have `bytes` bytes; the arenas differ
        unsafe { std::ptr::copy_nonoverlapping(source.as_ptr(), target.as_mut_ptr().cast::<u8>(), bytes) };
        kept[n].write(StoreEntry { key_start: base + at, key_len: entry.key_len, value_start: base + at + entry.key_len,
                                   value_len: entry.value_len });
        at += bytes;
    }
    // the caller marks the whole part initialized: it must be exactly the kept entries' bytes
    assert_eq!(at, arena.len(), "gathered bytes differ from the part's size");
    assert_eq!(order.len(), kept.len(), "gathered entries differ from the part's count");
}

/// Where one batch's records go: its header fields and the offsets `[start, end)` to take.
struct BatchSpan {
    count: i64,
    base_offset: i64,
    base_timestamp: i64,
    log_append_time: Option<i64>,
    partition: i32,
    start: i64,
    end: i64,
}

impl StoreEntries {
    fn key_of(&self, entry: &StoreEntry) -> &[u8] {
        &self.arena[entry.key_start..entry.key_start + entry.key_len]
    }

    fn value_of(&self, entry: &StoreEntry) -> &[u8] {
        &self.arena[entry.value_start..entry.value_start + entry.value_len]
    }

    /// Sorts by key and keeps the latest entry of each, copied into a new arena in key order
    /// (the old one is freed); touches no Python object.
    ///
    /// Each partition's entries (the partition leads every store key, so partitions are
    /// consecutive key ranges) are sorted on their own, on as many threads as there are cores
    /// when the entries are many: a cold start's last write and a rebuild then use the cores the
    /// log side leaves idle. The copy gathers each kept entry once, its bytes prefetched a few
    /// entries ahead; what reads the entries next (an SST write, the next chunk's sort) then
    /// walks the arena front to back instead of missing the cache on every key and value.
    fn sort_and_dedupe(&mut self) {
        if self.sorted {
            return;
        }
        let (old, entries) = (&self.arena, &self.entries);
        assert!(entries.len() < u32::MAX as usize, "more store entries than one chunk may hold");
        let threads = if entries.len() >= PARALLEL_SORT_MIN_ENTRIES {
            std::thread::available_parallelism().map_or(1, |n| n.get())
        } else {
            1
        };
        let groups = if threads > 1 { by_partition(old, entries) } else { vec![(0..entries.len() as u32).collect()] };
        // the groups of each thread: the largest first, each to the least loaded thread
        let mut by_size: Vec<usize> = (0..groups.len()).collect();
        by_size.sort_unstable_by_key(|&g| std::cmp::Reverse(groups[g].len()));
        let mut shares: Vec<(usize, Vec<usize>)> = vec![(0, Vec::new()); threads.min(groups.len()).max(1)];
        for g in by_size {
            let share = shares.iter_mut().min_by_key(|(load, _)| *load).expect("at least one share");
            share.0 += groups[g].len();
            share.1.push(g);
        }
        let in_parallel = |work: &(dyn Fn(usize) + Sync)| {
            if shares.len() == 1 {
                shares[0].1.iter().for_each(|&g| work(g));
            } else {
                std::thread::scope(|scope| {
                    for (_, share) in &shares {
                        scope.spawn(|| share.iter().for_each(|&g| work(g)));
                    }
                });
            }
        };
        // 1. each group's latest entries in key order, and their bytes
        let sorted: Vec<Mutex<(Vec<u32>, usize)>> = groups.iter().map(|_| Mutex::default()).collect();
        in_parallel(&|g| {
            let order = latest_order(old, entries, &groups[g]);
            let bytes = order.iter().map(|&i| entry_bytes(&entries[i as usize])).sum();
            *sorted[g].lock().expect("no sort thread panics") = (order, bytes);
        });
        let sorted: Vec<(Vec<u32>, usize)> =
            sorted.into_iter().map(|m| m.into_inner().expect("no sort thread panics")).collect();
        // 2. each group gathered into its own consecutive part of the new arena (groups ascend by partition)
        let total_bytes = sorted.iter().map(|(_, bytes)| bytes).sum();
        let total_entries = sorted.iter().map(|(order, _)| order.len()).sum();
        // gathered into the arena and entries the previous call replaced (their pages are mapped
        // already), left uninitialized until gathered into
        let mut arena = std::mem::take(&mut self.spare_arena);
        let mut kept = std::mem::take(&mut self.spare_entries);
        arena.clear();
        arena.reserve_exact(total_bytes);
        kept.clear();
        kept.reserve_exact(total_entries);
        let mut parts = Vec::with_capacity(sorted.len());
        let (mut arena_rest, mut kept_rest, mut base) =
            (&mut arena.spare_capacity_mut()[..total_bytes], &mut kept.spare_capacity_mut()[..total_entries], 0usize);
        for (order, bytes) in &sorted {
            let (bytes_part, arena_tail) = std::mem::take(&mut arena_rest).split_at_mut(*bytes);
            let (kept_part, kept_tail) = std::mem::take(&mut kept_rest).split_at_mut(order.len());
            parts.push(Mutex::new((bytes_part, kept_part, base)));
            (arena_rest, kept_rest, base) = (arena_tail, kept_tail, base + bytes);
        }
        in_parallel(&|g| {
            let mut part = parts[g].lock().expect("no gather thread panics");
            let (bytes_part, kept_part, base) = &mut *part;
            gather(old, entries, &sorted[g].0, bytes_part, kept_part, *base);
        });
        drop(parts);
        // SAFETY: the parts cover [0, total_bytes) and [0, total_entries) exactly, and each
        // `gather` wrote every byte and entry of its part (it asserts so)
        unsafe {
            arena.set_len(total_bytes);
            kept.set_len(total_entries);
        }
        self.spare_arena = std::mem::replace(&mut self.arena, arena);
        self.spare_entries = std::mem::replace(&mut self.entries, kept);
        self.sorted = true;
    }

    /// Empty, keeping the allocations: the next chunk of a load fills the same pages.
    fn reset(&mut self) {
        self.arena.clear();
        self.entries.clear();
        self.sorted = false;
    }

    /// The body of `add_records`; touches no Python object.
    fn take_batch(&mut self, data: &[u8], batch: &BatchSpan) -> DecodeResult<(usize, usize, i64)> {
        let (arena_mark, entries_mark) = (self.arena.len(), self.entries.len());
        let mut null_keys = 0usize;
        let mut last = -1i64;
        let arena = &mut self.arena;
        let entries = &mut self.entries;
        let walked = walk(data, batch.count, false, |_, record| -> DecodeResult<()> {
            let offset = batch.base_offset.wrapping_add(record.offset_delta);
            if offset < batch.start || offset >= batch.end {
                return Ok(());
            }
            last = offset;
            let Some(key) = record.key else {
                null_keys += 1;
                return Ok(());
            };
            let key_start = arena.len();
            arena.extend_from_slice(&batch.partition.to_be_bytes());
            arena.extend_from_slice(key);
            let value_start = arena.len();
            let value_len = match record.value {
                Some(value) => {
                    arena.extend_from_slice(&offset.to_be_bytes());
                    let timestamp = timestamp_of(batch.base_timestamp, record.timestamp_delta, batch.log_append_time);
                    arena.extend_from_slice(&timestamp.to_be_bytes());
                    arena.extend_from_slice(value);
                    16 + value.len()
                }
                None => TOMBSTONE,
            };
            entries.push(StoreEntry { key_start, key_len: 4 + key.len(), value_start, value_len });
            Ok(())
        });
        if let Err(message) = walked {
            self.arena.truncate(arena_mark);
            self.entries.truncate(entries_mark);
            return Err(message);
        }
        Ok((self.entries.len() - entries_mark, null_keys, last))
    }

    /// The body of `add_batches` for one whole v2 batch (header included): its header fields
    /// read here, its records section decompressed here when lz4. Returns `(records_taken,
    /// null_keys)`; nothing of the batch is taken on an error.
    fn take_whole_batch(&mut self, batch: &[u8], partition: i32, start: i64, end: i64) -> DecodeResult<(usize, usize)> {
        let Some(header) = batch.get(..BATCH_HEADER_BYTES) else {
            return Err(format!("batch of {} bytes is shorter than the {BATCH_HEADER_BYTES}-byte v2 header", batch.len()));
        };
        let field = |at: usize, n: usize| header[at..at + n].iter().fold(0i64, |acc, &b| (acc << 8) | i64::from(b));
        let attributes = field(BATCH_ATTRIBUTES_AT, 2);
        let count = field(BATCH_RECORDS_COUNT_AT, 4) as i32 as i64;
        if count == 0 {
            return Ok((0, 0));
        }
        if count < 0 {
            return Err(format!("found invalid record count {count} in magic v2 batch"));
        }
        let span = BatchSpan {
            count,
            base_offset: field(0, 8),
            base_timestamp: field(BATCH_BASE_TIMESTAMP_AT, 8),
            log_append_time: (attributes & TIMESTAMP_TYPE_FLAG != 0).then(|| field(BATCH_MAX_TIMESTAMP_AT, 8)),
            partition,
            start,
            end,
        };
        let body = &batch[BATCH_HEADER_BYTES..];
        let taken = match attributes & CODEC_MASK {
            CODEC_NONE => self.take_batch(body, &span),
            CODEC_LZ4 => {
                let mut scratch = std::mem::take(&mut self.scratch);
                let taken = lz4_frame::decompress_into(body, &mut scratch).and_then(|()| self.take_batch(scratch.bytes(), &span));
                self.scratch = scratch;
                taken
            }
            codec => Err(format!("records compressed with codec {codec} are decompressed by the caller")),
        };
        taken.map(|(records, null_keys, _)| (records, null_keys))
    }
}

/// The v2 batch header (`DefaultRecordBatch`): its size and the fields `add_batches` reads.
const BATCH_HEADER_BYTES: usize = 61;
const BATCH_ATTRIBUTES_AT: usize = 21;
const BATCH_BASE_TIMESTAMP_AT: usize = 27;
const BATCH_MAX_TIMESTAMP_AT: usize = 35;
const BATCH_RECORDS_COUNT_AT: usize = 57;
const CODEC_MASK: i64 = 0x07;
const CODEC_NONE: i64 = 0;
const CODEC_LZ4: i64 = 3;
const TIMESTAMP_TYPE_FLAG: i64 = 0x08;

#[pymethods]
impl StoreEntries {
    #[new]
    fn new() -> Self {
        StoreEntries { arena: Vec::new(), entries: Vec::new(), sorted: false, scratch: lz4_frame::Scratch::default(),
                       spare_arena: Vec::new(), spare_entries: Vec::new() }
    }

    /// Entries held: records taken since the last `take_*` (fewer once `sort_latest` de-duplicated them).
    fn __len__(&self) -> usize {
        self.entries.len()
    }

    /// Bytes held (entry bytes plus 32 per record), to bound memory by flushing.
    #[getter]
    fn held_bytes(&self) -> usize {
        self.arena.len() + self.entries.len() * std::mem::size_of::<StoreEntry>()
    }

    /// Take the records of one batch with `start <= offset < end`; null keys are skipped.
    /// Returns `(records_taken, null_keys, last_offset_taken)` (-1 when none).
    /// Raises `ValueError` on a framing error (nothing of that batch is taken).
    /// With `bytes` input the decode runs with the GIL released, so other threads (the fetch
    /// receiver, a service's reads) run meanwhile.
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (data, count, base_offset, base_timestamp, log_append_time, partition, start, end))]
    fn add_records(&mut self, py: Python<'_>, data: &Bound<'_, PyAny>, count: i64, base_offset: i64,
                   base_timestamp: i64, log_append_time: Option<i64>, partition: i32, start: i64, end: i64)
                   -> PyResult<(usize, usize, i64)> {
        let batch = BatchSpan { count, base_offset, base_timestamp, log_append_time, partition, start, end };
        self.sorted = false;
        let taken = if let Ok(bytes) = data.downcast::<PyBytes>() {
            // bytes are immutable and `data` keeps them alive for the whole call
            let data = bytes.as_bytes();
            py.allow_threads(|| self.take_batch(data, &batch))
        } else {
            with_bytes(data, |data| Ok(self.take_batch(data, &batch)))?
        };
        taken.map_err(value_error)
    }

    /// Take the records with `start <= offset < end` of whole v2 batches (`batches`: a list of
    /// bytes-like objects, each exactly one batch with its 61-byte header) of `partition`, in
    /// order, with the GIL released once for all of them: the apply of a cold start then waits
    /// for the interpreter once per list instead of twice per batch. Records sections compressed
    /// with lz4 (Kafka's frame, `storage/lz4_frame.rs`) are decompressed here, uncompressed ones
    /// read in place; a batch of another codec, or one this reader refuses, stops the call, and
    /// so does reaching `held_limit` (`held_bytes` after a batch at or above it), so that the
    /// caller can write a full chunk before taking more.
    ///
    /// Returns `(batches_taken, records_taken, null_keys, declined)`: `declined` is `None` when
    /// the batches were taken (all of them, or the first `batches_taken` when the limit was
    /// reached), else the reason the batch at index `batches_taken` was not (nothing of it is
    /// taken; the batches before it are). The caller then takes that batch its own way
    /// (decompressing it in Python; a really broken one raises there with file and position).
    /// Control batches and aborted records are the caller's to leave out. Writable buffers
    /// (a bytearray, a writable mmap) are read with the GIL held, since another thread could
    /// change them meanwhile.
    #[pyo3(signature = (batches, partition, start, end, held_limit = usize::MAX))]
    fn add_batches(&mut self, py: Python<'_>, batches: &Bound<'_, PyList>, partition: i32, start: i64, end: i64,
                   held_limit: usize) -> PyResult<(usize, usize, usize, Option<String>)> {
        // Strong references and buffer exports keep every batch's bytes alive and unresized
        // while the GIL is released (the list itself could be changed meanwhile).
        let items: Vec<Bound<'_, PyAny>> = batches.iter().collect();
        let mut exports: Vec<PyBuffer<u8>> = Vec::new();
        let mut slices: Vec<(*const u8, usize)> = Vec::with_capacity(items.len());
        let mut read_only = true;
        for item in &items {
            if let Ok(bytes) = item.downcast::<PyBytes>() {
                let data = bytes.as_bytes();
                slices.push((data.as_ptr(), data.len()));
            } else {
                let buffer: PyBuffer<u8> = PyBuffer::get(item)?;
                if !buffer.is_c_contiguous() {
                    return Err(PyValueError::new_err("batch buffer is not contiguous"));
                }
                read_only &= buffer.readonly();
                slices.push((buffer.buf_ptr() as *const u8, buffer.len_bytes()));
                exports.push(buffer);
            }
        }
        // SAFETY: each (pointer, length) is a C-contiguous buffer kept alive by `items` (bytes
        // are immutable) or exported by `exports` until this call returns; the GIL is released
        // only when every buffer is read-only, so no Python code can write them meanwhile.
        let slices: Vec<&[u8]> = slices.into_iter().map(|(p, n)| unsafe { std::slice::from_raw_parts(p, n) }).collect();
        self.sorted = false;
        let mut take = || {
            let (mut records, mut null_keys) = (0usize, 0usize);
            for (index, batch) in slices.iter().enumerate() {
                match self.take_whole_batch(batch, partition, start, end) {
                    Ok((taken, nulls)) => {
                        records += taken;
                        null_keys += nulls;
                    }
                    Err(reason) => return (index, records, null_keys, Some(reason)),
                }
                if self.held_bytes() >= held_limit {
                    return (index + 1, records, null_keys, None);
                }
            }
            (slices.len(), records, null_keys, None)
        };
        let outcome = if read_only { py.allow_threads(take) } else { take() };
        drop(exports);
        Ok(outcome)
    }

    /// Drop the entries later records of their key replaced, the others copied in key order
    /// into a new arena (the GIL released meanwhile; `sort_and_dedupe`): a log that repeats its
    /// keys then fills one chunk with many times its records, and a write right after needs no
    /// sort. Records taken afterwards still replace these. Returns `held_bytes` afterwards.
    fn compact(&mut self, py: Python<'_>) -> usize {
        py.allow_threads(|| self.sort_and_dedupe());
        self.held_bytes()
    }

    /// Drop every entry and give the memory kept for the next chunk back to the system (the
    /// arena and the one the last sort replaced), with the GIL released: after a cold start
    /// that is tens of MiB of pages the kernel frees, which another thread may do while the
    /// caller goes on.
    fn free_memory(&mut self, py: Python<'_>) {
        let buffers = (std::mem::take(&mut self.arena), std::mem::take(&mut self.entries),
                       std::mem::take(&mut self.spare_arena), std::mem::take(&mut self.spare_entries),
                       std::mem::take(&mut self.scratch));
        self.sorted = false;
        py.allow_threads(move || drop(buffers));
    }

    /// Sort by key and keep the latest entry of each (the GIL released meanwhile); returns
    /// `(puts, deletes)`: keys whose latest record has a value, and those whose latest is a tombstone.
    fn sort_latest(&mut self, py: Python<'_>) -> (usize, usize) {
        py.allow_threads(|| self.sort_and_dedupe());
        let deletes = self.entries.iter().filter(|e| e.value_len == TOMBSTONE).count();
        (self.entries.len() - deletes, deletes)
    }

    /// The latest entry of every key, in store-key order, and reset: `(put_keys, put_values,
    /// delete_keys)` (a key whose latest record is a tombstone is a delete).
    fn take_sorted<'py>(&mut self, py: Python<'py>)
                        -> PyResult<(Bound<'py, PyList>, Bound<'py, PyList>, Bound<'py, PyList>)> {
        py.allow_threads(|| self.sort_and_dedupe());
        let keys = PyList::empty(py);
        let values = PyList::empty(py);
        let deletes = PyList::empty(py);
        for entry in &self.entries {
            if entry.value_len == TOMBSTONE {
                deletes.append(PyBytes::new(py, self.key_of(entry)))?;
            } else {
                keys.append(PyBytes::new(py, self.key_of(entry)))?;
                values.append(PyBytes::new(py, self.value_of(entry)))?;
            }
        }
        self.reset();
        Ok((keys, values, deletes))
    }

    /// Write the latest put of every key, in store-key order, to new RocksDB SST files that
    /// `IngestExternalFile` accepts (`adapters/sst.rs`: BlockBasedTable format_version 5, CRC32C, data
    /// blocks of `block_size` bytes compressed with `compression`, "none" or "lz4"), and reset.
    /// With `write_deletes`, each key whose latest record is a tombstone is written into the
    /// files too, as a delete (what `SstFileWriter::Delete` writes), instead of being returned;
    /// those of the partitions in `skip_deletes_of` are dropped instead (the caller knows the
    /// store holds nothing of them for a delete to hide: a file that overlaps nothing lands in
    /// the bottom level, where RocksDB would keep its deletes for good).
    /// `path` is one path or a list of them: the entries are cut into that many consecutive key
    /// ranges of (nearly) equal entry counts, each written to its file by its own thread (one
    /// file per core is what a rebuild wants; RocksDB ingests non-overlapping files in one
    /// atomic call). Sorting and writing run with the GIL released; no Python object is made
    /// per entry. Returns `(entries_written, delete_keys)`: puts (and with `write_deletes`
    /// deletes) written, and the keys of the deletes not written; files past the entries'
    /// count (all of them with none) are not written. Raises `ValueError` for another
    /// compression, a zero block size or no path (nothing taken), and `OSError` naming a file
    /// that cannot be written (the entries are then dropped).
    #[pyo3(signature = (path, compression, block_size, write_deletes = false, skip_deletes_of = Vec::new()))]
    fn take_sst<'py>(&mut self, py: Python<'py>, path: &Bound<'py, PyAny>, compression: &str, block_size: usize,
                     write_deletes: bool, skip_deletes_of: Vec<i32>) -> PyResult<(u64, Bound<'py, PyList>)> {
        let paths: Vec<std::path::PathBuf> = if path.is_instance_of::<PyList>() {
            path.extract()?
        } else {
            vec![path.extract()?]
        };
        let Some(compression) = sst::Compression::from_name(compression) else {
            return Err(value_error(format!("SST compression {compression:?} is not written natively; \
                                            expected \"none\" or \"lz4\"")));
        };
        if block_size == 0 {
            return Err(value_error("SST block size must be above 0 bytes".to_string()));
        }
        if paths.is_empty() {
            return Err(value_error("no SST file path given".to_string()));
        }
        let written = py.allow_threads(|| {
            self.sort_and_dedupe();
            // a store key leads with its partition, Int32 big-endian
            let skipped = |key: &[u8]| skip_deletes_of.iter().any(|p| key.starts_with(&p.to_be_bytes()));
            let rows: Vec<(&[u8], Option<&[u8]>)> = self.entries.iter()
                .filter(|e| e.value_len != TOMBSTONE || (write_deletes && !skipped(self.key_of(e))))
                .map(|e| (self.key_of(e), (e.value_len != TOMBSTONE).then(|| self.value_of(e)))).collect();
            if rows.is_empty() {
                return Ok(0);
            }
            let per_file = rows.len().div_ceil(paths.len());
            let ranges: Vec<(&std::path::PathBuf, &[(&[u8], Option<&[u8]>)])> = paths.iter().zip(rows.chunks(per_file)).collect();
            if ranges.len() == 1 {
                let (file, range) = ranges[0];
                return sst::write_sst(file, range.iter().copied(), compression, block_size)
                    .map_err(|e| (file.clone(), e));
            }
            std::thread::scope(|scope| {
                let writers: Vec<_> = ranges.iter().map(|&(file, range)| {
                    scope.spawn(move || sst::write_sst(file, range.iter().copied(), compression, block_size)
                        .map_err(|e| (file.clone(), e)))
                }).collect();
                let mut total = 0;
                let mut failure = None;
                for writer in writers {
                    match writer.join().expect("an SST writer thread panicked") {
                        Ok(count) => total += count,
                        Err(error) => failure = failure.or(Some(error)),
                    }
                }
                failure.map_or(Ok(total), Err)
            })
        });
        let deletes = PyList::empty(py);
        if !write_deletes {
            for entry in self.entries.iter().filter(|e| e.value_len == TOMBSTONE) {
                deletes.append(PyBytes::new(py, self.key_of(entry)))?;
            }
        }
        self.reset();
        let written = written.map_err(|(file, e)| PyOSError::new_err(format!("cannot write SST file {}: {e}",
                                                                            file.display())))?;
        Ok((written, deletes))
    }
}

/// Kafka's `Utils.murmur2` of `key` (bytes-like): Java's signed 32-bit hash, the one
/// `BuiltInPartitioner.partitionForKey` and librdkafka's `murmur2` partitioners take.
#[pyfunction]
fn murmur2(key: &Bound<'_, PyAny>) -> PyResult<i32> {
    with_bytes(key, |key| Ok(partitioner::murmur2(key)))
}

/// librdkafka's `rd_fnv1a` of `key` (bytes-like): the unsigned 32-bit hash of its `fnv1a`
/// partitioners.
#[pyfunction]
fn fnv1a(key: &Bound<'_, PyAny>) -> PyResult<u32> {
    with_bytes(key, |key| Ok(partitioner::fnv1a(key)))
}

/// The extension module.
#[pymodule]
fn _native(module: &Bound<'_, PyModule>) -> PyResult<()> {
    module.add_function(wrap_pyfunction!(decode_records, module)?)?;
    module.add_function(wrap_pyfunction!(scan_keys, module)?)?;
    module.add_function(wrap_pyfunction!(encode_retained, module)?)?;
    module.add_function(wrap_pyfunction!(murmur2, module)?)?;
    module.add_function(wrap_pyfunction!(fnv1a, module)?)?;
    module.add_class::<DigestTable>()?;
    module.add_class::<ArrowColumns>()?;
    module.add_class::<StoreEntries>()?;
    Ok(())
}
