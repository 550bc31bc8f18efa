//! Arrow-layout column buffers filled straight from records sections (the `kafkalog` reader).
//!
//! Layouts follow the Arrow columnar format: an `i32` offsets buffer of n+1 entries plus a data
//! buffer for binary/string columns, an LSB-first validity bitmap where nulls exist, a list's
//! `i32` offsets over its struct child's rows.

use super::BatchSpan;
use crate::storage::records::{timestamp_of, walk, DecodeResult};

/// A binary or string column: offsets, data and validity.
#[derive(Default)]
pub struct BinaryColumn {
    pub offsets: Vec<i32>,
    pub data: Vec<u8>,
    pub validity: Vec<u8>,
    pub nulls: usize,
    pub len: usize,
}

impl BinaryColumn {
    pub fn new() -> Self {
        BinaryColumn { offsets: vec![0], ..Default::default() }
    }

    #[inline(always)]
    pub fn push(&mut self, item: Option<&[u8]>) {
        if self.len.is_multiple_of(8) {
            self.validity.push(0);
        }
        match item {
            Some(bytes) => {
                self.data.extend_from_slice(bytes);
                self.validity[self.len / 8] |= 1 << (self.len % 8);
            }
            None => self.nulls += 1,
        }
        self.offsets.push(self.data.len() as i32);
        self.len += 1;
    }

    /// Push every item of `staged`, in order.
    fn push_all(&mut self, staged: &BinaryColumn) {
        for i in 0..staged.len {
            let valid = staged.validity[i / 8] & (1 << (i % 8)) != 0;
            let item = &staged.data[staged.offsets[i] as usize..staged.offsets[i + 1] as usize];
            self.push(if valid { Some(item) } else { None });
        }
    }
}

/// The columns of Spark's Kafka source: key, value, partition, offset, timestamp (us),
/// timestampType and optionally headers (`list<struct<key: string, value: binary>>`).
pub struct KafkaColumns {
    pub include_headers: bool,
    pub keys: BinaryColumn,
    pub values: BinaryColumn,
    pub offsets: Vec<i64>,
    pub timestamps_us: Vec<i64>,
    pub timestamp_types: Vec<i32>,
    pub partitions: Vec<i32>,
    pub header_lists: Vec<i32>,
    pub header_keys: BinaryColumn,
    pub header_values: BinaryColumn,
}

impl KafkaColumns {
    pub fn new(include_headers: bool) -> Self {
        KafkaColumns {
            include_headers,
            keys: BinaryColumn::new(),
            values: BinaryColumn::new(),
            offsets: Vec::new(),
            timestamps_us: Vec::new(),
            timestamp_types: Vec::new(),
            partitions: Vec::new(),
            header_lists: vec![0],
            header_keys: BinaryColumn::new(),
            header_values: BinaryColumn::new(),
        }
    }

    pub fn rows(&self) -> usize {
        self.offsets.len()
    }

    /// Bytes held by the variable-length buffers (callers flush before 2 GiB, Arrow's i32 limit).
    pub fn data_bytes(&self) -> usize {
        self.keys.data.len() + self.values.data.len() + self.header_keys.data.len() + self.header_values.data.len()
    }

    /// Append the records of one batch's records section whose offset is in `[span.start,
    /// span.end)`; returns rows added. `timestamp_type` is Spark's `timestampType` (0 CreateTime,
    /// 1 LogAppendTime). Nothing of the batch is added on a framing error.
    pub fn add_records(&mut self, data: &[u8], span: &BatchSpan, timestamp_type: i32) -> DecodeResult<usize> {
        let include_headers = self.include_headers;
        let mut staged = KafkaColumns::new(include_headers);
        walk(data, span.count, include_headers, |_, record| {
            let offset = span.base_offset.wrapping_add(record.offset_delta);
            if offset < span.start || offset >= span.end {
                return Ok(());
            }
            staged.keys.push(record.key);
            staged.values.push(record.value);
            staged.offsets.push(offset);
            staged.timestamps_us.push(timestamp_of(span.base_timestamp, record.timestamp_delta, span.log_append_time)
                .wrapping_mul(1000));
            if include_headers {
                for (key, value) in &record.headers {
                    staged.header_keys.push(Some(String::from_utf8_lossy(key).as_bytes()));
                    staged.header_values.push(*value);
                }
                staged.header_lists.push(staged.header_keys.len as i32);
            }
            Ok(())
        })?;
        let added = staged.rows();
        self.append(staged, timestamp_type, span.partition);
        Ok(added)
    }

    fn append(&mut self, staged: KafkaColumns, timestamp_type: i32, partition: i32) {
        let rows = staged.rows();
        self.keys.push_all(&staged.keys);
        self.values.push_all(&staged.values);
        self.offsets.extend_from_slice(&staged.offsets);
        self.timestamps_us.extend_from_slice(&staged.timestamps_us);
        self.timestamp_types.extend(std::iter::repeat_n(timestamp_type, rows));
        self.partitions.extend(std::iter::repeat_n(partition, rows));
        if self.include_headers {
            let shift = self.header_keys.len as i32;
            self.header_lists.extend(staged.header_lists[1..].iter().map(|o| o + shift));
            self.header_keys.push_all(&staged.header_keys);
            self.header_values.push_all(&staged.header_values);
        }
    }

    /// The columns filled so far; empty ones (same `include_headers`) are left in their place.
    pub fn take(&mut self) -> KafkaColumns {
        let include_headers = self.include_headers;
        std::mem::replace(self, KafkaColumns::new(include_headers))
    }
}

/// `values` as an Arrow buffer: their bytes, little-endian.
pub fn i32_bytes(values: &[i32]) -> &[u8] {
    // SAFETY: i32 has no padding and any byte pattern is a valid u8; the slice covers exactly
    // the same memory. Arrow buffers are little-endian, as is every target this is built for.
    unsafe { std::slice::from_raw_parts(values.as_ptr() as *const u8, std::mem::size_of_val(values)) }
}

/// `values` as an Arrow buffer, as `i32_bytes`.
pub fn i64_bytes(values: &[i64]) -> &[u8] {
    // SAFETY: as i32_bytes.
    unsafe { std::slice::from_raw_parts(values.as_ptr() as *const u8, std::mem::size_of_val(values)) }
}
