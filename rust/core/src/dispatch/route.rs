//! Where a call goes, decided once: to a cached executable (a hit, and where it was found), to
//! a cache miss, to jax.jit's own dispatch, or to JAX with a [`Fallback`]. A call acts on the
//! route, `explain`'s probe reports it, and a bound call takes its own path or this one.
//!
//! The bindings read the call (its trace context, its tree and leaves, its cache entry); the
//! steps here decide over what they read.

use crate::delegation::Handover;
use crate::dispatch::MissState;
use crate::fallback::{Fallback, Whole};

/// Where a hit's cache entry was found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Found {
    /// Among the latest calls' entries, compared without hashing.
    Recent,
    /// By the signature's hash.
    Keyed,
}

impl Found {
    pub const fn name(self) -> &'static str {
        match self {
            Self::Recent => "recent",
            Self::Keyed => "keyed",
        }
    }
}

/// Where a call goes; `E` is a cache entry.
#[derive(Debug, PartialEq, Eq)]
pub enum Route<E> {
    /// Run the entry's executable.
    Hit(E, Found),
    /// Run the cache miss of the signature of this hash.
    Miss(u64),
    /// Another thread runs the miss of this entry: wait for it, then look again.
    Wait(E),
    /// jax.jit's own C++ dispatch takes the call, unread.
    Delegate(Handover),
    /// JAX runs the call, and why.
    Jax(Fallback),
}

/// Why a call has no signature; JAX's own path runs it (or raises its error).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unkeyable {
    /// A leaf that is not a value the dispatcher keys (a tracer, an ndarray subclass, ...).
    Leaf,
    /// A static argument without a hash.
    UnhashableStatic,
    /// Containers nested deeper than the dispatcher reads (`MAX_TREE_DEPTH`).
    Deep,
}

impl Unkeyable {
    pub const fn fallback(self) -> Fallback {
        Fallback::Whole(match self {
            Self::Leaf => Whole::NotAnArray,
            Self::UnhashableStatic => Whole::UnhashableStatic,
            Self::Deep => Whole::DeepNesting,
        })
    }
}

/// What a found entry holds: its executable, JAX's path with its fallback, or nothing yet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    Run,
    Jax(Fallback),
    Pending(MissState),
}

/// The route of a call whose entry was found (`found`), given what the entry holds; None
/// where its miss has since ended, so the entry is read again.
pub fn of_entry<E>(entry: E, found: Found, outcome: Outcome) -> Option<Route<E>> {
    Some(match outcome {
        Outcome::Run => Route::Hit(entry, found),
        Outcome::Jax(fallback) => Route::Jax(fallback),
        Outcome::Pending(MissState::Done) => return None,
        Outcome::Pending(MissState::Elsewhere) => Route::Wait(entry),
        // A call of the function made while its own miss runs (from a callback, say).
        Outcome::Pending(MissState::OwnMiss) => Route::Jax(Fallback::Whole(Whole::OwnMiss)),
    })
}

/// Whether the calls that JAX runs for `fallback` (outside traces) count toward handing the
/// function's calls to JAX's dispatch unread (see `Delegation::after_unkeyable`).
pub const fn counts_as_unkeyable(fallback: Fallback) -> bool {
    matches!(
        fallback,
        Fallback::Whole(Whole::NotAnArray | Whole::DeepNesting)
    )
}

/// Whether positional argument `i` of `num_args` is static under `argnums`, which count from
/// the end where negative, as JAX's do.
pub fn is_static_position(argnums: &[isize], i: usize, num_args: usize) -> bool {
    let (Ok(i), Ok(n)) = (isize::try_from(i), isize::try_from(num_args)) else {
        return false;
    };
    argnums.iter().any(|&k| k == i || k == i - n)
}

/// jax.jit's own function for a jit function, made or to be made: it costs tens of µs to make,
/// so it is made when the function hands a call to JAX for the `MAKE_AFTER`-th time, and a new
/// wrapper called once (`jit(f)(x)` in a loop) makes none. `H` is a Python callable.
#[derive(Debug)]
pub enum JaxDispatch<H> {
    None,
    Made(H),
    Maker { make: H, asked: u32 },
}

/// How many handovers make jax.jit's function.
pub const MAKE_AFTER: u32 = 2;

/// What a handover does with a function's `JaxDispatch`.
#[derive(Debug, PartialEq, Eq)]
pub enum Ask<H> {
    /// The function has no JAX dispatch.
    NoDispatch,
    /// Not yet made: fastpjit's path takes this call.
    NotYet,
    /// Call this one.
    Use(H),
    /// Make it with this maker (outside any lock), then `made` it.
    Make(H),
}

