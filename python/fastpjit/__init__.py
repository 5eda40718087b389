"""fastpjit: JAX's jit, pjit and pmap, with the work of every cached call done in Rust.

jit, pjit and pmap (and their `.lower(...).compile()` and `f.bind(...)` functions) key every
call and run its cached executable from Rust; JAX traces and compiles on a miss, and runs the
calls that fastpjit cannot serve, each counted in `stats()` with its reason. compile_hlo runs
sharded HLO or StableHLO from other frontends through the same dispatcher. The index maps
(devices_indices_map and its relatives) and the shard work of device_put, device_get and
make_array_from_process_local_data are done in Rust. `install()` puts fastpjit in JAX's place
under code that you don't own (`python -m fastpjit run SCRIPT` runs a program so), and
`python -m fastpjit.launch` runs a multi-process program on one machine. See docs/ in the
source tree.
"""

from __future__ import annotations

# isort: off
# First: a JAX that fastpjit does not support is refused here, with the versions it supports.
import fastpjit._jax  # noqa: F401

# isort: on
from fastpjit import _failures, _launched
from fastpjit._core import (
    __version__,
    fallback_reasons,
    reset_stats,
    set_host_pool_limit,
    stats,
)
from fastpjit.bench import benchmark
from fastpjit.errors import (
    CompilerOptionsError,
    DuplicateSpecError,
    IndivisibleError,
    NoPlacementError,
    RecompileError,
    ShardingRankError,
)
from fastpjit.explain import explain, no_recompiles
from fastpjit.hlo import compile_hlo
from fastpjit.install import install, installed, uninstall
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
from fastpjit.timing import timing
from fastpjit.transfer import device_get, device_put, make_array_from_process_local_data
from fastpjit.warm_start import save_signatures, warm_up

# A process of a multi-process run ends at once when it fails, under any engine, and reports
# an uncaught exception to the launcher where it started it (fastpjit._failures); a process
# that the launcher started dies with it. (Importing fastpjit also registers cluster
# environments with jax.distributed, in fastpjit._jax.cluster_env.)
_failures.install()
_launched.install()

__all__ = [
    "CompilerOptionsError",
    "DuplicateSpecError",
    "IndivisibleError",
    "NoPlacementError",
    "RecompileError",
    "ShardingRankError",
    "__version__",
    "addressable_devices_indices_map",
    "benchmark",
    "compile_hlo",
    "device_get",
    "device_put",
    "device_replica_id_map",
    "devices_indices_map",
    "explain",
    "fallback_reasons",
    "indices_array",
    "install",
    "installed",
    "jit",
    "make_array_from_process_local_data",
    "no_recompiles",
    "parse_hlo_sharding",
    "pjit",
    "pmap",
    "reset_stats",
    "save_signatures",
    "set_host_pool_limit",
    "shard_shape",
    "stats",
    "timing",
    "uninstall",
    "warm_up",
]
