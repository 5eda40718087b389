"""Type stub of the native module fastpjit._core, checked against it by mypy.stubtest."""

from collections.abc import Sequence
from typing import Any, Self

import numpy as np
import numpy.typing as npt
from typing_extensions import disjoint_base

__all__ = [
    "JitFunction",
    "__version__",
    "addressable_devices_indices_map",
    "canonical_hlo_sharding",
    "count_fallback",
    "device_get_leaf",
    "device_placement_map",
    "device_put_leaf",
    "device_replica_id_map",
    "devices_indices_map",
    "indices_array",
    "reset_stats",
    "set_host_pool_limit",
    "shard_shape",
    "stats",
    "transfer_cache_sizes",
]
__version__: str

def stats() -> dict[str, Any]: ...
def reset_stats() -> None: ...
def set_host_pool_limit(nbytes: int) -> None: ...
def count_fallback(reason: str) -> None: ...
def devices_indices_map(
    sharding: Any, global_shape: Sequence[int]
) -> dict[Any, tuple[slice, ...]]: ...
def addressable_devices_indices_map(
    sharding: Any, global_shape: Sequence[int]
) -> dict[Any, tuple[slice, ...]]: ...
def shard_shape(sharding: Any, global_shape: Sequence[int]) -> tuple[int, ...]: ...
def device_replica_id_map(sharding: Any, global_shape: Sequence[int]) -> dict[Any, int]: ...
def indices_array(sharding: Any, global_shape: Sequence[int]) -> npt.NDArray[np.int64]: ...
def device_placement_map(
    sharding: Any, global_shape: Sequence[int]
) -> dict[Any, tuple[tuple[slice, ...], int]]: ...
def canonical_hlo_sharding(text: str, num_devices: int | None) -> str: ...
def device_put_leaf(x: Any, sharding: Any, committed: bool = True) -> Any: ...
def device_get_leaf(x: Any) -> Any: ...
def transfer_cache_sizes() -> tuple[int, int, int]: ...

@disjoint_base
class JitFunction:
    def __new__(
        cls,
        fallback: Any,
        miss: Any,
        static_argnums: Sequence[int],
        static_argnames: Sequence[str],
        kind: str = "jit",
        capacity: int = 4096,
    ) -> Self: ...
    def __call__(self, *args: Any, **kwargs: Any) -> Any: ...
    def _cache_size(self) -> int: ...
    def _clear_cache(self) -> None: ...
