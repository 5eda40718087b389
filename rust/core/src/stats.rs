//! The counters behind `fastpjit.stats()`: for each function, its cache hits, misses,
//! compiles, the calls that JAX ran or staged, and fallbacks with their reasons; and the rows
//! that name them.
//!
//! A function is known by its name (`module.qualname`) and its place in the source (`file:line`,
//! or empty where it has none), so that two functions of one name (two lambdas in a module)
//! keep apart. A row is named by the name alone, and by its line too where names clash.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use crate::fallback::Fallback;
use crate::timing::Latencies;

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Counter {
    CacheHit,
    CacheMiss,
    /// Backend compiles that a cache miss (or `compile_hlo`) caused.
    Compile(u64),
    /// A call that JAX ran whole (`disable_jit`, effects, an argument fastpjit cannot key,
    /// one handed to jax.jit's dispatch), counted besides its fallback.
    JaxCall,
    /// A call made inside another function's trace (its arguments hold tracers), which JAX
    /// stages: counted apart from fallbacks.
    Traced,
}

/// One function's counts at one moment.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    pub hits: u64,
    pub misses: u64,
    pub compiles: u64,
    /// Calls that JAX ran, delegated ones included.
    pub jax_calls: u64,
    pub traced: u64,
    pub fallbacks: BTreeMap<Fallback, u64>,
}

impl Counts {
    /// Every call is one of a hit, a miss, a call that JAX ran, or one inside a trace.
    pub fn calls(&self) -> u64 {
        self.hits + self.misses + self.jax_calls + self.traced
    }

    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }

    /// Adds `other`'s counts to these.
    pub fn add(&mut self, other: &Self) {
        self.hits += other.hits;
        self.misses += other.misses;
        self.compiles += other.compiles;
        self.jax_calls += other.jax_calls;
        self.traced += other.traced;
        for (reason, n) in &other.fallbacks {
            *self.fallbacks.entry(*reason).or_default() += n;
        }
    }
}

/// The counters of one function (all the wrappers of one Python function and options), each
/// counted without a lock.
pub struct FunctionStats {
    hits: AtomicU64,
    misses: AtomicU64,
    compiles: AtomicU64,
    jax_calls: AtomicU64,
    traced: AtomicU64,
    /// One counter per fallback, at its index.
    fallbacks: [AtomicU64; Fallback::COUNT],
    /// The stage times of the latest timed hits.
    latencies: Mutex<Latencies>,
}

impl Default for FunctionStats {
    fn default() -> Self {
        Self::new()
    }
}

impl FunctionStats {
    pub const fn new() -> Self {
        Self {
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            compiles: AtomicU64::new(0),
            jax_calls: AtomicU64::new(0),
            traced: AtomicU64::new(0),
            fallbacks: [const { AtomicU64::new(0) }; Fallback::COUNT],
            latencies: Mutex::new(Latencies::new()),
        }
    }

    fn counters(&self) -> [&AtomicU64; 5] {
        [
            &self.hits,
            &self.misses,
            &self.compiles,
            &self.jax_calls,
            &self.traced,
        ]
    }

    pub fn count(&self, counter: Counter) {
        let (cell, n) = match counter {
            Counter::CacheHit => (&self.hits, 1),
            Counter::CacheMiss => (&self.misses, 1),
            Counter::Compile(n) => (&self.compiles, n),
            Counter::JaxCall => (&self.jax_calls, 1),
            Counter::Traced => (&self.traced, 1),
        };
        cell.fetch_add(n, Ordering::Relaxed);
    }

    /// Records that a call took a slower correct path, and why.
    pub fn count_fallback(&self, fallback: Fallback) {
        self.fallbacks[fallback.index()].fetch_add(1, Ordering::Relaxed);
    }

    /// Records a timed hit's stage times (nanoseconds).
    pub fn record(&self, stages: [u64; 4]) {
        lock(&self.latencies).record(stages);
    }

