//! The cache of a jitted function: cache entries by call signature hash, the recent entries
//! that a call is compared with before its signature is hashed, and the single-compile
//! protocol (as `pjit.cc`'s `PjitCacheEntry`): the thread that misses on a signature inserts
//! its entry at once, and other threads that call with that signature meanwhile wait for its
//! outcome instead of compiling again.
//!
//! Comparing a call with a signature may run Python (`__eq__`), so it never happens under a
//! lock here, and neither does dropping an entry (which frees Python objects).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, PoisonError};
use std::thread::{self, ThreadId};

use crate::bounded::{BoundedMap, LeastRecent, Recency, UseStamp};

/// How many entries a call is compared with before its signature is hashed: those of the
/// latest calls, so that alternating signatures are found without hashing either.
pub const RECENT: usize = 4;

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A cache entry: a signature `S`, and what calls of it do (`E`), once the thread that missed
/// on it has found out.
pub struct CacheEntry<S, E> {
    pub signature: S,
    used: UseStamp,
    outcome: OnceLock<E>,
    compiling: Mutex<Option<ThreadId>>,
    done: Condvar,
    /// Whether the cache forgot the entry (set under the recent entries' lock, so that none
    /// comes back among them: see `forget_where`).
    forgotten: AtomicBool,
}

impl<S, E> Recency for CacheEntry<S, E> {
    fn last_used(&self) -> u64 {
        self.used.get()
    }
}

/// Where a cache entry's miss stands, for a thread that found the entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MissState {
    Done,
    /// This thread is running the miss (the call was made from inside it).
    OwnMiss,
    /// Another thread is: wait for it (`wait_for_miss`).
    Elsewhere,
}

impl<S, E> CacheEntry<S, E> {
    /// An entry whose miss this thread runs.
    fn compiling(signature: S) -> Self {
        Self {
            signature,
            used: UseStamp::now(),
            outcome: OnceLock::new(),
            compiling: Mutex::new(Some(thread::current().id())),
            done: Condvar::new(),
            forgotten: AtomicBool::new(false),
        }
    }

    /// What calls of this signature do; None while its miss runs, or after it failed.
    #[inline]
    pub fn outcome(&self) -> Option<&E> {
        self.outcome.get()
    }

    /// Marks the entry used without making it recent (a call that took another path to it).
    #[inline]
    pub fn mark_used(&self) {
        self.used.mark();
    }

    /// Sets the outcome, once; only the thread running the miss sets it.
    pub fn set_outcome(&self, outcome: E) {
        let _ = self.outcome.set(outcome);
    }

    pub fn miss_state(&self) -> MissState {
        match *lock(&self.compiling) {
            None => MissState::Done,
            Some(thread) if thread == thread::current().id() => MissState::OwnMiss,
            Some(_) => MissState::Elsewhere,
        }
    }

    /// Blocks until the miss running on another thread is done (call it without the GIL).
    pub fn wait_for_miss(&self) {
        let mut compiling = lock(&self.compiling);
        while compiling.is_some() {
            compiling = self
                .done
                .wait(compiling)
                .unwrap_or_else(PoisonError::into_inner);
        }
    }

    fn finish(&self) {
        *lock(&self.compiling) = None;
        self.done.notify_all();
    }
}

pub type Entry<S, E> = Arc<CacheEntry<S, E>>;

/// A function's cache entries, bounded, least recently used evicted.
pub struct EntryCache<S, E> {
    entries: Mutex<BoundedMap<u64, Entry<S, E>, LeastRecent>>,
    /// The entries of the latest hits and misses, most recent first: calls tend to repeat.
    recent: Mutex<Vec<Entry<S, E>>>,
}

/// A miss in progress: its entry, already in the cache under its signature's hash.
pub struct Miss<S, E> {
    pub entry: Entry<S, E>,
    hash: u64,
}

impl<S, E> EntryCache<S, E> {
    /// An empty cache of at most `capacity` entries.
    pub fn new(capacity: usize) -> Self {
        Self {
            entries: Mutex::new(BoundedMap::new(capacity)),
            recent: Mutex::new(Vec::with_capacity(RECENT)),
        }
    }

    /// The entry of the latest call.
    #[inline]
    pub fn latest(&self) -> Option<Entry<S, E>> {
        lock(&self.recent).first().cloned()
    }

