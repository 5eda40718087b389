"""`f.bind(*args, **kwargs)`: resident arguments bound once for serving loops, against JAX's
call with the same arguments (`jax.jit(f)(*args, *rest)`): the same results, dtypes, weak
types, shardings, commitment and exceptions, on 1 and 8 devices, for jit, pmap, AOT-compiled
and compile_hlo functions."""

from __future__ import annotations

import contextlib
import copy
import functools
import pickle
import re
import threading
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from lines import ON_0_10
from oracle import assert_same_outputs
from rows import row
from threads import run_in_threads

import fastpjit

MESH_8 = jax.make_mesh((8,), ("x",))
ROW_8 = NamedSharding(MESH_8, P("x"))
REPLICATED_8 = NamedSharding(MESH_8, P())


def decode_step(params, token, cache, scale=1.0):
    h = jnp.tanh(token @ params["w"] + params["b"]) * scale
    return h.sum(axis=-1), cache * 0.5 + h.mean()


def host_params(features: int = 4) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {
        "w": rng.standard_normal((features, 8), dtype=np.float32),
        "b": np.arange(8, dtype=np.float32),
    }


@pytest.mark.parametrize("devices", [1, 8])
def test_bound_prefix_and_keywords_match_jax(devices):
    params = host_params()
    token, cache = np.ones((8, 4), np.float32), jnp.zeros((8,))
    if devices == 8:
        params = jax.device_put(params, REPLICATED_8)
        token = jax.device_put(token, ROW_8)
        cache = jax.device_put(cache, ROW_8)
    f, theirs = fastpjit.jit(decode_step), jax.jit(decode_step)
    g = f.bind(params)
    for _ in range(3):
        assert_same_outputs(g(token, cache), theirs(params, token, cache))
        assert_same_outputs(g(token, cache, scale=2.0), theirs(params, token, cache, scale=2.0))
    h = f.bind(params, scale=3)
    assert_same_outputs(h(token, cache), theirs(params, token, cache, scale=3))
    with pytest.raises(TypeError, match="multiple values for keyword argument"):
        h(token, cache, scale=1.0)


def test_bound_numpy_trees_are_placed_once_and_64_bit_values_are_left_to_each_call():
    params = {"w": np.ones((4, 8), np.float32), "b": np.arange(8, dtype=np.float64), "lr": 0.5}
    g = fastpjit.jit(lambda p, x: x @ p["w"] + p["b"] * p["lr"]).bind(params)
    x = jnp.ones((2, 4))
    g(x)  # placed after the first call, on the shardings that its executable takes
    bound = g._args[0]
    assert isinstance(bound["w"], jax.Array) and not bound["w"].committed
    assert type(bound["b"]) is np.ndarray and bound["lr"] == 0.5  # dtype depends on x64
    params["w"][:] = 7.0  # the host array after binding: the bound copy does not change
    expected = jax.jit(lambda p, x: x @ p["w"] + p["b"] * p["lr"])(
        {"w": np.ones((4, 8), np.float32), "b": params["b"], "lr": 0.5}, x
    )
    for _ in range(3):
        assert_same_outputs(g(x), expected)
    with jax.enable_x64(True):
        assert_same_outputs(
            g(x),
            jax.jit(lambda p, x: x @ p["w"] + p["b"] * p["lr"])(
                {"w": bound["w"], "b": params["b"], "lr": 0.5}, x
            ),
        )


def test_static_arguments_beside_bound_ones_go_through_the_dispatcher():
    # The bound path takes calls of positional arrays alone, and no function with static
    # arguments: their values are part of the key that it would skip. Such bound calls are
    # the dispatcher's hits, found by its recent-entry probe, never the bound path's.
    def scaled(params, x, n):
        return (x @ params["w"]) * n

    params = host_params()
    g = fastpjit.jit(scaled, static_argnums=2).bind(params)
    theirs = jax.jit(scaled, static_argnums=2)
    x = jnp.ones((3, 4))
    # Misses: each value of n, then n=1 again with the numpy weights placed after the first call.
    for n in (1, 2, 1):
        assert_same_outputs(g(x, n), theirs(params, x, n))
    before = row(scaled)
    for n in (2, 1, 2, 1):
        report = fastpjit.explain(g, x, n)
        assert (report.outcome, report.path) == ("hit", "recent")
        assert_same_outputs(g(x, n), theirs(params, x, n))
    after = row(scaled)
    assert after["cache_hits"] - before["cache_hits"] == 4
    assert after["cache_misses"] == before["cache_misses"]
    assert after["compiles"] == before["compiles"]
    assert not g._on_bound_path


