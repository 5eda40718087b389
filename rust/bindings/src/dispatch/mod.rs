//! The jit dispatcher: a call goes straight into Rust, which keys it by its call signature,
//! finds the cache entry and runs its executable; only a cache miss, or a call that JAX must
//! run, runs Python.
//!
//! - `context`: JAX's jit key (trace context, trace state, ...), read on every call.
//! - `tree`, `leaf`: a call flattened in JAX's order, and each leaf as the signature sees it.
//! - `signature`: the call signature, compared by identity first and by value on a miss.
//! - `entry`: a cached executable and how each argument becomes its input.
//! - `miss`: the typed contract with the cache miss that Python runs.
//! - `bound`: a function with resident arguments bound.

mod bound;
mod context;
mod entry;
mod leaf;
mod miss;
mod signature;
mod tree;

use std::borrow::Cow;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use fastpjit_core::dispatch::{CacheEntry, EntryCache, MissState};
use fastpjit_core::timing::Stage;
use fastpjit_core::{BoundedMap, Delegation, Handover};
use pyo3::exceptions::PyOverflowError;
use pyo3::gc::PyVisit;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyString, PyTuple};
use pyo3::PyTraverseError;

use crate::errors::DispatchError;
use crate::handles::{handles, Handles};
use crate::stats::{
    function_stats, guarding_jax_call, mark, recompiles_guarded, record, Clock, Counter,
    FunctionStats, DELEGATED, HANDED_OVER,
};
pub use bound::BoundFunction;
use context::LiveContext;
pub(crate) use context::MAX_STATES;
use entry::{Entry, Took};
use leaf::{LiveLeaf, SeenArrays};
pub use miss::{CacheMiss, FastPath};
use signature::{
    holds_array, is_key_of, is_positional_under, matches, same_leaf, CallSignature, LeafKey,
    LiveCall, StaticArgs, Unkeyable,
};
use tree::Tree;

/// What a bound function's calls take (see the core's `BoundPath`).
type BoundPath = fastpjit_core::dispatch::BoundPath<Arc<Cached>, Py<PyAny>>;

/// What a cache entry holds once its miss has run.
enum Outcome {
    Run(Entry),
    /// JAX runs such calls (effects, outputs that are not arrays, an active trace); why.
    Jax(String),
}

/// Where a call's cache entry was found (`"recent"` or `"keyed"`), or the hash of its miss, or
/// why it has no signature.
enum Found {
    Entry(Arc<Cached>, &'static str),
    Miss(u64),
    Unkeyable(Unkeyable),
}

/// A cache entry: a signature, and what calls of it do once its miss has run (see the core's
/// `EntryCache` for the single-compile protocol).
type Cached = CacheEntry<CallSignature, Outcome>;

/// The reasons that this function's fallbacks are counted under.
struct Reasons {
    kind: String,
    moved: String,
    disabled: String,
    unkeyable: String,
    unhashable: String,
    overflow: String,
    recursion: String,
    deep: String,
}

impl Reasons {
    fn unkeyable(&self, why: Unkeyable) -> &str {
        match why {
            Unkeyable::Leaf => &self.unkeyable,
            Unkeyable::UnhashableStatic => &self.unhashable,
            Unkeyable::Deep => &self.deep,
        }
    }

