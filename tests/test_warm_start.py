"""Warm starts: a record of the signatures served, written by one process and replayed by
another, and records that are corrupt, truncated, hostile or from a future version."""

import collections
import contextlib
import json
import os
import re
import subprocess
import sys
import tracemalloc
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from child import run_json
from hypothesis import given, settings
from hypothesis import strategies as st
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import fastpjit
from fastpjit import warm_start


@pytest.fixture
def mesh():
    return jax.make_mesh((2, 4), ("x", "y"))


def describe(args, kwargs=None, statics=(), static_names=()):
    """The signature of a call of a function with these static arguments."""
    dispatch = fastpjit._core.DispatchCache("f", list(statics), list(static_names))
    return warm_start.describe_call(dispatch, args, kwargs or {})


def new_log(statics=(), **options):
    """The signature log of a function with these static argument positions."""
    dispatch = fastpjit._core.DispatchCache("f", list(statics), [])
    return warm_start.SignatureLog(dispatch, (statics, ()), **options)


def roundtrip(args, kwargs=None, statics=(), static_names=()):
    """The call's signature through JSON and back to arguments."""
    signature = describe(args, kwargs, statics, static_names)
    signature = json.loads(json.dumps(signature))
    warm_start.check._Checker().signature(signature, "signature")
    return warm_start.replay._Rebuilder().call(signature)


def same_signature(a, b):
    la, ta = jax.tree.flatten(a)
    lb, tb = jax.tree.flatten(b)
    assert ta == tb
    for x, y in zip(la, lb, strict=True):
        assert type(x) is type(y) or (isinstance(x, jax.Array) and isinstance(y, jax.Array))
        if isinstance(x, (jax.Array, np.ndarray, np.generic)):
            assert (x.shape, x.dtype) == (y.shape, y.dtype)
        if isinstance(x, jax.Array):
            assert x.aval.weak_type == y.aval.weak_type
            assert x.committed == y.committed
            if x.committed:
                assert x.sharding == y.sharding


def test_a_signature_rebuilds_arguments_of_the_same_signature(mesh):
    sharded = jax.device_put(np.ones((8, 8), np.float32), NamedSharding(mesh, P("x", "y")))
    replicated = jax.device_put(np.ones(3, np.int32), NamedSharding(mesh, P()))
    weak = jnp.asarray(2.0)
    assert weak.aval.weak_type
    args = (
        {"w": sharded, "b": [replicated, None]},
        weak,
        np.ones((2, 3), np.float16),
        np.float32(1),
        3,
        2.5,
        True,
        1j,
        jnp.ones(2),
    )
    rebuilt, _ = roundtrip(args)
    same_signature(args, rebuilt)


def test_statics_and_keyword_arguments_rebuild_equal(mesh):
    args = (
        np.ones(2),
        (1, "a", None, 2.5, True),
        (3, (4,)),
        np.dtype("float32"),
        np.int8,
        jnp.bfloat16,
    )
    rebuilt, kwargs = roundtrip(
        args, {"n": 3, "x": np.ones(1)}, statics=(1, 2, 3, 4, 5), static_names=("n",)
    )
    assert rebuilt[1:] == args[1:]
    assert [type(a) for a in rebuilt[1:]] == [type(a) for a in args[1:]]
    assert kwargs["n"] == 3 and kwargs["x"].shape == (1,)


@pytest.mark.parametrize("value", [object(), float("nan"), frozenset({1}), b"bytes"])
def test_a_static_that_is_no_json_value_is_unrecordable(value):
    with pytest.raises(warm_start.Unrecordable, match="static"):
        describe((value,), statics=(0,))


class Moments(NamedTuple):
    count: jax.Array
    mu: dict
    nu: dict


class Empty(NamedTuple):
    pass


Pair = collections.namedtuple("Pair", "a b")


class Custom:
    def __init__(self, a):
        self.a = a


jax.tree_util.register_pytree_node(Custom, lambda c: ((c.a,), None), lambda _, ch: Custom(*ch))


class FirstOnly(NamedTuple):
    kept: jax.Array
    dropped: int


# A NamedTuple that JAX takes apart otherwise than by its fields.
jax.tree_util.register_pytree_node(
    FirstOnly, lambda t: ((t.kept,), t.dropped), lambda dropped, ch: FirstOnly(ch[0], dropped)
)


