//! The Kafka log engine's hot loops: the v2 records walk and the cleaner's offset map.

pub mod lz4_frame;
pub mod offset_map;
pub mod records;
