"""fastpjit.compile_hlo: a sharded HLO or StableHLO module, from any frontend, as a function on
global jax.Arrays, its calls dispatched by the same Rust fast path as fastpjit.jit's.

The module is compiled once, with a partition per device. A call that misses the dispatcher's
cache (a new kind of argument) is checked here, argument by argument, before anything reaches
jaxlib: jaxlib does not check the buffers it is given against the executable.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from fastpjit import _core
from fastpjit._jax import api, hlo_backend, rust_handles
from fastpjit.bind import Bindable
from fastpjit.warm_start import SignatureLog

__all__ = ["HloFunction", "compile_hlo"]

_KIND = "compile_hlo"
# Keys differ only by the kinds and shardings of the arguments, so few are ever live.
_CACHE_CAPACITY = 256
_PYTHON_SCALARS = (bool, int, float, complex)  # bool first: it is an int too


class HloFunction(Bindable, _core.JitFunction):
    """A compiled HLO module: call it with one array per entry parameter."""

    _kind = _KIND
    _program: _Program
    _signature_log: SignatureLog

    def _donated_arguments(self) -> tuple[set[int], set[str]]:
        return {i for i, donated in enumerate(self._program.donated) if donated}, set()

    def _bound_placement(self) -> tuple[Any, ...]:
        return self._program.in_shardings

    def _fixed_avals(self) -> tuple[tuple[Any, ...], dict[str, Any]]:
        return self._program.in_avals, {}

    @property
    def input_shardings(self) -> tuple[Any, ...]:
        """The sharding of each parameter, as the module writes it (replicated where not)."""
        return self._program.in_shardings

    @property
    def output_shardings(self) -> tuple[Any, ...]:
        """The sharding of each result, as the module writes it or XLA chose it."""
        return self._program.out_shardings

    @property
    def in_avals(self) -> tuple[Any, ...]:
        return self._program.in_avals

    @property
    def out_avals(self) -> tuple[Any, ...]:
        return tuple(self._program.out_avals)

    @property
    def num_devices(self) -> int:
        return len(self._program.devices)

    def as_text(self) -> str:
        """The partitioned, optimized HLO that runs."""
        return hlo_backend.hlo_text(self._program.executable)

    def cost_analysis(self) -> Any:
        """XLA's cost estimates (flops, bytes accessed, ...) of the compiled module."""
        return self._program.executable.cost_analysis()

    def __copy__(self) -> HloFunction:
        # As JAX's Compiled: a copy runs the same executable. (Like JAX's, it does not pickle.)
        return _function(self._program)

    def __repr__(self) -> str:
        return f"<fastpjit.compile_hlo of {self._program.name} on {self.num_devices} devices>"


def compile_hlo(
    module: str | bytes,
    devices: Sequence[Any] | None = None,
    *,
    donate_argnums: int | Sequence[int] = (),
) -> HloFunction:
    """Compiles a sharded module into a function that takes and returns global jax.Arrays.

    `module` is HLO text as XLA and PyTorch/XLA print it, StableHLO text, or bytes (a
    serialized HloModuleProto, MLIR bytecode or a StableHLO portable artifact). Device id `i`
    in its shardings is `devices[i]`; the default is the first N devices, N being the
    partitions that the module names. The function takes one argument per entry parameter:
    jax.Arrays on the parameter's sharding pass through, others are placed on it. It returns a
    tuple of jax.Arrays when the entry returns a tuple, else one jax.Array. Parameters in
    `donate_argnums` give their buffers to the results.
    """
    if not isinstance(module, str | bytes | bytearray | memoryview):
        raise TypeError(
            f"compile_hlo takes the module as text or bytes, got {type(module).__name__}"
        )
    parsed = hlo_backend.read_hlo_module(module if isinstance(module, str) else bytes(module))
    devices = _devices(devices, parsed.num_partitions)
    donated = _donated(donate_argnums, len(parsed.in_avals))
    return _function(_Program(parsed, devices, donated))


