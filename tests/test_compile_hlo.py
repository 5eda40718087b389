"""fastpjit.compile_hlo on 8 CPU devices: modules written by other frontends, and by JAX itself.

The notebook's three programs are written as PyTorch/XLA prints them (parameters, `Sharding`
custom calls, a `call` to a sub-computation, a tuple root) and checked against numpy. Modules
that JAX lowers, under Shardy and under GSPMD, run as HLO text, StableHLO text, MLIR bytecode
and a StableHLO portable artifact, and are checked against jax.jit of the same function:
values, output shardings, and input shardings equal to the module's annotations.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P
from jaxlib import xla_client as xc
from lines import DONATED_AGAIN
from rows import Counts

import fastpjit

DEVICES = tuple(jax.devices())


def same_sharding(ours: Any, theirs: Any, ndim: int) -> bool:
    return ours.is_equivalent_to(theirs, ndim) and ours.devices_indices_map(
        (8,) * ndim
    ) == theirs.devices_indices_map((8,) * ndim)


def annotated(sharding: Any, text: str, devices: Any, ndim: int = 2) -> bool:
    """Whether `sharding` places shards as the HLO sharding `text` over `devices` does; a
    NamedSharding, so that jax.jit takes it."""
    return isinstance(sharding, NamedSharding) and same_sharding(
        sharding, fastpjit.parse_hlo_sharding(text, devices), ndim
    )


# --- The notebook's programs, as PyTorch/XLA prints them -------------------------------------

ADD_HLO = """\
HloModule SyncTensorsGraph.9, entry_computation_layout={(f32[8,4]{1,0}, f32[8,4]{1,0})->(f32[8,4]{1,0})}

%AddComputation.3 (x.4: f32[8,4], y.5: f32[8,4]) -> f32[8,4] {
  %x.4 = f32[8,4]{1,0} parameter(0)
  %y.5 = f32[8,4]{1,0} parameter(1)
  ROOT %add.6 = f32[8,4]{1,0} add(f32[8,4]{1,0} %x.4, f32[8,4]{1,0} %y.5)
}

ENTRY %SyncTensorsGraph.9 (p0.1: f32[8,4], p1.2: f32[8,4]) -> (f32[8,4]) {
  %p0.1 = f32[8,4]{1,0} parameter(0), sharding={devices=[2,1]0,1}
  %custom-call.1 = f32[8,4]{1,0} custom-call(f32[8,4]{1,0} %p0.1), custom_call_target="Sharding", sharding={devices=[2,1]0,1}
  %p1.2 = f32[8,4]{1,0} parameter(1), sharding={devices=[2,1]0,1}
  %custom-call.2 = f32[8,4]{1,0} custom-call(f32[8,4]{1,0} %p1.2), custom_call_target="Sharding", sharding={devices=[2,1]0,1}
  %call.7 = f32[8,4]{1,0} call(f32[8,4]{1,0} %custom-call.1, f32[8,4]{1,0} %custom-call.2), to_apply=%AddComputation.3
  ROOT %tuple.8 = (f32[8,4]{1,0}) tuple(f32[8,4]{1,0} %call.7)
}
"""  # noqa: E501

# Untyped operands and no entry_computation_layout: XLA prints both ways.
MUL_HLO = """\
HloModule SyncTensorsGraph.12

%MulComputation.3 (x.4: f32[8,16], y.5: f32[8,16]) -> f32[8,16] {
  %x.4 = f32[8,16]{1,0} parameter(0)
  %y.5 = f32[8,16]{1,0} parameter(1)
  ROOT %multiply.6 = f32[8,16]{1,0} multiply(%x.4, %y.5)
}

ENTRY %SyncTensorsGraph.12 (p0.1: f32[8,16], p1.2: f32[8,16]) -> (f32[8,16]) {
  %p0.1 = f32[8,16]{1,0} parameter(0), sharding={devices=[2,4]0,1,2,3,4,5,6,7}
  %custom-call.1 = f32[8,16]{1,0} custom-call(%p0.1), custom_call_target="Sharding", sharding={devices=[2,4]0,1,2,3,4,5,6,7}
  %p1.2 = f32[8,16]{1,0} parameter(1), sharding={devices=[2,4]0,1,2,3,4,5,6,7}
  %custom-call.2 = f32[8,16]{1,0} custom-call(%p1.2), custom_call_target="Sharding", sharding={devices=[2,4]0,1,2,3,4,5,6,7}
  %call.7 = f32[8,16]{1,0} call(%custom-call.1, %custom-call.2), to_apply=%MulComputation.3
  ROOT %tuple.8 = (f32[8,16]{1,0}) tuple(%call.7)
}
"""  # noqa: E501

MATMUL_HLO = """\
HloModule SyncTensorsGraph.10, entry_computation_layout={(f32[4,6]{1,0}, f32[6,8]{1,0})->(f32[4,8]{1,0})}

