"""The cache misses of fastpjit's jit, AOT-compiled and pmap functions, run as JAX's C++ dispatcher
runs them (compiled by fastpjit where it can), and the `FastPath` each hands the Rust dispatcher."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from jax._src import api_util as _api_util
from jax._src import config as _config
from jax._src import core as _core
from jax._src import dispatch as _dispatch
from jax._src import dtypes as _dtypes
from jax._src import pjit as _pjit
from jax._src import pmap as _pmap_lib
from jax._src import sharding_impls as _sharding_impls
from jax._src import stages as _stages
from jax._src import tree_util as _tree_util
from jax._src.array import ArrayImpl
from jax._src.interpreters import mlir as _mlir
from jax._src.interpreters import pxla as _pxla
from jax._src.lib import xla_client as xc

from fastpjit import _core as _native
from fastpjit._jax import line as _line
from fastpjit._jax.rust_handles import canonical_dtype
from fastpjit._jax.xla_compile import compile_lowering, thread_compiles


def jit_cache_miss(
    jitted: Any,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    compiler_options: dict[str, Any] | None = None,
) -> _native.CacheMiss:
    """Runs a call of `jitted` as JAX's C++ dispatcher does on a cache miss, but compiled by
    fastpjit where it can be, and returns a `fastpjit._core.CacheMiss`: the outputs; where JAX
    would take its fast path next time, the `FastPath` that fastpjit's dispatcher takes
    instead; how many backend compiles the miss ran; and why JAX, not fastpjit, lowered and
    compiled the call (or runs it), if it did. fastpjit compiles with `compiler_options` (the
    call's signature's) over jitted's own; JAX, which compiles the calls that it runs, with
    jitted's own.
    """
    if _config.disable_jit.value:
        # Under jax.disable_jit(), jax.jit calls the function itself; there is nothing to cache.
        return _native.CacheMiss(
            jitted(*args, **kwargs), None, compiles=0, jax_reason="disable_jit"
        )
    compiles_before = thread_compiles()
    outs, fast, reason = _jit_miss(jitted, args, kwargs, compiler_options)
    return _native.CacheMiss(
        outs, fast, compiles=thread_compiles() - compiles_before, jax_reason=reason
    )


def _jit_miss(
    jitted: Any,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    compiler_options: dict[str, Any] | None,
) -> tuple[Any, Any, str | None]:
    fun, info = jitted._fun, jitted._jit_info
    p, args_flat = _pjit._infer_params(fun, info, args, kwargs)
    compiled, reason = _compile_by_fastpjit(_with_options(p, compiler_options), args_flat)
    if compiled is None:
        outs, out_flat, out_tree, args_flat, jaxpr, executable, profiler, const_args = (
            _pjit._run_python_pjit(p, args_flat, fun, args, kwargs)
        )
    else:
        executable, const_args = compiled
        jaxpr, out_tree, profiler = p.params["jaxpr"], p.out_tree, None
        out_flat = _run_checked(executable, const_args, args_flat, fun, args, kwargs)
        outs = _tree_util.tree_unflatten(out_tree, out_flat)
    fast = _pjit._get_fastpath_data(
        executable, out_tree, args_flat, out_flat, jaxpr.effects, jaxpr.consts, profiler, const_args
    )
    return outs, *_fast_path_and_reason(fast, p.params["donated_invars"], reason)


def _with_options(p: Any, compiler_options: dict[str, Any] | None) -> Any:
    """JAX's parameters of a call (`PjitParams`) with `compiler_options` over its own."""
    if not compiler_options:
        return p
    merged = {**dict(p.params["compiler_options_kvs"]), **compiler_options}
    return p._replace(params={**p.params, "compiler_options_kvs": tuple(merged.items())})


def _run_checked(
    executable: Any,
    const_args: Sequence[Any],
    args_flat: Sequence[Any],
    fun: Any,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> Any:
    """Runs a freshly compiled executable as JAX's own miss does: with jax_debug_nans or
    jax_debug_infs on, an invalid output reruns the function without jit to find where it
    arises, and raises JAX's FloatingPointError."""
    try:
        return executable.unsafe_call(
            *const_args, *_placed_host_args(executable, const_args, args_flat)
        )
    except _api_util.InternalFloatingPointError as err:
        if getattr(fun, "_apply_primitive", False):
            raise FloatingPointError(
                f"invalid value ({err.ty}) encountered in {fun.__qualname__}"
            ) from None
        _api_util.maybe_recursive_nan_check(err, fun, args, kwargs)  # raises
        raise RuntimeError("Internal error") from err


_HOST_VALUE_TYPES = (np.ndarray, np.generic, bool, int, float, complex)


def _placed_host_args(
    executable: Any, const_args: Sequence[Any], args_flat: Sequence[Any]
) -> Sequence[Any]:
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
            [handler.in_shardings[k]],
            [handler.in_layouts[k]],
            [xc.ArrayCopySemantics.REUSE_INPUT],
            [value],
            canonicalize=False,
        )[0]
    return placed


