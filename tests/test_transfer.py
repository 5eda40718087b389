"""device_put and device_get, differential against jax.device_put and np.asarray on 8 CPU devices.

JAX is the oracle for every result: value, dtype, weak type, shape, aval, sharding, committed,
and the bytes of every addressable shard. Errors must have JAX's exception types, leave no
device buffers behind, and the shard path's caches and the process's memory must stay bounded.
"""

from __future__ import annotations

import collections
import enum
import gc
import math
import re
import time
import warnings
from typing import Any

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from jax._src import dtypes as jax_dtypes
from jax.sharding import AxisType, Mesh, NamedSharding, SingleDeviceSharding
from jax.sharding import PartitionSpec as P
from lines import ON_0_10, by_line
from oracle import assert_same_array, host_bytes
from threads import run_in_threads

import fastpjit
from fastpjit import _core

DEVICES = tuple(jax.devices())
AXIS_NAMES = ("x", "y")
ML_DTYPE_NAMES = (
    "bfloat16",
    "float4_e2m1fn",
    "float8_e3m4",
    "float8_e4m3",
    "float8_e4m3b11fnuz",
    "float8_e4m3fn",
    "float8_e4m3fnuz",
    "float8_e5m2",
    "float8_e5m2fnuz",
    "float8_e8m0fnu",
    "int1",
    "int2",
    "int4",
    "uint1",
    "uint2",
    "uint4",
    # XLA's CPU client holds the float6 types from jaxlib 0.11.2.
    *by_line(jax_0_10=(), jax_0_11=("float6_e2m3fn", "float6_e3m2fn")),
)
# Every dtype that JAX places on the CPU.
DTYPES = tuple(
    np.dtype(t)
    for t in (
        np.bool_,
        np.int8,
        np.int16,
        np.int32,
        np.int64,
        np.uint8,
        np.uint16,
        np.uint32,
        np.uint64,
        np.float16,
        np.float32,
        np.float64,
        np.complex64,
        np.complex128,
    )
) + tuple(np.dtype(getattr(ml_dtypes, name)) for name in ML_DTYPE_NAMES)
LAYOUTS = ("c", "offset", "fortran", "transposed", "reversed", "strided", "broadcast")


def test_the_suite_runs_on_eight_cpu_devices_without_x64():
    assert len(DEVICES) == 8 and {d.platform for d in DEVICES} == {"cpu"}
    assert not jax.config.jax_enable_x64


def test_every_jax_dtype_is_covered():
    """DTYPES is every dtype JAX accepts, but float0 (tested alone), StringDType (tested
    alone) and, on jax 0.10.2, the float6 types, which its XLA CPU client cannot hold."""
    left_out = {str(d) for d in jax_dtypes._jax_dtype_set if d not in DTYPES}
    float6 = {"float6_e2m3fn", "float6_e3m2fn"}
    assert left_out == {"[('float0', 'V')]", "StringDType()"} | by_line(
        jax_0_10=float6, jax_0_11=set()
    )
    for name in float6 & left_out:
        x = np.zeros(8, getattr(ml_dtypes, name))
        with pytest.raises(jax.errors.JaxRuntimeError):
            jax.device_put(x, DEVICES[0])
        with pytest.raises(jax.errors.JaxRuntimeError):
            fastpjit.device_put(x, DEVICES[0])


# --- Host values ----------------------------------------------------------------------------


def _int_info(dtype):
    return ml_dtypes.iinfo(dtype) if dtype.name in ML_DTYPE_NAMES else np.iinfo(dtype)


def host_values(dtype, shape, seed):
    """Random values of `dtype` with specials (nan, inf, -0.0, huge) among the floats."""
    rng = np.random.default_rng(seed)
    n = math.prod(shape)
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return _draw_values(rng, dtype, n).astype(dtype).reshape(shape)


def _draw_values(rng, dtype, n):
    if dtype == np.bool_:
        return rng.random(n) < 0.5
    if dtype.kind in "iu" or dtype.name in ("int1", "int2", "int4", "uint1", "uint2", "uint4"):
        info = _int_info(dtype)
        wide = np.int64 if int(info.min) < 0 else np.uint64
        return rng.integers(int(info.min), int(info.max), size=n, dtype=wide, endpoint=True)
    specials = np.array([np.nan, np.inf, -np.inf, -0.0, 0.0, 1e300, -1e-300, 65504.0])
    parts = []
    for _ in range(2 if dtype.kind == "c" else 1):
        part = rng.standard_normal(n) * 10.0 ** rng.integers(-4, 5, size=n)
        mask = rng.random(n) < 0.15
        part[mask] = rng.choice(specials, size=int(mask.sum()))
        parts.append(part)
    if dtype.kind != "c":
        return parts[0]
    v = np.empty(n, np.complex128)
    v.real, v.imag = parts
    return v


def lay_out(v, layout):
    """`v`'s values (or a broadcast of part of them) in another memory layout."""
    if layout == "c":
        return v
    if layout == "offset":  # C order, but not aligned to more than an item
        buffer = np.empty(v.size + 1, v.dtype)
        buffer[1:] = v.ravel()
        return buffer[1:].reshape(v.shape)
    if layout == "fortran":
        return np.asfortranarray(v)
    if layout == "transposed":
        return v.T.copy().T
    if layout == "reversed":  # negative strides on every axis
        return np.flip(np.flip(v).copy())
    if layout == "strided":  # a step slice
        return np.repeat(v, 2, axis=-1)[..., ::2] if v.ndim else v
    if layout == "broadcast":  # a zero stride on the first axis
        return np.broadcast_to(v[:1], v.shape) if v.ndim and v.size else v
    raise AssertionError(layout)


# --- Targets ----------------------------------------------------------------------------------


