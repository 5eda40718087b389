"""`f.bind(*args, **kwargs)`: a fastpjit function with resident arguments bound, for serving
loops that pass the same parameters to every call.

`g = fastpjit.jit(step).bind(params)` makes `g(token, cache)` exactly `step(params, token,
cache)`. The bound arguments are flattened and checked once, at bind time: a bound argument
that the function donates is a `ValueError` (a resident argument cannot be consumed), and
numpy arrays among them are put on the devices once (as the call would place them: on the
executable's input sharding for a compiled function, else uncommitted on the default device,
as `jax.device_put` puts them), never per call. Numpy arrays of 64-bit types, whose dtype
depends on x64 at call time, and scalars stay as they are. Each call goes into the function's
dispatcher with the bound arrays first, the same objects every time. Binding new parameters
makes a new bound function; the old one stays valid while other threads call it.
"""

from __future__ import annotations

import types
from typing import Any

import jax
import numpy as np

from fastpjit import _core

__all__ = ["Bindable", "Bound"]


class Bound(_core.BoundFunction):
    """A fastpjit function with leading arguments (and keywords) bound."""

    @property
    def __wrapped__(self) -> Any:
        return self._function

    def lower(self, *args: Any, **kwargs: Any) -> Any:
        """Lowers the function for the bound arguments and these."""
        return self._function.lower(*self._args, *args, **self._kwargs, **kwargs)

    def __get__(self, instance: Any, owner: type | None = None) -> Any:
        return self if instance is None else types.MethodType(self, instance)

    def __reduce__(self) -> Any:
        return _rebind, (self._function, self._args, self._kwargs)

    def __copy__(self) -> Bound:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> Bound:
        return self

    def __repr__(self) -> str:
        names = [*(f"arg{i}" for i in range(len(self._args))), *self._kwargs]
        return f"<fastpjit bound {self._function!r} with {', '.join(names)} bound>"


def _rebind(function: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Bound:
    return function.bind(*args, **kwargs)


class Bindable:
    """What fastpjit's functions share: `bind`. A subclass says which arguments its function
    donates (`_donated_arguments`) and where host values go (`_bound_placement`)."""

    def bind(self, *args: Any, **kwargs: Any) -> Bound:
        """This function with `args` (its first arguments) and `kwargs` bound: calling the
        result with `rest` calls this one with `*args, *rest`."""
        donated_positions, donated_names = self._donated_arguments()
        for i in range(len(args)):
            if i in donated_positions:
                raise ValueError(
                    f"bind: argument {i} of {self!r} is donated, and a bound argument stays "
                    "resident: it cannot be consumed. Bind only arguments that are not donated, "
                    "or pass it on every call.")
        for name in kwargs:
            if name in donated_names:
                raise ValueError(
                    f"bind: keyword argument {name!r} of {self!r} is donated, and a bound "
                    "argument stays resident: it cannot be consumed.")
        placement = self._bound_placement(len(args))
        args = tuple(_placed(arg, placement(i)) for i, arg in enumerate(args))
        kwargs = {name: _placed(value, None) for name, value in kwargs.items()}
        arrays = [(_where(path), leaf)
                  for path, leaf in jax.tree_util.tree_flatten_with_path((args, kwargs))[0]
                  if isinstance(leaf, jax.Array)]
        return Bound(self, args, kwargs, arrays)

    def _donated_arguments(self) -> tuple[set[int], set[str]]:
        return set(), set()

    def _bound_placement(self, count: int) -> Any:
        """For each bound position, the sharding (tree) its host values go on, or None for
        `jax.device_put`'s default; or "host" to leave them to the call."""
        return lambda i: None


def _where(path: tuple[Any, ...]) -> str:
    """A bound leaf's path as the call spells it: `args[0]['w']`, `kwargs['cache'][1]`."""
    (kind, *rest) = path
    return ("args" if kind.idx == 0 else "kwargs") + jax.tree_util.keystr(tuple(rest))


def _x64_independent(dtype: np.dtype) -> bool:
    """Whether x64 leaves arrays of `dtype` as they are (not 64-bit ints and floats, nor
    complex128): those are placed at bind time as any call would place them."""
    wide = 16 if dtype.kind == "c" else 8
    return not (dtype.kind in "iufc" and dtype.itemsize == wide)


def _placed(value: Any, sharding: Any) -> Any:
    """`value` with its numpy arrays put on the devices (copied: later changes to the host
    array do not reach the bound one)."""
    if sharding == "host":
        return value

    def place(leaf: Any, where: Any = None) -> Any:
        if type(leaf) is np.ndarray and _x64_independent(leaf.dtype):
            return jax.device_put(leaf, where, may_alias=False)
        return leaf

    if sharding is None:
        return jax.tree.map(place, value)
    return jax.tree.map(place, value, sharding)
