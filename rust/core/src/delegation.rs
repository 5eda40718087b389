//! When a function's calls go to JAX's own C++ dispatch instead of fastpjit's.
//!
//! jaxlib 0.10.2 gives a Python caller one way to put host memory on a device,
//! `batched_device_put`, which builds a Python `jax.Array` on the way; jax.jit's C++ dispatch
//! puts a call's numpy arguments without one, and so takes less time per placed array than any
//! caller of the Python API can. A function whose calls keep placing new numpy arrays, and
//! pass few device arrays (which fastpjit reads for less than JAX does), is faster through
//! JAX's dispatch: after such a hit of fastpjit's, the next calls that carry numpy arrays go
//! to JAX, and every `RECHECK`-th call comes back to fastpjit's path to see whether the calls
//! still place them. From jaxlib 0.11.2 the same holds for arrays that a call passes on other
//! devices than the executable's: JAX's dispatch copies them without a Python array either
//! (`fastpjit._jax.line.JAX_COPIES_FOR_LESS`), so a stream of new ones weighs as placed ones
//! do, and then every call goes to JAX until the recheck.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

/// Every how many calls a delegating function takes fastpjit's path again.
pub const RECHECK: u32 = 256;
/// How many device arrays, passed as they are, one placed numpy array pays for: fastpjit reads
/// an array leaf for about 0.4 µs less than JAX does, and JAX places a small numpy array for
/// about 1.6 µs less than `batched_device_put` does.
pub const ARRAYS_PER_PLACED: usize = 4;

/// What a hit of fastpjit's did with the call's arguments.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct HitInputs {
    /// Numpy arrays placed on the device as new values, not served from kept device copies
    /// and not repeating (see `KeptValues::streaming`).
    pub placed: usize,
    /// Arrays copied to the executable's devices as new values, each after a copy of another
    /// (see `LatestCopy::streaming`).
    pub copied: usize,
    /// Device arrays passed as they are.
    pub passed: usize,
}

impl HitInputs {
    /// Whether JAX's dispatch would serve such calls faster, where it copies arrays for less
    /// than fastpjit does (`jax_copies_for_less`) or not.
    pub fn favour_jax(self, jax_copies_for_less: bool) -> bool {
        let new = self.placed + if jax_copies_for_less { self.copied } else { 0 };
        new > 0 && self.passed <= ARRAYS_PER_PLACED * new
    }
}

/// One function's choice, shared by the threads that call it: 0 while fastpjit serves the
/// calls, else how many calls in a row have gone to JAX, plus one; and whether every call goes
/// (copies decided it) or only those that carry numpy arrays.
#[derive(Debug, Default)]
pub struct Delegation {
    state: AtomicU32,
    every_call: AtomicBool,
}

impl Delegation {
    /// Whether this call goes to JAX's dispatch; `carries_numpy` tells whether it carries a
    /// numpy array, and is asked only where that decides.
    pub fn delegates(&self, carries_numpy: impl FnOnce() -> bool) -> bool {
        let state = self.state.load(Ordering::Relaxed);
        if state == 0 {
            return false;
        }
        if state > RECHECK {
            self.state.store(0, Ordering::Relaxed);
            return false;
        }
        self.state.store(state + 1, Ordering::Relaxed);
        self.every_call.load(Ordering::Relaxed) || carries_numpy()
    }

