//! When a function's calls go to JAX's own C++ dispatch instead of fastpjit's.
//!
//! jaxlib 0.10.2 gives a Python caller one way to put host memory on a device,
//! `batched_device_put`, which builds a Python `jax.Array` on the way; jax.jit's C++ dispatch
//! puts a call's numpy arguments without one, and so takes less time per placed array than any
//! caller of the Python API can. A function whose calls keep placing new numpy arrays, and
//! pass few device arrays (which fastpjit reads for less than JAX does), is faster through
//! JAX's dispatch: after such a hit of fastpjit's, the next calls that carry numpy arrays go
//! to JAX, and every `RECHECK`-th call comes back to fastpjit's path to see whether the calls
//! still place them.
//!
//! The same holds for arrays that a call passes on other devices than the executable's: JAX's
//! dispatch copies them without a Python array, where jaxlib's `batched_copy` builds one (a
//! jit on device 1 given a new array on device 0 on every call took 1.3–1.5× JAX's time on
//! 0.10.2, measured on 2 cores, and 70,300 instructions against JAX's 59,500 on the calling
//! thread on 0.12.0.1). An array passed again takes the copy kept from
//! its previous call, for less than JAX pays; so only a run of `COPYING_HITS` hits that copied
//! new arrays hands the calls to JAX (a hit that copies an array passed again, to keep the
//! copy, neither adds to the run nor ends it), and then every call goes there until the
//! recheck.
//!
//! Calls that fastpjit cannot key (an argument that is not an array: an ndarray subclass, an
//! object with `__jax_array__`) go to JAX anyway, after fastpjit has read their arguments up
//! to that one: 8,700 more instructions than JAX's call with two arguments, 92,000 with a
//! hundred (`benches/instructions.py subclass`). After `UNKEYABLE_CALLS` such calls in a row,
//! every call goes to JAX's dispatch unread until the recheck.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

/// Every how many calls a delegating function takes fastpjit's path again.
pub const RECHECK: u32 = 256;
/// How many device arrays, passed as they are, one placed numpy array pays for: fastpjit reads
/// an array leaf for about 0.4 µs less than JAX does, and JAX places a small numpy array for
/// about 1.6 µs less than `batched_device_put` does.
pub const ARRAYS_PER_PLACED: usize = 4;
/// How many hits that copied new arrays to the executable's devices (and favour JAX's
/// dispatch) it takes to hand the calls to JAX, each time.
pub const COPYING_HITS: u32 = 3;
/// How many calls in a row that fastpjit could not key hand the calls to JAX.
pub const UNKEYABLE_CALLS: u32 = 3;

/// Why a call goes to JAX's dispatch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Handover {
    /// The latest hits placed or copied new arrays, which JAX does for less.
    Placements,
    /// The latest calls had arguments that fastpjit cannot key.
    Unkeyable,
}

/// What a hit of fastpjit's did with the call's arguments.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct HitInputs {
    /// Numpy arrays placed on the device as new values, not served from kept device copies
    /// and not repeating (see `KeptValues::streaming`).
    pub placed: usize,
    /// Arrays copied to the executable's devices as new ones (not served from a kept copy).
    pub copied: usize,
    /// Arrays passed again, copied once more to keep the copy (see `LatestCopy`).
    pub copied_to_keep: usize,
    /// Device arrays passed as they are.
    pub passed: usize,
}

/// How an array argument came to the executable's devices.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Copied {
    /// The copy kept from the call before, which passed the same array.
    Kept,
    /// Copied now, as a new array.
    New,
    /// Copied now, and kept: the call before passed an array at the same address.
    ToKeep,
}

impl Copied {
    /// How a copy made now counts: kept where the call before passed the array again.
    pub fn now(seen_again: bool) -> Self {
        if seen_again {
            Self::ToKeep
        } else {
            Self::New
        }
    }
}

impl HitInputs {
    /// Records an array argument passed as it is.
    pub fn passed(&mut self) {
        self.passed += 1;
    }