    /// The stage times of the latest timed hits.
    pub fn latencies(&self) -> MutexGuard<'_, Latencies> {
        lock(&self.latencies)
    }

    /// The counts now.
    pub fn counts(&self) -> Counts {
        let [hits, misses, compiles, jax_calls, traced] =
            self.counters().map(|cell| cell.load(Ordering::Relaxed));
        let fallbacks = Fallback::all()
            .zip(&self.fallbacks)
            .map(|(fallback, cell)| (fallback, cell.load(Ordering::Relaxed)))
            .filter(|&(_, n)| n > 0)
            .collect();
        Counts {
            hits,
            misses,
            compiles,
            jax_calls,
            traced,
            fallbacks,
        }
    }

    pub fn reset(&self) {
        for cell in self.counters().into_iter().chain(&self.fallbacks) {
            cell.store(0, Ordering::Relaxed);
        }
        lock(&self.latencies).clear();
    }
}

/// A function as `fastpjit.stats()` tells it apart: its `module.qualname` and its place in the
/// source (`file:line`, or empty).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct FunctionId {
    pub name: String,
    pub place: String,
}

impl FunctionId {
    /// The line of its place, if it has one.
    fn line(&self) -> Option<&str> {
        self.place
            .rsplit_once(':')
            .map(|(_, line)| line)
            .filter(|line| !line.is_empty())
    }
}

/// The counters of every function, those of dead functions included, so that a summary at exit
/// names them all; past `capacity` functions, the others share one row.
pub struct Registry {
    functions: Mutex<BTreeMap<FunctionId, Arc<FunctionStats>>>,
    capacity: usize,
}

/// The row of the functions past a registry's capacity.
pub const OTHER_FUNCTIONS: &str = "(other functions)";

impl Registry {
    pub const fn new(capacity: usize) -> Self {
        Self {
            functions: Mutex::new(BTreeMap::new()),
            capacity,
        }
    }

    /// The counters of the function `id`, shared with earlier functions of the same id.
    pub fn of(&self, id: FunctionId) -> Arc<FunctionStats> {
        let mut functions = lock(&self.functions);
        if let Some(stats) = functions.get(&id) {
            return stats.clone();
        }
        let id = if functions.len() < self.capacity {
            id
        } else {
            FunctionId {
                name: OTHER_FUNCTIONS.to_owned(),
                place: String::new(),
            }
        };
        functions.entry(id).or_default().clone()
    }

    /// Each function's counts, under its row's name, leaving out those that counted nothing.
    pub fn rows(&self) -> Vec<(String, Arc<FunctionStats>, Counts)> {
        let counted: Vec<(FunctionId, Arc<FunctionStats>, Counts)> = lock(&self.functions)
            .iter()
            .map(|(id, stats)| (id.clone(), stats.clone(), stats.counts()))
            .filter(|(_, _, counts)| !counts.is_empty())
            .collect();
        let ids: Vec<&FunctionId> = counted.iter().map(|(id, _, _)| id).collect();
        let names = row_names(&ids);
        counted
            .into_iter()
            .zip(names)
            .map(|((_, stats, counts), name)| (name, stats, counts))
            .collect()
    }

    /// Sets every counter back to zero, and forgets the functions that no longer live (whose
    /// counters only the registry holds).
    pub fn reset(&self) {
        let mut functions = lock(&self.functions);
        functions.retain(|_, stats| Arc::strong_count(stats) > 1);
        for stats in functions.values() {
            stats.reset();
        }
    }
}

