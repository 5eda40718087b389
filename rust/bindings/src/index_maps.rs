//! `devices_indices_map` and its relatives: index maps of JAX shardings, built in Rust.

use fastpjit_core::{HloSharding, IndexMap};
use numpy::{PyArray3, PyArrayMethods};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PySlice, PyString, PyTuple};
use pyo3::{ffi, intern};

use crate::errors::sharding_error;
use crate::sharding::{view, ShardingView};

/// The index map of `sharding` over `global_shape`, with its view.
fn index_map<'py>(
    sharding: &Bound<'py, PyAny>,
    global_shape: &[usize],
) -> PyResult<(ShardingView<'py>, IndexMap)> {
    let view = view(sharding, global_shape.len())?;
    let map = IndexMap::new(&view.layout, global_shape, view.num_devices)
        .map_err(|e| sharding_error(sharding.py(), &e, Some(sharding)))?;
    Ok((view, map))
}

/// Reads `global_shape`, naming the argument when it is not a sequence of non-negative ints.
pub fn shape_arg(global_shape: &Bound<'_, PyAny>) -> PyResult<Vec<usize>> {
    let bad = || {
        let given = global_shape
            .repr()
            .map_or_else(|_| "?".to_owned(), |r| r.to_string());
        PyTypeError::new_err(format!(
            "global_shape must be a tuple of non-negative ints, got {given}"
        ))
    };
    if global_shape.is_instance_of::<PyString>() {
        return Err(bad());
    }
    let dims: Vec<i64> = global_shape.extract().map_err(|_| bad())?;
    dims.into_iter()
        .map(|d| usize::try_from(d).map_err(|_| bad()))
        .collect()
}

fn devices_of<'a, 'py>(view: &'a ShardingView<'py>) -> PyResult<&'a [Bound<'py, PyAny>]> {
    view.devices.as_deref().ok_or_else(|| {
        PyValueError::new_err(
            "the sharding's mesh is abstract and has no devices; use fastpjit.indices_array \
             for per-position indices",
        )
    })
}

/// `slice(start, stop)` with a `None` step, as JAX builds it (`slice(0, 4, 1)` would differ).
fn slice(py: Python<'_>, start: usize, stop: usize) -> PyResult<Bound<'_, PyAny>> {
    let start = start.into_pyobject(py)?;
    let stop = stop.into_pyobject(py)?;
    // SAFETY: both arguments are live ints; a null step means None.
    unsafe {
        Bound::from_owned_ptr_or_err(
            py,
            ffi::PySlice_New(start.as_ptr(), stop.as_ptr(), std::ptr::null_mut()),
        )
    }
}

/// One Python index tuple per tile, built once and shared by every device holding that tile.
fn tile_indices<'py>(
    py: Python<'py>,
    map: &IndexMap,
) -> PyResult<Vec<Option<Bound<'py, PyTuple>>>> {
    let whole = PySlice::full(py);
    let mut out: Vec<Option<Bound<'py, PyTuple>>> = vec![None; map.num_tiles()];
    for &tile in map.tile_of_device() {
        if out[tile].is_some() {
            continue;
        }
        let items = map
            .tile_bounds(tile)
            .zip(map.partitions())
            .map(|((start, stop), &parts)| {
                if parts == 1 {
                    Ok(whole.clone().into_any())
                } else {
                    slice(py, start, stop)
                }
            })
            .collect::<PyResult<Vec<_>>>()?;
        out[tile] = Some(PyTuple::new(py, items)?);
    }
    Ok(out)
}

/// The positions of the devices that this process can address.
fn addressable_positions(py: Python<'_>, devices: &[Bound<'_, PyAny>]) -> PyResult<Vec<usize>> {
    let Some(first) = devices.first() else {
        return Ok(Vec::new());
    };
    let this_process: i64 = first
        .getattr(intern!(py, "client"))?
        .call_method0(intern!(py, "process_index"))?
        .extract()?;
    let mut out = Vec::with_capacity(devices.len());
    for (position, device) in devices.iter().enumerate() {
        let process: i64 = device.getattr(intern!(py, "process_index"))?.extract()?;
        if process == this_process {
            out.push(position);
        }
    }
    Ok(out)
}

/// A device of a sharding with the index tuple of the slice it holds.
pub struct IndexedDevice<'py> {
    pub device: Bound<'py, PyAny>,
    pub index: Bound<'py, PyTuple>,
    /// The tile id that the core's `IndexMap` gives this device's slice.
    pub tile: usize,
}

