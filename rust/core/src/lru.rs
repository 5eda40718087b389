//! A bounded map from hashes to values, for keys whose equality only the caller can decide
//! (the dispatcher's call signatures compare Python objects). Values under one hash form a
//! bucket that the caller searches; when full, the least recently used value is evicted.
//! Values say when they were last used themselves (`Recency`), so that marking one used needs
//! no lock on the map.

use std::collections::HashMap;
use std::hash::BuildHasherDefault;
use std::sync::atomic::{AtomicU64, Ordering};

use rustc_hash::FxHasher;

type Buckets<V> = HashMap<u64, Vec<(u64, V)>, BuildHasherDefault<FxHasher>>;

/// When a value was last used, on a clock that only moves forward.
pub trait Recency {
    fn last_used(&self) -> u64;
}

impl<T: Recency> Recency for std::sync::Arc<T> {
    fn last_used(&self) -> u64 {
        T::last_used(self)
    }
}

/// A value's use stamp, to embed in values: `mark` on each use.
#[derive(Debug, Default)]
pub struct UseStamp(AtomicU64);

static CLOCK: AtomicU64 = AtomicU64::new(0);

impl UseStamp {
    /// A stamp of now.
    pub fn now() -> Self {
        Self(AtomicU64::new(CLOCK.fetch_add(1, Ordering::Relaxed)))
    }

    /// Marks a use now.
    pub fn mark(&self) {
        self.0
            .store(CLOCK.fetch_add(1, Ordering::Relaxed), Ordering::Relaxed);
    }

    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

pub struct LruBuckets<V> {
    buckets: Buckets<V>,
    len: usize,
    capacity: usize,
    next_id: u64,
}

/// A value's place in the map: its hash and an id unique among the values ever inserted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlotRef {
    pub hash: u64,
    pub id: u64,
}

impl<V: Clone + Recency> LruBuckets<V> {
    /// An empty map that holds at most `capacity` values (at least one).
    pub fn new(capacity: usize) -> Self {
        Self {
            buckets: Buckets::default(),
            len: 0,
            capacity: capacity.max(1),
            next_id: 0,
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The values under `hash`, most recently used first.
    pub fn bucket(&self, hash: u64) -> Vec<V> {
        let Some(bucket) = self.buckets.get(&hash) else {
            return Vec::new();
        };
        let mut found: Vec<V> = bucket.iter().map(|(_, value)| value.clone()).collect();
        if found.len() > 1 {
            found.sort_by_key(|value| std::cmp::Reverse(value.last_used()));
        }
        found
    }

    /// Every value, in no particular order.
    pub fn values(&self) -> impl Iterator<Item = &V> {
        self.buckets.values().flatten().map(|(_, value)| value)
    }

    /// Inserts `value` under `hash`, evicting the least recently used value when full; returns
    /// its place and the evicted value, if any.
    pub fn insert(&mut self, hash: u64, value: V) -> (SlotRef, Option<V>) {
        let evicted = if self.len >= self.capacity {
            self.evict_oldest()
        } else {
            None
        };
        self.next_id += 1;
        let at = SlotRef {
            hash,
            id: self.next_id,
        };
        self.buckets.entry(hash).or_default().push((at.id, value));
        self.len += 1;
        (at, evicted)
    }

    /// Removes the value at `at`, if it is still there.
    pub fn remove(&mut self, at: SlotRef) -> Option<V> {
        let bucket = self.buckets.get_mut(&at.hash)?;
        let i = bucket.iter().position(|(id, _)| *id == at.id)?;
        let (_, value) = bucket.swap_remove(i);
        if bucket.is_empty() {
            self.buckets.remove(&at.hash);
        }
        self.len -= 1;
        Some(value)
    }

    /// Removes every value, returning them (so that the caller can drop them where it may).
    pub fn drain(&mut self) -> Vec<V> {
        self.len = 0;
        self.buckets
            .drain()
            .flat_map(|(_, bucket)| bucket.into_iter().map(|(_, value)| value))
            .collect()
    }

    fn evict_oldest(&mut self) -> Option<V> {
        let oldest = self
            .buckets
            .iter()
            .flat_map(|(&hash, bucket)| {
                bucket
                    .iter()
                    .map(move |(id, value)| (value.last_used(), hash, *id))
            })
            .min()?;
        self.remove(SlotRef {
            hash: oldest.1,
            id: oldest.2,
        })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    #[derive(Debug)]
    struct Value {
        name: &'static str,
        used: UseStamp,
    }

    impl Recency for Value {
        fn last_used(&self) -> u64 {
            self.used.get()
        }
    }

    fn value(name: &'static str) -> Arc<Value> {
        Arc::new(Value {
            name,
            used: UseStamp::now(),
        })
    }

    fn names(map: &LruBuckets<Arc<Value>>, hash: u64) -> Vec<&'static str> {
        map.bucket(hash).into_iter().map(|v| v.name).collect()
    }

    #[test]
    fn values_under_one_hash_share_a_bucket_most_recent_first() {
        let mut map = LruBuckets::new(8);
        let a = value("a");
        map.insert(1, a.clone());
        map.insert(1, value("b"));
        map.insert(2, value("c"));
        assert_eq!(names(&map, 1), ["b", "a"]);
        a.used.mark();
        assert_eq!(names(&map, 1), ["a", "b"]);
        assert_eq!(names(&map, 2), ["c"]);
        assert!(names(&map, 3).is_empty());
        assert_eq!(map.len(), 3);
    }

    #[test]
    fn a_full_map_evicts_the_least_recently_used() {
        let mut map = LruBuckets::new(3);
        let a = value("a");
        map.insert(1, a.clone());
        map.insert(2, value("b"));
        map.insert(3, value("c"));
        a.used.mark();
        let (_, evicted) = map.insert(4, value("d"));
        assert_eq!(evicted.map(|v| v.name), Some("b"));
        assert_eq!(map.len(), 3);
        assert!(names(&map, 2).is_empty());
        let (_, evicted) = map.insert(5, value("e"));
        assert_eq!(evicted.map(|v| v.name), Some("c"));
        assert_eq!(names(&map, 1), ["a"]);
    }

    #[test]
    fn removed_places_and_draining() {
        let mut map = LruBuckets::new(4);
        let (a, _) = map.insert(7, value("a"));
        map.insert(7, value("b"));
        assert_eq!(map.remove(a).map(|v| v.name), Some("a"));
        assert!(map.remove(a).is_none());
        assert_eq!(names(&map, 7), ["b"]);
        assert_eq!(map.values().count(), 1);
        let drained: Vec<_> = map.drain().into_iter().map(|v| v.name).collect();
        assert_eq!(drained, ["b"]);
        assert!(map.is_empty());
        assert!(names(&map, 7).is_empty());
    }

    #[test]
    fn capacity_is_at_least_one() {
        let mut map = LruBuckets::new(0);
        map.insert(1, value("a"));
        let (_, evicted) = map.insert(2, value("b"));
        assert_eq!(evicted.map(|v| v.name), Some("a"));
        assert_eq!(map.len(), 1);
    }
}