/// A distinct name for each function: its name where no other function shares it, with its
/// line (`name:line`) where that tells the sharers apart, else with its whole place
/// (`name (file:line)`).
pub fn row_names(ids: &[&FunctionId]) -> Vec<String> {
    let mut names: BTreeMap<&str, usize> = BTreeMap::new();
    let mut lines: BTreeMap<(&str, Option<&str>), usize> = BTreeMap::new();
    for id in ids {
        *names.entry(&id.name).or_default() += 1;
        *lines.entry((&id.name, id.line())).or_default() += 1;
    }
    ids.iter()
        .map(|id| match id.line() {
            _ if names[id.name.as_str()] == 1 => id.name.clone(),
            Some(line) if lines[&(id.name.as_str(), Some(line))] == 1 => {
                format!("{}:{line}", id.name)
            }
            _ if id.place.is_empty() => id.name.clone(),
            _ => format!("{} ({})", id.name, id.place),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(name: &str, place: &str) -> FunctionId {
        FunctionId {
            name: name.to_owned(),
            place: place.to_owned(),
        }
    }

    fn names(ids: &[FunctionId]) -> Vec<String> {
        row_names(&ids.iter().collect::<Vec<_>>())
    }

    #[test]
    fn a_name_of_its_own_is_the_row() {
        let ids = [id("m.f", "m.py:3"), id("m.g", "m.py:3"), id("m.h", "")];
        assert_eq!(names(&ids), ["m.f", "m.g", "m.h"]);
    }

    #[test]
    fn shared_names_gain_their_lines() {
        let ids = [
            id("m.<lambda>", "m.py:3"),
            id("m.<lambda>", "m.py:14"),
            id("n.f", "n.py:1"),
        ];
        assert_eq!(names(&ids), ["m.<lambda>:3", "m.<lambda>:14", "n.f"]);
    }

    #[test]
    fn shared_lines_gain_their_files() {
        let ids = [
            id("__main__.f", "a.py:3"),
            id("__main__.f", "b.py:3"),
            id("__main__.f", "b.py:9"),
        ];
        assert_eq!(
            names(&ids),
            ["__main__.f (a.py:3)", "__main__.f (b.py:3)", "__main__.f:9"]
        );
    }

    #[test]
    fn rows_are_distinct_whatever_the_ids() {
        // Places that name no line, and files holding colons.
        let ids = [
            id("m.f", ""),
            id("m.f", "C:\\m.py:3"),
            id("m.f", "D:\\m.py:3"),
            id("m.f", "x:"),
        ];
        let rows = names(&ids);
        let distinct: std::collections::BTreeSet<&String> = rows.iter().collect();
        assert_eq!(distinct.len(), ids.len(), "{rows:?}");
    }

    #[test]
    fn one_id_shares_one_counter_and_the_rest_share_the_last_row() {
        let registry = Registry::new(2);
        let f = registry.of(id("m.f", "m.py:1"));
        assert!(Arc::ptr_eq(&f, &registry.of(id("m.f", "m.py:1"))));
        let g = registry.of(id("m.f", "m.py:2"));
        assert!(!Arc::ptr_eq(&f, &g));
        let h = registry.of(id("m.h", "m.py:3"));
        assert!(Arc::ptr_eq(&h, &registry.of(id("m.i", "m.py:4"))));
        for (stats, n) in [(&f, 1), (&g, 2), (&h, 3)] {
            for _ in 0..n {
                stats.count(Counter::CacheHit);
            }
        }
        let rows: Vec<(String, u64)> = registry
            .rows()
            .into_iter()
            .map(|(name, _, counts)| (name, counts.hits))
            .collect();
        let expected = [("(other functions)", 3), ("m.f:1", 1), ("m.f:2", 2)];
        assert_eq!(rows, expected.map(|(name, n)| (name.to_owned(), n)));
    }

    #[test]
    fn calls_add_up_and_each_fallback_counts_apart() {
        let stats = FunctionStats::new();
        for counter in [
            Counter::CacheHit,
            Counter::CacheMiss,
            Counter::Compile(3),
            Counter::JaxCall,
            Counter::Traced,
        ] {
            stats.count(counter);
        }
        stats.count_fallback(Fallback::DELEGATED);
        stats.count_fallback(Fallback::DELEGATED);
        stats.count_fallback(Fallback::HANDED_OVER);
        let counts = stats.counts();
        assert_eq!(counts.calls(), 4);
        assert_eq!(counts.compiles, 3);
        let expected = [(Fallback::DELEGATED, 2), (Fallback::HANDED_OVER, 1)];
        assert_eq!(counts.fallbacks, BTreeMap::from(expected));
        let mut total = Counts::default();
        total.add(&counts);
        total.add(&counts);
        assert_eq!(total.calls(), 8);
        assert_eq!(total.fallbacks[&Fallback::DELEGATED], 4);
        stats.reset();
        assert!(stats.counts().is_empty());
    }

    #[test]
    fn reset_forgets_the_functions_that_no_longer_live() {
        let registry = Registry::new(8);
        let live = registry.of(id("m.live", ""));
        registry.of(id("m.dead", "")).count(Counter::CacheHit);
        live.count(Counter::CacheHit);
        assert_eq!(registry.rows().len(), 2);
        registry.reset();
        live.count(Counter::CacheMiss);
        let rows = registry.rows();
        assert_eq!(rows.len(), 1);
        assert_eq!(rows[0].0, "m.live");
        assert_eq!(lock(&registry.functions).len(), 1);
    }
}
