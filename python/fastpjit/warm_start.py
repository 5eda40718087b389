"""Warm starts: the call signatures that fastpjit functions served, saved as a JSON record
(`save_signatures`), and compiled again by a new process before it takes traffic (`warm_up`).

A record is data, never code: JSON with a schema version and the versions that wrote it. A
signature holds each argument's kind, shape, dtype, weak type, commitment and sharding (mesh
shape, axis names, device ids and spec), its tree (tuples, lists, dicts, None, and NamedTuples
by the name of their type), the static arguments that are JSON values, keyword names, and the
configuration that keys a call (x64). Replaying one calls the function once on zero-filled
arguments of that signature, so that its first real call is a cache hit.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.metadata
import json
import math
import operator
import os
import re
import stat
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import jax
import numpy as np

from fastpjit._jax import api
from fastpjit._jax.xla_compile import thread_compile_events

__all__ = ["SignatureLog", "WarmUpReport", "load_record", "save_signatures", "warm_up"]

SCHEMA = "fastpjit.signatures"
# 2: NamedTuple nodes.
SCHEMA_VERSION = 2
# Bounds on what a record may hold, so that a hostile one cannot exhaust memory or the stack.
MAX_RECORD_BYTES = 64 << 20
MAX_DEPTH = 64
MAX_NDIM = 64
MAX_DIM = 1 << 48
MAX_NODES = 1 << 20
# `warm_up`'s defaults: the most bytes of arguments that one replayed call builds (its zeros on
# the host and its arrays on the devices), and the most signatures replayed per function
# (`save_signatures` writes at most as many).
MAX_BYTES = 2 << 30
MAX_SIGNATURES = 1024


class Unrecordable(Exception):
    """A call whose signature a record cannot hold, with the reason."""


class Skipped(Exception):
    """A recorded signature that this process cannot rebuild, with the reason."""


# -- Describing a call ----------------------------------------------------------------------


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
    kind = type(value)
    name = f"{kind.__module__}:{kind.__qualname__}"
    children, tree = jax.tree.flatten(value, is_leaf=lambda x: x is not value)
    try:
        again = kind(*value)
    except Exception:
        again = None
    rebuilt: Any = jax.tree.structure(again, is_leaf=lambda x: x is not again)
    if rebuilt != tree or len(children) != len(value) or any(map(operator.is_not, children, value)):
        raise Unrecordable(f"a pytree node of type {kind.__qualname__}, not made of its fields")
    if not _NAME.fullmatch(name) or _named_type(name) is not kind:
        raise Unrecordable(f"a NamedTuple {name} that another process cannot find by its name")
    return {
        "type": name,
        "fields": list(kind._fields),
        "children": [_node(v, depth + 1) for v in value],
    }


_NAME = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")


def _named_type(name: str) -> Any:
    """The type of this `module:qualname` in a module already imported, or None. Finding it
    reads the namespaces' dicts: no import, no module `__getattr__`, so that a record never
    runs code."""
    module, _, qualname = name.partition(":")
    found: Any = sys.modules.get(module)
    for part in qualname.split("."):
        namespace = getattr(found, "__dict__", None)
        if not isinstance(namespace, Mapping):
            return None
        found = namespace.get(part)
    return found


def _sort_key(item: tuple[Any, Any]) -> Any:
    return (type(item[0]).__name__, item[0])


_LEAF_TREE: Any = jax.tree.structure(0)


def _is_pytree_node(value: Any) -> bool:
    # Every leaf has the tree of one leaf; a container, even an empty one, has another.
    return bool(jax.tree.structure(value) != _LEAF_TREE)


def describe_call(
    args: tuple[Any, ...],
    kwargs: Mapping[str, Any],
    static_positions: set[int],
    static_names: set[str],
) -> dict[str, Any]:
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


def _frozen(value: Any) -> Any:
    """A JSON value as a hashable one that compares as its JSON text would (`1`, `1.0` and
    `true` apart), holding its strings rather than copies: a large static argument is not
    kept twice."""
    if isinstance(value, dict):
        return (dict, tuple(sorted((k, _frozen(v)) for k, v in value.items())))
    if isinstance(value, list):
        return (list, tuple(map(_frozen, value)))
    return (type(value), value)


class SignatureLog:
    """The signatures of one function's cache misses, newest last, at most `capacity`; calls
    that a record cannot hold are counted by reason. `statics` are the function's static
    argument positions and names."""

    def __init__(self, statics: tuple[Any, Any] = ((), ()), capacity: int = 1024) -> None:
        self._static_positions = set(statics[0])
        self._static_names = set(statics[1])
        self._capacity = capacity
        self._signatures: OrderedDict[Any, dict[str, Any]] = OrderedDict()
        self.unrecordable: dict[str, int] = {}
        self._lock = threading.Lock()

    def noting(
        self, miss: Callable[[tuple[Any, ...], dict[str, Any]], Any]
    ) -> Callable[[tuple[Any, ...], dict[str, Any]], Any]:
        """`miss`, noting the signature of each call that it serves."""

        def miss_and_note(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
            outcome = miss(args, kwargs)
            self.note(args, kwargs)
            return outcome

        return miss_and_note

    def describe(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> dict[str, Any]:
        """The signature of a call of this function; raises `Unrecordable`."""
        return describe_call(args, kwargs, self._static_positions, self._static_names)

    def statics_differ(self, signature: dict[str, Any]) -> str | None:
        """Where a recorded signature's static arguments are not this function's, which one;
        else None."""
        n = len(signature["args"])
        statics = {p % n for p in self._static_positions if -n <= p < n}
        places = [(f"args[{i}]", arg, i in statics) for i, arg in enumerate(signature["args"])]
        places += [
            (f"kwargs[{k!r}]", arg, k in self._static_names)
            for k, arg in signature["kwargs"].items()
        ]
        for where, arg, static in places:
            recorded = arg.keys() == {"static"}
            if recorded != static:
                kinds = ("static", "dynamic") if recorded else ("dynamic", "static")
                return f"{where} is recorded as {kinds[0]}, and the function takes it as {kinds[1]}"
        return None

    def note(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> None:
        try:
            signature = self.describe(args, kwargs)
        except Unrecordable as why:
            self._count(str(why))
            return
        except Exception as error:  # noqa: BLE001 - noting a call never fails it
            self._count(f"{type(error).__name__}: {error}")
            return
        key = _frozen(signature)
        with self._lock:
            self._signatures[key] = signature
            self._signatures.move_to_end(key)
            while len(self._signatures) > self._capacity:
                self._signatures.popitem(last=False)

    def _count(self, reason: str) -> None:
        with self._lock:
            if reason in self.unrecordable or len(self.unrecordable) < self._capacity:
                self.unrecordable[reason] = self.unrecordable.get(reason, 0) + 1

    def signatures(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self._signatures.values())

    def clear(self) -> None:
        with self._lock:
            self._signatures.clear()
            self.unrecordable.clear()


# -- The record -----------------------------------------------------------------------------


def _versions() -> dict[str, str]:
    from fastpjit import __version__

    return {
        "fastpjit": __version__,
        "jax": jax.__version__,
        "jaxlib": importlib.metadata.version("jaxlib"),
    }


def _log_of(fn: Any) -> SignatureLog:
    """The signatures that `fn` served; a bound function's are those of the function that it
    binds, whose calls it makes."""
    log = getattr(fn, "_signature_log", None)
    if not isinstance(log, SignatureLog):
        raise TypeError(
            f"expected a fastpjit function (jit, pjit, pmap, AOT-compiled, "
            f"compile_hlo or bound), got {type(fn).__qualname__}: {fn!r}"
        )
    return log


def save_signatures(path: str | os.PathLike[str], functions: Mapping[str, Any]) -> dict[str, Any]:
    """Writes the signatures that each fastpjit function in `functions` (a mapping from a
    stable name to the function) has served to `path` as JSON, and returns the record."""
    if not isinstance(functions, Mapping):
        raise TypeError(
            f"functions: expected a mapping from names to fastpjit functions, "
            f"got {type(functions).__qualname__}"
        )
    record: dict[str, Any] = {
        "schema": SCHEMA,
        "schema_version": SCHEMA_VERSION,
        "versions": _versions(),
        "functions": {},
    }
    for name, fn in functions.items():
        if not isinstance(name, str):
            raise TypeError(f"functions: names must be str, got {name!r}")
        log = _log_of(fn)
        record["functions"][name] = {
            "signatures": log.signatures(),
            "unrecordable": dict(log.unrecordable),
        }
    text = json.dumps(record, indent=1, allow_nan=False)
    tmp = f"{os.fspath(path)}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as out:
        out.write(text)
    os.replace(tmp, path)
    return record


_NODE_KEYS = "leaf, tuple, list, dict, none, namedtuple"


class _Checker:
    """Checks a loaded record against the schema, naming where it is wrong."""

    def __init__(self) -> None:
        self.nodes = 0

    def fail(self, where: str, expected: str, got: Any) -> None:
        shown = repr(got)
        if len(shown) > 80:
            shown = shown[:77] + "..."
        raise ValueError(f"invalid signature record at {where}: expected {expected}, got {shown}")

    def count(self, where: str) -> None:
        self.nodes += 1
        if self.nodes > MAX_NODES:
            raise ValueError(f"invalid signature record at {where}: more than {MAX_NODES} nodes")

    def obj(
        self, value: Any, where: str, keys: set[str], optional: frozenset[str] = frozenset()
    ) -> dict[str, Any]:
        if not isinstance(value, dict):
            self.fail(where, "an object", value)
        missing = keys - value.keys()
        extra = value.keys() - keys - optional
        if missing or extra:
            self.fail(where, f"an object with the keys {sorted(keys)}", sorted(value))
        return value

    def typed(self, value: Any, kind: type | tuple[type, ...], where: str, what: str) -> Any:
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            self.fail(where, what, value)
        return value

    def record(self, record: Any) -> None:
        self.obj(record, "the top level", {"schema", "schema_version", "versions", "functions"})
        if record["schema"] != SCHEMA:
            self.fail("schema", repr(SCHEMA), record["schema"])
        version = record["schema_version"]
        self.typed(version, int, "schema_version", "an integer")
        if version > SCHEMA_VERSION:
            self.fail(
                "schema_version",
                f"at most {SCHEMA_VERSION} (a newer fastpjit wrote this record)",
                version,
            )
        if version < 1:
            self.fail("schema_version", "at least 1", version)
        versions = self.obj(record["versions"], "versions", {"fastpjit", "jax", "jaxlib"})
        for name, value in versions.items():
            self.typed(value, str, f"versions.{name}", "a string")
        functions = self.typed(record["functions"], dict, "functions", "an object")
        for name, entry in functions.items():
            where = f"functions[{name!r}]"
            self.obj(entry, where, {"signatures", "unrecordable"})
            self.typed(entry["unrecordable"], dict, f"{where}.unrecordable", "an object")
            signatures = self.typed(entry["signatures"], list, f"{where}.signatures", "a list")
            for i, signature in enumerate(signatures):
                self.signature(signature, f"{where}.signatures[{i}]")

    def signature(self, signature: Any, where: str) -> None:
        self.obj(signature, where, {"args", "kwargs", "config"})
        for i, arg in enumerate(self.typed(signature["args"], list, f"{where}.args", "a list")):
            self.argument(arg, f"{where}.args[{i}]")
        kwargs = self.typed(signature["kwargs"], dict, f"{where}.kwargs", "an object")
        for name, arg in kwargs.items():
            self.argument(arg, f"{where}.kwargs[{name!r}]")
        config = self.obj(signature["config"], f"{where}.config", {"jax_enable_x64", "mesh"})
        self.typed(config["jax_enable_x64"], bool, f"{where}.config.jax_enable_x64", "a bool")
        if config["mesh"] is not None:
            self.obj(
                config["mesh"],
                f"{where}.config.mesh",
                {"mesh_shape", "axis_names", "axis_types", "device_ids"},
            )
            self.mesh(config["mesh"], f"{where}.config.mesh")

    def argument(self, arg: Any, where: str) -> None:
        if isinstance(arg, dict) and arg.keys() == {"static"}:
            self.static(arg["static"], f"{where}.static", 0)
        else:
            self.node(arg, where, 0)

    def static(self, value: Any, where: str, depth: int, hashable: bool = False) -> None:
        """A static value; `hashable` where it is a dict's key, which a list cannot be."""
        self.count(where)
        if depth > MAX_DEPTH:
            self.fail(where, f"at most {MAX_DEPTH} levels of nesting", "deeper")
        if value is None or isinstance(value, (bool, int, str)):
            return
        if isinstance(value, float):
            if not math.isfinite(value):
                self.fail(where, "a finite float", value)
            return
        if isinstance(value, dict) and value.keys() in ({"tuple"}, {"list"}):
            if hashable and "list" in value:
                self.fail(where, "a hashable static value (a list is not)", value)
            (items,) = value.values()
            for i, item in enumerate(self.typed(items, list, where, "a list")):
                self.static(item, f"{where}[{i}]", depth + 1, hashable)
            return
        if isinstance(value, dict) and value.keys() == {"dtype", "of"}:
            if value["of"] not in ("numpy.dtype", "numpy", "jax.numpy"):
                self.fail(f"{where}.of", "'numpy.dtype', 'numpy' or 'jax.numpy'", value["of"])
            _dtype(self.typed(value["dtype"], str, f"{where}.dtype", "a dtype name"), where)
            return
        self.fail(where, "a JSON static value", value)

    def node(self, node: Any, where: str, depth: int) -> None:
        self.count(where)
        if depth > MAX_DEPTH:
            self.fail(where, f"at most {MAX_DEPTH} levels of nesting", "deeper")
        if not isinstance(node, dict) or len(node) != 1:
            self.fail(where, f"an object with one of the keys {_NODE_KEYS}", node)
        ((tag, value),) = node.items()
        if tag == "none":
            if value is not None:
                self.fail(where, "null", value)
        elif tag in ("tuple", "list"):
            for i, item in enumerate(self.typed(value, list, where, "a list")):
                self.node(item, f"{where}[{i}]", depth + 1)
        elif tag == "dict":
            for i, item in enumerate(self.typed(value, list, where, "a list of [key, value]")):
                if not isinstance(item, list) or len(item) != 2:
                    self.fail(f"{where}[{i}]", "a [key, value] pair", item)
                self.static(item[0], f"{where}[{i}].key", depth + 1, hashable=True)
                self.node(item[1], f"{where}[{i}].value", depth + 1)
        elif tag == "namedtuple":
            self.obj(value, where, {"type", "fields", "children"})
            name = self.typed(value["type"], str, f"{where}.type", "a string")
            if not _NAME.fullmatch(name):
                self.fail(f"{where}.type", "a type's module:qualname", name)
            fields = self.typed(value["fields"], list, f"{where}.fields", "a list")
            for i, field in enumerate(fields):
                if not isinstance(field, str) or not field.isidentifier():
                    self.fail(f"{where}.fields[{i}]", "a field name", field)
            children = self.typed(value["children"], list, f"{where}.children", "a list")
            if len(children) != len(fields):
                self.fail(f"{where}.children", f"{len(fields)} children, one a field", children)
            for i, item in enumerate(children):
                self.node(item, f"{where}.children[{i}]", depth + 1)
        elif tag == "leaf":
            self.leaf(value, f"{where}.leaf")
        else:
            self.fail(where, f"one of the keys {_NODE_KEYS}", tag)

    def leaf(self, leaf: Any, where: str) -> None:
        kind = self.typed(leaf, dict, where, "an object").get("kind")
        if kind in ("bool", "int", "float", "complex"):
            self.obj(leaf, where, {"kind"})
        elif kind == "numpy_scalar":
            self.obj(leaf, where, {"kind", "dtype"})
            _dtype(self.typed(leaf["dtype"], str, f"{where}.dtype", "a dtype name"), where)
        elif kind in ("numpy", "array"):
            keys = {"kind", "shape", "dtype"}
            if kind == "array":
                keys |= {"weak_type", "committed", "sharding"}
            self.obj(leaf, where, keys)
            self.shape(leaf["shape"], f"{where}.shape")
            _dtype(self.typed(leaf["dtype"], str, f"{where}.dtype", "a dtype name"), where)
            if kind == "array":
                self.typed(leaf["weak_type"], bool, f"{where}.weak_type", "a bool")
                self.typed(leaf["committed"], bool, f"{where}.committed", "a bool")
                self.sharding(leaf["sharding"], f"{where}.sharding")
        else:
            self.fail(
                f"{where}.kind", "bool, int, float, complex, numpy_scalar, numpy or array", kind
            )

    def shape(self, shape: Any, where: str) -> None:
        self.typed(shape, list, where, "a list of dims")
        if len(shape) > MAX_NDIM:
            self.fail(where, f"at most {MAX_NDIM} dims", len(shape))
        for i, dim in enumerate(shape):
            self.typed(dim, int, f"{where}[{i}]", "an integer dim")
            if not 0 <= dim <= MAX_DIM:
                self.fail(f"{where}[{i}]", f"a dim in [0, {MAX_DIM}]", dim)

    def device_ids(self, ids: Any, where: str) -> None:
        for i, d in enumerate(self.typed(ids, list, where, "a list of device ids")):
            self.typed(d, int, f"{where}[{i}]", "a device id")
            if not 0 <= d < 1 << 31:
                self.fail(f"{where}[{i}]", "a device id in [0, 2**31)", d)

    def sharding(self, sharding: Any, where: str) -> None:
        kind = self.typed(sharding, dict, where, "an object").get("type")
        if kind == "single":
            self.obj(sharding, where, {"type", "device_id", "memory_kind"})
            self.device_ids([sharding["device_id"]], f"{where}.device_id")
        elif kind == "named":
            self.obj(
                sharding,
                where,
                {
                    "type",
                    "mesh_shape",
                    "axis_names",
                    "axis_types",
                    "device_ids",
                    "spec",
                    "memory_kind",
                },
            )
            self.mesh(sharding, where)
            for i, entry in enumerate(
                self.typed(sharding["spec"], list, f"{where}.spec", "a list")
            ):
                ok = (
                    entry is None
                    or isinstance(entry, str)
                    or (isinstance(entry, list) and all(isinstance(e, str) for e in entry))
                )
                if not ok:
                    self.fail(f"{where}.spec[{i}]", "null, an axis name or a list of them", entry)
        else:
            self.fail(f"{where}.type", "'single' or 'named'", kind)
        memory_kind = sharding["memory_kind"]
        if memory_kind is not None:
            self.typed(memory_kind, str, f"{where}.memory_kind", "a string or null")

    def mesh(self, sharding: dict[str, Any], where: str) -> None:
        self.shape(sharding["mesh_shape"], f"{where}.mesh_shape")
        for i, dim in enumerate(sharding["mesh_shape"]):
            if dim < 1:  # jaxlib aborts the process on a mesh without devices
                self.fail(f"{where}.mesh_shape[{i}]", "a mesh dim of at least 1", dim)
        names = self.typed(sharding["axis_names"], list, f"{where}.axis_names", "a list")
        types = self.typed(sharding["axis_types"], list, f"{where}.axis_types", "a list")
        if len(names) != len(sharding["mesh_shape"]) or len(types) != len(names):
            self.fail(
                where,
                "an axis name and type for each mesh dim",
                [names, types, sharding["mesh_shape"]],
            )
        for i, name in enumerate(names):
            self.typed(name, str, f"{where}.axis_names[{i}]", "a string")
        for i, kind in enumerate(types):
            if kind not in jax.sharding.AxisType.__members__:
                self.fail(f"{where}.axis_types[{i}]", "an AxisType name", kind)
        self.device_ids(sharding["device_ids"], f"{where}.device_ids")
        if len(sharding["device_ids"]) != math.prod(sharding["mesh_shape"]):
            self.fail(
                f"{where}.device_ids",
                "a device id for each mesh position",
                len(sharding["device_ids"]),
            )
        if len(set(sharding["device_ids"])) != len(sharding["device_ids"]):
            self.fail(f"{where}.device_ids", "distinct device ids", sharding["device_ids"])


