//! The Kafka log engine's hot loops: the v2 records walk and the cleaner's offset map (and its MD5).

pub mod lz4_frame;
pub mod md5_lanes;
pub mod offset_map;
pub mod records;
