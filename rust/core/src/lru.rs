//! A bounded map from hashes to values, for keys whose equality only the caller can decide
//! (the dispatcher's call signatures compare Python objects). Values under one hash form a
//! bucket that the caller searches; when full, the least recently used value is evicted.

use std::collections::HashMap;
use std::hash::BuildHasherDefault;

use rustc_hash::FxHasher;

type Buckets<V> = HashMap<u64, Vec<Slot<V>>, BuildHasherDefault<FxHasher>>;

struct Slot<V> {
    value: V,
    id: u64,
    used: u64,
}

pub struct LruBuckets<V> {
    buckets: Buckets<V>,
    len: usize,
    capacity: usize,
    /// Advances on every use; a slot's `used` is the clock when it was last used.
    clock: u64,
    next_id: u64,
}

/// A value's place in the map: its hash and an id unique among the values ever inserted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlotRef {
    pub hash: u64,
    pub id: u64,
}

impl<V: Clone> LruBuckets<V> {
    /// An empty map that holds at most `capacity` values (at least one).
    pub fn new(capacity: usize) -> Self {
        Self {
            buckets: Buckets::default(),
            len: 0,
            capacity: capacity.max(1),
            clock: 0,
            next_id: 0,
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The values under `hash`, most recently used first, with their places.
    pub fn bucket(&self, hash: u64) -> Vec<(SlotRef, V)> {
        let Some(bucket) = self.buckets.get(&hash) else {
            return Vec::new();
        };
        let mut found: Vec<_> = bucket
            .iter()
            .map(|slot| (slot.used, SlotRef { hash, id: slot.id }, slot.value.clone()))
            .collect();
        found.sort_by_key(|slot| std::cmp::Reverse(slot.0));
        found
            .into_iter()
            .map(|(_, at, value)| (at, value))
            .collect()
    }

    /// Every value, in no particular order.
    pub fn values(&self) -> impl Iterator<Item = &V> {
        self.buckets.values().flatten().map(|slot| &slot.value)
    }

    /// Marks the value at `at` as just used; false if it is no longer there.
    pub fn touch(&mut self, at: SlotRef) -> bool {
        self.clock += 1;
        let clock = self.clock;
        match self.slot_mut(at) {
            Some(slot) => {
                slot.used = clock;
                true
            }
            None => false,
        }
    }

    /// Inserts `value` under `hash`, evicting the least recently used value when full; returns
    /// its place and the evicted value, if any.
    pub fn insert(&mut self, hash: u64, value: V) -> (SlotRef, Option<V>) {
        let evicted = if self.len >= self.capacity {
            self.evict_oldest()
        } else {
            None
        };
        self.clock += 1;
        self.next_id += 1;
        let at = SlotRef {
            hash,
            id: self.next_id,
        };
        self.buckets.entry(hash).or_default().push(Slot {
            value,
            id: at.id,
            used: self.clock,
        });
        self.len += 1;
        (at, evicted)
    }

    /// Replaces the value at `at`; false if it is no longer there.
    pub fn replace(&mut self, at: SlotRef, value: V) -> bool {
        match self.slot_mut(at) {
            Some(slot) => {
                slot.value = value;
                true
            }
            None => false,
        }
    }

    /// Removes the value at `at`, if it is still there.
    pub fn remove(&mut self, at: SlotRef) -> Option<V> {
        let bucket = self.buckets.get_mut(&at.hash)?;
        let i = bucket.iter().position(|slot| slot.id == at.id)?;
        let slot = bucket.swap_remove(i);
        if bucket.is_empty() {
            self.buckets.remove(&at.hash);
        }
        self.len -= 1;
        Some(slot.value)
    }

    /// Removes every value, returning them (so that the caller can drop them where it may).
    pub fn drain(&mut self) -> Vec<V> {
        self.len = 0;
        self.buckets
            .drain()
            .flat_map(|(_, bucket)| bucket.into_iter().map(|slot| slot.value))
            .collect()
    }

    fn slot_mut(&mut self, at: SlotRef) -> Option<&mut Slot<V>> {
        self.buckets
            .get_mut(&at.hash)?
            .iter_mut()
            .find(|slot| slot.id == at.id)
    }

    fn evict_oldest(&mut self) -> Option<V> {
        let oldest = self
            .buckets
            .iter()
            .flat_map(|(&hash, bucket)| bucket.iter().map(move |slot| (slot.used, hash, slot.id)))
            .min()?;
        self.remove(SlotRef {
            hash: oldest.1,
            id: oldest.2,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(map: &LruBuckets<&'static str>, hash: u64) -> Vec<&'static str> {
        map.bucket(hash).into_iter().map(|(_, v)| v).collect()
    }

    #[test]
    fn values_under_one_hash_share_a_bucket_most_recent_first() {
        let mut map = LruBuckets::new(8);
        let (a, _) = map.insert(1, "a");
        map.insert(1, "b");
        map.insert(2, "c");
        assert_eq!(values(&map, 1), ["b", "a"]);
        assert!(map.touch(a));
        assert_eq!(values(&map, 1), ["a", "b"]);
        assert_eq!(values(&map, 2), ["c"]);
        assert!(values(&map, 3).is_empty());
        assert_eq!(map.len(), 3);
    }

    #[test]
    fn a_full_map_evicts_the_least_recently_used() {
        let mut map = LruBuckets::new(3);
        let (a, _) = map.insert(1, "a");
        map.insert(2, "b");
        map.insert(3, "c");
        map.touch(a);
        let (_, evicted) = map.insert(4, "d");
        assert_eq!(evicted, Some("b"));
        assert_eq!(map.len(), 3);
        assert!(values(&map, 2).is_empty());
        let (_, evicted) = map.insert(5, "e");
        assert_eq!(evicted, Some("c"));
        assert_eq!(values(&map, 1), ["a"]);
    }

    #[test]
    fn removed_and_replaced_places() {
        let mut map = LruBuckets::new(4);
        let (a, _) = map.insert(7, "a");
        let (b, _) = map.insert(7, "b");
        assert!(map.replace(b, "B"));
        assert_eq!(map.remove(a), Some("a"));
        assert_eq!(map.remove(a), None);
        assert!(!map.touch(a));
        assert!(!map.replace(a, "x"));
        assert_eq!(values(&map, 7), ["B"]);
        assert_eq!(map.drain(), vec!["B"]);
        assert!(map.is_empty());
        assert!(values(&map, 7).is_empty());
    }

    #[test]
    fn capacity_is_at_least_one() {
        let mut map = LruBuckets::new(0);
        map.insert(1, "a");
        let (_, evicted) = map.insert(2, "b");
        assert_eq!(evicted, Some("a"));
        assert_eq!(map.len(), 1);
    }
}