@pytest.mark.parametrize("devices", [1, 8])
def test_a_donated_per_call_argument_over_a_50_step_loop(devices):
    params = host_params()
    token = np.ones((8, 4), np.float32)
    ours_cache, theirs_cache = jnp.zeros((8,)), jnp.zeros((8,))
    if devices == 8:
        params = jax.device_put(params, REPLICATED_8)
        ours_cache = jax.device_put(ours_cache, ROW_8)
        theirs_cache = jax.device_put(theirs_cache, ROW_8)
    g = fastpjit.jit(decode_step, donate_argnums=2).bind(params)
    theirs = jax.jit(decode_step, donate_argnums=2)
    for step in range(50):
        previous, their_previous = ours_cache, theirs_cache
        out, ours_cache = g(token, ours_cache)
        expected, theirs_cache = theirs(params, token, theirs_cache)
        # Donated where JAX donates its own: jax 0.11.2 copies instead an array whose host
        # value np.asarray fetched (in assert_same_outputs).
        assert previous.is_deleted() == their_previous.is_deleted()
        assert previous.is_deleted() or step > 0
        assert_same_outputs((out, ours_cache), (expected, theirs_cache))


def test_new_per_call_shapes_recompile_and_are_counted():
    g = fastpjit.jit(decode_step).bind(host_params(features=5))
    stats = row(decode_step)
    misses, compiles = stats["cache_misses"], stats["compiles"]
    for rows in (2, 3, 2, 4):
        x = jnp.ones((rows, 5))
        assert_same_outputs(
            g(x, jnp.zeros(())), jax.jit(decode_step)(host_params(features=5), x, jnp.zeros(()))
        )
    stats = row(decode_step)
    # The first call places the bound numpy weights: its signature is the only other miss,
    # and it compiles nothing.
    assert stats["cache_misses"] - misses == 4
    assert stats["compiles"] - compiles == 3


def placed(devices: int) -> tuple[dict[str, jax.Array], jax.Array, jax.Array]:
    """Parameters, a token and a cache for `decode_step`, on 1 device or over 8."""
    params = {"w": jnp.ones((4, 8)), "b": jnp.zeros(8)}
    token, cache = jnp.ones((8, 4)), jnp.zeros(())
    if devices == 8:
        params = jax.device_put(params, REPLICATED_8)
        token, cache = jax.device_put(token, ROW_8), jax.device_put(cache, REPLICATED_8)
    return params, token, cache


def consume(tree: Any) -> Any:
    """Donates every array of `tree` to a computation."""
    return jax.jit(lambda t: jax.tree.map(lambda v: v + 1, t), donate_argnums=0)(tree)


@pytest.mark.parametrize("devices", [1, 8])
def test_a_deleted_bound_argument_raises_jax_s_error_naming_it(devices):
    params, token, cache = placed(devices)
    g = fastpjit.jit(decode_step).bind(params)
    g(token, cache)
    params["w"].delete()
    with pytest.raises(
        RuntimeError, match=r"bound argument args\[0\]\['w'\]: Array has been deleted"
    ):
        g(token, cache)


def row_step(params, token, cache):
    # Row by row: the devices never wait for each other (decode_step's mean makes them).
    return jnp.tanh(token @ params["w"] + params["b"]), cache


