//! Host arrays to sharded device arrays and back: the shard path that `device_put` and
//! `device_get` use, and that the jit and pmap dispatchers call for host arguments.

use std::sync::Arc;

use fastpjit_core::strided::{assemble, Placement, StridedView};
use fastpjit_core::transfer::{
    copy_threads, int_fits, DistinctTiles, HostLayout, PutMethod, Staging, ADOPT_ALIGN,
};
use fastpjit_core::{Fallback, Whole};
use numpy::{PyArrayDescr, PyArrayDescrMethods, PyUntypedArray, PyUntypedArrayMethods};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyComplex, PyFloat, PyInt, PyList, PySlice, PyString, PyTuple};

use crate::errors::{shown, Error};
use crate::handles::{handles, names, Handles};
use crate::host_memory::{empty_array, POOLED_BYTES};
use crate::index_maps::{indexed_devices, IndexedDevice};
use crate::memo::SharedMemo;
use crate::shard_buffer::{spanned_bytes, ShardBuffer};
use crate::stats::count_fallback;

/// Identity of a Python object, valid while the cache entry holds a reference to it.
pub fn id(obj: &Bound<'_, PyAny>) -> usize {
    obj.as_ptr() as usize
}

/// A dtype and its canonical form; holding the first keeps its identity valid as a key.
type DtypePair = Arc<(Py<PyAny>, Py<PyAny>)>;

/// The canonical dtype of each dtype seen, keyed by identity and by whether x64 is on (which
/// `jax.enable_x64` can change at any time, per thread).
static CANONICAL_DTYPES: SharedMemo<(usize, bool), DtypePair> = SharedMemo::new(256);

fn canonical_dtype<'py>(dtype: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
    let py = dtype.py();
    let h = handles(py)?;
    let x64 = h
        .jax_config
        .bind(py)
        .getattr(names(py).jax_enable_x64.bind(py))?
        .is_truthy()?;
    let key = (id(dtype), x64);
    if let Some(entry) = CANONICAL_DTYPES.get(&key) {
        return Ok(entry.1.bind(py).clone());
    }
    let canonical = h.canonical_dtype.bind(py).call1((dtype,))?;
    CANONICAL_DTYPES.insert(
        key,
        Arc::new((dtype.clone().unbind(), canonical.clone().unbind())),
    );
    Ok(canonical)
}

/// What `batched_device_put` needs for one (sharding, shape, dtype, weak type), built once.
pub struct PutPlan {
    _pinned: (Py<PyAny>, Py<PyAny>),
    aval: Py<PyAny>,
    devices: Py<PyList>,
    /// The index of each device's shard, or `None` when every device holds the whole array.
    indices: Option<Vec<Py<PyTuple>>>,
    /// On the CPU, the tiles' layout, which decides how values are handed to jaxlib: staged
    /// in buffers of our own when large, else adopted or copied by jaxlib (see
    /// `Staging::method`).
    staging: Option<Staging>,
}

type PutKey = (usize, usize, bool, Vec<usize>);
static PUT_PLANS: SharedMemo<PutKey, Arc<PutPlan>> = SharedMemo::new(512);

fn put_plan(
    sharding: &Bound<'_, PyAny>,
    shape: &[usize],
    dtype: &Bound<'_, PyAny>,
    weak_type: bool,
) -> PyResult<Arc<PutPlan>> {
    let key = (id(sharding), id(dtype), weak_type, shape.to_vec());
    if let Some(plan) = PUT_PLANS.get(&key) {
        return Ok(plan);
    }
    let (map, shards) = indexed_devices(sharding, shape, true)?;
    let whole = map.num_tiles() <= 1;
    let plan = Arc::new(PutPlan::new(
        sharding,
        shape,
        dtype,
        weak_type,
        &shards,
        map.shard_shape(),
        whole,
    )?);
    PUT_PLANS.insert(key, plan.clone());
    Ok(plan)
}

