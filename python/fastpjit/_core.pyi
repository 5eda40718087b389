"""Type stub of the native module fastpjit._core, checked against it by mypy.stubtest."""

from collections.abc import Sequence
from typing import Any, Self, final

import numpy as np
import numpy.typing as npt
from typing_extensions import disjoint_base

from fastpjit._stats import Stats

__all__ = [
    "BoundFunction",
    "CacheMiss",
    "DispatchCache",
    "FastPath",
    "JitFunction",
    "__version__",
    "addressable_devices_indices_map",
    "canonical_hlo_sharding",
    "check_module_text",
    "clear_dispatch_memo",
    "count_compiles",
    "count_recompile_stopped",
    "count_fallback",
    "device_get_leaf",
    "device_placement_map",
    "device_put_leaf",
    "device_replica_id_map",
    "devices_indices_map",
    "dispatch_memo_sizes",
    "indices_array",
    "make_array_from_process_local_leaf",
    "reset_stats",
    "set_host_pool_limit",
    "shard_shape",
    "stats",
    "transfer_cache_sizes",
    "transfers_guarded",
]
__version__: str

def stats() -> Stats: ...
def reset_stats() -> None: ...
def set_host_pool_limit(nbytes: int) -> None: ...
def count_fallback(reason: str) -> None: ...
def count_compiles(n: int) -> None: ...
def count_recompile_stopped() -> None: ...
def transfers_guarded(direction: str) -> bool: ...
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
def check_module_text(text: str, mlir: bool) -> None: ...
def device_put_leaf(x: Any, sharding: Any, committed: bool = True) -> Any: ...
def device_get_leaf(x: Any) -> Any: ...
def transfer_cache_sizes() -> tuple[int, int, int, int]: ...
def make_array_from_process_local_leaf(
    local_data: Any, sharding: Any, global_shape: Any = None
) -> Any: ...
def clear_dispatch_memo() -> None: ...
def dispatch_memo_sizes() -> tuple[int, int]: ...

@disjoint_base
class BoundFunction:
    def __new__(
        cls,
        function: JitFunction,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        arrays: list[Any],
        settle: Any = None,
    ) -> Self: ...
    def __call__(self, *args: Any, **kwargs: Any) -> Any: ...
    def _settle_with(
        self, args: tuple[Any, ...], kwargs: dict[str, Any], arrays: list[Any]
    ) -> None: ...
    @property
    def _function(self) -> JitFunction: ...
    @property
    def _args(self) -> tuple[Any, ...]: ...
    @property
    def _kwargs(self) -> dict[str, Any]: ...

@final
class DispatchCache:
    def __new__(
        cls,
        name: str,
        static_argnums: Sequence[int],
        static_argnames: Sequence[str],
        kind: str = "jit",
        capacity: int = 4096,
        context: bool = True,
    ) -> Self: ...
    def _clear(self) -> None: ...

@disjoint_base
class JitFunction:
    def __new__(
        cls,
        fallback: Any,
        miss: Any,
        cache: DispatchCache,
        jax_dispatch: Any = None,
        make_jax_dispatch: Any = None,
    ) -> Self: ...
    @property
    def _dispatch_cache(self) -> DispatchCache: ...
    def __call__(self, *args: Any, **kwargs: Any) -> Any: ...
    def _cache_size(self) -> int: ...
    def _held_arrays(self) -> int: ...
    def _latest_host_targets(self) -> list[tuple[int, Any]]: ...
    def _clear_cache(self) -> None: ...

@final
class FastPath:
    def __new__(
        cls,
        *,
        executable: Any,
        out_treedef: Any,
        out_handlers: list[Any],
        in_shardings: Sequence[Any],
        kept: Sequence[bool],
        const_args: Sequence[Any],
        donated: Sequence[bool],
        in_global: Sequence[tuple[Any, Any] | None] | None = None,
        out_local: Sequence[tuple[Any, Any] | None] | None = None,
    ) -> Self: ...
    @property
    def executable(self) -> Any: ...
    @property
    def out_treedef(self) -> Any: ...
    @property
    def out_handlers(self) -> list[Any]: ...
    @property
    def in_shardings(self) -> list[Any]: ...
    @property
    def kept(self) -> list[bool]: ...
    @property
    def const_args(self) -> list[Any]: ...
    @property
    def donated(self) -> list[bool]: ...
    @property
    def in_global(self) -> list[tuple[Any, Any] | None] | None: ...
    @property
    def out_local(self) -> list[tuple[Any, Any] | None] | None: ...

@final
class CacheMiss:
    def __new__(
        cls, outputs: Any, fast_path: FastPath | None, *, compiles: int, jax_reason: str | None
    ) -> Self: ...
    @property
    def outputs(self) -> Any: ...
    @property
    def fast_path(self) -> FastPath | None: ...
    @property
    def compiles(self) -> int: ...
    @property
    def jax_reason(self) -> str | None: ...
