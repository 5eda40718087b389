//! JAX's jit key: the configuration that a call's executable depends on besides its arguments.
//! It is the trace context (x64, meshes in context, ...) and the states that only the jit key
//! holds (the trace state, which tells an active trace apart, the default device, ...). Each
//! is read on every call, as JAX's own dispatcher reads them, and compared item by item:
//! by identity first, then by `==`.

use fastpjit_core::dispatch::MAX_STATES;
use pyo3::prelude::*;
use pyo3::types::PyTuple;

use crate::handles::Handles;

/// The jit key as a call finds it.
pub struct LiveContext<'py> {
    trace: Bound<'py, PyTuple>,
    /// The states, then JAX's post-hook (the NaN and inf checks of `jax_debug_nans` and
    /// `jax_debug_infs`), which is no part of JAX's jit key, but is of ours: with the checks
    /// on, pmap donates nothing, so it compiles another executable. Held inline: the jit key
    /// is read on every call.
    states: [Option<Bound<'py, PyAny>>; MAX_STATES],
    num_states: usize,
}

/// A jit key kept in a cache entry, holding every object it compares.
pub struct Context {
    trace: Py<PyTuple>,
    states: Vec<Py<PyAny>>,
}

impl Context {
    /// The jit key's items, in the order that `jit_key_names` names them.
    pub fn items<'py>(&self, py: Python<'py>) -> Vec<Bound<'py, PyAny>> {
        let trace = self.trace.bind(py).iter();
        trace
            .chain(self.states.iter().map(|s| s.bind(py).clone()))
            .collect()
    }
}

impl<'py> LiveContext<'py> {
    pub fn read(py: Python<'py>, h: &Handles) -> PyResult<Self> {
        let trace = h.trace_context.bind(py).call0()?.cast_into::<PyTuple>()?;
        let mut states = [const { None }; MAX_STATES];
        let all = h.jit_key_states.iter().chain([&h.post_hook_state]);
        for (slot, state) in states.iter_mut().zip(all) {
            *slot = Some(h.config_value.bind(py).call1((state,))?);
        }
        Ok(Self {
            trace,
            states,
            num_states: h.jit_key_states.len() + 1,
        })
    }

    /// The jit key of a function that has none: a compiled module from another frontend
    /// depends on no configuration, and no trace can stage it.
    pub fn none(py: Python<'py>) -> Self {
        Self {
            trace: PyTuple::empty(py),
            states: [const { None }; MAX_STATES],
            num_states: 0,
        }
    }

    fn states(&self) -> impl Iterator<Item = &Bound<'py, PyAny>> {
        self.states[..self.num_states].iter().flatten()
    }

    /// JAX's post-hook, if one is set: the call's outputs go through it.
    pub fn post_hook(&self) -> Option<&Bound<'py, PyAny>> {
        self.states[self.num_states.checked_sub(1)?]
            .as_ref()
            .filter(|hook| !hook.is_none())
    }

    pub fn py(&self) -> Python<'py> {
        self.trace.py()
    }

    /// Whether `jax.disable_jit()` is on, in which case JAX calls the function itself.
    pub fn jit_disabled(&self, h: &Handles) -> PyResult<bool> {
        self.trace.get_item(h.disable_jit_index)?.is_truthy()
    }

    pub fn keep(&self) -> Context {
        Context {
            trace: self.trace.clone().unbind(),
            states: self.states().map(|s| s.clone().unbind()).collect(),
        }
    }

    /// Whether `kept` is this jit key; an item whose `==` raises counts as different. The
    /// items are nearly always the very objects kept, so they are compared by address first.
    pub fn is(&self, kept: &Context) -> bool {
        let py = self.trace.py();
        let (ours, theirs) = (self.trace.as_slice(), kept.trace.bind(py).as_slice());
        if ours.len() != theirs.len() || kept.states.len() != self.num_states {
            return false;
        }
        // Compared without stopping at the first difference, which lets the compiler compare
        // several at once: the trace context has dozens of items.
        let identical = ours
            .iter()
            .zip(theirs)
            .fold(true, |same, (a, b)| same & (a.as_ptr() == b.as_ptr()))
            && self
                .states()
                .zip(&kept.states)
                .all(|(a, b)| a.as_ptr() == b.as_ptr());
        if identical {
            return true;
        }
        let same = |a: &Bound<'_, PyAny>, b: &Bound<'_, PyAny>| a.is(b) || a.eq(b).unwrap_or(false);
        ours.iter().zip(theirs).all(|(a, b)| same(a, b))
            && self
                .states()
                .zip(&kept.states)
                .all(|(a, b)| same(a, b.bind(py)))
    }
}