@pytest.mark.timeout(60)
@pytest.mark.parametrize("devices", [1, 8])
@pytest.mark.parametrize("how", ["donated", "deleted through a shard"])
@pytest.mark.parametrize("step", [decode_step, row_step], ids=["communicates", "row by row"])
def test_a_bound_argument_donated_or_deleted_elsewhere_raises_naming_it(devices, how, step):
    # Across devices, jaxlib 0.10.2 crashes on such an input. Later jaxlibs run the other devices'
    # part of the call where only some of its buffers are gone: decode_step's devices then wait
    # for the failed ones' until XLA aborts the process, and after row_step's no later call on
    # those devices completes. So every input is checked before the executable runs, as jax.jit
    # does, by jaxlib's is_deleted(): it looks at the first shard's buffer (shard 0 here) and at
    # no other, for jax.jit as for fastpjit.
    params, token, cache = placed(devices)
    g = fastpjit.jit(step).bind(params)
    expected = jax.jit(step)(params, token, cache)
    for _ in range(3):  # The first calls learn the bound path.
        assert_same_outputs(g(token, cache), expected)
    assert g._on_bound_path
    if how == "donated":
        consume(params)
    else:
        params["w"].addressable_shards[0].data.delete()
    assert params["w"].is_deleted()
    for _ in range(2):
        with pytest.raises((RuntimeError, ValueError), match=r"bound argument args\[0\]\['[bw]'\]"):
            g(token, cache)
    # The plain call raises an error of JAX's type. (jax.jit of jaxlib 0.10.2 crashes on such an
    # input across devices; there either of JAX's two types.)
    jax_type: Any = (RuntimeError, ValueError)
    if devices == 1 or not ON_0_10:
        with pytest.raises(jax_type) as theirs:
            jax.jit(step)(params, token, cache)
        jax_type = theirs.type
    with pytest.raises(jax_type):
        fastpjit.jit(step)(params, token, cache)


@pytest.mark.timeout(60)
def test_a_call_refused_for_a_deleted_bound_array_consumes_none_of_its_donated_arguments():
    # Later jaxlibs would run the other devices' part of the call, consuming their shards of the
    # cache; JAX refuses the whole call first.
    params, token, _ = placed(8)
    cache = jax.device_put(jnp.zeros((8, 8)), ROW_8)
    g = fastpjit.jit(row_step, donate_argnums=2).bind(params)
    for _ in range(3):
        _, cache = g(token, cache)
    assert g._on_bound_path
    params["w"].addressable_shards[0].data.delete()
    with pytest.raises((RuntimeError, ValueError), match=r"bound argument args\[0\]\['w'\]"):
        g(token, cache)
    assert not cache.is_deleted()
    if not ON_0_10:  # jax.jit of jaxlib 0.10.2 crashes here
        with pytest.raises((RuntimeError, ValueError)):
            jax.jit(row_step, donate_argnums=2)(params, token, cache)
        assert not cache.is_deleted()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("how", ["deleted", "donated"])
def test_bound_arrays_deleted_or_donated_by_another_thread_while_calls_run(how):
    # row_step: where a deletion races a call, some devices' part of it can fail, and XLA's
    # CPU collectives would then wait for the others' until they abort (jax.jit's calls too).
    params, token, cache = placed(8)
    g = fastpjit.jit(row_step).bind(params)
    expected = jax.jit(row_step)(params, token, cache)
    for _ in range(3):
        g(token, cache)
    assert g._on_bound_path
    # Where jaxlib fails jax.jit's calls too, the deletion waits for the calls in flight (and
    # they for it): jaxlib 0.10.2 crashes where a donation or deletion races an execution across
    # devices, and later ones can leave a call's outputs never ready where `delete()` races it
    # (no check before the call can close that window). A donation races the calls there.
    gate = None if how == "donated" and not ON_0_10 else threading.Lock()
    calls = threading.Semaphore(0)
    deadline = time.monotonic() + 30

    def work(t: int) -> None:
        if t == 4:
            for _ in range(20):  # after some calls of each thread's have run
                assert calls.acquire(timeout=30)
            with gate or contextlib.nullcontext():
                if how == "deleted":
                    params["w"].delete()
                else:
                    consume(params)
            return
        failed = 0
        while failed < 3 and time.monotonic() < deadline:
            try:
                with gate or contextlib.nullcontext():
                    out = jax.block_until_ready(g(token, cache))
            except (RuntimeError, ValueError) as err:
                assert re.match(r"bound argument args\[0\]\['[bw]'\]", str(err)), err
                failed += 1
                continue
            assert not failed, "a call after one that found the array deleted succeeded"
            assert_same_outputs(out, expected)
            calls.release()
        assert failed == 3

    run_in_threads(work, count=5, timeout=50)


