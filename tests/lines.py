"""Where JAX's own behaviour differs between the lines that fastpjit supports (jax 0.10.2, and
0.11.2 to 0.12.x): a test states both behaviours with `by_line` and asserts the running one's.
The line is the one that `fastpjit._jax.line` chose at import."""

from __future__ import annotations

import pathlib
import re
from typing import TypeVar

import fastpjit
from fastpjit._jax import line

T = TypeVar("T")

ON_0_10 = line.CURRENT == "0.10"


def by_line(*, jax_0_10: T, jax_0_11: T) -> T:
    """What the running JAX line does: `jax_0_10` on jax 0.10.2, `jax_0_11` from 0.11.2."""
    return jax_0_10 if ON_0_10 else jax_0_11


# From 0.11.2 JAX ends the errors of a call's arguments with the call's source location: "This
# error occurs at source:  FILE:LINE:COLUMN (FUNCTION)". Two calls on two lines give two texts.
_PACKAGE = str(pathlib.Path(fastpjit.__file__).parent)
_SOURCE_LOCATION = re.compile(r"(This error occurs at source:\s+)(\S+):\d+:\d+ \(([^)]*)\)")


def without_source_location(message: str) -> str:
    """`message` with the source location JAX adds from 0.11.2 cut down to its file, which must
    be the caller's own (a test's), never one of fastpjit's."""
    for match in _SOURCE_LOCATION.finditer(message):
        assert not match.group(2).startswith(_PACKAGE), f"the error points into fastpjit: {message}"
    return _SOURCE_LOCATION.sub(r"\1\2", message)


# A donated array handed again to a cached call: jax 0.10.2's C++ path raises a ValueError (and
# crashes on several devices), which fastpjit raises on every call path; from 0.11.2 JAX
# raises the RuntimeError of a deleted array. (The exception type, and words of its message.)
DONATED_AGAIN = by_line(
    jax_0_10=(ValueError, "donated"), jax_0_11=(RuntimeError, "Array has been deleted")
)
