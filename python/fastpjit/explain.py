"""How a call would be served (`explain`): a hit and its path, a fallback and its reason, or a
miss and what differs from the nearest signature that the function cached; and
`no_recompiles`, which turns a miss into an error that says so.

`explain` reads every fastpjit function through one contract (`_explainable.Explainable`);
the report in words is `_explanation`'s, and `no_recompiles` is `_recompiles`'.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypeGuard

from fastpjit._explainable import Explainable
from fastpjit._explanation import Difference, Explanation, explanation
from fastpjit._jax import jit_options
from fastpjit._recompiles import no_recompiles, recompiles_allowed
from fastpjit.jit import jit

if TYPE_CHECKING:
    from fastpjit.bind import Bound
    from fastpjit.hlo import HloFunction
    from fastpjit.jit import Compiled, JitWrapped
    from fastpjit.pmap import PmapWrapped

    # Every fastpjit function meets the contract that `explain` reads: mypy checks it here.
    _EXPLAINABLE: tuple[type[Explainable], ...] = (
        JitWrapped,
        PmapWrapped,
        Compiled,
        HloFunction,
        Bound,
    )

__all__ = [
    "Difference",
    "Explanation",
    "explain",
    "no_recompiles",
    "recompiles_allowed",
]


def explain(f: Any, /, *args: Any, **kwargs: Any) -> Explanation:
    """How `f(*args, **kwargs)` would be served, without running it: a hit (and how it is
    found), a miss (and what differs from the nearest cached signature) or a fallback to JAX
    (and why); the call's signature leaf by leaf; for a hit, how each argument becomes an
    input, and the executable's input and output shardings. `f` is a fastpjit jit, pjit, pmap,
    AOT-compiled, compile_hlo or bound function; for a `jax.jit` function, it explains what
    `fastpjit.jit` of the same function and options would do. For a jit function, it gives
    the compile options of the call (the function's, and its signature's over them)."""
    note = None
    if jit_options.is_jax_jit(f):
        fun, options = jit_options.jit_function_and_options(f)
        f = jit(fun, **options)
        note = "(a jax.jit function: this is what fastpjit.jit of it with its options does)"
    if not _explainable(f):
        raise TypeError(
            f"explain expects a fastpjit function (jit, pjit, pmap, AOT-compiled, "
            f"compile_hlo or bound) or a jax.jit function, got "
            f"{type(f).__qualname__}: {f!r}"
        )
    call = f._explain_call(args, kwargs)
    target = call.function
    name = getattr(target, "__qualname__", None) or getattr(target, "__name__", repr(target))
    return explanation(
        str(name),
        call.kind,
        target._dispatch_cache,
        call.args,
        call.kwargs,
        call.probe,
        note,
        target._compiler_options(call.args, call.kwargs),
    )


def _explainable(f: object) -> TypeGuard[Explainable]:
    """Whether `f` is a fastpjit function, as its type says: the AOT-compiled one hands the
    attributes it lacks to JAX's object."""
    return callable(getattr(type(f), "_explain_call", None))