def test_binding_a_donated_argument_is_a_value_error_naming_it():
    params = host_params()
    with pytest.raises(ValueError, match="argument 0 .* is donated"):
        fastpjit.jit(decode_step, donate_argnums=0).bind(params)
    with pytest.raises(ValueError, match="argument 0 .* is donated"):
        fastpjit.jit(decode_step, donate_argnames="params").bind(params)
    with pytest.raises(ValueError, match="keyword argument 'cache' .* is donated"):
        fastpjit.jit(decode_step, donate_argnums=2).bind(params, cache=jnp.zeros(()))
    with pytest.raises(ValueError, match="argument 0 .* is donated"):
        fastpjit.pmap(lambda a, b: a + b, donate_argnums=0).bind(np.ones((8, 2)))
    x = jnp.ones(4)
    compiled = fastpjit.jit(lambda a, b: a + b, donate_argnums=1).lower(x, x).compile()
    with pytest.raises(ValueError, match="argument 1 .* is donated"):
        compiled.bind(x, x)
    assert_same_outputs(compiled.bind(x)(jnp.ones(4)), x + 1)


@pytest.mark.slow
def test_a_bound_function_inside_jit_grad_and_vmap_stages_like_partial():
    params = host_params()
    g = fastpjit.jit(decode_step).bind(params)
    p = functools.partial(jax.jit(decode_step), params)
    token, cache = jnp.ones((8, 4)), jnp.zeros(())

    def loss(fn: Any, t: Any) -> Any:
        return fn(t, cache)[0].sum()

    assert_same_outputs(
        jax.jit(loss, static_argnums=0)(g, token), jax.jit(loss, static_argnums=0)(p, token)
    )
    assert_same_outputs(
        jax.grad(lambda t: loss(g, t))(token), jax.grad(lambda t: loss(p, t))(token)
    )
    tokens = jnp.ones((3, 8, 4))
    assert_same_outputs(
        jax.vmap(lambda t: g(t, cache))(tokens), jax.vmap(lambda t: p(t, cache))(tokens)
    )


@pytest.mark.slow
def test_pmap_aot_and_compile_hlo_functions_bind():
    x = np.arange(16, dtype=np.float32).reshape(8, 2)
    pmapped = fastpjit.pmap(lambda a, b: a * b)
    g = pmapped.bind(x)
    for _ in range(2):
        assert_same_outputs(
            g(jnp.full((8, 2), 2.0)), jax.pmap(lambda a, b: a * b)(x, jnp.full((8, 2), 2.0))
        )
    y = jax.device_put(jnp.ones((8, 4)), ROW_8)
    compiled = fastpjit.jit(lambda a, b: a - b).lower(y, y).compile()
    bound = compiled.bind(np.full((8, 4), 3.0, np.float32))
    assert bound._args[0].sharding == compiled.input_shardings[0][0]
    assert_same_outputs(
        bound(y),
        jax.jit(lambda a, b: a - b)
        .lower(y, y)
        .compile()(jax.device_put(np.full((8, 4), 3.0, np.float32), ROW_8), y),
    )
    hlo = jax.jit(lambda a, b: a + b).lower(jnp.ones(4), jnp.ones(4)).as_text()
    h = fastpjit.compile_hlo(hlo, jax.devices()[:1]).bind(np.full(4, 2.0, np.float32))
    np.testing.assert_array_equal(h(jnp.ones(4)), np.full(4, 3.0))


def test_binding_more_arguments_than_a_compiled_function_takes_is_a_type_error():
    x = jnp.ones(4)
    compiled = fastpjit.jit(lambda a, b: a + b).lower(x, x).compile()
    hlo = fastpjit.compile_hlo(
        "HloModule m\nENTRY e { p = f32[4] parameter(0)\nROOT r = f32[4] add(p, p) }"
    )
    for f, takes in ((compiled, 2), (hlo, 1)):
        with pytest.raises(TypeError, match=f"takes {takes} positional arguments, and 3 were"):
            f.bind(x, x, x)
    # As JAX's AOT call raises for too many arguments.
    with pytest.raises(TypeError):
        jax.jit(lambda a, b: a + b).lower(x, x).compile()(x, x, x)


