"""A call explained in words: its signature leaf by leaf, what differs from the nearest
signature that its function cached, and the `Explanation` that `explain` returns and a
`RecompileError` of `no_recompiles` says.

The dispatcher describes signatures, and decides what differs, itself
(`DispatchCache._describe` and `_differences`, the core's `dispatch::describe`): every leaf,
static argument, keyword name, the tree and each item of JAX's jit key, as it keys them.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from fastpjit import _core

__all__ = ["Difference", "Explanation", "explanation"]


@dataclasses.dataclass(frozen=True)
class Difference:
    """One way a call's signature differs from a cached one: `what` names the cause (kind,
    shape, dtype, weak type, committed, sharding, static value, tree structure, keyword
    arguments, or a jit-key item by its name, such as jax_enable_x64), `path` where it is."""

    what: str
    path: str
    call: str
    cached: str

    def __str__(self) -> str:
        return (
            f"{self.path}: {self.what} differs: this call has {self.call}, the cached "
            f"signature {self.cached}"
        )


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
    description, then each static argument's, the tree's and the keyword names' (for a call
    that JAX runs, which has no signature, `"(call)"` says so); on a miss, `differences` says
    what differs from the nearest cached signature (None when nothing is cached). For a hit,
    `inputs` says how each flat argument becomes an executable input, and `in_shardings` /
    `out_shardings` are the executable's.
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
    # Whether the call has a signature (one that JAX runs has none).
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
                    "The nearest cached signature reads the same (another cause: an equal "
                    "text of another value, such as a static argument's repr)."
                )
        elif self.outcome == "miss" and self.described:
            lines.append("Nothing is cached for this function yet.")
        elif self.outcome == "miss":
            lines.append(
                "What differs from the cached signatures cannot be said: this call has no "
                "signature."
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


def explanation(
    name: str,
    kind: str,
    dispatch: _core.DispatchCache,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    probe: dict[str, Any],
    note: str | None = None,
    compiler_options: dict[str, Any] | None = None,
) -> Explanation:
    """How the function `name` (of `kind`), whose cache is `dispatch`, serves this call, which
    the dispatcher's `probe` says."""
    rows = dispatch._describe(*args, **kwargs)
    outcome = probe["outcome"]
    differences = None
    if outcome == "miss" and rows is not None:
        found = dispatch._differences(*args, **kwargs)
        differences = None if found is None else tuple(Difference(*d) for d in found)
    inputs = None
    if outcome == "hit" and "inputs" in probe:
        kinds = probe["inputs"]
        # The rows start with the flat leaves, in the order of the executable's inputs.
        paths = [path for path, _ in rows or ()][: len(kinds)]
        if len(paths) != len(kinds):
            paths = [f"leaf {i}" for i in range(len(kinds))]
        inputs = {p: _INPUT_WORDS.get(k, k) for p, k in zip(paths, kinds, strict=True)}
    return Explanation(
        function=name,
        kind=kind,
        outcome=outcome,
        path=probe.get("path"),
        reason=probe.get("reason"),
        signature=dict(rows) if rows is not None else {"(call)": "no signature: JAX runs it"},
        differences=differences,
        inputs=inputs,
        in_shardings=tuple(probe["in_shardings"]) if "in_shardings" in probe else None,
        out_shardings=tuple(probe["out_shardings"]) if "out_shardings" in probe else None,
        note=note,
        described=rows is not None,
        compiler_options=compiler_options,
    )
