//! The one bounded map of fastpjit's memos (avals, shardings, dataclass types, placement
//! plans): when full, it forgets everything and starts again, so memory stays bounded, a hit
//! costs one hash of a cheap key, and no use ever writes bookkeeping.
//!
//! What it forgets is handed back to the caller, which drops it where it may: freeing a
//! Python object can run Python, which must not happen under the caller's lock.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hash};

use rustc_hash::FxHasher;

type Map<K, V> = HashMap<K, V, BuildHasherDefault<FxHasher>>;

#[derive(Debug)]
pub struct BoundedMap<K, V> {
    capacity: usize,
    /// None until the first insert, so that `new` is `const` (for statics).
    map: Option<Map<K, V>>,
}

/// What an insert or a clear forgot: every value of a full map, and a value replaced.
#[must_use = "drop what was forgotten outside the lock that guards the map"]
#[derive(Debug)]
pub struct Forgotten<K, V> {
    pub all: Option<Map<K, V>>,
    pub replaced: Option<V>,
}

impl<K, V> Forgotten<K, V> {
    /// How many values were forgotten.
    pub fn len(&self) -> usize {
        self.all.as_ref().map_or(0, HashMap::len) + usize::from(self.replaced.is_some())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl<K: Eq + Hash, V> BoundedMap<K, V> {
    /// An empty map of at most `capacity` values (at least one).
    pub const fn new(capacity: usize) -> Self {
        Self {
            capacity: if capacity == 0 { 1 } else { capacity },
            map: None,
        }
    }

    #[inline]
    pub fn get(&self, key: &K) -> Option<&V> {
        self.map.as_ref()?.get(key)
    }

    /// Maps `key` to `value`; a full map forgets every other value first.
    pub fn insert(&mut self, key: K, value: V) -> Forgotten<K, V> {
        let capacity = self.capacity;
        let map = self.map.get_or_insert_with(|| {
            Map::with_capacity_and_hasher(16, BuildHasherDefault::default())
        });
        let all = (map.len() >= capacity && !map.contains_key(&key)).then(|| std::mem::take(map));
        let replaced = map.insert(key, value);
        Forgotten { all, replaced }
    }

    /// Forgets every value.
    pub fn clear(&mut self) -> Forgotten<K, V> {
        Forgotten {
            all: self.map.take(),
            replaced: None,
        }
    }

    pub fn len(&self) -> usize {
        self.map.as_ref().map_or(0, HashMap::len)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    pub fn values(&self) -> impl Iterator<Item = &V> {
        self.map.iter().flat_map(HashMap::values)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn a_full_map_forgets_everything_and_keeps_the_new_value() {
        let mut map = BoundedMap::new(2);
        assert!(map.insert(1, "a").is_empty());
        assert!(map.insert(2, "b").is_empty());
        let forgotten = map.insert(3, "c");
        assert_eq!(forgotten.len(), 2);
        assert_eq!(map.len(), 1);
        assert_eq!(map.get(&3), Some(&"c"));
        assert_eq!(map.get(&1), None);
    }

    #[test]
    fn replacing_a_key_of_a_full_map_forgets_only_its_value() {
        let mut map = BoundedMap::new(2);
        let _ = map.insert(1, "a");
        let _ = map.insert(2, "b");
        let forgotten = map.insert(2, "B");
        assert!(forgotten.all.is_none());
        assert_eq!(forgotten.replaced, Some("b"));
        assert_eq!(map.len(), 2);
        assert_eq!(map.values().count(), 2);
    }

    #[test]
    fn clear_and_capacity_at_least_one() {
        let mut map = BoundedMap::new(0);
        assert_eq!(map.capacity(), 1);
        let _ = map.insert("k", 1);
        assert_eq!(map.clear().len(), 1);
        assert!(map.is_empty());
        assert_eq!(map.get(&"k"), None);
    }

    proptest! {
        /// Never more values than the capacity; the latest insert is always found; every
        /// value inserted is either found or was handed back.
        #[test]
        fn bounded_and_nothing_lost(capacity in 1usize..8, keys in prop::collection::vec(0u8..16, 0..64)) {
            let mut map = BoundedMap::new(capacity);
            let mut handed_back = 0;
            for (i, &key) in keys.iter().enumerate() {
                handed_back += map.insert(key, i).len();
                prop_assert!(map.len() <= capacity);
                prop_assert_eq!(map.get(&key), Some(&i));
            }
            prop_assert_eq!(handed_back + map.len(), keys.len());
        }
    }
}
