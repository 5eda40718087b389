//! A single-device array's memory read through the buffer protocol, which jaxlib gives CPU
//! arrays: no numpy array is built per shard, as `np.asarray` would.

use std::ffi::c_int;

use fastpjit_core::strided::StridedView;
use pyo3::ffi;
use pyo3::prelude::*;

/// A read-only buffer over a shard, released (and the shard's external reference with it)
/// when dropped.
pub struct ShardBuffer {
    view: Box<ffi::Py_buffer>,
}

impl ShardBuffer {
    /// The buffer of `single`, if it offers one of `shape` with items of `itemsize` bytes.
    /// `None` (no Python error left set) otherwise: the caller then reads it as JAX does.
    pub fn get(single: &Bound<'_, PyAny>, shape: &[usize], itemsize: usize) -> Option<Self> {
        let mut view = Box::new(ffi::Py_buffer::new());
        // Strides without a format: the copy is of bytes, and the caller has checked that the
        // dtype is a plain numpy one.
        let flags: c_int = ffi::PyBUF_STRIDED_RO;
        // SAFETY: `view` is a fresh Py_buffer that lives on the heap until released in `drop`.
        if unsafe { ffi::PyObject_GetBuffer(single.as_ptr(), &raw mut *view, flags) } != 0 {
            // A platform or layout that jaxlib gives no buffer for.
            drop(PyErr::take(single.py()));
            return None;
        }
        let buffer = Self { view };
        buffer.matches(shape, itemsize).then_some(buffer)
    }

    fn matches(&self, shape: &[usize], itemsize: usize) -> bool {
        let view = &*self.view;
        let ndim = usize::try_from(view.ndim).unwrap_or(usize::MAX);
        if ndim != shape.len()
            || usize::try_from(view.itemsize).ok() != Some(itemsize)
            || view.buf.is_null() && shape.iter().product::<usize>() != 0
            || (ndim > 0 && (view.shape.is_null() || view.strides.is_null()))
        {
            return false;
        }
        self.shape() == shape
    }

    fn shape(&self) -> Vec<usize> {
        self.dims(self.view.shape)
            .iter()
            .map(|&d| usize::try_from(d).unwrap_or(usize::MAX))
            .collect()
    }

    fn dims(&self, ptr: *const ffi::Py_ssize_t) -> &[ffi::Py_ssize_t] {
        let ndim = usize::try_from(self.view.ndim).unwrap_or(0);
        if ndim == 0 {
            return &[];
        }
        // SAFETY: `matches` checked the pointer; the exporter keeps `ndim` entries there until
        // the buffer is released.
        unsafe { std::slice::from_raw_parts(ptr, ndim) }
    }

    /// The bytes that the buffer spans, and a strided view over them.
    pub fn bytes(&self) -> (&[u8], StridedView) {
        let strides = self.dims(self.view.strides).to_vec();
        let itemsize = usize::try_from(self.view.itemsize).unwrap_or(0);
        // SAFETY: the exporter keeps the memory that its shape and strides span alive and
        // unchanged until the buffer is released, and `self` outlives the slice.
        unsafe { spanned_bytes(self.view.buf.cast::<u8>(), self.shape(), strides, itemsize) }
    }
}

impl Drop for ShardBuffer {
    fn drop(&mut self) {
        // SAFETY: the view was filled by a successful PyObject_GetBuffer and is released once.
        // Every ShardBuffer is made and dropped with the GIL held (it is not Send).
        unsafe { ffi::PyBuffer_Release(&raw mut *self.view) };
    }
}

/// The bytes that an array at `data` of `shape` and byte `strides` spans, and a strided view
/// over them.
///
/// # Safety
/// That memory stays alive and unchanged while the slice is used.
pub unsafe fn spanned_bytes<'a>(
    data: *const u8,
    shape: Vec<usize>,
    strides: Vec<isize>,
    itemsize: usize,
) -> (&'a [u8], StridedView) {
    let (view, len) = StridedView::spanning(shape, strides, itemsize);
    if len == 0 {
        return (&[], view);
    }
    // SAFETY: the array's elements reach `view.offset` bytes before `data` and `len` in all.
    let bytes = std::slice::from_raw_parts(data.sub(view.offset), len);
    (bytes, view)
}
