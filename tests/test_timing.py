"""fastpjit.timing: per-function host time of cache hits by stage, only when asked."""

import jax.numpy as jnp
import numpy as np

import fastpjit

STAGES = ("lookup", "inputs", "execute", "outputs")


def new_jit():
    def step(x, y):
        return x * y + 1

    return fastpjit.jit(step)


def counts_of(name="step"):
    """The counts of the function whose name ends with `name`."""
    found = [v for k, v in fastpjit.stats()["functions"].items() if k.split(".")[-1] == name]
    return found[0] if found else {}


def timing_of(name="step"):
    return counts_of(name).get("timing")


def test_off_by_default_nothing_is_timed():
    fastpjit.reset_stats()
    f = new_jit()
    for _ in range(3):
        f(jnp.ones(4), 2.0)
    assert counts_of()["cache_hits"] == 2
    assert timing_of() is None


def test_hits_are_timed_by_stage_inside_the_block_and_the_setting_is_restored():
    fastpjit.reset_stats()
    f = new_jit()
    f(jnp.ones(4), 2.0)  # the miss is not timed
    with fastpjit.timing():
        for _ in range(20):
            f(jnp.ones(4), 2.0)
    f(jnp.ones(4), 2.0)  # off again
    timing = timing_of()
    assert timing["calls"] == 20
    for stage in (*STAGES, "total"):
        assert 0 <= timing[stage]["p50_us"] <= timing[stage]["p99_us"]
    # Each call's total is the sum of its stages, so each order statistic of the totals is at
    # least that of any stage.
    assert all(timing["total"]["p50_us"] >= timing[s]["p50_us"] for s in STAGES)
    assert timing["total"]["p50_us"] > 0
    fastpjit.reset_stats()
    assert timing_of() is None


def test_on_until_switched_off_for_bound_and_compile_hlo_calls():
    fastpjit.reset_stats()
    f = new_jit()
    g = f.bind(jnp.ones(4))
    hlo = fastpjit.compile_hlo(
        "HloModule m\nENTRY e { p = f32[4] parameter(0)\nROOT r = f32[4] add(p, p) }"
    )
    x = jnp.ones(4)
    g(x), hlo(x)
    fastpjit.timing(True)
    try:
        for _ in range(5):
            g(x)
            hlo(x)
    finally:
        fastpjit.timing(False)
    assert timing_of()["calls"] >= 4
    (name,) = [n for n in fastpjit.stats()["functions"] if not n.endswith("step")]
    assert fastpjit.stats()["functions"][name]["timing"]["calls"] == 5
    np.testing.assert_array_equal(hlo(x)[0], 2.0)