impl PutPlan {
    /// The plan that puts a host array onto `sharding` as a global array of `global_shape`,
    /// each addressable device taking its shard's block of the host array; `whole`: every
    /// block is the whole host array.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        sharding: &Bound<'_, PyAny>,
        global_shape: &[usize],
        dtype: &Bound<'_, PyAny>,
        weak_type: bool,
        shards: &[IndexedDevice<'_>],
        shard_shape: &[usize],
        whole: bool,
    ) -> PyResult<Self> {
        let py = sharding.py();
        let aval = handles(py)?.device_put_aval.bind(py).call1((
            PyTuple::new(py, global_shape)?,
            dtype,
            weak_type,
            sharding,
        ))?;
        let indices = (!whole).then(|| shards.iter().map(|s| s.index.clone().unbind()).collect());
        let on_cpu = match shards.first() {
            Some(first) => {
                first
                    .device
                    .getattr(names(py).platform.bind(py))?
                    .extract::<String>()?
                    == "cpu"
            }
            None => false,
        };
        let staging = on_cpu.then(|| Staging {
            tiles: DistinctTiles::new(shards.iter().map(|s| (s.tile, s.bounds.as_slice()))),
            shard_shape: shard_shape.to_vec(),
        });
        Ok(Self {
            _pinned: (sharding.clone().unbind(), dtype.clone().unbind()),
            aval: aval.unbind(),
            devices: PyList::new(py, shards.iter().map(|s| &s.device))?.unbind(),
            indices,
            staging,
        })
    }
}

/// `x` as a numpy array, and whether JAX would give it a weak type (Python int, float, complex).
fn host_array<'py>(x: &Bound<'py, PyAny>) -> PyResult<(Bound<'py, PyAny>, bool)> {
    let py = x.py();
    let h = handles(py)?;
    if x.is_instance(h.arrays.ndarray.bind(py))? {
        if x.is_instance(h.masked_array.bind(py))? {
            return Err(Error::Value(
                "numpy masked arrays are not supported as direct inputs to JAX functions. Use \
                 arr.filled() to convert the value to a standard numpy array."
                    .into(),
            )
            .into());
        }
        return Ok((x.clone(), false));
    }
    if x.is_instance(h.arrays.numpy_scalar.bind(py))? || x.is_instance_of::<PyBool>() {
        return Ok((h.arrays.asarray.bind(py).call1((x,))?, false));
    }
    if x.is_instance_of::<PyInt>()
        || x.is_instance_of::<PyFloat>()
        || x.is_instance_of::<PyComplex>()
    {
        let kind = if x.is_instance_of::<PyInt>() {
            py.get_type::<PyInt>()
        } else if x.is_instance_of::<PyFloat>() {
            py.get_type::<PyFloat>()
        } else {
            py.get_type::<PyComplex>()
        };
        let dtype = h.python_scalar_dtype.bind(py).call1((kind,))?;
        if x.is_instance_of::<PyInt>() {
            check_int_fits(x, &dtype)?;
        }
        return Ok((h.arrays.asarray.bind(py).call1((x, dtype))?, true));
    }
    let given = shown(x);
    Err(Error::Type(
        format!(
            "Argument {given} of type {} is not a valid JAX type: expected a numpy array, a \
             numpy scalar, a Python bool, int, float or complex, or a jax.Array",
            x.get_type().name()?
        )
        .into(),
    )
    .into())
}

/// JAX's `OverflowError` for a Python int that `dtype` (int32, or int64 with x64) cannot hold;
/// numpy's own message would not name the value for ints beyond 64 bits.
fn check_int_fits(x: &Bound<'_, PyAny>, dtype: &Bound<'_, PyAny>) -> PyResult<()> {
    let bits = dtype.cast::<PyArrayDescr>()?.itemsize() * 8;
    if int_fits(x.extract::<i64>().ok(), bits) {
        return Ok(());
    }
    Err(Error::Overflow(format!("Python int {x} too large to convert to {dtype}").into()).into())
}

/// A host value as the numpy array that JAX places: canonical dtype, and whether it is weakly
/// typed.
pub struct HostValue<'py> {
    pub array: Bound<'py, PyAny>,
    pub dtype: Bound<'py, PyAny>,
    pub weak_type: bool,
}

impl HostValue<'_> {
    /// float0, the tangent type of integers, has no bytes to place.
    pub fn is_float0(&self) -> PyResult<bool> {
        Ok(self.dtype.cast::<PyArrayDescr>()?.itemsize() == 0)
    }
}

pub fn host_value<'py>(x: &Bound<'py, PyAny>) -> PyResult<HostValue<'py>> {
    let py = x.py();
    let (array, weak_type) = host_array(x)?;
    let dtype = array.getattr(names(py).dtype.bind(py))?;
    let canonical = canonical_dtype(&dtype)?;
    let array = if canonical.is(&dtype) || canonical.eq(&dtype)? {
        array
    } else {
        array.call_method1(names(py).astype.bind(py), (&canonical,))?
    };
    Ok(HostValue {
        array,
        dtype: canonical,
        weak_type,
    })
}

