"""fastpjit.pmap against jax.pmap on 8 CPU devices: outputs leaf by leaf, errors, caching."""

import enum
import functools
import subprocess
import sys
import typing

import jax
import jax.numpy as jnp
import numpy as np
import oracle
import pytest
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from lines import DONATED_AGAIN, by_line
from oracle import assert_same_error, assert_same_error_type, assert_same_outputs
from rows import row

import fastpjit
from fastpjit._jax.xla_compile import backend_compiles

DEVICES = jax.devices()
MOVED = "moved_argument"
TRACED = "not_an_array"


def counters():
    s = fastpjit.stats()
    return s["cache_hits"], s["cache_misses"], s["fallbacks"].get(MOVED, 0)


def check(pair, *args, **kwargs):
    """Calls JAX's pmap once and ours twice; the second call of ours must be a cache hit."""
    ours, theirs = pair
    expected = theirs(*args, **kwargs)
    assert_same_outputs(ours(*args, **kwargs), expected)
    hits, misses, _ = counters()
    again = ours(*args, **kwargs)
    assert counters()[:2] == (hits + 1, misses)
    assert_same_outputs(again, expected)
    return again


# (fastpjit.pmap, jax.pmap) of a function and options.
both = functools.partial(oracle.both, api="pmap")


def raised(call):
    with pytest.raises(Exception) as info:
        call()
    return info.value


def assert_same_call_error(fun_and_options, *args, message=True, **kwargs):
    """Both pmaps of `fun` with `options` raise alike (with the same message, where JAX's is
    stable) on the call."""
    fun, options = fun_and_options
    same = assert_same_error if message else assert_same_error_type
    return same(*both(fun, **options), *args, **kwargs)


X84 = np.arange(32, dtype=np.float32).reshape(8, 4)
X8 = np.arange(8, dtype=np.float32)


def double(x):
    return x * 2


def add(x, y):
    return x + y


DOUBLE = both(double)


# The classic tutorial examples.

SUM0 = both(jnp.sum, in_axes=0)
SUM1 = both(jnp.sum, in_axes=1)
NORMALIZE = both(lambda x: x / lax.psum(x, "i"), axis_name="i")


def test_sum_over_leading_axis():
    out = check(SUM0, jnp.asarray(X84))
    np.testing.assert_array_equal(np.asarray(out), X84.sum(axis=1))


def test_sum_over_axis_one_uses_four_devices():
    out = check(SUM1, jnp.asarray(X84))
    np.testing.assert_array_equal(np.asarray(out), X84.sum(axis=0))
    assert len(out.sharding.device_set) == 4


def test_normalize_by_psum():
    out = check(NORMALIZE, jnp.arange(8.0))
    np.testing.assert_allclose(np.asarray(out).sum(), 1.0, rtol=1e-6)


# in_axes and out_axes.

DOUBLE_IN = {axes: both(double, in_axes=axes) for axes in (0, 1, -1, -2)}


@pytest.mark.parametrize(
    "in_axes, shape",
    [
        (0, (8, 3)),
        (0, (4, 2, 3)),
        (1, (3, 8)),
        (1, (2, 4, 3)),
        (-2, (8, 3)),
        (-1, (8,)),
    ],
)
def test_in_axes(in_axes, shape):
    x = jnp.arange(np.prod(shape), dtype=jnp.float32).reshape(shape)
    check(DOUBLE_IN[in_axes], x)


@pytest.mark.parametrize("in_axes, shape", [(-1, (3, 8)), (-1, (8, 8)), (-2, (4, 2, 3))])
def test_negative_in_axes_that_jax_rejects(in_axes, shape):
    # JAX 0.10.2 maps a negative axis over the leading dimension but squeezes the named one.
    x = jnp.arange(np.prod(shape), dtype=jnp.float32).reshape(shape)
    ours, theirs = DOUBLE_IN[in_axes]
    assert_same_error(ours, theirs, x)


SCALE = both(lambda x, s: x * s, in_axes=(0, None))
MIXED = both(lambda a, b, c: a + b.T * c, in_axes=(0, 1, None))


def test_in_axes_none_broadcasts():
    check(SCALE, jnp.asarray(X84), jnp.arange(4.0))
    check(SCALE, jnp.asarray(X84), 3.0)
    check(SCALE, jnp.asarray(X84), np.float32(3.0))
    check(MIXED, jnp.asarray(X84), jnp.asarray(X84.T.copy()), jnp.float32(0.5))


