//! Reads a JAX sharding object into the core's terms: a tile layout and its device assignment.

use fastpjit_core::{HloSharding, MeshAxes, NamedSpec, TileLayout};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyTuple, PyType};

use crate::errors::{sharding_error, Error};
use crate::jax::private;

static NAMED_SHARDING: PyOnceLock<Py<PyType>> = PyOnceLock::new();
static SINGLE_DEVICE_SHARDING: PyOnceLock<Py<PyType>> = PyOnceLock::new();
static ABSTRACT_MESH: PyOnceLock<Py<PyType>> = PyOnceLock::new();
static SHARDING: PyOnceLock<Py<PyType>> = PyOnceLock::new();

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
    let named = NAMED_SHARDING.import(py, "jax.sharding", "NamedSharding")?;
    if sharding.is_instance(named)? {
        return named_view(sharding, ndim);
    }
    let single = SINGLE_DEVICE_SHARDING.import(py, "jax.sharding", "SingleDeviceSharding")?;
    if sharding.is_instance(single)? {
        let device = sharding
            .getattr(intern!(py, "device_set"))?
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
    if !sharding.is_instance(SHARDING.import(py, "jax.sharding", "Sharding")?)? {
        return Err(Error::Type(
            format!(
                "sharding must be a jax.sharding.Sharding, got {}",
                sharding.get_type().name()?
            )
            .into(),
        )
        .into());
    }
    let parts = private(py)?
        .getattr(intern!(py, "hlo_parts"))?
        .call1((sharding, ndim))?;
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
    let mesh = sharding.getattr(intern!(py, "mesh"))?;
    let spec = sharding.getattr(intern!(py, "spec"))?;
    if mesh.getattr(intern!(py, "manual_axes"))?.len()? > 0 {
        return Err(Error::NotImplemented(
            "devices_indices_map is not defined for a mesh with manual axes".into(),
        )
        .into());
    }
    // Axis names are any hashable objects: spec entries are matched to mesh axes by Python
    // equality, as JAX matches them, and the core sees only the matched names.
    let mesh_names: Vec<Bound<'py, PyAny>> = mesh
        .getattr(intern!(py, "axis_names"))?
        .try_iter()?
        .collect::<PyResult<_>>()?;
    let mut names: Vec<String> = mesh_names.iter().map(axis_name).collect::<PyResult<_>>()?;
    if (1..names.len()).any(|i| names[..i].contains(&names[i])) {
        // Distinct names that print alike (`1` and `'1'`): tell them apart by repr.
        names = mesh_names
            .iter()
            .map(|n| Ok(n.repr()?.to_str()?.to_owned()))
            .collect::<PyResult<_>>()?;
    }
    let sizes: Vec<usize> = mesh.getattr(intern!(py, "axis_sizes"))?.extract()?;
    let axes = MeshAxes::new(names, sizes).map_err(|e| sharding_error(py, &e, Some(sharding)))?;
    let resolve = |name: &Bound<'py, PyAny>| -> PyResult<String> {
        for (mesh_name, core_name) in mesh_names.iter().zip(&axes.names) {
            if mesh_name.eq(name)? {
                return Ok(core_name.clone());
            }
        }
        axis_name(name)
    };
    let unconstrained = spec.get_type().getattr(intern!(py, "UNCONSTRAINED"))?;
    // `partitions`, not the spec itself: iterating a spec with unreduced axes is an error.
    let dims = spec
        .getattr(intern!(py, "partitions"))?
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
        .getattr(intern!(py, "unreduced"))?
        .try_iter()?
        .map(|name| resolve(&name?))
        .collect::<PyResult<Vec<_>>>()?;
    let logical: Option<Vec<usize>> = private(py)?
        .getattr(intern!(py, "logical_device_ids"))?
        .call1((sharding,))?
        .extract()?;
    let layout = NamedSpec::new(dims)
        .with_unreduced(unreduced)
        .to_layout(&axes, ndim, logical.as_deref())
        .map_err(|e| sharding_error(py, &e, Some(sharding)))?;
    let abstract_mesh = ABSTRACT_MESH.import(py, "jax.sharding", "AbstractMesh")?;
    let devices = if mesh.is_instance(abstract_mesh)? {
        None
    } else {
        let flat = mesh
            .getattr(intern!(py, "devices"))?
            .call_method0(intern!(py, "ravel"))?;
        Some(flat.call_method0(intern!(py, "tolist"))?.extract()?)
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
