//! The one place where core errors, and the dispatcher's refusals of a call, become Python
//! exceptions, each the type JAX raises for the same misuse.

use fastpjit_core::dispatch::plan::DonationClash;
use fastpjit_core::ShardingError;
use pyo3::exceptions::{PyNotImplementedError, PyValueError};
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

/// jaxlib's error for a donated buffer that a call also passes as another argument.
pub fn donation_clash(clash: &DonationClash) -> PyErr {
    let (what, example) = if clash.previously_donated {
        (
            "Attempt to use a buffer that was previously donated in the same call to Execute()",
            "f(donate(a), a)",
        )
    } else {
        (
            "Attempt to donate a buffer which is also used by the same call to Execute()",
            "f(a, donate(a))",
        )
    };
    PyValueError::new_err(format!(
        "INVALID_ARGUMENT: {what} (flattened argument {}, replica 0, partition 0, first use: \
         {}). Toy example for this bug: `{example}`.",
        clash.input, clash.first
    ))
}

/// JAX's error for an argument whose buffer an earlier computation consumed; `shape` is its
/// aval's short form.
pub fn donated_argument(position: usize, shape: &Bound<'_, PyAny>) -> PyErr {
    PyValueError::new_err(format!(
        "Invalid buffer passed as argument {position} (flattened): the array of shape={shape} \
         was donated to an earlier computation, so its buffer has been deleted or donated."
    ))
}
