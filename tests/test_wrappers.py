"""The functions that fastpjit.jit, pjit and pmap return, as objects, against JAX's: copies and
pickling, methods, jit(None), jax.clear_caches(), traceback filtering; and that they leak
nothing (memory over many calls, the wrapped function and its executables once deleted,
reference cycles).

Where JAX 0.10.2 fails on its own account (plain pickle of a jax.jit function, cloudpickle of a
jax.pmap one), fastpjit works, and the tests say so.
"""

from __future__ import annotations

import copy
import functools
import gc
import os
import pickle
import subprocess
import sys
import textwrap
import traceback
import weakref
from typing import Any

import cloudpickle
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from oracle import assert_same_error, assert_same_outputs, fresh

import fastpjit
from fastpjit import _core
from fastpjit._jax.xla_compile import backend_compiles

DEVICES = tuple(jax.devices())
ROW_8 = NamedSharding(jax.make_mesh((8,), ("x",)), P("x"))
PACKAGE_DIR = os.path.dirname(os.path.abspath(fastpjit.__file__))


def live_executables() -> int:
    gc.collect()
    return len(DEVICES[0].client.live_executables())


# --- Module-level functions, which pickle finds by name ---------------------------------------


@fastpjit.jit
def doubled(x):
    return x * 2


@jax.jit
def doubled_by_jax(x):
    return x * 2


@fastpjit.pmap
def tripled(x):
    return x * 3


@jax.pmap
def tripled_by_jax(x):
    return x * 3


def plus(x, n):
    return x + n


# --- Copies ---------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["jit", "pjit"])
def test_a_copy_is_a_new_function_that_finds_the_executables_compiled(kind):
    wrap = {"jit": fastpjit.jit, "pjit": fastpjit.pjit}[kind]
    fun = fresh(plus)
    ours, theirs = wrap(fun, static_argnums=1), jax.jit(fresh(plus), static_argnums=1)
    x = jnp.arange(8.0)
    ours(x, 1), theirs(x, 1)
    ours.note = "kept"
    for copier in (copy.copy, copy.deepcopy):
        copied, copied_by_jax = copier(ours), copier(theirs)
        # As JAX's: another object, unequal, that calls the same function.
        assert copied is not ours and copied != ours
        assert copied_by_jax is not theirs and copied_by_jax != theirs
        assert type(copied) is type(ours)
        assert copied.__wrapped__ is fun and copied.__name__ == "plus" and copied.note == "kept"
        compiles = backend_compiles()
        assert_same_outputs(copied(x, 1), copied_by_jax(x, 1))
        assert backend_compiles() == compiles, "the copy compiled again"
        assert_same_outputs(copied(x, 2), copied_by_jax(x, 2))  # static argument
        assert copied.lower(x, 3).as_text() == ours.lower(x, 3).as_text()


def test_deepcopy_of_an_object_that_holds_jitted_functions():
    class Model:
        def __init__(self, jit):
            self.scale = jnp.float32(3.0)
            self.apply = jit(lambda x: x * 2)
            self.step = functools.partial(jit, static_argnums=1)(plus)

    ours, theirs = Model(fastpjit.jit), Model(jax.jit)
    x = jnp.arange(4.0)
    ours.apply(x), theirs.apply(x)
    ours_copy, theirs_copy = copy.deepcopy(ours), copy.deepcopy(theirs)
    assert ours_copy.apply is not ours.apply and theirs_copy.apply is not theirs.apply
    assert_same_outputs(ours_copy.apply(x), theirs_copy.apply(x))
    assert_same_outputs(ours_copy.step(x, 5), theirs_copy.step(x, 5))
    assert type(ours_copy.step) is type(doubled)


def test_pmap_copies_as_itself_like_jax_s_plain_function():
    ours, theirs = fastpjit.pmap(lambda v: v + 1), jax.pmap(lambda v: v + 1)
    assert copy.copy(theirs) is theirs and copy.deepcopy(theirs) is theirs
    assert copy.copy(ours) is ours and copy.deepcopy(ours) is ours
    holder = {"f": ours}
    assert copy.deepcopy(holder)["f"] is ours


