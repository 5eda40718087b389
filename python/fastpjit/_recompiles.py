"""`no_recompiles`: inside it, on this thread, a call of a fastpjit function that would trace
and compile raises `RecompileError` instead, saying what differs from the signatures cached.
The misses of jit, pjit and pmap functions ask `check_recompile` first."""

from __future__ import annotations

import contextlib
from typing import Any

from fastpjit import _core
from fastpjit._explanation import explanation
from fastpjit.errors import RecompileError

__all__ = ["check_recompile", "miss_report", "no_recompiles", "recompiles_allowed"]


def recompiles_allowed() -> bool:
    """False inside `no_recompiles` on this thread."""
    return _core.recompile_guard(0) == 0


class no_recompiles(contextlib.ContextDecorator):  # noqa: N801 - used like a function
    """Inside it, on this thread, a call of a fastpjit function that would trace and compile
    (a miss of a jit, pjit or pmap function) raises `fastpjit.RecompileError`, whose message
    says what differs from the signatures cached. As a decorator, it guards each call of the
    function it decorates. Like `jax.transfer_guard`, it is per thread. Calls that fastpjit
    would hand to JAX's own dispatch for speed (a stream of new numpy arrays) stay on fastpjit's
    path inside it, so that their misses raise too; those that JAX must run raise if JAX
    compiles for them."""

    def __enter__(self) -> no_recompiles:
        _core.recompile_guard(1)
        return self

    def __exit__(self, *exc: object) -> None:
        _core.recompile_guard(-1)


def check_recompile(
    name: str, dispatch: _core.DispatchCache, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> None:
    """Raises RecompileError for a miss of `name`, whose cache is `dispatch`, inside
    `no_recompiles`."""
    if recompiles_allowed():
        return
    _core.count_recompile_stopped()
    raise RecompileError(miss_report(name, dispatch, args, kwargs))


def miss_report(
    name: str, dispatch: _core.DispatchCache, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> str:
    """A miss in words: `explain`'s report of it."""
    return str(explanation(name, "", dispatch, args, kwargs, {"outcome": "miss"}))
