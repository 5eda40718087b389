"""fastpjit's JAX boundary: the only package that names JAX's or jaxlib's private APIs.

A JAX upgrade that moves any of these names should need changes here and nowhere else; the
assumptions it relies on are listed, as data, in tests/test_jax_boundary.py. `line` comes first:
it refuses a JAX that fastpjit does not support, chooses the JAX line once, and holds every
difference between the lines (re-exported here where Rust reads one). Then one module per
consumer:

- `rust_handles`: what the native module `fastpjit._core` reads by name from `fastpjit._jax`
  (re-exported here, where Rust looks them up);
- `api`: what fastpjit's public modules (jit, pmap, transfer) take from JAX;
- `exceptions`: JAX's exception types that `fastpjit.errors` re-exports;
- `jit_miss`: the cache misses of jit, AOT-compiled and pmap functions;
- `xla_compile`: fastpjit's compiles through jaxlib's PjRt client, shared by the misses and
  compile_hlo;
- `hlo_backend`: compile_hlo's reading, compiling and running of other frontends' modules;
- `cluster_env`: fastpjit's part in `jax.distributed.initialize()`: the cluster environments
  of the launcher's processes and of `JAX_NUM_PROCESSES`/`JAX_PROCESS_ID`, and a hook after it.
"""

from __future__ import annotations

# isort: off
# First: refuses a JAX that fastpjit does not support, before any other private name is read.
from fastpjit._jax import line as _line  # noqa: F401
# isort: on

# Registers the launcher's cluster environment with jax.distributed.
from fastpjit._jax import cluster_env as _cluster_env  # noqa: F401
from fastpjit._jax.line import (
    array_was_donated,
    indivisible_message,
    jit_key_states,
)
from fastpjit._jax.rust_handles import (
    ARRAY_HOST_VALUE,
    ARRAY_TO_HOST,
    DISABLE_JIT_INDEX,
    HOST_BUFFER_COPY,
    HOST_BUFFER_ZERO_COPY,
    TRANSFER_GUARD_ALLOW,
    ArrayImpl,
    array_aval,
    array_committed,
    array_input,
    array_is_deleted,
    array_rewrap,
    array_sharding,
    array_single_device_arrays,
    batched_copy,
    batched_device_put,
    canonical_dtype,
    collect_garbage,
    config_value,
    consume_with_handlers,
    copy_to_host_async,
    dataclass_fields,
    device_put_aval,
    flatten_one_level_for_dispatch,
    hlo_parts,
    jit_key_names,
    logical_device_ids,
    placement_sharding,
    post_hook_state,
    python_scalar_dtype,
    shard_arg,
    trace_context,
    trace_state_clean,
    transfer_guard_global_state,
    transfer_guard_thread_state,
)

# The names that the native module reads, through its one handle table
# (rust/bindings/src/handles.rs).
__all__ = [
    "ARRAY_HOST_VALUE",
    "ARRAY_TO_HOST",
    "DISABLE_JIT_INDEX",
    "HOST_BUFFER_COPY",
    "HOST_BUFFER_ZERO_COPY",
    "TRANSFER_GUARD_ALLOW",
    "ArrayImpl",
    "array_aval",
    "array_committed",
    "array_input",
    "array_is_deleted",
    "array_rewrap",
    "array_sharding",
    "array_single_device_arrays",
    "array_was_donated",
    "batched_copy",
    "batched_device_put",
    "canonical_dtype",
    "collect_garbage",
    "config_value",
    "consume_with_handlers",
    "copy_to_host_async",
    "dataclass_fields",
    "device_put_aval",
    "flatten_one_level_for_dispatch",
    "hlo_parts",
    "indivisible_message",
    "jit_key_names",
    "jit_key_states",
    "logical_device_ids",
    "placement_sharding",
    "post_hook_state",
    "python_scalar_dtype",
    "shard_arg",
    "trace_context",
    "trace_state_clean",
    "transfer_guard_global_state",
    "transfer_guard_thread_state",
]
