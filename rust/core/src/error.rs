//! The one error type of the core; the bindings map each variant to the Python exception that
//! JAX raises for the same misuse.

use std::fmt;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ShardingError {
    /// A dimension that the sharding splits into parts that don't divide it (JAX's `IndivisibleError`).
    Indivisible {
        axis: usize,
        partitions: usize,
        size: usize,
        shape: Vec<usize>,
        tiling: Vec<usize>,
    },
    /// A mesh axis used by more than one dimension of a spec (JAX's `DuplicateSpecError`).
    DuplicateAxis { axes: Vec<String> },
    /// A spec names an axis that the mesh lacks.
    UnknownAxis {
        axis: String,
        mesh_axes: Vec<String>,
    },
    /// The sharding describes more dimensions than the array has.
    Rank {
        sharding_rank: usize,
        array_rank: usize,
    },
    /// Text that is not an HLO sharding; `column` is 1-based.
    Parse {
        column: usize,
        expected: String,
        text: String,
    },
    /// A well-formed sharding that has no index map in JAX either (manual subgroups, unreduced,
    /// tuple).
    Unsupported(String),
    /// A sharding that says nothing of where data lies (fully manual, unknown); JAX fails an
    /// assertion on its index maps.
    NoPlacement(String),
    /// Anything else that is inconsistent (device counts, device lists).
    Invalid(String),
}

impl fmt::Display for ShardingError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Indivisible {
                axis,
                partitions,
                size,
                shape,
                tiling,
            } => write!(
                f,
                "array axis {axis} is partitioned {partitions} times, but the dimension size is \
                 {size} (full shape: {}, per-dimension tiling factors: {tiling:?} should evenly \
                 divide the shape)",
                python_tuple(shape)
            ),
            Self::DuplicateAxis { axes } => {
                write!(
                f,
                "a single NamedSharding spec can map every mesh axis to at most one positional \
                 dimension, but it has duplicate entries for {}",
                axes.iter().map(|a| format!("`{a}`")).collect::<Vec<_>>().join(", ")
            )
            }
            Self::UnknownAxis { axis, mesh_axes } => write!(
                f,
                "resource axis {axis} is not found in mesh axes ({})",
                mesh_axes.join(", ")
            ),
            Self::Rank {
                sharding_rank,
                array_rank,
            } => write!(
                f,
                "the sharding partitions {sharding_rank} dimensions, but the array has rank \
                 {array_rank}"
            ),
            Self::Parse {
                column,
                expected,
                text,
            } => write!(
                f,
                "invalid HLO sharding at column {column}: expected {expected} in {text:?}"
            ),
            Self::Unsupported(msg) | Self::NoPlacement(msg) | Self::Invalid(msg) => {
                f.write_str(msg)
            }
        }
    }
}

impl std::error::Error for ShardingError {}

/// Formats items the way Python prints a tuple of them, so messages read like JAX's.
pub fn python_tuple<T: std::fmt::Display>(items: &[T]) -> String {
    match items {
        [one] => format!("({one},)"),
        _ => format!(
            "({})",
            items
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}
/// The dispatcher's refusals of a call or of what a cache miss returned, in the words that JAX
/// uses for the same misuse; `kind` says which Python exception type raises each.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DispatchError {
    /// The function's callables were cleared (by the garbage collector).
    Cleared,
    /// A keyword argument of a bound function's call is bound already.
    BoundKeyword(String),
    /// The cache miss described another number of arguments than the call has.
    MissArity { described: usize, call: usize },
    /// The cache miss's `FastPath` does not hold together.
    FastPath(String),
    /// A fallback code that names no fallback.
    UnknownFallback(String),
    /// The executable's outputs do not make its output tree.
    OutputTree(String),
    /// A static argument's `==` raised (`error`, between objects of these types).
    StaticComparison {
        types: (String, String),
        error: String,
    },
    /// A donated buffer that the call also passes as another argument (as jaxlib says).
    DonationClash(crate::dispatch::DonationClash),
    /// An argument whose buffer an earlier computation consumed; `shape` its aval's short form.
    DonatedArgument { position: usize, shape: String },
}

/// The Python exception type of an error: the one that JAX raises for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    Runtime,
    Type,
    Value,
}

impl DispatchError {
    pub fn kind(&self) -> ErrorKind {
        match self {
            Self::Cleared | Self::MissArity { .. } | Self::OutputTree(_) => ErrorKind::Runtime,
            Self::BoundKeyword(_) => ErrorKind::Type,
            Self::FastPath(_)
            | Self::UnknownFallback(_)
            | Self::StaticComparison { .. }
            | Self::DonationClash(_)
            | Self::DonatedArgument { .. } => ErrorKind::Value,
        }
    }
}

impl fmt::Display for DispatchError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Cleared => f.write_str("this jit function was cleared"),
            Self::BoundKeyword(name) => write!(
                f,
                "got multiple values for keyword argument {name}: it is bound"
            ),
            Self::MissArity { described, call } => write!(
                f,
                "the cache miss described {described} arguments for a call of {call}"
            ),
            Self::FastPath(why) => write!(f, "FastPath: {why}"),
            Self::UnknownFallback(code) => write!(
                f,
                "{code:?} is no fallback code; fastpjit._core.fallback_reasons() lists them"
            ),
            Self::OutputTree(why) => f.write_str(why),
            Self::StaticComparison { types, error } => write!(
                f,
                "static arguments should be comparable using __eq__.The following error was \
                 raised when comparing two objects of types {} and {}. The error was:\n{error}",
                types.0, types.1
            ),
            Self::DonationClash(clash) => {
                let (what, example) = if clash.previously_donated {
                    (
                        "Attempt to use a buffer that was previously donated in the same call \
                         to Execute()",
                        "f(donate(a), a)",
                    )
                } else {
                    (
                        "Attempt to donate a buffer which is also used by the same call to \
                         Execute()",
                        "f(a, donate(a))",
                    )
                };
                write!(
                    f,
                    "INVALID_ARGUMENT: {what} (flattened argument {}, replica 0, partition 0, \
                     first use: {}). Toy example for this bug: `{example}`.",
                    clash.input, clash.first
                )
            }
            Self::DonatedArgument { position, shape } => write!(
                f,
                "Invalid buffer passed as argument {position} (flattened): the array of \
                 shape={shape} was donated to an earlier computation, so its buffer has been \
                 deleted or donated."
            ),
        }
    }
}

impl std::error::Error for DispatchError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dispatch_errors_read_as_jaxs_and_raise_its_types() {
        let clash = DispatchError::DonationClash(crate::dispatch::DonationClash {
            input: 2,
            first: 0,
            previously_donated: false,
        });
        assert_eq!(clash.kind(), ErrorKind::Value);
        assert_eq!(
            clash.to_string(),
            "INVALID_ARGUMENT: Attempt to donate a buffer which is also used by the same call \
             to Execute() (flattened argument 2, replica 0, partition 0, first use: 0). Toy \
             example for this bug: `f(a, donate(a))`."
        );
        let bound = DispatchError::BoundKeyword("w".into());
        assert_eq!(bound.kind(), ErrorKind::Type);
        assert!(bound.to_string().contains("keyword argument w"));
        assert_eq!(DispatchError::Cleared.kind(), ErrorKind::Runtime);
    }
}
