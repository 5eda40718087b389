//! The one place where the bindings' errors (the dispatcher's refusals of a call included) and
//! the core's become Python exceptions, each the type JAX raises for the same misuse.

use std::borrow::Cow;

pub use fastpjit_core::error::DispatchError;
use fastpjit_core::error::ErrorKind;
use fastpjit_core::strided::CopyError;
use fastpjit_core::{LocalDataError, ShardingError};
use pyo3::exceptions::{
    PyMemoryError, PyNotImplementedError, PyOverflowError, PyRuntimeError, PyTypeError,
    PyValueError,
};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyTuple, PyType};

use crate::handles::{handles, names};

/// An error of the bindings outside the dispatcher, by the Python exception it becomes.
#[derive(Debug)]
pub enum Error {
    /// An argument of the wrong type: `TypeError`.
    Type(Cow<'static, str>),
    /// An argument of the right type but a wrong value: `ValueError`.
    Value(Cow<'static, str>),
    /// A number too large for its destination: `OverflowError`.
    Overflow(Cow<'static, str>),
    /// What JAX does not define either: `NotImplementedError`.
    NotImplemented(Cow<'static, str>),
    /// Host memory that could not be had: `MemoryError`.
    Memory(Cow<'static, str>),
    /// A state of the runtime or of an array that forbids the operation: `RuntimeError`.
    Runtime(Cow<'static, str>),
    /// A host copy that failed its checks, while doing `what`: `RuntimeError`.
    Copy { what: &'static str, err: CopyError },
    /// Process-local data whose shape does not fit the sharding: `ValueError`.
    LocalData(LocalDataError),
}

impl From<Error> for PyErr {
    fn from(err: Error) -> Self {
        match err {
            Error::Type(message) => PyTypeError::new_err(message),
            Error::Value(message) => PyValueError::new_err(message),
            Error::Overflow(message) => PyOverflowError::new_err(message),
            Error::NotImplemented(message) => PyNotImplementedError::new_err(message),
            Error::Memory(message) => PyMemoryError::new_err(message),
            Error::Runtime(message) => PyRuntimeError::new_err(message),
            Error::Copy { what, err } => PyRuntimeError::new_err(format!("{what} failed: {err}")),
            Error::LocalData(err) => PyValueError::new_err(err.to_string()),
        }
    }
}

impl From<LocalDataError> for Error {
    fn from(err: LocalDataError) -> Self {
        Self::LocalData(err)
    }
}

/// `repr(obj)` for a message, or `?` where `repr` itself fails.
pub fn shown(obj: &Bound<'_, PyAny>) -> String {
    obj.repr()
        .map_or_else(|_| "?".to_owned(), |r| r.to_string())
}

static INDIVISIBLE: PyOnceLock<Py<PyType>> = PyOnceLock::new();
static DUPLICATE_SPEC: PyOnceLock<Py<PyType>> = PyOnceLock::new();
static RANK: PyOnceLock<Py<PyType>> = PyOnceLock::new();
static NO_PLACEMENT: PyOnceLock<Py<PyType>> = PyOnceLock::new();

fn error_class<'py>(
    py: Python<'py>,
    cell: &'static PyOnceLock<Py<PyType>>,
    name: &str,
) -> PyResult<&'py Bound<'py, PyType>> {
    cell.import(py, "fastpjit.errors", name)
}

/// Converts `err`; `subject` (the sharding, where there is one) opens messages as JAX's do.
pub fn sharding_error(
    py: Python<'_>,
    err: &ShardingError,
    subject: Option<&Bound<'_, PyAny>>,
) -> PyErr {
    let about = subject.map_or_else(String::new, |s| {
        s.repr()
            .map_or_else(|_| String::new(), |r| format!("Sharding {r}: "))
    });
    let raise = |cell, name, message: String| match error_class(py, cell, name) {
        Ok(class) => PyErr::from_type(class.clone(), message),
        Err(import_error) => import_error,
    };
    match err {
        ShardingError::Indivisible {
            axis,
            partitions,
            size,
            shape,
            tiling,
        } => {
            // JAX's text, which differs by JAX line: the boundary writes it.
            let shown = subject.and_then(|s| s.repr().ok());
            let message = handles(py).and_then(|h| {
                h.indivisible_message
                    .bind(py)
                    .call1((
                        shown,
                        axis,
                        partitions,
                        size,
                        PyTuple::new(py, shape)?,
                        tiling,
                    ))?
                    .extract::<String>()
            });
            match message {
                Ok(message) => raise(&INDIVISIBLE, "IndivisibleError", message),
                Err(err) => err,
            }
        }
        ShardingError::DuplicateAxis { .. } => {
            // DuplicateSpecError(message, mesh, pspec) takes the offending objects too.
            match error_class(py, &DUPLICATE_SPEC, "DuplicateSpecError") {
                Ok(class) => {
                    let message = format!("{about}{err}");
                    let (mesh, spec) = subject.map_or((None, None), |s| {
                        (
                            s.getattr(names(py).mesh.bind(py)).ok(),
                            s.getattr(names(py).spec.bind(py)).ok(),
                        )
                    });
                    match class.call1((message, mesh, spec)) {
                        Ok(instance) => PyErr::from_value(instance),
                        Err(e) => e,
                    }
                }
                Err(import_error) => import_error,
            }
        }
        ShardingError::Rank { .. } => raise(&RANK, "ShardingRankError", format!("{about}{err}")),
        ShardingError::Unsupported(_) => {
            Error::NotImplemented(format!("{about}{err}").into()).into()
        }
        ShardingError::NoPlacement(_) => {
            raise(&NO_PLACEMENT, "NoPlacementError", format!("{about}{err}"))
        }
        ShardingError::UnknownAxis { .. }
        | ShardingError::Parse { .. }
        | ShardingError::Invalid(_) => Error::Value(format!("{about}{err}").into()).into(),
    }
}

/// A dispatcher's refusal (see the core's `DispatchError`), raised as the type that JAX raises
/// for it. (Taken by value: a refusal is made to be raised.)
#[allow(clippy::needless_pass_by_value)]
pub fn refusal(err: DispatchError) -> PyErr {
    let text = err.to_string();
    match err.kind() {
        ErrorKind::Runtime => PyRuntimeError::new_err(text),
        ErrorKind::Type => PyTypeError::new_err(text),
        ErrorKind::Value => PyValueError::new_err(text),
    }
}