def test_in_axes_none_everywhere_raises_like_jax():
    assert_same_call_error((double, {"in_axes": None}), X8)


PYTREE_IN = both(
    lambda tree, y: tree["a"] * tree["b"][0] + tree["b"][1] - y,
    in_axes=({"a": 0, "b": (None, 1)}, 0),
)


def test_in_axes_pytree_prefix():
    tree = {"a": jnp.asarray(X84), "b": (jnp.arange(4.0), jnp.asarray(X84.T.copy()))}
    check(PYTREE_IN, tree, jnp.ones((8, 4)))


def test_in_axes_prefix_that_does_not_match_raises_like_jax():
    assert_same_call_error((add, {"in_axes": (0, 0, 0)}), X8, X8)
    assert_same_call_error((add, {"in_axes": [0, None]}), X8, X8)


REPLICATED = both(lambda x: (x * 2, lax.psum(x, "i")), axis_name="i", out_axes=(0, None))
OUT_AXES = {
    name: both(lambda x: {"y": x * 2, "z": x.sum()}, out_axes=axes)
    for name, axes in [("0", 0), ("1", 1), ("prefix", {"y": 1, "z": 0})]
}


@pytest.mark.parametrize("name", ["0", "prefix"])
def test_out_axes(name):
    check(OUT_AXES[name], jnp.asarray(X84))


def test_out_axes_past_an_output_rank_raises_like_jax():
    # The scalar output cannot take its mapped axis at 1.
    ours, theirs = OUT_AXES["1"]
    assert_same_error(ours, theirs, jnp.asarray(X84))


OUT1 = both(lambda x: x * 2, out_axes=1)


def test_out_axes_one():
    out = check(OUT1, jnp.asarray(X84))
    assert out.shape == (4, 8)


def test_out_axes_none_for_replicated_outputs():
    mapped, total = check(REPLICATED, jnp.asarray(X84))
    np.testing.assert_array_equal(np.asarray(total), X84.sum(axis=0))
    assert total.sharding.spec == P()


def test_out_axes_none_everywhere():
    check(both(lambda x: lax.pmax(x, "i"), axis_name="i", out_axes=None), jnp.asarray(X84))


# Collectives over axis_name.


def _perm(n):
    return [(j, (j + 3) % n) for j in range(n)]


COLLECTIVES = {
    "psum": lambda x: lax.psum(x, "i"),
    "pmean": lambda x: lax.pmean(x, "i"),
    "pmax": lambda x: lax.pmax(x, "i"),
    "pmin": lambda x: lax.pmin(x, "i"),
    "all_gather": lambda x: lax.all_gather(x, "i"),
    "all_gather_tiled": lambda x: lax.all_gather(x, "i", tiled=True),
    "ppermute": lambda x: lax.ppermute(x, "i", perm=_perm(8)),
    "psum_scatter": lambda x: lax.psum_scatter(x, "i"),
    "psum_scatter_tiled": lambda x: lax.psum_scatter(x, "i", tiled=True),
    "all_to_all": lambda x: lax.all_to_all(x, "i", split_axis=0, concat_axis=1),
    "axis_index": lambda x: x + lax.axis_index("i"),
    "tree_psum": lambda x: lax.psum({"a": x, "b": (x * 2, jnp.int32(1))}, "i"),
}


@pytest.mark.parametrize("name", list(COLLECTIVES))
def test_collective(name):
    x = jnp.arange(8 * 8 * 2, dtype=jnp.float32).reshape(8, 8, 2) % 13
    check(both(COLLECTIVES[name], axis_name="i"), x)


def test_collective_results_match_numpy():
    x = np.arange(8 * 3, dtype=np.float32).reshape(8, 3)
    out = check(
        both(
            lambda v: (
                lax.psum(v, "i"),
                lax.all_gather(v, "i"),
                lax.ppermute(v, "i", perm=_perm(8)),
                lax.axis_index("i"),
            ),
            axis_name="i",
        ),
        x,
    )
    total, gathered, permuted, index = map(np.asarray, out)
    np.testing.assert_array_equal(total, np.broadcast_to(x.sum(0), (8, 3)))
    np.testing.assert_array_equal(gathered, np.broadcast_to(x, (8, 8, 3)))
    np.testing.assert_array_equal(permuted, x[[(j - 3) % 8 for j in range(8)]])
    np.testing.assert_array_equal(index, np.arange(8))


