//! `devices_indices_map` and its relatives: index maps of JAX shardings, built in Rust.

use std::mem::MaybeUninit;

use fastpjit_core::{HloSharding, IndexMap};
use numpy::{PyArray3, PyArrayMethods};
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PySlice, PyString, PyTuple};

use crate::errors::{sharding_error, shown, Error};
use crate::handles::names;
use crate::sharding::{view, ShardingView};

/// The index map of `sharding` over `global_shape`, with its view; unreduced shardings
/// included, whose devices hold partial sums of their tiles.
fn placement<'py>(
    sharding: &Bound<'py, PyAny>,
    global_shape: &[usize],
) -> PyResult<(ShardingView<'py>, IndexMap)> {
    let view = view(sharding, global_shape.len())?;
    let map = IndexMap::new(&view.layout, global_shape, view.num_devices)
        .map_err(|e| sharding_error(sharding.py(), &e, Some(sharding)))?;
    Ok((view, map))
}

/// The index map of `sharding` over `global_shape`, with its view: where each device's slice
/// of the array lies. As in JAX, an unreduced sharding has none, since its devices hold partial
/// sums rather than slices.
fn index_map<'py>(
    sharding: &Bound<'py, PyAny>,
    global_shape: &[usize],
) -> PyResult<(ShardingView<'py>, IndexMap)> {
    let (view, map) = placement(sharding, global_shape)?;
    if map.unreduced() > 1 {
        let about = sharding
            .repr()
            .map_or_else(|_| String::new(), |r| format!("{r}: "));
        return Err(Error::NotImplemented(
            format!(
                "{about}devices_indices_map is not defined for an unreduced sharding: its devices \
             hold partial sums of their slices, whose sum is the array"
            )
            .into(),
        )
        .into());
    }
    Ok((view, map))
}

/// Reads `global_shape`, naming the argument when it is not a sequence of non-negative ints.
pub fn shape_arg(global_shape: &Bound<'_, PyAny>) -> PyResult<Vec<usize>> {
    let bad = || {
        let given = shown(global_shape);
        Error::Type(
            format!("global_shape must be a tuple of non-negative ints, got {given}").into(),
        )
        .into()
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
        Error::Value(
            "the sharding's mesh is abstract and has no devices; use fastpjit.indices_array \
             for per-position indices"
                .into(),
        )
        .into()
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

/// The index tuples of a map's tiles, built from one slice per (dimension, shard coordinate)
/// that every tile using it shares, as JAX shares them; `slice(None)` for a dimension split
/// once.
struct TileIndices<'py> {
    slices: Vec<Vec<Bound<'py, PyAny>>>,
    /// The tuple of each tile, once built.
    tuples: Vec<Option<Bound<'py, PyTuple>>>,
}

impl<'py> TileIndices<'py> {
    /// The tuples of the tiles that the devices at `positions` hold.
    fn new(py: Python<'py>, map: &IndexMap, positions: &[usize]) -> PyResult<Self> {
        let whole = PySlice::full(py).into_any();
        let slices = map
            .partitions()
            .iter()
            .zip(map.shard_shape())
            .map(|(&parts, &size)| {
                if parts == 1 {
                    Ok(vec![whole.clone()])
                } else {
                    (0..parts)
                        .map(|coord| slice(py, coord * size, (coord + 1) * size))
                        .collect()
                }
            })
            .collect::<PyResult<Vec<_>>>()?;
        let mut indices = Self {
            slices,
            tuples: Vec::new(),
        };
        if positions.len() >= map.num_tiles() {
            // Every tile is likely held: build them all in tile order, with no division.
            indices.tuples.reserve_exact(map.num_tiles());
            map.try_for_each_tile(|coords| {
                let tuple = indices.tuple(py, coords.iter().copied())?;
                indices.tuples.push(Some(tuple));
                Ok::<_, PyErr>(())
            })?;
        } else {
            // A few addressable devices of many: build only the tiles that they hold.
            indices.tuples = vec![None; map.num_tiles()];
            for &position in positions {
                let tile = map.tile_of_device()[position];
                if indices.tuples[tile].is_none() {
                    indices.tuples[tile] = Some(indices.tuple(py, map.tile_coords(tile))?);
                }
            }
        }
        Ok(indices)
    }

    fn tuple(
        &self,
        py: Python<'py>,
        coords: impl ExactSizeIterator<Item = usize>,
    ) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, self.slices.iter().zip(coords).map(|(dim, c)| &dim[c]))
    }

    /// The index tuple of `tile`, which `new` built for one of its positions.
    fn get(&self, tile: usize) -> &Bound<'py, PyTuple> {
        self.tuples[tile]
            .as_ref()
            .expect("a tuple is built for every tile held")
    }
}

