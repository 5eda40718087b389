//! The function behind `fastpjit.jit`, `fastpjit.pmap` and compiled (AOT) functions, as
//! jaxlib's `PjitFunction`: a call goes straight into Rust, which reads it, routes it once
//! (`Route`) and acts on the route: a hit runs its cache entry, a miss runs Python, and JAX
//! runs what it must.

use std::sync::{Arc, Mutex};

use fastpjit_core::dispatch::route::{self, Ask, JaxDispatch};
use fastpjit_core::dispatch::{Route, Unkeyable};
use fastpjit_core::timing::Stage;
use fastpjit_core::{Fallback, Handover, Whole};
use pyo3::exceptions::PyOverflowError;
use pyo3::gc::PyVisit;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};
use pyo3::PyTraverseError;

use super::entry::{Entry, Took};
use super::miss::CacheMiss;
use super::shared::{lock, Cached, DispatchCache, Outcome};
use super::signature::{self, CallSignature, LiveCall};
use crate::errors::{refusal, DispatchError};
use crate::handles::{handles, Handles};
use crate::stats::{guarding_jax_call, mark, recompiles_guarded, record, Clock, Counter};

/// The dispatcher behind `fastpjit.jit`, `fastpjit.pmap` and compiled (AOT) functions;
/// Python subclasses add `lower`, `trace`, ...
#[pyclass(module = "fastpjit._core", subclass, frozen)]
pub struct JitFunction {
    /// JAX's callable for the same computation (`jax.jit(f)`, or a `Compiled`): it runs every
    /// call that JAX must handle (tracers, `disable_jit`, effects).
    fallback: Mutex<Option<Py<PyAny>>>,
    /// `miss(args, kwargs) -> CacheMiss`: the cache miss.
    miss: Mutex<Option<Py<PyAny>>>,
    shared: Py<DispatchCache>,
    /// jax.jit's own C++ function of the same function and options, where the calls that JAX
    /// dispatches faster go (see `Delegation`).
    jax_dispatch: Mutex<JaxDispatch<Py<PyAny>>>,
}

impl std::ops::Deref for JitFunction {
    type Target = DispatchCache;

    fn deref(&self) -> &DispatchCache {
        self.shared.get()
    }
}

/// The routes that a call takes before its cache entry is looked for.
enum Early {
    Delegate(Handover),
    Jax(Fallback),
}

impl<E> From<Early> for Route<E> {
    fn from(early: Early) -> Self {
        match early {
            Early::Delegate(why) => Route::Delegate(why),
            Early::Jax(fallback) => Route::Jax(fallback),
        }
    }
}

/// Whether a route is taken (asking for jax.jit's function makes it) or only reported.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Routing {
    Call,
    Probe,
}

