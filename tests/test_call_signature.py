"""How fastpjit keys a call, against JAX: every way two calls can differ must reach a different
executable exactly when JAX's does, on the first call and on every cached one.

Each test here began as a defect of the old dispatcher (wrong results, crashes, JAX's behaviour
skipped on cached calls); JAX 0.10.2 is the oracle throughout.
"""

from __future__ import annotations

import collections
import dataclasses
import decimal
import enum
import fractions
import pickle
import subprocess
import sys
import textwrap
import threading
import weakref
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax.errors import JaxRuntimeError
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from lines import DONATED_AGAIN
from oracle import assert_same_error, assert_same_outputs, both, fresh
from rows import Counts
from threads import run_in_threads

import fastpjit

DEVICES = tuple(jax.devices())
ROW_8 = NamedSharding(jax.make_mesh((8,), ("x",)), P("x"))


def unpickled(array: np.ndarray) -> np.ndarray:
    """The array as a multiprocessing data loader delivers it: through pickle, with a dtype
    object of its own."""
    return pickle.loads(pickle.dumps(array))


# --- numpy dtypes are compared by value ------------------------------------------------------


def test_unpickled_arrays_carry_fresh_dtype_objects():
    # The premise of the tests below: identity says nothing about a numpy dtype's value.
    assert unpickled(np.ones(3, np.float32)).dtype is not np.dtype(np.float32)


@pytest.mark.parametrize("kind", ["jit", "pmap"])
def test_unpickled_batches_of_alternating_dtypes(kind):
    wrap = {"jit": fastpjit.jit, "pmap": fastpjit.pmap}[kind]
    oracle = {"jit": jax.jit, "pmap": jax.pmap}[kind]

    def double(a):
        return a * 2

    ours, theirs = wrap(double), oracle(fresh(double))
    counts = Counts()
    for step in range(50):
        dtype = np.float32 if step % 2 else np.int32
        batch = unpickled(np.arange(8 * 4, dtype=dtype).reshape(8, 4) + step)
        assert_same_outputs(ours(batch), theirs(batch))
    assert ours.cache_size() == 2
    assert counts["cache_misses"] == 2


def test_aot_compiled_function_rejects_another_dtype_like_jax():
    x32 = np.arange(8, dtype=np.int32)
    ours = fastpjit.jit(lambda a: a + 1).lower(x32).compile()
    theirs = jax.jit(lambda a: a + 1).lower(x32).compile()
    ours(unpickled(x32))
    for bad in (unpickled(x32.astype(np.float32)), x32.astype(np.float32)):
        assert type(assert_same_error(ours, theirs, bad)) is TypeError


def test_aot_compiled_function_on_eight_devices_rejects_another_shape_or_dtype():
    # jaxlib 0.10.2 crashes when execute_sharded gets multi-device buffers of another size or
    # dtype, so a wrong argument must be caught before it gets there.
    x = jax.device_put(np.arange(32, dtype=np.float32).reshape(8, 4), ROW_8)
    ours = fastpjit.jit(lambda a: a + 1).lower(x).compile()
    theirs = jax.jit(lambda a: a + 1).lower(x).compile()
    ours(x)
    bad_args = [
        jax.device_put(np.zeros((16, 4), np.float32), ROW_8),
        jax.device_put(np.zeros((8, 4), np.int32), ROW_8),
    ]
    for bad in bad_args:
        assert type(assert_same_error(ours, theirs, bad)) is TypeError
    with pytest.raises(TypeError):
        ours(x, x)


# --- static arguments: by type and value, positional and keyword apart -----------------------


def scale(x, k=1):
    return x * k


@pytest.mark.parametrize("values", [(2, 2.0), (True, 1.0), (1, True), (2.0, 2)])
def test_static_keyword_arguments_of_equal_value_and_other_type(values):
    ours, theirs = both(scale, static_argnames="k")
    x = jnp.arange(4, dtype=jnp.int32)
    for k in (*values, *values):
        assert_same_outputs(ours(x, k=k), theirs(x, k=k))


def pick(x, s=None, k=None):
    return x + (len(s) if isinstance(s, tuple) else 0) + (10 * k if k is not None else 0)


def test_a_positional_static_never_meets_a_keyword_static():
    ours, theirs = both(pick, static_argnums=1, static_argnames="k")
    x = jnp.arange(4)
    calls = [((x, ("k", 4)), {}), ((x,), {"k": 4}), ((x, ("k", 4)), {}), ((x,), {"k": 4})]
    for args, kwargs in calls:
        assert_same_outputs(ours(*args, **kwargs), theirs(*args, **kwargs))
    assert ours.cache_size() == 2


def equality_raises() -> type:
    """A class whose instances hash alike and refuse to be compared; a new one per side, so
    that no cache of JAX's compares one side's instances with the other's."""

    class EqualityRaises:
        def __hash__(self) -> int:
            return 7

        def __eq__(self, other: object) -> bool:
            raise RuntimeError("no comparison")

    return EqualityRaises


