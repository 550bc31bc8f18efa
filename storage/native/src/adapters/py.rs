//! The adapters' bindings: Arrow columns for the `kafkalog` Spark reader
//! (`materializer/spark/split_reader.py`) and the store entries of a bulk store load
//! (`materializer/apply/store_loader.py`). The work is in `columns.rs`, `store_entries.rs` and
//! `sst.rs`; this file reads the Python arguments, releases the GIL and builds the results.

use pyo3::exceptions::PyOSError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList};

use super::columns::{i32_bytes, i64_bytes, BinaryColumn, KafkaColumns};
use super::sst;
use super::store_entries;
use super::BatchSpan;
use crate::binding::{value_error, with_bytes, with_bytes_of_each};

/// Spark Kafka source columns filled batch by batch, handed to pyarrow as buffers.
#[pyclass(module = "materializer.storage._native")]
struct ArrowColumns {
    columns: KafkaColumns,
}

fn column_buffers<'py>(py: Python<'py>, out: &Bound<'py, PyDict>, name: &str, column: &BinaryColumn) -> PyResult<()> {
    let validity = if column.nulls > 0 { PyBytes::new(py, &column.validity).into_any() } else { py.None().into_bound(py) };
    out.set_item(name, (validity, PyBytes::new(py, i32_bytes(&column.offsets)), PyBytes::new(py, &column.data), column.nulls))
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
        let span = BatchSpan { count, base_offset, base_timestamp, log_append_time, partition, start, end };
        with_bytes(data, |data| self.columns.add_records(data, &span, timestamp_type).map_err(value_error))
    }

    /// The buffers of every row added since the last call, and reset:
    /// `{"rows": n, "key"|"value"|"header_key"|"header_value": (validity|None, offsets, data, nulls),
    ///   "offset"|"timestamp": int64 bytes, "partition"|"timestampType": int32 bytes,
    ///   "header_list": int32 offsets bytes, "header_rows": n headers}`.
    fn take<'py>(&mut self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let columns = self.columns.take();
        let out = PyDict::new(py);
        out.set_item("rows", columns.rows())?;
        column_buffers(py, &out, "key", &columns.keys)?;
        column_buffers(py, &out, "value", &columns.values)?;
        out.set_item("offset", PyBytes::new(py, i64_bytes(&columns.offsets)))?;
        out.set_item("timestamp", PyBytes::new(py, i64_bytes(&columns.timestamps_us)))?;
        out.set_item("partition", PyBytes::new(py, i32_bytes(&columns.partitions)))?;
        out.set_item("timestampType", PyBytes::new(py, i32_bytes(&columns.timestamp_types)))?;
        if columns.include_headers {
            out.set_item("header_list", PyBytes::new(py, i32_bytes(&columns.header_lists)))?;
            out.set_item("header_rows", columns.header_keys.len)?;
            column_buffers(py, &out, "header_key", &columns.header_keys)?;
            column_buffers(py, &out, "header_value", &columns.header_values)?;
        }
        Ok(out)
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
    core: store_entries::StoreEntries,
}

#[pymethods]
impl StoreEntries {
    #[new]
    fn new() -> Self {
        StoreEntries { core: store_entries::StoreEntries::default() }
    }

    /// Entries held: records taken since the last `take_*` (fewer once `sort_latest` de-duplicated them).
    fn __len__(&self) -> usize {
        self.core.len()
    }

