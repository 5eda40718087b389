"""fastpjit.jit and fastpjit.pjit: jax.jit with the dispatch of every cached call in Rust.

A call goes straight into `fastpjit._core.JitFunction`, which keys it, finds the executable
and runs it. On a miss (`fastpjit._jax.jit_miss`), JAX traces and lowers exactly as jax.jit
does, and fastpjit compiles (`fastpjit._jax.xla_compile`); calls that JAX must run or compile
itself (tracers, effects) go to jax.jit and are counted in fastpjit.stats().
Ahead-of-time compiled functions (`f.lower(...).compile()`) dispatch the same way.
"""

from __future__ import annotations

import enum
import functools
import sys
import types
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Self, TypeVar, overload

import jax

from fastpjit import _core
from fastpjit._compile_options import SignatureOptions
from fastpjit._jax import api as _jax
from fastpjit._jax.jit_miss import aot_cache_miss, compile_lowered, jit_cache_miss
from fastpjit._recompiles import check_recompile
from fastpjit._shared import FunctionCaches, SharedCaches, dispatch_cache
from fastpjit.bind import Bindable
from fastpjit.warm_start import SignatureLog

__all__ = ["Compiled", "JitWrapped", "Lowered", "jit", "pjit"]

T = TypeVar("T")

_UNSPECIFIED: Any = object()
# The dispatch caches of jit and pjit functions, one per function and options.
_shared_caches = SharedCaches()


class _NotSpecified:
    """jit's `fun` when not given: jit(**options) is a decorator; jit(None) is an error."""

    def __repr__(self) -> str:
        return "<not-specified>"


_NOT_SPECIFIED: Any = _NotSpecified()


class Wrapped(Bindable, _core.JitFunction):
    """What the functions of fastpjit.jit, pjit and pmap share with JAX's: on an instance they
    are bound methods; pickle takes them by reference where their module holds them, as it
    takes a function, and otherwise as the function that they wrap and their options."""

    # jit, pjit or pmap with this function's options: `_make(__wrapped__)` makes it again.
    _make: functools.partial[Any]
    # The function wrapped (set by functools.update_wrapper), and the one that JAX's NaN and
    # inf checks rerun without jit.
    __wrapped__: Any
    _fun: Any
    # Whether a function of `__main__` pickles by value: JAX's jit does under cloudpickle (the
    # only pickler that can), JAX's pmap, a plain Python function, by reference.
    _main_by_value = True

    @overload
    def __get__(self, instance: None, owner: type | None = None) -> Self: ...
    @overload
    def __get__(self, instance: object, owner: type | None = None) -> types.MethodType: ...
    def __get__(self, instance: object, owner: type | None = None) -> Self | types.MethodType:
        # As a Python function, and JAX's: a bound method on an instance. Two accesses are
        # equal, so a method passed as a static argument finds its executable again.
        return self if instance is None else types.MethodType(self, instance)

    def __reduce__(self) -> str | tuple[Any, ...]:
        name = self._global_name()
        return name if name is not None else (self._make, (self.__wrapped__,))

    def _global_name(self) -> str | None:
        """The name by which pickle finds this very function in its module, as it finds a
        function; None where it is not found so (cloudpickle's modules to pickle by value
        excepted)."""
        module_name = getattr(self, "__module__", None)
        name = getattr(self, "__qualname__", None)
        module = sys.modules.get(module_name) if isinstance(module_name, str) else None
        if (
            module is None
            or not isinstance(name, str)
            or (module_name == "__main__" and self._main_by_value)
        ):
            return None
        found: Any = module
        for part in name.split("."):
            found = getattr(found, part, None)
        if found is not self:
            return None
        cloudpickle = sys.modules.get("cloudpickle")
        if cloudpickle is not None and module_name in cloudpickle.list_registry_pickle_by_value():
            return None
        return name


