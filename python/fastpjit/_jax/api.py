"""What fastpjit's public modules (jit, pmap, transfer) take from JAX's internals: JAX's own jit
and pmap, traceback filtering, jax.clear_caches() and the trace state."""

from __future__ import annotations

import os
import threading
import weakref
from typing import Any

from jax._src import api as _api
from jax._src import config as _config
from jax._src import core as _core
from jax._src import mesh as _mesh
from jax._src import pjit as _pjit
from jax._src import pmap as _pmap_lib
from jax._src import source_info_util as _source_info_util
from jax._src import traceback_util as _traceback_util
from jax._src import util as _util
from jax._src.array import ArrayImpl
from jax._src.lax import lax as _lax

from fastpjit import _core as _native
from fastpjit._jax.xla_compile import clear_xla_executables

__all__ = ["ArrayImpl"]


# --- The wrapped functions as JAX's: traceback filtering and jax.clear_caches() -------------
# An error raised in the user's function unwinds through fastpjit's Python frames and JAX's;
# as JAX does for its own, every fastpjit file is left out of the traceback below an api
# boundary (a miss, lower, ...), so that the user sees the own code that raised.

api_boundary = _traceback_util.api_boundary
# The fastpjit package, this boundary's parent folder.
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_traceback_util.register_exclusion(_PACKAGE_DIR)
_source_info_util.register_exclusion(_PACKAGE_DIR)


class _FunctionCaches:
    """Every live fastpjit function's executables, XLA's executables by module and the
    dispatcher's memo of avals and shardings, as one cache in JAX's registry, which
    jax.clear_caches() clears. The functions are held weakly: registering one keeps nothing
    alive."""

    def __init__(self) -> None:
        self._functions: weakref.WeakSet[Any] = weakref.WeakSet()
        self._lock = threading.Lock()

    def add(self, function: Any) -> None:
        with self._lock:
            self._functions.add(function)

    def cache_clear(self) -> None:
        with self._lock:
            functions = list(self._functions)
        for function in functions:
            function._clear_cache()
        clear_xla_executables()
        _native.clear_dispatch_memo()


_function_caches = _FunctionCaches()
_util.register_cache(_function_caches, "fastpjit's jit and pmap functions")


def clear_with_jax_caches(function: Any) -> None:
    """Has jax.clear_caches() clear this fastpjit function's executables too."""
    _function_caches.add(function)


# JAX's own jit and pmap, which users may replace with fastpjit's (`fastpjit.install()`):
# fastpjit calls these, never the public names.
jax_jit = _api.jit
jax_pmap = _pmap_lib.pmap


def function_name(fun: Any) -> str:
    """How fastpjit.stats() names a function: its qualified name, as JAX's logs name it."""
    return _util.fun_qual_name(fun)


def legacy_pjit(fun: Any, **options: Any) -> Any:
    """The deprecated jax.experimental.pjit.pjit, which still honours `with mesh:`."""
    return _pjit.pjit(fun, **options)


def in_legacy_mesh_context() -> bool:
    """Whether an old-style `with mesh:` block is active on this thread."""
    return not _mesh.thread_resources.env.physical_mesh.empty


def jit_static_args(jitted: Any) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """The static argnums and argnames of a jax.jit function, as JAX resolved them."""
    info = jitted._jit_info
    return tuple(info.static_argnums), tuple(info.static_argnames)


def jit_donated_args(jitted: Any) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """The donated argnums and argnames of a jax.jit function, as JAX resolved them."""
    info = jitted._jit_info
    return tuple(info.donate_argnums), tuple(info.donate_argnames)


def weak_typed(value: Any) -> Any:
    """`value` as a weak-typed array of its dtype, as JAX makes one from a Python scalar."""
    return _lax._convert_element_type(value, value.dtype, weak_type=True)


def tracing() -> bool:
    """Whether a JAX transformation is tracing on this thread."""
    return not _core.trace_state_clean()


# The scope in which jax.device_put marks its transfers explicit, which the "_explicit" guard
# levels watch and the others let through.
explicit_device_put_scope = _config.explicit_device_put_scope
