//! Why a call, or part of one, took a slower correct path than fastpjit's own: one enum with
//! stable codes, which `fastpjit.stats()`, `explain`, the `run` summary, `docs/fallbacks.md`
//! and the tests all name. Python passes codes and reads texts; it never writes reasons.

use std::fmt;

/// Defines an enum of fieldless variants with a stable code and a text each.
macro_rules! coded {
    ($(#[$meta:meta])* $name:ident { $($(#[$vmeta:meta])* $variant:ident = $code:literal, $text:literal;)* }) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub enum $name {
            $($(#[$vmeta])* $variant,)*
        }

        impl $name {
            pub const ALL: &'static [Self] = &[$(Self::$variant,)*];

            pub const fn code(self) -> &'static str {
                match self {
                    $(Self::$variant => $code,)*
                }
            }

            pub const fn text(self) -> &'static str {
                match self {
                    $(Self::$variant => $text,)*
                }
            }

            /// The variant of `code`, if it is one.
            pub fn from_code(code: &str) -> Option<Self> {
                Self::ALL.iter().copied().find(|it| it.code() == code)
            }

            const fn index(self) -> usize {
                self as usize
            }
        }
    };
}

coded! {
    /// Why JAX compiled a cache miss's program, or runs its calls, rather than fastpjit.
    Why {
        DisableJit = "disable_jit", "jax.disable_jit is on";
        UnderTrace = "under_trace", "under a JAX trace";
        DebugChecks = "debug_checks", "key reuse checks or profile-guided optimization are on";
        Effects = "effects", "the function has effects or mutable state";
        HostCallbacks = "host_callbacks", "the computation calls back to the host";
        Layouts = "layouts", "layouts are set";
        MutableOrSymbolic = "mutable_or_symbolic", "mutable arrays or symbolic shapes";
        ExtendedDtypes = "extended_dtypes", "tokens or extended dtypes (PRNG keys)";
        Unconstrained = "unconstrained_shardings", "unconstrained shardings";
        ExecutableEffects = "executable_effects", "the executable has effects or callbacks";
        NotArrayOutputs = "not_array_outputs", "mutable state, or outputs that are not arrays";
        NoFastPath = "no_fast_path",
            "JAX's own dispatch keeps it off its fast path (outputs that are not arrays, \
             effects or layouts)";
        PmapArgumentMoved = "pmap_argument_moved",
            "a pmap across processes got an array off its local sharding, which JAX moves";
        PmapArgumentConverted = "pmap_argument_converted",
            "a pmap across processes got an argument that JAX converts";
        PmapOutputMoved = "pmap_output_moved",
            "a pmap across processes has an output that JAX moves";
    }
}

coded! {
    /// A call, or a transfer, that JAX runs whole, or a part of a call that JAX does.
    Whole {
        DisableJit = "disable_jit", "jax.disable_jit is on; JAX runs the call";
        NotAnArray = "not_an_array", "an argument is a tracer or not an array; JAX runs the call";
        UnhashableStatic = "unhashable_static",
            "a static argument has no hash; JAX raises its error";
        IntOverflow = "int_overflow",
            "a Python int too large for its dtype; JAX raises its error";
        OwnMiss = "own_miss", "a call made while its own cache miss runs; JAX runs it";
        DeepNesting = "deep_nesting",
            "an argument nests containers deeper than 100 levels; JAX runs the call";
        MovedArgument = "moved_argument", "an argument moved to the executable's sharding by JAX";
        Delegated = "delegated",
            "new numpy arrays or arrays on other devices, which JAX's C++ dispatch places for \
             less than jaxlib's Python API allows: JAX runs the call";
        HandedOver = "handed_over",
            "the latest calls had an argument that is not an array (or nested too deep), so \
             JAX's dispatch takes the calls, unread, until a recheck";
        PutOptions = "device_put.options", "device_put: src, donate or may_alias given";
        PutTarget = "device_put.target",
            "device_put: a target that is neither a Sharding nor a Device (None, a \
             PartitionSpec, a pytree of targets, a layout), which JAX resolves";
        PutUnreduced = "device_put.unreduced", "device_put: unreduced target sharding";
        PutUnderTrace = "device_put.under_trace", "device_put: under a JAX trace";
        PutMovedArray = "device_put.moved_array", "device_put: jax.Array moved by JAX";
        PutFloat0 = "device_put.float0", "device_put: float0 leaf placed by JAX";
        GetGuarded = "device_get.guarded", "device_get: a transfer guard is set; JAX applies it";
        GetUnderTrace = "device_get.under_trace", "device_get: under a JAX trace";
        GetOtherArray = "device_get.other_array",
            "device_get: a jax.Array other than jaxlib's fetched by JAX";
        GetKeyOrString = "device_get.key_or_string",
            "device_get: a key or string array fetched by JAX";
        LocalSpecOrTrees = "process_local.spec_or_trees",
            "make_array_from_process_local_data: a PartitionSpec, or pytrees of shardings or \
             global shapes";
        LocalNotNumpy = "process_local.not_numpy",
            "make_array_from_process_local_data: a leaf that is not a numpy array";
    }
}

