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

use std::sync::atomic::{AtomicU32, Ordering};

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
    /// Device arrays passed as they are.
    pub passed: usize,
}

impl HitInputs {
    /// Whether JAX's dispatch would serve such calls faster.
    pub fn favour_jax(self) -> bool {
        self.placed > 0 && self.passed <= ARRAYS_PER_PLACED * self.placed
    }
}

/// One function's choice, shared by the threads that call it: 0 while fastpjit serves the
/// calls, else how many calls in a row have gone to JAX, plus one.
#[derive(Debug, Default)]
pub struct Delegation {
    state: AtomicU32,
}

impl Delegation {
    /// Whether this call goes to JAX's dispatch.
    pub fn delegates(&self) -> bool {
        let state = self.state.load(Ordering::Relaxed);
        if state == 0 {
            return false;
        }
        if state > RECHECK {
            self.state.store(0, Ordering::Relaxed);
            return false;
        }
        self.state.store(state + 1, Ordering::Relaxed);
        true
    }

    /// Records a hit of fastpjit's that took `inputs` (`can_delegate`: whether this function
    /// has JAX's dispatch to hand calls to, and its executable takes them as JAX's would).
    pub fn after_hit(&self, can_delegate: bool, inputs: HitInputs) {
        let state = u32::from(can_delegate && inputs.favour_jax());
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
        passed: 3,
    };

    #[test]
    fn calls_stay_with_fastpjit_until_a_hit_favours_jax() {
        let delegation = Delegation::default();
        assert!(!delegation.delegates());
        delegation.after_hit(
            true,
            HitInputs {
                placed: 0,
                passed: 2,
            },
        );
        assert!(!delegation.delegates());
        delegation.after_hit(false, NUMPY_BATCH);
        assert!(!delegation.delegates());
        delegation.after_hit(true, NUMPY_BATCH);
        assert!(delegation.delegates());
    }

    #[test]
    fn every_recheck_th_call_comes_back_to_fastpjit() {
        let delegation = Delegation::default();
        delegation.after_hit(true, NUMPY_BATCH);
        let mut ours = 0;
        for _ in 0..10 * RECHECK {
            if !delegation.delegates() {
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
            assert!(delegation.delegates());
        }
        assert!(!delegation.delegates());
        delegation.after_hit(
            true,
            HitInputs {
                placed: 0,
                passed: 1,
            },
        );
        assert!(!delegation.delegates());
    }

    #[test]
    fn many_device_arrays_outweigh_a_placed_one() {
        assert!(HitInputs {
            placed: 1,
            passed: ARRAYS_PER_PLACED
        }
        .favour_jax());
        assert!(!HitInputs {
            placed: 1,
            passed: ARRAYS_PER_PLACED + 1
        }
        .favour_jax());
        assert!(!HitInputs::default().favour_jax());
    }
}
