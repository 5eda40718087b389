"""A call explained in words: its signature leaf by leaf, what differs from the nearest
signature that its function cached, and the `Explanation` that `explain` returns and a
`RecompileError` of `no_recompiles` says.

Signatures here are the JSON data of `fastpjit.warm_start` (kind, shape, dtype, weak type,
commitment and sharding of each leaf; static values; keyword names; x64).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from fastpjit import _core
from fastpjit.warm_start.describe import Unrecordable
from fastpjit.warm_start.log import SignatureLog
from fastpjit.warm_start.schema import Signature

__all__ = [
    "Difference",
    "Explanation",
    "explanation",
    "leaf_paths",
    "leaf_rows",
    "nearest_differences",
]

# -- Signatures as rows -----------------------------------------------------------------------


def leaf_rows(signature: Signature) -> dict[str, str]:
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
    elif tag == "namedtuple":
        if not value["fields"]:
            rows[path] = f"empty NamedTuple {value['type']}"
        for field, item in zip(value["fields"], value["children"], strict=True):
            _rows(item, f"{path}.{field}", rows)
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


# What keys a call besides its arguments: (the signature's config key, its name, its text).
_CONFIG: tuple[tuple[str, str, Callable[[Any], str]], ...] = (
    ("jax_enable_x64", "x64 (jax_enable_x64)", str),
    ("mesh", "mesh context (jax.set_mesh)", lambda mesh: _mesh_text(mesh)),
)


def _differences(call: Signature, cached: Signature) -> list[Difference]:
    out = []
    ours, theirs = call["config"], cached["config"]
    for key, what, text in _CONFIG:
        if ours[key] != theirs[key]:
            out.append(Difference(what, "config", text(ours[key]), text(theirs[key])))
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


def _leaves(signature: Signature) -> dict[str, dict[str, Any]]:
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
        elif tag == "namedtuple":
            leaves[path] = {"container": value["type"], "fields": value["fields"]}
            for field, item in zip(value["fields"], value["children"], strict=True):
                walk(item, f"{path}.{field}")
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


def nearest_differences(call: Signature, cached: list[Signature]) -> list[Difference] | None:
    """What differs between `call` and the cached signature nearest to it (fewest
    differences; the newest among equals); None when nothing is cached."""
    best: list[Difference] | None = None
    for signature in reversed(cached):
        found = _differences(call, signature)
        if best is None or len(found) < len(best):
            best = found
    return best


def _described_differences(
    dispatch: _core.DispatchCache, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> list[Difference] | None:
    """What differs between the dispatcher's descriptions of this call's signature and of the
    cached signature nearest to it (`DispatchCache._describe`: every leaf, static argument, the
    tree and each item of the jit key); None where either is missing."""
    described = dispatch._describe(*args, **kwargs)
    if described is None:
        return None
    ours = dict(described)
    best: list[Difference] | None = None
    for cached in dispatch._cached_descriptions():
        theirs = dict(cached)
        found = [
            Difference(_item_kind(item), item, ours.get(item, "none"), theirs.get(item, "none"))
            for item in [*ours, *(i for i in theirs if i not in ours)]
            if ours.get(item) != theirs.get(item)
        ]
        if best is None or len(found) < len(best):
            best = found
    return best


def _item_kind(item: str) -> str:
    """What an item of a description is: a jit-key item by its name, else the tree or a leaf."""
    if item.startswith("jit key: "):
        return item.removeprefix("jit key: ")
    return "tree structure" if item == "tree" else "argument"


# -- The explanation --------------------------------------------------------------------------


def _reason_text(code: str | None) -> str:
    """A fallback's code with its text (`docs/fallbacks.md`)."""
    text = _core.fallback_reasons().get(code) if code is not None else None
    return f"{text} [{code}]" if text is not None else str(code)


# What each input kind of a cache entry (the core's `plan::Input`) does with an argument.
_INPUT_WORDS = {
    "pass": "passed as it is",
    "copy": "copied to the executable's devices (a copy kept for the same array again)",
    "move": "moved to the executable's sharding by JAX",
    "host": "placed from the host (a kept device copy where the value repeats)",
    "dropped": "not an input of the executable (unused)",
    "rewrap": "viewed as this process's part of a global array",
    "process_local": "placed as this process's part of a global array",
}
_PATH_WORDS = {
    "recent": "a repeat of a recent call (the recent-entry probe)",
    "keyed": "found by its signature's hash",
    "bound": "the bound path (the bound arguments' leaves taken as they were)",
}