    /// Records an array argument copied to the executable's devices, as `how` says.
    pub fn copied(&mut self, how: Copied) {
        match how {
            Copied::Kept => {}
            Copied::New => self.copied += 1,
            Copied::ToKeep => self.copied_to_keep += 1,
        }
    }

    /// Records a host value placed: a numpy array (not a scalar) placed as one of a stream of
    /// new values counts, as JAX's dispatch would place it for less.
    pub fn placed_host(&mut self, streaming: bool, numpy_array: bool) {
        if streaming && numpy_array {
            self.placed += 1;
        }
    }

    /// Whether JAX's dispatch would serve such calls faster.
    pub fn favour_jax(self) -> bool {
        let new = self.placed + self.copied;
        new > 0 && self.passed <= ARRAYS_PER_PLACED * new
    }
}

/// One function's choice, shared by the threads that call it.
#[derive(Debug, Default)]
pub struct Delegation {
    /// 0 while fastpjit serves the calls, else how many calls in a row have gone to JAX, plus
    /// one, with `EVERY_CALL` set where copies decided it (every call goes, not only those
    /// that carry numpy arrays).
    state: AtomicU32,
    /// The hits that copied new arrays and favoured JAX, since the latest that did neither.
    copying_hits: AtomicU32,
    /// The calls that fastpjit could not key since the latest hit.
    unkeyable_calls: AtomicU32,
    /// Whether no call may go to JAX's dispatch: jax.jit compiles with the function's own
    /// compile options, and this function compiles some signatures with others.
    forbidden: AtomicBool,
}

/// The bit of `Delegation::state` that hands every call to JAX.
const EVERY_CALL: u32 = 1 << 31;
/// The bit of `Delegation::state` set where unkeyable calls decided it.
const UNKEYABLE: u32 = 1 << 30;

impl Delegation {
    /// Whether this call goes to JAX's dispatch, and why; `carries_numpy` tells whether it
    /// carries a numpy array, and is asked only where that decides.
    pub fn delegates(&self, carries_numpy: impl FnOnce() -> bool) -> Option<Handover> {
        let state = self.state.load(Ordering::Relaxed);
        if state == 0 {
            return None;
        }
        if self.forbidden.load(Ordering::Relaxed) {
            // A hit that began before `forbid` may have handed the calls over.
            self.state.store(0, Ordering::Relaxed);
            return None;
        }
        if state & !(EVERY_CALL | UNKEYABLE) > RECHECK {
            self.state.store(0, Ordering::Relaxed);
            return None;
        }
        self.state.store(state + 1, Ordering::Relaxed);
        if state & UNKEYABLE != 0 {
            Some(Handover::Unkeyable)
        } else {
            (state & EVERY_CALL != 0 || carries_numpy()).then_some(Handover::Placements)
        }
    }

    /// From now on, no call goes to JAX's dispatch.
    pub fn forbid(&self) {
        self.forbidden.store(true, Ordering::Relaxed);
        self.state.store(0, Ordering::Relaxed);
    }

    /// Records a call that fastpjit could not key, which went to JAX (outside any trace).
    pub fn after_unkeyable(&self) {
        if self.forbidden.load(Ordering::Relaxed) {
            return;
        }
        if self.unkeyable_calls.fetch_add(1, Ordering::Relaxed) + 1 >= UNKEYABLE_CALLS {
            self.unkeyable_calls.store(0, Ordering::Relaxed);
            self.state
                .store(EVERY_CALL | UNKEYABLE | 1, Ordering::Relaxed);
        }
    }

