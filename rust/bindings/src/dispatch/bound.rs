//! A function with resident arguments bound (`fastpjit.jit(f).bind(params)`): each call is the
//! function's call with the bound arguments first, dispatched by the same cache. The bound
//! arrays are the same objects on every call, so the dispatcher's memo of the latest calls'
//! arrays reads nothing of them again. Host values bound to a function whose input shardings
//! are known only once it has compiled are placed after the first call, on the shardings that
//! its executable takes (`settle`, run once). Once a call of positional arrays has run, its
//! cache entry is kept (`BoundPath`): a later call whose arrays have the same avals,
//! shardings and commitment under the same jit key runs it directly, reading the bound
//! leaves no more (a call costs what the executable does, plus the call's own arguments).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use fastpjit_core::dispatch::{can_run, can_teach, Learning};
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::gc::PyVisit;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyString, PyTuple};
use pyo3::PyTraverseError;

use super::context::LiveContext;
use super::function::JitFunction;
use super::leaf::LiveLeaf;
use super::shared::{Cached, Outcome};
use super::signature::{is_key_of, is_positional_under, PyCompare};
use super::tree::Tree;
use crate::errors::{refusal, DispatchError};
use crate::handles::{handles, Handles};
use crate::stats::{mark, record, Clock, Counter};
use fastpjit_core::timing::Stage;

/// What a bound function's calls take (see the core's `BoundPath`).
type BoundPath = fastpjit_core::dispatch::BoundPath<Arc<Cached>, Py<PyAny>>;

#[pyclass(module = "fastpjit._core", subclass, frozen)]
pub struct BoundFunction {
    function: Py<JitFunction>,
    bound: Mutex<Arguments>,
    /// `settle(self)`, run after the first call that succeeds while it is set, places the host
    /// values bound on the shardings that the call's executable took.
    settle: Mutex<Option<Py<PyAny>>>,
    unsettled: AtomicBool,
    /// The entry that calls of positional arrays take, learned from the first such call: a
    /// call that has its signature runs it without reading the bound leaves again.
    path: Mutex<Option<Arc<BoundPath>>>,
    learning: Learning,
}

/// The bound arguments, and the bound arrays, each with its path among them (to name a deleted
/// one).
struct Arguments {
    args: Py<PyTuple>,
    kwargs: Py<PyDict>,
    arrays: Vec<(Py<PyString>, Py<PyAny>)>,
}

impl Arguments {
    fn new(
        args: Bound<'_, PyTuple>,
        kwargs: Bound<'_, PyDict>,
        arrays: &Bound<'_, PyList>,
    ) -> PyResult<Self> {
        let arrays = arrays
            .iter()
            .map(|item| item.extract::<(Py<PyString>, Py<PyAny>)>())
            .collect::<PyResult<_>>()?;
        Ok(Self {
            args: args.unbind(),
            kwargs: kwargs.unbind(),
            arrays,
        })
    }

    fn clone_ref(&self, py: Python<'_>) -> (Py<PyTuple>, Py<PyDict>) {
        (self.args.clone_ref(py), self.kwargs.clone_ref(py))
    }
}

#[pymethods]
impl BoundFunction {
    /// `function` with `args` and `kwargs` bound; `arrays` lists the bound jax.Arrays as
    /// `(path, array)`; `settle`, if given, runs after the first call (see above).
    #[new]
    #[pyo3(signature = (function, args, kwargs, arrays, settle = None))]
    fn new(
        function: Bound<'_, JitFunction>,
        args: Bound<'_, PyTuple>,
        kwargs: Bound<'_, PyDict>,
        arrays: &Bound<'_, PyList>,
        settle: Option<Py<PyAny>>,
    ) -> PyResult<Self> {
        Ok(Self {
            function: function.unbind(),
            bound: Mutex::new(Arguments::new(args, kwargs, arrays)?),
            unsettled: AtomicBool::new(settle.is_some()),
            settle: Mutex::new(settle),
            path: Mutex::new(None),
            learning: Learning::default(),
        })
    }

    /// Binds these arguments instead (placed versions of the same values), once settled.
    #[pyo3(name = "_settle_with")]
    fn settle_with(
        &self,
        args: Bound<'_, PyTuple>,
        kwargs: Bound<'_, PyDict>,
        arrays: &Bound<'_, PyList>,
    ) -> PyResult<()> {
        let settled = Arguments::new(args, kwargs, arrays)?;
        let old = std::mem::replace(&mut *self.lock(), settled);
        let path = self
            .path
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        drop((old, path));
        Ok(())
    }

