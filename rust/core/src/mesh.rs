//! Named meshes and partition specs, reduced to tile layouts the way JAX lowers a
//! `NamedSharding` to an HLO sharding.

use crate::error::ShardingError;
use crate::tile::{DeviceOrder, TileLayout};

/// The axes of a device mesh: names and sizes, major to minor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MeshAxes {
    pub names: Vec<String>,
    pub sizes: Vec<usize>,
}

impl MeshAxes {
    pub fn new(names: Vec<String>, sizes: Vec<usize>) -> Result<Self, ShardingError> {
        if names.len() != sizes.len() {
            return Err(ShardingError::Invalid(format!(
                "a mesh needs one size per axis name, got names {names:?} and sizes {sizes:?}"
            )));
        }
        for (i, name) in names.iter().enumerate() {
            if names[..i].contains(name) {
                return Err(ShardingError::Invalid(format!(
                    "mesh axis names must be unique, got {names:?}"
                )));
            }
        }
        Ok(Self { names, sizes })
    }

    pub fn num_devices(&self) -> usize {
        self.sizes.iter().product()
    }

    fn position(&self, axis: &str) -> Result<usize, ShardingError> {
        self.names
            .iter()
            .position(|n| n == axis)
            .ok_or_else(|| ShardingError::UnknownAxis {
                axis: axis.to_owned(),
                mesh_axes: self.names.clone(),
            })
    }
}

/// A `PartitionSpec`: for each leading array dimension, the mesh axes that split it, major
/// first. Trailing dimensions that the spec leaves out are not split. Devices along the
/// `unreduced` axes hold partial sums of their tile rather than copies.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NamedSpec {
    pub dims: Vec<Vec<String>>,
    pub unreduced: Vec<String>,
}

impl NamedSpec {
    pub fn new(dims: Vec<Vec<String>>) -> Self {
        Self {
            dims,
            unreduced: Vec::new(),
        }
    }

    /// The spec with `axes` unreduced.
    #[must_use]
    pub fn with_unreduced(mut self, axes: Vec<String>) -> Self {
        self.unreduced = axes;
        self
    }

    /// Lowers the spec over `mesh` for an array of rank `ndim`.
    ///
    /// `logical_device_ids`, when given, maps each mesh position (row-major) to a position in
    /// the device assignment, as JAX's `NamedSharding(_logical_device_ids=...)` does.
    pub fn to_layout(
        &self,
        mesh: &MeshAxes,
        ndim: usize,
        logical_device_ids: Option<&[usize]>,
    ) -> Result<TileLayout, ShardingError> {
        self.validate(mesh)?;
        // Like JAX, size-1 axes split nothing, so only they may stand past the array's rank.
        let splits = |axes: &Vec<String>| {
            axes.iter()
                .any(|axis| mesh.position(axis).is_ok_and(|p| mesh.sizes[p] > 1))
        };
        if self.dims.iter().skip(ndim).any(splits) {
            return Err(ShardingError::Rank {
                sharding_rank: self.dims.len(),
                array_rank: ndim,
            });
        }
        let mut partitions = vec![1usize; ndim];
        let mut perm = Vec::with_capacity(mesh.names.len());
        for (dim, axes) in self.dims.iter().enumerate().take(ndim) {
            for axis in axes {
                let position = mesh.position(axis)?;
                partitions[dim] *= mesh.sizes[position];
                perm.push(position);
            }
        }
        // Unreduced axes come before replicated ones, in mesh order, as JAX lowers them.
        let mut unreduced = 1;
        for (position, name) in mesh.names.iter().enumerate() {
            if self.unreduced.contains(name) {
                perm.push(position);
                unreduced *= mesh.sizes[position];
            }
        }
        let sharded = partitions.iter().any(|&p| p > 1);
        if !sharded && unreduced == 1 {
            return Ok(TileLayout::Replicated);
        }
        let mut replicas = 1;
        for (position, &size) in mesh.sizes.iter().enumerate() {
            if !perm.contains(&position) {
                perm.push(position);
                replicas *= size;
            }
        }
        let order = DeviceOrder::Iota {
            reshape: mesh.sizes.clone(),
            perm,
        };
        let order = match logical_device_ids {
            None => order,
            Some(ids) => {
                if ids.len() != mesh.num_devices() {
                    return Err(ShardingError::Invalid(format!(
                        "logical device ids list {} devices, but the mesh has {}",
                        ids.len(),
                        mesh.num_devices()
                    )));
                }
                DeviceOrder::Explicit(order.positions().into_iter().map(|p| ids[p]).collect())
            }
        };
        Ok(TileLayout::Tiled {
            partitions,
            unreduced,
            replicas,
            order,
        })
    }

    /// Checks what JAX checks when it builds a `NamedSharding`: known axes, each used once
    /// (unreduced axes included).
    pub fn validate(&self, mesh: &MeshAxes) -> Result<(), ShardingError> {
        // JAX reports a repeated axis before an unknown one.
        let mut duplicates: Vec<String> = Vec::new();
        let used: Vec<&String> = self.dims.iter().flatten().chain(&self.unreduced).collect();
        for (i, axis) in used.iter().enumerate() {
            if used[..i].contains(axis) && !duplicates.contains(axis) {
                duplicates.push((*axis).clone());
            }
        }
        if !duplicates.is_empty() {
            return Err(ShardingError::DuplicateAxis { axes: duplicates });
        }
        used.into_iter()
            .try_for_each(|axis| mesh.position(axis).map(drop))
    }
}