def test_a_static_argument_whose_eq_raises_fails_like_jax():
    ours, theirs = both(lambda x, s: x + 1, static_argnums=1)
    x = jnp.arange(4)
    for f in (theirs, ours):
        kind = equality_raises()
        f(x, kind())
        with pytest.raises(ValueError, match="static arguments should be comparable using __eq__"):
            f(x, kind())


def test_an_unhashable_static_argument_fails_like_jax():
    ours, theirs = both(lambda x, s: x + 1, static_argnums=1)
    for value in ([1], {"a": 1}):
        with pytest.raises(ValueError) as expected:
            theirs(jnp.arange(4), value)
        with pytest.raises(ValueError) as got:
            ours(jnp.arange(4), value)
        assert str(got.value).split(".")[0] == str(expected.value).split(".")[0]


# --- a call made while a trace is active is staged, as jax.jit stages it ---------------------


def jit_equations(jaxpr: Any) -> list[Any]:
    return [e for e in jaxpr.jaxpr.eqns if e.primitive.name in ("jit", "pjit")]


def test_a_cached_function_called_with_concrete_arrays_inside_a_trace_is_staged():
    x = jnp.arange(4.0)
    ours, theirs = both(lambda a: a * 2)
    ours(x), theirs(x)
    expected = jax.make_jaxpr(lambda y: theirs(x) + y)(1.0)
    got = jax.make_jaxpr(lambda y: ours(x) + y)(1.0)
    assert len(jit_equations(expected)) == 1
    assert len(jit_equations(got)) == 1
    assert str(got) == str(expected)


def test_a_donating_function_called_inside_a_trace_leaves_the_closed_over_array():
    x = jnp.arange(4.0)
    ours, theirs = both(lambda a: a * 2, donate_argnums=0)
    ours(jnp.arange(4.0)), theirs(jnp.arange(4.0))
    for inner in (theirs, ours):
        outer = jax.jit(lambda y, inner=inner: inner(x) + y)
        np.testing.assert_array_equal(np.asarray(outer(1.0)), np.arange(4.0) * 2 + 1)
        assert not x.is_deleted()
        # A new signature retraces, closing over x again.
        np.testing.assert_array_equal(np.asarray(outer(jnp.ones(4))), np.arange(4.0) * 2 + 1)


@pytest.mark.parametrize("kind", ["pmap", "jit with in_shardings"])
def test_an_argument_that_must_move_inside_a_trace(kind):
    if kind == "pmap":
        ours, theirs = fastpjit.pmap(lambda a: a + 1), jax.pmap(lambda a: a + 1)
    else:
        ours, theirs = both(lambda a: a + 1, in_shardings=ROW_8)
    on_one = jnp.arange(8.0)  # uncommitted, on one device
    for f in (ours, theirs):
        f(on_one)  # cached, with an argument that the call moves to the executable's sharding
    expected = jax.jit(lambda y: theirs(on_one) + y)(1.0)
    got = jax.jit(lambda y: ours(on_one) + y)(1.0)
    assert_same_outputs(got, expected)


# --- jax_debug_nans and jax_debug_infs hold on cached calls ----------------------------------


def raised_in_a_new_thread(call: Any) -> BaseException | None:
    """What `call()` raises in a thread of its own. JAX's de-optimized rerun after a pmap's
    invalid value leaves its thread with the checks off (a thread-local None post-hook), so
    each side starts from a thread that has the global configuration."""
    raised: list[BaseException | None] = [None]

    def run() -> None:
        try:
            call()
        except BaseException as err:  # reported to the caller
            raised[0] = err

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(timeout=120)
    return raised[0]


@pytest.mark.parametrize("flag", ["jax_debug_nans", "jax_debug_infs"])
@pytest.mark.parametrize("kind", ["jit", "pmap"])
def test_debug_nans_and_infs_on_first_and_cached_calls(flag, kind):
    def divide(a, b):
        return a / b

    wrap, oracle = {"jit": (fastpjit.jit, jax.jit), "pmap": (fastpjit.pmap, jax.pmap)}[kind]
    ours, theirs = wrap(divide), oracle(fresh(divide))
    x = jnp.arange(8.0).reshape(8, 1)
    ones, zeros = jnp.ones((8, 1)), jnp.zeros((8, 1))  # x / zeros: nan, then infs
    ours(x, ones), theirs(x, ones)  # cached before the flag is set: the hit must check, too
    with _config(flag, True):
        repeats = 2 if kind == "jit" else 1
        for f in (theirs, ours):
            for _ in range(repeats):
                f(x, ones)
                raised = raised_in_a_new_thread(lambda f=f: f(x, zeros))
                assert type(raised) is FloatingPointError, raised
        assert_same_outputs(ours(x, ones), theirs(x, ones))
        # A first call under the flag raises JAX's public error, not its internal one.
        raised = raised_in_a_new_thread(lambda: wrap(fresh(divide))(x, zeros))
        assert type(raised) is FloatingPointError, raised