    /// Bytes held (entry bytes plus 32 per record), to bound memory by flushing.
    #[getter]
    fn held_bytes(&self) -> usize {
        self.core.held_bytes()
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
        let core = &mut self.core;
        let taken = if let Ok(bytes) = data.downcast::<PyBytes>() {
            // bytes are immutable and `data` keeps them alive for the whole call
            let data = bytes.as_bytes();
            py.allow_threads(|| core.take_batch(data, &batch))
        } else {
            with_bytes(data, |data| Ok(core.take_batch(data, &batch)))?
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
    fn add_batches(&mut self, batches: &Bound<'_, PyList>, partition: i32, start: i64, end: i64,
                   held_limit: usize) -> PyResult<(usize, usize, usize, Option<String>)> {
        let core = &mut self.core;
        with_bytes_of_each(batches, "batch", |batches| core.take_batches(batches, partition, start, end, held_limit))
    }

    /// Drop the entries later records of their key replaced, the others copied in key order
    /// into a new arena (the GIL released meanwhile; `sort_and_dedupe`): a log that repeats its
    /// keys then fills one chunk with many times its records, and a write right after needs no
    /// sort. Records taken afterwards still replace these. Returns `held_bytes` afterwards.
    fn compact(&mut self, py: Python<'_>) -> usize {
        py.allow_threads(|| self.core.sort_and_dedupe());
        self.core.held_bytes()
    }

    /// Drop every entry and give the memory kept for the next chunk back to the system (the
    /// arena and the one the last sort replaced), with the GIL released: after a cold start
    /// that is tens of MiB of pages the kernel frees, which another thread may do while the
    /// caller goes on.
    fn free_memory(&mut self, py: Python<'_>) {
        let buffers = std::mem::take(&mut self.core);
        py.allow_threads(move || drop(buffers));
    }

    /// Sort by key and keep the latest entry of each (the GIL released meanwhile); returns
    /// `(puts, deletes)`: keys whose latest record has a value, and those whose latest is a tombstone.
    fn sort_latest(&mut self, py: Python<'_>) -> (usize, usize) {
        py.allow_threads(|| self.core.sort_and_dedupe());
        self.core.counts()
    }

    /// The latest entry of every key, in store-key order, and reset: `(put_keys, put_values,
    /// delete_keys)` (a key whose latest record is a tombstone is a delete).
    fn take_sorted<'py>(&mut self, py: Python<'py>)
                        -> PyResult<(Bound<'py, PyList>, Bound<'py, PyList>, Bound<'py, PyList>)> {
        py.allow_threads(|| self.core.sort_and_dedupe());
        let keys = PyList::empty(py);
        let values = PyList::empty(py);
        let deletes = PyList::empty(py);
        for (key, value) in self.core.entries() {
            match value {
                Some(value) => {
                    keys.append(PyBytes::new(py, key))?;
                    values.append(PyBytes::new(py, value))?;
                }
                None => deletes.append(PyBytes::new(py, key))?,
            }
        }
        self.core.reset();
        Ok((keys, values, deletes))
    }

    /// The keys whose latest record is a tombstone and, for each, that tombstone's offset and
    /// timestamp (16 bytes: Int64 offset BE + Int64 timestamp ms BE), in store-key order: the
    /// deletes `take_sorted` returns next, in the same order (sorted here with the GIL released;
    /// nothing is reset).
    fn tombstones<'py>(&mut self, py: Python<'py>) -> PyResult<(Bound<'py, PyList>, Bound<'py, PyList>)> {
        py.allow_threads(|| self.core.sort_and_dedupe());
        let keys = PyList::empty(py);
        let at = PyList::empty(py);
        for (key, offset_and_timestamp) in self.core.tombstones() {
            keys.append(PyBytes::new(py, key))?;
            at.append(PyBytes::new(py, offset_and_timestamp))?;
        }
        Ok((keys, at))
    }

    /// Write each key whose latest record is a tombstone, in store-key order, to one new RocksDB
    /// SST file at `path` as a put of that tombstone's offset and timestamp (16 bytes, as
    /// `tombstones` gives them; the store's tombstone column family ingests it), with the GIL
    /// released; nothing is reset (`take_sst` writes the rest next). No file without a tombstone.
    /// Returns the tombstones written. Raises `ValueError` for a compression other than "none"
    /// or "lz4" or a zero block size, `OSError` naming a file that cannot be written.
    fn write_tombstone_sst(&mut self, py: Python<'_>, path: std::path::PathBuf, compression: &str,
                           block_size: usize) -> PyResult<u64> {
        let Some(compression) = sst::Compression::from_name(compression) else {
            return Err(value_error(format!("SST compression {compression:?} is not written natively; \
                                            expected \"none\" or \"lz4\"")));
        };
        if block_size == 0 {
            return Err(value_error("SST block size must be above 0 bytes".to_string()));
        }
        let core = &mut self.core;
        py.allow_threads(|| core.write_tombstone_sst(&path, compression, block_size))
            .map_err(|e| PyOSError::new_err(format!("cannot write SST file {}: {e}", path.display())))
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
        let core = &mut self.core;
        let written = py.allow_threads(|| core.write_sst(&paths, compression, block_size, write_deletes, &skip_deletes_of));
        let deletes = PyList::empty(py);
        if !write_deletes {
            for (key, _) in self.core.entries().filter(|(_, value)| value.is_none()) {
                deletes.append(PyBytes::new(py, key))?;
            }
        }
        self.core.reset();
        let written = written.map_err(|(file, e)| PyOSError::new_err(format!("cannot write SST file {}: {e}",
                                                                            file.display())))?;
        Ok((written, deletes))
    }
}

/// Adds the adapters' classes to the extension module.
pub fn register(module: &Bound<'_, PyModule>) -> PyResult<()> {
    module.add_class::<ArrowColumns>()?;
    module.add_class::<StoreEntries>()?;
    Ok(())
}
