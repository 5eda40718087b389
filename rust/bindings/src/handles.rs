//! Every Python object and attribute name that Rust uses, fetched or interned once: the Rust
//! side of the JAX boundary. JAX's private names come from `fastpjit._jax`, which lists them;
//! the few jaxlib method names that Rust calls itself are marked so below.

use std::sync::atomic::{AtomicU32, Ordering};

use fastpjit_core::dispatch::MAX_STATES;
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyString, PyType};

/// The objects, fetched once (see `handles`).
pub struct Handles {
    // The dispatcher's, read on every call.
    pub trace_context: Py<PyAny>,
    /// The jit key's states outside the trace context, and the getter of a state's value.
    pub jit_key_states: Vec<Py<PyAny>>,
    /// The name of each item of the jit key (the trace context's, then the states'), for a
    /// signature's description.
    pub jit_key_names: Vec<String>,
    pub config_value: Py<PyAny>,
    pub post_hook_state: Py<PyAny>,
    /// Where `jax_disable_jit` sits in the trace context.
    pub disable_jit_index: usize,
    /// JAX's dispatch registry taking a pytree node apart one level: `(children, data)`.
    pub flatten_one_level: Py<PyAny>,
    /// The data and meta fields of a registered dataclass type, or None.
    pub dataclass_fields: Py<PyAny>,
    pub shard_arg: Py<PyAny>,
    /// How an array on one sharding becomes an executable input on another: as it is, copied
    /// by `batched_copy` (with the arguments given), or moved by `shard_arg`.
    pub array_input: Py<PyAny>,
    pub batched_copy: Py<PyAny>,
    /// `ExecuteResults.consume_with_handlers`, unbound.
    pub consume_with_handlers: Py<PyAny>,
    /// jaxlib's `collect_garbage`, which drains the queue of Python objects it released, and
    /// the executions counted since the start (see `count_execution`).
    collect_garbage: Py<PyAny>,
    executions: AtomicU32,
    /// jaxlib's array type and the getters of it that Rust calls directly.
    pub arrays: Arrays,
    /// The getter of a `jaxlib` array's commitment, called directly (see `fastpjit._jax`).
    pub array_committed: Py<PyAny>,
    /// Whether a deleted array was donated (its buffer given to a computation) rather than
    /// deleted by `delete()`: JAX raises another error for each.
    pub array_was_donated: Py<PyAny>,
    /// jaxlib's transfer guard levels of this thread and of the process, and the level that
    /// lets every transfer through.
    guard_thread_state: Py<PyAny>,
    guard_global_state: Py<PyAny>,
    guard_allow: Py<PyAny>,
    /// `ArrayImpl._rewrap_with_aval_and_sharding`: the same buffers as another global array.
    pub rewrap: Py<PyAny>,
    /// JAX's `trace_state_clean()`: whether no transformation traces on this thread.
    pub trace_state_clean: Py<PyAny>,
    /// `builtins.sorted`, for the keys of dicts that JAX flattens in sorted order.
    pub sorted: Py<PyAny>,

    // The shard path's (`device_put`, `device_get`), read per new plan or per array.
    /// jaxlib's put of per-device host values as one array.
    pub batched_device_put: Py<PyAny>,
    /// `HostBufferSemantics` that let jaxlib adopt host memory, and that make it copy.
    pub zero_copy: Py<PyAny>,
    pub copy: Py<PyAny>,
    /// The aval of a put value: shape, dtype, weak type, and the sharding's memory kind.
    pub device_put_aval: Py<PyAny>,
    /// JAX's dtype canonicalization (which depends on `jax_enable_x64`).
    pub canonical_dtype: Py<PyAny>,
    /// The dtype that JAX gives a Python scalar type.
    pub python_scalar_dtype: Py<PyAny>,
    /// The layout on which jaxlib reads an executable input fastest.
    pub placement_sharding: Py<PyAny>,
    /// Starts a single-device array's copy to the host.
    pub copy_to_host_async: Py<PyAny>,
    /// `ArrayImpl._arrays`' getter: every single-device array of a global one.
    pub single_device_arrays: Py<PyAny>,
    /// jaxlib `ArrayImpl` attribute names: the method that gives a host view of the first
    /// shard (and whether it copied), and the slot of the cached numpy value.
    pub to_host: Py<PyString>,
    pub host_value: Py<PyString>,
    pub empty: Py<PyAny>,
    pub masked_array: Py<PyType>,
    /// The public `jax.Array`, and `jax.device_put`, `jax.device_get` and `jax.config`, to
    /// which rare values are handed.
    pub jax_array: Py<PyType>,
    pub jax_device_put: Py<PyAny>,
    pub jax_device_get: Py<PyAny>,
    pub jax_config: Py<PyAny>,