/// Why a call, or part of one, took JAX's path: a code, and a text that says it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Fallback {
    /// JAX runs the call, or does part of it.
    Whole(Whole),
    /// A cache miss whose calls JAX runs (there is no fast path), and why.
    JaxRuns(Why),
    /// A cache miss whose program JAX compiled (fastpjit dispatches its hits), and why.
    JaxCompiled(Why),
}

impl Fallback {
    pub const DISABLE_JIT: Self = Self::Whole(Whole::DisableJit);
    pub const NOT_AN_ARRAY: Self = Self::Whole(Whole::NotAnArray);
    pub const DELEGATED: Self = Self::Whole(Whole::Delegated);
    pub const HANDED_OVER: Self = Self::Whole(Whole::HandedOver);

    /// How many fallbacks there are: their indices are below.
    pub const COUNT: usize = Whole::ALL.len() + 2 * Why::ALL.len();

    /// Every fallback, in index order.
    pub fn all() -> impl Iterator<Item = Self> {
        let whole = Whole::ALL.iter().copied().map(Self::Whole);
        let runs = Why::ALL.iter().copied().map(Self::JaxRuns);
        let compiled = Why::ALL.iter().copied().map(Self::JaxCompiled);
        whole.chain(runs).chain(compiled)
    }

    /// A dense index below `COUNT`, for a counter each.
    pub const fn index(self) -> usize {
        match self {
            Self::Whole(whole) => whole.index(),
            Self::JaxRuns(why) => Whole::ALL.len() + why.index(),
            Self::JaxCompiled(why) => Whole::ALL.len() + Why::ALL.len() + why.index(),
        }
    }

    /// The fallback of index `index`.
    pub fn from_index(index: usize) -> Option<Self> {
        Self::all().nth(index)
    }

    /// The stable code: `not_an_array`, `jax_runs.effects`, `device_put.float0`, ...
    pub fn code(self) -> String {
        match self {
            Self::Whole(whole) => whole.code().to_owned(),
            Self::JaxRuns(why) => format!("jax_runs.{}", why.code()),
            Self::JaxCompiled(why) => format!("jax_compiled.{}", why.code()),
        }
    }

    /// The fallback of `code`, if it is one.
    pub fn from_code(code: &str) -> Option<Self> {
        if let Some(why) = code.strip_prefix("jax_runs.") {
            return Why::from_code(why).map(Self::JaxRuns);
        }
        if let Some(why) = code.strip_prefix("jax_compiled.") {
            return Why::from_code(why).map(Self::JaxCompiled);
        }
        Whole::from_code(code).map(Self::Whole)
    }
}

impl From<crate::delegation::Handover> for Fallback {
    /// The fallback of a call handed to jax.jit's dispatch.
    fn from(why: crate::delegation::Handover) -> Self {
        match why {
            crate::delegation::Handover::Placements => Self::DELEGATED,
            crate::delegation::Handover::Unkeyable => Self::HANDED_OVER,
        }
    }
}

impl fmt::Display for Fallback {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Whole(whole) => f.write_str(whole.text()),
            Self::JaxRuns(why) => write!(f, "JAX runs the call: {}", why.text()),
            Self::JaxCompiled(why) => write!(f, "JAX compiled the call: {}", why.text()),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    #[test]
    fn codes_are_distinct_and_name_their_fallback() {
        let codes: BTreeSet<String> = Fallback::all().map(Fallback::code).collect();
        assert_eq!(codes.len(), Fallback::COUNT);
        for fallback in Fallback::all() {
            assert_eq!(Fallback::from_code(&fallback.code()), Some(fallback));
            assert!(
                fallback
                    .code()
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c == '_' || c == '.' || c.is_ascii_digit()),
                "{fallback:?}"
            );
        }
        assert_eq!(Fallback::from_code("jax_runs.nothing"), None);
        assert_eq!(Fallback::from_code("effects"), None);
    }

    #[test]
    fn indices_are_dense_and_round_trip() {
        for (i, fallback) in Fallback::all().enumerate() {
            assert_eq!(fallback.index(), i);
            assert_eq!(Fallback::from_index(i), Some(fallback));
        }
        assert_eq!(Fallback::from_index(Fallback::COUNT), None);
    }

    #[test]
    fn a_miss_says_what_jax_did_and_why() {
        let runs = Fallback::JaxRuns(Why::Effects);
        assert_eq!(runs.code(), "jax_runs.effects");
        assert_eq!(
            runs.to_string(),
            "JAX runs the call: the function has effects or mutable state"
        );
        let compiled = Fallback::JaxCompiled(Why::ExtendedDtypes);
        assert_eq!(
            compiled.to_string(),
            "JAX compiled the call: tokens or extended dtypes (PRNG keys)"
        );
    }

    #[test]
    fn the_nesting_text_names_the_limit() {
        assert!(Whole::DeepNesting
            .text()
            .contains(&crate::dispatch::MAX_TREE_DEPTH.to_string()));
    }
}
