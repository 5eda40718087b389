"""Index maps of NamedSharding and SingleDeviceSharding, differential against JAX on 8 CPU devices.

JAX is the oracle: `sharding.devices_indices_map` and friends for concrete meshes, and its
pure-Python `op_sharding_to_indices` over the lowered HloSharding for abstract meshes.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict

import jax
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from index_oracle import (
    DEVICES,
    INDEX_MAP_FUNCTIONS,
    assert_matches_jax,
    expected_indices_array,
)
from jax._src import sharding as jax_sharding
from jax._src.named_sharding import DuplicateSpecError as JaxDuplicateSpecError
from jax._src.op_shardings import op_sharding_to_indices
from jax._src.sharding_impls import GSPMDSharding
from jax._src.sharding_impls import device_replica_id_map as jax_device_replica_id_map
from jax.sharding import AbstractMesh, AxisType, Mesh, NamedSharding, SingleDeviceSharding
from jax.sharding import PartitionSpec as P

import fastpjit
from fastpjit.sharding import device_placement_map

AXIS_NAMES = ("x", "y", "z", "w")


def test_the_suite_runs_on_eight_cpu_devices():
    assert len(DEVICES) == 8
    assert {d.platform for d in DEVICES} == {"cpu"}


# --- Oracles and properties ---------------------------------------------------------------


def assert_abstract_matches_jax(sharding, shape):
    """`indices_array` over an AbstractMesh agrees with op_sharding_to_indices over JAX's
    lowering of the sharding to an HloSharding."""
    shard = fastpjit.shard_shape(sharding, shape)
    assert shard == sharding.shard_shape(shape)
    hlo = sharding._to_xla_hlo_sharding(len(shape))
    indices = op_sharding_to_indices(hlo, shape, sharding.mesh.size)
    np.testing.assert_array_equal(
        fastpjit.indices_array(sharding, shape), expected_indices_array(indices, shape)
    )


def assert_shard_properties(index_map, shape, shard, replicas):
    """Shards have the shard shape, cover each element `replicas` times, and replica ids count
    0..r-1 among the devices that hold one index."""
    hits = np.zeros(shape, dtype=np.int64)
    for index in index_map.values():
        assert hits[index].shape == tuple(shard)
        hits[index] += 1
    assert (hits == replicas).all()


def assert_replica_ids_count_up(index_map, replica_ids, replicas):
    holders = defaultdict(list)
    for device, index in index_map.items():
        holders[tuple((s.start, s.stop) for s in index)].append(replica_ids[device])
    for ids in holders.values():
        assert ids == list(range(replicas))


def assert_bounds_cover(bounds, shape, shard, replicas):
    """The same coverage property over an `indices_array` result."""
    hits = np.zeros(shape, dtype=np.int64)
    for row in bounds:
        index = tuple(slice(start, stop) for start, stop in row)
        assert hits[index].shape == tuple(shard)
        hits[index] += 1
    assert (hits == replicas).all()


# --- Strategies ---------------------------------------------------------------------------


def factorizations(n, k):
    """Every k-tuple of positive ints whose product is n."""
    if k == 0:
        return [()] if n == 1 else []
    return [
        (d, *rest) for d in range(1, n + 1) if n % d == 0 for rest in factorizations(n // d, k - 1)
    ]


@st.composite
def specs_over(draw, names, sizes, rank, allow_unconstrained):
    """A PartitionSpec over the mesh axes `names`: each axis shards one dimension or none.

    Returns (spec, partitions per dimension, replicas).
    """
    # Mostly sharded: an axis is left unused (replicated) about a third of the time.
    choices = [-1, *range(rank), *range(rank)] if rank else [-1]
    placement = [draw(st.sampled_from(choices)) for _ in names]
    dims = [[] for _ in range(rank)]
    for axis in draw(st.permutations(range(len(names)))):
        if placement[axis] >= 0:
            dims[placement[axis]].append(axis)
    empty = [None, P.UNCONSTRAINED] if allow_unconstrained else [None]
    entries = []
    for axes in dims:
        if not axes:
            entries.append(draw(st.sampled_from(empty)))
        elif len(axes) == 1:
            entries.append(draw(st.sampled_from([names[axes[0]], (names[axes[0]],)])))
        else:
            entries.append(tuple(names[a] for a in axes))
    # Trailing dimensions that a spec leaves out are not sharded.
    while entries and entries[-1] is None and draw(st.booleans()):
        entries.pop()
    partitions = [math.prod(sizes[a] for a in axes) for axes in dims]
    replicas = math.prod(size for axis, size in enumerate(sizes) if placement[axis] < 0)
    return P(*entries), partitions, replicas


def ranks(max_rank):
    """Array ranks up to `max_rank`, weighted away from 0-d, which hypothesis favours."""
    return st.sampled_from([0, *[r for r in range(1, max_rank + 1) for _ in range(3)]])


@st.composite
def shapes_for(draw, partitions, min_multiple=1, max_multiple=3):
    return tuple(p * draw(st.integers(min_multiple, max_multiple)) for p in partitions)


@st.composite
def concrete_meshes(draw, max_axes=4):
    """A Mesh over a permutation of all 8 devices or of a subset of them, 1 to `max_axes` axes."""
    num_axes = draw(st.integers(1, max_axes))
    total = draw(st.sampled_from([8, 8, 8, 4, 2, 1]))
    sizes = draw(st.sampled_from(factorizations(total, num_axes)))
    names = tuple(draw(st.permutations(AXIS_NAMES))[:num_axes])
    order = draw(st.permutations(range(8)))
    devices = [DEVICES[i] for i in order[:total]]
    if draw(st.booleans()):
        mesh = Mesh(np.array(devices).reshape(sizes), names)
    else:
        types = tuple(
            draw(st.sampled_from([AxisType.Explicit, AxisType.Auto])) for _ in range(num_axes)
        )
        mesh = jax.make_mesh(sizes, names, axis_types=types, devices=devices)
    return mesh


def any_axis_auto(mesh):
    return any(t == AxisType.Auto for t in mesh.axis_types)


@st.composite
def named_shardings(draw, max_rank=4, min_multiple=1, max_multiple=3):
    """(NamedSharding over a concrete mesh, global shape it divides, replicas per shard)."""
    mesh = draw(concrete_meshes())
    rank = draw(ranks(max_rank))
    spec, partitions, replicas = draw(
        specs_over(mesh.axis_names, mesh.axis_sizes, rank, any_axis_auto(mesh))
    )
    shape = draw(shapes_for(partitions, min_multiple, max_multiple))
    return NamedSharding(mesh, spec), shape, replicas


@st.composite
def abstract_shardings(draw, max_rank=4, max_multiple=2):
    """(NamedSharding over an AbstractMesh of any axis sizes, global shape, replicas)."""
    num_axes = draw(st.integers(1, 4))
    sizes = tuple(draw(st.lists(st.integers(1, 6), min_size=num_axes, max_size=num_axes)))
    names = tuple(draw(st.permutations(AXIS_NAMES))[:num_axes])
    types = tuple(
        draw(st.sampled_from([AxisType.Explicit, AxisType.Auto])) for _ in range(num_axes)
    )
    mesh = AbstractMesh(sizes, names, axis_types=types)
    rank = draw(ranks(max_rank))
    spec, partitions, replicas = draw(specs_over(names, sizes, rank, any_axis_auto(mesh)))
    shape = draw(shapes_for(partitions, 1, max_multiple))
    return NamedSharding(mesh, spec), shape, replicas


# --- NamedSharding over concrete meshes ----------------------------------------------------


@given(named_shardings())
def test_named_sharding_index_maps_match_jax(case):
    sharding, shape, _ = case
    assert_matches_jax(sharding, shape)


@given(named_shardings(max_multiple=2))
def test_named_sharding_shards_cover_each_element_once_per_replica(case):
    sharding, shape, replicas = case
    index_map = fastpjit.devices_indices_map(sharding, shape)
    shard = fastpjit.shard_shape(sharding, shape)
    assert len(index_map) == sharding.mesh.size
    assert_shard_properties(index_map, shape, shard, replicas)
    replica_ids = fastpjit.device_replica_id_map(sharding, shape)
    assert_replica_ids_count_up(index_map, replica_ids, replicas)
    copies = sharding.mesh.size // replicas
    assert Counter(replica_ids.values()) == {r: copies for r in range(replicas)}


@given(named_shardings(), st.data())
def test_logical_device_ids_reorder_like_jax(case, data):
    sharding, shape, _ = case
    ids = tuple(data.draw(st.permutations(range(sharding.mesh.size))))
    reordered = NamedSharding(sharding.mesh, sharding.spec, _logical_device_ids=ids)
    assert_matches_jax(reordered, shape)


@given(named_shardings(), st.booleans(), st.data())
def test_named_sharding_lowered_to_gspmd_indexes_alike(case, reorder, data):
    # The GSPMD path reads the HloSharding text that XLA prints for JAX's lowering.
    sharding, shape, _ = case
    if reorder:
        ids = tuple(data.draw(st.permutations(range(sharding.mesh.size))))
        sharding = NamedSharding(sharding.mesh, sharding.spec, _logical_device_ids=ids)
    devices = tuple(sharding.mesh.devices.flat)
    lowered = GSPMDSharding(devices, sharding._to_xla_hlo_sharding(len(shape)))
    assert fastpjit.devices_indices_map(lowered, shape) == sharding.devices_indices_map(shape)
    np.testing.assert_array_equal(
        fastpjit.indices_array(lowered, shape), fastpjit.indices_array(sharding, shape)
    )


@given(named_shardings(min_multiple=0, max_multiple=2))
def test_zero_sized_dimensions_index_like_jax(case):
    sharding, shape, _ = case
    assert fastpjit.devices_indices_map(sharding, shape) == sharding.devices_indices_map(shape)
    assert fastpjit.shard_shape(sharding, shape) == sharding.shard_shape(shape)


def test_zero_sized_sharded_dimension_replica_ids_match_jax():
    # All eight shards of a (0,) array are the empty slice(0, 0): JAX hashes indices by
    # (start, stop), so it counts them as copies of one another, with replica ids 0..7.
    sharding = NamedSharding(Mesh(np.array(DEVICES), ("x",)), P("x"))
    assert fastpjit.device_replica_id_map(sharding, (0,)) == jax_device_replica_id_map(
        sharding, (0,)
    )


MESH_2x4 = Mesh(np.array(DEVICES).reshape(2, 4), ("x", "y"))
MESH_2x2x2 = Mesh(np.array(DEVICES)[::-1].reshape(2, 2, 2), ("a", "b", "c"))
MESH_WITH_SIZE_ONE = Mesh(np.array(DEVICES).reshape(1, 4, 1, 2), ("one", "y", "unit", "x"))
MESH_EXPLICIT = jax.make_mesh((2, 4), ("x", "y"), axis_types=(AxisType.Explicit,) * 2)
MESH_OF_FOUR = Mesh(np.array([DEVICES[i] for i in (6, 1, 3, 4)]).reshape(2, 2), ("x", "y"))
MESH_OF_ONE = Mesh(np.array(DEVICES[5:6]).reshape(1, 1), ("x", "y"))


@pytest.mark.parametrize(
    ("mesh", "spec", "shape"),
    [
        (MESH_2x4, P("x", "y"), (8, 8)),
        (MESH_2x4, P("y", "x"), (8, 8)),
        (MESH_2x4, P(("x", "y"), None), (16, 3)),
        (MESH_2x4, P(("y", "x"), None), (16, 3)),
        (MESH_2x4, P(None, ("y", "x")), (3, 8)),
        (MESH_2x4, P("x"), (4, 5, 6)),
        (MESH_2x4, P(None, "y"), (3, 4, 5)),
        (MESH_2x4, P(), (3, 4)),
        (MESH_2x4, P(None, None), (3, 4)),
        (MESH_2x4, P(), ()),
        (MESH_2x4, P("y"), (4,)),
        (MESH_2x4, P(P.UNCONSTRAINED, "y"), (2, 4)),
        (MESH_2x2x2, P("c", ("a", "b")), (2, 4)),
        (MESH_2x2x2, P(None, "b", "a"), (3, 2, 2)),
        (MESH_2x2x2, P(("c", "a"), None, "b"), (4, 1, 2)),
        (MESH_WITH_SIZE_ONE, P("one", ("x", "unit"), "y"), (1, 2, 4)),
        (MESH_WITH_SIZE_ONE, P(("one", "unit")), (5,)),
        (MESH_WITH_SIZE_ONE, P(None, "one"), (3,)),
        (MESH_WITH_SIZE_ONE, P("x", None, "one", "unit"), (2,)),
        (MESH_EXPLICIT, P("x", "y"), (2, 4)),
        (MESH_EXPLICIT, P(None, ("x", "y")), (1, 8)),
        (MESH_EXPLICIT, P(), ()),
        (MESH_OF_FOUR, P("y", "x"), (6, 4)),
        (MESH_OF_FOUR, P("y"), (6,)),
        (MESH_OF_ONE, P("x", "y"), (3, 3)),
        (MESH_OF_ONE, P(), ()),
    ],
    ids=str,
)
def test_named_sharding_cases_match_jax(mesh, spec, shape):
    assert_matches_jax(NamedSharding(mesh, spec), shape)


def test_readme_example_matches_jax():
    sharding = NamedSharding(jax.make_mesh((2, 4), ("x", "y")), P("x", "y"))
    assert fastpjit.shard_shape(sharding, (8, 8)) == (4, 2)
    assert_matches_jax(sharding, (8, 8))


@pytest.mark.parametrize("shape", [(), (3,), (2, 5), (0, 4), (1, 1, 1, 1)], ids=str)
@pytest.mark.parametrize("device", DEVICES, ids=str)
def test_single_device_sharding_matches_jax(device, shape):
    sharding = SingleDeviceSharding(device)
    assert_matches_jax(sharding, shape)
    assert fastpjit.devices_indices_map(sharding, shape) == {device: (slice(None),) * len(shape)}


def test_global_shape_may_be_any_int_sequence():
    sharding = NamedSharding(MESH_2x4, P("x", "y"))
    expected = sharding.devices_indices_map((8, 8))
    for shape in ([8, 8], np.array([8, 8]), (np.int64(8), np.int32(8))):
        assert fastpjit.devices_indices_map(sharding, shape) == expected


# --- NamedSharding over abstract meshes ----------------------------------------------------


@given(abstract_shardings())
def test_abstract_mesh_indices_array_matches_jax_lowering(case):
    sharding, shape, replicas = case
    assert_abstract_matches_jax(sharding, shape)
    bounds = fastpjit.indices_array(sharding, shape)
    assert bounds.shape == (sharding.mesh.size, len(shape), 2)
    assert_bounds_cover(bounds, shape, fastpjit.shard_shape(sharding, shape), replicas)


@given(abstract_shardings(), st.data())
def test_abstract_mesh_logical_device_ids_match_jax_lowering(case, data):
    sharding, shape, _ = case
    ids = tuple(data.draw(st.permutations(range(sharding.mesh.size))))
    assert_abstract_matches_jax(
        NamedSharding(sharding.mesh, sharding.spec, _logical_device_ids=ids), shape
    )


@given(named_shardings())
def test_abstract_mesh_agrees_with_its_concrete_mesh(case):
    sharding, shape, _ = case
    abstract = NamedSharding(sharding.mesh.abstract_mesh, sharding.spec)
    np.testing.assert_array_equal(
        fastpjit.indices_array(abstract, shape), fastpjit.indices_array(sharding, shape)
    )


def test_readme_abstract_example():
    big = NamedSharding(AbstractMesh((64, 512), ("data", "model")), P("data", "model"))
    bounds = fastpjit.indices_array(big, (4096, 8192))
    assert bounds.shape == (32768, 2, 2)
    # Device position 513 sits at mesh coordinates (1, 1).
    np.testing.assert_array_equal(bounds[513], [[64, 128], [16, 32]])
    assert_abstract_matches_jax(
        NamedSharding(AbstractMesh((4, 8), ("data", "model")), P("model", "data")), (16, 8)
    )


@pytest.mark.parametrize(
    "function",
    [
        fastpjit.devices_indices_map,
        fastpjit.addressable_devices_indices_map,
        fastpjit.device_replica_id_map,
    ],
)
def test_abstract_mesh_has_no_device_maps_like_jax(function):
    sharding = NamedSharding(AbstractMesh((2, 4), ("x", "y")), P("x"))
    with pytest.raises(ValueError):
        sharding.devices_indices_map((4, 4))
    with pytest.raises(ValueError):
        function(sharding, (4, 4))


# --- Errors: the exception types JAX raises -----------------------------------------------


@st.composite
def indivisible_cases(draw):
    """A sharding and a shape whose first sharded dimension the partitions don't divide."""
    sharding, shape, _ = draw(named_shardings(max_rank=3))
    partitions = [d // s for d, s in zip(shape, sharding.shard_shape(shape), strict=True)]
    sharded = [i for i, p in enumerate(partitions) if p > 1]
    if not sharded:
        # Every size-1 mesh: replace with a mesh that shards.
        sharding = NamedSharding(MESH_2x4, P("y"))
        shape, sharded, partitions = (4,), [0], [4]
    axis = draw(st.sampled_from(sharded))
    bad = partitions[axis] * draw(st.integers(0, 2)) + draw(st.integers(1, partitions[axis] - 1))
    return sharding, (*shape[:axis], bad, *shape[axis + 1 :])


def test_indivisible_error_is_jaxs_class():
    assert fastpjit.IndivisibleError is jax_sharding.IndivisibleError
    assert issubclass(fastpjit.IndivisibleError, ValueError)


@given(indivisible_cases())
def test_indivisible_shape_raises_jaxs_error(case):
    sharding, shape = case
    with pytest.raises(jax_sharding.IndivisibleError) as theirs:
        sharding.shard_shape(shape)
    with pytest.raises(jax_sharding.IndivisibleError):
        sharding.devices_indices_map(shape)
    for function in INDEX_MAP_FUNCTIONS:
        with pytest.raises(fastpjit.IndivisibleError) as ours:
            function(sharding, shape)
        assert str(ours.value) == str(theirs.value)


def test_indivisible_abstract_mesh_raises_jaxs_error():
    sharding = NamedSharding(AbstractMesh((3, 5), ("x", "y")), P(("y", "x")))
    with pytest.raises(jax_sharding.IndivisibleError):
        sharding.shard_shape((10,))
    for function in (fastpjit.shard_shape, fastpjit.indices_array):
        with pytest.raises(fastpjit.IndivisibleError):
            function(sharding, (10,))


@st.composite
def overlong_specs(draw):
    """A sharding whose spec shards a dimension at or past the array's rank."""
    sharding, shape, _ = draw(named_shardings(max_rank=4))
    mesh = sharding.mesh
    big = [n for n, s in zip(mesh.axis_names, mesh.axis_sizes, strict=True) if s > 1]
    if not big:
        mesh, big = MESH_2x4, ["x"]
    rank = draw(st.integers(0, 3))
    spec = P(*([None] * draw(st.integers(rank, rank + 2))), draw(st.sampled_from(big)))
    return NamedSharding(mesh, spec), tuple(draw(st.integers(1, 4)) for _ in range(rank))


def test_sharding_rank_error_is_each_error_jax_raises_for_a_wrong_rank():
    # IndexError (NamedSharding), AssertionError (GSPMDSharding, device_put onto an Explicit
    # mesh), ValueError (device_put onto an Auto mesh).
    for base in (ValueError, IndexError, AssertionError):
        assert issubclass(fastpjit.ShardingRankError, base)


@given(overlong_specs())
def test_spec_longer_than_rank_raises_index_error_like_jax(case):
    sharding, shape = case
    with pytest.raises(IndexError):
        sharding.devices_indices_map(shape)
    for function in INDEX_MAP_FUNCTIONS:
        with pytest.raises(fastpjit.ShardingRankError):
            function(sharding, shape)
    abstract = NamedSharding(sharding.mesh.abstract_mesh, sharding.spec)
    with pytest.raises(fastpjit.ShardingRankError):
        fastpjit.indices_array(abstract, shape)


def test_size_one_axes_may_stand_past_the_rank_like_jax():
    sharding = NamedSharding(MESH_WITH_SIZE_ONE, P("y", None, ("one", "unit")))
    assert_matches_jax(sharding, (4,))


class SpecOverride(NamedSharding):
    """A NamedSharding whose spec skips JAX's constructor checks, so that fastpjit's own
    validation of duplicate and unknown axes is what runs."""

    override = P()

    @property
    def spec(self):
        return self.override


def sharding_with_unchecked_spec(mesh, spec):
    sharding = SpecOverride(mesh, P())
    SpecOverride.override = spec
    return sharding


BAD_SPECS = [
    P("x", "x"),
    P(("x", "y"), "x"),
    P(None, ("y", "y")),
    P("x", "z", "x"),
    P("z", "y", "y"),
    P("z"),
    P(None, ("x", "z")),
]


@pytest.mark.parametrize("spec", BAD_SPECS, ids=str)
@pytest.mark.parametrize("mesh", [MESH_2x4, MESH_2x4.abstract_mesh], ids=["Mesh", "AbstractMesh"])
def test_duplicate_and_unknown_axes_raise_what_jax_raises(mesh, spec):
    with pytest.raises(Exception) as theirs:
        NamedSharding(mesh, spec)
    expected = type(theirs.value)
    assert expected in (JaxDuplicateSpecError, ValueError)
    sharding = sharding_with_unchecked_spec(mesh, spec)
    functions = INDEX_MAP_FUNCTIONS if isinstance(mesh, Mesh) else (fastpjit.indices_array,)
    for function in functions:
        with pytest.raises(expected) as ours:
            function(sharding, (4, 4, 4))
        assert type(ours.value) is expected


def test_duplicate_spec_error_is_jaxs_class():
    assert fastpjit.DuplicateSpecError is JaxDuplicateSpecError
    sharding = sharding_with_unchecked_spec(MESH_2x4, P("x", "x"))
    with pytest.raises(JaxDuplicateSpecError) as ours:
        fastpjit.devices_indices_map(sharding, (4, 4))
    assert "`x`" in str(ours.value)


NOT_SHARDINGS = [None, "x", 3, (), MESH_2x4, P("x"), object(), DEVICES[0]]


@pytest.mark.parametrize("not_a_sharding", NOT_SHARDINGS, ids=repr)
@pytest.mark.parametrize("function", INDEX_MAP_FUNCTIONS, ids=lambda f: f.__name__)
def test_a_non_sharding_raises_type_error(function, not_a_sharding):
    with pytest.raises(TypeError):
        function(not_a_sharding, (8, 8))


BAD_SHAPES = [None, 8, "ab", (8, -1), (8.0, 8), (8, None), (8, "8"), (2**64 + 8, 8), {8: 8}]


@pytest.mark.parametrize("shape", BAD_SHAPES, ids=repr)
@pytest.mark.parametrize("function", INDEX_MAP_FUNCTIONS, ids=lambda f: f.__name__)
def test_a_bad_global_shape_raises_type_error_naming_it(function, shape):
    with pytest.raises(TypeError, match="global_shape"):
        function(NamedSharding(MESH_2x4, P("x")), shape)


EXPLICIT_AND_MANUAL = jax.make_mesh(
    (2, 4), ("x", "y"), axis_types=(AxisType.Explicit, AxisType.Manual)
)
ALL_MANUAL = jax.make_mesh((2, 4), ("x", "y"), axis_types=(AxisType.Manual,) * 2)


MESH_2x2x2_EXPLICIT = jax.make_mesh(
    (2, 2, 2), ("x", "y", "z"), axis_types=(AxisType.Explicit,) * 3, devices=DEVICES[::-1]
)
UNREDUCED_SHARDINGS = [
    NamedSharding(MESH_EXPLICIT, P(None, "y", unreduced={"x"})),
    NamedSharding(MESH_EXPLICIT, P("x", None, unreduced={"y"})),
    NamedSharding(MESH_EXPLICIT, P(unreduced={"x", "y"})),
    NamedSharding(MESH_2x2x2_EXPLICIT, P("x", None, unreduced={"y"})),
    NamedSharding(MESH_2x2x2_EXPLICIT, P(("z", "x"), unreduced={"y"})),
    NamedSharding(MESH_2x2x2_EXPLICIT, P(None, "y", unreduced={"z", "x"})),
]


@pytest.mark.parametrize("sharding", UNREDUCED_SHARDINGS, ids=lambda s: str(s.spec))
@pytest.mark.parametrize("function", INDEX_MAP_FUNCTIONS, ids=lambda f: f.__name__)
def test_unreduced_axes_have_a_shard_shape_but_no_index_map_like_jax(function, sharding):
    shape = (8, 8)
    with pytest.raises(NotImplementedError):
        sharding.devices_indices_map(shape)
    if function is fastpjit.shard_shape:
        assert function(sharding, shape) == sharding.shard_shape(shape)
    else:
        with pytest.raises(NotImplementedError, match="unreduced"):
            function(sharding, shape)


@pytest.mark.parametrize("sharding", UNREDUCED_SHARDINGS, ids=lambda s: str(s.spec))
def test_unreduced_placement_is_that_of_the_lowered_sharding(sharding):
    # JAX lowers the NamedSharding to an HloSharding with unreduced subgroups; both place each
    # device's partial sum alike (the members are checked against XLA's tile assignment in
    # test_hlo_sharding).
    shape = (8, 8)
    lowered = GSPMDSharding(tuple(sharding.mesh.devices.flat), sharding._to_xla_hlo_sharding(2))
    placement = device_placement_map(sharding, shape)
    assert placement == device_placement_map(lowered, shape)
    assert list(placement) == list(sharding.mesh.devices.flat)
    # The bounds are those of the same spec with the unreduced axes replicated.
    replicated = NamedSharding(sharding.mesh, P(*sharding.spec.partitions))
    assert {d: index for d, (index, _) in placement.items()} == replicated.devices_indices_map(
        shape
    )
    # Each tile's devices hold every partial sum equally often.
    sums = math.prod(sharding.mesh.shape[a] for a in sharding.spec.unreduced)
    by_tile = defaultdict(Counter)
    for index, member in placement.values():
        by_tile[tuple((s.start, s.stop) for s in index)][member] += 1
    for members in by_tile.values():
        assert set(members) == set(range(sums)) and len(set(members.values())) == 1


@pytest.mark.parametrize(
    "sharding",
    [NamedSharding(EXPLICIT_AND_MANUAL, P("x")), NamedSharding(ALL_MANUAL, P())],
    ids=["some axes manual", "all axes manual"],
)
def test_manual_axes_raise_not_implemented(sharding):
    # JAX has no index map here either: NotImplementedError when some axes are manual, an
    # AssertionError when all are.
    with pytest.raises((NotImplementedError, AssertionError)):
        sharding.devices_indices_map((8, 8))
    for function in INDEX_MAP_FUNCTIONS:
        with pytest.raises(NotImplementedError):
            function(sharding, (8, 8))


def test_axis_names_need_not_be_strings():
    # Mesh axis names are any hashables; 1 and "1" are different axes.
    mesh = Mesh(np.array(DEVICES).reshape(2, 4), (1, "1"))
    assert_matches_jax(NamedSharding(mesh, P(1, "1")), (8, 8))
    mesh = Mesh(np.array(DEVICES).reshape(2, 4), (1, 2))
    assert_matches_jax(NamedSharding(mesh, P(2, 1)), (8, 8))


# --- Never a panic ------------------------------------------------------------------------

FUZZ_SHARDINGS = [
    NamedSharding(MESH_2x4, P("x", "y")),
    NamedSharding(MESH_2x2x2, P(("a", "c"))),
    NamedSharding(MESH_WITH_SIZE_ONE, P(None, "y")),
    SingleDeviceSharding(DEVICES[3]),
]
ANY_INT = st.one_of(
    st.integers(0, 17), st.integers(-(2**70), 2**70), st.sampled_from([2**63 - 1, 2**63, 2**64])
)


@given(
    st.sampled_from(FUZZ_SHARDINGS),
    st.lists(ANY_INT, max_size=5).map(tuple),
    st.sampled_from(INDEX_MAP_FUNCTIONS),
)
def test_any_shape_gives_jaxs_answer_or_an_ordinary_error(sharding, shape, function):
    try:
        function(sharding, shape)
    except (TypeError, ValueError, IndexError) as error:
        ours = error
    except BaseException as error:  # a pyo3 PanicException derives from BaseException
        pytest.fail(f"{type(error).__name__}: {error}")
    else:
        ours = None
    if all(0 <= d < 2**63 for d in shape):
        try:
            theirs = sharding.devices_indices_map(shape)
        except (ValueError, IndexError) as error:
            assert type(ours) is type(error) or isinstance(ours, fastpjit.ShardingRankError)
        else:
            assert ours is None
            assert fastpjit.devices_indices_map(sharding, shape) == theirs
    else:
        assert isinstance(ours, TypeError)
