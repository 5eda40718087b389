//! The one bounded map of fastpjit. Every store that could grow with the calls is one: the
//! memos (avals, shardings, trees, dataclass types, placement plans), a function's cache
//! entries, and the device copies of host values that an argument keeps.
//!
//! A map holds at most `capacity` values and, when full, makes room by one of two rules
//! (`R`):
//! - [`ForgetAll`], for memos: it forgets everything and starts again, so that a hit is one
//!   hash of a cheap key and writes no bookkeeping;
//! - [`LeastRecent`], for what is dear to make again (an executable, a device copy): it
//!   evicts the value used least recently, as values say themselves ([`Recency`]), so that
//!   marking a value used needs no lock on the map.
//!
//! Values under one key form a bucket. `insert` replaces a key's values (a memo); `push` adds
//! one beside them, for keys whose equality only the caller can decide, such as a call
//! signature's hash, whose bucket the caller searches.
//!
//! What a map forgets is handed back to the caller, which drops it where it may: freeing a
//! Python object can run Python, which must not happen under the caller's lock.

use std::borrow::Borrow;
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hash};
use std::marker::PhantomData;
use std::sync::atomic::{AtomicU64, Ordering};

use rustc_hash::FxHasher;

type Map<K, V> = HashMap<K, Bucket<V>, BuildHasherDefault<FxHasher>>;

/// The values under one key: one inline, so that a memo's hit reads no other allocation.
#[derive(Debug)]
enum Bucket<V> {
    One(V),
    Many(Vec<V>),
}

impl<V> Bucket<V> {
    fn as_slice(&self) -> &[V] {
        match self {
            Self::One(value) => std::slice::from_ref(value),
            Self::Many(values) => values,
        }
    }

    fn push(&mut self, value: V) {
        let values = match std::mem::replace(self, Self::Many(Vec::new())) {
            Self::One(first) => vec![first, value],
            Self::Many(mut values) => {
                values.push(value);
                values
            }
        };
        *self = Self::Many(values);
    }

    /// Removes the value at `i`, handing back what is left, if anything.
    fn remove(self, i: usize) -> (V, Option<Self>) {
        match self {
            Self::One(value) => (value, None),
            Self::Many(mut values) => {
                let value = values.swap_remove(i);
                let rest = match values.len() {
                    0 => None,
                    1 => values.pop().map(Self::One),
                    _ => Some(Self::Many(values)),
                };
                (value, rest)
            }
        }
    }

    fn into_values(self) -> Vec<V> {
        match self {
            Self::One(value) => vec![value],
            Self::Many(values) => values,
        }
    }
}

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

/// How a full map makes room for one more value.
pub trait Rule<V> {
    /// When `value` was last used, where a full map evicts the value used least recently;
    /// None where it forgets everything.
    fn last_used(value: &V) -> Option<u64>;
}

/// Forget every value (memos).
#[derive(Debug)]
pub enum ForgetAll {}

/// Evict the value used least recently.
#[derive(Debug)]
pub enum LeastRecent {}

impl<V> Rule<V> for ForgetAll {
    fn last_used(_: &V) -> Option<u64> {
        None
    }
}

impl<V: Recency> Rule<V> for LeastRecent {
    fn last_used(value: &V) -> Option<u64> {
        Some(value.last_used())
    }
}

/// Moves the value at `i` of `bucket` to `into`; a bucket left empty becomes an empty `Many`
/// for the caller to drop (`emptied`).
fn take_from<V>(bucket: &mut Bucket<V>, i: usize, into: &mut Vec<V>, emptied: &mut bool) {
    let (value, rest) = std::mem::replace(bucket, Bucket::Many(Vec::new())).remove(i);
    into.push(value);
    match rest {
        Some(rest) => *bucket = rest,
        None => *emptied = true,
    }
}

#[derive(Debug)]
pub struct BoundedMap<K, V, R = ForgetAll> {
    capacity: usize,
    len: usize,
    /// None until the first insert, so that `new` is `const` (for statics).
    map: Option<Map<K, V>>,
    rule: PhantomData<R>,
}

