//! Global arrays from process-local data, as JAX's `make_array_from_process_local_data` builds
//! them: the global shape that each process's local data implies, and the block of the local
//! data that each of the process's devices holds.
//!
//! In each dimension the local data either is the whole global extent, or holds, one after the
//! other in order of their global start, the distinct slices that the process's devices hold.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use crate::error::python_tuple;
use crate::index_map::IndexMap;

/// Local data whose shape does not fit the sharding.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LocalDataError {
    /// The local data and the global shape differ in rank.
    Rank {
        local: Vec<usize>,
        global: Vec<usize>,
    },
    /// A dimension that is neither the global extent nor the process's share of it.
    Extent {
        dim: usize,
        local: usize,
        process: usize,
        global: Vec<usize>,
    },
}

impl fmt::Display for LocalDataError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Rank { local, global } => write!(
                f,
                "local_data has shape {} and global_shape {}: they must have the same rank",
                python_tuple(local),
                python_tuple(global)
            ),
            Self::Extent {
                dim,
                local,
                process,
                global,
            } => write!(
                f,
                "Invalid host data: each dimension of local_data must be the global extent or \
                 the extent that this process addresses. In dimension {dim}, local_data has \
                 {local} elements; the process addresses {process} and global_shape={}",
                python_tuple(global)
            ),
        }
    }
}

impl std::error::Error for LocalDataError {}

/// Per dimension, how many distinct blocks the processes hold between them (the factor from
/// local to global extent), or `None` where the sharding is not process-uniform: where
/// processes hold different numbers of slices, or sets of slices that overlap without being
/// equal.
///
/// `map` is the sharding's index map over any shape that every split divides (JAX uses
/// `(num_devices,) * ndim`); `process_of_device` gives each device position's process.
pub fn process_block_counts(
    map: &IndexMap,
    process_of_device: &[usize],
    this_process: usize,
) -> Vec<Option<usize>> {
    let fully_addressable = process_of_device.iter().all(|&p| p == this_process);
    if fully_addressable || map.num_tiles() == 1 {
        return vec![Some(1); map.ndim()];
    }
    (0..map.ndim())
        .map(|dim| {
            let mut held: BTreeMap<usize, BTreeSet<usize>> = BTreeMap::new();
            for (&process, &tile) in process_of_device.iter().zip(map.tile_of_device()) {
                let coord = map
                    .tile_coords(tile)
                    .nth(dim)
                    .expect("dim is below the rank");
                held.entry(process).or_default().insert(coord);
            }
            let per_process = held.get(&this_process).map_or(0, BTreeSet::len);
            if held.values().any(|slices| slices.len() != per_process) {
                return None;
            }
            let distinct: BTreeSet<&BTreeSet<usize>> = held.values().collect();
            let all: BTreeSet<usize> = held.values().flatten().copied().collect();
            (distinct.iter().map(|s| s.len()).sum::<usize>() == all.len()).then_some(distinct.len())
        })
        .collect()
}

