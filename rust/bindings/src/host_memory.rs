//! New numpy arrays for transfers: large ones over memory from the process's host pool (see
//! `fastpjit_core::host_pool`), given back when the array and every view of it are gone.

use std::ffi::c_int;

use fastpjit_core::host_pool::{HostPool, Lease};
use numpy::npyffi::{get_type_object, npy_intp, NpyTypes, NPY_ARRAY_CARRAY, PY_ARRAY_API};
use numpy::{PyArrayDescr, PyArrayDescrMethods, PyUntypedArray};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::errors::Error;

/// Arrays of at least this many bytes take their memory from the pool; numpy's allocator,
/// which reuses small blocks itself, serves the rest.
pub const POOLED_BYTES: usize = 1 << 20;

/// The most idle bytes that the pool keeps unless `set_host_pool_limit` says otherwise.
const DEFAULT_LIMIT: usize = 1 << 30;

static HOST_POOL: HostPool = HostPool::new(DEFAULT_LIMIT);

/// The owner of a pooled array's memory: numpy's `base` of the array.
#[pyclass(frozen, module = "fastpjit._core")]
struct PooledMemory {
    _lease: Lease,
}

/// A new C-ordered, writeable array of `shape` and `descr`, uninitialised, as `np.empty`
/// makes it; from the pool when it spans `POOLED_BYTES` or more.
pub fn empty_array<'py>(
    shape: &[usize],
    descr: &Bound<'py, PyArrayDescr>,
) -> PyResult<Bound<'py, PyUntypedArray>> {
    let py = descr.py();
    let mut dims = shape
        .iter()
        .map(|&d| npy_intp::try_from(d))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|_| Error::Overflow("array dimension too large".into()))?;
    let nbytes = shape
        .iter()
        .try_fold(descr.itemsize(), |n, &d| n.checked_mul(d))
        .ok_or_else(|| Error::Overflow("array too large".into()))?;
    if nbytes < POOLED_BYTES {
        let ndim =
            c_int::try_from(dims.len()).map_err(|_| Error::Value("too many dimensions".into()))?;
        // SAFETY: PyArray_Empty steals the descr reference that `into_dtype_ptr` adds, and
        // reads `ndim` dimensions.
        let ptr = unsafe {
            PY_ARRAY_API.PyArray_Empty(
                py,
                ndim,
                dims.as_mut_ptr(),
                descr.clone().into_dtype_ptr(),
                0,
            )
        };
        // SAFETY: a new reference, or null with a Python error set.
        let array = unsafe { Bound::from_owned_ptr_or_err(py, ptr)? };
        return Ok(array.cast_into::<PyUntypedArray>()?);
    }
    let lease = HOST_POOL.take(nbytes).ok_or_else(|| {
        Error::Memory(format!("cannot allocate {nbytes} bytes of host memory").into())
    })?;
    let data = lease.as_mut_ptr();
    let owner = Bound::new(py, PooledMemory { _lease: lease })?.into_any();
    // The array's base is a writeable byte array over the block, owned by `owner`: numpy lets
    // a caller set `writeable` back on an array whose base chain ends in a writeable array, as
    // on the arrays that JAX returns.
    let mut len =
        [npy_intp::try_from(nbytes).map_err(|_| Error::Overflow("array too large".into()))?];
    let bytes = numpy::dtype::<u8>(py);
    // SAFETY: `data` spans `nbytes` writable bytes, aligned for any dtype, that `owner` keeps
    // alive, and `bytes` keeps `owner` alive (so does `array` keep `bytes`).
    let bytes = unsafe { array_over(&bytes, &mut len, data, owner)? };
    Ok(unsafe { array_over(descr, &mut dims, data, bytes.into_any())? })
}

/// A new C-ordered, writeable array of `descr` and `dims` over `data`, whose base becomes
/// `owner`.
///
/// # Safety
/// `data` spans the array's bytes, aligned for `descr`, for as long as `owner` lives.
unsafe fn array_over<'py>(
    descr: &Bound<'py, PyArrayDescr>,
    dims: &mut [npy_intp],
    data: *mut u8,
    owner: Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyUntypedArray>> {
    let py = descr.py();
    let ndim =
        c_int::try_from(dims.len()).map_err(|_| Error::Value("too many dimensions".into()))?;
    // SAFETY: the array takes the descr reference that `into_dtype_ptr` adds, and numpy
    // derives C-ordered strides when none are given.
    let ptr = unsafe {
        PY_ARRAY_API.PyArray_NewFromDescr(
            py,
            get_type_object(py, NpyTypes::PyArray_Type),
            descr.clone().into_dtype_ptr(),
            ndim,
            dims.as_mut_ptr(),
            std::ptr::null_mut(),
            data.cast(),
            NPY_ARRAY_CARRAY,
            std::ptr::null_mut(),
        )
    };
    // SAFETY: a new reference, or null with a Python error set (then `owner` is dropped).
    let array = unsafe { Bound::from_owned_ptr_or_err(py, ptr)? };
    // SAFETY: `array` is a new ndarray without a base; SetBaseObject steals the reference
    // given to it, and fails only with a Python error set.
    if unsafe { PY_ARRAY_API.PyArray_SetBaseObject(py, array.as_ptr().cast(), owner.into_ptr()) }
        != 0
    {
        return Err(PyErr::fetch(py));
    }
    Ok(array.cast_into::<PyUntypedArray>()?)
}

/// The host pool's counters: `{"hits", "misses", "idle_blocks", "idle_bytes", "limit"}`.
pub fn host_pool_stats(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    let stats = HOST_POOL.stats();
    let out = PyDict::new(py);
    out.set_item("hits", stats.hits)?;
    out.set_item("misses", stats.misses)?;
    out.set_item("idle_blocks", stats.idle_blocks)?;
    out.set_item("idle_bytes", stats.idle_bytes)?;
    out.set_item("limit", stats.limit)?;
    Ok(out)
}

pub fn reset_host_pool_counters() {
    HOST_POOL.reset_counters();
}

/// Sets the most bytes of idle host memory that fastpjit keeps for reuse by large transfers
/// (1 GiB by default); 0 frees the idle memory and keeps none.
#[pyfunction]
pub fn set_host_pool_limit(nbytes: usize) {
    HOST_POOL.set_limit(nbytes);
}
