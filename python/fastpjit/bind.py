"""`f.bind(*args, **kwargs)`: a fastpjit function with resident arguments bound, for serving
loops that pass the same parameters to every call.

`g = fastpjit.jit(step).bind(params)` makes `g(token, cache)` exactly `step(params, token,
cache)`. The bound arguments are checked once, at bind time: a bound argument that the
function donates is a `ValueError` (a resident argument cannot be consumed). Numpy arrays among
them are put on the devices once, never per call: on a compiled function's input shardings at
bind time, and for jit and pmap functions after the first call, on the input shardings that
its executable took (numpy arrays of 64-bit types, whose dtype x64 decides at call time, and
scalars are left to each call). A call goes through the Rust `BoundFunction`: after the first
call of positional arrays, a call of the same signature runs its cache entry directly, with the
bound leaves as its first inputs. Binding new parameters makes a new bound function; the old
one stays valid while other threads call it.
"""

from __future__ import annotations

import types
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Self, cast, overload

import jax
import numpy as np

from fastpjit import _core
from fastpjit._explainable import Explainable, ProbedCall

if TYPE_CHECKING:
    from fastpjit.warm_start.log import SignatureLog

__all__ = ["Bindable", "Bound"]


class Bound(_core.BoundFunction):
    """A fastpjit function with leading arguments (and keywords) bound."""

    @property
    def __wrapped__(self) -> _core.JitFunction:
        return self._function

    @property
    def _signature_log(self) -> SignatureLog:
        # Every fastpjit function that `bind` makes a bound function of keeps one.
        log: SignatureLog = cast(Any, self._function)._signature_log
        return log

    @property
    def _dispatch_cache(self) -> _core.DispatchCache:
        return self._explained()._dispatch_cache

    def _explained(self) -> Explainable:
        """The function bound (a fastpjit function, whose `bind` made this) as `explain` reads
        it."""
        return cast(Explainable, self._function)

    def _explain_call(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> ProbedCall:
        """The call of the function bound, with the bound arguments first; a hit of positional
        arguments that takes the bound path says so."""
        merged = self._merged_kwargs(kwargs, "explain")
        call = self._explained()._explain_call((*self._args, *args), merged)
        if call.probe["outcome"] == "hit" and self._on_bound_path and not merged:
            call.probe["path"] = "bound"
        return call._replace(kind=f"bound {call.kind}")

    def with_compiler_options(
        self, compiler_options: dict[str, Any], /, *args: Any, **kwargs: Any
    ) -> Self:
        """Compiles the calls of the signature of the bound arguments, then `args` and
        `kwargs`, with `compiler_options`, as the function bound's `with_compiler_options`
        does; returns this bound function."""
        register = getattr(self._function, "with_compiler_options", None)
        if register is None:
            raise TypeError(
                f"with_compiler_options: {self._function!r} takes no compile options per "
                "signature (fastpjit.jit and pjit functions do)"
            )
        merged = self._merged_kwargs(kwargs, "with_compiler_options")
        register(compiler_options, *self._args, *args, **merged)
        return self

    def _compiler_options(
        self, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> dict[str, Any] | None:
        merged = self._merged_kwargs(kwargs, "explain")
        return self._explained()._compiler_options((*self._args, *args), merged)

    def _merged_kwargs(self, kwargs: dict[str, Any], caller: str) -> dict[str, Any]:
        """The bound keyword arguments and `kwargs`, which may not bind one again."""
        merged = dict(self._kwargs)
        for key, value in kwargs.items():
            if key in merged:
                raise TypeError(f"{caller}: keyword argument {key!r} is bound already")
            merged[key] = value
        return merged

    def lower(self, *args: Any, **kwargs: Any) -> Any:
        """Lowers the function for the bound arguments and these."""
        function: Any = self._function
        return function.lower(*self._args, *args, **self._kwargs, **kwargs)

    @overload
    def __get__(self, instance: None, owner: type | None = None) -> Self: ...
    @overload
    def __get__(self, instance: object, owner: type | None = None) -> types.MethodType: ...
    def __get__(self, instance: object, owner: type | None = None) -> Self | types.MethodType:
        return self if instance is None else types.MethodType(self, instance)

    def __reduce__(self) -> tuple[Callable[..., Bound], tuple[Any, ...]]:
        return _rebind, (self._function, self._args, self._kwargs)

    def __copy__(self) -> Bound:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> Bound:
        return self

    def __repr__(self) -> str:
        names = [*(f"arg{i}" for i in range(len(self._args))), *self._kwargs]
        return f"<fastpjit bound {self._function!r} with {', '.join(names)} bound>"


def _rebind(function: Bindable, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Bound:
    return function.bind(*args, **kwargs)


class Bindable:
    """What fastpjit's functions share: `bind`, and what `explain` reads of them. A subclass
    says which arguments its function donates (`_donated_arguments`) and where host values go
    (`_bound_placement`)."""

    # What the function is, in `fastpjit.stats()` and `explain`: "jit", "pjit", "pmap",
    # "compiled" or "compile_hlo". Each subclass also keeps the signatures of the calls that its
    # cache served, `_signature_log`.
    _kind: ClassVar[str]

    def bind(self, *args: Any, **kwargs: Any) -> Bound:
        """This function with `args` (its first arguments) and `kwargs` bound: calling the
        result with `rest` calls this one with `*args, *rest`."""
        donated_positions, donated_names = self._donated_arguments()
        for i in range(len(args)):
            if i in donated_positions:
                raise ValueError(
                    f"bind: argument {i} of {self!r} is donated, and a bound argument stays "
                    "resident: it cannot be consumed. Bind only arguments that are not donated, "
                    "or pass it on every call."
                )
        for name in kwargs:
            if name in donated_names:
                raise ValueError(
                    f"bind: keyword argument {name!r} of {self!r} is donated, and a bound "
                    "argument stays resident: it cannot be consumed."
                )
        function: Any = self  # a JitFunction, which this class is mixed into
        placement = self._bound_placement()
        if placement is None:
            # Placed after the first call, on the input shardings that its executable takes.
            settle = _settle if any(map(_placeable, jax.tree.leaves(args))) else None
            return Bound(function, args, kwargs, _arrays(args, kwargs), settle)
        if len(args) > len(placement):
            raise TypeError(
                f"bind: {self!r} takes {len(placement)} positional arguments, and "
                f"{len(args)} were bound"
            )
        _check_avals(self, args, kwargs)
        args = tuple(_placed(arg, where) for arg, where in zip(args, placement, strict=False))
        return Bound(function, args, kwargs, _arrays(args, kwargs))

    def _explain_call(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> ProbedCall:
        """How `self(*args, **kwargs)` would be served, without running it."""
        function: Any = self  # a JitFunction with a `_signature_log`: an `Explainable`
        return ProbedCall(function, self._kind, args, kwargs, function._probe(*args, **kwargs))

    def _compiler_options(
        self, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> dict[str, Any] | None:
        """The compile options that a call of these arguments compiles with, where the
        function says (a jit function's own, and its signature's over them)."""
        return None

    def _donated_arguments(self) -> tuple[set[int], set[str]]:
        return set(), set()

    def _static_arguments(self) -> tuple[set[int], set[str]]:
        return set(), set()

    def _bound_placement(self) -> Sequence[Any] | None:
        """For each position, the sharding (tree) that its numpy arrays go on, where the
        function takes a fixed number of arguments; None where only a call tells (they are
        placed after the first call)."""
        return None

    def _fixed_avals(self) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """Where `_bound_placement` is not None: the abstract value (tree) that each position
        and keyword takes."""
        raise NotImplementedError


def _where(path: tuple[Any, ...]) -> str:
    """A bound leaf's path as the call spells it: `args[0]['w']`, `kwargs['cache'][1]`."""
    (kind, *rest) = path
    return ("args" if kind.idx == 0 else "kwargs") + jax.tree_util.keystr(tuple(rest))


def _check_avals(function: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """Raises JAX's TypeError, naming the argument, for a bound argument that a function of
    fixed parameters (compiled, compile_hlo) was not compiled for, as its call would."""
    positions, keywords = function._fixed_avals()
    for name in kwargs:
        if name not in keywords:
            raise TypeError(f"bind: {function!r} takes no keyword argument {name!r}")
    expected = (tuple(positions[: len(args)]), {name: keywords[name] for name in kwargs})
    pairs = [
        *(
            (f"args[{i}]", avals, arg)
            for i, (avals, arg) in enumerate(zip(expected[0], args, strict=True))
        ),
        *((f"kwargs[{name!r}]", keywords[name], value) for name, value in kwargs.items()),
    ]
    for where, avals, value in pairs:
        structure: Any = jax.tree.structure(avals)
        if structure != jax.tree.structure(value):
            raise TypeError(
                f"bind: {where} of {function!r} was compiled for the structure {structure}, "
                f"and one of {jax.tree.structure(value)} was bound"
            )
    leaves = jax.tree_util.tree_flatten_with_path((args, kwargs))[0]
    for aval, (path, leaf) in zip(jax.tree.leaves(expected), leaves, strict=True):
        got = _shape_and_dtype(leaf)
        if got != (aval.shape, aval.dtype):
            shown = (
                f"{got[1].name}[{','.join(map(str, got[0]))}]"
                if got
                else f"a {type(leaf).__qualname__}"
            )
            raise TypeError(
                f"bind: {_where(path)} of {function!r} was compiled for "
                f"{aval.str_short()}, and {shown} was bound"
            )


def _shape_and_dtype(leaf: Any) -> tuple[tuple[int, ...], np.dtype] | None:
    """The shape and dtype that `leaf` takes in a call, or None where it is no array."""
    try:
        dtype = leaf.dtype if hasattr(leaf, "dtype") else np.result_type(leaf)
        return np.shape(leaf), jax.dtypes.canonicalize_dtype(dtype)
    except (TypeError, ValueError):
        return None


def _x64_independent(dtype: np.dtype) -> bool:
    """Whether x64 leaves arrays of `dtype` as they are (not 64-bit ints and floats, nor
    complex128): those are placed at bind time as any call would place them."""
    wide = 16 if dtype.kind == "c" else 8
    return not (dtype.kind in "iufc" and dtype.itemsize == wide)


def _placeable(leaf: Any) -> bool:
    return type(leaf) is np.ndarray and _x64_independent(leaf.dtype)


def _placed(value: Any, sharding: Any) -> Any:
    """`value` with its numpy arrays put on `sharding` (a tree of them), copied: later changes
    to the host array do not reach the bound one."""

    def place(leaf: Any, where: Any) -> Any:
        return jax.device_put(leaf, where, may_alias=False) if _placeable(leaf) else leaf

    return jax.tree.map(place, value, sharding)


def _arrays(args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[tuple[str, Any]]:
    return [
        (_where(path), leaf)
        for path, leaf in jax.tree_util.tree_flatten_with_path((args, kwargs))[0]
        if isinstance(leaf, jax.Array)
    ]


def _settle(bound: Bound) -> None:
    """Places the numpy arrays among the bound positional arguments on the input shardings
    that the first call's executable took for them: the bound arguments' leaves are the
    first of the call's, unless a static argument comes before them."""
    function: Any = bound._function
    args, kwargs = bound._args, bound._kwargs
    static_positions, _ = function._static_arguments()
    if any(i < len(args) for i in static_positions):
        return
    leaves, tree = jax.tree.flatten(args)
    targets = dict(function._latest_host_targets())
    # As the call placed them: uncommitted, as host values are, except on several devices,
    # where only committed arrays exist (and the call's other arrays are committed).
    placed = [
        _core.device_put_leaf(np.array(leaf), targets[j], committed=targets[j].num_devices > 1)
        if j in targets and _placeable(leaf)
        else leaf
        for j, leaf in enumerate(leaves)
    ]
    args = jax.tree.unflatten(tree, placed)
    bound._settle_with(args, kwargs, _arrays(args, kwargs))
