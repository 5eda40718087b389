//! The normal form of every sharding: a grid of tiles over the array, copies of each tile,
//! and the order in which device positions take them.

use crate::error::ShardingError;

/// Which device position holds the k-th (tile, replica) pair, in row-major order over
/// `partitions ++ [replicas]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeviceOrder {
    /// `arange(n).reshape(reshape).transpose(perm).flatten()`, XLA's compact "iota" form
    /// (`<=[2,4]T(1,0)`). An empty `perm` means no transpose.
    Iota {
        reshape: Vec<usize>,
        perm: Vec<usize>,
    },
    /// Device positions listed one by one.
    Explicit(Vec<usize>),
}

impl DeviceOrder {
    /// Devices 0 to `n - 1` in order: `<=[n]`.
    pub fn in_order(n: usize) -> Self {
        Self::Iota {
            reshape: vec![n],
            perm: Vec::new(),
        }
    }

    pub fn len(&self) -> usize {
        match self {
            Self::Iota { reshape, .. } => reshape.iter().product(),
            Self::Explicit(list) => list.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The device positions in order.
    pub fn positions(&self) -> Vec<usize> {
        match self {
            Self::Explicit(list) => list.clone(),
            Self::Iota { reshape, perm } => iota_positions(reshape, perm),
        }
    }

    /// The same order with an untransposed iota written as one dimension (`<=[2,4]` and
    /// `<=[2,4]T(0,1)` are `<=[8]`), the form XLA prints.
    #[must_use]
    pub fn normalized(self) -> Self {
        match self {
            Self::Iota { reshape, perm } if perm.iter().enumerate().all(|(i, &p)| i == p) => {
                Self::in_order(reshape.iter().product())
            }
            other => other,
        }
    }

    /// Checks that the order names each of `num_devices` positions exactly once.
    pub fn check_permutation(&self, num_devices: usize) -> Result<(), ShardingError> {
        if self.len() != num_devices {
            return Err(ShardingError::Invalid(format!(
                "the sharding places tiles on {} devices, but its device list has {num_devices}",
                self.len()
            )));
        }
        if let Self::Explicit(list) = self {
            let mut seen = vec![false; num_devices];
            for &position in list {
                if position >= num_devices || std::mem::replace(&mut seen[position], true) {
                    return Err(ShardingError::Invalid(format!(
                        "the device list {list:?} is not a permutation of 0..{num_devices}"
                    )));
                }
            }
        }
        Ok(())
    }

    /// Checks that `perm` is a permutation of the reshape axes and that the size fits.
    pub fn validate(&self) -> Result<(), ShardingError> {
        if let Self::Iota { reshape, perm } = self {
            if reshape
                .iter()
                .try_fold(1usize, |acc, &d| acc.checked_mul(d))
                .is_none()
            {
                return Err(ShardingError::Invalid(format!(
                    "the iota shape {reshape:?} is too large"
                )));
            }
            if perm.is_empty() {
                return Ok(());
            }
            let mut seen = vec![false; reshape.len()];
            for &axis in perm {
                if axis >= reshape.len() || std::mem::replace(&mut seen[axis], true) {
                    return Err(ShardingError::Invalid(format!(
                        "iota transpose {perm:?} is not a permutation of {} axes",
                        reshape.len()
                    )));
                }
            }
            if perm.len() != reshape.len() {
                return Err(ShardingError::Invalid(format!(
                    "iota transpose {perm:?} is not a permutation of {} axes",
                    reshape.len()
                )));
            }
        }
        Ok(())
    }
}

/// Walks `arange(prod(reshape)).reshape(reshape).transpose(perm)` in row-major order.
fn iota_positions(reshape: &[usize], perm: &[usize]) -> Vec<usize> {
    if perm.is_empty() {
        return (0..reshape.iter().product()).collect();
    }
    // Row-major strides of the untransposed array, visited in the transposed axis order.
    let mut strides = vec![1usize; reshape.len()];
    for axis in (0..reshape.len().saturating_sub(1)).rev() {
        strides[axis] = strides[axis + 1] * reshape[axis + 1];
    }
    let axes: Vec<(usize, usize)> = perm.iter().map(|&p| (reshape[p], strides[p])).collect();
    row_major_offsets(&axes)
}

/// `Σ counter[i] * stride[i]` for each value of `counter` counting row-major over the axes'
/// sizes (`axes` are `(size, stride)`, major first).
///
/// Counts like an odometer, with no division: the innermost axis is a plain arithmetic run
/// (after merging axes that continue each other), and outer axes step once per run.
pub(crate) fn row_major_offsets(axes: &[(usize, usize)]) -> Vec<usize> {
    let total = axes.iter().map(|a| a.0).product();
    let mut out = Vec::with_capacity(total);
    if total == 0 {
        return out;
    }
    let axes = merge_axes(axes);
    let Some((&(run, step), outer)) = axes.split_last() else {
        out.push(0);
        return out;
    };
    let mut counter = vec![0usize; outer.len()];
    let mut base = 0usize;
    for _ in 0..total / run {
        // Steps by addition: SSE2 has no 64-bit multiply, so `base + i * step` is 3x slower.
        match step {
            0 => out.resize(out.len() + run, base),
            1 => out.extend(base..base + run),
            _ => out.extend((base..base + run * step).step_by(step)),
        }
        for (axis, &(size, stride)) in outer.iter().enumerate().rev() {
            counter[axis] += 1;
            if counter[axis] < size {
                base += stride;
                break;
            }
            counter[axis] = 0;
            base -= stride * (size - 1);
        }
    }
    out
}

/// Drops axes of size 1 and merges an axis into the next (minor) one where its stride is the
/// minor axis's stride times size, so `(a, s * b), (b, s)` becomes `(a * b, s)`.
fn merge_axes(axes: &[(usize, usize)]) -> Vec<(usize, usize)> {
    let mut merged: Vec<(usize, usize)> = Vec::with_capacity(axes.len());
    for &(size, stride) in axes.iter().filter(|a| a.0 != 1) {
        match merged.last_mut() {
            Some(last) if stride.checked_mul(size) == Some(last.1) => {
                *last = (last.0 * size, stride);
            }
            _ => merged.push((size, stride)),
        }
    }
    merged
}

/// For an iota order (see [`DeviceOrder::Iota`]) whose k-th entry holds tile `k / replicas`,
/// the `(size, tile stride)` of each axis of the *untransposed* iota array, so that a
/// row-major walk over device positions yields tile ids (with [`row_major_offsets`]).
///
/// Axis `perm[i]` steps k by the product of the transposed sizes after `i`; a tile id is a
/// linear function of position coordinates exactly when `replicas` is such a suffix product,
/// possibly after splitting one axis in two (`<=[8]` with 4 replicas is `<=[2,4]`). `None`
/// where no split makes it so (4 replicas over transposed sizes `[2, 3, 2]`).
fn iota_tile_axes(
    reshape: &[usize],
    perm: &[usize],
    replicas: usize,
) -> Option<Vec<(usize, usize)>> {
    let identity: Vec<usize>;
    let perm = if perm.is_empty() {
        identity = (0..reshape.len()).collect();
        &identity
    } else {
        perm
    };
    // Each untransposed axis as one or two (size, tile stride) pieces, major first.
    let mut pieces: Vec<[(usize, usize); 2]> = vec![[(1, 0); 2]; reshape.len()];
    let mut suffix = 1usize;
    for &axis in perm.iter().rev() {
        let size = reshape[axis];
        pieces[axis] = if suffix >= replicas {
            // Wholly among the tiles: suffix is a multiple of replicas by induction.
            [(size, suffix / replicas), (1, 0)]
        } else if suffix * size <= replicas {
            // Wholly among the copies of one tile.
            if replicas % (suffix * size) != 0 {
                return None;
            }
            [(size, 0), (1, 0)]
        } else {
            // Straddles: the minor `within` values of this axis are copies of one tile.
            let within = replicas / suffix;
            if replicas % suffix != 0 || size % within != 0 {
                return None;
            }
            [(size / within, 1), (within, 0)]
        };
        suffix *= size;
    }
    Some(pieces.into_iter().flatten().collect())
}

/// The tile id `k / replicas` of each device position, where position `order[k]` holds the
/// k-th (tile, replica) pair, and whether position k holds tile k for every k; checks that an
/// explicit order is a permutation.
pub(crate) fn tile_of_position(
    order: &DeviceOrder,
    replicas: usize,
    num_devices: usize,
) -> Result<(Vec<usize>, bool), ShardingError> {
    if num_devices == 0 {
        return Ok((Vec::new(), true));
    }
    if let DeviceOrder::Iota { reshape, perm } = order {
        if let Some(axes) = iota_tile_axes(reshape, perm, replicas) {
            // A sequential gather over positions: an iota is a permutation by construction.
            let in_order = num_devices == 1 || merge_axes(&axes) == [(num_devices, 1)];
            return Ok((row_major_offsets(&axes), in_order));
        }
    }
    let positions = order.positions();
    let mut tiles = vec![usize::MAX; num_devices];
    for (tile, group) in positions.chunks(replicas.max(1)).enumerate() {
        for &position in group {
            let slot = tiles.get_mut(position).ok_or_else(|| {
                ShardingError::Invalid(format!(
                    "the sharding names device position {position}, but there are only \
                     {num_devices} devices"
                ))
            })?;
            // Only an explicit list can repeat a position.
            if *slot != usize::MAX && matches!(order, DeviceOrder::Explicit(_)) {
                return Err(ShardingError::Invalid(format!(
                    "device position {position} appears more than once in the sharding"
                )));
            }
            *slot = tile;
        }
    }
    // Every slot is filled: positions are `num_devices` distinct values below it.
    let in_order = tiles.iter().enumerate().all(|(k, &tile)| k == tile);
    Ok((tiles, in_order))
}

/// A sharding reduced to tiles: `Replicated`, or a grid of `partitions` tiles, each held as
/// `unreduced` partial sums (1: the tile itself), each of those by `replicas` devices.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TileLayout {
    /// Every device holds the whole array (also XLA's `maximal`, which JAX treats alike).
    Replicated,
    /// The k-th entry of `order` holds tile `k / (unreduced * replicas)`, partial sum
    /// `k / replicas % unreduced`.
    Tiled {
        partitions: Vec<usize>,
        unreduced: usize,
        replicas: usize,
        order: DeviceOrder,
    },
}

impl TileLayout {
    /// How many partial sums of each tile the devices hold (1: none is unreduced).
    pub fn unreduced(&self) -> usize {
        match self {
            Self::Replicated => 1,
            Self::Tiled { unreduced, .. } => *unreduced,
        }
    }