fn place<'py>(
    value: &HostValue<'py>,
    sharding: &Bound<'py, PyAny>,
    committed: bool,
) -> PyResult<Bound<'py, PyAny>> {
    let shape: Vec<usize> = value.array.cast::<PyUntypedArray>()?.shape().to_vec();
    let plan = put_plan(sharding, &shape, &value.dtype, value.weak_type)?;
    put(value, sharding, &plan, committed)
}

/// How one host argument of a cached executable (a numpy array or scalar, a Python scalar) is
/// placed on every call: planned once, from the call that missed, for the dtype, shape and
/// kind of value that the cache entry's signature fixes.
pub struct HostInput {
    /// The executable's input sharding, and the same layout as jaxlib reads it fastest (see
    /// `placement_sharding`), on which the value is placed unless the transfer guard watches.
    target: Py<PyAny>,
    placement: Py<PyAny>,
    plan: Arc<PutPlan>,
    dtype: Py<PyAny>,
    weak_type: bool,
    source: HostSource,
}

/// The kinds of host value, as each becomes the numpy array placed.
enum HostSource {
    /// A numpy array of the canonical dtype, placed as it is.
    Array,
    /// A numpy array or scalar converted to the canonical dtype (float64 without x64, say).
    Converted,
    /// A Python scalar, made a 0-d array of the canonical dtype.
    Scalar { int: bool },
}

impl HostInput {
    /// The plan for values like `leaf` bound for `target`, an executable's input sharding.
    pub fn new(leaf: &Bound<'_, PyAny>, target: &Bound<'_, PyAny>) -> PyResult<Self> {
        let py = leaf.py();
        let h = handles(py)?;
        let value = host_value(leaf)?;
        let shape = value.array.cast::<PyUntypedArray>()?.shape().to_vec();
        let placement = h.placement_sharding.bind(py).call1((target, shape.len()))?;
        // Planned on the placement, whose aval, as JAX's for an argument, has no mesh axes.
        let plan = put_plan(&placement, &shape, &value.dtype, value.weak_type)?;
        let source = if leaf.is_instance_of::<PyInt>()
            || leaf.is_instance_of::<PyFloat>()
            || leaf.is_instance_of::<PyComplex>()
        {
            HostSource::Scalar {
                int: leaf.is_instance_of::<PyInt>() && !leaf.is_instance_of::<PyBool>(),
            }
        } else if value.array.is(leaf) {
            HostSource::Array
        } else {
            HostSource::Converted
        };
        Ok(Self {
            target: target.clone().unbind(),
            placement: placement.unbind(),
            plan,
            dtype: value.dtype.unbind(),
            weak_type: value.weak_type,
            source,
        })
    }

    /// The executable's input sharding that this input is placed on.
    pub fn target(&self) -> &Py<PyAny> {
        &self.target
    }

    /// Places `leaf`, a value of the kind this input was planned for.
    pub fn place<'py>(&self, leaf: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
        self.place_on(leaf, self.placement.bind(leaf.py()))
    }

    /// Places `leaf` on the executable's input sharding itself, which the transfer guard
    /// names when it logs or refuses the transfer, as it does for JAX's.
    pub fn place_guarded<'py>(&self, leaf: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
        self.place_on(leaf, self.target.bind(leaf.py()))
    }

    fn place_on<'py>(
        &self,
        leaf: &Bound<'py, PyAny>,
        sharding: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let py = leaf.py();
        let h = handles(py)?;
        let dtype = self.dtype.bind(py);
        let array = match self.source {
            HostSource::Array => leaf.clone(),
            HostSource::Converted => h.arrays.asarray.bind(py).call1((leaf, dtype))?,
            HostSource::Scalar { int } => {
                if int {
                    check_int_fits(leaf, dtype)?;
                }
                h.arrays.asarray.bind(py).call1((leaf, dtype))?
            }
        };
        let value = HostValue {
            array,
            dtype: dtype.clone(),
            weak_type: self.weak_type,
        };
        put_as_jax(&value, sharding, &self.plan)
    }
}

/// Places a host value by `plan`, which was made for its shape and dtype on `sharding`.
pub fn put<'py>(
    value: &HostValue<'py>,
    sharding: &Bound<'py, PyAny>,
    plan: &PutPlan,
    committed: bool,
) -> PyResult<Bound<'py, PyAny>> {
    let py = sharding.py();
    let array = &value.array;
    let untyped = array.cast::<PyUntypedArray>()?;
    let h = handles(py)?;
    // On the CPU, jaxlib adopts aligned dense shards (ours when staged) and copies the rest,
    // which it does sooner when told that it must; elsewhere it copies everything.
    let (shards, semantics) = match &plan.staging {
        Some(staging) => match staging.method(&host_layout(untyped), POOLED_BYTES) {
            PutMethod::Stage => (PyList::new(py, stage(untyped, staging)?)?, &h.zero_copy),
            PutMethod::ZeroCopy => (slices(array, plan)?, &h.zero_copy),
            PutMethod::Copy => (slices(array, plan)?, &h.copy),
        },
        None => (slices(array, plan)?, &h.zero_copy),
    };
    batched_put(plan, sharding, shards, committed, semantics.bind(py))
}

