"""no_recompiles: inside it a call that would trace and compile raises RecompileError, naming
what differs from the nearest cached signature; hits pass; it is per thread."""

import re
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from rows import Counts, row

import fastpjit
from fastpjit._jax.xla_compile import backend_compiles


@pytest.fixture
def mesh():
    return jax.make_mesh((2, 4), ("x", "y"))


def warmed(*calls, **options):
    """fastpjit.jit of a new function (so a cache of its own), called with `calls`."""

    def scale(x, y, n=2, *, mode="times"):
        return x * y * n if mode == "times" else x + y

    f = fastpjit.jit(scale, static_argnames=("n", "mode"), **options)
    for args, kwargs in calls:
        f(*args, **kwargs)
    return f


def test_a_miss_of_another_jit_key_names_the_item():
    x = jnp.ones(4, jnp.float32)
    f = warmed(((x, x), {}))
    with (
        fastpjit.no_recompiles(),
        jax.default_matmul_precision("highest"),
        pytest.raises(fastpjit.RecompileError) as error,
    ):
        f(x, x)
    assert "jit key: jax_default_matmul_precision differs" in str(error.value)


def test_hits_pass_and_misses_raise_naming_the_weak_type():
    f = warmed(((jnp.ones(4, jnp.float32), jnp.float32(2)), {}))
    with fastpjit.no_recompiles():
        np.testing.assert_array_equal(f(jnp.ones(4, jnp.float32), jnp.float32(2)), 4.0)
        with pytest.raises(fastpjit.RecompileError) as error:
            f(jnp.ones(4, jnp.float32), 2.0)
    message = str(error.value)
    assert "scale" in message
    assert "args[1]: kind differs: this call has python float, the cached signature jax.Array" in (
        message
    )
    assert "args[1]: python float (weak type)" in message


@pytest.mark.parametrize(
    ("first", "second", "words"),
    [
        ((jnp.ones(4), jnp.ones(4)), (jnp.ones(8), jnp.ones(8)), "args[0]: shape differs"),
        ((jnp.ones(4), jnp.ones(4)), (jnp.ones(4, jnp.int32), jnp.ones(4)), "args[0]: dtype"),
        ((jnp.ones(4), jnp.ones(())), (jnp.ones(4), jnp.asarray(1.0)), "args[1]: weak type"),
        (
            (jax.device_put(jnp.ones(4), jax.devices()[1]), jnp.ones(4)),
            (jax.device_put(jnp.ones(4), jax.devices()[2]), jnp.ones(4)),
            "args[0]: sharding",
        ),
        (
            (jax.device_put(jnp.ones(4), jax.devices()[1]), jnp.ones(4)),
            (jnp.ones(4), jnp.ones(4)),
            "args[0]: committed differs",
        ),
    ],
)
def test_each_cause_of_a_miss_is_named(first, second, words):
    f = warmed((first, {}))
    with fastpjit.no_recompiles(), pytest.raises(fastpjit.RecompileError, match=re.escape(words)):
        f(*second)


def test_a_new_static_value_and_keyword_are_named():
    f = warmed(((jnp.ones(4), jnp.ones(4)), {"n": 3}))
    with fastpjit.no_recompiles():
        with pytest.raises(fastpjit.RecompileError, match=r"kwargs\['n'\]: static value"):
            f(jnp.ones(4), jnp.ones(4), n=4)
        with pytest.raises(fastpjit.RecompileError, match="keyword arguments differs"):
            f(jnp.ones(4), jnp.ones(4), n=3, mode="plus")


def test_a_sharding_change_is_named(mesh):
    rows = jax.device_put(np.ones((8, 8), np.float32), NamedSharding(mesh, P("x")))
    cols = jax.device_put(np.ones((8, 8), np.float32), NamedSharding(mesh, P(None, "y")))
    f = warmed(((rows, rows), {}))
    with fastpjit.no_recompiles(), pytest.raises(fastpjit.RecompileError) as error:
        f(cols, rows)
    assert (
        f"args[0]: sharding differs: this call has {cols.sharding!r}, the cached signature "
        f"{rows.sharding!r}" in str(error.value)
    )


