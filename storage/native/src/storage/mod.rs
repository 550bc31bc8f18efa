//! The Kafka log engine's hot loops: the v2 records walk, the cleaner's passes and its offset map
//! (and its MD5), lz4 records sections; `py` binds them.

pub mod cleaner;
pub mod lz4_frame;
pub mod md5_lanes;
pub mod offset_map;
pub mod py;
pub mod records;