def test_compiled_copies_and_does_not_pickle_like_jax():
    x = jnp.arange(8.0)
    ours = fastpjit.jit(lambda v: v * 2).lower(x).compile()
    theirs = jax.jit(lambda v: v * 2).lower(x).compile()
    copied, copied_by_jax = copy.copy(ours), copy.copy(theirs)
    assert copied is not ours and type(copied) is type(ours)
    assert_same_outputs(copied(x), copied_by_jax(x))
    assert copied.as_text() == ours.as_text()
    for attempt in (copy.deepcopy, pickle.dumps):
        with pytest.raises(TypeError):
            attempt(theirs)
        with pytest.raises(TypeError):
            attempt(ours)


def test_lowered_copies_and_does_not_pickle_like_jax():
    x = jnp.arange(8.0)
    ours, theirs = fastpjit.jit(lambda v: v * 2).lower(x), jax.jit(lambda v: v * 2).lower(x)
    copied = copy.copy(ours)
    assert copied is not ours and copied.as_text() == ours.as_text()
    assert_same_outputs(copied.compile()(x), copy.copy(theirs).compile()(x))
    for attempt in (copy.deepcopy, pickle.dumps):
        with pytest.raises(TypeError):
            attempt(theirs)
        with pytest.raises(TypeError):
            attempt(ours)


def test_compile_hlo_function_copies_like_a_compiled_one():
    text = jax.jit(lambda a: a * 2).lower(np.ones(8, np.float32)).as_text()
    ours = fastpjit.compile_hlo(text)
    copied = copy.copy(ours)
    assert copied is not ours and type(copied) is type(ours)
    x = jnp.arange(8.0)
    np.testing.assert_array_equal(copied(x), ours(x))
    with pytest.raises(TypeError):
        pickle.dumps(ours)


# --- Pickling -------------------------------------------------------------------------------


def test_a_module_level_jitted_function_pickles_by_name():
    # pickle finds it by name, as a function; JAX's fails, for it pickles the function it
    # wraps, which its module's name no longer finds.
    assert pickle.loads(pickle.dumps(doubled)) is doubled
    assert cloudpickle.loads(cloudpickle.dumps(doubled)) is doubled
    with pytest.raises(pickle.PicklingError):
        pickle.dumps(doubled_by_jax)


def test_a_module_level_pmapped_function_pickles_by_name_like_jax():
    for pmapped in (tripled, tripled_by_jax):
        assert pickle.loads(pickle.dumps(pmapped)) is pmapped
        assert cloudpickle.loads(cloudpickle.dumps(pmapped)) is pmapped


def test_a_jitted_method_pickles_by_name():
    assert pickle.loads(pickle.dumps(Scaled.__dict__["scale"])) is Scaled.__dict__["scale"]
    scaled = Scaled(3.0)
    copied = pickle.loads(pickle.dumps(scaled.scale))
    assert copied.__func__ is Scaled.__dict__["scale"] and copied.__self__.factor == 3.0


@pytest.mark.parametrize("kind", ["jit", "pjit"])
def test_a_jitted_function_pickles_with_its_options(kind):
    # JAX's fails here (it pickles its cache miss, a local function); fastpjit's pickles as
    # the function it wraps and its options.
    wrap = {"jit": fastpjit.jit, "pjit": fastpjit.pjit}[kind]
    ours = wrap(plus, static_argnums=1, keep_unused=True)
    with pytest.raises(AttributeError, match="local object"):
        pickle.dumps(jax.jit(plus, static_argnums=1))
    loaded = pickle.loads(pickle.dumps(ours))
    assert type(loaded) is type(ours) and loaded is not ours and loaded.__wrapped__ is plus
    x = jnp.arange(8.0)
    expected = jax.jit(fresh(plus), static_argnums=1, keep_unused=True)
    for n in (1, 2):
        assert_same_outputs(loaded(x, n), expected(x, n))
    assert loaded.cache_size() == 2


def test_cloudpickle_of_local_jitted_functions_like_jax_s_own_test():
    # JAX's tests/pickle_test.py, testPickleOfJittedFunctions, with both jits.
    for jit in (fastpjit.jit, jax.jit):

        @jit
        def f(x, y):
            return x * y

        @jit
        def g(z):
            return f(z, z + 77)  # noqa: B023, F821

        expected = g(32)
        data = cloudpickle.dumps(g)
        del f, g
        assert pickle.loads(data)(32) == expected


