"""fastpjit.jit against jax.jit on 8 CPU devices.

Every case runs the same function through both and compares the outputs with oracle.py's
assertions, leaf by leaf (value, dtype, weak type, shape, aval, sharding, commitment) and the
output tree, on the first call (a miss), on repeats (cache hits, by key and by identity) and
with fresh arguments of the same signature. Errors must have JAX's type and message; compile
and fallback counts are checked through fastpjit.stats() deltas.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import gc
import importlib
import json
import re
import subprocess
import sys
import threading
import time
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.errors import JaxRuntimeError
from jax.sharding import AxisType, NamedSharding, SingleDeviceSharding
from jax.sharding import PartitionSpec as P
from lines import DONATED_AGAIN, ON_0_10
from oracle import assert_same_error, assert_same_outputs, both, check_calls, fresh
from rows import Counts, row
from threads import run_in_threads

import fastpjit
from fastpjit._compile_options import SignatureOptions
from fastpjit._jax.jit_miss import jit_cache_miss
from fastpjit._jax.xla_compile import backend_compiles
from fastpjit._shared import FunctionCaches
from fastpjit.warm_start import SignatureLog

DEVICES = tuple(jax.devices())
jit_module = importlib.import_module("fastpjit.jit")


def test_the_suite_runs_on_eight_cpu_devices():
    assert len(DEVICES) == 8
    assert {d.platform for d in DEVICES} == {"cpu"}


# --- Arguments and counters -----------------------------------------------------------------


def fresh_copy(tree: Any) -> Any:
    """Equal arguments in new objects: jax.Arrays copied onto the same sharding."""

    def copy(x: Any) -> Any:
        if isinstance(x, jax.Array):
            return jax.device_put(np.asarray(x), x.sharding) if x.committed else jnp.array(x)
        return x

    return jax.tree.map(copy, tree)


def traced() -> int:
    """How many calls of fastpjit functions so far were made inside another function's trace."""
    return sum(f["traced"] for f in fastpjit.stats()["functions"].values())


def fallbacks(code: str | None = None) -> int:
    """How many fallbacks of `code` (of any code where None) so far."""
    counted = fastpjit.stats()["fallbacks"]
    return sum(counted.values()) if code is None else counted.get(code, 0)


# --- Meshes ---------------------------------------------------------------------------------


@functools.cache
def mesh_of(shape: tuple[int, ...], axis_type: AxisType | None) -> jax.sharding.Mesh:
    names = ("x", "y")[: len(shape)]
    if axis_type is None:  # make_mesh's default, Explicit in JAX 0.10.2
        mesh = jax.make_mesh(shape, names)
        assert set(mesh.axis_types) == {AxisType.Explicit}
        return mesh
    return jax.make_mesh(shape, names, axis_types=(axis_type,) * len(shape))


MESH_8 = mesh_of((8,), AxisType.Auto)
ROW_8 = NamedSharding(MESH_8, P("x"))
REPLICATED_8 = NamedSharding(MESH_8, P())


# --- A two-layer MLP in its three sharding patterns -------------------------------------------


class Layout(NamedTuple):
    """Where the MLP's batch and hidden dimensions go on a mesh; a hashable static argument."""

    mesh: Any
    batch: Any  # the mesh axes of the batch dimension
    model: Any  # the mesh axes of the hidden dimension (tensor parallel)
    every: Any  # all mesh axes (data parallel and FSDP)


def layout_of(mesh: Any) -> Layout:
    names = mesh.axis_names
    if len(names) == 1:
        return Layout(mesh, None, names[0], names)
    return Layout(mesh, names[0], names[1], names)


def mlp(params: dict[str, Any], x: Any) -> Any:
    return jax.nn.relu(x @ params["w1"] + params["b1"]) @ params["w2"]


def mlp_data_parallel(params: dict[str, Any], x: Any, layout: Layout) -> Any:
    del layout
    return mlp(params, x)


def mlp_fsdp(params: dict[str, Any], x: Any, layout: Layout) -> Any:
    gathered = {
        k: jax.sharding.reshard(v, NamedSharding(layout.mesh, P())) for k, v in params.items()
    }
    return mlp(gathered, x)


def mlp_tensor_parallel(params: dict[str, Any], x: Any, layout: Layout) -> Any:
    if layout.mesh.axis_types[0] == AxisType.Explicit:
        h = jnp.einsum("bd,dh->bh", x, params["w1"], out_sharding=P(layout.batch, layout.model))
        h = jax.nn.relu(h + params["b1"])
        return jnp.einsum("bh,hd->bd", h, params["w2"], out_sharding=P(layout.batch, None))

    # einsum's out_sharding takes Explicit axes only; Auto meshes constrain instead.
    def constrain(v: Any, *spec: Any) -> Any:
        return jax.lax.with_sharding_constraint(v, NamedSharding(layout.mesh, P(*spec)))

    h = constrain(jnp.einsum("bd,dh->bh", x, params["w1"]), layout.batch, layout.model)
    h = jax.nn.relu(h + params["b1"])
    return constrain(jnp.einsum("bh,hd->bd", h, params["w2"]), layout.batch, None)


def mlp_values(seed: int = 0) -> tuple[dict[str, np.ndarray], np.ndarray]:
    rng = np.random.default_rng(seed)
    params = {
        "w1": rng.normal(size=(8, 32)).astype(np.float32),
        "b1": rng.normal(size=(32,)).astype(np.float32),
        "w2": rng.normal(size=(32, 8)).astype(np.float32),
    }
    return params, rng.normal(size=(16, 8)).astype(np.float32)


def mlp_case(pattern: str, layout: Layout) -> tuple[Any, dict[str, Any], dict[str, Any], Any]:
    """(function, jit options, parameter specs, batch spec) of one sharding pattern."""
    if pattern == "data_parallel":
        batch = NamedSharding(layout.mesh, P(layout.every))
        options = dict(
            in_shardings=(NamedSharding(layout.mesh, P()), batch), static_argnames="layout"
        )
        return mlp_data_parallel, options, {"w1": P(), "b1": P(), "w2": P()}, P(layout.every)
    if pattern == "fsdp":
        specs = {"w1": P(layout.every, None), "b1": P(layout.every), "w2": P(layout.every, None)}
        return mlp_fsdp, dict(static_argnums=2), specs, P(layout.every)
    specs = {"w1": P(None, layout.model), "b1": P(layout.model), "w2": P(layout.model, None)}
    return mlp_tensor_parallel, dict(static_argnames="layout"), specs, P(layout.batch)


@pytest.mark.parametrize("pattern", ["data_parallel", "fsdp", "tensor_parallel"])
@pytest.mark.parametrize("mesh_shape", [(8,), (2, 4)], ids=["1d", "2d"])
@pytest.mark.parametrize("axis_type", [AxisType.Auto, None], ids=["auto", "explicit"])
def test_mlp_sharding_patterns(pattern, mesh_shape, axis_type):
    mesh = mesh_of(mesh_shape, axis_type)
    layout = layout_of(mesh)
    fun, options, param_specs, batch_spec = mlp_case(pattern, layout)
    ours, theirs = both(fun, **options)
    params_host, x_host = mlp_values()
    # jit takes no keywords with in_shardings; elsewhere the static layout goes by keyword.
    if pattern == "data_parallel":

        def call(*args, **kw):
            return check_calls(ours, theirs, *args, layout, **kw)
    else:
        call = functools.partial(check_calls, ours, theirs, layout=layout)
    with jax.set_mesh(mesh):
        params = {
            k: jax.device_put(v, NamedSharding(mesh, param_specs[k]))
            for k, v in params_host.items()
        }
        x = jax.device_put(x_host, NamedSharding(mesh, batch_spec))
        out = call(params, x)
        call(fresh_copy(params), fresh_copy(x), repeats=1)
        if pattern == "data_parallel":
            # numpy arguments are sharded onto in_shardings by fastpjit's Rust shard path.
            call(params, x_host, repeats=2)
            call(params_host, x_host, repeats=2)
        # A new batch of the same signature gives new values, not the cached ones.
        x2 = jax.device_put(mlp_values(1)[1], NamedSharding(mesh, batch_spec))
        out2 = call(params, x2, repeats=1)
    np.testing.assert_allclose(np.asarray(out), mlp(params_host, x_host), rtol=1e-5, atol=1e-5)
    assert not np.array_equal(np.asarray(out), np.asarray(out2))
    assert out.sharding.mesh == mesh


def test_einsum_out_sharding_on_an_auto_mesh_fails_like_jax():
    layout = layout_of(MESH_8)

    def bad(x, w):
        return jnp.einsum("bd,dh->bh", x, w, out_sharding=P(None, layout.model))

    ours, theirs = both(bad)
    w = jax.device_put(np.ones((8, 32), np.float32), NamedSharding(MESH_8, P(None, "x")))
    with jax.set_mesh(MESH_8):
        for _ in range(2):
            assert_same_error(ours, theirs, jnp.ones((16, 8)), w)


# --- Pytrees --------------------------------------------------------------------------------


Point = collections.namedtuple("Point", "x y")