def test_named_tuples_rebuild_as_the_same_types(mesh):
    import optax

    params = {"w": jnp.ones((4, 2)), "b": jnp.zeros(2)}
    args = (
        Moments(jnp.asarray(1), {"w": jnp.ones(2)}, {"w": np.ones(2)}),
        [Pair(1.0, None), Empty()],
        optax.adam(1e-3).init(params),
        optax.chain(optax.clip(1.0), optax.sgd(0.1)).init(params),
    )
    rebuilt, _ = roundtrip(args)
    same_signature(args, rebuilt)
    assert [type(a) for a in jax.tree.leaves(rebuilt, is_leaf=lambda x: x is None)] == [
        type(a) for a in jax.tree.leaves(args, is_leaf=lambda x: x is None)
    ]
    assert type(rebuilt[0]) is Moments and type(rebuilt[1][0]) is Pair


def test_pytree_nodes_a_record_cannot_name_are_unrecordable():
    Local = collections.namedtuple("Local", "a")
    with pytest.raises(warm_start.Unrecordable, match="a pytree node of type Custom"):
        describe((Custom(1),))
    with pytest.raises(warm_start.Unrecordable, match="Local that another process cannot find"):
        describe((Local(1),))
    with pytest.raises(warm_start.Unrecordable, match="FirstOnly, not made of its fields"):
        describe((FirstOnly(jnp.ones(2), 3),))


def named(name, fields, children):
    return {"namedtuple": {"type": name, "fields": fields, "children": children}}


def test_a_replay_finds_named_tuples_without_running_a_module_s_code(monkeypatch):
    import types

    asked = []
    lazy = types.ModuleType("fastpjit_lazy_module")
    lazy.__getattr__ = lambda name: asked.append(name) or Moments  # a lazy import, say
    monkeypatch.setitem(sys.modules, "fastpjit_lazy_module", lazy)
    node = named("fastpjit_lazy_module:Moments", ["count", "mu", "nu"], [{"none": None}] * 3)
    with pytest.raises(warm_start.Skipped, match="not found in the modules"):
        warm_start.replay._Rebuilder().node(node)
    assert asked == []


def test_a_named_tuple_this_process_lacks_or_changed_is_skipped():
    leaf = {"leaf": {"kind": "float"}}
    for name, fields, words in [
        (
            "not_imported_anywhere:Moments",
            ["a"],
            "is not found in the modules this process imported",
        ),
        (f"{__name__}:Missing", ["a"], "is not found in the modules this process imported"),
        (f"{__name__}:Pair", ["a", "c"], "is no longer a NamedTuple of the fields ['a', 'c']"),
        ("json:loads", ["a"], "is no longer a NamedTuple"),
    ]:
        with pytest.raises(warm_start.Skipped, match=re.escape(f"{name} {words}")):
            warm_start.replay._Rebuilder().node(named(name, fields, [leaf] * len(fields)))


def test_a_log_is_bounded_and_counts_what_it_cannot_hold():
    log = new_log((1,), capacity=3)
    for n in range(5):
        log.note((np.ones(n), 1), {})
    log.note((np.ones(4), 1), {})
    log.note((np.ones(4), object()), {})
    shapes = [s["args"][0]["leaf"]["shape"] for s in log.signatures()]
    assert shapes == [[2], [3], [4]]
    assert list(log.unrecordable.values()) == [1]


def test_a_log_keeps_signatures_apart_as_json_does_and_holds_no_copy_of_a_static():
    log = new_log((1,))
    for static in (1, 1.0, True, "1", (1,), None):
        log.note((np.ones(2), static), {})
    log.note((np.ones(2), 1), {})  # the same signature again
    statics = [s["args"][1]["static"] for s in log.signatures()]
    assert statics == [1.0, True, "1", {"tuple": [1]}, None, 1]
    assert [type(v) for v in statics] == [float, bool, str, dict, type(None), int]
    # A large static argument is held, not copied (as JAX's cache holds it).
    big = "x" * 10_000_000
    tracemalloc.start()
    try:
        log.note((np.ones(2), big), {})
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1_000_000
    assert log.signatures()[-1]["args"][1]["static"] is big


# -- Bad records ------------------------------------------------------------------------------


def a_record(**changes):
    record = {
        "schema": warm_start.SCHEMA,
        "schema_version": warm_start.SCHEMA_VERSION,
        "versions": warm_start.schema.versions(),
        "functions": {
            "f": {
                "unrecordable": {},
                "signatures": [describe((np.ones(2), 1))],
            }
        },
    }
    record.update(changes)
    return record