def test_collective_over_an_unknown_axis_name_raises_like_jax():
    error = assert_same_call_error((lambda x: lax.psum(x, "j"), {"axis_name": "i"}), X8)
    assert isinstance(error, NameError)


class Axis(enum.Enum):
    BATCH = 1


@pytest.mark.parametrize("name", [("outer", 1), Axis.BATCH], ids=["tuple", "enum"])
def test_axis_names_that_are_not_strings_raise_like_jax(name):
    # JAX 0.10.2 takes a tuple axis name for a tuple of mesh axes and lowers only str names.
    assert_same_call_error((lambda x: lax.psum(x, name), {"axis_name": name}), jnp.asarray(X84))


# Nested pmap: JAX 0.10.2 rejects it (shard_map inside shard_map over another mesh).


def test_nested_pmap_raises_like_jax():
    def nested(pmap):
        inner = pmap(lambda v: lax.psum(v, "j") + lax.psum(v, "i"), axis_name="j")
        return pmap(inner, axis_name="i")

    x = jnp.arange(8.0).reshape(2, 4)
    error = assert_same_error(lambda: nested(fastpjit.pmap)(x), lambda: nested(jax.pmap)(x))
    assert isinstance(error, ValueError)


# devices= and axis_size=.


@pytest.mark.parametrize(
    "devices",
    [
        DEVICES[:4],
        DEVICES[2:6],
        DEVICES[::-1],
        DEVICES[5:1:-1],
        DEVICES[6:7],
    ],
    ids=["first4", "middle4", "reversed", "reversed4", "one"],
)
def test_devices(devices):
    n = len(devices)
    pair = both(
        lambda x: (lax.psum(x, "i"), x + lax.axis_index("i")), axis_name="i", devices=devices
    )
    out = check(pair, jnp.arange(n * 3.0).reshape(n, 3))
    assert list(out[0].sharding.mesh.devices.flat) == list(devices)


def test_fewer_inputs_than_devices_uses_a_prefix_of_devices():
    out = check(both(double, devices=DEVICES[::-1]), jnp.arange(3.0))
    assert list(out.sharding.mesh.devices.flat) == DEVICES[:4:-1]


def test_devices_errors_like_jax():
    assert_same_call_error((double, {"devices": DEVICES[:4]}), X8)
    assert_same_error(fastpjit.pmap, jax.pmap, double, devices=[])


AXIS_SIZE8 = both(lambda x: lax.psum(x, "i"), axis_name="i", axis_size=8)


def test_axis_size():
    check(AXIS_SIZE8, jnp.asarray(X84))
    x = jnp.arange(4.0)
    assert_same_error(*AXIS_SIZE8, x)


def test_one_device():
    check(both(lambda x: lax.psum(x, "i") * 2, axis_name="i"), jnp.arange(3.0).reshape(1, 3))
    check(both(double, devices=[DEVICES[3]]), np.ones((1, 2), np.int32))


# Static broadcasted arguments.


def test_static_broadcasted_recompiles_per_value():
    def scale(x, n, op):
        return x * n if op == "mul" else x + n

    ours = fastpjit.pmap(scale, static_broadcasted_argnums=(1, 2))
    theirs = jax.pmap(scale, static_broadcasted_argnums=(1, 2))
    x = jnp.asarray(X84)
    compiles = fastpjit.stats()["compiles"]
    assert_same_outputs(ours(x, 2, "mul"), theirs(x, 2, "mul"))
    assert (ours.cache_size(), fastpjit.stats()["compiles"]) == (1, compiles + 1)
    assert_same_outputs(ours(x, 3, "mul"), theirs(x, 3, "mul"))
    assert_same_outputs(ours(x, 3, "add"), theirs(x, 3, "add"))
    assert (ours.cache_size(), fastpjit.stats()["compiles"]) == (3, compiles + 3)
    hits = fastpjit.stats()["cache_hits"]
    assert_same_outputs(ours(x, 2, "mul"), theirs(x, 2, "mul"))
    op = "".join(["a", "dd"])
    assert op is not "add"  # noqa: F632 -- equal, not identical
    assert_same_outputs(ours(x, 3, op), theirs(x, 3, op))
    assert fastpjit.stats()["cache_hits"] == hits + 2
    assert (ours.cache_size(), fastpjit.stats()["compiles"]) == (3, compiles + 3)


