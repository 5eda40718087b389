"""make_array_from_process_local_data in one process, against JAX's.

With one process the local data is the whole array and JAX's function is a device_put; the
Rust path for local data that spans processes is checked here on its one-process case, and
across two processes in test_multiprocess.py.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, SingleDeviceSharding
from jax.sharding import PartitionSpec as P
from oracle import assert_same_array, assert_same_outputs

import fastpjit
from fastpjit import _core

DEVICES = tuple(jax.devices())
MESH_2x4 = Mesh(np.array(DEVICES).reshape(2, 4), ("x", "y"))
MESH_8 = Mesh(np.array(DEVICES[::-1]), ("x",))

CASES = [
    (NamedSharding(MESH_2x4, P("x", "y")), (8, 8)),
    (NamedSharding(MESH_2x4, P("y")), (4, 3)),
    (NamedSharding(MESH_2x4, P(None, ("x", "y"))), (2, 16)),
    (NamedSharding(MESH_2x4, P()), (5,)),
    (NamedSharding(MESH_8, P("x")), (16,)),
    (SingleDeviceSharding(DEVICES[3]), (2, 3)),
    (fastpjit.parse_hlo_sharding("{devices=[4,2]<=[2,4]T(1,0)}", DEVICES), (8, 2)),
]


@pytest.mark.parametrize(("sharding", "shape"), CASES)
def test_one_process_matches_jax(sharding, shape):
    data = np.arange(int(np.prod(shape)), dtype=np.float64).reshape(shape)
    for global_shape in (None, shape):
        fastpjit.reset_stats()
        ours = fastpjit.make_array_from_process_local_data(sharding, data, global_shape)
        theirs = jax.make_array_from_process_local_data(sharding, data, global_shape)
        assert_same_array(ours, theirs)
        assert fastpjit.stats()["fallbacks"] == {}


@pytest.mark.parametrize(("sharding", "shape"), CASES)
def test_the_rust_path_for_local_data_matches_jax_on_one_process(sharding, shape):
    # On one process every device is addressable, so the local data is the global array.
    data = np.arange(int(np.prod(shape)), dtype=np.int16).reshape(shape)
    expected = jax.make_array_from_callback(shape, sharding, lambda index: data[index])
    for global_shape in (None, shape):
        assert_same_array(
            _core.make_array_from_process_local_leaf(data, sharding, global_shape), expected
        )
    transposed = np.ascontiguousarray(data.T).T  # the same values, not C-ordered
    assert_same_array(_core.make_array_from_process_local_leaf(transposed, sharding), expected)


def test_pytrees_and_scalars_match_jax():
    sharded, replicated = NamedSharding(MESH_2x4, P("x")), NamedSharding(MESH_2x4, P())
    for sharding, tree in [
        (sharded, {"a": np.ones((8, 2), np.float32), "b": (np.arange(8, dtype=np.int8),)}),
        (replicated, [np.float32(2.5), 3.0, 7]),  # Python scalars weakly typed, as in JAX
    ]:
        ours = fastpjit.make_array_from_process_local_data(sharding, tree)
        theirs = jax.make_array_from_process_local_data(sharding, tree)
        assert_same_outputs(ours, theirs)


def test_a_global_shape_other_than_the_local_one_is_a_value_error_on_one_process():
    sharding = NamedSharding(MESH_2x4, P("x"))
    data = np.zeros((8, 2), np.float32)
    for global_shape in [(16, 2), (8, None)]:
        with pytest.raises(ValueError, match="single process") as ours:
            fastpjit.make_array_from_process_local_data(sharding, data, global_shape)
        with pytest.raises(ValueError) as theirs:
            jax.make_array_from_process_local_data(sharding, data, global_shape)
        assert type(ours.value) is type(theirs.value)


def test_local_data_that_does_not_fit_the_sharding_names_the_dimension():
    sharding = NamedSharding(MESH_2x4, P("x", "y"))
    with pytest.raises(ValueError, match="In dimension 0, local_data has 3 elements"):
        _core.make_array_from_process_local_leaf(np.zeros((3, 8)), sharding, (8, 8))
    with pytest.raises(ValueError, match="must have the same rank"):
        _core.make_array_from_process_local_leaf(np.zeros((8, 8)), sharding, (8, 8, 1))
    with pytest.raises(TypeError, match="global_shape must be a tuple of non-negative ints"):
        _core.make_array_from_process_local_leaf(np.zeros((8, 8)), sharding, (8, -8))


def test_partition_specs_and_sharding_pytrees_go_to_jax_counted():
    data = np.arange(8, dtype=np.float32)
    fastpjit.reset_stats()
    with jax.set_mesh(MESH_2x4):
        ours = fastpjit.make_array_from_process_local_data(P("x"), data)
        theirs = jax.make_array_from_process_local_data(P("x"), data)
    assert_same_array(ours, theirs)
    shardings = {"a": NamedSharding(MESH_2x4, P("y"))}
    ours = fastpjit.make_array_from_process_local_data(shardings, {"a": data})
    theirs = jax.make_array_from_process_local_data(shardings, {"a": data})
    assert_same_array(ours["a"], theirs["a"])
    assert fastpjit.stats()["fallbacks"] == {"process_local.spec_or_trees": 2}