/// What an insert, a removal or a clear forgot, for the caller to drop outside its lock.
#[must_use = "drop what was forgotten outside the lock that guards the map"]
#[derive(Debug)]
pub struct Forgotten<K, V> {
    all: Option<Map<K, V>>,
    some: Vec<V>,
}

impl<K, V> Forgotten<K, V> {
    fn none() -> Self {
        Self {
            all: None,
            some: Vec::new(),
        }
    }

    /// Every value forgotten.
    pub fn values(&self) -> impl Iterator<Item = &V> {
        let all = self.all.iter().flat_map(HashMap::values);
        all.flat_map(Bucket::as_slice).chain(&self.some)
    }

    /// How many values were forgotten.
    pub fn len(&self) -> usize {
        self.values().count()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The values forgotten, owned.
    pub fn into_values(self) -> Vec<V> {
        let mut values = self.some;
        for bucket in self.all.into_iter().flat_map(HashMap::into_values) {
            values.extend(bucket.into_values());
        }
        values
    }
}

impl<K: Eq + Hash, V, R: Rule<V>> BoundedMap<K, V, R> {
    /// An empty map of at most `capacity` values (at least one).
    pub const fn new(capacity: usize) -> Self {
        Self {
            capacity: if capacity == 0 { 1 } else { capacity },
            len: 0,
            map: None,
            rule: PhantomData,
        }
    }

    /// The first value under `key`.
    #[inline]
    pub fn get<Q: Eq + Hash + ?Sized>(&self, key: &Q) -> Option<&V>
    where
        K: Borrow<Q>,
    {
        self.bucket(key).first()
    }

    /// Every value under `key`.
    #[inline]
    pub fn bucket<Q: Eq + Hash + ?Sized>(&self, key: &Q) -> &[V]
    where
        K: Borrow<Q>,
    {
        self.map
            .as_ref()
            .and_then(|map| map.get(key))
            .map_or(&[], Bucket::as_slice)
    }

    /// Maps `key` to `value` alone, making room first if the map is full.
    pub fn insert(&mut self, key: K, value: V) -> Forgotten<K, V> {
        let mut forgotten = self.remove_all(&key);
        forgotten.some.extend(self.make_room().into_values());
        self.map().insert(key, Bucket::One(value));
        self.len += 1;
        forgotten
    }

    /// Adds `value` under `key`, beside the values there, making room first if the map is
    /// full.
    pub fn push(&mut self, key: K, value: V) -> Forgotten<K, V> {
        let forgotten = self.make_room();
        match self.map().entry(key) {
            std::collections::hash_map::Entry::Occupied(mut bucket) => bucket.get_mut().push(value),
            std::collections::hash_map::Entry::Vacant(slot) => {
                slot.insert(Bucket::One(value));
            }
        }
        self.len += 1;
        forgotten
    }

    /// Removes the first value under `key` that `is_it` picks.
    pub fn remove_where(&mut self, key: &K, is_it: impl Fn(&V) -> bool) -> Option<V> {
        let map = self.map.as_mut()?;
        let bucket = map.get_mut(key)?;
        let i = bucket.as_slice().iter().position(is_it)?;
        let (mut removed, mut emptied) = (Vec::new(), false);
        take_from(bucket, i, &mut removed, &mut emptied);
        if emptied {
            map.remove(key);
        }
        self.len -= 1;
        removed.pop()
    }

    /// Forgets every value that `is_it` picks.
    pub fn forget_where(&mut self, is_it: impl Fn(&V) -> bool) -> Forgotten<K, V>
    where
        K: Clone,
    {
        let keys: Vec<K> = self
            .map
            .iter()
            .flat_map(HashMap::iter)
            .filter(|(_, bucket)| bucket.as_slice().iter().any(&is_it))
            .map(|(key, _)| key.clone())
            .collect();
        let mut some = Vec::new();
        for key in keys {
            while let Some(value) = self.remove_where(&key, &is_it) {
                some.push(value);
            }
        }
        Forgotten { all: None, some }
    }