impl<H> JaxDispatch<H> {
    /// A function's JAX dispatch: made, to be made by `make`, or none.
    pub fn new(jitted: Option<H>, maker: Option<H>) -> Self {
        match (jitted, maker) {
            (Some(jitted), _) => Self::Made(jitted),
            (None, Some(make)) => Self::Maker { make, asked: 0 },
            (None, None) => Self::None,
        }
    }

    /// A handover asks for the function; `clone` copies a handle.
    pub fn ask(&mut self, clone: impl Fn(&H) -> H) -> Ask<H> {
        match self {
            Self::None => Ask::NoDispatch,
            Self::Made(made) => Ask::Use(clone(made)),
            Self::Maker { asked, .. } if *asked + 1 < MAKE_AFTER => {
                *asked += 1;
                Ask::NotYet
            }
            Self::Maker { make, .. } => Ask::Make(clone(make)),
        }
    }

    /// The function that `ask`'s maker made.
    pub fn made(&mut self, made: H) {
        *self = Self::Made(made);
    }

    pub fn is_none(&self) -> bool {
        matches!(self, Self::None)
    }

    /// The function, where it is made.
    pub fn get(&self) -> Option<&H> {
        match self {
            Self::Made(made) => Some(made),
            _ => None,
        }
    }

    /// The handle held: the function or its maker.
    pub fn handle(&self) -> Option<&H> {
        match self {
            Self::None => None,
            Self::Made(handle) | Self::Maker { make: handle, .. } => Some(handle),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_routes_by_what_it_holds() {
        let effects = Fallback::JaxRuns(crate::fallback::Why::Effects);
        assert_eq!(
            of_entry(7, Found::Recent, Outcome::Run),
            Some(Route::Hit(7, Found::Recent))
        );
        assert_eq!(
            of_entry(7, Found::Keyed, Outcome::Jax(effects)),
            Some(Route::Jax(effects))
        );
        assert_eq!(
            of_entry(7, Found::Keyed, Outcome::Pending(MissState::Elsewhere)),
            Some(Route::Wait(7))
        );
        assert_eq!(
            of_entry(7, Found::Keyed, Outcome::Pending(MissState::OwnMiss)),
            Some(Route::Jax(Fallback::Whole(Whole::OwnMiss)))
        );
        assert_eq!(
            of_entry(7, Found::Keyed, Outcome::Pending(MissState::Done)),
            None
        );
    }

    #[test]
    fn unkeyable_calls_have_their_fallbacks_and_two_hand_calls_over() {
        let all = [
            Unkeyable::Leaf,
            Unkeyable::UnhashableStatic,
            Unkeyable::Deep,
        ];
        let handing: Vec<bool> = all
            .iter()
            .map(|why| counts_as_unkeyable(why.fallback()))
            .collect();
        // An unhashable static argument raises JAX's error: no stream of calls to hand over.
        assert_eq!(handing, [true, false, true]);
        assert_eq!(Unkeyable::Deep.fallback().code(), "deep_nesting");
    }

    #[test]
    fn static_positions_count_from_either_end() {
        assert!(is_static_position(&[1], 1, 3));
        assert!(is_static_position(&[-1], 2, 3));
        assert!(!is_static_position(&[-1], 1, 3));
        // An argnum past the call's arguments names none of them.
        assert!((0..2).all(|i| !is_static_position(&[5, -5], i, 2)));
    }

    #[test]
    fn jax_dispatch_is_made_at_the_second_ask_and_used_after() {
        let mut dispatch = JaxDispatch::new(None, Some("make"));
        assert_eq!(dispatch.ask(|h| *h), Ask::NotYet);
        assert_eq!(dispatch.ask(|h| *h), Ask::Make("make"));
        dispatch.made("jitted");
        assert_eq!(dispatch.ask(|h| *h), Ask::Use("jitted"));
        assert_eq!(dispatch.get(), Some(&"jitted"));
        let mut none: JaxDispatch<&str> = JaxDispatch::new(None, None);
        assert_eq!(none.ask(|h| *h), Ask::NoDispatch);
        assert!(none.is_none() && none.handle().is_none());
        let mut made = JaxDispatch::new(Some("jitted"), Some("make"));
        assert_eq!(made.ask(|h| *h), Ask::Use("jitted"));
    }
}
