//! Python objects that every dispatch needs, fetched once.

use std::sync::atomic::{AtomicU32, Ordering};

use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyTuple, PyType};

use crate::jax::{attribute as get, private, type_attribute as get_type};
use crate::transfer::deleted_error;

pub struct Handles {
    trace_context: Py<PyAny>,
    jit_key_states: Vec<Py<PyAny>>,
    config_value: Py<PyAny>,
    pub flatten: Py<PyAny>,
    pub shard_arg: Py<PyAny>,
    /// `ExecuteResults.consume_with_handlers`, unbound.
    pub consume_with_handlers: Py<PyAny>,
    /// jaxlib's `collect_garbage`, which drains the queue of Python objects it released, and
    /// the executions counted since the start (see `count_execution`).
    collect_garbage: Py<PyAny>,
    executions: AtomicU32,
    /// Getters of a `jaxlib` array's aval, sharding and commitment, and its `is_deleted`,
    /// called directly (see `fastpjit._jax`).
    pub array_aval: Py<PyAny>,
    pub array_sharding: Py<PyAny>,
    pub array_committed: Py<PyAny>,
    pub array_is_deleted: Py<PyAny>,
    pub array_impl: Py<PyType>,
    pub ndarray: Py<PyType>,
    pub numpy_scalar: Py<PyType>,
}

static HANDLES: PyOnceLock<Handles> = PyOnceLock::new();

/// How many executions may leave their released objects in jaxlib's queue before the
/// dispatcher drains it: at most this many objects wait, and a drain (~70 ns) costs under a
/// nanosecond a call.
const EXECUTIONS_PER_DRAIN: u32 = 128;

pub fn handles(py: Python<'_>) -> PyResult<&Handles> {
    HANDLES.get_or_try_init(py, || {
        let jax = private(py)?;
        let numpy = py.import("numpy")?;
        Ok(Handles {
            trace_context: get(jax, "trace_context")?,
            jit_key_states: jax
                .getattr("jit_key_states")?
                .try_iter()?
                .map(|state| state.map(Bound::unbind))
                .collect::<PyResult<_>>()?,
            config_value: get(jax, "config_value")?,
            flatten: get(jax, "flatten_for_dispatch")?,
            shard_arg: get(jax, "shard_arg")?,
            consume_with_handlers: get(jax, "consume_with_handlers")?,
            collect_garbage: get(jax, "collect_garbage")?,
            executions: AtomicU32::new(0),
            array_aval: get(jax, "array_aval")?,
            array_sharding: get(jax, "array_sharding")?,
            array_committed: get(jax, "array_committed")?,
            array_is_deleted: get(jax, "array_is_deleted")?,
            array_impl: get_type(jax, "ArrayImpl")?,
            ndarray: get_type(&numpy, "ndarray")?,
            numpy_scalar: get_type(&numpy, "generic")?,
        })
    })
}

impl Handles {
    /// Raises JAX's error if `array` (a `jaxlib` array) was deleted or donated.
    pub fn check_not_deleted(&self, array: &Bound<'_, PyAny>) -> PyResult<()> {
        let py = array.py();
        if self
            .array_is_deleted
            .bind(py)
            .call1((array,))?
            .is_truthy()?
        {
            return Err(deleted_error(array)?);
        }
        Ok(())
    }

    /// Counts one execution through `execute_sharded`, which leaves a Python object in jaxlib's
    /// queue of released objects, and drains the queue every `EXECUTIONS_PER_DRAIN` of them.
    /// Nothing else would in a loop of cached calls: jaxlib drains it in its own dispatch, which
    /// these calls skip, and JAX's gc callback only when a collection runs, which a loop that
    /// allocates no Python containers never starts. The call has run by now, so a failed drain
    /// is reported as unraisable rather than losing its results.
    pub fn count_execution(&self, py: Python<'_>) {
        if self.executions.fetch_add(1, Ordering::Relaxed) % EXECUTIONS_PER_DRAIN == 0 {
            if let Err(err) = self.collect_garbage.bind(py).call0() {
                err.write_unraisable(py, None);
            }
        }
    }

    /// JAX's jit key as one flat tuple: the trace context (x64, meshes in context, ...) and
    /// then the values of the states that only the compile sees.
    pub fn jit_key<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        let context = self.trace_context.bind(py).call0()?;
        let context = context.cast::<PyTuple>()?;
        let mut items: Vec<Bound<'py, PyAny>> =
            Vec::with_capacity(context.len() + self.jit_key_states.len());
        items.extend(context.iter());
        for state in &self.jit_key_states {
            items.push(self.config_value.bind(py).call1((state,))?);
        }
        PyTuple::new(py, items)
    }

    /// Whether JAX's jit key now is `stored` (as `jit_key` built it), item by item by
    /// identity; builds no tuple.
    pub fn jit_key_is(&self, py: Python<'_>, stored: &Bound<'_, PyTuple>) -> PyResult<bool> {
        let context = self.trace_context.bind(py).call0()?;
        let context = context.cast::<PyTuple>()?;
        if context.len() + self.jit_key_states.len() != stored.len() {
            return Ok(false);
        }
        let mut stored = stored.iter_borrowed();
        for item in context.iter_borrowed() {
            if stored.next().is_none_or(|s| !s.is(item)) {
                return Ok(false);
            }
        }
        for state in &self.jit_key_states {
            let value = self.config_value.bind(py).call1((state,))?;
            if stored.next().is_none_or(|s| !s.is(&value)) {
                return Ok(false);
            }
        }
        Ok(true)
    }
}
