"""Why a call misses: a call signature leaf by leaf, what differs from the nearest signature
that the function cached, and `no_recompiles`, which turns a miss into an error.

Signatures here are the JSON data of `fastpjit.warm_start` (kind, shape, dtype, weak type,
commitment and sharding of each leaf; static values; keyword names; x64).
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from collections.abc import Callable
from typing import Any

from fastpjit import _core
from fastpjit.errors import RecompileError

__all__ = ["Difference", "leaf_rows", "nearest_differences", "no_recompiles", "recompiles_allowed"]

# -- Signatures as rows -----------------------------------------------------------------------


def leaf_rows(signature: dict[str, Any]) -> dict[str, str]:
    """Each leaf of a signature, by its path (`args[0]['w']`), described in words."""
    rows: dict[str, str] = {}
    for i, arg in enumerate(signature["args"]):
        _rows(arg, f"args[{i}]", rows)
    for name, arg in signature["kwargs"].items():
        _rows(arg, f"kwargs[{name!r}]", rows)
    return rows


def _rows(node: dict[str, Any], path: str, rows: dict[str, str]) -> None:
    ((tag, value),) = node.items()
    if tag == "static":
        rows[path] = f"static {_static_text(value)}"
    elif tag == "none":
        rows[path] = "None"
    elif tag in ("tuple", "list"):
        if not value:
            rows[path] = f"empty {tag}"
        for i, item in enumerate(value):
            _rows(item, f"{path}[{i}]", rows)
    elif tag == "dict":
        if not value:
            rows[path] = "empty dict"
        for key, item in value:
            _rows(item, f"{path}[{_static_text(key)}]", rows)
    else:
        rows[path] = _leaf_text(value)


def _static_text(value: Any) -> str:
    if isinstance(value, dict):
        if "tuple" in value:
            items = [_static_text(v) for v in value["tuple"]]
            return f"({', '.join(items)}{',' if len(items) == 1 else ''})"
        if "list" in value:
            return f"[{', '.join(_static_text(v) for v in value['list'])}]"
        return f"{value['of']}.{value['dtype']}"
    return repr(value)


def _leaf_text(leaf: dict[str, Any]) -> str:
    kind = leaf["kind"]
    if kind in ("bool", "int", "float", "complex"):
        return f"Python {kind} (weak-typed)" if kind != "bool" else "Python bool"
    if kind == "numpy_scalar":
        return f"numpy scalar {leaf['dtype']}"
    shape = f"{leaf['dtype']}[{','.join(map(str, leaf['shape']))}]"
    if kind == "numpy":
        return f"numpy array {shape}"
    weak = " weak-typed" if leaf["weak_type"] else ""
    committed = "committed" if leaf["committed"] else "uncommitted"
    return f"jax.Array {shape}{weak}, {committed}, {_sharding_text(leaf['sharding'])}"


def _sharding_text(sharding: dict[str, Any]) -> str:
    if sharding["type"] == "single":
        return f"on device {sharding['device_id']}"
    mesh = ", ".join(
        f"{n}={s}" for n, s in zip(sharding["axis_names"], sharding["mesh_shape"], strict=True)
    )
    if sharding["device_ids"] != sorted(sharding["device_ids"]):
        mesh += f" on devices {sharding['device_ids']}"
    spec = ", ".join(
        "None" if p is None else repr(p) if isinstance(p, str) else f"({', '.join(map(repr, p))})"
        for p in sharding["spec"]
    )
    return f"NamedSharding(mesh({mesh}), P({spec}))"


# -- What differs -----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Difference:
    """One way a call's signature differs from a cached one: `what` names the cause (weak
    type, shape, dtype, sharding, committed, static value, kind, tree, keyword arguments,
    x64), `path` the leaf."""

    what: str
    path: str
    call: str
    cached: str

    def __str__(self) -> str:
        return (
            f"{self.path}: {self.what} differs: this call has {self.call}, the cached "
            f"signature {self.cached}"
        )


def _differences(call: dict[str, Any], cached: dict[str, Any]) -> list[Difference]:
    out = []
    ours, theirs = call["config"], cached["config"]
    if ours["jax_enable_x64"] != theirs["jax_enable_x64"]:
        out.append(
            Difference(
                "x64 (jax_enable_x64)",
                "config",
                str(ours["jax_enable_x64"]),
                str(theirs["jax_enable_x64"]),
            )
        )
    if ours["mesh"] != theirs["mesh"]:
        out.append(
            Difference(
                "mesh context (jax.set_mesh)",
                "config",
                _mesh_text(ours["mesh"]),
                _mesh_text(theirs["mesh"]),
            )
        )
    if sorted(call["kwargs"]) != sorted(cached["kwargs"]):
        out.append(
            Difference(
                "keyword arguments",
                "kwargs",
                str(sorted(call["kwargs"])),
                str(sorted(cached["kwargs"])),
            )
        )
    our_leaves, their_leaves = _leaves(call), _leaves(cached)
    if our_leaves.keys() != their_leaves.keys():
        only = sorted(our_leaves.keys() ^ their_leaves.keys())
        out.append(
            Difference(
                "tree structure",
                ", ".join(only[:4]),
                f"{len(our_leaves)} leaves",
                f"{len(their_leaves)} leaves",
            )
        )
    for path in our_leaves.keys() & their_leaves.keys():
        out.extend(_leaf_differences(path, our_leaves[path], their_leaves[path]))
    return out


def _mesh_text(mesh: dict[str, Any] | None) -> str:
    if mesh is None:
        return "no mesh"
    axes = ", ".join(
        f"{n}={s}" for n, s in zip(mesh["axis_names"], mesh["mesh_shape"], strict=True)
    )
    return f"mesh({axes}) on devices {mesh['device_ids']}"


def _leaves(signature: dict[str, Any]) -> dict[str, dict[str, Any]]:
    leaves: dict[str, dict[str, Any]] = {}

    def walk(node: dict[str, Any], path: str) -> None:
        ((tag, value),) = node.items()
        if tag == "static":
            leaves[path] = {"static": value}
        elif tag == "leaf":
            leaves[path] = value
        elif tag in ("tuple", "list"):
            leaves[path] = {"container": tag, "length": len(value)}
            for i, item in enumerate(value):
                walk(item, f"{path}[{i}]")
        elif tag == "dict":
            leaves[path] = {"container": "dict", "keys": [k for k, _ in value]}
            for key, item in value:
                walk(item, f"{path}[{_static_text(key)}]")
        else:
            leaves[path] = {"container": "none"}

    for i, arg in enumerate(signature["args"]):
        walk(arg, f"args[{i}]")
    for name, arg in signature["kwargs"].items():
        walk(arg, f"kwargs[{name!r}]")
    return leaves


def _leaf_differences(path: str, ours: dict[str, Any], theirs: dict[str, Any]) -> list[Difference]:
    if "static" in ours or "static" in theirs:
        if ours != theirs:
            return [Difference("static value", path, _value(ours), _value(theirs))]
        return []
    if "container" in ours or "container" in theirs:
        if ours != theirs:
            return [Difference("tree structure", path, _value(ours), _value(theirs))]
        return []
    if ours["kind"] != theirs["kind"]:
        return [Difference("kind", path, _leaf_text(ours), _leaf_text(theirs))]
    out = []
    for field, what in (
        ("shape", "shape"),
        ("dtype", "dtype"),
        ("weak_type", "weak type"),
        ("committed", "committed"),
        ("sharding", "sharding"),
    ):
        if field in ours and ours[field] != theirs.get(field):
            show: Callable[[Any], str] = _sharding_text if field == "sharding" else str
            out.append(Difference(what, path, show(ours[field]), show(theirs[field])))
    return out


def _value(entry: dict[str, Any]) -> str:
    if "static" in entry:
        return _static_text(entry["static"])
    return str(entry)


def nearest_differences(
    call: dict[str, Any], cached: list[dict[str, Any]]
) -> list[Difference] | None:
    """What differs between `call` and the cached signature nearest to it (fewest
    differences; the newest among equals); None when nothing is cached."""
    best: list[Difference] | None = None
    for signature in reversed(cached):
        found = _differences(call, signature)
        if best is None or len(found) < len(best):
            best = found
    return best


# -- no_recompiles ----------------------------------------------------------------------------

_guard = threading.local()


def recompiles_allowed() -> bool:
    """False inside `no_recompiles` on this thread."""
    return not getattr(_guard, "depth", 0)


class no_recompiles(contextlib.ContextDecorator):  # noqa: N801 - used like a function
    """Inside it, on this thread, a call of a fastpjit function that would trace and compile
    (a miss of a jit, pjit or pmap function) raises `fastpjit.RecompileError`, whose message
    says what differs from the signatures cached. As a decorator, it guards each call of the
    function it decorates. Like `jax.transfer_guard`, it is per thread."""

    def __enter__(self) -> no_recompiles:
        _guard.depth = getattr(_guard, "depth", 0) + 1
        return self

    def __exit__(self, *exc: object) -> None:
        _guard.depth -= 1


def check_recompile(name: str, log: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """Raises RecompileError for a miss of `name` inside `no_recompiles`."""
    if recompiles_allowed():
        return
    _core.count_recompile_stopped()
    raise RecompileError(miss_report(name, log, args, kwargs))


def miss_report(name: str, log: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    """A miss in words: the call's signature, and what differs from the nearest cached."""
    from fastpjit.warm_start import Unrecordable

    try:
        call = log.describe(args, kwargs)
    except Unrecordable as why:
        return f"{name}: this call would compile; its signature cannot be described ({why})"
    lines = [f"{name}: this call misses the cache and would trace and compile."]
    differences = nearest_differences(call, log.signatures())
    if differences is None:
        lines.append("Nothing is cached for this function yet.")
    else:
        lines.append("It differs from the nearest cached signature in:")
        lines.extend(f"  {d}" for d in differences)
    lines.append("Its signature:")
    lines.extend(f"  {path}: {text}" for path, text in leaf_rows(call).items())
    return "\n".join(lines)
