"""The shape of `fastpjit.stats()`'s snapshot, as the native module builds it
(`rust/bindings/src/stats.rs`, `host_memory.rs`): TypedDicts for type checkers."""

from __future__ import annotations

from typing import NotRequired, TypedDict

__all__ = ["FunctionStats", "HostPoolStats", "Percentiles", "Stats", "Timing"]


class Percentiles(TypedDict):
    """Of a function's timed cache hits: the 50th and 99th percentile, in µs."""

    p50_us: float
    p99_us: float


class Timing(TypedDict):
    """The host time of a function's latest timed cache hits (`fastpjit.timing`), whole and
    by stage; `calls` counts every timed hit."""

    calls: int
    total: Percentiles
    lookup: Percentiles
    inputs: Percentiles
    execute: Percentiles
    outputs: Percentiles


class FunctionStats(TypedDict):
    """The counts of one function (all its wrappers with one set of options), under its
    `module.qualname`, with `:line` where functions share that (docs/dispatch.md). Each
    call is one of a hit, a miss, a call that JAX ran, or a call inside another function's
    trace: `calls == cache_hits + cache_misses + jax_calls + traced`."""

    calls: int
    cache_hits: int
    cache_misses: int
    # Calls that JAX ran whole (a fallback).
    jax_calls: int
    # Calls made inside another function's trace (jax.jit, grad, vmap), which JAX stages.
    traced: int
    compiles: int
    # Calls, or parts of calls, that took a slower correct path, by the fallback's code (see
    # `fallback_reasons()` and docs/fallbacks.md): the calls that JAX ran, a miss that JAX
    # compiled, an argument that JAX moved on a hit.
    fallbacks: dict[str, int]
    # Present once a hit was timed.
    timing: NotRequired[Timing]


class HostPoolStats(TypedDict):
    """The pool of host memory that device_get assembles arrays in."""

    hits: int
    misses: int
    idle_blocks: int
    idle_bytes: int
    limit: int


class Stats(TypedDict):
    """Every counter since the last `reset_stats()`: the totals over all functions (with the
    compiles and fallbacks of no function: compile_hlo's, device_put's), and per function."""

    cache_hits: int
    cache_misses: int
    compiles: int
    fallbacks: dict[str, int]
    # Calls that `fastpjit.no_recompiles` stopped.
    recompiles_stopped: int
    functions: dict[str, FunctionStats]
    host_pool: HostPoolStats
