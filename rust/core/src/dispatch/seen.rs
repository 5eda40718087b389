//! The rules by which a function remembers the arrays of its latest calls, two by position
//! among its flat leaves (so that calls that alternate between two arrays find both), with
//! what the call signature reads of each (`R`: its aval, sharding and commitment, fixed for
//! the array's life). A call that passes one of those arrays again reads nothing of it.
//!
//! An array is held by a weak reference (in `R`), which tells it apart from a new array at
//! its address once it is gone. A reference is made only for an array found at an address
//! that one of the two latest calls had at its position, so that calls with new arrays every
//! time (batches) make none. A loop whose new arrays take the addresses that its old ones
//! freed (a donated state, whose arrays alternate between two addresses) makes a reference or
//! two at a position, then none: an address where a held array was found replaced by a new
//! one is held again only when two calls in a row pass an array there.

/// How many positions a function remembers arrays at.
pub const SEEN_POSITIONS: usize = 1 << 16;

#[derive(Debug)]
pub struct SeenArrays<R> {
    slots: Vec<[Seen<R>; 2]>,
}

impl<R> Default for SeenArrays<R> {
    fn default() -> Self {
        Self { slots: Vec::new() }
    }
}

#[derive(Debug, Default)]
enum Seen<R> {
    #[default]
    Nothing,
    /// An array was at this address, and is not held; `hold` is false where a held array was
    /// found replaced by a new one (see above).
    At {
        address: usize,
        hold: bool,
    },
    Held {
        address: usize,
        array: R,
    },
}

impl<R> Seen<R> {
    fn address(&self) -> Option<usize> {
        match self {
            Self::Nothing => None,
            Self::At { address, .. } | Self::Held { address, .. } => Some(*address),
        }
    }
}

impl<R> SeenArrays<R> {
    /// The array held at `position` that `is_it` recognizes, if any; the array found second
    /// moves first.
    #[inline]
    pub fn remembered(&mut self, position: usize, is_it: impl Fn(&R) -> bool) -> Option<&R> {
        let pair = self.slots.get_mut(position)?;
        let i = pair.iter().position(|seen| match seen {
            Seen::Held { array, .. } => is_it(array),
            _ => false,
        })?;
        if i != 0 {
            pair.swap(0, i);
        }
        match &pair[0] {
            Seen::Held { array, .. } => Some(array),
            _ => None,
        }
    }

    /// Whether arrays at `position` are remembered at all.
    #[inline]
    pub fn tracks(position: usize) -> bool {
        position < SEEN_POSITIONS
    }

    /// Whether a new array found at `address`, at `position`, is to be held.
    pub fn holds(&self, position: usize, address: usize) -> bool {
        let Some(pair) = self.slots.get(position) else {
            return false;
        };
        let found = pair.iter().position(|s| s.address() == Some(address));
        // The address of the latest call's array, or of the call's before where no held
        // array has been replaced.
        matches!(
            found.map(|i| (i, &pair[i])),
            Some((0, Seen::At { .. }) | (_, Seen::At { hold: true, .. }))
        )
    }

    /// Remembers the array found at `address` at `position` (of a tracked position): held
    /// where `held` is its record (as `holds` said), else by address. Returns the record
    /// that no longer is held, for the caller to drop where it may.
    pub fn remember(&mut self, position: usize, address: usize, held: Option<R>) -> Option<R> {
        debug_assert!(Self::tracks(position));
        if self.slots.len() <= position {
            self.slots
                .resize_with(position + 1, || [Seen::Nothing, Seen::Nothing]);
        }
        let pair = &mut self.slots[position];
        let found = pair.iter().position(|s| s.address() == Some(address));
        let seen = match held {
            Some(array) => Seen::Held { address, array },
            None => Seen::At {
                address,
                // Not where a held array was just replaced by a new one, or one was before.
                hold: !matches!(
                    found.map(|i| &pair[i]),
                    Some(Seen::Held { .. } | Seen::At { hold: false, .. })
                ),
            },
        };
        // The new memory goes first; the one it replaces, or else the older one, goes.
        let replaced = if found == Some(0) {
            std::mem::replace(&mut pair[0], seen)
        } else {
            let older = std::mem::replace(&mut pair[0], seen);
            std::mem::replace(&mut pair[1], older)
        };
        match replaced {
            Seen::Held { array, .. } => Some(array),
            _ => None,
        }
    }

