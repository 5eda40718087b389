//! What the dispatcher remembers of avals and shardings, by object identity: each aval's value
//! (to hash and compare it), and each sharding's id. Shardings also have a representative per
//! value: a sharding object seen for the first time is compared by `==` with the
//! representatives of its hash, and takes the id of the one it equals, so that later
//! comparisons of shardings are comparisons of ids.
//!
//! Every entry holds its object (`H`, a handle), so that an address stays valid while it is a
//! key here. What is forgotten comes back to the caller, which releases it outside any lock:
//! freeing a Python object can run Python.

use std::sync::Arc;

use crate::bounded::{BoundedMap, Forgotten, LeastRecent, Recency, UseStamp};
use crate::dispatch::{AvalValue, ShardingId};

/// How many avals, sharding objects and sharding values are remembered.
pub const MEMO_AVALS: usize = 8192;
pub const MEMO_SHARDINGS: usize = 2048;
pub const MEMO_SHARDING_VALUES: usize = 1024;

/// An object's address: the key of what is remembered of it, valid while it is held.
pub type Address = usize;

pub struct LeafMemo<H> {
    avals: BoundedMap<Address, (H, Arc<AvalValue>)>,
    shardings: BoundedMap<Address, (H, ShardingId)>,
    /// By hash; when full, the value found least recently goes, and every object is read
    /// again, so that all objects of a value have one id. A value that comes back after it
    /// went has a new id, and signatures kept with the old one miss, no more. (Forgetting every
    /// value instead made every sharding in use miss once, whenever a program had made more
    /// values than the memo holds.)
    representatives: BoundedMap<isize, Representative<H>, LeastRecent>,
    next_id: ShardingId,
}

/// The sharding that stands for its value, the value's id, and when it was last found.
pub struct Representative<H> {
    pub sharding: H,
    pub id: ShardingId,
    found: UseStamp,
}

impl<H> Recency for Representative<H> {
    fn last_used(&self) -> u64 {
        self.found.get()
    }
}

/// What a memo forgot, for its caller to release.
pub type Released<H> = Vec<H>;

impl<H> Default for LeafMemo<H> {
    fn default() -> Self {
        Self::new(MEMO_AVALS, MEMO_SHARDINGS, MEMO_SHARDING_VALUES)
    }
}

impl<H> LeafMemo<H> {
    pub fn new(avals: usize, shardings: usize, sharding_values: usize) -> Self {
        Self {
            avals: BoundedMap::new(avals),
            shardings: BoundedMap::new(shardings),
            representatives: BoundedMap::new(sharding_values),
            next_id: 0,
        }
    }

    /// The value of the aval at `address`, if remembered.
    pub fn aval(&self, address: Address) -> Option<&Arc<AvalValue>> {
        self.avals.get(&address).map(|(_, value)| value)
    }

    /// Remembers the value of the aval `object` at `address`.
    pub fn remember_aval(
        &mut self,
        address: Address,
        object: H,
        value: Arc<AvalValue>,
    ) -> Released<H> {
        handles(self.avals.insert(address, (object, value)))
    }

    /// The id of the sharding at `address`, if remembered.
    pub fn sharding(&self, address: Address) -> Option<ShardingId> {
        self.shardings.get(&address).map(|&(_, id)| id)
    }

    /// The representatives of sharding values of this hash, with their ids: the sharding
    /// object that a new one is compared with by `==`.
    pub fn representatives(&self, hash: isize) -> impl Iterator<Item = (&H, ShardingId)> {
        self.representatives
            .bucket(&hash)
            .iter()
            .map(|r| (&r.sharding, r.id))
    }

