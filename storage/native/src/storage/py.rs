//! The log engine's bindings: the records decoders and the cleaner's offset map
//! (`materializer.storage`'s `record_batch`, `record_scan`, `offset_map`, `cleaner` call them).
//!
//! Every function takes the *uncompressed records section* of one batch (the bytes after the
//! 61-byte batch header) and its header fields.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PyString, PyTuple};

use super::cleaner;
use super::offset_map::{digest_of, SkimpyTable};
use super::records::{timestamp_of, walk};
use crate::binding::{value_error, with_bytes};

fn py_bytes_or_none<'py>(py: Python<'py>, item: Option<&[u8]>) -> Bound<'py, PyAny> {
    match item {
        Some(bytes) => PyBytes::new(py, bytes).into_any(),
        None => py.None().into_bound(py),
    }
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
        let (out, new_base, max_timestamp) = py
            .allow_threads(|| cleaner::encode_retained(data, count, base_timestamp, log_append_time, &indices,
                                                       delete_horizon_ms))
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
        // the walk, the MD5s and the puts run without the GIL (other cleaner threads run meanwhile)
        with_bytes(data, |data| {
            py.allow_threads(|| cleaner::map_records(table, data, count, base_offset, start, end, max_entries))
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
            py.allow_threads(|| cleaner::kept(table, data, count, base_offset, latest_offset, retain_deletes))
                .map_err(value_error)
        })
    }

    fn clear(&mut self, py: Python<'_>) {
        let table = &mut self.table;
        py.allow_threads(|| table.clear()); // zeroes the buckets in use
    }
}

/// Adds the log engine's functions and classes to the extension module.
pub fn register(module: &Bound<'_, PyModule>) -> PyResult<()> {
    module.add_function(wrap_pyfunction!(decode_records, module)?)?;
    module.add_function(wrap_pyfunction!(scan_keys, module)?)?;
    module.add_function(wrap_pyfunction!(encode_retained, module)?)?;
    module.add_class::<DigestTable>()?;
    Ok(())
}
