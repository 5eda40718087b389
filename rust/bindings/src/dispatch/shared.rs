//! What the functions of one Python function and options share, as JAX's jit functions share
//! its cache (`PjitFunctionCache`): the cache entries, the latest calls' trees and arrays, and
//! the function's counters. A new `jit(f)` of a function already wrapped finds the
//! executables of the others.

use std::borrow::Cow;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use fastpjit_core::dispatch::route::{self, Outcome as Held};
use fastpjit_core::dispatch::{has_leaf_shapes, CacheEntry, EntryCache, Found, Route, Unkeyable};
use fastpjit_core::{BoundedMap, Delegation, Fallback};
use pyo3::gc::PyVisit;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyString, PyTuple};
use pyo3::PyTraverseError;

use super::context::LiveContext;
use super::describe::{describe, plain};
use super::entry::Entry;
use super::leaf::{LiveLeaf, SeenArrays};
use super::signature::{self, matches, CallSignature, LeafKey, LiveCall, PyCompare, StaticArgs};
use super::tree::Tree;
use crate::handles::{handles, Handles};
use crate::stats::{function_stats, FunctionStats};
use fastpjit_core::dispatch::describe::{nearest, Description};

/// What a cache entry holds once its miss has run. (Not boxed: a hit reads its entry on every
/// call.)
#[allow(clippy::large_enum_variant)]
pub enum Outcome {
    Run(Entry),
    /// JAX runs such calls (effects, outputs that are not arrays, an active trace); why.
    Jax(Fallback),
}

/// A difference between signatures as Python reads it: `(what, path, call, cached)`.
type DifferenceRow = (String, String, String, String);

/// A cache entry: a signature, and what calls of it do once its miss has run (see the core's
/// `EntryCache` for the single-compile protocol).
pub type Cached = CacheEntry<CallSignature, Outcome>;

/// How many trees a function remembers.
const TREES: usize = 16;

pub fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

#[pyclass(module = "fastpjit._core", frozen)]
pub struct DispatchCache {
    pub(super) statics: StaticArgs,
    pub(super) stats: Arc<FunctionStats>,
    pub(super) cache: EntryCache<CallSignature, Outcome>,
    /// The trees of the function's calls by hash, so that entries of one tree share it.
    trees: Mutex<BoundedMap<u64, Arc<Tree>>>,
    /// The arrays of the latest calls, two by position; a call takes them while it reads its
    /// leaves, and puts them back with its own.
    seen: Mutex<SeenArrays>,
    /// Whether calls are keyed by JAX's jit key; not those of a compiled foreign module,
    /// which depends on no configuration and which no trace can stage.
    pub(super) keyed_by_context: bool,
    /// Whether calls go to JAX's C++ dispatch (see `Delegation`).
    pub(super) delegation: Delegation,
    /// How many times the cache was cleared: a bound function's entry from before is stale.
    generation: AtomicU64,
}

impl DispatchCache {
    /// How many times the cache was cleared.
    pub(super) fn generation(&self) -> u64 {
        self.generation.load(Ordering::Relaxed)
    }

    /// The route of `call`, flattened, by its cache entry: among the latest calls' entries
    /// where `recent` (compared only where the call was flattened against its tree), else by
    /// the signature's hash.
    #[inline]
    pub(super) fn route(
        &self,
        call: &LiveCall<'_, '_>,
        latest: Option<&Arc<Cached>>,
        recent: bool,
    ) -> PyResult<Route<Arc<Cached>>> {
        let found = if recent {
            self.cache.probe_recent(latest, |signature| {
                Ok::<_, PyErr>(
                    Arc::ptr_eq(&signature.tree, &call.tree) && matches(signature, call)?,
                )
            })?
        } else {
            None
        };
        let (cached, found) = if let Some(cached) = found {
            (cached, Found::Recent)
        } else {
            let hash = match call.hash()? {
                Ok(hash) => hash,
                Err(why) => return Ok(Route::Jax(why.fallback())),
            };
            match self.cache.lookup(hash, |s| matches(s, call))? {
                Some(cached) => (cached, Found::Keyed),
                None => return Ok(Route::Miss(hash)),
            }
        };
        let held = match cached.outcome() {
            Some(Outcome::Run(_)) => Held::Run,
            Some(Outcome::Jax(fallback)) => Held::Jax(*fallback),
            None => Held::Pending(cached.miss_state()),
        };
        match route::of_entry(cached, found, held) {
            Some(route) => Ok(route),
            // Its miss ended meanwhile: the entry holds its outcome now.
            None => self.route(call, latest, false),
        }
    }