@pytest.mark.slow
def test_compiles_count_what_jax_compiles_for_the_call_moves_included():
    # Given an array that lives on one device, jax.pmap compiles its program and the one it
    # slices the array across the devices with: a function's compiles count both, as JAX's.
    def triple(x):
        return x * 3

    def compiles_of(pmap, x):
        before = backend_compiles()
        for _ in range(3):
            pmap(x).block_until_ready()
        return backend_compiles() - before

    # Shapes of their own, so that neither finds the other's slicing program compiled.
    ours = compiles_of(fastpjit.pmap(triple), jnp.ones((8, 5, 7)))
    assert ours == compiles_of(jax.pmap(triple), jnp.ones((8, 5, 9))) == 2
    counts = row(triple)
    assert (counts["cache_misses"], counts["cache_hits"], counts["compiles"]) == (1, 2, 2)


class Config(typing.NamedTuple):
    scale: float
    shift: int


def test_static_broadcasted_with_in_axes_and_kwargs():
    pair = both(
        lambda c, x, y: x * c.scale + c.shift + y,
        static_broadcasted_argnums=0,
        in_axes=(None, 1, 0),
    )
    check(pair, Config(2.0, 1), jnp.asarray(X84.T.copy()), jnp.arange(8.0))
    check(pair, Config(2.0, 1), jnp.asarray(X84.T.copy()), y=jnp.arange(8.0))
    check(pair, Config(3.0, 1), jnp.asarray(X84.T.copy()), jnp.arange(8.0))
    assert pair[0].cache_size() == 3


def test_static_arguments_equal_across_types_are_distinct():
    # JAX keys static arguments by type and value (_HashableWithStrictTypeEquality):
    # 1 == 1.0 == True, but each compiles its own executable.
    pair = both(lambda x, kind: x.astype(type(kind)), static_broadcasted_argnums=1)
    for kind in (1, 1.0, True, 1):
        assert_same_outputs(pair[0](X8, kind), pair[1](X8, kind))
    assert pair[0].cache_size() == 3


class Colliding:
    """Equal by value, all with one hash."""

    def __init__(self, value):
        self.value = value

    def __hash__(self):
        return 0

    def __eq__(self, other):
        return isinstance(other, Colliding) and other.value == self.value


def test_static_arguments_with_colliding_hashes():
    pair = both(lambda x, c: x * c.value, static_broadcasted_argnums=1)
    for value in (2, 3, 2):
        assert_same_outputs(pair[0](X8, Colliding(value)), pair[1](X8, Colliding(value)))
    assert pair[0].cache_size() == 2


def test_unhashable_static_raises_like_jax():
    pair = both(lambda x, s: x * len(s), static_broadcasted_argnums=1)
    error = assert_same_error(*pair, X8, [1, 2])
    assert isinstance(error, ValueError)


def test_missing_static_argument_raises_like_jax():
    pair = both(lambda x, s=1: x * s, static_broadcasted_argnums=1)
    assert_same_error(*pair, X8)


# Donation.


def _donated_pair(pmap):
    return pmap(
        lambda x, n, y: (x * n + y, y - 1), static_broadcasted_argnums=1, donate_argnums=(0, 2)
    )


def test_donation_deletes_donated_inputs_and_reuse_raises():
    prepare = jax.pmap(lambda x: (x + 0, x * 0 + 1))
    ours, theirs = _donated_pair(fastpjit.pmap), _donated_pair(jax.pmap)
    x, y = prepare(jnp.asarray(X84))
    their_out = theirs(x, 2, y)
    assert x.is_deleted() and y.is_deleted()
    # JAX's own fast path crashes on a deleted multi-device input; its miss raises.
    expected = raised(lambda: jax.pmap(lambda x: x)(x))
    assert type(expected) is RuntimeError

    x, y = prepare(jnp.asarray(X84))
    our_out = ours(x, 2, y)  # a miss
    assert x.is_deleted() and y.is_deleted()
    assert_same_outputs(our_out, their_out)
    x, y = prepare(jnp.asarray(X84))
    hits = fastpjit.stats()["cache_hits"]
    our_out = ours(x, 2, y)  # a hit
    assert fastpjit.stats()["cache_hits"] == hits + 1
    assert x.is_deleted() and y.is_deleted()
    assert not any(o.is_deleted() for o in our_out)
    assert_same_outputs(our_out, their_out)
    # A cached call raises DONATED_AGAIN (on 0.10.2 JAX's cached path crashes here, and raises
    # the ValueError on one device); a call that misses raises JAX's RuntimeError.
    for call in (lambda: ours(x, 2, y), lambda: ours(our_out[0], 2, y)):
        error = raised(call)
        assert type(error) is DONATED_AGAIN[0] and DONATED_AGAIN[1] in str(error)
    error = raised(lambda: ours(our_out[0], 3, y))
    assert type(error) is RuntimeError
    assert str(error) == str(expected)
    assert not our_out[0].is_deleted()


