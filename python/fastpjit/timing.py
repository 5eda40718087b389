"""Per-function latency when asked: with timing on, every cache hit records its host time by
stage (signature and lookup, inputs, execute, outputs), and `fastpjit.stats()["functions"]`
reports p50/p99 of each. Off (the default), a call only reads the flag."""

from __future__ import annotations

from fastpjit import _core
from fastpjit._switch import Switch

__all__ = ["timing"]


class timing:  # noqa: N801 - used like a function
    """Switches the timing of cache hits on (or, with `False`, off) now, for every thread. As a
    context manager, it holds the setting for the block: timing stays on while any block that
    turned it on is open, in any thread, and after the last, it is as plain calls left it.

        fastpjit.timing(True)            # on from here
        with fastpjit.timing():          # on inside the block
            serve()
        # {"calls", "total", "lookup", "inputs", "execute", "outputs"}:
        fastpjit.stats()["functions"]["__main__.step"]["timing"]
    """

    def __init__(self, on: bool = True) -> None:
        self._on = bool(on)
        self._kept_before = _SWITCH.set(self._on)

    def __enter__(self) -> timing:
        _SWITCH.hold(self._on, self._kept_before)
        return self

    def __exit__(self, *exc: object) -> None:
        _SWITCH.release(self._on)


_SWITCH = Switch(_core.set_timing)