@jax.tree_util.register_pytree_node_class
class Tagged:
    """A registered pytree node whose tag is static metadata: a new tag is a new tree."""

    def __init__(self, tag: str, a: Any, b: Any):
        self.tag, self.a, self.b = tag, a, b

    def tree_flatten(self) -> tuple[tuple[Any, Any], str]:
        return (self.a, self.b), self.tag

    @classmethod
    def tree_unflatten(cls, tag: str, children: Any) -> Tagged:
        return cls(tag, *children)


def tree_function(d, lst, tup, nothing, point, tagged, *, scale):
    assert nothing is None
    total = d["a"] + d["b"].sum() + lst[0] + tup[1] + point.x + tagged.a
    return {
        "total": total * scale,
        "list": [lst[1] * 2, None, ()],
        "tuple": (tup[0], point.y),
        "point": Point(point.y, point.x),
        "tagged": Tagged(tagged.tag + "!", tagged.b, total),
        "empty": {},
    }


def tree_arguments(tag: str = "t") -> tuple[tuple[Any, ...], dict[str, Any]]:
    d = {"b": jnp.arange(3.0), "a": jnp.float32(1.5)}
    lst = [jnp.ones(()), jax.device_put(np.arange(4, dtype=np.int32), DEVICES[2])]
    tup = (np.arange(2, dtype=np.int16), 2.0)
    point = Point(jnp.ones(()), np.float32(3))
    tagged = Tagged(tag, 4, jnp.zeros((2, 2)))
    return (d, lst, tup, None, point, tagged), {"scale": jnp.float32(0.5)}


@pytest.mark.slow
def test_pytree_arguments_and_outputs():
    ours, theirs = both(fresh(tree_function))
    args, kwargs = tree_arguments()
    out = check_calls(ours, theirs, *args, **kwargs)
    assert isinstance(out["point"], Point) and isinstance(out["tagged"], Tagged)
    assert out["tagged"].tag == "t!"
    check_calls(ours, theirs, *fresh_copy(args), **fresh_copy(kwargs), repeats=1)
    size = ours.cache_size()
    # A new tag is a new tree: JAX keys on the treedef, and so must fastpjit.
    args, kwargs = tree_arguments("other")
    out = check_calls(ours, theirs, *args, **kwargs, repeats=2)
    assert out["tagged"].tag == "other!"
    assert ours.cache_size() == size + 1 == theirs._cache_size()


def test_outputs_of_builtin_containers_are_built_as_jax_builds_them():
    # fastpjit builds builtin output trees itself: the same container types, dict keys in JAX's
    # (sorted) order whatever order the function made them in, None and empty containers.
    def named(x):
        return {"z": [x, None, (x * 2, {})], "a": (), "m": {"b": x + 1, "a": [x]}}

    def numbered(x):
        return {2: x, 10: (x, [None]), 1: x * 3}

    x = jnp.arange(3.0)
    for fun in (named, numbered, lambda x: (x, [x, (None,)]), lambda x: [x]):
        ours, theirs = both(fun)
        check_calls(ours, theirs, x)
        counts, fallbacks_before = Counts(), fastpjit.stats()["fallbacks"]
        assert_same_outputs(ours(x), theirs(x))
        assert counts["cache_hits"] == 1
        assert fastpjit.stats()["fallbacks"] == fallbacks_before


def test_pytree_argument_as_keyword_and_dict_order():
    def fun(x, tree):
        return {k: v * x for k, v in tree.items()}

    ours, theirs = both(fun)
    a, b = jnp.arange(3.0), jnp.ones(2, jnp.int32)
    check_calls(ours, theirs, 2.0, tree={"a": a, "b": b})
    check_calls(ours, theirs, 2.0, tree={"b": b, "a": a}, repeats=2)
    check_calls(ours, theirs, tree={"a": a, "b": b}, x=3.0, repeats=2)
    assert ours.cache_size() == theirs._cache_size()


CLOSED_OVER = jnp.arange(4.0) * 10  # a jax.Array constant: JAX passes it as a const arg


def unused_second(x, y):
    return x * 2


MISC = {
    "identity": (lambda x: x, {}, (jnp.arange(4.0),)),
    "identity-sharded": (lambda x: x, {}, (jax.device_put(np.arange(8.0), ROW_8),)),
    "swap": (lambda x, y: (y, x), {}, (jnp.arange(4.0), jnp.ones(2, jnp.int32))),
    "closed-over-array": (lambda x: x + CLOSED_OVER, {}, (jnp.ones(4),)),
    "closed-over-numpy": (lambda x: x + np.arange(4.0), {}, (np.ones(4, np.float32),)),
    "unused-array": (unused_second, {}, (jnp.ones(3), jnp.ones(5))),
    "unused-numpy": (unused_second, {}, (jnp.ones(3), np.ones(5))),
    "unused-scalar": (unused_second, {}, (np.ones(3), 7)),
    "unused-first": (lambda x, y: y + 1, {}, (jnp.ones(3), np.ones(2, np.int32))),
    "keep-unused": (unused_second, dict(keep_unused=True), (jnp.ones(3), np.ones(5))),
    "weak-array": (lambda x, y: x * y, {}, (jnp.asarray(2.0), jnp.ones(3, jnp.bfloat16))),
    "bfloat16-numpy": (lambda x: x * 2, {}, (np.ones(4, jnp.bfloat16),)),
    "zero-size": (lambda x: (x * 2, x.sum()), {}, (np.ones((0, 3), np.float32),)),
    "zero-dim": (lambda x, y: x * y, {}, (np.array(3.0), jnp.array(2, jnp.int8))),
    "constant-outputs": (lambda x: (1.0, 2, True, np.float32(3), np.arange(3)), {}, (1,)),
    "no-outputs": (lambda x: (None, (), {}, []), {}, (jnp.ones(2),)),
    "no-arguments": (lambda: jnp.arange(3) * 2, {}, ()),
    "in-shardings-none": (
        lambda x, y: x + y.sum(),
        dict(in_shardings=(ROW_8, None)),
        (np.ones(8), jnp.ones(4)),
    ),
    "same-output-twice": (lambda x: (x * 2,) * 2, {}, (jnp.ones(3),)),
    "same-input-twice": (lambda x, y: x - y, {}, (X3 := jnp.arange(3.0), X3)),
    "float0-output": (
        lambda x: jax.grad(lambda a, n: (a * 2.0).sum(), argnums=(0, 1), allow_int=True)(x, 3),
        {},
        (jnp.ones(3),),
    ),
    "many-leaves": (
        lambda xs: [x * i for i, x in enumerate(xs)],
        {},
        ([jnp.full(2, float(i)) for i in range(40)],),
    ),
}


@pytest.mark.parametrize("name", list(MISC))
def test_assorted_functions(name):
    fun, options, args = MISC[name]
    ours, theirs = both(fun, **options)
    check_calls(ours, theirs, *args)
    check_calls(ours, theirs, *fresh_copy(args), repeats=2)
    if name.startswith("identity"):
        # JAX hands back the input itself where the output is the input: so must fastpjit.
        assert (ours(*args) is args[0]) == (theirs(*args) is args[0])


# --- Static arguments and keywords --------------------------------------------------------


def scale_or_shift(x, n, mode="mul"):
    return x * n if mode == "mul" else x + n


X4 = jnp.arange(4.0)
# Calls of scale_or_shift(x, n, mode) valid for each way of making arguments static.
N_STATIC = [
    ((X4, 2), {}),
    ((X4, 3), {}),
    ((X4,), {"n": 2}),
    ((fresh_copy(X4),), {"n": 2}),
    ((), {"n": 3, "x": X4}),
]
MODE_STATIC = [
    ((X4, 2), {"mode": "add"}),
    ((X4,), {"mode": "add", "n": 2}),
    ((), {"x": X4, "mode": "mul", "n": 3}),
]
STATIC_CASES = {
    "argnums": (dict(static_argnums=1), N_STATIC),
    "argnames": (dict(static_argnames="n"), N_STATIC),
    "argnums-infer-names": (
        dict(static_argnums=(1, 2)),
        N_STATIC + MODE_STATIC + [((X4, 2, "add"), {})],
    ),
    "argnames-infer-nums": (
        dict(static_argnames=("n", "mode")),
        N_STATIC + MODE_STATIC + [((X4, 2, "add"), {})],
    ),
    # Given both, JAX infers neither: mode is static by name only, n by position only.
    "argnums+argnames": (
        dict(static_argnums=1, static_argnames="mode"),
        [((X4, 2), {}), ((X4, 2), {"mode": "add"}), ((X4, 3), {"mode": "add"})],
    ),
    # Negative argnums count from the end of each call's positional arguments.
    "negative": (
        dict(static_argnums=-1),
        [((X4, 2), {}), ((X4, 3), {}), ((X4, 2, "add"), {}), ((X4, 3, "add"), {})],
    ),
}