    #[pyo3(signature = (*args, **kwargs))]
    fn __call__<'py>(
        slf: &Bound<'py, Self>,
        args: &Bound<'py, PyTuple>,
        kwargs: Option<&Bound<'py, PyDict>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let py = slf.py();
        let this = slf.get();
        let function = this.function.bind(py);
        let mut clock = Clock::start();
        let h = handles(py)?;
        let path = this
            .path
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        if let Some(path) = path
            .as_ref()
            .filter(|_| kwargs.is_none_or(PyDictMethods::is_empty))
        {
            if let Some(out) = function
                .get()
                .run_bound(h, path, args, &mut clock)
                .map_err(|err| this.named(py, err))?
            {
                return Ok(out);
            }
        }
        let (bound, bound_kwargs) = this.lock().clone_ref(py);
        let bound = bound.bind(py);
        let all = if args.is_empty() {
            bound.clone()
        } else {
            let all: Vec<Bound<'py, PyAny>> = bound.iter().chain(args.iter()).collect();
            PyTuple::new(py, all)?
        };
        let bound_kwargs = bound_kwargs.bind(py);
        let merged = match kwargs {
            _ if bound_kwargs.is_empty() => kwargs.cloned(),
            None => Some(bound_kwargs.clone()),
            Some(kwargs) => {
                let merged = bound_kwargs.copy()?;
                for (name, value) in kwargs.iter() {
                    if merged.contains(&name)? {
                        return Err(refusal(DispatchError::BoundKeyword(name.to_string())));
                    }
                    merged.set_item(name, value)?;
                }
                Some(merged)
            }
        };
        let out = JitFunction::__call__(function, &all, merged.as_ref())
            .map_err(|err| this.named(py, err))?;
        let stale = path
            .as_ref()
            .is_none_or(|path| !function.get().is_current(path));
        if this.learning.should_learn(
            stale,
            merged.is_some(),
            this.unsettled.load(Ordering::Relaxed),
        ) {
            match function.get().bound_path(py, h, &all, args.len())? {
                Some(learned) => {
                    *this.path.lock().unwrap_or_else(PoisonError::into_inner) =
                        Some(Arc::new(learned));
                }
                None => this.learning.failed(),
            }
        }
        if this.unsettled.load(Ordering::Relaxed) {
            let settle = this
                .settle
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .take();
            if let Some(settle) = settle {
                this.unsettled.store(false, Ordering::Relaxed);
                settle.call1(py, (slf,))?;
            }
        }
        Ok(out)
    }

    /// Whether calls take the bound path: one was learned since the cache was last cleared
    /// (for `fastpjit.explain`; a call of other avals still leaves it for the dispatcher).
    #[getter(_on_bound_path)]
    fn on_bound_path(&self, py: Python<'_>) -> bool {
        let path = self.path.lock().unwrap_or_else(PoisonError::into_inner);
        path.as_ref()
            .is_some_and(|path| self.function.bind(py).get().is_current(path))
    }

    /// The function whose arguments are bound.
    #[getter(_function)]
    fn function(&self, py: Python<'_>) -> Py<JitFunction> {
        self.function.clone_ref(py)
    }

    #[getter(_args)]
    fn args(&self, py: Python<'_>) -> Py<PyTuple> {
        self.lock().args.clone_ref(py)
    }

    #[getter(_kwargs)]
    fn kwargs(&self, py: Python<'_>) -> Py<PyDict> {
        self.lock().kwargs.clone_ref(py)
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        visit.call(&self.function)?;
        if let Ok(settle) = self.settle.try_lock() {
            visit.call(settle.as_ref())?;
        }
        if let Ok(Some(path)) = self.path.try_lock().as_deref() {
            for leaf in &path.leaves {
                visit.call(leaf)?;
            }
        }
        if let Ok(bound) = self.bound.try_lock() {
            visit.call(&bound.args)?;
            visit.call(&bound.kwargs)?;
            for (path, array) in &bound.arrays {
                visit.call(path)?;
                visit.call(array)?;
            }
        }
        Ok(())
    }
}

