//! Per-device slices of a global array: the answer to JAX's `devices_indices_map`.

use crate::error::ShardingError;
use crate::tile::TileLayout;

/// Which tile of a global array each device position holds.
///
/// Bounds are kept as tile ids rather than slices: devices that hold copies of one tile share
/// an id, so callers build each distinct index once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IndexMap {
    shape: Vec<usize>,
    partitions: Vec<usize>,
    shard_shape: Vec<usize>,
    /// The tile id (row-major over `partitions`) of each device position.
    tile_of_device: Vec<usize>,
}

impl IndexMap {
    /// Computes the map of `layout` over `num_devices` device positions for an array of `shape`.
    pub fn new(
        layout: &TileLayout,
        shape: &[usize],
        num_devices: usize,
    ) -> Result<Self, ShardingError> {
        layout.check(shape.len(), num_devices)?;
        let partitions = layout.partitions(shape.len());
        let shard_shape = shard_shape(shape, &partitions)?;
        let tile_of_device = match layout {
            TileLayout::Replicated => vec![0; num_devices],
            TileLayout::Tiled {
                replicas, order, ..
            } => {
                let mut tiles = vec![usize::MAX; num_devices];
                for (k, position) in order.positions().into_iter().enumerate() {
                    let slot = tiles.get_mut(position).ok_or_else(|| {
                        ShardingError::Invalid(format!(
                            "the sharding names device position {position}, but there are only \
                             {num_devices} devices"
                        ))
                    })?;
                    if *slot != usize::MAX {
                        return Err(ShardingError::Invalid(format!(
                            "device position {position} appears more than once in the sharding"
                        )));
                    }
                    *slot = k / replicas;
                }
                // Every slot is filled: positions are `num_devices` distinct values below it.
                tiles
            }
        };
        Ok(Self {
            shape: shape.to_vec(),
            partitions,
            shard_shape,
            tile_of_device,
        })
    }

    pub fn num_devices(&self) -> usize {
        self.tile_of_device.len()
    }

    pub fn ndim(&self) -> usize {
        self.shape.len()
    }

    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    pub fn shard_shape(&self) -> &[usize] {
        &self.shard_shape
    }

    /// How many ways each dimension is split; a dimension split once is held whole.
    pub fn partitions(&self) -> &[usize] {
        &self.partitions
    }

    /// The number of distinct tiles.
    pub fn num_tiles(&self) -> usize {
        self.partitions.iter().product()
    }

    /// The tile id of each device position; equal ids hold equal data.
    pub fn tile_of_device(&self) -> &[usize] {
        &self.tile_of_device
    }

    /// The `[start, stop)` bounds of tile `tile` in every dimension.
    pub fn tile_bounds(&self, tile: usize) -> impl Iterator<Item = (usize, usize)> + '_ {
        // Tile ids are row-major over `partitions`; walk the divisors from the last axis out.
        let mut divisor = self.num_tiles();
        self.partitions
            .iter()
            .zip(&self.shard_shape)
            .map(move |(&parts, &size)| {
                divisor /= parts;
                let coord = (tile / divisor) % parts;
                (coord * size, (coord + 1) * size)
            })
    }

    /// The `[start, stop)` bounds that device position `device` holds in every dimension.
    pub fn device_bounds(&self, device: usize) -> impl Iterator<Item = (usize, usize)> + '_ {
        self.tile_bounds(self.tile_of_device[device])
    }

    /// Writes `[start, stop]` pairs for every device and dimension into `out`, laid out as a
    /// C-ordered `(num_devices, ndim, 2)` array.
    pub fn write_bounds(&self, out: &mut [i64]) {
        assert_eq!(
            out.len(),
            self.num_devices() * self.ndim() * 2,
            "bounds buffer size"
        );
        let ndim = self.ndim();
        if ndim == 0 {
            return;
        }
        for (chunk, &tile) in out.chunks_exact_mut(ndim * 2).zip(&self.tile_of_device) {
            for (pair, (start, stop)) in chunk.chunks_exact_mut(2).zip(self.tile_bounds(tile)) {
                pair[0] = start as i64;
                pair[1] = stop as i64;
            }
        }
    }

    /// Replica ids as JAX numbers them: devices holding equal bounds count up in device order.
    pub fn replica_ids(&self) -> Vec<usize> {
        let mut seen = vec![0usize; self.num_tiles()];
        self.tile_of_device
            .iter()
            .map(|&tile| {
                let slot = &mut seen[self.bounds_key(tile)];
                *slot += 1;
                *slot - 1
            })
            .collect()
    }

    /// A tile id that is equal for tiles with equal bounds: tiles differ in bounds except
    /// along dimensions whose shards are empty.
    fn bounds_key(&self, tile: usize) -> usize {
        if !self.shard_shape.contains(&0) {
            return tile;
        }
        let mut divisor = self.num_tiles();
        let mut key = 0;
        for (&parts, &size) in self.partitions.iter().zip(&self.shard_shape) {
            divisor /= parts;
            let coord = if size == 0 {
                0
            } else {
                (tile / divisor) % parts
            };
            key = key * parts + coord;
        }
        key
    }
}