impl JitFunction {
    fn callable<'py>(
        py: Python<'py>,
        slot: &Mutex<Option<Py<PyAny>>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        lock(slot)
            .as_ref()
            .map(|f| f.bind(py).clone())
            .ok_or_else(|| refusal(DispatchError::Cleared))
    }

    /// Reads a call: the route it takes before its cache entry is looked for (JAX's dispatch
    /// or JAX), or the call split and flattened, whose entry `DispatchCache::route` finds.
    fn read_call<'a, 'py>(
        &self,
        py: Python<'py>,
        h: &Handles,
        args: &Bound<'py, PyTuple>,
        kwargs: Option<&Bound<'py, PyDict>>,
        latest: Option<&'a Arc<Cached>>,
        routing: Routing,
    ) -> PyResult<Result<LiveCall<'a, 'py>, Early>> {
        if let Some(why) = self
            .delegation
            .delegates(|| carries_numpy_array(h, args, kwargs))
        {
            if !recompiles_guarded() && self.has_jax_dispatch(py, routing)? {
                return Ok(Err(Early::Delegate(why)));
            }
        }
        Ok(self.read(py, h, args, kwargs, latest)?.map_err(Early::Jax))
    }

    /// Whether jax.jit's function can take a call now; a call (not a probe) asks for it, and
    /// so makes it at the `MAKE_AFTER`-th ask.
    fn has_jax_dispatch(&self, py: Python<'_>, routing: Routing) -> PyResult<bool> {
        if routing == Routing::Probe {
            return Ok(!lock(&self.jax_dispatch).is_none());
        }
        let ask = lock(&self.jax_dispatch).ask(|f| f.clone_ref(py));
        Ok(match ask {
            Ask::NoDispatch | Ask::NotYet => false,
            Ask::Use(_) => true,
            Ask::Make(make) => {
                // Making it runs Python, which must not hold the lock.
                let jitted = make.call0(py)?;
                lock(&self.jax_dispatch).made(jitted);
                true
            }
        })
    }

    /// Hands the call to jax.jit's own dispatch, counted by `why`.
    fn delegate<'py>(
        &self,
        py: Python<'py>,
        why: Handover,
        args: &Bound<'py, PyTuple>,
        kwargs: Option<&Bound<'py, PyDict>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let jitted = lock(&self.jax_dispatch).get().map(|f| f.clone_ref(py));
        let Some(jitted) = jitted else {
            return Err(refusal(DispatchError::Cleared));
        };
        self.stats.count(Counter::JaxCall);
        self.stats.count_fallback(why.into());
        // Never inside `no_recompiles`, whose calls are not delegated.
        jitted.bind(py).call(args, kwargs)
    }

    /// Hands the call to JAX, counting why; a call made inside another function's trace (whose
    /// arguments hold tracers) is counted as such, not as a fallback.
    fn to_jax<'py>(
        &self,
        py: Python<'py>,
        fallback: Fallback,
        args: &Bound<'py, PyTuple>,
        kwargs: Option<&Bound<'py, PyDict>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let traced = fallback == Fallback::NOT_AN_ARRAY
            && !handles(py)?
                .trace_state_clean
                .bind(py)
                .call0()?
                .is_truthy()?;
        if traced {
            self.stats.count(Counter::Traced);
        } else {
            self.stats.count_fallback(fallback);
            self.stats.count(Counter::JaxCall);
        }
        // jax.jit's own function where it is made (it is what the fallback calls), without
        // the Python frames on the way; and whether this function has one.
        let (made, has_dispatch) = {
            let dispatch = lock(&self.jax_dispatch);
            let made = dispatch.get().map(|f| f.clone_ref(py).into_bound(py));
            (made, !dispatch.is_none())
        };
        // Outside traces, a function whose calls keep coming here hands them to jax.jit's
        // dispatch before reading them (see `Delegation`).
        if has_dispatch && !traced && route::counts_as_unkeyable(fallback) {
            self.delegation.after_unkeyable();
        }
        if fallback == Fallback::DISABLE_JIT {
            // JAX runs it op by op, as the user asked; its compiles are not this call's.
            return Self::callable(py, &self.fallback)?.call(args, kwargs);
        }
        let fallback = match made {
            Some(jitted) => jitted,
            None => Self::callable(py, &self.fallback)?,
        };
        guarding_jax_call(|| fallback.call(args, kwargs))
    }

    /// Runs a hit of `call` on `entry`.
    fn run_hit<'py>(
        slf: &Bound<'py, Self>,
        h: &Handles,
        cached: &Arc<Cached>,
        latest: Option<&Arc<Cached>>,
        call: &LiveCall<'_, 'py>,
        mut clock: Option<Clock>,
        (args, kwargs): (&Bound<'py, PyTuple>, Option<&Bound<'py, PyDict>>),
    ) -> PyResult<Bound<'py, PyAny>> {
        let py = slf.py();
        let this = slf.get();
        let Some(Outcome::Run(entry)) = cached.outcome() else {
            return Err(refusal(DispatchError::Cleared));
        };
        this.stats.count(Counter::CacheHit);
        this.cache.hit(cached, latest);
        mark(&mut clock, Stage::Lookup);
        let mut took = Took {
            clock,
            ..Took::default()
        };
        let out = match entry.run(py, h, call, &mut took) {
            Err(err) if err.is_instance_of::<PyOverflowError>(py) => {
                // A Python int too large for its dtype: JAX's path names it.
                let overflow = Fallback::Whole(Whole::IntOverflow);
                return this.to_jax(py, overflow, args, kwargs);
            }
            out => out?,
        };
        record(&this.stats, took.clock.take());
        if took.moved {
            this.stats
                .count_fallback(Fallback::Whole(Whole::MovedArgument));
        }
        // Asked only where the hit placed or copied new arrays: it takes a lock.
        let can_delegate = (took.inputs.placed > 0 || took.inputs.copied > 0)
            && entry.delegable()
            && !lock(&this.jax_dispatch).is_none();
        this.delegation.after_hit(can_delegate, took.inputs);
        if let Some(hook) = call.context.post_hook() {
            let kwargs = kwargs.map_or_else(|| PyDict::new(py), Clone::clone);
            hook.call1((slf, args, kwargs, &out))?;
        }
        Ok(out)
    }

    /// For a function keyed by no jit key (a compiled foreign module): runs the latest entry
    /// if `args` are arrays of its signature, and it takes them as they are. Such a call is
    /// that entry's hit, without building a signature. (Commitment is not compared: these
    /// entries take an array on their sharding whatever its commitment, and their outputs do
    /// not depend on it.)
    fn run_repeat<'py>(
        &self,
        h: &Handles,
        args: &Bound<'py, PyTuple>,
        clock: &mut Option<Clock>,
    ) -> PyResult<Option<Bound<'py, PyAny>>> {
        let Some(latest) = self.cache.latest() else {
            return Ok(None);
        };
        let Some(Outcome::Run(entry)) = latest.outcome() else {
            return Ok(None);
        };
        let signature = &latest.signature;
        if !entry.passes_through()
            || !signature.positional_arrays
            || signature.leaves.len() != args.len()
            || !self.holds_arrays(h, args.as_slice(), &signature.leaves)?
        {
            return Ok(None);
        }
        self.stats.count(Counter::CacheHit);
        mark(clock, Stage::Lookup);
        let out = entry.run_arrays(h, args, None, clock)?;
        record(&self.stats, clock.take());
        Ok(Some(out))
    }

    /// Runs the cache miss of `call`, whose signature `signature` is then cached; returns the
    /// outputs.
    fn run_miss<'py>(
        &self,
        py: Python<'py>,
        h: &Handles,
        signature: CallSignature,
        leaves: &[Bound<'py, PyAny>],
        args: &Bound<'py, PyTuple>,
        kwargs: Option<&Bound<'py, PyDict>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        self.stats.count(Counter::CacheMiss);
        let miss = self.cache.begin_miss(signature.hash, signature);
        let result = self.miss_outcome(py, h, &miss.entry, leaves, args, kwargs);
        self.cache.end_miss(&miss, result.is_ok());
        result
    }

    fn miss_outcome<'py>(
        &self,
        py: Python<'py>,
        h: &Handles,
        cached: &Cached,
        leaves: &[Bound<'py, PyAny>],
        args: &Bound<'py, PyTuple>,
        kwargs: Option<&Bound<'py, PyDict>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let kwargs = kwargs.map_or_else(|| PyDict::new(py), Clone::clone);
        let miss = Self::callable(py, &self.miss)?
            .call1((args, kwargs))?
            .cast_into::<CacheMiss>()?;
        let miss = miss.get();
        self.stats.count(Counter::Compile(miss.compiles));
        let outcome = match &miss.fast_path {
            None => {
                let fallback = Fallback::JaxRuns(miss.why());
                self.stats.count_fallback(fallback);
                Outcome::Jax(fallback)
            }
            Some(fast) => {
                if let Some(why) = miss.why {
                    self.stats.count_fallback(Fallback::JaxCompiled(why));
                }
                Outcome::Run(Entry::new(py, h, fast.get(), &cached.signature, leaves)?)
            }
        };
        cached.set_outcome(outcome);
        Ok(miss.outputs.bind(py).clone())
    }
}

