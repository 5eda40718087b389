"""device_put and device_get with the shard path in Rust.

Host values (numpy arrays and scalars, Python scalars) are sliced per device and placed by
`fastpjit._core`; jax.Arrays that already have the target sharding come back as they are, as in
JAX. What this module cannot place itself goes through jax.device_put, counted in
`fastpjit.stats()["fallbacks"]` with the reason.
"""

from __future__ import annotations

from typing import Any

import jax
from jax.sharding import NamedSharding, Sharding, SingleDeviceSharding

from fastpjit import _core, _jax

__all__ = ["device_get", "device_put"]

def _fallback(reason: str, x: Any, device: Any, **kwargs: Any) -> Any:
    _core.count_fallback(reason)
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
        return _fallback("device_put: src, donate or may_alias given",
                         x, device, src=src, donate=donate, may_alias=may_alias)
    sharding = _target_sharding(device)
    if sharding is None:
        return _fallback(f"device_put: target of type {type(device).__name__}", x, device)
    if isinstance(sharding, NamedSharding) and sharding.spec.unreduced:
        # JAX places values onto unreduced axes with a jit of its own.
        return _fallback("device_put: unreduced target sharding", x, device)
    if _jax.tracing():
        # Under jit, grad or vmap, JAX binds its device_put primitive, for tracers and host
        # values alike.
        return _fallback("device_put: under a JAX trace", x, device)
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
                out.append(_fallback("device_put: jax.Array moved by JAX", leaf, device))
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
    if type(x) is _jax.ArrayImpl:
        # A bare array needs no tree, and JAX fetches concrete arrays alike under a trace.
        return _core.device_get_leaf(x)
    if _jax.tracing():
        # Tracers come back as they are, as in JAX.
        return _fallback_get("device_get: under a JAX trace", x)
    if isinstance(x, jax.Array):
        return _core.device_get_leaf(x)
    leaves, treedef = jax.tree_util.tree_flatten(x)
    return jax.tree_util.tree_unflatten(treedef, [_core.device_get_leaf(leaf) for leaf in leaves])


def _fallback_get(reason: str, x: Any) -> Any:
    _core.count_fallback(reason)
    return jax.device_get(x)