    fn of(kind: &str) -> Self {
        Self {
            kind: kind.to_owned(),
            moved: format!("{kind}: an argument moved to the executable's sharding by JAX"),
            disabled: format!("{kind}: jax.disable_jit is on; JAX runs the call"),
            unkeyable: format!(
                "{kind}: an argument is a tracer or not an array; JAX runs the call"
            ),
            unhashable: format!("{kind}: a static argument has no hash; JAX raises its error"),
            overflow: format!("{kind}: a Python int too large for its dtype; JAX raises its error"),
            recursion: format!("{kind}: a call made while its own cache miss runs; JAX runs it"),
            deep: format!(
                "{kind}: an argument nests containers deeper than {} levels; JAX runs the call",
                tree::MAX_DEPTH
            ),
        }
    }
}

/// How many trees a function remembers.
const TREES: usize = 16;

/// What the functions of one Python function and options share, as JAX's jit functions share
/// its cache: the cache entries, the latest calls' trees and arrays, and the function's
/// counters. A new `jit(f)` of a function already wrapped finds the executables of the others.
#[pyclass(module = "fastpjit._core", frozen)]
pub struct DispatchCache {
    statics: StaticArgs,
    reasons: Reasons,
    stats: Arc<FunctionStats>,
    cache: EntryCache<CallSignature, Outcome>,
    /// The trees of the function's calls by hash, so that entries of one tree share it.
    trees: Mutex<BoundedMap<u64, Arc<Tree>>>,
    /// The arrays of the latest calls, two by position; a call takes them while it reads its
    /// leaves, and puts them back with its own.
    seen: Mutex<SeenArrays>,
    /// Whether calls are keyed by JAX's jit key; not those of a compiled foreign module,
    /// which depends on no configuration and which no trace can stage.
    keyed_by_context: bool,
    /// Whether calls go to JAX's C++ dispatch (see `Delegation`).
    delegation: Delegation,
    /// How many times the cache was cleared: a bound function's entry from before is stale.
    generation: AtomicU64,
}

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
    jax_dispatch: Mutex<JaxDispatch>,
}

/// jax.jit's function of a `JitFunction`, made or to be made.
enum JaxDispatch {
    None,
    Made(Py<PyAny>),
    /// `make()` makes it (a jax.jit function costs tens of µs to make); made when this
    /// function hands a call to JAX for the `MAKE_AFTER`-th time, so that a new wrapper called
    /// once (`jit(f)(x)` in a loop) makes none.
    Maker {
        make: Py<PyAny>,
        asked: u32,
    },
}

const MAKE_AFTER: u32 = 2;

impl std::ops::Deref for JitFunction {
    type Target = DispatchCache;