#[pymethods]
impl JitFunction {
    /// A function that dispatches through `cache`: `fallback` runs the calls that JAX must
    /// run, `miss(args, kwargs)` the cache misses, and `jax_dispatch` (jax.jit's own function,
    /// or `make_jax_dispatch()` that makes it, where there is one) the calls that JAX's
    /// dispatch serves faster.
    #[new]
    #[pyo3(signature = (fallback, miss, cache, jax_dispatch = None, make_jax_dispatch = None))]
    fn new(
        fallback: Py<PyAny>,
        miss: Py<PyAny>,
        cache: Py<DispatchCache>,
        jax_dispatch: Option<Py<PyAny>>,
        make_jax_dispatch: Option<Py<PyAny>>,
    ) -> Self {
        Self {
            fallback: Mutex::new(Some(fallback)),
            miss: Mutex::new(Some(miss)),
            shared: cache,
            jax_dispatch: Mutex::new(JaxDispatch::new(jax_dispatch, make_jax_dispatch)),
        }
    }

    /// The cache that this function shares with the other functions of its function and
    /// options.
    #[getter(_dispatch_cache)]
    fn dispatch_cache(&self, py: Python<'_>) -> Py<DispatchCache> {
        self.shared.clone_ref(py)
    }

    #[pyo3(signature = (*args, **kwargs))]
    pub(super) fn __call__<'py>(
        slf: &Bound<'py, Self>,
        args: &Bound<'py, PyTuple>,
        kwargs: Option<&Bound<'py, PyDict>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let py = slf.py();
        let this = slf.get();
        let mut clock = Clock::start();
        let h = handles(py)?;
        if !this.keyed_by_context && kwargs.is_none_or(PyDictMethods::is_empty) {
            if let Some(out) = this.run_repeat(h, args, &mut clock)? {
                return Ok(out);
            }
        }
        let latest = this.cache.latest();
        let call = this.read_call(py, h, args, kwargs, latest.as_ref(), Routing::Call)?;
        let (call, mut route) = match call {
            Ok(call) => {
                let route = this.route(&call, latest.as_ref(), true)?;
                (call, route)
            }
            Err(Early::Delegate(why)) => return this.delegate(py, why, args, kwargs),
            Err(Early::Jax(fallback)) => return this.to_jax(py, fallback, args, kwargs),
        };
        loop {
            route = match route {
                Route::Hit(cached, _) => {
                    let call_args = (args, kwargs);
                    return Self::run_hit(
                        slf,
                        h,
                        &cached,
                        latest.as_ref(),
                        &call,
                        clock,
                        call_args,
                    );
                }
                Route::Miss(hash) => {
                    let Some(signature) = signature::keep(&call, hash)? else {
                        let fallback = Unkeyable::Leaf.fallback();
                        return this.to_jax(py, fallback, args, kwargs);
                    };
                    return this.run_miss(py, h, signature, call.leaves(), args, kwargs);
                }
                Route::Wait(cached) => {
                    py.detach(|| cached.wait_for_miss());
                    // Then the entry is looked up by hash only.
                    this.route(&call, latest.as_ref(), false)?
                }
                Route::Delegate(why) => return this.delegate(py, why, args, kwargs),
                Route::Jax(fallback) => return this.to_jax(py, fallback, args, kwargs),
            };
        }
    }

    /// The number of executables cached.
    #[pyo3(name = "_cache_size")]
    fn cache_size(&self) -> usize {
        self.cache.len()
    }

    /// How a call of these arguments would be served, without running it (for
    /// `fastpjit.explain`): `{"outcome": "hit" | "miss" | "fallback", "path": "recent" |
    /// "keyed" | None, "reason": the fallback's code or None}`, and for a hit the entry's
    /// `report`. Reading the call's leaves updates the arrays remembered, as a call does.
    #[pyo3(name = "_probe", signature = (*args, **kwargs))]
    fn probe<'py>(
        slf: &Bound<'py, Self>,
        args: &Bound<'py, PyTuple>,
        kwargs: Option<&Bound<'py, PyDict>>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let py = slf.py();
        let this = slf.get();
        let h = handles(py)?;
        let latest = this.cache.latest();
        let route = match this.read_call(py, h, args, kwargs, latest.as_ref(), Routing::Probe)? {
            Ok(call) => this.route(&call, latest.as_ref(), true)?,
            Err(early) => early.into(),
        };
        let out = PyDict::new(py);
        let (outcome, path, reason) = match &route {
            Route::Hit(cached, found) => {
                if let Some(Outcome::Run(entry)) = cached.outcome() {
                    out.update(entry.report(py)?.as_mapping())?;
                }
                ("hit", Some(found.name()), None)
            }
            Route::Miss(_) => ("miss", None, None),
            Route::Wait(_) => (
                "miss",
                None,
                Some("another call's miss of this signature runs".to_owned()),
            ),
            Route::Delegate(why) => ("fallback", None, Some(Fallback::from(*why).code())),
            Route::Jax(fallback) => ("fallback", None, Some(fallback.code())),
        };
        out.set_item("outcome", outcome)?;
        out.set_item("path", path)?;
        out.set_item("reason", reason)?;
        Ok(out)
    }

    /// The host values that the latest call's cache entry places: `(position among the call's
    /// leaves, input sharding)`.
    #[pyo3(name = "_latest_host_targets")]
    fn latest_host_targets(&self, py: Python<'_>) -> Vec<(usize, Py<PyAny>)> {
        let latest = self.cache.latest();
        match latest.as_ref().and_then(|cached| cached.outcome()) {
            Some(Outcome::Run(entry)) => entry.host_targets(py),
            _ => Vec::new(),
        }
    }

    /// How many arrays of the latest calls are remembered by weak reference (see `SeenArrays`).
    #[pyo3(name = "_held_arrays")]
    fn py_held_arrays(&self) -> usize {
        self.held_arrays()
    }

    /// Forgets every cached executable (of every function that shares them).
    #[pyo3(name = "_clear_cache")]
    fn clear_cache(&self) {
        self.clear();
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        for slot in [&self.fallback, &self.miss] {
            if let Ok(callable) = slot.try_lock() {
                visit.call(callable.as_ref())?;
            }
        }
        if let Ok(dispatch) = self.jax_dispatch.try_lock() {
            visit.call(dispatch.handle())?;
        }
        visit.call(&self.shared)
    }

    fn __clear__(&self) {
        let callables = [lock(&self.fallback).take(), lock(&self.miss).take()];
        let dispatch = std::mem::replace(&mut *lock(&self.jax_dispatch), JaxDispatch::None);
        drop((callables, dispatch));
    }
}