@dataclasses.dataclass(frozen=True)
class Explanation:
    """How fastpjit would serve a call, without running it (`fastpjit.explain`).

    `outcome` is "hit", "miss" or "fallback"; `path` how a hit is found ("recent", "keyed",
    "bound"); `reason` why JAX runs a fallback. `signature` maps each leaf's path to its
    description; on a miss, `differences` says what differs from the nearest cached signature
    (None when nothing is cached). For a hit, `inputs` says how each flat argument becomes an
    executable input, and `in_shardings` / `out_shardings` are the executable's.
    `compiler_options` are the compile options of a jit function's call."""

    function: str
    kind: str
    outcome: str
    path: str | None
    reason: str | None
    signature: dict[str, str]
    differences: tuple[Difference, ...] | None
    inputs: dict[str, str] | None
    in_shardings: tuple[Any, ...] | None
    out_shardings: tuple[Any, ...] | None
    note: str | None = None
    # Whether the call's signature could be described (see `warm_start.describe_call`).
    described: bool = True
    # A jit function's compile options for this call: its own, and its signature's over them
    # (`with_compiler_options`); None for the other kinds of function.
    compiler_options: dict[str, Any] | None = None

    def __str__(self) -> str:
        kind = f" ({self.kind})" if self.kind else ""
        if self.outcome == "hit":
            head = f"a cache hit, {_PATH_WORDS.get(self.path or '', self.path)}"
        elif self.outcome == "miss":
            head = "a cache miss: this call would trace and compile"
        else:
            head = f"a fallback to JAX: {_reason_text(self.reason)}"
        lines = [f"{self.function}{kind}: {head}."]
        if self.note:
            lines.append(self.note)
        if self.outcome == "miss" and self.reason:
            lines.append(f"({self.reason})")
        if self.differences is not None:
            if self.differences:
                lines.append("It differs from the nearest cached signature in:")
                lines.extend(f"  {d}" for d in self.differences)
            else:
                lines.append(
                    "The nearest cached signature shows no difference in what a record "
                    "holds (another cause: an evicted entry, an equal but other value)."
                )
        elif self.outcome == "miss" and self.described:
            lines.append("Nothing is cached for this function yet.")
        elif self.outcome == "miss":
            lines.append(
                "What differs from the cached signatures cannot be said: this call's "
                "signature cannot be described."
            )
        lines.append("Signature:")
        lines.extend(f"  {path}: {text}" for path, text in self.signature.items())
        if self.compiler_options:
            lines.append("Compiler options:")
            lines.extend(f"  {name}: {value!r}" for name, value in self.compiler_options.items())
        if self.inputs is not None:
            lines.append("Inputs:")
            lines.extend(f"  {path}: {how}" for path, how in self.inputs.items())
        for name, shardings in (
            ("Input shardings", self.in_shardings),
            ("Output shardings", self.out_shardings),
        ):
            if shardings:
                lines.append(f"{name}:")
                lines.extend(f"  {i}: {s}" for i, s in enumerate(shardings))
        return "\n".join(lines)


def leaf_paths(signature: Signature) -> list[str]:
    """The paths of a signature's flat dynamic leaves, in JAX's order (positional arguments,
    then keyword arguments by name)."""
    return [
        path
        for path, leaf in _leaves(signature).items()
        if "static" not in leaf and "container" not in leaf
    ]


def explanation(
    name: str,
    kind: str,
    log: SignatureLog,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    probe: dict[str, Any],
    note: str | None = None,
    compiler_options: dict[str, Any] | None = None,
) -> Explanation:
    """How `log`'s function `name` (of `kind`) serves this call, which the dispatcher's `probe`
    says."""
    call: Signature | None = None
    try:
        described = log.describe(args, kwargs)
    except Unrecordable as why:
        rows = {"(call)": f"cannot be described: {why}"}
    else:
        call, rows = described, leaf_rows(described)
    outcome = probe["outcome"]
    differences = None
    if outcome == "miss" and call is not None:
        found = nearest_differences(call, log.signatures())
        if not found and log.dispatch is not None:
            # What a record holds is the same: the dispatcher's own description names what
            # else keys the call (an item of the jit key, a static argument's type, ...).
            found = _described_differences(log.dispatch, args, kwargs) or found
        differences = None if found is None else tuple(found)
    inputs = None
    if outcome == "hit" and "inputs" in probe:
        paths = leaf_paths(call) if call is not None else []
        kinds = probe["inputs"]
        if len(paths) != len(kinds):
            paths = [f"leaf {i}" for i in range(len(kinds))]
        inputs = {p: _INPUT_WORDS.get(k, k) for p, k in zip(paths, kinds, strict=True)}
    return Explanation(
        function=name,
        kind=kind,
        outcome=outcome,
        path=probe.get("path"),
        reason=probe.get("reason"),
        signature=rows,
        differences=differences,
        inputs=inputs,
        in_shardings=tuple(probe["in_shardings"]) if "in_shardings" in probe else None,
        out_shardings=tuple(probe["out_shardings"]) if "out_shardings" in probe else None,
        note=note,
        described=call is not None,
        compiler_options=compiler_options,
    )