def _fast_path_and_reason(
    fast: Any, donated: Sequence[bool], reason: str | None
) -> tuple[Any, str | None]:
    fast_path = _fast_path(fast, donated)
    if fast_path is None and reason is None:
        reason = "no_fast_path"
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
        executable = compile_lowering(computation)
        return (executable, executable.shard_const_args(computation.const_args)), None
    except Exception as err:
        # JAX's own path then raises JAX's error for the same call, or runs it.
        return None, f"fastpjit's compile raised {type(err).__name__}"


def compile_lowered(lowered: Any) -> None:
    """Compiles a `jax.stages.Lowered` of a jit function the way a call would, where fastpjit
    can, so that its `compile()` returns fastpjit's executable."""
    computation = lowered._lowering
    if (
        isinstance(computation, _pxla.MeshComputation)
        and _why_jax_compiles_lowering(computation) is None
    ):
        compile_lowering(computation)


def _why_jax_compiles(params: dict[str, Any]) -> str | None:
    if not _core.trace_state_clean():
        return "under_trace"
    if _config.debug_key_reuse.value or _config.enable_pgle.value:
        return "debug_checks"
    jaxpr = params["jaxpr"]
    if jaxpr.jaxpr.is_high or jaxpr.effects:
        return "effects"
    return None


def _lower(params: dict[str, Any], args_flat: Sequence[Any]) -> Any:
    """JAX's lowering of the call, shared with jax.jit's caches."""
    return _pjit._resolve_and_lower(
        [_pjit.convert_to_metaty(a) for a in args_flat],
        jaxpr=params["jaxpr"],
        in_shardings=params["in_shardings"],
        out_shardings=params["out_shardings"],
        in_layouts=params["in_layouts"],
        out_layouts=params["out_layouts"],
        donated_invars=params["donated_invars"],
        ctx_mesh=params["ctx_mesh"],
        name=params["name"],
        keep_unused=params["keep_unused"],
        inline=params["inline"],
        lowering_platforms=None,
        lowering_parameters=_mlir.LoweringParameters(),
        pgle_profiler=None,
        compiler_options_kvs=params["compiler_options_kvs"],
    )


def _why_jax_compiles_lowering(computation: Any) -> str | None:
    args = computation.compile_args
    if args["host_callbacks"] or args["ordered_effects"] or args["unordered_effects"]:
        return "host_callbacks"
    if any(layout is not None for layout in (*args["in_layouts"], *args["out_layouts"])):
        return "layouts"
    if args["mut"] is not None or (
        args["shape_poly_state"] is not None and args["shape_poly_state"].uses_dim_vars
    ):
        return "mutable_or_symbolic"
    avals = (*args["global_in_avals"], *args["global_out_avals"])
    if any(
        a is _core.abstract_token or _dtypes.issubdtype(a.dtype, _dtypes.extended) for a in avals
    ):
        return "extended_dtypes"
    shardings = (*args["in_shardings"], *args["out_shardings"])
    if any(
        _mlir.contains_unconstrained(s)
        for s in shardings
        if not isinstance(s, _sharding_impls.UnspecifiedValue)
    ):
        return "unconstrained_shardings"
    return None


def _fast_path(fast: Any, donated: Sequence[bool]) -> _native.FastPath | None:
    """fastpjit's `FastPath` from JAX's fast-path data, or None without a fast path."""
    if fast is None or any(layout is not None for layout in fast.in_device_local_layouts):
        return None
    handlers = [
        _line.array_result_handler(aval, sharding, committed)
        for aval, sharding, committed in zip(
            fast.out_avals, fast.out_shardings, fast.out_committed, strict=True
        )
    ]
    return _native.FastPath(
        executable=fast.xla_executable,
        out_treedef=fast.out_pytree_def,
        out_handlers=handlers,
        in_shardings=list(fast.in_shardings),
        kept=[bool(k) for k in fast.kept_var_bitvec],
        const_args=list(fast.const_args),
        donated=[bool(d) for d in donated],
        out_shardings=list(fast.out_shardings),
    )


