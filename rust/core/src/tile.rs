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
                Self::Iota {
                    reshape: vec![reshape.iter().product()],
                    perm: Vec::new(),
                }
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
    let total: usize = reshape.iter().product();
    if perm.is_empty() || perm.iter().enumerate().all(|(i, &p)| i == p) {
        return (0..total).collect();
    }
    // Row-major strides of the untransposed array, visited in the transposed axis order.
    let mut strides = vec![1usize; reshape.len()];
    for axis in (0..reshape.len().saturating_sub(1)).rev() {
        strides[axis] = strides[axis + 1] * reshape[axis + 1];
    }
    let dims: Vec<usize> = perm.iter().map(|&p| reshape[p]).collect();
    let steps: Vec<usize> = perm.iter().map(|&p| strides[p]).collect();
    let mut out = Vec::with_capacity(total);
    let mut counter = vec![0usize; dims.len()];
    let mut offset = 0usize;
    for _ in 0..total {
        out.push(offset);
        // Odometer increment from the last (fastest) axis.
        for axis in (0..dims.len()).rev() {
            counter[axis] += 1;
            offset += steps[axis];
            if counter[axis] < dims[axis] {
                break;
            }
            offset -= steps[axis] * dims[axis];
            counter[axis] = 0;
        }
    }
    out
}

/// A sharding reduced to tiles: `Replicated`, or a grid of `partitions` tiles, each held by
/// `replicas` devices.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TileLayout {
    /// Every device holds the whole array (also XLA's `maximal`, which JAX treats alike).
    Replicated,
    Tiled {
        partitions: Vec<usize>,
        replicas: usize,
        order: DeviceOrder,
    },
}

impl TileLayout {
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
        let tiles = partitions.iter().product::<usize>() * replicas;
        if tiles != order.len() {
            return Err(ShardingError::Invalid(format!(
                "the tile grid {partitions:?} with {replicas} replicas has {tiles} tiles, but its \
                 device order lists {} devices",
                order.len()
            )));
        }
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
mod tests {
    use super::*;

    #[test]
    fn iota_without_transpose_counts_up() {
        let order = DeviceOrder::Iota {
            reshape: vec![8],
            perm: vec![],
        };
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
            replicas: 1,
            order: DeviceOrder::Iota {
                reshape: vec![8],
                perm: vec![],
            },
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
