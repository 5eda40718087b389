//! The contract between a cache miss, which Python runs, and the Rust dispatcher: the miss
//! returns a `CacheMiss`, and where the call can take the fast path next time, the
//! `FastPath` that a cache entry is built from. Both are checked when they are made.

use fastpjit_core::Why;
use pyo3::prelude::*;

use crate::errors::{refusal, DispatchError};
use pyo3::types::PyList;

/// An aval and a sharding: what a value of a pmap across processes becomes.
pub type Conversion = (Py<PyAny>, Py<PyAny>);

/// What a cached call needs to run an executable without Python of ours, as JAX's fast-path
/// data has it (`pxla.MeshExecutableFastpathData`).
#[pyclass(module = "fastpjit._core", frozen, get_all)]
pub struct FastPath {
    /// The `LoadedExecutable`.
    pub executable: Py<PyAny>,
    /// The treedef of the outputs.
    pub out_treedef: Py<PyAny>,
    /// One result handler per output leaf.
    pub out_handlers: Py<PyList>,
    /// The sharding of each executable input, in executable order.
    pub in_shardings: Vec<Py<PyAny>>,
    /// Whether each of `[const args..., flat args...]` is an executable input.
    pub kept: Vec<bool>,
    /// The constants that the executable takes first, already on their devices.
    pub const_args: Vec<Py<PyAny>>,
    /// Whether each flat argument is donated.
    pub donated: Vec<bool>,
    /// For a pmap across processes, whose calls take and return host-local arrays: the global
    /// aval and sharding that each flat argument becomes, and the local aval and sharding that
    /// each output leaf becomes (None for one that stays as it is).
    pub in_global: Option<Vec<Option<Conversion>>>,
    pub out_local: Option<Vec<Option<Conversion>>>,
    /// The sharding of each output leaf, where the miss knows it (for `fastpjit.explain`).
    pub out_shardings: Vec<Py<PyAny>>,
}

#[pymethods]
impl FastPath {
    #[new]
    #[pyo3(signature = (
        *, executable, out_treedef, out_handlers, in_shardings, kept, const_args, donated,
        in_global = None, out_local = None, out_shardings = Vec::new(),
    ))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        executable: Py<PyAny>,
        out_treedef: Py<PyAny>,
        out_handlers: Py<PyList>,
        in_shardings: Vec<Py<PyAny>>,
        kept: Vec<bool>,
        const_args: Vec<Py<PyAny>>,
        donated: Vec<bool>,
        in_global: Option<Vec<Option<Conversion>>>,
        out_local: Option<Vec<Option<Conversion>>>,
        out_shardings: Vec<Py<PyAny>>,
    ) -> PyResult<Self> {
        let inputs = kept.iter().filter(|&&k| k).count();
        if inputs != in_shardings.len() {
            return Err(refusal(DispatchError::FastPath(format!(
                "{} input shardings for the {inputs} inputs that `kept` marks",
                in_shardings.len()
            ))));
        }
        if kept.len() != const_args.len() + donated.len() {
            return Err(refusal(DispatchError::FastPath(format!(
                "`kept` has {} flags for {} constants and {} arguments",
                kept.len(),
                const_args.len(),
                donated.len()
            ))));
        }
        if in_global.as_ref().is_some_and(|g| g.len() != donated.len()) {
            return Err(refusal(DispatchError::FastPath(
                "`in_global` needs one entry per argument".to_owned(),
            )));
        }
        let outputs = out_handlers.bind(py).len();
        if out_local.as_ref().is_some_and(|l| l.len() != outputs) {
            return Err(refusal(DispatchError::FastPath(
                "`out_local` needs one entry per output".to_owned(),
            )));
        }
        if !out_shardings.is_empty() && out_shardings.len() != outputs {
            return Err(refusal(DispatchError::FastPath(
                "`out_shardings` needs one entry per output, or none".to_owned(),
            )));
        }
        Ok(Self {
            executable,
            out_treedef,
            out_handlers,
            in_shardings,
            kept,
            const_args,
            donated,
            in_global,
            out_local,
            out_shardings,
        })
    }
}

/// What a cache miss returns: the call's outputs; the fast path for the next such call, or
/// None where JAX must run it; the backend compiles the miss ran; and, where JAX rather than
/// fastpjit lowered and compiled the call (or runs it), why (a `Why` code: `"effects"`, ...).
#[pyclass(module = "fastpjit._core", frozen)]
pub struct CacheMiss {
    #[pyo3(get)]
    pub outputs: Py<PyAny>,
    #[pyo3(get)]
    pub fast_path: Option<Py<FastPath>>,
    #[pyo3(get)]
    pub compiles: u64,
    pub why: Option<Why>,
}

impl CacheMiss {
    /// Why JAX runs the calls of a miss without a fast path.
    pub fn why(&self) -> Why {
        self.why.unwrap_or(Why::NoFastPath)
    }
}

#[pymethods]
impl CacheMiss {
    #[new]
    #[pyo3(signature = (outputs, fast_path, *, compiles, jax_reason))]
    fn new(
        outputs: Py<PyAny>,
        fast_path: Option<Py<FastPath>>,
        compiles: u64,
        jax_reason: Option<&str>,
    ) -> PyResult<Self> {
        let why = jax_reason
            .map(|code| {
                Why::from_code(code)
                    .ok_or_else(|| refusal(DispatchError::UnknownFallback(code.to_owned())))
            })
            .transpose()?;
        Ok(Self {
            outputs,
            fast_path,
            compiles,
            why,
        })
    }

    /// The code of why JAX compiled the call or runs it, or None.
    #[getter]
    fn jax_reason(&self) -> Option<&'static str> {
        self.why.map(Why::code)
    }
}