/// The positions of the devices that this process can address.
fn addressable_positions(py: Python<'_>, devices: &[Bound<'_, PyAny>]) -> PyResult<Vec<usize>> {
    let Some(first) = devices.first() else {
        return Ok(Vec::new());
    };
    let this_process: i64 = first
        .getattr(names(py).client.bind(py))?
        .call_method0(names(py).process_index.bind(py))?
        .extract()?;
    let mut out = Vec::with_capacity(devices.len());
    for (position, device) in devices.iter().enumerate() {
        let process: i64 = device
            .getattr(names(py).process_index.bind(py))?
            .extract()?;
        if process == this_process {
            out.push(position);
        }
    }
    Ok(out)
}

/// A device of a sharding with the slice of the host array it holds: its index tuple, its
/// bounds, and its tile id (devices with equal ids hold equal data).
pub struct IndexedDevice<'py> {
    pub device: Bound<'py, PyAny>,
    pub index: Bound<'py, PyTuple>,
    pub bounds: Vec<(usize, usize)>,
    pub tile: usize,
}

/// The device positions to list (all, or those this process addresses) and their tiles'
/// index tuples.
fn indices_of<'py>(
    py: Python<'py>,
    map: &IndexMap,
    devices: &[Bound<'py, PyAny>],
    addressable_only: bool,
) -> PyResult<(Vec<usize>, TileIndices<'py>)> {
    let positions = if addressable_only {
        addressable_positions(py, devices)?
    } else {
        (0..devices.len()).collect()
    };
    let indices = TileIndices::new(py, map, &positions)?;
    Ok((positions, indices))
}

/// The devices of `sharding` (all, or those this process addresses) with their indices, in
/// device-assignment order, which is the order jaxlib expects shards in.
pub fn indexed_devices<'py>(
    sharding: &Bound<'py, PyAny>,
    global_shape: &[usize],
    addressable_only: bool,
) -> PyResult<(IndexMap, Vec<IndexedDevice<'py>>)> {
    let (view, map) = index_map(sharding, global_shape)?;
    let devices = devices_of(&view)?;
    let (positions, indices) = indices_of(sharding.py(), &map, devices, addressable_only)?;
    let out = positions
        .into_iter()
        .map(|position| {
            let tile = map.tile_of_device()[position];
            IndexedDevice {
                device: devices[position].clone(),
                index: indices.get(tile).clone(),
                bounds: map.tile_bounds(tile).collect(),
                tile,
            }
        })
        .collect();
    Ok((map, out))
}

// SAFETY: the declaration matches CPython's `PyObject *_PyDict_NewPresized(Py_ssize_t)`.
unsafe extern "C" {
    /// The interpreter's `_PyDict_NewPresized`: private API, so pyo3-ffi leaves it out, but
    /// exported by every version we support (3.13 restored it after a removal, for the many
    /// projects that use it, orjson among them).
    fn _PyDict_NewPresized(minused: ffi::Py_ssize_t) -> *mut ffi::PyObject;
}

