//! What every folder's `py.rs` shares: reading Python bytes-like objects without a copy, and
//! turning a decoding error (`storage::records::DecodeResult`) into Python's `ValueError`.

use pyo3::buffer::PyBuffer;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList};

/// A decoding or range error message as a Python `ValueError`.
pub fn value_error(message: String) -> PyErr {
    PyValueError::new_err(message)
}

/// Run `f` over the bytes of `obj` (bytes, bytearray, memoryview, mmap): no copy.
pub fn with_bytes<R>(obj: &Bound<'_, PyAny>, f: impl FnOnce(&[u8]) -> PyResult<R>) -> PyResult<R> {
    if let Ok(bytes) = obj.downcast::<PyBytes>() {
        return f(bytes.as_bytes());
    }
    let buffer: PyBuffer<u8> = PyBuffer::get(obj)?;
    if !buffer.is_c_contiguous() {
        return Err(PyValueError::new_err("records section buffer is not contiguous"));
    }
    // SAFETY: the buffer is C-contiguous, `len_bytes` long, and kept alive (and exported, so not
    // resized) by `buffer` for the whole call. The cleaner's calls (`map_records`, `kept`,
    // `encode_retained`, `clear`) release the GIL while they only read it: their buffers are
    // the calling thread's own read buffers, which no other thread writes during the call.
    let data = unsafe { std::slice::from_raw_parts(buffer.buf_ptr() as *const u8, buffer.len_bytes()) };
    f(data)
}

/// Run `f` over the bytes of every item of `items` (each bytes-like, `what` naming them in the
/// error for a non-contiguous buffer), in order, no copy; with the GIL released when every buffer
/// is read-only (bytes, a read-only memoryview or mmap). A writable one (a bytearray, a writable
/// mmap) is read with the GIL held, since another thread could change it meanwhile.
pub fn with_bytes_of_each<R: Send>(list: &Bound<'_, PyList>, what: &str,
                                   f: impl FnOnce(&[&[u8]]) -> R + Send) -> PyResult<R> {
    // Strong references and buffer exports keep every item's bytes alive and unresized while the
    // GIL is released (the list itself could be changed meanwhile).
    let items: Vec<Bound<'_, PyAny>> = list.iter().collect();
    let mut exports: Vec<PyBuffer<u8>> = Vec::new();
    let mut slices: Vec<(*const u8, usize)> = Vec::with_capacity(items.len());
    let mut read_only = true;
    for item in &items {
        if let Ok(bytes) = item.downcast::<PyBytes>() {
            let data = bytes.as_bytes();
            slices.push((data.as_ptr(), data.len()));
        } else {
            let buffer: PyBuffer<u8> = PyBuffer::get(item)?;
            if !buffer.is_c_contiguous() {
                return Err(PyValueError::new_err(format!("{what} buffer is not contiguous")));
            }
            read_only &= buffer.readonly();
            slices.push((buffer.buf_ptr() as *const u8, buffer.len_bytes()));
            exports.push(buffer);
        }
    }
    // SAFETY: each (pointer, length) is a C-contiguous buffer kept alive by `items` (bytes
    // are immutable) or exported by `exports` until this call returns; the GIL is released
    // only when every buffer is read-only, so no Python code can write them meanwhile.
    let slices: Vec<&[u8]> = slices.into_iter().map(|(p, n)| unsafe { std::slice::from_raw_parts(p, n) }).collect();
    let outcome = if read_only { list.py().allow_threads(|| f(&slices)) } else { f(&slices) };
    drop(exports);
    Ok(outcome)
}
