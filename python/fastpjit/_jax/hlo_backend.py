"""compile_hlo's backend: modules that other frontends wrote (HLO text, StableHLO, their serialized
forms) read into JAX's MLIR, compiled through jaxlib's PjRt client and run by `execute_sharded`.

Everything here is jaxlib's private surface; `fastpjit.hlo` holds the user-facing checks.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from jax._src import compiler as _compiler
from jax._src import core as _core
from jax._src import dispatch as _dispatch
from jax._src import mesh as _mesh
from jax._src import named_sharding as _named_sharding
from jax._src.interpreters import mlir as _mlir
from jax._src.lib import _jax as _jaxlib
from jax._src.lib import xla_client as xc
from jax._src.lib.mlir import ir
from jax._src.lib.mlir.dialects import sdy as _sdy
from jax._src.sharding_impls import GSPMDSharding

from fastpjit import _core as _native
from fastpjit._jax import line as _line
from fastpjit._jax.rust_handles import array_single_device_arrays
from fastpjit._jax.xla_compile import (
    devices_as_array,
    output_memory_kinds,
    thread_compiles,
    xla_shardings,
)

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
        raise ValueError(
            f"bytes that are neither MLIR bytecode nor a serialized HloModuleProto: {err}"
        ) from None
    return data


def _from_hlo_proto(proto: bytes) -> tuple[Any, bool]:
    """The module as StableHLO, and whether its entry returns a tuple (which the conversion
    flattens into several results)."""
    shape = xc.XlaComputation(proto).program_shape()
    for i, parameter in enumerate(shape.parameter_shapes()):
        if not parameter.is_array():
            raise NotImplementedError(
                f"the module's parameter {i} has shape {parameter}; compile_hlo takes and "
                "returns arrays only (no tuples or tokens)"
            )
    return ir.Module.parse(_jaxlib.mlir.hlo_to_stablehlo(proto)), shape.result_shape().is_tuple()


def _parse_mlir(module: str | bytes) -> Any:
    try:
        if isinstance(module, bytes):
            # Reads VHLO (portable artifacts) into StableHLO, and plain bytecode as it is.
            return _jaxlib.mlir.deserialize_portable_artifact(module, context=ir.Context.current)
        return ir.Module.parse(module)
    except Exception as err:  # MLIRError with the diagnostics, or jaxlib's for bytecode
        what = (
            "MLIR module"
            if isinstance(module, bytes)
            else ("MLIR module (text that does not start with `HloModule` is read as MLIR)")
        )
        raise ValueError(f"malformed {what}: {err}") from None


def _program(module: Any, header: str | None, tuple_result: bool | None) -> HloProgram:
    attributes = module.operation.attributes
    replicas = _int_attr(attributes, "mhlo.num_replicas") or _header_int(header, "replica_count")
    if replicas is not None and replicas > 1:
        raise NotImplementedError(
            f"the module runs {replicas} replicas; compile_hlo runs one replica with one "
            "partition per device (write the replicas as a partitioned dimension)"
        )
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
    partitions = (
        _int_attr(attributes, "mhlo.num_partitions")
        or _header_int(header, "num_partitions")
        or _named_partitions(module)
    )
    if "sym_name" not in attributes:  # JAX's compile names its logs and cache entries by it
        attributes["sym_name"] = ir.StringAttr.get("main")
    return HloProgram(
        module=module,
        name=attributes["sym_name"].value,
        in_avals=in_avals,
        out_avals=out_avals,
        tuple_result=len(out_avals) != 1 if tuple_result is None else tuple_result,
        num_partitions=partitions,
        shardy=shardy,
        result_sharded=_result_sharded(main),
    )


def _entry_function(module: Any) -> Any:
    for op in module.body.operations:
        if (
            op.operation.name == "func.func"
            and "sym_name" in op.attributes
            and op.attributes["sym_name"].value == "main"
        ):
            return op.operation
    raise ValueError(
        "the module has no entry function: HLO needs an ENTRY computation, "
        "StableHLO a func.func @main"
    )


def _int_attr(attributes: Any, name: str) -> int | None:
    return attributes[name].value if name in attributes else None


def _header_int(header: str | None, key: str) -> int | None:
    found = re.search(rf"\b{key}=(\d+)", header) if header else None
    return int(found.group(1)) if found else None


# JAX's element types by their MLIR spelling (f32, bf16, complex<f32>, ...).
_IR_TYPE_DTYPES: dict[str, np.dtype] = {}


def _aval(type_: Any, what: str) -> Any:
    if not _IR_TYPE_DTYPES:
        _IR_TYPE_DTYPES.update(
            {str(make()): np.dtype(d) for d, make in _mlir._dtype_to_ir_type.items()}
        )
    if not isinstance(type_, ir.RankedTensorType):
        raise NotImplementedError(
            f"the module's {what} has type {type_}; compile_hlo takes and returns arrays only "
            "(no tuples or tokens)"
        )
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
    return (
        "mhlo.frontend_attributes" in attributes
        and _SDY_MESHES_ATTR in attributes["mhlo.frontend_attributes"]
    )


def _keep_shardy_on(main: Any) -> None:
    """A module that JAX printed as HLO carries its Shardy shardings as frontend attributes
    and mirrors them as HLO shardings on the results; PjRt takes those for a GSPMD module and
    turns Shardy off, which cannot partition the `xla.sdy` custom calls. Shardy reads the
    frontend attributes, so the mirrors go."""
    if "res_attrs" in main.attributes:
        main.attributes["res_attrs"] = ir.ArrayAttr.get(
            [
                ir.DictAttr.get({a.name: a.attr for a in d if a.name != "mhlo.sharding"})
                for d in main.attributes["res_attrs"]
            ]
        )


def _result_sharded(main: Any) -> list[bool]:
    """Whether the module writes a sharding for each result (Shardy's only, in a module for
    Shardy: `_keep_shardy_on` has dropped the mirrors)."""
    count = len(main.attributes["function_type"].value.results)
    if "res_attrs" not in main.attributes:
        return [False] * count
    return [
        any(a.name in ("mhlo.sharding", "sdy.sharding") for a in d)
        for d in main.attributes["res_attrs"]
    ]


# The attributes where a module names devices: HLO shardings, alone or on function arguments
# and results, Shardy meshes, and meshes that JAX's HLO printer keeps as frontend attributes.
_DEVICE_NAMING_ATTRS = frozenset(
    ("mhlo.sharding", "arg_attrs", "res_attrs", "mesh", "mhlo.frontend_attributes")
)


def _named_partitions(module: Any) -> int | None:
    """How many partitions the module's shardings and meshes name, if any."""
    found: list[tuple[str, Any]] = []

    def visit(op: Any) -> Any:
        # An exception raised in here would reach the caller as a RuntimeError.
        attributes = op.attributes
        found.extend(
            (name, attributes[name]) for name in attributes if name in _DEVICE_NAMING_ATTRS
        )
        return ir.WalkResult.ADVANCE

    module.operation.walk(visit)
    return max((n for name, attr in found for n in _attr_partitions(name, attr)), default=0) or None


