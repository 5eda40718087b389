"""fastpjit.jit and fastpjit.pjit: jax.jit with the dispatch of every cached call in Rust.

A call goes straight into `fastpjit._core.JitFunction`, which keys it, finds the executable
and runs it. On a miss, JAX traces and lowers exactly as jax.jit does, and fastpjit compiles
(`_jax._compile_lowering`); calls that JAX must run or compile itself (tracers, effects) go to
jax.jit and are counted in fastpjit.stats().
Ahead-of-time compiled functions (`f.lower(...).compile()`) dispatch the same way.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import jax

from fastpjit import _core, _jax

__all__ = ["Compiled", "JitWrapped", "Lowered", "jit", "pjit"]

_UNSPECIFIED: Any = object()


class JitWrapped(_core.JitFunction):
    """The function that fastpjit.jit returns: call it, lower it, or inspect it like jax.jit's."""

    _jitted: Any

    @property
    def _active(self) -> Any:
        """The jax.jit function that traces this one's calls."""
        return self._jitted

    def lower(self, *args: Any, **kwargs: Any) -> Lowered:
        """Lowers for these arguments, as `jax.jit(fun).lower` does."""
        return Lowered(self._active.lower(*args, **kwargs))

    def trace(self, *args: Any, **kwargs: Any) -> Any:
        """Traces for these arguments, as `jax.jit(fun).trace` does."""
        return self._active.trace(*args, **kwargs)

    def eval_shape(self, *args: Any, **kwargs: Any) -> Any:
        """Output shapes and dtypes, as `jax.jit(fun).eval_shape` gives them."""
        return self._active.eval_shape(*args, **kwargs)

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


class Lowered:
    """`jax.stages.Lowered`, whose `compile()` gives a function that fastpjit dispatches."""

    def __init__(self, lowered: Any):
        self._lowered = lowered

    def compile(self, *args: Any, **kwargs: Any) -> Compiled:
        """Compiles as JAX's `Lowered.compile` does; with no compiler options or device
        assignment given, fastpjit compiles, as for a call."""
        if not args and not kwargs:
            _jax.compile_lowered(self._lowered)
        return Compiled.of(self._lowered.compile(*args, **kwargs))

    def __getattr__(self, name: str) -> Any:
        # as_text, compiler_ir, cost_analysis, in_tree, args_info, ... are JAX's.
        return getattr(self._lowered, name)


class Compiled(_core.JitFunction):
    """`jax.stages.Compiled` with its calls dispatched by fastpjit."""

    _compiled: Any

    @classmethod
    def of(cls, compiled: Any) -> Compiled:
        wrapped = cls(compiled, functools.partial(_jax.aot_cache_miss, compiled), [], [],
                      kind="compiled")
        wrapped._compiled = compiled
        return wrapped

    def __getattr__(self, name: str) -> Any:
        # as_text, cost_analysis, input_shardings, output_shardings, ... are JAX's.
        return getattr(self._compiled, name)


def _wrap(fun: Callable[..., Any], jitted: Any) -> JitWrapped:
    argnums, argnames = _jax.jit_static_args(jitted)
    wrapped = JitWrapped(jitted, functools.partial(_jax.jit_cache_miss, jitted),
                         list(argnums), list(argnames))
    wrapped._jitted = jitted
    _set_function(wrapped, fun)
    return wrapped


def _set_function(wrapped: Any, fun: Callable[..., Any]) -> None:
    functools.update_wrapper(wrapped, fun)
    # JAX's NaN and inf checks (its post-hook) rerun `_fun` without jit to find the culprit.
    wrapped._fun = fun


class _PjitWrapped(JitWrapped):
    """pjit: the old `with mesh:` resolves PartitionSpecs where it is active, and
    `jax.set_mesh` everywhere else. JAX's trace context keys the two apart."""

    _legacy: Any

    @property
    def _active(self) -> Any:
        return self._legacy if _jax.in_legacy_mesh_context() else self._jitted

    def clear_cache(self) -> None:
        super().clear_cache()
        self._legacy.clear_cache()


def _wrap_pjit(fun: Callable[..., Any], options: dict[str, Any]) -> JitWrapped:
    jitted, legacy = jax.jit(fun, **options), _jax.legacy_pjit(fun, **options)

    def fallback(*args: Any, **kwargs: Any) -> Any:
        return wrapped._active(*args, **kwargs)

    def miss(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        return _jax.jit_cache_miss(wrapped._active, args, kwargs)

    argnums, argnames = _jax.jit_static_args(jitted)
    wrapped = _PjitWrapped(fallback, miss, list(argnums), list(argnames), kind="pjit")
    wrapped._jitted, wrapped._legacy = jitted, legacy
    _set_function(wrapped, fun)
    return wrapped


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
    options = _options(
        in_shardings, out_shardings, static_argnums=static_argnums,
        static_argnames=static_argnames, donate_argnums=donate_argnums,
        donate_argnames=donate_argnames, keep_unused=keep_unused, device=device,
        backend=backend, inline=inline, compiler_options=compiler_options)
    if fun is None:
        return functools.partial(jit, **options)
    return _wrap(fun, jax.jit(fun, **options))


def pjit(
    fun: Callable[..., Any],
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
    *,
    in_axis_resources: Any = _UNSPECIFIED,
    out_axis_resources: Any = _UNSPECIFIED,
) -> JitWrapped:
    """The pjit API, old programs included.

    Like `jax.jit`, but bare PartitionSpecs in the shardings resolve against the mesh in
    context, whether set by `jax.set_mesh(mesh)` or by the old `with mesh:`; and the
    `in_axis_resources` / `out_axis_resources` keywords of 2022-era pjit are accepted as
    other names for `in_shardings` / `out_shardings`.
    """
    in_shardings = _renamed("in_shardings", in_shardings, "in_axis_resources", in_axis_resources)
    out_shardings = _renamed("out_shardings", out_shardings, "out_axis_resources",
                             out_axis_resources)
    options = _options(
        in_shardings, out_shardings, static_argnums=static_argnums,
        static_argnames=static_argnames, donate_argnums=donate_argnums,
        donate_argnames=donate_argnames, keep_unused=keep_unused, device=device,
        backend=backend, inline=inline, compiler_options=compiler_options)
    return _wrap_pjit(fun, options)


def _options(in_shardings: Any, out_shardings: Any, **options: Any) -> dict[str, Any]:
    """jax.jit's keyword arguments, leaving out the shardings not given."""
    for name, value in (("in_shardings", in_shardings), ("out_shardings", out_shardings)):
        if value is not _UNSPECIFIED:
            options[name] = value
    return options


def _renamed(name: str, value: Any, old_name: str, old_value: Any) -> Any:
    if old_value is _UNSPECIFIED:
        return value
    if value is not _UNSPECIFIED:
        raise ValueError(f"pjit got both {name} and its old name {old_name}; pass only one")
    return old_value
