//! Rules of Kafka's producer clients (Apache Kafka's `clients` module, librdkafka) that the
//! materializer re-applies: the key hashes of the partitioners, to route a key to its partition;
//! `py` binds them.

pub mod partitioner;
pub mod py;