    // The sharding types that the index maps read.
    pub named_sharding: Py<PyType>,
    pub single_device_sharding: Py<PyType>,
    pub sharding: Py<PyType>,
    pub abstract_mesh: Py<PyType>,
    /// Any other sharding as `(HloSharding text, device assignment)`.
    pub hlo_parts: Py<PyAny>,
    /// JAX's `IndivisibleError` text, which differs by JAX line.
    pub indivisible_message: Py<PyAny>,
    /// A `NamedSharding`'s mesh positions in device-assignment order, or None.
    pub logical_device_ids: Py<PyAny>,
}

/// jaxlib's array type and the getters of it that Rust calls directly (see `fastpjit._jax`),
/// and numpy's types: what the dispatcher and the shard path both read.
pub struct Arrays {
    pub array_impl: Py<PyType>,
    pub array_aval: Py<PyAny>,
    pub array_sharding: Py<PyAny>,
    pub array_is_deleted: Py<PyAny>,
    pub asarray: Py<PyAny>,
    pub ndarray: Py<PyType>,
    pub numpy_scalar: Py<PyType>,
}

static HANDLES: PyOnceLock<Handles> = PyOnceLock::new();

/// How many executions may leave their released objects in jaxlib's queue before the
/// dispatcher drains it: at most this many objects wait, and a drain (~70 ns) costs under a
/// nanosecond a call.
const EXECUTIONS_PER_DRAIN: u32 = 128;

/// The handles, fetched on first use.
pub fn handles(py: Python<'_>) -> PyResult<&Handles> {
    HANDLES.get_or_try_init(py, || {
        let handles = fetch(py)?;
        if handles.jit_key_states.len() >= MAX_STATES {
            return Err(PyRuntimeError::new_err(format!(
                "fastpjit._jax.jit_key_states has {} states; the dispatcher reads at most {}",
                handles.jit_key_states.len(),
                MAX_STATES - 1
            )));
        }
        Ok(handles)
    })
}

/// `module.name`, kept.
fn get(module: &Bound<'_, PyModule>, name: &str) -> PyResult<Py<PyAny>> {
    module.getattr(name).map(Bound::unbind)
}

/// `module.name`, a class, kept.
fn get_type(module: &Bound<'_, PyModule>, name: &str) -> PyResult<Py<PyType>> {
    Ok(module.getattr(name)?.cast_into::<PyType>()?.unbind())
}

/// `module.name`, a string, interned: an attribute name that Rust looks up per call.
fn interned(module: &Bound<'_, PyModule>, name: &str) -> PyResult<Py<PyString>> {
    let value: String = module.getattr(name)?.extract()?;
    Ok(PyString::intern(module.py(), &value).unbind())
}