    /// Reads a call under its jit key: split into static and dynamic arguments, and flattened;
    /// or why JAX runs it (`jax.disable_jit`, an argument that has no key).
    pub(super) fn read<'a, 'py>(
        &self,
        py: Python<'py>,
        h: &Handles,
        args: &Bound<'py, PyTuple>,
        kwargs: Option<&Bound<'py, PyDict>>,
        latest: Option<&'a Arc<Cached>>,
    ) -> PyResult<Result<LiveCall<'a, 'py>, Fallback>> {
        let context = if self.keyed_by_context {
            let context = LiveContext::read(py, h)?;
            if context.jit_disabled(h)? {
                return Ok(Err(Fallback::DISABLE_JIT));
            }
            context
        } else {
            LiveContext::none(py)
        };
        let mut call = LiveCall::split(&self.statics, args, kwargs, context)?;
        Ok(match self.flatten(py, h, &mut call, latest)? {
            Ok(()) => Ok(call),
            Err(why) => Err(why.fallback()),
        })
    }

    /// The signature of a call of these arguments, read without running it; None where the
    /// call has none (JAX runs it).
    fn signature_of(
        &self,
        py: Python<'_>,
        args: &Bound<'_, PyTuple>,
        kwargs: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Option<CallSignature>> {
        let h = handles(py)?;
        let latest = self.cache.latest();
        let Ok(call) = self.read(py, h, args, kwargs, latest.as_ref())? else {
            return Ok(None);
        };
        let Ok(hash) = call.hash()? else {
            return Ok(None);
        };
        signature::keep(&call, hash)
    }

    /// The description of the signature of a call of these arguments, without running it;
    /// None where the call has none.
    fn description(
        &self,
        args: &Bound<'_, PyTuple>,
        kwargs: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Option<Description>> {
        let py = args.py();
        self.signature_of(py, args, kwargs)?
            .map(|signature| describe(py, handles(py)?, &signature, &self.statics.argnums))
            .transpose()
    }

    /// Runs `f` on the latest call's arrays, taken out of their lock, which reading leaves
    /// (Python) must not hold; another thread's call meanwhile finds none.
    pub(super) fn with_seen<R>(&self, f: impl FnOnce(&mut SeenArrays) -> R) -> R {
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
    ) -> PyResult<Result<(), Unkeyable>> {
        self.with_seen(|seen| {
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
        })
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

    /// Whether `args` are `jax.Array`s with the avals and shardings of `keys`.
    pub(super) fn holds_arrays(
        &self,
        h: &Handles,
        args: &[Bound<'_, PyAny>],
        keys: &[LeafKey],
    ) -> PyResult<bool> {
        let Some(first) = args.first() else {
            return Ok(true);
        };
        let compare = PyCompare::leaves(first.py());
        self.with_seen(|seen| {
            for (position, (arg, key)) in args.iter().zip(keys).enumerate() {
                let Some(LiveLeaf::Array { aval, sharding, .. }) = seen.read(h, position, arg)?
                else {
                    return Ok(false);
                };
                if !key.holds_array(&compare, &aval, &sharding)? {
                    return Ok(false);
                }
            }
            Ok(true)
        })
    }

    /// How many arrays of the latest calls are remembered by weak reference.
    pub(super) fn held_arrays(&self) -> usize {
        lock(&self.seen).held()
    }

    pub(super) fn clear(&self) {
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
    /// defined at `place` (`file:line`, or empty), whose static arguments are these.
    #[new]
    #[pyo3(signature = (name, static_argnums, static_argnames, capacity = 4096, context = true, place = ""))]
    fn new(
        name: &str,
        static_argnums: Vec<isize>,
        static_argnames: Vec<Py<PyString>>,
        capacity: usize,
        context: bool,
        place: &str,
    ) -> Self {
        Self {
            statics: StaticArgs {
                argnums: static_argnums,
                argnames: static_argnames,
            },
            stats: function_stats(name, place),
            cache: EntryCache::new(capacity),
            trees: Mutex::new(BoundedMap::new(TREES)),
            seen: Mutex::new(SeenArrays::default()),
            keyed_by_context: context,
            delegation: Delegation::default(),
            generation: AtomicU64::new(0),
        }
    }

    /// The signature of a call of these arguments in words, one row per path (the flat leaves
    /// first, in JAX's order; see `describe`), without running it; None where the call has
    /// none (JAX runs it).
    #[pyo3(name = "_describe", signature = (*args, **kwargs))]
    fn describe_call(
        &self,
        args: &Bound<'_, PyTuple>,
        kwargs: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Option<Vec<(String, String)>>> {
        Ok(self.description(args, kwargs)?.map(|d| d.rows))
    }

    /// The signature of a call of these arguments as plain data (see `describe::plain`),
    /// without running it; None where the call has none (JAX runs it).
    #[pyo3(name = "_signature", signature = (*args, **kwargs))]
    fn plain_signature<'py>(
        &self,
        args: &Bound<'py, PyTuple>,
        kwargs: Option<&Bound<'py, PyDict>>,
    ) -> PyResult<Option<Bound<'py, PyTuple>>> {
        let py = args.py();
        self.signature_of(py, args, kwargs)?
            .map(|signature| plain(py, &signature, &self.statics.argnums))
            .transpose()
    }

    /// What differs between the signature of a call of these arguments and the cached
    /// signature nearest to it, as `(what, path, call, cached)`, without running it; None
    /// where the call has no signature or no miss has run.
    #[pyo3(name = "_differences", signature = (*args, **kwargs))]
    fn differences(
        &self,
        args: &Bound<'_, PyTuple>,
        kwargs: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Option<Vec<DifferenceRow>>> {
        let py = args.py();
        let Some(call) = self.description(args, kwargs)? else {
            return Ok(None);
        };
        let h = handles(py)?;
        let mut cached = Vec::new();
        self.cache.try_for_each(|entry| {
            if entry.outcome().is_some() {
                cached.push(describe(py, h, &entry.signature, &self.statics.argnums)?.items);
            }
            Ok::<_, PyErr>(())
        })?;
        let found = nearest(&call.items, cached.iter().map(Vec::as_slice));
        Ok(found.map(|found| {
            found
                .into_iter()
                .map(|d| (d.what, d.path, d.call, d.cached))
                .collect()
        }))
    }

    /// Forgets the cache entries whose flat leaves have `shapes` (in any order), and bound
    /// functions' kept entries; returns how many entries were forgotten. Compile options
    /// registered for a shape bucket make its entries stale; entries of other shapes stay.
    #[pyo3(name = "_forget_shapes")]
    fn forget_shapes(&self, shapes: Vec<Vec<i64>>) -> usize {
        self.generation.fetch_add(1, Ordering::Relaxed);
        let forgotten = self
            .cache
            .forget_where(move |signature| has_leaf_shapes(&signature.leaves, &shapes));
        forgotten.len()
    }

    /// Hands no call to jax.jit's dispatch any more, which compiles with the function's own
    /// compile options only.
    #[pyo3(name = "_no_delegation")]
    fn no_delegation(&self) {
        self.delegation.forbid();
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
