//! Python objects that every dispatch needs, fetched once.

use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyType;

use crate::sharding::private;

pub struct Handles {
    pub trace_context: Py<PyAny>,
    pub flatten: Py<PyAny>,
    pub shard_arg: Py<PyAny>,
    pub array_impl: Py<PyType>,
    pub ndarray: Py<PyType>,
    pub numpy_scalar: Py<PyType>,
}

static HANDLES: PyOnceLock<Handles> = PyOnceLock::new();

pub fn handles(py: Python<'_>) -> PyResult<&Handles> {
    HANDLES.get_or_try_init(py, || {
        let jax = private(py)?;
        let numpy = py.import("numpy")?;
        let get =
            |module: &Bound<'_, PyModule>, name: &str| module.getattr(name).map(Bound::unbind);
        let get_type = |module: &Bound<'_, PyModule>, name: &str| -> PyResult<Py<PyType>> {
            Ok(module.getattr(name)?.cast_into::<PyType>()?.unbind())
        };
        Ok(Handles {
            trace_context: get(jax, "trace_context")?,
            flatten: get(jax, "flatten_for_dispatch")?,
            shard_arg: get(jax, "shard_arg")?,
            array_impl: get_type(&py.import("jax._src.array")?, "ArrayImpl")?,
            ndarray: get_type(&numpy, "ndarray")?,
            numpy_scalar: get_type(&numpy, "generic")?,
        })
    })
}
