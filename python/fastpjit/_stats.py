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
    """The counts of one function by name (all its wrappers with one set of options)."""

    calls: int
    cache_hits: int
    cache_misses: int
    compiles: int
    # Calls that took a slower correct path (JAX ran them), by reason.
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