    /// How many arrays are held.
    pub fn held(&self) -> usize {
        self.records().count()
    }

    /// The records of the arrays held.
    pub fn records(&self) -> impl Iterator<Item = &R> {
        self.slots.iter().flatten().filter_map(|seen| match seen {
            Seen::Held { array, .. } => Some(array),
            _ => None,
        })
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// A record of the array at an address, alive while `alive` says so.
    #[derive(Debug, PartialEq)]
    struct Record {
        address: usize,
        generation: u32,
    }

    /// Runs one call's leaf at `position`: a new array at `address` (of `generation`, which a
    /// live array keeps); returns whether it was remembered.
    fn call(
        seen: &mut SeenArrays<Record>,
        position: usize,
        address: usize,
        generation: u32,
    ) -> bool {
        let is_it = |r: &Record| r.address == address && r.generation == generation;
        if seen.remembered(position, is_it).is_some() {
            return true;
        }
        let held = seen.holds(position, address).then_some(Record {
            address,
            generation,
        });
        let _ = seen.remember(position, address, held);
        false
    }

    #[test]
    fn an_array_passed_again_is_held_from_its_second_call() {
        let mut seen = SeenArrays::default();
        assert!(!call(&mut seen, 0, 100, 1));
        assert_eq!(seen.held(), 0);
        assert!(
            !call(&mut seen, 0, 100, 1),
            "second call makes the reference"
        );
        assert_eq!(seen.held(), 1);
        assert!(call(&mut seen, 0, 100, 1));
        assert!(call(&mut seen, 0, 100, 1));
    }

    #[test]
    fn two_arrays_alternating_at_a_position_are_both_held() {
        let mut seen = SeenArrays::default();
        for _ in 0..3 {
            call(&mut seen, 0, 100, 1);
            call(&mut seen, 0, 200, 1);
        }
        assert_eq!(seen.held(), 2);
        assert!(call(&mut seen, 0, 100, 1));
        assert!(call(&mut seen, 0, 200, 1));
    }

    #[test]
    fn new_arrays_every_call_are_never_held() {
        let mut seen = SeenArrays::default();
        for address in 0..100 {
            assert!(!call(&mut seen, 3, 1000 + address, 1));
        }
        assert_eq!(seen.held(), 0);
    }

    #[test]
    fn a_donated_loop_reusing_two_addresses_stops_making_references() {
        let mut seen = SeenArrays::default();
        let mut made = 0;
        for generation in 0..40 {
            let address = [100, 200][generation as usize % 2];
            let before = seen.held();
            call(&mut seen, 0, address, generation);
            made += usize::from(seen.held() > before);
        }
        assert!(made <= 4, "made {made} references");
    }

    #[test]
    fn untracked_positions() {
        assert!(SeenArrays::<Record>::tracks(SEEN_POSITIONS - 1));
        assert!(!SeenArrays::<Record>::tracks(SEEN_POSITIONS));
        let seen = SeenArrays::<Record>::default();
        assert!(!seen.holds(5, 1));
    }

    proptest! {
        /// Whatever the calls: at most two arrays held per position, and an array found
        /// remembered is the live array at that address.
        #[test]
        fn at_most_two_per_position_and_only_live_ones(calls in prop::collection::vec((0usize..3, 0usize..4, 0u32..3), 0..80)) {
            let mut seen = SeenArrays::default();
            for &(position, address, generation) in &calls {
                call(&mut seen, position, address, generation);
                prop_assert!(seen.held() <= 2 * 3);
                for (i, pair) in seen.slots.iter().enumerate() {
                    let held = pair.iter().filter(|s| matches!(s, Seen::Held { .. })).count();
                    prop_assert!(held <= 2, "position {}", i);
                }
            }
        }
    }
}
