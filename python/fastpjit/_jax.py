"""The one module that touches JAX's and jaxlib's private APIs.

A JAX upgrade that moves any of these names should need changes here and nowhere else.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import threading
import weakref
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from jax._src import api as _api
from jax._src import api_util as _api_util
from jax._src import clusters as _clusters
from jax._src import compiler as _compiler
from jax._src import config as _config
from jax._src import core as _core
from jax._src import dispatch as _dispatch
from jax._src import dtypes as _dtypes
from jax._src import mesh as _mesh
from jax._src import named_sharding as _named_sharding
from jax._src import op_shardings as _op_shardings
from jax._src import pjit as _pjit
from jax._src import pmap as _pmap_lib
from jax._src import sharding as _sharding
from jax._src import sharding_impls as _sharding_impls
from jax._src import source_info_util as _source_info_util
from jax._src import stages as _stages
from jax._src import traceback_util as _traceback_util
from jax._src import tree_util as _tree_util
from jax._src import util as _util
from jax._src.array import ArrayImpl
from jax._src.interpreters import mlir as _mlir
from jax._src.interpreters import pxla as _pxla
from jax._src.lax import lax as _lax
from jax._src.lib import _jax as _jaxlib
from jax._src.lib import guard_lib as _guard_lib
from jax._src.lib import xla_client as xc
from jax._src.lib.mlir import ir
from jax._src.lib.mlir.dialects import sdy as _sdy
from jax._src.sharding_impls import GSPMDSharding

from fastpjit import _core as _native
from fastpjit import _launched

IndivisibleError = _sharding.IndivisibleError
JaxRuntimeError = jax.errors.JaxRuntimeError
DuplicateSpecError = _named_sharding.DuplicateSpecError

__all__ = [
    "aot_cache_miss",
    "api_boundary",
    "array_aval",
    "array_committed",
    "ARRAY_HOST_VALUE",
    "array_input",
    "array_is_deleted",
    "array_rewrap",
    "array_sharding",
    "array_single_device_arrays",
    "ARRAY_TO_HOST",
    "array_was_donated",
    "ArrayImpl",
    "backend_compiles",
    "batched_copy",
    "batched_device_put",
    "buffer_id",
    "canonical_dtype",
    "clear_index_map_caches",
    "clear_with_jax_caches",
    "collect_garbage",
    "compile_hlo_program",
    "compile_lowered",
    "compiled_parts",
    "config_value",
    "consume_with_handlers",
    "copy_to_host_async",
    "dataclass_fields",
    "device_put_aval",
    "DISABLE_JIT_INDEX",
    "DuplicateSpecError",
    "execute",
    "explicit_device_put_scope",
    "flatten_one_level_for_dispatch",
    "gspmd_sharding",
    "GSPMDSharding",
    "hlo_module_proto",
    "hlo_parts",
    "hlo_shardings",
    "hlo_text",
    "HloProgram",
    "HOST_BUFFER_COPY",
    "HOST_BUFFER_ZERO_COPY",
    "host_view",
    "in_legacy_mesh_context",
    "IndivisibleError",
    "jax_cache_counts",
    "jax_indices_from_named",
    "JaxRuntimeError",
    "jit_cache_miss",
    "jit_key_state_names",
    "jit_key_states",
    "jit_static_args",
    "jit_donated_args",
    "jax_jit",
    "jax_pmap",
    "function_name",
    "LaunchedCluster",
    "legacy_pjit",
    "logical_device_ids",
    "placement_sharding",
    "pmap_cache_miss",
    "post_hook_state",
    "python_scalar_dtype",
    "read_hlo_module",
    "result_handlers",
    "shard_arg",
    "trace_context",
    "tracing",
    "TRANSFER_GUARD_ALLOW",
    "transfer_guard_global_state",
    "transfer_guard_thread_state",
]


def hlo_parts(sharding: Any, ndim: int) -> tuple[str, tuple[Any, ...]]:
    """The HLO sharding text and device assignment of any JAX sharding."""
    return str(sharding._to_xla_hlo_sharding(ndim)), tuple(sharding._device_assignment)


def logical_device_ids(sharding: Any) -> tuple[int, ...] | None:
    """The device order that a NamedSharding lays over its mesh, if it sets one."""
    return sharding._logical_device_ids


def gspmd_sharding(devices: Sequence[Any], hlo_text: str) -> GSPMDSharding:
    """A GSPMDSharding over `devices` from text that fastpjit's parser has checked."""
    return GSPMDSharding(tuple(devices), xc.HloSharding.from_string(hlo_text))


# Transfers: the pieces of jax.device_put and np.asarray(jax.Array) that fastpjit's Rust shard
# path calls. Rust fetches these names once and calls them per new plan or per array.

batched_device_put = xc.batched_device_put
# How batched_device_put treats host memory on the CPU: with ZERO_COPY (JAX's choice) jaxlib
# adopts 64-byte-aligned dense shards and copies the others on a slower path; for those,
# IMMUTABLE_ONLY_DURING_CALL copies sooner (measured, until ready: 15 against 17 µs for an
# unaligned (8, 4) float32 array split over 8 devices, 17 against 19 µs for an (8, 1024) one).
HOST_BUFFER_ZERO_COPY = xc.HostBufferSemantics.ZERO_COPY
HOST_BUFFER_COPY = xc.HostBufferSemantics.IMMUTABLE_ONLY_DURING_CALL


def placement_sharding(sharding: Any, ndim: int) -> Any:
    """The sharding on which the dispatcher places a host argument of `ndim` dimensions bound for
    `sharding`, an executable's input sharding: a GSPMDSharding of the same devices, layout and
    memory kind, which jaxlib reads in C++ (it asks a SingleDeviceSharding or a NamedSharding
    for its layout in Python, on every transfer). Arrays placed on it are inputs of the
    executable only, never handed to the caller."""
    if not isinstance(sharding, jax.sharding.SingleDeviceSharding | jax.sharding.NamedSharding):
        return sharding
    return GSPMDSharding(sharding._device_assignment, sharding._to_xla_hlo_sharding(ndim),
                         memory_kind=sharding.memory_kind)


def device_put_aval(shape: tuple[int, ...], dtype: np.dtype, weak_type: bool, sharding: Any) -> Any:
    """The aval that jax.device_put gives an array of this shape and dtype on `sharding`."""
    return _dispatch.update_dp_aval(_core.ShapedArray(shape, dtype, weak_type=weak_type), sharding)


def canonical_dtype(dtype: Any) -> np.dtype:
    """The dtype JAX stores for `dtype` (float64 becomes float32 without x64); TypeError if none."""
    dtype = np.dtype(dtype)
    _dtypes.check_valid_dtype(dtype)
    return np.dtype(_dtypes.canonicalize_dtype(dtype))


def python_scalar_dtype(kind: type) -> np.dtype:
    """The canonical dtype of a Python scalar type (bool, int, float, complex)."""
    return np.dtype(_dtypes.canonicalize_dtype(_dtypes.python_scalar_types_to_dtypes[kind]))


def copy_to_host_async(single: Any) -> None:
    """Starts the device-to-host copy of a single-device array (a no-op on CPU)."""
    single._copy_single_device_array_to_host_async()


# What device_get reads of a jaxlib ArrayImpl, from Rust: the method that gives a host view (a
# copy where the platform needs one) of a single-device or fully replicated array, as
# `(value, did_copy)`; and the attribute where np.asarray caches an array's host value.
ARRAY_TO_HOST = "_single_device_array_to_np_array_did_copy"
ARRAY_HOST_VALUE = "_npy_value"
# The getter of an array's single-device arrays, one per addressable device in the order of
# its device assignment; jaxlib builds them on first use, all at once, and keeps them.
array_single_device_arrays = vars(ArrayImpl)["_arrays"].fget


# jit: the cache miss that JAX's own C++ dispatcher would run, and what a hit needs.