    /// Records a hit of fastpjit's that took `inputs` (`can_delegate`: whether this function
    /// has JAX's dispatch to hand calls to, and its executable takes them as JAX's would).
    pub fn after_hit(&self, can_delegate: bool, inputs: HitInputs) {
        if self.forbidden.load(Ordering::Relaxed) {
            return;
        }
        if self.unkeyable_calls.load(Ordering::Relaxed) != 0 {
            self.unkeyable_calls.store(0, Ordering::Relaxed);
        }
        let favour = can_delegate && inputs.favour_jax();
        let state = if favour && inputs.placed > 0 {
            1
        } else if favour {
            if self.copying_hits.fetch_add(1, Ordering::Relaxed) + 1 < COPYING_HITS {
                return;
            }
            EVERY_CALL | 1
        } else if inputs.copied_to_keep > 0 && inputs.placed == 0 && inputs.copied == 0 {
            return;
        } else {
            0
        };
        // A run hands the calls over once: after the recheck, a new run must be seen (an
        // array passed again is copied twice before its kept copy serves). Stored only where
        // they change: the hits of many threads read them.
        if self.copying_hits.load(Ordering::Relaxed) != 0 {
            self.copying_hits.store(0, Ordering::Relaxed);
        }
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
        copied_to_keep: 0,
        passed: 3,
    };
    const NEW_COPIES: HitInputs = HitInputs {
        placed: 0,
        copied: 1,
        copied_to_keep: 0,
        passed: 2,
    };
    const COPIES_TO_KEEP: HitInputs = HitInputs {
        placed: 0,
        copied: 0,
        copied_to_keep: 1,
        passed: 2,
    };
    const CARRIES_NUMPY: fn() -> bool = || true;

    #[test]
    fn calls_stay_with_fastpjit_until_a_hit_favours_jax() {
        let delegation = Delegation::default();
        assert!(delegation.delegates(CARRIES_NUMPY).is_none());
        delegation.after_hit(
            true,
            HitInputs {
                placed: 0,
                copied: 0,
                copied_to_keep: 0,
                passed: 2,
            },
        );
        assert!(delegation.delegates(CARRIES_NUMPY).is_none());
        delegation.after_hit(false, NUMPY_BATCH);
        assert!(delegation.delegates(CARRIES_NUMPY).is_none());
        delegation.after_hit(true, NUMPY_BATCH);
        assert!(delegation.delegates(CARRIES_NUMPY).is_some());
    }

    #[test]
    fn a_forbidden_delegation_hands_over_no_call() {
        let delegation = Delegation::default();
        delegation.after_hit(true, NUMPY_BATCH);
        assert!(delegation.delegates(CARRIES_NUMPY).is_some());
        delegation.forbid();
        assert!(delegation.delegates(CARRIES_NUMPY).is_none());
        delegation.after_hit(true, NUMPY_BATCH);
        for _ in 0..UNKEYABLE_CALLS {
            delegation.after_unkeyable();
        }
        assert!(delegation.delegates(CARRIES_NUMPY).is_none());
    }

    #[test]
    fn every_recheck_th_call_comes_back_to_fastpjit() {
        let delegation = Delegation::default();
        delegation.after_hit(true, NUMPY_BATCH);
        let mut ours = 0;
        for _ in 0..10 * RECHECK {
            if delegation.delegates(CARRIES_NUMPY).is_none() {
                ours += 1;
                delegation.after_hit(true, NUMPY_BATCH);
            }
        }
        assert_eq!(ours, 10 * RECHECK / (RECHECK + 1));
    }

    #[test]
    fn a_hit_that_places_nothing_ends_the_delegation() {
        let delegation = Delegation::default();
        delegation.after_hit(true, NUMPY_BATCH);
        for _ in 0..RECHECK {
            assert!(delegation.delegates(CARRIES_NUMPY).is_some());
        }
        assert!(delegation.delegates(CARRIES_NUMPY).is_none());
        delegation.after_hit(
            true,
            HitInputs {
                placed: 0,
                copied: 0,
                copied_to_keep: 0,
                passed: 1,
            },
        );
        assert!(delegation.delegates(CARRIES_NUMPY).is_none());
    }

    #[test]
    fn many_device_arrays_outweigh_a_placed_one() {
        let one_placed = |passed| HitInputs {
            placed: 1,
            passed,
            ..HitInputs::default()
        };
        assert!(one_placed(ARRAYS_PER_PLACED).favour_jax());
        assert!(!one_placed(ARRAYS_PER_PLACED + 1).favour_jax());
        assert!(!HitInputs::default().favour_jax());
    }