/// jaxlib's put of `shards`, one per device of `plan`, as one array on `sharding`.
fn batched_put<'py>(
    plan: &PutPlan,
    sharding: &Bound<'py, PyAny>,
    shards: Bound<'py, PyList>,
    committed: bool,
    semantics: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyAny>> {
    let py = sharding.py();
    handles(py)?.batched_device_put.bind(py).call1((
        plan.aval.bind(py),
        sharding,
        shards,
        plan.devices.bind(py),
        committed,
        false,
        semantics,
    ))
}

/// Places a host argument of a call by `plan` as JAX's dispatch places it: each device's
/// numpy view handed to jaxlib, which adopts aligned memory and copies the rest, the copy
/// off the calling thread. (`put` stages large tiles itself, for `device_put`, which
/// returns the array; a call's input lives for the call only.)
fn put_as_jax<'py>(
    value: &HostValue<'py>,
    sharding: &Bound<'py, PyAny>,
    plan: &PutPlan,
) -> PyResult<Bound<'py, PyAny>> {
    let py = sharding.py();
    let shards = slices(&value.array, plan)?;
    batched_put(
        plan,
        sharding,
        shards,
        false,
        handles(py)?.zero_copy.bind(py),
    )
}

/// Each device's shard of `array`, as numpy views.
fn slices<'py>(array: &Bound<'py, PyAny>, plan: &PutPlan) -> PyResult<Bound<'py, PyList>> {
    let py = array.py();
    let devices = plan.devices.bind(py).len();
    match &plan.indices {
        None => PyList::new(py, std::iter::repeat_n(array, devices)),
        Some(indices) => PyList::new(
            py,
            indices
                .iter()
                .map(|index| array.get_item(index.bind(py)))
                .collect::<PyResult<Vec<_>>>()?,
        ),
    }
}

/// Copies each distinct tile of `array` into a new aligned buffer (GIL released); returns the
/// buffer of each device, shared by the devices that hold one tile.
fn stage<'py>(
    array: &Bound<'py, PyUntypedArray>,
    staging: &Staging,
) -> PyResult<Vec<Bound<'py, PyAny>>> {
    let py = array.py();
    let dtype = array.dtype();
    let itemsize = dtype.itemsize();
    let buffers = staging
        .tiles
        .bounds
        .iter()
        .map(|_| aligned_empty(&staging.shard_shape, &dtype))
        .collect::<PyResult<Vec<_>>>()?;
    // SAFETY: `array` and the fresh `buffers` stay alive, and the buffers unshared, until the
    // copies finish; each buffer is a C-ordered array of the shard's shape.
    let (src, whole) = unsafe { array_bytes(array) };
    let mut dsts = buffers
        .iter()
        .map(|buffer| {
            let buffer = buffer.cast::<PyUntypedArray>()?;
            let len = buffer.len() * itemsize;
            // SAFETY: a fresh C-ordered buffer of the shard's shape holds `len` bytes at its
            // data pointer, which no other reference reads or writes during the copies.
            Ok(unsafe {
                std::slice::from_raw_parts_mut(
                    (*buffer.as_array_ptr()).fields.data.cast::<u8>(),
                    len,
                )
            })
        })
        .collect::<PyResult<Vec<_>>>()?;
    let threads = copy_threads();
    py.detach(|| staging.stage(src, &whole, itemsize, &mut dsts, threads))
        .map_err(|err| Error::Copy {
            what: "staging the host value",
            err,
        })?;
    Ok(staging
        .tiles
        .tile_of_device
        .iter()
        .map(|&t| buffers[t].clone())
        .collect())
}

/// The layout of a numpy array's memory, in the core's terms.
fn host_layout<'a>(array: &'a Bound<'_, PyUntypedArray>) -> HostLayout<'a> {
    HostLayout {
        // SAFETY: reads the data pointer of a live array.
        address: unsafe { (*array.as_array_ptr()).fields.data } as usize,
        shape: array.shape(),
        strides: array.strides(),
        itemsize: array.dtype().itemsize(),
    }
}

