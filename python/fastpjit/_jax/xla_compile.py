"""fastpjit's compiles through jaxlib's PjRt client, shared by jit's misses and compile_hlo: the
compile options, JAX's persistent cache, the shardings XLA chose, and the count of compiles."""

from __future__ import annotations

import threading
import weakref
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from jax._src import compiler as _compiler
from jax._src import dispatch as _dispatch
from jax._src import sharding_impls as _sharding_impls
from jax._src.interpreters import pxla as _pxla
from jax._src.lib import xla_client as xc
from jax._src.sharding_impls import GSPMDSharding as GSPMDSharding  # fastpjit.sharding's

from fastpjit import _core as _native


def gspmd_sharding(devices: Sequence[Any], hlo_text: str) -> GSPMDSharding:
    """A GSPMDSharding over `devices` from text that fastpjit's parser has checked."""
    return GSPMDSharding(tuple(devices), xc.HloSharding.from_string(hlo_text))


# Every thread's compiles, which tests and benches compare with fastpjit.stats().
_backend_compiles = 0
# Compiles by the thread that runs them: a miss counts its own, not those of misses that
# other threads run meanwhile.
_compiles_on_thread = threading.local()
_PERSISTENT_CACHE_HIT_EVENT = "/jax/compilation_cache/cache_hits"


def _count_backend_compile(event: str, duration: float, **details: Any) -> None:
    # JAX times a load from its persistent compilation cache as a backend compile too; the
    # cache hit, reported just before on the same thread, says that nothing was compiled.
    global _backend_compiles
    if event != _dispatch.BACKEND_COMPILE_EVENT:
        return
    if _native.in_guarded_jax_call():
        _stop_compile(details.get("fun_name"))
    if getattr(_compiles_on_thread, "loaded", False):
        _compiles_on_thread.loaded = False
        _compiles_on_thread.loads = getattr(_compiles_on_thread, "loads", 0) + 1
        return
    _backend_compiles += 1
    _compiles_on_thread.count = thread_compiles() + 1


def _stop_compile(name: Any) -> None:
    """Inside `fastpjit.no_recompiles`, JAX compiled for a call that fastpjit handed to its
    dispatch: raised out of JAX's compile, whose executable JAX then keeps nowhere. (fastpjit's
    own misses raise before they trace.)"""
    from fastpjit.errors import RecompileError

    _native.count_recompile_stopped()
    raise RecompileError(
        f"JAX compiled {name} inside fastpjit.no_recompiles(), for a call that fastpjit "
        "handed to JAX's dispatch (fastpjit.stats() counts it as a fallback, with its reason)"
    )


def _note_persistent_cache_hit(event: str, **_: Any) -> None:
    if event == _PERSISTENT_CACHE_HIT_EVENT:
        _compiles_on_thread.loaded = True


def thread_compile_events() -> tuple[int, int]:
    """Backend compiles run, and executables loaded from JAX's persistent compilation cache,
    by this thread so far."""
    return thread_compiles(), getattr(_compiles_on_thread, "loads", 0)


def thread_compiles() -> int:
    """How many backend compiles this thread has run so far."""
    return getattr(_compiles_on_thread, "count", 0)


# JAX's listener protocol names its keyword arguments; this one takes any.
jax.monitoring.register_event_duration_secs_listener(_count_backend_compile)  # type: ignore[arg-type]
jax.monitoring.register_event_listener(_note_persistent_cache_hit)

# One lock per lowering: threads that miss on one call together compile it once, as in JAX.
_compile_locks: weakref.WeakKeyDictionary[Any, threading.Lock] = weakref.WeakKeyDictionary()
_compile_locks_lock = threading.Lock()


def compile_lowering(computation: Any) -> Any:
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
        _pxla.maybe_concretize_mesh(s, devices) for s in args["in_shardings"]
    )
    out_shardings: Sequence[Any] = tuple(
        _pxla.maybe_concretize_mesh(s, devices) for s in args["out_shardings"]
    )
    options = _compile_options(computation, in_shardings, out_shardings)
    xla_executable = _xla_executable(computation, options)
    in_avals, out_avals = args["global_in_avals"], args["global_out_avals"]
    # Shardings that XLA chose become NamedShardings where a user sharding shows the mesh,
    # as in JAX.
    in_shardings = _pxla.maybe_recover_user_shardings(
        in_shardings,
        _checked_shardings(
            in_shardings,
            xla_shardings(
                xla_executable.get_parameter_shardings(), [None] * len(in_avals), devices
            ),
            in_avals,
            "input",
        ),
        in_avals,
        in_avals,
    )
    out_shardings = _checked_shardings(
        out_shardings,
        xla_shardings(
            xla_executable.get_output_shardings(),
            output_memory_kinds(xla_executable, len(out_avals)),
            devices,
        ),
        out_avals,
        "output",
    )
    xla_in_layouts, xla_out_layouts = _pxla._get_layouts_from_executable(
        xla_executable, args["in_layouts"], args["out_layouts"], 0, in_avals, out_avals
    )
    out_shardings = _pxla.maybe_recover_user_shardings(
        in_shardings,
        out_shardings,
        in_avals,
        out_avals,
        args["intermediate_shardings"],
        args["context_mesh"],
    )
    in_shardings = _pxla.finalize_shardings(in_shardings, devices)
    out_shardings = _pxla.finalize_shardings(out_shardings, devices)
    return _pxla.UnloadedMeshExecutable(
        xla_executable=xla_executable,
        device_list=devices,
        backend=args["backend"],
        input_avals=in_avals,
        input_shardings=in_shardings,
        output_avals=out_avals,
        output_shardings=out_shardings,
        committed=args["committed"],
        name=computation._name,
        unordered_effects=[],
        ordered_effects=[],
        keepalive=args["keepalive"],
        host_callbacks=[],
        kept_var_idx=args["kept_var_idx"],
        mut=None,
        xla_in_layouts=xla_in_layouts,
        dispatch_in_layouts=_pxla.get_dispatch_layouts(xla_in_layouts, in_shardings, in_avals),
        xla_out_layouts=xla_out_layouts,
        all_args_info=args["all_args_info"],
        pgle_profiler=None,
    ).load()


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
        fun_name=computation._name,
        event=_dispatch.BACKEND_COMPILE_EVENT,
    ):
        executable = _compiler.compile_or_get_cached(
            computation.compile_args["backend"],
            module,
            devices_as_array(devices),
            options,
            [],
            devices,
        )
    with _xla_executables_lock:
        _xla_executables.setdefault(module, {})[key] = executable
    return executable