%MatMulComputation.3 (x.4: f32[4,6], y.5: f32[6,8]) -> f32[4,8] {
  %x.4 = f32[4,6]{1,0} parameter(0)
  %y.5 = f32[6,8]{1,0} parameter(1)
  ROOT %dot.6 = f32[4,8]{1,0} dot(f32[4,6]{1,0} %x.4, f32[6,8]{1,0} %y.5), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

ENTRY %SyncTensorsGraph.10 (p0.1: f32[4,6], p1.2: f32[6,8]) -> (f32[4,8]) {
  %p0.1 = f32[4,6]{1,0} parameter(0), sharding={devices=[2,2]0,1,2,3}
  %custom-call.1 = f32[4,6]{1,0} custom-call(f32[4,6]{1,0} %p0.1), custom_call_target="Sharding", sharding={devices=[2,2]0,1,2,3}
  %p1.2 = f32[6,8]{1,0} parameter(1), sharding={devices=[2,2]0,1,2,3}
  %custom-call.2 = f32[6,8]{1,0} custom-call(f32[6,8]{1,0} %p1.2), custom_call_target="Sharding", sharding={devices=[2,2]0,1,2,3}
  %call.7 = f32[4,8]{1,0} call(f32[4,6]{1,0} %custom-call.1, f32[6,8]{1,0} %custom-call.2), to_apply=%MatMulComputation.3
  ROOT %tuple.9 = (f32[4,8]{1,0}) tuple(f32[4,8]{1,0} %call.7)
}
"""  # noqa: E501


def _values(shapes: list[tuple[int, ...]], seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    # Small integers: float32 sums and products of them are exact, whatever the order.
    return [rng.integers(-4, 5, size=s).astype(np.float32) for s in shapes]


NOTEBOOK = [
    pytest.param(ADD_HLO, 2, "{devices=[2,1]0,1}", [(8, 4), (8, 4)], np.add, id="add"),
    pytest.param(
        MUL_HLO, 8, "{devices=[2,4]0,1,2,3,4,5,6,7}", [(8, 16), (8, 16)], np.multiply, id="multiply"
    ),
    pytest.param(MATMUL_HLO, 4, "{devices=[2,2]0,1,2,3}", [(4, 6), (6, 8)], np.matmul, id="matmul"),
]


@pytest.mark.parametrize(("text", "devices", "annotation", "shapes", "reference"), NOTEBOOK)
def test_notebook_programs_with_numpy_inputs(text, devices, annotation, shapes, reference):
    f = fastpjit.compile_hlo(text)
    assert f.num_devices == devices
    assert all(annotated(s, annotation, DEVICES[:devices]) for s in f.input_shardings)
    assert [a.shape for a in f.in_avals] == shapes
    a, b = _values(shapes)
    counts = Counts()
    for _ in range(3):
        (out,) = f(a, b)
        np.testing.assert_array_equal(np.asarray(out), reference(a, b))
        assert out.shape == out.aval.shape == f.out_avals[0].shape
        assert out.sharding == f.output_shardings[0]
        assert out.committed
    assert (counts["cache_misses"], counts["cache_hits"]) == (1, 2)
    assert counts.fallbacks() == {}


@pytest.mark.parametrize(("text", "devices", "annotation", "shapes", "reference"), NOTEBOOK)
def test_notebook_programs_with_placed_arrays(text, devices, annotation, shapes, reference):
    f = fastpjit.compile_hlo(text)
    values = _values(shapes, seed=1)
    placed = [jax.device_put(v, s) for v, s in zip(values, f.input_shardings, strict=True)]
    counts = Counts()
    outs = [f(*placed) for _ in range(3)]
    assert (counts["cache_misses"], counts["cache_hits"]) == (1, 2)
    assert counts.fallbacks() == {}
    for (out,) in outs:
        np.testing.assert_array_equal(np.asarray(out), reference(*values))
    # The outputs feed back in when their sharding is the parameter's (add and multiply).
    if f.out_avals[0] == f.in_avals[0] and f.output_shardings[0] == f.input_shardings[0]:
        (again,) = f(outs[0][0], placed[1])
        np.testing.assert_array_equal(np.asarray(again), reference(reference(*values), values[1]))
        assert counts.fallbacks() == {}


def test_the_matmul_is_partitioned_as_annotated():
    f = fastpjit.compile_hlo(MATMUL_HLO)
    text = f.as_text()
    # Each device holds a 2x3 tile of the 4x6 operand.
    assert "f32[2,3]" in text
    assert f.cost_analysis()["flops"] > 0


def test_results_go_on_into_jax():
    # jax.jit refuses GSPMDShardings under Shardy (its default): the shardings are named ones.
    f = fastpjit.compile_hlo(MUL_HLO)
    a, b = _values([(8, 16), (8, 16)])
    (out,) = f(a, b)
    doubled = jax.jit(lambda x: x * 2)(out)
    np.testing.assert_array_equal(np.asarray(doubled), a * b * 2)
    np.testing.assert_array_equal(np.asarray(fastpjit.jit(lambda x: x + 1)(out)), a * b + 1)
    jitted = jax.jit(lambda x, y: x - y, in_shardings=f.input_shardings)
    np.testing.assert_array_equal(np.asarray(jitted(a, b)), a - b)
    (again,) = f(doubled, b)
    np.testing.assert_array_equal(np.asarray(again), a * b * 2 * b)


def test_arrays_on_other_shardings_move_and_are_counted():
    f = fastpjit.compile_hlo(ADD_HLO)
    a, b = _values([(8, 4), (8, 4)])
    elsewhere = jax.device_put(a, DEVICES[5])
    counts = Counts()
    for _ in range(2):
        (out,) = f(elsewhere, b)
        np.testing.assert_array_equal(np.asarray(out), a + b)
    assert counts.fallbacks() == {"moved_argument": 2}


def test_equivalent_shardings_of_another_kind_pass_through():
    f = fastpjit.compile_hlo(ADD_HLO)
    mesh = Mesh(np.array(DEVICES[:2]), ("x",))
    named = NamedSharding(mesh, P("x"))
    a, b = (jax.device_put(v, named) for v in _values([(8, 4), (8, 4)]))
    counts = Counts()
    for _ in range(3):
        (out,) = f(a, b)
    np.testing.assert_array_equal(np.asarray(out), np.asarray(a) + np.asarray(b))
    assert counts.fallbacks() == {}
    assert counts["cache_hits"] == 2


def test_parameter_shardings_alone_are_kept():
    # Shardings on the parameters only, no `Sharding` custom call: PjRt's own check keeps
    # Shardy on for such a module, and Shardy drops them: it would compile replicated.
    text = """\
HloModule only_parameters, entry_computation_layout={(f32[8,4]{1,0})->f32[8,4]{1,0}}

ENTRY %main (p0: f32[8,4]) -> f32[8,4] {
  %p0 = f32[8,4]{1,0} parameter(0), sharding={devices=[4,1]0,1,2,3}
  ROOT %negate = f32[8,4]{1,0} negate(%p0)
}
"""
    f = fastpjit.compile_hlo(text)
    assert annotated(f.input_shardings[0], "{devices=[4,1]0,1,2,3}", DEVICES[:4])
    (a,) = _values([(8, 4)])
    out = f(a)  # the root is not a tuple: one array
    assert isinstance(out, jax.Array)
    np.testing.assert_array_equal(np.asarray(out), -a)
    assert "f32[2,4]" in f.as_text()


def test_parameters_without_a_sharding_are_replicated():
    # As in PyTorch/XLA: XLA does not choose shardings for the parameters.
    text = """\
HloModule half_annotated

ENTRY %main (p0: f32[8,4], p1: f32[8,4]) -> f32[8,4] {
  %p0 = f32[8,4]{1,0} parameter(0), sharding={devices=[4,1]0,1,2,3}
  %p1 = f32[8,4]{1,0} parameter(1)
  ROOT %add = f32[8,4]{1,0} add(%p0, %p1), sharding={devices=[4,1]0,1,2,3}
}
"""
    f = fastpjit.compile_hlo(text)
    assert f.input_shardings[1].is_fully_replicated
    assert f.output_shardings[0] == f.input_shardings[0]
    a, b = _values([(8, 4), (8, 4)])
    np.testing.assert_array_equal(np.asarray(f(a, b)), a + b)


def test_a_manual_region_written_by_hand():
    # A per-shard sum over the second axis of a [2,4] tiling, in GSPMD's manual form.
    text = """\
HloModule manual_sum, num_partitions=8

%sum (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %add = f32[] add(%a, %b)
}

ENTRY %main (p0: f32[8,8]) -> (f32[8,2]) {
  %p0 = f32[8,8]{1,0} parameter(0), sharding={devices=[2,4]<=[8]}
  %full = f32[8,8]{1,0} custom-call(%p0), custom_call_target="Sharding", sharding={devices=[2,4]<=[8]}
  %local = f32[4,2]{1,0} custom-call(%full), custom_call_target="SPMDFullToShardShape", sharding={manual}
  %summed = f32[4,2]{1,0} all-reduce(%local), channel_id=1, replica_groups={{0,1,2,3},{4,5,6,7}}, use_global_device_ids=true, to_apply=%sum, sharding={manual}
  %back = f32[4,2]{1,0} custom-call(%summed), custom_call_target="Sharding", sharding={manual}
  %global = f32[8,2]{1,0} custom-call(%back), custom_call_target="SPMDShardToFullShape", sharding={devices=[2,1,4]<=[8] last_tile_dim_replicate}
  ROOT %tuple = (f32[8,2]{1,0}) tuple(%global)
}
"""  # noqa: E501
    f = fastpjit.compile_hlo(text)
    assert f.num_devices == 8
    (a,) = _values([(8, 8)])
    (out,) = f(a)
    expected = a.reshape(8, 4, 2).sum(axis=1)
    np.testing.assert_array_equal(np.asarray(out), expected)
    assert same_sharding(
        out.sharding,
        fastpjit.parse_hlo_sharding("{devices=[2,1,4]<=[8] last_tile_dim_replicate}", DEVICES),
        2,
    )


def test_devices_map_the_module_device_ids():
    # Device id i in the module is devices[i]: here device 0 of the module is DEVICES[7].
    devices = [DEVICES[7], DEVICES[3]]
    f = fastpjit.compile_hlo(ADD_HLO, devices)
    assert annotated(f.input_shardings[0], "{devices=[2,1]0,1}", devices)
    a, b = _values([(8, 4), (8, 4)])
    (out,) = f(a, b)
    np.testing.assert_array_equal(np.asarray(out), a + b)
    assert out.sharding.devices_indices_map((8, 4))[DEVICES[7]] == (slice(0, 4), slice(None))
    (top,) = [s for s in out.addressable_shards if s.device == DEVICES[7]]
    np.testing.assert_array_equal(np.asarray(top.data), (a + b)[:4])


def test_scalars_numpy_dtypes_and_a_module_without_shardings():
    text = """\
HloModule axpy

ENTRY %main (alpha: f32[], x: f32[3], n: s32[]) -> (f32[3], s32[]) {
  %alpha = f32[] parameter(0)
  %x = f32[3]{0} parameter(1)
  %n = s32[] parameter(2)
  %broadcast = f32[3]{0} broadcast(%alpha), dimensions={}
  %scaled = f32[3]{0} multiply(%broadcast, %x)
  %one = s32[] constant(1)
  %next = s32[] add(%n, %one)
  ROOT %tuple = (f32[3]{0}, s32[]) tuple(%scaled, %next)
}
"""
    f = fastpjit.compile_hlo(text)
    assert f.num_devices == 1
    x = np.array([1.0, 2.0, 3.0])  # float64: JAX's canonical dtype is float32 without x64
    scaled, n = f(2.0, x, 41)
    np.testing.assert_array_equal(np.asarray(scaled), [2.0, 4.0, 6.0])
    assert scaled.dtype == np.float32 and n.dtype == np.int32 and int(n) == 42
    scaled, n = f(np.float32(3), jnp.asarray(x, jnp.float32), np.int32(1))
    np.testing.assert_array_equal(np.asarray(scaled), [3.0, 6.0, 9.0])
    assert int(n) == 2


def test_a_pinned_entry_layout_is_honoured():
    # The parameter's layout is column-major in the header; jax.Arrays are row-major.
    text = """\
HloModule transposed_layout, entry_computation_layout={(f32[8,4]{0,1})->f32[8,4]{1,0}}, num_partitions=2

ENTRY %main (p0: f32[8,4]) -> f32[8,4] {
  %p0 = f32[8,4]{0,1} parameter(0), sharding={devices=[2,1]0,1}
  ROOT %negate = f32[8,4]{1,0} negate(%p0)
}
"""  # noqa: E501
    f = fastpjit.compile_hlo(text)
    (a,) = _values([(8, 4)])
    np.testing.assert_array_equal(np.asarray(f(a)), -a)
    np.testing.assert_array_equal(np.asarray(f(jax.device_put(a, f.input_shardings[0]))), -a)


def test_donated_parameters_are_consumed():
    f = fastpjit.compile_hlo(ADD_HLO, donate_argnums=0)
    values = _values([(8, 4), (8, 4)])
    a, b = (jax.device_put(v, s) for v, s in zip(values, f.input_shardings, strict=True))
    (out,) = f(a, b)
    np.testing.assert_array_equal(np.asarray(out), values[0] + values[1])
    assert a.is_deleted() and not b.is_deleted()
    # As JAX's cached path has it (where it does not crash).
    with pytest.raises(DONATED_AGAIN[0], match=DONATED_AGAIN[1]):
        f(a, b)


def test_a_donated_buffer_that_is_also_another_argument_is_refused():
    # jaxlib crashes on it with multi-device arrays (jax.jit as well); on a miss and on a hit.
    f = fastpjit.compile_hlo(ADD_HLO, donate_argnums=(0,))
    sharding = f.input_shardings[0]
    fresh = [jax.device_put(v, sharding) for v in _values([(8, 4), (8, 4)])]
    c = jax.device_put(np.ones((8, 4), np.float32), sharding)
    message = (
        r"INVALID_ARGUMENT: Attempt to use a buffer that was previously donated in the "
        r"same call to Execute\(\) \(flattened argument 1, replica 0, partition 0, first "
        r"use: 0\)"
    )
    with pytest.raises(ValueError, match=message):
        f(c, c)  # a miss
    f(*fresh)  # caches the entry for arrays on this sharding
    with pytest.raises(ValueError, match=message):
        f(c, c)  # a hit
    alias = jax.device_put(c, NamedSharding(Mesh(np.array(DEVICES[:2]), ("x",)), P("x")))
    assert alias is not c
    with pytest.raises(ValueError, match=message):
        f(c, alias)  # another array object over the same buffers
    assert not c.is_deleted()
    (out,) = f(c, np.ones((8, 4), np.float32))
    np.testing.assert_array_equal(np.asarray(out), np.full((8, 4), 2.0))


# --- Modules lowered by JAX ------------------------------------------------------------------

MESH = Mesh(np.array(DEVICES).reshape(2, 4), ("x", "y"), axis_types=(AxisType.Auto,) * 2)
PERMUTED = NamedSharding(MESH, P("x", "y"), _logical_device_ids=(0, 2, 4, 6, 1, 3, 5, 7))
ROWS = NamedSharding(MESH, P("x"))  # partially replicated: last_tile_dim_replicate
COLUMNS = NamedSharding(MESH, P(None, "y"))


def _sharded(a, b):
    return a * 2 + jnp.sum(b), jnp.sin(a) @ b


def _manual(a):
    return jax.shard_map(
        lambda x: jax.lax.psum(x, "y") * 2, mesh=MESH, in_specs=P("x", "y"), out_specs=P("x")
    )(a)


def _open_output(a):
    return jnp.cos(a), a.sum(axis=1)


JAX_PROGRAMS = {
    "shardings": (
        lambda: jax.jit(_sharded, in_shardings=(PERMUTED, ROWS), out_shardings=(ROWS, COLUMNS)),
        [(8, 8), (8, 4)],
    ),
    "manual": (lambda: jax.jit(_manual), [(8, 8)]),
}


@contextlib.contextmanager
def partitioner(shardy: bool) -> Iterator[None]:
    before = jax.config.jax_use_shardy_partitioner
    jax.config.update("jax_use_shardy_partitioner", shardy)
    try:
        yield
    finally:
        jax.config.update("jax_use_shardy_partitioner", before)


def module_forms(lowered: Any) -> dict[str, str | bytes]:
    bytecode = io.BytesIO()
    lowered.compiler_ir("stablehlo").operation.write_bytecode(bytecode)
    return {
        "hlo text": lowered.as_text(dialect="hlo"),
        "stablehlo text": lowered.as_text(),
        "bytecode": bytecode.getvalue(),
    }


def _check_against_jax(f: Any, jitted: Any, args: list[np.ndarray]) -> None:
    compiled = jitted.lower(*args).compile()
    for ours, theirs, aval in zip(
        f.input_shardings, compiled.input_shardings[0], f.in_avals, strict=True
    ):
        assert same_sharding(ours, theirs, aval.ndim), (ours, theirs)
    expected = jax.tree.leaves(jitted(*args))
    counts = Counts()
    for _ in range(2):
        got = f(*args)
        leaves = list(got) if isinstance(got, tuple) else [got]
        assert len(leaves) == len(expected)
        for ours, theirs in zip(leaves, expected, strict=True):
            np.testing.assert_allclose(np.asarray(ours), np.asarray(theirs), rtol=1e-6)
            assert ours.dtype == theirs.dtype
            assert same_sharding(ours.sharding, theirs.sharding, ours.ndim), (
                ours.sharding,
                theirs.sharding,
            )
    assert counts["cache_hits"] == 1 and counts.fallbacks() == {}


@pytest.mark.parametrize("form", ["hlo text", "stablehlo text", "bytecode"])
@pytest.mark.parametrize("program", sorted(JAX_PROGRAMS))
@pytest.mark.parametrize("shardy", [True, False], ids=["shardy", "gspmd"])
def test_modules_lowered_by_jax(shardy, program, form):
    make, shapes = JAX_PROGRAMS[program]
    args = _values(shapes, seed=2)
    with partitioner(shardy):
        jitted = make()
        lowered = jitted.lower(*args)
        module = module_forms(lowered)[form]
        if program == "shardings" and form == "hlo text":
            # The permuted device order and the partial replication, as XLA prints them.
            assert "{devices=[2,4]0,2,4,6,1,3,5,7}" in module
            assert "last_tile_dim_replicate" in module
        if program == "manual" and form == "hlo text":
            # The manual region and its collective, in GSPMD's or in Shardy's words.
            assert "all-reduce(" in module
            assert (
                ("SPMDFullToShardShape" in module and "sharding={manual}" in module)
                if not shardy
                else "xla.sdy.GlobalToLocalShape" in module
            )
        f = fastpjit.compile_hlo(module)
        assert f.num_devices == 8
        _check_against_jax(f, jitted, args)


def test_a_stablehlo_portable_artifact():
    args = _values([(8, 8), (8, 4)], seed=3)
    jitted = jax.jit(_sharded, in_shardings=(PERMUTED, ROWS), out_shardings=(ROWS, COLUMNS))
    exported = jax.export.export(jitted)(*args)
    artifact = exported.mlir_module_serialized
    assert artifact.startswith(b"ML\xefR") and b"StableHLO" in artifact[:32]
    f = fastpjit.compile_hlo(artifact)
    _check_against_jax(f, jitted, args)


@pytest.mark.parametrize("out_shardings", [None, (ROWS, None)], ids=["all open", "one open"])
@pytest.mark.parametrize("form", ["stablehlo text", "hlo text"])
def test_xla_chooses_open_output_shardings_as_for_jax(form, out_shardings):
    # With one result sharded, JAX's HLO text also writes an HLO sharding for every result
    # (`{replicated}` for the open one) beside the Shardy ones that hold.
    args = _values([(8, 8)], seed=4)
    options = {} if out_shardings is None else {"out_shardings": out_shardings}
    jitted = jax.jit(_open_output, in_shardings=(PERMUTED,), **options)
    f = fastpjit.compile_hlo(module_forms(jitted.lower(*args))[form])
    _check_against_jax(f, jitted, args)


def test_hlo_text_of_a_gspmd_lowering_writes_open_outputs_as_replicated():
    # Once any result is sharded, XLA's printer gives the root tuple a sharding for every
    # element, `{replicated}` for the open ones; compile_hlo keeps what the text says.
    args = _values([(8, 8)], seed=5)
    with partitioner(False):
        jitted = jax.jit(_open_output, in_shardings=(PERMUTED,), out_shardings=(ROWS, None))
        text = jitted.lower(*args).as_text(dialect="hlo")
    assert "{replicated}" in text
    f = fastpjit.compile_hlo(text)
    first, second = f(*args)
    assert same_sharding(first.sharding, ROWS, 2)
    assert second.sharding.is_fully_replicated
    np.testing.assert_allclose(np.asarray(second), args[0].sum(axis=1))


def hlo_module_proto(text: str) -> bytes:
    """The serialized HloModuleProto of HLO text, as a frontend that writes protos gives it."""
    return xc.hlo.hlo_module_from_text(text).as_serialized_hlo_module_proto()


def test_serialized_hlo_module_proto():
    f = fastpjit.compile_hlo(hlo_module_proto(MATMUL_HLO))
    a, b = _values([(4, 6), (6, 8)])
    (out,) = f(a, b)
    np.testing.assert_array_equal(np.asarray(out), a @ b)
    assert annotated(f.input_shardings[0], "{devices=[2,2]0,1,2,3}", DEVICES[:4])


# --- Bad input -------------------------------------------------------------------------------


def test_malformed_hlo_text_names_the_line():
    text = ADD_HLO.replace("add(f32[8,4]{1,0} %x.4", "ad(f32[8,4]{1,0} %x.4")
    # XLA's parser names line 6, column 31: the opcode of the sub-computation's root.
    with pytest.raises(ValueError, match=r"(?s)malformed HLO text.*\b6:31: .*opcode"):
        fastpjit.compile_hlo(text)


def test_malformed_stablehlo_text_names_the_line():
    text = (
        "module @bad {\n  func.func public @main(%a: tensor<2xf32>) -> tensor<2xf32> {\n"
        "    return %b : tensor<2xf32>\n  }\n}\n"
    )
    with pytest.raises(ValueError, match=r"(?s)malformed MLIR module.*:3:12: use of undeclared"):
        fastpjit.compile_hlo(text)


def test_bytes_that_are_no_module():
    with pytest.raises(ValueError, match="neither MLIR bytecode nor a serialized HloModuleProto"):
        fastpjit.compile_hlo(b"\x00\x01 not a module")
    with pytest.raises(ValueError, match="malformed MLIR module"):
        fastpjit.compile_hlo(b"ML\xefR\x00truncated")
    with pytest.raises(TypeError, match="text or bytes"):
        fastpjit.compile_hlo(42)


def test_wrong_arguments_are_type_errors_before_jaxlib():
    f = fastpjit.compile_hlo(MUL_HLO)
    a, b = _values([(8, 16), (8, 16)])
    f(a, b)  # a cached entry must not let bad calls through either
    f(a, b)
    cases = [
        ((a,), r"takes 2 arguments \(float32\[8,16\], float32\[8,16\]\).*got 1"),
        ((a, b, b), r"takes 2 arguments.*got 3"),
        ((a, b[:4]), r"parameter 1 expects float32\[8,16\], got float32\[4,16\]"),
        ((a, b.astype(np.int32)), r"parameter 1 expects float32\[8,16\], got int32\[8,16\]"),
        ((jnp.zeros((8, 16), jnp.int32), b), r"parameter 0 expects float32\[8,16\], got int32"),
        ((jnp.zeros((16, 8)), b), r"parameter 0 expects float32\[8,16\], got float32\[16,8\]"),
        ((a, 1.0), r"parameter 1 expects float32\[8,16\], got float32\[\]"),
        ((a, [b]), r"parameter 1 takes a jax.Array, numpy array or scalar, got list"),
        ((a, "b"), r"parameter 1 takes a jax.Array, numpy array or scalar, got str"),
        ((None, b), r"parameter 0 takes a jax.Array, numpy array or scalar, got NoneType"),
    ]
    for args, message in cases:
        with pytest.raises(TypeError, match=message):
            f(*args)
    with pytest.raises(TypeError, match="positional arguments only"):
        f(a, y=b)
    scalar = fastpjit.compile_hlo(
        "HloModule s\n\nENTRY %main (p: f32[]) -> f32[] {\n"
        "  %p = f32[] parameter(0)\n  ROOT %n = f32[] negate(%p)\n}\n"
    )
    with pytest.raises(TypeError, match=r"parameter 0 expects float32\[\], got int32\[\]"):
        scalar(1)  # a Python int is int32, as JAX takes it
    assert float(scalar(1.5)) == -1.5


def test_tracers_are_refused():
    f = fastpjit.compile_hlo(ADD_HLO)
    with pytest.raises(TypeError, match="tracer"):
        jax.jit(lambda a, b: f(a, b))(*_values([(8, 4), (8, 4)]))


def test_the_compile_is_counted_once():
    counts = Counts()
    f = fastpjit.compile_hlo(ADD_HLO.replace("SyncTensorsGraph.9", "CountedOnce"))
    assert counts["compiles"] == 1
    placed = [
        jax.device_put(v, s)
        for v, s in zip(_values([(8, 4), (8, 4)]), f.input_shardings, strict=True)
    ]
    for _ in range(3):
        f(*placed)
    assert (counts["compiles"], counts["cache_misses"], counts["cache_hits"]) == (1, 1, 2)


def test_calls_depend_on_no_jax_configuration():
    # A compiled module reads no configuration: x64, disable_jit, debug_nans or an active
    # trace leave its calls cache hits (jax.jit would retrace or hand them to Python).
    f = fastpjit.compile_hlo(ADD_HLO)
    placed = [
        jax.device_put(v, s)
        for v, s in zip(_values([(8, 4), (8, 4)]), f.input_shardings, strict=True)
    ]
    expected = np.asarray(f(*placed)[0])
    counts = Counts()
    with jax.disable_jit(), jax.debug_nans(True), jax.enable_x64(True):
        (out,) = f(*placed)
    jax.make_jaxpr(lambda: f(*placed))()
    assert (counts["cache_misses"], counts["cache_hits"]) == (0, 2)
    assert counts.fallbacks() == {}
    np.testing.assert_array_equal(np.asarray(out), expected)


@pytest.mark.parametrize("text", [ADD_HLO, MUL_HLO], ids=["2 devices", "8 devices"])
def test_repeated_calls_of_placed_arrays_still_check_every_array(text):
    # A repeat of the latest entry's arrays skips building a signature; what it takes must
    # still be proven, and a deleted array named, not handed to jaxlib.
    f = fastpjit.compile_hlo(text)
    sharding = f.input_shardings[0]
    values = _values([f.in_avals[0].shape] * 2)
    a, b = (jax.device_put(v, s) for v, s in zip(values, f.input_shardings, strict=True))
    counts = Counts()
    (out,) = f(a, b)
    for _ in range(3):
        (out,) = f(out, b)  # the outputs' aval objects are not the first call's
    assert (counts["cache_misses"], counts["cache_hits"]) == (1, 3)
    assert counts.fallbacks() == {}
    np.testing.assert_array_equal(
        np.asarray(out),
        values[0] * values[1] ** 4 if text is MUL_HLO else values[0] + 4 * values[1],
    )
    shape = f.in_avals[1].shape
    short = jax.device_put(np.zeros((shape[0] // 2, *shape[1:]), np.float32), sharding)
    with pytest.raises(TypeError, match=r"parameter 1 expects float32\[.*\], got float32"):
        f(out, short)
    out.delete()
    with pytest.raises(RuntimeError, match="deleted"):
        f(out, b)
    assert (counts["cache_misses"], counts["cache_hits"]) == (2, 4)


def test_an_array_made_at_a_freed_arrays_address_is_checked_anew():
    # The repeat path remembers the latest call's arrays; CPython gives a new array the
    # address of one just freed, and that one must still be checked.
    f = fastpjit.compile_hlo(ADD_HLO)
    sharding, shape = f.input_shardings[0], f.in_avals[0].shape
    b = jax.device_put(np.ones(shape, np.float32), f.input_shardings[1])
    full = jax.jit(lambda: jnp.ones(shape, jnp.float32), out_shardings=sharding)
    short = jax.jit(
        lambda: jnp.ones((shape[0] // 2, *shape[1:]), jnp.float32), out_shardings=sharding
    )
    reused = 0
    for _ in range(5):
        a = full()
        for _ in range(3):
            f(a, b)
        address = id(a)
        del a
        c = short()
        reused += id(c) == address
        with pytest.raises(TypeError, match=r"parameter 0 expects float32\[.*\], got float32"):
            f(c, b)
    assert reused, "no array was made at a freed array's address: this test proves nothing"


def test_more_partitions_than_devices():
    text = ADD_HLO.replace("{devices=[2,1]0,1}", "{devices=[16,1]<=[16]}").replace(
        "f32[8,4]", "f32[16,4]"
    )
    with pytest.raises(ValueError, match="16 partitions, but there are only 8 devices"):
        fastpjit.compile_hlo(text)
    with pytest.raises(ValueError, match="2 partitions, but 3 devices were given"):
        fastpjit.compile_hlo(ADD_HLO, DEVICES[:3])
    with pytest.raises(ValueError, match="twice"):
        fastpjit.compile_hlo(ADD_HLO, [DEVICES[0], DEVICES[0]])
    header = ADD_HLO.replace("(f32[8,4]{1,0})}", "(f32[8,4]{1,0})}, num_partitions=9")
    with pytest.raises(ValueError, match="9 partitions"):
        fastpjit.compile_hlo(header)


def test_unsupported_modules_are_not_implemented():
    replicas = ADD_HLO.replace("(f32[8,4]{1,0})}", "(f32[8,4]{1,0})}, replica_count=2")
    with pytest.raises(NotImplementedError, match="2 replicas"):
        fastpjit.compile_hlo(replicas)
    tuple_parameter = """\
HloModule tupled

ENTRY %main (p: (f32[2], f32[2])) -> f32[2] {
  %p = (f32[2]{0}, f32[2]{0}) parameter(0)
  %a = f32[2]{0} get-tuple-element(%p), index=0
  %b = f32[2]{0} get-tuple-element(%p), index=1
  ROOT %add = f32[2]{0} add(%a, %b)
}
"""
    with pytest.raises(NotImplementedError, match="arrays only"):
        fastpjit.compile_hlo(tuple_parameter)


def test_bad_donate_argnums():
    with pytest.raises(ValueError, match="donate_argnums has 2, but the module has 2"):
        fastpjit.compile_hlo(ADD_HLO, donate_argnums=(2,))


def test_repr_and_error_names_the_module():
    f = fastpjit.compile_hlo(ADD_HLO)
    assert repr(f) == "<fastpjit.compile_hlo of SyncTensorsGraph.9 on 2 devices>"
    with pytest.raises(TypeError, match=re.escape("SyncTensorsGraph.9: parameter 0")):
        f(np.zeros((1,), np.float32), np.zeros((8, 4), np.float32))


PERSISTENT_CACHE_CHILD = """
import json, sys
import jax
import numpy as np

jax.config.update("jax_compilation_cache_dir", sys.argv[1])
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
import fastpjit
from fastpjit._jax.xla_compile import backend_compiles

hits = []
jax.monitoring.register_event_listener(
    lambda event, **_: hits.append(event) if event == "/jax/compilation_cache/cache_hits" else None)
f = fastpjit.compile_hlo(sys.argv[2])
(out,) = f(np.ones((8, 4), np.float32), np.ones((8, 4), np.float32))
print(json.dumps({"compiles": backend_compiles(), "hits": len(hits),
                  "stats": fastpjit.stats()["compiles"], "out": np.asarray(out).tolist()}))
"""


@pytest.mark.slow
@pytest.mark.subprocess
def test_persistent_compilation_cache_spares_a_second_process_the_compile(tmp_path):
    def child() -> dict[str, Any]:
        result = subprocess.run(
            [sys.executable, "-c", PERSISTENT_CACHE_CHILD, str(tmp_path), ADD_HLO],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert result.returncode == 0, result.stdout + result.stderr[-3000:]
        return json.loads(result.stdout.splitlines()[-1])

    first, second = child(), child()
    assert (first["compiles"], first["stats"], first["hits"]) == (1, 1, 0)
    assert (second["compiles"], second["stats"], second["hits"]) == (0, 0, 1)
    assert second["out"] == first["out"] == np.full((8, 4), 2.0).tolist()