    fn deref(&self) -> &DispatchCache {
        self.shared.get()
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl JitFunction {
    fn callable<'py>(
        py: Python<'py>,
        slot: &Mutex<Option<Py<PyAny>>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        lock(slot)
            .as_ref()
            .map(|f| f.bind(py).clone())
            .ok_or_else(|| DispatchError::Cleared.into())
    }

    /// What a bound function's calls take (see `bound.rs`), learned from the call of
    /// `all` (the bound arguments, then `rest`, arrays) that just ran: the entry that ran it,
    /// where that entry takes its arrays as they are and the bound leaves are the first of
    /// its signature. None where the call had other arguments, or the entry is not that.
    fn bound_path(
        &self,
        py: Python<'_>,
        h: &Handles,
        all: &Bound<'_, PyTuple>,
        rest: usize,
    ) -> PyResult<Option<BoundPath>> {
        let rest_args = &all.as_slice()[all.len() - rest..];
        if !self.statics.argnums.is_empty()
            || !self.statics.argnames.is_empty()
            || !rest_args.iter().all(|arg| h.is_array(arg))
        {
            return Ok(None);
        }
        let Some(cached) = self.cache.latest() else {
            return Ok(None);
        };
        let Some(Outcome::Run(entry)) = cached.outcome() else {
            return Ok(None);
        };
        let signature = &cached.signature;
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
                    Some(live) => same_leaf(key, &live, leaf)?,
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
            self.generation.load(Ordering::Relaxed),
            num_keys,
            all.len() - rest,
            leaves.into_iter().map(Bound::unbind).collect(),
            rest,
            taken,
        ))
    }

    /// Whether `path` was learned since the cache was last cleared.
    fn is_current(&self, path: &BoundPath) -> bool {
        path.is_current(self.generation.load(Ordering::Relaxed))
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
        let Some(Outcome::Run(entry)) = path.entry.outcome() else {
            return Ok(None);
        };
        if !self.is_current(path) {
            return Ok(None);
        }
        let context = if self.keyed_by_context {
            LiveContext::read(py, h)?
        } else {
            LiveContext::none(py)
        };
        let signature = &path.entry.signature;
        if context.post_hook().is_some()
            || !is_positional_under(signature, path.num_bound_args + rest.len(), &context)
        {
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

    /// Hands the call to jax.jit's own dispatch, counted by `why`; None for a function
    /// without one.
    fn delegate<'py>(
        &self,
        py: Python<'py>,
        why: Handover,
        args: &Bound<'py, PyTuple>,
        kwargs: Option<&Bound<'py, PyDict>>,
    ) -> Option<PyResult<Bound<'py, PyAny>>> {
        let jitted = {
            let mut dispatch = lock(&self.jax_dispatch);
            match &mut *dispatch {
                JaxDispatch::None => return None,
                JaxDispatch::Made(jitted) => jitted.clone_ref(py),
                JaxDispatch::Maker { asked, .. } if *asked + 1 < MAKE_AFTER => {
                    *asked += 1;
                    return None;
                }
                JaxDispatch::Maker { make, .. } => {
                    let make = make.clone_ref(py);
                    drop(dispatch);
                    // Making it runs Python, which must not hold the lock.
                    let jitted = match make.call0(py) {
                        Ok(jitted) => jitted,
                        Err(err) => return Some(Err(err)),
                    };
                    *lock(&self.jax_dispatch) = JaxDispatch::Made(jitted.clone_ref(py));
                    jitted
                }
            }
        };
        match why {
            Handover::Placements => self.stats.count(Counter::Delegated),
            Handover::Unkeyable => self.stats.count(Counter::HandedOver),
        }
        // Never inside `no_recompiles`, whose calls are not delegated.
        Some(jitted.bind(py).call(args, kwargs))
    }

    /// The cache entry of `call`: among the latest calls' entries where `recent` (compared only
    /// where the call was flattened against its tree), else by the signature's hash; else the
    /// hash that its miss keys, or why it has none.
    #[inline]
    fn find(
        &self,
        call: &LiveCall<'_, '_>,
        latest: Option<&Arc<Cached>>,
        recent: bool,
    ) -> PyResult<Found> {
        if recent {
            let found = self.cache.probe_recent(latest, |signature| {
                Ok::<_, PyErr>(
                    Arc::ptr_eq(&signature.tree, &call.tree) && matches(signature, call)?,
                )
            })?;
            if let Some(cached) = found {
                return Ok(Found::Entry(cached, "recent"));
            }
        }
        let hash = match call.hash()? {
            Ok(hash) => hash,
            Err(why) => return Ok(Found::Unkeyable(why)),
        };
        Ok(match self.cache.lookup(hash, |s| matches(s, call))? {
            Some(cached) => Found::Entry(cached, "keyed"),
            None => Found::Miss(hash),
        })
    }

    /// Hands the call to JAX, counting why; a call made inside another function's trace (whose
    /// arguments hold tracers) is counted as such, not as a fallback.
    fn to_jax<'py>(
        &self,
        py: Python<'py>,
        reason: &str,
        args: &Bound<'py, PyTuple>,
        kwargs: Option<&Bound<'py, PyDict>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let traced = reason == self.reasons.unkeyable
            && !handles(py)?
                .trace_state_clean
                .bind(py)
                .call0()?
                .is_truthy()?;
        if traced {
            self.stats.count(Counter::Traced);
        } else {
            self.count_fallback(reason);
            self.stats.count(Counter::JaxCall);
        }
        // jax.jit's own function where it is made (it is what the fallback calls), without
        // the Python frames on the way; and whether this function has one.
        let (made, has_dispatch) = match &*lock(&self.jax_dispatch) {
            JaxDispatch::Made(jitted) => (Some(jitted.clone_ref(py).into_bound(py)), true),
            JaxDispatch::Maker { .. } => (None, true),
            JaxDispatch::None => (None, false),
        };
        // Outside traces, a function whose calls keep coming here hands them to jax.jit's
        // dispatch before reading them (see `Delegation`).
        if has_dispatch
            && !traced
            && (reason == self.reasons.unkeyable || reason == self.reasons.deep)
        {
            self.delegation.after_unkeyable();
        }
        if reason == self.reasons.disabled {
            // JAX runs it op by op, as the user asked; its compiles are not this call's.
            return Self::callable(py, &self.fallback)?.call(args, kwargs);
        }
        let fallback = match made {
            Some(jitted) => jitted,
            None => Self::callable(py, &self.fallback)?,
        };
        guarding_jax_call(|| fallback.call(args, kwargs))
    }

    /// Runs `f` on the latest call's arrays, taken out of their lock, which reading leaves
    /// (Python) must not hold; another thread's call meanwhile finds none.
    fn with_seen<R>(&self, f: impl FnOnce(&mut SeenArrays) -> R) -> R {
        let mut seen = std::mem::take(&mut *lock(&self.seen));
        let result = f(&mut seen);
        let dropped = std::mem::replace(&mut *lock(&self.seen), seen);
        drop(dropped);
        result
    }

    /// Flattens the call's dynamic arguments and reads their leaves (the arrays of the latest
    /// call as `seen` remembers them), against the latest entry's tree when the call has it;
    /// why not, where JAX must handle the call.
    fn flatten<'a, 'py>(
        &self,
        py: Python<'py>,
        h: &Handles,
        call: &mut LiveCall<'a, 'py>,
        latest: Option<&'a Arc<Cached>>,
        seen: &mut SeenArrays,
    ) -> PyResult<Result<(), Unkeyable>> {
        if let Some(latest) = latest {
            let tree = &latest.signature.tree;
            if tree.flat {
                if call.dynamic().len() == tree.num_leaves {
                    if let Some(keys) = seen.read_all(h, call.dynamic())? {
                        call.set_tree(Cow::Borrowed(tree), None, keys);
                        return Ok(Ok(()));
                    }
                }
            } else {
                let mut leaves = Vec::with_capacity(tree.num_leaves);
                if tree.flatten(h, call.dynamic(), &mut leaves)? {
                    if let Some(keys) = seen.read_all(h, &leaves)? {
                        call.set_tree(Cow::Borrowed(tree), Some(leaves), keys);
                        return Ok(Ok(()));
                    }
                }
            }
        }
        let (tree, leaves) = match Tree::derive(py, h, call.dynamic())? {
            Ok(derived) => derived,
            Err(why) => return Ok(Err(why)),
        };
        let Some(keys) = seen.read_all(h, &leaves)? else {
            return Ok(Err(Unkeyable::Leaf));
        };
        let tree = self.intern(py, tree)?;
        let nested = (!tree.flat).then_some(leaves);
        call.set_tree(Cow::Owned(tree), nested, keys);
        Ok(Ok(()))
    }

    /// The function's own copy of `tree`, shared by the entries that have it.
    fn intern(&self, py: Python<'_>, tree: Tree) -> PyResult<Arc<Tree>> {
        let known = lock(&self.trees).get(&tree.hash).cloned();
        if let Some(known) = known {
            if known.same(py, &tree)? {
                return Ok(known);
            }
        }
        let tree = Arc::new(tree);
        let forgotten = lock(&self.trees).insert(tree.hash, tree.clone());
        drop(forgotten);
        Ok(tree)
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
        {
            return Ok(None);
        }
        if !self.with_seen(|seen| Self::holds_arrays(h, seen, args, &signature.leaves))? {
            return Ok(None);
        }
        self.stats.count(Counter::CacheHit);
        mark(clock, Stage::Lookup);
        let out = entry.run_arrays(h, args, None, clock)?;
        record(&self.stats, clock.take());
        Ok(Some(out))
    }

    /// Whether `args` are `jax.Array`s with the avals and shardings of `keys`.
    fn holds_arrays(
        h: &Handles,
        seen: &mut SeenArrays,
        args: &Bound<'_, PyTuple>,
        keys: &[LeafKey],
    ) -> PyResult<bool> {
        for (position, (arg, key)) in args.iter().zip(keys).enumerate() {
            let Some(LiveLeaf::Array { aval, sharding, .. }) = seen.read(h, position, &arg)? else {
                return Ok(false);
            };
            if !holds_array(key, &aval, &sharding)? {
                return Ok(false);
            }
        }
        Ok(true)
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
        let kind = &self.reasons.kind;
        let outcome = match &miss.fast_path {
            None => {
                let why = miss.jax_reason.as_deref().unwrap_or("no reason given");
                let reason = format!("{kind}: JAX runs the call: {why}");
                self.count_fallback(&reason);
                Outcome::Jax(reason)
            }
            Some(fast) => {
                if let Some(why) = &miss.jax_reason {
                    self.count_fallback(&format!("{kind}: JAX compiled the call: {why}"));
                }
                Outcome::Run(Entry::new(py, h, fast.get(), &cached.signature, leaves)?)
            }
        };
        cached.set_outcome(outcome);
        Ok(miss.outputs.bind(py).clone())
    }
}

