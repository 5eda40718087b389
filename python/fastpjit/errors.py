"""The exceptions fastpjit raises beyond the builtins, each a subclass of what JAX raises."""

from __future__ import annotations

from fastpjit._jax.exceptions import DuplicateSpecError, IndivisibleError

__all__ = [
    "CompilerOptionsError",
    "DuplicateSpecError",
    "IndivisibleError",
    "NoPlacementError",
    "RecompileError",
    "ShardingRankError",
]


class ShardingRankError(ValueError, IndexError, AssertionError):
    """A sharding partitions more dimensions than the array has, or fewer.

    JAX raises an IndexError for this misuse of a NamedSharding, an AssertionError for a
    GSPMDSharding and for device_put onto an Explicit mesh, and a ValueError for device_put onto
    an Auto mesh, so this error is all three.
    """


class NoPlacementError(NotImplementedError, AssertionError):
    """A sharding that says nothing of where data lies ({manual}, {unknown}) has no index map.

    JAX fails an assertion on the index maps of these, so the error is an AssertionError too.
    """


class CompilerOptionsError(TypeError, ValueError, AttributeError):
    """Compile options that are not a dict of XLA option names to str, bool, int or float.

    JAX raises an AttributeError for `compiler_options` that are not a dict, a ValueError for
    a value that cannot be hashed and a TypeError for a value of another type, so this error
    is all three. (An unknown option name is JAX's `JaxRuntimeError`, as the backend raises
    it.)
    """


class RecompileError(RuntimeError):
    """A call inside `fastpjit.no_recompiles()` would have traced and compiled. The message
    says what differs from the signatures that the function has cached."""