/// The shape of each shard, or `Indivisible` if a split does not divide its dimension.
pub fn shard_shape(shape: &[usize], partitions: &[usize]) -> Result<Vec<usize>, ShardingError> {
    if partitions.len() != shape.len() {
        return Err(ShardingError::Rank {
            sharding_rank: partitions.len(),
            array_rank: shape.len(),
        });
    }
    shape
        .iter()
        .zip(partitions)
        .enumerate()
        .map(|(axis, (&size, &parts))| {
            if parts == 0 || size % parts != 0 {
                Err(ShardingError::Indivisible {
                    axis,
                    partitions: parts,
                    size,
                    shape: shape.to_vec(),
                    tiling: partitions.to_vec(),
                })
            } else {
                Ok(size / parts)
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mesh::{MeshAxes, NamedSpec};
    use crate::tile::DeviceOrder;

    fn mesh_2x4() -> MeshAxes {
        MeshAxes::new(vec!["x".into(), "y".into()], vec![2, 4]).unwrap()
    }

    fn spec(dims: &[&[&str]]) -> NamedSpec {
        NamedSpec::new(
            dims.iter()
                .map(|axes| axes.iter().map(|&a| a.to_owned()).collect())
                .collect(),
        )
    }

    fn bounds(map: &IndexMap, device: usize) -> Vec<(usize, usize)> {
        map.device_bounds(device).collect()
    }

    #[test]
    fn named_first_axis_splits_rows() {
        let layout = spec(&[&["x"]]).to_layout(&mesh_2x4(), 2, None).unwrap();
        let map = IndexMap::new(&layout, &[8, 4], 8).unwrap();
        assert_eq!(map.partitions(), &[2, 1]);
        assert_eq!(map.shard_shape(), &[4, 4]);
        assert_eq!(bounds(&map, 0), vec![(0, 4), (0, 4)]);
        assert_eq!(bounds(&map, 3), vec![(0, 4), (0, 4)]);
        assert_eq!(bounds(&map, 4), vec![(4, 8), (0, 4)]);
        assert_eq!(map.replica_ids(), vec![0, 1, 2, 3, 0, 1, 2, 3]);
    }

    #[test]
    fn named_tuple_of_axes_is_major_first() {
        // P(('y', 'x')): device (x, y) holds row block y * 2 + x.
        let layout = spec(&[&["y", "x"]])
            .to_layout(&mesh_2x4(), 2, None)
            .unwrap();
        let map = IndexMap::new(&layout, &[8, 4], 8).unwrap();
        let rows: Vec<usize> = (0..8).map(|d| bounds(&map, d)[0].0).collect();
        assert_eq!(rows, vec![0, 2, 4, 6, 1, 3, 5, 7]);
        assert_eq!(map.replica_ids(), vec![0; 8]);
    }

    #[test]
    fn named_two_axes_tile_both_dims() {
        let layout = spec(&[&["y"], &["x"]])
            .to_layout(&mesh_2x4(), 2, None)
            .unwrap();
        let map = IndexMap::new(&layout, &[8, 4], 8).unwrap();
        assert_eq!(bounds(&map, 5), vec![(2, 4), (2, 4)]);
        assert_eq!(bounds(&map, 2), vec![(4, 6), (0, 2)]);
    }

    #[test]
    fn logical_device_ids_relabel_positions() {
        let ids: Vec<usize> = (0..8).rev().collect();
        let layout = spec(&[&["x"]])
            .to_layout(&mesh_2x4(), 1, Some(&ids))
            .unwrap();
        let map = IndexMap::new(&layout, &[8], 8).unwrap();
        assert_eq!(bounds(&map, 7), vec![(0, 4)]);
        assert_eq!(bounds(&map, 0), vec![(4, 8)]);
    }

    #[test]
    fn unsplit_spec_is_replicated() {
        let layout = spec(&[&[], &[]]).to_layout(&mesh_2x4(), 2, None).unwrap();
        assert_eq!(layout, TileLayout::Replicated);
        let one = MeshAxes::new(vec!["a".into(), "b".into()], vec![1, 8]).unwrap();
        let layout = spec(&[&["a"]]).to_layout(&one, 1, None).unwrap();
        assert_eq!(layout, TileLayout::Replicated);
        // A size-1 axis may name a dimension past the rank, as in JAX.
        assert!(spec(&[&[], &["a"]]).to_layout(&one, 1, None).is_ok());
        let map = IndexMap::new(&TileLayout::Replicated, &[], 8).unwrap();
        assert_eq!(map.replica_ids(), (0..8).collect::<Vec<_>>());
    }

    #[test]
    fn spec_errors_match_jax() {
        let mesh = mesh_2x4();
        assert_eq!(
            spec(&[&["x"], &["x"]]).to_layout(&mesh, 2, None),
            Err(ShardingError::DuplicateAxis {
                axes: vec!["x".into()]
            })
        );
        assert!(matches!(
            spec(&[&["z"]]).to_layout(&mesh, 2, None),
            Err(ShardingError::UnknownAxis { .. })
        ));
        assert_eq!(
            spec(&[&["x"], &["y"]]).to_layout(&mesh, 1, None),
            Err(ShardingError::Rank {
                sharding_rank: 2,
                array_rank: 1
            })
        );
        let layout = spec(&[&["x"]]).to_layout(&mesh, 2, None).unwrap();
        let err = IndexMap::new(&layout, &[3, 4], 8).unwrap_err();
        assert_eq!(
            err.to_string(),
            "array axis 0 is partitioned 2 times, but the dimension size is 3 (full shape: \
             (3, 4), per-dimension tiling factors: [2, 1] should evenly divide the shape)"
        );
    }

    #[test]
    fn duplicate_or_missing_positions_are_errors() {
        let layout = TileLayout::Tiled {
            partitions: vec![2, 2],
            replicas: 1,
            order: DeviceOrder::Explicit(vec![0, 1, 2, 0]),
        };
        assert!(matches!(
            IndexMap::new(&layout, &[4, 4], 4),
            Err(ShardingError::Invalid(_))
        ));
        let layout = TileLayout::Tiled {
            partitions: vec![4],
            replicas: 1,
            order: DeviceOrder::Explicit(vec![0, 1, 2, 9]),
        };
        assert!(matches!(
            IndexMap::new(&layout, &[4], 4),
            Err(ShardingError::Invalid(_))
        ));
    }

    #[test]
    fn bounds_array_is_devices_by_dims_by_two() {
        let layout = spec(&[&["x"], &["y"]])
            .to_layout(&mesh_2x4(), 2, None)
            .unwrap();
        let map = IndexMap::new(&layout, &[4, 8], 8).unwrap();
        let mut out = vec![0i64; 8 * 2 * 2];
        map.write_bounds(&mut out);
        assert_eq!(&out[..8], &[0, 2, 0, 2, 0, 2, 2, 4]);
        assert_eq!(&out[28..], &[2, 4, 6, 8]);
    }

    #[test]
    fn every_element_is_covered_once_per_replica() {
        let mesh = MeshAxes::new(vec!["a".into(), "b".into(), "c".into()], vec![2, 3, 2]).unwrap();
        let layout = spec(&[&["c", "a"], &[]]).to_layout(&mesh, 2, None).unwrap();
        let map = IndexMap::new(&layout, &[8, 3], 12).unwrap();
        let mut counts = [0usize; 8 * 3];
        for device in 0..12 {
            let b = bounds(&map, device);
            for row in b[0].0..b[0].1 {
                for col in b[1].0..b[1].1 {
                    counts[row * 3 + col] += 1;
                }
            }
        }
        assert!(counts.iter().all(|&c| c == 3));
    }

    #[test]
    fn replica_ids_group_equal_bounds_of_empty_shards() {
        let layout = spec(&[&["x"]]).to_layout(&mesh_2x4(), 1, None).unwrap();
        let map = IndexMap::new(&layout, &[0], 8).unwrap();
        assert_eq!(map.replica_ids(), (0..8).collect::<Vec<_>>());
    }
}
