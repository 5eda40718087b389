"""fastpjit: JAX's pmap and jit with a Rust runtime core.

This release has the foundation: sharding index maps computed in Rust, equal to JAX's.
"""

from __future__ import annotations

from fastpjit._core import __version__
from fastpjit._core import reset_stats, stats
from fastpjit.errors import DuplicateSpecError, IndivisibleError, ShardingRankError
from fastpjit.sharding import (
    addressable_devices_indices_map,
    device_replica_id_map,
    devices_indices_map,
    indices_array,
    parse_hlo_sharding,
    shard_shape,
)

__all__ = [
    "DuplicateSpecError",
    "IndivisibleError",
    "ShardingRankError",
    "__version__",
    "addressable_devices_indices_map",
    "device_replica_id_map",
    "devices_indices_map",
    "indices_array",
    "parse_hlo_sharding",
    "reset_stats",
    "shard_shape",
    "stats",
]
