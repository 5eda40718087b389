//! The JAX boundary of the bindings: the private-API module `fastpjit._jax` (the one place
//! that names JAX's internals) and the attributes that Rust fetches once from modules.

use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyString, PyType};

static PRIVATE: PyOnceLock<Py<PyModule>> = PyOnceLock::new();

/// The private-API module `fastpjit._jax`, imported once.
pub fn private(py: Python<'_>) -> PyResult<&Bound<'_, PyModule>> {
    Ok(PRIVATE
        .get_or_try_init(py, || py.import("fastpjit._jax").map(Bound::unbind))?
        .bind(py))
}

/// `module.name`, kept.
pub fn attribute(module: &Bound<'_, PyModule>, name: &str) -> PyResult<Py<PyAny>> {
    module.getattr(name).map(Bound::unbind)
}

/// `module.name`, a class, kept.
pub fn type_attribute(module: &Bound<'_, PyModule>, name: &str) -> PyResult<Py<PyType>> {
    Ok(module.getattr(name)?.cast_into::<PyType>()?.unbind())
}

/// `module.name`, a string, interned: an attribute name that Rust looks up per call.
pub fn interned(module: &Bound<'_, PyModule>, name: &str) -> PyResult<Py<PyString>> {
    let value: String = module.getattr(name)?.extract()?;
    Ok(PyString::intern(module.py(), &value).unbind())
}

/// jaxlib's array type and the getters of it that Rust calls directly (see `fastpjit._jax`),
/// and numpy's types: what the dispatcher and the shard path both read.
pub struct Arrays {
    pub array_impl: Py<PyType>,
    pub array_aval: Py<PyAny>,
    pub array_sharding: Py<PyAny>,
    pub array_is_deleted: Py<PyAny>,
    pub asarray: Py<PyAny>,
    pub ndarray: Py<PyType>,
    pub numpy_scalar: Py<PyType>,
}

static ARRAYS: PyOnceLock<Arrays> = PyOnceLock::new();

/// The shared `Arrays`, fetched once.
pub fn arrays(py: Python<'_>) -> PyResult<&'static Arrays> {
    ARRAYS.get_or_try_init(py, || {
        let jax = private(py)?;
        let numpy = py.import("numpy")?;
        Ok(Arrays {
            array_impl: type_attribute(jax, "ArrayImpl")?,
            array_aval: attribute(jax, "array_aval")?,
            array_sharding: attribute(jax, "array_sharding")?,
            array_is_deleted: attribute(jax, "array_is_deleted")?,
            asarray: attribute(&numpy, "asarray")?,
            ndarray: type_attribute(&numpy, "ndarray")?,
            numpy_scalar: type_attribute(&numpy, "generic")?,
        })
    })
}
