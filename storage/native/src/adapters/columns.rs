//! Arrow-layout column buffers filled straight from records sections (the `kafkalog` reader).
//!
//! Layouts follow the Arrow columnar format: an `i32` offsets buffer of n+1 entries plus a data
//! buffer for binary/string columns, an LSB-first validity bitmap where nulls exist, a list's
//! `i32` offsets over its struct child's rows.

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
}
