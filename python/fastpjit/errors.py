"""The exceptions fastpjit raises beyond the builtins, each a subclass of what JAX raises."""

from __future__ import annotations

from fastpjit._jax import DuplicateSpecError, IndivisibleError

__all__ = ["DuplicateSpecError", "IndivisibleError", "ShardingRankError"]


class ShardingRankError(ValueError, IndexError):
    """A sharding partitions more dimensions than the array has.

    JAX raises an IndexError (NamedSharding) for this misuse, so the error is one too.
    """