def test_cloudpickle_of_a_local_pmapped_function():
    # JAX's fails: jax.pmap's function holds a weak reference. fastpjit's pickles by value.
    def add_one(v):
        return v + 1

    with pytest.raises(TypeError):
        cloudpickle.dumps(jax.pmap(fresh(add_one)))
    loaded = pickle.loads(cloudpickle.dumps(fastpjit.pmap(add_one, axis_name="i")))
    x = jnp.arange(16.0).reshape(8, 2)
    assert_same_outputs(loaded(x), jax.pmap(fresh(add_one), axis_name="i")(x))


@pytest.mark.subprocess
def test_cloudpickle_of_a_jitted_lambda_loads_in_another_process():
    data = cloudpickle.dumps(fastpjit.jit(lambda x, n: x * n, static_argnums=1))
    script = textwrap.dedent("""
        import pickle, sys
        import jax.numpy as jnp
        f = pickle.loads(sys.stdin.buffer.read())
        print(type(f).__name__, f(jnp.arange(3.0), 4).tolist())
    """)
    done = subprocess.run(
        [sys.executable, "-c", script], input=data, capture_output=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr.decode()
    assert done.stdout.decode().split() == ["JitWrapped", "[0.0,", "4.0,", "8.0]"]


@pytest.mark.subprocess
def test_pickle_of_a_function_in_main_as_jax_does():
    # In __main__, JAX's jit pickles the function it wraps by value under cloudpickle (plain
    # pickle cannot find it), JAX's pmap by name.
    script = textwrap.dedent("""
        import pickle, cloudpickle, fastpjit, jax

        @fastpjit.jit
        def f(x):
            return x + 1

        @fastpjit.pmap
        def p(x):
            return x + 1

        @jax.jit
        def f_by_jax(x):
            return x + 1

        def outcome(dump, fun):
            try:
                return "name" if pickle.loads(dump(fun)) is fun else "value"
            except pickle.PicklingError:
                return "fails"

        print(outcome(pickle.dumps, f), outcome(pickle.dumps, f_by_jax),
              outcome(cloudpickle.dumps, f), outcome(cloudpickle.dumps, f_by_jax),
              outcome(pickle.dumps, p), outcome(cloudpickle.dumps, p))
    """)
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr.decode()
    assert done.stdout.decode().split() == ["fails", "fails", "value", "value", "name", "name"]


# --- Methods --------------------------------------------------------------------------------


class Scaled:
    def __init__(self, factor: float):
        self.factor, self.traces = factor, 0

    @functools.partial(fastpjit.jit, static_argnums=0)
    def scale(self, x):
        self.traces += 1
        return x * self.factor

    @functools.partial(fastpjit.pmap, static_broadcasted_argnums=0)
    def scale_rows(self, x):
        return x * self.factor


class ScaledByJax:
    def __init__(self, factor: float):
        self.factor, self.traces = factor, 0

    @functools.partial(jax.jit, static_argnums=0)
    def scale(self, x):
        self.traces += 1
        return x * self.factor

    @functools.partial(jax.pmap, static_broadcasted_argnums=0)
    def scale_rows(self, x):
        return x * self.factor


def test_a_jitted_method_is_a_bound_method_like_jax_s():
    ours, theirs = Scaled(3.0), ScaledByJax(3.0)
    x = jnp.arange(4.0)
    for obj, cls in ((ours, Scaled), (theirs, ScaledByJax)):
        bound = obj.scale
        assert type(bound) is type(theirs.scale)
        assert bound.__self__ is obj and bound.__func__ is cls.__dict__["scale"]
        assert bound.__name__ == "scale"
        assert bound == obj.scale and hash(bound) == hash(obj.scale)
        assert cls.scale is cls.__dict__["scale"]
    assert_same_outputs(ours.scale(x), theirs.scale(x))
    # `.lower` and `.eval_shape` are the function's, as on JAX's bound method.
    assert ours.scale.lower(ours, x).as_text() == Scaled.scale.lower(ours, x).as_text()
    assert ours.scale.eval_shape(ours, x) == theirs.scale.eval_shape(theirs, x)


def test_a_pmapped_method_is_a_bound_method_like_jax_s():
    ours, theirs = Scaled(2.0), ScaledByJax(2.0)
    x = jnp.arange(16.0).reshape(8, 2)
    assert type(ours.scale_rows) is type(theirs.scale_rows)
    assert ours.scale_rows.__self__ is ours and ours.scale_rows == ours.scale_rows
    assert_same_outputs(ours.scale_rows(x), theirs.scale_rows(x))


def calls_traced(traces: list[Any]) -> Any:
    def call(f, v):
        traces.append(f)
        return f(v)

    return call


def test_a_bound_method_as_a_static_argument_traces_once():
    x = jnp.arange(4.0)
    for jit, obj in ((fastpjit.jit, Scaled(2.0)), (jax.jit, ScaledByJax(2.0))):
        traces: list[Any] = []
        outer = jit(calls_traced(traces), static_argnums=0)
        for _ in range(3):
            outer(obj.scale, x)
        assert len(traces) == 1 and obj.traces == 1, jit
        assert outer._cache_size() == 1, jit


# --- jit(None), pmap(None) ------------------------------------------------------------------


@pytest.mark.parametrize(
    "call",
    [
        lambda jit, pmap: jit(None),
        lambda jit, pmap: jit(None, static_argnums=0),
        lambda jit, pmap: jit(3),
        lambda jit, pmap: pmap(None),
        lambda jit, pmap: pmap(None, axis_name="i"),
        lambda jit, pmap: pmap(axis_name="i"),
    ],
)
def test_a_value_that_is_not_callable_fails_like_jax(call):
    error = assert_same_error(
        lambda: call(fastpjit.jit, fastpjit.pmap), lambda: call(jax.jit, jax.pmap)
    )
    assert type(error) is TypeError


def test_pjit_of_none_fails_like_jax_s_jit():
    with pytest.raises(TypeError) as got:
        fastpjit.pjit(None)
    assert str(got.value) == "Expected a callable value, got None"


def test_jit_without_a_function_is_a_decorator():
    decorate = fastpjit.jit(static_argnums=1)
    ours = decorate(plus)
    assert isinstance(ours, type(doubled))
    assert_same_outputs(
        ours(jnp.arange(3.0), 2), jax.jit(fresh(plus), static_argnums=1)(jnp.arange(3.0), 2)
    )


@pytest.mark.parametrize(
    "argnums", [lambda: np.int64(1), lambda: iter([1]), lambda: (i for i in [1])]
)
def test_pmap_reads_static_argument_numbers_as_jax_does(argnums):
    # An iterator reached jax.pmap, which consumed it, and the dispatcher then saw no static
    # argument; numpy integers were refused.
    ours = fastpjit.pmap(fresh(plus), static_broadcasted_argnums=argnums())
    theirs = jax.pmap(fresh(plus), static_broadcasted_argnums=argnums())
    x = jnp.arange(8.0)
    for n in (1, 2, 1):
        assert_same_outputs(ours(x, n), theirs(x, n))
    assert ours.cache_size() == 2


# --- jax.clear_caches() ---------------------------------------------------------------------


@pytest.mark.slow
def test_jax_clear_caches_frees_fastpjit_s_executables_like_jax_s():
    jax.clear_caches()
    x = jax.device_put(np.arange(8, dtype=np.float32))
    rows = jax.device_put(np.arange(16, dtype=np.float32).reshape(8, 2))
    baseline = live_executables()
    ours = [
        fastpjit.jit(fresh(plus), static_argnums=1),
        fastpjit.pjit(fresh(plus), static_argnums=1),
        fastpjit.pmap(fresh(plus), static_broadcasted_argnums=1),
    ]
    theirs = [
        jax.jit(fresh(plus), static_argnums=1),
        jax.pmap(fresh(plus), static_broadcasted_argnums=1),
    ]
    for f in ours:
        f(rows if isinstance(f, type(tripled)) else x, 1)
    assert live_executables() > baseline
    assert all(f.cache_size() == 1 for f in ours)
    assert _core.dispatch_memo_sizes() != (0, 0)
    jax.clear_caches()
    assert [f.cache_size() for f in ours] == [0, 0, 0]
    assert _core.dispatch_memo_sizes() == (0, 0)
    assert live_executables() == baseline
    # JAX's, the oracle: its own executables go too.
    theirs[0](x, 1), theirs[1](rows, 1)
    jax.clear_caches()
    assert live_executables() == baseline
    # The functions still run, and cache again.
    assert_same_outputs(ours[0](x, 1), theirs[0](x, 1))
    assert_same_outputs(ours[2](rows, 1), theirs[1](rows, 1))
    assert ours[0].cache_size() == 1


def test_jax_clear_caches_leaves_a_compiled_function_working():
    x = jnp.arange(8.0)
    ours = fastpjit.jit(lambda v: v + 1).lower(x).compile()
    theirs = jax.jit(lambda v: v + 1).lower(x).compile()
    ours(x)
    jax.clear_caches()
    assert_same_outputs(ours(x), theirs(x))


def test_clear_caches_holds_functions_weakly():
    ours = fastpjit.jit(lambda v: v + 1)
    ours(jnp.arange(3.0))
    alive = weakref.ref(ours)
    del ours
    gc.collect()
    assert alive() is None
    jax.clear_caches()


# --- Traceback filtering --------------------------------------------------------------------


def raises_inside(x):
    raise ValueError("raised by the user's function")


def frames_of(error: BaseException) -> list[tuple[str, str]]:
    """The traceback's frames, as (file, function)."""
    return [(f.filename, f.name) for f in traceback.extract_tb(error.__traceback__)]


@pytest.mark.parametrize(
    ("kind", "how"),
    [
        *(
            (kind, how)
            for kind in ("jit", "pjit")
            for how in ("call", "lower", "eval_shape", "trace")
        ),
        ("pmap", "call"),
        ("pmap", "lower"),  # jax.pmap's functions have no eval_shape or trace
    ],
)
def test_an_error_in_the_user_s_function_shows_the_user_s_frames_like_jax(kind, how):
    ours = {"jit": fastpjit.jit, "pjit": fastpjit.pjit, "pmap": fastpjit.pmap}[kind]
    theirs = jax.pmap if kind == "pmap" else jax.jit
    x = jnp.ones((8, 2))

    def run(wrap: Any) -> BaseException:
        with pytest.raises(ValueError, match="raised by the user's function") as info:
            f = wrap(raises_inside)
            f(x) if how == "call" else getattr(f, how)(x)
        return info.value

    expected, got = run(theirs), run(ours)
    # JAX leaves out its frames but jax.pmap's own (jax/_src/pmap.py is not registered).
    jax_dir = os.path.dirname(os.path.abspath(jax.__file__))
    assert frames_of(got) == [f for f in frames_of(expected) if not f[0].startswith(jax_dir)]
    assert frames_of(got) == [(__file__, "run"), (__file__, "raises_inside")]
    assert got.__notes__ == expected.__notes__


def test_an_error_in_a_miss_of_a_compile_hlo_function_shows_the_caller():
    text = jax.jit(lambda a: a * 2).lower(np.ones(8, np.float32)).as_text()
    ours = fastpjit.compile_hlo(text)
    with pytest.raises(TypeError, match="parameter 0") as info:
        ours(np.ones(4, np.float32))
    assert [f[0] for f in frames_of(info.value)] == [__file__]


def test_filtering_off_shows_fastpjit_s_frames():
    jax.config.update("jax_traceback_filtering", "off")
    try:
        with pytest.raises(ValueError) as info:
            fastpjit.jit(raises_inside)(1.0)
    finally:
        jax.config.update("jax_traceback_filtering", "auto")
    miss_frame = (os.path.join(PACKAGE_DIR, "_jax", "jit_miss.py"), "jit_cache_miss")
    assert miss_frame in frames_of(info.value)


# --- Leaks ----------------------------------------------------------------------------------


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("kind", ["jit", "pmap"])
def test_rss_stays_flat_over_20000_calls_with_fresh_arrays(kind):
    # 4 KiB per array: an array, an executable or a buffer kept per call would be 80 MiB. (No
    # collectives: XLA's CPU runtime aborts on thousands of all-reduces in flight over 8
    # virtual devices on 2 busy cores, under jax.jit too.)
    host = np.arange(1024, dtype=np.float32)
    if kind == "jit":
        ours, sharding = fastpjit.jit(lambda v, w: (v * 2 + w, -v)), ROW_8
    else:
        ours = fastpjit.pmap(lambda v, w: (v * 2 + w, -v), in_axes=(0, None))
        host = host.reshape(8, 128)
        sharding = ours(host, np.float32(0))[0].sharding

    def calls(n: int) -> None:
        for i in range(n):
            out = ours(fastpjit.device_put(host, sharding), np.float32(i))
            if i % 100 == 0:
                jax.block_until_ready(out)
            del out

    calls(1000)
    gc.collect()
    entries, before = ours.cache_size(), rss_bytes()
    calls(20_000)
    gc.collect()
    growth = rss_bytes() - before
    assert ours.cache_size() == entries
    assert growth < 16 * 2**20, f"RSS grew {growth / 2**20:.1f} MiB over 20,000 calls"


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["jit", "pjit"])
def test_deleting_a_jitted_function_frees_its_function_and_executables_like_jax(kind):
    wrap = {"jit": fastpjit.jit, "pjit": fastpjit.pjit}[kind]
    x, y = jax.device_put(np.ones(8, np.float32), ROW_8), jax.device_put(np.ones(4, np.int32))
    for jit in (wrap, jax.jit):
        fun = fresh(plus)
        function_alive = weakref.ref(fun)
        baseline = live_executables()
        f = jit(fun, static_argnums=1)
        f(x, 1), f(y, 2), f(x, 1)
        assert live_executables() == baseline + 2
        f_alive = weakref.ref(f)
        del f, fun
        gc.collect()
        assert f_alive() is None and function_alive() is None, jit
        assert live_executables() == baseline, jit