def aot_cache_miss(
    compiled: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> _native.CacheMiss:
    """The cache miss of an ahead-of-time compiled function, as JAX's C++ dispatcher runs it:
    JAX checks and runs the call; the `CacheMiss` is as `jit_cache_miss` gives it."""
    executable, params = compiled._executable, compiled._params
    call = getattr(executable, "unsafe_call", None)
    fast_path = (
        isinstance(call, _pxla.ExecuteReplicated)
        and not call.has_unordered_effects
        and not call.has_host_callbacks
    )
    if not fast_path:
        return _native.CacheMiss(
            compiled(*args, **kwargs),
            None,
            compiles=0,
            jax_reason="executable_effects",
        )
    params = params._replace(const_args=executable.shard_const_args(params.const_args))
    outs, out_flat, args_flat = _stages.Compiled.call(params, *args, **kwargs)
    out_flat, out_tree = _pxla.reflatten_outputs_for_dispatch(params.out_tree, out_flat)
    if params.is_high or executable._mut or not all(isinstance(x, xc.ArrayImpl) for x in out_flat):
        return _native.CacheMiss(outs, None, compiles=0, jax_reason="not_array_outputs")
    in_shardings = [
        _sharding_impls.physical_sharding(a, s)
        if a is not _core.abstract_token and _dtypes.issubdtype(a.dtype, _dtypes.extended)
        else s
        for s, a in zip(executable._in_shardings, executable.in_avals, strict=True)
    ]
    kept = [i in executable._kept_var_idx for i in range(len(params.const_args) + len(args_flat))]
    fast = _pxla.MeshExecutableFastpathData(
        executable.xla_executable,
        out_tree,
        in_shardings,
        executable._out_shardings,
        [o.aval for o in out_flat],
        [o._committed for o in out_flat],
        kept,
        executable._dispatch_in_layouts,
        params.const_args,
    )
    donated = [info.donated for info in _tree_util.tree_leaves(compiled.args_info)]
    fast_path, reason = _fast_path_and_reason(fast, donated, None)
    return _native.CacheMiss(outs, fast_path, compiles=0, jax_reason=reason)


def pmap_cache_miss(
    pmapped: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> _native.CacheMiss:
    """The cache miss of a jax.pmap function: JAX's pmap resolves its parameters and the jit
    over shard_map that it calls, whose miss is `jit_cache_miss`'s. Across processes, the
    call's host-local arrays become global arrays first and its outputs host-local ones after;
    the fast path then says how each argument and output is converted."""
    infer_params = _closure_variable(pmapped, "infer_params")
    local_flat = _pmap_dynamic_leaves(infer_params, args, kwargs)
    cached, jitted, args_flat, _, _, process_count, trace_state_clean = infer_params(
        *args, **kwargs
    )
    if not trace_state_clean:
        return _native.CacheMiss(
            pmapped(*args, **kwargs), None, compiles=0, jax_reason="under_trace"
        )
    miss = jit_cache_miss(jitted, tuple(args_flat), {})
    if process_count == 1:
        return miss
    outputs = _pmap_lib.global_array_to_host_local_array(miss.outputs, cached, True)
    fast_path, reason = _across_processes(miss, cached, local_flat)
    return _native.CacheMiss(
        outputs, fast_path, compiles=miss.compiles, jax_reason=reason or miss.jax_reason
    )


def _pmap_dynamic_leaves(
    infer_params: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> list[Any]:
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
    shardings = zip(local_flat, cached.in_local_shardings, cached.in_global_shardings, strict=True)
    for arg, local_sharding, global_sharding in shardings:
        if type(arg) is ArrayImpl:
            if not (
                arg.is_fully_addressable
                and _pmap_lib._is_sharding_equivalent(arg.sharding, local_sharding, arg.ndim)
            ):
                return None, "pmap_argument_moved"
            shape, dtype = arg.shape, arg.dtype
        elif isinstance(arg, np.ndarray | np.generic | bool | int | float | complex):
            value = np.asarray(arg)
            shape, dtype = value.shape, canonical_dtype(value.dtype)
        else:
            return None, "pmap_argument_converted"
        in_global.append(
            (_pmap_lib._local_to_global_aval(shape, dtype, global_sharding), global_sharding)
        )
    out_flat, out_tree = _tree_util.tree_flatten(miss.outputs)
    local_shardings, global_shardings = _pmap_lib._get_out_shardings(
        out_tree, cached.out_specs, cached.out_local_shardings_thunk
    )
    out_local: list[tuple[Any, Any] | None] = []
    for out, local_sharding, global_sharding in zip(
        out_flat, local_shardings, global_shardings, strict=True
    ):
        if type(out) is not ArrayImpl or out.is_fully_addressable:
            out_local.append(None)
            continue
        if not _pmap_lib._is_sharding_equivalent(out.sharding, global_sharding, out.ndim):
            return None, "pmap_output_moved"
        out_local.append(
            (_pmap_lib._global_to_local_aval(out.shape, out.dtype, global_sharding), local_sharding)
        )
    fields = (
        "executable",
        "out_treedef",
        "out_handlers",
        "in_shardings",
        "kept",
        "const_args",
        "donated",
    )
    return _native.FastPath(
        **{f: getattr(fast, f) for f in fields}, in_global=in_global, out_local=out_local
    ), None


def _closure_variable(function: Any, name: str) -> Any:
    """A variable that `function` closes over; jax.pmap keeps its parameter inference so."""
    code = function.__code__
    if name not in code.co_freevars:
        raise RuntimeError(f"{function!r} no longer closes over {name!r}; update fastpjit._jax")
    return function.__closure__[code.co_freevars.index(name)].cell_contents
