"""The JAX and jaxlib objects that the native module (`fastpjit._core`) fetches once, by name, from
`fastpjit._jax`: jaxlib's array getters, JAX's jit key and transfer guard, and the transfer steps.

The one Rust handle table (`rust/bindings/src/handles.rs`) names every attribute here;
`fastpjit._jax` re-exports each one.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
from jax._src import api as _api
from jax._src import config as _config
from jax._src import core as _core
from jax._src import dispatch as _dispatch
from jax._src import dtypes as _dtypes
from jax._src import op_shardings as _op_shardings
from jax._src import tree_util as _tree_util
from jax._src.array import ArrayImpl as ArrayImpl  # re-exported: Rust reads it from here
from jax._src.interpreters import pxla as _pxla
from jax._src.lib import _jax as _jaxlib
from jax._src.lib import guard_lib as _guard_lib
from jax._src.lib import xla_client as xc
from jax._src.sharding_impls import GSPMDSharding

from fastpjit._jax import line as _line


def hlo_parts(sharding: Any, ndim: int) -> tuple[str, tuple[Any, ...]]:
    """The HLO sharding text and device assignment of any JAX sharding."""
    return str(sharding._to_xla_hlo_sharding(ndim)), tuple(sharding._device_assignment)


def logical_device_ids(sharding: Any) -> tuple[int, ...] | None:
    """The device order that a NamedSharding lays over its mesh, if it sets one."""
    return sharding._logical_device_ids


# Transfers: the pieces of jax.device_put and np.asarray(jax.Array) that fastpjit's Rust shard
# path calls. Rust fetches these names once and calls them per new plan or per array.

batched_device_put = xc.batched_device_put
# How batched_device_put treats host memory on the CPU: with ZERO_COPY (JAX's choice) jaxlib
# adopts 64-byte-aligned dense shards and copies the others on a slower path; for those,
# IMMUTABLE_ONLY_DURING_CALL copies sooner (measured, until ready: 15 against 17 µs for an
# unaligned (8, 4) float32 array split over 8 devices, 17 against 19 µs for an (8, 1024) one).
HOST_BUFFER_ZERO_COPY = xc.HostBufferSemantics.ZERO_COPY
HOST_BUFFER_COPY = xc.HostBufferSemantics.IMMUTABLE_ONLY_DURING_CALL


def placement_sharding(sharding: Any, ndim: int) -> Any:
    """The sharding on which the dispatcher places a host argument of `ndim` dimensions bound for
    `sharding`, an executable's input sharding: a GSPMDSharding of the same devices, layout and
    memory kind, which jaxlib reads in C++ (it asks a SingleDeviceSharding or a NamedSharding
    for its layout in Python, on every transfer). Arrays placed on it are inputs of the
    executable only, never handed to the caller."""
    if not isinstance(sharding, jax.sharding.SingleDeviceSharding | jax.sharding.NamedSharding):
        return sharding
    return GSPMDSharding(
        sharding._device_assignment,
        sharding._to_xla_hlo_sharding(ndim),
        memory_kind=sharding.memory_kind,
    )


def device_put_aval(shape: tuple[int, ...], dtype: np.dtype, weak_type: bool, sharding: Any) -> Any:
    """The aval that jax.device_put gives an array of this shape and dtype on `sharding`."""
    return _dispatch.update_dp_aval(_core.ShapedArray(shape, dtype, weak_type=weak_type), sharding)


def canonical_dtype(dtype: Any) -> np.dtype:
    """The dtype JAX stores for `dtype` (float64 becomes float32 without x64); TypeError if none."""
    dtype = np.dtype(dtype)
    _dtypes.check_valid_dtype(dtype)
    return np.dtype(_dtypes.canonicalize_dtype(dtype))


def python_scalar_dtype(kind: type) -> np.dtype:
    """The canonical dtype of a Python scalar type (bool, int, float, complex)."""
    return np.dtype(_dtypes.canonicalize_dtype(_dtypes.python_scalar_types_to_dtypes[kind]))


def copy_to_host_async(single: Any) -> None:
    """Starts the device-to-host copy of a single-device array (a no-op on CPU)."""
    single._copy_single_device_array_to_host_async()


# What device_get reads of a jaxlib ArrayImpl, from Rust: the method that gives a host view (a
# copy where the platform needs one) of a single-device or fully replicated array, as
# `(value, did_copy)`; and the attribute where np.asarray caches an array's host value.
ARRAY_TO_HOST = "_single_device_array_to_np_array_did_copy"
ARRAY_HOST_VALUE = "_npy_value"
# The getter of an array's single-device arrays, one per addressable device in the order of
# its device assignment; jaxlib builds them on first use, all at once, and keeps them.
array_single_device_arrays = vars(ArrayImpl)["_arrays"].fget


# The dispatcher: what a cached call of a jit or pmap function needs.

# What the Rust dispatcher reads on every call: JAX's dispatch registry (which takes apart the
# pytree nodes that are not builtin containers), and JAX's jit key, which is the trace context
# plus the states that only the jit key holds (`fastpjit._jax.line.jit_key_states`).
flatten_one_level_for_dispatch = _tree_util.dispatch_registry.flatten_one_level
trace_context = _config.trace_context
DISABLE_JIT_INDEX = _config.trace_context_names().index("jax_disable_jit")
# The name of each item of the jit key, in the order the dispatcher reads them (the trace
# context's, then the states' and the post-hook's): a call signature's description names them.
jit_key_names = (
    *_config.trace_context_names(),
    *(state.name for state in _line.jit_key_states),
    "post_hook",
)
# JAX's post-hook, which runs the NaN and inf checks of jax_debug_nans and jax_debug_infs on the
# outputs of every cached call: `hook(function, args, kwargs, outputs)`; None when they are off.
post_hook_state = _api._post_hook_state
# What the dispatcher reads of every argument, taken from jaxlib's ArrayImpl once and called
# without an attribute lookup: the getters of its aval, sharding and commitment (the public
# `sharding` and `committed` are Python properties over the last two, which would run bytecode
# per argument), and its is_deleted method.
array_aval = vars(ArrayImpl)["aval"].fget
array_sharding = vars(ArrayImpl)["_sharding"].fget
array_committed = vars(ArrayImpl)["_committed"].fget
array_is_deleted = vars(ArrayImpl)["is_deleted"]
# The same buffers as another global array: a pmap across processes views a host-local array
# as this process's part of a global one, and back.
array_rewrap = vars(ArrayImpl)["_rewrap_with_aval_and_sharding"]


# Whether no JAX transformation traces on this thread: where one does (`jax.jit`, `grad`,
# `vmap`), a call that fastpjit cannot key (its arguments hold tracers) is staged by it.
trace_state_clean = _core.trace_state_clean


consume_with_handlers = _jaxlib.ExecuteResults.consume_with_handlers
# jaxlib releases some Python objects of an execution through a queue that its own C++
# dispatch drains as it goes and JAX drains from a gc callback; `execute_sharded` leaves one
# object there per call, so the Rust dispatcher drains it itself every so many calls.
collect_garbage = _jaxlib.collect_garbage


# jaxlib's transfer guard, per thread and for the process: a call's host arguments are implicit
# host-to-device transfers, which every level but "allow" watches ("log"/"disallow", and their
# "_explicit" forms, which watch explicit transfers too). The dispatcher checks it before it
# hands a call a device copy of a scalar kept from an earlier call.
transfer_guard_thread_state = _guard_lib.thread_local_state
transfer_guard_global_state = _guard_lib.global_state()
TRANSFER_GUARD_ALLOW = _guard_lib.TransferGuardLevel.ALLOW


def dataclass_fields(kind: type) -> tuple[tuple[str, ...], tuple[str, ...]] | None:
    """The data and meta fields of a class registered with `jax.tree_util.register_dataclass`
    (JAX's registries take such a node apart by reading those attributes), or None for any
    other type. JAX keeps the field names only in the closure of its flatten function."""
    entry = _tree_util._registry.get(kind)
    flatten: Any = getattr(entry, "to_iter", None)
    code = getattr(flatten, "__code__", None)
    if code is None or code.co_freevars != ("data_fields", "meta_fields"):
        return None
    if flatten.__qualname__ not in _line.DATACLASS_FLATTEN or flatten.__module__ != _line.TREE_UTIL:
        return None
    data, meta = (cell.cell_contents for cell in flatten.__closure__)
    return tuple(data), tuple(meta)


def array_input(own: Any, target: Any, ndim: int) -> tuple[str, tuple[list[Any], ...] | None]:
    """How an array of `ndim` dimensions on sharding `own` becomes an executable input on
    sharding `target`, as JAX's dispatch has it: ("pass", None) as it is (the same sharding, or
    one that places the same shards on the same devices in the same order: a previous pmap's
    output, say); ("copy", the arguments `batched_copy` takes after the list of arrays) where
    its shards go to other devices as they are (from one device to another, or the same tiles
    over devices in another order), which JAX copies in C++; else ("move", None), where JAX
    moves it (`shard_arg`)."""
    if own == target:
        return "pass", None
    if own.num_devices == 1 and target.num_devices == 1:
        (device,) = own._device_assignment
        default = device.default_memory().kind if hasattr(device, "default_memory") else None
        if tuple(target._device_assignment) == (device,) and (own.memory_kind or default) == (
            target.memory_kind or default
        ):
            return "pass", None
    elif own.is_equivalent_to(target, ndim):
        return "pass", None
    elif (
        own.num_devices != target.num_devices
        or own.memory_kind != target.memory_kind
        or not _op_shardings.are_hlo_shardings_equal(
            own._to_xla_hlo_sharding(ndim), target._to_xla_hlo_sharding(ndim)
        )
    ):
        return "move", None
    if not (own.is_fully_addressable and target.is_fully_addressable):
        return "move", None
    return "copy", (
        [target._internal_device_list.addressable_device_list],
        [target],
        [xc.ArrayCopySemantics.REUSE_INPUT],
    )


# jaxlib's copy of arrays to other devices; it applies the device-to-device transfer guard.
batched_copy = _jaxlib.batched_copy_array_to_devices_with_sharding

# The getter of a config state's value, called directly.
config_value = vars(_jaxlib.config.Config)["value"].fget


def shard_arg(x: Any, sharding: Any) -> Any:
    """Places one argument on `sharding` the way jit's dispatch does for a mismatched input."""
    return _pxla.cc_shard_arg(x, sharding, None)
