"""device_put and device_get with the shard path in Rust.

Host values (numpy arrays and scalars, Python scalars) are sliced per device and placed by
`fastpjit._core`; jax.Arrays that already have the target sharding come back as they are, as in
JAX. What this module cannot place itself goes through jax.device_put, counted in
`fastpjit.stats()["fallbacks"]` with the reason.
"""

from __future__ import annotations

from typing import Any

import jax
from jax.sharding import Sharding, SingleDeviceSharding

from fastpjit import _core

__all__ = ["device_get", "device_put"]

def _fallback(reason: str, x: Any, device: Any, **kwargs: Any) -> Any:
    _core.count_fallback(reason)
    return jax.device_put(x, device, **kwargs)


def _target_sharding(device: Any) -> Sharding | None:
    """The one sharding that every leaf goes to, or None when JAX must resolve the target."""
    if isinstance(device, Sharding):
        return device
    if isinstance(device, jax.Device):
        return SingleDeviceSharding(device)
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
    leaves, treedef = jax.tree_util.tree_flatten(x)
    out = []
    for i, leaf in enumerate(leaves):
        try:
            if not isinstance(leaf, jax.Array):
                out.append(_core.device_put_leaf(leaf, sharding))
            elif leaf.is_deleted():
                raise RuntimeError(f"Array has been deleted with shape={leaf.aval.str_short()}.")
            elif leaf.sharding == sharding and leaf.committed:
                out.append(leaf)
            else:
                # Moving data between devices is JAX's work.
                out.append(_fallback("device_put: jax.Array moved by JAX", leaf, sharding))
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
    Rust, into one preallocated array; values that are not jax.Arrays come back unchanged.
    """
    leaves, treedef = jax.tree_util.tree_flatten(x)
    return jax.tree_util.tree_unflatten(treedef, [_core.device_get_leaf(leaf) for leaf in leaves])