class JitWrapped(Wrapped):
    """The function that fastpjit.jit returns: call it, lower it, or inspect it like jax.jit's."""

    _kind = "jit"
    _jax_function: _JaxFunction

    @property
    def _jitted(self) -> Any:
        """The jax.jit function of the same function and options."""
        return self._jax_function.jitted()

    @property
    def _active(self) -> Any:
        """The jax.jit function that traces this one's calls."""
        return self._jax_function.active()

    @property
    def _signature_log(self) -> SignatureLog:
        return self._jax_function.signatures

    @_jax.api_boundary
    def lower(self, *args: Any, **kwargs: Any) -> Lowered:
        """Lowers for these arguments, as `jax.jit(fun).lower` does; its `compile()` takes
        the compile options registered for their signature (`with_compiler_options`)."""
        lowered = self._active.lower(*args, **kwargs)
        return Lowered(lowered, self.__wrapped__, self._jax_function.options.of(args, kwargs))

    @_jax.api_boundary
    def trace(self, *args: Any, **kwargs: Any) -> jax.stages.Traced:
        """Traces for these arguments, as `jax.jit(fun).trace` does."""
        traced: jax.stages.Traced = self._active.trace(*args, **kwargs)
        return traced

    @_jax.api_boundary
    def eval_shape(self, *args: Any, **kwargs: Any) -> Any:
        """Output shapes and dtypes, as `jax.jit(fun).eval_shape` gives them."""
        return self._active.eval_shape(*args, **kwargs)

    def clear_cache(self) -> None:
        """Forgets the executables compiled for this function."""
        self._clear_cache()
        self._jitted.clear_cache()

    def _donated_arguments(self) -> tuple[set[int], set[str]]:
        positions, names = _jax.jit_donated_args(self._jitted)
        return set(positions), set(names)

    def _static_arguments(self) -> tuple[set[int], set[str]]:
        positions, names = _jax.jit_static_args(self._jitted)
        return set(positions), set(names)

    def cache_size(self) -> int:
        """How many executables this function has cached."""
        return self._cache_size()

    def with_compiler_options(
        self, compiler_options: dict[str, Any], /, *args: Any, **kwargs: Any
    ) -> Self:
        """Compiles the calls of the signature of `args` and `kwargs` (arrays, scalars or
        `jax.ShapeDtypeStruct`s: a shape bucket) with `compiler_options` over the function's
        own; returns this function. A bucket is the arguments' tree, each leaf's shape and
        dtype, and the static arguments. Executables that its calls compiled before are
        forgotten. The functions of this function and options share the options, as they
        share their executables."""
        self._jax_function.options.register(compiler_options, args, kwargs)
        return self

    @property
    def _signature_options(self) -> SignatureOptions:
        return self._jax_function.options

    def _compiler_options(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        return self._jax_function.options.merged(args, kwargs)

    def _rewrapped(self) -> JitWrapped:
        """A new function over the same jax.jit function and dispatch cache."""
        return _function(
            type(self), self.__wrapped__, self._jax_function, self._dispatch_cache, self._make
        )

    def __copy__(self) -> JitWrapped:
        # As JAX's copy, it shares JAX's caches: it finds the executables compiled already.
        copied = self._rewrapped()
        copied.__dict__.update(self.__dict__)
        return copied

    def __deepcopy__(self, memo: dict[int, Any]) -> JitWrapped:
        # A function is not deep-copied (JAX's deep copy still calls the function it wraps).
        return self.__copy__()

    def __repr__(self) -> str:
        return f"<fastpjit.jit of {self.__wrapped__!r}>"


class Lowered:
    """`jax.stages.Lowered`, whose `compile()` gives a function that fastpjit dispatches.
    `options` are those registered for its signature, if any."""

    def __init__(self, lowered: Any, fun: Any, options: dict[str, Any] | None = None):
        self._lowered, self._fun, self._options = lowered, fun, options

    @_jax.api_boundary
    def compile(self, *args: Any, **kwargs: Any) -> Compiled:
        """Compiles as JAX's `Lowered.compile` does. With nothing given, a signature with
        compile options of its own compiles with them (over the function's), as its calls
        do; else fastpjit compiles, as for a call."""
        if not args and not kwargs:
            if self._options:
                kwargs = {"compiler_options": self._options}
            else:
                compile_lowered(self._lowered)
        return Compiled.of(self._lowered.compile(*args, **kwargs), self._fun)

    def __getattr__(self, name: str) -> Any:
        # as_text, compiler_ir, cost_analysis, in_tree, args_info, ... are JAX's. (copy.copy
        # asks a new, empty instance for its attributes.)
        if name == "_lowered":
            raise AttributeError(name)
        return getattr(self._lowered, name)


class Compiled(Bindable, _core.JitFunction):
    """`jax.stages.Compiled` with its calls dispatched by fastpjit."""

    _kind = "compiled"
    _compiled: Any
    _fun: Any
    _signature_log: SignatureLog

    def _donated_arguments(self) -> tuple[set[int], set[str]]:
        args_info, kwargs_info = self._compiled.args_info
        positions = {
            i
            for i, info in enumerate(args_info)
            if any(leaf.donated for leaf in jax.tree.leaves(info))
        }
        names = {
            name
            for name, info in kwargs_info.items()
            if any(leaf.donated for leaf in jax.tree.leaves(info))
        }
        return positions, names

    def _bound_placement(self) -> tuple[Any, ...]:
        shardings: tuple[Any, ...] = self._compiled.input_shardings[0]
        return shardings

    def _fixed_avals(self) -> tuple[tuple[Any, ...], dict[str, Any]]:
        positions, keywords = self._compiled.in_avals
        return positions, keywords

    @classmethod
    def of(cls, compiled: Any, fun: Any = None) -> Compiled:
        """`compiled` (JAX's) of the function `fun` (or of no function known), as fastpjit
        calls it."""
        cache = dispatch_cache(compiled if fun is None else fun, [], [])
        log = SignatureLog(cache)
        miss = _jax.api_boundary(log.noting(functools.partial(aot_cache_miss, compiled)))
        wrapped = cls(compiled, miss, cache)
        wrapped._compiled, wrapped._fun = compiled, fun
        wrapped._signature_log = log
        return wrapped

    def __copy__(self) -> Compiled:
        # As JAX's Compiled: a copy runs the same executable. (Like JAX's, it does not pickle.)
        return Compiled.of(self._compiled, self._fun)

    def __getattr__(self, name: str) -> Any:
        # as_text, cost_analysis, input_shardings, output_shardings, ... are JAX's.
        if name == "_compiled":
            raise AttributeError(name)
        return getattr(self._compiled, name)


class _PjitWrapped(JitWrapped):
    """pjit: the old `with mesh:` resolves PartitionSpecs where it is active, and
    `jax.set_mesh` everywhere else. JAX's trace context keys the two apart."""

    _kind = "pjit"

    def clear_cache(self) -> None:
        super().clear_cache()
        self._jax_function.legacy().clear_cache()


class _JaxFunction:
    """jax.jit (or the old pjit) of a function with its options, made on first use: a new
    wrapper of a function wrapped before finds its executables in the shared dispatch cache,
    and makes no jax.jit function unless it misses, falls back or is lowered."""

    __slots__ = ("_legacy", "_made", "_make", "_make_legacy", "dispatch", "options", "signatures")

    def __init__(
        self,
        make: Callable[[], Any],
        caches: FunctionCaches,
        make_legacy: Callable[[], Any] | None = None,
        made: Any = None,
    ):
        self._make, self._make_legacy = make, make_legacy
        self._made, self._legacy = made, None
        # The dispatch cache, the signatures of the calls it cached and the compile options
        # per signature, shared by the functions of one dispatch cache.
        assert caches.options is not None
        self.dispatch, self.signatures = caches.dispatch, caches.signatures
        self.options: SignatureOptions = caches.options

    def _name(self) -> str:
        fun = self._make.args[0] if isinstance(self._make, functools.partial) else self._make
        return _jax.function_name(fun)

    def made(self) -> Any:
        """The jax.jit function if it was made, else None."""
        return self._made

    def jitted(self) -> Any:
        made = self._made
        if made is None:
            made = self._made = self._make()
        return made

    def legacy(self) -> Any:
        """The old pjit function, which honours `with mesh:` (pjit's only)."""
        legacy = self._legacy
        if legacy is None:
            assert self._make_legacy is not None
            legacy = self._legacy = self._make_legacy()
        return legacy

    def active(self) -> Any:
        """The function that traces a call now."""
        if self._make_legacy is not None and _jax.in_legacy_mesh_context():
            return self.legacy()
        return self.jitted()

    @_jax.api_boundary
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.active()(*args, **kwargs)

    @_jax.api_boundary
    def miss(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> _core.CacheMiss:
        check_recompile(self._name(), self.dispatch, args, kwargs)
        options = self.options.of(args, kwargs)
        outcome = jit_cache_miss(self.active(), args, kwargs, options)
        self.signatures.note(args, kwargs, options)
        return outcome


def _function(
    kind: type[JitWrapped],
    fun: Callable[..., Any],
    jax_function: _JaxFunction,
    cache: Any,
    make: functools.partial[Any],
) -> JitWrapped:
    # Calls that jax.jit's C++ dispatch serves faster go to it (not pjit's, whose function
    # depends on the mesh context).
    if kind is JitWrapped:
        wrapped = kind(
            jax_function, jax_function.miss, cache, jax_function.made(), jax_function.jitted
        )
    else:
        wrapped = kind(jax_function, jax_function.miss, cache)
    wrapped._jax_function = jax_function
    functools.update_wrapper(wrapped, fun)
    # JAX's NaN and inf checks (its post-hook) rerun `_fun` without jit to find the culprit.
    wrapped._fun = fun
    wrapped._make = make
    _jax.clear_with_jax_caches(wrapped)
    return wrapped


def _wrap(
    kind: type[JitWrapped],
    fun: Callable[..., Any],
    options: dict[str, Any],
    make: functools.partial[Any],
    make_legacy: Callable[[], Any] | None = None,
) -> JitWrapped:
    """A new function of `kind` over `fun` with jax.jit's `options`, sharing the dispatch cache
    of the earlier ones of the same function and options, as JAX's jit functions share theirs."""
    made = []

    def new_caches() -> FunctionCaches:
        jitted = _jax.jax_jit(fun, **options)  # checks the options, as jax.jit does
        made.append(jitted)
        argnums, argnames = _jax.jit_static_args(jitted)
        cache = dispatch_cache(fun, argnums, argnames)
        return FunctionCaches(
            cache,
            SignatureLog(cache, (argnums, argnames)),
            SignatureOptions(cache, (argnums, argnames), options.get("compiler_options")),
        )

    caches = _shared_caches.get(fun, (kind._kind, options), new_caches)
    jax_function = _JaxFunction(
        functools.partial(_jax.jax_jit, fun, **options),
        caches,
        make_legacy,
        made[0] if made else None,
    )
    return _function(kind, fun, jax_function, caches.dispatch, make)


@_jax.api_boundary
def jit(
    fun: Callable[..., Any] = _NOT_SPECIFIED,
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
    inline: bool | enum.Enum = False,  # or, from jax 0.11.2, a jax.Inline
    compiler_options: dict[str, Any] | None = None,
) -> Any:
    """Drop-in for `jax.jit`: the same arguments, results and errors; faster calls.

    Usable as `jit(f, ...)`, as a decorator (`@jit` or `@jit(**options)`), and with
    `functools.partial`.
    """
    options = _options(
        in_shardings,
        out_shardings,
        static_argnums=static_argnums,
        static_argnames=static_argnames,
        donate_argnums=donate_argnums,
        donate_argnames=donate_argnames,
        keep_unused=keep_unused,
        device=device,
        backend=backend,
        inline=inline,
        compiler_options=compiler_options,
    )
    make = functools.partial(jit, **options)
    if fun is _NOT_SPECIFIED:
        return make
    return _wrap(JitWrapped, fun, options, make)


@_jax.api_boundary
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
    inline: bool | enum.Enum = False,
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
    out_shardings = _renamed(
        "out_shardings", out_shardings, "out_axis_resources", out_axis_resources
    )
    options = _options(
        in_shardings,
        out_shardings,
        static_argnums=static_argnums,
        static_argnames=static_argnames,
        donate_argnums=donate_argnums,
        donate_argnames=donate_argnames,
        keep_unused=keep_unused,
        device=device,
        backend=backend,
        inline=inline,
        compiler_options=compiler_options,
    )
    return _wrap(
        _PjitWrapped,
        fun,
        options,
        functools.partial(pjit, **options),
        functools.partial(_jax.legacy_pjit, fun, **options),
    )


def _options(in_shardings: Any, out_shardings: Any, **options: Any) -> dict[str, Any]:
    """jax.jit's keyword arguments, leaving out the shardings not given."""
    for name, value in (("in_shardings", in_shardings), ("out_shardings", out_shardings)):
        if value is not _UNSPECIFIED:
            options[name] = value
    return options


def _renamed(name: str, value: T, old_name: str, old_value: T) -> T:
    if old_value is _UNSPECIFIED:
        return value
    if value is not _UNSPECIFIED:
        raise ValueError(f"pjit got both {name} and its old name {old_name}; pass only one")
    return old_value
