"""fastpjit.explain: how a call would be served, without running it: the path of a hit, the
reason of a fallback, and what differs on a miss; for every kind of fastpjit function."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import fastpjit
from fastpjit.explain import Difference


@pytest.fixture
def mesh():
    return jax.make_mesh((2, 4), ("x", "y"))


def new_jit(**options):
    """fastpjit.jit of a new function, so a cache of its own."""

    def scale(x, y, n=2):
        return x * y * n

    return fastpjit.jit(scale, **options)


def unchanged(f, *args, **kwargs):
    """explain(f, ...), checking that it ran nothing: no counter moved, nothing cached."""
    before, size = fastpjit.stats(), f.cache_size() if hasattr(f, "cache_size") else None
    report = fastpjit.explain(f, *args, **kwargs)
    after = fastpjit.stats()
    assert (after["cache_hits"], after["cache_misses"], after["compiles"]) == (
        before["cache_hits"],
        before["cache_misses"],
        before["compiles"],
    )
    if size is not None:
        assert f.cache_size() == size
    return report


def test_a_repeated_call_is_a_hit_on_the_recent_probe_with_its_inputs_and_shardings(mesh):
    f = new_jit()
    x = jax.device_put(np.ones((8, 4), np.float32), NamedSharding(mesh, P("x")))
    out = f(x, 2.0)
    report = unchanged(f, x, 2.0)
    assert (report.outcome, report.path, report.reason) == ("hit", "recent", None)
    assert report.kind == "jit" and report.function.endswith("scale")
    assert report.inputs == {
        "args[0]": "passed as it is",
        "args[1]": "placed from the host (a kept device copy where the value repeats)",
    }
    assert report.in_shardings[0] == x.sharding
    assert report.out_shardings == (out.sharding,)
    text = str(report)
    assert "a cache hit, a repeat of a recent call" in text
    assert f"args[0]: jax.Array float32[8,4], committed, on {x.sharding!r}" in text
    assert "args[1]: python float (weak type)" in text


def test_an_older_signature_is_found_by_its_hash():
    f = new_jit()
    for n in range(1, 7):
        f(jnp.ones(n), jnp.ones(n))
    assert unchanged(f, jnp.ones(1), jnp.ones(1)).path == "keyed"


@pytest.mark.parametrize(
    ("first", "second", "what"),
    [
        ((jnp.ones(4), jnp.ones(4)), (jnp.ones(8), jnp.ones(8)), "shape"),
        ((jnp.ones(4), jnp.ones(())), (jnp.ones(4), jnp.asarray(1.0)), "weak type"),
        (
            (jax.device_put(jnp.ones(4), jax.devices()[1]), jnp.ones(4)),
            (jnp.ones(4), jnp.ones(4)),
            "committed",
        ),
    ],
)
def test_a_miss_names_what_differs(first, second, what):
    f = new_jit()
    f(*first)
    report = unchanged(f, *second)
    assert report.outcome == "miss" and report.inputs is None
    assert what in {d.what for d in report.differences}
    assert "a cache miss: this call would trace and compile" in str(report)


def test_a_miss_on_a_sharding_a_static_value_x64_and_a_mesh_context(mesh):
    f = new_jit(static_argnames="n")
    rows = jax.device_put(np.ones((8, 8), np.float32), NamedSharding(mesh, P("x")))
    cols = jax.device_put(np.ones((8, 8), np.float32), NamedSharding(mesh, P(None, "y")))
    f(rows, rows, n=3)
    assert [d.what for d in unchanged(f, cols, rows, n=3).differences] == ["sharding"]
    static = Difference("static value", "kwargs['n']", "4 (int)", "3 (int)")
    assert unchanged(f, rows, rows, n=4).differences == (static,)
    with jax.enable_x64(True):
        x64 = Difference("jax_enable_x64", "jit key", "True", "False")
        assert unchanged(f, rows, rows, n=3).differences == (x64,)
    with jax.set_mesh(mesh):
        differences = unchanged(f, rows, rows, n=3).differences
    # The items of the jit key that hold the mesh (which, depends on the JAX line).
    assert differences and all(d.path == "jit key" for d in differences)
    assert any("'x': 2, 'y': 4" in d.call and "'x'" not in d.cached for d in differences)


def test_a_miss_names_the_jit_key_item_that_differs():
    # The default matmul precision is an item of JAX's jit key that no record holds: the
    # dispatcher's own description of the signature names it.
    f = new_jit()
    x = jnp.ones(4)
    f(x, x)
    with jax.default_matmul_precision("highest"):
        report = unchanged(f, x, x)
    assert report.outcome == "miss"
    (difference,) = report.differences
    assert (difference.what, difference.path) == ("jax_default_matmul_precision", "jit key")
    assert "highest" in difference.call and "highest" not in difference.cached
    assert "jit key: jax_default_matmul_precision differs" in str(report)


def test_the_dispatcher_describes_every_item_of_a_signature(mesh):
    f = fastpjit.jit(lambda tree, n: tree["w"] * n, static_argnums=1)
    tree = {"w": jnp.ones(4), "b": (np.float32(1), 2.0)}
    rows = f._dispatch_cache._describe(tree, 3)
    # The flat leaves first, in JAX's order, then the static argument and the tree.
    assert [path for path, _ in rows] == [
        "args[0]['b'][0]",
        "args[0]['b'][1]",
        "args[0]['w']",
        "args[1]",
        "tree",
    ]
    items = dict(rows)
    assert items["args[0]['w']"].startswith("jax.Array float32[4], uncommitted, on Single")
    assert items["args[0]['b'][0]"] == "numpy scalar float32"
    assert items["args[0]['b'][1]"] == "python float (weak type)"
    assert items["args[1]"] == "static 3 (int)"
    assert items["tree"] == "({'b': (*, *), 'w': *})"
    # A call that JAX runs has no signature, and nothing to compare before a miss has run.
    assert f._dispatch_cache._describe("not an array", 3) is None
    assert f._dispatch_cache._differences(tree, 3) is None
    f(tree, 3)
    assert f._dispatch_cache._differences(tree, 3) == []
    # Every item of the jit key is compared, by name.
    for name in fastpjit._jax.jit_key_names:
        differences = [(d[0], d[1]) for d in f._dispatch_cache._differences(tree, 3)]
        assert (name, "jit key") not in differences
    with jax.default_device(jax.devices()[1]):
        differences = f._dispatch_cache._differences(tree, 3)
    assert [d[:2] for d in differences] == [("jax_default_device", "jit key")]


def test_named_tuples_are_walked_by_field(mesh):
    import optax

    def step(params, state, x):
        updates, state = optax.adam(1e-3).update(params, state, params)
        return optax.apply_updates(params, updates), state

    f = fastpjit.jit(step)
    params = {"w": jnp.ones((4, 2))}
    state = optax.adam(1e-3).init(params)
    f(params, state, jnp.ones(2))
    text = str(unchanged(f, params, state, jnp.ones(2)))
    assert "args[1][0].mu['w']: jax.Array float32[4,2]" in text
    assert "tree: ({'w': *}, (ScaleByAdamState(count=*, mu={'w': *}, nu={'w': *}), " in text
    wider = optax.adam(1e-3).init({"w": jnp.ones((8, 2))})
    differences = unchanged(f, params, wider, jnp.ones(2)).differences
    assert {(d.what, d.path) for d in differences} >= {("shape", "args[1][0].mu['w']")}


def test_the_first_call_misses_with_nothing_cached():
    report = unchanged(new_jit(), jnp.ones(2), jnp.ones(2))
    assert report.outcome == "miss" and report.differences is None
    assert "Nothing is cached for this function yet." in str(report)


def test_a_fallback_says_why():
    f = new_jit()
    f(jnp.ones(2), jnp.ones(2))
    with jax.disable_jit():
        report = unchanged(f, jnp.ones(2), jnp.ones(2))
    assert report.outcome == "fallback" and "disable_jit" in report.reason
    report = unchanged(f, jnp.ones(2), "not an array")
    assert report.outcome == "fallback" and report.reason == "not_an_array"
    assert report.reason in str(report)


def test_a_bound_call_takes_the_bound_path():
    f = new_jit()
    g = f.bind(jnp.ones(4))
    for _ in range(3):
        g(jnp.ones(4))
    report = unchanged(g, jnp.ones(4))
    assert (report.outcome, report.path, report.kind) == ("hit", "bound", "bound jit")
    assert list(report.signature) == ["args[0]", "args[1]", "tree"]


def test_pmap_aot_and_compile_hlo_functions():
    p = fastpjit.pmap(lambda x: x * 2)
    p(np.ones((8, 2), np.float32))
    assert unchanged(p, np.ones((8, 2), np.float32)).outcome == "hit"
    assert unchanged(p, np.ones((8, 3), np.float32)).outcome == "miss"
    compiled = fastpjit.jit(lambda x: x + 1).lower(jnp.ones(4)).compile()
    assert unchanged(compiled, jnp.ones(4)).outcome == "miss"
    compiled(jnp.ones(4))
    hit = unchanged(compiled, jnp.ones(4))
    assert (hit.outcome, hit.kind) == ("hit", "compiled")
    hlo = fastpjit.compile_hlo(
        jax.jit(lambda a: a * 3).lower(jax.ShapeDtypeStruct((4,), jnp.float32)).as_text()
    )
    hlo(np.ones(4, np.float32))
    assert unchanged(hlo, np.ones(4, np.float32)).kind == "compile_hlo"


def test_a_jax_jit_function_is_explained_as_fastpjit_jit_would_serve_it():
    jitted = jax.jit(lambda x, n: x * n, static_argnums=1)
    report = fastpjit.explain(jitted, jnp.ones(2), 3)
    assert report.outcome == "miss" and report.note and "jax.jit" in report.note
    assert report.signature["args[1]"] == "static 3 (int)"


def test_what_is_no_fastpjit_function_raises_type_error():
    with pytest.raises(TypeError, match="expects a fastpjit function"):
        fastpjit.explain(lambda x: x, 1)


def test_the_recompile_error_is_the_explain_report_of_the_miss():
    f = new_jit()
    f(jnp.ones(4), jnp.ones(4))
    with fastpjit.no_recompiles(), pytest.raises(fastpjit.RecompileError) as error:
        f(jnp.ones(5), jnp.ones(5))
    expected = str(fastpjit.explain(f, jnp.ones(5), jnp.ones(5)))
    assert str(error.value).splitlines()[1:] == expected.splitlines()[1:]
