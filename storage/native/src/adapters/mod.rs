//! Writers for the adapters (not the Kafka log): RocksDB SST files, the store entries written
//! into them and Arrow columns; `py` binds them.

pub mod columns;
pub mod py;
pub mod sst;
pub mod store_entries;

/// Where one batch's records go: its header fields, the partition it belongs to and the offsets
/// `[start, end)` to take.
pub struct BatchSpan {
    pub count: i64,
    pub base_offset: i64,
    pub base_timestamp: i64,
    /// the batch's max timestamp when it is LogAppendTime: every record's timestamp then
    pub log_append_time: Option<i64>,
    pub partition: i32,
    pub start: i64,
    pub end: i64,
}