class _config:
    """`jax.config.update` for the duration of a with block."""

    def __init__(self, name: str, value: Any):
        self.name, self.value = name, value

    def __enter__(self) -> None:
        self.before = getattr(jax.config, self.name)
        jax.config.update(self.name, self.value)

    def __exit__(self, *exc: Any) -> None:
        jax.config.update(self.name, self.before)


# --- donated and deleted arguments -----------------------------------------------------------


def test_reusing_a_donated_array_raises_jax_s_error():
    ours, theirs = both(lambda a: a + 1, donate_argnums=0)
    error, words = DONATED_AGAIN
    for f in (theirs, ours):
        f(jnp.ones(4))  # cached
        donated = jnp.ones(4)
        f(donated)
        for _ in range(3):  # the array of the latest calls, remembered
            with pytest.raises(error, match=words):
                f(donated)


def test_a_deleted_array_raises_jax_s_runtime_error():
    ours, theirs = both(lambda a: a + 1)
    for f in (theirs, ours):
        f(jnp.ones(4))
        deleted = jnp.ones(4)
        f(deleted)
        f(deleted)
        deleted.delete()
        for _ in range(3):
            with pytest.raises(RuntimeError, match="Array has been deleted"):
                f(deleted)


@pytest.mark.subprocess
@pytest.mark.timeout(120)
def test_a_donated_array_on_eight_devices_raises_instead_of_crashing():
    # jaxlib 0.10.2 crashes when execute_sharded gets a donated multi-device buffer (JAX's own
    # cached path does so too), so this runs in a child process.
    script = textwrap.dedent("""
        import numpy as np, jax, fastpjit
        from jax.sharding import NamedSharding, PartitionSpec as P
        s = NamedSharding(jax.make_mesh((8,), ("x",)), P("x"))
        f = fastpjit.jit(lambda a: a + 1, donate_argnums=0)
        f(jax.device_put(np.ones((8, 4), np.float32), s))
        x = jax.device_put(np.ones((8, 4), np.float32), s)
        f(x)
        try:
            f(x)
        except Exception as e:
            print("raised", type(e).__name__, e)
    """)
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=110
    )
    assert result.returncode == 0, result.stderr[-2000:]
    error, words = DONATED_AGAIN
    assert f"raised {error.__name__}" in result.stdout and words in result.stdout


# --- what the key must not confuse -----------------------------------------------------------


def test_single_device_sharding_and_commitment_are_keyed():
    ours, theirs = both(lambda a: a + 1)
    committed = [jax.device_put(np.arange(4.0), d) for d in DEVICES[:3]]
    uncommitted = jnp.arange(4.0)
    for x in (*committed, uncommitted, *committed, uncommitted):
        assert_same_outputs(ours(x), theirs(x))


def test_an_array_made_at_a_freed_arrays_address_is_read_anew():
    # A call that passes the latest call's arrays again reads none of them. CPython gives a
    # new array the address of one just freed; that one must not pass for the freed one.
    ours, theirs = both(lambda a: a * 2)
    floats = jax.jit(lambda: jnp.ones((3,), jnp.float32))
    ints = jax.jit(lambda: jnp.arange(5, dtype=jnp.int32))
    reused = 0
    for _ in range(10):
        a = floats()
        for _ in range(3):
            assert_same_outputs(ours(a), theirs(a))
        address = id(a)
        del a
        b = ints()
        reused += id(b) == address
        assert_same_outputs(ours(b), theirs(b))
    assert reused, "no array was made at a freed array's address: this test proves nothing"


@pytest.mark.slow
def test_alternating_arrays_then_one_made_at_a_freed_arrays_address_is_read_anew():
    # Calls that alternate between two arrays find both remembered; a new array at the
    # address of one of them, freed, must not pass for it.
    ours, theirs = both(lambda a: a * 2)
    floats = jax.jit(lambda: jnp.ones((3,), jnp.float32))
    ints = jax.jit(lambda: jnp.arange(5, dtype=jnp.int32))
    other = jnp.ones((2, 2), jnp.float16)
    reused = 0
    for _ in range(10):
        a = floats()
        for _ in range(3):
            for x in (a, other):
                assert_same_outputs(ours(x), theirs(x))
        address = id(a)
        del a
        b = ints()
        reused += id(b) == address
        for x in (other, b, other, b):
            assert_same_outputs(ours(x), theirs(x))
    assert reused, "no array was made at a freed array's address: this test proves nothing"