/// The `[start, stop)` block of the local data (of `local_shape`) that holds each tile in
/// `tiles` (those of the process's devices, one per device), in that order; `map` is the index
/// map over the global shape.
pub fn local_blocks(
    map: &IndexMap,
    tiles: &[usize],
    local_shape: &[usize],
) -> Result<Vec<Vec<(usize, usize)>>, LocalDataError> {
    let global = map.shape();
    if local_shape.len() != global.len() {
        return Err(LocalDataError::Rank {
            local: local_shape.to_vec(),
            global: global.to_vec(),
        });
    }
    let bounds: Vec<Vec<(usize, usize)>> = tiles
        .iter()
        .map(|&tile| map.tile_bounds(tile).collect())
        .collect();
    // Per dimension, the sorted distinct starts that this process's devices hold, or None where
    // the local data spans the global extent.
    let mut starts: Vec<Option<Vec<usize>>> = Vec::with_capacity(global.len());
    for (dim, (&local, &extent)) in local_shape.iter().zip(global).enumerate() {
        if local == extent {
            starts.push(None);
            continue;
        }
        let distinct: BTreeSet<usize> = bounds.iter().map(|b| b[dim].0).collect();
        let process = map.shard_shape()[dim] * distinct.len();
        if process != local {
            return Err(LocalDataError::Extent {
                dim,
                local,
                process,
                global: global.to_vec(),
            });
        }
        starts.push(Some(distinct.into_iter().collect()));
    }
    Ok(bounds
        .into_iter()
        .map(|device| {
            device
                .into_iter()
                .zip(&starts)
                .zip(map.shard_shape())
                .map(|((global_bounds, starts), &size)| match starts {
                    None => global_bounds,
                    Some(starts) => {
                        let rank = starts.partition_point(|&s| s < global_bounds.0);
                        (rank * size, (rank + 1) * size)
                    }
                })
                .collect()
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mesh::{MeshAxes, NamedSpec};

    fn map(mesh: &[(&str, usize)], spec: &[&[&str]], shape: &[usize]) -> IndexMap {
        let axes = MeshAxes::new(
            mesh.iter().map(|(n, _)| (*n).to_owned()).collect(),
            mesh.iter().map(|(_, s)| *s).collect(),
        )
        .unwrap();
        let spec = NamedSpec::new(
            spec.iter()
                .map(|dim| dim.iter().map(|a| (*a).to_owned()).collect())
                .collect(),
        );
        let layout = spec.to_layout(&axes, shape.len(), None).unwrap();
        IndexMap::new(&layout, shape, axes.num_devices()).unwrap()
    }

    fn tiles(map: &IndexMap, devices: &[usize]) -> Vec<usize> {
        devices.iter().map(|&d| map.tile_of_device()[d]).collect()
    }

    /// Devices 0-3 in process 0, 4-7 in process 1: the first mesh axis splits the processes.
    const TWO_PROCESSES: [usize; 8] = [0, 0, 0, 0, 1, 1, 1, 1];

    #[test]
    fn a_split_across_processes_multiplies_the_local_extent() {
        let universal = map(&[("x", 2), ("y", 4)], &[&["x"], &["y"]], &[8, 8]);
        assert_eq!(
            process_block_counts(&universal, &TWO_PROCESSES, 1),
            vec![Some(2), Some(1)]
        );
        let flat = map(&[("x", 2), ("y", 4)], &[&["x", "y"]], &[8]);
        assert_eq!(
            process_block_counts(&flat, &TWO_PROCESSES, 0),
            vec![Some(2)]
        );
        let within = map(&[("x", 2), ("y", 4)], &[&[], &["y"]], &[8, 8]);
        assert_eq!(
            process_block_counts(&within, &TWO_PROCESSES, 0),
            vec![Some(1), Some(1)]
        );
    }

    #[test]
    fn replicated_or_local_shardings_keep_the_local_shape() {
        let replicated = map(&[("x", 2), ("y", 4)], &[], &[8, 8]);
        assert_eq!(
            process_block_counts(&replicated, &TWO_PROCESSES, 0),
            vec![Some(1), Some(1)]
        );
        let sharded = map(&[("x", 2), ("y", 4)], &[&["x"]], &[8]);
        assert_eq!(process_block_counts(&sharded, &[0; 8], 0), vec![Some(1)]);
    }

    #[test]
    fn overlapping_process_slices_are_not_uniform() {
        // Processes own devices {0, 1, 2, 5} and {3, 4, 6, 7} of a 2x4 mesh. Both hold both
        // rows (one block of rows, each whole); along y, process 0 holds columns {0, 1, 2} and
        // process 1 {0, 2, 3}, which overlap unequally.
        let sharding = map(&[("x", 2), ("y", 4)], &[&["x"], &["y"]], &[8, 8]);
        let processes = [0, 0, 0, 1, 1, 0, 1, 1];
        assert_eq!(
            process_block_counts(&sharding, &processes, 0),
            vec![Some(1), None]
        );
    }

    #[test]
    fn local_blocks_of_a_process_share_of_rows() {
        let global = map(&[("x", 2), ("y", 4)], &[&["x"], &["y"]], &[4, 8]);
        // Process 1 holds rows 2..4 and every column: its local data is (2, 8).
        let blocks = local_blocks(&global, &tiles(&global, &[4, 5, 6, 7]), &[2, 8]).unwrap();
        assert_eq!(
            blocks,
            vec![
                vec![(0, 2), (0, 2)],
                vec![(0, 2), (2, 4)],
                vec![(0, 2), (4, 6)],
                vec![(0, 2), (6, 8)],
            ]
        );
    }

    #[test]
    fn a_dimension_given_whole_is_indexed_globally() {
        // Every process passes all 4 rows (global extent) of an array split over processes.
        let global = map(&[("x", 2), ("y", 4)], &[&["x"], &["y"]], &[4, 8]);
        let blocks = local_blocks(&global, &tiles(&global, &[4, 7]), &[4, 8]).unwrap();
        assert_eq!(blocks, vec![vec![(2, 4), (0, 2)], vec![(2, 4), (6, 8)]]);
    }

    #[test]
    fn interleaved_slices_are_packed_in_global_order() {
        // Devices in mesh order 0, 4, 1, 5, ...: process 0 holds rows 0, 2, 4, 6 of 8.
        let global = map(&[("x", 8)], &[&["x"]], &[8]);
        let addressable = [0, 2, 4, 6];
        let blocks = local_blocks(&global, &tiles(&global, &addressable), &[4]).unwrap();
        assert_eq!(
            blocks,
            vec![vec![(0, 1)], vec![(1, 2)], vec![(2, 3)], vec![(3, 4)]]
        );
        let processes = [0, 1, 0, 1, 0, 1, 0, 1];
        let universal = map(&[("x", 8)], &[&["x"]], &[8]);
        assert_eq!(
            process_block_counts(&universal, &processes, 1),
            vec![Some(2)]
        );
    }

    #[test]
    fn a_local_extent_that_fits_neither_is_an_error() {
        let global = map(&[("x", 2), ("y", 4)], &[&["x"], &["y"]], &[4, 8]);
        let err = local_blocks(&global, &tiles(&global, &[0, 1, 2, 3]), &[3, 8]).unwrap_err();
        assert_eq!(
            err,
            LocalDataError::Extent {
                dim: 0,
                local: 3,
                process: 2,
                global: vec![4, 8]
            }
        );
        assert!(err
            .to_string()
            .contains("In dimension 0, local_data has 3 elements"));
        let err = local_blocks(&global, &tiles(&global, &[0]), &[2]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "local_data has shape (2,) and global_shape (4, 8): they must have the same rank"
        );
    }
}
