"""What fastpjit.stats() counted, as the tests read it: a function's row (`row`), and how far
the totals moved since a point (`Counts`)."""

from __future__ import annotations

from typing import Any

import fastpjit
from fastpjit._shared import stats_row


def row(fun: Any) -> dict[str, Any]:
    """The counts of `fun` (the Python function that fastpjit functions wrap): its row is named
    `module.qualname`, with `:line` or ` (file:line)` where other functions share the name.
    All zeros where it counted nothing yet."""
    name, place = stats_row(fun)
    functions = fastpjit.stats()["functions"]
    for key in (name, f"{name}:{place.rpartition(':')[2]}", f"{name} ({place})"):
        if key in functions:
            return functions[key]
    zeros = dict.fromkeys(("calls", "cache_hits", "cache_misses", "jax_calls", "traced"), 0)
    return {**zeros, "compiles": 0, "fallbacks": {}}


class Counts:
    """Deltas of fastpjit.stats() counters since construction."""

    def __init__(self) -> None:
        self.start = fastpjit.stats()

    def __getitem__(self, name: str) -> int:
        return fastpjit.stats()[name] - self.start[name]

    def fallbacks(self) -> dict[str, int]:
        """The fallbacks counted since construction, by reason (those that moved only)."""
        before = self.start["fallbacks"]
        return {
            reason: n - before.get(reason, 0)
            for reason, n in fastpjit.stats()["fallbacks"].items()
            if n != before.get(reason, 0)
        }