/// A new C-ordered array of `shape` and `dtype` whose data starts on an `ADOPT_ALIGN` boundary,
/// where jaxlib adopts a host buffer instead of copying it.
fn aligned_empty<'py>(
    shape: &[usize],
    dtype: &Bound<'py, PyArrayDescr>,
) -> PyResult<Bound<'py, PyAny>> {
    let py = dtype.py();
    let nbytes = shape.iter().product::<usize>() * dtype.itemsize();
    if nbytes >= POOLED_BYTES {
        // Pooled memory starts on a huge-page boundary.
        return Ok(empty_array(shape, dtype)?.into_any());
    }
    let raw = handles(py)?
        .empty
        .bind(py)
        .call1((nbytes + ADOPT_ALIGN, names(py).uint8.bind(py)))?;
    // SAFETY: reading the data pointer of a live numpy array (only its address is used).
    let address = unsafe { (*raw.cast::<PyUntypedArray>()?.as_array_ptr()).fields.data } as usize;
    let offset = (ADOPT_ALIGN - address % ADOPT_ALIGN) % ADOPT_ALIGN;
    let bytes = raw.get_item(PySlice::new(
        py,
        offset as isize,
        (offset + nbytes) as isize,
        1,
    ))?;
    bytes
        .call_method1(names(py).view.bind(py), (dtype,))?
        .call_method1(names(py).reshape.bind(py), (PyTuple::new(py, shape)?,))
}

/// How `device_get` reads arrays of one sharding and shape.
struct GetPlan {
    _pinned: Py<PyAny>,
    /// Whether every device holds the whole array (the sharding's `is_fully_replicated`).
    fully_replicated: bool,
    /// The distinct tiles, each read from its first holder (its position among the
    /// addressable devices is its index in `_arrays`).
    tiles: DistinctTiles,
    tile_shapes: Vec<Vec<usize>>,
    /// Whether the addressable devices hold every tile (always, unless multi-process).
    complete: bool,
    /// Whether the shards live in host memory (CPU devices), where jaxlib lends their bytes
    /// through the buffer protocol; elsewhere each must be copied to the host, and those
    /// copies are worth starting early.
    on_cpu: bool,
}

static GET_PLANS: SharedMemo<(usize, Vec<usize>), Arc<GetPlan>> = SharedMemo::new(512);

fn get_plan(sharding: &Bound<'_, PyAny>, shape: &[usize]) -> PyResult<Arc<GetPlan>> {
    let key = (id(sharding), shape.to_vec());
    if let Some(plan) = GET_PLANS.get(&key) {
        return Ok(plan);
    }
    let py = sharding.py();
    // `indexed_devices` keeps device-assignment order, so position k is `_arrays[k]`.
    let (map, devices) = indexed_devices(sharding, shape, true)?;
    let tiles = DistinctTiles::new(devices.iter().map(|d| (d.tile, d.bounds.as_slice())));
    let platform = match devices.first() {
        Some(first) => first
            .device
            .getattr(names(py).platform.bind(py))?
            .extract::<String>()?,
        None => String::new(),
    };
    let plan = Arc::new(GetPlan {
        _pinned: sharding.clone().unbind(),
        fully_replicated: sharding
            .getattr(names(py).is_fully_replicated.bind(py))?
            .is_truthy()?,
        on_cpu: platform == "cpu",
        complete: tiles.len() == map.num_tiles(),
        tile_shapes: (0..tiles.len()).map(|t| tiles.shape(t)).collect(),
        tiles,
    });
    GET_PLANS.insert(key, plan.clone());
    Ok(plan)
}

/// A numpy array's bytes and a strided view over them.
///
/// # Safety
/// The slice borrows the array's memory: the caller keeps `array` alive, and nothing may
/// resize it, while the slice is used.
unsafe fn array_bytes<'a>(array: &'a Bound<'_, PyUntypedArray>) -> (&'a [u8], StridedView) {
    spanned_bytes(
        (*array.as_array_ptr()).fields.data.cast::<u8>(),
        array.shape().to_vec(),
        array.strides().to_vec(),
        array.dtype().itemsize(),
    )
}

/// JAX's error for a deleted or donated array.
pub fn deleted_error(array: &Bound<'_, PyAny>) -> PyResult<PyErr> {
    let py = array.py();
    let shape = array
        .getattr(names(py).aval.bind(py))?
        .call_method0(names(py).str_short.bind(py))?;
    Ok(Error::Runtime(format!("Array has been deleted with shape={shape}.").into()).into())
}