def with_argument(node):
    """A record whose one signature takes `node` as its one argument."""
    signature = {"args": [node], "kwargs": {}, "config": {"jax_enable_x64": False, "mesh": None}}
    return a_record(functions={"f": {"unrecordable": {}, "signatures": [signature]}})


def write(tmp_path, data):
    path = tmp_path / "record.json"
    path.write_bytes(data if isinstance(data, bytes) else json.dumps(data).encode())
    return path


def test_a_good_record_loads(tmp_path):
    assert warm_start.load_record(write(tmp_path, a_record()))["functions"]["f"]


@pytest.mark.parametrize(
    ("record", "words"),
    [
        (a_record(schema_version=warm_start.SCHEMA_VERSION + 1), "newer fastpjit"),
        (a_record(schema="other"), "schema"),
        (a_record(schema_version=True), "schema_version"),
        (a_record(functions=[]), "functions"),
        ({"schema": "fastpjit.signatures"}, "the keys"),
        ([], "an object"),
        (
            with_argument({"leaf": {"kind": "numpy", "shape": [2**60], "dtype": "float32"}}),
            "a dim in",
        ),
        (with_argument({"leaf": {"kind": "numpy", "shape": [2], "dtype": "object"}}), "dtype"),
        (with_argument({"code": "1"}), "one of the keys"),
        (with_argument(named("os:system()", [], [])), "module:qualname"),
        (with_argument(named("a:B", ["x y"], [{"none": None}])), "a field name"),
        (with_argument(named("a:B", ["x"], [])), "1 children"),
        (with_argument(named("a:B", ["x"], [{"code": 1}])), "one of the keys"),
        (with_argument({"namedtuple": {"type": "a:B"}}), "the keys"),
    ],
)
def test_a_bad_record_raises_value_error_naming_what_is_wrong(tmp_path, record, words):
    with pytest.raises(ValueError, match=words):
        warm_start.load_record(write(tmp_path, record))