/// The devices of `sharding` (all, or those this process addresses) with their indices, in
/// device-assignment order, which is the order jaxlib expects shards in.
pub fn indexed_devices<'py>(
    sharding: &Bound<'py, PyAny>,
    global_shape: &[usize],
    addressable_only: bool,
) -> PyResult<(IndexMap, Vec<IndexedDevice<'py>>)> {
    let py = sharding.py();
    let (view, map) = index_map(sharding, global_shape)?;
    let devices = devices_of(&view)?;
    let tiles = tile_indices(py, &map)?;
    let positions = if addressable_only {
        addressable_positions(py, devices)?
    } else {
        (0..devices.len()).collect()
    };
    let out = positions
        .into_iter()
        .map(|position| {
            let tile = map.tile_of_device()[position];
            IndexedDevice {
                device: devices[position].clone(),
                index: tiles[tile].clone().expect("every tile held is built"),
                tile,
            }
        })
        .collect();
    Ok((map, out))
}

fn indices_dict<'py>(
    sharding: &Bound<'py, PyAny>,
    global_shape: &[usize],
    addressable_only: bool,
) -> PyResult<Bound<'py, PyDict>> {
    let (_, devices) = indexed_devices(sharding, global_shape, addressable_only)?;
    let out = PyDict::new(sharding.py());
    for IndexedDevice { device, index, .. } in devices {
        out.set_item(device, index)?;
    }
    Ok(out)
}

/// `{device: index}` for every device of `sharding`, equal to JAX's `devices_indices_map`.
#[pyfunction]
pub fn devices_indices_map<'py>(
    sharding: &Bound<'py, PyAny>,
    global_shape: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyDict>> {
    indices_dict(sharding, &shape_arg(global_shape)?, false)
}

/// `{device: index}` for the devices this process addresses, equal to JAX's
/// `addressable_devices_indices_map`.
#[pyfunction]
pub fn addressable_devices_indices_map<'py>(
    sharding: &Bound<'py, PyAny>,
    global_shape: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyDict>> {
    indices_dict(sharding, &shape_arg(global_shape)?, true)
}

/// The shape of each shard, equal to JAX's `sharding.shard_shape`.
#[pyfunction]
pub fn shard_shape<'py>(
    py: Python<'py>,
    sharding: &Bound<'py, PyAny>,
    global_shape: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyTuple>> {
    let (_, map) = index_map(sharding, &shape_arg(global_shape)?)?;
    PyTuple::new(py, map.shard_shape())
}

/// `{device: replica id}`: devices that hold the same data count up from 0 in device order.
#[pyfunction]
pub fn device_replica_id_map<'py>(
    py: Python<'py>,
    sharding: &Bound<'py, PyAny>,
    global_shape: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyDict>> {
    let (view, map) = index_map(sharding, &shape_arg(global_shape)?)?;
    let devices = devices_of(&view)?;
    let out = PyDict::new(py);
    for (device, id) in devices.iter().zip(map.replica_ids()) {
        out.set_item(device, id)?;
    }
    Ok(out)
}

/// The `[start, stop)` bounds of every device position as an int64 array of shape
/// `(devices, ndim, 2)`, rows in device-assignment order (mesh order for an abstract mesh).
#[pyfunction]
pub fn indices_array<'py>(
    py: Python<'py>,
    sharding: &Bound<'py, PyAny>,
    global_shape: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyArray3<i64>>> {
    let (_, map) = index_map(sharding, &shape_arg(global_shape)?)?;
    let out = PyArray3::<i64>::zeros(py, [map.num_devices(), map.ndim(), 2], false);
    {
        let mut bounds = out.readwrite();
        let slice = bounds
            .as_slice_mut()
            .map_err(|e| PyValueError::new_err(e.to_string()))?;
        py.detach(|| map.write_bounds(slice));
    }
    Ok(out)
}

/// Checks HLO sharding text against a device count and returns it in canonical form.
#[pyfunction]
pub fn canonical_hlo_sharding(py: Python<'_>, text: &str, num_devices: usize) -> PyResult<String> {
    let hlo = HloSharding::parse(text).map_err(|e| sharding_error(py, &e, None))?;
    hlo.check_for_array(num_devices)
        .map_err(|e| sharding_error(py, &e, None))?;
    Ok(hlo.to_string())
}