    #[test]
    fn copies_weigh_as_placed_arrays() {
        assert!(NEW_COPIES.favour_jax());
        let copies_and_many_arrays = HitInputs {
            passed: ARRAYS_PER_PLACED + 1,
            ..NEW_COPIES
        };
        assert!(!copies_and_many_arrays.favour_jax());
    }

    /// The delegation after `hits`.
    fn after(hits: &[HitInputs]) -> Delegation {
        let delegation = Delegation::default();
        for &inputs in hits {
            delegation.after_hit(true, inputs);
        }
        delegation
    }

    #[test]
    fn a_run_of_copying_hits_hands_every_call_to_jax() {
        let carries_none = || false;
        let (new, to_keep, none) = (NEW_COPIES, COPIES_TO_KEEP, HitInputs::default());
        // An array passed again is copied once more to keep the copy, which then serves.
        let repeats = [new, to_keep, none, none, new, to_keep, none];
        assert!(after(&repeats).delegates(carries_none).is_none());
        // New arrays at the address of the one before are taken for a repeat, and kept.
        assert!(after(&[new, to_keep, new, to_keep, new])
            .delegates(carries_none)
            .is_some());
        let delegation = after(&[new, new, new]);
        // Until the recheck, after which another run hands them over again.
        for _ in 0..RECHECK {
            assert!(delegation.delegates(carries_none).is_some());
        }
        for _ in 1..COPYING_HITS {
            assert!(delegation.delegates(carries_none).is_none());
            delegation.after_hit(true, NEW_COPIES);
        }
        assert!(delegation.delegates(carries_none).is_none());
        delegation.after_hit(true, NEW_COPIES);
        assert!(delegation.delegates(carries_none).is_some());
        // A hit that copies nothing ends a run.
        while delegation.delegates(carries_none).is_some() {}
        delegation.after_hit(true, NEW_COPIES);
        delegation.after_hit(true, HitInputs::default());
        delegation.after_hit(true, NEW_COPIES);
        delegation.after_hit(true, NEW_COPIES);
        assert!(delegation.delegates(carries_none).is_none());
    }

    #[test]
    fn numpy_hands_only_the_calls_that_carry_it_to_jax() {
        let delegation = Delegation::default();
        delegation.after_hit(true, NUMPY_BATCH);
        assert!(delegation.delegates(|| false).is_none());
        assert!(delegation.delegates(CARRIES_NUMPY).is_some());
    }

    #[test]
    fn a_run_of_unkeyable_calls_hands_every_call_to_jax_until_the_recheck() {
        let delegation = Delegation::default();
        for _ in 1..UNKEYABLE_CALLS {
            delegation.after_unkeyable();
            assert_eq!(delegation.delegates(|| false), None);
        }
        // A hit ends a run.
        delegation.after_hit(true, HitInputs::default());
        for _ in 1..UNKEYABLE_CALLS {
            delegation.after_unkeyable();
        }
        assert_eq!(delegation.delegates(|| false), None);
        delegation.after_unkeyable();
        for _ in 0..RECHECK {
            assert_eq!(delegation.delegates(|| false), Some(Handover::Unkeyable));
        }
        assert_eq!(delegation.delegates(|| false), None);
        // Placements hand calls over by their own reason.
        delegation.after_hit(true, NUMPY_BATCH);
        assert_eq!(
            delegation.delegates(CARRIES_NUMPY),
            Some(Handover::Placements)
        );
    }

    #[test]
    fn a_hit_counts_what_it_placed_and_copied_anew() {
        let mut inputs = HitInputs::default();
        inputs.passed();
        inputs.copied(Copied::Kept);
        inputs.copied(Copied::now(false));
        inputs.copied(Copied::now(true));
        inputs.placed_host(true, false);
        inputs.placed_host(false, true);
        inputs.placed_host(true, true);
        let expected = HitInputs {
            placed: 1,
            copied: 1,
            copied_to_keep: 1,
            passed: 1,
        };
        assert_eq!(inputs, expected);
    }
}
