"""The one module that touches JAX's and jaxlib's private APIs.

A JAX upgrade that moves any of these names should need changes here and nowhere else.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from jax._src import compiler as _compiler
from jax._src import config as _config
from jax._src import core as _core
from jax._src import dispatch as _dispatch
from jax._src import dtypes as _dtypes
from jax._src import mesh as _mesh
from jax._src import named_sharding as _named_sharding
from jax._src import op_shardings as _op_shardings
from jax._src import pjit as _pjit
from jax._src import sharding as _sharding
from jax._src import sharding_impls as _sharding_impls
from jax._src import stages as _stages
from jax._src import tree_util as _tree_util
from jax._src import util as _util
from jax._src.array import ArrayImpl
from jax._src.interpreters import mlir as _mlir
from jax._src.interpreters import pxla as _pxla
from jax._src.lib import _jax as _jaxlib
from jax._src.lib import xla_client as xc
from jax._src.sharding_impls import GSPMDSharding

IndivisibleError = _sharding.IndivisibleError
DuplicateSpecError = _named_sharding.DuplicateSpecError

__all__ = [
    "aot_cache_miss",
    "array_aval",
    "array_committed",
    "ARRAY_HOST_VALUE",
    "array_is_deleted",
    "array_sharding",
    "array_single_device_arrays",
    "ARRAY_TO_HOST",
    "ArrayImpl",
    "backend_compiles",
    "batched_device_put",
    "HOST_BUFFER_COPY",
    "HOST_BUFFER_ZERO_COPY",
    "canonical_dtype",
    "clear_index_map_caches",
    "collect_garbage",
    "compile_lowered",
    "compiled_parts",
    "config_value",
    "consume_with_handlers",
    "copy_to_host_async",
    "device_put_aval",
    "DuplicateSpecError",
    "flatten_for_dispatch",
    "gspmd_sharding",
    "GSPMDSharding",
    "hlo_parts",
    "host_view",
    "in_legacy_mesh_context",
    "IndivisibleError",
    "jax_cache_counts",
    "jax_indices_from_named",
    "jit_cache_miss",
    "jit_key_states",
    "jit_static_args",
    "legacy_pjit",
    "logical_device_ids",
    "pmap_cache_miss",
    "python_scalar_dtype",
    "shard_arg",
    "trace_context",
    "tracing",
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

# What the Rust dispatcher reads on every call: JAX's dispatch flattening, and JAX's jit key,
# which is the trace context plus these states that only the compile sees (set_mesh's concrete
# mesh, say: two meshes of one abstract mesh trace alike). All are C++ objects.
flatten_for_dispatch = _tree_util.dispatch_registry.flatten
trace_context = _config.trace_context
# What the dispatcher reads of every argument, taken from jaxlib's ArrayImpl once and called
# without an attribute lookup: the getters of its aval, sharding and commitment (the public
# `sharding` and `committed` are Python properties over the last two, which would run bytecode
# per argument), and its is_deleted method.
array_aval = vars(ArrayImpl)["aval"].fget
array_sharding = vars(ArrayImpl)["_sharding"].fget
array_committed = vars(ArrayImpl)["_committed"].fget
array_is_deleted = vars(ArrayImpl)["is_deleted"]
consume_with_handlers = _jaxlib.ExecuteResults.consume_with_handlers
# jaxlib releases some Python objects of an execution through a queue that its own C++
# dispatch drains as it goes and JAX drains from a gc callback; `execute_sharded` leaves one
# object there per call, so the Rust dispatcher drains it itself every so many calls.
collect_garbage = _jaxlib.collect_garbage
jit_key_states = (_config.device_context, _config.optimization_level,
                  _config.memory_fitting_level)
# The getter of a config state's value, called directly.
config_value = vars(_jaxlib.config.Config)["value"].fget


def jit_static_args(jitted: Any) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """The static argnums and argnames of a jax.jit function, as JAX resolved them."""
    info = jitted._jit_info
    return tuple(info.static_argnums), tuple(info.static_argnames)


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
        return
    _backend_compiles += 1
    _compiles_on_thread.count = _thread_compiles() + 1


def _note_persistent_cache_hit(event: str, **_: Any) -> None:
    if event == _PERSISTENT_CACHE_HIT_EVENT:
        _compiles_on_thread.loaded = True


def _thread_compiles() -> int:
    return getattr(_compiles_on_thread, "count", 0)


jax.monitoring.register_event_duration_secs_listener(_count_backend_compile)
jax.monitoring.register_event_listener(_note_persistent_cache_hit)


def jit_cache_miss(
    jitted: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[Any, Any, int, str | None]:
    """Runs a call of `jitted` as JAX's C++ dispatcher does on a cache miss, but compiled by
    fastpjit where it can be.

    Returns the outputs; where JAX would take its fast path next time, what fastpjit's
    dispatcher needs to take its own (executable, output treedef, input shardings of the kept
    inputs, output result handlers, kept-input flags over [consts, args], const args), else
    None; how many backend compiles the miss ran; and why JAX, not fastpjit, lowered and
    compiled the call, if it did.
    """
    if _config.disable_jit.value:
        # Under jax.disable_jit(), jax.jit calls the function itself; there is nothing to cache.
        return jitted(*args, **kwargs), None, 0, "jax.disable_jit is on"
    compiles_before = _thread_compiles()
    outs, entry, reason = _jit_miss(jitted, args, kwargs)
    return outs, entry, _thread_compiles() - compiles_before, reason


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
        out_flat = executable.unsafe_call(*const_args, *args_flat)
        outs = _tree_util.tree_unflatten(out_tree, out_flat)
    fast = _pjit._get_fastpath_data(executable, out_tree, args_flat, out_flat, jaxpr.effects,
                                    jaxpr.consts, profiler, const_args)
    return outs, *_entry_and_reason(fast, reason)


def _entry_and_reason(fast: Any, reason: str | None) -> tuple[Any, str | None]:
    entry = _dispatch_entry(fast)
    if entry is None and reason is None:
        reason = "JAX's own dispatch keeps it off its fast path (outputs that are not arrays, "
        reason += "effects or layouts)"
    return entry, reason


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
    in_shardings = tuple(_pxla.maybe_concretize_mesh(s, devices) for s in args["in_shardings"])
    out_shardings = tuple(_pxla.maybe_concretize_mesh(s, devices) for s in args["out_shardings"])
    options = _compile_options(computation, in_shardings, out_shardings)
    with _dispatch.log_elapsed_time(
            "Finished XLA compilation of {fun_name} in {elapsed_time:.9f} sec",
            fun_name=computation._name, event=_dispatch.BACKEND_COMPILE_EVENT):
        xla_executable = _compiler.compile_or_get_cached(
            args["backend"], computation._hlo, _device_array(devices), options, [], devices)
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


def _dispatch_entry(fast: Any) -> tuple[Any, ...] | None:
    """What fastpjit's dispatcher keeps of JAX's fast-path data, or None without a fast path."""
    if fast is None or any(layout is not None for layout in fast.in_device_local_layouts):
        return None
    handlers = [xc.array_result_handler(aval, sharding, committed=committed, _skip_checks=True)
                for aval, sharding, committed
                in zip(fast.out_avals, fast.out_shardings, fast.out_committed, strict=True)]
    return (fast.xla_executable, fast.out_pytree_def, list(fast.in_shardings), handlers,
            [bool(k) for k in fast.kept_var_bitvec], list(fast.const_args))


def aot_cache_miss(
    compiled: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[Any, Any, int, str | None]:
    """The cache miss of an ahead-of-time compiled function, as JAX's C++ dispatcher runs it:
    JAX checks and runs the call; the entry is as `jit_cache_miss` gives it."""
    executable, params = compiled._executable, compiled._params
    call = getattr(executable, "unsafe_call", None)
    fast_path = (isinstance(call, _pxla.ExecuteReplicated) and not call.has_unordered_effects
                 and not call.has_host_callbacks)
    if not fast_path:
        return compiled(*args, **kwargs), None, 0, "the executable has effects or callbacks"
    params = params._replace(const_args=executable.shard_const_args(params.const_args))
    outs, out_flat, args_flat = _stages.Compiled.call(params, *args, **kwargs)
    out_flat, out_tree = _pxla.reflatten_outputs_for_dispatch(params.out_tree, out_flat)
    if params.is_high or executable._mut or not all(isinstance(x, xc.ArrayImpl) for x in out_flat):
        return outs, None, 0, "mutable state, or outputs that are not arrays"
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
    entry, reason = _entry_and_reason(fast, None)
    return outs, entry, 0, reason


def legacy_pjit(fun: Any, **options: Any) -> Any:
    """The deprecated jax.experimental.pjit.pjit, which still honours `with mesh:`."""
    return _pjit.pjit(fun, **options)


def in_legacy_mesh_context() -> bool:
    """Whether an old-style `with mesh:` block is active on this thread."""
    return not _mesh.thread_resources.env.physical_mesh.empty


def pmap_cache_miss(
    pmapped: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[Any, Any, int, str | None]:
    """The cache miss of a jax.pmap function: JAX's pmap resolves its parameters and the jit
    over shard_map that it calls, whose miss is `jit_cache_miss`'s. Multi-process pmaps, which
    convert host-local arrays in Python, run in JAX without an entry."""
    infer_params = _closure_variable(pmapped, "infer_params")
    _, jitted, args_flat, _, _, process_count, trace_state_clean = infer_params(*args, **kwargs)
    if process_count > 1 or not trace_state_clean:
        return pmapped(*args, **kwargs), None, 0, "multi-process, or under a JAX trace"
    return jit_cache_miss(jitted, tuple(args_flat), {})


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


def backend_compiles() -> int:
    """How many backend compiles JAX has run in this process so far (loads from the persistent
    compilation cache left out)."""
    return _backend_compiles