# What the Rust dispatcher reads on every call: JAX's dispatch registry (which takes apart the
# pytree nodes that are not builtin containers), and JAX's jit key,
# which is the trace context plus the states that only the jit key holds: the trace state (a
# weak reference to the active trace, so that a call made while a trace is active misses and is
# staged), set_mesh's concrete mesh (two meshes of one abstract mesh trace alike), the
# optimization levels. All are C++ objects. `jit_key_state_names` lists them by name for the
# test that keeps this list complete.
flatten_one_level_for_dispatch = _tree_util.dispatch_registry.flatten_one_level
trace_context = _config.trace_context
jit_key_states = (_core.trace_state, _config.device_context, _config.optimization_level,
                  _config.memory_fitting_level)
DISABLE_JIT_INDEX = _config.trace_context_names().index("jax_disable_jit")
# JAX's post-hook, which runs the NaN and inf checks of jax_debug_nans and jax_debug_infs on the
# outputs of every cached call: `hook(function, args, kwargs, outputs)`; None when they are off.
post_hook_state = _api._post_hook_state
# What the dispatcher reads of every argument, taken from jaxlib's ArrayImpl once and called
# without an attribute lookup: the getters of its aval, sharding and commitment (the public
# `sharding` and `committed` are Python properties over the last two, which would run bytecode
# per argument), and its is_deleted method.
array_aval = vars(ArrayImpl)["aval"].fget
array_sharding = vars(ArrayImpl)["_sharding"].fget
array_committed = vars(ArrayImpl)["_committed"].fget
array_is_deleted = vars(ArrayImpl)["is_deleted"]
# The same buffers as another global array: a pmap across processes views a host-local array
# as this process's part of a global one, and back.
array_rewrap = vars(ArrayImpl)["_rewrap_with_aval_and_sharding"]
consume_with_handlers = _jaxlib.ExecuteResults.consume_with_handlers
# jaxlib releases some Python objects of an execution through a queue that its own C++
# dispatch drains as it goes and JAX drains from a gc callback; `execute_sharded` leaves one
# object there per call, so the Rust dispatcher drains it itself every so many calls.
collect_garbage = _jaxlib.collect_garbage


# jaxlib's transfer guard, per thread and for the process: a call's host arguments are implicit
# host-to-device transfers, which every level but "allow" watches ("log"/"disallow", and their
# "_explicit" forms, which watch explicit transfers too). The dispatcher checks it before it
# hands a call a device copy of a scalar kept from an earlier call.
transfer_guard_thread_state = _guard_lib.thread_local_state
transfer_guard_global_state = _guard_lib.global_state()
TRANSFER_GUARD_ALLOW = _guard_lib.TransferGuardLevel.ALLOW
# The scope in which jax.device_put marks its transfers explicit, which the "_explicit" guard
# levels watch and the others let through.
explicit_device_put_scope = _config.explicit_device_put_scope


def dataclass_fields(kind: type) -> tuple[tuple[str, ...], tuple[str, ...]] | None:
    """The data and meta fields of a class registered with `jax.tree_util.register_dataclass`
    (JAX's registries take such a node apart by reading those attributes), or None for any
    other type. JAX keeps the field names only in the closure of its flatten function."""
    entry = _tree_util._registry.get(kind)
    flatten: Any = getattr(entry, "to_iter", None)
    code = getattr(flatten, "__code__", None)
    if code is None or code.co_freevars != ("data_fields", "meta_fields"):
        return None
    if flatten.__qualname__ != "register_dataclass.<locals>.flatten_func":
        return None
    data, meta = (cell.cell_contents for cell in flatten.__closure__)
    return tuple(data), tuple(meta)


def jit_key_state_names() -> tuple[str, ...]:
    """The names of the states in JAX's jit key that the dispatcher reads: the trace context's
    and `jit_key_states`."""
    return (*_config.trace_context_names(), *(state.name for state in jit_key_states))


def array_was_donated(array: Any) -> bool:
    """Whether a deleted array was donated to a computation rather than deleted by `delete()`:
    jaxlib keeps a donated array's device array (which still knows its size) and drops a
    deleted one's. JAX's cached path raises a ValueError for the first, a RuntimeError for the
    second."""
    try:
        array.on_device_size_in_bytes()
    except Exception:
        return False
    return True


def array_input(own: Any, target: Any, ndim: int) -> tuple[str, tuple[list[Any], ...] | None]:
    """How an array of `ndim` dimensions on sharding `own` becomes an executable input on
    sharding `target`, as JAX's dispatch has it: ("pass", None) as it is (the same sharding, or
    one that places the same shards on the same devices in the same order: a previous pmap's
    output, say); ("copy", the arguments `batched_copy` takes after the list of arrays) where
    its shards go to other devices as they are (from one device to another, or the same tiles
    over devices in another order), which JAX copies in C++; else ("move", None), where JAX
    moves it (`shard_arg`)."""
    if own == target:
        return "pass", None
    if own.num_devices == 1 and target.num_devices == 1:
        device, = own._device_assignment
        default = device.default_memory().kind if hasattr(device, "default_memory") else None
        if (tuple(target._device_assignment) == (device,)
                and (own.memory_kind or default) == (target.memory_kind or default)):
            return "pass", None
    elif own.is_equivalent_to(target, ndim):
        return "pass", None
    elif (own.num_devices != target.num_devices or own.memory_kind != target.memory_kind
          or not _op_shardings.are_hlo_shardings_equal(own._to_xla_hlo_sharding(ndim),
                                                       target._to_xla_hlo_sharding(ndim))):
        return "move", None
    if not (own.is_fully_addressable and target.is_fully_addressable):
        return "move", None
    return "copy", ([target._internal_device_list.addressable_device_list], [target],
                    [xc.ArrayCopySemantics.REUSE_INPUT])


# jaxlib's copy of arrays to other devices; it applies the device-to-device transfer guard.
batched_copy = _jaxlib.batched_copy_array_to_devices_with_sharding

# The getter of a config state's value, called directly.
config_value = vars(_jaxlib.config.Config)["value"].fget


def jit_static_args(jitted: Any) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """The static argnums and argnames of a jax.jit function, as JAX resolved them."""
    info = jitted._jit_info
    return tuple(info.static_argnums), tuple(info.static_argnames)


def jit_donated_args(jitted: Any) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """The donated argnums and argnames of a jax.jit function, as JAX resolved them."""
    info = jitted._jit_info
    return tuple(info.donate_argnums), tuple(info.donate_argnames)


_backend_compiles = 0
# Compiles by the thread that runs them: a miss counts its own, not those of misses that
# other threads run meanwhile.
_compiles_on_thread = threading.local()
_PERSISTENT_CACHE_HIT_EVENT = "/jax/compilation_cache/cache_hits"


def _count_backend_compile(event: str, duration: float, **_: Any) -> None:
    # JAX times a load from its persistent compilation cache as a backend compile too; the
    # cache hit, reported just before on the same thread, says that nothing was compiled.
    global _backend_compiles
    if event != _dispatch.BACKEND_COMPILE_EVENT:
        return
    if getattr(_compiles_on_thread, "loaded", False):
        _compiles_on_thread.loaded = False
        _compiles_on_thread.loads = getattr(_compiles_on_thread, "loads", 0) + 1
        return
    _backend_compiles += 1
    _compiles_on_thread.count = _thread_compiles() + 1


def _note_persistent_cache_hit(event: str, **_: Any) -> None:
    if event == _PERSISTENT_CACHE_HIT_EVENT:
        _compiles_on_thread.loaded = True


def _thread_compiles() -> int:
    return getattr(_compiles_on_thread, "count", 0)


def thread_compile_events() -> tuple[int, int]:
    """Backend compiles run, and executables loaded from JAX's persistent compilation cache,
    by this thread so far."""
    return _thread_compiles(), getattr(_compiles_on_thread, "loads", 0)


def weak_typed(value: Any) -> Any:
    """`value` as a weak-typed array of its dtype, as JAX makes one from a Python scalar."""
    return _lax._convert_element_type(value, np.dtype(value.dtype), weak_type=True)


# JAX's listener protocol names its keyword arguments; this one takes any.
jax.monitoring.register_event_duration_secs_listener(
    _count_backend_compile)  # type: ignore[arg-type]
jax.monitoring.register_event_listener(_note_persistent_cache_hit)