fn fetch(py: Python<'_>) -> PyResult<Handles> {
    let jax = &py.import("fastpjit._jax")?;
    let public_jax = &py.import("jax")?;
    let sharding = &py.import("jax.sharding")?;
    let numpy = &py.import("numpy")?;
    Ok(Handles {
        trace_context: get(jax, "trace_context")?,
        jit_key_states: jax
            .getattr("jit_key_states")?
            .try_iter()?
            .map(|state| state.map(Bound::unbind))
            .collect::<PyResult<_>>()?,
        jit_key_names: jax.getattr("jit_key_names")?.extract()?,
        config_value: get(jax, "config_value")?,
        post_hook_state: get(jax, "post_hook_state")?,
        disable_jit_index: jax.getattr("DISABLE_JIT_INDEX")?.extract()?,
        flatten_one_level: get(jax, "flatten_one_level_for_dispatch")?,
        dataclass_fields: get(jax, "dataclass_fields")?,
        shard_arg: get(jax, "shard_arg")?,
        array_input: get(jax, "array_input")?,
        batched_copy: get(jax, "batched_copy")?,
        consume_with_handlers: get(jax, "consume_with_handlers")?,
        collect_garbage: get(jax, "collect_garbage")?,
        executions: AtomicU32::new(0),
        arrays: Arrays {
            array_impl: get_type(jax, "ArrayImpl")?,
            array_aval: get(jax, "array_aval")?,
            array_sharding: get(jax, "array_sharding")?,
            array_is_deleted: get(jax, "array_is_deleted")?,
            asarray: get(numpy, "asarray")?,
            ndarray: get_type(numpy, "ndarray")?,
            numpy_scalar: get_type(numpy, "generic")?,
        },
        array_committed: get(jax, "array_committed")?,
        array_was_donated: get(jax, "array_was_donated")?,
        guard_thread_state: get(jax, "transfer_guard_thread_state")?,
        guard_global_state: get(jax, "transfer_guard_global_state")?,
        guard_allow: get(jax, "TRANSFER_GUARD_ALLOW")?,
        rewrap: get(jax, "array_rewrap")?,
        trace_state_clean: get(jax, "trace_state_clean")?,
        sorted: get(&py.import("builtins")?, "sorted")?,
        batched_device_put: get(jax, "batched_device_put")?,
        zero_copy: get(jax, "HOST_BUFFER_ZERO_COPY")?,
        copy: get(jax, "HOST_BUFFER_COPY")?,
        device_put_aval: get(jax, "device_put_aval")?,
        canonical_dtype: get(jax, "canonical_dtype")?,
        python_scalar_dtype: get(jax, "python_scalar_dtype")?,
        placement_sharding: get(jax, "placement_sharding")?,
        copy_to_host_async: get(jax, "copy_to_host_async")?,
        single_device_arrays: get(jax, "array_single_device_arrays")?,
        to_host: interned(jax, "ARRAY_TO_HOST")?,
        host_value: interned(jax, "ARRAY_HOST_VALUE")?,
        empty: get(numpy, "empty")?,
        masked_array: get_type(&py.import("numpy.ma")?, "MaskedArray")?,
        jax_array: get_type(public_jax, "Array")?,
        jax_device_put: get(public_jax, "device_put")?,
        jax_device_get: get(public_jax, "device_get")?,
        jax_config: get(public_jax, "config")?,
        named_sharding: get_type(sharding, "NamedSharding")?,
        single_device_sharding: get_type(sharding, "SingleDeviceSharding")?,
        sharding: get_type(sharding, "Sharding")?,
        abstract_mesh: get_type(sharding, "AbstractMesh")?,
        hlo_parts: get(jax, "hlo_parts")?,
        indivisible_message: get(jax, "indivisible_message")?,
        logical_device_ids: get(jax, "logical_device_ids")?,
    })
}

impl Handles {
    /// Whether `value` is a jax.Array of jaxlib's own type (`ArrayImpl`, not a subclass), which
    /// the dispatcher reads without calling Python.
    #[inline]
    pub fn is_array(&self, value: &Bound<'_, PyAny>) -> bool {
        std::ptr::eq(value.get_type_ptr(), self.arrays.array_impl.as_ptr().cast())
    }

    /// Whether jaxlib's transfer guard watches host-to-device transfers now, on this thread.
    pub fn host_transfers_guarded(&self, py: Python<'_>) -> PyResult<bool> {
        self.transfers_guarded(names(py).host_to_device.bind(py))
    }

    /// Whether jaxlib's transfer guard watches transfers in `direction` (`"host_to_device"`,
    /// `"device_to_host"`, ...) now, on this thread.
    pub fn transfers_guarded(&self, direction: &Bound<'_, PyString>) -> PyResult<bool> {
        let py = direction.py();
        let mut level = self
            .guard_thread_state
            .bind(py)
            .call0()?
            .getattr(direction)?;
        if level.is_none() {
            level = self.guard_global_state.bind(py).getattr(direction)?;
        }
        let allow = self.guard_allow.bind(py);
        Ok(!(level.is_none() || level.is(allow) || level.eq(allow)?))
    }

    /// Counts one execution through `execute_sharded`, which leaves a Python object in jaxlib's
    /// queue of released objects, and drains the queue every `EXECUTIONS_PER_DRAIN` of them.
    /// Nothing else would in a loop of cached calls: jaxlib drains it in its own dispatch, which
    /// these calls skip, and JAX's gc callback only when a collection runs, which a loop that
    /// allocates no Python containers never starts. The call has run by now, so a failed drain
    /// is reported as unraisable rather than losing its results.
    pub fn count_execution(&self, py: Python<'_>) {
        if self.executions.fetch_add(1, Ordering::Relaxed) % EXECUTIONS_PER_DRAIN == 0 {
            if let Err(err) = self.collect_garbage.bind(py).call0() {
                err.write_unraisable(py, None);
            }
        }
    }
}

