"""Compile options per signature (`f.with_compiler_options`): the XLA options that the calls of
one shape bucket of a jit function compile with, merged over the function's own
`compiler_options` (the bucket's win).

A bucket is a call's tree, the shape and dtype of each dynamic leaf (an array, a scalar or a
`jax.ShapeDtypeStruct`) and its static arguments; weak types and shardings do not count.
"""

from __future__ import annotations

import threading
from collections.abc import Hashable, Iterable, Mapping
from typing import Any

import jax
import numpy as np

from fastpjit import _core
from fastpjit.errors import CompilerOptionsError

__all__ = ["SignatureOptions", "checked_options"]

# What jaxlib takes as an option's value (`CompileOptions.env_option_overrides`).
_VALUE_TYPES = (str, bool, int, float)


def checked_options(options: Any) -> dict[str, Any]:
    """`options` as a dict of XLA option names to values, checked as the backend checks them
    (an unknown name is JAX's `JaxRuntimeError`, as jax.jit's `compiler_options` gives it);
    errors name the argument."""
    if not isinstance(options, Mapping):
        raise CompilerOptionsError(
            "with_compiler_options: compiler_options must be a dict of XLA option names to "
            f"values, got {type(options).__qualname__}: {options!r}"
        )
    checked: dict[str, Any] = {}
    for name, value in options.items():
        if not isinstance(name, str):
            raise CompilerOptionsError(
                f"with_compiler_options: compiler_options' names must be str, got {name!r}"
            )
        if not isinstance(value, _VALUE_TYPES):
            raise CompilerOptionsError(
                f"with_compiler_options: compiler_options[{name!r}] must be a str, bool, int or "
                f"float, got {type(value).__qualname__}: {value!r}"
            )
        checked[name] = value
    if checked:
        try:
            # The backend knows which names it takes: a tiny compile asks it once.
            jax.jit(_identity, compiler_options=checked).lower(np.float32(0)).compile()
        except jax.errors.JaxRuntimeError as error:
            raise jax.errors.JaxRuntimeError(
                f"with_compiler_options: compiler_options: {error}"
            ) from None
    return checked


def _identity(x: Any) -> Any:
    return x


class SignatureOptions:
    """The compile options registered for shape buckets of one function's calls, shared by the
    functions of its dispatch cache (`dispatch`), whose entries of a bucket they replace are
    forgotten. `statics` are the function's static argument positions and names; `options`
    its own `compiler_options`."""

    def __init__(
        self,
        dispatch: _core.DispatchCache,
        statics: tuple[Iterable[int], Iterable[str]],
        options: Mapping[str, Any] | None,
    ) -> None:
        self._dispatch = dispatch
        self._static_positions = set(statics[0])
        self._static_names = set(statics[1])
        self.function_options = dict(options or {})
        self._by_bucket: dict[Hashable, dict[str, Any]] = {}
        self._lock = threading.Lock()

    def register(self, options: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """Compiles the calls of the bucket of `args` and `kwargs` with `options`."""
        bucket, shapes = self._bucket(args, kwargs)
        checked = checked_options(options)
        with self._lock:
            if self._by_bucket.get(bucket) == checked:
                return
            self._by_bucket[bucket] = checked
        # jax.jit's dispatch would compile these calls with the function's options.
        self._dispatch._no_delegation()
        self._dispatch._forget_shapes(shapes)

    def adopt(
        self, options: Mapping[str, Any], args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> str | None:
        """For `warm_up`: registers recorded `options` for this call's bucket where the
        function has none for it; where it has others, says so (and registers nothing)."""
        bucket, _ = self._bucket(args, kwargs)
        with self._lock:
            found = self._by_bucket.get(bucket, {})
        if found == options:
            return None
        if found:
            recorded = f"the compiler options {dict(options)}" if options else "no compiler options"
            return (
                f"recorded with {recorded} for this signature, and the function now takes "
                f"{found} for it"
            )
        self.register(options, args, kwargs)
        return None

    def registered(self) -> bool:
        """Whether any signature has options of its own."""
        return bool(self._by_bucket)

    def of(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> dict[str, Any] | None:
        """The options registered for the bucket of this call, or None."""
        if not self._by_bucket:
            return None
        try:
            bucket, _ = self._bucket(args, kwargs)
        except (TypeError, ValueError):
            return None
        with self._lock:
            found = self._by_bucket.get(bucket)
        return None if found is None else dict(found)

    def merged(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> dict[str, Any]:
        """The options that this call compiles with: the function's, and its bucket's over
        them."""
        return {**self.function_options, **(self.of(args, kwargs) or {})}

    def _bucket(
        self, args: tuple[Any, ...], kwargs: Mapping[str, Any]
    ) -> tuple[Hashable, list[tuple[int, ...]]]:
        """The bucket of a call, and the shapes of its dynamic leaves; a TypeError names a leaf
        that has no shape and dtype, or a static argument that cannot be hashed."""
        n = len(args)
        statics = {p % n for p in self._static_positions if -n <= p < n}
        # Static arguments as None, so that the paths of the others are the call's.
        dynamic = (
            tuple(None if i in statics else a for i, a in enumerate(args)),
            {k: v for k, v in kwargs.items() if k not in self._static_names},
        )
        leaves, tree = jax.tree_util.tree_flatten_with_path(dynamic)
        avals = []
        for path, leaf in leaves:
            aval = _shape_and_dtype(leaf)
            if aval is None:
                where = ("args" if path[0].idx == 0 else "kwargs") + jax.tree_util.keystr(path[1:])
                raise TypeError(
                    f"with_compiler_options: {where} is a {type(leaf).__qualname__}; a "
                    "signature takes arrays, scalars or jax.ShapeDtypeStructs"
                )
            avals.append(aval)
        static_values = (
            tuple((i, args[i]) for i in sorted(statics)),
            tuple(sorted((k, v) for k, v in kwargs.items() if k in self._static_names)),
        )
        bucket = (tree, tuple(avals), static_values)
        try:
            hash(bucket)
        except TypeError as error:
            raise TypeError(
                f"with_compiler_options: a static argument cannot be hashed ({error})"
            ) from None
        return bucket, [shape for shape, _ in avals]


def _shape_and_dtype(leaf: Any) -> tuple[tuple[int, ...], np.dtype] | None:
    """The shape and dtype that `leaf` takes in a call (a Python scalar's under x64 as it is
    now), or None where it is no array, scalar or `jax.ShapeDtypeStruct`."""
    try:
        dtype = leaf.dtype if hasattr(leaf, "dtype") else np.result_type(leaf)
        return tuple(np.shape(leaf)), jax.dtypes.canonicalize_dtype(dtype)
    except Exception:  # noqa: BLE001 - any leaf that says neither
        return None
