//! A small bounded map for hot lookups: when full, it forgets everything and starts again,
//! so memory stays bounded and a hit costs one hash of a cheap key.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::Mutex;

pub struct BoundedCache<K, V> {
    capacity: usize,
    entries: Mutex<Option<HashMap<K, V>>>,
}

impl<K: Eq + Hash, V: Clone> BoundedCache<K, V> {
    pub const fn new(capacity: usize) -> Self {
        Self {
            capacity,
            entries: Mutex::new(None),
        }
    }

    pub fn get(&self, key: &K) -> Option<V> {
        self.lock().as_ref().and_then(|map| map.get(key).cloned())
    }

    pub fn insert(&self, key: K, value: V) {
        let released = {
            let mut guard = self.lock();
            let map = guard.get_or_insert_with(HashMap::new);
            let forgotten = (map.len() >= self.capacity).then(|| std::mem::take(map));
            (forgotten, map.insert(key, value))
        };
        // Released after the lock: freeing a value's Python objects can run Python, during
        // which another thread may take the GIL and wait for this lock.
        drop(released);
    }

    pub fn len(&self) -> usize {
        self.lock().as_ref().map_or(0, HashMap::len)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<HashMap<K, V>>> {
        self.entries
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}