/// The numpy value of a jax.Array, equal to `np.asarray(x)`; other values come back as
/// `jax.device_get` gives them: converted by their `__array__` (numpy scalars become 0-d
/// arrays), or as given.
pub fn get_host_value<'py>(x: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
    let py = x.py();
    let h = handles(py)?;
    if !x.get_type().is(h.arrays.array_impl.bind(py)) {
        if x.is_instance(h.jax_array.bind(py))? {
            count_fallback(Fallback::Whole(Whole::GetOtherArray));
            return h.jax_device_get.bind(py).call1((x,));
        }
        if x.get_type().is(h.arrays.ndarray.bind(py)) {
            return Ok(x.clone());
        }
        return match x.getattr_opt(names(py).__array__.bind(py))? {
            Some(to_array) => to_array.call0(),
            None => Ok(x.clone()),
        };
    }
    if h.arrays
        .array_is_deleted
        .bind(py)
        .call1((x,))?
        .is_truthy()?
    {
        return Err(deleted_error(x)?);
    }
    let aval = h.arrays.array_aval.bind(py).call1((x,))?;
    let dtype = aval.getattr(names(py).dtype.bind(py))?;
    let descr = match dtype.cast::<PyArrayDescr>() {
        // Byte copies are only right for plain data: JAX converts extended dtypes (PRNG keys)
        // by their own rule, and StringDType items point into their array's own storage.
        Ok(descr) if !descr.has_object() => descr,
        _ => {
            count_fallback(Fallback::Whole(Whole::GetKeyOrString));
            return h.jax_device_get.bind(py).call1((x,));
        }
    };
    let cached = x.getattr(h.host_value.bind(py))?;
    if !cached.is_none() {
        return Ok(cached);
    }
    let shape: Vec<usize> = aval.getattr(names(py).shape.bind(py))?.extract()?;
    if shape.contains(&0) {
        return empty_host_value(h, x, &shape, descr);
    }
    let sharding = h.arrays.array_sharding.bind(py).call1((x,))?;
    let plan = get_plan(&sharding, &shape)?;
    if plan.fully_replicated {
        return host_view(h, x);
    }
    if !plan.complete {
        return Err(Error::Runtime(
            "Fetching value for `jax.Array` that spans non-addressable (non process local) \
             devices is not possible. You can use \
             `jax.experimental.multihost_utils.process_allgather` to print the global array or \
             use `.addressable_shards` method of jax.Array to inspect the addressable (process \
             local) shards."
                .into(),
        )
        .into());
    }
    let out = assemble_shards(h, x, &plan, &shape, descr)?;
    x.setattr(h.host_value.bind(py), &out)?;
    Ok(out)
}

/// A shard's bytes: lent by jaxlib through the buffer protocol, or a numpy view (or host
/// copy) of it made as `np.asarray` makes one.
enum ShardBytes<'py> {
    Lent(ShardBuffer),
    Viewed(Bound<'py, PyUntypedArray>),
}

/// Copies the first holder's shard of each distinct tile into one new read-only array.
fn assemble_shards<'py>(
    h: &Handles,
    x: &Bound<'py, PyAny>,
    plan: &GetPlan,
    shape: &[usize],
    descr: &Bound<'py, PyArrayDescr>,
) -> PyResult<Bound<'py, PyAny>> {
    let py = x.py();
    // One call builds every single-device array (jaxlib keeps them in `x`).
    let singles = h.single_device_arrays.bind(py).call1((x,))?;
    let sources = plan
        .tiles
        .first_holder
        .iter()
        .map(|&holder| singles.get_item(holder))
        .collect::<PyResult<Vec<_>>>()?;
    if !plan.on_cpu {
        // Start every device-to-host copy before waiting on the first.
        for single in &sources {
            h.copy_to_host_async.bind(py).call1((single,))?;
        }
    }
    let itemsize = descr.itemsize();
    let lendable = plan.on_cpu && has_plain_bytes(descr);
    let shards = sources
        .iter()
        .zip(&plan.tile_shapes)
        .map(|(single, shape)| {
            if lendable {
                if let Some(buffer) = ShardBuffer::get(single, shape, itemsize) {
                    return Ok(ShardBytes::Lent(buffer));
                }
            }
            let view = h.arrays.asarray.bind(py).call1((single,))?;
            Ok(ShardBytes::Viewed(view.cast_into::<PyUntypedArray>()?))
        })
        .collect::<PyResult<Vec<_>>>()?;
    let out = empty_array(shape, descr)?;
    let nbytes = out.len() * itemsize;
    // SAFETY: `shards` (each holding its shard's memory) and `out` stay alive and unshared
    // until the copies finish; `out` is a fresh C-ordered array of `nbytes` bytes.
    let placements = shards
        .iter()
        .zip(&plan.tiles.bounds)
        .map(|(shard, bounds)| {
            let (src, view) = match shard {
                ShardBytes::Lent(buffer) => buffer.bytes(),
                // SAFETY: `shards` keeps the viewed arrays alive until the copies finish.
                ShardBytes::Viewed(view) => unsafe { array_bytes(view) },
            };
            Placement {
                src,
                view,
                bounds: bounds.clone(),
            }
        })
        .collect::<Vec<_>>();
    // SAFETY: `out` is a fresh C-ordered array of `nbytes` bytes that nothing else references.
    let dst = unsafe {
        std::slice::from_raw_parts_mut((*out.as_array_ptr()).fields.data.cast::<u8>(), nbytes)
    };
    let run = |dst: &mut [u8]| assemble(dst, shape, itemsize, &placements, copy_threads());
    // Handing the GIL over costs more than copying a small array.
    let copied = if nbytes >= DETACH_BYTES {
        py.detach(|| run(dst))
    } else {
        run(dst)
    };
    copied.map_err(|err| Error::Copy {
        what: "assembling the host value",
        err,
    })?;
    drop(placements);
    drop(shards);
    set_read_only(&out);
    Ok(out.into_any())
}