impl DispatchCache {
    /// Counts a fallback of this function's, with its reason.
    fn count_fallback(&self, reason: &str) {
        self.stats.count_fallback(reason);
    }

    fn clear(&self) {
        self.generation.fetch_add(1, Ordering::Relaxed);
        let entries = self.cache.drain();
        let trees = lock(&self.trees).clear();
        let seen = std::mem::take(&mut *lock(&self.seen));
        drop((entries, trees, seen));
    }
}

#[pymethods]
impl DispatchCache {
    /// An empty cache for the function named `name` (`module.qualname`) in `fastpjit.stats()`,
    /// defined at `place` (`file:line`, or empty), whose static arguments are these, of `kind`
    /// (`"jit"`, `"pmap"`, ...).
    #[new]
    #[pyo3(signature = (name, static_argnums, static_argnames, kind = "jit", capacity = 4096, context = true, place = ""))]
    fn new(
        name: &str,
        static_argnums: Vec<isize>,
        static_argnames: Vec<Py<PyString>>,
        kind: &str,
        capacity: usize,
        context: bool,
        place: &str,
    ) -> Self {
        Self {
            statics: StaticArgs {
                argnums: static_argnums,
                argnames: static_argnames,
            },
            reasons: Reasons::of(kind),
            stats: function_stats(name, place),
            cache: EntryCache::new(capacity),
            trees: Mutex::new(BoundedMap::new(TREES)),
            seen: Mutex::new(SeenArrays::default()),
            keyed_by_context: context,
            delegation: Delegation::default(),
            generation: AtomicU64::new(0),
        }
    }

