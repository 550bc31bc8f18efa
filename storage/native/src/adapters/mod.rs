//! Writers for the adapters (not the Kafka log): RocksDB SST files and Arrow columns.

pub mod columns;
pub mod sst;
