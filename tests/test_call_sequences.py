"""Random sequences of calls, each made through fastpjit and through JAX, compared call by call.

Each scenario jits (or pmaps) one function with random options, draws a few call shapes (trees
of Python and numpy scalars, numpy arrays of several dtypes, layouts and origins, jax.Arrays
committed or not, on one device or eight, weak-typed, None), and then calls them in a random
order: with the same objects again, with new ones, with numpy arrays changed in place or
jax.Arrays deleted, inside contexts that JAX's jit keys (default device, dtype promotion, x64,
matmul precision, debug NaNs). Every call must give what JAX gives: the same outputs (tree,
values, dtypes, weak types, shardings, commitment) or the same exception type. Some scenarios
run on four threads at once, which share the function and pass each other's objects. The
sequences reach the dispatcher's memories of earlier calls (remembered arrays, kept host
values and copies, the latest call's tree), which hand-written tests reach one at a time; one
of them found that None, passed where a remembered array had died, passed for that array.

The seeds are fixed, so that a failure names its scenario and step.
"""

from __future__ import annotations

import collections
import contextlib
import pickle
import random
import threading
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from oracle import assert_same_outputs, fresh
from threads import run_in_threads

import fastpjit

# Hundreds of random calls per sequence, against JAX: seconds each.
pytestmark = [pytest.mark.slow]

DEVICES = tuple(jax.devices())
MESH = jax.make_mesh((8,), ("d",))
Pair = collections.namedtuple("Pair", "a b")
STATICS = (1, 2, 1.0, 2.0, True, "a", ("k", 4), None, (1, 2))


def _weak(value: Any) -> jax.Array:
    return jax.jit(lambda: value)()


def _leaf_makers(rng: random.Random) -> list[Callable[[], Any]]:
    """Makers of the leaves a jit call may get; each makes a new object."""

    def ints(dtype: Any) -> np.ndarray:
        return ((np.arange(3) + rng.randint(0, 1)) % 2).astype(dtype)

    return [
        lambda: True,
        lambda: 3,
        lambda: 2**40,
        lambda: 2.5,
        lambda: -0.0,
        lambda: float("nan"),
        lambda: 1 + 2j,
        lambda: np.float32(1.5),
        lambda: np.int8(3),
        lambda: np.float64(2.0),
        lambda: np.bool_(True),
        lambda: np.uint32(7),
        lambda: np.float16(0.5),
        lambda: np.complex64(1j),
        lambda: np.int64(5),
        lambda: np.array(4.0, np.float32),
        lambda: ints(np.float32),
        lambda: ints(np.int32),
        lambda: ints(np.uint8),
        lambda: ints(np.bool_),
        lambda: ints(">f4"),
        lambda: np.arange(6, dtype=np.float32).reshape(2, 3),
        lambda: np.arange(6, dtype=np.float64).reshape(2, 3),
        lambda: np.ones((8, 4), np.float32) * rng.randint(0, 2),
        lambda: np.asfortranarray(np.arange(6, dtype=np.float32).reshape(2, 3)),
        lambda: np.arange(12, dtype=np.float32).reshape(3, 4)[:, ::2],
        lambda: pickle.loads(pickle.dumps(ints(np.float32))),
        lambda: jnp.arange(3, dtype=jnp.float32),
        lambda: jnp.arange(3, dtype=jnp.int32),
        lambda: jax.device_put(jnp.arange(3.0), DEVICES[0]),
        lambda: jax.device_put(jnp.arange(3.0), DEVICES[3]),
        lambda: jax.device_put(jnp.ones((8, 4)), NamedSharding(MESH, P("d"))),
        lambda: jax.device_put(jnp.ones((8, 4)), NamedSharding(MESH, P())),
        lambda: _weak(1.0),
        lambda: _weak(2),
        lambda: jnp.array(1.5, jnp.bfloat16),
        lambda: None,
    ]