    /// Records a hit of fastpjit's that took `inputs` (`can_delegate`: whether this function
    /// has JAX's dispatch to hand calls to, and its executable takes them as JAX's would).
    pub fn after_hit(&self, can_delegate: bool, inputs: HitInputs, jax_copies_for_less: bool) {
        // Stored only where they change: the hits of many threads read them.
        let favour = can_delegate && inputs.favour_jax(jax_copies_for_less);
        let every_call = favour && inputs.placed == 0;
        if self.every_call.load(Ordering::Relaxed) != every_call {
            self.every_call.store(every_call, Ordering::Relaxed);
        }
        let state = u32::from(favour);
        if self.state.load(Ordering::Relaxed) != state {
            self.state.store(state, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NUMPY_BATCH: HitInputs = HitInputs {
        placed: 2,
        copied: 0,
        passed: 3,
    };
    const NEW_COPIES: HitInputs = HitInputs {
        placed: 0,
        copied: 1,
        passed: 2,
    };
    const CARRIES_NUMPY: fn() -> bool = || true;

    #[test]
    fn calls_stay_with_fastpjit_until_a_hit_favours_jax() {
        let delegation = Delegation::default();
        assert!(!delegation.delegates(CARRIES_NUMPY));
        delegation.after_hit(
            true,
            HitInputs {
                placed: 0,
                copied: 0,
                passed: 2,
            },
            false,
        );
        assert!(!delegation.delegates(CARRIES_NUMPY));
        delegation.after_hit(false, NUMPY_BATCH, false);
        assert!(!delegation.delegates(CARRIES_NUMPY));
        delegation.after_hit(true, NUMPY_BATCH, false);
        assert!(delegation.delegates(CARRIES_NUMPY));
    }

    #[test]
    fn every_recheck_th_call_comes_back_to_fastpjit() {
        let delegation = Delegation::default();
        delegation.after_hit(true, NUMPY_BATCH, false);
        let mut ours = 0;
        for _ in 0..10 * RECHECK {
            if !delegation.delegates(CARRIES_NUMPY) {
                ours += 1;
                delegation.after_hit(true, NUMPY_BATCH, false);
            }
        }
        assert_eq!(ours, 10 * RECHECK / (RECHECK + 1));
    }

    #[test]
    fn a_hit_that_places_nothing_ends_the_delegation() {
        let delegation = Delegation::default();
        delegation.after_hit(true, NUMPY_BATCH, false);
        for _ in 0..RECHECK {
            assert!(delegation.delegates(CARRIES_NUMPY));
        }
        assert!(!delegation.delegates(CARRIES_NUMPY));
        delegation.after_hit(
            true,
            HitInputs {
                placed: 0,
                copied: 0,
                passed: 1,
            },
            false,
        );
        assert!(!delegation.delegates(CARRIES_NUMPY));
    }

    #[test]
    fn many_device_arrays_outweigh_a_placed_one() {
        let one_placed = |passed| HitInputs {
            placed: 1,
            copied: 0,
            passed,
        };
        assert!(one_placed(ARRAYS_PER_PLACED).favour_jax(false));
        assert!(!one_placed(ARRAYS_PER_PLACED + 1).favour_jax(false));
        assert!(!HitInputs::default().favour_jax(true));
    }

    #[test]
    fn new_copies_weigh_as_placed_arrays_only_where_jax_copies_for_less() {
        assert!(NEW_COPIES.favour_jax(true));
        assert!(!NEW_COPIES.favour_jax(false));
        let copies_and_many_arrays = HitInputs {
            passed: ARRAYS_PER_PLACED + 1,
            ..NEW_COPIES
        };
        assert!(!copies_and_many_arrays.favour_jax(true));
        let delegation = Delegation::default();
        delegation.after_hit(true, NEW_COPIES, false);
        assert!(!delegation.delegates(CARRIES_NUMPY));
    }

    #[test]
    fn copies_hand_every_call_to_jax_and_numpy_only_the_calls_that_carry_it() {
        let carries_none = || false;
        let delegation = Delegation::default();
        delegation.after_hit(true, NUMPY_BATCH, true);
        assert!(!delegation.delegates(carries_none));
        assert!(delegation.delegates(CARRIES_NUMPY));
        let delegation = Delegation::default();
        delegation.after_hit(true, NEW_COPIES, true);
        assert!(delegation.delegates(carries_none));
        // A hit that copies nothing new ends it.
        let _ = delegation.delegates(carries_none);
        delegation.after_hit(true, HitInputs::default(), true);
        assert!(!delegation.delegates(carries_none));
    }
}
