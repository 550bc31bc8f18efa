//! `materializer.storage._native`: the hot loops over Kafka v2 record bytes.
//!
//! Only loops over bytes live here; the Python modules of `storage/` stay the API and the
//! readable definition of each format (`record_reference.py` is the reference decoder the
//! tests hold this code to).
//!
//! The Kafka log engine's loops (`storage/`, for `materializer.storage`), the adapters' writers
//! (`adapters/`: RocksDB SST files, store entries, Arrow columns for Spark) and the producers'
//! key hashes (`clients/`, for `materializer/group/routing.py`) are separate module trees of pure Rust;
//! each folder's `py.rs` binds its modules and `binding.rs` holds what those bindings share
//! (reading bytes-like objects, `ValueError`). This file only assembles the one extension module
//! `materializer.storage._native` from them.

use pyo3::prelude::*;

mod adapters;
mod binding;
mod clients;
mod storage;

/// The extension module.
#[pymodule]
fn _native(module: &Bound<'_, PyModule>) -> PyResult<()> {
    storage::py::register(module)?;
    clients::py::register(module)?;
    adapters::py::register(module)?;
    Ok(())
}