def _tree(rng: random.Random, depth: int = 0) -> Any:
    draw = rng.random()
    if depth < 2 and draw < 0.1:
        return tuple(_tree(rng, depth + 1) for _ in range(rng.randint(0, 3)))
    if depth < 2 and draw < 0.2:
        return [_tree(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    if depth < 2 and draw < 0.3:
        return {k: _tree(rng, depth + 1) for k in rng.sample("wxyz", rng.randint(0, 3))}
    if depth < 2 and draw < 0.35:
        return Pair(_tree(rng, depth + 1), _tree(rng, depth + 1))
    return rng.choice(_leaf_makers(rng))()


def _pmap_value(rng: random.Random) -> Any:
    shape = rng.choice([(8,), (8, 3)])
    host = (
        (np.arange(np.prod(shape)) % 5)
        .reshape(shape)
        .astype(rng.choice([np.float32, np.int32, np.bool_]))
    )
    return rng.choice(
        [
            lambda: host,
            lambda: jnp.asarray(host),
            lambda: None,
            lambda: jax.device_put(host, NamedSharding(MESH, P("d"))),
        ]
    )()


def _contexts(rng: random.Random) -> Callable[[], Any]:
    return rng.choice(
        [
            contextlib.nullcontext,
            contextlib.nullcontext,
            contextlib.nullcontext,
            lambda: jax.default_device(DEVICES[2]),
            lambda: jax.numpy_dtype_promotion("strict"),
            lambda: jax.enable_x64(True),
            lambda: jax.default_matmul_precision("float32"),
            lambda: jax.debug_nans(True),
        ]
    )


def _body(*args: Any, **kwargs: Any) -> Any:
    k = kwargs.pop("k", 1)
    kwargs.pop("s", None)
    scale = k if isinstance(k, int | float) and not isinstance(k, bool) else 2
    return jax.tree.map(lambda v: v + v * scale, (args, kwargs))


def _pmap_body(*args: Any) -> Any:
    return jax.tree.map(lambda v: v * 2, args)


def _outcome(f: Any, args: list[Any], kwargs: dict[str, Any], context: Any) -> Any:
    try:
        with context():
            return jax.block_until_ready(f(*args, **kwargs))
    except Exception as err:  # noqa: BLE001 - the oracle decides which errors are right
        return err


def _scenario(seed: int, steps: int, threads: int = 1) -> None:
    rng = random.Random(seed)
    kind = rng.choice(["jit", "jit static", "jit donate", "pmap"])
    options: dict[str, Any] = {
        "jit": {},
        "jit static": rng.choice(
            [
                {"static_argnums": (1,)},
                {"static_argnames": ("k",)},
                {"static_argnums": (0,), "static_argnames": ("s",)},
            ]
        ),
        "jit donate": {"donate_argnums": (0,)},
        "pmap": {},
    }[kind]
    fun = _pmap_body if kind == "pmap" else _body
    wrap, oracle = (fastpjit.pmap, jax.pmap) if kind == "pmap" else (fastpjit.jit, jax.jit)
    ours, theirs = wrap(fun, **options), oracle(fresh(fun), **options)
    statics = set(options.get("static_argnums", ()))
    static_names = set(options.get("static_argnames", ()))

    def make(value_seed: int, position: int) -> Any:
        value_rng = random.Random(value_seed)
        if position in statics:
            return value_rng.choice(STATICS)
        return _pmap_value(value_rng) if kind == "pmap" else _tree(value_rng)

    shapes = []
    for _ in range(rng.randint(2, 6)):
        seeds = [rng.randrange(10**9) for _ in range(rng.randint(1, 3))]
        named = {name: rng.choice(STATICS) for name in sorted(static_names) if rng.random() < 0.5}
        keyword = kind != "pmap" and rng.random() < 0.3
        # Objects passed again on each call, except where the function donates them.
        kept = kind != "jit donate" and rng.random() < 0.5
        shapes.append((seeds, named, keyword, kept, _contexts(rng)))
    objects: dict[tuple[int, int, str], Any] = {}
    objects_lock = threading.Lock()

    def calls_on(thread: int) -> None:
        thread_rng = rng if threads == 1 else random.Random(seed * 100 + thread)
        for step in range(steps):
            seeds, named, keyword, kept, context = thread_rng.choice(shapes)
            new = [thread_rng.random() < 0.3 for _ in seeds]
            calls = {}
            for side in ("ours", "theirs"):
                args = []
                for position, (value_seed, fresh_value) in enumerate(zip(seeds, new, strict=True)):
                    if kept:
                        key = (value_seed, position, side)
                        with objects_lock:
                            if key not in objects:
                                objects[key] = make(value_seed, position)
                            args.append(objects[key])
                    else:
                        args.append(
                            make(value_seed + (step * threads + thread) * fresh_value, position)
                        )
                kwargs = dict(named)
                if keyword and len(args) > 1 and len(args) - 1 not in statics:
                    kwargs["y"] = args.pop()
                calls[side] = (args, kwargs)
            # Arrays that other threads share are left alone.
            if threads == 1 and kept and thread_rng.random() < 0.3:
                changes = thread_rng.randrange(10**9)
                for args, kwargs in calls.values():
                    _change_in_place(random.Random(changes), (args, kwargs))
                    if changes % 8 == 0:  # and now and then, the jax.Arrays are deleted
                        _delete_arrays((args, kwargs))
            mine = _outcome(ours, *calls["ours"], context)
            expected = _outcome(theirs, *calls["theirs"], context)
            where = f"seed {seed}, thread {thread}, step {step}, {kind} {options}"
            if not isinstance(expected, Exception) and _swapped(calls["theirs"]):
                # jax.jit's C++ cache misreads a non-native byte order (see
                # test_an_array_of_another_byte_order_fails_like_jax_after_a_native_one_was_
                # cached); its traced calls raise TypeError, as fastpjit's do.
                assert isinstance(mine, TypeError), f"{where}: {mine!r}"
            elif isinstance(expected, Exception):
                assert isinstance(mine, type(expected)), f"{where}: {mine!r} != {expected!r}"
            else:
                assert not isinstance(mine, Exception), f"{where}: {mine!r}"
                assert_same_outputs(mine, expected)

    if threads == 1:
        calls_on(0)
    else:
        run_in_threads(calls_on, threads, timeout=120)


def _swapped(call: tuple[list[Any], dict[str, Any]]) -> bool:
    return any(
        isinstance(leaf, np.ndarray) and not leaf.dtype.isnative for leaf in jax.tree.leaves(call)
    )


def _delete_arrays(tree: Any) -> None:
    for leaf in jax.tree.leaves(tree):
        if isinstance(leaf, jax.Array) and not leaf.is_deleted():
            leaf.delete()


def _change_in_place(rng: random.Random, tree: Any) -> None:
    for leaf in jax.tree.leaves(tree):
        writeable = isinstance(leaf, np.ndarray) and leaf.size and leaf.flags.writeable
        if writeable and rng.random() < 0.5:
            leaf.flat[rng.randrange(leaf.size)] += 1


@pytest.mark.timeout(240)
@pytest.mark.parametrize("first", range(0, 40, 8))
def test_random_call_sequences_match_jax(first):
    for seed in range(first, first + 8):
        _scenario(seed, steps=40)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("first", range(0, 16, 8))
def test_random_call_sequences_on_four_threads_match_jax(first):
    # The threads share one function, its cache and its memories of earlier calls, and pass
    # each other's arrays; contexts such as jax.enable_x64 hold per thread, in JAX and here.
    for seed in range(first, first + 8):
        _scenario(seed, steps=20, threads=4)