    /// The recent entry, after `latest` (the caller's, taken before), whose signature the
    /// call has, if any: `matches` compares the call with a signature.
    pub fn probe_recent<Err>(
        &self,
        latest: Option<&Entry<S, E>>,
        mut matches: impl FnMut(&S) -> Result<bool, Err>,
    ) -> Result<Option<Entry<S, E>>, Err> {
        if let Some(latest) = latest {
            if matches(&latest.signature)? {
                return Ok(Some(latest.clone()));
            }
        }
        // Held out of the lock, which comparing signatures must not hold.
        let mut others: [Option<Entry<S, E>>; RECENT - 1] = Default::default();
        for (slot, entry) in others.iter_mut().zip(lock(&self.recent).iter().skip(1)) {
            *slot = Some(entry.clone());
        }
        for entry in others.iter().flatten() {
            if matches(&entry.signature)? {
                return Ok(Some(entry.clone()));
            }
        }
        Ok(None)
    }

    /// The cache entry under `hash` whose signature the call has, if any.
    pub fn lookup<Err>(
        &self,
        hash: u64,
        mut matches: impl FnMut(&S) -> Result<bool, Err>,
    ) -> Result<Option<Entry<S, E>>, Err> {
        let mut candidates = lock(&self.entries).bucket(&hash).to_vec();
        if candidates.len() > 1 {
            candidates.sort_by_key(|entry| std::cmp::Reverse(entry.last_used()));
        }
        for entry in candidates {
            if matches(&entry.signature)? {
                return Ok(Some(entry));
            }
        }
        Ok(None)
    }

    /// Notes a hit on `entry`; `latest` is the call's latest entry, which is the most recently
    /// used already, so a hit on it writes nothing.
    #[inline]
    pub fn hit(&self, entry: &Entry<S, E>, latest: Option<&Entry<S, E>>) {
        if !latest.is_some_and(|l| Arc::ptr_eq(l, entry)) {
            entry.used.mark();
            self.note_recent(entry);
        }
    }

    /// Starts the miss of a call of `signature`, whose hash is `hash`: its entry goes into
    /// the cache now, so that other threads' calls of the signature wait for its outcome.
    pub fn begin_miss(&self, hash: u64, signature: S) -> Miss<S, E> {
        let entry = Arc::new(CacheEntry::compiling(signature));
        let evicted = lock(&self.entries).push(hash, entry.clone());
        if !evicted.is_empty() {
            let mut recent = lock(&self.recent);
            recent.retain(|r| !evicted.values().any(|e| Arc::ptr_eq(r, e)));
        }
        drop(evicted);
        Miss { entry, hash }
    }

    /// Ends `miss`: a failed one leaves the cache (the next call misses again), a finished
    /// one becomes the latest entry; threads waiting for it go on.
    pub fn end_miss(&self, miss: &Miss<S, E>, succeeded: bool) {
        if succeeded {
            self.note_recent(&miss.entry);
        } else {
            let is_it = |entry: &Entry<S, E>| Arc::ptr_eq(entry, &miss.entry);
            let removed = lock(&self.entries).remove_where(&miss.hash, is_it);
            drop(removed);
        }
        miss.entry.finish();
    }

    /// Puts `entry` first among the recent entries, unless the cache forgot it.
    fn note_recent(&self, entry: &Entry<S, E>) {
        let mut recent = lock(&self.recent);
        if entry.forgotten.load(Ordering::Relaxed) {
            return;
        }
        if recent
            .first()
            .is_some_and(|first| Arc::ptr_eq(first, entry))
        {
            return;
        }
        if let Some(i) = recent.iter().position(|r| Arc::ptr_eq(r, entry)) {
            recent[..=i].rotate_right(1);
            return;
        }
        recent.insert(0, entry.clone());
        let keep = recent.len().min(RECENT);
        let dropped = recent.split_off(keep);
        drop(recent);
        drop(dropped);
    }