def test_x64_and_a_mesh_context_are_named(mesh):
    f = warmed(((jnp.ones(4), jnp.ones(4)), {}))
    with fastpjit.no_recompiles():
        with jax.enable_x64(True), pytest.raises(fastpjit.RecompileError, match="x64"):
            f(jnp.ones(4, jnp.float32), jnp.ones(4, jnp.float32))
        # The items of the jit key that hold the mesh (which, depends on the JAX line).
        with (
            jax.set_mesh(mesh),
            pytest.raises(
                fastpjit.RecompileError, match=r"jit key: \w+ differs: this call has \w*Mesh\("
            ),
        ):
            f(jnp.ones(4), jnp.ones(4))


def test_the_first_call_of_a_function_raises_saying_nothing_is_cached():
    f = fastpjit.jit(lambda x: x + 1)
    with (
        fastpjit.no_recompiles(),
        pytest.raises(fastpjit.RecompileError, match="Nothing is cached"),
    ):
        f(jnp.ones(2))


def test_pmap_misses_raise_and_hits_pass():
    f = fastpjit.pmap(lambda x: x * 2)
    f(np.ones((8, 2), np.float32))
    with fastpjit.no_recompiles():
        f(np.ones((8, 2), np.float32))
        with pytest.raises(fastpjit.RecompileError, match="shape differs"):
            f(np.ones((8, 3), np.float32))


def raised(f, args):
    with pytest.raises(Exception) as info:
        f(*args)
    return info.value


def test_aot_and_hlo_functions_never_compile_on_a_call():
    # Both are compiled before their first call: a call of a new kind of argument misses the
    # dispatcher's cache and compiles nothing, so the guard lets it through; a wrong argument
    # raises inside the guard the error that it raises outside.
    host = np.arange(32, dtype=np.float32).reshape(8, 4)
    rows = NamedSharding(jax.make_mesh((2,), ("x",), devices=jax.devices()[:2]), P("x"))
    placed = jax.device_put(host, rows)
    compiled = fastpjit.jit(lambda x: x * 2).lower(host).compile()
    add = jax.jit(lambda x, y: x + y, in_shardings=rows, out_shardings=rows)
    hlo = fastpjit.compile_hlo(add.lower(host, host).as_text(dialect="hlo"))
    calls = [
        (compiled, (host,), host * 2),
        (compiled, (jnp.asarray(host),), host * 2),
        (compiled, (jax.device_put(host, jax.devices()[0]),), host * 2),  # committed
        (hlo, (placed, placed), host + host),
        (hlo, (host, host), host + host),
        (hlo, (placed, host), host + host),
    ]
    wrong = [
        (compiled, (host[:4],)),
        (compiled, (jax.device_put(host, jax.devices()[3]),)),
        (hlo, (host[:4], host)),
        (hlo, (host, host.astype(np.int32))),
    ]
    errors = [raised(f, args) for f, args in wrong]
    assert [type(e) for e in errors] == [TypeError, ValueError, TypeError, TypeError]
    counts, backend = Counts(), backend_compiles()
    with fastpjit.no_recompiles():
        for f, args, expected in calls:
            (out,) = jax.tree.leaves(f(*args))
            np.testing.assert_array_equal(np.asarray(out), expected)
        misses = counts["cache_misses"]
        for (f, args), error in zip(wrong, errors, strict=True):
            with pytest.raises(type(error)) as got:
                f(*args)
            assert str(got.value) == str(error)
    assert misses == len(calls)  # each a new kind of argument
    assert (counts["compiles"], backend_compiles() - backend) == (0, 0)
    assert counts["recompiles_stopped"] == 0


def test_it_is_per_thread_and_works_as_a_decorator():
    f = warmed(((jnp.ones(4), jnp.ones(4)), {}))
    outcome = {}

    @fastpjit.no_recompiles()
    def guarded():
        f(jnp.ones(16), jnp.ones(16))

    def other_thread():
        outcome["other"] = f(jnp.ones(8), jnp.ones(8)).shape  # compiles: not guarded here

    with fastpjit.no_recompiles():
        thread = threading.Thread(target=other_thread)
        thread.start()
        thread.join()
    assert outcome["other"] == (8,)
    with pytest.raises(fastpjit.RecompileError):
        guarded()
    f(jnp.ones(16), jnp.ones(16))  # outside: compiles