@pytest.mark.parametrize("name", list(STATIC_CASES))
def test_static_arguments(name):
    options, calls = STATIC_CASES[name]
    ours, theirs = both(fresh(scale_or_shift), **options)
    before = fallbacks()
    for args, kwargs in calls:
        check_calls(ours, theirs, *args, **kwargs, repeats=2)
    for args, kwargs in calls:
        check_calls(ours, theirs, *fresh_copy(args), **kwargs, repeats=1)
    assert ours.cache_size() == theirs._cache_size()
    assert fallbacks() == before


def test_equal_static_arguments_of_different_types_are_different_keys():
    # jaxlib keys a static argument by type and ==: 2 and 2.0 are equal but not the same key.
    ours, theirs = both(fresh(scale_or_shift), static_argnums=1)
    x = jnp.arange(4)
    check_calls(ours, theirs, x, 2, repeats=2)
    out = check_calls(ours, theirs, x, 2.0, repeats=2)
    assert out.dtype == jnp.float32
    check_calls(ours, theirs, x, True, repeats=2)
    assert ours.cache_size() == theirs._cache_size() == 3


def test_static_arguments_compile_once_per_value():
    def fun(x, n):
        return x * n

    ours = fastpjit.jit(fun, static_argnums=1)
    x = jnp.arange(4.0)
    counts = Counts()
    ours(x, 2)
    assert counts["compiles"] == 1
    ours(x, 2)
    ours(fresh_copy(x), 2)
    assert counts["compiles"] == 1 and ours.cache_size() == 1
    ours(x, 3)
    assert counts["compiles"] == 2 and ours.cache_size() == 2


@pytest.mark.slow
def test_keyword_arguments():
    def fun(x, y=1.0, *, z):
        return x * y + z

    ours, theirs = both(fun)
    x = jnp.arange(4.0)
    check_calls(ours, theirs, x, z=1.0)
    check_calls(ours, theirs, x, 2.0, z=jnp.ones(4))
    check_calls(ours, theirs, x=x, y=3, z=np.ones(4))
    check_calls(ours, theirs, z=0.5, y=x, x=2)


# --- Donation -------------------------------------------------------------------------------


def add_to(x, y):
    return x + y


def donated_input(kind: str) -> jax.Array:
    host = np.arange(16, dtype=np.float32)
    if kind == "uncommitted":
        return jnp.asarray(host)
    if kind == "one-device":
        return jax.device_put(host, DEVICES[1])
    return jax.device_put(host, ROW_8)


@pytest.mark.parametrize("kind", ["uncommitted", "one-device", "eight-devices"])
@pytest.mark.parametrize(
    "options", [dict(donate_argnums=0), dict(donate_argnames="x")], ids=["argnums", "argnames"]
)
def test_donation(options, kind):
    ours, theirs = both(add_to, **options)
    for _ in range(3):  # a miss, then hits
        a, b = donated_input(kind), donated_input(kind)
        expected = theirs(a, 1.0)
        out = ours(b, 1.0)
        assert_same_outputs(out, expected)
        assert a.is_deleted() and b.is_deleted()
        # Reusing a donated array raises as JAX's dispatch does: a call that misses (by
        # keyword here) raises JAX's RuntimeError; a cached call raises DONATED_AGAIN, as JAX's
        # C++ path does where it does not crash (on 0.10.2 it crashes on several devices).
        error = assert_same_error(ours, theirs, x=b, y=1.0)
        assert isinstance(error, RuntimeError)
        with pytest.raises(RuntimeError, match=re.escape(str(error))):
            ours(x=b, y=jnp.float32(1))
        if kind != "eight-devices" or not ON_0_10:
            with pytest.raises(DONATED_AGAIN[0], match=DONATED_AGAIN[1]):
                theirs(a, 1.0)
        with pytest.raises(DONATED_AGAIN[0], match=DONATED_AGAIN[1]):
            ours(b, 1.0)


def scaled_add(n, x, y):
    return x * n + y


def test_donation_with_static_arguments():
    ours, theirs = both(scaled_add, static_argnums=0, donate_argnums=(1,))
    for n in (2, 3, 2):
        a, b = donated_input("eight-devices"), donated_input("eight-devices")
        y = jnp.ones(16)
        assert_same_outputs(ours(n, b, y), theirs(n, a, y))
        assert a.is_deleted() and b.is_deleted() and not y.is_deleted()


def test_donated_input_of_a_fresh_function():
    ours = fastpjit.jit(add_to, donate_argnums=0)
    a = donated_input("eight-devices")
    ours(a, 1.0)
    with pytest.raises(RuntimeError, match="Array has been deleted"):
        fastpjit.jit(add_to)(a, 1.0)
    assert_same_error(fastpjit.jit(add_to), jax.jit(add_to), a, 1.0)


# --- Python scalars and numpy arguments -------------------------------------------------------


def affine(x, a, b):
    return x * a + b


HOST_ARGUMENTS = {
    "f64-int-float": (np.linspace(0, 1, 16), 2, 0.5),
    "f32-float-int": (np.arange(16, dtype=np.float32), 1.5, 3),
    "i64-int-int": (np.arange(16, dtype=np.int64), 3, -1),
    "i32-bool-int": (np.arange(16, dtype=np.int32), True, 7),
    "bool-bool-bool": (np.arange(16) % 3 == 0, True, False),
    "u8-npint-float": (np.arange(16, dtype=np.uint8), np.int8(2), 0.25),
    "f16-f64scalar-complex": (np.ones(16, np.float16), np.float64(1.5), 1 + 2j),
    "c128-0d-int": (np.ones(16, np.complex128), np.array(2.0), 1),
    "u64-u64-u64": (np.arange(16, dtype=np.uint64), np.uint64(3), np.ones(16, np.uint64)),
}


def vary(value: Any, k: int) -> Any:
    """An argument of the same signature as `value` (type, dtype, shape), another value."""
    if isinstance(value, bool):
        return value ^ bool(k % 2)
    if isinstance(value, np.ndarray | np.generic):
        if value.dtype == bool:
            return np.logical_xor(value, bool(k % 2))
        changed = np.asarray(value + k).astype(value.dtype)
        return changed if isinstance(value, np.ndarray) else changed[()]
    return type(value)(value + k)


@pytest.mark.parametrize("executable", ["one-device", "eight-devices"])
@pytest.mark.parametrize("name", list(HOST_ARGUMENTS))
def test_host_arguments(name, executable):
    if executable == "one-device":
        ours, theirs = both(fresh(affine))
    else:
        # A scalar argument into a 8-device executable is replicated.
        ours, theirs = both(fresh(affine), in_shardings=(ROW_8, REPLICATED_8, REPLICATED_8))
    args = HOST_ARGUMENTS[name]
    out = check_calls(ours, theirs, *args, repeats=2)
    if executable == "eight-devices":
        assert out.sharding == ROW_8
    # Hits must place the new values, not the old ones.
    for k in (1, 2):
        check_calls(ours, theirs, *[vary(a, k) for a in args], repeats=1)
    assert ours.cache_size() == theirs._cache_size() == 1


def test_float64_is_canonicalized_to_float32():
    ours, theirs = both(lambda x, y: (x, y, x * y))
    for _ in range(2):
        out = check_calls(ours, theirs, np.ones(4), np.float64(2.0), repeats=1)
        assert [o.dtype for o in out] == [jnp.float32] * 3
        assert [o.weak_type for o in out] == [False] * 3
    out = check_calls(ours, theirs, 1.0, 2, repeats=2)
    assert [o.weak_type for o in out] == [True, True, True]
    assert [o.dtype for o in out] == [jnp.float32, jnp.int32, jnp.float32]


X64_CHILD = """
import jax, numpy as np, fastpjit

def fun(x, y):
    return x * y

ours, theirs = fastpjit.jit(fun), jax.jit(fun)

def same(*args):
    expected, out = theirs(*args), ours(*args)
    assert (out.dtype, out.weak_type) == (expected.dtype, expected.weak_type), (out, expected)
    np.testing.assert_array_equal(np.asarray(out), np.asarray(expected))
    return out.dtype

for _ in range(2):
    assert same(np.ones(4), 2) == np.float32
with jax.enable_x64(True):
    for _ in range(3):
        assert same(np.ones(4), 2) == np.float64
        assert same(np.arange(4), 2) == np.int64
        assert same(np.float32(1), 2.0) == np.float32
assert same(np.ones(4), 2) == np.float32
print("ok")
"""