def _function(program: _Program) -> HloFunction:
    # A bad argument's error shows the caller's frame, not fastpjit's checks.
    cache = _core.DispatchCache(program.name, [], [], capacity=_CACHE_CAPACITY, context=False)
    log = SignatureLog(cache)
    function = HloFunction(
        api.api_boundary(program.run), api.api_boundary(log.noting(program.miss)), cache
    )
    function._program = program
    function._signature_log = log
    return function


def _devices(devices: Sequence[Any] | None, partitions: int | None) -> tuple[Any, ...]:
    if devices is None:
        available = jax.devices()
        count = partitions or 1
        if count > len(available):
            raise ValueError(
                f"the module has {count} partitions, but there are only {len(available)} devices"
            )
        return tuple(available[:count])
    devices = tuple(devices)
    if not devices:
        raise ValueError("compile_hlo got an empty device list")
    for d in devices:
        if not isinstance(d, jax.Device):
            raise TypeError(f"devices must be jax Devices, got {type(d).__name__}")
    if len(set(devices)) != len(devices):
        raise ValueError(f"devices lists a device twice: {devices}")
    if len({d.client for d in devices}) != 1:
        raise ValueError("devices must all belong to one backend")
    if partitions is not None and partitions != len(devices):
        raise ValueError(
            f"the module has {partitions} partitions, but {len(devices)} devices "
            "were given (one per partition)"
        )
    return devices


def _donated(donate_argnums: int | Sequence[int], count: int) -> list[bool]:
    argnums = (donate_argnums,) if isinstance(donate_argnums, int) else tuple(donate_argnums)
    donated = [False] * count
    for i in argnums:
        i = operator.index(i)
        if not -count <= i < count:
            raise ValueError(f"donate_argnums has {i}, but the module has {count} parameters")
        donated[i] = True
    return donated