def _dtype(name: str, where: str) -> np.dtype:
    try:
        dtype = jax.numpy.dtype(name)
    except TypeError:
        dtype = None
    # Booleans and numbers, ml_dtypes' too (bfloat16, int4, float8s); not numpy's void.
    if (
        dtype is None
        or dtype.name != name
        or not (dtype.kind == "b" or jax.dtypes.issubdtype(dtype, np.number))
    ):
        raise ValueError(
            f"invalid signature record at {where}: expected a dtype that JAX places, got {name!r}"
        )
    return dtype


def load_record(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Reads and checks a record; raises ValueError naming what is wrong. Runs nothing."""
    name = os.fspath(path)
    # Without blocking: a named pipe opens at once (and is refused), where a plain open would
    # wait for a writer.
    fd = os.open(name, os.O_RDONLY | os.O_NONBLOCK)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ValueError(f"invalid signature record {name!r}: not a regular file")
        with open(fd, "rb", closefd=False) as source:
            data = source.read(MAX_RECORD_BYTES + 1)
    finally:
        os.close(fd)
    if len(data) > MAX_RECORD_BYTES:
        raise ValueError(f"invalid signature record {name!r}: larger than {MAX_RECORD_BYTES} bytes")
    try:
        record = json.loads(
            data.decode("utf-8"), parse_constant=_no_constant, object_pairs_hook=_unique_keys
        )
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as error:
        raise ValueError(f"invalid signature record {name!r}: not JSON ({error})") from None
    _Checker().record(record)
    return record


def _no_constant(name: str) -> Any:
    raise ValueError(f"invalid signature record: {name} is not a JSON value")


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object, whose keys must differ: JSON itself keeps the last of a repeated key."""
    out = dict(pairs)
    if len(out) != len(pairs):
        keys = [key for key, _ in pairs]
        twice = next(key for i, key in enumerate(keys) if key in keys[:i])
        raise ValueError(f"invalid signature record: an object has the key {twice!r} twice")
    return out


# -- Replaying a record ---------------------------------------------------------------------


class _Rebuilder:
    """Rebuilds a recorded call's arguments, zero-filled, on this process's devices."""

    def __init__(self) -> None:
        self.devices = {d.id: d for d in jax.devices()}

    def device(self, device_id: int) -> Any:
        device = self.devices.get(device_id)
        if device is None:
            raise Skipped(
                f"device id {device_id} is not one of this process's {len(self.devices)} devices"
            )
        return device

    def static(self, value: Any) -> Any:
        if not isinstance(value, dict):
            return value
        if "tuple" in value:
            return tuple(self.static(v) for v in value["tuple"])
        if "list" in value:
            return [self.static(v) for v in value["list"]]
        dtype = np.dtype(jax.numpy.dtype(value["dtype"]))
        if value["of"] == "numpy.dtype":
            return dtype
        if value["of"] == "numpy":
            return dtype.type
        return getattr(jax.numpy, dtype.name)

    def mesh(self, mesh: dict[str, Any]) -> jax.sharding.Mesh:
        devices = np.array([self.device(i) for i in mesh["device_ids"]], dtype=object)
        axis_types = tuple(jax.sharding.AxisType[t] for t in mesh["axis_types"])
        try:
            return jax.sharding.Mesh(
                devices.reshape(mesh["mesh_shape"]),
                tuple(mesh["axis_names"]),
                axis_types=axis_types,
            )
        except Exception as error:
            raise Skipped(f"the mesh no longer fits: {type(error).__name__}: {error}") from None

    def sharding(self, sharding: dict[str, Any]) -> Any:
        if sharding["type"] == "single":
            return jax.sharding.SingleDeviceSharding(
                self.device(sharding["device_id"]), memory_kind=sharding["memory_kind"]
            )
        mesh = self.mesh(sharding)
        spec = jax.sharding.PartitionSpec(
            *(tuple(p) if isinstance(p, list) else p for p in sharding["spec"])
        )
        return jax.sharding.NamedSharding(mesh, spec, memory_kind=sharding["memory_kind"])

    def leaf(self, leaf: dict[str, Any]) -> Any:
        kind = leaf["kind"]
        if kind in ("bool", "int", "float", "complex"):
            return {"bool": False, "int": 0, "float": 0.0, "complex": 0j}[kind]
        dtype = np.dtype(jax.numpy.dtype(leaf["dtype"]))
        if kind == "numpy_scalar":
            return dtype.type(0)
        zeros = np.zeros(leaf["shape"], dtype)
        if kind == "numpy":
            return zeros
        try:
            sharding = self.sharding(leaf["sharding"])
            array = api.weak_typed(zeros) if leaf["weak_type"] else zeros
            if not leaf["committed"]:
                return jax.device_put(array)
            return jax.device_put(array, sharding)
        except Skipped:
            raise
        except Exception as error:  # a mesh or spec that no longer fits this process
            raise Skipped(f"the sharding no longer fits: {type(error).__name__}: {error}") from None

    def node(self, node: dict[str, Any]) -> Any:
        ((tag, value),) = node.items()
        if tag == "none":
            return None
        if tag == "tuple":
            return tuple(self.node(v) for v in value)
        if tag == "list":
            return [self.node(v) for v in value]
        if tag == "dict":
            return {self.static(k): self.node(v) for k, v in value}
        if tag == "namedtuple":
            return self.named_tuple(value)
        return self.leaf(value)

    def named_tuple(self, node: dict[str, Any]) -> Any:
        name, fields = node["type"], tuple(node["fields"])
        kind = _named_type(name)
        if kind is None:
            raise Skipped(
                f"the NamedTuple {name} is not found in the modules this process imported"
            )
        if not (isinstance(kind, type) and issubclass(kind, tuple)) or (
            getattr(kind, "_fields", None) != fields
        ):
            raise Skipped(f"{name} is no longer a NamedTuple of the fields {list(fields)}")
        return kind(*(self.node(v) for v in node["children"]))

    def argument(self, arg: dict[str, Any]) -> Any:
        if arg.keys() == {"static"}:
            return self.static(arg["static"])
        return self.node(arg)

    def call(self, signature: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
        args = tuple(self.argument(a) for a in signature["args"])
        kwargs = {k: self.argument(v) for k, v in signature["kwargs"].items()}
        return args, kwargs


def _leaf_bytes(leaf: dict[str, Any]) -> int:
    """The bytes that a replay builds for a recorded leaf: an array's on each of its devices."""
    if "dtype" not in leaf:
        return 8  # a Python scalar
    size = math.prod(leaf.get("shape", ())) * jax.numpy.dtype(leaf["dtype"]).itemsize
    sharding = leaf.get("sharding")
    if not leaf.get("committed") or sharding is None or sharding["type"] == "single":
        return size
    # Split over the mesh axes that the spec names, and repeated over the others.
    axes = dict(zip(sharding["axis_names"], sharding["mesh_shape"], strict=True))
    named = [e if isinstance(e, list) else [e] for e in sharding["spec"] if e is not None]
    split = math.prod(axes.get(axis, 1) for entry in named for axis in entry)
    return -(-size // split) * len(sharding["device_ids"])


def _bytes(node: Any) -> int:
    """The bytes of the arguments that a replay builds for a recorded argument or node."""
    ((tag, value),) = node.items()
    if tag == "leaf":
        return _leaf_bytes(value)
    if tag in ("tuple", "list"):
        return sum(map(_bytes, value))
    if tag == "dict":
        return sum(_bytes(v) for _, v in value)
    if tag == "namedtuple":
        return sum(map(_bytes, value["children"]))
    return 0  # none, static


def _signature_bytes(signature: dict[str, Any]) -> int:
    return sum(map(_bytes, signature["args"])) + sum(map(_bytes, signature["kwargs"].values()))


@dataclasses.dataclass(frozen=True)
class WarmUpEntry:
    """One recorded signature replayed: compiled, loaded from JAX's persistent compilation
    cache, already cached, or skipped and why."""

    function: str
    index: int
    outcome: str
    seconds: float
    reason: str | None = None


@dataclasses.dataclass(frozen=True)
class WarmUpReport:
    """What `warm_up` did with each recorded signature."""

    entries: tuple[WarmUpEntry, ...]
    seconds: float

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for entry in self.entries:
            out[entry.outcome] = out.get(entry.outcome, 0) + 1
        return out

    def skipped(self) -> dict[str, int]:
        """The reasons of the skipped signatures, with their counts."""
        out: dict[str, int] = {}
        for entry in self.entries:
            if entry.outcome == "skipped":
                assert entry.reason is not None
                out[entry.reason] = out.get(entry.reason, 0) + 1
        return out

    def __str__(self) -> str:
        lines = [
            f"warm_up: {len(self.entries)} signatures in {self.seconds:.2f} s: "
            + ", ".join(f"{n} {outcome}" for outcome, n in sorted(self.counts().items()))
        ]
        for entry in self.entries:
            line = f"  {entry.function}[{entry.index}]: {entry.outcome}, {entry.seconds:.3f} s"
            if entry.reason:
                line += f" ({entry.reason})"
            lines.append(line)
        return "\n".join(lines)


def warm_up(
    path: str | os.PathLike[str],
    functions: Mapping[str, Any],
    *,
    threads: int | None = None,
    max_bytes: int | None = MAX_BYTES,
    max_signatures: int | None = MAX_SIGNATURES,
) -> WarmUpReport:
    """Compiles every signature recorded in `path` for the functions passed (a mapping from
    the names they were saved under to fastpjit functions) and caches it, so that the first
    real call of each is a cache hit. Each signature is replayed by one call on zero-filled
    arguments; those that this process cannot rebuild, whose arguments take more than
    `max_bytes`, past the first `max_signatures` of their function, or whose replay raises are
    skipped with their reason (None: no limit). Only the functions passed are called. Ctrl-C
    stops it. Returns a `WarmUpReport`."""
    if not isinstance(functions, Mapping):
        raise TypeError(
            f"functions: expected a mapping from names to fastpjit functions, "
            f"got {type(functions).__qualname__}"
        )
    for fn in functions.values():
        _log_of(fn)
    for name, value, least in (
        ("threads", threads, 1),
        ("max_bytes", max_bytes, 0),
        ("max_signatures", max_signatures, 0),
    ):
        if value is not None and (type(value) is not int or value < least):
            raise ValueError(f"{name}: expected an int of at least {least} or None, got {value!r}")
    record = load_record(path)
    start = time.perf_counter()
    mismatch = _version_mismatch(record["versions"])
    tasks = [
        (name, i, signature)
        for name, fn in functions.items()
        for i, signature in enumerate(record["functions"].get(name, {}).get("signatures", []))
    ]
    rebuilder = _Rebuilder()

    def replay(task: tuple[str, int, dict[str, Any]]) -> WarmUpEntry:
        name, i, signature = task
        began = time.perf_counter()
        if mismatch is not None:
            return WarmUpEntry(name, i, "skipped", 0.0, mismatch)
        fn = _unbound(functions[name])
        config = signature["config"]
        try:
            if max_signatures is not None and i >= max_signatures:
                raise Skipped(f"past the first max_signatures={max_signatures} of the function")
            statics = _log_of(fn).statics_differ(signature)
            if statics is not None:
                raise Skipped(statics)
            size = _signature_bytes(signature)
            if max_bytes is not None and size > max_bytes:
                raise Skipped(f"its arguments take {size} bytes, more than max_bytes={max_bytes}")
            with contextlib.ExitStack() as scope:
                scope.enter_context(jax.enable_x64(config["jax_enable_x64"]))
                if config["mesh"] is not None:
                    scope.enter_context(jax.set_mesh(rebuilder.mesh(config["mesh"])))
                args, kwargs = rebuilder.call(signature)
                compiles, loaded = thread_compile_events()
                jax.block_until_ready(fn(*args, **kwargs))
                compiles_after, loaded_after = thread_compile_events()
        except Skipped as why:
            return WarmUpEntry(name, i, "skipped", time.perf_counter() - began, str(why))
        except Exception as error:  # noqa: BLE001 - one signature never ends the replay
            first_line = str(error).strip().split("\n", 1)[0]
            reason = f"the replay raised {type(error).__name__}: {first_line}"
            return WarmUpEntry(name, i, "skipped", time.perf_counter() - began, reason)
        if loaded_after > loaded:
            outcome = "loaded"
        elif compiles_after > compiles:
            outcome = "compiled"
        else:
            outcome = "cached"
        return WarmUpEntry(name, i, outcome, time.perf_counter() - began)

    workers = threads or min(len(tasks), os.cpu_count() or 1) or 1
    if jax.process_count() > 1:
        workers = 1  # every process replays its collectives in the record's order
    entries = _run(replay, tasks, workers)
    return WarmUpReport(tuple(entries), time.perf_counter() - start)


def _unbound(fn: Any) -> Any:
    """The function whose calls were recorded: a bound function's is the one it binds."""
    from fastpjit.bind import Bound

    return fn._function if isinstance(fn, Bound) else fn


def _run(replay: Callable[[Any], WarmUpEntry], tasks: list[Any], workers: int) -> list[WarmUpEntry]:
    progress = _progress(len(tasks))
    try:
        if workers == 1:
            results = []
            for task in tasks:
                results.append(replay(task))
                progress(1)
            return results
        pool = ThreadPoolExecutor(workers, thread_name_prefix="fastpjit-warm-up")
        try:
            futures = [pool.submit(replay, task) for task in tasks]
            results = []
            for future in futures:
                results.append(future.result())
                progress(1)
            return results
        finally:
            # On Ctrl-C, at once: the signatures not begun are dropped, and those compiling
            # end on their own.
            pool.shutdown(wait=False, cancel_futures=True)
    finally:
        progress(0, close=True)


def _progress(total: int) -> Callable[..., None]:
    try:
        from tqdm import tqdm  # type: ignore[import-untyped]
    except ImportError:
        return lambda n, close=False: None
    bar = tqdm(
        total=total, desc="fastpjit warm_up", unit="signature", leave=False, disable=total == 0
    )

    def update(n: int, close: bool = False) -> None:
        if close:
            bar.close()
        else:
            bar.update(n)

    return update


def _version_mismatch(recorded: dict[str, str]) -> str | None:
    current = _versions()
    for name in ("fastpjit", "jax", "jaxlib"):
        if recorded[name] != current[name]:
            return f"recorded with {name} {recorded[name]}, and this process runs {current[name]}"
    return None