    /// Forgets every value.
    pub fn clear(&mut self) -> Forgotten<K, V> {
        self.len = 0;
        Forgotten {
            all: self.map.take(),
            some: Vec::new(),
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Every value, in no particular order.
    pub fn values(&self) -> impl Iterator<Item = &V> {
        self.map
            .iter()
            .flat_map(HashMap::values)
            .flat_map(Bucket::as_slice)
    }

    fn map(&mut self) -> &mut Map<K, V> {
        let capacity = self.capacity.min(16);
        self.map.get_or_insert_with(|| {
            Map::with_capacity_and_hasher(capacity, BuildHasherDefault::default())
        })
    }

    fn remove_all(&mut self, key: &K) -> Forgotten<K, V> {
        let removed = self.map.as_mut().and_then(|map| map.remove(key));
        let some = removed.map_or_else(Vec::new, Bucket::into_values);
        self.len -= some.len();
        Forgotten { all: None, some }
    }

    fn make_room(&mut self) -> Forgotten<K, V> {
        if self.len < self.capacity {
            return Forgotten::none();
        }
        let map = self.map();
        let mut stamps = map.values().flat_map(Bucket::as_slice).map(R::last_used);
        let Some(Some(first)) = stamps.next() else {
            return self.clear();
        };
        let oldest = stamps.flatten().fold(first, u64::min);
        let (mut some, mut emptied) = (Vec::new(), false);
        for bucket in map.values_mut() {
            let mut stamps = bucket.as_slice().iter().map(R::last_used);
            if let Some(i) = stamps.position(|s| s == Some(oldest)) {
                take_from(bucket, i, &mut some, &mut emptied);
                break;
            }
        }
        if emptied {
            map.retain(|_, bucket| !bucket.as_slice().is_empty());
        }
        self.len -= some.len();
        Forgotten { all: None, some }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use proptest::prelude::*;

    use super::*;

    #[test]
    fn a_full_map_forgets_everything_and_keeps_the_new_value() {
        let mut map = BoundedMap::<_, _>::new(2);
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
        let mut map = BoundedMap::<_, _>::new(2);
        let _ = map.insert(1, "a");
        let _ = map.insert(2, "b");
        let forgotten = map.insert(2, "B");
        assert_eq!(forgotten.into_values(), ["b"]);
        assert_eq!(map.len(), 2);
        assert_eq!(map.values().count(), 2);
    }

    #[test]
    fn forget_where_forgets_the_values_picked_under_every_key() {
        let mut map = BoundedMap::<_, _>::new(8);
        let _ = map.push(1, 10);
        let _ = map.push(1, 11);
        let _ = map.push(1, 12);
        let _ = map.push(2, 20);
        let _ = map.push(3, 31);
        let mut forgotten = map.forget_where(|v| v % 2 == 1).into_values();
        forgotten.sort_unstable();
        assert_eq!(forgotten, [11, 31]);
        assert_eq!(map.len(), 3);
        let mut kept: Vec<_> = map.values().copied().collect();
        kept.sort_unstable();
        assert_eq!(kept, [10, 12, 20]);
        assert_eq!(map.get(&3), None);
        assert!(map.forget_where(|_| false).is_empty());
    }

    #[test]
    fn clear_and_capacity_at_least_one() {
        let mut map = BoundedMap::<_, _>::new(0);
        assert_eq!(map.capacity(), 1);
        let _ = map.insert("k", 1);
        assert_eq!(map.clear().len(), 1);
        assert!(map.is_empty());
        assert_eq!(map.get(&"k"), None);
    }

    #[test]
    fn keys_are_found_by_what_they_borrow_as() {
        let mut map = BoundedMap::<Box<[u8]>, u8>::new(4);
        let _ = map.insert(b"abc".as_slice().into(), 1);
        assert_eq!(map.get(b"abc".as_slice()), Some(&1));
        assert_eq!(map.get(b"ab".as_slice()), None);
    }

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

    type Lru = BoundedMap<u64, Arc<Value>, LeastRecent>;

    fn names(map: &Lru, hash: u64) -> Vec<&'static str> {
        map.bucket(&hash).iter().map(|v| v.name).collect()
    }

    fn forgotten_names(forgotten: Forgotten<u64, Arc<Value>>) -> Vec<&'static str> {
        forgotten.into_values().iter().map(|v| v.name).collect()
    }

    #[test]
    fn values_pushed_under_one_key_share_its_bucket() {
        let mut map = Lru::new(8);
        let _ = map.push(1, value("a"));
        let _ = map.push(1, value("b"));
        let _ = map.push(2, value("c"));
        assert_eq!(names(&map, 1), ["a", "b"]);
        assert_eq!(names(&map, 2), ["c"]);
        assert!(names(&map, 3).is_empty());
        assert_eq!(map.len(), 3);
    }

    #[test]
    fn a_full_lru_map_evicts_the_least_recently_used_value() {
        let mut map = Lru::new(3);
        let a = value("a");
        let _ = map.push(1, a.clone());
        let _ = map.push(2, value("b"));
        let _ = map.push(2, value("c"));
        a.used.mark();
        assert_eq!(forgotten_names(map.push(4, value("d"))), ["b"]);
        assert_eq!(map.len(), 3);
        assert_eq!(names(&map, 2), ["c"]);
        assert_eq!(forgotten_names(map.push(5, value("e"))), ["c"]);
        assert!(names(&map, 2).is_empty());
        assert_eq!(names(&map, 1), ["a"]);
    }

    #[test]
    fn removing_one_value_of_a_bucket() {
        let mut map = Lru::new(4);
        let a = value("a");
        let _ = map.push(7, a.clone());
        let _ = map.push(7, value("b"));
        let removed = map.remove_where(&7, |v| Arc::ptr_eq(v, &a));
        assert_eq!(removed.map(|v| v.name), Some("a"));
        assert!(map.remove_where(&7, |v| Arc::ptr_eq(v, &a)).is_none());
        assert_eq!(names(&map, 7), ["b"]);
        assert_eq!(map.len(), 1);
        assert!(map.remove_where(&7, |_| true).is_some());
        assert!(map.is_empty() && map.values().next().is_none());
    }

    proptest! {
        /// Never more values than the capacity; the latest insert is always found; every
        /// value inserted is either found or was handed back.
        #[test]
        fn bounded_and_nothing_lost(capacity in 1usize..8, keys in prop::collection::vec(0u8..16, 0..64)) {
            let mut map = BoundedMap::<_, _>::new(capacity);
            let mut handed_back = 0;
            for (i, &key) in keys.iter().enumerate() {
                handed_back += map.insert(key, i).len();
                prop_assert!(map.len() <= capacity);
                prop_assert_eq!(map.get(&key), Some(&i));
            }
            prop_assert_eq!(handed_back + map.len(), keys.len());
            prop_assert_eq!(map.values().count(), map.len());
        }

        /// The same of a least-recently-used map that values are pushed into, some of them
        /// used again: it evicts one value at a time, never one used after another one it
        /// keeps, and removals keep its count.
        #[test]
        fn lru_bounded_and_evicts_the_least_recent(
            capacity in 1usize..6,
            steps in prop::collection::vec((0u64..4, any::<bool>()), 0..60),
        ) {
            let mut map = Lru::new(capacity);
            let mut handed_back = 0;
            let mut pushed = 0;
            for (key, use_first) in steps {
                if use_first {
                    if let Some(first) = map.get(&key) {
                        first.used.mark();
                        continue;
                    }
                }
                let forgotten = map.push(key, value("v"));
                pushed += 1;
                prop_assert!(forgotten.len() <= 1);
                for gone in forgotten.values() {
                    prop_assert!(map.values().all(|kept| kept.last_used() > gone.last_used()));
                }
                handed_back += forgotten.len();
                prop_assert!(map.len() <= capacity);
                prop_assert_eq!(map.values().count(), map.len());
            }
            prop_assert_eq!(handed_back + map.len(), pushed);
        }
    }
}
