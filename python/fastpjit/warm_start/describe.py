"""A call's signature as JSON data (`describe_call`): each argument's kind, shape, dtype, weak
type, commitment and sharding, its tree, the static arguments that are JSON values, keyword
names, and the configuration that keys a call. What the signature log notes, a record holds
and `explain` compares; `Unrecordable` says why a call cannot be described."""

from __future__ import annotations

import math
import operator
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np

from fastpjit.warm_start.schema import MAX_DEPTH, TYPE_NAME, Signature, named_type

__all__ = ["Unrecordable", "describe_call"]


class Unrecordable(Exception):
    """A call whose signature a record cannot hold, with the reason."""


def describe_call(
    args: tuple[Any, ...],
    kwargs: Mapping[str, Any],
    static_positions: set[int],
    static_names: set[str],
) -> Signature:
    """The signature of `fn(*args, **kwargs)` as JSON data; raises `Unrecordable`."""
    n = len(args)
    statics = {p % n for p in static_positions if -n <= p < n}
    return {
        "args": [
            {"static": _static_value(a)} if i in statics else _node(a) for i, a in enumerate(args)
        ],
        "kwargs": {
            k: ({"static": _static_value(v)} if k in static_names else _node(v))
            for k, v in sorted(kwargs.items())
        },
        "config": {
            "jax_enable_x64": bool(jax.config.read("jax_enable_x64")),
            "mesh": _context_mesh(),
        },
    }