@pytest.mark.slow
def test_dicts_in_any_key_order_with_new_keys_or_changed_in_place():
    # A dict whose keys come in the order of the tree's dict, as the same objects, is read in
    # that order; any other is read key by key. JAX sorts the keys either way.
    ours, theirs = both(lambda t: {k: jax.tree.map(lambda v: v * 2, v) for k, v in t.items()})
    a, b, c = jnp.arange(3.0), jnp.ones(3, jnp.int32), jnp.zeros(4, jnp.float16)

    def new(key):  # an equal key, not the same object
        return "".join([key[:2], key[2:]])

    tree = {"beta": b, "alpha": a, "gamma": {"y_last": c, "x_first": a}}
    calls = [
        tree,
        {"alpha": a, "beta": b, "gamma": {"x_first": a, "y_last": c}},
        {"gamma": {"y_last": c, "x_first": a}, "beta": b, "alpha": a},
        {new("beta"): b, new("alpha"): a, new("gamma"): {new("y_last"): c, new("x_first"): a}},
        {"beta": a, "alpha": b, "gamma": {"y_last": a, "x_first": c}},
        {"beta": b, "alpha": a, "omega": {"y_last": c, "x_first": a}},
        tree,
    ]
    for t in calls:
        for _ in range(2):
            assert_same_outputs(ours(t), theirs(t))
    tree["alpha"] = b
    assert_same_outputs(ours(tree), theirs(tree))
    del tree["beta"]
    tree["beta"] = c
    tree["gamma"]["x_first"] = jnp.ones((2, 2))
    for _ in range(2):
        assert_same_outputs(ours(tree), theirs(tree))
    tree["delta"] = a
    assert_same_outputs(ours(tree), theirs(tree))


def test_remembered_arrays_none_in_a_donation_loop_and_again_after_a_reload():
    # A donated state takes, call after call, the addresses that its old arrays freed: after
    # a few calls, it is not held any more (each would be a weak reference made and dropped);
    # `x`, passed on every call, is.
    step = fastpjit.jit(lambda s, x: s + x, donate_argnums=0)
    state, x = jnp.zeros(3), jnp.ones(3)
    for _ in range(20):
        state = step(state, x)
    assert step._held_arrays() == 1
    np.testing.assert_array_equal(state, np.full(3, 20.0, np.float32))
    # An array made where a held one was, and then passed call after call, is held again.
    g = fastpjit.jit(lambda a: a * 2)
    make = jax.jit(lambda: jnp.arange(3.0))
    reused = 0
    for _ in range(10):
        old = make()
        for _ in range(3):
            g(old)
        address = id(old)
        del old
        new = make()
        reused += id(new) == address
        for _ in range(3):
            g(new)
        assert g._held_arrays() >= 1
    assert reused, "no array was made at a freed array's address: this test proves nothing"


def test_calls_alternating_two_arrays_remember_both_and_keep_neither_alive():
    f = fastpjit.jit(lambda a: a + 1)
    a, b = jnp.ones(3), jnp.ones(4)
    for _ in range(3):
        f(a)
        f(b)
    assert f._held_arrays() == 2
    alive = weakref.ref(a), weakref.ref(b)
    del a, b
    assert [r() for r in alive] == [None, None]


@pytest.mark.parametrize("kind", ["jit", "pmap"])
@pytest.mark.parametrize("beside", ["nothing", "an array", "a scalar"])
def test_none_where_a_remembered_array_died_is_read_as_none(kind, beside):
    # A remembered array is held by a weak reference, whose referent CPython sets to None
    # when the array dies: None, passed where that array was, must not pass for it (once
    # fastpjit ran the array's executable with None for the array). Calls of arrays only take
    # one path; calls with a scalar, another.
    wrap = {"jit": fastpjit.jit, "pmap": fastpjit.pmap}[kind]
    oracle = {"jit": jax.jit, "pmap": jax.pmap}[kind]
    options = {"in_axes": (0, None)} if kind == "pmap" and beside == "a scalar" else {}

    def double(*args):
        return jax.tree.map(lambda v: v * 2, args)

    ours, theirs = wrap(double, **options), oracle(fresh(double), **options)
    rest = {"nothing": (), "an array": (jnp.ones((8, 2)),), "a scalar": (2.5,)}[beside]
    for _ in range(3):
        dying = jnp.ones((8, 3))
        for _ in range(3):
            assert_same_outputs(ours(dying, *rest), theirs(dying, *rest))
        gone = weakref.ref(dying)
        del dying
        assert gone() is None
        if kind == "pmap" and beside != "an array":  # nothing left to map
            assert_same_error(ours, theirs, None, *rest)
        else:
            assert_same_outputs(ours(None, *rest), theirs(None, *rest))


@pytest.mark.parametrize("value", [0.0, -0.0, 1.5, float("nan"), 3, -3, True, False, 2j])
def test_python_scalars_of_every_type_and_sign(value):
    ours, theirs = both(lambda a, b: a * b)
    x = jnp.arange(4.0)
    for v in (value, 1.0, value, 1, value, True, value):
        assert_same_outputs(ours(x, v), theirs(x, v))