@pytest.mark.subprocess
def test_float64_under_enable_x64():
    # x64 is part of JAX's trace context: a call under it is keyed apart, and its hits must
    # keep float64 (and int64) inputs as they are. In a child process: jaxlib can crash on an
    # input of the wrong width.
    result = subprocess.run(
        [sys.executable, "-c", X64_CHILD], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    assert result.stdout == "ok\n"


PERSISTENT_CACHE_CHILD = """
import json, sys
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

jax.config.update("jax_compilation_cache_dir", sys.argv[1])
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
import fastpjit

persistent_hits = []
jax.monitoring.register_event_listener(
    lambda event, **_: persistent_hits.append(event)
    if event == "/jax/compilation_cache/cache_hits" else None)
mesh = jax.make_mesh((8,), ("x",), axis_types=(jax.sharding.AxisType.Auto,))
x = jax.device_put(np.arange(32.0, dtype=np.float32).reshape(8, 4), NamedSharding(mesh, P("x")))
f = fastpjit.jit(lambda a: (a * 2 + 1).sum(axis=1))
out = f(x)
print(json.dumps({"compiles": fastpjit.stats()["compiles"], "persistent_hits": len(persistent_hits),
                  "out": np.asarray(out).tolist(), "sharding": str(out.sharding)}))
"""


@pytest.mark.slow
@pytest.mark.subprocess
def test_persistent_compilation_cache_spares_a_second_process_the_compile(tmp_path):
    # JAX's jax_compilation_cache_dir is honoured: the first process compiles and stores the
    # executable, the second loads it and compiles nothing.
    def child() -> dict[str, Any]:
        result = subprocess.run(
            [sys.executable, "-c", PERSISTENT_CACHE_CHILD, str(tmp_path)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert result.returncode == 0, result.stdout + result.stderr[-3000:]
        return json.loads(result.stdout.splitlines()[-1])

    first, second = child(), child()
    assert (first["compiles"], first["persistent_hits"]) == (1, 0)
    assert (second["compiles"], second["persistent_hits"]) == (0, 1)
    assert second["out"] == first["out"] == (np.arange(32.0).reshape(8, 4) * 2 + 1).sum(1).tolist()
    assert second["sharding"] == first["sharding"]
    assert any(tmp_path.iterdir())


def test_non_contiguous_numpy_arguments():
    ours, theirs = both(lambda x: x * 2, in_shardings=ROW_8)
    base = np.arange(64, dtype=np.float32).reshape(8, 8)
    strided = np.arange(128, dtype=np.float32).reshape(8, 16)[:, ::2]
    for x in (base.T, base[::-1], base[::-1, ::-1], strided, np.asfortranarray(base)):
        check_calls(ours, theirs, x, repeats=2)


def test_python_int_overflow_fails_like_jax():
    ours, theirs = both(lambda x: x + 1)
    with pytest.raises(OverflowError):
        ours(2**40)  # a miss: JAX raises
    check_calls(ours, theirs, 5, repeats=2)  # an int32 entry exists; the next call is a hit
    with pytest.raises(OverflowError, match="1099511627776"):
        ours(2**40)
    check_calls(ours, theirs, -(2**31), repeats=1)
    check_calls(ours, theirs, 2**31 - 1, repeats=1)


def test_python_int_overflow_on_a_hit_has_jax_s_message():
    ours, theirs = both(lambda x: x + 1)
    check_calls(ours, theirs, 5, repeats=2)
    error = assert_same_error(ours, theirs, 2**40)
    assert isinstance(error, OverflowError)


def test_transfer_guard_applies_to_host_arguments():
    ours, theirs = both(affine, in_shardings=(ROW_8, REPLICATED_8, REPLICATED_8))
    args = (np.ones(8, np.float32), 2.0, np.float32(1))
    check_calls(ours, theirs, *args, repeats=2)
    placed = [
        jax.device_put(a, s) for a, s in zip(args, (ROW_8, REPLICATED_8, REPLICATED_8), strict=True)
    ]
    # Host-to-device only: from 0.11.2 the guard also watches the comparison's np.asarray.
    with jax.transfer_guard_host_to_device("disallow"):
        assert_same_error(ours, theirs, *args)  # an implicit host-to-device transfer
        check_calls(ours, theirs, *placed, repeats=2)


_ONE_DEVICE_MESH = NamedSharding(jax.make_mesh((1,), ("x",), devices=DEVICES[:1]), P())
_REVERSED_ROWS = NamedSharding(jax.make_mesh((8,), ("x",), devices=DEVICES[::-1]), P("x"))
_AUTO_COLUMNS = NamedSharding(mesh_of((2, 4), AxisType.Auto), P(None, "y"))


@pytest.mark.parametrize(
    ("target", "value"),
    [
        (None, np.ones((8, 4), np.float32)),
        (None, 2.5),
        (_ONE_DEVICE_MESH, np.ones((8, 4), np.float32)),
        (_ONE_DEVICE_MESH, 2.5),
        (_REVERSED_ROWS, np.ones((8, 4), np.float32)),
        (_AUTO_COLUMNS, np.ones((8, 4), np.float32)),
        (REPLICATED_8, 2.5),
    ],
    ids=[
        "default",
        "default, scalar",
        "one-device mesh",
        "one-device mesh, scalar",
        "explicit mesh, devices reversed",
        "auto mesh",
        "replicated, scalar",
    ],
)
def test_host_arguments_are_placed_and_guarded_like_jax_s(target, value):
    # fastpjit places host arguments on an equivalent sharding that jaxlib reads without
    # Python; under the transfer guard, the transfer it refuses is named as JAX names it.
    options = {} if target is None else {"in_shardings": target}
    ours, theirs = both(lambda a: a * 2 + 1, **options)
    check_calls(ours, theirs, value, repeats=2)
    check_calls(
        ours, theirs, np.arange(32, dtype=np.float32).reshape(8, 4) if np.shape(value) else 4.5
    )
    with jax.transfer_guard("disallow"):
        assert_same_error(ours, theirs, value + 1)


def test_host_arguments_placed_under_a_logging_guard_match_jax():
    # While the guard watches, host arguments are placed on the input sharding itself.
    target = NamedSharding(jax.make_mesh((4, 2), ("x", "y"), devices=DEVICES[::-1]), P("y", "x"))
    ours, theirs = both(lambda a: a * 2 + 1, in_shardings=target)
    with jax.transfer_guard("log"):
        for i in range(3):
            check_calls(ours, theirs, np.arange(32, dtype=np.float32).reshape(4, 8) + i)


def test_arguments_that_are_not_arrays_fail_like_jax():
    ours, theirs = both(lambda x: x)
    assert_same_error(ours, theirs, "text")
    assert_same_error(ours, theirs, np.array(["a", "b"]))
    assert_same_error(ours, theirs, object())
    assert_same_error(ours, theirs, np.ma.masked_array(np.ones(3, np.float32), mask=[0, 1, 0]))


@pytest.mark.slow
def test_prng_keys():
    ours, theirs = both(lambda k: (jax.random.normal(k, (3,)), jax.random.split(k)))
    check_calls(ours, theirs, jax.random.key(0))
    check_calls(ours, theirs, jax.random.PRNGKey(1))


# --- Uncommitted arrays, device sets, out_shardings ------------------------------------------


def test_uncommitted_arrays():
    ours, theirs = both(fresh(add_to))
    x, y = jnp.arange(8.0), jnp.ones(8)
    out = check_calls(ours, theirs, x, y)
    assert not out.committed
    # An uncommitted argument follows a committed one to its device.
    committed = jax.device_put(np.ones(8, np.float32), DEVICES[3])
    out = check_calls(ours, theirs, x, committed)
    assert out.committed and out.sharding == SingleDeviceSharding(DEVICES[3])
    out = check_calls(ours, theirs, committed, 2.0)
    assert out.devices() == {DEVICES[3]}
    # ... and to a mesh.
    sharded = jax.device_put(np.ones(8, np.float32), ROW_8)
    out = check_calls(ours, theirs, x, sharded)
    assert out.sharding == ROW_8
    assert ours.cache_size() == theirs._cache_size()


def test_uncommitted_array_into_in_shardings_is_moved():
    ours, theirs = both(lambda x: x * 2, in_shardings=ROW_8)
    x = jnp.arange(8.0)
    counts = Counts()
    moved = fallbacks("moved_argument")
    out = check_calls(ours, theirs, x, repeats=4)
    assert out.sharding == ROW_8 and out.committed
    assert fallbacks("moved_argument") - moved == 3  # each hit; the miss went through JAX
    assert (counts["cache_misses"], counts["cache_hits"], counts["compiles"]) == (1, 3, 1)


def test_committed_array_with_another_sharding_fails_like_jax():
    ours, theirs = both(lambda x: x * 2, in_shardings=ROW_8)
    check_calls(ours, theirs, jax.device_put(np.ones(8, np.float32), ROW_8))
    replicated = jax.device_put(np.ones(8, np.float32), REPLICATED_8)
    for _ in range(2):
        assert_same_error(ours, theirs, replicated)


def test_out_shardings():
    def fun(x):
        return x * 2, {"plus": x + 1, "same": x}

    for out_shardings in (
        ROW_8,
        (REPLICATED_8, None),
        (None, {"plus": REPLICATED_8, "same": ROW_8}),
    ):
        ours, theirs = both(fun, out_shardings=out_shardings)
        check_calls(ours, theirs, jnp.arange(16.0))
        check_calls(ours, theirs, np.arange(16.0), repeats=2)


def test_partition_specs_resolve_against_the_mesh_in_context():
    # Bare PartitionSpecs take the mesh that jax.set_mesh puts in context. The two meshes
    # have one abstract mesh (one trace context); JAX's jit key tells their devices apart.
    mesh = mesh_of((8,), None)
    reversed_mesh = jax.make_mesh((8,), ("x",), devices=DEVICES[::-1])
    ours, theirs = both(lambda x: x + 1, in_shardings=P("x"), out_shardings=P())
    for m in (mesh, reversed_mesh, mesh):
        with jax.set_mesh(m):
            out = check_calls(ours, theirs, np.arange(8, dtype=np.float32), repeats=2)
            assert out.sharding.mesh == m
    assert ours.cache_size() == theirs._cache_size() == 2


def test_default_device_is_part_of_the_key():
    ours, theirs = both(fresh(affine))
    for device in (None, DEVICES[3], DEVICES[6], None):
        with jax.default_device(device):
            out = check_calls(ours, theirs, np.ones(3), 2.0, jnp.float32(1), repeats=2)
            assert out.devices() == {device or DEVICES[0]} and not out.committed
    assert ours.cache_size() == theirs._cache_size() == 3


@pytest.mark.parametrize("target", ["default device", "in_shardings"])
def test_an_uncommitted_array_on_another_device_is_copied_on_the_fast_path(target):
    # JAX's dispatch copies an uncommitted array to a one-device executable's device in C++;
    # so does fastpjit's, where it once handed every such call to JAX's Python (3x slower).
    device = DEVICES[5]
    if target == "default device":
        ours, theirs = both(lambda a, b: a * b)
        context = jax.default_device(device)
    else:
        ours, theirs = both(lambda a, b: a * b, in_shardings=SingleDeviceSharding(device))
        context = contextlib.nullcontext()
    x = jnp.arange(3.0)
    assert x.devices() == {DEVICES[0]} and not x.committed
    with context:
        check_calls(ours, theirs, x, 2.0, repeats=1)
        before = fallbacks("moved_argument")
        for y in (x, jnp.ones(3, jnp.int32), x):
            out = check_calls(ours, theirs, y, 2.0, repeats=2)
            assert out.devices() == {device}
    assert fallbacks("moved_argument") == before
    np.testing.assert_array_equal(x, np.arange(3.0))


def _arrays_on(device: Any) -> int:
    return sum(device in a.devices() for a in jax.live_arrays())


@pytest.mark.parametrize("donate", [False, True], ids=["kept", "donated"])
def test_the_copy_of_an_array_passed_again_is_reused_while_it_lives(donate):
    # jax.Arrays never change: the copy made for one call serves the next with the same array,
    # unless the executable consumes it; a deleted array still raises JAX's error, and a copy
    # is let go when another array is copied.
    device = DEVICES[6]
    options = {"donate_argnums": (0,)} if donate else {}
    ours, theirs = both(lambda a: a * 2, in_shardings=SingleDeviceSharding(device), **options)
    x, y = jnp.arange(4.0), jnp.arange(4.0) + 1
    for arg in (x, x, y):
        check_calls(ours, theirs, arg, repeats=2)
    # y once more, from its kept copy: that ends the run of hits that copied new arrays, which
    # from jax 0.11.2 would hand the calls to JAX's dispatch (y, zeros, x: three in a row).
    ours(y)
    ours(jnp.zeros(4))  # a new array: no copy is kept
    copies = _arrays_on(device)
    outs = [ours(x) for _ in range(4)]
    assert _arrays_on(device) == copies + 4 + (0 if donate else 1)
    del outs
    ours(y)
    assert _arrays_on(device) == copies
    x.delete()
    assert_same_error(ours, theirs, x)
    np.testing.assert_array_equal(ours(y), np.arange(4.0) * 2 + 2)


def test_a_kept_copy_is_not_reused_under_the_device_to_device_guard():
    # fastpjit's copy applies the transfer guard on every call, as JAX's first call does.
    device = DEVICES[6]
    ours = fastpjit.jit(lambda a: a * 2, in_shardings=SingleDeviceSharding(device))
    x = jnp.arange(4.0)
    for _ in range(3):
        ours(x)
    with jax.transfer_guard_device_to_device("disallow"):
        with pytest.raises(JaxRuntimeError, match="Disallowed device-to-device transfer"):
            jax.jit(lambda a: a * 2, in_shardings=SingleDeviceSharding(device))(x)
        with pytest.raises(JaxRuntimeError, match="Disallowed device-to-device transfer"):
            ours(x)
    np.testing.assert_array_equal(ours(x), np.arange(4.0) * 2)


def test_disable_jit_runs_the_function_in_python():
    traced_with: list[type] = []

    def fun(x):
        traced_with.append(type(x))
        return x * 2

    ours, theirs = both(fun)
    x = jnp.arange(3.0)
    check_calls(ours, theirs, x, repeats=2)
    traced_with.clear()
    with jax.disable_jit():
        check_calls(ours, theirs, x, repeats=2)
        assert traced_with == [type(x)] * 4
    traced_with.clear()
    check_calls(ours, theirs, x, repeats=2)
    assert traced_with == []


def test_out_shardings_on_a_2d_explicit_mesh():
    mesh = mesh_of((2, 4), None)
    ours, theirs = both(lambda x: (x.T, x.sum(axis=1)), out_shardings=(P("y", "x"), P("x")))
    with jax.set_mesh(mesh):
        x = jax.device_put(np.arange(64, dtype=np.float32).reshape(8, 8), P("x", "y"))
        out = check_calls(ours, theirs, x)
        assert out[0].sharding.spec == P("y", "x")


# --- Compiles and the cache ------------------------------------------------------------------


def plus_one_function() -> Any:
    """A new function object each time, so that JAX's caches of one do not serve another."""

    def fun(x):
        return x + 1

    return fun


@pytest.mark.slow
def test_recompiles_on_a_new_signature_only():
    # fastpjit compiles exactly when jax.jit of an identical function compiles, and caches an
    # executable exactly where JAX's dispatcher does.
    ours, theirs = fastpjit.jit(plus_one_function()), jax.jit(plus_one_function())

    def call(x: Any, compiles: int | None = None) -> None:
        counts, jax_before = Counts(), backend_compiles()
        expected = theirs(x)
        jax_compiles = backend_compiles() - jax_before
        assert_same_outputs(ours(x), expected)
        assert counts["compiles"] == jax_compiles
        if compiles is not None:
            assert jax_compiles == compiles
        assert ours.cache_size() == theirs._cache_size()

    x = jnp.ones(4)
    call(x, 1)
    call(x, 0)  # a hit by identity
    call(x, 0)  # a hit after a hit
    call(jnp.zeros(4), 0)  # a hit by key
    call(np.ones(4, np.float32))
    call(np.zeros(4, np.float32), 0)
    call(jnp.ones(5), 1)  # shape
    call(jnp.ones(5), 0)
    call(jnp.ones(4, jnp.int32), 1)  # dtype
    call(jnp.ones(4, jnp.int32), 0)
    call(jnp.ones(4, jnp.float32), 0)
    call(1.0, 1)  # weak type
    call(2.0, 0)
    call(jnp.float32(1.0), 1)
    call(jax.device_put(jnp.ones(4), DEVICES[0]))  # committed
    call(jax.device_put(jnp.ones(4), DEVICES[5]))  # another device
    call(jax.device_put(jnp.ones(4), DEVICES[5]), 0)
    call(jax.device_put(jnp.ones(8), ROW_8), 1)
    call(jax.device_put(jnp.ones(8), NamedSharding(MESH_8, P("x"))), 0)  # an equal sharding
    call(jnp.ones(4), 0)
    assert ours.cache_size() == 9
    # fastpjit keys a numpy argument by its own dtype, JAX by the canonical one: float64 and
    # float32 numpy arguments are one entry for JAX and two, of one executable, for fastpjit.
    size = ours.cache_size()
    counts = Counts()
    assert_same_outputs(ours(np.ones(4)), theirs(np.ones(4)))
    assert counts["compiles"] == 0 and ours.cache_size() == size + 1


@pytest.mark.slow
def test_repeated_calls_flattened_in_rust_follow_every_change_of_structure():
    # A repeat of the latest call is flattened in Rust (tuples, lists, dicts, None) and
    # checked leaf by leaf; any change of structure, key, leaf or value must show.
    def fun(*args):
        return jax.tree.map(lambda v: v * 2 + 1, args)

    ours, theirs = both(fun)
    a, b, c = jnp.arange(3.0), jnp.ones((2, 2), jnp.int32), jnp.zeros(5)
    host = np.arange(4, dtype=np.float32)
    ab, ba = {"a": a, "b": b}, {"b": b, "a": a}
    calls = [
        (a,),
        (a, b),
        ([a, b],),
        ((a, b),),
        ({"a": a, "b": b},),
        ({"a": a, "b": b, "c": c},),
        (ba,),
        ({"a": a, "c": b},),
        (a, b, c),
        ({"a": a, "b": None},),
        ({"a": a, "b": (b, None)},),
        ([a, None, {"z": [b, c]}],),
        ([a, None, {"z": (b, c)}],),
        ([a, None, {"z": [c, b]}],),
        (ab, ab),
        (ab, ba),
        (host,),
        (host, a),
        (host[::2],),
        (host.astype(np.int32),),
        (host.reshape(2, 2),),
        (collections.OrderedDict(a=a, b=b),),
        (Point(a, b),),
        ((a, b), [a]),
        ([a],),
        (c,),
        ({1: a, 2: b},),
        ({2: b, 1: a},),
        ({"k": a},),
        ({"k": c},),
    ]
    rounds = [calls, calls[::-1], [call for call in calls for _ in range(2)]]
    for order in rounds:
        for args in order:
            assert_same_outputs(ours(*args), theirs(*args))
    # New objects of the same signatures: keyed (flattened in Rust, or by JAX's registry for
    # namedtuples), each a hit.
    counts = Counts()
    for args in calls:
        args = fresh_copy(args)
        assert_same_outputs(ours(*args), theirs(*args))
    assert counts["cache_misses"] == 0 and counts["compiles"] == 0
    # A numpy leaf is read again on every call, though the call repeats by identity.
    ours(host)
    host += 1
    assert_same_outputs(ours(host), theirs(host))
    counts = Counts()
    for _ in range(3):
        ours(ab, ba)
    assert counts["cache_hits"] == 3 and counts["cache_misses"] == 0


def test_fastpjit_compiles_and_jax_jit_of_the_same_function_reuses_it():
    # fastpjit sets the compile options and compiles JAX's lowering itself; like JAX, it
    # compiles a lowering once, so jax.jit of the same function then compiles nothing.
    def fun(x, y):
        return (x @ y.T).sum(axis=0), x.T

    fun = fresh(fun)
    mesh = mesh_of((2, 4), AxisType.Auto)
    x = jax.device_put(
        np.arange(64.0, dtype=np.float32).reshape(8, 8), NamedSharding(mesh, P("x", "y"))
    )
    y = jax.device_put(np.ones((4, 8), np.float32), NamedSharding(mesh, P()))
    reasons = dict(fastpjit.stats()["fallbacks"])
    counts = Counts()
    out = fastpjit.jit(fun)(x, y)
    assert counts["compiles"] == 1
    assert fastpjit.stats()["fallbacks"] == reasons  # nothing went to JAX
    before = backend_compiles()
    expected = jax.jit(fun)(x, y)
    assert backend_compiles() == before
    assert_same_outputs(out, expected)
    # And against JAX's own compile of a copy of the function:
    assert_same_outputs(out, jax.jit(fresh(fun))(x, y))
    assert out[1].sharding == NamedSharding(mesh, P("y", "x"))


def test_calls_that_jax_must_compile_are_counted():
    ours, theirs = both(lambda key: jax.random.normal(key, (3,)))
    key = jax.random.key(0)
    before = fallbacks("jax_compiled.extended_dtypes")
    check_calls(ours, theirs, key)
    assert fallbacks("jax_compiled.extended_dtypes") == before + 1


def test_hits_count_and_compile_nothing():
    ours = fastpjit.jit(lambda x, y: x * y)
    x, y = jnp.ones(8), jnp.arange(8.0)
    ours(x, y)
    ours(x, y=y)  # keywords are another signature, for JAX too
    counts = Counts()
    for _ in range(5):
        ours(x, y)  # identity fast path
        ours(fresh_copy(x), y)  # keyed
        ours(x, y=y)  # keyword: keyed
    assert counts["cache_hits"] == 15
    assert counts["cache_misses"] == 0 and counts["compiles"] == 0
    assert fastpjit.stats()["fallbacks"] == counts.start["fallbacks"]
    assert ours.cache_size() == 2


def test_clear_cache():
    ours = fastpjit.jit(lambda x: x - 1)
    x = jnp.ones(3)
    ours(x)
    ours(jnp.ones(2))
    assert ours.cache_size() == 2
    ours.clear_cache()
    assert ours.cache_size() == 0
    counts = Counts()
    np.testing.assert_array_equal(ours(x), np.zeros(3))
    assert counts["cache_misses"] == 1 and ours.cache_size() == 1


def bounded_jit(fun: Any, capacity: int) -> Any:
    """fastpjit.jit(fun) with a small cache; jit() itself keeps the default capacity."""
    jitted = jax.jit(fun)
    cache = fastpjit._core.DispatchCache("bounded", [], [], capacity=capacity)
    wrapped = jit_module.JitWrapped(jitted, functools.partial(jit_cache_miss, jitted), cache)
    caches = FunctionCaches(cache, SignatureLog(cache), SignatureOptions(cache, ((), ()), None))
    wrapped._jax_function = jit_module._JaxFunction(lambda: jitted, caches, made=jitted)
    return wrapped


def test_the_cache_is_bounded_and_evicts_the_least_recently_used():
    def fun(x):
        return x * 3

    ours, theirs = bounded_jit(fun, capacity=3), jax.jit(fun)
    arrays = {n: jnp.arange(float(n)) for n in range(1, 9)}
    for n, x in arrays.items():
        assert_same_outputs(ours(x), theirs(x))
        assert ours.cache_size() == min(n, 3)
    # Sizes 6, 7, 8 are cached. Using 6 makes 7 the least recently used.
    counts = Counts()
    assert_same_outputs(ours(fresh_copy(arrays[6])), theirs(arrays[6]))
    assert counts["cache_misses"] == 0
    assert_same_outputs(ours(arrays[1]), theirs(arrays[1]))  # evicts 7
    assert counts["cache_misses"] == 1 and ours.cache_size() == 3
    assert_same_outputs(ours(fresh_copy(arrays[6])), theirs(arrays[6]))
    assert_same_outputs(ours(fresh_copy(arrays[8])), theirs(arrays[8]))
    assert counts["cache_misses"] == 1
    assert_same_outputs(ours(fresh_copy(arrays[7])), theirs(arrays[7]))
    assert counts["cache_misses"] == 2 and ours.cache_size() == 3


def test_the_default_capacity_keeps_every_signature_of_a_few():
    ours = fastpjit.jit(lambda x: x)
    for n in range(12):
        ours(np.zeros(n, np.float32))
        ours(np.zeros(n, np.float32))
        assert ours.cache_size() == n + 1


@pytest.mark.parametrize("kind", ["jit", "pmap"])
def test_a_loop_of_cached_calls_holds_no_growing_memory(kind):
    """jaxlib hands some Python objects that an execution releases to a queue that only its own
    fast path and Python's garbage collector drain; a loop that allocates nothing else must not
    grow it (before the fix: one more Python object held per call, about 72 bytes)."""
    if kind == "jit":
        ours, x = fastpjit.jit(lambda v: v + 1), jax.device_put(np.ones(4, np.float32))
    else:
        devices = jax.devices()[:1]
        ours = fastpjit.pmap(lambda v: v + 1, devices=devices)
        x = jax.pmap(lambda v: v, devices=devices)(np.ones((1, 4), np.float32))
    calls = 3000
    for _ in range(10):
        ours(x)
    gc.collect()  # drains jaxlib's queue too (JAX runs it from a gc callback)
    gc.disable()
    try:
        before = sys.getallocatedblocks()
        for _ in range(calls):
            ours(x)
        grown = sys.getallocatedblocks() - before
    finally:
        gc.enable()
    assert grown < calls // 10, f"{grown} Python memory blocks more after {calls} calls"


# --- Ahead of time ---------------------------------------------------------------------------


def without_stack_frames(hlo: str) -> str:
    """Compiled HLO text without the Python stack frames that its metadata records (fastpjit's
    own frames show there)."""
    hlo = re.sub(r", stack_frame_id=\d+", "", hlo)
    return hlo.split("\n\nFileNames\n")[0]


def test_lower_and_compile():
    def fun(x, tree):
        return {"y": jnp.sin(x) @ tree["w"], "n": tree["n"] + 1}

    ours, theirs = both(fun, in_shardings=(ROW_8, None))
    x = jax.device_put(np.ones((8, 4), np.float32), ROW_8)
    tree = {"w": jnp.ones((4, 2)), "n": 3}
    lowered, lowered_jax = ours.lower(x, tree), theirs.lower(x, tree)
    assert lowered.as_text() == lowered_jax.as_text()
    compiled, compiled_jax = lowered.compile(), lowered_jax.compile()
    assert without_stack_frames(compiled.as_text()) == without_stack_frames(compiled_jax.as_text())
    assert compiled.cost_analysis() == compiled_jax.cost_analysis()
    assert compiled.input_shardings == compiled_jax.input_shardings
    assert compiled.output_shardings == compiled_jax.output_shardings
    check_calls(compiled, compiled_jax, x, tree)
    check_calls(compiled, compiled_jax, fresh_copy(x), fresh_copy(tree), repeats=2)
    check_calls(compiled, compiled_jax, x, {"w": np.ones((4, 2)), "n": 4}, repeats=2)
    # The wrong signature fails as JAX's compiled function does.
    assert_same_error(compiled, compiled_jax, jnp.ones((8, 3)), tree)
    assert_same_error(compiled, compiled_jax, x, {"w": jnp.ones((4, 2))})
    assert_same_error(compiled, compiled_jax, x)


def test_compiled_with_static_arguments_and_abstract_lowering():
    ours, theirs = both(scale_or_shift, static_argnums=(1, 2))
    spec = jax.ShapeDtypeStruct((4,), jnp.float32)
    compiled, compiled_jax = (
        ours.lower(spec, 3, "add").compile(),
        theirs.lower(spec, 3, "add").compile(),
    )
    assert without_stack_frames(compiled.as_text()) == without_stack_frames(compiled_jax.as_text())
    check_calls(compiled, compiled_jax, jnp.arange(4.0))
    check_calls(compiled, compiled_jax, np.arange(4.0), repeats=2)
    assert_same_error(compiled, compiled_jax, x=jnp.ones(4))  # lowered positionally
    lowered, lowered_jax = ours.lower(spec, 2, "mul"), theirs.lower(spec, 2, "mul")
    assert str(lowered.compiler_ir()) == str(lowered_jax.compiler_ir())
    assert lowered.cost_analysis() == lowered_jax.cost_analysis()


def test_compiled_with_donation():
    ours, theirs = both(add_to, donate_argnums=0)
    x = donated_input("eight-devices")
    compiled, compiled_jax = ours.lower(x, 1.0).compile(), theirs.lower(x, 1.0).compile()
    for _ in range(3):
        a, b = donated_input("eight-devices"), donated_input("eight-devices")
        assert_same_outputs(compiled(b, 1.0), compiled_jax(a, 1.0))
        assert a.is_deleted() and b.is_deleted()
        # A cached call with a donated array: DONATED_AGAIN (on 0.10.2 JAX's C++ path raises a
        # ValueError on one device and crashes on several; fastpjit raises the ValueError).
        with pytest.raises(DONATED_AGAIN[0], match=DONATED_AGAIN[1]):
            compiled(b, 1.0)


def test_trace_and_eval_shape_methods():
    ours, theirs = both(lambda x, y: (x @ y, y.sum()))
    x, y = jnp.ones((4, 3)), jnp.ones((3, 2))
    assert str(ours.trace(x, y).jaxpr) == str(theirs.trace(x, y).jaxpr)
    assert ours.eval_shape(x, y) == theirs.eval_shape(x, y)


# --- Effects and transformations ------------------------------------------------------------


def printing(x):
    jax.debug.print("x = {x}", x=x)
    return x * 2


def test_debug_print_runs_through_jax(capfd):
    ours, theirs = both(printing)
    x = jnp.arange(3.0)
    theirs(x)
    jax.effects_barrier()
    expected = capfd.readouterr().out
    assert expected == "x = [0. 1. 2.]\n"
    ours(x)  # compiles, through JAX
    jax.effects_barrier()
    assert capfd.readouterr().out == expected
    effects = "jax_runs.effects"
    before = fallbacks(effects)
    counts = Counts()
    for n in range(1, 4):
        assert_same_outputs(ours(x), theirs(x))
        jax.effects_barrier()
        assert capfd.readouterr().out == expected * 2
        assert fallbacks(effects) - before == n
    # Like JAX, the function keeps an entry that sends such calls to JAX.
    assert counts["compiles"] == 0 and ours.cache_size() == theirs._cache_size() == 1


def sine_sum(x):
    return jnp.sin(x).sum() * 2


@pytest.mark.slow
def test_grad_vmap_jit_of_a_fastpjit_function():
    x = jnp.arange(8.0)
    ours, theirs = both(sine_sum)
    for transform in (
        jax.grad,
        jax.vmap,
        jax.jit,
        jax.value_and_grad,
        lambda f: jax.jit(jax.grad(f)),
        lambda f: jax.vmap(jax.grad(f)),
    ):
        before, fallen_back = traced(), fallbacks("not_an_array")
        assert_same_outputs(transform(ours)(x), transform(theirs)(x))
        assert traced() - before >= 1  # the call traced JAX's jit
        assert fallbacks("not_an_array") == fallen_back


def test_vjp_and_jvp_of_a_fastpjit_function():
    x, t = jnp.arange(8.0), jnp.linspace(0.0, 1.0, 8)
    ours, theirs = both(sine_sum)
    out, pullback = jax.vjp(ours, x)
    expected, expected_pullback = jax.vjp(theirs, x)
    assert_same_outputs(out, expected)
    assert_same_outputs(pullback(jnp.float32(2.0)), expected_pullback(jnp.float32(2.0)))
    assert_same_outputs(jax.jvp(ours, (x,), (t,)), jax.jvp(theirs, (x,), (t,)))
    assert_same_outputs(jax.linearize(ours, x)[1](t), jax.linearize(theirs, x)[1](t))


def test_each_traced_call_counts_once_apart_from_fallbacks():
    ours = fastpjit.jit(sine_sum)
    before = traced()
    jax.grad(ours)(jnp.ones(3))
    assert traced() - before == 1
    jax.vmap(ours)(jnp.ones((2, 3)))
    assert traced() - before == 2
    counts = row(sine_sum)
    assert counts["calls"] == sum(
        counts[k] for k in ("cache_hits", "cache_misses", "jax_calls", "traced")
    )


def test_make_jaxpr_holds_jax_jit_equation():
    ours, theirs = both(sine_sum)
    x = jnp.arange(8.0)
    jaxpr, jaxpr_jax = jax.make_jaxpr(ours)(x), jax.make_jaxpr(theirs)(x)
    assert str(jaxpr) == str(jaxpr_jax)
    (eqn,) = jaxpr.jaxpr.eqns
    assert eqn.primitive.name == "jit" and eqn.params["name"] == "sine_sum"
    # inline=True drops the jit equation on jax 0.10.2; from 0.11.2 it inlines in the lowering
    # and only `jax.Inline.JAX_EARLY` drops the equation.
    if ON_0_10:
        inlines = [(True, False)]
    else:
        inlines = [(True, True), (jax.Inline.JAX_EARLY, False), (jax.Inline.XLA_LATE, True)]
    for how, keeps_jit in inlines:
        inline, inline_jax = both(sine_sum, inline=how)
        outer = jax.make_jaxpr(lambda x: inline(x) * 2)(x)  # noqa: B023 - called here
        assert str(outer) == str(jax.make_jaxpr(lambda x: inline_jax(x) * 2)(x))  # noqa: B023
        assert ("jit" in str(outer)) == keeps_jit, how
        check_calls(inline, inline_jax, x, repeats=2)
    static = fastpjit.jit(scale_or_shift, static_argnums=1)
    static_jax = jax.jit(scale_or_shift, static_argnums=1)
    assert str(jax.make_jaxpr(lambda x: static(x, 3))(x)) == str(
        jax.make_jaxpr(lambda x: static_jax(x, 3))(x)
    )


def test_eval_shape_of_a_fastpjit_function():
    ours, theirs = both(tree_function)
    args, kwargs = tree_arguments()
    shapes, shapes_jax = (
        jax.eval_shape(ours, *args, **kwargs),
        jax.eval_shape(theirs, *args, **kwargs),
    )
    assert jax.tree.structure(shapes) == jax.tree.structure(shapes_jax)
    assert jax.tree.leaves(shapes) == jax.tree.leaves(shapes_jax)


@pytest.mark.parametrize("axis_type", [AxisType.Auto, None], ids=["auto", "explicit"])
def test_shard_map_of_a_fastpjit_function(axis_type):
    mesh = mesh_of((2, 4), axis_type)
    ours, theirs = both(lambda x, y: (jnp.sin(x) * y, x.sum(keepdims=True)))
    x = jax.device_put(
        np.arange(32, dtype=np.float32).reshape(8, 4), NamedSharding(mesh, P("x", "y"))
    )
    specs = dict(mesh=mesh, in_specs=(P("x", "y"), P()), out_specs=(P("x", "y"), P("x", "y")))
    assert_same_outputs(
        jax.shard_map(ours, **specs)(x, 2.0), jax.shard_map(theirs, **specs)(x, 2.0)
    )


def test_fastpjit_function_inside_jax_jit():
    ours, theirs = both(sine_sum)
    x = jnp.arange(8.0)
    outer, outer_jax = (
        jax.jit(lambda x: ours(x) + ours(x * 2)),
        jax.jit(lambda x: theirs(x) + theirs(x * 2)),
    )
    check_calls(outer, outer_jax, x)
    # a fastpjit function calling another, against JAX's calling JAX's
    check_calls(fastpjit.jit(lambda x: ours(x) * 2), jax.jit(lambda x: theirs(x) * 2), x)


# --- Ways to apply it -----------------------------------------------------------------------


def test_decorator_forms():
    @fastpjit.jit
    def plain(x, n):
        return x * n

    @functools.partial(fastpjit.jit, static_argnums=1)
    def partial_static(x, n):
        return x * n

    @fastpjit.jit(static_argnames="n")
    def called(x, n):
        return x * n

    x = jnp.arange(4.0)
    check_calls(plain, jax.jit(plain.__wrapped__), x, 3)
    check_calls(partial_static, jax.jit(partial_static.__wrapped__, static_argnums=1), x, 3)
    check_calls(called, jax.jit(called.__wrapped__, static_argnames="n"), x, n=3)
    assert plain.__name__ == "plain" and partial_static.__name__ == "partial_static"
    assert partial_static.cache_size() == 1


def scale_method(self, x):
    return x * self.factor


def identity_method(self, x):
    return x


class Scaler:
    """Jitted functions as class attributes: methods, static on (hashable) self or not."""

    scale = functools.partial(fastpjit.jit, static_argnums=0)(scale_method)
    needs_static_self = fastpjit.jit(identity_method)

    def __init__(self, factor: float):
        self.factor = factor


class ScalerJax:
    scale = functools.partial(jax.jit, static_argnums=0)(scale_method)
    needs_static_self = jax.jit(identity_method)

    def __init__(self, factor: float):
        self.factor = factor


def test_methods():
    x = jnp.arange(4.0)
    ours, theirs = Scaler(3.0), ScalerJax(3.0)
    check_calls(ours.scale, theirs.scale, x)
    check_calls(
        functools.partial(Scaler.scale, ours),
        functools.partial(ScalerJax.scale, theirs),
        x,
        repeats=1,
    )
    check_calls(Scaler(2.0).scale, ScalerJax(2.0).scale, x, repeats=2)
    with pytest.raises(TypeError) as expected:
        theirs.needs_static_self(x)
    with pytest.raises(TypeError) as got:
        ours.needs_static_self(x)
    assert str(got.value) == str(expected.value).replace("ScalerJax", "Scaler")
    assert Scaler.scale.__get__(None, Scaler) is Scaler.__dict__["scale"]
    assert "fastpjit" in repr(Scaler.scale)


# --- Errors ---------------------------------------------------------------------------------


def one_argument(x):
    return x + 1


def two_arguments(x, y):
    return x + y


a0 = jax.device_put(np.ones(3, np.float32), DEVICES[0])
a1 = jax.device_put(np.ones(3, np.float32), DEVICES[1])
ERRORS = {
    "too-many-arguments": (one_argument, {}, (jnp.ones(3), jnp.ones(3)), {}),
    "too-few-arguments": (two_arguments, {}, (jnp.ones(3),), {}),
    "unknown-keyword": (one_argument, {}, (jnp.ones(3),), {"z": 1}),
    "unhashable-static": (two_arguments, dict(static_argnums=1), (jnp.ones(3), [1]), {}),
    "unhashable-static-name": (
        two_arguments,
        dict(static_argnames="y"),
        (jnp.ones(3),),
        {"y": {"a": 1}},
    ),
    "in-shardings-tree": (one_argument, dict(in_shardings=(ROW_8, ROW_8)), (jnp.ones(8),), {}),
    "in-shardings-dict": (
        one_argument,
        dict(in_shardings=({"b": ROW_8},)),
        ({"a": jnp.ones(8)},),
        {},
    ),
    "sharding-rank": (
        one_argument,
        dict(in_shardings=NamedSharding(MESH_8, P("x", None))),
        (jnp.ones(8),),
        {},
    ),
    "sharding-rank-numpy": (
        one_argument,
        dict(in_shardings=NamedSharding(MESH_8, P("x", None))),
        (np.ones(8),),
        {},
    ),
    "indivisible": (one_argument, dict(in_shardings=ROW_8), (np.ones(6),), {}),
    "keywords-with-in-shardings": (one_argument, dict(in_shardings=ROW_8), (), {"x": jnp.ones(8)}),
    "trace-error": (lambda x: x.reshape(5), {}, (jnp.ones(4),), {}),
    "device-sets": (two_arguments, {}, (a0, a1), {}),
    "device-sets-2": (two_arguments, {}, (a0, jax.device_put(np.ones(3), DEVICES[4])), {}),
    "mesh-and-device": (lambda x, y: x + y[:3], {}, (a0, jax.device_put(np.ones(8), ROW_8)), {}),
}


@pytest.mark.parametrize("name", list(ERRORS))
def test_errors_match_jax(name):
    fun, options, args, kwargs = ERRORS[name]
    ours, theirs = both(fun, **options)
    for _ in range(2):  # nothing was cached by the failing call
        assert_same_error(ours, theirs, *args, **kwargs)
    assert ours.cache_size() == 0


def test_errors_after_a_cached_call():
    ours, theirs = both(two_arguments)
    x = jax.device_put(np.ones(3, np.float32), DEVICES[0])
    check_calls(ours, theirs, x, x)
    assert_same_error(ours, theirs, x)
    assert_same_error(ours, theirs, x, x, x)
    assert_same_error(ours, theirs, x, jax.device_put(np.ones(3, np.float32), DEVICES[1]))
    check_calls(ours, theirs, x, x, repeats=1)


@pytest.mark.parametrize("on", ["miss", "keyed-hit", "identity-hit", "numpy-hit"])
def test_deleted_array(on):
    ours = fastpjit.jit(two_arguments)
    x, y = jnp.arange(3.0), jnp.ones(3)
    if on == "numpy-hit":
        x = np.ones(3, np.float32)
    if on != "miss":
        ours(fresh_copy(x), fresh_copy(y) if on == "keyed-hit" else y)
    y.delete()
    # JAX's oracle is a fresh jit, whose miss checks every argument.
    assert_same_error(ours, jax.jit(two_arguments), x, y)
    with pytest.raises(RuntimeError, match="Array has been deleted"):
        ours(x=x, y=y)


# --- Fallback accounting ----------------------------------------------------------------------


def test_fallbacks_are_counted_by_their_codes():
    ours = fastpjit.jit(two_arguments, static_argnums=1)
    x = jnp.arange(4.0)
    ours(x, 1)
    ours(x, 1)
    codes = ("not_an_array", "unhashable_static", "jax_runs.effects", "moved_argument")
    start = {code: fallbacks(code) for code in codes}
    traced_before = traced()

    def delta(code: str) -> int:
        return fallbacks(code) - start[code]

    assert all(delta(code) == 0 for code in start)
    jax.jit(lambda x: ours(x, 2))(x)
    # A call inside another function's trace: counted apart, not as a fallback.
    assert (delta("not_an_array"), traced() - traced_before) == (0, 1)
    with pytest.raises(ValueError, match="Non-hashable static arguments"):
        ours(x, [1])
    assert delta("unhashable_static") == 1
    fastpjit.jit(printing)(x)
    assert delta("jax_runs.effects") == 1
    moved = fastpjit.jit(one_argument, in_shardings=ROW_8)
    moved(jnp.ones(8))
    moved(jnp.ones(8))
    assert [delta(code) for code in codes] == [0, 1, 1, 1]
    # Each code has a text, and Python passes only codes.
    reasons = fastpjit.fallback_reasons()
    assert all(code in reasons for code in codes)
    assert reasons["jax_runs.effects"] == (
        "JAX runs the call: the function has effects or mutable state"
    )
    with pytest.raises(ValueError, match="no fallback code"):
        fastpjit._core.count_fallback("jit: an argument moved")


# --- Threads --------------------------------------------------------------------------------


@pytest.mark.slow
def test_threads_call_one_function_concurrently():
    ours = fastpjit.jit(lambda x, y: x * 2 + y)
    host = {n: np.arange(n * 8, dtype=np.float32) for n in (1, 2)}
    shardings = (ROW_8, SingleDeviceSharding(DEVICES[2]), REPLICATED_8)

    def round_of_calls(x: np.ndarray, sharding: Any) -> None:
        placed = fastpjit.device_put(x, sharding)
        assert placed.sharding == sharding
        for arg in (placed, x, fresh_copy(placed)):
            out = ours(arg, 1.0)
            np.testing.assert_array_equal(np.asarray(out), x * 2 + 1)
            assert out.dtype == jnp.float32
        np.testing.assert_array_equal(np.asarray(ours(placed, y=placed)), x * 3)

    for x in host.values():  # compile first, so that the threads mostly hit
        for sharding in shardings:
            round_of_calls(x, sharding)
    rounds = [0] * 4
    deadline = time.monotonic() + 2.0

    def worker(t: int) -> None:
        rng = np.random.default_rng(t)
        while time.monotonic() < deadline:
            round_of_calls(host[int(rng.integers(1, 3))], shardings[int(rng.integers(0, 3))])
            if t == 0 and rounds[t] % 100 == 99:
                ours.clear_cache()  # the others miss, concurrently
            rounds[t] += 1

    run_in_threads(worker)
    assert min(rounds) > 20


def test_concurrent_misses_of_one_signature():
    # JAX's dispatcher lets one thread compile and the others wait for its entry: one cache
    # entry, one compile, counted once.
    def run(jitted: Any) -> None:
        barrier = threading.Barrier(4)
        x = jnp.ones(3)

        def worker(_: int) -> None:
            barrier.wait()
            for _ in range(3):
                np.testing.assert_array_equal(np.asarray(jitted(x)), np.full(3, 2.0))

        run_in_threads(worker)

    theirs = jax.jit(plus_one_function())
    run(theirs)
    ours = fastpjit.jit(plus_one_function())
    counts, compiles_before = Counts(), backend_compiles()
    run(ours)
    assert counts["cache_hits"] + counts["cache_misses"] == 12
    assert counts["compiles"] == backend_compiles() - compiles_before == 1
    assert ours.cache_size() == theirs._cache_size() == 1