def devices_as_array(devices: Any) -> np.ndarray:
    """`devices` as a flat numpy array of objects: the device assignment that PjRt takes."""
    array = np.empty(len(devices), dtype=object)
    array[:] = list(devices)
    return array


def _compile_options(
    computation: Any, in_shardings: Sequence[Any], out_shardings: Sequence[Any]
) -> Any:
    """One replica and one partition per device, in the lowering's device order; XLA may
    choose the shardings of the inputs and outputs that the user left unspecified. The other
    options (XLA flags, JAX's compiler options) are read from JAX's configuration."""
    args = computation.compile_args
    devices = devices_as_array(computation._device_list)
    options = _compiler.get_compile_options(
        num_replicas=1,
        num_partitions=devices.size,
        device_assignment=devices.reshape((1, devices.size)),
        env_options_overrides=dict(computation._compiler_options_kvs),
        detailed_logging=_compiler.use_detailed_logging(computation._hlo),
        backend=args["backend"],
    )
    options.parameter_is_tupled_arguments = args["tuple_args"]
    build = options.executable_build_options
    unspecified = _sharding_impls.UnspecifiedValue
    build.allow_spmd_sharding_propagation_to_parameters = [
        isinstance(s, unspecified) for s in in_shardings
    ]
    build.allow_spmd_sharding_propagation_to_output = [
        isinstance(s, unspecified) for s in out_shardings
    ]
    return options


def output_memory_kinds(executable: Any, count: int) -> list[str | None]:
    try:
        kinds = list(executable.getoutput_memory_kinds()[0])
    except Exception:  # platforms without memory kinds
        return [None] * count
    if len(kinds) != count:
        raise AssertionError(f"XLA gave {len(kinds)} memory kinds for {count} outputs")
    return kinds


def xla_shardings(
    op_shardings: Any, memory_kinds: list[str | None], devices: Any
) -> list[Any] | None:
    """XLA's shardings of an executable's inputs or outputs (in the given memory kinds), read
    by fastpjit's HLO sharding parser; None where XLA reports none."""
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
    shardings = [
        gspmd_sharding(devices, _native.canonical_hlo_sharding(text, len(devices)))
        for text in texts
    ]
    return [
        s if kind is None else s.with_memory_kind(kind)
        for s, kind in zip(shardings, memory_kinds, strict=True)
    ]


def _checked_shardings(
    shardings: Sequence[Any], xla: list[Any] | None, avals: Sequence[Any], what: str
) -> list[Any]:
    """The user's shardings where given, each checked against XLA's by where they place data
    (index maps, and the partial sums of unreduced shardings), and XLA's where not."""
    if xla is None:
        return list(shardings)
    out = []
    for given, chosen, aval in zip(shardings, xla, avals, strict=True):
        if isinstance(given, _sharding_impls.UnspecifiedValue):
            out.append(chosen)
            continue
        if (
            aval.size != 0
            and not chosen._to_xla_hlo_sharding(aval.ndim).is_manual()
            and (
                _native.device_placement_map(chosen, aval.shape)
                != _native.device_placement_map(given, aval.shape)
                or (what == "output" and chosen.memory_kind != given.memory_kind)
            )
        ):
            raise AssertionError(
                f"Unexpected XLA sharding override: (XLA) {chosen} != {given} (User {what})"
            )
        out.append(given)
    return out


def backend_compiles() -> int:
    """How many backend compiles JAX has run in this process so far (loads from the persistent
    compilation cache left out)."""
    return _backend_compiles


def clear_xla_executables() -> None:
    """Forgets every XLA executable kept by module (jax.clear_caches())."""
    with _xla_executables_lock:
        _xla_executables.clear()