@pytest.mark.slow
def test_numpy_scalars_and_arrays_of_every_width():
    ours, theirs = both(lambda a, b: a + b)
    x = jnp.arange(4, dtype=jnp.float32)
    values = [
        np.float32(1.5),
        np.float16(1.5),
        np.int8(3),
        np.uint8(3),
        np.bool_(True),
        np.float64(2.5),
        np.int64(2),
        np.arange(4, dtype=np.int16),
        np.arange(4, dtype=np.float32),
        unpickled(np.arange(4, dtype=np.float16)),
    ]
    for v in (*values, *values):
        assert_same_outputs(ours(x, v), theirs(x, v))


def kept_copies_of(value: np.ndarray) -> list[jax.Array]:
    """The live device arrays that hold `value` (of its shape and dtype): give it values that
    no other test makes."""
    return [
        a
        for a in jax.live_arrays()
        if a.shape == value.shape
        and a.dtype == value.dtype
        and not a.is_deleted()
        and np.array_equal(np.asarray(a), value)
    ]


@pytest.mark.parametrize("placement", ["one device", "eight devices", "pmap"])
def test_small_numpy_arguments_are_kept_on_device_and_compared_by_content(placement):
    # A small numpy argument passed again with the same contents reuses a device copy of
    # it; contents changed in place, a new array of equal contents, or a non-contiguous view
    # are compared by what they hold, never by identity.
    if placement == "pmap":
        ours, theirs = fastpjit.pmap(lambda a, b: a + b), jax.pmap(lambda a, b: a + b)
        x = jnp.arange(32.0, dtype=jnp.float32).reshape(8, 4)
    else:
        ours, theirs = both(lambda a, b: a + b)
        x = jnp.arange(32.0, dtype=jnp.float32).reshape(8, 4)
        if placement == "eight devices":
            x = jax.device_put(x, ROW_8)
    value = np.arange(32, dtype=np.float32).reshape(8, 4) * 7.25 + 0.125
    for _ in range(3):
        assert_same_outputs(ours(x, value), theirs(x, value))
    (kept,) = kept_copies_of(value)
    value[2, 1] = -1.5  # changed in place: not the kept copy
    assert_same_outputs(ours(x, value), theirs(x, value))
    assert_same_outputs(ours(x, value.copy()), theirs(x, value.copy()))
    column_major = np.asfortranarray(value)
    for _ in range(3):
        assert_same_outputs(ours(x, column_major), theirs(x, column_major))
    column_major[0, 0] = 9.0
    assert_same_outputs(ours(x, column_major), theirs(x, column_major))
    # A kept copy deleted behind the dispatcher's back (jax.live_arrays reaches it) is
    # placed again.
    for _ in range(3):
        ours(x, value)
    for array in kept_copies_of(value):
        array.delete()
    assert_same_outputs(ours(x, value), theirs(x, value))
    del kept


@pytest.mark.parametrize("dtype", [np.float64, np.int64, np.bool_, np.uint8])
def test_kept_numpy_values_that_jax_converts_match_jax(dtype):
    # Without x64, float64 and int64 arrays are placed as 32-bit ones: their kept copies are
    # the converted values, found by the bytes of the unconverted ones.
    ours, theirs = both(lambda a, b: a + b)
    x = jnp.arange(6, dtype=jnp.int32).reshape(2, 3)
    value = (np.arange(6).reshape(2, 3) % 2 + 3).astype(dtype)
    for _ in range(3):
        assert_same_outputs(ours(x, value), theirs(x, value))
    value[1, 2] = 0
    for _ in range(3):
        assert_same_outputs(ours(x, value), theirs(x, value))


def aligned_array(values: np.ndarray) -> np.ndarray:
    """A copy of `values` whose data starts on a 64-byte boundary, where jaxlib on the CPU
    adopts a host buffer instead of copying it."""
    raw = np.empty(values.nbytes + 64, np.uint8)
    offset = -raw.ctypes.data % 64
    array = raw[offset : offset + values.nbytes].view(values.dtype).reshape(values.shape)
    array[...] = values
    return array


def test_a_kept_copy_does_not_share_the_callers_memory():
    # jaxlib adopts aligned numpy memory where it can; a kept copy made from it would change
    # with the caller's array, and serve another array of the values it had before.
    ours, theirs = both(lambda a, b: a + b)
    x = jnp.zeros((8, 4), jnp.float32)
    original = np.arange(32, dtype=np.float32).reshape(8, 4) * 5.5 + 0.375
    value = aligned_array(original)
    for _ in range(3):
        assert_same_outputs(ours(x, value), theirs(x, value))
    value[...] = -1.0
    assert_same_outputs(ours(x, original), theirs(x, original))
    assert_same_outputs(ours(x, value), theirs(x, value))


