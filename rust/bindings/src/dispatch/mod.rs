//! The jit dispatcher: a call goes straight into Rust, which keys it, finds the executable and
//! runs it; only a cache miss (or a call JAX must trace) runs Python.

mod entry;
mod fast;
mod handles;
mod signature;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use pyo3::exceptions::PyOverflowError;
use pyo3::gc::PyVisit;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyString, PyTuple};
use pyo3::PyTraverseError;

use crate::stats::{count, count_fallback, Counter};
use entry::Entry;
use fast::{FastKey, Structure};
use handles::handles;
use signature::{Hashed, Signature, Tree, Unkeyable};

/// A cached executable under its key.
struct Cached {
    signature: Signature,
    entry: Entry,
}

/// The latest flat call: its executable, and the identities that a repeat of it shows.
struct Latest {
    cached: Arc<Cached>,
    key: FastKey,
}

/// Executables by the hash of their key, bounded, least recently used evicted first.
struct JitCache {
    buckets: HashMap<u64, Vec<(Arc<Cached>, u64)>>,
    len: usize,
    clock: u64,
}

impl JitCache {
    fn new() -> Self {
        Self {
            buckets: HashMap::new(),
            len: 0,
            clock: 0,
        }
    }

    fn candidates(&mut self, hash: u64) -> Vec<Arc<Cached>> {
        self.clock += 1;
        let clock = self.clock;
        self.buckets.get_mut(&hash).map_or_else(Vec::new, |bucket| {
            bucket
                .iter_mut()
                .map(|(cached, used)| {
                    *used = clock;
                    cached.clone()
                })
                .collect()
        })
    }

    fn insert(&mut self, cached: Arc<Cached>, capacity: usize) {
        if self.len >= capacity {
            self.evict_oldest();
        }
        self.clock += 1;
        self.buckets
            .entry(cached.signature.hash)
            .or_default()
            .push((cached, self.clock));
        self.len += 1;
    }

    fn evict_oldest(&mut self) {
        let oldest = self
            .buckets
            .iter()
            .flat_map(|(&hash, bucket)| {
                bucket
                    .iter()
                    .enumerate()
                    .map(move |(i, (_, used))| (*used, hash, i))
            })
            .min();
        if let Some((_, hash, i)) = oldest {
            let bucket = self.buckets.get_mut(&hash).expect("the bucket just seen");
            bucket.swap_remove(i);
            if bucket.is_empty() {
                self.buckets.remove(&hash);
            }
            self.len -= 1;
        }
    }

    fn clear(&mut self) {
        self.buckets.clear();
        self.len = 0;
    }
}

/// What a miss returns: the outputs, the entry to cache (None if JAX keeps the function off
/// its fast path), the backend compiles it ran, and why JAX compiled it, if JAX did.
type MissResult<'py> = (Bound<'py, PyAny>, Bound<'py, PyAny>, u64, Option<String>);

/// A call split into its static arguments and the dynamic rest.
struct SplitCall<'py> {
    statics: Vec<Bound<'py, PyAny>>,
    args: Bound<'py, PyTuple>,
    kwargs: Bound<'py, PyDict>,
}

/// The dispatcher behind `fastpjit.jit` and its compiled (AOT) functions; Python subclasses
/// add `lower`, `trace`, ...
#[pyclass(module = "fastpjit._core", subclass)]
pub struct JitFunction {
    /// JAX's callable for the same computation (`jax.jit(f)`, or a `Compiled`): it runs every
    /// call that JAX must handle (tracers, unhashable statics).
    fallback: Option<Py<PyAny>>,
    /// `miss(args, kwargs) -> MissResult`: the cache miss.
    miss: Option<Py<PyAny>>,
    /// Positions of static arguments; a negative one counts from the end of the call's.
    static_argnums: Vec<isize>,
    static_argnames: Vec<Py<PyString>>,
    capacity: usize,
    /// What the function is (`jit`, `pmap`, `compiled`), for the reasons of its fallbacks.
    kind: String,
    cache: Mutex<JitCache>,
    /// The latest flat call, tried first by identity.
    latest: Mutex<Option<Arc<Latest>>>,
}

