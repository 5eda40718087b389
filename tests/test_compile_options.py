"""Compile options per signature (`f.with_compiler_options`): decode-like and prefill-like calls
of one function compiled with different XLA options, each executable's optimized HLO as
jax.jit's with those options alone; kept apart in the cache, in bound functions, in `explain`,
and across a warm start. Options whose names or values JAX refuses raise JAX's error types."""

import json
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from child import run_json
from compile_options_script import (
    DECODE,
    DECODE_OPTIONS,
    PREFILL,
    W,
    capture_executables,
    jax_text,
    step,
    without_stack_frames,
)
from oracle import assert_same_outputs
from rows import row

import fastpjit
from fastpjit import warm_start

SCRIPT = os.path.join(os.path.dirname(__file__), "compile_options_script.py")
DECODE_SPEC = jax.ShapeDtypeStruct((1, 8), jnp.float32)


@pytest.fixture
def executables():
    """The optimized HLO of the executable that each jit miss compiles, by the shape of the
    call's last argument (see `compile_options_script.capture_executables`)."""
    jit_module = sys.modules["fastpjit.jit"]
    miss = jit_module.jit_cache_miss
    yield capture_executables()
    jit_module.jit_cache_miss = miss


def new_step(**options):
    """fastpjit.jit of a new copy of `step`: a cache of its own."""

    def step_copy(w, x):
        return step(w, x)

    return fastpjit.jit(step_copy, **options), step_copy


def test_decode_and_prefill_compile_with_their_own_options(executables):
    f, fun = new_step()
    assert f.with_compiler_options(DECODE_OPTIONS, W, DECODE_SPEC) is f
    for x in (DECODE, PREFILL):
        assert_same_outputs(f(W, x), jax.jit(fun)(W, x))
    decode, prefill = executables[(1, 8)], executables[(16, 8)]
    assert decode == jax_text(fun, DECODE_OPTIONS, W, DECODE)
    assert prefill == jax_text(fun, None, W, PREFILL)
    # The option shows in the optimized HLO (XLA's simplifier folds or reshapes less).
    assert decode != jax_text(fun, None, W, DECODE)


def test_a_signature_s_options_win_over_the_function_s(executables):
    function_wide = {"xla_disable_hlo_passes": "algsimp", "xla_embed_ir_in_executable": False}
    f, fun = new_step(compiler_options=function_wide)
    f.with_compiler_options({"xla_disable_hlo_passes": ""}, W, DECODE)
    f(W, DECODE), f(W, PREFILL)
    merged = {"xla_disable_hlo_passes": "", "xla_embed_ir_in_executable": False}
    assert f._compiler_options((W, DECODE), {}) == merged
    assert executables[(1, 8)] == jax_text(fun, merged, W, DECODE)
    assert executables[(1, 8)] != jax_text(fun, function_wide, W, DECODE)
    assert executables[(16, 8)] == jax_text(fun, function_wide, W, PREFILL)


def test_a_bucket_is_tree_shapes_dtypes_and_statics():
    f = fastpjit.jit(lambda x, n, tree: x * n + tree["b"], static_argnums=1)
    f.with_compiler_options(DECODE_OPTIONS, DECODE_SPEC, 2, {"b": np.float32(0)})
    of = f._jax_function.options.of
    # An array, a numpy array or a weak-typed scalar of the shape and dtype: the same bucket.
    for x, b in ((jnp.ones((1, 8)), 1.0), (DECODE, jnp.float32(1)), (DECODE_SPEC, np.zeros(()))):
        assert of((x, 2, {"b": b}), {}) == DECODE_OPTIONS
    assert of((jnp.ones((2, 8)), 2, {"b": 1.0}), {}) is None  # shape
    assert of((jnp.ones((1, 8), jnp.int32), 2, {"b": 1.0}), {}) is None  # dtype
    assert of((DECODE, 3, {"b": 1.0}), {}) is None  # static value
    assert of((DECODE, 2, {"c": 1.0}), {}) is None  # tree


def test_registering_forgets_that_signature_s_executable_only(executables):
    f, fun = new_step()
    f(W, DECODE), f(W, PREFILL)
    assert f.cache_size() == 2
    before = executables[(1, 8)]
    f.with_compiler_options(DECODE_OPTIONS, W, DECODE)
    assert f.cache_size() == 1
    counts = row(fun)
    f(W, PREFILL)
    assert row(fun)["cache_hits"] == counts["cache_hits"] + 1
    f(W, DECODE)
    assert row(fun)["cache_misses"] == counts["cache_misses"] + 1
    assert executables[(1, 8)] != before
    assert executables[(1, 8)] == jax_text(fun, DECODE_OPTIONS, W, DECODE)
    # The same options again forget nothing.
    f.with_compiler_options(dict(DECODE_OPTIONS), W, DECODE)
    assert f.cache_size() == 2