@pytest.mark.timeout(60)
def test_threads_share_kept_values_while_changing_their_own():
    # Four threads call one function with host values, some shared and unchanged, some their
    # own and changed in place between calls: every result is the one of its call's values.
    f = fastpjit.jit(lambda a, b, c: a + b * c)
    x = jnp.arange(32, dtype=jnp.float32).reshape(8, 4)
    shared = np.full((8, 4), 0.5, np.float32)

    def worker(t: int) -> None:
        rng = np.random.default_rng(t)
        own = np.full((8, 4), float(t), np.float32)
        for step in range(300):
            if rng.integers(0, 3) == 0:
                own[rng.integers(0, 8), rng.integers(0, 4)] = float(step % 5)
            scale = float(rng.integers(0, 3))
            b = own if step % 2 else shared
            expected = np.asarray(x) + b * np.float32(scale)
            np.testing.assert_array_equal(np.asarray(f(x, b, scale)), expected)

    run_in_threads(worker, timeout=50)


def test_host_values_seen_once_are_not_kept():
    # A loop that passes new contents on every call keeps no device copies of them.
    f = fastpjit.jit(lambda a, b: a + b)
    x = jnp.zeros(4, jnp.float32)
    values = [np.full(4, 2000.5 + i, np.float32) for i in range(6)]
    for v in values:
        np.testing.assert_array_equal(np.asarray(f(x, v)), v)
    assert not any(kept_copies_of(v) for v in values)


def test_donated_numpy_arguments_are_never_reused():
    # Not donated, numpy arguments passed a third time come from kept device copies.
    ours, theirs = both(lambda a, b: a * 2 + b)
    value, y = np.arange(4, dtype=np.float32) * 3.5 + 1000.25, np.full(4, 77.125, np.float32)
    for _ in range(3):
        assert_same_outputs(ours(value, y), theirs(value, y))
    assert kept_copies_of(value) and kept_copies_of(y)
    # Donated, one is placed anew on each call that fastpjit serves (a miss, then hits), and
    # no copy of it is kept; fastpjit may hand such a stream of placements to JAX's dispatch.
    ours, theirs = both(lambda a, b: a * 2 + b, donate_argnums=0)
    value, y = value + 1, y + 1
    counts = Counts()
    for _ in range(4):
        assert_same_outputs(ours(value, y), theirs(value, y))
    assert counts["cache_misses"] == 1 and counts["cache_hits"] >= 1
    assert not kept_copies_of(value)


def test_large_numpy_arguments_take_the_placing_path_and_match_jax():
    ours, theirs = both(lambda a, b: a + b)
    x = jnp.zeros((64, 64), jnp.float32)
    value = np.arange(64 * 64, dtype=np.float32).reshape(64, 64)
    for _ in range(3):
        assert_same_outputs(ours(x, value), theirs(x, value))
    value[63, 63] = -1.0
    assert_same_outputs(ours(x, value), theirs(x, value))


def test_keyword_arguments_in_any_order_and_names_built_at_run_time():
    ours, theirs = both(lambda a, b, c: a - b * c)
    x, y, z = jnp.arange(4.0), jnp.ones(4), jnp.full(4, 2.0)
    name_b = "".join(["b"])
    calls = [{"b": y, "c": z}, {"c": z, "b": y}, {name_b: y, "c": z}]
    for kwargs in (*calls, *calls):
        assert_same_outputs(ours(x, **kwargs), theirs(x, **kwargs))
    assert ours.cache_size() == 1


@pytest.mark.subprocess
@pytest.mark.timeout(120)
def test_a_donated_argument_that_is_also_another_argument_raises_instead_of_crashing():
    # jaxlib refuses it on one device (JAX's cached path raises a ValueError) and crashes on
    # several, where JAX's own jit crashes too; so the eight-device cases run in a child process.
    for donate, args in ((0, (0, 0, 1)), (0, (0, 1, 0)), (2, (1, 0, 0)), (2, (0, 1, 0))):
        ours, theirs = both(lambda a, b, c: a + b + c, donate_argnums=donate)
        for f in (ours, theirs):
            f(jnp.ones(4), jnp.ones(4), jnp.ones(4))  # cached
        errors = []
        for f in (theirs, ours):
            values = [jnp.ones(4), jnp.ones(4)]
            with pytest.raises(ValueError) as raised:
                f(*(values[i] for i in args))
            errors.append((type(raised.value), str(raised.value)))
        assert errors[0] == errors[1]
    script = textwrap.dedent("""
        import numpy as np, jax, fastpjit
        from jax.sharding import NamedSharding, PartitionSpec as P
        mesh = jax.make_mesh((8,), ("x",))
        s = NamedSharding(mesh, P("x"))
        f = fastpjit.jit(lambda a, b: a + b, donate_argnums=0)
        f(jax.device_put(np.ones((8, 4), np.float32), s),
          jax.device_put(np.ones((8, 4), np.float32), s))
        c = jax.device_put(np.ones((8, 4), np.float32), s)
        try:
            f(c, c)
        except ValueError as e:
            print("raised", "previously donated in the same call" in str(e))
        print(np.asarray(f(c, jax.device_put(np.ones((8, 4), np.float32), s)))[0, 0])
    """)
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=110
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split() == ["raised", "True", "2.0"]


