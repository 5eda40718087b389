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