    /// The number of array dimensions that the layout describes (`None`: any rank).
    pub fn rank(&self) -> Option<usize> {
        match self {
            Self::Replicated => None,
            Self::Tiled { partitions, .. } => Some(partitions.len()),
        }
    }

    /// How many ways each of `ndim` dimensions is split.
    pub fn partitions(&self, ndim: usize) -> Vec<usize> {
        match self {
            Self::Replicated => vec![1; ndim],
            Self::Tiled { partitions, .. } => partitions.clone(),
        }
    }

    /// Checks the layout against an array rank and a device count.
    pub fn check(&self, ndim: usize, num_devices: usize) -> Result<(), ShardingError> {
        let Self::Tiled {
            partitions,
            unreduced,
            replicas,
            order,
        } = self
        else {
            return Ok(());
        };
        if partitions.len() != ndim {
            return Err(ShardingError::Rank {
                sharding_rank: partitions.len(),
                array_rank: ndim,
            });
        }
        order.validate()?;
        let tiles = partitions
            .iter()
            .chain([unreduced, replicas])
            .try_fold(1usize, |acc, &d| acc.checked_mul(d));
        if tiles != Some(order.len()) {
            return Err(ShardingError::Invalid(format!(
                "the tile grid {partitions:?} with {unreduced} partial sums of {replicas} replicas \
                 does not have the {} devices that its device order lists",
                order.len()
            )));
        }
        let tiles = order.len();
        if tiles != num_devices {
            return Err(ShardingError::Invalid(format!(
                "the sharding places tiles on {tiles} devices, but its device list has \
                 {num_devices}"
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A xorshift generator: reproducible random layouts without a crate.
    pub(crate) struct Rng(u64);

    impl Rng {
        pub(crate) fn new(seed: u64) -> Self {
            Self(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
        }

        /// A value in `0..n`.
        pub(crate) fn below(&mut self, n: usize) -> usize {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            (self.0 % n as u64) as usize
        }

        pub(crate) fn shuffle<T>(&mut self, items: &mut [T]) {
            for i in (1..items.len()).rev() {
                items.swap(i, self.below(i + 1));
            }
        }

        /// Between 1 and `max_axes` sizes, each in `1..=max_size`.
        pub(crate) fn sizes(&mut self, max_axes: usize, max_size: usize) -> Vec<usize> {
            let axes = 1 + self.below(max_axes);
            (0..axes).map(|_| 1 + self.below(max_size)).collect()
        }

        /// A random divisor of `n` (positive).
        pub(crate) fn divisor(&mut self, n: usize) -> usize {
            let divisors: Vec<usize> = (1..=n).filter(|d| n % d == 0).collect();
            divisors[self.below(divisors.len())]
        }

        /// A random iota order: sizes, and a transpose (sometimes none).
        pub(crate) fn iota(&mut self) -> DeviceOrder {
            let reshape = self.sizes(4, 6);
            let mut perm: Vec<usize> = (0..reshape.len()).collect();
            if self.below(4) == 0 {
                perm.clear();
            } else {
                self.shuffle(&mut perm);
            }
            DeviceOrder::Iota { reshape, perm }
        }
    }

    /// `row_major_offsets` the slow way: a division per axis per entry.
    fn row_major_by_division(axes: &[(usize, usize)]) -> Vec<usize> {
        let total: usize = axes.iter().map(|a| a.0).product();
        (0..total)
            .map(|mut flat| {
                let mut offset = 0;
                for &(size, stride) in axes.iter().rev() {
                    offset += (flat % size) * stride;
                    flat /= size;
                }
                offset
            })
            .collect()
    }

    /// `tile_of_position` the simple way: `k / replicas` scattered to `order[k]`.
    fn tiles_by_scatter(order: &DeviceOrder, replicas: usize) -> Vec<usize> {
        let positions = order.positions();
        let mut tiles = vec![usize::MAX; positions.len()];
        for (k, &position) in positions.iter().enumerate() {
            tiles[position] = k / replicas;
        }
        tiles
    }

    /// Tile ids with whether position k holds tile k.
    fn in_order(tiles: Vec<usize>) -> (Vec<usize>, bool) {
        let in_order = tiles.iter().enumerate().all(|(k, &tile)| k == tile);
        (tiles, in_order)
    }

    #[test]
    fn odometer_matches_division_on_random_axes() {
        let mut rng = Rng::new(1);
        for _ in 0..2000 {
            let sizes = rng.sizes(5, 5);
            let axes: Vec<(usize, usize)> = sizes
                .iter()
                .map(|&size| {
                    // Strides that sometimes continue the next axis, so that axes merge.
                    (size, [0, 1, 2, 5, 7][rng.below(5)])
                })
                .collect();
            assert_eq!(
                row_major_offsets(&axes),
                row_major_by_division(&axes),
                "axes {axes:?}"
            );
        }
        // Merged axes, a rank-0 walk, an empty one.
        let merged = [(2, 12), (3, 4), (4, 1)];
        assert_eq!(merge_axes(&merged), vec![(24, 1)]);
        assert_eq!(row_major_offsets(&merged), (0..24).collect::<Vec<_>>());
        assert_eq!(row_major_offsets(&[]), vec![0]);
        assert_eq!(row_major_offsets(&[(3, 1), (0, 1)]), Vec::<usize>::new());
    }

    #[test]
    fn tile_gather_matches_scatter_on_random_iotas() {
        let mut rng = Rng::new(2);
        let mut gathered = 0;
        for _ in 0..3000 {
            let order = rng.iota();
            let total = order.len();
            let replicas = rng.divisor(total);
            let DeviceOrder::Iota { reshape, perm } = &order else {
                unreachable!()
            };
            gathered += usize::from(iota_tile_axes(reshape, perm, replicas).is_some());
            assert_eq!(
                tile_of_position(&order, replicas, total).unwrap(),
                in_order(tiles_by_scatter(&order, replicas)),
                "{order:?} with {replicas} replicas"
            );
        }
        // Most random layouts take the gather; the rest check the fallback.
        assert!(gathered > 2000, "{gathered} gathered");
    }

    #[test]
    fn tile_gather_splits_an_axis_where_needed() {
        // `{devices=[2,1,4]<=[8] last_tile_dim_replicate}`: positions 0-3 hold tile 0.
        assert_eq!(iota_tile_axes(&[8], &[], 4), Some(vec![(2, 1), (4, 0)]));
        // No split of a size-3 axis leaves 4 copies to a tile.
        assert_eq!(iota_tile_axes(&[2, 3, 2], &[], 4), None);
        let order = DeviceOrder::Iota {
            reshape: vec![2, 3, 2],
            perm: vec![],
        };
        assert_eq!(
            tile_of_position(&order, 4, 12).unwrap().0,
            vec![0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2]
        );
    }

    #[test]
    fn explicit_orders_are_scattered_and_checked() {
        let mut rng = Rng::new(3);
        for _ in 0..500 {
            let total = 1 + rng.below(24);
            let mut list: Vec<usize> = (0..total).collect();
            rng.shuffle(&mut list);
            let order = DeviceOrder::Explicit(list);
            let replicas = rng.divisor(total);
            assert_eq!(
                tile_of_position(&order, replicas, total).unwrap(),
                in_order(tiles_by_scatter(&order, replicas))
            );
        }
        let repeated = DeviceOrder::Explicit(vec![0, 1, 1, 3]);
        assert!(tile_of_position(&repeated, 1, 4).is_err());
        let out_of_range = DeviceOrder::Explicit(vec![0, 1, 2, 4]);
        assert!(tile_of_position(&out_of_range, 2, 4).is_err());
    }

    #[test]
    fn iota_without_transpose_counts_up() {
        let order = DeviceOrder::in_order(8);
        assert_eq!(order.positions(), (0..8).collect::<Vec<_>>());
    }

    #[test]
    fn iota_transpose_matches_numpy() {
        // np.arange(8).reshape(2, 4).T.flatten()
        let order = DeviceOrder::Iota {
            reshape: vec![2, 4],
            perm: vec![1, 0],
        };
        assert_eq!(order.positions(), vec![0, 4, 1, 5, 2, 6, 3, 7]);
        // np.arange(24).reshape(2, 3, 4).transpose(2, 0, 1).flatten()[:8]
        let order = DeviceOrder::Iota {
            reshape: vec![2, 3, 4],
            perm: vec![2, 0, 1],
        };
        assert_eq!(&order.positions()[..8], &[0, 4, 8, 12, 16, 20, 1, 5]);
    }

    #[test]
    fn bad_permutations_are_rejected() {
        for perm in [vec![0, 0], vec![0], vec![0, 2]] {
            let order = DeviceOrder::Iota {
                reshape: vec![2, 4],
                perm,
            };
            assert!(matches!(order.validate(), Err(ShardingError::Invalid(_))));
        }
    }

    #[test]
    fn check_rejects_wrong_rank_and_device_count() {
        let layout = TileLayout::Tiled {
            partitions: vec![4, 2],
            unreduced: 1,
            replicas: 1,
            order: DeviceOrder::in_order(8),
        };
        assert_eq!(
            layout.check(1, 8),
            Err(ShardingError::Rank {
                sharding_rank: 2,
                array_rank: 1
            })
        );
        assert!(matches!(layout.check(2, 4), Err(ShardingError::Invalid(_))));
        assert_eq!(layout.check(2, 8), Ok(()));
    }
}