@pytest.mark.slow
def test_deleting_a_pmapped_function_frees_it_with_jax_clear_caches_like_jax():
    # jax.pmap's caches keep the function until jax.clear_caches(); fastpjit adds nothing.
    x = jnp.ones((8, 2))
    for pmap in (fastpjit.pmap, jax.pmap):
        fun = fresh(plus)
        function_alive = weakref.ref(fun)
        baseline = live_executables()
        f = pmap(fun, static_broadcasted_argnums=1)
        f(x, 1)
        del f, fun
        jax.clear_caches()
        gc.collect()
        assert function_alive() is None, pmap
        assert live_executables() <= baseline, pmap


class Holder:
    """An object whose jitted function closes over the object: a reference cycle."""

    def __init__(self, wrap: Any):
        self.factor = 2.0
        self.apply = wrap(lambda x: x * self.factor)


@pytest.mark.parametrize("kind", ["jit", "pjit", pytest.param("pmap", marks=pytest.mark.slow)])
def test_a_cycle_through_a_jitted_function_is_collected_like_jax_s(kind):
    ours = {"jit": fastpjit.jit, "pjit": fastpjit.pjit, "pmap": fastpjit.pmap}[kind]
    theirs = jax.pmap if kind == "pmap" else jax.jit
    x = jnp.ones((8, 2))

    def collected(wrap: Any) -> tuple[bool, bool]:
        holder = Holder(wrap)
        holder.apply(x)
        alive = weakref.ref(holder)
        del holder
        gc.collect()
        by_gc = alive() is None
        jax.clear_caches()
        gc.collect()
        return by_gc, alive() is None

    expected = collected(theirs)
    assert collected(ours) == expected
    if kind != "pmap":
        assert expected == (True, True)  # jax.pmap's caches keep it until clear_caches