def test_another_wrapper_of_the_function_shares_them(executables):
    def fun(w, x):
        return step(w, x)

    fastpjit.jit(fun).with_compiler_options(DECODE_OPTIONS, W, DECODE)
    fastpjit.jit(fun)(W, DECODE)
    assert executables[(1, 8)] == jax_text(fun, DECODE_OPTIONS, W, DECODE)
    # Other options make another cache, which has none.
    fastpjit.jit(fun, keep_unused=True)(W, DECODE)
    assert executables[(1, 8)] == jax_text(fun, None, W, DECODE)


def test_a_bound_function_honours_them(executables):
    f, fun = new_step()
    bound = f.bind(jnp.asarray(W))
    for _ in range(3):  # the bound path learns the entry
        bound(jnp.asarray(DECODE))
    before = executables[(1, 8)]
    assert bound.with_compiler_options(DECODE_OPTIONS, DECODE_SPEC) is bound
    counts = row(fun)
    out = bound(jnp.asarray(DECODE))
    assert row(fun)["cache_misses"] == counts["cache_misses"] + 1
    assert_same_outputs(out, jax.jit(fun)(W, DECODE))
    assert executables[(1, 8)] != before
    assert executables[(1, 8)] == jax_text(fun, DECODE_OPTIONS, W, DECODE)
    bound(jnp.asarray(DECODE))
    assert row(fun)["cache_hits"] == counts["cache_hits"] + 1


def test_a_bound_pmap_takes_none():
    bound = fastpjit.pmap(lambda w, x: w * x).bind(np.ones(8, np.float32))
    with pytest.raises(TypeError, match="with_compiler_options"):
        bound.with_compiler_options(DECODE_OPTIONS, np.ones(8, np.float32))


def test_calls_that_place_numpy_arrays_stay_with_their_options(executables):
    # Such calls would go to jax.jit's dispatch, which compiles with the function's options.
    f, fun = new_step()
    f.with_compiler_options(DECODE_OPTIONS, W, DECODE)
    for _ in range(12):
        f(W, np.random.rand(1, 8).astype(np.float32))
    assert row(fun)["jax_calls"] == 0
    assert executables[(1, 8)] == jax_text(fun, DECODE_OPTIONS, W, DECODE)
    g, other = new_step()
    for _ in range(12):
        g(W, np.random.rand(1, 8).astype(np.float32))
    assert row(other)["jax_calls"] > 0  # the same calls, without options


def test_explain_shows_the_options_of_a_call():
    f, _ = new_step(compiler_options={"xla_embed_ir_in_executable": False})
    f.with_compiler_options(DECODE_OPTIONS, W, DECODE)
    decode = fastpjit.explain(f, W, DECODE)
    assert decode.compiler_options == {"xla_embed_ir_in_executable": False, **DECODE_OPTIONS}
    assert "Compiler options:\n  xla_embed_ir_in_executable: False\n" in str(decode)
    assert "  xla_disable_hlo_passes: 'algsimp'" in str(decode)
    prefill = fastpjit.explain(f, W, PREFILL)
    assert prefill.compiler_options == {"xla_embed_ir_in_executable": False}
    bound = fastpjit.explain(f.bind(W), DECODE)
    assert bound.compiler_options == decode.compiler_options
    f(W, DECODE)
    assert fastpjit.explain(f, W, DECODE).outcome == "hit"
    assert fastpjit.explain(f, W, DECODE).compiler_options == decode.compiler_options
    assert fastpjit.explain(fastpjit.pmap(lambda x: x), np.ones(8)).compiler_options is None
    assert "Compiler options" not in str(fastpjit.explain(new_step()[0], W, DECODE))


@pytest.mark.parametrize(
    "options",
    [
        [("xla_disable_hlo_passes", "algsimp")],  # not a dict
        "xla_disable_hlo_passes=algsimp",
        {"xla_no_such_option": True},  # a name the backend does not take
        {1: "algsimp"},  # a name that is no str
        {"xla_disable_hlo_passes": object()},  # a value of no type XLA takes
        {"xla_disable_hlo_passes": ["algsimp"]},
    ],
)
def test_bad_options_raise_jax_s_error_type_naming_the_argument(options):
    fun = new_step()[1]
    with pytest.raises(Exception) as theirs:
        jax.jit(fun, compiler_options=options)(W, DECODE)
    f = fastpjit.jit(fun)
    with pytest.raises(Exception) as ours:
        f.with_compiler_options(options, W, DECODE)
    assert isinstance(ours.value, type(theirs.value))
    assert "with_compiler_options: compiler_options" in str(ours.value)
    # Nothing was registered.
    assert f._compiler_options((W, DECODE), {}) == {}


def test_an_example_that_is_no_array_raises_type_error_naming_it():
    f, _ = new_step()
    with pytest.raises(TypeError, match=r"with_compiler_options: args\[1\]\['x'\] is a object"):
        f.with_compiler_options(DECODE_OPTIONS, W, {"x": object()})
    with pytest.raises(TypeError, match="bound already"):
        f.bind(W, x=DECODE).with_compiler_options(DECODE_OPTIONS, x=DECODE)