/// Whether a call passes a numpy array as an argument, or one level inside one (a batch in a
/// tuple or dict): the calls that a delegating function hands to JAX (see `Delegation`).
fn carries_numpy_array(
    h: &Handles,
    args: &Bound<'_, PyTuple>,
    kwargs: Option<&Bound<'_, PyDict>>,
) -> bool {
    let ndarray = h.arrays.ndarray.as_ptr().cast();
    let is_numpy = |value: &Bound<'_, PyAny>| std::ptr::eq(value.get_type_ptr(), ndarray);
    let carries = |value: Bound<'_, PyAny>| {
        is_numpy(&value)
            || value
                .cast::<PyTuple>()
                .is_ok_and(|items| items.iter().any(|item| is_numpy(&item)))
            || value
                .cast::<PyDict>()
                .is_ok_and(|items| items.values().iter().any(|item| is_numpy(&item)))
    };
    args.iter().any(carries) || kwargs.is_some_and(|kwargs| kwargs.values().iter().any(carries))
}

#[cfg(test)]
mod tests {
    use std::ffi::CStr;

    use fastpjit_core::dispatch::{Found, RECENT};
    use pyo3::types::PyModule;

    use super::*;
    use crate::dispatch::FastPath;
    use crate::testing::helper_module;

    /// jit functions of this crate's classes (the installed module's are other types), whose
    /// misses are fastpjit's, rebuilt as this crate's `CacheMiss`.
    const HELPERS: &CStr = cr#"
import jax
import jax.numpy as jnp
from fastpjit._jax.jit_miss import jit_cache_miss

FIELDS = ("executable", "out_treedef", "out_handlers", "in_shardings", "kept", "const_args",
          "donated", "in_global", "out_local", "out_shardings")


def jit(core, fun, static_argnums=()):
    jitted = jax.jit(fun, static_argnums=static_argnums)

