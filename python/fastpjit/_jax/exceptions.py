"""JAX's exception types that fastpjit's own errors re-export (`fastpjit.errors`). Apart from
`api`, which imports the compile path, whose guard raises fastpjit's errors."""

from __future__ import annotations

from jax._src import named_sharding as _named_sharding
from jax._src import sharding as _sharding

__all__ = ["DuplicateSpecError", "IndivisibleError"]

IndivisibleError = _sharding.IndivisibleError
DuplicateSpecError = _named_sharding.DuplicateSpecError