impl BoundFunction {
    fn lock(&self) -> std::sync::MutexGuard<'_, Arguments> {
        self.bound.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// `err`, naming the bound argument that it is about where a bound array was deleted or
    /// donated (read only when a call fails).
    fn named(&self, py: Python<'_>, err: PyErr) -> PyErr {
        if !(err.is_instance_of::<PyRuntimeError>(py) || err.is_instance_of::<PyValueError>(py)) {
            return err;
        }
        let Ok(h) = handles(py) else {
            return err;
        };
        let arrays: Vec<(Py<PyString>, Py<PyAny>)> = self
            .lock()
            .arrays
            .iter()
            .map(|(path, array)| (path.clone_ref(py), array.clone_ref(py)))
            .collect();
        for (path, array) in &arrays {
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

impl JitFunction {
    /// What a bound function's calls take, learned from the call of `all` (the bound
    /// arguments, then `rest`, arrays) that just ran: the entry that ran it, where that entry
    /// takes its arrays as they are and the bound leaves are the first of its signature. None
    /// where the call had other arguments, or the entry is not that.
    fn bound_path(
        &self,
        py: Python<'_>,
        h: &Handles,
        all: &Bound<'_, PyTuple>,
        rest: usize,
    ) -> PyResult<Option<BoundPath>> {
        let rest_args = &all.as_slice()[all.len() - rest..];
        let Some(cached) = self.cache.latest() else {
            return Ok(None);
        };
        let Some(Outcome::Run(entry)) = cached.outcome() else {
            return Ok(None);
        };
        let signature = &cached.signature;
        let own_arrays = rest_args.iter().all(|arg| h.is_array(arg));
        if !can_teach(!self.statics.is_empty(), own_arrays) {
            return Ok(None);
        }
        let Some(taken) = entry.taken_as_is() else {
            return Ok(None);
        };
        let Ok((tree, leaves)) = Tree::derive(py, h, all.as_slice())? else {
            return Ok(None);
        };
        if leaves.len() != signature.leaves.len() || !tree.same(py, &signature.tree)? {
            return Ok(None);
        }
        for ((leaf, key), &taken) in leaves.iter().zip(&signature.leaves).zip(&taken) {
            // An argument that the executable does not use (a numpy array, say) is only keyed.
            let fits = if taken {
                h.is_array(leaf) && is_key_of(key, h, leaf)?
            } else {
                match LiveLeaf::read(h, leaf)? {
                    Some(live) => key.holds(&PyCompare::leaves(py), &live.as_arg(leaf))?,
                    None => false,
                }
            };
            if !fits {
                return Ok(None);
            }
        }
        let num_keys = signature.leaves.len();
        Ok(BoundPath::new(
            cached,
            self.generation(),
            num_keys,
            all.len() - rest,
            leaves.into_iter().map(Bound::unbind).collect(),
            rest,
            taken,
        ))
    }

    /// Whether `path` was learned since the cache was last cleared.
    fn is_current(&self, path: &BoundPath) -> bool {
        path.is_current(self.generation())
    }

    /// Runs a bound call on `path`, with `rest`, its arguments after the bound ones; None where
    /// the call has another signature (then the dispatcher takes it).
    fn run_bound<'py>(
        &self,
        h: &Handles,
        path: &BoundPath,
        rest: &Bound<'py, PyTuple>,
        clock: &mut Option<Clock>,
    ) -> PyResult<Option<Bound<'py, PyAny>>> {
        let py = rest.py();
        let entry = match path.entry.outcome() {
            Some(Outcome::Run(entry)) if self.is_current(path) => entry,
            _ => return Ok(None),
        };
        let context = if self.keyed_by_context {
            LiveContext::read(py, h)?
        } else {
            LiveContext::none(py)
        };
        let signature = &path.entry.signature;
        let positional = is_positional_under(signature, path.num_bound_args + rest.len(), &context);
        if !can_run(context.post_hook().is_some(), positional) {
            return Ok(None);
        }
        let Some(own) = path.own_keys(signature.leaves.len(), rest.len()) else {
            return Ok(None);
        };
        let keys = &signature.leaves[own];
        for (arg, key) in rest.iter().zip(keys) {
            if !h.is_array(&arg) || !is_key_of(key, h, &arg)? {
                return Ok(None);
            }
        }
        self.stats.count(Counter::CacheHit);
        path.entry.mark_used();
        let mut leaves: Vec<Bound<'py, PyAny>> = Vec::with_capacity(path.leaves.len() + rest.len());
        leaves.extend(path.leaves.iter().map(|leaf| leaf.bind(py).clone()));
        leaves.extend(rest.iter());
        let inputs = path
            .inputs(&leaves)
            .map(|inputs| PyTuple::new(py, inputs))
            .transpose()?;
        mark(clock, Stage::Lookup);
        let out = entry.run_arrays(h, &PyTuple::new(py, leaves)?, inputs.as_ref(), clock)?;
        record(&self.stats, clock.take());
        Ok(Some(out))
    }
}
