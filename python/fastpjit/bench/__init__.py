"""Measuring dispatch: `fastpjit.benchmark(fn, *args)` times one call under fastpjit, JAX and
the floor; `python -m fastpjit.bench` runs the standard suite. Both time with `harness`."""

from __future__ import annotations

from fastpjit.bench.benchmark import Benchmark, benchmark, measure_call
from fastpjit.bench.harness import CheckFailed, Settings

__all__ = ["Benchmark", "CheckFailed", "Settings", "benchmark", "measure_call"]
