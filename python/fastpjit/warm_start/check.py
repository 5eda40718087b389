"""Checks a loaded record against the schema before anything of it is used, naming where it is
wrong: the record is data from outside, possibly corrupt, truncated or hostile."""

from __future__ import annotations

import math
from typing import Any, NoReturn, TypeVar

import jax
import numpy as np

from fastpjit.warm_start.schema import (
    MAX_DEPTH,
    MAX_DIM,
    MAX_NDIM,
    MAX_NODES,
    SCHEMA,
    SCHEMA_VERSION,
    TYPE_NAME,
    Record,
)

__all__ = ["check_record"]

T = TypeVar("T")


def check_record(record: Any) -> Record:
    """`record`, checked; raises ValueError naming what is wrong."""
    return _Checker().record(record)


_NODE_KEYS = "leaf, tuple, list, dict, none, namedtuple"


class _Checker:
    """Checks a loaded record against the schema, naming where it is wrong."""

    def __init__(self) -> None:
        self.nodes = 0

    def fail(self, where: str, expected: str, got: Any) -> NoReturn:
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

    def typed(self, value: object, kind: type[T], where: str, what: str) -> T:
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            self.fail(where, what, value)
        return value

    def record(self, value: Any) -> Record:
        record = self.obj(
            value, "the top level", {"schema", "schema_version", "versions", "functions"}
        )
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
        return record

    def signature(self, signature: Any, where: str) -> None:
        self.obj(signature, where, {"args", "kwargs", "config"}, frozenset({"compiler_options"}))
        if "compiler_options" in signature:
            self.compiler_options(signature["compiler_options"], f"{where}.compiler_options")
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

    def compiler_options(self, options: Any, where: str) -> None:
        for name, value in self.typed(options, dict, where, "an object").items():
            self.count(where)
            if isinstance(value, float) and not math.isfinite(value):
                self.fail(f"{where}[{name!r}]", "a finite float", value)
            if not isinstance(value, (str, bool, int, float)):
                self.fail(f"{where}[{name!r}]", "a string, bool or number", value)

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
            if not TYPE_NAME.fullmatch(name):
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
