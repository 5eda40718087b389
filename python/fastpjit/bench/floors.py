"""Floors for dispatch benchmarks: the executable of a call, run raw.

A floor is what any dispatcher pays for a call: `LoadedExecutable.execute_sharded` of the
call's executable on its inputs already placed on their devices, then the result handlers and,
for a tree of outputs, the output tree. No keying, no flattening, no checks, no transfers.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

import jax

from fastpjit._jax import api as _jax
from fastpjit._jax.jit_miss import aot_cache_miss, jit_cache_miss, pmap_cache_miss
from fastpjit.bench.harness import Call


class NoFloor(AssertionError):
    """JAX runs the call another way than one executable on its inputs (effects, callbacks),
    so it has no floor to time."""


def fresh(fun: Any) -> Any:
    """A new function object with `fun`'s code (other callables as they are), so that no side
    shares another's caches: JAX keys its jit caches by the function."""
    if not isinstance(fun, types.FunctionType):
        return fun
    return types.FunctionType(
        fun.__code__, fun.__globals__, fun.__name__, fun.__defaults__, fun.__closure__
    )


def placed_inputs(fast_path: Any, flat_args: list[Any]) -> list[Any]:
    """The executable's inputs for `flat_args`: its kept constants, then each kept argument
    placed on its input sharding (host values and scalars too, canonicalized as JAX does)."""
    num_consts = len(fast_path.const_args)
    inputs = [c for c, kept in zip(fast_path.const_args, fast_path.kept, strict=False) if kept]
    shardings = iter(fast_path.in_shardings[len(inputs) :])
    for arg, kept in zip(flat_args, fast_path.kept[num_consts:], strict=True):
        if not kept:
            continue
        sharding = next(shardings)
        if isinstance(arg, jax.Array) and arg.sharding == sharding:
            inputs.append(arg)
        else:
            inputs.append(jax.device_put(arg, sharding))
    return inputs


def runner(fast_path: Any) -> Callable[[list[Any]], Any]:
    """Runs the executable of `fast_path` on inputs as `placed_inputs` gives them."""
    execute = fast_path.executable.execute_sharded
    handlers, tree = fast_path.out_handlers, fast_path.out_treedef
    if tree.num_leaves == 1 and tree.num_nodes == 1:
        return lambda inputs: execute(inputs).consume_with_handlers(handlers)[0]
    unflatten = tree.unflatten
    return lambda inputs: unflatten(execute(inputs).consume_with_handlers(handlers))


COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")


def has_collectives(fast_path: Any) -> bool:
    """Whether the executable communicates between devices. XLA's CPU collectives abort the
    process when hundreds of such programs are in flight on a small machine (JAX's alike), so
    benchmarks wait for each result of one."""
    text = "\n".join(m.to_string() for m in fast_path.executable.hlo_modules())
    return any(op in text for op in COLLECTIVES)


def waiting(call: Callable[[], Any]) -> Callable[[], Any]:
    """`call`, returning when its result is ready."""
    return lambda: jax.block_until_ready(call())


def waiting_call(call: Call) -> Call:
    """`call`, returning when its result is ready (its setup as it is)."""
    fn = call.fn
    return Call(lambda: jax.block_until_ready(fn()), call.setup)


def jit_floor(
    jitted: Any, args: tuple[Any, ...], kwargs: dict[str, Any], statics: tuple[int, ...] = ()
) -> Floor:
    """The floor of `jitted(*args, **kwargs)` (a jax.jit function), inputs placed once."""
    miss = jit_cache_miss(jitted, *_copies(args, kwargs))
    return _floor(miss, _dynamic_leaves(args, kwargs, statics, jitted))


def pmap_floor(
    pmapped: Any, args: tuple[Any, ...], kwargs: dict[str, Any], statics: tuple[int, ...] = ()
) -> Floor:
    """The floor of `pmapped(*args, **kwargs)` (a jax.pmap function), inputs placed once."""
    miss = pmap_cache_miss(pmapped, *_copies(args, kwargs))
    dynamic = tuple(a for i, a in enumerate(args) if i not in statics)
    return _floor(miss, jax.tree.leaves((dynamic, kwargs)))


def aot_floor(compiled: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Floor:
    """The floor of `compiled(*args, **kwargs)` (a jax.stages.Compiled), inputs placed once."""
    miss = aot_cache_miss(compiled, *_copies(args, kwargs))
    return _floor(miss, jax.tree.leaves((args, kwargs)))


def _copies(
    args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Copies of the arrays among the arguments, for the one call that finds the executable:
    a function that donates them consumes the copies, not the caller's."""
    copies: tuple[tuple[Any, ...], dict[str, Any]] = jax.tree.map(fresh_copy, (args, kwargs))
    return copies


def _dynamic_leaves(
    args: tuple[Any, ...], kwargs: dict[str, Any], statics: tuple[int, ...], jitted: Any
) -> list[Any]:
    argnums, argnames = _jax.jit_static_args(jitted)
    static_positions = {i if i >= 0 else len(args) + i for i in (*argnums, *statics)}
    dynamic = tuple(a for i, a in enumerate(args) if i not in static_positions)
    dynamic_kwargs = {k: v for k, v in kwargs.items() if k not in argnames}
    return jax.tree.leaves((dynamic, dynamic_kwargs))


class Floor:
    """The floor of one call: its executable, run raw on its inputs placed once."""

    def __init__(self, fast_path: Any, inputs: list[Any]):
        self.fast_path = fast_path
        self.inputs = inputs
        self._run = runner(fast_path)

    def __call__(self) -> Any:
        return self._run(self.inputs)

    def renewing(self) -> Call:
        """This floor as a `Call` whose donated inputs are copied, untimed, before each call,
        as a donating caller passes new ones; the inputs placed once stay whole."""
        fast_path = self.fast_path
        num_consts = len(fast_path.const_args)
        kept_consts = sum(fast_path.kept[:num_consts])
        donated = [False] * kept_consts + [
            d
            for d, kept in zip(fast_path.donated, fast_path.kept[num_consts:], strict=True)
            if kept
        ]
        inputs = list(self.inputs)

        def renew() -> None:
            inputs[:] = [
                fresh_copy(x) if d else x for x, d in zip(self.inputs, donated, strict=True)
            ]

        return Call(lambda: self._run(inputs), renew)


def fresh_copy(leaf: Any) -> Any:
    """A copy of an array on the same devices, sharding and commitment (other leaves as they
    are): what a donated argument is replaced with before each call."""
    if not isinstance(leaf, jax.Array):
        return leaf
    if leaf.committed:
        return jax.device_put(leaf, leaf.sharding, may_alias=False)
    return leaf.copy()


def _floor(miss: Any, flat_args: list[Any]) -> Floor:
    if miss.fast_path is None:
        raise NoFloor(f"the call has no fast path, so no floor: {miss.jax_reason}")
    return Floor(miss.fast_path, placed_inputs(miss.fast_path, flat_args))