def test_the_log_notes_a_signature_s_latest_options():
    log = warm_start.SignatureLog(fastpjit._core.DispatchCache("f", [], []))
    log.note((DECODE,), {}, {"a": 1})
    log.note((DECODE,), {}, {"a": 2})
    log.note((PREFILL,), {})
    decode, prefill = log.signatures()
    assert decode["compiler_options"] == {"a": 2} and "compiler_options" not in prefill


@pytest.mark.parametrize(
    ("options", "words"),
    [
        ([1], "compiler_options: expected an object"),
        ({"a": [1]}, "compiler_options['a']: expected a string, bool or number"),
        ({"a": None}, "compiler_options['a']: expected a string, bool or number"),
    ],
)
def test_a_record_s_options_are_checked(tmp_path, options, words):
    f, _ = new_step()
    f(W, DECODE)
    path = tmp_path / "record.json"
    record = fastpjit.save_signatures(path, {"step": f})
    assert record["schema_version"] == 3
    record["functions"]["step"]["signatures"][0]["compiler_options"] = options
    path.write_text(json.dumps(record))
    with pytest.raises(ValueError, match=words.replace("[", r"\[")):
        warm_start.load_record(path)
    # A record of schema 2, which held no options, still loads.
    record["schema_version"] = 2
    del record["functions"]["step"]["signatures"][0]["compiler_options"]
    path.write_text(json.dumps(record))
    warm_start.load_record(path)


def test_a_warm_up_registers_the_recorded_options_before_any_replay(tmp_path, executables):
    # The int32 call has the decode call's shapes, and is replayed first: registering decode's
    # options after its replay would forget its executable.
    f, _ = new_step()
    f.with_compiler_options(DECODE_OPTIONS, W, DECODE)
    decode_int = DECODE.astype(np.int32)
    f(W, decode_int), f(W, DECODE)
    path = tmp_path / "record.json"
    fastpjit.save_signatures(path, {"step": f})
    g, fun = new_step()  # a new cache, with no options: warm_up registers the record's
    report = fastpjit.warm_up(path, {"step": g}, threads=1)
    assert report.counts() == {"compiled": 2}
    counts = row(fun)
    g(W, decode_int), g(W, DECODE)
    assert row(fun)["cache_hits"] == counts["cache_hits"] + 2
    assert row(fun)["cache_misses"] == counts["cache_misses"]
    assert executables[(1, 8)] == jax_text(fun, DECODE_OPTIONS, W, DECODE)


def run_script(*argv):
    return run_json(SCRIPT, *argv, timeout=200)


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    path = tmp_path_factory.mktemp("record") / "signatures.json"
    served = run_script("record", path)
    assert all(served["equal"]) and served["decode_as_jax"] and served["prefill_as_jax"]
    decode, prefill = json.loads(path.read_text())["functions"]["step"]["signatures"]
    assert decode["compiler_options"] == DECODE_OPTIONS and "compiler_options" not in prefill
    return path


@pytest.mark.slow
@pytest.mark.subprocess
@pytest.mark.timeout(400)
@pytest.mark.parametrize("how", ["register", "adopt"])
def test_a_warm_start_compiles_each_signature_with_its_options(recorded, how):
    # A new process that registers the same options, or none (warm_up registers the record's).
    replayed = run_script("replay", recorded, how)
    assert all(replayed["equal"]) and replayed["skipped"] == {}
    assert replayed["misses"] == 0 and replayed["hits"] == 4
    assert replayed["decode_as_jax"] and replayed["prefill_as_jax"]


@pytest.mark.slow
@pytest.mark.subprocess
@pytest.mark.timeout(400)
def test_a_warm_start_skips_a_signature_whose_options_changed(recorded):
    replayed = run_script("replay", recorded, "conflict")
    (reason,) = replayed["skipped"]
    assert "recorded with the compiler options {'xla_disable_hlo_passes': 'algsimp'}" in reason
    assert "now takes {'xla_disable_hlo_passes': ''}" in reason
    assert all(replayed["equal"]) and replayed["misses"] == 1 and replayed["hits"] == 3
    assert not replayed["decode_as_jax"] and replayed["prefill_as_jax"]


def test_lower_and_compile_take_the_signature_s_options():
    # As a call would: the AOT path compiles a registered bucket with its options, and JAX's
    # own compile_options given to compile() are JAX's (merged over the function's).
    f, fun = new_step()
    f.with_compiler_options(DECODE_OPTIONS, W, DECODE_SPEC)
    decode = f.lower(W, DECODE).compile()
    assert without_stack_frames(decode.as_text()) == jax_text(fun, DECODE_OPTIONS, W, DECODE)
    assert_same_outputs(decode(W, DECODE), jax.jit(fun)(W, DECODE))
    prefill = f.lower(W, PREFILL).compile()
    assert without_stack_frames(prefill.as_text()) == jax_text(fun, None, W, PREFILL)
    given = f.lower(W, DECODE).compile(compiler_options={"xla_embed_ir_in_executable": False})
    expected = jax.jit(fun).lower(W, DECODE).compile({"xla_embed_ir_in_executable": False})
    assert without_stack_frames(given.as_text()) == without_stack_frames(expected.as_text())