class _Program:
    """The compiled module and what its calls need; the dispatcher's `miss` and `fallback`."""

    def __init__(
        self, parsed: hlo_backend.HloProgram, devices: tuple[Any, ...], donated: list[bool]
    ):
        self.name = parsed.name
        self.devices = devices
        self.in_avals, out_avals = parsed.in_avals, parsed.out_avals
        self.executable = hlo_backend.compile_hlo_program(parsed, devices, donated)
        self.donated = donated
        ins, outs = hlo_backend.hlo_shardings(
            self.executable, devices, len(self.in_avals), len(out_avals)
        )
        self.in_shardings, self.out_shardings = tuple(ins), tuple(outs)
        self.out_avals, self.handlers = hlo_backend.result_handlers(out_avals, self.out_shardings)
        count = len(out_avals)
        self.out_treedef: Any = jax.tree.structure(
            tuple(range(count)) if parsed.tuple_result else 0
        )

    def miss(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> _core.CacheMiss:
        """Checks and runs a call the dispatcher has no entry for, and gives it the entry."""
        inputs, shardings = self._inputs(args, kwargs)
        self._check_donations(inputs)
        outputs = self.out_treedef.unflatten(
            hlo_backend.execute(self.executable, inputs, self.handlers)
        )
        fast_path = _core.FastPath(
            executable=self.executable,
            out_treedef=self.out_treedef,
            out_handlers=self.handlers,
            in_shardings=shardings,
            kept=[True] * len(shardings),
            const_args=[],
            donated=self.donated,
            out_shardings=list(self.out_shardings),
        )
        return _core.CacheMiss(outputs, fast_path, compiles=0, jax_reason=None)

    def run(self, *args: Any, **kwargs: Any) -> jax.Array | tuple[jax.Array, ...]:
        """A call that the dispatcher cannot key (an argument that is not an array)."""
        outputs: jax.Array | tuple[jax.Array, ...] = self.miss(args, kwargs).outputs
        return outputs

    def _check_donations(self, inputs: list[Any]) -> None:
        """No donated buffer may also be another input of the call: jaxlib crashes on that
        with multi-device arrays (JAX's own jit too). Raises the ValueError of JAX's cached
        path, as the dispatcher does for cached calls."""
        if not any(self.donated):
            return
        first_use: dict[Any, int] = {}
        for i, x in enumerate(inputs):
            j = first_use.setdefault(hlo_backend.buffer_id(x), i)
            if j == i:
                continue
            if self.donated[j]:
                what, example = (
                    "Attempt to use a buffer that was previously donated in the "
                    "same call to Execute()",
                    "f(donate(a), a)",
                )
            elif self.donated[i]:
                what, example = (
                    "Attempt to donate a buffer which is also used by the same call to Execute()",
                    "f(a, donate(a))",
                )
            else:
                continue
            raise ValueError(
                f"INVALID_ARGUMENT: {what} (flattened argument {i}, replica 0, "
                f"partition 0, first use: {j}). Toy example for this bug: "
                f"`{example}`."
            )

    def _inputs(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[list[Any], list[Any]]:
        """The arguments on the executable's input shardings, and the sharding object that
        each parameter's inputs of this kind carry (an argument's own where equivalent)."""
        if kwargs:
            raise TypeError(
                f"{self.name} takes positional arguments only, one per entry "
                f"parameter; got keyword arguments {sorted(kwargs)}"
            )
        if len(args) != len(self.in_avals):
            expected = ", ".join(a.str_short() for a in self.in_avals)
            raise TypeError(
                f"{self.name} takes {len(self.in_avals)} arguments ({expected}), "
                f"one per entry parameter; got {len(args)}"
            )
        inputs, shardings = [], []
        for i, arg in enumerate(args):
            placed, sharding = self._input(i, arg)
            inputs.append(placed)
            shardings.append(sharding)
        return inputs, shardings

    def _input(self, i: int, arg: Any) -> tuple[Any, Any]:
        aval, sharding = self.in_avals[i], self.in_shardings[i]
        shape, dtype = _shape_and_dtype(arg, self._where(i))
        if shape != aval.shape or dtype != aval.dtype:
            given = jax.core.ShapedArray(shape, dtype).str_short()
            raise TypeError(f"{self._where(i)} expects {aval.str_short()}, got {given}")
        if not isinstance(arg, jax.Array):
            return _core.device_put_leaf(arg, sharding, False), sharding
        if arg.is_deleted():
            raise RuntimeError(
                f"{self._where(i)}: the array has been deleted (donated to an earlier call?)"
            )
        own = arg.sharding
        if own is sharding or own.is_equivalent_to(sharding, len(shape)):
            return arg, own
        _core.count_fallback("moved_argument")
        return rust_handles.shard_arg(arg, sharding), sharding

    def _where(self, i: int) -> str:
        return f"{self.name}: parameter {i}"


def _shape_and_dtype(arg: Any, where: str) -> tuple[tuple[int, ...], Any]:
    """What an argument holds, as the executable would take it; TypeError if it holds none."""
    if isinstance(arg, jax.core.Tracer):
        raise TypeError(
            f"{where} got a tracer: a compile_hlo function runs concrete arrays, "
            "and cannot be called under jax.jit, grad or vmap"
        )
    if isinstance(arg, jax.Array):
        return tuple(arg.shape), arg.dtype
    if isinstance(arg, np.ndarray | np.generic):
        return tuple(arg.shape), _canonical(arg.dtype, where)
    for kind in _PYTHON_SCALARS:
        if isinstance(arg, kind):
            return (), rust_handles.python_scalar_dtype(kind)
    raise TypeError(f"{where} takes a jax.Array, numpy array or scalar, got {type(arg).__name__}")


@functools.cache
def _canonical_cached(dtype: np.dtype) -> np.dtype:
    return rust_handles.canonical_dtype(dtype)


def _canonical(dtype: np.dtype, where: str) -> np.dtype:
    try:
        return _canonical_cached(dtype)
    except TypeError as err:
        raise TypeError(f"{where}: {err}") from None
