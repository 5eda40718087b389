"""fastpjit.jit: jax.jit with the dispatch of every cached call done in Rust.

A call goes straight into `fastpjit._core.JitFunction`, which keys it, finds the executable
and runs it. On a miss, JAX traces, lowers and compiles exactly as jax.jit does; calls that
JAX must run itself (tracers, effects) go to jax.jit and are counted in fastpjit.stats().
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import jax

from fastpjit import _core, _jax

__all__ = ["jit"]

_UNSPECIFIED: Any = object()


class JitWrapped(_core.JitFunction):
    """The function that fastpjit.jit returns: call it, lower it, or inspect it like jax.jit's."""

    def lower(self, *args: Any, **kwargs: Any) -> Any:
        """Lowers for these arguments, as `jax.jit(fun).lower` does."""
        return self._jitted.lower(*args, **kwargs)

    def trace(self, *args: Any, **kwargs: Any) -> Any:
        """Traces for these arguments, as `jax.jit(fun).trace` does."""
        return self._jitted.trace(*args, **kwargs)

    def eval_shape(self, *args: Any, **kwargs: Any) -> Any:
        """Output shapes and dtypes, as `jax.jit(fun).eval_shape` gives them."""
        return self._jitted.eval_shape(*args, **kwargs)

    def clear_cache(self) -> None:
        """Forgets the executables compiled for this function."""
        self._clear_cache()
        self._jitted.clear_cache()

    def cache_size(self) -> int:
        """How many executables this function has cached."""
        return self._cache_size()

    def __get__(self, instance: Any, owner: type | None = None) -> Any:
        # Like a plain function, a jitted function becomes a bound method on an instance.
        return self if instance is None else functools.partial(self, instance)

    def __repr__(self) -> str:
        return f"<fastpjit.jit of {self.__wrapped__!r}>"


def jit(
    fun: Callable[..., Any] | None = None,
    /,
    *,
    in_shardings: Any = _UNSPECIFIED,
    out_shardings: Any = _UNSPECIFIED,
    static_argnums: int | Sequence[int] | None = None,
    static_argnames: str | Iterable[str] | None = None,
    donate_argnums: int | Sequence[int] | None = None,
    donate_argnames: str | Iterable[str] | None = None,
    keep_unused: bool = False,
    device: Any = None,
    backend: str | None = None,
    inline: bool = False,
    compiler_options: dict[str, Any] | None = None,
) -> Any:
    """Drop-in for `jax.jit`: the same arguments, results and errors; faster calls.

    Usable as `jit(f, ...)`, as a decorator, and with `functools.partial`.
    """
    options: dict[str, Any] = dict(
        static_argnums=static_argnums, static_argnames=static_argnames,
        donate_argnums=donate_argnums, donate_argnames=donate_argnames,
        keep_unused=keep_unused, device=device, backend=backend, inline=inline,
        compiler_options=compiler_options)
    if in_shardings is not _UNSPECIFIED:
        options["in_shardings"] = in_shardings
    if out_shardings is not _UNSPECIFIED:
        options["out_shardings"] = out_shardings
    if fun is None:
        return functools.partial(jit, **options)
    jitted = jax.jit(fun, **options)
    argnums, argnames = _jax.jit_static_args(jitted)
    wrapped = JitWrapped(jitted, list(argnums), list(argnames))
    functools.update_wrapper(wrapped, fun)
    return wrapped
