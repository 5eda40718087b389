"""fastpjit: JAX's pmap and jit with a Rust runtime core.

So far: sharding index maps computed in Rust, equal to JAX's, and device_put/device_get with
the shard and unshard work done in Rust.
"""

from __future__ import annotations

from fastpjit._core import __version__, reset_stats, set_host_pool_limit, stats
from fastpjit.errors import (
    DuplicateSpecError,
    IndivisibleError,
    NoPlacementError,
    ShardingRankError,
)
from fastpjit.jit import jit, pjit
from fastpjit.pmap import pmap
from fastpjit.sharding import (
    addressable_devices_indices_map,
    device_replica_id_map,
    devices_indices_map,
    indices_array,
    parse_hlo_sharding,
    shard_shape,
)
from fastpjit.transfer import device_get, device_put

__all__ = [
    "DuplicateSpecError",
    "IndivisibleError",
    "NoPlacementError",
    "ShardingRankError",
    "__version__",
    "addressable_devices_indices_map",
    "device_get",
    "device_put",
    "device_replica_id_map",
    "devices_indices_map",
    "indices_array",
    "jit",
    "parse_hlo_sharding",
    "pjit",
    "pmap",
    "reset_stats",
    "set_host_pool_limit",
    "shard_shape",
    "stats",
]
