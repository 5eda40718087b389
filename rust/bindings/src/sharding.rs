//! Reads a JAX sharding object into the core's terms: a tile layout and its device assignment.

use fastpjit_core::{HloSharding, MeshAxes, NamedSpec, TileLayout};
use pyo3::prelude::*;
use pyo3::types::PyTuple;

use crate::errors::{sharding_error, Error};
use crate::handles::{handles, names};

/// A sharding in the core's terms, for arrays of one rank.
pub struct ShardingView<'py> {
    pub layout: TileLayout,
    /// The device assignment, or `None` for a mesh with no devices (`AbstractMesh`).
    pub devices: Option<Vec<Bound<'py, PyAny>>>,
    pub num_devices: usize,
}

/// Converts `sharding` for arrays of rank `ndim`.
pub fn view<'py>(sharding: &Bound<'py, PyAny>, ndim: usize) -> PyResult<ShardingView<'py>> {
    let py = sharding.py();
    let h = handles(py)?;
    let named = h.named_sharding.bind(py);
    if sharding.is_instance(named)? {
        return named_view(sharding, ndim);
    }
    let single = h.single_device_sharding.bind(py);
    if sharding.is_instance(single)? {
        let device = sharding
            .getattr(names(py).device_set.bind(py))?
            .try_iter()?
            .next()
            .transpose()?;
        let device =
            device.ok_or_else(|| Error::Type("a SingleDeviceSharding with no device".into()))?;
        return Ok(ShardingView {
            layout: TileLayout::Replicated,
            devices: Some(vec![device]),
            num_devices: 1,
        });
    }
    if !sharding.is_instance(h.sharding.bind(py))? {
        return Err(Error::Type(
            format!(
                "sharding must be a jax.sharding.Sharding, got {}",
                sharding.get_type().name()?
            )
            .into(),
        )
        .into());
    }
    let parts = h.hlo_parts.bind(py).call1((sharding, ndim))?;
    let (text, devices): (String, Vec<Bound<'py, PyAny>>) = parts.extract()?;
    let num_devices = devices.len();
    let layout = HloSharding::parse(&text)
        .and_then(|hlo| hlo.to_layout(ndim, num_devices))
        .map_err(|e| sharding_error(py, &e, Some(sharding)))?;
    Ok(ShardingView {
        layout,
        devices: Some(devices),
        num_devices,
    })
}

fn named_view<'py>(sharding: &Bound<'py, PyAny>, ndim: usize) -> PyResult<ShardingView<'py>> {
    let py = sharding.py();
    let mesh = sharding.getattr(names(py).mesh.bind(py))?;
    let spec = sharding.getattr(names(py).spec.bind(py))?;
    if mesh.getattr(names(py).manual_axes.bind(py))?.len()? > 0 {
        return Err(Error::NotImplemented(
            "devices_indices_map is not defined for a mesh with manual axes".into(),
        )
        .into());
    }
    // Axis names are any hashable objects: spec entries are matched to mesh axes by Python
    // equality, as JAX matches them, and the core sees only the matched names.
    let mesh_names: Vec<Bound<'py, PyAny>> = mesh
        .getattr(names(py).axis_names.bind(py))?
        .try_iter()?
        .collect::<PyResult<_>>()?;
    let mut core_names: Vec<String> = mesh_names.iter().map(axis_name).collect::<PyResult<_>>()?;
    if (1..core_names.len()).any(|i| core_names[..i].contains(&core_names[i])) {
        // Distinct names that print alike (`1` and `'1'`): tell them apart by repr.
        core_names = mesh_names
            .iter()
            .map(|n| Ok(n.repr()?.to_str()?.to_owned()))
            .collect::<PyResult<_>>()?;
    }
    let sizes: Vec<usize> = mesh.getattr(names(py).axis_sizes.bind(py))?.extract()?;
    let axes =
        MeshAxes::new(core_names, sizes).map_err(|e| sharding_error(py, &e, Some(sharding)))?;
    let resolve = |name: &Bound<'py, PyAny>| -> PyResult<String> {
        for (mesh_name, core_name) in mesh_names.iter().zip(&axes.names) {
            if mesh_name.eq(name)? {
                return Ok(core_name.clone());
            }
        }
        axis_name(name)
    };
    let unconstrained = spec.get_type().getattr(names(py).UNCONSTRAINED.bind(py))?;
    // `partitions`, not the spec itself: iterating a spec with unreduced axes is an error.
    let dims = spec
        .getattr(names(py).partitions.bind(py))?
        .try_iter()?
        .map(|entry| {
            let entry = entry?;
            if entry.is_none() || entry.is(&unconstrained) {
                Ok(Vec::new())
            } else if let Ok(tuple) = entry.cast::<PyTuple>() {
                tuple.iter().map(|n| resolve(&n)).collect()
            } else {
                Ok(vec![resolve(&entry)?])
            }
        })
        .collect::<PyResult<Vec<_>>>()?;
    let unreduced = spec
        .getattr(names(py).unreduced.bind(py))?
        .try_iter()?
        .map(|name| resolve(&name?))
        .collect::<PyResult<Vec<_>>>()?;
    let h = handles(py)?;
    let logical: Option<Vec<usize>> = h
        .logical_device_ids
        .bind(py)
        .call1((sharding,))?
        .extract()?;
    let layout = NamedSpec::new(dims)
        .with_unreduced(unreduced)
        .to_layout(&axes, ndim, logical.as_deref())
        .map_err(|e| sharding_error(py, &e, Some(sharding)))?;
    let abstract_mesh = h.abstract_mesh.bind(py);
    let devices = if mesh.is_instance(abstract_mesh)? {
        None
    } else {
        let flat = mesh
            .getattr(names(py).devices.bind(py))?
            .call_method0(names(py).ravel.bind(py))?;
        Some(flat.call_method0(names(py).tolist.bind(py))?.extract()?)
    };
    Ok(ShardingView {
        layout,
        devices,
        num_devices: axes.num_devices(),
    })
}

/// How the core names a mesh axis in messages: as Python prints it.
fn axis_name(name: &Bound<'_, PyAny>) -> PyResult<String> {
    Ok(name.str()?.to_str()?.to_owned())
}
