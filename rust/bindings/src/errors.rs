//! The one place where core errors, and the dispatcher's refusals of a call, become Python
//! exceptions, each the type JAX raises for the same misuse.

use fastpjit_core::dispatch::plan::DonationClash;
use fastpjit_core::ShardingError;
use pyo3::exceptions::{PyNotImplementedError, PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyType;

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
        ShardingError::Indivisible { .. } => {
            let message = match subject.and_then(|s| s.repr().ok()) {
                Some(r) => format!("Sharding {r} implies that {err}"),
                None => format!("The sharding implies that {err}"),
            };
            raise(&INDIVISIBLE, "IndivisibleError", message)
        }
        ShardingError::DuplicateAxis { .. } => {
            // DuplicateSpecError(message, mesh, pspec) takes the offending objects too.
            match error_class(py, &DUPLICATE_SPEC, "DuplicateSpecError") {
                Ok(class) => {
                    let message = format!("{about}{err}");
                    let (mesh, spec) = subject.map_or((None, None), |s| {
                        (s.getattr("mesh").ok(), s.getattr("spec").ok())
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
        ShardingError::Unsupported(_) => PyNotImplementedError::new_err(format!("{about}{err}")),
        ShardingError::NoPlacement(_) => {
            raise(&NO_PLACEMENT, "NoPlacementError", format!("{about}{err}"))
        }
        ShardingError::UnknownAxis { .. }
        | ShardingError::Parse { .. }
        | ShardingError::Invalid(_) => PyValueError::new_err(format!("{about}{err}")),
    }
}

/// The dispatcher's refusals of a call or of what a cache miss returned, each raised as the
/// type that JAX raises for it.
pub enum DispatchError {
    /// The function's callables were cleared (by the garbage collector).
    Cleared,
    /// A keyword argument of a bound function's call is bound already.
    BoundKeyword(String),
    /// The cache miss described another number of arguments than the call has.
    MissArity { described: usize, call: usize },
    /// The cache miss's `FastPath` does not hold together.
    FastPath(String),
    /// The executable's outputs do not make its output tree.
    OutputTree(String),
    /// A static argument's `==` raised (`error`, between objects of these types).
    StaticComparison {
        types: (String, String),
        error: String,
    },
    /// A donated buffer that the call also passes as another argument (as jaxlib says).
    DonationClash(DonationClash),
    /// An argument whose buffer an earlier computation consumed; `shape` its aval's short form.
    DonatedArgument { position: usize, shape: String },
}

impl From<DispatchError> for PyErr {
    fn from(err: DispatchError) -> Self {
        match err {
            DispatchError::Cleared => PyRuntimeError::new_err("this jit function was cleared"),
            DispatchError::BoundKeyword(name) => PyTypeError::new_err(format!(
                "got multiple values for keyword argument {name}: it is bound"
            )),
            DispatchError::MissArity { described, call } => PyRuntimeError::new_err(format!(
                "the cache miss described {described} arguments for a call of {call}"
            )),
            DispatchError::FastPath(why) => PyValueError::new_err(format!("FastPath: {why}")),
            DispatchError::OutputTree(why) => PyRuntimeError::new_err(why),
            DispatchError::StaticComparison { types, error } => PyValueError::new_err(format!(
                "static arguments should be comparable using __eq__.The following error was \
                 raised when comparing two objects of types {} and {}. The error was:\n{error}",
                types.0, types.1
            )),
            DispatchError::DonationClash(clash) => {
                let (what, example) = if clash.previously_donated {
                    (
                        "Attempt to use a buffer that was previously donated in the same call \
                         to Execute()",
                        "f(donate(a), a)",
                    )
                } else {
                    (
                        "Attempt to donate a buffer which is also used by the same call to \
                         Execute()",
                        "f(a, donate(a))",
                    )
                };
                PyValueError::new_err(format!(
                    "INVALID_ARGUMENT: {what} (flattened argument {}, replica 0, partition 0, \
                     first use: {}). Toy example for this bug: `{example}`.",
                    clash.input, clash.first
                ))
            }
            DispatchError::DonatedArgument { position, shape } => PyValueError::new_err(format!(
                "Invalid buffer passed as argument {position} (flattened): the array of \
                 shape={shape} was donated to an earlier computation, so its buffer has been \
                 deleted or donated."
            )),
        }
    }
}
