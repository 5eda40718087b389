//! A shared memo for hot lookups (dataclass types, placement plans): the core's one bounded
//! map (`BoundedMap`: when full, it forgets everything) behind a lock.

use std::hash::Hash;
use std::sync::{Mutex, MutexGuard, PoisonError};

use fastpjit_core::BoundedMap;

pub struct SharedMemo<K, V> {
    entries: Mutex<BoundedMap<K, V>>,
}

impl<K: Eq + Hash, V: Clone> SharedMemo<K, V> {
    pub const fn new(capacity: usize) -> Self {
        Self {
            entries: Mutex::new(BoundedMap::new(capacity)),
        }
    }

    pub fn get(&self, key: &K) -> Option<V> {
        self.lock().get(key).cloned()
    }

    pub fn insert(&self, key: K, value: V) {
        let forgotten = self.lock().insert(key, value);
        // Released after the lock: freeing a value's Python objects can run Python, during
        // which another thread may take the GIL and wait for this lock.
        drop(forgotten);
    }

    pub fn len(&self) -> usize {
        self.lock().len()
    }

    fn lock(&self) -> MutexGuard<'_, BoundedMap<K, V>> {
        self.entries.lock().unwrap_or_else(PoisonError::into_inner)
    }
}
