//! The producers' key hashes bound for `materializer/group/routing.py` (`partition_for_key`).

use pyo3::prelude::*;

use super::partitioner;
use crate::binding::with_bytes;

/// Kafka's `Utils.murmur2` of `key` (bytes-like): Java's signed 32-bit hash, the one
/// `BuiltInPartitioner.partitionForKey` and librdkafka's `murmur2` partitioners take.
#[pyfunction]
fn murmur2(key: &Bound<'_, PyAny>) -> PyResult<i32> {
    with_bytes(key, |key| Ok(partitioner::murmur2(key)))
}

/// librdkafka's `rd_fnv1a` of `key` (bytes-like): the unsigned 32-bit hash of its `fnv1a`
/// partitioners.
#[pyfunction]
fn fnv1a(key: &Bound<'_, PyAny>) -> PyResult<u32> {
    with_bytes(key, |key| Ok(partitioner::fnv1a(key)))
}

/// Adds the key hashes to the extension module.
pub fn register(module: &Bound<'_, PyModule>) -> PyResult<()> {
    module.add_function(wrap_pyfunction!(murmur2, module)?)?;
    module.add_function(wrap_pyfunction!(fnv1a, module)?)?;
    Ok(())
}
