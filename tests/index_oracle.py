"""JAX as the oracle of fastpjit's index maps: checks shared by the index-map and GSPMD tests."""

from __future__ import annotations

import jax
import numpy as np
from jax._src.sharding_impls import device_replica_id_map as jax_device_replica_id_map
from jax.sharding import NamedSharding, SingleDeviceSharding

import fastpjit

DEVICES = tuple(jax.devices())
INDEX_MAP_FUNCTIONS = (
    fastpjit.devices_indices_map,
    fastpjit.addressable_devices_indices_map,
    fastpjit.shard_shape,
    fastpjit.device_replica_id_map,
    fastpjit.indices_array,
)


def bounds_of(index, shape):
    """JAX's index tuple as [[start, stop], ...]; slice(None) is the whole dimension."""
    out = []
    for part, dim in zip(index, shape, strict=True):
        assert isinstance(part, slice) and part.step is None
        start = 0 if part.start is None else part.start
        out.append([start, dim if part.stop is None else part.stop])
    return out


def expected_indices_array(indices, shape):
    """The (devices, ndim, 2) array that `indices_array` must return for JAX's `indices`."""
    rows = [bounds_of(index, shape) for index in indices]
    return np.array(rows, dtype=np.int64).reshape(len(rows), len(shape), 2)


def device_assignment(sharding):
    if isinstance(sharding, NamedSharding):
        return tuple(sharding.mesh.devices.flat)
    if isinstance(sharding, SingleDeviceSharding):
        return tuple(sharding.device_set)
    return tuple(sharding._device_assignment)


def assert_matches_jax(sharding, shape):
    """Every fastpjit index-map function agrees with JAX for a concrete sharding."""
    theirs = sharding.devices_indices_map(shape)
    ours = fastpjit.devices_indices_map(sharding, shape)
    assert ours == theirs
    assert list(ours) == list(theirs), "devices come in device-assignment order"
    assert all(type(index) is tuple for index in ours.values())

    ours_local = fastpjit.addressable_devices_indices_map(sharding, shape)
    assert ours_local == sharding.addressable_devices_indices_map(shape)

    shard = fastpjit.shard_shape(sharding, shape)
    assert shard == sharding.shard_shape(shape)
    assert type(shard) is tuple

    assert fastpjit.device_replica_id_map(sharding, shape) == jax_device_replica_id_map(
        sharding, shape
    )

    bounds = fastpjit.indices_array(sharding, shape)
    assert bounds.dtype == np.int64
    devices = device_assignment(sharding)
    np.testing.assert_array_equal(
        bounds, expected_indices_array([theirs[d] for d in devices], shape)
    )
