//! Process-wide counters behind `fastpjit.stats()`: cache hits, misses, compiles and fallbacks
//! with their reasons.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use pyo3::prelude::*;
use pyo3::types::PyDict;

static CACHE_HITS: AtomicU64 = AtomicU64::new(0);
static CACHE_MISSES: AtomicU64 = AtomicU64::new(0);
static COMPILES: AtomicU64 = AtomicU64::new(0);
static FALLBACKS: Mutex<BTreeMap<String, u64>> = Mutex::new(BTreeMap::new());

#[derive(Clone, Copy)]
pub enum Counter {
    CacheHit,
    CacheMiss,
    /// Backend compiles that a cache miss (or `compile_hlo`) caused.
    Compile(u64),
}

pub fn count(counter: Counter) {
    match counter {
        Counter::CacheHit => CACHE_HITS.fetch_add(1, Ordering::Relaxed),
        Counter::CacheMiss => CACHE_MISSES.fetch_add(1, Ordering::Relaxed),
        Counter::Compile(n) => COMPILES.fetch_add(n, Ordering::Relaxed),
    };
}

/// Records that a call took a slower correct path, and why.
pub fn count_fallback(reason: &str) {
    let mut fallbacks = FALLBACKS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    *fallbacks.entry(reason.to_owned()).or_default() += 1;
}

/// A snapshot of every counter: `{"cache_hits", "cache_misses", "compiles", "fallbacks":
/// {reason: n}, "host_pool": {...}}`.
#[pyfunction]
pub fn stats(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    let out = PyDict::new(py);
    out.set_item("cache_hits", CACHE_HITS.load(Ordering::Relaxed))?;
    out.set_item("cache_misses", CACHE_MISSES.load(Ordering::Relaxed))?;
    out.set_item("compiles", COMPILES.load(Ordering::Relaxed))?;
    let fallbacks = PyDict::new(py);
    for (reason, n) in FALLBACKS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .iter()
    {
        fallbacks.set_item(reason, n)?;
    }
    out.set_item("fallbacks", fallbacks)?;
    out.set_item("host_pool", crate::host_memory::host_pool_stats(py)?)?;
    Ok(out)
}

/// Sets every counter back to zero.
#[pyfunction]
pub fn reset_stats() {
    for cell in [&CACHE_HITS, &CACHE_MISSES, &COMPILES] {
        cell.store(0, Ordering::Relaxed);
    }
    FALLBACKS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clear();
    crate::host_memory::reset_host_pool_counters();
}

/// Counts backend compiles that no cache miss reported (`compile_hlo`'s).
#[pyfunction]
pub fn count_compiles(n: u64) {
    count(Counter::Compile(n));
}

/// Counts a fallback from Python code paths (`fastpjit.stats()["fallbacks"][reason]`).
#[pyfunction]
#[pyo3(name = "count_fallback")]
pub fn py_count_fallback(reason: &str) {
    count_fallback(reason);
}
