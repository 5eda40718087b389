//! Process-wide counters behind `fastpjit.stats()`: cache hits, misses, compiles and fallbacks
//! with their reasons, in all and per function.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub use fastpjit_core::stats::{Counter, FunctionStats};
use fastpjit_core::stats::{FunctionId, Registry};
use fastpjit_core::timing::{Latencies, Percentiles, Stage};
use fastpjit_core::Fallback;

use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::errors::{refusal, DispatchError};

/// Counts that belong to no function: compiles and fallbacks that Python code paths report
/// (`compile_hlo`'s compiles, `device_put`'s fallbacks).
static OTHERS: FunctionStats = FunctionStats::new();
/// Every function's counters; past 4,096 functions, the others share one row.
static FUNCTIONS: Registry = Registry::new(4096);
/// Whether cache hits are timed by stage (`fastpjit.timing`); off, a call reads this flag and
/// nothing more.
static TIMING: AtomicBool = AtomicBool::new(false);

/// The stage times of one timed call.
pub struct Clock {
    last: Instant,
    stages: [u64; 4],
}

impl Clock {
    /// A clock started now, where timing is on.
    #[inline]
    pub fn start() -> Option<Self> {
        TIMING.load(Ordering::Relaxed).then(|| Self {
            last: Instant::now(),
            stages: [0; 4],
        })
    }

    /// Ends `stage` (and starts the next) now.
    pub fn mark(&mut self, stage: Stage) {
        let now = Instant::now();
        self.stages[stage as usize] += u64::try_from((now - self.last).as_nanos()).unwrap_or(0);
        self.last = now;
    }
}

/// Ends `stage` on a clock, if the call is timed.
#[inline]
pub fn mark(clock: &mut Option<Clock>, stage: Stage) {
    if let Some(clock) = clock {
        clock.mark(stage);
    }
}

/// Switches the timing of cache hits on or off; returns whether it was on.
#[pyfunction]
pub fn set_timing(on: bool) -> bool {
    TIMING.swap(on, Ordering::Relaxed)
}

thread_local! {
    /// How deep this thread is in `fastpjit.no_recompiles` blocks.
    static RECOMPILE_GUARD: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
    /// How many calls that fastpjit handed to JAX inside such a block this thread is in.
    static GUARDED_JAX_CALLS: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

/// Runs `call`, a call that fastpjit hands to JAX; inside `no_recompiles`, a compile in it
/// raises (`fastpjit._jax.xla_compile` asks `in_guarded_jax_call`).
pub fn guarding_jax_call<R>(call: impl FnOnce() -> R) -> R {
    /// Leaves the call when dropped, however it ends.
    struct Leave;
    impl Drop for Leave {
        fn drop(&mut self) {
            GUARDED_JAX_CALLS.with(|n| n.set(n.get().saturating_sub(1)));
        }
    }
    if !recompiles_guarded() {
        return call();
    }
    GUARDED_JAX_CALLS.with(|n| n.set(n.get() + 1));
    let _leave = Leave;
    call()
}

/// Whether this thread is in a call that fastpjit handed to JAX inside `no_recompiles`, where
/// JAX's compile must raise.
#[pyfunction]
pub fn in_guarded_jax_call() -> bool {
    recompiles_guarded() && GUARDED_JAX_CALLS.with(std::cell::Cell::get) > 0
}

/// Whether this thread is inside `fastpjit.no_recompiles`: its calls then stay on fastpjit's
/// own path, whose misses raise, rather than going to JAX's dispatch, which would compile.
pub fn recompiles_guarded() -> bool {
    RECOMPILE_GUARD.with(std::cell::Cell::get) > 0
}

/// Enters (`delta` 1) or leaves (-1) a `no_recompiles` block on this thread, or reads (0);
/// returns the depth.
#[pyfunction]
pub fn recompile_guard(delta: i32) -> u32 {
    RECOMPILE_GUARD.with(|depth| {
        depth.set(depth.get().saturating_add_signed(delta));
        depth.get()
    })
}

/// Calls that `fastpjit.no_recompiles` stopped, in all functions.
static RECOMPILES_STOPPED: AtomicU64 = AtomicU64::new(0);

/// The counters of a function, shared with earlier functions of the same name and place.
pub fn function_stats(name: &str, place: &str) -> Arc<FunctionStats> {
    FUNCTIONS.of(FunctionId {
        name: name.to_owned(),
        place: place.to_owned(),
    })
}

/// Records a timed call's stage times, if it was timed.
pub fn record(stats: &FunctionStats, clock: Option<Clock>) {
    if let Some(clock) = clock {
        stats.record(clock.stages);
    }
}

/// Counts a fallback that no function's call made (`device_put`, `device_get`).
pub fn count_fallback(fallback: Fallback) {
    OTHERS.count_fallback(fallback);
}

/// How many fallbacks of `fallback` no function's call made, so far.
#[cfg(test)]
pub fn others_fallbacks(fallback: Fallback) -> u64 {
    OTHERS
        .counts()
        .fallbacks
        .get(&fallback)
        .copied()
        .unwrap_or(0)
}

/// `{code: n}` of counted fallbacks.
fn fallback_counts<'py>(
    py: Python<'py>,
    counts: &std::collections::BTreeMap<Fallback, u64>,
) -> PyResult<Bound<'py, PyDict>> {
    let out = PyDict::new(py);
    for (fallback, n) in counts {
        out.set_item(fallback.code(), n)?;
    }
    Ok(out)
}

