//! The bound-argument plan (`fastpjit.jit(f).bind(params)`): once a call of the bound
//! arguments and positional arrays has run, its cache entry is kept with the bound leaves
//! (`BoundPath`), and a later call whose own arrays have that signature runs it directly. A
//! path is learned from the first calls that can teach it (`Learning`), and is stale once the
//! cache is cleared (its generation moves on).

use std::sync::atomic::{AtomicU32, Ordering};

/// How many calls may fail to teach a path before calls stop trying.
pub const LEARNING_CALLS: u32 = 8;

/// What a bound function's calls take: the cache entry `E` of its calls' signature, and the
/// bound arguments' leaves `L`, the first of its leaves. The executable takes each leaf as it
/// is or not at all (an argument it does not use).
#[derive(Debug)]
pub struct BoundPath<E, L> {
    pub entry: E,
    generation: u64,
    pub num_bound_args: usize,
    pub leaves: Vec<L>,
    /// Which of the call's leaves (the bound ones, then its own) the executable takes.
    taken: Vec<bool>,
    takes_all: bool,
}

impl<E, L> BoundPath<E, L> {
    /// The path of a call whose signature has `num_keys` leaves, of `num_bound_args` bound
    /// arguments and then `rest` arguments of its own (one leaf each), whose flat leaves are
    /// `leaves`, of which the executable takes those that `taken` marks; None where the
    /// leaves do not split so.
    pub fn new(
        entry: E,
        generation: u64,
        num_keys: usize,
        num_bound_args: usize,
        mut leaves: Vec<L>,
        rest: usize,
        taken: Vec<bool>,
    ) -> Option<Self> {
        if leaves.len() != num_keys || num_keys < rest || taken.len() != num_keys {
            return None;
        }
        leaves.truncate(num_keys - rest);
        Some(Self {
            entry,
            generation,
            num_bound_args,
            leaves,
            takes_all: taken.iter().all(|&t| t),
            taken,
        })
    }

    /// The executable's inputs of a call whose leaves are `leaves` (the bound ones, then the
    /// call's own): those it takes, in order; None where it takes them all.
    pub fn inputs<T: Clone>(&self, leaves: &[T]) -> Option<Vec<T>> {
        (!self.takes_all).then(|| {
            leaves
                .iter()
                .zip(&self.taken)
                .filter(|(_, &taken)| taken)
                .map(|(leaf, _)| leaf.clone())
                .collect()
        })
    }

    /// Whether the path was learned since the cache was last cleared (at `generation`).
    #[inline]
    pub fn is_current(&self, generation: u64) -> bool {
        self.generation == generation
    }

    /// The positions among the signature's `num_keys` leaves of a call's own `rest`
    /// arguments; None where the call does not fit the path.
    #[inline]
    pub fn own_keys(&self, num_keys: usize, rest: usize) -> Option<std::ops::Range<usize>> {
        let bound = self.leaves.len();
        (num_keys.checked_sub(bound) == Some(rest)).then_some(bound..num_keys)
    }
}

/// Whether a call of a bound function can teach it a path (whose entry takes its arrays as
/// they are): one of a function without static arguments (whose leaves would not be the
/// call's), with arrays after the bound arguments.
pub fn can_teach(has_static_args: bool, own_args_are_arrays: bool) -> bool {
    !has_static_args && own_args_are_arrays
}

/// Whether a call can run on a current path: one with no post-hook to run after it
/// (`jax_debug_nans`, ...), whose positional arguments are those of the path's signature under
/// the call's jit key (`positional`).
pub fn can_run(post_hook: bool, positional: bool) -> bool {
    !post_hook && positional
}

/// How many calls of a bound function failed to teach it a path.
#[derive(Debug, Default)]
pub struct Learning(AtomicU32);

impl Learning {
    /// Whether a call that just ran is to teach the path: the path is missing or stale, the
    /// call had no keyword arguments, the bound values are settled, and fewer than
    /// `LEARNING_CALLS` calls failed before.
    pub fn should_learn(&self, stale: bool, keywords: bool, unsettled: bool) -> bool {
        stale && !keywords && !unsettled && self.0.load(Ordering::Relaxed) < LEARNING_CALLS
    }

    /// Counts a call that failed to teach the path.
    pub fn failed(&self) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_path_splits_bound_leaves_from_the_calls_own() {
        let leaves = vec![10, 11, 12, 13, 14];
        let path = BoundPath::new("entry", 3, 5, 2, leaves.clone(), 2, vec![true; 5]).unwrap();
        assert_eq!(path.leaves, [10, 11, 12]);
        assert_eq!(path.own_keys(5, 2), Some(3..5));
        assert_eq!(path.own_keys(5, 1), None);
        assert_eq!(path.own_keys(2, 0), None);
        assert!(path.is_current(3) && !path.is_current(4));
        assert_eq!(
            path.inputs(&leaves),
            None,
            "all taken: the leaves as they are"
        );
        assert!(
            BoundPath::new((), 0, 4, 1, vec![1, 2, 3], 1, vec![true; 4]).is_none(),
            "a leaf short"
        );
        assert!(
            BoundPath::new((), 0, 1, 1, vec![1], 2, vec![true]).is_none(),
            "more own than keys"
        );
        assert!(
            BoundPath::new((), 0, 1, 1, vec![1], 0, vec![]).is_none(),
            "a mark short"
        );
    }

    #[test]
    fn leaves_the_executable_does_not_take_are_left_out_of_its_inputs() {
        let taken = vec![true, false, true, false];
        let path = BoundPath::new((), 0, 4, 1, vec![10, 11, 12, 13], 1, taken).unwrap();
        assert_eq!(path.leaves, [10, 11, 12]);
        assert_eq!(path.inputs(&[10, 11, 12, 13]), Some(vec![10, 12]));
    }

    #[test]
    fn learning_stops_after_failed_calls() {
        let learning = Learning::default();
        assert!(learning.should_learn(true, false, false));
        assert!(!learning.should_learn(false, false, false), "current path");
        assert!(!learning.should_learn(true, true, false), "keywords");
        assert!(!learning.should_learn(true, false, true), "unsettled");
        for _ in 0..LEARNING_CALLS {
            learning.failed();
        }
        assert!(!learning.should_learn(true, false, false));
    }

    #[test]
    fn only_plain_calls_teach_and_run_a_path() {
        assert!(can_teach(false, true));
        assert!(!can_teach(true, true), "static arguments");
        assert!(
            !can_teach(false, false),
            "a host value after the bound ones"
        );
        assert!(can_run(false, true));
        assert!(!can_run(true, true), "a post-hook");
        assert!(
            !can_run(false, false),
            "keywords where the signature has positions"
        );
    }
}
