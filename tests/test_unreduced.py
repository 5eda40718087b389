"""Unreduced shardings through fastpjit.jit, differential against jax.jit on 8 CPU devices.

Outputs of `einsum(..., out_sharding=P(..., unreduced=...))` are partial sums on the devices
along the unreduced axes. fastpjit compiles these calls itself (no fallback to JAX), and gives
JAX's output shardings, shard values and results. Cases follow JAX's own tests
(`tests/pjit_test.py`: test_unreduced_output_from_jit, test_unreduced_input_to_jit, ...).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding, reshard
from jax.sharding import PartitionSpec as P
from oracle import assert_same_array

import fastpjit

DEVICES = tuple(jax.devices())

# (mesh sizes, axis names, x spec, y spec, out spec) of JAX's test_unreduced_output_from_jit.
EINSUM_CASES = [
    ((2,), ("x",), P(None, "x"), P("x", None), P(None, None, unreduced={"x"})),
    ((2, 2), ("x", "y"), P("x", "y"), P("y", None), P("x", None, unreduced={"y"})),
    ((2, 2), ("x", "y"), P(None, "y"), P("y", None), P(None, None, unreduced={"y"})),
    ((2, 2, 2), ("x", "y", "z"), P("x", "y"), P("y", None), P("x", None, unreduced={"y"})),
    ((2, 4), ("x", "y"), P(None, "y"), P("y", None), P(None, None, unreduced={"y"})),
    (
        (2, 4),
        ("x", "y"),
        P(None, ("x", "y")),
        P(("x", "y"), None),
        P(None, None, unreduced={"x", "y"}),
    ),
]
CASE_IDS = ["Ux", "Sx,Uy", "Rx,Uy", "Sx,Uy,Rz", "Rx,Uy4", "Uxy"]


def explicit_mesh(sizes, names):
    n = int(np.prod(sizes))
    return jax.make_mesh(
        sizes, names, axis_types=(AxisType.Explicit,) * len(names), devices=DEVICES[:n]
    )


def operand(sizes):
    """An (8, k) matrix whose k the mesh's axes divide."""
    k = 8 if np.prod(sizes) == 8 else 2
    return np.arange(8.0 * k, dtype=np.float32).reshape(8, k)


def einsum_to(out_spec):
    """A fresh function each time, so that fastpjit and JAX each trace and compile their own."""

    def f(x, y):
        return jnp.einsum("xy,yz->xz", x, y, out_sharding=out_spec)

    return f


class CompiledByFastpjit:
    """Checks that the calls in the block compiled in fastpjit, and went to JAX for nothing."""

    def __enter__(self):
        self.before = fastpjit.stats()
        return self

    def __exit__(self, *exc):
        if exc[0] is None:
            after = fastpjit.stats()
            assert after["fallbacks"] == self.before["fallbacks"]
            assert after["compiles"] > self.before["compiles"]


@pytest.mark.parametrize(
    ("sizes", "names", "x_spec", "y_spec", "out_spec"), EINSUM_CASES, ids=CASE_IDS
)
def test_unreduced_output_is_jaxs(sizes, names, x_spec, y_spec, out_spec):
    mesh = explicit_mesh(sizes, names)
    with jax.set_mesh(mesh):
        np_inp = operand(sizes)
        x = jax.device_put(np_inp, x_spec)
        y = jax.device_put(np_inp.T, y_spec)
        ours_f = fastpjit.jit(einsum_to(out_spec))
        with CompiledByFastpjit():
            ours = ours_f(x, y)
        theirs = jax.jit(einsum_to(out_spec))(x, y)
        assert ours.sharding == NamedSharding(mesh, out_spec)
        assert_same_array(ours, theirs)
        # Again, from fastpjit's cache.
        assert_same_array(ours_f(x, y), theirs)
        ours_sum = reshard(ours, P(*out_spec.partitions))
        np.testing.assert_allclose(np.asarray(ours_sum), np_inp @ np_inp.T, rtol=1e-6)


@pytest.mark.parametrize(
    ("sizes", "names", "x_spec", "y_spec", "out_spec"), EINSUM_CASES, ids=CASE_IDS
)
def test_unreduced_input_and_output_are_jaxs(sizes, names, x_spec, y_spec, out_spec):
    mesh = explicit_mesh(sizes, names)
    with jax.set_mesh(mesh):
        np_inp = operand(sizes)
        x = jax.device_put(np_inp, x_spec)
        y = jax.device_put(np_inp.T, y_spec)
        partial = jax.jit(einsum_to(out_spec))(x, y)

        def double(a):
            return a + a

        def double_and_sum(a):
            return reshard(a + a, P(None, None))

        for g in (double, double_and_sum):
            ours_g = fastpjit.jit(g)
            with CompiledByFastpjit():
                ours = ours_g(partial)
            theirs = jax.jit(g)(partial)
            assert_same_array(ours, theirs)
            assert_same_array(ours_g(partial), theirs)
        np.testing.assert_allclose(
            np.asarray(fastpjit.jit(double_and_sum)(partial)), 2 * np_inp @ np_inp.T, rtol=1e-6
        )


def test_unreduced_out_shardings_of_jit_are_jaxs():
    mesh = explicit_mesh((2, 4), ("x", "y"))
    with jax.set_mesh(mesh):
        np_inp = np.arange(64.0, dtype=np.float32).reshape(8, 8)
        x = jax.device_put(np_inp, P("x", "y"))
        y = jax.device_put(np_inp.T, P("y", None))
        out = NamedSharding(mesh, P("x", None, unreduced={"y"}))
        with CompiledByFastpjit():
            ours = fastpjit.jit(einsum_to(out.spec), out_shardings=out)(x, y)
        theirs = jax.jit(einsum_to(out.spec), out_shardings=out)(x, y)
        assert ours.sharding == out
        assert_same_array(ours, theirs)


def test_unreduced_reduce_sum_is_jaxs():
    # JAX's test_reduce_sum_unreduced and test_unreduced_einsum_lowers_to_reduce_sum.
    mesh = explicit_mesh((2, 2), ("x", "y"))
    with jax.set_mesh(mesh):
        arr = jax.device_put(np.arange(16, dtype=np.int32).reshape(4, 2, 2), P("x", "y", None))

        def f(a):
            return jax.lax.reduce_sum(a, axes=(0, 1), out_sharding=P(None, unreduced={"x"}))

        def g(a):
            return jnp.einsum("abc->c", a, out_sharding=P(None, unreduced={"x", "y"}))

        for h in (f, g):
            with CompiledByFastpjit():
                ours = fastpjit.jit(h)(arr)
            theirs = jax.jit(h)(arr)
            assert_same_array(ours, theirs)
            np.testing.assert_array_equal(
                np.asarray(reshard(ours, P(None))), np.arange(16).reshape(4, 2, 2).sum(axis=(0, 1))
            )
