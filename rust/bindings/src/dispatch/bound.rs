//! A function with resident arguments bound (`fastpjit.jit(f).bind(params)`): each call is the
//! function's call with the bound arguments first, dispatched by the same cache. The bound
//! arrays are the same objects on every call, so the dispatcher's memo of the latest calls'
//! arrays reads nothing of them again.

use pyo3::exceptions::{PyRuntimeError, PyTypeError, PyValueError};
use pyo3::gc::PyVisit;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyString, PyTuple};
use pyo3::PyTraverseError;

use super::handles::handles;
use super::JitFunction;

#[pyclass(module = "fastpjit._core", subclass, frozen)]
pub struct BoundFunction {
    function: Py<JitFunction>,
    args: Py<PyTuple>,
    kwargs: Py<PyDict>,
    /// The bound arrays, each with its path among the bound arguments, to name a deleted one.
    arrays: Vec<(Py<PyString>, Py<PyAny>)>,
}

#[pymethods]
impl BoundFunction {
    /// `function` with `args` and `kwargs` bound; `arrays` lists the bound jax.Arrays as
    /// `(path, array)`.
    #[new]
    fn new(
        function: Bound<'_, JitFunction>,
        args: Bound<'_, PyTuple>,
        kwargs: Bound<'_, PyDict>,
        arrays: &Bound<'_, PyList>,
    ) -> PyResult<Self> {
        let arrays = arrays
            .iter()
            .map(|item| item.extract::<(Py<PyString>, Py<PyAny>)>())
            .collect::<PyResult<_>>()?;
        Ok(Self {
            function: function.unbind(),
            args: args.unbind(),
            kwargs: kwargs.unbind(),
            arrays,
        })
    }

    #[pyo3(signature = (*args, **kwargs))]
    fn __call__<'py>(
        &self,
        py: Python<'py>,
        args: &Bound<'py, PyTuple>,
        kwargs: Option<&Bound<'py, PyDict>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let bound = self.args.bind(py);
        let all = if args.is_empty() {
            bound.clone()
        } else {
            let all: Vec<Bound<'py, PyAny>> = bound.iter().chain(args.iter()).collect();
            PyTuple::new(py, all)?
        };
        let bound_kwargs = self.kwargs.bind(py);
        let merged = match kwargs {
            _ if bound_kwargs.is_empty() => kwargs.cloned(),
            None => Some(bound_kwargs.clone()),
            Some(kwargs) => {
                let merged = bound_kwargs.copy()?;
                for (name, value) in kwargs.iter() {
                    if merged.contains(&name)? {
                        return Err(PyTypeError::new_err(format!(
                            "got multiple values for keyword argument {name}: it is bound"
                        )));
                    }
                    merged.set_item(name, value)?;
                }
                Some(merged)
            }
        };
        let function = self.function.bind(py);
        JitFunction::__call__(function, &all, merged.as_ref()).map_err(|err| self.named(py, err))
    }

    /// The function whose arguments are bound.
    #[getter(_function)]
    fn function(&self, py: Python<'_>) -> Py<JitFunction> {
        self.function.clone_ref(py)
    }

    #[getter(_args)]
    fn args(&self, py: Python<'_>) -> Py<PyTuple> {
        self.args.clone_ref(py)
    }

    #[getter(_kwargs)]
    fn kwargs(&self, py: Python<'_>) -> Py<PyDict> {
        self.kwargs.clone_ref(py)
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        visit.call(&self.function)?;
        visit.call(&self.args)?;
        visit.call(&self.kwargs)?;
        for (path, array) in &self.arrays {
            visit.call(path)?;
            visit.call(array)?;
        }
        Ok(())
    }
}

impl BoundFunction {
    /// `err`, naming the bound argument that it is about where a bound array was deleted or
    /// donated (read only when a call fails).
    fn named(&self, py: Python<'_>, err: PyErr) -> PyErr {
        if !(err.is_instance_of::<PyRuntimeError>(py) || err.is_instance_of::<PyValueError>(py)) {
            return err;
        }
        let Ok(h) = handles(py) else {
            return err;
        };
        for (path, array) in &self.arrays {
            let deleted = h
                .arrays
                .array_is_deleted
                .bind(py)
                .call1((array.bind(py),))
                .and_then(|d| d.is_truthy());
            if deleted.unwrap_or(false) {
                let named = PyErr::from_type(
                    err.get_type(py),
                    format!("bound argument {}: {}", path.bind(py), err.value(py)),
                );
                named.set_cause(py, Some(err));
                return named;
            }
        }
        err
    }
}