/// A snapshot of every counter: `{"cache_hits", "cache_misses", "compiles", "fallbacks":
/// {reason: n}, "recompiles_stopped", "functions": {row: {"calls", "cache_hits",
/// "cache_misses", "jax_calls", "traced", "compiles", "fallbacks", "timing"?}}, "host_pool":
/// {...}}`.
#[pyfunction]
pub fn stats(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    let mut totals = OTHERS.counts();
    let per_function = PyDict::new(py);
    for (name, stats, counts) in FUNCTIONS.rows() {
        totals.add(&counts);
        let entry = PyDict::new(py);
        entry.set_item("calls", counts.calls())?;
        entry.set_item("cache_hits", counts.hits)?;
        entry.set_item("cache_misses", counts.misses)?;
        entry.set_item("jax_calls", counts.jax_calls)?;
        entry.set_item("traced", counts.traced)?;
        entry.set_item("compiles", counts.compiles)?;
        entry.set_item("fallbacks", fallback_counts(py, &counts.fallbacks)?)?;
        if let Some(timing) = latency_report(py, &stats.latencies())? {
            entry.set_item("timing", timing)?;
        }
        per_function.set_item(name, entry)?;
    }
    let out = PyDict::new(py);
    out.set_item("cache_hits", totals.hits)?;
    out.set_item("cache_misses", totals.misses)?;
    out.set_item("compiles", totals.compiles)?;
    out.set_item("fallbacks", fallback_counts(py, &totals.fallbacks)?)?;
    out.set_item(
        "recompiles_stopped",
        RECOMPILES_STOPPED.load(Ordering::Relaxed),
    )?;
    out.set_item("functions", per_function)?;
    out.set_item("host_pool", crate::host_memory::host_pool_stats(py)?)?;
    Ok(out)
}

/// `{"calls": n, "total": {"p50_us", "p99_us"}, "lookup": {...}, "inputs": {...}, "execute":
/// {...}, "outputs": {...}}` of a function's timed hits; None where none was timed.
fn latency_report<'py>(
    py: Python<'py>,
    latencies: &Latencies,
) -> PyResult<Option<Bound<'py, PyDict>>> {
    let Some((stages, total)) = latencies.percentiles() else {
        return Ok(None);
    };
    let as_us = |p: Percentiles| -> PyResult<Bound<'py, PyDict>> {
        let out = PyDict::new(py);
        let us = |nanos: u64| Duration::from_nanos(nanos).as_secs_f64() * 1e6;
        out.set_item("p50_us", us(p.p50))?;
        out.set_item("p99_us", us(p.p99))?;
        Ok(out)
    };
    let out = PyDict::new(py);
    out.set_item("calls", latencies.calls())?;
    out.set_item("total", as_us(total)?)?;
    for (stage, p) in Stage::ALL.into_iter().zip(stages) {
        out.set_item(stage.name(), as_us(p)?)?;
    }
    Ok(Some(out))
}

/// Sets every counter back to zero, and forgets the names of functions that no longer live.
#[pyfunction]
pub fn reset_stats() {
    OTHERS.reset();
    RECOMPILES_STOPPED.store(0, Ordering::Relaxed);
    FUNCTIONS.reset();
    crate::host_memory::reset_host_pool_counters();
}

/// Counts a call that `fastpjit.no_recompiles` stopped.
#[pyfunction]
pub fn count_recompile_stopped() {
    RECOMPILES_STOPPED.fetch_add(1, Ordering::Relaxed);
}

/// Counts backend compiles that no cache miss reported (`compile_hlo`'s).
#[pyfunction]
pub fn count_compiles(n: u64) {
    OTHERS.count(Counter::Compile(n));
}

/// Counts a fallback of Python code paths (`device_put`'s, ...) by its code.
#[pyfunction]
#[pyo3(name = "count_fallback")]
pub fn py_count_fallback(code: &str) -> PyResult<()> {
    count_fallback(fallback_of(code)?);
    Ok(())
}

/// The fallback of `code`; a `ValueError` naming it where it is none.
pub fn fallback_of(code: &str) -> PyResult<Fallback> {
    Fallback::from_code(code)
        .ok_or_else(|| refusal(DispatchError::UnknownFallback(code.to_owned())))
}

/// Every fallback's code and text: `{code: text}`, in the order of `docs/fallbacks.md`.
#[pyfunction]
pub fn fallback_reasons(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    let out = PyDict::new(py);
    for fallback in Fallback::all() {
        out.set_item(fallback.code(), fallback.to_string())?;
    }
    Ok(out)
}