    pub fn len(&self) -> usize {
        lock(&self.entries).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Removes every entry, returning them for the caller to drop where it may.
    pub fn drain(&self) -> Vec<Entry<S, E>> {
        let mut entries = lock(&self.entries).clear().into_values();
        entries.append(&mut lock(&self.recent));
        entries
    }

    /// Removes the entries whose signatures `is_it` picks, returning them (each once) for the
    /// caller to drop where it may. An entry whose miss is running stays out when it ends:
    /// it serves the calls that waited for it, and no later one.
    pub fn forget_where(&self, is_it: impl Fn(&S) -> bool) -> Vec<Entry<S, E>> {
        let forgotten = lock(&self.entries)
            .forget_where(|entry| is_it(&entry.signature))
            .into_values();
        let mut recent = lock(&self.recent);
        for entry in &forgotten {
            entry.forgotten.store(true, Ordering::Relaxed);
        }
        let (gone, kept): (Vec<_>, Vec<_>) = std::mem::take(&mut *recent)
            .into_iter()
            .partition(|entry| is_it(&entry.signature));
        *recent = kept;
        drop(recent);
        // Handles of entries that `forgotten` holds too: none of them is the last.
        drop(gone);
        forgotten
    }

    /// Calls `f` on every entry, unless another thread holds the cache (a garbage
    /// collection's traversal must not block).
    pub fn try_for_each<Err>(
        &self,
        mut f: impl FnMut(&CacheEntry<S, E>) -> Result<(), Err>,
    ) -> Result<(), Err> {
        if let Ok(entries) = self.entries.try_lock() {
            for entry in entries.values() {
                f(entry)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Barrier;

    use proptest::prelude::*;

    use super::*;

    type Cache = EntryCache<u32, &'static str>;

    fn find(cache: &Cache, hash: u64, signature: u32) -> Option<Entry<u32, &'static str>> {
        let found: Result<_, Infallible> = cache.lookup(hash, |s| Ok(*s == signature));
        found.unwrap()
    }

    fn probe(cache: &Cache, signature: u32) -> Option<u32> {
        let latest = cache.latest();
        let found: Result<_, Infallible> =
            cache.probe_recent(latest.as_ref(), |s| Ok(*s == signature));
        found.unwrap().map(|e| e.signature)
    }

    fn compile(cache: &Cache, hash: u64, signature: u32) -> Entry<u32, &'static str> {
        let miss = cache.begin_miss(hash, signature);
        miss.entry.set_outcome("run");
        cache.end_miss(&miss, true);
        miss.entry
    }

    #[test]
    fn forget_where_leaves_the_other_entries_found() {
        let cache = Cache::new(8);
        compile(&cache, 1, 10);
        compile(&cache, 1, 11);
        compile(&cache, 2, 20);
        let forgotten = cache.forget_where(|s| *s == 11 || *s == 20);
        assert_eq!(forgotten.len(), 2);
        assert_eq!(cache.len(), 1);
        assert!(find(&cache, 1, 10).is_some());
        assert!(find(&cache, 1, 11).is_none() && find(&cache, 2, 20).is_none());
        assert_eq!(probe(&cache, 11), None);
        assert_eq!(probe(&cache, 20), None);
        assert_eq!(probe(&cache, 10), Some(10));
    }

    #[test]
    fn an_entry_forgotten_while_its_miss_runs_never_serves_a_later_call() {
        // Compile options registered for a signature while its miss compiles with the old
        // ones: that executable serves the calls that waited for it, and no later one.
        let cache = Cache::new(8);
        compile(&cache, 1, 10);
        let miss = cache.begin_miss(2, 20);
        assert_eq!(cache.forget_where(|s| *s == 20).len(), 1);
        miss.entry.set_outcome("run");
        cache.end_miss(&miss, true);
        assert_eq!(miss.entry.outcome(), Some(&"run"));
        assert!(find(&cache, 2, 20).is_none());
        assert_eq!(probe(&cache, 20), None);
        assert_eq!(cache.latest().map(|e| e.signature), Some(10));
        // A hit on an entry found before it was forgotten does not bring it back either.
        let entry = find(&cache, 1, 10).unwrap();
        cache.forget_where(|s| *s == 10);
        cache.hit(&entry, None);
        assert_eq!(probe(&cache, 10), None);
        assert!(cache.latest().is_none());
    }

    #[test]
    fn a_miss_is_found_by_hash_and_among_the_recent_entries() {
        let cache = Cache::new(8);
        assert!(cache.latest().is_none());
        let a = compile(&cache, 1, 10);
        assert_eq!(a.outcome(), Some(&"run"));
        assert_eq!(a.miss_state(), MissState::Done);
        assert!(find(&cache, 1, 10).is_some());
        assert!(find(&cache, 1, 11).is_none());
        assert!(find(&cache, 2, 10).is_none());
        assert_eq!(probe(&cache, 10), Some(10));
        assert_eq!(cache.len(), 1);
    }

    #[test]
    fn the_recent_entries_are_the_latest_four_most_recent_first() {
        let cache = Cache::new(8);
        let entries: Vec<_> = (0..5).map(|i| compile(&cache, u64::from(i), i)).collect();
        assert_eq!(cache.latest().map(|e| e.signature), Some(4));
        assert_eq!(probe(&cache, 0), None, "fifth most recent");
        assert_eq!(probe(&cache, 1), Some(1));
        let latest = cache.latest();
        cache.hit(&entries[2], latest.as_ref());
        assert_eq!(cache.latest().map(|e| e.signature), Some(2));
        cache.hit(&entries[0], cache.latest().as_ref());
        assert_eq!(probe(&cache, 0), Some(0));
        assert_eq!(probe(&cache, 1), None, "pushed out by 0");
    }

    #[test]
    fn a_failed_miss_leaves_the_cache_and_no_recent_entry() {
        let cache = Cache::new(8);
        let miss = cache.begin_miss(3, 30);
        assert_eq!(miss.entry.miss_state(), MissState::OwnMiss);
        assert!(find(&cache, 3, 30).is_some(), "visible while it runs");
        cache.end_miss(&miss, false);
        assert!(find(&cache, 3, 30).is_none());
        assert!(cache.latest().is_none());
        assert_eq!(miss.entry.miss_state(), MissState::Done);
        assert!(miss.entry.outcome().is_none());
    }

    #[test]
    fn an_evicted_entry_leaves_the_recent_entries() {
        let cache = Cache::new(2);
        compile(&cache, 1, 1);
        compile(&cache, 2, 2);
        compile(&cache, 3, 3);
        assert_eq!(cache.len(), 2);
        assert_eq!(probe(&cache, 1), None);
        assert!(find(&cache, 1, 1).is_none());
        assert_eq!(cache.drain().len(), 2 + 2);
        assert!(cache.is_empty() && cache.latest().is_none());
    }

    /// Threads that miss on one signature at once compile it once: the first inserts the
    /// entry, the others find it and wait for its outcome.
    #[test]
    fn concurrent_misses_of_one_signature_compile_once() {
        const THREADS: usize = 8;
        let cache = Cache::new(8);
        let compiles = AtomicUsize::new(0);
        let first = Mutex::new(());
        let barrier = Barrier::new(THREADS);
        thread::scope(|scope| {
            for _ in 0..THREADS {
                scope.spawn(|| {
                    barrier.wait();
                    // What the dispatcher does under the GIL: look up, else begin a miss.
                    let guard = lock(&first);
                    let found = find(&cache, 9, 90);
                    let outcome = if let Some(entry) = found {
                        drop(guard);
                        match entry.miss_state() {
                            MissState::Elsewhere => entry.wait_for_miss(),
                            MissState::Done => {}
                            MissState::OwnMiss => unreachable!(),
                        }
                        entry.outcome().copied()
                    } else {
                        let miss = cache.begin_miss(9, 90);
                        drop(guard);
                        compiles.fetch_add(1, Ordering::Relaxed);
                        thread::sleep(std::time::Duration::from_millis(20));
                        miss.entry.set_outcome("compiled");
                        cache.end_miss(&miss, true);
                        miss.entry.outcome().copied()
                    };
                    assert_eq!(outcome, Some("compiled"));
                });
            }
        });
        assert_eq!(compiles.load(Ordering::Relaxed), 1);
        assert_eq!(cache.len(), 1);
    }

    proptest! {
        /// Whatever the calls, the cache holds at most its capacity, the recent entries are
        /// at most four distinct cached entries, and the latest call's entry is the first.
        #[test]
        fn bounded_and_recent_entries_are_cached(capacity in 1usize..6, calls in prop::collection::vec(0u32..10, 1..60)) {
            let cache = Cache::new(capacity);
            for &signature in &calls {
                let hash = u64::from(signature % 3);
                let latest = cache.latest();
                let found: Result<_, Infallible> = cache.probe_recent(latest.as_ref(), |s| Ok(*s == signature));
                match found.unwrap().or_else(|| find(&cache, hash, signature)) {
                    Some(entry) => cache.hit(&entry, latest.as_ref()),
                    None => { compile(&cache, hash, signature); }
                }
                prop_assert!(cache.len() <= capacity);
                prop_assert_eq!(cache.latest().map(|e| e.signature), Some(signature));
                let recent = lock(&cache.recent).clone();
                prop_assert!(recent.len() <= RECENT.min(capacity));
                for (i, entry) in recent.iter().enumerate() {
                    prop_assert!(find(&cache, u64::from(entry.signature % 3), entry.signature).is_some());
                    prop_assert!(recent[..i].iter().all(|e| !Arc::ptr_eq(e, entry)));
                }
            }
        }
    }
}