/// Bytes of host copies from which `device_get` releases the GIL.
const DETACH_BYTES: usize = 64 << 10;

/// Whether `descr` is one of numpy's own numeric types (bool, integers, floats, complex),
/// whose bytes jaxlib lends as they are; extension types such as bfloat16 or int4 are read
/// as JAX reads them.
fn has_plain_bytes(descr: &Bound<'_, PyArrayDescr>) -> bool {
    use numpy::npyffi::NPY_TYPES;
    let num = descr.num();
    (num >= NPY_TYPES::NPY_BOOL as i32 && num <= NPY_TYPES::NPY_CDOUBLE as i32)
        || num == NPY_TYPES::NPY_HALF as i32
}

/// Clears an array's writeable flag, as `a.flags.writeable = False` does.
fn set_read_only(array: &Bound<'_, PyUntypedArray>) {
    // SAFETY: clearing WRITEABLE is always allowed (PyArray_CLEARFLAGS).
    unsafe { (*array.as_array_ptr()).fields.flags &= !numpy::npyffi::NPY_ARRAY_WRITEABLE };
}

/// The value of an empty array: nothing to copy, and XLA may even give its shards the global
/// shape.
fn empty_host_value<'py>(
    h: &Handles,
    x: &Bound<'py, PyAny>,
    shape: &[usize],
    descr: &Bound<'py, PyArrayDescr>,
) -> PyResult<Bound<'py, PyAny>> {
    let py = x.py();
    if x.getattr(names(py).is_fully_replicated.bind(py))?
        .is_truthy()?
    {
        return host_view(h, x);
    }
    let out = empty_array(shape, descr)?;
    set_read_only(&out);
    x.setattr(h.host_value.bind(py), &out)?;
    Ok(out.into_any())
}

/// The value of a single-device or fully replicated array, as JAX gives it: a read-only host
/// view of its first shard, kept in the array only where the platform had to copy it.
fn host_view<'py>(h: &Handles, array: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
    let py = array.py();
    let (value, did_copy): (Bound<'py, PyAny>, bool) =
        array.call_method0(h.to_host.bind(py))?.extract()?;
    set_read_only(value.cast::<PyUntypedArray>()?);
    if did_copy {
        array.setattr(h.host_value.bind(py), &value)?;
    }
    Ok(value)
}

/// `fastpjit.device_get` for one leaf.
#[pyfunction]
pub fn device_get_leaf<'py>(x: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
    get_host_value(x)
}

/// `fastpjit.device_put` for one host leaf onto a sharding.
#[pyfunction]
#[pyo3(signature = (x, sharding, committed = true))]
pub fn device_put_leaf<'py>(
    x: &Bound<'py, PyAny>,
    sharding: &Bound<'py, PyAny>,
    committed: bool,
) -> PyResult<Bound<'py, PyAny>> {
    let value = host_value(x)?;
    if value.is_float0()? {
        // jax.device_put gives back a host array of float0, not a jax.Array.
        count_fallback(Fallback::Whole(Whole::PutFloat0));
        let py = x.py();
        return handles(py)?.jax_device_put.bind(py).call1((x, sharding));
    }
    place(&value, sharding, committed)
}