    /// Forgets every cached executable.
    #[pyo3(name = "_clear")]
    fn py_clear(&self) {
        self.clear();
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        for name in &self.statics.argnames {
            visit.call(name)?;
        }
        // What an entry holds that may lead back to a function: the caller's objects (static
        // arguments, dict keys, pytree node types and data) and the output tree.
        self.cache.try_for_each(|cached| {
            signature::traverse(&cached.signature, &visit)?;
            if let Some(Outcome::Run(entry)) = cached.outcome() {
                entry.traverse(&visit)?;
            }
            Ok(())
        })?;
        if let Ok(trees) = self.trees.try_lock() {
            for tree in trees.values() {
                tree.traverse(&visit)?;
            }
        }
        if let Ok(seen) = self.seen.try_lock() {
            seen.traverse(&visit)?;
        }
        Ok(())
    }

    fn __clear__(&self) {
        self.clear();
    }
}

#[pymethods]
impl JitFunction {
    /// A function that dispatches through `cache`: `fallback` runs the calls that JAX must
    /// run, `miss(args, kwargs)` the cache misses, and `jax_dispatch` (jax.jit's own function,
    /// or `make_jax_dispatch()` that makes it,
    /// where there is one) the calls that JAX's dispatch serves faster.
    #[new]
    #[pyo3(signature = (fallback, miss, cache, jax_dispatch = None, make_jax_dispatch = None))]
    fn new(
        fallback: Py<PyAny>,
        miss: Py<PyAny>,
        cache: Py<DispatchCache>,
        jax_dispatch: Option<Py<PyAny>>,
        make_jax_dispatch: Option<Py<PyAny>>,
    ) -> Self {
        let jax_dispatch = match (jax_dispatch, make_jax_dispatch) {
            (Some(jitted), _) => JaxDispatch::Made(jitted),
            (None, Some(make)) => JaxDispatch::Maker { make, asked: 0 },
            (None, None) => JaxDispatch::None,
        };
        Self {
            fallback: Mutex::new(Some(fallback)),
            miss: Mutex::new(Some(miss)),
            shared: cache,
            jax_dispatch: Mutex::new(jax_dispatch),
        }
    }