def test_a_truncated_corrupted_or_deep_record_raises_value_error(tmp_path):
    text = json.dumps(a_record()).encode()
    for data in (
        text[: len(text) // 2],
        b"\xff\xfe" + text,
        b"[" * 100_000 + b"]" * 100_000,
        text.replace(b"false", b"NaN"),
    ):
        with pytest.raises(ValueError, match="invalid signature record"):
            warm_start.load_record(write(tmp_path, data))


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_a_fuzzed_record_loads_or_raises_value_error(tmp_path_factory, data):
    text = bytearray(json.dumps(a_record()).encode())
    for _ in range(data.draw(st.integers(1, 5))):
        i = data.draw(st.integers(0, len(text) - 1))
        edit = data.draw(st.sampled_from(["flip", "cut", "insert"]))
        if edit == "flip":
            text[i] = data.draw(st.integers(0, 255))
        elif edit == "cut":
            del text[i : i + data.draw(st.integers(1, 8))]
        else:
            text[i:i] = data.draw(
                st.sampled_from(
                    [b"{", b"}", b"[", b"]", b",", b'"', b"1e999", b"-1", b"null", b'"x"']
                )
            )
        if not text:
            text = bytearray(b"{")
    path = tmp_path_factory.mktemp("fuzz") / "record.json"
    path.write_bytes(bytes(text))
    # Anything but ValueError (a KeyError, a RecursionError, a crash) fails the test.
    with contextlib.suppress(ValueError):
        warm_start.load_record(path)


# -- A record written by one process, replayed by another -----------------------------------

SCRIPT = os.path.join(os.path.dirname(__file__), "warm_start_script.py")


def run_script(mode, path, **env):
    return run_json(SCRIPT, mode, path, **env)


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    path = tmp_path_factory.mktemp("record") / "signatures.json"
    served = run_script("record", path)
    assert all(served["equal"]) and served["misses"] > 0
    return path


@pytest.mark.slow
@pytest.mark.subprocess
@pytest.mark.timeout(300)
def test_a_replayed_record_makes_every_first_call_a_hit(recorded):
    replayed = run_script("replay", recorded)
    assert all(replayed["equal"])
    assert replayed["misses"] == 0 and replayed["hits"] == len(replayed["equal"])
    assert replayed["fallbacks"] == {} and replayed["skipped"] == {}
    assert replayed["counts"]["compiled"] >= 9


@pytest.mark.slow
@pytest.mark.subprocess
@pytest.mark.timeout(300)
def test_a_replay_loads_what_jaxs_persistent_cache_holds(recorded, tmp_path):
    env = {
        "JAX_COMPILATION_CACHE_DIR": str(tmp_path / "cache"),
        "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
        "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0",
    }
    first = run_script("replay", recorded, **env)
    second = run_script("replay", recorded, **env)
    assert first["misses"] == second["misses"] == 0
    assert "loaded" not in first["counts"]
    assert second["counts"].get("loaded", 0) >= 9 and "compiled" not in second["counts"]


def edited(recorded, tmp_path, edit):
    record = json.loads(recorded.read_text())
    edit(record)
    path = tmp_path / "edited.json"
    path.write_text(json.dumps(record))
    return path


@pytest.mark.subprocess
def test_signatures_on_devices_this_process_lacks_are_skipped(recorded, tmp_path):
    def on_device_99(record):
        leaf = record["functions"]["aot"]["signatures"][0]["args"][0]["leaf"]
        leaf["sharding"]["device_ids"][3] = 99

    path = edited(recorded, tmp_path, on_device_99)
    aot = fastpjit.jit(lambda x: x * 2 + 1).lower(jnp.ones((8, 4))).compile()
    report = fastpjit.warm_up(path, {"aot": aot})
    assert report.skipped() == {"device id 99 is not one of this process's 8 devices": 1}
    assert "skipped" in str(report)


@pytest.mark.subprocess
def test_a_record_of_other_versions_is_skipped_whole(recorded, tmp_path):
    def older_jax(record):
        record["versions"]["jax"] = "0.4.1"

    path = edited(recorded, tmp_path, older_jax)
    f = fastpjit.jit(lambda x: x)
    report = fastpjit.warm_up(path, {"power": f, "layer": f})
    (reason,) = report.skipped()
    assert reason == f"recorded with jax 0.4.1, and this process runs {jax.__version__}"
    assert report.counts() == {"skipped": 6}
    assert f.cache_size() == 0


@pytest.mark.subprocess
def test_only_the_functions_passed_are_called(recorded):
    calls = []
    f = fastpjit.jit(
        lambda x, n, mode="square": calls.append(x) or x, static_argnums=1, static_argnames="mode"
    )
    report = fastpjit.warm_up(recorded, {"power": f, "not recorded": fastpjit.jit(abs)})
    assert len(report.entries) == len(calls) == 3
    assert {e.function for e in report.entries} == {"power"}


def test_statics_a_record_cannot_hold_are_counted_at_save(tmp_path):
    f = fastpjit.jit(lambda x, how: x, static_argnums=1)
    f(np.ones(2), 1)
    f(np.ones(2), object())
    record = fastpjit.save_signatures(tmp_path / "r.json", {"f": f})
    entry = record["functions"]["f"]
    assert len(entry["signatures"]) == 1
    assert entry["unrecordable"] == {
        "a static argument of type object, which is not a JSON value or a dtype": 1
    }
    assert warm_start.load_record(tmp_path / "r.json") == record


@pytest.mark.subprocess
def test_misuse_raises_type_and_value_errors(tmp_path, recorded):
    with pytest.raises(TypeError, match="expected a fastpjit function"):
        fastpjit.save_signatures(tmp_path / "r.json", {"f": jax.jit(abs)})
    with pytest.raises(TypeError, match="mapping"):
        fastpjit.save_signatures(tmp_path / "r.json", [fastpjit.jit(abs)])
    with pytest.raises(ValueError, match="threads"):
        fastpjit.warm_up(recorded, {}, threads=0)


def test_a_call_under_a_mesh_context_replays_under_it(mesh, tmp_path):
    def make():
        return fastpjit.jit(lambda x: jax.lax.with_sharding_constraint(x * 2, P("x")))

    served = make()
    with jax.set_mesh(mesh):
        served(jax.device_put(np.ones((8, 4), np.float32), NamedSharding(mesh, P("x"))))
    fastpjit.save_signatures(tmp_path / "r.json", {"f": served})
    fresh = make()
    report = fastpjit.warm_up(tmp_path / "r.json", {"f": fresh})
    assert report.counts() == {"compiled": 1}
    before = fastpjit.stats()["cache_misses"]
    with jax.set_mesh(mesh):
        out = fresh(jax.device_put(np.ones((8, 4), np.float32), NamedSharding(mesh, P("x"))))
    assert fastpjit.stats()["cache_misses"] == before
    np.testing.assert_array_equal(out, 2.0)


# -- Records with a bounded cost ------------------------------------------------------------


def named_leaf(mesh_shape, device_ids, shape=(4,)):
    return {
        "leaf": {
            "kind": "array",
            "shape": list(shape),
            "dtype": "float32",
            "weak_type": False,
            "committed": True,
            "sharding": {
                "type": "named",
                "mesh_shape": mesh_shape,
                "axis_names": [f"a{i}" for i in range(len(mesh_shape))],
                "axis_types": ["Auto"] * len(mesh_shape),
                "device_ids": device_ids,
                "spec": [None] * len(shape),
                "memory_kind": None,
            },
        }
    }


def under_mesh(mesh):
    """A record whose one signature runs under `jax.set_mesh` of `mesh`."""
    record = a_record()
    record["functions"]["f"]["signatures"][0]["config"]["mesh"] = mesh
    return record


@pytest.mark.parametrize(
    ("record", "words"),
    [
        # jaxlib aborts the process on a mesh with no devices.
        (with_argument(named_leaf([0, 4], [])), "a mesh dim of at least 1"),
        (
            under_mesh(
                {
                    "mesh_shape": [0, 4],
                    "axis_names": ["a", "b"],
                    "axis_types": ["Auto", "Auto"],
                    "device_ids": [],
                }
            ),
            "a mesh dim of at least 1",
        ),
        (with_argument(named_leaf([2], [1, 1])), "distinct device ids"),
        (with_argument(named_leaf([2], [0, 1, 2])), "a device id for each mesh position"),
        (
            with_argument({"leaf": {"kind": "numpy", "shape": [2], "dtype": "void"}}),
            "a dtype that JAX places",
        ),
        (
            with_argument({"dict": [[{"list": [1]}, {"none": None}]]}),
            "a hashable static value",
        ),
    ],
)
def test_a_record_that_cannot_run_is_refused_naming_the_field(tmp_path, record, words):
    with pytest.raises(ValueError, match=words):
        warm_start.load_record(write(tmp_path, record))


def test_a_record_with_a_key_twice_is_refused(tmp_path):
    text = json.dumps(a_record()).replace('"schema": ', '"schema": "x", "schema": ', 1)
    with pytest.raises(ValueError, match="the key 'schema' twice"):
        warm_start.load_record(write(tmp_path, text.encode()))


@pytest.mark.timeout(30)
def test_a_path_that_is_no_regular_file_is_refused_at_once(tmp_path):
    pipe = tmp_path / "pipe"
    os.mkfifo(pipe)
    for path in (pipe, tmp_path):
        with pytest.raises(ValueError, match="not a regular file"):
            warm_start.load_record(path)
    with pytest.raises(ValueError, match="not a regular file"):
        fastpjit.warm_up(pipe, {})


def signatures_of(*calls, statics=()):
    """A record of `f` with the signature of each call."""
    signatures = [describe(args, statics=statics) for args in calls]
    return a_record(functions={"f": {"unrecordable": {}, "signatures": signatures}})


def test_signatures_past_the_limits_are_skipped_with_the_reason(tmp_path):
    f = fastpjit.jit(lambda x: x + 1)
    # 4 TiB of float32 zeros: within the dims a record may hold, past the default max_bytes.
    bomb = {"leaf": {"kind": "numpy", "shape": [1 << 40], "dtype": "float32"}}
    report = fastpjit.warm_up(write(tmp_path, with_argument(bomb)), {"f": f})
    assert report.skipped() == {
        f"its arguments take {4 << 40} bytes, more than max_bytes={warm_start.MAX_BYTES}": 1
    }
    assert f.cache_size() == 0
    record = signatures_of(*[(np.ones((n,), np.float32),) for n in range(1, 6)])
    path = write(tmp_path, record)
    report = fastpjit.warm_up(path, {"f": f}, max_signatures=4, max_bytes=12)
    assert [e.outcome for e in report.entries] == ["compiled"] * 3 + ["skipped"] * 2
    assert report.skipped() == {
        "its arguments take 16 bytes, more than max_bytes=12": 1,
        "past the first max_signatures=4 of the function": 1,
    }
    report = fastpjit.warm_up(path, {"f": f}, max_signatures=None, max_bytes=None)
    assert report.counts() == {"cached": 3, "compiled": 2}
    for bad in ({"max_bytes": -1}, {"max_signatures": 1.5}, {"max_bytes": True}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            fastpjit.warm_up(path, {"f": f}, **bad)


def test_a_signature_that_fails_at_replay_is_skipped_and_the_replay_goes_on(tmp_path):
    def g(x, n):
        return x * n

    f = fastpjit.jit(g, static_argnums=1)
    good = describe((np.ones(2, np.float32), 2), statics=(1,))
    three = describe((np.ones(2, np.float32), 2, 3), statics=(1,))
    # A string static in a dynamic slot, and a dynamic argument in a static one.
    text = describe(("s", 2), statics=(0, 1))
    dynamic = describe((np.ones(2, np.float32), 2))
    int4 = describe((np.ones(2, np.float32), 2), statics=(1,))
    int4["args"][0]["leaf"]["dtype"] = "int4"
    other = describe((np.ones(3, np.float32), 4), statics=(1,))
    signatures = [good, three, text, dynamic, int4, other]
    record = a_record(functions={"f": {"unrecordable": {}, "signatures": signatures}})
    path = write(tmp_path, record)
    report = fastpjit.warm_up(path, {"f": f})
    outcomes = [(e.outcome, e.reason) for e in report.entries]
    assert outcomes[0] == ("compiled", None) and outcomes[-1] == ("compiled", None)
    assert outcomes[4][0] == "compiled"  # int4 zeros times 2: JAX runs it
    assert outcomes[1][0] == "skipped" and outcomes[1][1].startswith("the replay raised TypeError")
    assert outcomes[2:4] == [
        ("skipped", "args[0] is recorded as static, and the function takes it as dynamic"),
        ("skipped", "args[1] is recorded as dynamic, and the function takes it as static"),
    ]


INTERRUPTED = """
import os, signal, sys, threading, time
import numpy as np
import fastpjit
from fastpjit import warm_start
import json

dispatch = fastpjit._core.DispatchCache("f", [], [])
signatures = [
    warm_start.describe_call(dispatch, (np.ones((n,), np.float32),), {})
    for n in range(1, 301)
]
record = {
    "schema": warm_start.SCHEMA,
    "schema_version": warm_start.SCHEMA_VERSION,
    "versions": warm_start.schema.versions(),
    "functions": {"f": {"unrecordable": {}, "signatures": signatures}},
}
path = sys.argv[1]
with open(path, "w") as out:
    json.dump(record, out)
f = fastpjit.jit(lambda x: (x * 2).sum())
timer = threading.Timer(2.0, lambda: (print("interrupting", time.monotonic(), flush=True),
                                      os.kill(os.getpid(), signal.SIGINT)))
timer.start()
try:
    fastpjit.warm_up(path, {"f": f}, threads=4)
except KeyboardInterrupt:
    print("interrupted", time.monotonic(), f.cache_size(), flush=True)
    os._exit(3)
print("finished", f.cache_size(), flush=True)
"""


@pytest.mark.slow
@pytest.mark.subprocess
@pytest.mark.timeout(120)
def test_ctrl_c_stops_a_warm_up_on_several_threads_within_a_second(tmp_path):
    done = subprocess.run(
        [sys.executable, "-c", INTERRUPTED, str(tmp_path / "r.json")],
        capture_output=True,
        text=True,
        timeout=100,
        check=False,
    )
    lines = dict(line.split(" ", 1) for line in done.stdout.splitlines())
    assert done.returncode == 3, (done.stdout, done.stderr[-2000:])
    asked, stopped = float(lines["interrupting"]), float(lines["interrupted"].split()[0])
    assert stopped - asked < 1.0
    assert int(lines["interrupted"].split()[1]) < 300


def test_an_array_s_bytes_count_on_each_of_its_devices():
    replicated = named_leaf([2, 4], list(range(8)), shape=(8,))
    split = named_leaf([2, 4], list(range(8)), shape=(8,))
    split["leaf"]["sharding"]["spec"] = [["a0", "a1"]]
    uncommitted = named_leaf([2, 4], list(range(8)), shape=(8,))
    uncommitted["leaf"]["committed"] = False
    signature = {"args": [replicated, {"static": 3}], "kwargs": {"b": {"tuple": [split]}}}
    assert warm_start.replay._signature_bytes(signature) == 32 * 8 + 4 * 8
    assert warm_start.replay._bytes({"list": [uncommitted, {"leaf": {"kind": "int"}}]}) == 32 + 8