def jit_cache_miss(jitted: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Runs a call of `jitted` as JAX's C++ dispatcher does on a cache miss, but compiled by
    fastpjit where it can be, and returns a `fastpjit._core.CacheMiss`: the outputs; where JAX
    would take its fast path next time, the `FastPath` that fastpjit's dispatcher takes
    instead; how many backend compiles the miss ran; and why JAX, not fastpjit, lowered and
    compiled the call (or runs it), if it did.
    """
    if _config.disable_jit.value:
        # Under jax.disable_jit(), jax.jit calls the function itself; there is nothing to cache.
        return _native.CacheMiss(jitted(*args, **kwargs), None, compiles=0,
                                 jax_reason="jax.disable_jit is on")
    compiles_before = _thread_compiles()
    outs, fast, reason = _jit_miss(jitted, args, kwargs)
    return _native.CacheMiss(outs, fast, compiles=_thread_compiles() - compiles_before,
                             jax_reason=reason)


def _jit_miss(
    jitted: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[Any, Any, str | None]:
    fun, info = jitted._fun, jitted._jit_info
    p, args_flat = _pjit._infer_params(fun, info, args, kwargs)
    compiled, reason = _compile_by_fastpjit(p, args_flat)
    if compiled is None:
        outs, out_flat, out_tree, args_flat, jaxpr, executable, profiler, const_args = (
            _pjit._run_python_pjit(p, args_flat, fun, args, kwargs))
    else:
        executable, const_args = compiled
        jaxpr, out_tree, profiler = p.params["jaxpr"], p.out_tree, None
        out_flat = _run_checked(executable, const_args, args_flat, fun, args, kwargs)
        outs = _tree_util.tree_unflatten(out_tree, out_flat)
    fast = _pjit._get_fastpath_data(executable, out_tree, args_flat, out_flat, jaxpr.effects,
                                    jaxpr.consts, profiler, const_args)
    return outs, *_fast_path_and_reason(fast, p.params["donated_invars"], reason)


def _run_checked(executable: Any, const_args: Sequence[Any], args_flat: Sequence[Any],
                 fun: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Runs a freshly compiled executable as JAX's own miss does: with jax_debug_nans or
    jax_debug_infs on, an invalid output reruns the function without jit to find where it
    arises, and raises JAX's FloatingPointError."""
    try:
        return executable.unsafe_call(*const_args, *_placed_host_args(executable, const_args,
                                                                       args_flat))
    except _api_util.InternalFloatingPointError as err:
        if getattr(fun, "_apply_primitive", False):
            raise FloatingPointError(
                f"invalid value ({err.ty}) encountered in {fun.__qualname__}") from None
        _api_util.maybe_recursive_nan_check(err, fun, args, kwargs)  # raises
        raise RuntimeError("Internal error") from err


_HOST_VALUE_TYPES = (np.ndarray, np.generic, bool, int, float, complex)


def _placed_host_args(executable: Any, const_args: Sequence[Any],
                      args_flat: Sequence[Any]) -> Sequence[Any]:
    """`args_flat` with each host value (a numpy array or scalar, a Python scalar) placed on
    its input's sharding as the executable's input dtype, which the lowering fixed.

    JAX's `shard_args` converts host values by jaxlib's `canonicalize_value`, whose view of
    x64 is not always the calling thread's while other threads switch x64 (measured: 1 run in
    3 of 4 threads, two under `jax.enable_x64`, gives a float64 executable a float32 buffer,
    with `jax.jit` alike); on several devices jaxlib then reads the wrong buffer unchecked.
    Values placed here never reach it. Any value that does not convert is left to JAX."""
    call = executable.unsafe_call
    handler = getattr(call, "in_handler", None)
    kept = getattr(call, "kept_var_idx", None)
    if handler is None or kept is None or getattr(call, "mut", None) is not None:
        return args_flat
    num_consts = len(const_args)
    positions = [i for i in range(num_consts + len(args_flat)) if i in kept]
    in_avals = executable.in_avals
    if not len(positions) == len(in_avals) == len(handler.in_shardings):
        return args_flat
    placed = list(args_flat)
    for k, i in enumerate(positions):
        j = i - num_consts
        if j < 0 or not isinstance(placed[j], _HOST_VALUE_TYPES):
            continue
        dtype = getattr(in_avals[k], "dtype", None)
        if not isinstance(dtype, np.dtype) or dtype.itemsize == 0:
            continue
        try:
            value = np.asarray(placed[j], dtype=dtype)
        except (OverflowError, TypeError, ValueError):
            continue
        placed[j] = _pxla.shard_args(
            [handler.in_shardings[k]], [handler.in_layouts[k]],
            [xc.ArrayCopySemantics.REUSE_INPUT], [value], canonicalize=False)[0]
    return placed


def _fast_path_and_reason(fast: Any, donated: Sequence[bool],
                          reason: str | None) -> tuple[Any, str | None]:
    fast_path = _fast_path(fast, donated)
    if fast_path is None and reason is None:
        reason = "JAX's own dispatch keeps it off its fast path (outputs that are not arrays, "
        reason += "effects or layouts)"
    return fast_path, reason


# fastpjit's compile of a jit call: JAX traces and lowers to StableHLO with the shardings;
# fastpjit sets the compile options (one replica, a partition per device of the lowering's
# device assignment, where XLA may choose shardings), compiles through jaxlib's PjRt client
# (JAX's persistent compilation cache is consulted first), and reads the output shardings
# that XLA chose through fastpjit's own HLO sharding parser and index maps. The executable
# is JAX's MeshExecutable, so `Compiled`, `.lower()` and JAX's own jit share it.


def _compile_by_fastpjit(
    p: Any, args_flat: Sequence[Any]
) -> tuple[tuple[Any, list[Any]] | None, str | None]:
    """Lowers and compiles a jit call whose parameters JAX inferred: ((executable, const args
    placed on their devices), None), or (None, why JAX must lower and compile it)."""
    params = p.params
    reason = _why_jax_compiles(params)
    if reason is not None:
        return None, reason
    try:
        for arg in args_flat:
            _dispatch.check_arg(arg)
        args_flat = [_core.full_lower(a) for a in args_flat]
        _core.check_eval_args(args_flat)
        computation = _lower(params, args_flat)
        reason = _why_jax_compiles_lowering(computation)
        if reason is not None:
            return None, reason
        executable = _compile_lowering(computation)
        return (executable, executable.shard_const_args(computation.const_args)), None
    except Exception as err:
        # JAX's own path then raises JAX's error for the same call, or runs it.
        return None, f"fastpjit's compile raised {type(err).__name__}"


def compile_lowered(lowered: Any) -> None:
    """Compiles a `jax.stages.Lowered` of a jit function the way a call would, where fastpjit
    can, so that its `compile()` returns fastpjit's executable."""
    computation = lowered._lowering
    if (isinstance(computation, _pxla.MeshComputation)
            and _why_jax_compiles_lowering(computation) is None):
        _compile_lowering(computation)


def _why_jax_compiles(params: dict[str, Any]) -> str | None:
    if not _core.trace_state_clean():
        return "under a JAX trace"
    if _config.debug_key_reuse.value or _config.enable_pgle.value:
        return "key reuse checks or profile-guided optimization are on"
    jaxpr = params["jaxpr"]
    if jaxpr.jaxpr.is_high or jaxpr.effects:
        return "the function has effects or mutable state"
    return None


def _lower(params: dict[str, Any], args_flat: Sequence[Any]) -> Any:
    """JAX's lowering of the call, shared with jax.jit's caches."""
    return _pjit._resolve_and_lower(
        [_pjit.convert_to_metaty(a) for a in args_flat], jaxpr=params["jaxpr"],
        in_shardings=params["in_shardings"], out_shardings=params["out_shardings"],
        in_layouts=params["in_layouts"], out_layouts=params["out_layouts"],
        donated_invars=params["donated_invars"], ctx_mesh=params["ctx_mesh"],
        name=params["name"], keep_unused=params["keep_unused"], inline=params["inline"],
        lowering_platforms=None, lowering_parameters=_mlir.LoweringParameters(),
        pgle_profiler=None, compiler_options_kvs=params["compiler_options_kvs"])


def _why_jax_compiles_lowering(computation: Any) -> str | None:
    args = computation.compile_args
    if args["host_callbacks"] or args["ordered_effects"] or args["unordered_effects"]:
        return "the computation calls back to the host"
    if any(layout is not None for layout in (*args["in_layouts"], *args["out_layouts"])):
        return "layouts are set"
    if args["mut"] is not None or (args["shape_poly_state"] is not None
                                   and args["shape_poly_state"].uses_dim_vars):
        return "mutable arrays or symbolic shapes"
    avals = (*args["global_in_avals"], *args["global_out_avals"])
    if any(a is _core.abstract_token or _dtypes.issubdtype(a.dtype, _dtypes.extended)
           for a in avals):
        return "tokens or extended dtypes (PRNG keys)"
    shardings = (*args["in_shardings"], *args["out_shardings"])
    if any(_mlir.contains_unconstrained(s) for s in shardings
           if not isinstance(s, _sharding_impls.UnspecifiedValue)):
        return "unconstrained shardings"
    return None


# One lock per lowering: threads that miss on one call together compile it once, as in JAX.
_compile_locks: weakref.WeakKeyDictionary[Any, threading.Lock] = weakref.WeakKeyDictionary()
_compile_locks_lock = threading.Lock()


def _compile_lowering(computation: Any) -> Any:
    """The MeshExecutable of `computation`, compiled by fastpjit once per lowering (as JAX
    does; JAX's `MeshComputation.compile` then finds it)."""
    with _compile_locks_lock:
        lock = _compile_locks.setdefault(computation, threading.Lock())
    with lock:
        if computation._executable is None:
            computation._executable = _compile_unlocked(computation)
    return computation._executable


def _compile_unlocked(computation: Any) -> Any:
    args = computation.compile_args
    devices = computation._device_list
    in_shardings: Sequence[Any] = tuple(
        _pxla.maybe_concretize_mesh(s, devices) for s in args["in_shardings"])
    out_shardings: Sequence[Any] = tuple(
        _pxla.maybe_concretize_mesh(s, devices) for s in args["out_shardings"])
    options = _compile_options(computation, in_shardings, out_shardings)
    xla_executable = _xla_executable(computation, options)
    in_avals, out_avals = args["global_in_avals"], args["global_out_avals"]
    # Shardings that XLA chose become NamedShardings where a user sharding shows the mesh,
    # as in JAX.
    in_shardings = _pxla.maybe_recover_user_shardings(
        in_shardings,
        _checked_shardings(
            in_shardings,
            _xla_shardings(xla_executable.get_parameter_shardings(), [None] * len(in_avals),
                           devices),
            in_avals, "input"),
        in_avals, in_avals)
    out_shardings = _checked_shardings(
        out_shardings,
        _xla_shardings(xla_executable.get_output_shardings(),
                       _output_memory_kinds(xla_executable, len(out_avals)), devices),
        out_avals, "output")
    xla_in_layouts, xla_out_layouts = _pxla._get_layouts_from_executable(
        xla_executable, args["in_layouts"], args["out_layouts"], 0, in_avals, out_avals)
    out_shardings = _pxla.maybe_recover_user_shardings(
        in_shardings, out_shardings, in_avals, out_avals, args["intermediate_shardings"],
        args["context_mesh"])
    in_shardings = _pxla.finalize_shardings(in_shardings, devices)
    out_shardings = _pxla.finalize_shardings(out_shardings, devices)
    return _pxla.UnloadedMeshExecutable(
        xla_executable=xla_executable, device_list=devices, backend=args["backend"],
        input_avals=in_avals, input_shardings=in_shardings, output_avals=out_avals,
        output_shardings=out_shardings, committed=args["committed"], name=computation._name,
        unordered_effects=[], ordered_effects=[], keepalive=args["keepalive"],
        host_callbacks=[], kept_var_idx=args["kept_var_idx"], mut=None,
        xla_in_layouts=xla_in_layouts,
        dispatch_in_layouts=_pxla.get_dispatch_layouts(xla_in_layouts, in_shardings,
                                                       in_avals),
        xla_out_layouts=xla_out_layouts, all_args_info=args["all_args_info"],
        pgle_profiler=None).load()


# XLA's executables by lowered module and compile options. Two signatures whose lowering JAX
# serves from its cache (the same module: equivalent shardings, say) share one compile, as
# they do in JAX (`pxla._cached_compilation`). The module is held weakly, as JAX holds it.
_xla_executables: weakref.WeakKeyDictionary[Any, dict[bytes, Any]] = weakref.WeakKeyDictionary()
_xla_executables_lock = threading.Lock()


def _xla_executable(computation: Any, options: Any) -> Any:
    module, key = computation._hlo, options.SerializeAsString()
    with _xla_executables_lock:
        found = _xla_executables.get(module, {}).get(key)
    if found is not None:
        return found
    devices = computation._device_list
    with _dispatch.log_elapsed_time(
            "Finished XLA compilation of {fun_name} in {elapsed_time:.9f} sec",
            fun_name=computation._name, event=_dispatch.BACKEND_COMPILE_EVENT):
        executable = _compiler.compile_or_get_cached(
            computation.compile_args["backend"], module, _device_array(devices), options, [],
            devices)
    with _xla_executables_lock:
        _xla_executables.setdefault(module, {})[key] = executable
    return executable


def _device_array(devices: Any) -> np.ndarray:
    array = np.empty(len(devices), dtype=object)
    array[:] = list(devices)
    return array


def _compile_options(computation: Any, in_shardings: Sequence[Any],
                     out_shardings: Sequence[Any]) -> Any:
    """One replica and one partition per device, in the lowering's device order; XLA may
    choose the shardings of the inputs and outputs that the user left unspecified. The other
    options (XLA flags, JAX's compiler options) are read from JAX's configuration."""
    args = computation.compile_args
    devices = _device_array(computation._device_list)
    options = _compiler.get_compile_options(
        num_replicas=1, num_partitions=devices.size,
        device_assignment=devices.reshape((1, devices.size)),
        env_options_overrides=dict(computation._compiler_options_kvs),
        detailed_logging=_compiler.use_detailed_logging(computation._hlo),
        backend=args["backend"])
    options.parameter_is_tupled_arguments = args["tuple_args"]
    build = options.executable_build_options
    unspecified = _sharding_impls.UnspecifiedValue
    build.allow_spmd_sharding_propagation_to_parameters = [
        isinstance(s, unspecified) for s in in_shardings]
    build.allow_spmd_sharding_propagation_to_output = [
        isinstance(s, unspecified) for s in out_shardings]
    return options


def _output_memory_kinds(executable: Any, count: int) -> list[str | None]:
    try:
        kinds = list(executable.get_output_memory_kinds()[0])
    except Exception:  # platforms without memory kinds
        return [None] * count
    if len(kinds) != count:
        raise AssertionError(f"XLA gave {len(kinds)} memory kinds for {count} outputs")
    return kinds


def _xla_shardings(op_shardings: Any, memory_kinds: list[str | None],
                   devices: Any) -> list[Any] | None:
    """XLA's shardings of an executable's inputs or outputs (in the given memory kinds), read
    by fastpjit's HLO sharding parser; None where XLA reports none."""
    from fastpjit.sharding import parse_hlo_sharding

    count = len(memory_kinds)
    if len(devices) == 1:
        # With one device the SPMD partitioner does not run, and sets no shardings.
        return [GSPMDSharding.get_replicated(devices, memory_kind=kind) for kind in memory_kinds]
    if not op_shardings:
        return None
    texts = [str(xc.HloSharding.from_proto(o)) for o in op_shardings]
    if count == 0:
        return []
    if len(texts) == 1 and count > 1:
        # Outputs that all share one sharding may carry it once, on the tuple.
        texts = texts * count
    if len(texts) != count:
        raise AssertionError(f"XLA gave {len(texts)} shardings for {count} values")
    shardings = [parse_hlo_sharding(text, devices) for text in texts]
    return [s if kind is None else s.with_memory_kind(kind)
            for s, kind in zip(shardings, memory_kinds, strict=True)]


def _checked_shardings(shardings: Sequence[Any], xla: list[Any] | None,
                       avals: Sequence[Any], what: str) -> list[Any]:
    """The user's shardings where given, each checked against XLA's by where they place data
    (index maps, and the partial sums of unreduced shardings), and XLA's where not."""
    from fastpjit.sharding import device_placement_map

    if xla is None:
        return list(shardings)
    out = []
    for given, chosen, aval in zip(shardings, xla, avals, strict=True):
        if isinstance(given, _sharding_impls.UnspecifiedValue):
            out.append(chosen)
            continue
        if (aval.size != 0 and not chosen._to_xla_hlo_sharding(aval.ndim).is_manual()
                and (device_placement_map(chosen, aval.shape)
                     != device_placement_map(given, aval.shape)
                     or (what == "output" and chosen.memory_kind != given.memory_kind))):
            raise AssertionError(
                f"Unexpected XLA sharding override: (XLA) {chosen} != {given} (User {what})")
        out.append(given)
    return out


def _fast_path(fast: Any, donated: Sequence[bool]) -> Any:
    """fastpjit's `FastPath` from JAX's fast-path data, or None without a fast path."""
    if fast is None or any(layout is not None for layout in fast.in_device_local_layouts):
        return None
    handlers = [xc.array_result_handler(aval, sharding, committed=committed, _skip_checks=True)
                for aval, sharding, committed
                in zip(fast.out_avals, fast.out_shardings, fast.out_committed, strict=True)]
    return _native.FastPath(
        executable=fast.xla_executable, out_treedef=fast.out_pytree_def, out_handlers=handlers,
        in_shardings=list(fast.in_shardings), kept=[bool(k) for k in fast.kept_var_bitvec],
        const_args=list(fast.const_args), donated=[bool(d) for d in donated])


def aot_cache_miss(compiled: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The cache miss of an ahead-of-time compiled function, as JAX's C++ dispatcher runs it:
    JAX checks and runs the call; the `CacheMiss` is as `jit_cache_miss` gives it."""
    executable, params = compiled._executable, compiled._params
    call = getattr(executable, "unsafe_call", None)
    fast_path = (isinstance(call, _pxla.ExecuteReplicated) and not call.has_unordered_effects
                 and not call.has_host_callbacks)
    if not fast_path:
        return _native.CacheMiss(compiled(*args, **kwargs), None, compiles=0,
                                 jax_reason="the executable has effects or callbacks")
    params = params._replace(const_args=executable.shard_const_args(params.const_args))
    outs, out_flat, args_flat = _stages.Compiled.call(params, *args, **kwargs)
    out_flat, out_tree = _pxla.reflatten_outputs_for_dispatch(params.out_tree, out_flat)
    if params.is_high or executable._mut or not all(isinstance(x, xc.ArrayImpl) for x in out_flat):
        return _native.CacheMiss(outs, None, compiles=0,
                                 jax_reason="mutable state, or outputs that are not arrays")
    in_shardings = [
        _sharding_impls.physical_sharding(a, s)
        if a is not _core.abstract_token and _dtypes.issubdtype(a.dtype, _dtypes.extended)
        else s
        for s, a in zip(executable._in_shardings, executable.in_avals, strict=True)]
    kept = [i in executable._kept_var_idx for i in range(len(params.const_args) + len(args_flat))]
    fast = _pxla.MeshExecutableFastpathData(
        executable.xla_executable, out_tree, in_shardings, executable._out_shardings,
        [o.aval for o in out_flat], [o._committed for o in out_flat], kept,
        executable._dispatch_in_layouts, params.const_args)
    donated = [info.donated for info in _tree_util.tree_leaves(compiled.args_info)]
    fast_path, reason = _fast_path_and_reason(fast, donated, None)
    return _native.CacheMiss(outs, fast_path, compiles=0, jax_reason=reason)


# JAX's own jit and pmap, which users may replace with fastpjit's (`fastpjit.install()`):
# fastpjit calls these, never the public names.
jax_jit = _api.jit
jax_pmap = _pmap_lib.pmap


def function_name(fun: Any) -> str:
    """How fastpjit.stats() names a function: its qualified name, as JAX's logs name it."""
    return _util.fun_qual_name(fun)


def legacy_pjit(fun: Any, **options: Any) -> Any:
    """The deprecated jax.experimental.pjit.pjit, which still honours `with mesh:`."""
    return _pjit.pjit(fun, **options)


def in_legacy_mesh_context() -> bool:
    """Whether an old-style `with mesh:` block is active on this thread."""
    return not _mesh.thread_resources.env.physical_mesh.empty


def pmap_cache_miss(pmapped: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The cache miss of a jax.pmap function: JAX's pmap resolves its parameters and the jit
    over shard_map that it calls, whose miss is `jit_cache_miss`'s. Across processes, the
    call's host-local arrays become global arrays first and its outputs host-local ones after;
    the fast path then says how each argument and output is converted."""
    infer_params = _closure_variable(pmapped, "infer_params")
    local_flat = _pmap_dynamic_leaves(infer_params, args, kwargs)
    cached, jitted, args_flat, _, _, process_count, trace_state_clean = infer_params(
        *args, **kwargs)
    if not trace_state_clean:
        return _native.CacheMiss(pmapped(*args, **kwargs), None, compiles=0,
                                 jax_reason="under a JAX trace")
    miss = jit_cache_miss(jitted, tuple(args_flat), {})
    if process_count == 1:
        return miss
    outputs = _pmap_lib.global_array_to_host_local_array(miss.outputs, cached, True)
    fast_path, reason = _across_processes(miss, cached, local_flat)
    return _native.CacheMiss(outputs, fast_path, compiles=miss.compiles,
                             jax_reason=reason or miss.jax_reason)


def _pmap_dynamic_leaves(infer_params: Any, args: tuple[Any, ...],
                         kwargs: dict[str, Any]) -> list[Any]:
    """A pmap call's flat dynamic arguments as the caller passed them (host-local ones)."""
    statics = set(_closure_variable(infer_params, "static_broadcasted_tuple"))
    dynamic = tuple(a for i, a in enumerate(args) if i not in statics)
    return _tree_util.tree_leaves((dynamic, kwargs))


def _across_processes(miss: Any, cached: Any, local_flat: list[Any]) -> tuple[Any, str | None]:
    """The fast path of a pmap across processes: its own, with how each host-local argument
    becomes a global array (its buffers viewed as this process's part of it, or placed there
    when it is a host value) and each global output a host-local array. None, with why, where
    JAX's conversion would have to move an argument."""
    fast = miss.fast_path
    if fast is None:
        return None, None
    in_global = []
    shardings = zip(local_flat, cached.in_local_shardings, cached.in_global_shardings,
                    strict=True)
    for arg, local_sharding, global_sharding in shardings:
        if type(arg) is ArrayImpl:
            if not (arg.is_fully_addressable and _pmap_lib._is_sharding_equivalent(
                    arg.sharding, local_sharding, arg.ndim)):
                return None, ("a pmap across processes got an array off its local sharding, "
                              "which JAX moves")
            shape, dtype = arg.shape, arg.dtype
        elif isinstance(arg, np.ndarray | np.generic | bool | int | float | complex):
            value = np.asarray(arg)
            shape, dtype = value.shape, canonical_dtype(value.dtype)
        else:
            return None, "a pmap across processes got an argument that JAX converts"
        in_global.append((_pmap_lib._local_to_global_aval(shape, dtype, global_sharding),
                          global_sharding))
    out_flat, out_tree = _tree_util.tree_flatten(miss.outputs)
    local_shardings, global_shardings = _pmap_lib._get_out_shardings(
        out_tree, cached.out_specs, cached.out_local_shardings_thunk)
    out_local: list[tuple[Any, Any] | None] = []
    for out, local_sharding, global_sharding in zip(out_flat, local_shardings,
                                                    global_shardings, strict=True):
        if type(out) is not ArrayImpl or out.is_fully_addressable:
            out_local.append(None)
            continue
        if not _pmap_lib._is_sharding_equivalent(out.sharding, global_sharding, out.ndim):
            return None, "a pmap across processes has an output that JAX moves"
        out_local.append((_pmap_lib._global_to_local_aval(out.shape, out.dtype, global_sharding),
                          local_sharding))
    fields = ("executable", "out_treedef", "out_handlers", "in_shardings", "kept", "const_args",
              "donated")
    return _native.FastPath(**{f: getattr(fast, f) for f in fields}, in_global=in_global,
                            out_local=out_local), None


def _closure_variable(function: Any, name: str) -> Any:
    """A variable that `function` closes over; jax.pmap keeps its parameter inference so."""
    code = function.__code__
    if name not in code.co_freevars:
        raise RuntimeError(f"{function!r} no longer closes over {name!r}; update fastpjit._jax")
    return function.__closure__[code.co_freevars.index(name)].cell_contents


def tracing() -> bool:
    """Whether a JAX transformation is tracing on this thread."""
    return not _core.trace_state_clean()


def shard_arg(x: Any, sharding: Any) -> Any:
    """Places one argument on `sharding` the way jit's dispatch does for a mismatched input."""
    return _pxla.cc_shard_arg(x, sharding, None)


# For benchmarks and tests


def host_view(array: Any) -> np.ndarray:
    """What fastpjit's device_get returns for a fully replicated array: a host view of its
    first shard, by the method that `ARRAY_TO_HOST` names."""
    return getattr(array, ARRAY_TO_HOST)()[0]


_INDEX_MAP_CACHES = (
    _sharding.common_devices_indices_map,
    _sharding._addressable_devices_indices_map,
    _sharding._common_shard_shape,
    _named_sharding.named_sharding_to_xla_hlo_sharding,
    _sharding_impls.device_replica_id_map,
)


def clear_index_map_caches() -> None:
    """Empties JAX's memo caches on the devices_indices_map path, so its next call runs cold."""
    for cache in _INDEX_MAP_CACHES:
        cache.cache_clear()


def jax_cache_counts() -> tuple[int, int]:
    """(hits, misses) so far, summed over every cache that JAX registers."""
    infos = [cache.cache_info() for cache in list(_util._caches) if hasattr(cache, "cache_info")]
    return sum(info.hits for info in infos), sum(info.misses for info in infos)


def jax_indices_from_named(
    sharding: Any, shape: tuple[int, ...], num_devices: int
) -> tuple[tuple[slice, ...], ...]:
    """JAX's own per-position indices of a NamedSharding, abstract meshes included."""
    hlo = _named_sharding.named_sharding_to_xla_hlo_sharding(sharding, len(shape))
    return _op_shardings.op_sharding_to_indices(hlo, shape, num_devices)


def compiled_parts(compiled: Any) -> tuple[Any, list[Any], Any]:
    """A Compiled's LoadedExecutable, result handlers and output treedef; flat inputs only."""
    executable = compiled._executable
    kept_all = executable._kept_var_idx == set(range(compiled.in_tree.num_leaves))
    if compiled._params.const_args or not kept_all:
        raise ValueError("the executable's inputs are not the call's flat arguments")
    handlers = list(executable.unsafe_call.out_handler.handlers)
    return executable.xla_executable, handlers, compiled.out_tree


def hlo_module_proto(text: str) -> bytes:
    """The serialized HloModuleProto of HLO text, as a frontend that writes protos gives it."""
    return xc.hlo.hlo_module_from_text(text).as_serialized_hlo_module_proto()


def backend_compiles() -> int:
    """How many backend compiles JAX has run in this process so far (loads from the persistent
    compilation cache left out)."""
    return _backend_compiles


# --- The wrapped functions as JAX's: traceback filtering and jax.clear_caches() -------------
# An error raised in the user's function unwinds through fastpjit's Python frames and JAX's;
# as JAX does for its own, every fastpjit file is left out of the traceback below an api
# boundary (a miss, lower, ...), so that the user sees the own code that raised.

api_boundary = _traceback_util.api_boundary
_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
_traceback_util.register_exclusion(_PACKAGE_DIR)
_source_info_util.register_exclusion(_PACKAGE_DIR)


class _FunctionCaches:
    """Every live fastpjit function's executables, XLA's executables by module and the
    dispatcher's memo of avals and shardings, as one cache in JAX's registry, which
    jax.clear_caches() clears. The functions are held weakly: registering one keeps nothing
    alive."""

    def __init__(self) -> None:
        self._functions: weakref.WeakSet[Any] = weakref.WeakSet()
        self._lock = threading.Lock()

    def add(self, function: Any) -> None:
        with self._lock:
            self._functions.add(function)

    def cache_clear(self) -> None:
        with self._lock:
            functions = list(self._functions)
        for function in functions:
            function._clear_cache()
        with _xla_executables_lock:
            _xla_executables.clear()
        _native.clear_dispatch_memo()


_function_caches = _FunctionCaches()
_util.register_cache(_function_caches, "fastpjit's jit and pmap functions")


def clear_with_jax_caches(function: Any) -> None:
    """Has jax.clear_caches() clear this fastpjit function's executables too."""
    _function_caches.add(function)


# --- fastpjit.launch: the cluster environment of the processes that it starts ---------------
# jax.distributed.initialize() with no arguments asks JAX's cluster environments (SLURM, Open
# MPI, Kubernetes, ...) for the coordinator address, the process count and this process's id.
# The launcher passes them in environment variables (fastpjit._launched); this environment
# reads them. JAX registers each ClusterEnv subclass as it is defined and takes the first one
# present in that order: this one is moved first, so that a launch inside, say, a SLURM
# allocation is not taken for the allocation's own job.


class LaunchedCluster(_clusters.ClusterEnv):
    """The processes of one `python -m fastpjit.launch` run, all on this machine."""

    name = "fastpjit"

    @classmethod
    def is_env_present(cls) -> bool:
        return _launched.launched()

    @classmethod
    def get_coordinator_address(cls, timeout_secs: int | None,
                                override_coordinator_port: str | None) -> str:
        return os.environ[_launched.COORDINATOR_ADDRESS]

    @classmethod
    def get_process_count(cls) -> int:
        return int(os.environ[_launched.NUM_PROCESSES])

    @classmethod
    def get_process_id(cls) -> int:
        return int(os.environ[_launched.PROCESS_ID])

    @classmethod
    def get_local_process_id(cls) -> int | None:
        # Every process is on this machine. JAX then shows each one GPU, the one of its index,
        # unless JAX_LOCAL_DEVICE_IDS (set by --local-devices) names others; as it does under
        # SLURM and Open MPI. The CPU ignores it.
        return cls.get_process_id()


_clusters.ClusterEnv._cluster_types.remove(LaunchedCluster)
_clusters.ClusterEnv._cluster_types.insert(0, LaunchedCluster)


# ---------------------------------------------------------------------------------------------
# compile_hlo: modules that other frontends wrote (HLO text, StableHLO, their serialized forms),
# read into JAX's MLIR, compiled through jaxlib's PjRt client and run by `execute_sharded`.
# Everything here is jaxlib's private surface; `fastpjit.hlo` holds the user-facing checks.

# The first bytes of MLIR bytecode, StableHLO portable artifacts included.
_MLIR_BYTECODE_MAGIC = b"ML\xefR"
# PjRt falls back to GSPMD only where it sees GSPMD shardings on the results or in `Sharding`
# custom calls; it keeps Shardy on for a module whose only shardings sit on its parameters, and
# Shardy ignores `mhlo.sharding` there: the module would compile replicated, silently.
# fastpjit chooses the partitioner from what the module is written for instead.
_SDY_MESHES_ATTR = "xla.sdy.meshes"
# Entry layouts that the HLO header may pin; jax.Arrays are in the default layout, so the
# executable must take that one.
_ENTRY_LAYOUT_ATTRS = (
    "mhlo.xla_entry_computation_parameter_layouts",
    "mhlo.xla_entry_computation_parameter_tiles",
    "mhlo.xla_entry_computation_result_layout",
    "mhlo.xla_entry_computation_result_tiles",
)
_HLO_HEADER = re.compile(r"\s*HloModule\s[^\n]*")


@dataclasses.dataclass
class HloProgram:
    """A module read into JAX's MLIR, and what compile_hlo must know of it before compiling."""

    module: Any  # jax's ir.Module, which keeps its context alive
    name: str
    in_avals: tuple[Any, ...]
    out_avals: tuple[Any, ...]
    # Whether the entry returns a tuple (every PyTorch/XLA module does), not one array.
    tuple_result: bool
    # The partitions the module names (its header, meshes or shardings); None if it names none.
    num_partitions: int | None
    # Whether the module is written for Shardy (sdy meshes), else for GSPMD (HLO shardings).
    shardy: bool
    # Whether each result has a sharding written in the module.
    result_sharded: list[bool]


def read_hlo_module(module: str | bytes) -> HloProgram:
    """Reads HLO text, StableHLO/MLIR text, MLIR bytecode (a StableHLO portable artifact
    included) or a serialized HloModuleProto; ValueError with the parser's message where it is
    malformed, NotImplementedError where fastpjit cannot run it."""
    with _mlir.make_ir_context():
        header = _HLO_HEADER.match(module) if isinstance(module, str) else None
        if isinstance(module, str):
            # What XLA's parsers would abort or overflow their stack on, refused first.
            _native.check_module_text(module, header is None)
        if header is not None:
            assert isinstance(module, str)
            parsed, tuple_result = _from_hlo_proto(_parse_hlo_text(module))
        elif isinstance(module, str) or module[:4] == _MLIR_BYTECODE_MAGIC:
            parsed, tuple_result = _parse_mlir(module), None
        else:
            parsed, tuple_result = _from_hlo_proto(_check_hlo_proto(module))
        return _program(parsed, header.group(0) if header else None, tuple_result)


def _parse_hlo_text(text: str) -> bytes:
    try:
        return xc.hlo.hlo_module_from_text(text).as_serialized_hlo_module_proto()
    except Exception as err:  # jaxlib's runtime error, with XLA's parser message and line
        raise ValueError(f"malformed HLO text: {err}") from None


def _check_hlo_proto(data: bytes) -> bytes:
    try:
        xc.hlo.HloModule.from_serialized_hlo_module_proto(data)
    except Exception as err:
        raise ValueError("bytes that are neither MLIR bytecode nor a serialized HloModuleProto: "
                         f"{err}") from None
    return data


def _from_hlo_proto(proto: bytes) -> tuple[Any, bool]:
    """The module as StableHLO, and whether its entry returns a tuple (which the conversion
    flattens into several results)."""
    shape = xc.XlaComputation(proto).program_shape()
    for i, parameter in enumerate(shape.parameter_shapes()):
        if not parameter.is_array():
            raise NotImplementedError(
                f"the module's parameter {i} has shape {parameter}; compile_hlo takes and "
                "returns arrays only (no tuples or tokens)")
    return ir.Module.parse(_jaxlib.mlir.hlo_to_stablehlo(proto)), shape.result_shape().is_tuple()


def _parse_mlir(module: str | bytes) -> Any:
    try:
        if isinstance(module, bytes):
            # Reads VHLO (portable artifacts) into StableHLO, and plain bytecode as it is.
            return _jaxlib.mlir.deserialize_portable_artifact(module, context=ir.Context.current)
        return ir.Module.parse(module)
    except Exception as err:  # MLIRError with the diagnostics, or jaxlib's for bytecode
        what = "MLIR module" if isinstance(module, bytes) else (
            "MLIR module (text that does not start with `HloModule` is read as MLIR)")
        raise ValueError(f"malformed {what}: {err}") from None


def _program(module: Any, header: str | None, tuple_result: bool | None) -> HloProgram:
    attributes = module.operation.attributes
    replicas = _int_attr(attributes, "mhlo.num_replicas") or _header_int(header, "replica_count")
    if replicas is not None and replicas > 1:
        raise NotImplementedError(
            f"the module runs {replicas} replicas; compile_hlo runs one replica with one "
            "partition per device (write the replicas as a partitioned dimension)")
    for name in _ENTRY_LAYOUT_ATTRS:
        if name in attributes:
            del attributes[name]
    main = _entry_function(module)
    function_type = main.attributes["function_type"].value
    in_avals = tuple(_aval(t, f"parameter {i}") for i, t in enumerate(function_type.inputs))
    out_avals = tuple(_aval(t, f"result {i}") for i, t in enumerate(function_type.results))
    shardy = _has_sdy_meshes(module)
    if shardy:
        _keep_shardy_on(main)
    partitions = (_int_attr(attributes, "mhlo.num_partitions")
                  or _header_int(header, "num_partitions") or _named_partitions(module))
    if "sym_name" not in attributes:  # JAX's compile names its logs and cache entries by it
        attributes["sym_name"] = ir.StringAttr.get("main")
    return HloProgram(
        module=module, name=attributes["sym_name"].value,
        in_avals=in_avals, out_avals=out_avals,
        tuple_result=len(out_avals) != 1 if tuple_result is None else tuple_result,
        num_partitions=partitions, shardy=shardy, result_sharded=_result_sharded(main))


def _entry_function(module: Any) -> Any:
    for op in module.body.operations:
        if (op.operation.name == "func.func" and "sym_name" in op.attributes
                and op.attributes["sym_name"].value == "main"):
            return op.operation
    raise ValueError("the module has no entry function: HLO needs an ENTRY computation, "
                     "StableHLO a func.func @main")


def _int_attr(attributes: Any, name: str) -> int | None:
    return attributes[name].value if name in attributes else None


def _header_int(header: str | None, key: str) -> int | None:
    found = re.search(rf"\b{key}=(\d+)", header) if header else None
    return int(found.group(1)) if found else None


# JAX's element types by their MLIR spelling (f32, bf16, complex<f32>, ...).
_IR_TYPE_DTYPES: dict[str, np.dtype] = {}


def _aval(type_: Any, what: str) -> Any:
    if not _IR_TYPE_DTYPES:
        _IR_TYPE_DTYPES.update({str(make()): np.dtype(d)
                                for d, make in _mlir._dtype_to_ir_type.items()})
    if not isinstance(type_, ir.RankedTensorType):
        raise NotImplementedError(
            f"the module's {what} has type {type_}; compile_hlo takes and returns arrays only "
            "(no tuples or tokens)")
    if not type_.has_static_shape:
        raise NotImplementedError(f"the module's {what} has a dynamic shape: {type_}")
    dtype = _IR_TYPE_DTYPES.get(str(type_.element_type))
    if dtype is None:
        raise NotImplementedError(f"the module's {what} has an element type JAX lacks: {type_}")
    return _core.ShapedArray(tuple(type_.shape), dtype)


def _has_sdy_meshes(module: Any) -> bool:
    if any(op.operation.name == "sdy.mesh" for op in module.body.operations):
        return True
    attributes = module.operation.attributes
    return ("mhlo.frontend_attributes" in attributes
            and _SDY_MESHES_ATTR in attributes["mhlo.frontend_attributes"])


def _keep_shardy_on(main: Any) -> None:
    """A module that JAX printed as HLO carries its Shardy shardings as frontend attributes
    and mirrors them as HLO shardings on the results; PjRt takes those for a GSPMD module and
    turns Shardy off, which cannot partition the `xla.sdy` custom calls. Shardy reads the
    frontend attributes, so the mirrors go."""
    if "res_attrs" in main.attributes:
        main.attributes["res_attrs"] = ir.ArrayAttr.get([
            ir.DictAttr.get({a.name: a.attr for a in d if a.name != "mhlo.sharding"})
            for d in main.attributes["res_attrs"]])


def _result_sharded(main: Any) -> list[bool]:
    """Whether the module writes a sharding for each result (Shardy's only, in a module for
    Shardy: `_keep_shardy_on` has dropped the mirrors)."""
    count = len(main.attributes["function_type"].value.results)
    if "res_attrs" not in main.attributes:
        return [False] * count
    return [any(a.name in ("mhlo.sharding", "sdy.sharding") for a in d)
            for d in main.attributes["res_attrs"]]


# The attributes where a module names devices: HLO shardings, alone or on function arguments
# and results, Shardy meshes, and meshes that JAX's HLO printer keeps as frontend attributes.
_DEVICE_NAMING_ATTRS = frozenset(
    ("mhlo.sharding", "arg_attrs", "res_attrs", "mesh", "mhlo.frontend_attributes"))


def _named_partitions(module: Any) -> int | None:
    """How many partitions the module's shardings and meshes name, if any."""
    found: list[tuple[str, Any]] = []

    def visit(op: Any) -> Any:
        # An exception raised in here would reach the caller as a RuntimeError.
        attributes = op.attributes
        found.extend((name, attributes[name]) for name in attributes
                     if name in _DEVICE_NAMING_ATTRS)
        return ir.WalkResult.ADVANCE

    module.operation.walk(visit)
    return max((n for name, attr in found for n in _attr_partitions(name, attr)),
               default=0) or None


def _attr_partitions(name: str, attr: Any) -> list[int]:
    if name == "mhlo.sharding" and isinstance(attr, ir.StringAttr):
        try:
            sharding = xc.HloSharding.from_string(attr.value)
        except Exception as err:
            raise ValueError(f"malformed HLO sharding {attr.value!r}: {err}") from None
        return [_sharding_partitions(sharding)]
    if name in ("arg_attrs", "res_attrs") and isinstance(attr, ir.ArrayAttr):
        return [n for d in attr for a in d  # type: ignore[attr-defined]
                for n in _attr_partitions(a.name, a.attr)]
    if name == "mesh" and _sdy.MeshAttr.isinstance(attr):
        return [_mesh_partitions(_sdy.MeshAttr(attr))]
    if name == "mhlo.frontend_attributes" and _SDY_MESHES_ATTR in attr:
        meshes = ir.Attribute.parse(attr[_SDY_MESHES_ATTR].value)
        return [_mesh_partitions(_sdy.MeshAttr(m.attr))
                for m in meshes]  # type: ignore[attr-defined]
    return []


def _sharding_partitions(sharding: Any) -> int:
    elements = sharding.tuple_elements()
    if elements:
        return max(_sharding_partitions(e) for e in elements)
    if sharding.is_replicated() or sharding.is_manual() or sharding.is_unknown():
        return 0
    return max(sharding.tile_assignment_devices()) + 1


def _mesh_partitions(mesh: Any) -> int:
    size = math.prod(_sdy.MeshAxisAttr(a).size for a in mesh.axes)
    return max([size, *(d + 1 for d in mesh.device_ids)])


def compile_hlo_program(program: HloProgram, devices: Sequence[Any],
                        donated: Sequence[bool]) -> Any:
    """Compiles `program` with one replica and a partition per device of `devices` (device id
    i in its shardings is devices[i]): the parameters keep the shardings written in the module
    and XLA propagates none into them; it chooses those of the results left open."""
    main = _entry_function(program.module)
    if any(donated):
        with program.module.context:
            _mark_donated(main, donated)
    count = len(devices)
    device_array = _device_array(devices)
    backend = devices[0].client
    options = _compiler.get_compile_options(
        num_replicas=1, num_partitions=count,
        device_assignment=device_array.reshape((1, count)), backend=backend)
    build = options.executable_build_options
    build.use_shardy_partitioner = program.shardy
    build.allow_spmd_sharding_propagation_to_parameters = [False] * len(program.in_avals)
    build.allow_spmd_sharding_propagation_to_output = [
        not sharded for sharded in program.result_sharded]
    compiles_before = _thread_compiles()
    with _dispatch.log_elapsed_time(
            "Finished XLA compilation of {fun_name} in {elapsed_time:.9f} sec",
            fun_name=program.name, event=_dispatch.BACKEND_COMPILE_EVENT):
        try:
            # JAX's persistent compilation cache first, and its IR dumps, as for a jit.
            executable = _compiler.compile_or_get_cached(
                backend, program.module, device_array, options, [],
                xc.DeviceList(tuple(devices)))
        except _jaxlib.JaxRuntimeError as err:
            if "INVALID_ARGUMENT" in str(err):
                raise ValueError(f"XLA rejects the module: {err}") from None
            raise
    # The event above counts the compile when the block ends (not a load from JAX's cache).
    _native.count_compiles(_thread_compiles() - compiles_before)
    return executable


def _mark_donated(main: Any, donated: Sequence[bool]) -> None:
    """Marks parameters as buffer donors: XLA may reuse their buffers for the results."""
    old = (list(ir.ArrayAttr(main.attributes["arg_attrs"])) if "arg_attrs" in main.attributes
           else [ir.DictAttr.get({})] * len(donated))
    main.attributes["arg_attrs"] = ir.ArrayAttr.get([
        ir.DictAttr.get({**{a.name: a.attr
                            for a in ir.DictAttr(d)},  # type: ignore[attr-defined]
                         "jax.buffer_donor": ir.BoolAttr.get(True)}) if give
        else d for d, give in zip(old, donated, strict=True)])


def hlo_shardings(executable: Any, devices: Sequence[Any], num_in: int,
                  num_out: int) -> tuple[list[Any], list[Any]]:
    """The shardings that the compiled executable takes and gives over `devices`, read by
    fastpjit's HLO sharding parser (replicated where XLA reports none), as NamedShardings
    where they can be."""
    devices = tuple(devices)
    ins = _xla_shardings(executable.get_parameter_shardings(), [None] * num_in, devices)
    outs = _xla_shardings(executable.get_output_shardings(),
                          _output_memory_kinds(executable, num_out), devices)
    replicated = GSPMDSharding.get_replicated(devices)
    return ([_as_named(s, devices) for s in ins or [replicated] * num_in],
            [_as_named(s, devices) for s in outs or [replicated] * num_out])


def _as_named(sharding: GSPMDSharding, devices: tuple[Any, ...]) -> Any:
    """The NamedSharding that places shards as a replicated or tiled HLO sharding does: a mesh
    shaped like its tiles over `devices` in order, and the tile order as logical device ids
    (as JAX itself lowers a permuted device order). jax.jit refuses GSPMDShardings under
    Shardy, so arrays on these can go on into JAX. Other shardings stay as they are."""
    hlo = sharding._hlo_sharding
    count = len(devices)
    if hlo.is_replicated():
        dims, partitioned, ids = [count], 0, None
    else:
        groups = hlo.subgroup_types()
        replicated_groups = hlo.replicate_on_last_tile_dim() or (
            groups == [xc.OpSharding.Type.REPLICATED])
        if not hlo.is_tiled() or (groups and not replicated_groups):
            return sharding
        dims = hlo.tile_assignment_dimensions()
        partitioned = len(dims) - (1 if replicated_groups else 0)
        ids = tuple(hlo.tile_assignment_devices())
        if math.prod(dims) != count:
            return sharding
    names = [f"d{i}" for i in range(partitioned)] + ["replicas"] * (len(dims) - partitioned)
    mesh = _mesh.Mesh(np.array(devices, dtype=object).reshape(dims), tuple(names),
                      axis_types=(_mesh.AxisType.Auto,) * len(dims))
    spec = jax.sharding.PartitionSpec(*(n if d > 1 else None
                                        for n, d in zip(names[:partitioned], dims, strict=False)))
    return _named_sharding.NamedSharding(
        mesh, spec, memory_kind=sharding.memory_kind,
        _logical_device_ids=None if ids is None or ids == tuple(range(count)) else ids)


def result_handlers(avals: Sequence[Any], shardings: Sequence[Any]) -> tuple[list[Any],
                                                                              list[Any]]:
    """The avals of the arrays on `shardings` (as device_put gives them), and jaxlib's
    handlers that wrap an executable's output buffers as such committed jax.Arrays."""
    avals = [_dispatch.update_dp_aval(a, s) for a, s in zip(avals, shardings, strict=True)]
    return avals, [xc.array_result_handler(a, s, committed=True, _skip_checks=True)
                   for a, s in zip(avals, shardings, strict=True)]


def execute(executable: Any, inputs: Sequence[Any], handlers: Sequence[Any]) -> list[Any]:
    """Runs `executable` on jax.Arrays already on its input shardings: its outputs."""
    return executable.execute_sharded(list(inputs)).consume_with_handlers(list(handlers))


def buffer_id(array: Any) -> int:
    """Where the first shard of a jax.Array lives: arrays that share it alias each other."""
    return array_single_device_arrays(array)[0].unsafe_buffer_pointer()


def hlo_text(executable: Any) -> str:
    """The partitioned, optimized HLO of a compiled executable."""
    return "\n".join(m.to_string() for m in executable.hlo_modules())