    def miss(args, kwargs):
        ours = jit_cache_miss(jitted, args, kwargs)
        fast = ours.fast_path
        if fast is not None:
            fast = core.FastPath(**{name: getattr(fast, name) for name in FIELDS})
        return core.CacheMiss(
            ours.outputs, fast, compiles=ours.compiles, jax_reason=ours.jax_reason
        )

    cache = core.DispatchCache("route_test", list(static_argnums), [])
    return core.JitFunction(jitted, miss, cache)


def functions(core):
    return jit(core, lambda x: x * 2), jit(core, lambda x, n: x * n, static_argnums=(1,))


def arrays():
    return jnp.arange(4.0), jnp.arange(5.0)


def arrays_of_sizes(n):
    return [jnp.ones(6 + i) for i in range(n)]


def disable_jit():
    return jax.disable_jit()
"#;

    fn helpers(py: Python<'_>) -> Bound<'_, PyModule> {
        helper_module(py, c"fastpjit_route_helpers", HELPERS)
    }

    /// The route of a call of `f`, as plain data: a hit and where it was found, a miss, or
    /// JAX and why.
    #[derive(Debug, PartialEq)]
    enum Took {
        Hit(Found),
        Miss,
        Jax(Fallback),
        Other,
    }

    fn route_of(f: &Bound<'_, JitFunction>, args: &Bound<'_, PyTuple>) -> Took {
        let (py, this) = (f.py(), f.get());
        let h = handles(py).unwrap();
        let latest = this.cache.latest();
        let route = match this
            .read_call(py, h, args, None, latest.as_ref(), Routing::Probe)
            .unwrap()
        {
            Ok(call) => this.route(&call, latest.as_ref(), true).unwrap(),
            Err(early) => early.into(),
        };
        match route {
            Route::Hit(_, found) => Took::Hit(found),
            Route::Miss(_) => Took::Miss,
            Route::Jax(fallback) => Took::Jax(fallback),
            Route::Wait(_) | Route::Delegate(_) => Took::Other,
        }
    }

    fn args<'py>(items: &[&Bound<'py, PyAny>]) -> Bound<'py, PyTuple> {
        PyTuple::new(items[0].py(), items).unwrap()
    }

    #[test]
    fn a_call_routes_to_a_miss_then_a_hit_and_to_jax_where_it_must() {
        Python::initialize();
        Python::attach(|py| {
            let module = helpers(py);
            let core = PyModule::new(py, "route_test_core").unwrap();
            core.add_class::<JitFunction>().unwrap();
            core.add_class::<DispatchCache>().unwrap();
            core.add_class::<CacheMiss>().unwrap();
            core.add_class::<FastPath>().unwrap();
            let (f, g): (Bound<'_, PyAny>, Bound<'_, PyAny>) = module
                .call_method1("functions", (&core,))
                .unwrap()
                .extract()
                .unwrap();
            let f = f.cast_into::<JitFunction>().unwrap();
            let (x, y): (Bound<'_, PyAny>, Bound<'_, PyAny>) =
                module.call_method0("arrays").unwrap().extract().unwrap();
            assert_eq!(route_of(&f, &args(&[&x])), Took::Miss);
            f.call1((&x,)).unwrap();
            assert_eq!(route_of(&f, &args(&[&x])), Took::Hit(Found::Recent));
            assert_eq!(route_of(&f, &args(&[&y])), Took::Miss);
            f.call1((&y,)).unwrap();
            f.call1((&x,)).unwrap();
            // Alternating signatures are among the latest calls' entries.
            assert_eq!(route_of(&f, &args(&[&y])), Took::Hit(Found::Recent));
            // Past them, an entry is found by the signature's hash.
            let others = module.call_method1("arrays_of_sizes", (RECENT,)).unwrap();
            for other in others.try_iter().unwrap() {
                f.call1((other.unwrap(),)).unwrap();
            }
            assert_eq!(route_of(&f, &args(&[&y])), Took::Hit(Found::Keyed));
            let text = "not an array".into_pyobject(py).unwrap().into_any();
            assert_eq!(
                route_of(&f, &args(&[&text])),
                Took::Jax(Fallback::NOT_AN_ARRAY)
            );
            let disabled = module.call_method0("disable_jit").unwrap();
            disabled.call_method0("__enter__").unwrap();
            let under = route_of(&f, &args(&[&x]));
            let none = py.None().into_bound(py);
            disabled
                .call_method1("__exit__", (&none, &none, &none))
                .unwrap();
            assert_eq!(under, Took::Jax(Fallback::DISABLE_JIT));
            let g = g.cast_into::<JitFunction>().unwrap();
            let unhashable = pyo3::types::PyList::empty(py).into_any();
            let unkeyable = Took::Jax(Unkeyable::UnhashableStatic.fallback());
            assert_eq!(route_of(&g, &args(&[&x, &unhashable])), unkeyable);
        });
    }
}