@pytest.mark.parametrize("value", [2.0, np.full(4, 2.0, np.float32)], ids=["scalar", "array"])
def test_the_transfer_guard_watches_kept_host_values(value):
    # A Python scalar or numpy array is an implicit host-to-device transfer on every call,
    # even where the dispatcher keeps a device copy of its value.
    ours, theirs = both(lambda a, b: a * b)
    x = jnp.arange(4.0)
    for f in (ours, theirs):
        f(x, value), f(x, value), f(x, value)
    levels = (
        ("disallow", True),
        ("disallow_explicit", True),
        ("log", False),
        ("log_explicit", False),
        ("allow", False),
    )
    for level, raises in levels:
        for f in (theirs, ours):
            with jax.transfer_guard(level):
                if raises:
                    with pytest.raises(JaxRuntimeError, match="Disallowed host-to-device"):
                        f(x, value)
                else:
                    np.testing.assert_array_equal(np.asarray(f(x, value)), np.arange(4.0) * 2)


def test_a_masked_array_fails_like_jax_after_a_plain_array_was_cached():
    # JAX refuses masked arrays when it traces a call; its C++ cache then takes one as the
    # plain array it was cached for, dropping the mask. fastpjit refuses it every time.
    ours, theirs = both(lambda a: a + 1)
    plain = np.arange(4.0, dtype=np.float32)
    masked = np.ma.masked_array(plain, mask=[0, 1, 0, 0])
    with pytest.raises(ValueError, match="masked arrays are not supported") as expected:
        jax.jit(lambda a: a + 1)(masked)
    ours(plain), ours(plain)
    with pytest.raises(ValueError) as got:
        ours(masked)
    assert str(got.value) == str(expected.value)


class _Color(enum.IntEnum):
    RED = 3


class _NdarraySubclass(np.ndarray):
    pass


class _HasJaxArray:
    def __jax_array__(self) -> jax.Array:
        return jnp.arange(3.0)


# Arguments a dispatcher meets rarely: each either runs, with JAX's values, dtypes and weak
# types, or fails with JAX's exception and message, on the first call and on cached ones.
UNUSUAL_ARGUMENTS = {
    "str": "abc",
    "bytes": b"ab",
    "object": object(),
    "None": None,
    "int over 64 bits": 2**70,
    "int under int64": -(2**63) - 1,
    "int over int32": 2**31,
    "int64 max": 2**63 - 1,
    "object array": np.array([1, "a"], dtype=object),
    "str array": np.array(["a"]),
    "datetime64 array": np.array(["2020-01-01"], dtype="datetime64[D]"),
    "void array": np.zeros(2, dtype="V4"),
    "structured array": np.zeros(2, dtype=[("a", "f4")]),
    "ndarray subclass": np.arange(3.0).view(_NdarraySubclass),
    "bfloat16 array": np.ones(3, ml_dtypes.bfloat16),
    "int4 array": np.ones(3, ml_dtypes.int4),
    "float8 array": np.ones(3, ml_dtypes.float8_e4m3fn),
    "float16 scalar": np.float16(1.5),
    "complex128 scalar": np.complex128(1 + 2j),
    "uint64 scalar over int64": np.uint64(2**63),
    "numpy bool": np.bool_(True),
    "IntEnum": _Color.RED,
    "Decimal": decimal.Decimal(1),
    "Fraction": fractions.Fraction(1, 2),
    "__jax_array__": _HasJaxArray(),
    "0-d array": np.array(3.0),
    "strided array": np.arange(12.0).reshape(3, 4)[:, ::2],
    "Fortran-ordered array": np.asfortranarray(np.arange(6.0).reshape(2, 3)),
    "read-only array": np.frombuffer(b"\0" * 16, np.float32),
    "memoryview": memoryview(b"abcd"),
    "range": range(3),
    "set": {1},
    "empty tuple": (),
    "dict of int and str keys": {1: 2.0, "a": 3.0},
    "nan": float("nan"),
    "-0.0": -0.0,
    "int64 scalar over int32": np.int64(2**40),
}


@pytest.mark.parametrize("kind", ["jit", "pmap"])
@pytest.mark.parametrize("x64", [False, True], ids=["x32", "x64"])
@pytest.mark.parametrize("name", list(UNUSUAL_ARGUMENTS))
def test_unusual_arguments_run_or_fail_like_jax_on_every_call(name, x64, kind):
    value = UNUSUAL_ARGUMENTS[name]

    def double(tree):
        return jax.tree.map(lambda leaf: leaf * 2, tree)

    if kind == "jit":
        ours, theirs = both(double)
    else:
        # Broadcast to every device, as a pmap takes a value that has no axis to map.
        ours = fastpjit.pmap(double, in_axes=None, axis_size=len(DEVICES))
        theirs = jax.pmap(fresh(double), in_axes=None, axis_size=len(DEVICES))
    with jax.enable_x64(x64):
        for _ in range(3):
            try:
                expected = theirs(value)
            except Exception:
                assert_same_error(ours, theirs, value)
            else:
                assert_same_outputs(ours(value), expected)


