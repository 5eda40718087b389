//! Device copies of an argument's recent host values, found by the values' bytes.
//!
//! A host value (a scalar, a small numpy array) is copied to the device on every call that
//! passes it. Where a call passes the same bytes again, a copy kept from before serves: device
//! arrays are immutable, so equal bytes mean an equal copy. A value is kept from the second
//! time it is seen among the latest few, so that a loop passing new values on every call pays
//! only a fingerprint per call, and no copy that it never uses again.
//!
//! A device array copied to another device is found by identity instead (`LatestCopy`): the
//! copy of the latest array passed serves the next call that passes the same array.

use std::hash::Hasher;

use rustc_hash::FxHasher;

use crate::bounded::{BoundedMap, LeastRecent, Recency, UseStamp};

/// How many copies one argument keeps, and how many fingerprints of values not kept.
pub const KEPT_VALUES: usize = 4;

/// The copies of one argument's recent values (`T`, a device array), by the values' bytes.
#[derive(Debug)]
pub struct KeptValues<T> {
    /// When full, the copy kept first goes (a hit writes nothing).
    kept: BoundedMap<Box<[u8]>, Kept<T>, LeastRecent>,
    /// Fingerprints of the latest values placed without keeping a copy, most recent first.
    seen: Vec<u64>,
}

#[derive(Debug)]
struct Kept<T> {
    copy: T,
    kept_at: UseStamp,
}

impl<T> Recency for Kept<T> {
    fn last_used(&self) -> u64 {
        self.kept_at.get()
    }
}

impl<T> Default for KeptValues<T> {
    fn default() -> Self {
        Self {
            kept: BoundedMap::new(KEPT_VALUES),
            seen: Vec::with_capacity(KEPT_VALUES),
        }
    }
}

impl<T> KeptValues<T> {
    /// The copy kept of the value of these bytes.
    pub fn get(&self, bytes: &[u8]) -> Option<&T> {
        self.kept.get(bytes).map(|kept| &kept.copy)
    }

    /// Whether a copy of the value of these bytes, which has none kept, is worth keeping: it
    /// was seen among the latest values placed. If not, it is remembered as seen.
    pub fn admit(&mut self, bytes: &[u8]) -> bool {
        let fingerprint = fingerprint(bytes);
        if let Some(at) = self.seen.iter().position(|&f| f == fingerprint) {
            self.seen.remove(at);
            return true;
        }
        self.seen.truncate(KEPT_VALUES - 1);
        self.seen.insert(0, fingerprint);
        false
    }

    /// Whether the latest values placed were all new: as many in a row as fingerprints are
    /// kept, none seen before among them. Such values are a stream (a new batch on every
    /// call), which keeping copies will not serve.
    pub fn streaming(&self) -> bool {
        self.seen.len() == KEPT_VALUES
    }

    /// Keeps `copy` of the value of these bytes. Returns the copies that no longer are kept
    /// (an earlier copy of the same value, the one kept first), which the caller drops where
    /// it likes (freeing a device array may run other threads).
    pub fn keep(&mut self, bytes: &[u8], copy: T) -> Vec<T> {
        let kept = Kept {
            copy,
            kept_at: UseStamp::now(),
        };
        let dropped = self.kept.insert(bytes.into(), kept).into_values();
        dropped.into_iter().map(|kept| kept.copy).collect()
    }
}

fn fingerprint(bytes: &[u8]) -> u64 {
    let mut hasher = FxHasher::default();
    hasher.write(bytes);
    hasher.write_usize(bytes.len());
    hasher.finish()
}

/// The copy of the latest source array copied for one argument. Sources are immutable, so a
/// source passed again takes its copy from the call before. The copy is kept from the second
/// call in a row with a source at one address, so that calls with a new source every time
/// keep nothing (and make no `S`, a weak reference to the source); it is let go when another
/// source is copied.
#[derive(Debug, Default)]
pub enum LatestCopy<S, T> {
    #[default]
    Nothing,
    /// The latest source copied was at this address; its copy is not kept.
    At(usize),
    /// The latest source (`S` identifies it) and its copy.
    Kept(S, T),
}

impl<S, T> LatestCopy<S, T> {
    /// The copy kept of the source at `address`, where `is_source` tells the kept source is
    /// that one; and whether the latest source copied, not kept, was at this address.
    pub fn lookup(&self, address: usize, is_source: impl FnOnce(&S) -> bool) -> (Option<&T>, bool) {
        match self {
            Self::Nothing => (None, false),
            Self::At(seen) => (None, *seen == address),
            Self::Kept(source, copy) => (is_source(source).then_some(copy), false),
        }
    }