    /// Remembers the sharding `object` at `address`, of hash `hash`, which equals the
    /// representative of id `equal` (found by `representatives`), or none; its id. An `equal`
    /// representative that went meanwhile (while `==` ran) counts as none. A new value's
    /// representative is `object`, as `representative()` gives it.
    pub fn remember_sharding(
        &mut self,
        address: Address,
        hash: isize,
        object: H,
        equal: Option<ShardingId>,
        representative: impl FnOnce() -> H,
    ) -> (ShardingId, Released<H>) {
        let kept = equal.and_then(|id| {
            let bucket = self.representatives.bucket(&hash);
            bucket.iter().find(|r| r.id == id)
        });
        let mut released = Vec::new();
        let id = if let Some(kept) = kept {
            kept.found.mark();
            kept.id
        } else {
            self.next_id += 1;
            let id = self.next_id;
            let forgotten = self.representatives.push(
                hash,
                Representative {
                    sharding: representative(),
                    id,
                    found: UseStamp::now(),
                },
            );
            if !forgotten.is_empty() {
                // An object remembered with the id of a value that went would keep that id
                // while new objects of the value take another: every object is read again.
                released.extend(handles(self.shardings.clear()));
                released.extend(forgotten.into_values().into_iter().map(|r| r.sharding));
            }
            id
        };
        released.extend(handles(self.shardings.insert(address, (object, id))));
        (id, released)
    }

    /// Forgets everything (`jax.clear_caches()`).
    pub fn clear(&mut self) -> Released<H> {
        let mut released = handles(self.avals.clear());
        released.extend(handles(self.shardings.clear()));
        let representatives = self.representatives.clear().into_values();
        released.extend(representatives.into_iter().map(|r| r.sharding));
        released
    }

    /// How many avals and sharding objects are remembered.
    pub fn sizes(&self) -> (usize, usize) {
        (self.avals.len(), self.shardings.len())
    }
}

fn handles<H, V>(forgotten: Forgotten<Address, (H, V)>) -> Released<H> {
    forgotten
        .into_values()
        .into_iter()
        .map(|(handle, _)| handle)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dispatch::DtypeKey;

    fn aval(shape: &[i64]) -> Arc<AvalValue> {
        let float32 = DtypeKey {
            num: 11,
            itemsize: 4,
        };
        Arc::new(AvalValue::new(float32, shape.into(), false))
    }

    #[test]
    fn avals_are_remembered_by_address_and_hold_their_object() {
        let mut memo = LeafMemo::new(2, 2, 2);
        assert!(memo.aval(1).is_none());
        assert!(memo.remember_aval(1, "a", aval(&[2])).is_empty());
        assert_eq!(memo.aval(1).map(|v| v.hash), Some(aval(&[2]).hash));
        memo.remember_aval(2, "b", aval(&[3]));
        // Full: the map forgets, and its objects come back to be released.
        let released = memo.remember_aval(3, "c", aval(&[4]));
        assert!(!released.is_empty());
        assert_eq!(memo.sizes().0, 3 - released.len());
    }

    #[test]
    fn equal_shardings_share_an_id() {
        let mut memo = LeafMemo::new(4, 4, 4);
        let (first, _) = memo.remember_sharding(10, 7, "s1", None, || "s1");
        assert_eq!(memo.sharding(10), Some(first));
        let candidates: Vec<_> = memo.representatives(7).collect();
        assert_eq!(candidates, [(&"s1", first)]);
        // Another object of the same value (the caller's `==` said so) takes its id.
        let (second, _) = memo.remember_sharding(11, 7, "s2", Some(first), || "s2");
        assert_eq!(second, first);
        // A new value of the same hash gets a new id.
        let (third, _) = memo.remember_sharding(12, 7, "s3", None, || "s3");
        assert_ne!(third, first);
        assert_eq!(memo.representatives(7).count(), 2);
    }

    #[test]
    fn a_representative_that_went_is_not_matched() {
        let mut memo = LeafMemo::new(8, 8, 1);
        let (first, _) = memo.remember_sharding(1, 1, "a", None, || "a");
        // Another value pushes the first out, and every object is read again.
        let (other, released) = memo.remember_sharding(2, 2, "b", None, || "b");
        assert!(released.contains(&"a"));
        assert_eq!(memo.sharding(1), None);
        // `==` ran against the first while it went: the object gets a new id.
        let (again, _) = memo.remember_sharding(3, 1, "c", Some(first), || "c");
        assert!(again != first && again != other);
    }

    #[test]
    fn clear_releases_everything() {
        let mut memo = LeafMemo::new(4, 4, 4);
        memo.remember_aval(1, "a", aval(&[1]));
        memo.remember_sharding(2, 5, "s", None, || "s-representative");
        let mut released = memo.clear();
        released.sort_unstable();
        assert_eq!(released, ["a", "s", "s-representative"]);
        assert_eq!(memo.sizes(), (0, 0));
    }
}