/// The number of entries in the shard path's plan caches (for tests of their bounds): puts,
/// gets, canonical dtypes, puts of process-local data.
#[pyfunction]
pub fn transfer_cache_sizes() -> (usize, usize, usize, usize) {
    (
        PUT_PLANS.len(),
        GET_PLANS.len(),
        CANONICAL_DTYPES.len(),
        crate::process_local::plans_cached(),
    )
}

/// Whether jaxlib's transfer guard watches transfers in `direction` (`"host_to_device"`,
/// `"device_to_host"`) now, on this thread.
#[pyfunction]
pub fn transfers_guarded(direction: &Bound<'_, PyString>) -> PyResult<bool> {
    handles(direction.py())?.transfers_guarded(direction)
}

#[cfg(test)]
mod tests {
    use std::ffi::CStr;

    use pyo3::exceptions::PyOverflowError;
    use pyo3::types::PyModule;

    use super::*;
    use crate::testing::{helper_module, items as list};

    /// Values placed and fetched, and what JAX and numpy say of them (the oracles).
    const HELPERS: &CStr = cr#"
import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P, SingleDeviceSharding


def targets():
    devices = np.array(jax.devices()[:8]).reshape(2, 4)
    mesh = jax.sharding.Mesh(devices, ("x", "y"))
    return [SingleDeviceSharding(jax.devices()[1]), NamedSharding(mesh, P("x", "y")),
            NamedSharding(mesh, P(None, "y")), NamedSharding(mesh, P())]


def values():
    return [np.arange(32, dtype=np.float32).reshape(4, 8), np.arange(32.0).reshape(8, 4).T,
            np.asfortranarray(np.arange(32, dtype=np.int32).reshape(4, 8))]


def same_as_jax(ours, value, sharding):
    theirs = jax.device_put(value, sharding)
    assert type(ours) is type(theirs), (type(ours), type(theirs))
    assert ours.sharding == theirs.sharding and ours.dtype == theirs.dtype
    assert ours.committed == theirs.committed and ours.aval == theirs.aval
    for a, b in zip(ours.addressable_shards, theirs.addressable_shards, strict=True):
        assert a.device == b.device and a.index == b.index
        assert np.array_equal(np.asarray(a.data), np.asarray(b.data))
    return True


def same_host_value(ours, array):
    expected = np.asarray(array)
    assert type(ours) is np.ndarray and ours.dtype == expected.dtype
    return bool(np.array_equal(ours, expected))


def float0():
    return np.zeros(3, jax.dtypes.float0)
"#;

    fn helpers(py: Python<'_>) -> Bound<'_, PyModule> {
        helper_module(py, c"fastpjit_transfer_helpers", HELPERS)
    }

    #[test]
    fn the_put_path_places_what_jax_places_and_the_get_path_fetches_it_back() {
        Python::initialize();
        Python::attach(|py| {
            let m = helpers(py);
            for sharding in list(&m, "targets") {
                for value in list(&m, "values") {
                    let placed = device_put_leaf(&value, &sharding, true).unwrap();
                    let same = m.call_method1("same_as_jax", (&placed, &value, &sharding));
                    assert!(
                        same.unwrap().is_truthy().unwrap(),
                        "{value:?} on {sharding:?}"
                    );
                    let fetched = get_host_value(&placed).unwrap();
                    let back = m.call_method1("same_host_value", (&fetched, &placed));
                    assert!(
                        back.unwrap().is_truthy().unwrap(),
                        "{value:?} on {sharding:?}"
                    );
                }
            }
        });
    }

    #[test]
    fn the_put_path_refuses_what_jax_refuses_and_counts_what_jax_places() {
        Python::initialize();
        Python::attach(|py| {
            let m = helpers(py);
            let sharding = list(&m, "targets").swap_remove(0);
            // A Python int beyond int32 (x64 off): JAX's OverflowError, naming the value.
            let wide = (1_i64 << 40).into_pyobject(py).unwrap().into_any();
            let err = device_put_leaf(&wide, &sharding, true).unwrap_err();
            assert!(err.is_instance_of::<PyOverflowError>(py), "{err}");
            assert!(err.to_string().contains("1099511627776"), "{err}");
            // float0 has no bytes to place: JAX does it, counted under its code.
            let before = crate::stats::others_fallbacks(Fallback::Whole(Whole::PutFloat0));
            let float0 = m.call_method0("float0").unwrap();
            let placed = device_put_leaf(&float0, &sharding, true).unwrap();
            assert!(placed
                .getattr("dtype")
                .unwrap()
                .eq(float0.getattr("dtype").unwrap())
                .unwrap());
            let after = crate::stats::others_fallbacks(Fallback::Whole(Whole::PutFloat0));
            assert_eq!(after, before + 1);
        });
    }
}
