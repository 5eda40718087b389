"""fastpjit.pmap: jax.pmap with every cached call dispatched in Rust.

jax.pmap resolves its parameters in Python on every call before it reaches jit's fast path;
here the Rust dispatcher keys the call itself (static broadcasted arguments, argument tree,
shapes, dtypes, shardings) and runs the executable of JAX's jit over shard_map directly.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import jax

from fastpjit import _core
from fastpjit._jax import api as _jax
from fastpjit._jax.jit_miss import pmap_cache_miss
from fastpjit._recompiles import check_recompile
from fastpjit._shared import FunctionCaches, SharedCaches, dispatch_cache
from fastpjit.jit import Wrapped
from fastpjit.warm_start import SignatureLog

__all__ = ["pmap"]

# The dispatch caches of pmap functions, one per function and options.
_shared_caches = SharedCaches()


class PmapWrapped(Wrapped):
    """The function that fastpjit.pmap returns."""

    _kind = "pmap"
    _pmapped: Any
    _signature_log: SignatureLog
    # JAX's pmap returns a plain Python function: pickle finds it by name in `__main__` too,
    # and it copies as itself.
    _main_by_value = False

    @_jax.api_boundary
    def lower(self, *args: Any, **kwargs: Any) -> jax.stages.Lowered:
        """Lowers for these arguments, as `jax.pmap(fun).lower` does."""
        lowered: jax.stages.Lowered = self._pmapped.lower(*args, **kwargs)
        return lowered

    def clear_cache(self) -> None:
        """Forgets the executables compiled for this function."""
        self._clear_cache()

    def _donated_arguments(self) -> tuple[set[int], set[str]]:
        return set(self._make.keywords["donate_argnums"]), set()

    def _static_arguments(self) -> tuple[set[int], set[str]]:
        return set(self._make.keywords["static_broadcasted_argnums"]), set()

    def cache_size(self) -> int:
        """How many executables this function has cached."""
        return self._cache_size()

    def __copy__(self) -> PmapWrapped:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> PmapWrapped:
        return self

    def __repr__(self) -> str:
        return f"<fastpjit.pmap of {self.__wrapped__!r}>"


@_jax.api_boundary
def pmap(
    fun: Callable[..., Any],
    axis_name: Any = None,
    *,
    in_axes: Any = 0,
    out_axes: Any = 0,
    static_broadcasted_argnums: int | Iterable[int] = (),
    devices: Sequence[Any] | None = None,
    backend: str | None = None,
    axis_size: int | None = None,
    donate_argnums: int | Iterable[int] = (),
) -> PmapWrapped:
    """Drop-in for `jax.pmap`: the same arguments, results and errors; faster calls."""
    static_broadcasted_argnums = _index_tuple(static_broadcasted_argnums)
    donate_argnums = _index_tuple(donate_argnums)
    options: dict[str, Any] = dict(
        axis_name=axis_name,
        in_axes=in_axes,
        out_axes=out_axes,
        static_broadcasted_argnums=static_broadcasted_argnums,
        devices=devices,
        backend=backend,
        axis_size=axis_size,
        donate_argnums=donate_argnums,
    )
    pmapped = _jax.jax_pmap(fun, **options)

    # Like jax.pmap, only non-negative positions name static arguments.
    statics = [i for i in static_broadcasted_argnums if i >= 0]

    def new_caches() -> FunctionCaches:
        cache = dispatch_cache(fun, statics, [])
        return FunctionCaches(cache, SignatureLog(cache, (statics, ())))

    caches = _shared_caches.get(fun, options, new_caches)

    def guarded_miss(args: tuple[Any, ...], kwargs: dict[str, Any]) -> _core.CacheMiss:
        check_recompile(_jax.function_name(fun), caches.dispatch, args, kwargs)
        return pmap_cache_miss(pmapped, args, kwargs)

    miss = caches.signatures.noting(guarded_miss)
    wrapped = PmapWrapped(pmapped, _jax.api_boundary(miss), caches.dispatch)
    wrapped._signature_log = caches.signatures
    wrapped._pmapped = pmapped
    wrapped._make = functools.partial(pmap, **options)
    functools.update_wrapper(wrapped, fun)
    # JAX's NaN and inf checks (its post-hook) rerun `_fun` to find the culprit: jax.pmap's.
    wrapped._fun = pmapped
    _jax.clear_with_jax_caches(wrapped)
    return wrapped


def _index_tuple(argnums: int | Iterable[int]) -> tuple[int, ...]:
    """Argument numbers as jax.pmap reads them (with its errors), read once: an iterator too
    reaches JAX, the dispatcher and pickle alike."""
    try:
        return (operator.index(argnums),)  # type: ignore[arg-type]
    except TypeError:
        return tuple(map(operator.index, argnums))  # type: ignore[arg-type]
