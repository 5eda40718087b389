"""One dispatch cache per function and options, as JAX keys its jit caches: a new wrapper of a
function wrapped before with the same options (`jit(f)(x)` in a loop) finds the executables
that the earlier wrappers compiled."""

from __future__ import annotations

import contextlib
import functools
import inspect
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable
from typing import Any, NamedTuple

from fastpjit import _core
from fastpjit._compile_options import SignatureOptions
from fastpjit._jax import api as _jax
from fastpjit.warm_start import SignatureLog

__all__ = ["FunctionCaches", "SharedCaches", "dispatch_cache", "stats_row"]


def stats_row(fun: Any) -> tuple[str, str]:
    """How `fastpjit.stats()` tells `fun` apart: by `module.qualname`, and by where its code
    starts (`file:line`, empty for a callable with no Python code), which keeps apart the
    functions of one name (two lambdas)."""
    inner = fun
    while isinstance(inner, functools.partial):
        inner = inner.func
    with contextlib.suppress(ValueError):  # a cycle of __wrapped__
        inner = inspect.unwrap(inner)
    qualname = getattr(inner, "__qualname__", None) or type(inner).__qualname__
    module = getattr(inner, "__module__", None)
    code = getattr(inner, "__code__", None) or getattr(type(inner).__call__, "__code__", None)
    place = f"{code.co_filename}:{code.co_firstlineno}" if code is not None else ""
    return (f"{module}.{qualname}" if isinstance(module, str) else str(qualname)), place


def dispatch_cache(
    fun: Any, static_argnums: Iterable[int], static_argnames: Iterable[str]
) -> _core.DispatchCache:
    """A new dispatch cache of `fun`'s, whose counts are `fun`'s row in `fastpjit.stats()`."""
    name, place = stats_row(fun)
    return _core.DispatchCache(name, list(static_argnums), list(static_argnames), place=place)


class FunctionCaches(NamedTuple):
    """What the functions of one function and options share: the dispatch cache, the
    signatures of the calls that it cached (for warm starts), and a jit function's compile
    options per signature."""

    dispatch: _core.DispatchCache
    signatures: SignatureLog
    options: SignatureOptions | None = None

    def _clear(self) -> None:
        self.dispatch._clear()
        self.signatures.clear()


class SharedCaches:
    """Dispatch caches by function and options. A function is held weakly, so its caches go
    with it; each function keeps those of its latest `OPTION_SETS` option sets, and
    `jax.clear_caches()` empties them all. A function that cannot be held weakly or hashed,
    or options that cannot be hashed or compared, get a cache of their own."""

    OPTION_SETS = 16

    def __init__(self) -> None:
        self._caches: weakref.WeakKeyDictionary[Any, OrderedDict[Hashable, Any]] = (
            weakref.WeakKeyDictionary()
        )
        self._lock = threading.Lock()
        _jax.clear_with_jax_caches(self)

    def get(self, fun: Any, options: Any, make: Callable[[], FunctionCaches]) -> FunctionCaches:
        """The caches of `fun` with `options`, made by `make` if there are none."""
        key = _frozen(options)
        try:
            hash(key)
            with self._lock:
                caches = self._caches.get(fun)
                found = None if caches is None else caches.get(key)
                if found is not None:
                    caches.move_to_end(key)  # type: ignore[union-attr]
                    return found  # type: ignore[no-any-return]
        except Exception:  # an unhashable option, or one whose == raises (an array)
            return make()
        cache = make()
        with self._lock:
            caches = self._caches.setdefault(fun, OrderedDict())
            caches[key] = cache
            while len(caches) > self.OPTION_SETS:
                caches.popitem(last=False)
        return cache

    def _clear_cache(self) -> None:
        with self._lock:
            caches = [c for per_function in self._caches.values() for c in per_function.values()]
            self._caches.clear()
        for cache in caches:
            cache._clear()


def _frozen(value: Any) -> Any:
    """`value` with its lists, tuples, dicts and sets as hashable tuples, kept apart by type."""
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, *map(_frozen, value))
    if isinstance(value, dict):
        return ("dict", *((k, _frozen(v)) for k, v in value.items()))
    if isinstance(value, (set, frozenset)):
        return ("set", frozenset(value))
    return value