def test_donated_state_loop_on_the_identity_fast_path():
    def step(pmap):
        return pmap(lambda state, batch: state * 0.5 + batch, donate_argnums=0)

    ours, theirs = step(fastpjit.pmap), step(jax.pmap)
    batches = [jnp.asarray(X84 + i) for i in range(6)]
    prepare = jax.pmap(lambda x: x + 0)
    o, t = prepare(jnp.asarray(X84)), prepare(jnp.asarray(X84))
    history, their_history = [], []
    for batch in batches:
        history.append(o)
        their_history.append(t)
        o, t = ours(o, batch), theirs(t, batch)
        assert_same_outputs(o, t)
    # Each state is donated where JAX donates its own: jax 0.11.2 copies instead an array whose
    # host value np.asarray has fetched (in assert_same), and 0.10.2 and 0.12 donate them all.
    assert [h.is_deleted() for h in history] == [h.is_deleted() for h in their_history]
    assert history[0].is_deleted() and not o.is_deleted()
    donated = [h for h in history if h.is_deleted()][-1]
    hits = fastpjit.stats()["cache_hits"]
    error = raised(lambda: ours(donated, batches[0]))
    assert fastpjit.stats()["cache_hits"] == hits + 1  # the fast path saw the call
    assert type(error) is DONATED_AGAIN[0]
    assert by_line(
        jax_0_10="shape=float32[8,4] was donated",
        jax_0_11="Array has been deleted with shape=float32[8,4]",
    ) in str(error)


def test_donation_of_a_host_or_moved_input_keeps_the_original():
    # JAX donates the copy it places on the pmap's devices, not the caller's array.
    outs = []
    for pmap in (fastpjit.pmap, jax.pmap):
        donating = _donated_pair(pmap)
        for _ in range(2):  # ours: a miss, then a hit
            x, y = jnp.asarray(X84), np.ones((8, 4), np.float32)
            outs.append(donating(x, 2, y))
            assert not x.is_deleted()
    assert_same_outputs(outs[0], outs[2])
    assert_same_outputs(outs[1], outs[2])


def test_donated_input_deleted_before_a_first_call():
    x = jax.pmap(lambda v: v + 1)(jnp.asarray(X8))
    x.delete()
    error = assert_same_call_error((double, {}), x)
    assert type(error) is RuntimeError


# Keyword arguments, pytrees, numpy and JAX inputs.

KEYWORDS1 = both(lambda x, y: x.sum() + y, in_axes=1)


@pytest.mark.slow
def test_keyword_arguments_map_over_axis_zero():
    pair = both(add)
    check(pair, jnp.asarray(X84), y=jnp.asarray(X84))
    check(pair, x=jnp.asarray(X84), y=jnp.ones((8, 4)))
    check(pair, jnp.asarray(X84), jnp.asarray(X84))
    size = pair[0].cache_size()
    check(pair, y=jnp.ones((8, 4)), x=jnp.asarray(X84))  # keyword order does not matter
    assert pair[0].cache_size() == size
    # in_axes applies to positional arguments only.
    check(KEYWORDS1, jnp.asarray(X84.T.copy()), y=jnp.arange(8.0))


def test_keyword_arguments_with_a_tuple_in_axes_raise_like_jax():
    assert_same_call_error((add, {"in_axes": (0, None)}), X8, y=X8)


class Point(typing.NamedTuple):
    x: typing.Any
    y: typing.Any


TREE = both(
    lambda p, d: {"sum": p.x + d["w"][0], "prod": (p.y * d["w"][1], None), "n": jnp.int32(3)}
)


