"""A call's signature as JSON data (`describe_call`), for a record to carry to another
process. The dispatcher reads the signature as it keys it (`DispatchCache._signature`: the
tree, each leaf's kind, shape, dtype, weak type and commitment, the static arguments, the
keyword names); this module writes what must cross processes as JSON: shardings (meshes,
device ids, specs), static values, NamedTuple types by name, and the configuration that keys
a call (x64, the mesh of `jax.set_mesh`). `Unrecordable` says why a call cannot be written.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import numpy as np

from fastpjit import _core
from fastpjit.warm_start.schema import MAX_DEPTH, TYPE_NAME, Signature, named_type

__all__ = ["Unrecordable", "describe_call"]


class Unrecordable(Exception):
    """A call whose signature a record cannot hold, with the reason."""


def describe_call(
    dispatch: _core.DispatchCache, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Signature:
    """The signature of `fn(*args, **kwargs)`, as `fn`'s dispatch cache `dispatch` keys it,
    as JSON data; raises `Unrecordable`."""
    read = dispatch._signature(*args, **kwargs)
    if read is None:
        raise Unrecordable("a call that JAX runs, which has no signature")
    positional, keywords = read
    return {
        "args": [_entry(entry) for entry in positional],
        "kwargs": {name: _entry(entry) for name, entry in sorted(keywords)},
        "config": {
            "jax_enable_x64": bool(jax.config.read("jax_enable_x64")),
            "mesh": _context_mesh(),
        },
    }


def _entry(entry: tuple[Any, ...], depth: int = 0) -> Any:
    """A static argument, or a node of the dispatcher's tree (see `DispatchCache._signature`),
    as tagged JSON."""
    if depth > MAX_DEPTH:
        raise Unrecordable(f"a tree deeper than {MAX_DEPTH} levels")
    tag = entry[0]
    if tag == "static":
        return {"static": _static_value(entry[1])}
    if tag == "leaf":
        return {"leaf": _leaf(entry[1])}
    if tag == "none":
        return {"none": None}
    if tag in ("tuple", "list"):
        return {tag: [_entry(child, depth + 1) for child in entry[1]]}
    if tag == "dict":
        return {"dict": [[_static_value(k), _entry(v, depth + 1)] for k, v in entry[1]]}
    if tag == "registered":
        _, kind, data, children = entry
        return {"namedtuple": _named_tuple(kind, data, children, depth)}
    raise Unrecordable(f"a pytree node of type {entry[1].__qualname__}")


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


def _leaf(leaf: tuple[Any, ...]) -> dict[str, Any]:
    kind = leaf[0]
    if kind == "array":
        _, shape, dtype, weak_type, committed, sharding = leaf
        return {
            "kind": "array",
            "shape": list(shape),
            "dtype": np.dtype(dtype).name,
            "weak_type": bool(weak_type),
            "committed": bool(committed),
            "sharding": _sharding(sharding),
        }
    if kind == "numpy":
        return {"kind": "numpy", "shape": list(leaf[1]), "dtype": leaf[2].name}
    if kind == "numpy_scalar":
        return {"kind": "numpy_scalar", "dtype": leaf[1].name}
    return {"kind": leaf[1]}  # a Python scalar: bool, int, float or complex


def _named_tuple(kind: Any, data: Any, children: list[Any], depth: int) -> dict[str, Any]:
    """A NamedTuple (optax's states, say) by the name of its type, which a replay finds among
    the modules that its process has imported. Only JAX's own node for a NamedTuple (whose
    data is the type, and whose children are the fields) is one; a node that JAX takes apart
    otherwise, or a type that no name finds, cannot be recorded."""
    fields = getattr(kind, "_fields", None)
    if not (isinstance(kind, type) and issubclass(kind, tuple) and isinstance(fields, tuple)):
        raise Unrecordable(f"a pytree node of type {kind.__qualname__}")
    if data is not kind or len(fields) != len(children):
        raise Unrecordable(f"a pytree node of type {kind.__qualname__}, not made of its fields")
    name = f"{kind.__module__}:{kind.__qualname__}"
    if not TYPE_NAME.fullmatch(name) or named_type(name) is not kind:
        raise Unrecordable(f"a NamedTuple {name} that another process cannot find by its name")
    return {
        "type": name,
        "fields": list(fields),
        "children": [_entry(child, depth + 1) for child in children],
    }
