//! Process-wide counters behind `fastpjit.stats()`: cache hits, misses, compiles and fallbacks
//! with their reasons, in all and per function.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use fastpjit_core::timing::{Latencies, Percentiles, Stage};

use pyo3::prelude::*;
use pyo3::types::PyDict;

/// Counts that belong to no function: compiles and fallbacks that Python code paths report
/// (`compile_hlo`'s compiles, `device_put`'s fallbacks).
static OTHERS: FunctionStats = FunctionStats::new();
/// The counts of every function by name, those of dead functions included, so that a summary
/// at exit names them all.
static FUNCTIONS: Mutex<BTreeMap<String, Arc<FunctionStats>>> = Mutex::new(BTreeMap::new());
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
/// How many names `FUNCTIONS` holds; the functions of further names share one entry.
const NAMED_FUNCTIONS: usize = 4096;
const OTHER_FUNCTIONS: &str = "(other functions)";

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

#[derive(Clone, Copy)]
pub enum Counter {
    CacheHit,
    CacheMiss,
    /// Backend compiles that a cache miss (or `compile_hlo`) caused.
    Compile(u64),
    /// A call that JAX ran whole (a tracer, `disable_jit`, effects), counted besides its
    /// fallback's reason.
    JaxCall,
    /// A call made inside another function's trace (its arguments hold tracers), which JAX
    /// stages: counted apart from fallbacks.
    Traced,
    /// A call handed to jax.jit's C++ dispatch, which places its new numpy arrays (or copies
    /// its new arrays from other devices) faster: a fallback of reason `DELEGATED`, counted
    /// without a lock.
    Delegated,
}

/// The fallback reason of `Counter::Delegated`.
pub const DELEGATED: &str = "jit: new numpy arrays or arrays on other devices, which JAX's C++ \
                             dispatch places for less than jaxlib's Python API allows: JAX runs \
                             the call";

/// The counters of one function (all the wrappers of one Python function and options).
pub struct FunctionStats {
    hits: AtomicU64,
    misses: AtomicU64,
    compiles: AtomicU64,
    jax_calls: AtomicU64,
    traced: AtomicU64,
    delegated: AtomicU64,
    fallbacks: Mutex<BTreeMap<String, u64>>,
    /// The stage times of the latest timed hits.
    latencies: Mutex<Latencies>,
}

impl FunctionStats {
    const fn new() -> Self {
        Self {
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            compiles: AtomicU64::new(0),
            jax_calls: AtomicU64::new(0),
            traced: AtomicU64::new(0),
            delegated: AtomicU64::new(0),
            fallbacks: Mutex::new(BTreeMap::new()),
            latencies: Mutex::new(Latencies::new()),
        }
    }

    /// Records a timed call's stage times, if it was timed.
    pub fn record(&self, clock: Option<Clock>) {
        if let Some(clock) = clock {
            lock(&self.latencies).record(clock.stages);
        }
    }

    /// The counters of the function named `name`, shared with earlier functions of the name.
    pub fn named(name: &str) -> Arc<Self> {
        let mut functions = lock(&FUNCTIONS);
        if let Some(stats) = functions.get(name) {
            return stats.clone();
        }
        let name = if functions.len() < NAMED_FUNCTIONS {
            name
        } else {
            OTHER_FUNCTIONS
        };
        functions
            .entry(name.to_owned())
            .or_insert_with(|| Arc::new(Self::new()))
            .clone()
    }

    pub fn count(&self, counter: Counter) {
        let (cell, n) = match counter {
            Counter::CacheHit => (&self.hits, 1),
            Counter::CacheMiss => (&self.misses, 1),
            Counter::Compile(n) => (&self.compiles, n),
            Counter::JaxCall => (&self.jax_calls, 1),
            Counter::Traced => (&self.traced, 1),
            Counter::Delegated => (&self.delegated, 1),
        };
        cell.fetch_add(n, Ordering::Relaxed);
    }

    /// Records that a call took a slower correct path, and why.
    pub fn count_fallback(&self, reason: &str) {
        let mut fallbacks = lock(&self.fallbacks);
        if let Some(n) = fallbacks.get_mut(reason) {
            *n += 1;
        } else {
            fallbacks.insert(reason.to_owned(), 1);
        }
    }

