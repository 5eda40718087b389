"""Per-function latency when asked: with timing on, every cache hit records its host time by
stage (signature and lookup, inputs, execute, outputs), and `fastpjit.stats()["functions"]`
reports p50/p99 of each. Off (the default), a call only reads the flag."""

from __future__ import annotations

from fastpjit import _core

__all__ = ["timing"]


class timing:  # noqa: N801 - used like a function
    """Switches the timing of cache hits on (or, with `False`, off) now, for every thread. As a
    context manager, it puts the previous setting back on exit:

        fastpjit.timing(True)            # on from here
        with fastpjit.timing():          # on inside the block
            serve()
        fastpjit.stats()["functions"]["step"]["timing"]   # {"calls", "total", "lookup", ...}
    """

    def __init__(self, on: bool = True) -> None:
        self._previous = _core.set_timing(bool(on))

    def __enter__(self) -> timing:
        return self

    def __exit__(self, *exc: object) -> None:
        _core.set_timing(self._previous)