def _attr_partitions(name: str, attr: Any) -> list[int]:
    if name == "mhlo.sharding" and isinstance(attr, ir.StringAttr):
        try:
            sharding = xc.HloSharding.from_string(attr.value)
        except Exception as err:
            raise ValueError(f"malformed HLO sharding {attr.value!r}: {err}") from None
        return [_sharding_partitions(sharding)]
    if name in ("arg_attrs", "res_attrs") and isinstance(attr, ir.ArrayAttr):
        return [
            n
            for d in attr
            for a in d  # type: ignore[attr-defined]
            for n in _attr_partitions(a.name, a.attr)
        ]
    if name == "mesh" and _sdy.MeshAttr.isinstance(attr):
        return [_mesh_partitions(_sdy.MeshAttr(attr))]
    if name == "mhlo.frontend_attributes" and _SDY_MESHES_ATTR in attr:
        meshes = ir.Attribute.parse(attr[_SDY_MESHES_ATTR].value)
        return [_mesh_partitions(_sdy.MeshAttr(m.attr)) for m in meshes]  # type: ignore[attr-defined]
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


def compile_hlo_program(
    program: HloProgram, devices: Sequence[Any], donated: Sequence[bool]
) -> Any:
    """Compiles `program` with one replica and a partition per device of `devices` (device id
    i in its shardings is devices[i]): the parameters keep the shardings written in the module
    and XLA propagates none into them; it chooses those of the results left open."""
    main = _entry_function(program.module)
    if any(donated):
        with program.module.context:
            _mark_donated(main, donated)
    count = len(devices)
    device_array = devices_as_array(devices)
    backend = devices[0].client
    options = _compiler.get_compile_options(
        num_replicas=1,
        num_partitions=count,
        device_assignment=device_array.reshape((1, count)),
        backend=backend,
    )
    build = options.executable_build_options
    build.use_shardy_partitioner = program.shardy
    build.allow_spmd_sharding_propagation_to_parameters = [False] * len(program.in_avals)
    build.allow_spmd_sharding_propagation_to_output = [
        not sharded for sharded in program.result_sharded
    ]
    compiles_before = thread_compiles()
    with _dispatch.log_elapsed_time(
        "Finished XLA compilation of {fun_name} in {elapsed_time:.9f} sec",
        fun_name=program.name,
        event=_dispatch.BACKEND_COMPILE_EVENT,
    ):
        try:
            # JAX's persistent compilation cache first, and its IR dumps, as for a jit.
            executable = _compiler.compile_or_get_cached(
                backend, program.module, device_array, options, [], xc.DeviceList(tuple(devices))
            )
        except _jaxlib.JaxRuntimeError as err:
            if "INVALID_ARGUMENT" in str(err):
                raise ValueError(f"XLA rejects the module: {err}") from None
            raise
    # The event above counts the compile when the block ends (not a load from JAX's cache).
    _native.count_compiles(thread_compiles() - compiles_before)
    return executable