/// An empty dict with room for `len` items, so that filling it never resizes.
fn presized_dict(py: Python<'_>, len: usize) -> PyResult<Bound<'_, PyDict>> {
    let len = ffi::Py_ssize_t::try_from(len)?;
    // SAFETY: the GIL is held (`py`); the call returns a new reference to a dict, or null with
    // an exception set.
    let dict = unsafe { Bound::from_owned_ptr_or_err(py, _PyDict_NewPresized(len))? };
    // SAFETY: `_PyDict_NewPresized` returns a dict.
    Ok(unsafe { dict.cast_into_unchecked() })
}

fn indices_dict<'py>(
    sharding: &Bound<'py, PyAny>,
    global_shape: &[usize],
    addressable_only: bool,
) -> PyResult<Bound<'py, PyDict>> {
    let (view, map) = index_map(sharding, global_shape)?;
    let devices = devices_of(&view)?;
    let (positions, indices) = indices_of(sharding.py(), &map, devices, addressable_only)?;
    let out = presized_dict(sharding.py(), positions.len())?;
    for position in positions {
        let tile = map.tile_of_device()[position];
        out.set_item(&devices[position], indices.get(tile))?;
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

/// The shape of each shard, equal to JAX's `sharding.shard_shape` (unreduced shardings
/// included).
#[pyfunction]
pub fn shard_shape<'py>(
    py: Python<'py>,
    sharding: &Bound<'py, PyAny>,
    global_shape: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyTuple>> {
    let (_, map) = placement(sharding, &shape_arg(global_shape)?)?;
    PyTuple::new(py, map.shard_shape())
}

/// `{device: (index, partial sum)}`: the slice of the array that each device's data covers,
/// as `devices_indices_map` gives it, and which of that slice's partial sums the device holds
/// (0 for every device of a sharding that is not unreduced). Two shardings place data alike
/// exactly when these are equal.
#[pyfunction]
pub fn device_placement_map<'py>(
    py: Python<'py>,
    sharding: &Bound<'py, PyAny>,
    global_shape: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyDict>> {
    let (view, map) = placement(sharding, &shape_arg(global_shape)?)?;
    let devices = devices_of(&view)?;
    let (positions, indices) = indices_of(py, &map, devices, false)?;
    let out = presized_dict(py, positions.len())?;
    for position in positions {
        let index = indices.get(map.tile_of_device()[position]);
        out.set_item(&devices[position], (index, map.member_of_device(position)))?;
    }
    Ok(out)
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
    let out = presized_dict(py, devices.len())?;
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
    let dims = [map.num_devices(), map.ndim(), 2];
    // SAFETY: the GIL is held; the array is new, C-ordered and not yet shared, and
    // `write_bounds` below initializes every element before it is returned.
    let out = unsafe { PyArray3::<i64>::new(py, dims, false) };
    let len = dims.iter().product();
    if len > 0 {
        // SAFETY: `out` owns `len` contiguous, aligned i64 slots that nothing else references
        // until it is returned; `MaybeUninit` makes no claim that they hold values.
        let slots =
            unsafe { std::slice::from_raw_parts_mut(out.data().cast::<MaybeUninit<i64>>(), len) };
        py.detach(|| map.write_bounds(slots));
    }
    Ok(out)
}

/// Reads HLO sharding text and returns it in canonical form; with a device count, checks that
/// it shards one array over that many devices.
#[pyfunction]
#[pyo3(signature = (text, num_devices))]
pub fn canonical_hlo_sharding(
    py: Python<'_>,
    text: &str,
    num_devices: Option<usize>,
) -> PyResult<String> {
    let hlo = HloSharding::parse(text).map_err(|e| sharding_error(py, &e, None))?;
    if let Some(num_devices) = num_devices {
        hlo.check_for_array(num_devices)
            .map_err(|e| sharding_error(py, &e, None))?;
    }
    Ok(hlo.to_string())
}
