//! Per-device slices of a global array: the answer to JAX's `devices_indices_map`.

use std::mem::MaybeUninit;

use crate::error::ShardingError;
use crate::tile::{tile_of_position, TileLayout};

/// A place for one bound in [`IndexMap::write_bounds`]: an `i64`, or a `MaybeUninit<i64>` of a
/// buffer not yet written (a new array), which `write_bounds` initializes in full.
pub trait BoundSlot {
    fn set(&mut self, value: i64);
}

impl BoundSlot for i64 {
    fn set(&mut self, value: i64) {
        *self = value;
    }
}

impl BoundSlot for MaybeUninit<i64> {
    fn set(&mut self, value: i64) {
        self.write(value);
    }
}

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
    /// Whether device position k holds tile k, for every k.
    tiles_in_order: bool,
    /// How many partial sums of each tile there are (1: none is unreduced).
    unreduced: usize,
    /// Which partial sum each device position holds; empty where nothing is unreduced.
    member_of_device: Vec<usize>,
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
        let unreduced = layout.unreduced();
        let (tile_of_device, tiles_in_order) = match layout {
            TileLayout::Replicated => (vec![0; num_devices], num_devices <= 1),
            TileLayout::Tiled {
                replicas, order, ..
            } => tile_of_position(order, replicas * unreduced, num_devices)?,
        };
        let member_of_device = match layout {
            // Ids of (tile, partial sum) pairs, of which the partial sum is the remainder.
            TileLayout::Tiled {
                replicas, order, ..
            } if unreduced > 1 => tile_of_position(order, *replicas, num_devices)?
                .0
                .into_iter()
                .map(|pair| pair % unreduced)
                .collect(),
            _ => Vec::new(),
        };
        Ok(Self {
            shape: shape.to_vec(),
            partitions,
            shard_shape,
            tile_of_device,
            tiles_in_order,
            unreduced,
            member_of_device,
        })
    }

    /// How many partial sums of each tile there are: above 1, devices hold partial sums of
    /// their tile (XLA's `unreduced`), and the array is their sum.
    pub fn unreduced(&self) -> usize {
        self.unreduced
    }

    /// Which of its tile's partial sums device position `device` holds (0 where the sharding
    /// is not unreduced).
    pub fn member_of_device(&self, device: usize) -> usize {
        self.member_of_device.get(device).copied().unwrap_or(0)
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

    /// The coordinates of tile `tile` in the grid of `partitions`, major first.
    pub fn tile_coords(&self, tile: usize) -> impl ExactSizeIterator<Item = usize> + '_ {
        // Tile ids are row-major over `partitions`; walk the divisors from the last axis out.
        let mut divisor = self.num_tiles();
        self.partitions.iter().map(move |&parts| {
            divisor /= parts;
            (tile / divisor) % parts
        })
    }

    /// The `[start, stop)` bounds of tile `tile` in every dimension.
    pub fn tile_bounds(&self, tile: usize) -> impl Iterator<Item = (usize, usize)> + '_ {
        self.tile_coords(tile)
            .zip(&self.shard_shape)
            .map(|(coord, &size)| (coord * size, (coord + 1) * size))
    }

    /// The `[start, stop)` bounds that device position `device` holds in every dimension.
    pub fn device_bounds(&self, device: usize) -> impl Iterator<Item = (usize, usize)> + '_ {
        self.tile_bounds(self.tile_of_device[device])
    }

    /// Calls `f` with the coordinates of every tile, in tile-id order; stops at the first
    /// error. Counts like an odometer, so no tile's coordinates cost a division.
    pub fn try_for_each_tile<E>(
        &self,
        mut f: impl FnMut(&[usize]) -> Result<(), E>,
    ) -> Result<(), E> {
        let mut coords = vec![0usize; self.ndim()];
        for _ in 0..self.num_tiles() {
            f(&coords)?;
            for (coord, &parts) in coords.iter_mut().zip(&self.partitions).rev() {
                *coord += 1;
                if *coord < parts {
                    break;
                }
                *coord = 0;
            }
        }
        Ok(())
    }

    /// Writes `[start, stop]` pairs for every device and dimension into `out`, laid out as a
    /// C-ordered `(num_devices, ndim, 2)` array; every slot of `out` is written.
    ///
    /// The bounds of each tile are computed once, into a table, and copied to the devices that
    /// hold it; no step divides.
    pub fn write_bounds<S: BoundSlot>(&self, out: &mut [S]) {
        assert_eq!(
            out.len(),
            self.num_devices() * self.ndim() * 2,
            "bounds buffer size"
        );
        // Constant row widths let the compiler unroll the copies of the common ranks.
        match self.ndim() {
            0 => {}
            1 => self.write_bounds_rows::<2, S>(out),
            2 => self.write_bounds_rows::<4, S>(out),
            3 => self.write_bounds_rows::<6, S>(out),
            4 => self.write_bounds_rows::<8, S>(out),
            _ => self.write_bounds_rows::<0, S>(out),
        }
    }

    /// `write_bounds` with rows of `W` values (`0`: of `2 * ndim`, not known when compiling).
    fn write_bounds_rows<const W: usize, S: BoundSlot>(&self, out: &mut [S]) {
        if self.tiles_in_order {
            // The table is the answer.
            self.write_tile_rows::<W, S>(out);
            return;
        }
        let width = if W == 0 { 2 * self.ndim() } else { W };
        let mut table = vec![0i64; self.num_tiles() * width];
        self.write_tile_rows::<W, i64>(&mut table);
        for (row, &tile) in out.chunks_exact_mut(width).zip(&self.tile_of_device) {
            for (slot, &bound) in row.iter_mut().zip(&table[tile * width..][..width]) {
                slot.set(bound);
            }
        }
    }

    /// Writes the bounds of every tile, in tile-id order, as rows of `W` values (as in
    /// `write_bounds_rows`).
    ///
    /// Tiles that differ only in the last coordinate form a run: the leading bounds are copied
    /// and the last pair steps by the shard size.
    fn write_tile_rows<const W: usize, S: BoundSlot>(&self, out: &mut [S]) {
        let width = if W == 0 { 2 * self.ndim() } else { W };
        let (&last_parts, outer_parts) = self.partitions.split_last().expect("rank is positive");
        let last_size = *self.shard_shape.last().expect("rank is positive") as i64;
        // The bounds of the dimensions before the last, at the current outer coordinates.
        let mut prefix: Vec<i64> = self.shard_shape[..outer_parts.len()]
            .iter()
            .flat_map(|&size| [0, size as i64])
            .collect();
        let mut coords = vec![0usize; outer_parts.len()];
        for run in out.chunks_exact_mut(width * last_parts) {
            let mut start = 0i64;
            for row in run.chunks_exact_mut(width) {
                let (lead, last) = row.split_at_mut(width - 2);
                for (slot, &bound) in lead.iter_mut().zip(&prefix[..width - 2]) {
                    slot.set(bound);
                }
                last[0].set(start);
                start += last_size;
                last[1].set(start);
            }
            for (axis, &parts) in outer_parts.iter().enumerate().rev() {
                let size = self.shard_shape[axis] as i64;
                coords[axis] += 1;
                if coords[axis] < parts {
                    prefix[2 * axis] += size;
                    prefix[2 * axis + 1] += size;
                    break;
                }
                coords[axis] = 0;
                prefix[2 * axis] = 0;
                prefix[2 * axis + 1] = size;
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
    use crate::tile::tests::Rng;
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
            unreduced: 1,
            replicas: 1,
            order: DeviceOrder::Explicit(vec![0, 1, 2, 0]),
        };
        assert!(matches!(
            IndexMap::new(&layout, &[4, 4], 4),
            Err(ShardingError::Invalid(_))
        ));
        let layout = TileLayout::Tiled {
            partitions: vec![4],
            unreduced: 1,
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

    /// A slot that checks that `write_bounds` writes it once, as an uninitialized buffer needs.
    #[derive(Clone)]
    struct WrittenOnce(Option<i64>);

    impl BoundSlot for WrittenOnce {
        fn set(&mut self, value: i64) {
            assert!(self.0.replace(value).is_none(), "a slot was written twice");
        }
    }

    /// A random tiled layout: iota or explicit order, 0 to 5 dimensions, some replicas.
    fn random_layout(rng: &mut Rng) -> (TileLayout, Vec<usize>) {
        let ndim = rng.below(6);
        let partitions: Vec<usize> = (0..ndim).map(|_| 1 + rng.below(4)).collect();
        let replicas = 1 + rng.below(3);
        let total = partitions.iter().product::<usize>() * replicas;
        let order = match rng.below(3) {
            0 => {
                let mut list: Vec<usize> = (0..total).collect();
                rng.shuffle(&mut list);
                DeviceOrder::Explicit(list)
            }
            1 => DeviceOrder::in_order(total),
            _ => {
                // Split the devices into random factors and transpose them.
                let mut reshape = Vec::new();
                let mut rest = total;
                while rest > 1 {
                    let d = rng.divisor(rest);
                    if d > 1 {
                        reshape.push(d);
                        rest /= d;
                    }
                }
                let mut perm: Vec<usize> = (0..reshape.len()).collect();
                rng.shuffle(&mut perm);
                DeviceOrder::Iota { reshape, perm }
            }
        };
        // Shards of 0 to 2 elements.
        let shape = partitions.iter().map(|&p| p * rng.below(3)).collect();
        let layout = TileLayout::Tiled {
            partitions,
            unreduced: 1,
            replicas,
            order,
        };
        (layout, shape)
    }

    #[test]
    fn bounds_array_matches_per_device_bounds_on_random_layouts() {
        let mut rng = Rng::new(4);
        for _ in 0..3000 {
            let (layout, shape) = random_layout(&mut rng);
            let n = layout.partitions(shape.len()).iter().product::<usize>()
                * match &layout {
                    TileLayout::Tiled { replicas, .. } => *replicas,
                    TileLayout::Replicated => 1,
                };
            let map = IndexMap::new(&layout, &shape, n).unwrap();
            if let TileLayout::Tiled {
                replicas, order, ..
            } = &layout
            {
                let mut tiles = vec![usize::MAX; n];
                for (k, position) in order.positions().into_iter().enumerate() {
                    tiles[position] = k / replicas;
                }
                assert_eq!(map.tile_of_device(), tiles, "{layout:?}");
            }
            let mut out = vec![-1i64; n * shape.len() * 2];
            map.write_bounds(&mut out);
            let expected: Vec<i64> = (0..n)
                .flat_map(|d| map.device_bounds(d).collect::<Vec<_>>())
                .flat_map(|(start, stop)| [start as i64, stop as i64])
                .collect();
            assert_eq!(out, expected, "{layout:?} over {shape:?}");
            let mut once = vec![WrittenOnce(None); out.len()];
            map.write_bounds(&mut once);
            assert!(once.iter().map(|w| w.0).eq(out.iter().copied().map(Some)));
            let mut tile = 0;
            map.try_for_each_tile(|coords| {
                assert_eq!(coords, map.tile_coords(tile).collect::<Vec<_>>());
                tile += 1;
                Ok::<(), ()>(())
            })
            .unwrap();
            assert_eq!(tile, map.num_tiles());
        }
    }

    #[test]
    fn replicated_bounds_are_the_whole_array() {
        let map = IndexMap::new(&TileLayout::Replicated, &[4, 6], 3).unwrap();
        let mut out = vec![0i64; 3 * 4];
        map.write_bounds(&mut out);
        assert_eq!(out, [0, 4, 0, 6].repeat(3));
    }
}