def _mark_donated(main: Any, donated: Sequence[bool]) -> None:
    """Marks parameters as buffer donors: XLA may reuse their buffers for the results."""
    old = (
        list(ir.ArrayAttr(main.attributes["arg_attrs"]))
        if "arg_attrs" in main.attributes
        else [ir.DictAttr.get({})] * len(donated)
    )
    main.attributes["arg_attrs"] = ir.ArrayAttr.get(
        [
            ir.DictAttr.get(
                {
                    **{a.name: a.attr for a in ir.DictAttr(d)},  # type: ignore[attr-defined]
                    "jax.buffer_donor": ir.BoolAttr.get(True),
                }
            )
            if give
            else d
            for d, give in zip(old, donated, strict=True)
        ]
    )


def hlo_shardings(
    executable: Any, devices: Sequence[Any], num_in: int, num_out: int
) -> tuple[list[Any], list[Any]]:
    """The shardings that the compiled executable takes and gives over `devices`, read by
    fastpjit's HLO sharding parser (replicated where XLA reports none), as NamedShardings
    where they can be."""
    devices = tuple(devices)
    ins = xla_shardings(executable.get_parameter_shardings(), [None] * num_in, devices)
    outs = xla_shardings(
        executable.get_output_shardings(), output_memory_kinds(executable, num_out), devices
    )
    replicated = GSPMDSharding.get_replicated(devices)
    return (
        [_as_named(s, devices) for s in ins or [replicated] * num_in],
        [_as_named(s, devices) for s in outs or [replicated] * num_out],
    )


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
            groups == [xc.OpSharding.Type.REPLICATED]
        )
        if not hlo.is_tiled() or (groups and not replicated_groups):
            return sharding
        dims = hlo.tile_assignment_dimensions()
        partitioned = len(dims) - (1 if replicated_groups else 0)
        ids = tuple(hlo.tile_assignment_devices())
        if math.prod(dims) != count:
            return sharding
    names = [f"d{i}" for i in range(partitioned)] + ["replicas"] * (len(dims) - partitioned)
    mesh = _mesh.Mesh(
        np.array(devices, dtype=object).reshape(dims),
        tuple(names),
        axis_types=(_mesh.AxisType.Auto,) * len(dims),
    )
    spec = jax.sharding.PartitionSpec(
        *(n if d > 1 else None for n, d in zip(names[:partitioned], dims, strict=False))
    )
    return _named_sharding.NamedSharding(
        mesh,
        spec,
        memory_kind=sharding.memory_kind,
        _logical_device_ids=None if ids is None or ids == tuple(range(count)) else ids,
    )


def result_handlers(avals: Sequence[Any], shardings: Sequence[Any]) -> tuple[list[Any], list[Any]]:
    """The avals of the arrays on `shardings` (as device_put gives them), and jaxlib's
    handlers that wrap an executable's output buffers as such committed jax.Arrays."""
    avals = [_dispatch.update_dp_aval(a, s) for a, s in zip(avals, shardings, strict=True)]
    return avals, [
        _line.array_result_handler(a, s, True) for a, s in zip(avals, shardings, strict=True)
    ]


def execute(executable: Any, inputs: Sequence[Any], handlers: Sequence[Any]) -> list[Any]:
    """Runs `executable` on jax.Arrays already on its input shardings: its outputs."""
    return executable.execute_sharded(list(inputs)).consume_with_handlers(list(handlers))


def buffer_id(array: Any) -> int:
    """Where the first shard of a jax.Array lives: arrays that share it alias each other."""
    return array_single_device_arrays(array)[0].unsafe_buffer_pointer()


def hlo_text(executable: Any) -> str:
    """The partitioned, optimized HLO of a compiled executable."""
    return "\n".join(m.to_string() for m in executable.hlo_modules())
