"""A function's row in `fastpjit.stats()["functions"]`, found by the Python function."""

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