@pytest.mark.parametrize(
    ("bound", "message"),
    [
        (
            np.ones((3, 8), np.float32),
            r"args\[0\] .* compiled for float32\[4,8\], and float32\[3,8\]",
        ),
        (
            jnp.ones((4, 8), jnp.int32),
            r"args\[0\] .* compiled for float32\[4,8\], and int32\[4,8\]",
        ),
        ("weights", r"args\[0\] .* compiled for float32\[4,8\], and a str was bound"),
        ((np.ones((4, 8), np.float32),), r"args\[0\] .* compiled for the structure"),
    ],
)
def test_binding_what_a_compiled_function_was_not_compiled_for_is_a_type_error(bound, message):
    w, x = np.ones((4, 8), np.float32), np.ones((8, 2), np.float32)
    compiled = fastpjit.jit(lambda w, x: w @ x).lower(w, x).compile()
    hlo = fastpjit.compile_hlo(jax.jit(lambda w, x: w @ x).lower(w, x).as_text())
    for f in (compiled, hlo):
        with pytest.raises(TypeError, match=message):
            f.bind(bound)
    # JAX's AOT call raises the same type for the same argument.
    with pytest.raises(TypeError):
        jax.jit(lambda w, x: w @ x).lower(w, x).compile()(bound, x)
    # Keywords: by name where the function takes them, never where it takes none.
    keyed = fastpjit.jit(lambda w, x: w @ x).lower(w, x=x).compile()
    with pytest.raises(TypeError, match=r"kwargs\['x'\] .* compiled for float32\[8,2\]"):
        keyed.bind(w, x=np.ones((8, 3), np.float32))
    np.testing.assert_array_equal(keyed.bind(w, x=x)(), w @ x)
    with pytest.raises(TypeError, match="takes no keyword argument 'x'"):
        hlo.bind(w, x=x)


class Model:
    def __init__(self) -> None:
        self.apply = fastpjit.jit(decode_step).bind(host_params())


def test_wrapped_repr_lower_method_partial_copy_and_pickle():
    f = fastpjit.jit(decode_step)
    g = f.bind(host_params())
    token, cache = jnp.ones((2, 4)), jnp.zeros(())
    assert g.__wrapped__ is f
    assert "decode_step" in repr(g) and "arg0" in repr(g)
    assert "tanh" in g.lower(token, cache).as_text()
    assert_same_outputs(Model().apply(token, cache), g(token, cache))
    assert_same_outputs(functools.partial(g, token)(cache), g(token, cache))
    assert copy.copy(g) is g and copy.deepcopy(g) is g
    restored = pickle.loads(pickle.dumps(g))
    assert_same_outputs(restored(token, cache), g(token, cache))


@pytest.mark.timeout(60)
def test_new_weights_bound_while_four_threads_call_the_old_function():
    f = fastpjit.jit(decode_step)
    token, cache = jnp.ones((2, 4)), jnp.zeros(())
    current = {"g": f.bind(host_params()), "version": 0}
    expected = [
        jax.jit(decode_step)({"w": host_params()["w"] * v, "b": host_params()["b"]}, token, cache)
        for v in (1, 2, 3)
    ]
    errors: list[BaseException] = []

    def serve() -> None:
        try:
            for _ in range(300):
                g, version = current["g"], current["version"]
                assert_same_outputs(g(token, cache), expected[version])
        except BaseException as err:  # noqa: BLE001
            errors.append(err)

    threads = [threading.Thread(target=serve) for _ in range(4)]
    for t in threads:
        t.start()
    for version in (1, 2):
        params = {"w": host_params()["w"] * (version + 1), "b": host_params()["b"]}
        new = f.bind(params)
        current["g"], current["version"] = new, version  # a reader may see either pair
    for t in threads:
        t.join()
    assert not errors, errors[0]


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_eight_threads_of_2000_bound_calls():
    params = jax.device_put(host_params(), REPLICATED_8)
    g = fastpjit.jit(decode_step).bind(params)
    tokens = [jax.device_put(np.full((8, 4), i, np.float32), ROW_8) for i in range(8)]
    cache = jax.device_put(jnp.zeros((8,)), ROW_8)
    expected = [jax.jit(decode_step)(params, t, cache) for t in tokens]

    def serve(i: int) -> None:
        for n in range(2000):
            # Waited for, as a serving loop consumes each step: XLA's CPU collectives abort
            # with hundreds of collective programs in flight (JAX's too).
            out = jax.block_until_ready(g(tokens[i], cache))
            if n % 100 == 0:
                assert_same_outputs(out, expected[i])
        assert_same_outputs(g(tokens[i], cache), expected[i])

    run_in_threads(serve, count=8, timeout=110)