    /// The cache that this function shares with the other functions of its function and
    /// options.
    #[getter(_dispatch_cache)]
    fn dispatch_cache(&self, py: Python<'_>) -> Py<DispatchCache> {
        self.shared.clone_ref(py)
    }

    #[pyo3(signature = (*args, **kwargs))]
    fn __call__<'py>(
        slf: &Bound<'py, Self>,
        args: &Bound<'py, PyTuple>,
        kwargs: Option<&Bound<'py, PyDict>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let py = slf.py();
        let this = slf.get();
        let mut clock = Clock::start();
        let h = handles(py)?;
        if let Some(why) = this
            .delegation
            .delegates(|| carries_numpy_array(h, args, kwargs))
        {
            if !recompiles_guarded() {
                if let Some(out) = this.delegate(py, why, args, kwargs) {
                    return out;
                }
            }
        }
        let context = if this.keyed_by_context {
            let context = LiveContext::read(py, h)?;
            if context.jit_disabled(h)? {
                return this.to_jax(py, &this.reasons.disabled, args, kwargs);
            }
            context
        } else {
            if kwargs.is_none_or(PyDictMethods::is_empty) {
                if let Some(out) = this.run_repeat(h, args, &mut clock)? {
                    return Ok(out);
                }
            }
            LiveContext::none(py)
        };
        let latest = this.cache.latest();
        let mut call = LiveCall::split(&this.statics, args, kwargs, context)?;
        if let Err(why) =
            this.with_seen(|seen| this.flatten(py, h, &mut call, latest.as_ref(), seen))?
        {
            return this.to_jax(py, this.reasons.unkeyable(why), args, kwargs);
        }
        // After waiting for another thread's miss, the entry is looked up by hash only.
        let mut first = true;
        loop {
            let recent = std::mem::replace(&mut first, false);
            let cached = match this.find(&call, latest.as_ref(), recent)? {
                Found::Entry(cached, _) => cached,
                Found::Unkeyable(why) => {
                    return this.to_jax(py, this.reasons.unkeyable(why), args, kwargs);
                }
                Found::Miss(hash) => {
                    let Some(signature) = signature::keep(&call, hash)? else {
                        let reason = this.reasons.unkeyable(Unkeyable::Leaf);
                        return this.to_jax(py, reason, args, kwargs);
                    };
                    return this.run_miss(py, h, signature, call.leaves(), args, kwargs);
                }
            };
            match cached.outcome() {
                Some(Outcome::Run(entry)) => {
                    this.stats.count(Counter::CacheHit);
                    this.cache.hit(&cached, latest.as_ref());
                    mark(&mut clock, Stage::Lookup);
                    let mut took = Took {
                        clock: clock.take(),
                        ..Took::default()
                    };
                    let out = match entry.run(py, h, &call, &mut took) {
                        Err(err) if err.is_instance_of::<PyOverflowError>(py) => {
                            // A Python int too large for its dtype: JAX's path names it.
                            return this.to_jax(py, &this.reasons.overflow, args, kwargs);
                        }
                        out => out?,
                    };
                    record(&this.stats, took.clock.take());
                    if took.moved {
                        this.count_fallback(&this.reasons.moved);
                    }
                    // Asked only where the hit placed or copied new arrays: it takes a lock.
                    let can_delegate = (took.inputs.placed > 0 || took.inputs.copied > 0)
                        && entry.delegable()
                        && !matches!(*lock(&this.jax_dispatch), JaxDispatch::None);
                    this.delegation.after_hit(can_delegate, took.inputs);
                    if let Some(hook) = call.context.post_hook() {
                        let kwargs = kwargs.map_or_else(|| PyDict::new(py), Clone::clone);
                        hook.call1((slf, args, kwargs, &out))?;
                    }
                    return Ok(out);
                }
                Some(Outcome::Jax(reason)) => return this.to_jax(py, reason, args, kwargs),
                None => match cached.miss_state() {
                    MissState::Done => {}
                    MissState::Elsewhere => py.detach(|| cached.wait_for_miss()),
                    MissState::OwnMiss => {
                        return this.to_jax(py, &this.reasons.recursion, args, kwargs);
                    }
                },
            }
        }
    }

    /// The number of executables cached.
    #[pyo3(name = "_cache_size")]
    fn cache_size(&self) -> usize {
        self.cache.len()
    }

    /// How a call of these arguments would be served, without running it (for
    /// `fastpjit.explain`): `{"outcome": "hit" | "miss" | "fallback", "path": "recent" |
    /// "keyed" | None, "reason": the fallback's reason or None}`, and for a hit the entry's
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
        let out = PyDict::new(py);
        let answer = |outcome: &str, path: Option<&str>, reason: Option<&str>| {
            out.set_item("outcome", outcome)?;
            out.set_item("path", path)?;
            out.set_item("reason", reason)?;
            Ok::<_, PyErr>(out.clone())
        };
        let delegated = this
            .delegation
            .delegates(|| carries_numpy_array(h, args, kwargs))
            .filter(|_| {
                !recompiles_guarded() && !matches!(*lock(&this.jax_dispatch), JaxDispatch::None)
            });
        if let Some(why) = delegated {
            let reason = match why {
                Handover::Placements => DELEGATED,
                Handover::Unkeyable => HANDED_OVER,
            };
            return answer("fallback", None, Some(reason));
        }
        let context = if this.keyed_by_context {
            let context = LiveContext::read(py, h)?;
            if context.jit_disabled(h)? {
                return answer("fallback", None, Some(&this.reasons.disabled));
            }
            context
        } else {
            LiveContext::none(py)
        };
        let latest = this.cache.latest();
        let mut call = LiveCall::split(&this.statics, args, kwargs, context)?;
        if let Err(why) =
            this.with_seen(|seen| this.flatten(py, h, &mut call, latest.as_ref(), seen))?
        {
            return answer("fallback", None, Some(this.reasons.unkeyable(why)));
        }
        let (cached, path) = match this.find(&call, latest.as_ref(), true)? {
            Found::Entry(cached, path) => (cached, path),
            Found::Unkeyable(why) => {
                return answer("fallback", None, Some(this.reasons.unkeyable(why)));
            }
            Found::Miss(_) => return answer("miss", None, None),
        };
        match cached.outcome() {
            Some(Outcome::Run(entry)) => {
                let report = entry.report(py)?;
                out.update(report.as_mapping())?;
                answer("hit", Some(path), None)
            }
            Some(Outcome::Jax(reason)) => answer("fallback", Some(path), Some(reason)),
            None => answer(
                "miss",
                None,
                Some("another call's miss of this signature runs"),
            ),
        }
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
    fn held_arrays(&self) -> usize {
        lock(&self.seen).held()
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
            match &*dispatch {
                JaxDispatch::None => {}
                JaxDispatch::Made(callable) | JaxDispatch::Maker { make: callable, .. } => {
                    visit.call(callable)?;
                }
            }
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

/// Forgets the avals and shardings that the dispatcher remembers (`jax.clear_caches()`).
#[pyfunction]
pub fn clear_dispatch_memo() {
    leaf::clear_memo();
}

/// Whether jaxlib's transfer guard watches transfers in `direction` (`"host_to_device"`,
/// `"device_to_host"`) now, on this thread.
#[pyfunction]
pub fn transfers_guarded(direction: &Bound<'_, PyString>) -> PyResult<bool> {
    handles(direction.py())?.transfers_guarded(direction)
}

/// How many avals and shardings the dispatcher remembers.
#[pyfunction]
pub fn dispatch_memo_sizes() -> (usize, usize) {
    leaf::memo_sizes()
}