/// Declares `Names`, one interned string per attribute or method name, each the field's name.
macro_rules! names {
    ($($(#[doc = $doc:literal])* $name:ident,)*) => {
        /// Attribute and method names that Rust looks up, interned once.
        #[allow(non_snake_case)]
        pub struct Names {
            $($(#[doc = $doc])* pub $name: Py<PyString>,)*
        }

        impl Names {
            fn new(py: Python<'_>) -> Self {
                Self {
                    $($name: PyString::intern(py, stringify!($name)).unbind(),)*
                }
            }
        }
    };
}

names! {
    // Of numpy arrays, avals and host values.
    /// The dtype of an array or aval.
    dtype,
    /// The shape of an array or aval.
    shape,
    /// The rank of an array.
    ndim,
    /// The bytes of an array.
    nbytes,
    /// Whether an aval is weakly typed.
    weak_type,
    /// `ndarray.astype`, which converts a host value to its canonical dtype.
    astype,
    /// `ndarray.view`, which reads an aligned byte buffer as another dtype.
    view,
    /// `ndarray.reshape`.
    reshape,
    /// `ndarray.ravel`, which flattens a mesh's device array.
    ravel,
    /// `ndarray.tolist`.
    tolist,
    /// numpy's `uint8` dtype name, for raw byte buffers.
    uint8,
    /// The conversion of a value to a numpy array, as `jax.device_get` uses it.
    __array__,
    // Of jax.Arrays.
    /// The aval of a jax.Array.
    aval,
    /// jaxlib's `ShapedArray.str_short` (private), which names a deleted array's shape in
    /// JAX's error.
    str_short,
    /// Whether every device of a sharding or array holds the whole array.
    is_fully_replicated,
    // Of devices and shardings.
    /// A device's platform (`"cpu"`, `"gpu"`, ...).
    platform,
    /// A device's client, and a client's or device's process index.
    client,
    process_index,
    /// A sharding's mesh and spec, and the device count of a sharding.
    mesh,
    spec,
    num_devices,
    /// The one device of a `SingleDeviceSharding`.
    device_set,
    /// A mesh's axis names, axis sizes, devices and manual axes.
    axis_names,
    axis_sizes,
    devices,
    manual_axes,
    /// `PartitionSpec.partitions` (private): a spec's entries, which iterating a spec with
    /// unreduced axes would refuse.
    partitions,
    /// A spec's unreduced axes.
    unreduced,
    /// `PartitionSpec.UNCONSTRAINED`.
    UNCONSTRAINED,
    // Of JAX's config and the transfer guard.
    /// Whether 64-bit types are on.
    jax_enable_x64,
    /// The transfer guard's directions.
    host_to_device,
    device_to_device,
    // Of pytree defs and executables (jaxlib's, called by the dispatcher).
    /// A treedef's leaf and node counts, and the rebuilding of a tree from leaves.
    num_leaves,
    num_nodes,
    unflatten,
    /// jaxlib's `PyTreeDef.node_data` and `PyTreeDef.children` (private): a treedef taken
    /// apart one level.
    node_data,
    children,
    /// jaxlib's `LoadedExecutable.execute_sharded` (private), which runs a compiled call.
    execute_sharded,
}

static NAMES: PyOnceLock<Names> = PyOnceLock::new();

/// The interned names.
pub fn names(py: Python<'_>) -> &Names {
    NAMES.get_or_init(py, || Names::new(py))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every handle and name resolves against the installed JAX: run with the project's
    /// interpreter and packages (`make rust-test-bindings`).
    #[test]
    fn every_handle_is_fetched_and_every_name_interned() {
        Python::initialize();
        Python::attach(|py| {
            let h = handles(py).expect("fastpjit._jax and JAX provide every handle");
            assert!(h.jit_key_states.len() < MAX_STATES);
            let n = names(py);
            assert_eq!(
                n.execute_sharded.bind(py).to_str().unwrap(),
                "execute_sharded"
            );
            assert_eq!(n.__array__.bind(py).to_str().unwrap(), "__array__");
            // An interned name is the same object each time.
            assert!(n.dtype.bind(py).is(PyString::intern(py, "dtype")));
            // The private jaxlib methods that Rust calls exist on jaxlib's types.
            let public_jax = py.import("jax").unwrap();
            let treedef = public_jax
                .getattr("tree")
                .and_then(|tree| tree.call_method1("structure", ((1, 2),)))
                .unwrap();
            for name in [&n.node_data, &n.children, &n.num_nodes, &n.num_leaves] {
                assert!(treedef.hasattr(name.bind(py)).unwrap(), "{name}");
            }
            let aval = public_jax
                .getattr("numpy")
                .and_then(|jnp| jnp.call_method1("zeros", (3,)))
                .and_then(|x| x.getattr(n.aval.bind(py)))
                .unwrap();
            assert!(aval.hasattr(n.str_short.bind(py)).unwrap());
            let spec = py
                .import("jax.sharding")
                .and_then(|s| s.getattr("PartitionSpec"))
                .and_then(|p| p.call1(("x",)))
                .unwrap();
            assert!(spec.hasattr(n.partitions.bind(py)).unwrap());
        });
    }
}