def test_bound_numpy_weights_go_on_the_shardings_that_the_executable_takes():
    params = host_params()
    token = jax.device_put(np.ones((8, 4), np.float32), ROW_8)
    cache = jax.device_put(jnp.zeros((8,)), ROW_8)
    g = fastpjit.jit(decode_step).bind(params)
    expected = jax.jit(decode_step)(params, token, cache)
    assert_same_outputs(g(token, cache), expected)
    assert g._args[0]["w"].sharding.num_devices == 8
    before = row(decode_step)
    for _ in range(3):
        assert_same_outputs(g(token, cache), expected)
    after = row(decode_step)
    assert after["fallbacks"] == before["fallbacks"]  # nothing moved by JAX
    assert after["cache_hits"] - before["cache_hits"] >= 2


@pytest.mark.slow
def test_the_bound_path_leaves_calls_of_other_signatures_and_contexts_to_the_dispatcher():
    """After the first call of positional arrays, a bound call of the same signature runs its
    entry directly; any other call (shapes, shardings, commitment, x64, keywords, a cleared
    cache) goes through the dispatcher and matches JAX."""
    params = jax.device_put(host_params())
    f = fastpjit.jit(decode_step)
    g = f.bind(params)
    token, cache = jnp.ones((8, 4)), jnp.zeros(())

    def same(*args: Any, **kwargs: Any) -> None:
        assert_same_outputs(g(*args, **kwargs), jax.jit(decode_step)(params, *args, **kwargs))

    stats = row(decode_step)
    hits = stats["cache_hits"]
    for _ in range(4):
        same(token, cache)
    assert row(decode_step)["cache_hits"] - hits >= 3
    same(jnp.ones((3, 4)), cache)  # another shape
    same(jax.device_put(token, jax.devices()[0]), cache)  # committed
    same(jax.device_put(token, ROW_8), jax.device_put(cache, REPLICATED_8))  # 8 devices
    same(token, cache, scale=2.0)  # a keyword
    same(np.ones((8, 4), np.float32), cache)  # numpy
    with jax.enable_x64(True):
        same(token, cache)
    f.clear_cache()
    misses = row(decode_step)["cache_misses"]
    same(token, cache)
    assert row(decode_step)["cache_misses"] == misses + 1
    same(token, cache)


@pytest.mark.parametrize("devices", [1, 8])
def test_bound_leaves_the_executable_does_not_use_keep_calls_on_the_bound_path(devices):
    # JAX prunes the arguments that a program does not use: a bound numpy weight among them is
    # never placed, and is only keyed; the calls run the executable directly.
    def uses_one(params, x):
        return x * params["used"]

    rng = np.random.default_rng(1)
    params = {f"w{i}": rng.standard_normal((4, 4)).astype(np.float32) for i in range(20)}
    params["used"] = np.float32(3.0) * np.ones(4, np.float32)
    params["unused_array"] = jnp.ones(3)
    x = np.arange(8.0 * devices, dtype=np.float32).reshape(2 * devices, 4)
    x = jax.device_put(x, ROW_8 if devices == 8 else None)
    g = fastpjit.jit(uses_one).bind(params)
    for _ in range(3):
        assert_same_outputs(g(x), jax.jit(uses_one)(params, x))
    before = row(uses_one)
    report = fastpjit.explain(g, x)
    assert (report.outcome, report.path) == ("hit", "bound")
    assert report.inputs["args[0]['w3']"].startswith("not an input")
    for _ in range(5):
        assert_same_outputs(g(x), jax.jit(uses_one)(params, x))
    after = row(uses_one)
    assert after["cache_hits"] - before["cache_hits"] == 5
    assert after["fallbacks"] == before["fallbacks"]