def test_pytrees_in_and_out():
    p = Point(jnp.asarray(X84), np.arange(8, dtype=np.int32))
    d = {"w": [jnp.ones((8, 4)), np.full(8, 2, np.int32)]}
    check(TREE, p, d)
    check(TREE, p, {"w": [jnp.ones((8, 4)), jnp.full(8, 2, jnp.int32)]})


INPUTS = both(lambda a, b: (a * 2, b + 1))


@pytest.mark.parametrize("kind", ["numpy", "int64", "jax", "committed", "placed", "bool"])
def test_numpy_and_jax_inputs(kind):
    mesh_sharding = NamedSharding(jax.sharding.Mesh(np.array(DEVICES), ("p",)), P("p"))
    make = {
        "numpy": lambda v: v,
        "int64": lambda v: v.astype(np.int64),
        "jax": jnp.asarray,
        "committed": lambda v: jax.device_put(v, DEVICES[0]),
        "placed": lambda v: jax.device_put(v, mesh_sharding),
        "bool": lambda v: v > 3,
    }[kind]
    a, b = make(X84), make(np.arange(8, dtype=np.float32))
    if kind == "committed":
        assert_same_error(*INPUTS, a, b)
    else:
        check(INPUTS, a, b)


@pytest.mark.parametrize(
    "dtype",
    [np.float16, jnp.bfloat16, np.int8, np.uint64, np.float64, np.complex128, np.bool_],
    ids=lambda d: np.dtype(d).name,
)
def test_numpy_dtypes(dtype):
    check(DOUBLE_IN[0], (np.arange(16) % 3).astype(dtype).reshape(8, 2))


def test_weakly_typed_inputs():
    check(INPUTS, jnp.arange(8) * 1.0, jnp.ones(8, jnp.int32) + 1)
    check(SCALE, jnp.asarray(X84), jnp.asarray(2.0))  # weakly typed, broadcast


def test_cache_hits_see_new_values():
    # A hit must place the values of this call: new arrays, mutated arrays, new scalars.
    ours, theirs = SCALE
    host = X84.copy()
    for s in (2.0, 3.5, -1.0):
        host += 1
        assert_same_outputs(ours(host, s), theirs(host, s))
        assert_same_outputs(ours(host.copy(), np.float32(s)), theirs(host.copy(), np.float32(s)))
        assert_same_outputs(ours(jnp.asarray(host), s), theirs(jnp.asarray(host), s))


def test_python_int_too_large_for_int32_after_a_hit():
    ours, theirs = SCALE
    ours(X84, 3)
    ours(X84, 3)
    # JAX's own messages differ between its miss and its fast path; the type is stable.
    assert_same_error_type(ours, theirs, X84, 2**40)


@pytest.mark.slow
def test_typed_prng_keys():
    keys = jax.random.split(jax.random.key(0), 8)
    check(both(lambda k: jax.random.normal(k, (3,))), keys)
    split = both(lambda k: jax.random.split(k)[0])
    new_keys = check(split, keys)
    check(split, new_keys)  # chained, on the executable's sharding


CLOSED_OVER = jnp.arange(3.0) + 10


def test_closed_over_constants_and_unused_arguments():
    host = np.arange(3.0) + 100
    pair = both(lambda x, unused: x[:, None] + CLOSED_OVER + host)
    check(pair, jnp.ones((8, 2)), jnp.zeros(8))
    unused = jax.pmap(lambda v: v)(X8)
    check(pair, jnp.ones((8, 2)), unused)
    unused.delete()  # JAX prunes the argument, so a deleted one is no error
    assert_same_outputs(pair[0](jnp.ones((8, 2)), unused), pair[1](jnp.ones((8, 2)), unused))


def test_host_callbacks_run_on_every_call():
    calls = {"ours": 0, "theirs": 0}

    def counted(who):
        def f(x):
            jax.debug.callback(lambda v: calls.__setitem__(who, calls[who] + 1), x)
            return x * 2

        return f

    ours, theirs = fastpjit.pmap(counted("ours")), jax.pmap(counted("theirs"))
    for _ in range(3):
        assert_same_outputs(ours(X8), theirs(X8))
    assert calls["ours"] == calls["theirs"] == 3 * 8


def test_backend():
    check(both(double, backend="cpu"), jnp.asarray(X84))
    assert_same_call_error((double, {"backend": "gpu"}), X8)


def test_non_array_input_raises_like_jax():
    assert_same_call_error((double, {}), "not an array")
    assert_same_call_error((double, {}), object(), message=False)