    /// What follows a copy of the source at `address`: the source and its copy (made by `keep`)
    /// where `seen_again` (as `lookup` said), else the address alone.
    pub fn after_copy<E>(
        address: usize,
        seen_again: bool,
        keep: impl FnOnce() -> Result<(S, T), E>,
    ) -> Result<Self, E> {
        Ok(if seen_again {
            let (source, copy) = keep()?;
            Self::Kept(source, copy)
        } else {
            Self::At(address)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_value_is_kept_from_its_second_sighting() {
        let mut values = KeptValues::default();
        assert!(!values.admit(b"abc"));
        assert!(values.get(b"abc").is_none());
        assert!(values.admit(b"abc"));
        assert!(values.keep(b"abc", 1).is_empty());
        assert_eq!(values.get(b"abc"), Some(&1));
        assert!(values.get(b"abd").is_none());
        assert!(values.get(b"ab").is_none());
    }

    #[test]
    fn new_values_on_every_call_are_never_admitted() {
        let mut values = KeptValues::<u32>::default();
        for i in 0..100u32 {
            assert!(!values.admit(&i.to_le_bytes()));
        }
        assert!(values.kept.is_empty());
    }

    #[test]
    fn a_cycle_longer_than_the_fingerprints_is_never_admitted() {
        let mut values = KeptValues::<u32>::default();
        let cycle = KEPT_VALUES as u32 + 1;
        for i in 0..10 * cycle {
            assert!(!values.admit(&(i % cycle).to_le_bytes()));
        }
    }

    #[test]
    fn new_values_on_every_call_are_a_stream_and_repeated_ones_are_not() {
        let mut values = KeptValues::<u32>::default();
        for i in 0..KEPT_VALUES as u32 {
            assert!(!values.streaming());
            values.admit(&i.to_le_bytes());
        }
        assert!(values.streaming());
        let mut values = KeptValues::<u32>::default();
        for i in 0..20u32 {
            if values.admit(&(i % 2).to_le_bytes()) {
                values.keep(&(i % 2).to_le_bytes(), i);
            }
            assert!(!values.streaming());
        }
    }

    #[test]
    fn a_short_cycle_is_admitted_then_served_from_copies() {
        let mut values = KeptValues::default();
        let mut admitted = 0;
        for i in 0..40u32 {
            let bytes = (i % KEPT_VALUES as u32).to_le_bytes();
            if values.get(&bytes).is_none() && values.admit(&bytes) {
                admitted += 1;
                values.keep(&bytes, i);
            }
        }
        assert_eq!(admitted, KEPT_VALUES);
        assert_eq!(values.kept.len(), KEPT_VALUES);
    }

    #[test]
    fn keeping_is_bounded_and_evicts_the_least_recent() {
        let mut values = KeptValues::default();
        for i in 0..KEPT_VALUES as u8 {
            assert!(values.keep(&[i], i).is_empty());
        }
        assert_eq!(values.keep(&[100], 100), vec![0]);
        assert!(values.get(&[0]).is_none());
        assert_eq!(values.kept.len(), KEPT_VALUES);
        // A value kept again replaces its earlier copy.
        assert_eq!(values.keep(&[2], 22), vec![2]);
        assert_eq!(values.get(&[2]), Some(&22));
        assert_eq!(values.kept.len(), KEPT_VALUES);
    }

    /// One call of a source at `address` (`source` identifies it): its copy, kept or new.
    fn call(latest: &mut LatestCopy<u32, &'static str>, address: usize, source: u32) -> bool {
        let (kept, seen_again) = latest.lookup(address, |s| *s == source);
        if kept.is_some() {
            return true;
        }
        *latest =
            LatestCopy::after_copy(address, seen_again, || Ok::<_, ()>((source, "copy"))).unwrap();
        false
    }

    #[test]
    fn a_source_is_kept_from_its_second_call_in_a_row() {
        let mut latest = LatestCopy::default();
        assert!(!call(&mut latest, 8, 1));
        assert!(!call(&mut latest, 8, 1));
        assert!(matches!(latest, LatestCopy::Kept(1, _)));
        assert!(call(&mut latest, 8, 1));
        assert!(call(&mut latest, 8, 1));
    }

    #[test]
    fn another_source_lets_the_copy_go() {
        let mut latest = LatestCopy::default();
        call(&mut latest, 8, 1);
        call(&mut latest, 8, 1);
        assert!(!call(&mut latest, 16, 2));
        assert!(matches!(latest, LatestCopy::At(16)));
        // A new source at a dead source's address is not taken for it.
        assert!(!call(&mut latest, 16, 2));
        assert!(!call(&mut latest, 16, 3));
        assert!(matches!(latest, LatestCopy::At(16)));
    }

    #[test]
    fn new_sources_every_call_keep_nothing() {
        let mut latest = LatestCopy::default();
        for i in 0..100u32 {
            assert!(!call(&mut latest, i as usize, i));
            assert!(matches!(latest, LatestCopy::At(_)));
        }
    }
}
