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