# Chaining: an output goes straight back in, without a copy.

CHAIN = both(lambda x: x * 0.5 + lax.axis_index("i"), axis_name="i")


def test_chained_outputs_are_cache_hits_without_moves():
    ours, theirs = CHAIN
    o = t = jnp.asarray(X84)
    o, t = ours(o), theirs(t)
    o, t = ours(o), theirs(t)  # the first call with a committed input: a miss
    hits, misses, moved = counters()
    for _ in range(5):
        o, t = ours(o), theirs(t)
        assert_same_outputs(o, t)
    assert counters() == (hits + 5, misses, moved)


@pytest.mark.parametrize(
    "first_devices, then_devices",
    [
        (DEVICES[::-1], None),
        (DEVICES[:4], DEVICES[4:]),
        (DEVICES[:4], DEVICES[3::-1]),
    ],
    ids=["reversed-into-default", "first4-into-last4", "first4-into-reversed4"],
)
def test_chained_into_a_pmap_over_other_devices(first_devices, then_devices):
    first = both(lambda x: x + 1, devices=first_devices)
    then = both(double, devices=then_devices)
    x = jnp.arange(float(len(first_devices)))
    o, t = first[0](x), first[1](x)
    # JAX's own fast path crashes on the second such call (a buffer on the wrong device), so
    # JAX runs once; ours runs a miss, then a hit whose input jaxlib copies to the devices of
    # the same tiles (as JAX's shard_arg does), without JAX's Python.
    expected = then[1](t)
    assert_same_outputs(then[0](o), expected)
    hits, misses, moved = counters()
    assert_same_outputs(then[0](o), expected)
    assert counters() == (hits + 1, misses, moved)


def test_out_axes_one_into_in_axes_zero_raises_like_jax():
    o = OUT1[0](jnp.asarray(X84))
    assert_same_error(*DOUBLE, o)


# Transformations: calls with tracers go to jax.pmap.

GRAD_F = both(lambda w, x: jnp.tanh(w * x) / lax.psum(w, "i"), axis_name="i")


@pytest.mark.slow
def test_grad_of_pmap():
    def loss(pmap, w, x):
        return pmap(w, x).sum()

    w, x = jnp.arange(1.0, 9.0), jnp.linspace(-1, 1, 8)
    fallbacks = fastpjit.stats()["fallbacks"].get(TRACED, 0)
    traced = traced_calls()
    assert_same_outputs(
        jax.grad(loss, argnums=1)(GRAD_F[0], w, x), jax.grad(loss, argnums=1)(GRAD_F[1], w, x)
    )
    assert_same_outputs(
        jax.value_and_grad(loss, argnums=1)(GRAD_F[0], w, x),
        jax.value_and_grad(loss, argnums=1)(GRAD_F[1], w, x),
    )
    # Calls inside JAX's traces are counted apart, not as fallbacks.
    assert traced_calls() > traced
    assert fastpjit.stats()["fallbacks"].get(TRACED, 0) == fallbacks


def traced_calls():
    return sum(f["traced"] for f in fastpjit.stats()["functions"].values())


@pytest.mark.slow
def test_vmap_of_pmap():
    x = jnp.arange(3 * 8 * 2.0).reshape(3, 8, 2)
    ours, theirs = NORMALIZE
    assert_same_outputs(jax.vmap(ours)(x), jax.vmap(theirs)(x))
    assert_same_outputs(
        jax.vmap(ours, in_axes=1, out_axes=1)(x.transpose(1, 0, 2)),
        jax.vmap(theirs, in_axes=1, out_axes=1)(x.transpose(1, 0, 2)),
    )


def test_pmap_inside_jit():
    ours, theirs = NORMALIZE
    x = jnp.arange(1.0, 9.0)
    assert_same_outputs(jax.jit(lambda v: ours(v) * 2)(x), jax.jit(lambda v: theirs(v) * 2)(x))
    assert_same_outputs(fastpjit.jit(lambda v: ours(v) + 1)(x), jax.jit(lambda v: theirs(v) + 1)(x))


def test_jit_inside_pmap():
    inner = jax.jit(lambda v: jnp.sin(v) + lax.psum(v, "i"))
    check(both(lambda v: inner(v) * 2, axis_name="i"), jnp.asarray(X84))
    check(both(jax.jit(jnp.cos)), jnp.asarray(X84))
    ours_inner = fastpjit.jit(lambda v: jnp.tanh(v) - lax.pmean(v, "i"))
    check(both(lambda v: ours_inner(v), axis_name="i"), jnp.asarray(X84))