def test_stats_count_what_it_stopped():
    f = warmed(((jnp.ones(4), jnp.ones(4)), {}))
    before = fastpjit.stats()["recompiles_stopped"]
    with fastpjit.no_recompiles(), pytest.raises(fastpjit.RecompileError):
        f(jnp.ones(5), jnp.ones(5))
    assert fastpjit.stats()["recompiles_stopped"] == before + 1


def test_a_stream_of_numpy_arrays_handed_to_jax_stays_on_fastpjits_path_and_raises():
    # A one-device function fed a new numpy array on every call hands such calls to JAX's own
    # dispatch, which would compile a new shape silently; inside the guard they stay here.
    def step(x):
        return x * 2

    f = fastpjit.jit(step)
    rng = np.random.default_rng(0)
    for _ in range(40):
        f(rng.standard_normal((8, 4)).astype(np.float32))
    assert fastpjit.explain(f, np.ones((8, 4), np.float32)).outcome == "fallback"
    with fastpjit.no_recompiles():
        f(rng.standard_normal((8, 4)).astype(np.float32))  # a hit on fastpjit's path
        with pytest.raises(fastpjit.RecompileError, match="shape differs"):
            f(rng.standard_normal((4, 4)).astype(np.float32))


class Box:
    """A pytree node of the caller's: JAX takes it apart by the functions registered for it."""

    def __init__(self, value):
        self.value = value


jax.tree_util.register_pytree_node(Box, lambda b: ((b.value,), None), lambda _, c: Box(*c))


def test_a_pytree_node_of_the_caller_s_is_described_and_what_differs_named():
    def step(x, state):
        return x + 1

    f = fastpjit.jit(step)
    f(jnp.ones(4), Box(jnp.ones(2)))
    with fastpjit.no_recompiles(), pytest.raises(fastpjit.RecompileError) as error:
        f(jnp.ones(5), Box(jnp.ones(2)))
    message = str(error.value)
    assert "args[0]: shape differs: this call has [5], the cached signature [4]" in message
    assert "args[1][0]: jax.Array float32[2]" in message and "tree: (*, Box[None](*))" in message
    with fastpjit.no_recompiles(), pytest.raises(fastpjit.RecompileError) as error:
        f(jnp.ones(4), Box((jnp.ones(2), jnp.ones(2))))
    assert "tree: tree structure differs" in str(error.value)


def test_a_named_tuple_state_is_described_by_field():
    import optax

    def step(x, state):
        return x + 1

    f = fastpjit.jit(step)
    f(jnp.ones(4), optax.EmptyState())
    with fastpjit.no_recompiles(), pytest.raises(fastpjit.RecompileError, match="shape differs"):
        f(jnp.ones(5), optax.EmptyState())


class Subclass(np.ndarray):
    """An ndarray subclass, which fastpjit hands to JAX's dispatch."""


def nested(leaf, levels):
    for _ in range(levels):
        leaf = [leaf]
    return leaf


@pytest.mark.parametrize(
    "argument",
    [
        np.ones(3, np.float32).view(Subclass),
        nested(np.float32(1), 120),  # deeper than fastpjit's signatures go
    ],
    ids=["ndarray subclass", "nesting past 100 levels"],
)
def test_a_compile_on_jax_s_path_raises_too(argument):
    def first_leaf_twice(x):
        return jax.tree.leaves(x)[0] * 2

    f = fastpjit.jit(first_leaf_twice)
    before = fastpjit.stats()["recompiles_stopped"]
    with fastpjit.no_recompiles(), pytest.raises(fastpjit.RecompileError, match="first_leaf"):
        f(argument)
    assert fastpjit.stats()["recompiles_stopped"] == before + 1
    assert row(first_leaf_twice)["fallbacks"]
    # Compiled outside it, the same call is a hit of JAX's inside it.
    expected = f(argument)
    with fastpjit.no_recompiles():
        np.testing.assert_array_equal(f(argument), expected)


def test_jax_s_own_functions_and_disable_jit_compile_inside_it():
    # Only fastpjit's functions are guarded: eager operations and jax.jit compile as they do.
    with fastpjit.no_recompiles():
        jax.jit(lambda x: x - 1)(jnp.arange(3.0) + 7)
        with jax.disable_jit():
            fastpjit.jit(lambda x: x * 3)(np.ones(2, np.float32))