impl JitFunction {
    fn latest(&self) -> Option<Arc<Latest>> {
        self.latest
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Remembers `cached` as the executable of a call of positional `args`, keyed by
    /// `signature` with leaves `leaves`, when a repeat of it can be recognised by identity.
    fn set_latest(
        &self,
        py: Python<'_>,
        cached: &Arc<Cached>,
        signature: &Signature,
        args: &Bound<'_, PyTuple>,
        leaves: &[Bound<'_, PyAny>],
    ) -> PyResult<()> {
        let key = FastKey::new(py, args, leaves, signature, &cached.entry)?;
        *self.latest.lock().unwrap_or_else(PoisonError::into_inner) = key.map(|key| {
            Arc::new(Latest {
                cached: cached.clone(),
                key,
            })
        });
        Ok(())
    }

    /// A callable slot; `None` only after the garbage collector cleared it.
    fn callable<'a, 'py>(
        py: Python<'py>,
        slot: Option<&'a Py<PyAny>>,
    ) -> PyResult<&'a Bound<'py, PyAny>> {
        slot.map(|f| f.bind(py)).ok_or_else(|| {
            pyo3::exceptions::PyRuntimeError::new_err("this jit function was cleared")
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, JitCache> {
        self.cache.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Splits a call into static arguments (by position, then name) and the dynamic rest.
    fn split<'py>(
        &self,
        py: Python<'py>,
        args: &Bound<'py, PyTuple>,
        kwargs: Option<&Bound<'py, PyDict>>,
    ) -> PyResult<SplitCall<'py>> {
        let mut statics = Vec::new();
        let dynamic_args = if self.static_argnums.is_empty() {
            args.clone()
        } else {
            let mut dynamic = Vec::with_capacity(args.len());
            for (i, arg) in args.iter().enumerate() {
                let from_end = i as isize - args.len() as isize;
                if self
                    .static_argnums
                    .iter()
                    .any(|&n| n == i as isize || n == from_end)
                {
                    statics.push(arg);
                } else {
                    dynamic.push(arg);
                }
            }
            PyTuple::new(py, dynamic)?
        };
        let dynamic_kwargs = PyDict::new(py);
        if let Some(kwargs) = kwargs {
            for (name, value) in kwargs.iter() {
                if self
                    .static_argnames
                    .iter()
                    .any(|s| s.bind(py).as_any().eq(&name).unwrap_or(false))
                {
                    statics.push(PyTuple::new(py, [name, value])?.into_any());
                } else {
                    dynamic_kwargs.set_item(name, value)?;
                }
            }
        }
        Ok(SplitCall {
            statics,
            args: dynamic_args,
            kwargs: dynamic_kwargs,
        })
    }

    fn lookup(&self, py: Python<'_>, signature: &Signature) -> PyResult<Option<Arc<Cached>>> {
        // Comparing keys may run Python (`__eq__`), so it happens outside the lock.
        let candidates = self.lock().candidates(signature.hash);
        for cached in candidates {
            if cached.signature.matches(py, signature)? {
                return Ok(Some(cached));
            }
        }
        Ok(None)
    }
}

#[pymethods]
impl JitFunction {
    #[new]
    #[pyo3(signature = (fallback, miss, static_argnums, static_argnames, kind = "jit", capacity = 4096))]
    fn new(
        fallback: Py<PyAny>,
        miss: Py<PyAny>,
        static_argnums: Vec<isize>,
        static_argnames: Vec<Py<PyString>>,
        kind: &str,
        capacity: usize,
    ) -> Self {
        Self {
            fallback: Some(fallback),
            miss: Some(miss),
            static_argnums,
            static_argnames,
            capacity: capacity.max(1),
            kind: kind.to_owned(),
            cache: Mutex::new(JitCache::new()),
            latest: Mutex::new(None),
        }
    }

    #[pyo3(signature = (*args, **kwargs))]
    fn __call__<'py>(
        &self,
        py: Python<'py>,
        args: &Bound<'py, PyTuple>,
        kwargs: Option<&Bound<'py, PyDict>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let h = handles(py)?;
        let positional_only =
            kwargs.is_none_or(PyDictMethods::is_empty) && self.static_argnums.is_empty();
        if positional_only {
            if let Some(latest) = self.latest() {
                if let Some(leaves) = latest.key.matches(py, h, args)? {
                    count(Counter::CacheHit);
                    return latest.cached.entry.call_fast(
                        py,
                        h,
                        &leaves,
                        &latest.key.leaves,
                        latest.key.passthrough,
                        &self.kind,
                    );
                }
            }
        }
        let call = self.split(py, args, kwargs)?;
        let (leaves, tree) = if let Some((structure, leaves)) =
            Structure::flatten_call(h, &call.args, &call.kwargs)?
        {
            (leaves, Tree::Rust(Arc::new(structure)))
        } else {
            // Custom pytree nodes (and unusual leaves): JAX's registry flattens the call.
            let (leaves, treedef): (Bound<'py, PyList>, Bound<'py, PyAny>) = h
                .flatten
                .bind(py)
                .call1(((&call.args, &call.kwargs),))?
                .extract()?;
            (leaves.iter().collect(), Tree::Jax(Hashed::new(&treedef)?))
        };
        let signature = match Signature::new(py, h, &call.statics, tree, &leaves, positional_only)?
        {
            Ok(signature) => signature,
            Err(reason) => {
                let why = match reason {
                    Unkeyable::Leaf => "an argument is a tracer or not an array; JAX runs the call",
                    Unkeyable::UnhashableStatic => {
                        "a static argument has no hash; JAX runs the call"
                    }
                };
                count_fallback(&format!("{}: {why}", self.kind));
                return Self::callable(py, self.fallback.as_ref())?.call(args, kwargs);
            }
        };
        if let Some(cached) = self.lookup(py, &signature)? {
            count(Counter::CacheHit);
            self.set_latest(py, &cached, &signature, args, &leaves)?;
            return match cached
                .entry
                .call(py, h, &leaves, &signature.leaves, &self.kind)
            {
                // A Python int too large for its dtype: JAX's own path names the argument.
                Err(err) if err.is_instance_of::<PyOverflowError>(py) => {
                    Self::callable(py, self.fallback.as_ref())?.call(args, kwargs)
                }
                result => result,
            };
        }
        count(Counter::CacheMiss);
        let kwargs = kwargs.map_or_else(|| PyDict::new(py), Clone::clone);
        let (outs, entry, compiles, jax_compiled): MissResult<'py> =
            Self::callable(py, self.miss.as_ref())?
                .call1((args, kwargs))?
                .extract()?;
        count(Counter::Compile(compiles));
        if entry.is_none() {
            let why = jax_compiled.as_deref().unwrap_or("no reason given");
            count_fallback(&format!("{}: JAX runs the call: {why}", self.kind));
            return Ok(outs);
        }
        if let Some(why) = &jax_compiled {
            count_fallback(&format!("{}: JAX compiled the call: {why}", self.kind));
        }
        if let Some(cached) = self.lookup(py, &signature)? {
            // Another thread missed on the same key meanwhile and cached its executable.
            self.set_latest(py, &cached, &signature, args, &leaves)?;
        } else {
            let mut entry = Entry::from_miss(&entry)?;
            entry.adopt_equal_shardings(py, &signature.leaves)?;
            let cached = Arc::new(Cached { signature, entry });
            self.set_latest(py, &cached, &cached.signature, args, &leaves)?;
            self.lock().insert(cached, self.capacity);
        }
        Ok(outs)
    }

    /// The number of executables cached.
    #[pyo3(name = "_cache_size")]
    fn cache_size(&self) -> usize {
        self.lock().len
    }

    /// Forgets every cached executable.
    #[pyo3(name = "_clear_cache")]
    fn clear_cache(&self) {
        self.lock().clear();
        *self.latest.lock().unwrap_or_else(PoisonError::into_inner) = None;
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        for callable in [&self.fallback, &self.miss].into_iter().flatten() {
            visit.call(callable)?;
        }
        for name in &self.static_argnames {
            visit.call(name)?;
        }
        Ok(())
    }

    fn __clear__(&mut self) {
        self.fallback = None;
        self.miss = None;
        self.clear_cache();
    }
}