    /// Hits, misses, compiles, calls that JAX ran (delegated ones included), and calls made
    /// inside another function's trace.
    fn load(&self) -> [u64; 5] {
        let delegated = self.delegated.load(Ordering::Relaxed);
        let [hits, misses, compiles, jax_calls, traced] = [
            &self.hits,
            &self.misses,
            &self.compiles,
            &self.jax_calls,
            &self.traced,
        ]
        .map(|cell| cell.load(Ordering::Relaxed));
        [hits, misses, compiles, jax_calls + delegated, traced]
    }

    /// The fallbacks by reason.
    fn fallbacks(&self) -> BTreeMap<String, u64> {
        let mut fallbacks = lock(&self.fallbacks).clone();
        let delegated = self.delegated.load(Ordering::Relaxed);
        if delegated > 0 {
            *fallbacks.entry(DELEGATED.to_owned()).or_default() += delegated;
        }
        fallbacks
    }

    fn reset(&self) {
        for cell in [
            &self.hits,
            &self.misses,
            &self.compiles,
            &self.jax_calls,
            &self.traced,
            &self.delegated,
        ] {
            cell.store(0, Ordering::Relaxed);
        }
        lock(&self.fallbacks).clear();
        lock(&self.latencies).clear();
    }

    fn is_empty(&self) -> bool {
        self.load() == [0; 5] && lock(&self.fallbacks).is_empty()
    }
}

/// Counts a fallback that no function's call made (`device_put`, `device_get`).
pub fn count_fallback(reason: &str) {
    OTHERS.count_fallback(reason);
}

/// A snapshot of every counter: `{"cache_hits", "cache_misses", "compiles", "fallbacks":
/// {reason: n}, "functions": {name: {"calls", "cache_hits", "cache_misses", "compiles",
/// "fallbacks"}}, "host_pool": {...}}`.
#[pyfunction]
pub fn stats(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    let functions: Vec<(String, Arc<FunctionStats>)> = lock(&FUNCTIONS)
        .iter()
        .map(|(name, stats)| (name.clone(), stats.clone()))
        .collect();
    let mut totals = OTHERS.load();
    let mut fallbacks = OTHERS.fallbacks();
    let per_function = PyDict::new(py);
    for (name, stats) in &functions {
        if stats.is_empty() {
            continue;
        }
        let [hits, misses, compiles, jax_calls, traced] = stats.load();
        for (total, n) in totals
            .iter_mut()
            .zip([hits, misses, compiles, jax_calls, traced])
        {
            *total += n;
        }
        let own = stats.fallbacks();
        for (reason, n) in &own {
            *fallbacks.entry(reason.clone()).or_default() += n;
        }
        let entry = PyDict::new(py);
        // Each call is one of a hit, a miss, a call that JAX ran, or one inside a trace.
        entry.set_item("calls", hits + misses + jax_calls + traced)?;
        entry.set_item("cache_hits", hits)?;
        entry.set_item("cache_misses", misses)?;
        entry.set_item("jax_calls", jax_calls)?;
        entry.set_item("traced", traced)?;
        entry.set_item("compiles", compiles)?;
        entry.set_item("fallbacks", own.into_pyobject(py)?)?;
        if let Some(timing) = latency_report(py, &lock(&stats.latencies))? {
            entry.set_item("timing", timing)?;
        }
        per_function.set_item(name, entry)?;
    }
    let out = PyDict::new(py);
    out.set_item("cache_hits", totals[0])?;
    out.set_item("cache_misses", totals[1])?;
    out.set_item("compiles", totals[2])?;
    out.set_item("fallbacks", fallbacks.into_pyobject(py)?)?;
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
    let mut functions = lock(&FUNCTIONS);
    functions.retain(|_, stats| Arc::strong_count(stats) > 1);
    for stats in functions.values() {
        stats.reset();
    }
    drop(functions);
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

/// Counts a fallback from Python code paths (`fastpjit.stats()["fallbacks"][reason]`).
#[pyfunction]
#[pyo3(name = "count_fallback")]
pub fn py_count_fallback(reason: &str) {
    count_fallback(reason);
}