def _static_value(value: Any) -> Any:
    """A static argument as JSON: None, bool, int, finite float and str as they are; tuples,
    lists and dtypes tagged. Anything else cannot be recorded."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise Unrecordable(f"a static float {value!r} that JSON cannot hold")
        return float(value)
    if isinstance(value, tuple) and type(value) is tuple:
        return {"tuple": [_static_value(v) for v in value]}
    if isinstance(value, list):
        return {"list": [_static_value(v) for v in value]}
    if isinstance(value, np.dtype):
        return {"dtype": value.name, "of": "numpy.dtype"}
    if isinstance(value, type) and issubclass(value, np.generic):
        return {"dtype": np.dtype(value).name, "of": "numpy"}
    jnp_type: Any = getattr(jax.numpy, getattr(value, "__name__", ""), None)
    if jnp_type is value and hasattr(jnp_type, "dtype"):
        return {"dtype": np.dtype(jnp_type.dtype).name, "of": "jax.numpy"}
    raise Unrecordable(
        f"a static argument of type {type(value).__qualname__}, which is not a "
        "JSON value or a dtype"
    )


def _mesh(mesh: Any) -> dict[str, Any]:
    if not isinstance(mesh, jax.sharding.Mesh):
        raise Unrecordable(f"a {type(mesh).__qualname__}, which the record cannot hold")
    return {
        "mesh_shape": list(mesh.devices.shape),
        "axis_names": list(mesh.axis_names),
        "axis_types": [t.name for t in mesh.axis_types],
        "device_ids": [int(d.id) for d in mesh.devices.flat],
    }


def _context_mesh() -> dict[str, Any] | None:
    """The mesh that `jax.set_mesh` made current, which keys a call; None where none is."""
    mesh = jax.sharding.get_mesh()
    return None if mesh.empty else _mesh(mesh)


def _sharding(sharding: Any) -> dict[str, Any]:
    if isinstance(sharding, jax.sharding.NamedSharding):
        spec = [list(p) if isinstance(p, tuple) else p for p in sharding.spec]
        if any(
            not (
                p is None
                or isinstance(p, str)
                or (isinstance(p, list) and all(isinstance(q, str) for q in p))
            )
            for p in spec
        ):
            raise Unrecordable(f"a PartitionSpec entry the record cannot hold: {sharding.spec}")
        return {
            "type": "named",
            **_mesh(sharding.mesh),
            "spec": spec,
            "memory_kind": sharding.memory_kind,
        }
    if isinstance(sharding, jax.sharding.SingleDeviceSharding):
        (device,) = sharding.device_set
        device_id = getattr(device, "id")  # noqa: B009 - jaxlib's stub lacks Device.id
        return {"type": "single", "device_id": int(device_id), "memory_kind": sharding.memory_kind}
    raise Unrecordable(f"a {type(sharding).__qualname__}, which the record cannot hold")


def _leaf(leaf: Any) -> dict[str, Any]:
    if isinstance(leaf, jax.Array):
        if jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.extended):
            raise Unrecordable(f"an array of the extended dtype {leaf.dtype}")
        aval = leaf.aval
        return {
            "kind": "array",
            "shape": list(leaf.shape),
            "dtype": np.dtype(leaf.dtype).name,
            "weak_type": bool(aval.weak_type),
            "committed": bool(leaf.committed),
            "sharding": _sharding(leaf.sharding),
        }
    if isinstance(leaf, np.ndarray):
        return {"kind": "numpy", "shape": list(leaf.shape), "dtype": leaf.dtype.name}
    if isinstance(leaf, np.generic):
        return {"kind": "numpy_scalar", "dtype": np.dtype(type(leaf)).name}
    for kind in (bool, int, float, complex):  # bool first: it is an int
        if isinstance(leaf, kind):
            return {"kind": kind.__name__}
    raise Unrecordable(f"an argument of type {type(leaf).__qualname__}")


def _node(value: Any, depth: int = 0) -> Any:
    """A dynamic argument: builtin containers as tagged JSON, leaves described."""
    if depth > MAX_DEPTH:
        raise Unrecordable(f"a tree deeper than {MAX_DEPTH} levels")
    if value is None:
        return {"none": None}
    if type(value) is tuple:
        return {"tuple": [_node(v, depth + 1) for v in value]}
    if type(value) is list:
        return {"list": [_node(v, depth + 1) for v in value]}
    if type(value) is dict:
        return {
            "dict": [
                [_static_value(k), _node(v, depth + 1)]
                for k, v in sorted(value.items(), key=_sort_key)
            ]
        }
    if isinstance(value, tuple) and hasattr(type(value), "_fields"):
        return {"namedtuple": _named_tuple(value, depth)}
    if _is_pytree_node(value):
        raise Unrecordable(f"a pytree node of type {type(value).__qualname__}")
    return {"leaf": _leaf(value)}


def _named_tuple(value: tuple[Any, ...], depth: int) -> dict[str, Any]:
    """A NamedTuple (optax's states, say) by the name of its type, which a replay finds among
    the modules that its process has imported; one that JAX takes apart otherwise than by its
    fields, or that no name finds, cannot be recorded."""
    kind: Any = type(value)  # a NamedTuple's class: its fields are known only at run time
    name = f"{kind.__module__}:{kind.__qualname__}"
    children, tree = jax.tree.flatten(value, is_leaf=lambda x: x is not value)
    try:
        again = kind(*value)
    except Exception:
        again = None
    rebuilt: Any = jax.tree.structure(again, is_leaf=lambda x: x is not again)
    if rebuilt != tree or len(children) != len(value) or any(map(operator.is_not, children, value)):
        raise Unrecordable(f"a pytree node of type {kind.__qualname__}, not made of its fields")
    if not TYPE_NAME.fullmatch(name) or named_type(name) is not type(value):
        raise Unrecordable(f"a NamedTuple {name} that another process cannot find by its name")
    return {
        "type": name,
        "fields": list(kind._fields),
        "children": [_node(v, depth + 1) for v in value],
    }


def _sort_key(item: tuple[Any, Any]) -> tuple[str, Any]:
    return (type(item[0]).__name__, item[0])


_LEAF_TREE: Any = jax.tree.structure(0)


def _is_pytree_node(value: Any) -> bool:
    # Every leaf has the tree of one leaf; a container, even an empty one, has another.
    return bool(jax.tree.structure(value) != _LEAF_TREE)