def _factorings(n):
    return [(n,)] + [(a, n // a) for a in range(1, n + 1) if n % a == 0]


@st.composite
def meshes(draw):
    """1-D and 2-D meshes over a permuted subset (or all) of the devices."""
    size = draw(st.sampled_from((8, 4, 2, 1, 6, 3)))
    devices = draw(st.permutations(DEVICES))[:size]
    dims = draw(st.sampled_from(_factorings(size)))
    axis_type = draw(st.sampled_from((AxisType.Explicit, AxisType.Auto)))
    grid = np.array(devices, dtype=object).reshape(dims)
    return Mesh(grid, AXIS_NAMES[: len(dims)], axis_types=(axis_type,) * len(dims))


@st.composite
def named_cases(draw, max_rank=3):
    """A NamedSharding and a global shape that it divides evenly (zero-size dims included)."""
    mesh = draw(meshes())
    rank = draw(st.integers(0, max_rank))
    home = {name: draw(st.sampled_from((None, *range(rank)))) for name in mesh.axis_names}
    order = draw(st.permutations(mesh.axis_names))
    entries, shape = [], []
    for dim in range(rank):
        axes = tuple(name for name in order if home[name] == dim)
        if not axes:
            entries.append(None)
        elif len(axes) == 1 and draw(st.booleans()):
            entries.append(axes[0])
        else:
            entries.append(axes)
        tiles = math.prod(mesh.shape[name] for name in axes)
        shape.append(tiles * draw(st.sampled_from((1, 2, 3, 0))))
    while entries and entries[-1] is None and draw(st.booleans()):
        entries.pop()  # a spec shorter than the rank
    return NamedSharding(mesh, P(*entries)), tuple(shape)


def gspmd_of(named, rank):
    """The same placement as a GSPMDSharding, through fastpjit's HLO sharding parser."""
    hlo = str(named._to_xla_hlo_sharding(rank))
    return fastpjit.parse_hlo_sharding(hlo, named._device_assignment)


@st.composite
def targets(draw, max_rank=3):
    """(target, shape): a NamedSharding, GSPMDSharding, SingleDeviceSharding or Device."""
    kind = draw(st.sampled_from(("named", "gspmd", "single", "device")))
    named, shape = draw(named_cases(max_rank))
    if kind == "named":
        return named, shape
    if kind == "gspmd":
        return gspmd_of(named, len(shape)), shape
    device = draw(st.sampled_from(DEVICES))
    return (SingleDeviceSharding(device) if kind == "single" else device), shape


# --- The oracle -------------------------------------------------------------------------------


def shard_values(a):
    return [(s.device, s.index, s.replica_id, host_bytes(s.data)) for s in a.addressable_shards]


def assert_same_array_bitwise(ours, ref):
    """`ours` is JAX's `ref` (oracle.assert_same_array), bit for bit in every shard and
    replica; returns fastpjit.device_get(ours)."""
    assert_same_array(ours, ref)
    assert str(ours.aval) == str(ref.aval)
    assert shard_values(ours) == shard_values(ref)
    return assert_get_matches(ours, ref)


def put_both(x, target):
    """(fastpjit's result, JAX's result); casts that overflow warn alike in both (tested apart)."""
    with np.errstate(all="ignore"):
        ref = jax.device_put(x, target)
        ours = fastpjit.device_put(x, target)
    return ours, ref


def assert_get_matches(a, ref):
    """device_get(a) equals np.asarray of an equal array `ref` and is cached where JAX caches.

    Nothing may have read `a` to the host before: the value would come from JAX's cache.
    """
    got = fastpjit.device_get(a)
    assert type(got) is np.ndarray
    assert host_bytes(got) == host_bytes(np.asarray(ref))
    assert not got.flags.writeable
    if not a.is_fully_replicated:
        assert np.asarray(a) is got and jax.device_get(a) is got
    return got


def canonical(x):
    """x's value as JAX stores it (64-bit types narrowed, since x64 is off)."""
    x = np.asarray(x)
    with np.errstate(all="ignore"):
        return x.astype(jax_dtypes.canonicalize_dtype(x.dtype))


# --- device_put of host arrays --------------------------------------------------------------


@given(
    case=targets(),
    dtype=st.sampled_from(DTYPES),
    layout=st.sampled_from(LAYOUTS),
    seed=st.integers(0, 2**32 - 1),
)
def test_device_put_matches_jax(case, dtype, layout, seed):
    target, shape = case
    x = lay_out(host_values(dtype, shape, seed), layout)
    ours, ref = put_both(x, target)
    got = assert_same_array_bitwise(ours, ref)
    assert host_bytes(got) == host_bytes(canonical(x))


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_every_dtype_and_layout_on_a_permuted_mesh(dtype, layout):
    devices = np.array([DEVICES[i] for i in (5, 2, 7, 0, 3, 6, 1, 4)]).reshape(2, 4)
    mesh = Mesh(devices, ("x", "y"))
    for spec in (P("x", "y"), P(None, ("y", "x")), P("y")):
        x = lay_out(host_values(dtype, (8, 16), seed=7), layout)
        ours, ref = put_both(x, NamedSharding(mesh, spec))
        assert host_bytes(assert_same_array_bitwise(ours, ref)) == host_bytes(canonical(x))


HLO_TEXTS = (
    "{replicated}",
    "{maximal device=5}",
    "{devices=[2,4]<=[8]}",
    "{devices=[4,2]<=[2,4]T(1,0)}",
    "{devices=[2,1,4]<=[8] last_tile_dim_replicate}",
    "{devices=[1,2,4]<=[2,2,2]T(2,0,1) last_tile_dim_replicate}",
    "{devices=[2,2,2]7,6,5,4,3,2,1,0 last_tile_dim_replicate}",
    "{devices=[4,2]0,2,4,6,1,3,5,7}",
)


@pytest.mark.parametrize("text", HLO_TEXTS)
@pytest.mark.parametrize("devices", ["ordered", "reversed"])
def test_device_put_onto_parsed_hlo_shardings(text, devices):
    order = DEVICES if devices == "ordered" else DEVICES[::-1]
    sharding = fastpjit.parse_hlo_sharding(text, order)
    for shape, dtype in (((8, 12), np.float32), ((4, 0), np.int8), ((16, 4), ml_dtypes.int4)):
        x = lay_out(host_values(np.dtype(dtype), shape, seed=3), "reversed")
        ours, ref = put_both(x, sharding)
        assert_same_array_bitwise(ours, ref)


# --- Scalars and pytrees ----------------------------------------------------------------------

python_scalars = st.one_of(
    st.booleans(),
    st.integers(-(2**31), 2**31 - 1),
    st.floats(allow_nan=True, allow_infinity=True),
    st.complex_numbers(allow_nan=True, allow_infinity=True),
)


@st.composite
def numpy_scalars(draw):
    dtype = draw(st.sampled_from(DTYPES))
    return host_values(dtype, (1,), draw(st.integers(0, 2**32 - 1)))[0]


@st.composite
def rank0_targets(draw):
    """A target that a 0-d value fits."""
    kind = draw(st.sampled_from(("named", "gspmd", "single", "device")))
    mesh = draw(meshes())
    named = NamedSharding(mesh, P())
    return {
        "named": named,
        "gspmd": gspmd_of(named, 0),
        "single": SingleDeviceSharding(draw(st.sampled_from(DEVICES))),
        "device": draw(st.sampled_from(DEVICES)),
    }[kind]


@given(x=st.one_of(python_scalars, numpy_scalars()), target=rank0_targets())
def test_scalars_match_jax(x, target):
    ours, ref = put_both(x, target)
    assert_same_array_bitwise(ours, ref)
    assert ours.weak_type == (type(x) in (int, float, complex))


class Color(enum.IntEnum):
    RED = 3


class Meters(float):
    pass


def test_python_scalars_are_weakly_typed_with_canonical_dtypes():
    cases = {
        True: (np.bool_, False),
        7: (np.int32, True),
        1.5: (np.float32, True),
        2j: (np.complex64, True),
        Color.RED: (np.int32, True),
        Meters(2.5): (np.float32, True),
    }
    for x, (dtype, weak) in cases.items():
        ours, ref = put_both(x, DEVICES[2])
        assert_same_array_bitwise(ours, ref)
        assert ours.dtype == dtype and ours.weak_type is weak


def test_enable_x64_toggled_between_puts():
    # The canonical dtype follows x64 as it is at each call, not as it was when first seen.
    s = NamedSharding(MESH_2x4, P("x"))
    values = [
        host_values(np.dtype(t), (8, 3), seed=1)
        for t in (np.float64, np.int64, np.uint64, np.complex128)
    ]
    values += [7, 1.5, np.float64(2.5), np.int64(-(2**50))]
    for x64 in (False, True, False, True):
        with jax.enable_x64(x64):
            for x in values + [2**40] * x64:
                target = s if np.ndim(x) else DEVICES[2]
                ours, ref = put_both(x, target)
                assert_same_array_bitwise(ours, ref)


Point = collections.namedtuple("Point", "x y")


class ArrayLike:
    def __array__(self, dtype=None, copy=None):
        return np.arange(3, dtype=dtype)


@st.composite
def pytrees(draw, leaves, depth=2):
    if depth == 0 or draw(st.booleans()):
        return draw(leaves)
    kind = draw(st.sampled_from(("dict", "list", "tuple", "none", "namedtuple")))
    children = [draw(pytrees(leaves, depth - 1)) for _ in range(draw(st.integers(0, 3)))]
    if kind == "dict":
        return {f"k{i}": child for i, child in enumerate(children)}
    if kind == "list":
        return children
    if kind == "tuple":
        return tuple(children)
    if kind == "none":
        return None
    return Point(draw(pytrees(leaves, depth - 1)), draw(pytrees(leaves, depth - 1)))


MESH_2x4 = Mesh(np.array(DEVICES).reshape(2, 4), ("x", "y"))


@st.composite
def leaves_for_8x4(draw):
    """Leaves that P('x') on MESH_2x4 fits: host arrays of shape (8, 4) and scalars."""
    kind = draw(st.sampled_from(("array", "python", "numpy", "none")))
    if kind == "array":
        dtype = draw(st.sampled_from(DTYPES))
        layout = draw(st.sampled_from(LAYOUTS))
        return lay_out(host_values(dtype, (8, 4), draw(st.integers(0, 99))), layout)
    if kind == "python":
        return draw(python_scalars)
    if kind == "numpy":
        return draw(numpy_scalars())
    return None


@given(
    tree=pytrees(leaves_for_8x4()),
    target=st.sampled_from(
        (NamedSharding(MESH_2x4, P()), SingleDeviceSharding(DEVICES[6]), DEVICES[3])
    ),
)
def test_pytrees_match_jax(tree, target):
    ours, ref = put_both(tree, target)
    assert jax.tree.structure(ours) == jax.tree.structure(ref)
    for o, r in zip(jax.tree.leaves(ours), jax.tree.leaves(ref), strict=True):
        assert_same_array_bitwise(o, r)
    got = fastpjit.device_get(ours)
    expected = jax.device_get(ref)
    assert jax.tree.structure(got) == jax.tree.structure(expected)
    for g, e in zip(jax.tree.leaves(got), jax.tree.leaves(expected), strict=True):
        assert host_bytes(g) == host_bytes(e)


def test_pytree_leaves_go_to_the_sharded_target():
    s = NamedSharding(MESH_2x4, P("x", "y"))
    tree = {
        "a": np.arange(32.0).reshape(8, 4),
        "b": [np.ones((2, 4), np.int8), None],
        "c": (np.zeros((4, 8), ml_dtypes.bfloat16).T,),
    }
    ours, ref = put_both(tree, s)
    assert jax.tree.structure(ours) == jax.tree.structure(ref)
    for o, r in zip(jax.tree.leaves(ours), jax.tree.leaves(ref), strict=True):
        assert_same_array_bitwise(o, r)


def test_float0_matches_jax():
    for target in (DEVICES[1], NamedSharding(MESH_2x4, P("x"))):
        x = np.zeros((8, 4), jax.dtypes.float0)
        ref = jax.device_put(x, target)
        ours = fastpjit.device_put(x, target)
        assert type(ours) is type(ref)
        assert ours.dtype == ref.dtype and ours.shape == ref.shape


@pytest.mark.slow
def test_string_arrays_match_jax():
    # Strings past 15 bytes live in the array's own storage, not in its items.
    words = ["a", "bc" * 20, "", "long string number " + "3" * 30]
    x = np.array([words, words[::-1]], dtype=np.dtypes.StringDType())
    for target in (DEVICES[4], NamedSharding(MESH_2x4, P("x", "y"))):
        ours, ref = put_both(x, target)
        assert ours.aval == ref.aval and ours.sharding == ref.sharding
        assert [np.asarray(s.data).tolist() for s in ours.addressable_shards] == [
            np.asarray(s.data).tolist() for s in ref.addressable_shards
        ]
        got = fastpjit.device_get(ours)
        del ours
        gc.collect()
        assert got.tolist() == x.tolist()  # the strings outlive the device array
        assert np.asarray(ref).tolist() == x.tolist()


# --- jax.Array inputs -------------------------------------------------------------------------


def test_committed_arrays_on_the_target_come_back_as_they_are():
    s = NamedSharding(MESH_2x4, P("x"))
    a = jax.device_put(np.arange(8.0), s)
    fastpjit.reset_stats()
    assert fastpjit.device_put(a, s) is a
    assert fastpjit.device_put(a, NamedSharding(MESH_2x4, P("x"))) is a  # equal, not identical
    tree = fastpjit.device_put({"a": a, "b": [a]}, s)
    assert tree["a"] is a and tree["b"][0] is a
    assert fastpjit.stats()["fallbacks"] == {}
    assert jax.device_put(a, s) is a


def test_other_arrays_are_moved_by_jax_and_counted():
    s = NamedSharding(MESH_2x4, P("x"))
    uncommitted = jnp.arange(8.0)
    cases = [
        (uncommitted, uncommitted.sharding),
        (uncommitted, s),
        (jax.device_put(np.arange(8.0), s), NamedSharding(MESH_2x4, P("y"))),
        (jax.device_put(np.arange(8.0), s), DEVICES[5]),
        (jax.device_put(np.arange(8.0), DEVICES[1]), DEVICES[2]),
    ]
    for a, target in cases:
        fastpjit.reset_stats()
        ours, ref = fastpjit.device_put(a, target), jax.device_put(a, target)
        assert_same_array_bitwise(ours, ref)
        assert ours is not a
        assert fastpjit.stats()["fallbacks"] == {"device_put.moved_array": 1}


def test_key_arrays_are_moved_by_jax():
    keys = jax.random.split(jax.random.key(1), 8)
    for target in (NamedSharding(MESH_2x4, P("x")), DEVICES[6]):
        ours, ref = fastpjit.device_put(keys, target), jax.device_put(keys, target)
        assert type(ours) is type(ref) and ours.dtype == ref.dtype
        assert ours.sharding == ref.sharding and ours.committed == ref.committed
        assert (jax.random.key_data(ours) == jax.random.key_data(ref)).all()
        assert fastpjit.device_put(ours, ours.sharding) is ours or target is DEVICES[6]


def test_fallbacks_are_counted_with_their_reason():
    x = np.arange(8.0, dtype=np.float32)
    s = NamedSharding(MESH_2x4, P("x"))
    cases = [
        ((x,), {}, "device_put.target"),
        ((x, P("x")), {}, "device_put.target"),
        (({"a": x}, {"a": s}), {}, "device_put.target"),
        ((x, s), {"donate": True}, "device_put.options"),
        ((x, s), {"may_alias": False}, "device_put.options"),
        ((x, s), {"src": DEVICES[0]}, "device_put.options"),
    ]
    with jax.set_mesh(MESH_2x4):
        for args, kwargs, reason in cases:
            fastpjit.reset_stats()
            ours, ref = fastpjit.device_put(*args, **kwargs), jax.device_put(*args, **kwargs)
            for o, r in zip(jax.tree.leaves(ours), jax.tree.leaves(ref), strict=True):
                assert_same_array_bitwise(o, r)
            assert fastpjit.stats()["fallbacks"] == {reason: 1}
    fastpjit.reset_stats()
    fastpjit.device_put([x, 1.0, {"z": np.int8(3)}], NamedSharding(MESH_2x4, P()))
    fastpjit.device_get(fastpjit.device_put(x, s))
    assert fastpjit.stats()["fallbacks"] == {}


def test_device_put_under_a_trace_matches_jax():
    s = NamedSharding(MESH_2x4, P("x"))
    x = np.arange(8.0, dtype=np.float32)

    def traced_leaf(put):
        return lambda v: put(v * 2, s)

    def host_leaf(put):
        return lambda v: put(x, s) + v

    for make in (traced_leaf, host_leaf):
        ours = jax.jit(make(fastpjit.device_put))(x)
        ref = jax.jit(make(jax.device_put))(x)
        assert_same_array_bitwise(ours, ref)
    grad_ours = jax.grad(lambda v: fastpjit.device_put(v, s).sum())(x)
    grad_ref = jax.grad(lambda v: jax.device_put(v, s).sum())(x)
    assert_same_array_bitwise(grad_ours, grad_ref)


# --- device_get -------------------------------------------------------------------------------


def _jit_outputs():
    """(name, a function making fresh arrays): jit outputs with various output shardings."""
    x = np.arange(96, dtype=np.float32).reshape(8, 12)
    subset = Mesh(np.array([DEVICES[i] for i in (5, 2, 7, 0)]).reshape(2, 2), ("a", "b"))
    on_subset = NamedSharding(subset, P("a", "b"))
    shardings = {
        "sharded": NamedSharding(MESH_2x4, P("x", "y")),
        "partly replicated rows": NamedSharding(MESH_2x4, P("x", None)),
        "partly replicated columns": NamedSharding(MESH_2x4, P(None, "y")),
        "fully replicated": NamedSharding(MESH_2x4, P()),
        "single device": SingleDeviceSharding(DEVICES[6]),
        "gspmd partly replicated": fastpjit.parse_hlo_sharding(
            "{devices=[1,2,4]<=[2,2,2]T(2,0,1) last_tile_dim_replicate}", DEVICES
        ),
    }
    cases = {
        name: (lambda s=s: jax.jit(lambda v: (v * 3 - 1).astype(jnp.bfloat16), out_shardings=s)(x))
        for name, s in shardings.items()
    }
    cases["device subset"] = lambda: jax.jit(lambda v: v[::-1] + 1)(jax.device_put(x, on_subset))
    cases["device subset replicated"] = lambda: jax.jit(
        lambda v: v * 2, out_shardings=NamedSharding(subset, P("b"))
    )(jax.device_put(x, on_subset))
    cases["scalar"] = lambda: jax.jit(lambda v: v.sum())(x)
    cases["complex"] = lambda: jax.jit(
        lambda v: v * 1j, out_shardings=NamedSharding(MESH_2x4, P("y", "x"))
    )(x)
    cases["int4 output"] = lambda: jax.jit(
        lambda v: (v % 7).astype(jnp.int4), out_shardings=NamedSharding(MESH_2x4, P("x"))
    )(x)
    cases["pmap"] = lambda: jax.pmap(lambda v: v + 1)(x)
    cases["shard_map"] = lambda: jax.shard_map(
        lambda v: v * 2, mesh=MESH_2x4, in_specs=P("x", "y"), out_specs=P("x"), check_vma=False
    )(x)
    return sorted(cases.items())


@pytest.mark.parametrize("make", [m for _, m in _jit_outputs()], ids=[n for n, _ in _jit_outputs()])
def test_device_get_of_jit_outputs(make):
    ours, ref = make(), make()
    assert ours.sharding == ref.sharding
    assert_get_matches(ours, ref)
    assert host_bytes(fastpjit.device_get(ours)) == host_bytes(jax.device_get(ref))


@pytest.mark.parametrize("spec", [P("x", "y"), P(None, ("y", "x")), P("y")], ids=str)
def test_large_arrays_take_the_threaded_copies(spec):
    # Above 8 MiB, the host copies of device_get are split over threads.
    x = lay_out(host_values(np.dtype(np.float32), (1024, 4096), seed=5), "transposed")
    ours, ref = put_both(x, NamedSharding(MESH_2x4, spec))
    assert shard_values(ours) == shard_values(ref)
    assert host_bytes(assert_get_matches(ours, ref)) == host_bytes(x)


def test_device_get_of_empty_jit_outputs():
    # jaxlib 0.10.2's XLA gives each shard of these the global shape, (8, 0) where the sharding
    # says (4, 0): np.asarray raises ValueError ("could not broadcast"), and fastpjit returns the
    # empty array, as there is nothing to copy. From 0.11.2 each shard has the shard shape.
    x = np.arange(96, dtype=np.float32).reshape(8, 12)
    for spec, cut in ((P("x"), np.s_[:, :0]), (P(None, "y"), np.s_[:0])):
        s = NamedSharding(MESH_2x4, spec)
        a = jax.jit(lambda v, cut=cut: v[cut], out_shardings=s)(x)
        shard_shape = by_line(jax_0_10=a.shape, jax_0_11=s.shard_shape(a.shape))
        assert a.addressable_shards[0].data.shape == shard_shape
        if ON_0_10:
            with pytest.raises(ValueError, match="broadcast"):
                np.asarray(jax.jit(lambda v, cut=cut: v[cut], out_shardings=s)(x))
        else:
            assert (
                np.asarray(jax.jit(lambda v, cut=cut: v[cut], out_shardings=s)(x)).shape == a.shape
            )
        got = fastpjit.device_get(a)
        assert host_bytes(got) == host_bytes(x[cut])
        assert not got.flags.writeable and np.asarray(a) is got


def test_device_get_of_pytrees_and_non_arrays():
    s = NamedSharding(MESH_2x4, P("x", "y"))
    keys = jax.random.split(jax.random.key(0), 8)
    tree = {
        "a": jax.device_put(np.arange(32.0).reshape(8, 4), s),
        "n": 3,
        "s": "text",
        "none": None,
        "host": np.arange(3),
        "np scalar": np.float32(2.5),
        "keys": keys,
        "list": [jnp.int8(4), 1.5, (jax.device_put(np.ones(8), DEVICES[3]),)],
        "array-like": ArrayLike(),
        "strings": jax.device_put(np.array(["a", "b"], np.dtypes.StringDType()), DEVICES[1]),
    }
    ours, ref = fastpjit.device_get(tree), jax.device_get(tree)
    assert jax.tree.structure(ours) == jax.tree.structure(ref)
    for o, r in zip(jax.tree.leaves(ours), jax.tree.leaves(ref), strict=True):
        assert type(o) is type(r)
        if isinstance(r, np.ndarray):
            assert host_bytes(o) == host_bytes(r)
        else:
            assert o is r or (
                jax.dtypes.issubdtype(r.dtype, jax.dtypes.prng_key)
                and (jax.random.key_data(o) == jax.random.key_data(r)).all()
            )
    assert ours["s"] is tree["s"] and ours["host"] is tree["host"] and ours["n"] is tree["n"]


@given(case=named_cases(), dtype=st.sampled_from(DTYPES))
def test_device_get_fills_jax_cache(case, dtype):
    sharding, shape = case
    x = host_values(dtype, shape, seed=11)
    with np.errstate(all="ignore"):
        a = jax.device_put(x, sharding)
    got = fastpjit.device_get(a)
    assert fastpjit.device_get(a) is got or a.is_fully_replicated
    assert host_bytes(np.asarray(a)) == host_bytes(got) == host_bytes(canonical(x))


# --- Errors -----------------------------------------------------------------------------------


def live_arrays():
    gc.collect()
    return len(jax.live_arrays())


def assert_no_new_arrays(before):
    """No more live device arrays than `before`; a collection first (slow) only if needed."""
    assert len(jax.live_arrays()) == before or live_arrays() == before


def assert_both_raise(exc_type, x, target, match=None):
    """Both device_puts raise exc_type (fastpjit: with `match`), and no buffer is left behind."""
    before = live_arrays()
    with pytest.raises(exc_type):
        jax.device_put(x, target)
    with pytest.raises(exc_type, match=match):
        fastpjit.device_put(x, target)
    assert_no_new_arrays(before)


@pytest.mark.slow
@pytest.mark.parametrize(
    "leaf, type_name",
    [
        ("abc", "str"),
        (b"abc", "bytes"),
        (object(), "object"),
        (Point, "type"),
        (np.float32, "type"),
        (slice(1), "slice"),
    ],
)
def test_non_array_leaves_raise_type_error_naming_the_type(leaf, type_name):
    s = NamedSharding(MESH_2x4, P())
    assert_both_raise(TypeError, leaf, s, match=rf"type {type_name}\b")
    # In a pytree, after leaves that were placed: nothing of them may stay alive.
    assert_both_raise(
        TypeError, [np.zeros((8, 4)), 1.0, {"bad": leaf}], s, match=rf"type {type_name}\b"
    )


EXPLICIT_2x4 = jax.make_mesh((2, 4), ("x", "y"), axis_types=(AxisType.Explicit,) * 2)


@pytest.mark.slow
@pytest.mark.parametrize(
    "target, x",
    [
        (NamedSharding(MESH_2x4, P("x", "y")), np.zeros(8)),
        (NamedSharding(MESH_2x4, P("x", "y")), 1.0),
        (NamedSharding(MESH_2x4, P("x", "y")), np.float32(1)),
        (NamedSharding(EXPLICIT_2x4, P("x")), np.float32(1)),
        (NamedSharding(EXPLICIT_2x4, P("x")), 1.0),
        (NamedSharding(EXPLICIT_2x4, P("x")), np.array(1, np.int32)),
        (NamedSharding(EXPLICIT_2x4, P("x", "y")), np.zeros(8)),
        (fastpjit.parse_hlo_sharding("{devices=[2,4]<=[8]}", DEVICES), np.zeros(8)),
        (fastpjit.parse_hlo_sharding("{devices=[2,4]<=[8]}", DEVICES), np.zeros((8, 4, 2))),
    ],
    ids=lambda v: repr(v)[:60],
)
def test_ranks_that_do_not_fit_the_sharding_raise_jaxs_error(target, x):
    # JAX raises a ValueError onto an Auto mesh and an AssertionError onto an Explicit one (a
    # rank-0 value onto P('x')) and for a GSPMDSharding; fastpjit's ShardingRankError is both.
    before = live_arrays()
    with pytest.raises((ValueError, AssertionError)) as theirs:
        jax.device_put(x, target)
    with pytest.raises(type(theirs.value)):
        fastpjit.device_put(x, target)
    with pytest.raises(fastpjit.ShardingRankError, match="rank"):
        fastpjit.device_put(x, target)
    assert_no_new_arrays(before)


def test_device_put_onto_unreduced_axes_is_jaxs():
    # jax 0.10.2 places a value onto unreduced axes with a jit of its own; fastpjit hands it to
    # JAX. From 0.11.2 JAX refuses, and so does fastpjit, through JAX.
    target = NamedSharding(EXPLICIT_2x4, P(None, "y", unreduced={"x"}))
    x = np.arange(32.0, dtype=np.float32).reshape(4, 8)
    fastpjit.reset_stats()
    if not ON_0_10:
        with pytest.raises(NotImplementedError) as refused:
            jax.device_put(x, target)
        with pytest.raises(NotImplementedError, match=re.escape(str(refused.value))):
            fastpjit.device_put(x, target)
        assert fastpjit.stats()["fallbacks"] == {"device_put.unreduced": 1}
        return
    theirs = jax.device_put(x, target)
    ours = fastpjit.device_put(x, target)
    assert ours.sharding == theirs.sharding == target
    for a, b in zip(ours.addressable_shards, theirs.addressable_shards, strict=True):
        assert a.device == b.device
        np.testing.assert_array_equal(a.data, b.data)
    assert fastpjit.stats()["fallbacks"] == {"device_put.unreduced": 1}
    with pytest.raises(NotImplementedError):
        jax.device_get(theirs)
    with pytest.raises(NotImplementedError):
        fastpjit.device_get(ours)


@pytest.mark.parametrize(
    "shape, spec",
    [((3, 4), P("x")), ((8, 6), P(None, "y")), ((4, 4), P(("x", "y"))), ((0, 3), P(None, "y"))],
)
def test_indivisible_shapes_raise_indivisible_error(shape, spec):
    s = NamedSharding(MESH_2x4, spec)
    assert_both_raise(ValueError, np.zeros(shape), s, match="evenly|divide")
    with pytest.raises(fastpjit.IndivisibleError, match=str(shape[0] if spec[0] else shape[1])):
        fastpjit.device_put(np.zeros(shape), s)
    with pytest.raises(fastpjit.IndivisibleError):
        fastpjit.device_put({"ok": np.zeros((8, 8)), "bad": np.zeros(shape)}, s)


@pytest.mark.slow
@pytest.mark.parametrize(
    "dtype",
    [">f4", ">i8", ">c8", "O", "U3", "S2", "V4", "M8[s]", "m8[s]", np.longdouble, np.clongdouble],
)
def test_unsupported_dtypes_raise_jax_type_error(dtype):
    x = np.zeros((8, 4), dtype=dtype)
    for target in (DEVICES[0], NamedSharding(MESH_2x4, P("x"))):
        assert_both_raise(TypeError, x, target, match=r"Dtype .* is not a valid JAX array type")
        with pytest.raises(TypeError) as ref:
            jax.device_put(x, target)
        with pytest.raises(TypeError) as ours:
            fastpjit.device_put(x, target)
        assert str(ours.value) == str(ref.value)


@pytest.mark.slow
@pytest.mark.parametrize("value", [2**31, -(2**31) - 1, 2**63, -(2**63) - 1, 2**64, 10**30])
def test_python_int_overflow_raises_overflow_error(value):
    assert_both_raise(OverflowError, value, DEVICES[0], match=rf"{value}.*int32")
    assert_both_raise(
        OverflowError, [1, value], NamedSharding(MESH_2x4, P()), match=rf"{value}.*int32"
    )


def test_python_ints_at_the_int32_bounds_fit():
    for value in (2**31 - 1, -(2**31)):
        ours, ref = put_both(value, DEVICES[0])
        assert_same_array_bitwise(ours, ref)


def test_masked_arrays_raise_value_error():
    x = np.ma.masked_array(np.zeros((8, 4)), mask=False)
    assert_both_raise(ValueError, x, NamedSharding(MESH_2x4, P("x")), match="masked arrays")


def test_overflowing_casts_warn_as_jax_does():
    for x in (np.array([1e300, 1.0]), np.array([1e300 + 1j])):
        with pytest.warns(RuntimeWarning, match="overflow"):
            ref = jax.device_put(x, DEVICES[1])
        with pytest.warns(RuntimeWarning, match="overflow"):
            ours = fastpjit.device_put(x, DEVICES[1])
        assert_same_array_bitwise(ours, ref)


def _deleted(kind, sharding):
    a = jax.device_put(np.arange(32.0, dtype=np.float32).reshape(8, 4), sharding)
    if kind == "deleted":
        a.delete()
    else:
        jax.jit(lambda v: v + 1, donate_argnums=0)(a)
    assert a.is_deleted()
    return a


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["deleted", "donated"])
@pytest.mark.parametrize("where", ["sharded", "single device", "replicated"])
def test_deleted_and_donated_arrays_raise_runtime_error(kind, where):
    sharding = {
        "sharded": NamedSharding(MESH_2x4, P("x", "y")),
        "single device": SingleDeviceSharding(DEVICES[2]),
        "replicated": NamedSharding(MESH_2x4, P()),
    }[where]
    a = _deleted(kind, sharding)
    message = r"Array has been deleted with shape=float32\[8"
    for target in (NamedSharding(MESH_2x4, P("y")), DEVICES[3]):
        for x in (a, [np.zeros(4), {"a": a}]):
            assert_both_raise(RuntimeError, x, target, match=message)
    # JAX hands a dead array back when it already has the target sharding; fastpjit raises.
    for x in (a, [np.zeros((8, 4)), {"a": a}]):
        before = live_arrays()
        with pytest.raises(RuntimeError, match=message):
            fastpjit.device_put(x, sharding)
        assert_no_new_arrays(before)
    for x in (a, {"k": [1, a]}):
        before = live_arrays()
        with pytest.raises(RuntimeError):
            jax.device_get(x)
        with pytest.raises(RuntimeError, match=message):
            fastpjit.device_get(x)
        assert_no_new_arrays(before)


# --- Bounds and leaks -------------------------------------------------------------------------


def test_transfer_caches_stay_bounded():
    bounds = (512, 512, 256, 256)
    largest = [0, 0, 0, 0]

    def check():
        sizes = _core.transfer_cache_sizes()
        assert all(n <= bound for n, bound in zip(sizes, bounds, strict=True)), sizes
        largest[:] = map(max, largest, sizes)

    s = NamedSharding(MESH_2x4, P("x"))
    for n in range(1, 700):
        fastpjit.device_get(fastpjit.device_put(np.zeros((8, n), np.int8), s))
        check()
    for i in range(300):
        dtype = np.dtype(np.float32, metadata={"i": i})  # a distinct dtype object each time
        fastpjit.device_put(np.zeros(2, dtype), DEVICES[0])
        check()
    for n in range(1, 300):
        _core.make_array_from_process_local_leaf(np.zeros((8, n), np.int8), s)
        check()
    assert largest == list(bounds)  # every bound was reached, and held


def test_a_device_target_reuses_its_plan():
    x = np.arange(12, dtype=np.int16).reshape(3, 4)
    fastpjit.device_put(x, DEVICES[4])
    put_plans = _core.transfer_cache_sizes()[0]
    for _ in range(100):
        fastpjit.device_put(x, DEVICES[4])
    assert _core.transfer_cache_sizes()[0] == put_plans


@pytest.mark.slow
def test_threads_put_and_get_at_once():
    # device_get copies with the GIL released; each thread must get back its own values.
    shardings = [
        NamedSharding(MESH_2x4, P("x", "y")),
        NamedSharding(MESH_2x4, P(None, "x")),
        SingleDeviceSharding(DEVICES[3]),
    ]

    def work(seed):
        for i in range(40):
            x = host_values(np.dtype(np.float32), (64, 2048), seed * 1000 + i)
            a = fastpjit.device_put(x, shardings[(seed + i) % len(shardings)])
            assert host_bytes(fastpjit.device_get(a)) == host_bytes(x), (seed, i)

    run_in_threads(work)


def _rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


@pytest.mark.slow
def test_no_memory_growth_over_many_puts_and_gets():
    shardings = [
        NamedSharding(MESH_2x4, P("x")),
        NamedSharding(MESH_2x4, P(None, "y")),
        NamedSharding(MESH_2x4, P()),
        SingleDeviceSharding(DEVICES[5]),
    ]
    hosts = [
        np.arange(32, dtype=np.float32).reshape(8, 4),
        np.asfortranarray(np.arange(32, dtype=np.float64).reshape(8, 4)),
        np.arange(64, dtype=np.int16).reshape(8, 8)[::-1, ::2],
    ]

    def round_trips(n):
        for i in range(n):
            s, x = shardings[i % len(shardings)], hosts[i % len(hosts)]
            tree = {
                "x": fastpjit.device_put(x, s),
                "k": fastpjit.device_put([i, np.float32(i)], DEVICES[i % 8]),
            }
            got = fastpjit.device_get(tree)
            assert got["k"][0] == i and got["x"].shape == x.shape
            if i % 50 == 0:
                with pytest.raises(TypeError):
                    fastpjit.device_put([x, "not an array"], s)

    round_trips(1000)
    gc.collect()
    before, start = _rss_bytes(), time.monotonic()
    round_trips(10_000)
    gc.collect()
    growth = _rss_bytes() - before
    assert growth < 20 * 2**20, f"RSS grew {growth / 2**20:.1f} MiB over 10,000 round trips"
    assert time.monotonic() - start < 60


def _at_offset(shape, dtype, offset):
    """A C-ordered array whose data starts `offset` bytes past a 64-byte boundary."""
    nbytes = math.prod(shape) * np.dtype(dtype).itemsize
    raw = np.empty(nbytes + 128, np.uint8)
    start = (-raw.ctypes.data) % 64 + offset
    out = raw[start : start + nbytes].view(dtype).reshape(shape)
    out[...] = np.arange(out.size, dtype=dtype).reshape(shape)
    return out


@pytest.mark.parametrize("layout", ["c", "offset", "broadcast", "strided"])
@pytest.mark.parametrize(
    "target",
    [
        NamedSharding(MESH_2x4, P("x")),
        NamedSharding(MESH_2x4, P("y")),
        NamedSharding(MESH_2x4, P("x", "y")),
        NamedSharding(MESH_2x4, P()),
        fastpjit.parse_hlo_sharding("{maximal device=5}", DEVICES),
        SingleDeviceSharding(DEVICES[2]),
    ],
    ids=str,
)
def test_small_puts_that_jaxlib_copies_match_jax(target, layout):
    # On the CPU, fastpjit tells jaxlib to copy the slices that it cannot adopt, except where
    # two devices' slices start at one address (shared tiles, broadcasts), which jaxlib 0.10.2
    # fails to copy so.
    x = lay_out(host_values(np.dtype(np.float32), (8, 16), seed=3), layout)
    ours, ref = put_both(x, target)
    assert_same_array_bitwise(ours, ref)
    assert_get_matches(ours, ref)


@pytest.mark.parametrize("spec", [P(), P("x"), P("x", "y")])
@pytest.mark.parametrize("offset", [0, 16])
def test_large_puts_onto_shared_tiles_match_jax(spec, offset):
    # 2 MiB: large enough that tiles held by several CPU devices are staged in our own
    # aligned buffers, unless the user's array is already adoptable as it is (offset 0).
    sharding = NamedSharding(Mesh(np.array(jax.devices()).reshape(2, 4), ("x", "y")), spec)
    x = _at_offset((512, 1024), np.float32, offset)
    ours, ref = fastpjit.device_put(x, sharding), jax.device_put(x, sharding)
    assert_same_array_bitwise(ours, ref)
    assert_get_matches(ours, x)


@pytest.mark.parametrize("spec", [P("x"), P(None, "x")])
@pytest.mark.parametrize("offset", [0, 16])
def test_large_puts_of_large_tiles_match_jax(spec, offset):
    # 32 MiB over 2 devices: tiles of 16 MiB, which are staged in pooled host memory even
    # when no device shares them (unless adoptable as they are: the contiguous rows of P('x')
    # at offset 0).
    sharding = NamedSharding(Mesh(np.array(jax.devices()[:2]), ("x",)), spec)
    x = _at_offset((4096, 2048), np.float32, offset)
    ours, ref = fastpjit.device_put(x, sharding), jax.device_put(x, sharding)
    assert_same_array_bitwise(ours, ref)
    assert_get_matches(ours, x)
    x[...] = 0  # the device copies are the device's own
    np.testing.assert_array_equal(np.asarray(ours), np.asarray(ref))


# --- The host pool: reused memory for large transfers -------------------------------------


@pytest.fixture
def host_pool_limit():
    """Sets the pool's limit for one test, and puts the default (1 GiB) back after it."""
    default = fastpjit.stats()["host_pool"]["limit"]
    yield fastpjit.set_host_pool_limit
    fastpjit.set_host_pool_limit(default)


def test_large_gets_reuse_host_memory_and_stay_writeable_on_request():
    s = NamedSharding(MESH_2x4, P("x", "y"))
    x = _at_offset((1024, 1024), np.float32, 16)  # 4 MiB
    fastpjit.reset_stats()
    for _ in range(4):
        a, ref = fastpjit.device_put(x, s), jax.device_put(x, s)
        got = assert_get_matches(a, ref)
        # As on JAX's value, a caller may make it writeable again, and writes stay in it.
        expected = np.asarray(ref)
        expected.flags.writeable = True
        got.flags.writeable = True
        got[0, :3] = expected[0, :3] = -1
        assert host_bytes(got) == host_bytes(expected) and np.asarray(a) is got
        del a, got
    pool = fastpjit.stats()["host_pool"]
    assert pool["hits"] >= 3, pool


def test_pooled_memory_is_never_shared_by_live_values():
    s = NamedSharding(MESH_2x4, P("x"))
    xs = [_at_offset((1024, 1024), np.float32, 16) + i for i in range(3)]
    live, values = [], []
    for i in range(12):
        x = xs[i % 3]
        a = fastpjit.device_put(x, s)
        if i % 2:  # every other one dies at once, its memory free for the next
            del a
            continue
        live.append((a, x))
        values.append((fastpjit.device_get(a), x))
    for a, x in live:
        assert shard_values(a) == shard_values(jax.device_put(x, s))
    for got, x in values:
        assert host_bytes(got) == host_bytes(x)


def test_idle_host_memory_stays_within_its_limit(host_pool_limit):
    host_pool_limit(8 << 20)
    s = NamedSharding(MESH_2x4, P())
    for rows in (256, 512, 1024, 1536, 2048):  # 1 to 8 MiB
        x = _at_offset((rows, 1024), np.float32, 16)
        got = fastpjit.device_get(fastpjit.device_put(x, s))
        assert host_bytes(got) == host_bytes(x)
        del got
        pool = fastpjit.stats()["host_pool"]
        assert pool["idle_bytes"] <= 8 << 20, pool
    host_pool_limit(0)
    pool = fastpjit.stats()["host_pool"]
    assert (pool["idle_blocks"], pool["idle_bytes"], pool["limit"]) == (0, 0, 0)


@pytest.mark.slow
def test_no_memory_growth_over_many_large_puts_and_gets(host_pool_limit):
    host_pool_limit(64 << 20)
    shardings = [
        NamedSharding(MESH_2x4, P("x")),
        NamedSharding(MESH_2x4, P("x", "y")),
        NamedSharding(MESH_2x4, P()),
    ]
    x = _at_offset((1024, 2048), np.float32, 16)  # 8 MiB

    def round_trips(n):
        for i in range(n):
            got = fastpjit.device_get(fastpjit.device_put(x, shardings[i % 3]))
            assert got.shape == x.shape

    round_trips(30)
    gc.collect()
    before = _rss_bytes()
    round_trips(300)
    gc.collect()
    growth = _rss_bytes() - before
    assert growth < 64 * 2**20, f"RSS grew {growth / 2**20:.1f} MiB over 300 8 MiB round trips"


# --- Transfer guards: device_put and device_get are explicit transfers -----------------------


def _outcome(call: Any) -> str:
    try:
        call()
    except Exception as e:  # compared between JAX and fastpjit
        return type(e).__name__
    return "ok"


@pytest.mark.parametrize("level", ["allow", "log", "disallow", "log_explicit", "disallow_explicit"])
def test_transfer_guard_levels_treat_device_put_and_get_as_explicit(level):
    sharding = NamedSharding(jax.make_mesh((8,), ("x",)), P("x"))
    host = np.arange(32, dtype=np.float32).reshape(8, 4)
    placed = jax.device_put(host, sharding)
    fresh = jax.jit(lambda a: a + 1)(placed)
    with jax.transfer_guard(level):
        assert _outcome(lambda: fastpjit.device_put(host, sharding)) == _outcome(
            lambda: jax.device_put(host, sharding)
        )
        assert _outcome(lambda: fastpjit.device_get(fresh)) == _outcome(
            lambda: jax.device_get(fresh)
        )
    expected_put = "JaxRuntimeError" if level == "disallow_explicit" else "ok"
    with jax.transfer_guard(level):
        assert _outcome(lambda: fastpjit.device_put(host, sharding)) == expected_put
