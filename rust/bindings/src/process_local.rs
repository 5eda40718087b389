//! `make_array_from_process_local_data` for one leaf: this process's host data placed on its
//! devices as its part of one global array, through the shard path of `device_put`.

use std::sync::Arc;

use fastpjit_core::error::python_tuple;
use fastpjit_core::{local_blocks, process_block_counts, IndexMap};
use numpy::{PyUntypedArray, PyUntypedArrayMethods};
use pyo3::prelude::*;
use pyo3::types::{PySlice, PyTuple};

use crate::errors::{sharding_error, shown, Error};
use crate::handles::names;
use crate::index_maps::{indexed_devices, shape_arg, IndexedDevice};
use crate::memo::SharedMemo;
use crate::sharding::view;
use crate::transfer::{host_value, id, put, PutPlan};

/// Plans keyed by (sharding, dtype, local shape, global shape if given).
type LocalKey = (usize, usize, Vec<usize>, Option<Vec<usize>>);
static LOCAL_PLANS: SharedMemo<LocalKey, Arc<PutPlan>> = SharedMemo::new(256);

pub fn plans_cached() -> usize {
    LOCAL_PLANS.len()
}

/// Places `local_data` (a numpy array or scalar) on this process's devices of `sharding` as
/// this process's part of a global array of `global_shape` (by default the shape that the
/// local data implies); equal to `jax.make_array_from_process_local_data` for one leaf.
#[pyfunction]
#[pyo3(signature = (local_data, sharding, global_shape = None))]
pub fn make_array_from_process_local_leaf<'py>(
    local_data: &Bound<'py, PyAny>,
    sharding: &Bound<'py, PyAny>,
    global_shape: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyAny>> {
    let value = host_value(local_data)?;
    if value.is_float0()? {
        return Err(Error::Type("local_data of dtype float0 has no data to place".into()).into());
    }
    let local_shape = value.array.cast::<PyUntypedArray>()?.shape().to_vec();
    let global_shape = global_shape.map(shape_arg).transpose()?;
    let key = (
        id(sharding),
        id(&value.dtype),
        local_shape.clone(),
        global_shape.clone(),
    );
    if let Some(plan) = LOCAL_PLANS.get(&key) {
        return put(&value, sharding, &plan, true);
    }
    let plan = Arc::new(local_plan(
        sharding,
        &local_shape,
        global_shape,
        &value.dtype,
    )?);
    LOCAL_PLANS.insert(key, plan.clone());
    put(&value, sharding, &plan, true)
}

fn local_plan(
    sharding: &Bound<'_, PyAny>,
    local_shape: &[usize],
    global_shape: Option<Vec<usize>>,
    dtype: &Bound<'_, PyAny>,
) -> PyResult<PutPlan> {
    let py = sharding.py();
    let global_shape = match global_shape {
        Some(shape) => shape,
        None => implied_global_shape(sharding, local_shape)?,
    };
    let (map, devices) = indexed_devices(sharding, &global_shape, true)?;
    if devices.is_empty() {
        return Err(no_devices_here(sharding));
    }
    let tiles: Vec<usize> = devices.iter().map(|d| d.tile).collect();
    let blocks = local_blocks(&map, &tiles, local_shape).map_err(Error::from)?;
    let whole = blocks.iter().all(|block| {
        block
            .iter()
            .zip(local_shape)
            .all(|(&(start, stop), &size)| start == 0 && stop == size)
    });
    let shards = devices
        .into_iter()
        .zip(blocks)
        .map(|(d, bounds)| {
            let index = PyTuple::new(
                py,
                bounds
                    .iter()
                    .map(|&(start, stop)| PySlice::new(py, start as isize, stop as isize, 1)),
            )?;
            Ok(IndexedDevice {
                device: d.device,
                index,
                bounds,
                tile: d.tile,
            })
        })
        .collect::<PyResult<Vec<_>>>()?;
    PutPlan::new(
        sharding,
        &global_shape,
        dtype,
        false,
        &shards,
        map.shard_shape(),
        whole,
    )
}

/// The global shape that local data of `local_shape` implies: in each dimension, its extent
/// times the number of distinct blocks that the processes hold.
fn implied_global_shape(
    sharding: &Bound<'_, PyAny>,
    local_shape: &[usize],
) -> PyResult<Vec<usize>> {
    let py = sharding.py();
    let ndim = local_shape.len();
    let view = view(sharding, ndim)?;
    let devices = view
        .devices
        .as_deref()
        .ok_or_else(|| Error::Value("the sharding's mesh is abstract and has no devices".into()))?;
    let first = devices.first().ok_or_else(|| no_devices_here(sharding))?;
    let this_process: usize = first
        .getattr(names(py).client.bind(py))?
        .call_method0(names(py).process_index.bind(py))?
        .extract()?;
    let processes = devices
        .iter()
        .map(|d| d.getattr(names(py).process_index.bind(py))?.extract())
        .collect::<PyResult<Vec<usize>>>()?;
    if !processes.contains(&this_process) {
        return Err(no_devices_here(sharding));
    }
    // Every split divides the device count, so this shape fits any sharding of these devices.
    let universal = vec![view.num_devices; ndim];
    let map = IndexMap::new(&view.layout, &universal, view.num_devices)
        .map_err(|e| sharding_error(py, &e, Some(sharding)))?;
    let counts = process_block_counts(&map, &processes, this_process);
    if counts.iter().all(Option::is_some) {
        return Ok(counts
            .iter()
            .zip(local_shape)
            .map(|(count, &size)| count.unwrap_or(0) * size)
            .collect());
    }
    let partial: Vec<String> = counts
        .iter()
        .zip(local_shape)
        .map(|(count, &size)| count.map_or_else(|| "None".to_owned(), |c| (c * size).to_string()))
        .collect();
    let partial = python_tuple(&partial);
    Err(Error::Value(
        format!(
            "Unable to compute global_shape due to non-uniform sharding. Specify global shape \
         directly. Partially computed global_shape={partial}."
        )
        .into(),
    )
    .into())
}

fn no_devices_here(sharding: &Bound<'_, PyAny>) -> PyErr {
    let shown = shown(sharding);
    Error::Value(
        format!(
            "make_array_from_process_local_data: sharding {shown} has no devices in this process, \
         so there is nowhere to place its local data"
        )
        .into(),
    )
    .into()
}
