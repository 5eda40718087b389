"""device_put, device_get and make_array_from_process_local_data with the shard path in Rust.

Host values (numpy arrays and scalars, Python scalars) are sliced per device and placed by
`fastpjit._core`; jax.Arrays that already have the target sharding come back as they are, as in
JAX. What this module cannot place itself goes through jax.device_put, counted in
`fastpjit.stats()["fallbacks"]` by its code (docs/fallbacks.md).
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
from jax.sharding import NamedSharding, Sharding, SingleDeviceSharding

from fastpjit import _core
from fastpjit._jax import api as _jax

__all__ = ["device_get", "device_put", "make_array_from_process_local_data"]


def _fallback(code: str, x: Any, device: Any, **kwargs: Any) -> Any:
    _core.count_fallback(code)
    return jax.device_put(x, device, **kwargs)


# One sharding per device, so that the Rust plan cache (keyed by identity) hits for a Device
# target as it does for a Sharding. Bounded by the number of devices.
_device_shardings: dict[Any, SingleDeviceSharding] = {}


def _target_sharding(device: Any) -> Sharding | None:
    """The one sharding that every leaf goes to, or None when JAX must resolve the target."""
    if isinstance(device, Sharding):
        return device
    if isinstance(device, jax.Device):
        sharding = _device_shardings.get(device)
        if sharding is None:
            sharding = _device_shardings[device] = SingleDeviceSharding(device)
        return sharding
    return None


def device_put(
    x: Any,
    device: Any = None,
    *,
    src: Any = None,
    donate: Any = False,
    may_alias: Any = None,
) -> Any:
    """Transfers `x` (an array, scalar, jax.Array or pytree of them) to `device`.

    The same signature and results as `jax.device_put`. A Sharding or a Device as the target
    takes fastpjit's path; other targets (None, a PartitionSpec, a pytree of targets, layouts)
    and the src/donate/may_alias options go through JAX and are counted as fallbacks.
    """
    if src is not None or donate is not False or may_alias is not None:
        return _fallback(
            "device_put.options",
            x,
            device,
            src=src,
            donate=donate,
            may_alias=may_alias,
        )
    sharding = _target_sharding(device)
    if sharding is None:
        return _fallback("device_put.target", x, device)
    if isinstance(sharding, NamedSharding) and sharding.spec.unreduced:
        # JAX places values onto unreduced axes with a jit of its own.
        return _fallback("device_put.unreduced", x, device)
    if _jax.tracing():
        # Under jit, grad or vmap, JAX binds its device_put primitive, for tracers and host
        # values alike.
        return _fallback("device_put.under_trace", x, device)
    if _core.transfers_guarded("host_to_device"):
        # An explicit transfer, as jax.device_put's: the transfer guard's "_explicit" levels
        # watch it, the others let it through.
        with _jax.explicit_device_put_scope():
            return _put_tree(x, device, sharding)
    return _put_tree(x, device, sharding)


def _put_tree(x: Any, device: Any, sharding: Sharding) -> Any:
    leaves, treedef = jax.tree_util.tree_flatten(x)
    out = []
    for i, leaf in enumerate(leaves):
        try:
            if not isinstance(leaf, jax.Array):
                out.append(_core.device_put_leaf(leaf, sharding))
            elif leaf.is_deleted():
                raise RuntimeError(f"Array has been deleted with shape={leaf.aval.str_short()}.")
            elif device is sharding and leaf.committed and leaf.sharding == sharding:
                # Only a Sharding target: onto a Device, JAX always makes a new array.
                out.append(leaf)
            else:
                # Moving data between devices is JAX's work; it gets the target as given,
                # since a Device and its SingleDeviceSharding give different avals.
                out.append(_fallback("device_put.moved_array", leaf, device))
        except Exception as e:
            e.add_note(f"while placing the leaf x{_leaf_path(x, i)} of device_put")
            raise
    return jax.tree_util.tree_unflatten(treedef, out)


def _leaf_path(tree: Any, i: int) -> str:
    """The key path of the i-th leaf, for error messages only."""
    paths = jax.tree_util.tree_flatten_with_path(tree)[0]
    return jax.tree_util.keystr(paths[i][0])


def device_get(x: Any) -> Any:
    """Transfers `x` (a jax.Array or pytree of them) to host numpy arrays.

    Equal to `jax.device_get(x)` / `np.asarray(x)`: each distinct shard is copied once, by
    Rust, into one preallocated array; other values come back as JAX gives them (unchanged,
    or through their `__array__`).
    """
    if _core.transfers_guarded("device_to_host"):
        # fastpjit reads CPU shards through the buffer protocol, where jaxlib checks no guard.
        return _fallback_get("device_get.guarded", x)
    if type(x) is _jax.ArrayImpl:
        # A bare array needs no tree, and JAX fetches concrete arrays alike under a trace.
        return _core.device_get_leaf(x)
    if _jax.tracing():
        # Tracers come back as they are, as in JAX.
        return _fallback_get("device_get.under_trace", x)
    if isinstance(x, jax.Array):
        return _core.device_get_leaf(x)
    leaves, treedef = jax.tree_util.tree_flatten(x)
    return jax.tree_util.tree_unflatten(treedef, [_core.device_get_leaf(leaf) for leaf in leaves])


def _fallback_get(code: str, x: Any) -> Any:
    _core.count_fallback(code)
    return jax.device_get(x)


def make_array_from_process_local_data(
    sharding: Any, local_data: Any, global_shape: Any = None
) -> Any:
    """A global array built from the data that each process holds for its own devices.

    The same signature and results as `jax.make_array_from_process_local_data`. In each
    dimension, `local_data` is either the whole global extent, or the slices that this
    process's devices hold, one after the other in global order; `global_shape` defaults to
    the shape that this implies. One sharding and one global shape (or None) for every leaf
    take fastpjit's path; pytrees of them, PartitionSpecs, and leaves that are not numpy
    arrays go through JAX and are counted as fallbacks.
    """
    if not isinstance(sharding, Sharding) or not (
        global_shape is None or isinstance(global_shape, tuple)
    ):
        return _fallback_local(
            "process_local.spec_or_trees",
            sharding,
            local_data,
            global_shape,
        )
    leaves, treedef = jax.tree_util.tree_flatten(local_data)
    if jax.process_count() == 1:
        # As in JAX: one process holds the whole array.
        for leaf in leaves:
            if global_shape is not None and global_shape != leaf.shape:
                raise ValueError(
                    "When calling `make_array_from_process_local_data` on a single process, "
                    f"global_shape should be None or equal to local_data.shape. Got "
                    f"global_shape={global_shape} and local_data.shape={leaf.shape}."
                )
        return device_put(local_data, sharding)
    if global_shape is not None and None in global_shape:
        raise ValueError(f"{global_shape=} has Nones. This is not supported.")
    out = []
    for leaf in leaves:
        if isinstance(leaf, np.ndarray | np.generic) and leaf.dtype != jax.dtypes.float0:
            out.append(_core.make_array_from_process_local_leaf(leaf, sharding, global_shape))
        else:
            out.append(
                _fallback_local(
                    "process_local.not_numpy",
                    sharding,
                    leaf,
                    global_shape,
                )
            )
    return jax.tree_util.tree_unflatten(treedef, out)


def _fallback_local(code: str, sharding: Any, local_data: Any, global_shape: Any) -> Any:
    _core.count_fallback(code)
    return jax.make_array_from_process_local_data(sharding, local_data, global_shape)
