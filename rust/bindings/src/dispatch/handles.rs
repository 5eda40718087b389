//! Python objects that every dispatch needs, fetched once from `fastpjit._jax`.

use std::sync::atomic::{AtomicU32, Ordering};

use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyString;

use super::context::MAX_STATES;
use crate::jax::{arrays, attribute as get, private, Arrays};

pub struct Handles {
    pub trace_context: Py<PyAny>,
    /// The jit key's states outside the trace context, and the getter of a state's value.
    pub jit_key_states: Vec<Py<PyAny>>,
    pub config_value: Py<PyAny>,
    pub post_hook_state: Py<PyAny>,
    /// Where `jax_disable_jit` sits in the trace context.
    pub disable_jit_index: usize,
    /// JAX's dispatch registry taking a pytree node apart one level: `(children, data)`.
    pub flatten_one_level: Py<PyAny>,
    /// The data and meta fields of a registered dataclass type, or None.
    pub dataclass_fields: Py<PyAny>,
    pub shard_arg: Py<PyAny>,
    /// How an array on one sharding becomes an executable input on another: as it is, copied
    /// by `batched_copy` (with the arguments given), or moved by `shard_arg`.
    pub array_input: Py<PyAny>,
    pub batched_copy: Py<PyAny>,
    /// `ExecuteResults.consume_with_handlers`, unbound.
    pub consume_with_handlers: Py<PyAny>,
    /// jaxlib's `collect_garbage`, which drains the queue of Python objects it released, and
    /// the executions counted since the start (see `count_execution`).
    collect_garbage: Py<PyAny>,
    executions: AtomicU32,
    /// jaxlib's array type, getters of it, and numpy's types, shared with the shard path.
    pub arrays: &'static Arrays,
    /// The getter of a `jaxlib` array's commitment, called directly (see `fastpjit._jax`).
    pub array_committed: Py<PyAny>,
    /// Whether a deleted array was donated (its buffer given to a computation) rather than
    /// deleted by `delete()`: JAX raises another error for each.
    pub array_was_donated: Py<PyAny>,
    /// jaxlib's transfer guard levels of this thread and of the process, and the level that
    /// lets every transfer through.
    guard_thread_state: Py<PyAny>,
    guard_global_state: Py<PyAny>,
    guard_allow: Py<PyAny>,
    /// `ArrayImpl._rewrap_with_aval_and_sharding`: the same buffers as another global array.
    pub rewrap: Py<PyAny>,
}

static HANDLES: PyOnceLock<Handles> = PyOnceLock::new();

/// How many executions may leave their released objects in jaxlib's queue before the
/// dispatcher drains it: at most this many objects wait, and a drain (~70 ns) costs under a
/// nanosecond a call.
const EXECUTIONS_PER_DRAIN: u32 = 128;

pub fn handles(py: Python<'_>) -> PyResult<&Handles> {
    HANDLES.get_or_try_init(py, || {
        let handles = fetch(py)?;
        if handles.jit_key_states.len() >= MAX_STATES {
            return Err(pyo3::exceptions::PyRuntimeError::new_err(format!(
                "fastpjit._jax.jit_key_states has {} states; the dispatcher reads at most {}",
                handles.jit_key_states.len(),
                MAX_STATES - 1
            )));
        }
        Ok(handles)
    })
}

fn fetch(py: Python<'_>) -> PyResult<Handles> {
    let jax = private(py)?;
    Ok(Handles {
        trace_context: get(jax, "trace_context")?,
        jit_key_states: jax
            .getattr("jit_key_states")?
            .try_iter()?
            .map(|state| state.map(Bound::unbind))
            .collect::<PyResult<_>>()?,
        config_value: get(jax, "config_value")?,
        post_hook_state: get(jax, "post_hook_state")?,
        disable_jit_index: jax.getattr("DISABLE_JIT_INDEX")?.extract()?,
        flatten_one_level: get(jax, "flatten_one_level_for_dispatch")?,
        dataclass_fields: get(jax, "dataclass_fields")?,
        shard_arg: get(jax, "shard_arg")?,
        array_input: get(jax, "array_input")?,
        batched_copy: get(jax, "batched_copy")?,
        consume_with_handlers: get(jax, "consume_with_handlers")?,
        collect_garbage: get(jax, "collect_garbage")?,
        executions: AtomicU32::new(0),
        arrays: arrays(py)?,
        array_committed: get(jax, "array_committed")?,
        array_was_donated: get(jax, "array_was_donated")?,
        guard_thread_state: get(jax, "transfer_guard_thread_state")?,
        guard_global_state: get(jax, "transfer_guard_global_state")?,
        guard_allow: get(jax, "TRANSFER_GUARD_ALLOW")?,
        rewrap: get(jax, "array_rewrap")?,
    })
}

impl Handles {
    /// Whether jaxlib's transfer guard watches host-to-device transfers now, on this thread.
    pub fn host_transfers_guarded(&self, py: Python<'_>) -> PyResult<bool> {
        self.transfers_guarded(pyo3::intern!(py, "host_to_device"))
    }

    /// Whether jaxlib's transfer guard watches transfers in `direction` (`"host_to_device"`,
    /// `"device_to_host"`, ...) now, on this thread.
    pub fn transfers_guarded(&self, direction: &Bound<'_, PyString>) -> PyResult<bool> {
        let py = direction.py();
        let mut level = self
            .guard_thread_state
            .bind(py)
            .call0()?
            .getattr(direction)?;
        if level.is_none() {
            level = self.guard_global_state.bind(py).getattr(direction)?;
        }
        let allow = self.guard_allow.bind(py);
        Ok(!(level.is_none() || level.is(allow) || level.eq(allow)?))
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
}