def test_eval_shape_of_pmap():
    ours, theirs = NORMALIZE
    assert_same_outputs(
        jax.eval_shape(ours, jnp.arange(8.0)), jax.eval_shape(theirs, jnp.arange(8.0))
    )


X64_CHILD = """
import jax, numpy as np, fastpjit
for pmap in (jax.pmap, fastpjit.pmap):
    f = pmap(lambda v: v * 2)
    dtypes = []
    for x64 in (False, True, False):
        with jax.enable_x64(x64):
            f(np.arange(8))
            dtypes.append(str(f(np.arange(8)).dtype))  # a hit for fastpjit
    print(*dtypes, flush=True)
"""


@pytest.mark.subprocess
def test_x64_toggled_between_cached_calls():
    # In a child process: a hit that places int64 where the executable takes int32 (or the
    # reverse) crashes jaxlib.
    result = subprocess.run(
        [sys.executable, "-c", X64_CHILD], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    theirs, ours = result.stdout.splitlines()
    assert theirs == "int32 int64 int32"
    assert ours == theirs


# Errors with JAX's type.


def test_mapped_axes_of_different_sizes():
    assert_same_call_error((add, {}), jnp.arange(8.0), jnp.arange(4.0))
    assert_same_call_error((add, {}), jnp.arange(4.0), jnp.arange(2.0))
    assert_same_call_error((add, {"in_axes": (0, 1)}), jnp.ones((4, 3)), jnp.ones((4, 2)))


@pytest.mark.parametrize("size", [9, 16])
def test_axis_larger_than_the_device_count(size):
    error = assert_same_call_error((double, {}), jnp.arange(float(size)))
    assert isinstance(error, ValueError)


def test_in_axes_out_of_range():
    assert_same_call_error((double, {"in_axes": 2}), jnp.asarray(X84))
    assert_same_call_error((double, {"in_axes": 5}), jnp.asarray(X84))
    assert_same_call_error((add, {"in_axes": (0, 3)}), jnp.asarray(X84), jnp.asarray(X84))


@pytest.mark.parametrize("axes", [1.0, "0", (0, 1.5), {"a": [0, "x"]}], ids=repr)
def test_in_axes_not_an_int(axes):
    error = assert_same_error(fastpjit.pmap, jax.pmap, add, in_axes=axes)
    assert type(error) is TypeError


def test_out_axes_not_an_int():
    assert_same_error(fastpjit.pmap, jax.pmap, double, out_axes=0.0)


def test_out_axes_out_of_range():
    assert_same_call_error((double, {"out_axes": 2}), X8)


def test_error_after_a_cached_call_raises_like_jax():
    ours, theirs = DOUBLE
    ours(X8)
    ours(X8)
    assert_same_error(ours, theirs, np.arange(9.0))
    assert_same_outputs(ours(X8), theirs(X8))


# The wrapper itself.


def test_decorator_forms_and_lower():
    @fastpjit.pmap
    def bare(x):
        return x * 3

    @functools.partial(fastpjit.pmap, axis_name="k")
    def named(x):
        """Centres x."""
        return x - lax.pmean(x, "k")

    assert_same_outputs(bare(X84), jax.pmap(lambda x: x * 3)(X84))
    assert_same_outputs(named(X84), jax.pmap(named.__wrapped__, axis_name="k")(X84))
    assert (named.__name__, named.__doc__) == ("named", "Centres x.")
    assert_same_outputs(fastpjit.pmap(named.__wrapped__, "k")(X84), named(X84))
    assert named.lower(X84).as_text() == jax.pmap(named.__wrapped__, "k").lower(X84).as_text()


def test_cache_size_and_clear_cache():
    ours = fastpjit.pmap(lambda x: x - 1)
    assert ours.cache_size() == 0
    ours(X8)
    ours(jnp.asarray(X84))
    ours(jnp.asarray(X84))
    assert ours.cache_size() == 2
    ours.clear_cache()
    assert ours.cache_size() == 0
    misses = fastpjit.stats()["cache_misses"]
    assert_same_outputs(ours(X8), jax.pmap(lambda x: x - 1)(X8))
    assert fastpjit.stats()["cache_misses"] == misses + 1