@pytest.mark.parametrize("kind", ["jit", "pmap"])
def test_an_array_of_another_byte_order_fails_like_jax_after_a_native_one_was_cached(kind):
    # JAX refuses a big-endian numpy array when it traces a call; jax.jit's C++ cache then
    # takes one as the native array it was cached for and reads its bytes in native order
    # (zeros for 1.0, 2.0, 3.0). fastpjit keys the byte order and refuses it every time.
    wrap, oracle = {"jit": (fastpjit.jit, jax.jit), "pmap": (fastpjit.pmap, jax.pmap)}[kind]
    ours = wrap(lambda a: a * 2)
    native = np.arange(8, dtype="<f4")
    swapped = np.arange(1, 9, dtype=">f4")
    np.testing.assert_array_equal(np.asarray(ours(native)), native * 2)
    for _ in range(2):
        assert_same_error(ours, oracle(lambda a: a * 2), swapped)
    np.testing.assert_array_equal(np.asarray(ours(native)), native * 2)


# --- pytree nodes that are not builtin containers --------------------------------------------


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class Layer:
    w: Any
    b: Any
    activation: str = dataclasses.field(default="relu", metadata={"static": True})


class Pair(NamedTuple):
    first: Any
    second: Any


class Boxed:
    """A custom node whose node data is its label."""

    def __init__(self, value: Any, label: str):
        self.value, self.label = value, label


jax.tree_util.register_pytree_node(
    Boxed, lambda b: ((b.value,), b.label), lambda label, children: Boxed(children[0], label)
)


def combine(tree):
    leaves = jax.tree.leaves(tree)
    return sum(jnp.sum(leaf) for leaf in leaves) * len(leaves)


@pytest.mark.slow
def test_registered_nodes_key_by_type_node_data_and_children():
    ours, theirs = both(combine)
    x, y = jnp.arange(4.0), jnp.ones(3)
    trees = [
        Layer(x, y),
        Layer(x, y, "tanh"),
        Layer(y, x),
        Layer({"k": x, "j": y}, None),
        Pair(x, y),
        Pair(x, (y, None)),
        Pair(Layer(x, y), {"b": y, "a": x}),
        Boxed(x, "one"),
        Boxed(x, "two"),
        Boxed({"z": x, "a": y}, "one"),
        collections.OrderedDict(b=x, a=y),
        collections.OrderedDict(a=y, b=x),
        collections.defaultdict(list, b=x, a=y),
    ]
    for tree in (*trees, *trees, *reversed(trees)):
        assert_same_outputs(ours(tree), theirs(tree))
    assert ours.cache_size() == theirs._cache_size()


def test_a_namedtuple_registered_as_a_custom_node_flattens_as_registered():
    class Reversed(NamedTuple):
        a: Any
        b: Any

    jax.tree_util.register_pytree_node(
        Reversed, lambda r: ((r.b, r.a), None), lambda _, c: Reversed(c[1], c[0])
    )
    ours, theirs = both(lambda r: r.a - 2 * r.b)
    for r in (Reversed(jnp.arange(3.0), jnp.ones(3)), Reversed(jnp.ones(3), jnp.arange(3.0))):
        assert_same_outputs(ours(r), theirs(r))


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_sharding_values_past_the_memo_s_bound_are_forgotten_and_calls_stay_right():
    """Each sharding value seen takes an id, remembered for at most 1,024 values; past that
    bound the value found least recently goes, and takes a new id when it comes back. A call
    whose sharding object is new and equal to a cached signature's then misses once, and its
    results stay JAX's."""
    import itertools

    f = fastpjit.jit(fresh(lambda x: x * 2))
    host = np.arange(8.0, dtype=np.float32)
    first = jax.device_put(host, NamedSharding(jax.make_mesh((8,), ("x",)), P("x")))
    f(first)
    # Reading a call's signature (what explain does, without running it) remembers the value
    # of its sharding: 1,100 meshes of the 8 devices in other orders are 1,100 values.
    orders = itertools.islice(itertools.permutations(DEVICES), 1, 1101)
    for order in orders:
        sharding = NamedSharding(jax.sharding.Mesh(np.array(order), ("x",)), P("x"))
        assert fastpjit.explain(f, jax.device_put(host, sharding)).outcome == "miss"
    before = fastpjit.stats()["cache_misses"]
    again = jax.device_put(host, NamedSharding(jax.make_mesh((8,), ("x",)), P("x")))
    assert again.sharding is not first.sharding and again.sharding == first.sharding
    np.testing.assert_array_equal(f(again), host * 2)
    np.testing.assert_array_equal(f(again), host * 2)
    assert f(again).sharding == jax.jit(lambda x: x * 2)(again).sharding
    assert fastpjit.stats()["cache_misses"] - before == 1
    assert fastpjit.explain(f, again).outcome == "hit"
    # The objects of that value remembered earlier were read again: all take its new id.
    assert fastpjit.explain(f, first).outcome == "hit"