@pytest.mark.slow
@pytest.mark.parametrize("case", ["static_self", "static_method_self", "treedef"])
def test_cycles_that_jax_s_caches_hold_go_with_jax_clear_caches(case):
    """A jitted function passed to itself as a static argument, a method static on its object,
    a pytree whose treedef holds the function: JAX's trace caches hold these strongly, so
    neither JAX's nor fastpjit's is collected until jax.clear_caches()."""
    x = jnp.arange(4.0)

    def build(jit: Any) -> Any:
        if case == "static_self":
            f = jit(lambda g, v: v + 1, static_argnums=0)
            f(f, x)
            return f
        if case == "static_method_self":
            obj = Scaled(2.0) if jit is fastpjit.jit else ScaledByJax(2.0)
            obj.scale(x)
            return obj
        f = jit(lambda s: s.x + 1)
        f(Carrier(x, f))
        return f

    def collected(jit: Any) -> tuple[bool, bool]:
        alive = weakref.ref(build(jit))
        gc.collect()
        by_gc = alive() is None
        jax.clear_caches()
        gc.collect()
        return by_gc, alive() is None

    expected = collected(jax.jit)
    assert collected(fastpjit.jit) == expected
    assert expected[1]


class Carrier:
    """A pytree whose treedef (its aux data) holds a function."""

    def __init__(self, x: Any, fn: Any):
        self.x, self.fn = x, fn


jax.tree_util.register_pytree_node(
    Carrier, lambda c: ((c.x,), c.fn), lambda fn, children: Carrier(children[0], fn)
)
